"""MIG: each MIG device stands in for its physical GPU and is attributed like a whole GPU."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from exporter.attribution.allocations import AllocationInputs, compute_allocations
from exporter.attribution.utilization import (
    UTILIZATION_GPM,
    UTILIZATION_NVML,
    UTILIZATION_UNAVAILABLE,
    utilization_source,
)
from exporter.exposition.health_notes import NO_UTILIZATION, utilization_note
from exporter.node.pods import pod_from_api
from exporter.node.simulate import ScenarioError, load_scenario, parse_scenario
from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config
from exporter.xid.parse import gpu_for_xid
from tests.k8s_double.server import poll_until
from tests.simulated import one_cycle, values
from tests.test_daemon_xid import xid_rows

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mig-a100-node.yaml"
DOC = yaml.safe_load(EXAMPLE.read_text())
CARD0 = "GPU-a1000000-0000-4000-8000-000000000000"
CARD1 = "GPU-a1000000-0000-4000-8000-000000000001"
MIG_3G = "MIG-3a1b2c3d-0000-5000-8000-000000000001"
MIG_2G_A = "MIG-2a1b2c3d-0000-5000-8000-000000000002"
MIG_2G_B = "MIG-2a1b2c3d-0000-5000-8000-000000000003"
GIB = 2**30


def _rows(text: str, family: str) -> dict[str, list[dict[str, str] | float]]:
    """{uuid: [(labels, value), ...]} of one family."""
    out: dict[str, list] = {}
    for (name, labels), value in values(text).items():
        if name == family:
            lbl = dict(labels)
            out.setdefault(lbl["uuid"], []).append((lbl, value))
    return out


def _render_doc(doc: dict, tmp_path: Path) -> str:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc))
    return one_cycle(path)


def _check_attribution(text: str) -> None:
    used = _rows(text, "nvidia_gpu_memory_used_bytes")
    # the partitioned card itself has no row: its MIG devices stand in its place
    assert CARD0 not in used
    assert set(used) == {MIG_3G, MIG_2G_A, MIG_2G_B, CARD1}
    (lbl, value), = used[MIG_3G]
    assert (lbl["allocate_mode"], lbl["pod_name"], lbl["container_name"], value) == (
        "exclusive", "train-large-0", "trainer", 20 * GIB)
    assert lbl["name"] == "NVIDIA A100-SXM4-80GB MIG 3g.40gb" and lbl["minor_number"] == "0"
    (lbl, value), = used[MIG_2G_A]
    assert (lbl["allocate_mode"], lbl["pod_name"], value) == ("exclusive", "infer-small-6d5c4b3a2-xk2lp", 8 * GIB)
    (lbl, value), = used[MIG_2G_B]
    assert (lbl["allocate_mode"], lbl["pod_name"], value) == ("None", "", 0)
    # memory total is the MIG device's, power and temperature are the card's
    total = {u: rows[0][1] for u, rows in _rows(text, "nvidia_gpu_memory_total_bytes").items()}
    assert total == {MIG_3G: 40 * GIB, MIG_2G_A: 20 * GIB, MIG_2G_B: 20 * GIB, CARD1: 80 * GIB}
    power = {u: rows[0][1] for u, rows in _rows(text, "nvidia_gpu_power_usage_milliwatts").items()}
    assert power == {MIG_3G: 212000, MIG_2G_A: 212000, MIG_2G_B: 212000, CARD1: 250000}
    # NVML has no utilization for MIG devices: absent, not 0
    assert set(_rows(text, "nvidia_gpu_duty_cycle")) == {CARD1}
    # allocations: one per container, the MIG device's memory
    alloc = {u: [(lb["pod_name"], v) for lb, v in rows]
             for u, rows in _rows(text, "nvidia_gpu_allocated_memory_bytes").items()}
    assert alloc == {MIG_3G: [("train-large-0", 40 * GIB)], MIG_2G_A: [("infer-small-6d5c4b3a2-xk2lp", 20 * GIB)],
                     CARD1: [("notebook-ana", 80 * GIB)]}
    v = values(text)
    assert v[("nvidia_gpu_num_devices", frozenset({("node_name", "gpu-node-mig-1")}))] == 4


def test_mig_devices_are_attributed_like_whole_gpus() -> None:
    text = one_cycle(EXAMPLE)
    _check_attribution(text)
    info = {u: rows[0][0] for u, rows in _rows(text, "nvidia_gpu_mig_device_info").items()}
    assert set(info) == {MIG_3G, MIG_2G_A, MIG_2G_B}
    assert {(i["parent_uuid"], i["profile"], i["gpu_instance_id"], i["compute_instance_id"])
            for i in info.values()} == {(CARD0, "3g.40gb", "2", "0"), (CARD0, "2g.20gb", "3", "0"),
                                        (CARD0, "2g.20gb", "4", "0")}


def test_without_pod_resources_mig_allocations_are_placed_by_processes(tmp_path: Path) -> None:
    doc = copy.deepcopy(DOC)
    del doc["pod_resources"]
    # limits and requests name the same MIG resource: still one slice, not two
    _check_attribution(_render_doc(doc, tmp_path))


def test_lost_card_takes_its_mig_devices_with_it(tmp_path: Path) -> None:
    doc = copy.deepcopy(DOC)
    doc["devices"][0]["lost_after_ticks"] = 0
    v = values(_render_doc(doc, tmp_path))
    up = {dict(lbl)["uuid"]: val for (n, lbl), val in v.items() if n == "nvidia_gpu_up"}
    assert up == {MIG_3G: 0, MIG_2G_A: 0, MIG_2G_B: 0, CARD1: 1}


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["devices"][0].update(processes=[{"pid": 9}]), "processes on them, not on itself"),
    (lambda d: d["devices"][0].update(mig_devices=[]), "MIG mode with no MIG device"),
    (lambda d: d["devices"][0]["mig_devices"][0].update(uuid="GPU-x"), "starts with MIG-"),
    (lambda d: d["devices"][0]["mig_devices"][0].pop("profile"), "'profile' is required"),
    (lambda d: d["devices"][0]["mig_devices"][0].update(sm_util=3), "unknown key(s) sm_util"),
    (lambda d: d["devices"][0]["mig_devices"][0].update(memory_used_bytes=50 * GIB), "exceeds"),
    (lambda d: d["devices"][0]["mig_devices"][1].update(uuid=MIG_3G), "duplicate uuid"),
    (lambda d: d["devices"][0]["mig_devices"][0]["processes"].append({"pid": 7001}), "duplicate pid"),
])
def test_broken_mig_scenarios_give_clear_errors(mutate, message) -> None:
    doc = copy.deepcopy(DOC)
    mutate(doc)
    with pytest.raises(ScenarioError, match=re.escape(message)):
        parse_scenario(doc)


def test_a_mig_resource_in_limits_and_requests_is_one_slice() -> None:
    scenario = load_scenario(EXAMPLE)
    pods = [pod_from_api(p) for p in DOC["pods"]]
    devices = [d.sample for d in scenario.devices]
    got = compute_allocations(AllocationInputs(pods, devices, {}, None)).allocations
    per_container = sorted((a.container, a.uuid, a.whole) for a in got)
    assert per_container == [("lab", None, True), ("server", None, True), ("trainer", None, True)]
    placed = compute_allocations(AllocationInputs(pods, devices, {}, scenario.pod_resources)).allocations
    assert sorted((a.container, a.uuid) for a in placed) == [
        ("lab", CARD1), ("server", MIG_2G_A), ("trainer", MIG_3G)]


# ---------------------------------------------------------------- Xids on a MIG card

def test_gpu_for_xid_picks_the_mig_device_by_gpu_instance_else_the_card() -> None:
    devices = [d.sample for d in load_scenario(EXAMPLE).devices]
    assert gpu_for_xid(devices, "0000:07:00", 3) == (MIG_2G_A, 0)
    assert gpu_for_xid(devices, "0000:07:00", 2) == (MIG_3G, 0)
    assert gpu_for_xid(devices, "0000:07:00", None) == (CARD0, 0)  # card-wide, e.g. Xid 79
    assert gpu_for_xid(devices, "0000:07:00", 9) == (CARD0, 0)  # an instance we do not list
    assert gpu_for_xid(devices, "0000:0f:00", None) == (CARD1, 1)
    assert gpu_for_xid(devices, "0000:0f:00", 1) == (CARD1, 1)  # not in MIG mode: the card
    assert gpu_for_xid(devices, "0000:99:00", None) is None


def test_simulated_mig_node_kmsg_xids_land_on_the_mig_device(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "4,10,1000000,-;NVRM: Xid (PCI:0000:07:00 GPU-I:03): 31, pid=7002, name=tritonserver, "
        "Ch 00000008, intr 00000000. MMU Fault\n"
        "4,11,1000500,-;NVRM: Xid (PCI:0000:07:00): 79, pid=<unknown>, name=<unknown>, "
        "GPU has fallen off the bus.\n")
    cfg = load_config(["--simulate", str(EXAMPLE), "--kmsg-path", str(kmsg), "--kmsg-replay", "--no-events",
                       "--interval", "0.1"], environ={})
    daemon = build_daemon(cfg)
    try:
        daemon.start()

        def counted():
            rows = xid_rows(daemon.holder.get().body)
            return rows if len(rows) == 2 else None

        rows = {lbl["xid"]: lbl for lbl, _ in poll_until(counted, timeout=15)}
        assert rows["31"]["uuid"] == MIG_2G_A and rows["31"]["pod_name"] == "infer-small-6d5c4b3a2-xk2lp"
        assert rows["79"]["uuid"] == CARD0 and rows["79"]["pod_name"] == ""
    finally:
        daemon.close()


def test_fake_only_not_supported_names_are_accepted_by_the_simulated_node() -> None:
    doc = copy.deepcopy(DOC)
    doc["devices"][1]["not_supported"] = ["events", "mig"]
    doc["devices"][0]["not_supported"] = ["events"]
    parse_scenario(doc)
    doc["devices"][0]["not_supported"] = ["mig"]
    with pytest.raises(ScenarioError, match="not_supported lists mig, but the GPU has mig_devices"):
        parse_scenario(doc)


HOPPER = ROOT / "examples" / "mig-h100-node.yaml"
H_3G, H_2G, H_1G = (f"MIG-b2000000-0000-5000-8000-00000000000{i}" for i in (1, 2, 3))
H_WHOLE = "GPU-b2000000-0000-4000-8000-000000000001"


def test_hopper_mig_devices_serve_their_gpu_instance_gpm_and_the_holders_duty_cycle() -> None:
    """examples/mig-h100-node.yaml: GPM per GPU instance, natively and as DCGM_FI_PROF_* with GPU_I_*; the
    exclusive holder's duty cycle is its instance's graphics engine activity (NVML has no MIG utilization)."""
    text = one_cycle(HOPPER, "--dcgm-compat")
    sm = {u: rows[0][1] for u, rows in _rows(text, "nvidia_gpu_sm_active_ratio").items()}
    assert sm == {H_3G: 0.81, H_2G: 0.3, H_1G: 0.0, H_WHOLE: 0.58}  # each its own, the idle one 0, not absent
    duty = {u: [(lb["allocate_mode"], lb["pod_name"], v) for lb, v in rows]
            for u, rows in _rows(text, "nvidia_gpu_duty_cycle").items()}
    assert duty == {H_3G: [("exclusive", "train-large-0", 88.0)],
                    H_2G: [("exclusive", "infer-small-7f6d5c4b3-m2q8r", 35.0)], H_1G: [("None", "", 0.0)],
                    H_WHOLE: [("exclusive", "notebook-ana", 64.0)]}
    prof = {dict(lb).get("GPU_I_ID", ""): (dict(lb)["pod"], v) for (name, lb), v in values(text).items()
            if name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
    assert prof == {"2": ("train-large-0", 0.88), "3": ("infer-small-7f6d5c4b3-m2q8r", 0.35), "9": ("", 0.0),
                    "": ("notebook-ana", 0.64)}
    assert not [k for k in values(text) if k[0] == "DCGM_FI_DEV_GPU_UTIL" and dict(k[1]).get("GPU_I_ID")]


def test_a100_mig_devices_have_no_gpm_so_no_utilization_at_all() -> None:
    text = one_cycle(EXAMPLE, "--dcgm-compat")
    assert not _rows(text, "nvidia_gpu_sm_active_ratio")
    assert not [k for k in values(text) if k[0].startswith("DCGM_FI_PROF_")]


def test_the_utilization_source_tells_gpm_from_unavailable() -> None:
    """The fact the status page and `top` show: a MIG device's utilization comes from its GPU instance's GPM
    (Hopper) or is not available from NVML at all (A100): then "utilisation not available", not a dash."""
    sources = {d.sample.uuid: utilization_source(d.sample) for p in (HOPPER, EXAMPLE)
               for d in load_scenario(p).devices}
    assert sources == {H_3G: UTILIZATION_GPM, H_2G: UTILIZATION_GPM, H_1G: UTILIZATION_GPM,
                       H_WHOLE: UTILIZATION_NVML, MIG_3G: UTILIZATION_UNAVAILABLE, MIG_2G_A: UTILIZATION_UNAVAILABLE,
                       MIG_2G_B: UTILIZATION_UNAVAILABLE, CARD1: UTILIZATION_NVML}
    assert utilization_note({"utilization_source": UTILIZATION_UNAVAILABLE}) == NO_UTILIZATION
    assert NO_UTILIZATION == "utilisation not available from NVML on this GPU"
    for entry in ({"utilization_source": UTILIZATION_GPM}, {"utilization_source": UTILIZATION_NVML}, {}):
        assert utilization_note(entry) is None  # an older exporter's entry has no key: nothing claimed
