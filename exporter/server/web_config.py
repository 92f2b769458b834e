"""``--web-config-file``: TLS and basic authentication, in the Prometheus exporter-toolkit format.

The file node_exporter reads with ``--web.config.file`` (exporter-toolkit docs/web-configuration.md):

* ``tls_server_config``: ``cert_file``, ``key_file``, ``client_ca_file``, ``client_auth_type``
  (NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert), ``min_version``/``max_version``
  (TLS12, TLS13). Relative paths are relative to the web config file's directory.
* ``basic_auth_users``: user -> bcrypt hash; every path then needs one of them (as node_exporter).

Refused at start, naming the key: any other key, the inline ``cert``/``key``/``client_ca``, ``cipher_suites``,
``curve_preferences``, ``prefer_server_cipher_suites``, ``client_allowed_sans``, ``http_server_config``,
``rate_limit``, and RequestClientCert/RequireAnyClientCert (Python's ssl verifies every certificate it requests).

The file itself is read once at start; the certificate, key and client CA files are re-read when they change
(checked on a new connection, at most every :data:`RELOAD_CHECK_SECONDS`), so cert-manager rotations apply.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from exporter.model import OneLineError

log = logging.getLogger("kube_gpu_exporter.http")

RELOAD_CHECK_SECONDS = 2.0
EXPIRY_WARN_SECONDS = 14 * 86400  # a certificate expiring within this long is logged (a warning)
EXPIRY_CHECK_SECONDS = 3600.0  # its expiry looked at again this often (and at every reload)
# The web config and each TLS file are small; the caps keep /dev/zero or a runaway file out of the memory.
MAX_WEB_CONFIG_BYTES = 1 << 20
MAX_TLS_FILE_BYTES = 1 << 20
TLS_KEYS = frozenset({"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"})
UNSUPPORTED = {
    "http_server_config": "HTTP/2 and custom headers are not supported",
    "rate_limit": "rate limiting is not supported",
    "cert": "inline certificates are not supported: use cert_file",
    "key": "inline keys are not supported: use key_file",
    "client_ca": "an inline client CA is not supported: use client_ca_file",
    "cipher_suites": "cipher suites are not configurable (OpenSSL's defaults apply)",
    "curve_preferences": "curves are not configurable (OpenSSL's defaults apply)",
    "prefer_server_cipher_suites": "cipher suites are not configurable (OpenSSL's defaults apply)",
    "client_allowed_sans": "client SAN allowlists are not supported",
}
VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
UNVERIFIED_AUTH = ("RequestClientCert", "RequireAnyClientCert")
_BCRYPT = re.compile(r"\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}")


class WebConfigError(OneLineError):
    """A web config file the exporter refuses; the message is one line naming the file (and its source)."""


def check_tls_file(path: Path) -> None:
    """Refuse (OSError, one line) a TLS file that is not a regular file or is larger than OpenSSL needs."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{path}: not a regular file")
    if st.st_size > MAX_TLS_FILE_BYTES:
        raise OSError(f"{path}: {st.st_size} bytes, larger than the {MAX_TLS_FILE_BYTES >> 20} MiB a TLS file may hold")


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """``tls_server_config``, resolved: absolute paths, ssl constants."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    verify_mode: ssl.VerifyMode = ssl.CERT_NONE
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.cert_file, self.key_file) + ((self.client_ca_file,) if self.client_ca_file else ())

    def context(self) -> ssl.SSLContext:
        """A server context from the files as they are now (raises OSError, ssl.SSLError)."""
        for f in self.files:
            check_tls_file(f)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version, ctx.maximum_version = self.min_version, self.max_version
        key_file = self.key_file

        def no_passphrase() -> bytes:  # without a callback OpenSSL prompts on a TTY, and HTTPS waits for it
            raise OSError(f"{key_file}: the private key is encrypted: give it without a passphrase")

        ctx.load_cert_chain(self.cert_file, self.key_file, password=no_passphrase)
        ctx.verify_mode = self.verify_mode
        if self.client_ca_file is not None:
            ctx.load_verify_locations(cafile=self.client_ca_file)
        return ctx


@dataclass(frozen=True, slots=True)
class WebConfig:
    """The parsed web configuration file; ``context`` is the TLS context built at load (None: plain HTTP)."""

    path: str
    tls: TlsSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    context: ssl.SSLContext | None = None


def load_web_config(path: str, source: str = "--web-config-file") -> WebConfig:
    """Read and check the file, load its certificates once; raises WebConfigError naming ``source``."""
    import yaml  # only with --web-config-file

    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_WEB_CONFIG_BYTES + 1)
        if len(raw) > MAX_WEB_CONFIG_BYTES:
            raise WebConfigError(f"{source} {path}: larger than {MAX_WEB_CONFIG_BYTES >> 20} MiB, the most it may hold")
        data = yaml.safe_load(raw.decode("utf-8"))
    except WebConfigError:
        raise
    except (OSError, ValueError, yaml.YAMLError) as e:  # ValueError: a NUL in the path (UnicodeError is one)
        # A YAML error spans lines (context, caret): its words on one line are enough.
        raise WebConfigError(f"{source} {path}: cannot read it: {' '.join(str(e).split())}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise WebConfigError(f"{source} {path}: must be a mapping, got {type(data).__name__}")
    _refuse_keys(data, {"tls_server_config", "basic_auth_users"}, f"{source} {path}")
    tls = _tls(data.get("tls_server_config"), Path(path).parent, f"{source} {path}: tls_server_config")
    users = _users(data.get("basic_auth_users"), f"{source} {path}: basic_auth_users")
    context = None
    if tls is not None:
        try:
            context = tls.context()
        except (OSError, ValueError, ssl.SSLError) as e:  # ValueError: a NUL in a certificate path
            raise WebConfigError(f"{source} {path}: cannot load the certificate: {e}") from None
    return WebConfig(path, tls, users, context)


def _refuse_keys(data: Mapping, known: frozenset[str] | set[str], where: str) -> None:
    for key in data:
        if key in UNSUPPORTED:
            raise WebConfigError(f"{where}: {key!r} is not supported: {UNSUPPORTED[key]}")
        if key not in known:
            raise WebConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")


def _tls(section: object, base: Path, where: str) -> TlsSettings | None:
    if section is None:
        return None
    if not isinstance(section, dict):
        raise WebConfigError(f"{where}: must be a mapping")
    _refuse_keys(section, TLS_KEYS, where)
    for key, value in section.items():
        if not isinstance(value, str):
            raise WebConfigError(f"{where}: {key} must be a string, got {value!r}")
    if not section.get("cert_file") or not section.get("key_file"):
        raise WebConfigError(f"{where}: cert_file and key_file are required")
    auth = section.get("client_auth_type") or "NoClientCert"
    if auth in UNVERIFIED_AUTH:
        raise WebConfigError(f"{where}: client_auth_type {auth} is not supported (Python's ssl verifies every client "
                          "certificate it asks for): use VerifyClientCertIfGiven or RequireAndVerifyClientCert")
    if auth not in CLIENT_AUTH:
        raise WebConfigError(f"{where}: client_auth_type must be one of {', '.join(CLIENT_AUTH)}, got {auth!r}")
    ca = section.get("client_ca_file") or None
    if ca and auth == "NoClientCert":
        raise WebConfigError(f"{where}: client_ca_file is set but client_auth_type is NoClientCert")
    if not ca and auth != "NoClientCert":
        raise WebConfigError(f"{where}: client_auth_type {auth} needs client_ca_file")
    versions = []
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        name = section.get(key) or default
        if name not in VERSIONS:
            raise WebConfigError(f"{where}: {key} must be TLS12 or TLS13, got {name!r}")
        versions.append(VERSIONS[name])
    if versions[0] > versions[1]:
        raise WebConfigError(f"{where}: min_version is above max_version")
    return TlsSettings(base / section["cert_file"], base / section["key_file"], base / ca if ca else None,
                       CLIENT_AUTH[auth], versions[0], versions[1])


def _users(section: object, where: str) -> dict[str, bytes]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise WebConfigError(f"{where}: must be a mapping of user names to bcrypt hashes")
    users: dict[str, bytes] = {}
    for user, hashed in section.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"{where}: user names are non-empty strings without ':', got {user!r}")
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise WebConfigError(f"{where}: the password of {user!r} must be a bcrypt hash ($2y$10$...)")
        users[user] = hashed.encode()
    return users


def expiry_state(not_after: float | None, now: float, warn: float = EXPIRY_WARN_SECONDS) -> str:
    """"expired", "expiring" (within ``warn`` seconds) or "ok" (also when the end is not known)."""
    if not_after is None:
        return "ok"
    return "expired" if not_after <= now else "expiring" if not_after - now <= warn else "ok"


def cert_not_after(path: Path) -> float | None:
    """The first certificate's notAfter in ``path`` as unix time; None when it cannot be read here."""
    try:
        decoded = ssl._ssl._test_decode_cert(str(path))  # type: ignore[attr-defined]  # CPython's, no new dependency
        return float(ssl.cert_time_to_seconds(decoded["notAfter"]))
    except (AttributeError, KeyError, OSError, ValueError, ssl.SSLError):
        return None


