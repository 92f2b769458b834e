"""NVML Xid events as the second Xid source: the pure dedup rule, the NVML thread against the fake
libnvidia-ml.so.1 (real pynvml, no mocks), the watcher pairing both sources, and the daemon wiring."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.shell.cli import build_daemon
from exporter.shell.config import load_config
from exporter.xid.dedup import NVML_DEDUP_WINDOW_SECONDS, XidDedup
from exporter.xid.events_writer import EventsWriter
from exporter.xid.nvml_events import NvmlXid, NvmlXidSource
from exporter.xid.stats import XidStats, xid_metric_families
from exporter.xid.watcher import XidWatcher
from tests.fake_nvml import FakeNvml, fake_nvml_loaded, write_config
from tests.k8s_double import ApiServerDouble, kube_api_for
from tests.k8s_double import poll_until as _poll_until
from tests.k8s_double.events_validation import EVENTS_V1

NODE = "gpu-node-1"
PATIENCE_S = 20.0  # polling deadline: generous for a loaded 2-core CI box (passing runs take ms)
WINDOW = NVML_DEDUP_WINDOW_SECONDS
GPUS = [
    {"uuid": "GPU-3b000000-0000-4000-8000-000000000000", "name": "NVIDIA A100", "minor_number": 4,
     "pci_bus_id": "00000000:3B:00.0"},
    {"uuid": "GPU-86000000-0000-4000-8000-000000000000", "name": "NVIDIA A100", "minor_number": 5,
     "pci_bus_id": "00000000:86:00.0"},
    {"uuid": "GPU-af000000-0000-4000-8000-000000000000", "name": "NVIDIA A100", "minor_number": 6,
     "pci_bus_id": "00000000:AF:00.0"},
]
UUID0 = GPUS[0]["uuid"]
PCI0 = "0000:3b:00"
POD = ("team-a", "trainer-0", "main", "uid-trainer-0")
NO_POD = ("", "", "")


class FakeClock:
    """Wall clock the test moves by hand; shared by the watcher and the NVML source."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def poll_until(predicate: Any, timeout: float = PATIENCE_S) -> Any:
    return _poll_until(predicate, timeout=timeout)


def kmsg_xid(seq: int, xid: int = 79, pci: str = PCI0, pid: int = 1234) -> bytes:
    return f"4,{seq},{seq * 1000},-;NVRM: Xid (PCI:{pci}): {xid}, pid={pid}, name=python, test\n".encode()


def with_xids(index: int, *xids: tuple[int, int]) -> list[dict[str, Any]]:
    """GPUS with ``xid_events`` (tick, xid) on device ``index``."""
    gpus = [dict(g) for g in GPUS]
    gpus[index]["xid_events"] = [{"tick": t, "xid": x} for t, x in xids]
    return gpus


@contextmanager
def fake(lib: Path, tmp_path: Path, devices: list[dict[str, Any]], **nvml: Any) -> Iterator[FakeNvml]:
    doc = {"nvml": {"clock": "manual", **nvml}, "devices": devices}
    with fake_nvml_loaded(lib, write_config(doc, tmp_path / "fake_nvml.cfg")) as f:
        yield f


@contextmanager
def running(source: NvmlXidSource) -> Iterator[list[NvmlXid]]:
    got: list[NvmlXid] = []
    source.start(got.append)
    try:
        yield got
    finally:
        source.stop()


# ---------------------------------------------------------------- the dedup rule (pure)


KEY = (PCI0, 79)


def test_dedup_kmsg_first_then_nvml_within_the_window_is_one_incident() -> None:
    d: XidDedup[str] = XidDedup(10)
    assert d.kmsg(KEY, 100.0) is None
    assert d.nvml(KEY, 109.5, "n") is False  # a duplicate: not held, never counted
    assert d.held == 0 and d.due(1000.0) == []


def test_dedup_nvml_first_then_kmsg_replaces_it() -> None:
    d: XidDedup[str] = XidDedup(10)
    assert d.nvml(KEY, 100.0, "n") is True
    assert d.held == 1 and d.due(105.0) == []  # inside the window: still waiting
    assert d.kmsg(KEY, 104.0) == "n"
    assert d.held == 0 and d.due(1000.0) == []


def test_dedup_outside_the_window_both_count() -> None:
    d: XidDedup[str] = XidDedup(10)
    assert d.kmsg(KEY, 100.0) is None
    assert d.nvml(KEY, 110.5, "late") is True
    assert d.due(120.0) == [] and d.due(120.6) == ["late"]
    # the other order
    assert d.nvml(KEY, 200.0, "early") is True
    assert d.due(210.01) == ["early"]
    assert d.kmsg(KEY, 210.5) is None  # nothing held any more: the kernel-log record counts too


