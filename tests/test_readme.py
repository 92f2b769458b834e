"""The README's newcomer path works as written: every command block of its "Try it" section runs on a
fresh copy of the repository (its tracked and untracked, not ignored, files: no ``.venv``), each command
bounded in time.

A command that starts the exporter (``scripts/run-simulated.sh``) runs in its own session until the end
of the test, which polls its ``/readyz``; ``kube-gpu-exporter top`` runs in a pseudo-terminal until it
has drawn the node, then gets ``q``; any other command must exit 0 within its bound. The only change
to what is written: each ``127.0.0.1:<port>`` of the section (and the scripts' default, 9400) is moved to
a free port, so that the test never meets another server.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import termios
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.prom_support import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INSTALL_S = 600.0  # a command (pip install) may download and build
READY_S = 300.0  # the first run-simulated.sh creates .venv and installs into it
TOP_S = 60.0


def try_it(text: str) -> str:
    """The "Try it" section of the README."""
    start = text.index("## Try it")
    return text[start:text.index("\n## ", start + 1)]


def command_blocks(section: str) -> list[list[str]]:
    """The ``sh`` blocks of ``section``, each as its command lines (comments and blank lines left out)."""
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)
    return [[line for line in b.splitlines() if line.strip() and not line.lstrip().startswith("#")] for b in blocks]


def test_the_section_has_the_blocks_a_newcomer_needs() -> None:
    blocks = command_blocks(try_it(README.read_text()))
    commands = [c for b in blocks for c in b]
    assert commands[0] == "scripts/run-simulated.sh examples/seed-cgpu-t4.yaml"
    assert ".venv/bin/pip install '.[top]'" in commands  # the package is not on PyPI
    assert any(c.startswith(".venv/bin/kube-gpu-exporter top") for c in commands)  # the console script's path
    assert any("--dcgm-compat" in c for c in commands) and any("trouble-node.yaml" in c for c in commands)


def test_every_example_is_named() -> None:
    text = README.read_text()
    section = try_it(text)
    for entry in sorted((ROOT / "examples").iterdir()):
        name = entry.name + ("/" if entry.is_dir() else "")
        named = f"examples/{name}" in text or f"`{name}`" in section
        realworld = entry.name.startswith("realworld-") and "`realworld-*.yaml`" in section
        assert named or realworld, f"README.md does not name examples/{name}"
    assert "kube-gpu-exporter[top]" not in text and not re.search(r"about [\d,]+ tests", text)


def fresh_copy(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def ready(url: str, proc: subprocess.Popen, bound: float) -> None:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{url}: the exporter exited ({proc.returncode})"
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)  # polling: the first start installs into .venv
    raise AssertionError(f"{url}: not ready in {bound:.0f} s")


def run_top(command: str, cwd: Path, env: dict[str, str], expect: str) -> None:
    """``top`` in a pseudo-terminal: it must draw ``expect`` within TOP_S, then quit on ``q`` with 0."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command in the copy, on a 200x50 terminal
        os.chdir(cwd)
        os.execvpe("bash", ["bash", "-c", command], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    screen, deadline = b"", time.monotonic() + TOP_S
    try:
        while expect.encode() not in re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", screen):
            assert time.monotonic() < deadline, f"top drew no {expect!r} in {TOP_S:.0f} s: {screen[-2000:]!r}"
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    screen += os.read(fd, 65536)
                except OSError:
                    break  # it exited
        os.write(fd, b"q")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0, screen[-2000:]
                return
            if select.select([fd], [], [], 0.2)[0]:
                with contextlib.suppress(OSError):
                    os.read(fd, 65536)  # keep the terminal drained
        raise AssertionError("top did not quit on q within 20 s")
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


def moved_ports(section: str) -> dict[str, str]:
    ports = set(re.findall(r"127\.0\.0\.1:(\d+)", section)) | {"9400"}
    return {p: str(free_port()) for p in sorted(ports)}


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen]]:
    """The exporters a block started, each in its own session: stopped at the end, whatever happened."""
    started: list[subprocess.Popen] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.e2e
def test_try_it_runs_as_written_on_a_fresh_copy(tmp_path: Path, servers: list[subprocess.Popen]) -> None:
    section = try_it(README.read_text())
    ports = moved_ports(section)
    repo = fresh_copy(tmp_path / "repo")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "KUBE_GPU"))}
    env["TERM"] = "xterm-256color"
    node = "cn-beijing.192.168.3.5"  # the seed's, which `top` reads at 127.0.0.1:9400
    for block in command_blocks(section):
        for written in block:
            command = re.sub(r"127\.0\.0\.1:(\d+)", lambda m: f"127.0.0.1:{ports[m.group(1)]}", written)
            if "scripts/run-simulated.sh" in command:
                port = re.search(r"LISTEN=127\.0\.0\.1:(\d+)", command)
                listen = port.group(1) if port else ports["9400"]
                log = (tmp_path / f"server-{listen}.log").open("w")
                proc = subprocess.Popen(["bash", "-c", command], cwd=repo, start_new_session=True, stdout=log,
                                        stderr=subprocess.STDOUT, env={**env, "LISTEN": f"127.0.0.1:{listen}"})
                servers.append(proc)
                ready(f"http://127.0.0.1:{listen}", proc, READY_S)
            elif "kube-gpu-exporter top" in command:
                run_top(command, repo, env, node)
            else:
                done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=repo, env=env,
                                      capture_output=True, text=True, timeout=INSTALL_S)
                assert done.returncode == 0, f"{written}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
                if "| grep" in command:
                    assert done.stdout.strip(), f"{written}: printed nothing"
