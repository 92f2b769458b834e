"""The Dockerfile's build, run step by step on this machine, in fresh virtualenvs, with no network.

Base images cannot be pulled and containers cannot run here, so this runs the Dockerfile's own
instructions outside a container: the build stage's WORKDIR, ENV and COPY lines (.dockerignore
applied, the way tests/test_dockerfile.py reads it) and every RUN line verbatim through /bin/sh,
with the image's absolute paths (/src, /opt, /wheels) moved under a temporary root; `python` is
the base CPython 3.11 of the test virtualenv, as it is the python:3.11 base image's. pip takes its
files from the wheelhouse and no index (PIP_NO_INDEX and PIP_FIND_LINKS; the RUN lines' text is
untouched), so a lock that misses a package, a wrong hash or a wheel that does not build from the
copied files fails here. Then the runtime stage: the virtualenv it copies, its ENV and its
ENTRYPOINT, run from a directory outside the checkout. Not run: the runtime stage's groupadd,
useradd, the removal of the base's installers and USER (root-only changes to the system, checked
as text by tests/test_dockerfile.py; the built image itself is tests/test_image.py).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from exporter import __version__
from tests.release_support import (
    BASE_PYTHON,
    BUILD_LOCK,
    ROOT,
    RUNTIME_LOCK,
    distributions,
    offline_pip_env,
    parse_lock,
    wheelhouse_missing,
)
from tests.test_dockerfile import build_stage, dockerfile, excluded, final_stage

pytestmark = pytest.mark.e2e  # every test here starts sh

IMAGE_PATHS = re.compile(r"(?<![\w./-])/(src|opt|wheels)(?=/|\s|$)")
SCENARIO = ROOT / "examples" / "seed-cgpu-t4.yaml"


@dataclass
class Built:
    root: Path
    runtime_venv: Path
    env: dict[str, str]  # the runtime stage's environment, paths moved
    entrypoint: list[str]
    seconds: dict[str, float] = field(default_factory=dict)

    def entry(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*self.entrypoint, *args], cwd=cwd, env=self.env, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc


def mover(root: Path) -> Callable[[str], str]:
    return lambda text: IMAGE_PATHS.sub(lambda m: f"{root}/{m.group(1)}", text)


def expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), value)


def apply_env(args: str, env: dict[str, str], move: Callable[[str], str]) -> None:
    for word in shlex.split(args):
        key, _, value = word.partition("=")
        env[key] = move(expand(value, env))


def copy_into(args: str, cwd: Path, move: Callable[[str], str]) -> None:
    """COPY src... dest from the checkout as the build context, without what .dockerignore excludes."""
    *sources, dest = args.split()
    assert not any(s.startswith("--") for s in sources), args
    target = Path(move(dest)) if dest.startswith("/") else cwd / dest
    assert len(sources) == 1 or dest.endswith("/"), "several sources go into a directory"
    for src in sources:
        assert not excluded(src), f"COPY {src}: .dockerignore keeps it out of the build context"
        path = ROOT / src
        if path.is_dir():  # the directory's contents, into dest
            files = [f for f in path.rglob("*") if f.is_file() and not excluded(f.relative_to(ROOT).as_posix())]
            pairs = [(f, target / f.relative_to(path)) for f in files]
        else:
            pairs = [(path, target / path.name if dest.endswith("/") else target)]
        for a, b in pairs:
            b.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(a, b)


def build(root: Path) -> Built:
    move = mover(root)
    shim = root / "usr-local-bin"  # `python` of the base image
    shim.mkdir()
    for name in ("python", "python3"):
        (shim / name).symlink_to(BASE_PYTHON)
    base = offline_pip_env(PATH=f"{shim}:/usr/bin:/bin", HOME=str(root / "home"), LANG="C.UTF-8")
    env, cwd, seconds = dict(base), root, {}
    for ins in build_stage().instructions:
        if ins.cmd == "ENV":
            apply_env(ins.args, env, move)
        elif ins.cmd == "ARG":  # a build argument: the value this replay passes (its pip settings), else the default
            key, _, default = ins.args.partition("=")
            env.setdefault(key, default)
        elif ins.cmd == "WORKDIR":
            cwd = Path(move(ins.args))
            cwd.mkdir(parents=True, exist_ok=True)
        elif ins.cmd == "COPY":
            copy_into(ins.args, cwd, move)
        elif ins.cmd == "RUN":
            started = time.monotonic()
            proc = subprocess.run(["/bin/sh", "-c", move(ins.args)], cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=300)  # fmt: skip
            assert proc.returncode == 0, f"RUN (line {ins.line}) failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
            seconds[f"RUN line {ins.line}"] = round(time.monotonic() - started, 1)
        else:
            raise AssertionError(f"line {ins.line}: {ins.cmd} in the build stage is not replayed here")
    env, venv, entrypoint = dict(base), None, None
    for ins in final_stage().instructions:
        if ins.cmd == "ENV":
            apply_env(ins.args, env, move)
        elif ins.cmd == "COPY":
            words = ins.args.split()
            assert words[0] == "--from=build" and words[1] == words[2], "a virtualenv must keep its path"
            venv = Path(move(words[1]))
            assert (venv / "pyvenv.cfg").is_file(), f"COPY --from=build {words[1]}: not built"
        elif ins.cmd == "RUN":
            assert re.fullmatch(r"groupadd .*&& useradd .*", ins.args), "only the user is created there"
        elif ins.cmd == "ENTRYPOINT":
            entrypoint = json.loads(ins.args)
        else:
            assert ins.cmd in ("LABEL", "USER", "EXPOSE"), ins.cmd
    assert venv and entrypoint
    return Built(root, venv, env, entrypoint, seconds)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    missing = wheelhouse_missing(RUNTIME_LOCK, BUILD_LOCK)
    if missing:
        # never a skip: a skipped image test would pass CI without proving the image installs
        pytest.fail(f"the wheelhouse (.wheelhouse/) lacks {', '.join(missing[:3])}: scripts/test.sh downloads it")
    return build(tmp_path_factory.mktemp("image"))


def test_the_image_venv_holds_the_locked_packages_and_the_wheel_alone(built: Built, tmp_path: Path) -> None:
    found = distributions(built.runtime_venv / "bin" / "python", cwd=tmp_path)
    locked = {p.name: p.version for p in parse_lock(RUNTIME_LOCK).values()}
    assert found == {**locked, "kube-gpu-exporter": __version__}, "no pip, no setuptools, nothing unlocked"


def test_the_wheel_is_built_from_the_copied_source(built: Built) -> None:
    wheels = [p.name for p in (built.root / "wheels").iterdir()]
    assert wheels == [f"kube_gpu_exporter-{__version__}-py3-none-any.whl"]


def test_the_entrypoint_runs_the_installed_package_outside_the_checkout(built: Built, tmp_path: Path) -> None:
    assert built.entry("--version", cwd=tmp_path).stdout == f"kube-gpu-exporter {__version__}\n"
    rules = yaml.safe_load(built.entry("rules", cwd=tmp_path).stdout)
    assert rules["groups"] and all(g["rules"] for g in rules["groups"])
    metrics = built.entry("render", "--simulate", str(SCENARIO), cwd=tmp_path).stdout
    assert re.search(rf'^kube_gpu_exporter_build_info\{{version="{re.escape(__version__)}"\}} 1(\.0)?$', metrics, re.M)
    assert "nvidia_gpu_duty_cycle{" in metrics
    where = subprocess.run([str(built.runtime_venv / "bin" / "python"), "-I", "-c",
                            "import importlib.util, exporter, grpclib; print(exporter.__file__, grpclib.__file__); "
                            "print(importlib.util.find_spec('kubernetes'))"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert all(Path(p).is_relative_to(built.runtime_venv) for p in where[:2]), where
    assert where[2:] == ["None"], "the kubeconfig extra (the kubernetes client) is not in the image"
    print("build steps (s):", built.seconds)


def test_a_wrong_hash_stops_the_install(built: Built, tmp_path: Path) -> None:
    """The runtime stage's install line, run again with one hash of the lock changed, fails: the
    hashes are checked, not decoration."""
    (run_line,) = [i for i in build_stage().all("RUN") if "-r requirements.lock" in i.args]
    text = RUNTIME_LOCK.read_text()
    pin = parse_lock(RUNTIME_LOCK)["pyyaml"]
    for h in pin.hashes:
        text = text.replace(h, h[::-1])
    (tmp_path / "requirements.lock").write_text(text)
    command = mover(built.root)(run_line.args)
    # a fresh virtualenv of its own, by the same line; the tools' venv is the one built above
    command = command.replace(str(built.runtime_venv), str(tmp_path / "venv"))
    env = built.env | {"PATH": f"{built.root / 'usr-local-bin'}:/usr/bin:/bin"}
    proc = subprocess.run(["/bin/sh", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in proc.stderr and "pyyaml" in proc.stderr.lower(), proc.stderr
    assert not (tmp_path / "venv" / "bin" / "kube-gpu-exporter").exists()


def test_replay_covers_every_build_instruction() -> None:
    """The replay above knows every instruction the Dockerfile uses; a new kind fails it loudly."""
    _, stages = dockerfile()
    assert {i.cmd for s in stages for i in s.instructions} <= {
        "ARG", "ENV", "WORKDIR", "COPY", "RUN", "LABEL", "USER", "EXPOSE", "ENTRYPOINT"}
