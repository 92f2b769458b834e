"""docs/testing.md's "Which tests cover what" names every test module, and only existing ones."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- test map: start -->", "<!-- test map: end -->"


def mapped_modules(doc: str) -> list[str]:
    """The test module names in the map's table rows (between its two markers)."""
    assert doc.count(START) == 1 and doc.count(END) == 1, "docs/testing.md lost the test map's markers"
    table = doc.split(START, 1)[1].split(END, 1)[0]
    return re.findall(r"`(test_\w+\.py)`", table)


def test_the_map_names_every_test_module_once_and_nothing_else() -> None:
    named = mapped_modules((ROOT / "docs" / "testing.md").read_text())
    present = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    twice = sorted({m for m in named if named.count(m) > 1})
    assert not twice, f"docs/testing.md maps these test modules twice: {twice}"
    assert not present - set(named), f"add to docs/testing.md's test map: {sorted(present - set(named))}"
    assert not set(named) - present, f"docs/testing.md maps missing test modules: {sorted(set(named) - present)}"


def test_the_check_sees_a_module_left_out() -> None:
    doc = f"{START}\n| `exporter/top/` | `test_top.py`, `test_x.py` |\n{END}\n"
    assert mapped_modules(doc) == ["test_top.py", "test_x.py"]
    assert mapped_modules("outside the map: `test_pods.py`\n" + doc) == ["test_top.py", "test_x.py"]