def test_dedup_a_held_xid_past_its_window_is_not_taken_by_a_late_kmsg_record() -> None:
    d: XidDedup[str] = XidDedup(10)
    d.nvml(KEY, 100.0, "n")
    assert d.kmsg(KEY, 110.5) is None  # due() has not run yet, but the window has passed
    assert d.due(110.5) == ["n"]
    assert d.nvml(KEY, 111.0, "m") is False  # the record is still there for a later NVML Xid


def test_dedup_window_boundary_is_inclusive() -> None:
    d: XidDedup[str] = XidDedup(10)
    d.kmsg(KEY, 100.0)
    assert d.nvml(KEY, 110.0, "n") is False
    assert d.nvml(KEY, 120.0, "m") is True
    assert d.due(130.0) == [] and d.due(130.001) == ["m"]


def test_dedup_needs_the_same_gpu_and_code() -> None:
    d: XidDedup[str] = XidDedup(10)
    d.kmsg((PCI0, 31), 100.0)
    d.kmsg(("0000:86:00", 79), 100.0)
    assert d.nvml(KEY, 100.0, "n") is True
    assert d.kmsg(None, 100.0) is None  # a report without address pairs with nothing
    assert d.nvml(None, 100.0, "no-address") is True
    assert d.kmsg(KEY, 101.0) == "n"
    assert d.due(111.0) == ["no-address"]


def test_dedup_pairs_one_to_one() -> None:
    d: XidDedup[str] = XidDedup(10)
    for t in (100.0, 100.1):
        d.kmsg(KEY, t)
    assert [d.nvml(KEY, 100.2 + i, f"n{i}") for i in range(3)] == [False, False, True]
    assert d.due(200.0) == ["n2"]


def test_dedup_stale_sightings_are_forgotten_and_bounded() -> None:
    d: XidDedup[str] = XidDedup(10, max_entries=3)
    for i in range(5):
        d.kmsg(KEY, 100.0 + i)
    # only the 3 newest sightings are kept: NVML Xids at 100 and 101 find none in their window
    assert d.nvml(KEY, 90.5, "a") is True
    assert [d.nvml(KEY, 101.0, x) for x in "bcde"] == [False, False, False, True]
    for i in range(5):
        d.nvml(("0000:86:00", 13), 300.0 + i, f"h{i}")
    assert d.held == 7 and d.due(300.0) == ["a", "e", "h0", "h1"]  # the window, then the bound


def test_dedup_drain_hands_out_everything_held_oldest_first() -> None:
    d: XidDedup[str] = XidDedup(10)
    d.nvml(("0000:86:00", 13), 101.0, "second")
    d.nvml(KEY, 100.0, "first")
    assert d.drain() == ["first", "second"] and d.held == 0


# ---------------------------------------------------------------- the NVML thread


@pytest.mark.e2e
def test_source_registers_every_gpu_and_maps_the_event_to_its_gpu(lib: Path, tmp_path: Path) -> None:
    clock = FakeClock()
    with fake(lib, tmp_path, with_xids(2, (1, 48), (1, 13))) as f:
        source = NvmlXidSource(clock=clock, wait_ms=20)
        with running(source) as got:
            poll_until(lambda: source.registered_devices == 3)
            f.advance(1)
            poll_until(lambda: len(got) == 2)
    assert got == [NvmlXid(x, "0000:af:00", GPUS[2]["uuid"], 6, None, None, clock.now) for x in (48, 13)]
    assert source.errors() == {}


@pytest.mark.e2e
def test_a_gpu_that_fails_to_register_is_skipped_and_counted(lib: Path, tmp_path: Path) -> None:
    devices = with_xids(2, (2, 31))
    devices[0]["xid_events"] = [{"tick": 2, "xid": 79}]
    devices[0]["lost_after_ticks"] = 0  # lost before the source starts: its handle cannot be had
    with fake(lib, tmp_path, devices) as f:
        pynvml.nvmlInit()  # the sampler's session, as in the daemon: the source shares NVML with it
        try:
            f.advance(1)
            source = NvmlXidSource(wait_ms=20)
            with running(source) as got:
                poll_until(lambda: source.registered_devices == 2)
                f.advance(1)
                poll_until(lambda: got)
                assert [(x.uuid, x.xid) for x in got] == [(GPUS[2]["uuid"], 31)]
                assert source.errors() == {("nvmlDeviceGetHandleByIndex", "NVMLError_GpuIsLost"): 1}
            # our nvmlShutdown balanced our nvmlInit only: the sampler's session is still up
            assert pynvml.nvmlDeviceGetCount() == 3
        finally:
            pynvml.nvmlShutdown()


