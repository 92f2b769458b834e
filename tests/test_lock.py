"""requirements.lock, requirements-kubeconfig.lock and requirements-build.lock: pinned, hashed, complete,
and what the suite runs.

Offline: the lock's shape is read strictly (tests/release_support.parse_lock), its coverage is
checked against pyproject.toml and the installed packages' own metadata (every dependency of a
locked package, markers evaluated for CPython 3.11 on Linux x86_64 and aarch64, is locked too, and
nothing else is), and the test virtualenv must hold exactly the locked versions (scripts/test.sh
installs the lock first), so the suite tests the dependencies the image ships. The SBOM that
scripts/sbom.py writes from the lock lists every locked package. Installing from the lock, as the
Dockerfile does, is tests/test_dockerfile_install.py.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from exporter import __version__
from tests.release_support import BUILD_LOCK, KUBECONFIG_LOCK, ROOT, RUNTIME_LOCK, offline_pip_env, parse_lock, run

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
RUNTIME = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
KUBECONFIG = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["kubeconfig"]]
LOCKS = (RUNTIME_LOCK, KUBECONFIG_LOCK, BUILD_LOCK)
BUILD = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]] + [Requirement("build")]
RELOCK = "run `python scripts/lock.py` (docs/release.md#dependencies)"


def _applies(req: Requirement) -> bool:
    if req.marker is None:
        return True
    base = default_environment() | {"python_version": "3.11", "sys_platform": "linux", "platform_system": "Linux",
                                    "os_name": "posix", "implementation_name": "cpython", "extra": ""}
    return any(req.marker.evaluate(base | {"platform_machine": arch}) for arch in ("x86_64", "aarch64"))


def _closure(roots: list[Requirement]) -> set[str]:
    """Canonical names that ``roots`` need, by the installed distributions' metadata."""
    seen: set[str] = set()
    todo = [r for r in roots if _applies(r)]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        for dep in importlib.metadata.requires(name) or []:
            dep_req = Requirement(dep)
            if _applies(dep_req):
                todo.append(dep_req)
    return seen


def test_the_locks_have_the_generators_shape() -> None:
    for lock in LOCKS:
        pins = parse_lock(lock)
        assert list(pins) == sorted(pins), f"{lock.name}: sorted by name, as scripts/lock.py writes it"
        assert "python scripts/lock.py" in lock.read_text().split("\n", 3)[1], f"{lock.name}: the header says how"


def test_every_runtime_dependency_is_locked_at_a_version_it_allows() -> None:
    pins = parse_lock(RUNTIME_LOCK)
    for req in RUNTIME:
        pin = pins.get(canonicalize_name(req.name))
        assert pin, f"{req.name} is a runtime dependency but not in requirements.lock: {RELOCK}"
        assert req.specifier.contains(pin.version, prereleases=True), f"{req} does not allow {pin.version}: {RELOCK}"
    kube = parse_lock(KUBECONFIG_LOCK)
    for req in KUBECONFIG:
        pin = kube.get(canonicalize_name(req.name))
        assert pin and req.specifier.contains(pin.version), f"{req} in requirements-kubeconfig.lock: {RELOCK}"
    build = parse_lock(BUILD_LOCK)
    for req in BUILD:
        pin = build.get(canonicalize_name(req.name))
        assert pin and req.specifier.contains(pin.version), f"{req} in requirements-build.lock: {RELOCK}"


def test_the_test_virtualenv_runs_the_locked_versions() -> None:
    """The suite tests what the image ships: scripts/test.sh installs the locks before the test extra."""
    for lock in LOCKS:
        for pin in parse_lock(lock).values():
            try:
                installed = importlib.metadata.version(pin.name)
            except importlib.metadata.PackageNotFoundError:
                installed = None
            assert installed == pin.version, (
                f"{lock.name} pins {pin.name}=={pin.version}, the test venv has {installed}: run scripts/test.sh, "
                f"or {RELOCK} if the test extra needs another version")


