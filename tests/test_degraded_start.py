"""Real mode without its sources: one-line startup errors, and honest rows while NVML is down."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.shell.cli import main


@pytest.mark.e2e
@pytest.mark.parametrize("content", [
    None,  # missing file
    "garbage: [\n",  # not YAML
    "just a string\n",  # YAML of the wrong shape
    "apiVersion: v1\nkind: Config\nclusters: 7\ncontexts: [{name: x}]\ncurrent-context: x\n",
    "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\ncurrent-context: nowhere\n",
    b"apiVersion: v1\nkind: Config\n# caf\xe9\n",  # not UTF-8
    "directory",  # unreadable
])
def test_unusable_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes | None) -> None:
    path = tmp_path / "kubeconfig"
    if content == "directory":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    rc = main(["--kubeconfig", str(path), "--listen", "127.0.0.1:19999", "--node-name", "n1", "--no-xid"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("kube-gpu-exporter: error: --kubeconfig ") and err.count("\n") == 1, err
    assert "--no-pod-watch" in err


@pytest.mark.e2e
def test_a_kubeconfig_without_the_kubeconfig_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The image has no kubernetes package (the kubeconfig extra): --kubeconfig says how to get it, in one line."""
    import sys

    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes -> ImportError, as in the image
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\ncurrent-context: x\n")
    rc = main(["--kubeconfig", str(path), "--listen", "127.0.0.1:19999", "--node-name", "n1", "--no-xid"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("kube-gpu-exporter: error: --kubeconfig ") and "kube-gpu-exporter[kubeconfig]" in err, err


@pytest.mark.e2e
def test_no_cluster_and_no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    rc = main(["--listen", "127.0.0.1:19999", "--node-name", "n1", "--no-xid"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "no Kubernetes API configuration" in err and "--kube-api-url or --kubeconfig" in err
    assert err.count("\n") == 1, err


def test_while_nvml_is_down_capacity_is_absent_not_zero() -> None:
    from exporter.attribution.attribute import NodeAttribution
    from exporter.exposition.rows import ExporterStats, LabelNames, build_families
    from exporter.model import EMPTY, NodeSample

    def names_of(sample: NodeSample) -> dict[str, int]:
        attr = NodeAttribution(devices=(), allocations=(), pods=(), skips=EMPTY)
        fams = build_families(attr, sample, "n1", LabelNames(), ExporterStats())
        return {f.name: len(f.samples) for f in fams}

    down = names_of(NodeSample(timestamp=1.0, nvml_up=False))
    up = names_of(NodeSample(timestamp=1.0, nvml_up=True))
    for family in ("nvidia_gpu_num_devices", "nvidia_gpu_node_healthy_devices",
                   "nvidia_gpu_node_memory_total_bytes", "nvidia_gpu_node_healthy_memory_bytes"):
        assert up.get(family) == 1, family  # a node that really has no GPU says 0
        assert not down.get(family), family
    assert down["kube_gpu_exporter_nvml_up"] == 1
