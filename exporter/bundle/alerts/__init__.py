"""The GPU alerting rules (plain rule file or PrometheusRule), built as code.

Alerts are built in Python rather than jinja2 because their annotations are Go templates
(``{{ $labels.x }}``), which would need escaping in every jinja2 line. The rendered default is
committed as ``alerts/kube-gpu-exporter.alerts.yaml``; the runbook is docs/alerts.md.

Modules, in the order the alerts appear in the bundle and the runbook:

- :mod:`.options`: :class:`~.options.AlertOptions`, their defaults and validation;
- :mod:`.alert`: the :class:`~.alert.Alert` record and the label sets the alerts share;
- :mod:`.exporter_health`: the exporter is scraped, has NVML, samples and sees the pods;
- :mod:`.gpu_health`: lost GPUs, Xid errors, heat, uncorrected ECC errors;
- :mod:`.gpu_hardware`: memory repair (row remapping, page retirement), PCIe replays, clock
  slowdowns, NVLink errors;
- :mod:`.usage`: unallocated processes, containers over their memory grant, idle allocations;
- :mod:`.recording_rules`: the recording rules the dashboards and HPA read are evaluated;
- :mod:`.cli`: the bundle's assembly and rendering and ``kube-gpu-exporter alerts`` (``main``).
"""
