"""Every decoder of bytes from outside, fed arbitrary bytes: a value or its own one-line error, never another.

The exporter reads bytes it does not control: the kubelet's pod-resources answer, the kernel log (its
records and the Xid lines in them), /proc's cgroup and stat files, a scenario file, the web config file,
HTTP request heads and Authorization headers, and the API's pods and DRA objects as any JSON. Each
decoder here either returns or raises the error type its caller handles (a counted skip, a one-line
refusal); anything else would reach the cycle's SourceGuard or the server as a bug.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.attribution.cgroup import parse_cgroup
from exporter.attribution.dra_objects import parse_claims, parse_pod_claims, parse_slices
from exporter.node.podresources import PodResourcesDecodeError, decode_list_response
from exporter.node.pods import MalformedPod, parse_pod
from exporter.node.procfs import parse_stat_starttime
from exporter.node.simulate import ScenarioError, load_scenario
from exporter.server.auth import BasicAuth
from exporter.server.limits import ServerLimits
from exporter.server.web_config import WebConfigError, load_web_config
from exporter.server.wire import BadRequest, parse_head
from exporter.xid.kmsg import parse_record, split_records
from exporter.xid.parse import ScanState, scan_line

# Bytes shaped like each input often enough to get past the first check, and any bytes at all.
_any = st.binary(max_size=600)
_texty = st.lists(st.sampled_from([b"0::/kubepods/pod", b"NVRM: Xid (PCI:0000:07:00): 79, ", b"\n", b":", b"-",
                                   b"basic_auth_users:\n  a: ", b"tls_server_config:", b"$2b$12$", b"6,1,2,-;",
                                   b"GET / HTTP/1.1\r\nHost: x\r\n", b"\x00", b"\xff", b"{", b"[", b"  "]),
                  max_size=12).map(b"".join)
BYTES = st.one_of(_any, _texty)
text = BYTES.map(lambda b: b.decode("utf-8", "replace"))


def _returns_or_raises(decode: Callable[[], Any], *allowed: type[BaseException]) -> None:
    try:
        decode()
    except allowed as e:
        assert "\n" not in str(e), str(e)  # refused in one line
    # anything else propagates: the property fails


@given(BYTES)
def test_pod_resources_answer(data: bytes) -> None:
    _returns_or_raises(lambda: decode_list_response(data), PodResourcesDecodeError)


@given(BYTES, st.booleans())
def test_kernel_log_records_and_their_xid_lines(data: bytes, final: bool) -> None:
    records, rest = split_records(data, final=final)
    state = ScanState()
    for raw in records:
        record = parse_record(raw)
        if record is not None:
            state, _ = scan_line(state, record.text)
    state, _ = scan_line(state, data.decode("utf-8", "replace"))
    assert b"".join(records) + rest == data


@given(text)
def test_proc_cgroup_and_stat_files(content: str) -> None:
    parse_cgroup(content)
    parse_stat_starttime(content)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                         st.sampled_from(["metadata", "spec", "status", "uid", "name", "namespace", "containers",
                                          "devices", "allocation", "reservedFor", "resourceClaims", "driver",
                                          "pool", "nodeName", "x"]), inner, max_size=5), max_leaves=25)


@given(st.one_of(BYTES, _json.map(lambda v: json.dumps(v).encode())))
def test_api_objects_from_any_json(data: bytes) -> None:
    """The API client hands on whatever JSON a watch line held: pods and DRA objects are parsed or skipped."""
    try:
        obj = json.loads(data)
    except ValueError:
        return  # not JSON: the client's own error, counted as a sync error
    _returns_or_raises(lambda: parse_pod(obj), MalformedPod)
    skipped: list[str] = []
    objs = obj if isinstance(obj, list) else [obj]
    parse_slices(objs, "node-1", skipped.append)
    parse_claims(objs, skipped.append)
    parse_pod_claims(obj, skipped.append)
    assert all(isinstance(reason, str) for reason in skipped)


@given(BYTES)
def test_http_request_head(data: bytes) -> None:
    _returns_or_raises(lambda: parse_head(data, ServerLimits(), "1.2.3.4:5"), BadRequest)


_AUTH = BasicAuth({})


@given(text)
def test_authorization_header(header: str) -> None:
    creds = _AUTH._decode(header)  # decodes or refuses, never raises
    assert creds is None or (isinstance(creds[0], str) and isinstance(creds[1], bytes))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("decoders") / "input"


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=BYTES)
def test_scenario_file(scratch: Path, data: bytes) -> None:
    scratch.write_bytes(data)
    _returns_or_raises(lambda: load_scenario(scratch), ScenarioError)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=BYTES)
def test_web_config_file(scratch: Path, data: bytes) -> None:
    scratch.write_bytes(data)
    _returns_or_raises(lambda: load_web_config(str(scratch)), WebConfigError)
