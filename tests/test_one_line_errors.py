"""Every refused input is told in one line, whatever keys, values or paths it echoes (issue 24).

A scenario, a flag, a web config file or a pod-label allowlist may hold a newline, a line
separator or a terminal escape: the message (one stderr line, one log record) escapes them.
"""

from __future__ import annotations

import errno
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.exposition.pod_labels import AllowlistError, parse_allowlist
from exporter.model import OneLineError, one_line
from exporter.node.scenario_parse import ScenarioError, reject_unknown
from exporter.node.simulate import load_scenario, parse_scenario
from exporter.server.web_config import WebConfigError, load_web_config
from exporter.shell.config import ConfigError, bind_error, load_config
from tests.test_scenario_properties import documents

BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
# Text that is likely to hold what splits a line or drives a terminal, among any other characters.
nasty = st.text(st.one_of(st.sampled_from([*BREAKS, "\x1b", "\t", "\x00", "\x7f"]),
                          st.characters(exclude_categories=["Cs"])), max_size=24)
GPU = {"uuid": "GPU-1", "name": "NVIDIA H100 80GB HBM3"}


def assert_one_line(err: BaseException) -> None:
    text = str(err)
    assert text and len(text.splitlines()) == 1 and not any(c in text for c in BREAKS), repr(text)


@given(nasty)
def test_one_line_escapes_every_line_break_and_control(text: str) -> None:
    out = one_line(text)
    assert len(out.splitlines()) <= 1 and not any(c in out for c in BREAKS)
    assert not any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in out)
    assert one_line(out) == out  # idempotent: a message wrapped in another is not escaped twice


@given(st.text(st.characters(categories=["L", "N", "P", "S", "Zs"])))
def test_printable_text_passes_unchanged(text: str) -> None:
    assert one_line(text) == text


def test_the_escapes_read_as_python_writes_them() -> None:
    assert one_line("a\nb\x1b[31m\u2028") == "a\\nb\\x1b[31m\\u2028"
    assert str(OneLineError("key\nvalue")) == "key\\nvalue"


# --- scenarios (exporter/node/scenario_parse.py, simulate.py, scenario_health.py)

@given(st.lists(nasty, min_size=1, max_size=3))
def test_unknown_scenario_keys_are_one_line(keys: list[str]) -> None:
    with pytest.raises(ScenarioError) as e:
        reject_unknown(dict.fromkeys(keys, 1), {"known"} - set(keys), "devices[0]")
    assert_one_line(e.value)


@given(nasty, documents, st.sampled_from(["top", "device", "node_labels", "nvlink", "gpm", "process"]))
@settings(max_examples=300)
def test_any_key_or_value_anywhere_in_a_scenario_is_one_line(key: str, value: Any, where: str) -> None:
    device: dict[str, Any] = dict(GPU)
    doc: dict[str, Any] = {"node": "n", "devices": [device]}
    target = {"top": doc, "device": device, "node_labels": doc.setdefault("node_labels", {})}.get(where)
    if target is None:  # the nested mappings of a device
        target = {"nvlink": {"link": 0, "active": 1}, "gpm": {}, "process": {"pid": 1}}[where]
        device[{"nvlink": "nvlinks", "gpm": "gpm", "process": "processes"}[where]] = (
            target if where == "gpm" else [target])
    target[key] = value
    try:
        parse_scenario(doc)
    except ScenarioError as e:
        assert_one_line(e)


@given(nasty)
@settings(max_examples=60)
def test_scenario_files_of_any_text_or_path_are_one_line(tmp_path_factory: pytest.TempPathFactory,
                                                        text: str) -> None:
    path = tmp_path_factory.mktemp("scenario") / "s.yaml"
    path.write_text(text, encoding="utf-8")
    for target in (path, f"/nonexistent/{text}.yaml"):
        try:
            load_scenario(target)
        except ScenarioError as e:
            assert_one_line(e)


# --- flags and environment (exporter/shell/config.py)

@given(st.sampled_from(["--listen", "--log-level", "--log-format", "--pod-label", "--pod-labels-allowlist",
                        "--interval", "--kubelet-timeout", "--web-config-file", "--bogus", "--no-such-flag"]), nasty)
@settings(max_examples=300)
def test_any_flag_value_is_refused_in_one_line(flag: str, value: str) -> None:
    for argv, environ in (([flag, value], {}), ([f"{flag}={value}"], {}), ([value], {}),
                          ([], {"KUBE_GPU_EXPORTER_" + flag[2:].upper().replace("-", "_"): value})):
        try:
            load_config(argv, environ)
        except ConfigError as e:
            assert_one_line(e)


@given(nasty, nasty)
def test_a_failed_bind_is_one_line(listen: str, address: str) -> None:
    for code in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES, errno.EPERM):
        assert_one_line(ConfigError(bind_error(listen, address, 9400, OSError(code, "refused\nby the kernel"))))


# --- the web config file (exporter/server/web_config.py)

@given(nasty, documents, st.sampled_from(["top", "tls_server_config", "basic_auth_users"]))
@settings(max_examples=200)
def test_any_web_config_is_refused_in_one_line(tmp_path_factory: pytest.TempPathFactory, key: str, value: Any,
                                                where: str) -> None:
    doc: dict[str, Any] = {key: value} if where == "top" else {where: {key: value}}
    path = tmp_path_factory.mktemp("web") / "web.yml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=False))
    try:
        load_web_config(str(path), "--web-config-file")
    except WebConfigError as e:
        assert_one_line(e)


@given(nasty)
@settings(max_examples=60)
def test_web_config_files_of_any_text_or_path_are_one_line(tmp_path_factory: pytest.TempPathFactory,
                                                          text: str) -> None:
    path = tmp_path_factory.mktemp("web") / "web.yml"
    path.write_text(text, encoding="utf-8")
    for target in (str(path), f"/nonexistent/{text}.yml"):
        try:
            load_web_config(target)
        except WebConfigError as e:
            assert_one_line(e)


def test_a_yaml_error_in_a_web_config_is_its_words_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config:\n  cert_file: [unclosed\n")
    with pytest.raises(WebConfigError) as e:
        load_web_config(str(path))
    assert_one_line(e.value)
    assert "\\n" not in str(e.value) and "line 3" in str(e.value)


# --- the pod-label allowlist (exporter/exposition/pod_labels.py)

@given(st.lists(nasty, min_size=1, max_size=4).map(",".join))
@settings(max_examples=300)
def test_any_allowlist_is_refused_in_one_line(text: str) -> None:
    try:
        parse_allowlist(text)
    except AllowlistError as e:
        assert_one_line(e)
