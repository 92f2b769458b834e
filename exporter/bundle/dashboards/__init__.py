"""The Grafana dashboards as code: a cluster overview, a node view and a namespace / workload / pod view.

Three dashboards read the recording rules (docs/rules.md) and the exporter's own families
(docs/metrics.md); docs/dashboards.md describes them. The modules:

- ``cluster``, ``node``, ``workload``: one board each, written row by row as it appears in Grafana
  (``node_hardware`` and ``node_health``: the node board's hardware-health, errors and
  exporter-health rows; ``workload_usage``: the workload board's busy-time and energy row);
- ``panels`` and ``board``: the small typed builder (frozen dataclasses with ``to_json()``) the
  boards are written in, ``promql`` the label selectors their queries share;
- ``options``: what to render; ``render``: the JSON files and Grafana-sidecar ConfigMaps;
- ``cli``: ``kube-gpu-exporter dashboards`` (also ``python -m exporter.bundle.dashboards``).
"""
