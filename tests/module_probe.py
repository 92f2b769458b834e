"""Run the exporter daemon exactly as ``python -m exporter`` does and record what it loaded.

    python tests/module_probe.py OUT.json [--interval S] -- EXPORTER_FLAGS...

At exit (SIGTERM ends the daemon cleanly) it writes ``{"modules": sorted(sys.modules)}`` to OUT.json:
every module the daemon imported while it ran, lazy ones included. ``--interval S`` overrides the
sampling interval past the flag's lower bound (``bench/footprint.py`` runs thousands of cycles
back to back with it); the rest of the configuration comes from the flags, unchanged.
"""

from __future__ import annotations

import atexit
import json
import sys
from dataclasses import replace
from pathlib import Path


def main(argv: list[str]) -> int:
    out, rest = Path(argv[0]), argv[1:]
    interval = None
    if rest[:1] == ["--interval"]:
        interval, rest = float(rest[1]), rest[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    atexit.register(lambda: out.write_text(json.dumps({"modules": sorted(sys.modules)})))
    from exporter.shell import cli

    if interval is not None:
        load = cli.load_config
        cli.load_config = lambda args, **kw: replace(load(args, **kw), interval=interval)
    return cli.main(rest)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    raise SystemExit(main(sys.argv[1:]))
