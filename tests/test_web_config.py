"""--web-config-file: TLS, client certificates and basic authentication on the real exporter.

Certificates come from the openssl command line (a CA, a server and a client certificate per test module);
the exporter runs as ``python -m exporter --simulate`` like in production, and is spoken to with ssl/urllib.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import logging
import os
import re
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import yaml

from exporter.server.auth import BasicAuth
from exporter.server.web_config import (
    TlsReloader,
    TlsSettings,
    WebConfigError,
    cert_not_after,
    expiry_state,
    load_web_config,
)
from exporter.shell import cli
from exporter.shell.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "examples" / "seed-cgpu-t4.yaml"
PASSWORD = "s3cret"
# cost 4: fast tests; $2y$, the prefix htpasswd writes (as in node_exporter's docs)
HASH = "$2y$" + bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()[4:]


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_ca(d: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=d)


def make_cert(d: Path, name: str, ca: str, usage: str) -> None:
    (d / f"{name}.ext").write_text("basicConstraints=CA:FALSE\nsubjectKeyIdentifier=hash\n"
                                   "authorityKeyIdentifier=keyid,issuer\nkeyUsage=critical,digitalSignature\n"
                                   f"extendedKeyUsage={usage}\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_cert(d, "server", "ca", "serverAuth")
    make_cert(d, "server2", "ca", "serverAuth")  # the rotated certificate
    make_cert(d, "client", "ca", "clientAuth")
    make_cert(d, "stranger", "other-ca", "clientAuth")
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Exporter:
    def __init__(self, port: int, proc: subprocess.Popen) -> None:
        self.port, self.proc = port, proc
        self.url = f"https://127.0.0.1:{port}"


@pytest.fixture
def start(tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen] = []

    def go(web: dict) -> Exporter:
        path = tmp_path / "web-config.yml"
        path.write_text(yaml.safe_dump(web))
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "exporter", "--simulate", str(SEED), "--listen",
                                 f"127.0.0.1:{port}", "--web-config-file", str(path)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "KUBE_GPU_EXPORTER_INTERVAL": "0.5"})
        procs.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return Exporter(port, proc)
            except OSError:
                time.sleep(0.1)  # polling for the port to open
        raise AssertionError("the exporter did not listen")

    yield go
    for proc in procs:
        proc.terminate()
        proc.communicate(timeout=10)


def client_context(pki: Path, cert: str | None = None, ca: str = "ca") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / f"{ca}.crt"))
    if cert is not None:
        ctx.load_cert_chain(pki / f"{cert}.crt", pki / f"{cert}.key")
    return ctx


def get(url: str, ctx: ssl.SSLContext, auth: tuple[str, str] | None = None) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url)
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def served_cert_serial(port: int, pki: Path) -> int:
    ctx = client_context(pki)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as s:
        der = s.getpeercert(binary_form=True)
    pem = ssl.DER_cert_to_PEM_cert(der)
    out = subprocess.run(["openssl", "x509", "-noout", "-serial"], input=pem, capture_output=True, text=True,
                         check=True)
    return int(out.stdout.strip().split("=")[1], 16)


def file_serial(path: Path) -> int:
    out = subprocess.run(["openssl", "x509", "-noout", "-serial", "-in", str(path)], capture_output=True,
                         text=True, check=True)
    return int(out.stdout.strip().split("=")[1], 16)


def tls_section(pki: Path, **extra: str) -> dict:
    return {"cert_file": str(pki / "server.crt"), "key_file": str(pki / "server.key"), **extra}


@pytest.mark.e2e
def test_https_with_basic_auth_plain_http_refused_and_certificate_rotation(pki: Path, start, tmp_path: Path):
    live = tmp_path / "live"
    live.mkdir()
    for ext in ("crt", "key"):  # relative paths: from the web config's directory, as exporter-toolkit
        (live / f"tls.{ext}").write_bytes((pki / f"server.{ext}").read_bytes())
    exp = start({"tls_server_config": {"cert_file": "live/tls.crt", "key_file": "live/tls.key"},
                 "basic_auth_users": {"prometheus": HASH}})
    ctx = client_context(pki)
    status, headers, body = get(exp.url + "/metrics", ctx, ("prometheus", PASSWORD))
    assert status == 200 and b"nvidia_gpu_duty_cycle" in body
    for path in ("/metrics", "/healthz", "/readyz", "/", "/nothing"):  # every path, as node_exporter
        status, headers, _ = get(exp.url + path, ctx)
        assert status == 401 and headers["WWW-Authenticate"] == "Basic", path
    assert get(exp.url + "/metrics", ctx, ("prometheus", "wrong"))[0] == 401
    assert get(exp.url + "/metrics", ctx, ("nobody", PASSWORD))[0] == 401
    assert get(exp.url + "/healthz", ctx, ("prometheus", PASSWORD))[0] == 200
    # an untrusting client refuses the server
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        get(exp.url + "/metrics", client_context(pki, ca="other-ca"), ("prometheus", PASSWORD))
    # plain HTTP on the TLS port is not served: the handshake fails and the connection closes
    with socket.create_connection(("127.0.0.1", exp.port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        got = b""
        while chunk := s.recv(4096):
            got += chunk
    assert b"HTTP/1." not in got and b"nvidia_gpu" not in got
    with pytest.raises((http.client.HTTPException, OSError)):
        urllib.request.urlopen(f"http://127.0.0.1:{exp.port}/metrics", timeout=5)
    # rotation: the new files are served to new connections within the check interval (2 s)
    assert served_cert_serial(exp.port, pki) == file_serial(pki / "server.crt")
    for ext in ("key", "crt"):
        tmp = live / f".tls.{ext}.new"
        tmp.write_bytes((pki / f"server2.{ext}").read_bytes())
        tmp.replace(live / f"tls.{ext}")
    deadline = time.monotonic() + 10
    while served_cert_serial(exp.port, pki) != file_serial(pki / "server2.crt"):
        assert time.monotonic() < deadline, "the rotated certificate was not served"
        time.sleep(0.5)
    assert get(exp.url + "/metrics", ctx, ("prometheus", PASSWORD))[0] == 200
    exp.proc.terminate()
    out, _ = exp.proc.communicate(timeout=10)
    assert f"serving https://127.0.0.1:{exp.port}/metrics, basic authentication" in out
    assert "TLS certificate reloaded" in out
    assert "Traceback" not in out and "SSL handshake" not in out


@pytest.mark.e2e
def test_required_client_certificate(pki: Path, start):
    exp = start({"tls_server_config": tls_section(pki, client_ca_file=str(pki / "ca.crt"),
                                                  client_auth_type="RequireAndVerifyClientCert",
                                                  min_version="TLS13")})
    status, _, body = get(exp.url + "/metrics", client_context(pki, "client"))
    assert status == 200 and b"nvidia_gpu_duty_cycle" in body
    for ctx in (client_context(pki), client_context(pki, "stranger")):  # none, or one of another CA
        with pytest.raises((urllib.error.URLError, OSError, http.client.HTTPException)):
            get(exp.url + "/metrics", ctx)
    # TLS 1.2 only: below min_version
    old = client_context(pki, "client")
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises((urllib.error.URLError, OSError)):
        get(exp.url + "/metrics", old)


@pytest.mark.e2e
def test_optional_client_certificate_verified_if_given(pki: Path, start):
    exp = start({"tls_server_config": tls_section(pki, client_ca_file=str(pki / "ca.crt"),
                                                  client_auth_type="VerifyClientCertIfGiven")})
    assert get(exp.url + "/metrics", client_context(pki))[0] == 200
    assert get(exp.url + "/metrics", client_context(pki, "client"))[0] == 200
    with pytest.raises((urllib.error.URLError, OSError, http.client.HTTPException)):
        get(exp.url + "/metrics", client_context(pki, "stranger"))


BAD = [
    ({"tls_server_config": {"cert_file": "x"}}, "cert_file and key_file are required"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "ciphers": "x"}}, "unknown key 'ciphers'"),
    ({"tls_config": {}}, "unknown key 'tls_config'"),
    ({"http_server_config": {"http2": False}}, "'http_server_config' is not supported"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "cipher_suites": ["x"]}}, "not supported"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "RequireAnyClientCert",
                            "client_ca_file": "c"}}, "RequireAnyClientCert is not supported"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "Sometimes"}},
     "client_auth_type must be one of"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "RequireAndVerifyClientCert"}},
     "needs client_ca_file"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "TLS10"}}, "TLS12 or TLS13"),
    ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"}}, "cannot load the certificate"),
    ({"basic_auth_users": {"u": "plaintext"}}, "must be a bcrypt hash"),
    ({"basic_auth_users": ["u"]}, "must be a mapping"),
    (["a"], "must be a mapping"),
]


@pytest.mark.e2e
@pytest.mark.parametrize(("web", "words"), BAD, ids=[w for _, w in BAD])
def test_malformed_web_config_is_one_line_exit_2(tmp_path: Path, capsys, web, words: str):
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(web))
    with pytest.raises(WebConfigError, match=words):
        load_web_config(str(path))
    rc = cli.main(["--simulate", str(SEED), "--listen", f"127.0.0.1:{free_port()}", "--web-config-file", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("kube-gpu-exporter: error: --web-config-file")
    assert words in err


@pytest.mark.e2e
def test_malformed_web_config_from_the_environment_exits_2(tmp_path: Path):
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config: [not, a, mapping]\n")
    out = subprocess.run([sys.executable, "-m", "exporter", "--simulate", str(SEED)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "KUBE_GPU_EXPORTER_WEB_CONFIG_FILE": str(path)})
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (f"kube-gpu-exporter: error: KUBE_GPU_EXPORTER_WEB_CONFIG_FILE {path}: "
                          "tls_server_config: must be a mapping\n")


def test_a_nul_in_the_path_is_a_config_error_not_a_crash():
    # found by tests/test_scenario_properties.py's hypothesis run: pathlib raises ValueError on a NUL
    with pytest.raises(ConfigError, match="cannot read it"):
        load_config(["--web-config-file", "web\x00.yml"])


def test_empty_web_config_is_plain_http(tmp_path: Path):
    path = tmp_path / "web.yml"
    path.write_text("")
    cfg = load_config(["--web-config-file", str(path)])
    web = load_web_config(cfg.web_config_file or "")
    assert web.tls is None and not web.users


def test_successful_verifications_are_cached_failures_are_not():
    now = [0.0]
    auth = BasicAuth({"p": HASH.encode()}, clock=lambda: now[0], ttl=60.0)
    good = "Basic " + base64.b64encode(f"p:{PASSWORD}".encode()).decode()
    bad = "Basic " + base64.b64encode(b"p:nope").decode()

    async def go() -> None:
        for _ in range(5):
            assert await auth.allowed(good)
        assert auth.checks == 1  # one bcrypt for five scrapes
        for _ in range(2):
            assert not await auth.allowed(bad)
        assert auth.checks == 2  # the same wrong credential again costs no bcrypt (remembered a while)
        for header in (None, "Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode()):
            assert not await auth.allowed(header)
        assert auth.checks == 2  # malformed headers cost no bcrypt
        now[0] = 61.0
        assert await auth.allowed(good)
        assert auth.checks == 3  # expired: verified again

    asyncio.run(go())


@pytest.mark.e2e
def test_a_broken_rotation_keeps_the_previous_certificate(pki: Path, tmp_path: Path, caplog):
    for ext in ("crt", "key"):
        (tmp_path / f"tls.{ext}").write_bytes((pki / f"server.{ext}").read_bytes())
    settings = TlsSettings(tmp_path / "tls.crt", tmp_path / "tls.key")
    now = [0.0]
    reloader = TlsReloader(settings, clock=lambda: now[0], interval=2.0)
    first = reloader.current()
    assert reloader.server_context() is first
    (tmp_path / "tls.crt").write_text("half-written\n")
    now[0] = 1.0
    assert reloader.current() is first  # not checked again within the interval
    now[0] = 3.0
    with caplog.at_level(logging.ERROR, "kube_gpu_exporter.http"):
        assert reloader.current() is first
    assert "TLS certificate not reloaded, keeping the previous one" in caplog.text
    (tmp_path / "tls.crt").write_bytes((pki / "server2.crt").read_bytes())
    (tmp_path / "tls.key").write_bytes((pki / "server2.key").read_bytes())
    now[0] = 6.0
    assert reloader.current() is not first and reloader.reloads == 1


@pytest.mark.e2e
def test_an_encrypted_key_is_refused_in_one_line_never_prompted_for(pki: Path, tmp_path: Path, caplog):
    """Before, OpenSSL asked for the passphrase on a TTY (blocking every handshake) or failed with "PEM lib"."""
    openssl("pkey", "-in", str(pki / "server.key"), "-out", "locked.key", "-aes256", "-passout", "pass:secret",
            cwd=tmp_path)
    assert b"ENCRYPTED" in (tmp_path / "locked.key").read_bytes()
    with pytest.raises(OSError, match="the private key is encrypted: give it without a passphrase"):
        TlsSettings(pki / "server.crt", tmp_path / "locked.key").context()
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(pki / "server.crt"),
                                                         "key_file": str(tmp_path / "locked.key")}}))
    with pytest.raises(WebConfigError) as e:
        load_web_config(str(web))
    assert "locked.key: the private key is encrypted" in str(e.value) and "\n" not in str(e.value)
    # rotated in: refused in one line, the previous certificate stays
    for ext in ("crt", "key"):
        (tmp_path / f"tls.{ext}").write_bytes((pki / f"server.{ext}").read_bytes())
    now = [0.0]
    reloader = TlsReloader(TlsSettings(tmp_path / "tls.crt", tmp_path / "tls.key"), clock=lambda: now[0])
    first = reloader.current()
    (tmp_path / "tls.key").write_bytes((tmp_path / "locked.key").read_bytes())
    now[0] = 10.0
    with caplog.at_level(logging.ERROR, "kube_gpu_exporter.http"):
        assert reloader.current() is first
    lines = [r.getMessage() for r in caplog.records if "not reloaded" in r.getMessage()]
    assert len(lines) == 1 and "the private key is encrypted" in lines[0], lines


def test_expiry_state() -> None:
    assert expiry_state(None, 100.0) == "ok"
    assert expiry_state(100.0, 100.0) == "expired"
    assert expiry_state(100.0 + 14 * 86400, 100.0) == "expiring"
    assert expiry_state(101.0 + 14 * 86400, 100.0) == "ok"


@pytest.mark.e2e
def test_a_certificate_expiring_and_expired_is_logged_once_each(pki: Path, caplog):
    """The test PKI's certificates live 2 days: within the 14 days warned of, then expired on a moved clock."""
    not_after = cert_not_after(pki / "server.crt")
    assert not_after is not None and 0 < not_after - time.time() <= 2 * 86400 + 60
    mono, wall = [0.0], [time.time()]
    with caplog.at_level(logging.INFO, "kube_gpu_exporter.http"):
        reloader = TlsReloader(TlsSettings(pki / "server.crt", pki / "server.key"), clock=lambda: mono[0],
                               wall_clock=lambda: wall[0])
        for step in range(1, 5):  # hourly checks, the certificate still 2 days from its end
            mono[0] = step * 3600.0
            reloader.current()
        wall[0] = not_after + 1.0
        for step in range(5, 9):
            mono[0] = step * 3600.0
            reloader.current()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if "TLS certificate" in r.getMessage()]
    assert [level for level, _ in lines] == [logging.WARNING, logging.ERROR], lines
    assert re.fullmatch(rf"TLS certificate {re.escape(str(pki / 'server.crt'))} expires in [12]\.\d days "
                        r"\(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\): renew it", lines[0][1]), lines[0][1]
    assert "expired at" in lines[1][1] and "refuse every connection" in lines[1][1]


