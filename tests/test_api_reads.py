"""The API reads of one node are bounded (issue 26, item 1): requests counted by the API double, not timed.

The daemon's own wiring (bench/api_reads.py ``after``) against pods naming many claims, half of them
missing: nothing but the budget in steady state, at most ``--dra-max-claims-per-pod`` reads per pod
change, and the one rate limit holding every caller whatever the pods name. The reader before the fix
(``before``) is the counter-check: it read every claim again at each pod change.
"""

from __future__ import annotations

import pytest

from bench.api_reads import measure

pytestmark = pytest.mark.e2e  # the API double is a server


def test_steady_state_and_pod_changes_read_a_bounded_number_of_claims():
    after = measure("after", pods=10, refs=32, steady_s=4.0, churn_s=3, qps=50.0, burst=10, cap=8, settle_s=60)
    assert after["start"]["requests"] <= 10 * 8 + 10  # each pod's 8 claims, the pod list and watch, Node, slices
    assert after["steady"]["requests_per_second"] <= 1.0
    assert after["churn"]["claim_reads_per_pod_change"] == 8  # 32 named, 8 followed: each read once
    assert after["churn"]["requests"] <= 8 * 3 + 3  # and nothing else but a watch renewed now and then
    before = measure("before", pods=4, refs=32, steady_s=0.0, churn_s=2, settle_s=60)
    assert before["churn"]["requests"] > 32 * 2  # every claim again at each pod change


def test_the_one_rate_limit_holds_whatever_the_pods_name():
    qps, burst, churn = 4.0, 4, 2
    run = measure("after", pods=1, refs=16, steady_s=0.0, churn_s=churn, qps=qps, burst=burst, cap=16, settle_s=60)
    assert run["start"]["requests"] >= 16  # 16 claims followed: the cap was not what bounded the churn below
    assert run["churn"]["claim_reads_per_pod_change"] == 16
    # two new pods want 32 reads in 2 s; the bucket lets burst + qps x seconds through (one at the edge)
    assert run["churn"]["requests"] <= burst + qps * churn + 1
