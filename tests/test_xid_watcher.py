"""The Xid watcher end to end: kmsg files in, counters and metrics out, Events into the API double."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from exporter.xid.dedup import FALLEN_REPEAT_WINDOW_USEC, FallenEchoFilter, is_fallen_echo
from exporter.xid.events import PlannerConfig
from exporter.xid.events_writer import EventsWriter
from exporter.xid.history import replay_start
from exporter.xid.kmsg import KmsgReader, parse_record
from exporter.xid.parse import XidReport
from exporter.xid.stats import XidStats, xid_metric_families
from exporter.xid.watcher import XidWatcher
from tests.k8s_double import ApiServerDouble, kube_api_for, poll_until
from tests.k8s_double.events_validation import EVENTS_V1

DATA = Path(__file__).parent / "data" / "kmsg"
NODE = "gpu-node-1"
UUID_3B = "GPU-5fd4f0d9-3d3a-4b4c-9c0a-0b2d8b6f7a10"
UUID_D8_FROM_LOG = "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
BUS = {
    "0000:3b:00": (UUID_3B, 0),
    "0000:86:00": ("GPU-86", 1),
    "0000:2b:00": ("GPU-2b", 2),
    "000a:c1:00": ("GPU-c1", 3),
}
PODS = {
    1234: ("team-a", "trainer-0", "main", "uid-trainer-0"),
    2345: ("team-b", "mig-job", "worker", "uid-mig-job"),
    4242: ("team-a", "infer-1", "server", "uid-infer-1"),
}


class FakeClock:
    """An injected clock the test moves by hand."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def resolve_bus(pci: str, gpu_instance: int | None = None) -> tuple[str, int | None] | None:
    return BUS.get(pci)


def resolve_pid(pid: int) -> tuple[str, str, str, str] | None:
    return PODS.get(pid)


def xid_line(seq: int, ts_usec: int, xid: int = 31, pci: str = "0000:3b:00", pid: int = 1234) -> bytes:
    return f"4,{seq},{ts_usec},-;NVRM: Xid (PCI:{pci}): {xid}, pid={pid}, name=python, test\n".encode()


@pytest.fixture
def stop_later() -> Iterator[list]:
    """Things to stop/close at teardown, even when the test fails half way."""
    items: list = []
    yield items
    for item in reversed(items):
        if isinstance(item, XidWatcher):
            item.stop()
        else:
            item.close()


def writer_for(double: ApiServerDouble) -> EventsWriter:
    return EventsWriter(kube_api_for(double), backoff_base=0.01, backoff_max=0.05)


def watcher(path: Path | str, events=None, stop_later: list | None = None, **kw) -> XidWatcher:
    kw.setdefault("poll_interval", 0.02)
    w = XidWatcher(str(path), NODE, resolve_bus, resolve_pid, events, **kw)
    w.start()
    if stop_later is not None:
        stop_later.append(w)
    return w


def wait_records(w: XidWatcher, n: int, timeout: float = 10.0) -> XidStats:
    return poll_until(lambda: (s := w.stats()).records_read >= n and s, timeout=timeout)


# ---------------------------------------------------------------- the fixture's variants


EXPECTED_VARIANTS = Counter({
    (UUID_3B, 0, 79, "team-a", "trainer-0", "main"): 1,
    ("GPU-86", 1, 31, "team-b", "mig-job", "worker"): 1,
    ("GPU-86", 1, 13, "", "", ""): 1,
    ("GPU-2b", 2, 79, "", "", ""): 2,
    ("", None, 13, "", "", ""): 1,  # 0000:01:00: not a GPU the resolver knows
    ("", None, 53, "", "", ""): 1,
    (UUID_3B, 0, 154, "", "", ""): 1,
    ("GPU-c1", 3, 48, "", "", ""): 1,  # pid 777 is no pod's
    (UUID_3B, 0, 94, "team-a", "infer-1", "server"): 1,
    (UUID_D8_FROM_LOG, None, 79, "", "", ""): 1,  # the driver's own "GPU at PCI" line names it
    ("", None, 79, "", "", ""): 1,  # 0000:af:00, multi-record report, unknown GPU
})


def test_every_variant_counted_with_gpu_and_pod(stop_later: list) -> None:
    w = watcher(DATA / "variants.kmsg", replay_from_start=True, stop_later=stop_later)
    stats = wait_records(w, 23)
    assert Counter(dict(stats.xid_counts)) == EXPECTED_VARIANTS
    assert stats.skips == {"fallen_off_bus_echo": 1, "not_from_kernel": 1}
    assert stats.history_skipped == 0 and stats.epipe == 0
    assert set(stats.last_xid_time) == {k[:2] for k in EXPECTED_VARIANTS}


