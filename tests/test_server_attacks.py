"""The security review's attacks, replayed against the real exporter process on the simulated node.

* 2,000 idle TCP connections against a process started under a 1,024 soft descriptor limit (the
  container runtimes' default): /metrics and /healthz must keep answering within seconds, and the log
  must stay a few lines (it used to grow by ~5 MB/s of "Too many open files" tracebacks).
* 1,000 malformed requests (HTTP/1.1 without Host, garbage request lines, oversized headers): one log
  line in all (it used to be ten per request, a traceback), each counted in
  ``kube_gpu_exporter_http_errors_total{reason}``.
"""

from __future__ import annotations

import os
import resource
import selectors
import shutil
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration_support import ROOT, ExporterProcess, free_port, parse_exposition, poll, value

pytestmark = pytest.mark.e2e  # every test here starts a server

SEED = ROOT / "examples" / "seed-cgpu-t4.yaml"
FLOOD = 2000


def limited_argv(nofile: str, *args: str) -> list[str]:
    """``python -m exporter ARGS`` under RLIMIT_NOFILE ``soft:hard`` (prlimit, or a Python trampoline)."""
    exporter = [sys.executable, "-m", "exporter", *args]
    if shutil.which("prlimit"):
        return ["prlimit", f"--nofile={nofile}", *exporter]
    soft, hard = (int(x) for x in nofile.split(":"))
    code = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, "
            f"({soft}, {hard})); os.execv(sys.argv[1], sys.argv[1:])")
    return [sys.executable, "-c", code, *exporter]


def start_exporter(workdir: Path, nofile: str) -> ExporterProcess:
    port = free_port()
    argv = limited_argv(nofile, "--simulate", str(SEED), "--listen", f"127.0.0.1:{port}", "--interval", "0.5")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = ExporterProcess(argv, env, port, workdir / "exporter.log").start()
    proc.wait_ready(30)
    return proc


