"""One label-name check (exporter/exposition/label_names.py) for the exporter and the three generators.

Each command line refuses the same names the same way: a value that is no Prometheus label name
(``pod\\n`` among them, which a ``$`` anchor let through into a generated header), a reserved or
the exporter's own name, a name two flags share; exit 2, exactly one line on stderr.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from exporter.bundle.rules import RuleOptions
from exporter.exposition.label_names import FIXED_LABELS, LabelNameError, check_label_names, label_name_error
from exporter.shell import cli

# command -> (argv before the label flags, the prefix of its error line)
COMMANDS = {
    "exporter": ([], "kube-gpu-exporter: error: "),
    "rules": (["rules"], "kube-gpu-exporter rules: error: "),
    "alerts": (["alerts"], "kube-gpu-exporter alerts: error: "),
    "dashboards": (["dashboards"], "kube-gpu-exporter dashboards: error: "),
}
BAD = {
    "newline": (["--pod-label", "pod\n"], ["--pod-label", "'pod\\n'", "label name"]),
    "reserved": (["--pod-label", "__name__"], ["--pod-label", "reserved"]),
    "the exporter's own": (["--container-label", "uuid"], ["--container-label", "'uuid'", "collides"]),
    "colliding": (["--pod-label", "x", "--namespace-label", "x"], ["--pod-label", "--namespace-label", "must differ"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_the_same_names_in_one_line(command: str, case: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    prefix, start = COMMANDS[command]
    argv, words = BAD[case]
    out = ["-o", str(tmp_path)] if command == "dashboards" else ["-o", str(tmp_path / "out")]
    rc = cli.main([*prefix, *argv, *(out if command != "exporter" else [])])
    captured = capsys.readouterr()
    assert rc == 2, captured.err
    assert captured.err.startswith(start) and captured.err.count("\n") == 1, captured.err
    assert len(captured.err.splitlines()) == 1, captured.err
    for word in words:
        assert word in captured.err, (word, captured.err)
    assert not list(tmp_path.iterdir()), "a refused command wrote output"


def test_the_generators_accept_what_the_exporter_accepts() -> None:
    """--node-label stands for node_name, which only it may keep; the other flags may not take it."""
    RuleOptions(node_label="node_name").validate()
    RuleOptions(pod_label="pod", namespace_label="namespace", container_label="container").validate()
    with pytest.raises(ValueError, match="--pod-label 'node_name' collides"):
        RuleOptions(pod_label="node_name", node_label="node").validate()
    with pytest.raises(ValueError, match="--cluster-label 'node_name' collides"):
        RuleOptions(cluster_label="node_name").validate()


@given(name=st.text(max_size=20) | st.sampled_from(sorted(FIXED_LABELS)), other=st.text(max_size=8))
@example(name="pod\n", other="x")
@example(name="a\u2028b", other="x")
@example(name="x", other="x")
@settings(max_examples=300, deadline=None)
def test_the_error_is_one_line_for_any_input(name: str, other: str) -> None:
    try:
        check_label_names([("--pod-label", name), ("--namespace-label", other)])
    except LabelNameError as e:
        assert len(str(e).splitlines()) == 1 and "\n" not in str(e), str(e)
        assert "--pod-label" in str(e) or "--namespace-label" in str(e), str(e)
        return
    assert label_name_error("--pod-label", name) is None and name not in FIXED_LABELS and name != other
