"""Command line for humans: ``python -m tests.fake_nvml build DIR`` / ``convert SCENARIO OUT``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.fake_nvml import FakeNvmlError, build_fake_nvml, load_scenario_file, write_config


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tests.fake_nvml", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="compile DIR/libnvidia-ml.so.1")
    build.add_argument("dir", type=Path)
    build.add_argument("--old-driver", action="store_true", help="leave out the _v3 process symbols")
    convert = sub.add_parser("convert", help="write the fake's config for a scenario YAML")
    convert.add_argument("scenario", type=Path)
    convert.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build_fake_nvml(args.dir, old_driver=args.old_driver))
        else:
            print(write_config(load_scenario_file(args.scenario), args.out))
    except (FakeNvmlError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
