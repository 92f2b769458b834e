"""CI draws the same hypothesis examples every run; outside CI they explore (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from tests.conftest import profile_name

ROOT = Path(__file__).resolve().parent.parent
TINY = '''
import json, os
from hypothesis import given, settings, strategies as st

@given(st.integers(), st.text())
@settings(max_examples=25)  # an explicit setting of its own, as many of our tests have
def test_draw(n, s):
    with open(os.environ["DRAWN"], "a") as f:
        f.write(json.dumps([n, s, settings.default.derandomize]) + "\\n")
'''


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, "explore"),
    ({"CI": "true"}, "ci"),
    ({"CI": "1"}, "ci"),
    ({"CI": "false"}, "explore"),
    ({"CI": ""}, "explore"),
    ({"CI": "true", "HYPOTHESIS_PROFILE": "explore"}, "explore"),
    ({"HYPOTHESIS_PROFILE": "ci"}, "ci"),
])
def test_the_profile_follows_ci_unless_named(environ: dict[str, str], expected: str) -> None:
    assert profile_name(environ) == expected


def test_explicit_settings_keep_the_profiles_other_keys() -> None:
    ci = settings.get_profile("ci")
    own = settings(parent=ci, max_examples=7)
    assert (own.max_examples, own.derandomize, own.database, own.deadline) == (7, True, None, None)
    # This run's own decorators take the loaded profile as parent, as conftest loads it first.
    assert settings(max_examples=7).derandomize == settings.get_profile(profile_name(os.environ)).derandomize


def _draws(tmp_path: Path, run: str, **environ: str) -> list[list[object]]:
    """Run the tiny test module under tests/conftest.py in a fresh pytest; its drawn examples."""
    (tmp_path / "test_tiny.py").write_text(TINY)
    drawn = tmp_path / f"{run}.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    env |= {"PYTHONPATH": str(ROOT), "DRAWN": str(drawn), **environ}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "test_tiny.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in drawn.read_text().splitlines()]


@pytest.mark.e2e
def test_ci_draws_the_same_examples_every_run(tmp_path: Path) -> None:
    first, second = _draws(tmp_path, "ci1", CI="true"), _draws(tmp_path, "ci2", CI="true")
    assert first == second
    assert len(first) == 25 and all(derandomized for *_, derandomized in first)
    explored = _draws(tmp_path, "explore", HYPOTHESIS_PROFILE="explore")
    assert not any(derandomized for *_, derandomized in explored)
    assert explored != first  # 25 fresh draws of integers and text: equal only by a miracle
