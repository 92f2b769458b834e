#!/usr/bin/env python3
"""Compare the hypothesis examples two test runs drew (docs/testing.md, "the same examples every run").

Each run is made with hypothesis's observability on, into its own storage directory:

    CI=true HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER=1 HYPOTHESIS_STORAGE_DIRECTORY=/tmp/hyp1 scripts/test.sh
    CI=true HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER=1 HYPOTHESIS_STORAGE_DIRECTORY=/tmp/hyp2 scripts/test.sh
    scripts/compare-hypothesis-draws.py /tmp/hyp1 /tmp/hyp2

A test case's representation is compared after masking what is not a draw: temporary paths and object
addresses of fixtures, and the print order of sets (it follows the per-process string hash seed).
Exit 1 when a property drew different examples, naming it.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

# tests/test_hypothesis_profiles.py runs this module under the exploring profile on purpose.
EXPLORING_ON_PURPOSE = ("test_tiny.py::",)
_MASKS = (re.compile(r"pytest-\d+"), re.compile(r"0x[0-9a-f]+"), re.compile(r"/tmp/[^\s'\"),]+"))


def draws(storage: Path) -> dict[str, list[str]]:
    """Property -> its test cases' representations, in the order they ran."""
    out: dict[str, list[str]] = defaultdict(list)
    for path in sorted((storage / "observed").glob("*_testcases.jsonl")):
        for line in path.read_text().splitlines():
            case = json.loads(line)
            out[case["property"]].append(case["representation"])
    return out


def normal(representation: str) -> str:
    for mask in _MASKS:
        representation = mask.sub("*", representation)
    return "".join(sorted(representation))  # set displays differ only in order: compare the multiset


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: compare-hypothesis-draws.py STORAGE_DIR_1 STORAGE_DIR_2", file=sys.stderr)
        return 2
    a, b = (draws(Path(d)) for d in argv)
    if not a or not b:
        print("no observations found: run with HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER=1", file=sys.stderr)
        return 2
    differing = sorted(p for p in a.keys() | b.keys() if not p.startswith(EXPLORING_ON_PURPOSE)
                       and [normal(r) for r in a.get(p, [])] != [normal(r) for r in b.get(p, [])])
    cases = sum(len(v) for p, v in a.items() if not p.startswith(EXPLORING_ON_PURPOSE))
    print(f"{len(a)} properties, {cases} test cases compared; {len(differing)} drew differently")
    for p in differing:
        print(f"  {p}: {len(a.get(p, []))} vs {len(b.get(p, []))} cases")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
