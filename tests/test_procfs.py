"""Tests for exporter.node.procfs against fake /proc trees."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.model import CgroupRef
from exporter.node.procfs import SKIP_REASONS, ProcReader, parse_stat_starttime

UID_A = "3f0c1c9e-5b7a-4c1e-9a57-2f1e0e9b1f00"
UID_B = "99999999-8888-7777-6666-555555555555"
CID_A = "a" * 64
CID_B = "b" * 64


def stat_line(pid: int, comm: str, start: int) -> str:
    # fields 3..21 then starttime (22) then a few more, as the kernel prints them
    after = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", "10", "0", "0", "0", "5", "3", "0", "0",
             "20", "0", "1", "0", str(start), "12345678", "300"]
    return f"{pid} ({comm}) " + " ".join(after) + "\n"


def cgroup_text(uid: str, cid: str) -> str:
    return f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n"


def make_proc(root: Path, pid: int, *, start: int, cgroup: str, comm: str = "python3") -> Path:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(stat_line(pid, comm, start))
    (d / "cgroup").write_text(cgroup)
    (d / "comm").write_text(comm + "\n")
    return d


def test_parse_stat_comm_with_parentheses_and_spaces() -> None:
    assert parse_stat_starttime(stat_line(42, "a) (b c) d", 987654)) == 987654
    assert parse_stat_starttime(stat_line(42, ")", 5)) == 5
    many_fields = " ".join(str(i) for i in range(25))
    assert parse_stat_starttime(stat_line(42, many_fields, 77)) == 77


@pytest.mark.parametrize(
    "text",
    ["", "42 (x", "42 (x) S 1 2", "42 (x) " + " ".join(["1"] * 19) + " notanumber 5", "no paren at all"],
)
def test_parse_stat_malformed(text: str) -> None:
    assert parse_stat_starttime(text) is None


@given(st.text())
def test_parse_stat_never_raises(text: str) -> None:
    start = parse_stat_starttime(text)
    assert start is None or start >= 0


def test_resolve_basic_and_host_process(tmp_path: Path) -> None:
    make_proc(tmp_path, 100, start=1000, cgroup=cgroup_text(UID_A, CID_A))
    make_proc(tmp_path, 200, start=2000, cgroup="0::/system.slice/sshd.service\n")
    reader = ProcReader(tmp_path)
    assert reader.resolve([100, 200, 100]) == {
        100: CgroupRef(UID_A, CID_A, "containerd"),
        200: None,  # alive, not in a pod
    }
    assert dict(reader.skips()) == dict.fromkeys(SKIP_REASONS, 0)


def test_cache_hit_reads_only_stat_then_stat_change_rereads(tmp_path: Path) -> None:
    d = make_proc(tmp_path, 100, start=1000, cgroup=cgroup_text(UID_A, CID_A))
    reader = ProcReader(tmp_path)
    assert reader.resolve([100]) == {100: CgroupRef(UID_A, CID_A, "containerd")}
    # cgroup changes but stat does not: the cached answer proves cgroup was not re-read
    (d / "cgroup").write_text(cgroup_text(UID_B, CID_B))
    assert reader.resolve([100]) == {100: CgroupRef(UID_A, CID_A, "containerd")}
    # stronger: the cgroup file can even be unreadable on a cache hit
    (d / "cgroup").unlink()
    assert reader.resolve([100]) == {100: CgroupRef(UID_A, CID_A, "containerd")}
    # pid reuse: same pid, new start time, new cgroup -> new answer
    (d / "cgroup").write_text(cgroup_text(UID_B, CID_B))
    (d / "stat").write_text(stat_line(100, "other", 5000))
    assert reader.resolve([100]) == {100: CgroupRef(UID_B, CID_B, "containerd")}
    assert sum(reader.skips().values()) == 0


def test_process_exits_between_calls(tmp_path: Path) -> None:
    d = make_proc(tmp_path, 100, start=1000, cgroup=cgroup_text(UID_A, CID_A))
    make_proc(tmp_path, 101, start=1001, cgroup=cgroup_text(UID_B, CID_B))
    reader = ProcReader(tmp_path)
    assert set(reader.resolve([100, 101])) == {100, 101}
    for f in d.iterdir():
        f.unlink()
    d.rmdir()
    assert reader.resolve([100, 101]) == {101: CgroupRef(UID_B, CID_B, "containerd")}
    assert reader.skips()["exited"] == 1
    # never existed
    assert reader.resolve([999999]) == {}
    assert reader.skips()["exited"] == 2


def test_exit_between_stat_and_cgroup_reads(tmp_path: Path) -> None:
    d = make_proc(tmp_path, 100, start=1000, cgroup=cgroup_text(UID_A, CID_A))
    (d / "cgroup").unlink()
    reader = ProcReader(tmp_path)
    assert reader.resolve([100]) == {}
    assert reader.skips()["exited"] == 1


def test_empty_stat_counts_as_exited(tmp_path: Path) -> None:
    d = make_proc(tmp_path, 100, start=1000, cgroup=cgroup_text(UID_A, CID_A))
    (d / "stat").write_text("")
    reader = ProcReader(tmp_path)
    assert reader.resolve([100]) == {}
    assert reader.skips()["exited"] == 1


def test_malformed_stat_still_resolves_but_is_not_cached(tmp_path: Path) -> None:
    d = make_proc(tmp_path, 100, start=1000, cgroup=cgroup_text(UID_A, CID_A))
    (d / "stat").write_text("100 (truncated")
    reader = ProcReader(tmp_path)
    assert reader.resolve([100]) == {100: CgroupRef(UID_A, CID_A, "containerd")}
    (d / "cgroup").write_text(cgroup_text(UID_B, CID_B))
    assert reader.resolve([100]) == {100: CgroupRef(UID_B, CID_B, "containerd")}
    assert reader.skips()["malformed_stat"] == 2


def test_malformed_cgroup_lines_counted_per_parse(tmp_path: Path) -> None:
    make_proc(tmp_path, 100, start=1000, cgroup="junk\nmore junk\n" + cgroup_text(UID_A, CID_A))
    reader = ProcReader(tmp_path)
    assert reader.resolve([100]) == {100: CgroupRef(UID_A, CID_A, "containerd")}
    reader.resolve([100])  # cache hit: not parsed again, not counted again
    assert reader.skips()["malformed_cgroup_line"] == 2


def test_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # monkeypatch rather than chmod: the tests may run as root, which ignores file modes
    make_proc(tmp_path, 100, start=1000, cgroup=cgroup_text(UID_A, CID_A))
    make_proc(tmp_path, 101, start=1001, cgroup=cgroup_text(UID_B, CID_B))
    make_proc(tmp_path, 102, start=1002, cgroup=cgroup_text(UID_B, CID_B))
    real_open = Path.open

    def open_(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == tmp_path / "100" / "cgroup":
            raise PermissionError(13, "Permission denied")
        if self == tmp_path / "101" / "stat":
            raise OSError(5, "Input/output error")
        if self == tmp_path / "102" / "stat":
            raise ProcessLookupError(3, "No such process")
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", open_)
    reader = ProcReader(tmp_path)
    assert reader.resolve([100, 101, 102]) == {}
    assert reader.skips()["permission"] == 1
    assert reader.skips()["read_error"] == 1
    assert reader.skips()["exited"] == 1


def test_eviction_of_unseen_pids(tmp_path: Path) -> None:
    d = make_proc(tmp_path, 100, start=1000, cgroup=cgroup_text(UID_A, CID_A))
    make_proc(tmp_path, 101, start=1001, cgroup=cgroup_text(UID_B, CID_B))
    reader = ProcReader(tmp_path)
    reader.resolve([100, 101])
    reader.resolve([101])  # 100 not seen: evicted
    (d / "cgroup").write_text(cgroup_text(UID_B, CID_B))
    # same start time, but the entry was evicted, so cgroup is read afresh
    assert reader.resolve([100]) == {100: CgroupRef(UID_B, CID_B, "containerd")}


def test_max_cache_bounds_entries(tmp_path: Path) -> None:
    dirs = [make_proc(tmp_path, pid, start=pid, cgroup=cgroup_text(UID_A, CID_A)) for pid in (1, 2, 3)]
    reader = ProcReader(tmp_path, max_cache=2)
    reader.resolve([1, 2, 3])
    for d in dirs:
        (d / "cgroup").write_text(cgroup_text(UID_B, CID_B))
    got = reader.resolve([1, 2, 3])
    # the first two stayed cached (old answer); the third was re-read
    assert [got[p].pod_uid for p in (1, 2, 3)] == [UID_A, UID_A, UID_B]  # type: ignore[union-attr]


def test_comm(tmp_path: Path) -> None:
    make_proc(tmp_path, 100, start=1, cgroup="0::/\n", comm="a) (b")
    reader = ProcReader(tmp_path)
    assert reader.comm(100) == "a) (b"
    assert reader.comm(12345) is None
    # the comm with ") (" also parses in stat
    assert reader.resolve([100]) == {100: None}


def test_resolve_reads_each_comm_once_per_process(tmp_path: Path) -> None:
    d = make_proc(tmp_path, 100, start=1, cgroup="0::/\n", comm="ollama")
    make_proc(tmp_path, 101, start=1, cgroup="0::/\n", comm="bad\nname\x1b " + "x" * 100)
    reader = ProcReader(tmp_path)
    reader.resolve([100, 101, 102])
    comms = reader.comms()
    assert comms[100] == "ollama" and 102 not in comms
    assert "\n" not in comms[101] and len(comms[101]) <= 64  # one bounded line
    (d / "comm").write_text("renamed\n")  # same process (same start time): the cached name stays
    reader.resolve([100])
    assert reader.comms() == {100: "ollama"}  # and 101, absent from this call, is gone
    (d / "stat").write_text(stat_line(100, "x", 2))  # the PID reused: read again
    reader.resolve([100])
    assert reader.comms() == {100: "renamed"}


def test_non_utf8_cgroup_bytes(tmp_path: Path) -> None:
    d = make_proc(tmp_path, 100, start=1, cgroup="")
    (d / "cgroup").write_bytes(b"1:name=systemd:/\xff\xfe\n" + cgroup_text(UID_A, CID_A).encode())
    assert ProcReader(tmp_path).resolve([100]) == {100: CgroupRef(UID_A, CID_A, "containerd")}


def test_skips_is_a_snapshot(tmp_path: Path) -> None:
    reader = ProcReader(tmp_path)
    before = reader.skips()
    reader.resolve([1])
    assert before["exited"] == 0
    assert reader.skips()["exited"] == 1
    with pytest.raises(TypeError):
        reader.skips()["exited"] = 5  # type: ignore[index]


def test_real_proc_self() -> None:
    reader = ProcReader()
    pid = os.getpid()
    assert pid in reader.resolve([pid])
    assert reader.comm(pid)


@given(stat=st.binary(max_size=200), cgroup=st.binary(max_size=200))
def test_resolve_never_raises_on_garbage_files(stat: bytes, cgroup: bytes) -> None:
    with tempfile.TemporaryDirectory() as root:
        d = Path(root) / "7"
        d.mkdir()
        (d / "stat").write_bytes(stat)
        (d / "cgroup").write_bytes(cgroup)
        reader = ProcReader(Path(root))
        got = reader.resolve([7, 8])
        assert 8 not in got
        assert set(reader.skips()) == set(SKIP_REASONS)
        assert all(v >= 0 for v in reader.skips().values())


def test_a_proc_file_over_the_limit_is_a_counted_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A --host-proc of ordinary files could hold anything (/dev/zero linked in): read no further than 1 MiB."""
    from exporter.node import procfs

    monkeypatch.setattr(procfs, "MAX_PROC_FILE_BYTES", 4096)
    make_proc(tmp_path, 100, start=1000, cgroup=cgroup_text(UID_A, CID_A) + "#" * 5000)
    make_proc(tmp_path, 200, start=2000, cgroup=cgroup_text(UID_A, CID_A))
    (tmp_path / "300").mkdir()
    (tmp_path / "300" / "stat").symlink_to("/dev/zero")
    reader = ProcReader(tmp_path)
    assert reader.resolve([100, 200, 300]) == {200: CgroupRef(UID_A, CID_A, "containerd")}
    assert reader.skips()["read_error"] == 2
