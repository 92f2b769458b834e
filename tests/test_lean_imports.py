"""The daemon imports only what its configured features use (issue 13: a lean per-node agent).

Each case runs the real daemon (``python -m exporter``'s main, through tests/module_probe.py),
waits until it serves, stops it and reads every module it had loaded. The heavy packages of
features that are off, or that the daemon does not use at all, must be absent: the ``kubernetes``
client (only a kubeconfig loads it), grpcio (replaced by grpclib), the rule and dashboard
templates (jinja2), the terminal view (textual), bcrypt (basic authentication only), YAML (a
scenario or a web config file only), protobuf.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.integration_support import (
    EXAMPLES,
    ROOT,
    ExporterProcess,
    exporter_node,
    free_port,
    generate_node,
    select,
    value,
)

pytestmark = pytest.mark.e2e  # every test here builds the fake NVML library (gcc), starts a server

PROBE = ROOT / "tests" / "module_probe.py"
READY_S = 60.0
NEVER = {"kubernetes", "grpc", "aiohttp", "google", "jinja2", "textual", "bcrypt", "urllib3", "requests", "pydantic",
         "exporter.bundle"}


def without_listen(argv: list[str]) -> list[str]:
    """The exporter's flags from an ``exporter_node`` command line, its ``--listen`` left out."""
    flags = argv[3:]
    i = flags.index("--listen")
    return flags[:i] + flags[i + 2:]


def top_level(modules: list[str]) -> set[str]:
    """Every module and package loaded, each dotted prefix of a name included."""
    return {".".join(m.split(".")[:i + 1]) for m in modules for i in range(m.count(".") + 1)}


def probe(tmp_path: Path, flags: list[str], env: dict | None = None, ready=None) -> set[str]:
    port = free_port()
    out = tmp_path / "modules.json"
    argv = [sys.executable, str(PROBE), str(out), "--", *flags, "--listen", f"127.0.0.1:{port}"]
    exp = ExporterProcess(argv, env or {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, port, tmp_path / "log")
    exp.start()
    try:
        exp.wait_ready(READY_S)
        if ready is not None:
            exp.wait_for(ready, READY_S, "the daemon warm")
    finally:
        exp.stop()
    assert exp.proc is not None and exp.proc.returncode == 0, exp.output()[-3000:]
    return top_level(json.loads(out.read_text())["modules"])


def test_simulated_mode_loads_no_cluster_client(tmp_path: Path) -> None:
    loaded = probe(tmp_path, ["--simulate", str(EXAMPLES / "mixed-4gpu-node.yaml")])
    unwanted = NEVER | {"grpclib", "h2", "exporter.node.kube_api"}
    assert not loaded & unwanted, sorted(loaded & unwanted)
    assert "yaml" in loaded  # the scenario file


def test_real_mode_loads_what_its_sources_need(tmp_path: Path) -> None:
    scenario = generate_node(gpus=2, processes=3)
    with exporter_node(scenario, tmp_path / "node", interval=0.2) as node:
        node.exporter.stop()  # the probe runs the same daemon, flags and environment

        def synced(s: dict) -> bool:
            rows = select(s, "nvidia_gpu_allocated_gpus") or select(s, "nvidia_gpu_memory_used_bytes")
            return value(s, "kube_gpu_exporter_pod_cache_synced") == 1 and bool(rows)

        loaded = probe(tmp_path, without_listen(node.exporter.argv), node.exporter.env, synced)
        assert node.podres.calls > 0 and node.api.requests_to("GET", "/api/v1/pods")
    assert not loaded & (NEVER | {"yaml"}), sorted(loaded & (NEVER | {"yaml"}))
    assert {"grpclib", "exporter.node"} <= loaded  # the pod-resources socket and the API are on


def test_real_mode_without_pods_or_pod_resources(tmp_path: Path) -> None:
    scenario = generate_node(gpus=1, processes=1)
    with exporter_node(scenario, tmp_path / "node", interval=0.2) as node:
        node.exporter.stop()
        flags = without_listen(node.exporter.argv)
        flags[flags.index("--pod-resources-socket") + 1] = ""
        loaded = probe(tmp_path, [*flags, "--no-pod-watch"], node.exporter.env)
    unwanted = NEVER | {"yaml", "grpclib", "h2", "exporter.node.kube_api"}
    assert not loaded & unwanted, sorted(loaded & unwanted)
