"""``kube-gpu-exporter top``: a refreshing terminal view of one exporter's ``/status.json``.

Textual is an optional extra (``pip install '.[top]'`` from a checkout): it is imported only here, when
the subcommand runs, so the daemon never loads it. The app lives in top_app.py, the rows in top_rows.py.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

# The package is not on PyPI: from a checkout the extra is '.[top]' (or textual itself, next to an installed wheel)
INSTALL_HINT = "kube-gpu-exporter top: needs textual: pip install '.[top]' from a checkout (or pip install textual)"


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be in (0, 3600], got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``kube-gpu-exporter top`` argument parser."""
    p = argparse.ArgumentParser(
        prog="kube-gpu-exporter top",
        description="A refreshing terminal view of a running exporter's /status.json: GPUs, containers with "
                    "their grant and use, unaccounted processes, Xids and the exporter's subsystems; with "
                    "--prometheus, of the cluster from the recorded series. q quits, r refreshes now.",
    )
    p.add_argument("--url", default="http://127.0.0.1:9400",
                   help="the exporter's base URL or its /status.json (default %(default)s)")
    p.add_argument("--prometheus", metavar="URL",
                   help="a Prometheus with the recorded series (kube-gpu-exporter rules): show the cluster view "
                        "(top workloads, namespaces, nodes, idle allocations) instead of one node")
    p.add_argument("--interval", type=_positive, default=2.0, help="refresh interval in seconds (default 2)")
    p.add_argument("--timeout", type=_positive, default=2.0, help="request timeout in seconds (default 2)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; ``argv`` are the arguments after ``top``. Returns the exit status."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        from exporter.top.app import ClusterApp, TopApp
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    app_class, url = (TopApp, args.url) if args.prometheus is None else (ClusterApp, args.prometheus)
    app_class(url, interval=args.interval, timeout=args.timeout).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
