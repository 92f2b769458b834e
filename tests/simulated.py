"""One sampling cycle of the simulated node in-process: what /metrics would serve, without a server.

Shared by the modules that check what a scenario (a file, or a dict written to a temporary file) renders.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config

Samples = dict[str, list[tuple[dict[str, str], float]]]


def one_cycle(scenario: Path, *flags: str) -> str:
    """The exposition text of one cycle of ``--simulate scenario`` (no environment variables read)."""
    daemon = build_daemon(load_config(["--simulate", str(scenario), *flags], environ={}))
    try:
        snapshot, _ = daemon.pipeline.step()
    finally:
        daemon.close()
    return snapshot.body.decode()


def write_scenario(doc: dict[str, Any], tmp_path: Path, name: str = "scenario.yaml") -> Path:
    """``doc`` as a scenario file under ``tmp_path``."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def samples(text: str) -> Samples:
    """Exposition text as {sample name: [(labels, value), ...]}."""
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def values(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Exposition text as {(sample name, frozenset of labels): value}."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def render_doc(doc: dict[str, Any], tmp_path: Path, *flags: str) -> Samples:
    """The samples of one cycle of the scenario ``doc``."""
    return samples(one_cycle(write_scenario(doc, tmp_path), *flags))
