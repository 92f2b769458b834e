"""The per-node client rate limit of every Kubernetes API call: a token bucket, as client-go's QPS/burst.

client-go's default limiter (``flowcontrol.NewTokenBucketRateLimiter``, golang.org/x/time/rate) holds
``burst`` tokens, refills ``qps`` a second and makes each request wait for its token. :func:`reserve`
is that decision, pure: a request takes a token now, and the bucket may go into debt, so each waiter
is served in turn, ``1/qps`` apart, in the order it asked. :class:`RateLimiter` is the one shared
instance the daemon's :class:`~exporter.node.kube_api.KubeApi` holds: pods, the Node, DRA and Events
all wait in one queue, so no caller (and no pod author naming claims) can push the node past it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Bucket:
    """Tokens left (negative: owed to requests already promised a slot) at monotonic time ``last``."""

    tokens: float
    last: float


def refill(bucket: Bucket | None, now: float, qps: float, burst: int) -> Bucket:
    """The bucket at ``now``: full at first, ``qps`` tokens a second since ``last``, never above ``burst``."""
    if bucket is None:
        return Bucket(float(burst), now)
    elapsed = max(0.0, now - bucket.last)  # a clock read out of order adds nothing
    return Bucket(min(float(burst), bucket.tokens + elapsed * qps), max(now, bucket.last))


def reserve(bucket: Bucket | None, now: float, qps: float, burst: int) -> tuple[Bucket, float]:
    """Take one token at ``now``: the new bucket, and how long the request must wait before it is sent."""
    b = refill(bucket, now, qps, burst)
    tokens = b.tokens - 1.0
    return Bucket(tokens, b.last), (0.0 if tokens >= 0 else -tokens / qps)


def spend(bucket: Bucket, n: int) -> Bucket:
    """``n`` tokens taken from a refilled bucket (by a caller that never waits: see :func:`available`)."""
    return Bucket(bucket.tokens - n, bucket.last)


def available(bucket: Bucket) -> int:
    """Whole tokens a refilled bucket holds now (0 while in debt)."""
    return max(0, int(bucket.tokens))


class RateLimiter:
    """A thread-safe :func:`reserve` with the wait done outside the lock; ``close()`` ends every wait."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs qps > 0 and burst >= 1, got {qps}, {burst}")
        self.qps, self.burst, self._clock = qps, burst, clock
        self._bucket: Bucket | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.requests = 0  # requests let through
        self.waited_seconds = 0.0  # the time they waited for their token, summed

    def acquire(self) -> float:
        """Wait for this request's token; the seconds waited (0 after ``close()``: shutting down)."""
        with self._lock:
            self._bucket, wait = reserve(self._bucket, self._clock(), self.qps, self.burst)
            self.requests += 1
            self.waited_seconds += wait
        if wait > 0 and not self._closed.is_set():
            self._closed.wait(wait)
        return wait

    def close(self) -> None:
        self._closed.set()
