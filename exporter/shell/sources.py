"""Shell-side sources: the kubelet's pod-resources answers (state logged when it changes), the Xid watcher's."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable

from exporter.model import PodResources, XidSummary
from exporter.shell.logging_setup import StateLog
from exporter.xid.stats import XidStats, xid_summary

log = logging.getLogger("kube_gpu_exporter")


class PodResourcesSource:
    """The kubelet's pod-resources answer each cycle, or None; ``state`` says which, for the summary.

    A missing socket (the chart mounts it only when asked) is no trouble; an unreachable kubelet is,
    logged once per reason, and its recovery once.
    """

    def __init__(self, socket: str, timeout: float = 1.0) -> None:
        self.socket, self.timeout = socket, timeout
        self.state = "disabled (--pod-resources-socket '')" if not socket else "not asked yet"
        self.ok: bool | None = None  # None: not in use (disabled, no socket, not asked yet)
        self._log = StateLog(log)

    def __call__(self) -> tuple[PodResources, ...] | None:
        if not self.socket:
            return None
        from exporter.node.podresources import PodResourcesDecodeError, PodResourcesUnavailable, list_pod_resources

        if not os.path.exists(self.socket):
            self.state, self.ok = f"no socket at {self.socket}", None
            self._log.good("absent", "kubelet pod-resources: no socket at %s now, going on without it", self.socket)
            return None
        try:
            answer = list_pod_resources(self.socket, timeout=self.timeout)
        except PodResourcesUnavailable as e:
            self.state, self.ok = f"unavailable ({e})", False
            # Keyed without numbers: a changing detail (a port, a count) is not a new state.
            self._log.bad(re.sub(r"\d+", "#", str(e)), "kubelet pod-resources unavailable: %s", e)
            return None
        except PodResourcesDecodeError as e:  # the cycle keeps the last good answer (pipeline/source_guard.py)
            self.state, self.ok = f"undecodable answer ({e})", False
            raise
        self.state, self.ok = "ok", True
        self._log.good("ok", "kubelet pod-resources available again")
        return answer


class XidSource:
    """The Xid watcher's metric families (a Pipeline's extra families), its counts and the kernel log's state."""

    def __init__(self, families: Callable[[], list] = list, stats: Callable[[], XidStats] | None = None,
                 kernel_log: str = "off (--no-xid)") -> None:
        self.families, self.stats, self.kernel_log = families, stats, kernel_log

    def __call__(self) -> list:
        return self.families()

    def state(self) -> tuple[str, bool | None]:
        """The kernel log's state for the status page: ok when read, False when it cannot be, else None."""
        text = self.kernel_log
        return text, False if text.startswith("cannot read") else True if text.startswith("reading") else None

    def summary(self) -> XidSummary | None:
        """The counts a cycle's outputs read (status page, dcgm-compat); None when no watcher counts (--no-xid)."""
        return None if self.stats is None else xid_summary(self.stats())


def pod_resources_state(source: object) -> tuple[str, bool | None]:
    """The pod-resources source's state for the status page (a simulated node's answers are the scenario's)."""
    if isinstance(source, PodResourcesSource):
        return source.state, source.ok
    return "simulated (the scenario's answers)", None
