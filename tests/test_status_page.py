"""The status page in a real browser: headless Chromium loads ``/`` from the real exporter on simulated nodes.

The trouble node (examples/trouble-node.yaml with its kernel log) and a healthy one, at 1400 and 800 px,
light and dark (``prefers-color-scheme``, Chromium's --force-dark-mode). ``UPDATE_STATUS_SCREENSHOT=1``
writes the screenshots to docs/ (the README shows docs/status-page.png).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from exporter.exposition.problems import KINDS

pytestmark = pytest.mark.e2e  # every test here starts a server

ROOT = Path(__file__).resolve().parent.parent
TROUBLE = ROOT / "examples" / "trouble-node.yaml"
TROUBLE_KMSG = ROOT / "examples" / "trouble-node.kmsg"
HEALTHY = ROOT / "examples" / "dra-sharing-node.yaml"
DOCS = ROOT / "docs"
HEIGHT = 1000
SUBSYSTEM_KINDS = {"nvml_down", "nvml_errors", "pod_cache_not_synced", "pod_resources_unavailable",
                   "kernel_log_unreadable", "snapshot_stale", "sample_failures", "output_failures"}
LIGHT, DARK = (255, 255, 255), (0x0D, 0x11, 0x17)  # the page's --bg in each scheme
# (scenario, width, dark) -> docs file; docs/status-page.png is the README's
SHOTS = {
    ("trouble", 1400, False): "status-page.png",
    ("trouble", 800, False): "status-page-800.png",
    ("trouble", 1400, True): "status-page-dark.png",
    ("trouble", 800, True): "status-page-800-dark.png",
    ("healthy", 1400, False): "status-page-healthy.png",
    ("healthy", 800, True): "status-page-healthy-800-dark.png",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def first_pixel(data: bytes) -> tuple[int, int, int]:
    """The top-left pixel of an 8-bit RGB(A) PNG: whatever a first row's filter, its first pixel is raw."""
    pos, idat, color = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            assert chunk[8] == 8, "8-bit samples expected"
            color = chunk[9]
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    assert color in (2, 6), f"PNG color type {color}"
    raw = zlib.decompressobj().decompress(idat, 16)
    return raw[1], raw[2], raw[3]  # after the row's filter byte


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


