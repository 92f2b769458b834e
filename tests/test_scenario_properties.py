"""Property tests: any scenario document or configuration either loads or fails with a clear error.

The scenario file and the environment are user input to a long-running daemon, so the only
acceptable outcomes are a validated value or the module's own error type (which the CLI turns
into a one-line message and exit status 2); a scenario that loads must also render.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.node.simulate import Scenario, ScenarioError, parse_scenario
from exporter.shell.config import OPTIONS, Config, ConfigError, load_config, parse_listen
from tests.simulated import one_cycle

ROOT = Path(__file__).resolve().parent.parent
BASE = yaml.safe_load((ROOT / "examples" / "mixed-4gpu-node.yaml").read_text())

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40))
documents = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=20)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a YAML document (dict keys and list indexes)."""
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_paths(v, (*prefix, i)))
    return out


BASE_PATHS = [p for p in _paths(BASE) if p]


def _replace(doc: Any, path: tuple, value: Any) -> Any:
    doc = copy.deepcopy(doc)
    node = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return doc


def _outcome(doc: object) -> Scenario | None:
    try:
        return parse_scenario(doc)
    except ScenarioError as e:
        assert str(e), "a scenario error must say what is wrong"
        assert len(str(e).splitlines()) == 1, f"not one line: {str(e)!r}"
        return None


@given(documents)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_arbitrary_documents_load_or_raise_scenario_error(doc: object) -> None:
    _outcome(doc)


@given(st.sampled_from(BASE_PATHS), documents)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_one_garbage_value_in_a_real_scenario_is_caught_or_harmless(path: tuple, garbage: object) -> None:
    _outcome(_replace(BASE, path, garbage))


@given(st.sampled_from(BASE_PATHS), documents)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_scenario_that_loads_renders_valid_exposition(tmp_path_factory, path: tuple, garbage: object) -> None:
    doc = _replace(BASE, path, garbage)
    if _outcome(doc) is None:
        return
    target = tmp_path_factory.mktemp("scenario") / "s.yaml"
    target.write_text(yaml.safe_dump(doc))
    text = one_cycle(target)
    families = {f.name for f in text_string_to_metric_families(text)}
    assert "nvidia_gpu_num_devices" in families


env_values = st.one_of(st.text(max_size=30), st.builds("{}:{}".format, st.text(max_size=8), st.text(max_size=6)),
                       st.sampled_from(
    ["", "0", "-1", "nan", "inf", "1e308", "true", "yes", "off", "[::1]:9400", ":9400", "a:b:c", "x:\u00b2", "__x"]))


@given(st.dictionaries(st.sampled_from([o.env for o in OPTIONS]), env_values, max_size=6))
@settings(max_examples=400)
def test_any_environment_gives_a_config_or_a_config_error(env: dict[str, str]) -> None:
    try:
        cfg = load_config([], env)
    except ConfigError as e:
        assert any(o.env in str(e) or o.flag in str(e) for o in OPTIONS), f"error names no setting: {e}"
        return
    assert isinstance(cfg, Config)
    assert 0.05 <= cfg.interval < float("inf")
    _host, port = cfg.host_port
    assert 0 <= port <= 65535


@given(st.one_of(st.text(max_size=20), st.builds("{}:{}".format, st.text(max_size=8), st.text(max_size=6))))
@example("x:\u00b2")  # a Unicode digit: str.isdigit() accepts it, int() does not
@example("[::1]:9400")
def test_listen_address_parses_or_raises_config_error(text: str) -> None:
    try:
        _host, port = parse_listen(text)
    except ConfigError as e:
        assert "--listen" in str(e)
        return
    assert 0 < port < 65536
    assert int(text.rpartition(":")[2]) == port
