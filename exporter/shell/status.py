"""What the exporter sees, cycle by cycle: readiness while NVML is down, and state changes logged once.

:class:`CycleMonitor` runs after every sampling cycle (the sampler thread's ``on_cycle``). It logs
NVML going down (an error naming the likely fix) and coming back, a GPU lost and answering again,
the pod watch losing and regaining its sync, Events failing and working again, and each new Xid
(warning, rate-limited);
``/readyz`` asks it :meth:`CycleMonitor.not_ready_reason`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from exporter.model import DeviceSample
from exporter.pipeline.cycle import Pipeline
from exporter.pipeline.sampler import SamplerThread
from exporter.shell.logging_setup import StateLog
from exporter.xid.stats import XidCountKey, XidStats

log = logging.getLogger("kube_gpu_exporter")

# The calls whose failure leaves NVML uninitialised (exporter/node/nvml/backend.py).
INIT_CALLS = ("nvmlInit", "nvmlDeviceGetCount")
_DEFAULT_FIX = ("check that the pod runs with runtimeClassName: nvidia (or the NVIDIA container runtime as the "
                "default), NVIDIA_VISIBLE_DEVICES=all, and the driver's libraries and /dev/nvidia* mounted")
FIXES: Mapping[str, str] = {
    "LibraryNotFound": "libnvidia-ml.so.1 is not in the container: run the pod with runtimeClassName: nvidia "
                       "and NVIDIA_VISIBLE_DEVICES=all, or mount the host's driver libraries",
    "DriverNotLoaded": "no NVIDIA driver is reachable: check the driver on the node (nvidia-smi), "
                       "runtimeClassName: nvidia and NVIDIA_VISIBLE_DEVICES=all",
    "LibRmVersionMismatch": "the container's libnvidia-ml does not match the loaded kernel driver (an upgrade "
                            "without reboot, or a library baked into the image): mount the host's driver "
                            "(runtimeClassName: nvidia) or reboot the node",
    "NoPermission": "no access to /dev/nvidia*: run with runtimeClassName: nvidia and NVIDIA_VISIBLE_DEVICES=all",
}
XID_REPORT_INTERVAL = 60.0  # seconds: at most one warning per GPU and Xid in this long
STUCK_AFTER_MIN = 10.0  # seconds a cycle may run before it is called stuck, at the least
XID_LINES_PER_CYCLE = 10


def likely_fix(error: str) -> str:
    """The fix to suggest for an NVML init error name such as ``NVMLError_LibraryNotFound``."""
    short = error.removeprefix("NVMLError_")
    return FIXES.get(short, _DEFAULT_FIX)


def gpu_words(uuid: str, minor: int | None, gpu_instance: int | None) -> str:
    """How a log line names a GPU: its UUID, then its minor number and MIG GPU instance when known."""
    known = [f"minor {minor}"] if minor is not None else []
    known += [f"GPU instance {gpu_instance}"] if gpu_instance is not None else []
    return f"GPU {uuid or 'unknown'}" + (f" ({', '.join(known)})" if known else "")


def lost_changes(was_lost: Mapping[str, str],
                 devices: Iterable[DeviceSample]) -> tuple[dict[str, str], list[str], list[str]]:
    """GPUs lost now (card uuid -> how a log line names it), and those newly lost and recovered since ``was_lost``.

    A card in MIG mode is one GPU however many of its MIG devices report it lost (they all do).
    """
    now: dict[str, str] = {}
    for d in devices:
        if d.lost:
            card = d.parent_uuid or d.uuid
            now.setdefault(card, gpu_words(card, d.minor_number, None))
    return now, [w for c, w in now.items() if c not in was_lost], [w for c, w in was_lost.items() if c not in now]


class XidLog:
    """Logs new Xids from the watcher's counts at warning level, at most once a minute per GPU and Xid."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, interval: float = XID_REPORT_INTERVAL) -> None:
        self._clock, self._interval = clock, interval
        self._seen: dict[XidCountKey, int] = {}
        self._next: dict[tuple[str, int], float] = {}  # (uuid, xid) -> when the next line may be logged
        self._held: dict[tuple[str, int], int] = {}  # Xids counted but not yet logged

    def update(self, counts: Mapping[XidCountKey, int],
               gpu_instances: Mapping[tuple[str, int | None, int], int | None] | None = None) -> None:
        """Log the Xids counted since the last call; ``gpu_instances``: the MIG GPU instance each named last."""
        from exporter.xid.parse import lookup

        now, lines = self._clock(), 0
        for key, count in counts.items():
            new = count - self._seen.get(key, 0)
            self._seen[key] = count
            if new <= 0:
                continue
            uuid, minor, xid, namespace, pod, container = key
            series = (uuid, xid)
            held = self._held.pop(series, 0) + new
            if now < self._next.get(series, float("-inf")) or lines >= XID_LINES_PER_CYCLE:
                self._held[series] = held
                continue
            lines += 1
            self._next[series] = now + self._interval
            where = gpu_words(uuid, minor, (gpu_instances or {}).get((uuid, minor, xid)))
            who = f" (pod {namespace}/{pod}, container {container or '-'})" if pod else ""
            info = lookup(xid)
            log.warning("Xid %d on %s%s: %d new since the last report; %s (%s)", xid, where, who, held,
                        info.meaning, info.action)