def wait_for_kinds(url: str, kinds: set[str]) -> None:
    """Poll ``/status.json`` until its problems hold ``kinds`` (the Xid watcher reads the kernel log on its
    own thread, and names a pod once a snapshot knows the process)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "status.json", timeout=2) as r:
            problems = json.load(r)["problems"]
        if kinds <= {p["kind"] for p in problems} and any(p["kind"] == "xid" and p["pod"] for p in problems):
            return
        time.sleep(0.2)
    raise AssertionError(f"{url}: no {sorted(kinds)} in 30 s")


@contextmanager
def serving(scenario: Path, *flags: str) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "KUBE_GPU_EXPORTER_INTERVAL": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--simulate", str(scenario),
                             "--listen", f"127.0.0.1:{port}", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    try:
        wait_ready(port, proc)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        proc.communicate(timeout=10)


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    browser = shutil.which("chromium")
    assert browser, "chromium missing: run scripts/test.sh (installs Debian's chromium)"
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--no-first-run", f"--user-data-dir={tmp / 'profile'}", *args],
                          capture_output=True, timeout=120)


def dom(tmp: Path, url: str) -> str:
    out = chromium(tmp, "--dump-dom", url)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    return out.stdout.decode()


def shoot(tmp: Path, url: str, name: str, width: int, dark: bool) -> bytes:
    shot = tmp / f"{name}-{width}{'-dark' if dark else ''}.png"
    out = chromium(tmp, f"--screenshot={shot}", f"--window-size={width},{HEIGHT}", url,
                   *(["--force-dark-mode"] if dark else []))
    assert out.returncode == 0 and shot.exists(), out.stderr.decode()[-2000:]
    data = shot.read_bytes()
    assert png_size(data) == (width, HEIGHT) and len(data) > 10_000  # a page, not a blank
    assert first_pixel(data) == (DARK if dark else LIGHT), "the page follows the browser's color scheme"
    return data


def keep(shots: dict[tuple[str, int, bool], bytes]) -> None:
    """Write the screenshots to docs/ when asked; they must be there, at their size, either way."""
    for key, name in SHOTS.items():
        if key[0] != next(iter(shots))[0]:
            continue  # the other test's
        if key in shots and os.environ.get("UPDATE_STATUS_SCREENSHOT"):
            (DOCS / name).write_bytes(shots[key])
        assert png_size((DOCS / name).read_bytes()) == (key[1], HEIGHT), f"docs/{name}: rerun with " \
            "UPDATE_STATUS_SCREENSHOT=1"


def test_trouble_node_page_leads_with_its_problems(tmp_path: Path) -> None:
    # relative to the repository (the cwd): the screenshots show no path of this checkout
    with serving(TROUBLE, "--kmsg-path", str(TROUBLE_KMSG.relative_to(ROOT)), "--kmsg-replay", "--no-events") as url:
        # every kind a GPU or a pod can have (the exporter's own sources are fine on a simulated node)
        wait_for_kinds(url, set(KINDS) - SUBSYSTEM_KINDS)
        text = dom(tmp_path, url)
        banner, subsystems, first_gpu = (text.index('id="problems" class="critical"'), text.index("<h2>Subsystems"),
                                         text.index('<section class="gpu'))
        assert banner < subsystems < first_gpu  # the problems before everything per GPU
        assert "6 critical, 8 warnings, 2 notes" in text
        for expected in ("is lost", "fallen off the bus (Xid 79)", "failed to remap a memory row",
                         "Xid 31 (GPU memory page fault)", "raised by pod ml/trainer-7f9c8d6b5-x2k9p",
                         "slows its clocks for heat", "133 % of its 3.0 GiB grant", "PID 900 (ollama) on the host",
                         "holds GPU 5 (Tesla T4) whole", " s ago)"):
            assert expected in text[banner:subsystems], expected
        assert "<code>ollama</code>" in text[first_gpu:]  # the unaccounted process's comm
        assert '<section class="gpu critical"><h2>GPU 0:' in text and '<tr class="warning">' in text
        assert "ml/trainer-7f9c8d6b5-x2k9p (main)" in text[first_gpu:]  # the Xid table names the pod
        xids = text[first_gpu:].split("<h3>Xid errors")[1]
        assert re.search(r"<td>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(\d+ s ago\)</td>", xids), xids[:500]  # ISO 8601
        shots = {("trouble", w, d): shoot(tmp_path, url, "trouble", w, d) for w in (1400, 800) for d in (False, True)}
    keep(shots)


def test_healthy_node_is_one_green_line(tmp_path: Path) -> None:
    with serving(HEALTHY) as url:
        text = dom(tmp_path, url)
        assert '<div id="problems" class="ok"><p><span class="ok">✓ Nothing wrong on' in text
        assert text.index('id="problems"') < text.index('<section class="gpu')
        assert "<li" not in text.split('id="problems"')[1].split("</div>")[0]
        shots = {("healthy", w, d): shoot(tmp_path, url, "healthy", w, d) for w, d in ((1400, False), (800, True))}
    keep(shots)


def test_mixed_node_page_in_chromium(tmp_path: Path) -> None:
    with serving(ROOT / "examples" / "mixed-4gpu-node.yaml") as url:
        text = dom(tmp_path, url)
    for expected in ("gpu-node-mixed-1", "trainer-5d8f7c9b4-x2k9p", "infer-a-7c6b5d4f3-qwert",
                     "Unaccounted processes", "Subsystems", 'href="/metrics"', "1 warning, 1 note"):
        assert expected in text, expected