@pytest.mark.e2e
def test_a_gpu_without_xid_events_is_skipped_and_counted(lib: Path, tmp_path: Path) -> None:
    devices = with_xids(2, (1, 31))
    devices[1]["not_supported"] = ["events"]  # its supported event types lack Xid
    with fake(lib, tmp_path, devices) as f:
        source = NvmlXidSource(wait_ms=20)
        with running(source) as got:
            poll_until(lambda: source.registered_devices == 2)
            f.advance(1)
            poll_until(lambda: got)
        assert [(x.uuid, x.xid) for x in got] == [(GPUS[2]["uuid"], 31)]
        assert source.errors() == {("nvmlDeviceRegisterEvents", "NVMLError_NotSupported"): 1}
        assert f.calls("nvmlDeviceRegisterEvents") == 2  # not asked for what it said it cannot do


@pytest.mark.e2e
def test_nvml_down_is_retried_with_backoff(lib: Path, tmp_path: Path) -> None:
    with fake(lib, tmp_path, with_xids(0, (1, 79)), init_failures=3) as f:
        source = NvmlXidSource(wait_ms=20, backoff_s=0.01, backoff_max_s=0.02)
        with running(source) as got:
            poll_until(lambda: source.registered_devices == 3)
            f.advance(1)
            poll_until(lambda: got)
        assert source.errors() == {("nvmlInit", "NVMLError_DriverNotLoaded"): 3}
        assert source.sessions == 1 and f.calls("nvmlInitWithFlags") == 4


@pytest.mark.e2e
def test_no_gpus_is_retried_later(lib: Path, tmp_path: Path) -> None:
    with fake(lib, tmp_path, []) as f:
        source = NvmlXidSource(wait_ms=20, backoff_s=0.01, backoff_max_s=0.02)
        with running(source):
            poll_until(lambda: f.calls("nvmlInitWithFlags") >= 3)
            assert source.registered_devices == 0 and source.sessions == 0
        assert source.errors()[("nvmlDeviceGetCount", "no_devices")] >= 3
        # every failed attempt gave its session back
        assert f.calls("nvmlShutdown") == f.calls("nvmlInitWithFlags")
        assert f.calls("nvmlEventSetCreate") == 0


@pytest.mark.e2e
def test_stop_is_prompt_while_waiting_and_while_backing_off(lib: Path, tmp_path: Path) -> None:
    with fake(lib, tmp_path, GPUS) as f:
        source = NvmlXidSource(wait_ms=300)
        with running(source):
            poll_until(lambda: f.calls("nvmlEventSetWait_v2") >= 2)  # blocked in the wait
            started = time.monotonic()
            source.stop()
            assert time.monotonic() - started < 1.0
        assert f.calls("nvmlEventSetFree") == 1 and f.calls("nvmlShutdown") == 1
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()  # the source's session was the only one, and it is closed
    with fake(lib, tmp_path, GPUS, init_failures=100) as f:
        source = NvmlXidSource(backoff_s=60)
        with running(source):
            poll_until(lambda: f.calls("nvmlInitWithFlags") == 1)
            started = time.monotonic()
            source.stop()
            assert time.monotonic() - started < 1.0


# ---------------------------------------------------------------- the watcher with both sources


def resolve_bus(pci: str, gpu_instance: int | None = None) -> tuple[str, int | None] | None:
    return {PCI0: (UUID0, 4)}.get(pci)


def resolve_pid(pid: int) -> tuple[str, str, str, str] | None:
    return POD if pid == 1234 else None


def totals(stats: XidStats) -> dict[tuple, int]:
    """xid counts by (uuid, minor, xid, namespace, pod, container)."""
    return dict(stats.xid_counts)


class FailingKmsg:
    """A kernel log that opened, then fails every read (EIO on a flaky /dev/kmsg)."""

    pollable = False

    def read_available(self, max_records: int):
        raise OSError(5, "Input/output error")

    def close(self) -> None:
        pass


@contextmanager
def watching(lib: Path, tmp_path: Path, kmsg: Path | None, *, events=None, devices=None,
             resolver=resolve_bus, **kw) -> Iterator[tuple[XidWatcher, FakeNvml, FakeClock]]:
    clock = FakeClock()
    with fake(lib, tmp_path, devices or with_xids(0, (1, 79))) as f:
        source = NvmlXidSource(clock=clock, wait_ms=20)
        w = XidWatcher(str(kmsg) if kmsg else None, NODE, resolver, resolve_pid, events,
                       replay_from_start=True, clock=clock, poll_interval=0.01, nvml_source=source, **kw)
        w.start()
        try:
            poll_until(lambda: source.registered_devices == 3)
            yield w, f, clock
        finally:
            w.stop()


