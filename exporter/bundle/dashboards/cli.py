"""``kube-gpu-exporter dashboards``: render the Grafana dashboards to files, stdout or ConfigMaps."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exporter.bundle.common import fail, parse_key_values, write_output
from exporter.bundle.dashboards.options import DASHBOARD_TABLE, DashboardOptions, DashboardOptionsError
from exporter.bundle.dashboards.render import DASHBOARDS, dashboard_uid, render_configmaps, render_dashboards
from exporter.bundle.option_table import add_option_arguments, option_values


def build_parser() -> argparse.ArgumentParser:
    """The ``kube-gpu-exporter dashboards`` argument parser."""
    p = argparse.ArgumentParser(
        prog="kube-gpu-exporter dashboards",
        description="Render the Grafana dashboards (docs/dashboards.md): one JSON file per dashboard, "
        "or Grafana-sidecar ConfigMaps.",
    )
    add_option_arguments(p, DASHBOARD_TABLE)  # the label flags, then --uid-prefix ... --time-from
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
    return DashboardOptions(**option_values(args, DASHBOARD_TABLE, DashboardOptionsError))


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
