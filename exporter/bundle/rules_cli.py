"""``kube-gpu-exporter rules``: the command line of the recording-rule bundle and its federation tier.

Kept apart from the generators: ``rules.py`` renders the bundle, ``federation.py`` the global tier
built from it; this module parses the flags and picks one.
"""

from __future__ import annotations

import argparse
import sys

from exporter.bundle.common import add_prometheusrule_arguments, fail, rule_file_main, write_output
from exporter.bundle.federation import render_federation_job, render_global_prometheusrule, render_global_rules
from exporter.bundle.option_table import add_option_arguments, option_values
from exporter.bundle.rules import RULE_TABLE, RuleOptions, RuleOptionsError, render_prometheusrule, render_rules


def build_parser() -> argparse.ArgumentParser:
    """The ``kube-gpu-exporter rules`` argument parser."""
    p = argparse.ArgumentParser(
        prog="kube-gpu-exporter rules",
        description="Render the GPU recording-rule bundle (container/pod/node/workload/namespace/cluster).",
    )
    add_option_arguments(p, RULE_TABLE)  # the label flags, then --interval, --rate-window, --levels
    add_prometheusrule_arguments(
        p, "kube-gpu-exporter", "PrometheusRule metadata label, repeatable (e.g. release=kube-prometheus-stack)"
    )
    p.add_argument(
        "--tier",
        choices=("cluster", "global"),
        default="cluster",
        help="cluster: this bundle; global: the rule file of a Prometheus federating the clusters' records "
        "(exporter.bundle.federation; needs --cluster-label). Default %(default)s",
    )
    p.add_argument(
        "--federation-selectors",
        action="store_true",
        help="print the /federate scrape job (honor_labels, match[] selectors) of the federating Prometheus",
    )
    p.add_argument("-o", "--output", default="-", help="output file (default stdout)")
    return p


def options_from_args(args: argparse.Namespace) -> RuleOptions:
    """Translate parsed CLI arguments into :class:`RuleOptions` (not yet validated)."""
    return RuleOptions(**option_values(args, RULE_TABLE, RuleOptionsError))


def _federation_main(args: argparse.Namespace) -> int:
    """``kube-gpu-exporter rules --tier global`` / ``--federation-selectors`` (parsed by build_parser)."""
    if args.federation_selectors:
        try:
            if args.tier != "cluster" or args.format != "plain":
                raise RuleOptionsError("--federation-selectors prints a scrape job: no --tier or --format with it")
            text = render_federation_job(options_from_args(args))
        except RuleOptionsError as exc:
            return fail("rules", exc)
        write_output(text, args.output)
        return 0
    if args.name == "kube-gpu-exporter":
        args.name = "kube-gpu-exporter-global"  # the bundle's default name: the global object gets its own
    return rule_file_main(
        "rules", RuleOptionsError, args, options_from_args, render_global_rules, render_global_prometheusrule
    )


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; ``argv`` are the arguments after ``rules``. Returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.tier != "cluster" or args.federation_selectors:
        return _federation_main(args)
    return rule_file_main("rules", RuleOptionsError, args, options_from_args, render_rules, render_prometheusrule)


if __name__ == "__main__":
    sys.exit(main())