@pytest.fixture
def enough_descriptors() -> Iterator[None]:
    """This test process holds the 2,000 client sockets itself."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = FLOOD + 512
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"needs {need} file descriptors, hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def accept_queue(port: int) -> int:
    """Connections the kernel completed on the listening socket at ``port`` that the server has not
    accepted yet (``rx_queue`` of a LISTEN socket in /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":
            return int(fields[4].split(":")[1], 16)
    return 0


def open_idle(port: int, n: int, budget: float) -> tuple[list[socket.socket], int]:
    """Open ``n`` connections that never send a byte, within ``budget`` seconds; return the sockets and
    how many the kernel completed.

    Batches of 50, each once the server has taken the previous one off its listen queue: a fuller
    queue makes the kernel drop handshakes, and their 1 s, 3 s, 7 s retries would make the flood slow
    rather than large.
    """
    socks: list[socket.socket] = []
    done = 0
    deadline = time.monotonic() + budget
    with selectors.DefaultSelector() as sel:
        while len(socks) < n and time.monotonic() < deadline:
            poll(lambda: accept_queue(port) <= 50 or time.monotonic() > deadline, budget, "the listen queue to drain",
                 interval=0.002)
            batch = []
            for _ in range(min(50, n - len(socks))):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                sel.register(s, selectors.EVENT_WRITE)
                batch.append(s)
            socks += batch
            pending = len(batch)
            while pending and time.monotonic() < deadline:
                for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    sel.unregister(key.fileobj)
                    pending -= 1
                    done += key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            for s in batch:  # those the kernel did not complete in time
                if s in {key.fileobj for key in sel.get_map().values()}:
                    sel.unregister(s)
    return socks, done


def timed_get(url: str, timeout: float = 3.0) -> tuple[int, bytes, float]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read(), time.monotonic() - started


@pytest.mark.parametrize("nofile", ["1024:4096", "1024:1024"], ids=["soft1024-hard4096", "hard1024"])
def test_idle_flood_does_not_take_metrics_or_healthz_down(tmp_path: Path, nofile: str, enough_descriptors):
    exporter = start_exporter(tmp_path, nofile)
    base = f"http://127.0.0.1:{exporter.port}"
    log_before = len(exporter.output())
    socks, connected = open_idle(exporter.port, FLOOD, budget=8.0)
    try:
        # Every one of them got in (the oldest idle ones were dropped to make room) ...
        assert connected == FLOOD, f"only {connected} of {FLOOD} connections were accepted"
        # ... and, with all 2,000 still open on our side, scrapes and probes answer at once.
        for _ in range(3):
            status, body, took = timed_get(f"{base}/metrics")
            assert status == 200 and b"nvidia_gpu_duty_cycle" in body and took < 3.0
            status, body, took = timed_get(f"{base}/healthz")
            assert (status, body) == (200, b"ok\n") and took < 3.0
        samples = parse_exposition(timed_get(f"{base}/metrics")[1].decode())
        limit = value(samples, "kube_gpu_exporter_http_connections_limit")
        assert limit is not None and 16 <= limit <= 512
        assert value(samples, "kube_gpu_exporter_http_connections") <= limit
        assert value(samples, "kube_gpu_exporter_http_connections_dropped_total", reason="limit") >= FLOOD - limit
        assert value(samples, "kube_gpu_exporter_http_errors_total", reason="accept_emfile") == 0
    finally:
        for s in socks:
            s.close()
    assert exporter.alive()
    grown = exporter.output()[log_before:]
    assert "Traceback" not in grown and "Too many open files" not in grown
    assert len(grown) < 1000 and len(grown.splitlines()) <= 2, grown[:3000]
    exporter.stop()


def test_descriptor_limit_is_raised_and_logged_once(tmp_path: Path):
    exporter = start_exporter(tmp_path, "1024:4096")
    try:
        limits = Path(f"/proc/{exporter.pid}/limits").read_text()
        assert [line.split()[3:5] for line in limits.splitlines() if line.startswith("Max open files")] == [
            ["4096", "4096"]]
    finally:
        exporter.stop()
    lines = [line for line in exporter.output().splitlines() if "file descriptor limit" in line]
    assert len(lines) == 1 and "raised from 1024 to 4096" in lines[0]


MALFORMED = {
    "bad_request": b"GET /metrics HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
    "bad_request_line": b"GARBAGE\r\n\r\n",
    "too_large": b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
    "bad_header": b"GET /metrics HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
}
EXTRA_MALFORMED = {  # more of each kind: the same reasons
    "bad_request_line": [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40),  # TLS to the HTTP port
                         b"GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n"],
    "too_large": [b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                  b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(100)) + b"\r\n"],
}


def send_raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        return s.recv(200)


def test_malformed_requests_are_counted_and_logged_in_one_line_each(tmp_path: Path):
    exporter = start_exporter(tmp_path, "1024:4096")
    log_before = len(exporter.output())
    sent = dict.fromkeys(MALFORMED, 0)
    requests = [(r, d) for r, d in MALFORMED.items()] + [(r, d) for r, ds in EXTRA_MALFORMED.items() for d in ds]
    for i in range(1000):
        reason, data = requests[i % len(requests)]
        assert send_raw(exporter.port, data).startswith(b"HTTP/1.0 400 Bad Request\r\n")
        sent[reason] += 1
    samples = exporter.samples()
    for reason, n in sent.items():
        assert value(samples, "kube_gpu_exporter_http_errors_total", reason=reason) == n, reason
    assert exporter.alive()
    grown = exporter.output()[log_before:]
    assert "Traceback" not in grown
    # one line for all 1,000 (the next one waits a minute, and will say how many were held back)
    lines = grown.splitlines()
    assert len(lines) == 1 and len(lines[0]) < 400 and "HTTP 400 for a request from 127.0.0.1" in lines[0], grown
    exporter.stop()