@pytest.mark.e2e
def test_failed_handshakes_are_counted_and_logged_once_a_minute(pki: Path, caplog):
    """Before, asyncio dropped them without a word (only its debug mode logs them)."""
    from exporter.exposition.snapshot import empty_snapshot
    from exporter.pipeline.holder import SnapshotHolder
    from exporter.server.app import HttpServer, make_app
    from exporter.server.limits import ServerLimits
    from exporter.server.stats import HttpStats
    from exporter.server.web_config import WebConfig

    web = load_web_config_for(pki)
    stats = HttpStats()
    server = HttpServer(make_app(SnapshotHolder(empty_snapshot(0.0)), 60.0, stats=stats), "127.0.0.1", 0,
                        ServerLimits(), stats, web_config=WebConfig("web.yml", web.tls, {}, web.context))

    async def go() -> None:
        await server.start()
        try:
            for _ in range(5):  # plain HTTP on the TLS port
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                assert await asyncio.wait_for(reader.read(), 5) == b""
                writer.close()
            _, writer = await asyncio.open_connection("127.0.0.1", server.port)  # a TCP probe: connect, close
            writer.close()
            ctx = client_context(pki)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=ctx,
                                                           server_hostname="localhost")
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 200 OK")  # TLS still served
            writer.close()
            await asyncio.sleep(0.2)
        finally:
            await server.close()

    with caplog.at_level(logging.WARNING, "kube_gpu_exporter.http"):
        asyncio.run(go())
    assert stats.errors["tls_handshake"] == 5
    lines = [r.getMessage() for r in caplog.records if "TLS handshake" in r.getMessage()]
    assert lines == ["TLS handshake with 127.0.0.1 failed: HTTP_REQUEST"], lines  # then held back for a minute


def load_web_config_for(pki: Path):
    from exporter.server.web_config import TlsSettings, WebConfig

    settings = TlsSettings(pki / "server.crt", pki / "server.key")
    return WebConfig("web.yml", settings, {}, settings.context())
