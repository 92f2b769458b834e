"""The prepared real-hardware check runs its NVML part against the fake library (no GPU here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter.exposition.device_fields import DEVICE_FIELDS
from tests.fake_nvml import subprocess_env, write_config

pytestmark = pytest.mark.e2e  # every test here builds the fake NVML library (gcc)

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "examples" / "mig-a100-node.yaml"



def device_check(lib: Path, tmp_path: Path, scenario: dict) -> tuple[dict, str]:
    """scripts/device-check.py run against the fake NVML loaded with ``scenario``: its JSON report and stdout."""
    env = subprocess_env(lib.parent, write_config(scenario, tmp_path / "fake.conf"))
    env["OUT"] = str(tmp_path / "out")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "device-check.py"), "--no-load"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((tmp_path / "out" / "device-check.json").read_text()), r.stdout


def test_device_check_reads_every_device_through_the_real_backend(lib: Path, tmp_path: Path) -> None:
    scenario = yaml.safe_load(SCENARIO.read_text())
    report, _ = device_check(lib, tmp_path, scenario)
    seen = {d["uuid"] for d in report["samples"][0]}
    want = {m["uuid"] for d in scenario["devices"] for m in d.get("mig_devices", [])}
    want |= {d["uuid"] for d in scenario["devices"] if "mig_devices" not in d}
    assert seen == want
    assert all(c["ok"] for c in report["checks"].values())
    assert report["driver_version"]


def test_device_check_reads_every_health_call_and_checks_the_backend_against_it(lib: Path, tmp_path: Path) -> None:
    from tests.test_nvml_health import H100

    t4 = {"uuid": "GPU-c1000000-0000-4000-8000-000000000000", "name": "Tesla T4", "memory_total_bytes": 16 << 30,
          "memory_used_bytes": 1 << 30, "retired_pages_single_bit": 2, "retired_pages_pending": 0}
    scenario = {"node": "n", "devices": [H100, t4]}
    report, stdout = device_check(lib, tmp_path, scenario)
    checks = report["checks"]
    for uuid in (H100["uuid"], t4["uuid"]):
        assert checks[f"{uuid} health calls"]["ok"] and checks[f"{uuid} backend health agrees"]["ok"]
    h100, other = report["health_direct"][H100["uuid"]], report["health_direct"][t4["uuid"]]
    # every new call read straight, its answer printed
    assert h100["nvmlDeviceGetEnforcedPowerLimit"] == {"value": 700_000}
    assert h100["nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)"] == {"value": 71}
    assert h100["nvmlDeviceGetMemoryInfo_v2"]["value"]["reserved"] == 600 << 20
    assert [h100[f"nvmlDeviceGetRemappedRows[{i}]"] for i in range(4)] == [{"value": v} for v in (6, 2, 1, 0)]
    # every device field's own read, read straight (DeviceField.read), with the scenario's value (energy: grown)
    reads = {f.attr.removeprefix("health."): f.read for f in DEVICE_FIELDS if f.read}
    got = {k: h100[read].get("value") for k, read in reads.items()}
    assert got.pop("energy_millijoules") >= H100["energy_millijoules"]
    assert got == {k: H100[k] for k in got}
    assert sorted(k for k in h100 if k.endswith(" state")) == ["nvlink 0 state", "nvlink 17 state", "nvlink 5 state"]
    assert h100["nvlink 0 tx KiB"] == {"value": 10} and h100["nvlink 5 tx KiB"] == {"error": "NVMLError_NotSupported"}
    assert h100["gpm sm_active (percent)"] == {"value": 50.0}
    assert other["nvmlDeviceGetRetiredPages(SINGLE_BIT)"] == {"value": 2}
    assert other["nvmlDeviceGetFanSpeed"] == {"error": "NVMLError_NotSupported"}
    assert other["nvmlGpmQueryDeviceSupport"] == {"value": 0} and "nvmlGpmMetricsGet" not in other
    assert f"{H100['uuid']} nvmlDeviceGetTotalEnergyConsumption: " in stdout
    assert len(report["sample_seconds"]) == 2
    second = {d["uuid"]: d for d in report["samples"][1]}
    assert second[H100["uuid"]]["health"]["gpm"]["sm_active"] == 0.5  # the backend's second cycle


def test_device_check_reads_gpm_per_gpu_instance_on_a_hopper_mig_card(lib: Path, tmp_path: Path) -> None:
    """examples/mig-h100-node.yaml: the check samples each GPU instance straight (nvmlGpmMigSampleGet) as the
    backend does, and every check holds."""
    scenario = yaml.safe_load((ROOT / "examples" / "mig-h100-node.yaml").read_text())
    report, _ = device_check(lib, tmp_path, scenario)
    assert all(c["ok"] for c in report["checks"].values()), report["checks"]
    card = report["health_direct"][scenario["devices"][0]["uuid"]]
    assert card["gpm sm_active (percent) (GPU instance 2)"]["value"] == pytest.approx(81.0)
    assert card["gpm sm_active (percent) (GPU instance 9)"] == {"value": 0.0}
    assert "nvmlGpmSampleGet" not in card  # a MIG card's own GPM is not what the backend reads
    whole = report["health_direct"][scenario["devices"][1]["uuid"]]
    assert whole["gpm sm_active (percent)"]["value"] == pytest.approx(58.0)  # ratio x 100 in a double