def test_old_drivers_doubled_fallen_off_the_bus_counts_once(tmp_path: Path, stop_later: list) -> None:
    """Old drivers print the numberless line twice, microseconds apart: one incident. Seconds apart: two."""
    path = tmp_path / "kmsg"
    path.write_bytes(
        b"3,1,1000000000,-;NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.\n"
        b"3,2,1000000004,-;NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.\n"
        b"3,3,1000000010,-;NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n"  # the other variant, same GPU
        b"3,4,1000000020,-;NVRM: GPU at PCI:0000:2b:00: GPU has fallen off the bus.\n"  # another GPU
        b"3,5,1005000000,-;NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.\n"  # 5 s later: new incident
        b"3,6,1005000003,-;NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.\n"
    )
    w = watcher(path, replay_from_start=True, stop_later=stop_later)
    stats = wait_records(w, 6)
    assert Counter(dict(stats.xid_counts)) == Counter(
        {(UUID_3B, 0, 79, "", "", ""): 2, ("GPU-2b", 2, 79, "", "", ""): 1})
    assert stats.skips == {"fallen_off_bus_echo": 3}


def test_the_gpu_instance_of_each_xid_is_kept_for_the_log(tmp_path: Path, stop_later: list) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes((DATA / "variants.kmsg").read_bytes())
    w = watcher(path, replay_from_start=True, stop_later=stop_later)
    poll_until(lambda: sum(w.stats().xid_counts.values()) == sum(EXPECTED_VARIANTS.values()))
    instances = w.stats().gpu_instances
    assert instances[("GPU-86", 1, 31)] == 1 and instances[("GPU-86", 1, 13)] == 2  # GPU-I:01, GPU-I:02
    assert instances[(UUID_3B, 0, 79)] is None


def test_garbage_never_stops_the_watcher(tmp_path: Path, stop_later: list) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes((DATA / "garbage.kmsg").read_bytes())
    w = watcher(path, replay_from_start=True, stop_later=stop_later)
    stats = wait_records(w, 10)
    poll_until(lambda: sum(w.stats().xid_counts.values()) == 2)
    stats = w.stats()
    assert {k[2] for k in stats.xid_counts} == {31, 43}
    assert stats.skips["malformed_record"] >= 5 and stats.skips["malformed_xid_line"] >= 5
    with path.open("ab") as f:
        f.write(xid_line(9000, 10**9, xid=62))
    poll_until(lambda: any(k[2] == 62 for k in w.stats().xid_counts))


