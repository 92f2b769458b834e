"""``python -m exporter.bundle.dashboards``: the same as ``kube-gpu-exporter dashboards``."""

import sys

from exporter.bundle.dashboards.cli import main

sys.exit(main())
