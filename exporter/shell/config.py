"""All configuration: command-line flags, each with an environment-variable equivalent.

Precedence: flag > environment variable > default. ``docs/configuration.md`` is generated
from :data:`OPTIONS` (``kube-gpu-exporter --help`` shows the same).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ENV_PREFIX = "KUBE_GPU_EXPORTER_"
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class ConfigError(ValueError):
    """A flag or environment variable has a bad value."""


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
    per_process_metrics: bool
    xid: bool
    kmsg_path: str | None
    kmsg_replay: bool
    xid_lookback: float
    xid_nvml_events: bool
    events: bool
    log_level: str

    @property
    def host_port(self) -> tuple[str, int]:
        return parse_listen(self.listen)


@dataclass(frozen=True, slots=True)
class Option:
    flag: str
    default: object
    help: str
    kind: type = str  # str | float | bool

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


OPTIONS: tuple[Option, ...] = (
    Option("--listen", "0.0.0.0:9400", "HOST:PORT to serve /metrics on"),
    Option("--node-name", "", "this node's name (default: $NODE_NAME, else the hostname)"),
    Option("--interval", 1.0, "seconds between NVML sampling cycles", float),
    Option("--host-proc", "/proc", "the host's /proc (NVML reports host PIDs)"),
    Option("--simulate", None, "serve a simulated node from this scenario file (no GPU, no cluster)"),
    Option("--kube-api-url", None, "Kubernetes API URL (tests; default: in-cluster or kubeconfig)"),
    Option("--kubeconfig", None, "kubeconfig file (default: in-cluster config, then $KUBECONFIG)"),
    Option("--pod-watch", True, "list and watch this node's pods", bool),
    Option("--pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock",
           "kubelet pod-resources socket; empty disables"),
    Option("--pod-label", "pod_name", "label name for the pod"),
    Option("--namespace-label", "namespace_name", "label name for the namespace"),
    Option("--container-label", "container_name", "label name for the container"),
    Option("--per-process-metrics", False, "also export one row per GPU process", bool),
    Option("--xid", True, "watch the kernel log for NVIDIA Xid errors", bool),
    Option("--kmsg-path", None, "kernel log device or a file of kmsg records "
           "(default /dev/kmsg; none under --simulate)"),
    Option("--kmsg-replay", False, "read the kmsg path from its start (default: only new records)", bool),
    Option("--xid-lookback", 0.0, "also report Xids logged up to this many seconds before start", float),
    Option("--xid-nvml-events", True, "also take Xids from NVML events, deduplicated against the kernel log "
           "(works without kernel log access; off under --simulate)", bool),
    Option("--events", True, "post Kubernetes Events for Xid errors", bool),
    Option("--log-level", "info", "debug, info, warning or error"),
)


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ConfigError(f"--listen must be HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _parse_bool(text: str, name: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name} must be true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kube-gpu-exporter",
        description="Per-container GPU metrics for a Kubernetes node. Subcommands: "
        "'rules', 'alerts' and 'dashboards' render the generated rules, alerts and Grafana dashboards; "
        "'render' prints one exposition and exits.",
        epilog=f"Every flag can also be set with an environment variable: {ENV_PREFIX}<FLAG>, "
        f"e.g. {ENV_PREFIX}LISTEN.")
    for o in OPTIONS:
        help_text = f"{o.help} (env {o.env}; default {o.default!r})"
        if o.kind is bool:
            p.add_argument(o.flag, dest=o.dest, action=argparse.BooleanOptionalAction, default=None,
                           help=help_text)
        else:
            p.add_argument(o.flag, dest=o.dest, default=None, help=help_text)
    return p


def load_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Config:
    """Parse flags and environment into a validated :class:`Config` (raises ConfigError)."""
    env = os.environ if environ is None else environ
    ns = build_parser().parse_args(list(argv))
    values: dict[str, object] = {}
    for o in OPTIONS:
        raw = getattr(ns, o.dest)
        source = o.flag
        if raw is None and o.env in env:
            raw, source = env[o.env], o.env
        if raw is None:
            values[o.dest] = o.default
        elif o.kind is bool:
            values[o.dest] = raw if isinstance(raw, bool) else _parse_bool(str(raw), source)
        elif o.kind is float:
            try:
                number = float(raw)
            except ValueError:
                raise ConfigError(f"{source} must be a number, got {raw!r}") from None
            if not number >= 0 or number == float("inf"):
                raise ConfigError(f"{source} must be a finite number >= 0, got {raw!r}")
            values[o.dest] = number
        else:
            values[o.dest] = str(raw)
    if not values["node_name"]:
        # Left empty here: the simulated node takes the scenario's name, the real one $NODE_NAME.
        values["node_name"] = ""
    cfg = Config(**values)  # type: ignore[arg-type]
    parse_listen(cfg.listen)
    if cfg.interval < 0.05:
        raise ConfigError(f"--interval must be at least 0.05 seconds, got {cfg.interval}")
    for flag, name in (("--pod-label", cfg.pod_label), ("--namespace-label", cfg.namespace_label),
                       ("--container-label", cfg.container_label)):
        if not _LABEL.match(name) or name.startswith("__"):
            raise ConfigError(f"{flag} must be a Prometheus label name, got {name!r}")
    if len({cfg.pod_label, cfg.namespace_label, cfg.container_label}) != 3:
        raise ConfigError("--pod-label, --namespace-label and --container-label must differ")
    if cfg.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"--log-level must be debug, info, warning or error, got {cfg.log_level!r}")
    return cfg


def options_markdown() -> str:
    """The configuration table for docs/configuration.md."""
    lines = ["| flag | environment variable | default | meaning |", "| --- | --- | --- | --- |"]
    for o in OPTIONS:
        flag = f"`{o.flag}` / `--no-{o.flag[2:]}`" if o.kind is bool else f"`{o.flag}`"
        lines.append(f"| {flag} | `{o.env}` | `{o.default}` | {o.help} |")
    return "\n".join(lines) + "\n"
