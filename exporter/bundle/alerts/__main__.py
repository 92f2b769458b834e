"""``python -m exporter.bundle.alerts``: the same as ``kube-gpu-exporter alerts``."""

import sys

from exporter.bundle.alerts.cli import main

sys.exit(main())
