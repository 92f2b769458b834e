"""The DRA claim reader's decisions (exporter/node/claim_cache.py): unit and property tests, no I/O.

The property drives :func:`step` tick by tick through arbitrary pod churn over claims that exist or do
not, answering each read as the API would, and checks the bounds the design promises: reads at once
only for claims a pod change named (so at most the per-pod cap a change), everything else within the
steady budget, a missing claim never read again before its backoff ends, and a claim named by a new
pod published by the end of that tick.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.attribution.dra_objects import PodClaims
from exporter.node.claim_cache import (
    MAX_NEGATIVE,
    START,
    Entry,
    Policy,
    after_read,
    changed,
    plan,
    pod_keys,
    prune,
    published,
    record,
    step,
)

POLICY = Policy(resync_seconds=60.0, steady_qps=0.5, steady_burst=3, missing_initial=10.0, missing_max=80.0,
                error_initial=2.0, error_max=20.0)


def pc(uid: str, *names: str, ns: str = "ml") -> PodClaims:
    return PodClaims(uid, ns, {f"c{i}": n for i, n in enumerate(names)})


def test_pod_keys_drop_names_the_api_would_refuse_and_changed_sees_only_new_names():
    keys = pod_keys({"a": pc("a", "x", "", "Bad_Name", "y"), "b": pc("b", "x", ns="-no")})
    assert keys == {"a": frozenset({("ml", "x"), ("ml", "y")}), "b": frozenset()}
    before = {"a": frozenset({("ml", "x")})}
    assert changed(before, keys) == {("ml", "y")}
    assert changed(keys, {"c": frozenset({("ml", "x")})}) == {("ml", "x")}  # a new pod: its claims, even known ones
    assert changed(keys, keys) == set()


def test_plan_reads_changes_at_once_and_the_rest_within_the_budget():
    entries = {("ml", "fresh"): Entry({"k": 1}, due=100.0), ("ml", "due"): Entry({"k": 2}, due=5.0),
               ("ml", "gone"): Entry(None, True, 1, due=50.0), ("ml", "late"): Entry({}, due=7.0)}
    wanted = {*entries, ("ml", "new")}
    at_once, later = plan(entries, wanted, {("ml", "fresh"), ("ml", "gone")}, 10.0, 2)
    assert at_once == [("ml", "fresh")]  # the missing one's backoff runs: a pod naming it reads nothing
    assert later == [("ml", "new"), ("ml", "due")]  # never read first, then the earliest due
    assert plan(entries, wanted, set(), 10.0, 0) == ([], [])


def test_after_read_resyncs_answers_backs_off_misses_and_keeps_the_last_good_object_on_errors():
    ok = after_read(None, {"o": 1}, None, 0.0, POLICY)
    assert ok == Entry({"o": 1}, False, 0, 60.0)
    err = after_read(ok, None, 500, 1.0, POLICY)
    assert err.obj == {"o": 1} and err.failures == 1 and err.due == 3.0
    misses = [None]
    for _ in range(6):
        misses.append(after_read(misses[-1], None, 404, 0.0, POLICY))
    assert [m.due for m in misses[1:]] == [10.0, 20.0, 40.0, 80.0, 80.0, 80.0]
    assert all(m.obj is None and m.missing for m in misses[1:])
    assert after_read(misses[-1], {"o": 2}, None, 0.0, POLICY).failures == 0


@settings(max_examples=200, deadline=None)
@given(outcomes=st.lists(st.sampled_from([None, 404, 500, 0]), max_size=30), jitter=st.floats(0.8, 1.2))
def test_backoff_doubles_to_its_cap_and_an_answer_ends_it(outcomes, jitter):
    entry, now = None, 0.0
    for status in outcomes:
        prev = entry
        entry = after_read(prev, {"o": now} if status is None else None, status, now, POLICY, jitter)
        wait = entry.due - now
        if status is None:
            assert entry.failures == 0 and abs(wait - POLICY.resync_seconds * jitter) < 1e-6
        else:
            low, high = ((POLICY.missing_initial, POLICY.missing_max) if status == 404
                         else (POLICY.error_initial, POLICY.error_max))
            assert entry.failures == (prev.failures if prev else 0) + 1
            assert low * jitter <= wait + 1e-6 and wait <= high * jitter + 1e-6
            assert entry.missing == (status == 404 or (prev is not None and prev.missing))
            if status != 404 and prev is not None:
                assert entry.obj == prev.obj  # an error keeps the last good object
        now = entry.due


def test_prune_keeps_what_pods_name_and_the_missing_whose_backoff_runs():
    entries = {("ml", "a"): Entry({}, due=1.0), ("ml", "gone"): Entry(None, True, 2, due=30.0),
               ("ml", "old"): Entry(None, True, 1, due=5.0), ("ml", "b"): Entry({}, due=99.0)}
    assert set(prune(entries, {("ml", "a")}, 10.0)) == {("ml", "a"), ("ml", "gone")}
    many = {("ml", f"m{i}"): Entry(None, True, 1, due=100.0 + i) for i in range(MAX_NEGATIVE + 10)}
    assert len(prune(many, set(), 0.0)) == MAX_NEGATIVE
    assert published(entries, {("ml", "b"), ("ml", "gone"), ("ml", "nope")}) == ({},)


EXISTING = [f"real-{i}" for i in range(6)]
MISSING = [f"ghost-{i}" for i in range(6)]
_event = st.one_of(
    st.tuples(st.just("add"), st.lists(st.sampled_from(EXISTING + MISSING), max_size=8)),
    st.tuples(st.just("delete"), st.integers(0, 20)),
    st.tuples(st.just("rename"), st.integers(0, 20), st.sampled_from(EXISTING + MISSING)),
    st.tuples(st.just("idle"), st.integers(1, 60)),
)


@settings(max_examples=150, deadline=None)
@given(events=st.lists(_event, max_size=40))
def test_reads_stay_bounded_whatever_the_pods_name(events):
    pods: dict[str, PodClaims] = {}
    state, now, n = START, 0.0, 0
    reads_at_once = reads_later = changed_claims = 0
    last_miss_read: dict[str, float] = {}
    ticks = []  # one per second: the events of each tick happen before it
    for e in events:
        ticks.extend([("idle",)] * (e[1] - 1) if e[0] == "idle" else [])
        ticks.append(e)
    for e in ticks:
        if e[0] == "add":
            n += 1
            pods[f"p{n}"] = pc(f"p{n}", *e[1])
        elif e[0] == "delete" and pods:
            pods.pop(sorted(pods)[e[1] % len(pods)])
        elif e[0] == "rename" and pods:
            uid = sorted(pods)[e[1] % len(pods)]
            pods[uid] = pc(uid, *pods[uid].claims.values(), e[2])
        now += 1.0
        new_claims = changed(state.before, pod_keys(pods))
        changed_claims += len(new_claims)
        state, reads = step(state, pods, now, POLICY)
        for key, consistent in reads:
            assert not consistent or key in new_claims  # a read at once is a pod change's
            reads_at_once += consistent
            reads_later += not consistent
            if key[1] in MISSING:
                assert now - last_miss_read.get(key[1], -1e9) >= POLICY.missing_initial  # negative cache holds
                last_miss_read[key[1]] = now
            obj = {"metadata": {"namespace": key[0], "name": key[1]}} if key[1] in EXISTING else None
            state = record(state, key, after_read(state.entries.get(key), obj, None if obj else 404, now, POLICY))
        names = {o["metadata"]["name"] for o in published(state.entries, state.wanted)}
        assert names == {k[1] for k in state.wanted if k[1] in EXISTING}  # every named claim that exists, now
    assert reads_at_once <= changed_claims
    assert reads_later <= POLICY.steady_burst + POLICY.steady_qps * now + 1e-9


def test_steady_state_reads_at_the_budget_however_many_claims():
    pods = {f"p{i}": pc(f"p{i}", *(f"c-{i}-{j}" for j in range(32))) for i in range(10)}  # 320: 5.3 a second due
    state, reads_per_tick = START, []
    for t in range(1, 1201):
        state, reads = step(state, pods, float(t), POLICY)
        for key, _ in reads:
            state = record(state, key, after_read(state.entries.get(key), {"m": key}, None, float(t), POLICY))
        reads_per_tick.append(len(reads))
    assert reads_per_tick[0] == 320  # every pod is new at start: its claims at once
    steady = sum(reads_per_tick[200:]) / 1000
    assert steady <= POLICY.steady_qps + 0.01
