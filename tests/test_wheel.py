"""The sdist and the wheel, built as a release builds them and used outside the checkout.

From a copy of the checkout (its files less what .gitignore ignores, so no stale egg-info or
build/ leaks in): setuptools' PEP 517 hooks build the sdist, and the wheel is built from the
unpacked sdist, as `python -m build` does, so a file the sdist forgets is missing from the wheel
too. No build isolation and no index: the backend is the test virtualenv's setuptools (the test
extra and requirements-build.lock bring it). The wheel is installed with --no-deps into a fresh
virtualenv that sees the test virtualenv's packages for its dependencies, and the console script
runs from a directory outside the checkout: `rules`, `alerts` and `dashboards` find their
templates in the installed package.
"""

from __future__ import annotations

import email.parser
import json
import shutil
import site
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from exporter import __version__
from tests.release_support import BASE_PYTHON, ROOT, checkout_files, offline_pip_env, run

pytestmark = pytest.mark.e2e  # every test here starts git

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
HOOK = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"
NAME = f"kube_gpu_exporter-{__version__}"


@dataclass
class Dists:
    sdist: Path
    wheel: Path
    venv: Path
    elsewhere: Path

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run([str(self.venv / "bin" / "kube-gpu-exporter"), *args], cwd=self.elsewhere,
                   env=offline_pip_env(PATH="/usr/bin:/bin"), timeout=60)  # fmt: skip


def build_hook(hook: str, source: Path, out: Path) -> Path:
    out.mkdir()
    name = run([sys.executable, "-c", HOOK, hook, str(out)], cwd=source, env=offline_pip_env()).stdout.split()[-1]
    return out / name


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    tmp = tmp_path_factory.mktemp("dists")
    checkout = tmp / "checkout"
    for rel in checkout_files():
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, checkout / rel)
    sdist = build_hook("build_sdist", checkout, tmp / "sdist")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "unpacked", filter="data")
    wheel = build_hook("build_wheel", tmp / "unpacked" / NAME, tmp / "wheel")
    venv = tmp / "venv"
    run([str(BASE_PYTHON), "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps",
         "--no-compile", "--quiet", str(wheel)], cwd=tmp, env=offline_pip_env())  # fmt: skip
    # the dependencies: the test virtualenv's packages, after the venv's own (a plain path entry, so
    # the test venv's .pth files, the editable install of this checkout among them, are not run)
    (purelib,) = {Path(p) for p in run([str(venv / "bin" / "python"), "-I", "-c",
                  "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=tmp).stdout.split()}
    (purelib / "test-venv-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return Dists(sdist, wheel, venv, elsewhere)


def test_the_sdist_holds_the_source_templates_readme_and_license(dists: Dists) -> None:
    with tarfile.open(dists.sdist) as tar:
        names = {n.removeprefix(f"{NAME}/") for n in tar.getnames()}
    assert {"PKG-INFO", "pyproject.toml", "README.md", "LICENSE", "exporter/_version.py"} <= names
    package = {p for p in checkout_files() if p.startswith("exporter/")}
    assert package <= names, f"missing from the sdist: {sorted(package - names)[:5]}"
    templates = {p for p in package if p.endswith(".j2")}
    assert templates, "the package has jinja2 templates"


def test_the_wheel_holds_the_package_data_and_the_metadata(dists: Dists) -> None:
    assert dists.wheel.name == f"{NAME}-py3-none-any.whl"
    with zipfile.ZipFile(dists.wheel) as zf:
        names = set(zf.namelist())
        meta = email.parser.Parser().parsestr(zf.read(f"{NAME}.dist-info/METADATA").decode())
        entry_points = zf.read(f"{NAME}.dist-info/entry_points.txt").decode()
    package = {p for p in checkout_files() if p.startswith("exporter/")}
    assert package <= names, f"missing from the wheel: {sorted(package - names)[:5]}"
    assert not [n for n in names if n.startswith(("tests/", "helm/", "scripts/")) or "__pycache__" in n]
    assert f"{NAME}.dist-info/licenses/LICENSE" in names
    assert meta["Name"] == "kube-gpu-exporter" and meta["Version"] == __version__
    assert meta["License-Expression"] == PYPROJECT["project"]["license"]
    assert meta["Requires-Python"] == PYPROJECT["project"]["requires-python"]
    runtime = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    assert sorted(runtime) == sorted(d.split("#")[0].strip().replace(" ", "") for d in
                                     PYPROJECT["project"]["dependencies"])
    assert "kube-gpu-exporter = exporter.shell.cli:main" in entry_points


def test_version_outside_the_checkout(dists: Dists) -> None:
    assert dists.cli("--version").stdout == f"kube-gpu-exporter {__version__}\n"
    code = "import exporter, importlib.metadata as m; print(exporter.__file__); print(m.version('kube-gpu-exporter'))"
    where, version = run([str(dists.venv / "bin" / "python"), "-I", "-c", code], cwd=dists.elsewhere).stdout.split()
    assert Path(where).is_relative_to(dists.venv) and version == __version__


def test_rules_and_alerts_render_from_the_installed_templates(dists: Dists) -> None:
    for command in ("rules", "alerts"):
        doc = yaml.safe_load(dists.cli(command).stdout)
        assert doc["groups"], command
        assert all(g["name"] and g["rules"] for g in doc["groups"]), command
    rules = yaml.safe_load(dists.cli("rules").stdout)
    assert any(r.get("record") == "k8s_cluster_gpu_used" for g in rules["groups"] for r in g["rules"])
    alerts = yaml.safe_load(dists.cli("alerts").stdout)
    assert all("alert" in r for g in alerts["groups"] for r in g["rules"] if "record" not in r)


def test_dashboards_write_valid_json(dists: Dists) -> None:
    out = dists.elsewhere / "dashboards"
    out.mkdir()
    dists.cli("dashboards", "-o", str(out))
    boards = sorted(out.glob("*.json"))
    assert len(boards) == len(list((ROOT / "dashboards").glob("*.json"))) >= 3
    for board in boards:
        doc = json.loads(board.read_text())
        assert doc["title"] and doc["panels"], board.name
        assert board.read_text() == (ROOT / "dashboards" / board.name).read_text(), "same as the committed board"
