"""A small Kubernetes API client: JSON over HTTP(S) with the standard library's ``http.client``.

The daemon makes few calls (its pods listed and watched, its Node read, DRA ResourceSlices listed
and watched and ResourceClaims read, Events created and patched), always with raw JSON in and out.
The ``kubernetes`` package would load its whole generated client (tens of MiB) for them; this
module sends the same requests: the same paths, query parameters (``true`` for booleans), JSON
bodies and content types, so the API server (and tests/k8s_double) sees no difference.

Configuration (:func:`build_api_client`): an explicit URL, a kubeconfig, the in-cluster service
account (``KUBERNETES_SERVICE_HOST``/``PORT``, its token re-read when the kubelet rotates the file,
its CA), or ``$KUBECONFIG``/``~/.kube/config``. Only a kubeconfig loads the ``kubernetes`` package
(exec plugins, OIDC, client certificates), and only then; it is the ``kubeconfig`` extra, not in the
image.

Every request and every watch started waits for a token of the client's :attr:`KubeApi.limiter`
(:mod:`exporter.node.rate_limit`, client-go's QPS/burst), one per process, so the callers together
stay under it.

Answers are bounded: a response body over :data:`MAX_RESPONSE_BYTES` or a watch event over
:data:`MAX_EVENT_BYTES` raises :class:`ApiResponseTooLarge` (one line) after reading no further, so a
list that grew past what the DaemonSet's memory limit holds fails as a counted sync error that keeps
the last good view, not as an OOM kill that loses it on every restart.

Each thread keeps one connection alive for its requests; a request that fails on a connection the
server closed while idle is sent once more on a new one. A watch gets a connection of its own,
which :meth:`WatchStream.shutdown` closes from another thread to end a blocked read at once.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from exporter import __version__
from exporter.node.rate_limit import RateLimiter

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
USER_AGENT = f"kube-gpu-exporter/{__version__}"
# A pod list page of this node's pods (at most 500 per page, a few hundred per node, typically tens of
# KiB each) fits many times over; the chart's memory limit (128 Mi) would not hold the decoded JSON of
# much more. A watch event is one object: the API server refuses objects over about 1.5 MiB (etcd's
# request limit), JSON-encoded a few times that at most.
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
MAX_EVENT_BYTES = 8 * 1024 * 1024
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class ApiException(Exception):
    """The API server answered with an error status (``status``; the Status object's message)."""

    def __init__(self, status: int, reason: str = "", body: bytes = b"") -> None:
        self.status, self.reason, self.body = status, reason, body
        message = ""
        with contextlib.suppress(ValueError, AttributeError):
            message = json.loads(body).get("message", "")
        super().__init__(f"({status}) {reason}" + (f": {message}" if message else ""))


class ApiResponseTooLarge(Exception):
    """An answer over the client's bound: refused after reading ``limit`` bytes and no further."""

    def __init__(self, what: str, limit: int) -> None:
        self.limit = limit
        super().__init__(f"{what} over {limit:,} bytes: refused, not read further")


def _read_capped(resp: http.client.HTTPResponse, limit: int) -> bytes:
    """The whole body, or :class:`ApiResponseTooLarge` once it passes ``limit`` (read no further)."""
    length = resp.getheader("Content-Length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiResponseTooLarge(f"API answer of {int(length):,} bytes", limit)
    data = resp.read(limit + 1)
    if len(data) > limit:
        raise ApiResponseTooLarge("API answer", limit)
    return data


class KubeConfigError(Exception):
    """No usable API configuration (a startup mistake, reported in one line)."""


class _Reloaded:
    """A value derived from a file, rebuilt when the file changes (inode, size or mtime)."""

    def __init__(self, path: Path, build: Callable[[Path], Any]) -> None:
        self.path, self._build = path, build
        self._key: tuple[int, int, int] | None = None
        self._value: Any = None
        self._lock = threading.Lock()

    def __call__(self) -> Any:
        st = os.stat(self.path)
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            if key != self._key:
                self._value, self._key = self._build(self.path), key
            return self._value


def _bearer(path: Path) -> str:
    return "Bearer " + path.read_text().strip()


def _ca_context(path: Path) -> Any:
    import ssl

    return ssl.create_default_context(cafile=str(path))


class KubeApi:
    """JSON requests to one API server; thread-safe (each thread has its own connection)."""

    def __init__(self, host: str, *, authorization: Callable[[], str | None] = lambda: None,
                 ssl_context: Callable[[], Any] | None = None, limiter: RateLimiter | None = None,
                 max_response_bytes: int = MAX_RESPONSE_BYTES, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.host = host.rstrip("/")
        url = urllib.parse.urlsplit(self.host)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise KubeConfigError(f"not an http(s) API URL: {host!r}")
        self._https, self._prefix = url.scheme == "https", url.path
        self._address = (url.hostname, url.port or (443 if self._https else 80))
        self.authorization = authorization
        self._ssl_context = ssl_context
        self._local = threading.local()
        self.limiter = limiter  # shared by every caller of this client; None: unlimited (tests)
        self.max_response_bytes, self.max_event_bytes = max_response_bytes, max_event_bytes

    # ------------------------------------------------------------------ plumbing

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        host, port = self._address
        if self._https:
            import ssl

            context = self._ssl_context() if self._ssl_context else ssl.create_default_context()
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
        return http.client.HTTPConnection(host, port, timeout=timeout)

    def _target(self, path: str, query: Mapping[str, Any] | None) -> str:
        def text(v: Any) -> str:
            return ("true" if v else "false") if isinstance(v, bool) else str(v)

        q = urllib.parse.urlencode({k: text(v) for k, v in (query or {}).items() if v is not None})
        return self._prefix + path + (f"?{q}" if q else "")

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if content_type:
            headers["Content-Type"] = content_type
        if auth := self.authorization():
            headers["Authorization"] = auth
        return headers

    def request(self, method: str, path: str, query: Mapping[str, Any] | None = None, body: Any = None, *,
                content_type: str = "application/json", timeout: float = 30.0) -> Any:
        """One request on this thread's connection; the decoded JSON answer (raises :class:`ApiException`)."""
        data = None if body is None else json.dumps(body).encode()
        target = self._target(path, query)
        headers = self._headers(content_type if data is not None else None)
        for attempt in (1, 2):
            self._wait_turn()
            conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
            reused = conn is not None
            if conn is None:
                conn = self._local.conn = self._connect(timeout)
            else:
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                raw = _read_capped(resp, self.max_response_bytes)
            except ApiResponseTooLarge:
                conn.close()  # the rest of the body is still on the wire: the connection is unusable
                self._local.conn = None
                raise
            except BaseException as e:
                conn.close()
                self._local.conn = None
                if reused and attempt == 1 and isinstance(e, _STALE):
                    continue  # the server closed the idle connection: once more on a new one
                raise
            if resp.will_close:
                conn.close()
                self._local.conn = None
            if not 200 <= resp.status < 300:
                raise ApiException(resp.status, resp.reason, raw)
            return json.loads(raw) if raw else None
        raise AssertionError("unreachable")

    def watch(self, path: str, query: Mapping[str, Any], *, connect_timeout: float = 30.0,
              read_timeout: float = 330.0) -> WatchStream:
        """Start a watch (``watch=true`` is added) on a connection of its own.

        ``connect_timeout`` bounds the connection and the response's headers (the API server sends them
        as the watch starts), so a peer that accepts and never answers fails as fast as a refused one;
        ``read_timeout`` then bounds each read of the event stream.
        """
        self._wait_turn()
        conn = self._connect(connect_timeout)
        try:
            conn.request("GET", self._target(path, {**query, "watch": True}), headers=self._headers(None))
            resp = conn.getresponse()
            if conn.sock is not None:
                conn.sock.settimeout(read_timeout)  # past the server's timeoutSeconds: a silent peer still ends
            if not 200 <= resp.status < 300:
                raise ApiException(resp.status, resp.reason, resp.read(64 * 1024))
        except BaseException:
            conn.close()
            raise
        return WatchStream(conn, resp, self.max_event_bytes)

    def _wait_turn(self) -> None:
        if self.limiter is not None:
            self.limiter.acquire()

    # ------------------------------------------------------------------ the calls the daemon makes

    def get(self, path: str, query: Mapping[str, Any] | None = None, timeout: float = 30.0) -> Any:
        return self.request("GET", path, query, timeout=timeout)

    def create_event(self, namespace: str, body: Mapping[str, Any], timeout: float = 10.0) -> Any:
        """POST an ``events.k8s.io/v1`` Event."""
        return self.request("POST", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", body=body,
                            timeout=timeout)

    def patch_event(self, name: str, namespace: str, patch: Mapping[str, Any], timeout: float = 10.0) -> Any:
        """Merge-patch an ``events.k8s.io/v1`` Event."""
        return self.request("PATCH", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events/{name}", body=patch,
                            content_type="application/merge-patch+json", timeout=timeout)


class WatchStream:
    """A watch response: newline-delimited JSON events."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse,
                 max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._conn, self._resp, self._max_event = conn, resp, max_event_bytes

    def events(self) -> Iterator[dict[str, Any]]:
        """Each event object until the server ends the watch; raises on a broken stream or an event
        over the bound (:class:`ApiResponseTooLarge`)."""
        pending: list[bytes] = []  # the current line's chunks: joined once, when its newline comes
        size = 0
        while chunk := self._resp.read1(65536):
            *complete, rest = chunk.split(b"\n")
            for part in complete:
                line = b"".join([*pending, part]) if pending else part
                pending, size = [], 0
                if len(line) > self._max_event:
                    raise ApiResponseTooLarge("watch event", self._max_event)
                if line.strip():
                    event = json.loads(line)
                    if not isinstance(event, dict):
                        raise ValueError("watch event is not an object")
                    yield event
            if rest:
                pending.append(rest)
                size += len(rest)
                if size > self._max_event:
                    raise ApiResponseTooLarge("watch event", self._max_event)
        if b"".join(pending).strip():
            raise ValueError("watch stream ended in the middle of an event")

    def shutdown(self) -> None:
        """End a read blocked in another thread (closing alone would not wake it)."""
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._conn.close()


# ---------------------------------------------------------------------- configuration


def in_cluster(directory: Path | None = None, environ: Mapping[str, str] | None = None) -> KubeApi | None:
    """The service account's API client, or None outside a cluster (as client-go decides it)."""
    directory = directory or SERVICE_ACCOUNT
    environ = os.environ if environ is None else environ
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    token, ca = directory / "token", directory / "ca.crt"
    if not host or not port or not token.is_file() or not ca.is_file():
        return None
    if ":" in host:
        host = f"[{host}]"  # IPv6
    return in_cluster_client(f"https://{host}:{port}", directory)


def in_cluster_client(url: str, directory: Path | None = None) -> KubeApi:
    """``url`` with the service account's token (re-read when it rotates) and CA."""
    directory = directory or SERVICE_ACCOUNT
    token, ca = directory / "token", directory / "ca.crt"
    if not token.read_text().strip():
        raise KubeConfigError(f"the service-account token {token} is empty")
    return KubeApi(url, authorization=_Reloaded(token, _bearer), ssl_context=_Reloaded(ca, _ca_context))


def from_kubeconfig(path: str) -> KubeApi:
    """A kubeconfig's current context, read by the ``kubernetes`` package (loaded only here)."""
    import yaml
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise KubeConfigError("reading a kubeconfig needs the kubeconfig extra "
                              "(pip install 'kube-gpu-exporter[kubeconfig]'); in a cluster the service account "
                              "needs nothing") from None

    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=path, client_configuration=cfg, persist_config=False)
    except (ConfigException, OSError, yaml.YAMLError, ValueError, TypeError, KeyError, AttributeError) as e:
        # A kubeconfig of the wrong shape fails inside the client in many ways.
        raise KubeConfigError(" ".join(str(e).split()) or type(e).__name__) from None
    return from_configuration(cfg)


def from_configuration(cfg: Any) -> KubeApi:
    """A ``kubernetes.client.Configuration``'s server, credentials and TLS settings."""

    def authorization() -> str | None:
        if cfg.refresh_api_key_hook is not None:
            cfg.refresh_api_key_hook(cfg)  # exec plugins and OIDC renew their token here
        for setting in cfg.auth_settings().values():  # {"BearerToken": {"in": "header", "value": ...}}
            header = setting.get("in") == "header" and str(setting.get("key")).lower() == "authorization"
            if header and setting.get("value"):
                return setting["value"]
        return cfg.get_basic_auth_token() if cfg.username else None

    def context() -> Any:
        import ssl

        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.verify_ssl else ssl.SSLContext(
            ssl.PROTOCOL_TLS_CLIENT)
        if not cfg.verify_ssl:
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        return ctx

    return KubeApi(cfg.host, authorization=authorization, ssl_context=functools.cache(context))


def build_api_client(api_url: str | None, kubeconfig: str | None) -> KubeApi:
    """An API client from, in this order: an explicit API URL, a kubeconfig path, the in-cluster
    service account, then ``$KUBECONFIG`` / ``~/.kube/config``.

    With an explicit https URL the in-cluster token and CA are still used when present (pointing
    a DaemonSet at a specific apiserver endpoint); otherwise it is plain (tests, ``kubectl proxy``).
    """
    if api_url:
        # Never send the service-account token over plain http.
        if api_url.startswith("https://") and in_cluster() is not None:
            return in_cluster_client(api_url)
        return KubeApi(api_url)
    if kubeconfig:
        return from_kubeconfig(kubeconfig)
    if (api := in_cluster()) is not None:
        return api
    # Read $KUBECONFIG now, not when some library was imported.
    default = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if not os.path.exists(default):
        raise KubeConfigError(f"no Kubernetes API configuration: not in a cluster and no usable kubeconfig at "
                              f"{default} (use --kube-api-url or --kubeconfig)")
    try:
        return from_kubeconfig(default)
    except KubeConfigError as e:
        raise KubeConfigError(f"no Kubernetes API configuration: not in a cluster and no usable kubeconfig at "
                              f"{default}: {e} (use --kube-api-url or --kubeconfig)") from None