def test_a_rotated_kernel_log_file_is_followed_and_the_rotation_logged_once(
        tmp_path: Path, stop_later: list, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(xid_line(1, 10**6, xid=31))
    w = watcher(path, replay_from_start=True, stop_later=stop_later)
    poll_until(lambda: any(k[2] == 31 for k in w.stats().xid_counts))
    with path.open("r+b") as f:  # logrotate's copytruncate: the same file, emptied, written again
        f.truncate(0)
        f.write(xid_line(2, 2 * 10**6, xid=43) + xid_line(3, 3 * 10**6, xid=62))
    poll_until(lambda: {k[2] for k in w.stats().xid_counts} == {31, 43, 62})  # before: never read again
    lines = [r.getMessage() for r in caplog.records if "truncated in place" in r.getMessage()]
    assert lines == [f"kernel log file {path} was truncated in place (copytruncate): reading it from its new start"]


# ---------------------------------------------------------------- restart safety


@pytest.mark.e2e
def test_history_is_not_reemitted_but_feeds_the_gpu_map(tmp_path: Path, double: ApiServerDouble,
                                                       stop_later: list) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes((DATA / "variants.kmsg").read_bytes())
    writer = writer_for(double)
    stop_later.append(writer)
    w = watcher(path, writer, stop_later=stop_later)
    assert w.stats().history_skipped == 23 and w.stats().xid_counts == {}
    with path.open("ab") as f:  # after start: new; the bus resolver does not know d8, the log did
        f.write(xid_line(2000, 3_000_000_000, xid=43, pci="0000:d8:00", pid=1))
    poll_until(lambda: w.stats().events_posted == 1)
    assert dict(w.stats().xid_counts) == {(UUID_D8_FROM_LOG, None, 43, "", "", ""): 1}
    w.stop()

    # A restart over the same content: nothing is new, nothing is posted.
    w2 = watcher(path, writer, stop_later=stop_later, instance_token="second")
    assert w2.stats().history_skipped == 24
    with path.open("ab") as f:
        f.write(xid_line(2001, 3_100_000_000, xid=45))
    poll_until(lambda: writer.counts().posted == 2)
    assert dict(w2.stats().xid_counts) == {(UUID_3B, 0, 45, "team-a", "trainer-0", "main"): 1}
    assert sorted(e["reason"] for e in double.events(EVENTS_V1)) == ["NvidiaXid43", "NvidiaXid45"]


def test_bounded_lookback_replays_only_recent_history(tmp_path: Path, stop_later: list) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(b"".join(xid_line(i, ts, xid=x) for i, (ts, x) in
                              enumerate([(100_000_000, 13), (200_000_000, 31), (286_000_000, 43),
                                         (300_000_000, 45)])))
    w = watcher(path, lookback_seconds=15, stop_later=stop_later)
    assert w.stats().history_skipped == 2
    poll_until(lambda: sum(w.stats().xid_counts.values()) == 2)
    assert sorted(k[2] for k in w.stats().xid_counts) == [43, 45]


def test_replay_start_pure() -> None:
    recs = [parse_record(b"6,%d,%d,-;x" % (i, ts)) for i, ts in enumerate([10, 20_000_000, 30_000_000])]
    assert replay_start(recs, 0) == 3
    assert replay_start(recs, 10) == 1
    assert replay_start([None, *recs], 1000) == 1  # unparseable history is never "new"
    assert replay_start([], 5) == 0


def test_fallen_echo_rule() -> None:
    numberless = XidReport(79, "0000:3b:00", numbered=False)
    assert is_fallen_echo(numberless, 5_000_000, {"0000:3b:00": 1_000_000})
    assert not is_fallen_echo(numberless, 20_000_000, {"0000:3b:00": 1_000_000})  # too late: new incident
    assert not is_fallen_echo(numberless, 5_000_000, {"0000:2b:00": 1_000_000})  # another GPU
    assert is_fallen_echo(XidReport(79, None, numbered=False), 5_000_000, {"0000:2b:00": 1_000_000})
    assert not is_fallen_echo(XidReport(79, "0000:3b:00"), 5_000_000, {"0000:3b:00": 1_000_000})
    # a numberless copy of a numberless report: within a second it is the same incident
    assert is_fallen_echo(numberless, 1_000_004, {}, {"0000:3b:00": 1_000_000})
    assert not is_fallen_echo(numberless, 3_000_000, {}, {"0000:3b:00": 1_000_000})
    assert not is_fallen_echo(numberless, 1_000_004, {}, {"0000:2b:00": 1_000_000})
    assert is_fallen_echo(numberless, 1_000_004, {}, {None: 1_000_000})  # an addressless report covers any GPU


# ---------------------------------------------------------------- EPIPE and the device


class OverrunDevice:
    """A kmsg device double: one record per read, EPIPE where records were overwritten."""

    def __init__(self, script: list) -> None:
        self.script = list(script)
        self.lock = threading.Lock()

    def read(self, size: int = -1) -> bytes | None:
        with self.lock:
            if not self.script:
                return None
            item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def push(self, *items: object) -> None:
        with self.lock:
            self.script.extend(items)

    def close(self) -> None:
        pass


def test_epipe_is_survived_and_counted(stop_later: list) -> None:
    dev = OverrunDevice([xid_line(1, 1, xid=13)])
    w = watcher("/dev/kmsg-double", opener=lambda _: KmsgReader(dev, record_per_read=True),
                stop_later=stop_later)
    assert w.stats().history_skipped == 1
    dev.push(xid_line(2, 2, xid=31), BrokenPipeError(), OSError(32, "Broken pipe"), xid_line(9, 9, xid=43))
    # the record count moves before the Xid is counted: wait for both, not for one of them
    poll_until(lambda: w.stats().records_read == 3 and len(w.stats().xid_counts) == 2)
    stats = w.stats()
    assert stats.epipe == 2
    assert sorted(k[2] for k in stats.xid_counts) == [31, 43]


def test_a_read_error_is_counted_and_reading_goes_on(stop_later: list) -> None:
    dev = OverrunDevice([])
    w = watcher("/dev/kmsg-double", opener=lambda _: KmsgReader(dev, record_per_read=True),
                stop_later=stop_later)
    dev.push(OSError(5, "Input/output error"), xid_line(3, 3, xid=62))
    poll_until(lambda: w.stats().xid_counts)
    assert w.stats().skips == {"read_error": 1}


def test_real_dev_kmsg_history_is_skipped_and_stop_is_prompt(stop_later: list) -> None:
    try:
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
    except OSError as err:
        pytest.skip(f"/dev/kmsg not readable here: {err}")
    w = watcher("/dev/kmsg", poll_interval=0.2)
    assert w.stats().history_skipped > 0
    t0 = time.monotonic()
    w.stop()
    assert time.monotonic() - t0 < 2.0


def test_resolver_errors_are_counted_not_fatal(tmp_path: Path, stop_later: list) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(xid_line(1, 1, xid=31))

    def broken(*_: object) -> None:
        raise RuntimeError("snapshot not ready")

    w = XidWatcher(str(path), NODE, broken, broken, None, replay_from_start=True, poll_interval=0.02)
    w.start()
    stop_later.append(w)
    poll_until(lambda: w.stats().xid_counts)
    assert dict(w.stats().xid_counts) == {("", None, 31, "", "", ""): 1}
    assert w.stats().skips == {"resolver_error": 2}


# ---------------------------------------------------------------- events through the real client


@pytest.mark.e2e
def test_variants_become_valid_events(double: ApiServerDouble, stop_later: list) -> None:
    writer = writer_for(double)
    stop_later.append(writer)
    cfg = PlannerConfig(rate=100, burst=100)
    w = watcher(DATA / "variants.kmsg", writer, replay_from_start=True, event_config=cfg,
                stop_later=stop_later)
    poll_until(lambda: writer.counts().posted == len(EXPECTED_VARIANTS))
    assert writer.counts().failed == 0  # the double would 422 an invalid body
    events = double.events(EVENTS_V1)
    assert all(e["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE}
               for e in events)
    assert all(e["type"] == "Warning" and e["metadata"]["namespace"] == "default" for e in events)
    related = {e["related"]["name"]: e for e in events if e.get("related")}
    assert set(related) == {"trainer-0", "mig-job", "infer-1"}
    mig = related["mig-job"]
    assert mig["reason"] == "NvidiaXid31" and "MIG GPU-I 1" in mig["note"]
    assert "restart the application" in mig["note"]
    recovery = next(e for e in events if e["reason"] == "NvidiaXid154")
    assert "Node Reboot Required" in recovery["note"]
    assert w.stats().events_posted == len(EXPECTED_VARIANTS)


@pytest.mark.e2e
def test_repeats_patch_one_series(tmp_path: Path, double: ApiServerDouble, stop_later: list) -> None:
    clock = FakeClock()
    path = tmp_path / "kmsg"
    path.write_bytes(b"".join(xid_line(i, i * 1000, xid=31) for i in range(5)))
    writer = writer_for(double)
    stop_later.append(writer)
    cfg = PlannerConfig(patch_interval_seconds=10, window_seconds=300, rate=1, burst=5)
    w = watcher(path, writer, replay_from_start=True, clock=clock, event_config=cfg, stop_later=stop_later)
    wait_records(w, 5)
    poll_until(lambda: writer.counts().posted == 1)
    assert writer.counts().patched == 0  # repeats wait for the patch interval
    clock.now += 11
    poll_until(lambda: writer.counts().patched == 1)
    (event,) = double.events(EVENTS_V1)
    assert event["series"]["count"] == 5
    # After the window, the same Xid starts a new Event.
    clock.now += 400
    with path.open("ab") as f:
        f.write(xid_line(99, 99_000, xid=31))
    poll_until(lambda: writer.counts().posted == 2)
    assert len(double.events(EVENTS_V1)) == 2


def storm(path: Path, n: int) -> None:
    """``n`` Xid records over 8 GPUs, 5 codes and 4 pods (160 distinct series), 1 ms apart."""
    codes = [13, 31, 43, 48, 79]
    pcis = [f"0000:{b:02x}:00" for b in (0x1b, 0x2b, 0x3b, 0x5e, 0x86, 0xaf, 0xc1, 0xd8)]
    pids = [1234, 2345, 4242, 5555]
    with path.open("wb") as f:
        for i in range(n):
            f.write(xid_line(i, 5_000_000_000 + i * 1000, xid=codes[i % 5], pci=pcis[(i // 5) % 8],
                             pid=pids[(i // 40) % 4]))


@pytest.mark.e2e
def test_storm_of_10000_xids_is_rate_limited(tmp_path: Path, double: ApiServerDouble,
                                             stop_later: list) -> None:
    clock = FakeClock()
    path = tmp_path / "kmsg"
    storm(path, 10_000)
    writer = writer_for(double)
    stop_later.append(writer)
    cfg = PlannerConfig(rate=0.1, burst=25, patch_interval_seconds=10)
    w = watcher(path, writer, replay_from_start=True, clock=clock, event_config=cfg, stop_later=stop_later)
    wait_records(w, 10_000, timeout=60)
    clock.now += 60  # a minute passes: 6 more tokens
    poll_until(lambda: writer.counts().patched + writer.counts().posted >= 31)
    w.stop()
    writer.close(timeout=10)
    stats = w.stats()
    assert sum(stats.xid_counts.values()) == 10_000  # the counter counts every Xid
    writes = double.writes
    assert writes == stats.events_posted + stats.events_patched + stats.events_failed
    assert writes <= 25 + 6 + 1  # burst + rate * elapsed (+1 for the refill at stop)
    assert stats.events_posted == 25 and stats.events_patched == 6
    # Dropped: every occurrence of the 135 series that never got a create token, plus the 19
    # created series whose last repeats found no token at shutdown.
    assert stats.events_dropped == sum(1 for i in range(10_000) if i % 160 >= 25) + 19
    assert stats.events_failed == 0


def test_metric_families_render(tmp_path: Path, stop_later: list) -> None:
    w = watcher(DATA / "variants.kmsg", replay_from_start=True, stop_later=stop_later,
                clock=FakeClock(1234.5))
    stats = wait_records(w, 23)

    class One(Collector):
        def collect(self):  # type: ignore[override]
            return xid_metric_families(stats, NODE, pod_label="pod", namespace_label="ns",
                                       container_label="ctr")

    registry = CollectorRegistry()
    registry.register(One())
    text = generate_latest(registry).decode()
    assert ('nvidia_gpu_xid_errors_total{ctr="main",minor_number="0",node_name="gpu-node-1",ns="team-a",'
            f'pod="trainer-0",uuid="{UUID_3B}",xid="79"}} 1.0') in text
    assert ('nvidia_gpu_xid_errors_total{ctr="",minor_number="2",node_name="gpu-node-1",ns="",pod="",'
            'uuid="GPU-2b",xid="79"} 2.0') in text
    assert ('nvidia_gpu_last_xid_timestamp_seconds{minor_number="0",node_name="gpu-node-1",'
            f'uuid="{UUID_3B}"}} 1234.5') in text
    assert ('kube_gpu_exporter_xid_skips_total{node_name="gpu-node-1",reason="fallen_off_bus_echo"} 1.0'
            in text)
    assert 'kube_gpu_exporter_xid_records_total{node_name="gpu-node-1"} 23.0' in text
    assert 'kube_gpu_exporter_xid_kmsg_overruns_total{node_name="gpu-node-1"} 0.0' in text
    assert 'kube_gpu_exporter_xid_events_total{node_name="gpu-node-1",result="dropped"} 0.0' in text


def test_metric_families_of_empty_stats() -> None:
    fams = xid_metric_families(XidStats(), NODE)
    names = [f.name for f in fams]
    assert names[:2] == ["nvidia_gpu_xid_errors", "nvidia_gpu_last_xid_timestamp_seconds"]
    assert fams[0].samples == [] and fams[0].type == "counter" and fams[1].type == "gauge"
    assert {s.labels["result"] for s in fams[-1].samples} == {"posted", "patched", "dropped", "failed"}


@given(st.lists(st.tuples(st.sampled_from(["0000:3b:00", "0000:2b:00", None]), st.integers(0, 3_000_000)),
                max_size=20))
def test_fallen_filter_counts_one_incident_per_burst_of_numberless_reports(reports) -> None:
    """Time-ordered numberless reports: one counted per GPU for each burst of copies less than 1 s apart."""
    filt, t, counted = FallenEchoFilter(), 0, []
    for pci, gap in reports:
        t += gap
        if not filt.is_echo(XidReport(79, pci, numbered=False), t):
            counted.append((pci, t))
    # nothing counted is within the repeat window of an earlier counted report of its GPU (or of an addressless one)
    for i, (pci, when) in enumerate(counted):
        for other, before in counted[:i]:
            if other == pci or other is None or pci is None:
                assert when - before > FALLEN_REPEAT_WINDOW_USEC
    assert bool(counted) == bool(reports)
