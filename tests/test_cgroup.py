"""Tests for exporter.attribution.cgroup: every kubelet layout in the reference, and garbage never raises."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.attribution.cgroup import CgroupParse, parse_cgroup, parse_cgroup_path
from exporter.model import CgroupRef

UID = "3f0c1c9e-5b7a-4c1e-9a57-2f1e0e9b1f00"
UID_ = UID.replace("-", "_")
CID = "a1b2c3d4" * 8
CID2 = "0123456789abcdef" * 4
STATIC_UID = "6c4d7f1f2a3a0c2f5c9c2f6d5b3e8a1c"

SYSTEMD_BURSTABLE = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
SYSTEMD_BESTEFFORT = f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
SYSTEMD_GUARANTEED = f"/kubepods.slice/kubepods-pod{UID_}.slice"


def ref_of(text: str) -> CgroupRef | None:
    return parse_cgroup(text).ref


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # cgroupfs driver, v1, each QoS class; Guaranteed has no QoS level
        (f"11:memory:/kubepods/burstable/pod{UID}/{CID}", CgroupRef(UID, CID, None)),
        (f"11:memory:/kubepods/besteffort/pod{UID}/{CID}", CgroupRef(UID, CID, None)),
        (f"11:memory:/kubepods/pod{UID}/{CID}", CgroupRef(UID, CID, None)),
        # systemd driver, each runtime
        (f"11:memory:{SYSTEMD_BESTEFFORT}/cri-containerd-{CID}.scope", CgroupRef(UID, CID, "containerd")),
        (f"0::{SYSTEMD_BURSTABLE}/cri-containerd-{CID}.scope", CgroupRef(UID, CID, "containerd")),
        (f"0::{SYSTEMD_GUARANTEED}/crio-{CID}.scope", CgroupRef(UID, CID, "cri-o")),
        (f"0::{SYSTEMD_GUARANTEED}/docker-{CID}.scope", CgroupRef(UID, CID, "docker")),
        (f"0::{SYSTEMD_BURSTABLE}/{CID}", CgroupRef(UID, CID, None)),
        # CRI-O on the cgroupfs driver: "crio-<id>" directory without .scope
        (f"0::/kubepods/burstable/pod{UID}/crio-{CID}", CgroupRef(UID, CID, "cri-o")),
        # reader inside a private cgroup namespace: relative path, no /kubepods anchor
        (f"0::/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
         CgroupRef(UID, CID, "containerd")),
        (f"0::/../pod{UID}/{CID}", CgroupRef(UID, CID, None)),
        # nested below the container scope
        (f"0::{SYSTEMD_BURSTABLE}/cri-containerd-{CID}.scope/init.scope", CgroupRef(UID, CID, "containerd")),
        (f"0::{SYSTEMD_BURSTABLE}/cri-containerd-{CID}.scope/worker/gpu", CgroupRef(UID, CID, "containerd")),
        (f"0::/kubepods/burstable/pod{UID}/{CID}/docker/{CID2}", CgroupRef(UID, CID, None)),
        # kind / k3s-style prefixes
        (f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
         f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
         CgroupRef(UID, CID, "containerd")),
        (f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
         CgroupRef(UID, CID, "containerd")),
        (f"4:memory:/docker/{CID2}/kubepods/besteffort/pod{UID}/{CID}", CgroupRef(UID, CID, None)),
        (f"0::/docker/{CID2}/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
         CgroupRef(UID, CID, "containerd")),
        # pod-level cgroups
        (f"0::{SYSTEMD_BURSTABLE}", CgroupRef(UID, None, None)),
        (f"11:memory:/kubepods/burstable/pod{UID}", CgroupRef(UID, None, None)),
        (f"11:memory:/kubepods/burstable/pod{UID}/", CgroupRef(UID, None, None)),
        (f"0::{SYSTEMD_BURSTABLE}/something-else", CgroupRef(UID, None, None)),
        # conmon: charged to the pod, never to the container it monitors
        (f"0::{SYSTEMD_GUARANTEED}/crio-conmon-{CID}.scope", CgroupRef(UID, None, "cri-o")),
        (f"0::/kubepods/pod{UID}/crio-conmon-{CID}", CgroupRef(UID, None, "cri-o")),
        # static pod: 32-hex UID without dashes
        (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/"
         f"cri-containerd-{CID}.scope", CgroupRef(STATIC_UID, CID, "containerd")),
        (f"0::/kubepods/pod{STATIC_UID}/{CID}", CgroupRef(STATIC_UID, CID, None)),
        # a removed cgroup keeps its path with a suffix on v2
        (f"0::{SYSTEMD_BURSTABLE}/cri-containerd-{CID}.scope (deleted)", CgroupRef(UID, CID, "containerd")),
        # colon form: kubelet on the systemd driver, runc on cgroupfs (containerd without SystemdCgroup)
        (f"11:memory:/system.slice/containerd.service/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}",
         CgroupRef(UID, CID, "containerd")),
        (f"0::/system.slice/containerd.service/kubepods-burstable-pod{UID_}.slice:cri-containerd:{CID}",
         CgroupRef(UID, CID, "containerd")),
        (f"4:pids:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice:cri-containerd:{CID}",
         CgroupRef(UID, CID, "containerd")),
        (f"0::/kubepods-pod{UID_}.slice:crio:{CID}", CgroupRef(UID, CID, "cri-o")),
        (f"0::/system.slice/docker.service/kubepods-pod{UID_}.slice:docker:{CID}", CgroupRef(UID, CID, "docker")),
        (f"0::{SYSTEMD_BURSTABLE}/kubepods-burstable-pod{UID_}.slice:cri-containerd:{CID}",
         CgroupRef(UID, CID, "containerd")),
        (f"0::/system.slice/containerd.service/kubepods-besteffort-pod{UID_}.slice:cri-containerd:{CID}/init.scope",
         CgroupRef(UID, CID, "containerd")),
        # colon form with an unknown runtime prefix or a malformed id: the pod alone
        (f"0::/system.slice/containerd.service/kubepods-pod{UID_}.slice:podman:{CID}", CgroupRef(UID, None, None)),
        (f"0::/system.slice/containerd.service/kubepods-pod{UID_}.slice:cri-containerd:abc",
         CgroupRef(UID, None, None)),
        # Kubernetes < 1.6 (--experimental-cgroups-per-qos): "BestEffort-pod<uid>.slice", no kubepods prefix
        (f"11:memory:/system.slice/docker.service/BestEffort.slice/BestEffort-pod{UID_}.slice/{CID}",
         CgroupRef(UID, CID, None)),
        (f"11:memory:/Burstable.slice/Burstable-pod{UID_}.slice/{CID}", CgroupRef(UID, CID, None)),
        # upper case is normalised
        (f"0::/kubepods/pod{UID.upper()}/{CID.upper()}", CgroupRef(UID, CID, None)),
    ],
)
def test_layouts(line: str, expected: CgroupRef) -> None:
    assert parse_cgroup(line + "\n") == CgroupParse(expected, 0)


@pytest.mark.parametrize(
    "line",
    [
        "0::/",
        "0::/init.scope",
        "0::/system.slice/containerd.service",
        "0::/user.slice/user-1000.slice/session-3.scope",
        f"0::/docker/{CID}",
        f"0::/system.slice/docker-{CID}.scope",
        # not a pod: wrong UID shapes, no kubepods in the slice name
        f"0::/kubepods/pod{UID[:-1]}/{CID}",
        f"0::/kubepods/pod{UID_}/{CID}",  # underscores only in systemd slice names
        f"0::/foo.slice/foo-pod{UID_}.slice/cri-containerd-{CID}.scope",
        f"0::/kubepods.slice/kubepods-pod{UID}.slice/{CID}",  # dashes would be slice nesting
        f"0::/kubepods/xpod{UID}/{CID}",
    ],
)
def test_not_in_a_pod(line: str) -> None:
    assert parse_cgroup(line) == CgroupParse(None, 0)


def test_container_id_must_be_64_hex() -> None:
    assert ref_of(f"0::{SYSTEMD_BURSTABLE}/cri-containerd-{CID[:-1]}.scope") == CgroupRef(UID, None)
    assert ref_of(f"0::/kubepods/pod{UID}/{CID}0") == CgroupRef(UID, None)
    assert ref_of(f"0::/kubepods/pod{UID}/{'g' * 64}") == CgroupRef(UID, None)


def test_outermost_pod_wins_when_kubernetes_is_nested_in_a_pod() -> None:
    other = "11111111-2222-3333-4444-555555555555"
    text = f"0::/kubepods/burstable/pod{UID}/{CID}/kubepods/besteffort/pod{other}/{CID2}\n"
    assert ref_of(text) == CgroupRef(UID, CID, None)


V1_HOST = """12:hugetlb:/
11:devices:/user.slice
10:pids:/user.slice/user-1000.slice
9:memory:/user.slice
1:name=systemd:/user.slice/user-1000.slice/session-1.scope
0::/user.slice/user-1000.slice/session-1.scope
"""


def test_host_process_on_hybrid_is_none() -> None:
    assert parse_cgroup(V1_HOST) == CgroupParse(None, 0)


def test_full_v1_file_cgroupfs() -> None:
    base = f"/kubepods/burstable/pod{UID}/{CID}"
    text = "\n".join(
        f"{i}:{c}:{base}"
        for i, c in enumerate(
            ["cpuset", "perf_event", "net_cls,net_prio", "hugetlb", "blkio", "memory", "freezer",
             "cpu,cpuacct", "pids", "devices", "rdma"],
            start=2,
        )
    )
    text += f"\n1:name=systemd:{base}\n"
    assert parse_cgroup(text) == CgroupParse(CgroupRef(UID, CID, None), 0)


def test_hybrid_v2_line_not_in_pod_falls_back_to_v1() -> None:
    # systemd hybrid with the cgroupfs driver: the unified line shows the runtime's service
    text = (
        f"5:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n"
        "0::/system.slice/containerd.service\n"
    )
    assert ref_of(text) == CgroupRef(UID, CID, None)


def test_v2_line_preferred_over_v1() -> None:
    other = "99999999-8888-7777-6666-555555555555"
    text = (
        f"5:memory:/kubepods/besteffort/pod{other}/{CID2}\n"
        f"0::{SYSTEMD_BURSTABLE}/cri-containerd-{CID}.scope\n"
    )
    assert ref_of(text) == CgroupRef(UID, CID, "containerd")


def test_v1_conflict_resolved_by_controller_rank_not_line_order() -> None:
    other = "99999999-8888-7777-6666-555555555555"
    lines = [
        f"1:name=systemd:/kubepods/besteffort/pod{other}/{CID2}",
        f"3:pids:/kubepods/besteffort/pod{other}/{CID2}",
        f"4:cpu,cpuacct:/kubepods/besteffort/pod{other}/{CID2}",
        f"7:memory:/kubepods/burstable/pod{UID}/{CID}",
        "8:devices:/",
    ]
    assert ref_of("\n".join(lines)) == CgroupRef(UID, CID, None)
    assert ref_of("\n".join(reversed(lines))) == CgroupRef(UID, CID, None)
    # without memory, cpu ranks next
    assert ref_of("\n".join(lines[:3])) == CgroupRef(other, CID2, None)
    # memory present but outside any pod: the next ranked hierarchy that yields a pod is used
    text = f"7:memory:/\n1:name=systemd:/kubepods/pod{UID}/{CID}\n"
    assert ref_of(text) == CgroupRef(UID, CID, None)


def test_v1_equal_rank_first_line_wins() -> None:
    other = "99999999-8888-7777-6666-555555555555"
    text = f"6:blkio:/kubepods/pod{other}/{CID2}\n2:rdma:/kubepods/pod{UID}/{CID}\n"
    assert ref_of(text) == CgroupRef(other, CID2, None)


def test_malformed_lines_are_counted_and_skipped() -> None:
    text = (
        "garbage\n"
        "x:memory:/kubepods\n"  # hierarchy id not numeric
        "3:memory\n"  # two fields
        "4:memory:relative/path\n"  # path must be absolute
        "\n   \n"  # blank lines are not malformed
        f"0::{SYSTEMD_BURSTABLE}/cri-containerd-{CID}.scope\n"
        "\uff15:memory:/\n"  # FULLWIDTH DIGIT FIVE: str.isdigit() would accept it
    )
    assert parse_cgroup(text) == CgroupParse(CgroupRef(UID, CID, "containerd"), 5)


def test_empty_input() -> None:
    assert parse_cgroup("") == CgroupParse(None, 0)


def test_path_with_colons_is_kept_whole() -> None:
    # only the first two colons separate fields
    assert ref_of(f"0::/a:b/kubepods/pod{UID}/{CID}") == CgroupRef(UID, CID, None)


def test_parse_cgroup_path_direct() -> None:
    assert parse_cgroup_path(f"/kubepods/pod{UID}/{CID}") == CgroupRef(UID, CID, None)
    assert parse_cgroup_path("") is None


# --- properties ---------------------------------------------------------------------------

_UID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")
_CID_RE = re.compile(r"[0-9a-f]{64}")


def _check_ref(ref: CgroupRef | None) -> None:
    if ref is None:
        return
    assert _UID_RE.fullmatch(ref.pod_uid)
    assert ref.container_id is None or _CID_RE.fullmatch(ref.container_id)
    assert ref.runtime in (None, "containerd", "cri-o", "docker")


@given(st.text())
def test_garbage_never_raises(text: str) -> None:
    result = parse_cgroup(text)
    assert 0 <= result.malformed_lines <= text.count("\n") + 1
    _check_ref(result.ref)


_fragment = st.sampled_from(
    ["/", ":", "\n", "0", "::", "kubepods", ".slice", "-pod", "pod", UID, UID_, CID, "cri-containerd-",
     "crio-", "crio-conmon-", ".scope", "docker-", "..", "memory", "_", "-"]
)


@given(st.lists(st.one_of(_fragment, st.text(max_size=5)), max_size=40))
def test_near_miss_garbage_never_raises(parts: list[str]) -> None:
    _check_ref(parse_cgroup("".join(parts)).ref)




@st.composite
def _uid(draw: st.DrawFn) -> str:
    groups = [draw(st.text(alphabet="0123456789abcdef", min_size=n, max_size=n)) for n in (8, 4, 4, 4, 12)]
    return "-".join(groups)


@given(
    uid=_uid(),
    cid=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    driver=st.sampled_from(["cgroupfs", "systemd"]),
    qos=st.sampled_from(["", "burstable", "besteffort"]),
    runtime=st.sampled_from([None, "containerd", "cri-o", "docker", "conmon"]),
    prefix=st.sampled_from(["", "/..", "/../..", f"/docker/{CID2}", "/kubelet.slice"]),
    suffix=st.sampled_from(["", "/init.scope", "/sub/cgroup"]),
    v1=st.booleans(),
)
def test_generated_layouts_round_trip(
    uid: str, cid: str, driver: str, qos: str, runtime: str | None, prefix: str, suffix: str, v1: bool
) -> None:
    if driver == "cgroupfs":
        pod = "/kubepods" + (f"/{qos}" if qos else "") + f"/pod{uid}"
        leaf = {None: cid, "containerd": cid, "cri-o": f"crio-{cid}", "docker": cid,
                "conmon": f"crio-conmon-{cid}"}[runtime]
        expected_runtime = {"containerd": None, "docker": None}.get(runtime or "", runtime)
    else:
        kp = "kubelet-kubepods" if prefix == "/kubelet.slice" else "kubepods"
        q = f"-{qos}" if qos else ""
        uid_ = uid.replace("-", "_")
        pod = f"/{kp}.slice" + (f"/{kp}{q}.slice" if qos else "") + f"/{kp}{q}-pod{uid_}.slice"
        leaf = {None: cid, "containerd": f"cri-containerd-{cid}.scope", "cri-o": f"crio-{cid}.scope",
                "docker": f"docker-{cid}.scope", "conmon": f"crio-conmon-{cid}.scope"}[runtime]
        expected_runtime = runtime
    path = prefix + pod + "/" + leaf + suffix
    text = f"7:memory:{path}\n1:name=systemd:/\n0::/\n" if v1 else f"0::{path}\n"
    # conmon is charged to the pod, never to the container it monitors
    expected = CgroupRef(uid, None, "cri-o") if runtime == "conmon" else CgroupRef(uid, cid, expected_runtime)
    assert parse_cgroup(text) == CgroupParse(expected, 0)


@given(
    uid=_uid(),
    cid=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    qos=st.sampled_from(["", "burstable", "besteffort"]),
    runtime=st.sampled_from(["containerd", "cri-o", "docker"]),
    parent=st.sampled_from(["/system.slice/containerd.service", "/system.slice/crio.service", "", "/..",
                            "/kubepods.slice/kubepods-besteffort.slice"]),
    suffix=st.sampled_from(["", "/init.scope", " (deleted)"]),
    v1=st.booleans(),
)
def test_generated_colon_form_round_trip(
    uid: str, cid: str, qos: str, runtime: str, parent: str, suffix: str, v1: bool
) -> None:
    q = f"-{qos}" if qos else ""
    prefix = {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker"}[runtime]
    path = f"{parent}/kubepods{q}-pod{uid.replace('-', '_')}.slice:{prefix}:{cid}{suffix}"
    text = f"9:memory:{path}\n1:name=systemd:/\n0::/\n" if v1 else f"0::{path}\n"
    assert parse_cgroup(text) == CgroupParse(CgroupRef(uid, cid, runtime), 0)
