"""Session setup shared by every test module: hypothesis profiles, the fast lane's e2e guard, shared doubles.

``ci`` is derandomized: the same examples every run, so a red CI run is red again on a laptop.
``explore`` (the default outside CI) draws new examples each run and keeps failures in .hypothesis/.
``HYPOTHESIS_PROFILE=<name>`` picks one explicitly; otherwise ``CI`` set (as .ci/run does) means ``ci``.
A run that leaves the e2e tests out (``-m "not e2e"``) installs tests/e2e_guard.py. See docs/testing.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path

import pytest
from hypothesis import settings

from tests import e2e_guard
from tests.fake_nvml.harness import Harness
from tests.k8s_double import ApiServerDouble

# deadline=None in both: 2 shared cores make a 200 ms deadline a flake, not a finding.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None)


def profile_name(environ: Mapping[str, str]) -> str:
    """The profile a run with ``environ`` uses."""
    explicit = environ.get("HYPOTHESIS_PROFILE", "").strip()
    if explicit:
        return explicit
    ci = environ.get("CI", "").strip().lower()
    return "ci" if ci not in ("", "0", "false", "no") else "explore"


# Loaded at import, before any test module: a module's @settings(...) takes the loaded profile as its
# parent when it is decorated, overriding only the keys it names.
settings.load_profile(profile_name(os.environ))


def excludes_e2e(markexpr: str) -> bool:
    """Whether ``-m`` leaves the e2e tests out (the fast lane: ``-m "not e2e"``, alone or with more)."""
    return re.search(r"\bnot\s+e2e\b", markexpr or "") is not None


def pytest_configure(config: pytest.Config) -> None:
    if excludes_e2e(config.option.markexpr):
        e2e_guard.install()  # a test the lane still runs must start nothing: its missing mark shows here


@pytest.fixture(autouse=True)
def _no_unmarked_e2e() -> Iterator[None]:
    """Fail a test that started a process or server in the fast lane, even if its code swallowed the error."""
    yield
    violations = e2e_guard.take_violations()
    if violations:
        pytest.fail("\n".join(dict.fromkeys(violations)), pytrace=False)


# ---- doubles shared by many modules: built once, or fresh per test where they hold state ------------

@pytest.fixture(scope="session")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake ``libnvidia-ml.so.1`` (tests/fake_nvml), compiled once per session (cached by source hash)."""
    from tests.fake_nvml import build_fake_nvml

    return build_fake_nvml(tmp_path_factory.mktemp("fake_nvml"))


@pytest.fixture(scope="session")
def fake_libs(lib: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both variants of the fake: today's driver and one before 510 (no ``*_v3``, no GPM)."""
    from tests.fake_nvml import build_fake_nvml

    return {"current": lib, "old": build_fake_nvml(tmp_path_factory.mktemp("fake_nvml_old"), old_driver=True)}


@pytest.fixture
def nvml(fake_libs: dict[str, Path], tmp_path: Path) -> Iterator[Harness]:
    """A harness that loads the fake with a scenario and builds backends on a hand-moved clock."""
    with ExitStack() as stack:
        yield Harness(fake_libs, tmp_path, stack)


@pytest.fixture
def double() -> Iterator[ApiServerDouble]:
    """A fresh API server double (tests/k8s_double) per test: it holds objects and counts requests."""
    with ApiServerDouble() as api:
        yield api
