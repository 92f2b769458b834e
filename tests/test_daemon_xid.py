"""The whole Xid path under --simulate: kmsg file -> counter with pod labels -> Event on the API."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config
from tests.k8s_double import ApiServerDouble
from tests.k8s_double.server import poll_until

ROOT = Path(__file__).resolve().parent.parent
MIXED = ROOT / "examples" / "mixed-4gpu-node.yaml"


def xid_rows(body: bytes) -> list[tuple[dict[str, str], float]]:
    return [(dict(s.labels), s.value) for fam in text_string_to_metric_families(body.decode())
            for s in fam.samples if s.name == "nvidia_gpu_xid_errors_total"]


@pytest.mark.e2e
def test_simulated_node_kmsg_file_to_counter_and_event(tmp_path: Path):
    kmsg = tmp_path / "kmsg"
    # GPU 0 of the mixed node is at 00000000:07:00.0; pid 1001 is the trainer's process on it.
    kmsg.write_text("4,10,1000000,-;NVRM: Xid (PCI:0000:07:00): 31, pid=1001, name=python, "
                    "Ch 00000008, intr 00000000. MMU Fault\n"
                    "4,11,1000500,-;NVRM: Xid (PCI:0000:07:00): 31, pid=1001, name=python, "
                    "Ch 00000008, intr 00000000. MMU Fault\n")
    with ApiServerDouble() as api:
        cfg = load_config(["--simulate", str(MIXED), "--kmsg-path", str(kmsg), "--kmsg-replay",
                           "--kube-api-url", api.url, "--interval", "0.1"], environ={})
        daemon = build_daemon(cfg)
        try:
            daemon.start()

            def counted():
                rows = xid_rows(daemon.holder.get().body)
                return rows if rows and sum(v for _, v in rows) == 2 else None

            rows = poll_until(counted, timeout=15)
            labels, value = rows[0]
            assert value == 2
            assert labels["uuid"] == "GPU-0a7c1f52-3b1d-4e86-9f0e-6c2d8a4b1e01"
            assert labels["minor_number"] == "0" and labels["xid"] == "31"
            assert (labels["namespace_name"], labels["pod_name"], labels["container_name"]) == (
                "ml", "trainer-5d8f7c9b4-x2k9p", "trainer")
            events = poll_until(lambda: api.events("events.k8s.io/v1") or None, timeout=15)
            event = events[0]
            assert event["type"] == "Warning" and "31" in event["reason"]
            assert event["regarding"]["kind"] == "Node"
            assert event["regarding"]["name"] == "gpu-node-mixed-1"
            assert event["related"]["name"] == "trainer-5d8f7c9b4-x2k9p"
        finally:
            daemon.close()


def test_unreadable_kmsg_disables_xid_but_not_the_exporter(tmp_path: Path):
    cfg = load_config(["--simulate", str(MIXED), "--kmsg-path", str(tmp_path / "absent")], environ={})
    daemon = build_daemon(cfg)
    try:
        daemon.start()
        assert b"nvidia_gpu_duty_cycle" in daemon.holder.get().body
    finally:
        daemon.close()
