"""The command line: --version, real subcommands with their own --help, dashboards' -o, run-simulated.sh."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exporter import __version__
from exporter.shell import cli

ROOT = Path(__file__).resolve().parent.parent
SUBCOMMANDS = ("rules", "alerts", "dashboards", "render", "top")


def exporter_cli(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exporter", *argv], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"kube-gpu-exporter {__version__}\n"


def test_subcommands_are_in_the_main_usage_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    usage = out.split("\n\n")[0]
    assert "{rules,alerts,dashboards,render,top} ..." in usage, usage
    assert "--version" in usage
    for name in SUBCOMMANDS:
        assert f"\n    {name}" in out, name  # each listed with its one-line help


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_its_own_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([name, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: kube-gpu-exporter {name} "), out[:200]
    assert "{rules,alerts,dashboards,render,top}" not in out  # not the main help


def test_render_help_describes_render(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["render", "--help"])
    out = capsys.readouterr().out
    assert "one sampling cycle" in out and "--simulate" in out


def test_a_subcommand_after_flags_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--no-xid", "rules"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kube-gpu-exporter: error: the subcommand 'rules' must come first") and err.count("\n") == 1


@pytest.mark.e2e
def test_dashboards_without_output_prints_usage_and_writes_nothing(tmp_path: Path) -> None:
    proc = exporter_cli("dashboards", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("usage: kube-gpu-exporter dashboards"), proc.stderr
    assert "kube-gpu-exporter dashboards: error: -o DIR is required" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_dashboards_says_what_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["dashboards", "-o", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    written = sorted(tmp_path.glob("*.json"))
    assert len(written) == 3
    assert err.splitlines() == [f"wrote {p}" for p in written]
    out = tmp_path / "cm.yaml"
    assert cli.main(["dashboards", "--format", "configmap", "-o", str(out)]) == 0
    assert capsys.readouterr().err == f"wrote {out}\n"
    assert cli.main(["dashboards", "--only", "node", "-o", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.startswith("{")


# ------------------------------------------------------------------ scripts/run-simulated.sh

FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for .venv/bin/python: records each pip install, installs a fake entry point
echo "$*" >> "$(dirname "$0")/../pip.log"
printf '#!/usr/bin/env bash\\necho served "$@"\\n' > "$(dirname "$0")/kube-gpu-exporter"
chmod +x "$(dirname "$0")/kube-gpu-exporter"
"""


@pytest.mark.e2e
def test_run_simulated_reinstalls_only_when_the_project_changed(tmp_path: Path) -> None:
    (tmp_path / "scripts" / "lib").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "run-simulated.sh", tmp_path / "scripts")
    shutil.copy(ROOT / "scripts" / "lib" / "ensure-venv.sh", tmp_path / "scripts" / "lib")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "exporter").mkdir()
    (tmp_path / "exporter" / "a.py").write_text("A = 1\n")
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text(FAKE_PYTHON)
    (venv_bin / "python").chmod(0o755)
    log = tmp_path / ".venv" / "pip.log"

    def run() -> str:
        proc = subprocess.run(["bash", str(tmp_path / "scripts" / "run-simulated.sh"), "s.yaml"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("served --simulate s.yaml"), proc.stdout
        return log.read_text() if log.exists() else ""

    assert run().count("pip install") == 1
    assert run().count("pip install") == 1  # nothing changed: no reinstall
    (tmp_path / "exporter" / "__pycache__").mkdir()
    (tmp_path / "exporter" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"x")
    assert run().count("pip install") == 1  # byte code is no change
    (tmp_path / "exporter" / "a.py").write_text("A = 2\n")
    assert run().count("pip install") == 2
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'y'\n")
    assert run().count("pip install") == 3
    assert run().count("pip install") == 3
