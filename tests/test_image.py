"""The image itself, built here by scripts/build-image.sh (buildah, no registry) once per session.

What tests/test_dockerfile.py reads as text and tests/test_dockerfile_install.py replays outside a
container is checked on the built image: its configuration (user, entrypoint, labels, port), that
no installer or compiler is left in it, that it runs with a read-only root filesystem as uid 9400
(nothing written outside /tmp), and that the SBOM scripts/sbom.py writes lists exactly the Python
distributions installed in it, read from inside the image. The script's own smoke test (--version,
the simulated node scraped from outside) runs as part of the build.

The read-only run: the image's root filesystem (a buildah working container, mounted) bound
read-only in a private mount namespace, a tmpfs on /tmp, /proc and /dev as a runtime gives them,
then chroot to uid 9400 with the image's environment and entrypoint: what Kubernetes'
readOnlyRootFilesystem (the chart's default) gives the process, without a container runtime.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from exporter import __version__
from tests.test_dockerfile import final_stage

pytestmark = pytest.mark.e2e  # builds and runs an image

ROOT = Path(__file__).resolve().parent.parent
BUILDAH = ["buildah", "--storage-driver", "vfs"]
SCENARIO = ROOT / "examples" / "seed-cgpu-t4.yaml"
BUILD_TOOLS = ("pip", "pip3", "pip3.11", "wheel", "easy_install", "gcc", "cc", "c++", "g++", "cpp", "clang", "make",
               "ld", "as", "tcc")  # fmt: skip
BUILD_MODULES = ("pip", "setuptools", "wheel", "pkg_resources", "_distutils_hack", "distutils")
BUILD_PACKAGES = {"gcc", "g++", "cpp", "binutils", "make", "libc6-dev", "build-essential", "python3-pip",
                  "python3-setuptools", "python3-wheel", "python3-dev", "python3.11-dev"}  # fmt: skip


@dataclass
class Image:
    ref: str
    size_mb: int
    config: dict
    rootfs: Path  # a working container's root filesystem, mounted
    container: str
    build_seconds: float

    def base_python(self) -> str:
        """The base image's own interpreter, which the virtualenv was made from (``python3`` on PATH is the venv's)."""
        cfg = (self.rootfs / "opt" / "kube-gpu-exporter" / "pyvenv.cfg").read_text()
        (home,) = re.findall(r"^home = (\S+)$", cfg, re.M)
        return f"{home}/python3"

    def run(self, *argv: str) -> str:
        """A command inside the image (buildah run: the image's user and environment)."""
        proc = subprocess.run([*BUILDAH, "run", "--isolation", "chroot", self.container, "--", *argv],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout


def _buildah(*args: str) -> str:
    return subprocess.run([*BUILDAH, *args], capture_output=True, text=True, check=True, timeout=120).stdout.strip()


@pytest.fixture(scope="module")
def image() -> Iterator[Image]:
    started = time.monotonic()
    proc = subprocess.run([str(ROOT / "scripts" / "build-image.sh")], cwd=ROOT, capture_output=True, text=True,
                          env=os.environ | {"PYTHON": sys.executable}, timeout=1200)  # fmt: skip
    assert proc.returncode == 0, f"scripts/build-image.sh failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    *_, image_line, size_line = proc.stdout.splitlines()
    ref = image_line.removeprefix("image: ")
    m = re.fullmatch(r"size: (\d+) MB \(uncompressed layers, base \S+\)", size_line)
    assert m, f"the last line gives the size in MB: {size_line!r}"
    inspected = json.loads(_buildah("inspect", "--type", "image", ref))
    container = _buildah("from", "--pull=never", ref)
    try:
        rootfs = Path(_buildah("mount", container))
        yield Image(ref, int(m.group(1)), inspected["OCIv1"]["config"], rootfs, container,
                    time.monotonic() - started)
    finally:
        subprocess.run([*BUILDAH, "rm", container], capture_output=True, timeout=120)


def test_the_script_prints_the_reference_and_the_size_last(image: Image) -> None:
    assert image.ref == f"localhost/kube-gpu-exporter:{__version__}"
    manifest = json.loads(json.loads(_buildah("inspect", "--type", "image", image.ref))["Manifest"])
    assert image.size_mb == (sum(layer["size"] for layer in manifest["layers"]) + 500_000) // 1_000_000
    # the lean daemon image (docs/deploy.md#image-size): at most 300 MB on the Debian base
    assert image.size_mb <= 300, f"{image.size_mb} MB"


def test_user_entrypoint_labels_and_port(image: Image) -> None:
    config = image.config
    assert config["User"] == "9400:9400"
    assert config["Entrypoint"] == ["kube-gpu-exporter"] and not config.get("Cmd")
    assert set(config["ExposedPorts"]) == {"9400/tcp"}
    labels = config["Labels"]
    (label,) = final_stage().all("LABEL")
    declared = dict(re.findall(r'(\S+)="([^"]*)"', label.args))
    assert {k: labels.get(k) for k in declared} == declared
    assert labels["org.opencontainers.image.version"] == __version__  # as the release workflow sets it
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["PATH"].split(":")[0] == "/opt/kube-gpu-exporter/bin"
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["NVIDIA_DRIVER_CAPABILITIES"]) == ("all", "utility")
    passwd = [line.split(":") for line in (image.rootfs / "etc" / "passwd").read_text().splitlines()]
    (user,) = [p for p in passwd if p[2] == "9400"]
    assert (user[0], user[3], user[5], user[6]) == ("kube-gpu-exporter", "9400", "/nonexistent", "/usr/sbin/nologin")
    assert image.run("id", "-u").strip() == "9400", "buildah run takes the image's USER"
    assert image.run("kube-gpu-exporter", "--version").strip() == f"kube-gpu-exporter {__version__}"


def test_no_installer_or_compiler_is_in_the_image(image: Image) -> None:
    root = image.rootfs
    found = [f"{d}/{name}" for d in ("usr/bin", "usr/sbin", "usr/local/bin", "opt/kube-gpu-exporter/bin")
             for name in BUILD_TOOLS if (root / d / name).exists() or (root / d / name).is_symlink()]  # fmt: skip
    assert not found, f"build tools in the runtime image: {found}"
    wheels = [str(p.relative_to(root)) for p in root.rglob("*.whl")]
    assert not wheels, f"wheels left for ensurepip or pip: {wheels[:5]}"
    status = (root / "var" / "lib" / "dpkg" / "status").read_text()
    packages = set(re.findall(r"^Package: (\S+)\nStatus: install ok installed", status, re.M))
    assert packages & BUILD_PACKAGES == set()
    probe = ("import importlib.util, json; "
             f"print(json.dumps([m for m in {BUILD_MODULES!r} if importlib.util.find_spec(m)]))")  # fmt: skip
    for python in ("/opt/kube-gpu-exporter/bin/python", image.base_python()):
        importable = json.loads(image.run(python, "-c", probe))
        # distutils is gone from the standard library only in 3.12; 3.11 keeps it, without setuptools
        assert set(importable) <= {"distutils"}, f"{python} imports {importable}"


INSTALLED = ("import importlib.metadata as m, json, sys; "
             "print(json.dumps(sorted({(d.metadata['Name'], d.version) for d in m.distributions()})))")


def test_the_sbom_lists_exactly_what_the_image_installed(image: Image, tmp_path: Path) -> None:
    out = tmp_path / "sbom.cdx.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "sbom.py"), "-o", str(out)], check=True, timeout=60)
    doc = json.loads(out.read_text())
    listed = {(canonicalize_name(c["name"]), c["version"]) for c in doc["components"]}
    installed = {(canonicalize_name(n), v) for n, v in
                 json.loads(image.run("/opt/kube-gpu-exporter/bin/python", "-c", INSTALLED))}
    root = doc["metadata"]["component"]
    assert (canonicalize_name(root["name"]), root["version"]) in installed
    installed.discard((canonicalize_name(root["name"]), root["version"]))
    assert installed - listed == set(), "installed in the image, not in the SBOM"
    assert listed - installed == set(), "in the SBOM, not installed in the image"
    # and the system Python beside it has nothing of its own (the SBOM leaves out only the OS packages)
    system = json.loads(image.run(image.base_python(), "-I", "-c", INSTALLED))
    assert system == [], f"the base's Python has distributions the SBOM does not list: {system}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


READ_ONLY_RUN = r"""
set -eu
root=$1 ctl=$2; shift 2
mount --make-rprivate /
mount --bind "$root" "$ctl/root"
mount -o remount,bind,ro "$ctl/root"
root=$ctl/root
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
cp "$ctl/scenario.yaml" "$root/tmp/scenario.yaml"
if chroot "$root" /bin/sh -c ': > /probe' 2>/dev/null; then echo "root is writable" > "$ctl/error"; exit 1; fi
chroot --userspec=9400:9400 "$root" /usr/bin/env -i "$@" > "$ctl/log" 2>&1 &
echo $! > "$ctl/pid"
status=0
wait $! || status=$?
echo "$status" > "$ctl/status"
(cd "$root/tmp" && find . -mindepth 1 | sort) > "$ctl/tmp-files"
"""


def test_runs_with_a_read_only_root_writing_nothing_outside_tmp(image: Image, tmp_path: Path) -> None:
    for tool in ("unshare", "chroot", "mount"):
        assert shutil.which(tool), f"{tool} missing (util-linux, coreutils)"
    ctl = tmp_path / "ctl"
    (ctl / "root").mkdir(parents=True)
    shutil.copy(SCENARIO, ctl / "scenario.yaml")
    port = _free_port()
    argv = [*image.config["Env"], *image.config["Entrypoint"], "--simulate", "/tmp/scenario.yaml",
            "--listen", f"127.0.0.1:{port}"]  # fmt: skip
    runner = subprocess.Popen(["unshare", "--mount", "sh", "-c", READ_ONLY_RUN, "sh", str(image.rootfs), str(ctl),
                               *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while _get(f"http://127.0.0.1:{port}/readyz") is None:
            assert runner.poll() is None, f"{runner.stdout.read() if runner.stdout else ''}" + "".join(
                (ctl / f).read_text() for f in ("error", "log") if (ctl / f).exists())
            assert time.monotonic() < deadline, "the exporter did not become ready with a read-only root"
            time.sleep(0.1)
        metrics = (_get(f"http://127.0.0.1:{port}/metrics") or b"").decode()
        assert 'nvidia_gpu_duty_cycle{allocate_mode="share"' in metrics
        status = json.loads(_get(f"http://127.0.0.1:{port}/status.json") or b"{}")
        assert status, "/status.json answers"
        pid = int((ctl / "pid").read_text())
        ids = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        assert ids["Uid"].split() == ids["Gid"].split() == ["9400"] * 4, "uid and gid 9400: real, effective, saved, fs"
        os.kill(pid, signal.SIGTERM)
        runner.wait(timeout=30)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(timeout=30)
    assert runner.returncode == 0, (ctl / "log").read_text()
    assert (ctl / "status").read_text().strip() == "0", f"exit status; log:\n{(ctl / 'log').read_text()}"
    log = (ctl / "log").read_text()
    assert "Read-only file system" not in log and "Traceback" not in log, log
    # /tmp was the only writable place: it holds the scenario this test put there and nothing else
    assert (ctl / "tmp-files").read_text().split() == ["./scenario.yaml"]


def test_the_shell_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck missing: scripts/test.sh installs it (Debian's shellcheck)"
    scripts = [*sorted(str(p) for p in (ROOT / "scripts").rglob("*.sh")), str(ROOT / ".ci" / "run")]
    assert str(ROOT / "scripts" / "build-image.sh") in scripts
    proc = subprocess.run([shellcheck, "--external-sources", *scripts], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
