"""The prepared real-hardware check runs its NVML part against the fake library (no GPU here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from tests.fake_nvml import build_fake_nvml, subprocess_env, write_config

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "examples" / "mig-a100-node.yaml"


def test_device_check_reads_every_device_through_the_real_backend(tmp_path: Path) -> None:
    scenario = yaml.safe_load(SCENARIO.read_text())
    lib = build_fake_nvml(tmp_path / "lib")
    env = subprocess_env(lib.parent, write_config(scenario, tmp_path / "fake.conf"))
    env["OUT"] = str(tmp_path / "out")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "device-check.py"), "--no-load"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((tmp_path / "out" / "device-check.json").read_text())
    seen = {d["uuid"] for d in report["samples"][0]}
    want = {m["uuid"] for d in scenario["devices"] for m in d.get("mig_devices", [])}
    want |= {d["uuid"] for d in scenario["devices"] if "mig_devices" not in d}
    assert seen == want
    assert all(c["ok"] for c in report["checks"].values())
    assert report["driver_version"]
