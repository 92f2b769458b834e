"""The generated monitoring bundle: recording rules (jinja2 templates), alerts and Grafana
dashboards, with the option handling they share."""