def nvml_result(w: XidWatcher, result: str) -> int:
    return w.stats().nvml_events.get(result, 0)


@pytest.mark.e2e
@pytest.mark.parametrize("kmsg", ["disabled", "unreadable"])
def test_nvml_alone_counts_after_the_window_and_posts_an_event(lib: Path, tmp_path: Path, kmsg: str) -> None:
    with ApiServerDouble() as api:
        writer = EventsWriter(kube_api_for(api), backoff_base=0.01, backoff_max=0.05)
        path = None if kmsg == "disabled" else tmp_path / "absent"
        # unreadable: the resolver does not know the GPU either, so NVML's own identity is used
        resolver = resolve_bus if kmsg == "disabled" else (lambda pci, gpu_instance: None)
        try:
            with watching(lib, tmp_path, path, events=writer, resolver=resolver) as (w, f, clock):
                f.advance(1)
                poll_until(lambda: w.stats().nvml_held == 1)
                assert w.stats().xid_counts == {}  # held: a kernel-log record may still come
                clock.now += WINDOW + 0.5
                poll_until(lambda: w.stats().xid_counts)
                assert totals(w.stats()) == {(UUID0, 4, 79, *NO_POD): 1}
                assert nvml_result(w, "counted") == 1 and nvml_result(w, "duplicate") == 0
                assert w.stats().skips == ({} if kmsg == "disabled" else {"read_error": 1})
                (event,) = poll_until(lambda: api.events(EVENTS_V1))
        finally:
            writer.close()
    assert event["reason"] == "NvidiaXid79" and event["type"] == "Warning"
    assert event["regarding"]["kind"] == "Node" and event["regarding"]["name"] == NODE
    assert "related" not in event or event["related"] is None
    assert UUID0 in event["note"] and "NVML" in event["note"]
    assert writer.counts().failed == 0


@pytest.mark.e2e
def test_a_kernel_log_failing_every_read_does_not_stall_the_nvml_xids(lib: Path, tmp_path: Path) -> None:
    with watching(lib, tmp_path, tmp_path / "kmsg", opener=lambda path: FailingKmsg()) as (w, f, clock):
        f.advance(1)
        poll_until(lambda: w.stats().nvml_held == 1)
        clock.now += WINDOW + 0.5
        poll_until(lambda: w.stats().xid_counts)
        assert totals(w.stats()) == {(UUID0, 4, 79, *NO_POD): 1}
        assert w.stats().skips["read_error"] >= 1


