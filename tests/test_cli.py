"""Startup mistakes in real mode end with one clear line and exit status 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.cli import main


@pytest.mark.parametrize("content", [
    None,  # missing file
    "garbage: [\n",  # not YAML
    "just a string\n",  # YAML of the wrong shape
    "apiVersion: v1\nkind: Config\nclusters: 7\ncontexts: [{name: x}]\ncurrent-context: x\n",
    "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\ncurrent-context: nowhere\n",
])
def test_unusable_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    rc = main(["--kubeconfig", str(path), "--listen", "127.0.0.1:19999", "--node-name", "n1", "--no-xid"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("kube-gpu-exporter: error: --kubeconfig ") and err.count("\n") == 1, err
    assert "--no-pod-watch" in err


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
