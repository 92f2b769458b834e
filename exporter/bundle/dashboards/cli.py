"""``kube-gpu-exporter dashboards``: render the Grafana dashboards to files, stdout or ConfigMaps."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exporter.bundle.common import add_label_arguments, fail, label_arguments, parse_key_values, write_output
from exporter.bundle.dashboards.options import DashboardOptions, DashboardOptionsError
from exporter.bundle.dashboards.render import DASHBOARDS, dashboard_uid, render_configmaps, render_dashboards


def build_parser() -> argparse.ArgumentParser:
    """The ``kube-gpu-exporter dashboards`` argument parser."""
    p = argparse.ArgumentParser(
        prog="kube-gpu-exporter dashboards",
        description="Render the Grafana dashboards (docs/dashboards.md): one JSON file per dashboard, "
        "or Grafana-sidecar ConfigMaps.",
    )
    d = DashboardOptions()
    add_label_arguments(p, "label telling clusters apart: adds a cluster variable (default: none)")
    p.add_argument("--uid-prefix", default=d.uid_prefix, help="dashboard uid prefix (default %(default)s)")
    p.add_argument("--title-prefix", default=d.title_prefix, help="dashboard title prefix (default %(default)r)")
    p.add_argument(
        "--tag",
        action="append",
        default=None,
        metavar="TAG",
        help="dashboard tag, repeatable (default: kube-gpu-exporter, gpu); the first links the dashboards",
    )
    p.add_argument("--refresh", default=d.refresh, help="auto-refresh interval (default %(default)s)")
    p.add_argument("--time-from", default=d.time_from, help="default time range start (default %(default)s)")
    p.add_argument("--format", choices=("json", "configmap"), default="json")
    p.add_argument("--only", choices=DASHBOARDS, default=None, help="json: render this dashboard only")
    p.add_argument("--namespace", default=None, help="configmap: metadata.namespace")
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="configmap: extra metadata label, repeatable (grafana_dashboard=1 is always set)",
    )
    p.add_argument(
        "-o",
        "--output",
        default=None,
        help="json: output directory (required; '-' with --only for stdout); configmap: output file (default stdout)",
    )
    return p


def options_from_args(args: argparse.Namespace) -> DashboardOptions:
    """Translate parsed CLI arguments into :class:`DashboardOptions` (not yet validated)."""
    return DashboardOptions(
        **label_arguments(args),
        uid_prefix=args.uid_prefix,
        title_prefix=args.title_prefix,
        tags=tuple(args.tag) if args.tag else DashboardOptions().tags,
        refresh=args.refresh,
        time_from=args.time_from,
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; ``argv`` are the arguments after ``dashboards``. Returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        opts = options_from_args(args)
        if args.format == "configmap":
            if args.only:
                raise DashboardOptionsError("--only applies to --format json")
            labels = parse_key_values(args.label, "--label", DashboardOptionsError)
            write_output(render_configmaps(opts, args.namespace, labels), args.output)
            if args.output not in (None, "-"):
                print(f"wrote {args.output}", file=sys.stderr)
            return 0
        if args.namespace or args.label:
            raise DashboardOptionsError("--namespace and --label apply to --format configmap")
        files = render_dashboards(opts)  # validates the options: their errors come first
        if args.output is None:  # not the current directory by surprise
            parser.print_usage(sys.stderr)
            raise DashboardOptionsError("-o DIR is required: the directory to write the JSON files to "
                                        "('-o -' with --only for stdout)")
        _write_json(files, dashboard_uid(opts, args.only) if args.only else None, args.output)
    except DashboardOptionsError as exc:
        return fail("dashboards", exc)
    return 0


def _write_json(files: dict[str, str], only: str | None, output: str | None) -> None:
    """Write the ``files`` (just dashboard ``only`` when given) to directory ``output``, or stdout for ``-``."""
    if only:
        files = {k: v for k, v in files.items() if k == f"{only}.json"}
    if output == "-":
        if len(files) != 1:
            raise DashboardOptionsError("-o -: choose one dashboard with --only")
        sys.stdout.write(next(iter(files.values())))
        return
    out_dir = Path(output or ".")
    if not out_dir.is_dir():
        raise DashboardOptionsError(f"-o: {str(out_dir)!r} is not a directory")
    for file_name, text in files.items():
        (out_dir / file_name).write_text(text, encoding="utf-8")
        print(f"wrote {out_dir / file_name}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