@pytest.mark.e2e
def test_kmsg_first_then_nvml_within_the_window_counts_once(lib: Path, tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(b"")
    with watching(lib, tmp_path, kmsg) as (w, f, clock):
        with kmsg.open("ab") as out:
            out.write(kmsg_xid(1))
        poll_until(lambda: w.stats().xid_counts)
        clock.now += WINDOW - 1
        f.advance(1)
        poll_until(lambda: nvml_result(w, "duplicate") == 1)
        assert w.stats().nvml_held == 0
    # stop() counts whatever is still held: nothing is, so the NVML Xid was never counted
    assert totals(w.stats()) == {(UUID0, 4, 79, *POD[:3]): 1}
    assert nvml_result(w, "counted") == 0


@pytest.mark.e2e
def test_nvml_first_then_kmsg_within_the_window_counts_once_with_the_pod(lib: Path, tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(b"")
    with watching(lib, tmp_path, kmsg) as (w, f, clock):
        f.advance(1)
        poll_until(lambda: w.stats().nvml_held == 1)
        clock.now += WINDOW - 1
        with kmsg.open("ab") as out:
            out.write(kmsg_xid(1))
        poll_until(lambda: nvml_result(w, "duplicate") == 1)
        assert w.stats().nvml_held == 0
    assert totals(w.stats()) == {(UUID0, 4, 79, *POD[:3]): 1}
    assert nvml_result(w, "counted") == 0


@pytest.mark.e2e
@pytest.mark.parametrize("first", ["kmsg", "nvml"])
def test_outside_the_window_both_are_counted(lib: Path, tmp_path: Path, first: str) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(b"")
    with watching(lib, tmp_path, kmsg) as (w, f, clock):
        if first == "kmsg":
            with kmsg.open("ab") as out:
                out.write(kmsg_xid(1))
            poll_until(lambda: w.stats().xid_counts)
            clock.now += WINDOW + 0.5
            f.advance(1)
            poll_until(lambda: w.stats().nvml_held == 1)
            clock.now += WINDOW + 0.5
        else:
            f.advance(1)
            poll_until(lambda: w.stats().nvml_held == 1)
            clock.now += WINDOW + 0.5
            poll_until(lambda: nvml_result(w, "counted") == 1)
            with kmsg.open("ab") as out:
                out.write(kmsg_xid(1))
        poll_until(lambda: sum(w.stats().xid_counts.values()) == 2)
    assert totals(w.stats()) == {(UUID0, 4, 79, *POD[:3]): 1, (UUID0, 4, 79, *NO_POD): 1}
    assert nvml_result(w, "duplicate") == 0


@pytest.mark.e2e
def test_nvml_families_render(lib: Path, tmp_path: Path) -> None:
    devices = with_xids(0, (1, 79))
    devices[1]["lost_after_ticks"] = 0
    with fake(lib, tmp_path, devices) as f:
        pynvml.nvmlInit()
        try:
            f.advance(1)  # device 1 lost before the source registers
            clock = FakeClock()
            source = NvmlXidSource(clock=clock, wait_ms=20)
            w = XidWatcher(None, NODE, resolve_bus, resolve_pid, None, clock=clock, poll_interval=0.01,
                           nvml_source=source)
            w.start()
            try:
                poll_until(lambda: source.registered_devices == 2)
                f.advance(1)
                poll_until(lambda: w.stats().nvml_held == 1)
            finally:
                w.stop()  # counts the held Xid: nothing can pair with it any more
        finally:
            pynvml.nvmlShutdown()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in xid_metric_families(w.stats(), NODE) for s in fam.samples}
    assert samples[("kube_gpu_exporter_xid_nvml_events_total", (("node_name", NODE), ("result", "counted")))] == 1
    assert samples[("kube_gpu_exporter_xid_nvml_events_total", (("node_name", NODE), ("result", "dropped")))] == 0
    assert samples[("kube_gpu_exporter_xid_nvml_errors_total", (
        ("call", "nvmlDeviceGetHandleByIndex"), ("code", "NVMLError_GpuIsLost"), ("node_name", NODE)))] == 1
    assert not any(name.startswith("kube_gpu_exporter_xid_nvml") for name, _ in
                   ((s.name, 0) for fam in xid_metric_families(XidStats(), NODE) for s in fam.samples))


# ---------------------------------------------------------------- the daemon


def exposition(body: bytes) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


@pytest.mark.e2e
def test_daemon_takes_nvml_xids_and_pairs_them_with_the_kernel_log(lib: Path, tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(kmsg_xid(1, pid=0))
    devices = with_xids(0, (3, 79))
    with fake(lib, tmp_path, devices, clock="auto"):
        cfg = load_config(["--no-pod-watch", "--pod-resources-socket", "", "--node-name", NODE,
                           "--kmsg-path", str(kmsg), "--kmsg-replay", "--interval", "0.05",
                           "--host-proc", str(tmp_path)], environ={})
        assert cfg.xid_nvml_events
        daemon = build_daemon(cfg)
        try:
            daemon.start()
            key = ("kube_gpu_exporter_xid_nvml_events_total", (("node_name", NODE), ("result", "duplicate")))
            rows = poll_until(lambda: (e := exposition(daemon.holder.get().body)).get(key) == 1 and e)
        finally:
            daemon.close()
    xids = {k: v for k, v in rows.items() if k[0] == "nvidia_gpu_xid_errors_total"}
    assert list(xids.values()) == [1]
    assert dict(next(iter(xids))[1])["uuid"] == UUID0


def test_daemon_flag_off_and_simulate_have_no_nvml_source(tmp_path: Path) -> None:
    mixed = Path(__file__).resolve().parent.parent / "examples" / "mixed-4gpu-node.yaml"
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(b"")
    for extra in ([], ["--xid-nvml-events"]):  # under --simulate the flag cannot turn it on
        cfg = load_config(["--simulate", str(mixed), "--kmsg-path", str(kmsg), *extra], environ={})
        daemon = build_daemon(cfg)
        try:
            daemon.start()
            body = daemon.holder.get().body
        finally:
            daemon.close()
        assert b"kube_gpu_exporter_xid_records_total" in body
        assert b"kube_gpu_exporter_xid_nvml" not in body
    env = {"KUBE_GPU_EXPORTER_XID_NVML_EVENTS": "false"}
    assert load_config([], environ=env).xid_nvml_events is False
    assert load_config(["--no-xid-nvml-events"], environ={}).xid_nvml_events is False
