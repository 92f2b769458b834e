"""Shared by the release tests: the lock files, the wheelhouse, fresh virtualenvs without a network.

A lock file (requirements.lock, requirements-build.lock; scripts/lock.py writes them) is read here
by its own small parser, strict about the one shape the generator writes, so a hand edit that pip
would still accept (an unpinned line, an option, a missing hash) fails the tests.

The wheelhouse, ``.wheelhouse/`` in the checkout, holds the locked wheels for this machine;
scripts/test.sh downloads it (hash-checked) next to installing the test virtualenv, so the tests
that install from the locks need no network.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_LOCK = ROOT / "requirements.lock"
BUILD_LOCK = ROOT / "requirements-build.lock"
KUBECONFIG_LOCK = ROOT / "requirements-kubeconfig.lock"  # the kubeconfig extra, beside RUNTIME_LOCK
WHEELHOUSE = ROOT / ".wheelhouse"
# the base interpreter of the test virtualenv: what `python` is in the image's python:3.11 base
BASE_PYTHON = Path(getattr(sys, "_base_executable", sys.executable))

_PIN = re.compile(r"([a-z0-9]+(?:-[a-z0-9]+)*)==([A-Za-z0-9.+!-]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class Pin:
    name: str  # canonical (PEP 503)
    version: str
    hashes: tuple[str, ...]
    line: int


def parse_lock(path: Path) -> dict[str, Pin]:
    """Canonical name -> Pin; AssertionError naming the line for anything but the generator's shape."""
    pins: dict[str, Pin] = {}
    lines = path.read_text().splitlines()
    n = 0
    while n < len(lines):
        raw = lines[n]
        n += 1
        if not raw.strip() or raw.startswith("#"):
            continue
        start = n
        logical = [raw]
        while logical[-1].endswith("\\"):
            assert n < len(lines), f"{path.name}:{start}: ends inside a continued line"
            logical.append(lines[n])
            n += 1
        words = " ".join(part.rstrip("\\").strip() for part in logical).split()
        m = _PIN.fullmatch(words[0])
        assert m, f"{path.name}:{start}: {words[0]!r} is not name==version with a canonical name"
        hashes = []
        for word in words[1:]:
            h = _HASH.fullmatch(word)
            assert h, f"{path.name}:{start}: only --hash=sha256:<64 hex> may follow the pin, not {word!r}"
            hashes.append(h.group(1))
        assert hashes, f"{path.name}:{start}: {words[0]} has no hash"
        assert len(set(hashes)) == len(hashes), f"{path.name}:{start}: a hash is repeated"
        name = m.group(1)
        assert name == canonicalize_name(name) and name not in pins, f"{path.name}:{start}: {name}"
        pins[name] = Pin(name, m.group(2), tuple(hashes), start)
    return pins


def wheel_pin(filename: str) -> tuple[str, str]:
    """(canonical name, version) of a wheel file name."""
    name, version = filename.split("-")[:2]
    return canonicalize_name(name), version


def wheelhouse_missing(*locks: Path) -> list[str]:
    """The pins of ``locks`` that have no wheel in the wheelhouse (empty: it can install them offline)."""
    have = {wheel_pin(p.name) for p in WHEELHOUSE.glob("*.whl")} if WHEELHOUSE.is_dir() else set()
    return [f"{p.name}=={p.version}" for lock in locks for p in parse_lock(lock).values()
            if (p.name, p.version) not in have]


def offline_pip_env(**extra: str) -> dict[str, str]:
    """The environment without this machine's pip settings (mirrors, find-links) or virtualenv, and
    pip told to use the wheelhouse and no index: nothing can come from a network."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PIP_", "PYTHON")) and k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(WHEELHOUSE),
               PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120,
        ) -> subprocess.CompletedProcess[str]:
    """Run, failing the test with the command's output when it fails."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def checkout_files() -> list[str]:
    """The checkout's files, committed or not, less what .gitignore ignores: what a clone would hold
    once the work in progress is committed (no .venv, egg-info, build/ or caches)."""
    out = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT)
    return sorted(p for p in out.stdout.split("\0") if p and (ROOT / p).is_file())


def distributions(python: Path, cwd: Path) -> dict[str, str]:
    """Canonical name -> version of every distribution ``python`` sees, in isolated mode."""
    code = ("import importlib.metadata as m\n"
            "for d in m.distributions(): print(d.metadata['Name'], d.version)")
    out = run([str(python), "-I", "-c", code], cwd=cwd, env=offline_pip_env()).stdout
    return {canonicalize_name(name): version for name, version in (line.split() for line in out.splitlines())}


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py as a module (the scripts directory is no package)."""
    spec = importlib.util.spec_from_file_location(f"scripts_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
