#!/usr/bin/env python3
"""Package the Helm chart as a release does: `helm package`, with the published image as the default.

    python scripts/package_chart.py -o dist [--image-repository ghcr.io/OWNER/kube-gpu-exporter]

The chart in the checkout defaults `image.repository` to the image the release workflow pushes for
this repository (ghcr.io/kube-gpu-exporter/kube-gpu-exporter); the release passes the repository it
pushed (ghcr.io/<its owner>/kube-gpu-exporter), the same one here and a fork's own elsewhere, so
that installing the released chart takes no --set. This copies the chart, rewrites that one line of
values.yaml (an error unless it is there exactly once), and packages the copy with the `helm`
command where it is on PATH (the release workflow), else with helm-python-sdk's binding of the same
Helm Go code (the tests, offline). The archive is <name>-<chart version>.tgz; its Chart.yaml keeps
version and appVersion as committed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "kube-gpu-exporter"
PUBLISHED = "ghcr.io/kube-gpu-exporter/kube-gpu-exporter"  # what the release of github.com/kube-gpu-exporter pushes
DEFAULT_LINE = f"  repository: {PUBLISHED}\n"


def set_image_repository(values: str, repository: str) -> str:
    if values.count(DEFAULT_LINE) != 1:
        raise SystemExit(f"package_chart: values.yaml must have exactly one line {DEFAULT_LINE.strip()!r}")
    return values.replace(DEFAULT_LINE, f"  repository: {repository}\n")


def package(out: Path, repository: str | None = None, chart: Path = CHART) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / chart.name
        shutil.copytree(chart, copy)
        if repository:
            values = copy / "values.yaml"
            values.write_text(set_image_repository(values.read_text(), repository))
        helm = shutil.which("helm")
        if helm:
            proc = subprocess.run([helm, "package", str(copy), "--destination", str(out)], check=True,
                                  capture_output=True, text=True)
            return Path(proc.stdout.strip().rsplit(" ", 1)[-1])
        import helm_python

        return Path(helm_python.package(copy, destination=out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", required=True, type=Path, help="directory for the .tgz")
    parser.add_argument("--image-repository", help="the default image.repository of the packaged chart")
    args = parser.parse_args(argv)
    print(package(args.output, args.image_repository))
    return 0


if __name__ == "__main__":
    sys.exit(main())
