"""DRA through the recording rules on a real Prometheus: each claim's grant counts once (examples/dra-node.yaml).

train-0 and infer-mig-0 hold one device each (100); notebook-a and notebook-b share one claim
(50 each); the adminAccess monitoring pod holds nothing. So the node's allocated compute is 300
percent of one GPU: three claims, three devices, whatever the number of holders.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from exporter.bundle.rules import RuleOptions, render_rules
from tests.prom_support import PROMETHEUS, ROOT, query, run_prometheus, start_exporter, stop

pytestmark = pytest.mark.e2e  # every test here starts a server

NODE = "dra-node-1"


def _by(series, label: str) -> dict[str, float]:
    return {dict(k).get(label, ""): v for k, v in series.items()}


def test_claims_count_once_in_the_recorded_series(tmp_path: Path):
    assert Path(PROMETHEUS).exists(), "Prometheus server missing: apt-get install prometheus"
    exporter, address = start_exporter(ROOT / "examples" / "dra-node.yaml", NODE, tmp_path)
    try:
        proc, base = run_prometheus(tmp_path, render_rules(RuleOptions(interval="1s")), [{"targets": [address]}])
        try:
            want_pods = {"train-0": 100.0, "infer-mig-0": 100.0, "notebook-a": 50.0, "notebook-b": 50.0}
            deadline, pods, node = time.monotonic() + 60, {}, {}
            while time.monotonic() < deadline:
                pods = _by(query(base, "k8s_pod_gpu_request"), "pod_name")
                node = _by(query(base, "k8s_node_gpu_allocated_compute"), "node_name")
                if pods == want_pods and node.get(NODE) is not None:
                    break
                time.sleep(0.5)
            assert pods == want_pods
            assert math.isclose(node[NODE], 300.0)
        finally:
            stop(proc)
    finally:
        stop(exporter)
