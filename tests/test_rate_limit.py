"""The shared client rate limit (exporter/node/rate_limit.py): client-go's token bucket, pure, and its thin lock.

The property: whatever the times requests are asked for, the times they are sent (asked + waited) never put
more than ``burst + qps * T`` requests in any window of T seconds, they are sent in the order asked, and
nobody waits while the bucket has a token.
"""

from __future__ import annotations

import itertools
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.node.kube_api import ApiException, KubeApi
from exporter.node.rate_limit import Bucket, RateLimiter, available, refill, reserve, spend
from tests.k8s_double import ApiServerDouble


def sent_times(asks: list[float], qps: float, burst: int) -> list[float]:
    bucket, out = None, []
    for t in asks:
        bucket, wait = reserve(bucket, t, qps, burst)
        out.append(t + wait)
    return out


@settings(max_examples=300, deadline=None)
@given(gaps=st.lists(st.floats(0, 3, allow_nan=False), min_size=1, max_size=80),
       qps=st.floats(0.1, 50, allow_nan=False), burst=st.integers(1, 20))
def test_no_window_gets_more_than_burst_plus_qps_times_its_length(gaps, qps, burst):
    asks, t = [], 100.0
    for g in gaps:
        t += g
        asks.append(t)
    sent = sent_times(asks, qps, burst)
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(sent))  # in the order asked
    assert all(s >= a for s, a in zip(sent, asks, strict=True))
    for i, start in enumerate(sent):  # every window starting at a send
        for j in range(i, len(sent)):
            assert j - i + 1 <= burst + qps * (sent[j] - start) + 1e-6


def test_a_full_bucket_lets_burst_through_then_one_per_interval():
    sent = sent_times([0.0] * 13, qps=5, burst=10)
    assert sent[:10] == [0.0] * 10
    assert sent[10:] == pytest.approx([0.2, 0.4, 0.6])
    spaced = sent_times([i * 0.2 for i in range(50)], qps=5, burst=1)  # asked at the rate: never waits
    assert spaced == pytest.approx([i * 0.2 for i in range(50)])


def test_refill_is_capped_and_ignores_a_clock_going_back():
    b = refill(Bucket(-3.0, 10.0), 1000.0, 5, 10)
    assert b.tokens == 10.0 and b.last == 1000.0
    assert refill(Bucket(2.0, 10.0), 9.0, 5, 10) == Bucket(2.0, 10.0)
    b = refill(None, 0.0, 1, 4)
    assert available(b) == 4 and available(spend(b, 4)) == 0 and available(Bucket(-2.0, 0.0)) == 0


def test_the_limiter_spaces_concurrent_callers_and_close_ends_the_waits():
    now = [0.0]
    limiter = RateLimiter(2.0, 2, clock=lambda: now[0])
    waits = [limiter.acquire() for _ in range(4)]
    assert waits == [0.0, 0.0, 0.5, 1.0] and limiter.requests == 4
    limiter.close()  # shutting down: nobody sleeps for a token
    done = threading.Event()
    threading.Thread(target=lambda: (limiter.acquire(), done.set()), daemon=True).start()
    assert done.wait(5)
    with pytest.raises(ValueError):
        RateLimiter(0, 1)


@pytest.mark.e2e
def test_every_request_and_watch_of_the_client_takes_a_token():
    with ApiServerDouble() as api:
        limiter = RateLimiter(1000.0, 1000)
        kube = KubeApi(api.url, limiter=limiter)
        kube.get("/api/v1/pods")
        kube.watch("/api/v1/pods", {"timeoutSeconds": 1}).close()
        with pytest.raises(ApiException):
            kube.get("/api/v1/nodes/missing")
        assert limiter.requests == 3 == len(api.requests)
