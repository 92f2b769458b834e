"""The package version: the one place it is written (docs/release.md).

pyproject.toml reads it at build time (setuptools' ``attr:``, parsed without importing the package),
``kube-gpu-exporter --version``, the start-up line and ``kube_gpu_exporter_build_info{version}``
import it, and the chart's ``appVersion`` must equal it (tests/test_release.py).
"""

__version__ = "0.2.0"
