"""The status page in a real browser: headless Chromium loads ``/`` from the real exporter on the simulated node.

``UPDATE_STATUS_SCREENSHOT=1`` writes the screenshot to docs/status-page.png (the README shows it).
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # every test here starts a server

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "examples" / "mixed-4gpu-node.yaml"
SHOT = ROOT / "docs" / "status-page.png"
WIDTH, HEIGHT = 1200, 900


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def wait_ready(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.1)  # polling for the first snapshot
    raise AssertionError("exporter not ready in 30 s")


def chromium(browser: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--no-first-run", f"--user-data-dir={tmp / 'profile'}", *args],
                          capture_output=True, timeout=120)


def test_status_page_renders_in_chromium(tmp_path: Path) -> None:
    browser = shutil.which("chromium")
    assert browser, "chromium missing: run scripts/test.sh (installs Debian's chromium)"
    port = free_port()
    env = {**os.environ, "KUBE_GPU_EXPORTER_INTERVAL": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--simulate", str(SCENARIO),
                             "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    try:
        wait_ready(port, proc)
        url = f"http://127.0.0.1:{port}/"
        dom = chromium(browser, tmp_path, "--dump-dom", url)
        assert dom.returncode == 0, dom.stderr.decode()[-2000:]
        text = dom.stdout.decode()
        for expected in ("gpu-node-mixed-1", "trainer-5d8f7c9b4-x2k9p", "infer-a-7c6b5d4f3-qwert",
                         "Unaccounted processes", "Subsystems", 'href="/metrics"'):
            assert expected in text, expected
        shot = tmp_path / "status.png"
        out = chromium(browser, tmp_path, f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}", url)
        assert out.returncode == 0 and shot.exists(), out.stderr.decode()[-2000:]
        data = shot.read_bytes()
        assert png_size(data) == (WIDTH, HEIGHT) and len(data) > 10_000  # a page, not a blank
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    if os.environ.get("UPDATE_STATUS_SCREENSHOT"):
        SHOT.write_bytes(data)
    assert png_size(SHOT.read_bytes()) == (WIDTH, HEIGHT), "docs/status-page.png: rerun with UPDATE_STATUS_SCREENSHOT=1"