class TlsReloader:
    """Hands every new connection a context from the current certificate files.

    :meth:`server_context` is the context for ``create_server``; its ``sni_callback`` (called for every
    handshake) switches the connection to :meth:`current`, rebuilt when a file's mtime, size or inode changed.
    """

    def __init__(self, settings: TlsSettings, initial: ssl.SSLContext | None = None,
                 clock: Callable[[], float] = time.monotonic, interval: float = RELOAD_CHECK_SECONDS,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.settings, self._clock, self._interval, self._wall = settings, clock, interval, wall_clock
        self._stamps = self._read_stamps()
        self._current = initial if initial is not None else settings.context()
        self._checked = clock()
        self.reloads = 0
        self._not_after = cert_not_after(settings.cert_file)
        self._expiry, self._expiry_checked = "ok", clock()
        self._check_expiry()
        self._base = self._current  # every handshake starts on it; _on_hello moves it to the current one
        self._base.sni_callback = self._on_hello

    def server_context(self) -> ssl.SSLContext:
        return self._base

    def _read_stamps(self) -> tuple[tuple[int, int, int] | None, ...]:
        stamps = []
        for f in self.settings.files:
            try:
                st = os.stat(f)
            except OSError:
                stamps.append(None)
            else:
                stamps.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(stamps)

    def current(self) -> ssl.SSLContext:
        """The newest context; a failed reload keeps the previous one (logged once per change)."""
        now = self._clock()
        if now - self._checked >= self._interval:
            self._checked = now
            stamps = self._read_stamps()
            if stamps != self._stamps:
                self._stamps = stamps
                try:
                    self._current = self.settings.context()
                except (OSError, ssl.SSLError) as e:
                    log.error("TLS certificate not reloaded, keeping the previous one: %s", e)
                else:
                    self.reloads += 1
                    log.info("TLS certificate reloaded from %s", self.settings.cert_file)
                    self._not_after = cert_not_after(self.settings.cert_file)
                    self._check_expiry()
        if now - self._expiry_checked >= EXPIRY_CHECK_SECONDS:
            self._check_expiry()
        return self._current

    def _check_expiry(self) -> None:
        """Log the served certificate's expiry once per change of state (ok, expiring, expired)."""
        self._expiry_checked = self._clock()
        state = expiry_state(self._not_after, self._wall())
        if state == self._expiry:
            return
        self._expiry = state
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self._not_after or 0))
        if state == "expired":
            log.error("TLS certificate %s expired at %s: clients that verify it refuse every connection",
                      self.settings.cert_file, when)
        elif state == "expiring":
            log.warning("TLS certificate %s expires in %.1f days (%s): renew it", self.settings.cert_file,
                        ((self._not_after or 0) - self._wall()) / 86400, when)
        else:
            log.info("TLS certificate %s is valid until %s", self.settings.cert_file, when)

    def _on_hello(self, conn: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                  ctx: ssl.SSLContext) -> None:
        current = self.current()
        if current is not conn.context:
            conn.context = current
