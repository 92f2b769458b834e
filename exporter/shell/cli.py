"""Command line: wires the configured sources into the pipeline and serves it.

``kube-gpu-exporter [flags]`` runs the exporter; the subcommands (config.SUBCOMMANDS) ``rules``,
``alerts`` and ``dashboards`` render the generated Prometheus rules, alerts and Grafana dashboards;
``kube-gpu-exporter render [flags]`` prints one exposition and exits.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from exporter.attribution.infrastructure import parse_namespaces
from exporter.exposition.pod_labels import parse_allowlist
from exporter.exposition.rows import LabelNames
from exporter.exposition.snapshot import empty_snapshot
from exporter.node.scenario_parse import ScenarioError
from exporter.pipeline.cycle import Pipeline, PodState, Settings, Sources
from exporter.pipeline.holder import SnapshotHolder
from exporter.pipeline.sampler import SamplerThread
from exporter.shell.config import SUBCOMMANDS, Config, ConfigError, bind_error, check_listen, load_config
from exporter.shell.logging_setup import configure_logging
from exporter.shell.sources import PodResourcesSource, XidSource, pod_resources_state
from exporter.shell.status import CycleMonitor, StuckWatch, stuck_after
from exporter.shell.summary import startup_summary
from exporter.xid.parse import catalog_entry

log = logging.getLogger("kube_gpu_exporter")
SWITCH_INTERVAL = 0.0001  # seconds; see _serve
FIRST_CYCLE_WAIT = 5.0  # seconds the listener waits for the first cycle (a scrape then has data) at most


@dataclass
class Daemon:
    """Everything one exporter process runs; ``close()`` stops it all."""

    config: Config
    node_name: str
    pipeline: Pipeline
    holder: SnapshotHolder
    sampler: SamplerThread
    closers: list[Callable[[], None]] = field(default_factory=list)
    # Started after the first sampling cycle, so they can already resolve GPUs and pods.
    late_starts: list[Callable[[], None]] = field(default_factory=list)
    monitor: CycleMonitor | None = None  # readiness and state logging after each cycle
    watch: StuckWatch | None = None  # logs a cycle that runs far too long (serving only)

    def start(self, wait_first: float | None = None) -> None:
        """First cycle synchronously (the first scrape has data), then the background threads.

        With ``wait_first`` (serving) the first cycle runs on the sampler thread, waited for that many
        seconds only: NVML's init is in it, and one that hangs must not keep the listener and /healthz down.
        """
        if wait_first is None:
            self.sampler.run_once()
            self._late_starts()
            self.sampler.start()
            return
        self.sampler.after_first = self._late_starts
        self.sampler.start()
        # For the late starts too (the Xid watcher, then the summary line), in the same bound: the banner
        # then follows the summary, whichever thread the scheduler runs first.
        if not self.sampler.settled.wait(wait_first):
            if not self.sampler.first_done.is_set():
                log.warning("NVML initialisation has not returned after %gs: listening now, /readyz answers 503 "
                            "(NVML initialising) until the first sampling cycle ends", wait_first)
            else:
                log.warning("the Xid watcher has not started after %gs: listening now", wait_first)
        self.watch = StuckWatch(self.sampler, stuck_after(self.config.interval))
        self.watch.start()
        self.closers.append(self.watch.stop)

    def _late_starts(self) -> None:
        for start in self.late_starts:
            start()

    def close(self) -> None:
        self.sampler.stop()
        for close in reversed(self.closers):
            try:
                close()
            except Exception:  # shutting down: report, keep closing the rest
                log.exception("error while shutting down")


def _static_pods(objs: Sequence[Mapping]) -> Callable[[], PodState]:
    from exporter.node.pod_store import PodStore

    store = PodStore()
    store.replace(list(objs), "1")
    view = store.view()
    skips = dict(store.skips())
    # A scenario's pods never go stale: the cache is current at every cycle.
    return lambda: PodState(view=view, synced=True, last_sync=time.time(), sync_errors=0, skips=skips)


def _empty_pods() -> Callable[[], PodState]:
    from exporter.node.pod_store import PodStore

    view = PodStore().view()
    return lambda: PodState(view=view, synced=False, last_sync=None)


def build_daemon(cfg: Config) -> Daemon:
    """Construct (but do not start) the exporter for this configuration."""
    names = LabelNames(cfg.pod_label, cfg.namespace_label, cfg.container_label)
    closers: list[Callable[[], None]] = []
    api_client = None
    if cfg.simulate:
        from exporter.node.simulate import ScenarioProc, SimulatedBackend, load_scenario

        scenario = load_scenario(cfg.simulate)
        node = cfg.node_name or scenario.node or os.uname().nodename
        backend = SimulatedBackend(scenario, nvlink=cfg.nvlink_metrics)
        proc = ScenarioProc(scenario)
        pods = _static_pods(scenario.pods)
        labels, capacity = dict(scenario.node_labels), dict(scenario.node_capacity)

        def node_labels() -> Mapping[str, str]:
            return labels

        def node_capacity() -> Mapping[str, str]:
            return capacity

        def pod_resources(pr=scenario.pod_resources):
            return pr
        if cfg.kube_api_url:  # Events only
            from exporter.node.kube_api import KubeConfigError, build_api_client
            try:
                api_client = _limited(cfg, build_api_client(cfg.kube_api_url, None))
            except KubeConfigError as e:
                raise ConfigError(f"--kube-api-url: {e}") from None
    else:
        from exporter.node.nvml.backend import NvmlBackend
        from exporter.node.procfs import ProcReader

        node = cfg.node_name or os.environ.get("NODE_NAME") or os.uname().nodename
        backend = NvmlBackend(nvlink=cfg.nvlink_metrics)
        closers.append(backend.close)
        proc = ProcReader(Path(cfg.host_proc))
        pods, node_object, api_client = _cluster_sources(cfg, node, closers)
        node_labels = node_object.labels if node_object else dict
        node_capacity = node_object.capacity if node_object else dict
        pod_resources = _pod_resources_source(cfg.pod_resources_socket)

    holder = SnapshotHolder(empty_snapshot(0.0))
    late_starts: list[Callable[[], None]] = []
    xid_families = _xid(cfg, node, names, holder, api_client, closers, late_starts)
    from exporter.node.dra_source import NO_DRA, static_dra
    # DRA: the scenario's objects, or what _cluster_sources hung on its pods source (none with --no-pod-watch)
    dra = (static_dra(scenario.resource_slices, scenario.resource_claims, scenario.pods) if cfg.simulate
           else getattr(pods, "dra", NO_DRA))
    sources = Sources(backend, proc, pods, node_labels, node_capacity, pod_resources,
                      dra.resource_slices, dra.resource_claims, dra.pod_claims, xid_families, xid_families.summary,
                      proc.comms, lambda: {"pod_resources": pod_resources_state(pod_resources),
                                           "kernel_log": xid_families.state()})
    pipeline = Pipeline(sources, Settings(node, names, cfg.per_process_metrics, dcgm_compat=cfg.dcgm_compat,
                                          pod_labels=parse_allowlist(cfg.pod_labels_allowlist),  # validated
                                          xid_catalog=catalog_entry,
                                          infrastructure_namespaces=parse_namespaces(cfg.infrastructure_namespaces)))
    monitor = CycleMonitor(pipeline, ready_without_nvml=cfg.ready_without_nvml,
                           pod_watch=cfg.pod_watch and not cfg.simulate, xid_stats=xid_families.stats)
    # After the Xid watcher's start: the summary tells whether it reads the kernel log.
    late_starts.append(lambda: log.info("%s", startup_summary(cfg, node, pipeline, xid_families.kernel_log)))
    sampler = SamplerThread(pipeline, holder, cfg.interval, on_cycle=monitor)
    return Daemon(cfg, node, pipeline, holder, sampler, closers, late_starts, monitor)


def _cluster_sources(cfg: Config, node: str, closers: list):
    """Pods and the Node object from the API (or nothing, with --no-pod-watch)."""
    if not cfg.pod_watch:
        return _empty_pods(), None, None
    from exporter.node.kube_api import KubeConfigError, build_api_client
    from exporter.node.node_object import NodeObject
    from exporter.node.pod_watcher import PodWatcher

    try:
        api_client = _limited(cfg, build_api_client(cfg.kube_api_url, cfg.kubeconfig))
    except KubeConfigError as e:
        # A startup mistake, not a transient fault: say what to do instead of a traceback.
        where = f"--kubeconfig {cfg.kubeconfig}: " if cfg.kubeconfig else ""
        detail = " ".join(str(e).split()) or type(e).__name__
        raise ConfigError(f"{where}{detail} (or --no-pod-watch to run without pods)") from None
    from exporter.node.dra_source import ClaimAwarePodStore, DraWatcher

    store = ClaimAwarePodStore(cfg.dra_max_claims_per_pod)  # keeps the pods' DRA claim references as well
    watcher = PodWatcher(node, api_client, store=store)
    watcher.start()
    closers.append(watcher.stop)
    dra_watcher = DraWatcher(node, api_client, store.pod_claims)
    dra_watcher.start()
    closers.append(dra_watcher.stop)

    def pods() -> PodState:
        s = watcher.stats()
        return PodState(watcher.view(), s.synced, s.last_sync_timestamp, s.sync_errors, s.skips)

    pods.dra = dra_watcher.sources()  # type: ignore[attr-defined]  # read where the Pipeline is built

    node_object = NodeObject(node, api_client)
    node_object.start()
    closers.append(node_object.stop)
    closers.append(api_client.limiter.close)  # run first (closers run in reverse): no stop waits for a token
    return pods, node_object, api_client


def _limited(cfg: Config, api_client):
    """The one API client of the process, behind the one rate limit every caller shares (--kube-api-qps)."""
    from exporter.node.rate_limit import RateLimiter

    api_client.limiter = RateLimiter(cfg.kube_api_qps, cfg.kube_api_burst)
    return api_client


def _pod_resources_source(socket: str) -> PodResourcesSource:
    """kubelet pod-resources answers, when the socket exists; None otherwise."""
    return PodResourcesSource(socket)


def _xid(cfg: Config, node: str, names: LabelNames, holder: SnapshotHolder, api_client,
         closers: list, late_starts: list) -> XidSource:
    """Start the Xid watcher when configured; return its metric families source."""
    if not cfg.xid:
        return XidSource()
    if cfg.kmsg_path == "none":
        kmsg_path = None  # deliberately no kernel log: an unprivileged pod takes Xids from NVML events
        if cfg.xid and cfg.xid_nvml_events and not cfg.simulate:
            log.info("no kernel log (--kmsg-path none): Xids from NVML events only, without pods")
    else:
        kmsg_path = cfg.kmsg_path or (None if cfg.simulate else "/dev/kmsg")
    # NVML events need the real library: a simulated node has none (its scenario's xid_events feed
    # only the fake libnvidia-ml.so.1 of the tests), so the second source is off under --simulate.
    nvml_events = cfg.xid_nvml_events and not cfg.simulate
    if kmsg_path is None and not nvml_events:
        return XidSource(kernel_log="none")
    from exporter.xid.parse import gpu_for_xid
    from exporter.xid.stats import xid_metric_families
    from exporter.xid.watcher import XidWatcher

    def resolve_bus_id(bus: str, gpu_instance: int | None):
        return gpu_for_xid(holder.get().devices, bus, gpu_instance)

    def resolve_pid(pid: int):
        return holder.get().pid_owners.get(pid)

    sink = None
    if cfg.events and api_client is not None:
        from exporter.xid.events_writer import EventsWriter
        sink = EventsWriter(api_client)
        sink.start()
        closers.append(sink.stop)
    nvml_source = None
    if nvml_events:
        from exporter.xid.nvml_events import NvmlXidSource
        nvml_source = NvmlXidSource()  # the watcher's default clock (time.time) stamps both sources
    from exporter.xid.events import PlannerConfig
    events = PlannerConfig(namespace=cfg.xid_events_namespace, regarding=cfg.xid_events_regarding)
    watcher = XidWatcher(kmsg_path, node, resolve_bus_id, resolve_pid, sink,
                         replay_from_start=cfg.kmsg_replay, lookback_seconds=cfg.xid_lookback,
                         nvml_source=nvml_source, event_config=events)

    def start() -> None:
        try:
            watcher.start()  # without kmsg access it goes on with NVML events, when enabled
        except OSError as e:
            # e.g. no CAP_SYSLOG with kernel.dmesg_restrict=1: GPU metrics matter more than Xids.
            log.error("Xid watcher disabled: cannot read %s: %s", kmsg_path, e)
            source.kernel_log = f"cannot read {kmsg_path}: Xid watcher disabled"
            return
        closers.append(watcher.stop)
        if kmsg_path is None:
            source.kernel_log = "none (--kmsg-path none): Xids from NVML events only, without pods"
        elif watcher.stats().skips.get("read_error"):
            source.kernel_log = f"cannot read {kmsg_path}: Xids from NVML events only"
        else:
            source.kernel_log = f"reading {kmsg_path}"

    late_starts.append(start)
    source = XidSource(lambda: xid_metric_families(watcher.stats(), node, names.pod, names.namespace,
                                                   names.container), watcher.stats, "not started")
    return source


def say(line: str, stream: TextIO) -> None:
    """Write one line in one write and flush it.

    print() writes the text and its newline separately; with PYTHONUNBUFFERED (the image sets it) each is
    a system call of its own, and a log line from the sampler's thread can land between them, on the
    same file (a CI run read a JSON log with the banner glued to one object and an empty line after)."""
    stream.write(line + "\n")
    stream.flush()


def _serve(daemon: Daemon) -> int:
    from exporter.server.app import BindError, HttpServer, make_app, run
    from exporter.server.limits import ServerLimits, raise_nofile_limit
    from exporter.server.stats import HttpStats
    from exporter.server.web_config import WebConfigError, load_web_config

    try:  # checked by load_config already; read again here for the certificates as they are now
        web = load_web_config(daemon.config.web_config_file) if daemon.config.web_config_file else None
    except WebConfigError as e:
        say(f"kube-gpu-exporter: error: {' '.join(str(e).split())}", sys.stderr)
        daemon.close()
        return 2
    # The sampler's cycle is pure Python on its own thread: a scrape arriving meanwhile waits for the
    # GIL after each of its system calls, up to the switch interval each time (5 ms by default, times
    # the scrapes queued). A short one keeps scrapes near an idle server's latency; the cost is a few
    # microseconds per switch, paid only while both threads want to run (bench/README.md, footprint).
    sys.setswitchinterval(SWITCH_INTERVAL)
    # Containers often start with a soft limit of 1024: lift it, then cap connections well under it.
    limits = ServerLimits().fitted(raise_nofile_limit())
    host, port = daemon.config.host_port
    daemon.start(wait_first=FIRST_CYCLE_WAIT)
    stats = HttpStats()
    app = make_app(daemon.holder, stale_after=max(60.0, 20 * daemon.config.interval), stats=stats,
                   not_ready=daemon.monitor.not_ready_reason if daemon.monitor else None,
                   starting=daemon.sampler.starting)
    # One access-log line per scrape is noise in production; keep it for --log-level debug.
    access_log = log if daemon.config.log_level.lower() == "debug" else None
    server = HttpServer(app, host, port, limits, stats, access_log=access_log, web_config=web)
    scheme = "https" if server.tls is not None else "http"

    def serving() -> None:  # only once the socket listens
        shown = f"[{host}]" if ":" in host else host
        auth = ", basic authentication" if server.auth is not None else ""
        say(f"kube-gpu-exporter: node {daemon.node_name}, serving {scheme}://{shown}:{server.port}/metrics{auth}",
            sys.stdout)

    try:
        run(server, on_started=serving)
    except BindError as e:  # the port was taken since the pre-flight check
        say(f"kube-gpu-exporter: error: {bind_error(daemon.config.listen, e.host, e.port, e.error)}", sys.stderr)
        return 2
    finally:
        daemon.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (``--help`` and ``--version`` exit through SystemExit)."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args and args[0] in SUBCOMMANDS else None
    if command is not None and (module := SUBCOMMANDS[command][0]) is not None:
        return importlib.import_module(module).main(args[1:])
    render_once = command == "render"
    try:
        cfg = load_config(args[1:] if render_once else args, command=command)
        configure_logging(cfg.log_level, cfg.log_format)
        if render_once:
            cfg = replace(cfg, xid=False, pod_watch=False if not cfg.simulate else cfg.pod_watch)
        else:
            # Before build_daemon: it starts the pod and Node watchers, and the server binds only later.
            check_listen(cfg.listen)
        daemon = build_daemon(cfg)
    except (ConfigError, ScenarioError) as e:
        # One line whatever the message holds (a YAML error, a client's multi-line exception text).
        say(f"kube-gpu-exporter: error: {' '.join(str(e).split())}", sys.stderr)
        return 2
    if render_once:
        try:
            snapshot, _ = daemon.pipeline.step()
            sys.stdout.buffer.write(snapshot.body)
        finally:
            daemon.close()
        return 0
    return _serve(daemon)


if __name__ == "__main__":
    raise SystemExit(main())
