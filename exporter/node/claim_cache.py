"""Which ResourceClaims to read, and when: the decisions of the DRA claim reader, pure.

The reader (:class:`exporter.node.dra_source.DraWatcher`) keeps one :class:`Entry` per claim this
node's pods name and asks :func:`plan` each tick what to read. Reads are bounded by design:

- **a pod change** (a pod new to this node, or naming a claim it did not name before) reads that
  pod's new claims at once: at most the per-pod cap (``--dra-max-claims-per-pod``) a change, whatever
  the pods name; a claim another pod already named is read again, since its ``reservedFor`` grew;
- **steady state**: each claim is read again every ``resync_seconds`` (served from the API server's
  watch cache, ``resourceVersion=0``), at most ``steady_qps`` reads a second across all claims: with
  many claims the resync takes longer, the rate does not grow;
- **a missing claim** (404) is remembered as missing and read again after a backoff that doubles to
  ``missing_max``; nothing a pod names makes it be read sooner. An error keeps the last good object
  and backs off the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

from exporter.attribution.dra_objects import PodClaims
from exporter.node.rate_limit import Bucket, available, refill, spend

Key = tuple[str, str]  # (namespace, name)
_DNS = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # object names and namespaces, as the API validates


@dataclass(frozen=True, slots=True)
class Policy:
    """The reader's timings (seconds) and its steady-state budget (reads a second)."""

    resync_seconds: float = 600.0
    steady_qps: float = 0.5
    steady_burst: int = 5
    missing_initial: float = 30.0
    missing_max: float = 1800.0
    error_initial: float = 5.0
    error_max: float = 300.0


@dataclass(frozen=True, slots=True)
class Entry:
    """What is known of one claim: the last good object, whether the API said it is missing, and when to read it."""

    obj: Any = None
    missing: bool = False
    failures: int = 0  # consecutive misses or errors
    due: float = 0.0  # monotonic time of the next read


def pod_keys(pods: Mapping[str, PodClaims]) -> dict[str, frozenset[Key]]:
    """Each pod's claims by uid, as (namespace, name); names the API would refuse are never read."""
    return {uid: frozenset((pc.namespace, name) for name in pc.claims.values()
                           if _DNS.fullmatch(name) and _DNS.fullmatch(pc.namespace))
            for uid, pc in pods.items()}


def changed(before: Mapping[str, frozenset[Key]], now: Mapping[str, frozenset[Key]]) -> set[Key]:
    """The claims a pod names now and did not name before (every claim of a pod new to the node)."""
    return {k for uid, keys in now.items() for k in keys - before.get(uid, frozenset())}


def plan(entries: Mapping[Key, Entry], wanted: Set[Key], urgent: Set[Key], now: float,
         steady_allowance: int) -> tuple[list[Key], list[Key]]:
    """(read at once, read within the steady budget): the claims to read at ``now``.

    At once: the ``urgent`` claims (named by a pod change) that are not known to be missing with their
    backoff running. Within the budget: claims never read, then those due, earliest first, at most
    ``steady_allowance`` of them.
    """
    def backing_off(k: Key) -> bool:
        e = entries.get(k)
        return e is not None and e.failures > 0 and e.due > now

    now_reads = sorted(k for k in urgent & wanted if not backing_off(k))
    taken = set(now_reads)
    due = sorted((entries[k].due if k in entries else float("-inf"), k) for k in wanted
                 if k not in taken and (k not in entries or entries[k].due <= now))
    return now_reads, [k for _, k in due[:max(0, steady_allowance)]]


def _backoff(initial: float, maximum: float, failures: int) -> float:
    return min(maximum, initial * 2 ** min(max(failures - 1, 0), 30))


def after_read(prev: Entry | None, obj: Any, status: int | None, now: float, policy: Policy,
               jitter: float = 1.0) -> Entry:
    """The entry after one read: ``status`` None for an answer ``obj``, 404 for missing, else an error.

    ``jitter`` (about 0.8 to 1.2) scales the wait, so that claims read together are not due together.
    """
    if status is None:
        return Entry(obj, False, 0, now + policy.resync_seconds * jitter)
    failures = (prev.failures if prev is not None else 0) + 1
    if status == 404:
        wait = _backoff(policy.missing_initial, policy.missing_max, failures)
        return Entry(None, True, failures, now + wait * jitter)
    keep = prev if prev is not None else Entry()  # the API may be down: the last good answer stays
    wait = _backoff(policy.error_initial, policy.error_max, failures)
    return Entry(keep.obj, keep.missing, failures, now + wait * jitter)


MAX_NEGATIVE = 4096  # missing claims remembered after no pod names them: pods churned naming them read none


def prune(entries: Mapping[Key, Entry], wanted: Set[Key], now: float) -> dict[Key, Entry]:
    """The claims some pod still names, and the missing ones whose backoff runs (pod churn re-reads none)."""
    kept = {k: e for k, e in entries.items() if k in wanted}
    negative = sorted(((e.due, k) for k, e in entries.items() if k not in wanted and e.missing and e.due > now),
                      reverse=True)[:MAX_NEGATIVE]
    kept.update((k, entries[k]) for _, k in negative)
    return kept


@dataclass(frozen=True, slots=True)
class ReaderState:
    """The reader between ticks: each pod's claims last seen, what is known of each claim, the steady budget."""

    before: Mapping[str, frozenset[Key]]
    entries: Mapping[Key, Entry]
    wanted: frozenset[Key] = frozenset()
    steady: Bucket | None = None


START = ReaderState({}, {})


def step(state: ReaderState, pods: Mapping[str, PodClaims], now: float, policy: Policy
         ) -> tuple[ReaderState, list[tuple[Key, bool]]]:
    """One tick: the state with this tick's pods, and the reads to make, each with whether it must be
    consistent (a pod change: the claim as it is now) or may come from the server's cache (a resync)."""
    keys = pod_keys(pods)
    wanted = frozenset(k for ks in keys.values() for k in ks)
    entries = prune(state.entries, wanted, now)
    steady = refill(state.steady, now, policy.steady_qps, policy.steady_burst)
    at_once, later = plan(entries, wanted, changed(state.before, keys), now, available(steady))
    reads = [*((k, True) for k in at_once), *((k, False) for k in later)]
    return ReaderState(keys, entries, wanted, spend(steady, len(later))), reads


def record(state: ReaderState, key: Key, entry: Entry) -> ReaderState:
    """The state after one read's entry."""
    return ReaderState(state.before, {**state.entries, key: entry}, state.wanted, state.steady)


def published(entries: Mapping[Key, Entry], wanted: Set[Key]) -> tuple[Any, ...]:
    """The claim objects attribution reads: the known ones some pod names, in a stable order."""
    return tuple(entries[k].obj for k in sorted(wanted) if k in entries and entries[k].obj is not None)