class CycleMonitor:
    """Called after each cycle; see the module docstring."""

    def __init__(self, pipeline: Pipeline, *, ready_without_nvml: bool = False, pod_watch: bool = True,
                 xid_stats: Callable[[], XidStats] | None = None) -> None:
        self.pipeline = pipeline
        self.ready_without_nvml = ready_without_nvml
        self.pod_watch = pod_watch
        self.xid_stats = xid_stats
        self.nvml = StateLog(log)
        self.pods = StateLog(log)
        self.pods.state, self.pods.healthy = "syncing", False  # the first sync is news too
        self.events = StateLog(log)
        self.xids = XidLog()
        self._init_errors: dict[tuple[str, str], int] = {}
        self._nvml_reason: str | None = None
        self._events_seen = (0, 0)
        self._lost: dict[str, str] = {}  # card uuid -> its name in log lines, while NVML says it is lost

    def __call__(self) -> None:
        sample = self.pipeline.last_sample
        if sample is not None:
            self._check_nvml(sample.nvml_up, sample.errors)
            if sample.nvml_up:  # NVML down says nothing about each GPU
                self._check_lost(sample.devices)
        if self.pod_watch:
            self._check_pods()
        if self.xid_stats is not None:
            stats = self.xid_stats()
            self.xids.update(stats.xid_counts, stats.gpu_instances)
            self._check_events(stats)

    def not_ready_reason(self) -> str | None:
        """Why ``/readyz`` fails now beyond "no snapshot yet"; None when ready."""
        if self._nvml_reason is None or self.ready_without_nvml:
            return None
        return self._nvml_reason

    def _check_nvml(self, up: bool, errors: Mapping[tuple[str, str], int]) -> None:
        if up:
            self._nvml_reason = None
            self.nvml.good("up", "NVML initialised again: GPU metrics are back")
            return
        fix = _DEFAULT_FIX
        for key, n in errors.items():
            if key[0] in INIT_CALLS and n > self._init_errors.get(key, 0):
                self._init_errors[key] = n
                self._nvml_reason, fix = f"NVML cannot initialise ({key[0]}: {key[1]})", likely_fix(key[1])
        if self._nvml_reason is None:
            self._nvml_reason = "NVML is not initialised"
        readiness = "" if self.ready_without_nvml else (
            " (/readyz fails meanwhile; --ready-without-nvml where a node without NVML is expected)")
        self.nvml.bad(self._nvml_reason, "%s: no GPU metrics until it does, retrying with backoff%s. Likely fix: %s",
                      self._nvml_reason, readiness, fix, level=logging.ERROR)

    def _check_lost(self, devices: Iterable[DeviceSample]) -> None:
        self._lost, lost, recovered = lost_changes(self._lost, devices)
        for gpu in lost:
            log.error("%s lost (NVML: GPU is lost): no values for it until it answers again, re-probed with backoff; "
                      "a lost GPU usually needs a reset or a node reboot", gpu)
        for gpu in recovered:
            log.info("%s answers again: its values are back", gpu)

    def _check_pods(self) -> None:
        try:
            state = self.pipeline.sources.pods()
        except Exception:  # the cycle's SourceGuard counts and logs a raising source, once per change
            return
        if state.synced:
            first = self.pods.state == "syncing"
            self.pods.good("synced", "pod watch %s: %d pods on this node", "synced" if first else "synced again",
                           len(state.view.pods))
        elif self.pods.state != "syncing":
            self.pods.bad("failing", "pod watch lost its sync with the API (%d errors so far): rows keep the last "
                          "pod view until it is back", state.sync_errors)

    def _check_events(self, stats: XidStats) -> None:
        written = stats.events_posted + stats.events_patched
        seen_written, seen_failed = self._events_seen
        if stats.events_failed > seen_failed and written == seen_written:
            self.events.bad("failing", "Kubernetes Events for Xids are not being written (%d failed so far); "
                            "check the Role for events.k8s.io create/patch", stats.events_failed)
        elif written > seen_written:
            self.events.good("ok", "Kubernetes Events for Xids are written again")
        self._events_seen = (written, stats.events_failed)


def stuck_after(interval: float) -> float:
    """How long a cycle may run before the sampler is called stuck: 5 intervals, 10 s at the least."""
    return max(STUCK_AFTER_MIN, 5 * interval)


def stuck_transition(running_for: float | None, threshold: float, stuck: bool) -> str | None:
    """What to log: "stuck" when the cycle running for ``running_for`` s (None: none runs) passed the
    threshold, "unstuck" when a stuck one ended, None when nothing changed."""
    if running_for is not None and running_for > threshold:
        return None if stuck else "stuck"
    return "unstuck" if stuck and running_for is None else None


class StuckWatch:
    """Its own thread: logs once when a sampling cycle runs past ``threshold`` and once when it ends.

    Scrapes meanwhile serve the last snapshot and /healthz fails only later (no cycle ended for its
    ``stale_after``), so without this line a hung NVML call is silent until the kubelet restarts the pod.
    """

    def __init__(self, sampler: SamplerThread, threshold: float, every: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sampler, self.threshold, self.every, self._clock = sampler, threshold, every, clock
        self.stuck_since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler-watch", daemon=True)

    def check(self) -> None:
        """One look at the sampler (the thread's step; tests call it)."""
        started = self.sampler.cycle_started
        if self.stuck_since is not None and started != self.stuck_since:
            started = None  # the stuck cycle ended (another may have begun since)
        running_for = None if started is None else self._clock() - started
        change = stuck_transition(running_for, self.threshold, self.stuck_since is not None)
        if change == "stuck" and started is not None:
            self.stuck_since = started
            log.error("sampling cycle running for %.0fs (more than %gs): stuck, most likely in an NVML call; scrapes "
                      "serve the last snapshot, /healthz fails once no cycle has ended for a while",
                      running_for or 0.0, self.threshold)
        elif change == "unstuck" and self.stuck_since is not None:
            log.info("the stuck sampling cycle ended after about %.0fs: sampling again",
                     self._clock() - self.stuck_since)
            self.stuck_since = None

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.check()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