def test_the_runtime_lock_is_closed_and_holds_nothing_else() -> None:
    locked = set(parse_lock(RUNTIME_LOCK))
    needed = _closure(RUNTIME)
    assert needed - locked == set(), f"needed but not locked: {sorted(needed - locked)}: {RELOCK}"
    assert locked - needed == set(), f"locked but needed by nothing: {sorted(locked - needed)}: {RELOCK}"
    # the kubeconfig extra's lock: what the extra adds to the runtime's, nothing of it twice
    kube_locked, kube_needed = set(parse_lock(KUBECONFIG_LOCK)), _closure(RUNTIME + KUBECONFIG) - needed
    assert kube_locked == kube_needed, f"requirements-kubeconfig.lock: {RELOCK}"
    assert "kubernetes" in kube_locked and "kubernetes" not in locked, "the image leaves the kubeconfig extra out"
    build_locked, build_needed = set(parse_lock(BUILD_LOCK)), _closure(BUILD)
    assert build_locked == build_needed, f"requirements-build.lock: {RELOCK}"


def test_binary_packages_have_a_wheel_hash_per_platform() -> None:
    """A compiled package needs its x86_64 and its aarch64 wheel's hash; a pure one has one file."""
    for lock in LOCKS:
        for pin in parse_lock(lock).values():
            tags = [line.split(":", 1)[1].strip() for line in
                    (importlib.metadata.distribution(pin.name).read_text("WHEEL") or "").splitlines()
                    if line.startswith("Tag:")]
            pure = all(t.endswith("-none-any") for t in tags)
            assert len(pin.hashes) == (1 if pure else 2), f"{lock.name}: {pin.name} ({tags}) has {len(pin.hashes)}"


@pytest.mark.e2e
def test_pip_reads_the_locks_in_hash_checking_mode(tmp_path) -> None:
    """pip itself parses the lock files with --require-hashes, offline: everything is already installed at
    the pinned version (the test above), so nothing would be fetched."""
    report = tmp_path / "report.json"
    run([sys.executable, "-m", "pip", "install", "--dry-run", "--require-hashes", "--no-deps", "--quiet",
         "--report", str(report), "-r", str(RUNTIME_LOCK), "-r", str(KUBECONFIG_LOCK), "-r", str(BUILD_LOCK)],
        cwd=tmp_path,
        env=offline_pip_env())  # fmt: skip
    assert json.loads(report.read_text())["install"] == []


def _sbom(tmp_path, name: str) -> dict:
    out = tmp_path / name
    subprocess.run([sys.executable, str(ROOT / "scripts" / "sbom.py"), "-o", str(out)], check=True, cwd=tmp_path,
                   env=os.environ | {"SOURCE_DATE_EPOCH": "1767225600"}, timeout=60)  # fmt: skip
    return json.loads(out.read_text())


@pytest.mark.e2e
def test_the_sbom_lists_every_locked_package_with_its_hashes(tmp_path) -> None:
    doc = _sbom(tmp_path, "a.cdx.json")
    assert (doc["bomFormat"], doc["specVersion"]) == ("CycloneDX", "1.5")
    assert doc["serialNumber"].startswith("urn:uuid:") and doc["metadata"]["timestamp"] == "2026-01-01T00:00:00Z"
    pins = parse_lock(RUNTIME_LOCK)
    components = {c["purl"]: c for c in doc["components"]}
    assert set(components) == {f"pkg:pypi/{p.name}@{p.version}" for p in pins.values()}
    for pin in pins.values():
        c = components[f"pkg:pypi/{pin.name}@{pin.version}"]
        assert (c["name"], c["version"], c["type"]) == (pin.name, pin.version, "library")
        assert [h["content"] for h in c["hashes"] if h["alg"] == "SHA-256"] == list(pin.hashes)
    root = doc["metadata"]["component"]
    assert (root["name"], root["version"]) == ("kube-gpu-exporter", __version__)
    assert root["licenses"] == [{"expression": PYPROJECT["project"]["license"]}]
    (deps,) = doc["dependencies"]
    assert deps["ref"] == root["bom-ref"]
    assert sorted(deps["dependsOn"]) == sorted(
        f"pkg:pypi/{canonicalize_name(r.name)}@{pins[canonicalize_name(r.name)].version}" for r in RUNTIME)
    refs = {c["bom-ref"] for c in doc["components"]}
    assert set(deps["dependsOn"]) <= refs
    _sbom(tmp_path, "b.cdx.json")
    assert (tmp_path / "a.cdx.json").read_bytes() == (tmp_path / "b.cdx.json").read_bytes(), "deterministic"
