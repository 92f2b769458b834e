"""``kube-gpu-exporter top``: the terminal client of /status.json and Prometheus (the daemon never imports it)."""
