"""All configuration: command-line flags, each with an environment-variable equivalent.

Precedence: flag > environment variable > default. ``docs/configuration.md`` is generated
from :data:`OPTIONS` (``kube-gpu-exporter --help`` shows the same).
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from exporter.attribution.infrastructure import DEFAULT_NAMESPACES, parse_namespaces
from exporter.exposition.label_names import FIXED_LABELS as FIXED_LABELS  # public here too (tests)
from exporter.exposition.label_names import check_label_names
from exporter.exposition.pod_labels import MAX_KEY_LENGTH, MAX_LABELS_PER_POD, PREFIX, AllowlistError, parse_allowlist
from exporter.model import OneLineError
from exporter.xid.events import EVENT_NAMESPACE, NODE_EVENT_NAMESPACES, REGARDING, REGARDING_NODE

ENV_PREFIX = "KUBE_GPU_EXPORTER_"


class ConfigError(OneLineError):
    """A flag or environment variable has a bad value (one line: what it echoes is escaped)."""


@dataclass(frozen=True, slots=True)
class Config:
    listen: str
    node_name: str
    interval: float
    host_proc: str
    simulate: str | None
    kube_api_url: str | None
    kubeconfig: str | None
    pod_watch: bool
    pod_resources_socket: str
    pod_label: str
    namespace_label: str
    container_label: str
    pod_labels_allowlist: str
    per_process_metrics: bool
    xid: bool
    kmsg_path: str | None
    kmsg_replay: bool
    xid_lookback: float
    xid_nvml_events: bool
    events: bool
    log_level: str
    log_format: str = "text"
    ready_without_nvml: bool = False
    web_config_file: str | None = None
    dcgm_compat: bool = False
    nvlink_metrics: bool = True
    xid_events_namespace: str = EVENT_NAMESPACE
    xid_events_regarding: str = REGARDING_NODE
    kube_api_qps: float = 5.0
    kube_api_burst: int = 10
    dra_max_claims_per_pod: int = 8
    infrastructure_namespaces: str = ",".join(DEFAULT_NAMESPACES)

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen(self.listen)


@dataclass(frozen=True, slots=True)
class Option:
    flag: str
    default: object
    help: str
    kind: type = str  # str | float | int | bool
    bounds: tuple[float, float] | None = None  # float and int options: the inclusive range accepted

    @property
    def range_text(self) -> str:
        """The accepted range as errors, --help and the generated docs say it ("" without bounds)."""
        return "" if self.bounds is None else " to ".join(f"{b:.15g}" for b in self.bounds)

    @property
    def described(self) -> str:
        """The help text, with the accepted range."""
        return f"{self.help} ({self.range_text})" if self.bounds else self.help

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


OPTIONS: tuple[Option, ...] = (
    Option("--listen", "0.0.0.0:9400", "HOST:PORT to serve /metrics on"),
    Option("--node-name", "", "this node's name (default: $NODE_NAME, else the hostname)"),
    # 0.05 s is the fastest a cycle over a full node keeps up with; past an hour the pod view and
    # /healthz (stale after 20 intervals) stop meaning anything.
    Option("--interval", 1.0, "seconds between NVML sampling cycles", float, (0.05, 3600.0)),
    Option("--host-proc", "/proc", "the host's /proc (NVML reports host PIDs)"),
    Option("--simulate", None, "serve a simulated node from this scenario file (no GPU, no cluster)"),
    Option("--kube-api-url", None, "Kubernetes API URL (tests; default: in-cluster or kubeconfig)"),
    Option("--kubeconfig", None, "kubeconfig file (default: in-cluster config, then $KUBECONFIG)"),
    Option("--pod-watch", True, "list and watch this node's pods", bool),
    # client-go's defaults (5 and 10): one token bucket for the pod watch, the Node, DRA and Events together
    Option("--kube-api-qps", 5.0, "requests a second to the Kubernetes API, all of the exporter's callers "
           "together (pods, the Node, DRA, Events): a token bucket as client-go's QPS", float, (0.1, 1000.0)),
    Option("--kube-api-burst", 10, "requests the --kube-api-qps bucket lets through at once (client-go's "
           "burst)", int, (1, 1000)),
    Option("--dra-max-claims-per-pod", 8, "ResourceClaims followed per pod (each is read from the API); a pod "
           "naming more is counted (kube_gpu_exporter_skips_total, reason dra_pod_claims_over_limit) and its "
           "further claims hold nothing", int, (1, 32)),
    Option("--pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock",
           "kubelet pod-resources socket; empty disables"),
    Option("--pod-label", "pod_name", "label name for the pod (a Prometheus label name, not one of the "
           "exporter's own labels such as node_name or uuid, nor another of these three)"),
    Option("--namespace-label", "namespace_name", "label name for the namespace (same rules)"),
    Option("--container-label", "container_name", "label name for the container (same rules)"),
    Option("--pod-labels-allowlist", "", "comma-separated regular expressions over pod label keys (each a full "
           f"match, tried on keys of at most {MAX_KEY_LENGTH} characters); a pod's matching labels are copied onto "
           f"nvidia_gpu_pod_info, named {PREFIX} + the sanitised key, at most {MAX_LABELS_PER_POD} per pod "
           "(docs/metrics.md#chargeback-by-pod-label); empty: none"),
    Option("--infrastructure-namespaces", ",".join(DEFAULT_NAMESPACES), "comma-separated namespaces whose MPS "
           "daemons (nvidia-cuda-mps-server, -control) are the GPUs' infrastructure: listed as such, neither a "
           "GPU's user nor unaccounted (docs/sharing.md#infrastructure); a tenant's process of that name elsewhere "
           "stays unaccounted"),
    Option("--per-process-metrics", False, "also export one row per GPU process", bool),
    Option("--nvlink-metrics", True, "export the NVLink families (nvidia_gpu_nvlink_*, six series per link; a MIG "
           "card's once, on the card's uuid); off: NVLink is not read from NVML and no NVLink series is served, "
           "--dcgm-compat's included (docs/metrics.md#health-nvml-no-dcgm)", bool),
    Option("--dcgm-compat", False, "also export dcgm-exporter's DCGM_FI_* series (names, units, labels), so its "
           "dashboards and alerts work unchanged (docs/metrics.md#dcgm-compatibility---dcgm-compat)", bool),
    Option("--xid", True, "watch the kernel log for NVIDIA Xid errors", bool),
    Option("--kmsg-path", None, "kernel log device or a file of kmsg records; 'none' for no kernel log "
           "(Xids from NVML events only) (default /dev/kmsg; none under --simulate)"),
    Option("--kmsg-replay", False, "read the kmsg path from its start (default: only new records)", bool),
    Option("--xid-lookback", 0.0, "also report Xids logged up to this many seconds before start", float,
           (0.0, 30 * 86400.0)),
    Option("--xid-nvml-events", True, "also take Xids from NVML events, deduplicated against the kernel log "
           "(works without kernel log access; off under --simulate)", bool),
    Option("--events", True, "post Kubernetes Events for Xid errors", bool),
    Option("--xid-events-namespace", EVENT_NAMESPACE, "namespace of the Xid Events about the Node: default or "
           "kube-system, the two the API server accepts for an Event about a cluster-scoped object "
           "(docs/xid.md#where-the-events-go)"),
    Option("--xid-events-regarding", REGARDING_NODE, "what an Xid of a known pod is an Event about: node (in "
           "--xid-events-namespace, the pod as related), or pod (in the pod's namespace, where kubectl describe "
           "pod shows it; needs create/patch on events in every namespace); Xids without a pod are the Node's"),
    Option("--log-level", "info", "debug, info, warning or error"),
    Option("--log-format", "text", "text, or json: one JSON object per line (time, level, logger, message, "
           "exception) for log pipelines"),
    Option("--ready-without-nvml", False, "report ready (/readyz 200) while NVML cannot be initialised, for nodes "
           "where that is expected (default: /readyz 503 naming the reason)", bool),
    Option("--web-config-file", None, "TLS and basic authentication: a web configuration file in the format of "
           "the Prometheus exporter-toolkit, as node_exporter's --web.config.file "
           "(docs/deploy.md#tls-and-authentication); default: plain HTTP, no authentication"),
)

# The subcommands: name -> (module whose main() runs it, or None for the exporter's own, one-line help).
SUBCOMMANDS: dict[str, tuple[str | None, str]] = {
    "rules": ("exporter.bundle.rules_cli", "render the recording rules"),
    "alerts": ("exporter.bundle.alerts.cli", "render the alerting rules"),
    "dashboards": ("exporter.bundle.dashboards.cli", "render the Grafana dashboards"),
    "render": (None, "run one sampling cycle, print the exposition and exit (the exporter's flags)"),
    "top": ("exporter.top.command", "a refreshing terminal view of an exporter's /status.json (extra: top)"),
}


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen must be HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def check_listen(listen: str) -> None:
    """Pre-flight: bind every address the server will bind for ``listen``, then release them.

    The server binds only after the first cycle and the watcher threads have started; probing at
    start turns an unknown host, an address of another machine or a busy port into one ConfigError.
    """
    host, port = parse_listen(listen)
    try:
        # The same lookup asyncio's create_server makes for this host.
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as e:  # gaierror, or a name the idna codec refuses
        detail = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"--listen {listen}: cannot resolve host {host!r}: {detail}") from None
    opened: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError:
                continue  # an address family this kernel lacks: asyncio skips it too
            opened.append(sock)
            # As the server's socket: a port left in TIME_WAIT is free to it, a listening one is not.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(addr)
            except OSError as e:
                raise ConfigError(bind_error(listen, addr[0], port, e)) from None
        if not opened:
            raise ConfigError(f"--listen {listen}: no usable address for host {host!r}")
    finally:
        for sock in opened:
            sock.close()


def bind_error(listen: str, address: str, port: int, e: OSError) -> str:
    """The one-line message for a failed bind of ``address``:``port`` (``listen`` as configured)."""
    if e.errno == errno.EADDRINUSE:
        return f"--listen {listen}: port {port} is already in use on {address}"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"--listen {listen}: no local interface has the address {address}"
    if e.errno == errno.EACCES:
        return f"--listen {listen}: permission denied for port {port} (below 1024 needs CAP_NET_BIND_SERVICE)"
    return f"--listen {listen}: cannot bind {address} port {port}: {e.strerror or e}"


def _parse_bool(text: str, name: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name} must be true or false, got {text!r}")


def _parse_bounded(text: str, name: str, o: Option) -> float:
    assert o.bounds is not None, o.flag  # every number has a range (tests/test_config.py)
    lo, hi = o.bounds
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not lo <= number <= hi:  # NaN fails both comparisons
        raise ConfigError(f"{name} must be a number from {o.range_text}, got {text!r}")
    return number


class _Parser(argparse.ArgumentParser):
    """Usage errors as ConfigError: one line on stderr like every other startup error."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see --help)")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The exporter's parser; ``command`` "render" gives the ``render`` subcommand's own."""
    from exporter import __version__

    epilog = (f"Every flag can also be set with an environment variable: {ENV_PREFIX}<FLAG>, "
              f"e.g. {ENV_PREFIX}LISTEN.")
    if command == "render":
        p = _Parser(prog="kube-gpu-exporter render", epilog=epilog,
                    description="Run one sampling cycle, print the exposition and exit (no server, no Xid "
                    "watcher). Takes the exporter's flags, e.g. --simulate SCENARIO.")
    else:
        p = _Parser(prog="kube-gpu-exporter", epilog=epilog,
                    description="Per-container GPU metrics for a Kubernetes node: without a subcommand, "
                    "sample and serve /metrics. Each subcommand has its own --help.")
        p.add_argument("--version", action="version", version=f"kube-gpu-exporter {__version__}")
    for o in OPTIONS:
        help_text = f"{o.described} (env {o.env}; default {o.default!r})"
        if o.kind is bool:
            p.add_argument(o.flag, dest=o.dest, action=argparse.BooleanOptionalAction, default=None,
                           help=help_text)
        else:
            p.add_argument(o.flag, dest=o.dest, default=None, help=help_text)
    if command is None:
        # Listed for usage and --help; cli.main dispatches a subcommand given first before parsing.
        sub = p.add_subparsers(dest="command", title="subcommands", metavar="{" + ",".join(SUBCOMMANDS) + "}")
        for name, (_, text) in SUBCOMMANDS.items():
            sub.add_parser(name, help=text, add_help=False)
    return p


def _convert(o: Option, raw: object, source: str) -> object:
    """One flag's or variable's text -> its value (raises ConfigError naming ``source``)."""
    if o.kind is bool:
        return raw if isinstance(raw, bool) else _parse_bool(str(raw), source)
    if o.kind is float:
        return _parse_bounded(str(raw), source, o)
    if o.kind is int:
        number = _parse_bounded(str(raw), source, o)
        if number != int(number):
            raise ConfigError(f"{source} must be a whole number from {o.range_text}, got {raw!r}")
        return int(number)
    return str(raw)


def load_config(argv: Sequence[str], environ: Mapping[str, str] | None = None, command: str | None = None
                ) -> Config:
    """Parse flags (of ``command``, see :func:`build_parser`) and environment into a :class:`Config`.

    Raises ConfigError.
    """
    env = os.environ if environ is None else environ
    parser = build_parser(command)
    ns, unknown = parser.parse_known_args(list(argv))
    if getattr(ns, "command", None):
        raise ConfigError(f"the subcommand {ns.command!r} must come first: kube-gpu-exporter {ns.command} ...")
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    values: dict[str, object] = {}
    sources: dict[str, str] = {}  # where each value came from, so an error names what to fix
    for o in OPTIONS:
        raw = getattr(ns, o.dest)
        sources[o.dest] = o.flag
        if raw is None and o.env in env:
            raw, sources[o.dest] = env[o.env], o.env
        values[o.dest] = o.default if raw is None else _convert(o, raw, sources[o.dest])
    # An empty node name stays empty here: the simulated node takes the scenario's name, the real one $NODE_NAME.
    cfg = Config(**values)  # type: ignore[arg-type]
    parse_listen(cfg.listen)
    check_label_names([(sources[d], str(values[d])) for d in ("pod_label", "namespace_label", "container_label")],
                      ConfigError)
    _check_pod_labels_allowlist(cfg, sources)
    try:
        parse_namespaces(cfg.infrastructure_namespaces)
    except ValueError as e:
        raise ConfigError(f"{sources['infrastructure_namespaces']}: {e}") from None
    if cfg.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"{sources['log_level']} must be debug, info, warning or error, got {cfg.log_level!r}")
    if cfg.xid_events_namespace not in NODE_EVENT_NAMESPACES:
        raise ConfigError(f"{sources['xid_events_namespace']} must be default or kube-system (the API server "
                          f"refuses an Event about a Node elsewhere), got {cfg.xid_events_namespace!r}")
    if cfg.xid_events_regarding not in REGARDING:
        raise ConfigError(f"{sources['xid_events_regarding']} must be node or pod, got {cfg.xid_events_regarding!r}")
    if cfg.log_format not in ("text", "json"):
        raise ConfigError(f"{sources['log_format']} must be text or json, got {cfg.log_format!r}")
    if cfg.web_config_file:
        from exporter.server.web_config import WebConfigError, load_web_config
        try:
            load_web_config(cfg.web_config_file, sources["web_config_file"])  # refused at start, with the key
        except WebConfigError as e:
            raise ConfigError(str(e)) from None
    return cfg


def _check_pod_labels_allowlist(cfg: Config, sources: Mapping[str, str]) -> None:
    """The allowlist's regexes compile and are safe; no label name of ours can meet a copied label_<key>."""
    source = sources["pod_labels_allowlist"]
    try:
        allowlist = parse_allowlist(cfg.pod_labels_allowlist)
    except AllowlistError as e:
        raise ConfigError(f"{source}: {e}") from None
    if not allowlist.patterns:
        return
    for dest in ("pod_label", "namespace_label", "container_label"):
        name = getattr(cfg, dest)
        if name.startswith(PREFIX):
            raise ConfigError(f"{sources[dest]} {name!r} could collide with the {PREFIX}<key> labels of {source}: "
                              f"choose a name not starting with {PREFIX}")


def options_markdown() -> str:
    """The configuration table for docs/configuration.md."""
    lines = ["| flag | environment variable | default | meaning |", "| --- | --- | --- | --- |"]
    for o in OPTIONS:
        flag = f"`{o.flag}` / `--no-{o.flag[2:]}`" if o.kind is bool else f"`{o.flag}`"
        lines.append(f"| {flag} | `{o.env}` | `{o.default}` | {o.described} |")
    return "\n".join(lines) + "\n"
