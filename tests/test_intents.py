"""Intent bookkeeping without sockets: acting, expiry, 0->1 / 1->0 aggregation.

The worker's queue is native (native/intent_queue.c); :class:`ReferenceQueue` is what it does,
in Python (heaps of batches, as the engine had it before), and the property test holds one
against the other over random signals and rounds.
"""

import heapq
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapm._engine.intents import MIN_PATIENCE_S, NodeIntents, WorkerIntents
from adapm._engine.timing import ActionTimer, ImmediateTimer

NUM_KEYS = 10


def arr(*ks):
    return np.array(ks, dtype=np.int64)


class ReferenceQueue:
    """One worker's intents: a heap of pending batches by start, one of acted ones by end."""

    def __init__(self) -> None:
        self.seq = itertools.count()
        self.pending: list = []  # (start, seq, end, keys)
        self.acted: list = []  # (end, seq, start, keys)

    def signal(self, keys, start, end) -> None:
        heapq.heappush(self.pending, (start, next(self.seq), end, np.array(keys)))

    def collect(self, clock, horizon) -> tuple[list, list]:
        expired = []
        while self.acted and self.acted[0][0] <= clock:
            expired.append(heapq.heappop(self.acted)[3])
        acted = []
        while self.pending and self.pending[0][0] < horizon:
            start, seq, end, keys = heapq.heappop(self.pending)
            if end <= clock:
                continue  # over before it was acted on: never counted
            heapq.heappush(self.acted, (end, seq, start, keys))
            acted.append(keys)
        return acted, expired

    def served(self, clock, told) -> bool:
        if any(start <= clock < end for start, _, end, _ in self.pending):
            return False
        return all(told[keys].all() for end, _, start, keys in self.acted
                   if start <= clock < end)

    def empty(self) -> bool:
        return not (self.pending or self.acted)


def _round(node: NodeIntents, worker: WorkerIntents, clock: int, force: bool = False):
    acted, changed = node.collect(worker, clock, force)
    keys, flags = node.changes()
    node.acknowledge(keys, flags)
    return acted, changed, keys.tolist(), flags.tolist()


def test_acts_per_timer_and_expires():
    w = WorkerIntents(ActionTimer(lambda0=1, p=0.5), NUM_KEYS)  # Q(2) at p=0.5 is 2: horizon 2
    node = NodeIntents(NUM_KEYS)
    w.signal(arr(1, 2), 1, 3)
    w.signal(arr(3), 100, 101)
    assert _round(node, w, 0) == (2, True, [1, 2], [True, True])
    assert _round(node, w, 3) == (0, True, [1, 2], [False, False])  # expired
    assert _round(node, w, 99)[:3] == (1, True, [3])
    assert not w.empty()
    assert _round(node, w, 101) == (0, True, [3], [False])
    assert w.empty() and not w.fresh()


def test_intent_over_before_acting_is_dropped():
    w = WorkerIntents(ActionTimer(lambda0=1, p=0.5), NUM_KEYS)
    node = NodeIntents(NUM_KEYS)
    w.signal(arr(5), 2, 4)
    assert w.fresh()
    assert _round(node, w, 10) == (0, False, [], [])
    assert w.empty() and not node.dense()[0].any()


def test_force_acts_on_active_intents():
    w = WorkerIntents(ActionTimer(lambda0=0.001, p=0.5), NUM_KEYS)
    node = NodeIntents(NUM_KEYS)
    w.signal(arr(5), 0, 10)
    assert not w.served(0, node)
    assert _round(node, w, 0) == (0, False, [], [])  # the timer's horizon is 0: not yet
    assert _round(node, w, 0, force=True) == (1, True, [5], [True])
    assert w.served(0, node) and w.served(10, node)


def test_idle_is_when_a_round_would_change_nothing():
    """``idle(clock)`` lets a round skip the worker (Rounds._build_round): where it says so, a
    collect changes nothing, the timer included; where a collect would change something (the
    clock moved, an intent waits or is acted on and not over), it does not say so."""
    timer = ActionTimer(lambda0=1, p=0.5)
    w, node = WorkerIntents(timer, NUM_KEYS), NodeIntents(NUM_KEYS)
    assert w.idle(0)
    assert _round(node, w, 0) == (0, False, [], [])
    assert (timer.lam, timer.last_clock) == (1.0, 0)
    assert not w.idle(3)  # the clock moved: the timer learns from it
    _round(node, w, 3)
    assert timer.lam > 1.0 and w.idle(3)
    w = WorkerIntents(ImmediateTimer(), NUM_KEYS)
    w.signal(arr(1), 2, 4)
    assert not w.idle(0)  # an intent waits
    assert _round(node, w, 0)[:3] == (1, True, [1])
    assert not w.idle(0)  # acted on, not over: a later round counts it out
    assert _round(node, w, 4)[:3] == (0, True, [1])
    assert w.idle(4)


def test_signal_checks_its_keys():
    w = WorkerIntents(ImmediateTimer(), NUM_KEYS)
    with pytest.raises(IndexError, match="outside"):
        w.signal(arr(1, NUM_KEYS), 0, 1)
    with pytest.raises(TypeError):
        w.signal(np.array([1], dtype=np.int32), 0, 1)
    with pytest.raises(ValueError, match="end"):
        w.signal(arr(1), 3, 3)
    assert w.empty() and not w.fresh()  # nothing was queued


def test_node_aggregates_transitions_only():
    w = WorkerIntents(ImmediateTimer(), NUM_KEYS)
    node = NodeIntents(NUM_KEYS)
    w.signal(arr(1, 1, 2), 0, 10)  # duplicates in one batch count once
    w.signal(arr(2, 3), 0, 2)
    assert _round(node, w, 0) == (5, True, [1, 2, 3], [True, True, True])
    assert _round(node, w, 2)[2:] == ([3], [False])  # key 2 still wanted by the first batch
    w.signal(arr(4), 2, 3)
    assert _round(node, w, 3)[2:] == ([], [])  # started and ended between two rounds


class ReferenceNode:
    """What NodeIntents does with a round's batches, per key in Python: count each key in or
    out; a key whose count crosses zero is collected once, in the order it first crossed; the
    changes are those collected keys whose state differs from what owners were told."""

    def __init__(self) -> None:
        self.count = np.zeros(NUM_KEYS, dtype=np.int32)
        self.told = np.zeros(NUM_KEYS, dtype=bool)
        self.dirty: list[int] = []

    def apply(self, batches: list, delta: int) -> None:
        for keys in batches:
            for k in keys.tolist():
                before = self.count[k]
                self.count[k] += delta
                if (before == 0 if delta > 0 else before == 1) and k not in self.dirty:
                    self.dirty.append(k)

    def changes(self) -> tuple[list, list]:
        keys = [k for k in self.dirty if (self.count[k] > 0) != self.told[k]]
        self.dirty = []
        flags = [bool(self.count[k] > 0) for k in keys]
        self.told[keys] = flags
        return keys, flags


signals = st.tuples(st.lists(st.integers(0, NUM_KEYS - 1), max_size=5), st.integers(0, 30),
                    st.integers(1, 10))


@given(st.lists(st.tuples(st.lists(signals, max_size=4), st.integers(0, 4), st.booleans()),
                min_size=1, max_size=25),
       st.sampled_from(["timer", "immediate"]))
@settings(max_examples=300, deadline=None)
def test_native_queue_matches_the_reference(rounds, timing):
    """Signals between rounds, rounds at advancing clocks (some forced): the native queue acts
    and expires the same batches as the reference, so counts, changes and served() agree."""
    def timer():
        return ActionTimer(lambda0=2, p=0.9) if timing == "timer" else ImmediateTimer()

    worker, ref, ref_timer = WorkerIntents(timer(), NUM_KEYS), ReferenceQueue(), timer()
    node, ref_node = NodeIntents(NUM_KEYS), ReferenceNode()
    clock = 0
    for new, step, force in rounds:
        for keys, start, length in new:
            start += clock
            worker.signal(np.array(keys, dtype=np.int64), start, start + length)
            ref.signal(np.array(keys, dtype=np.int64), start, start + length)
        assert worker.fresh() == bool(new)
        clock += step
        horizon = ref_timer.horizon(clock)
        if force:
            horizon = max(horizon, clock + 1)
        acted, expired = ref.collect(clock, horizon)
        ref_node.apply(acted, 1)
        ref_node.apply(expired, -1)
        got_acted, changed = node.collect(worker, clock, force)
        assert got_acted == sum(map(len, acted))
        assert changed == bool(acted or expired)
        np.testing.assert_array_equal(node.dense()[0], ref_node.count)
        keys, flags = node.changes()
        assert (keys.tolist(), flags.tolist()) == ref_node.changes()
        node.acknowledge(keys, flags)
        for at in (clock, clock + 1, clock + 5):
            assert worker.served(at, node) == ref.served(at, ref_node.told)
        # A record only for keys with a count or told (none marked: changes() took them).
        records, _ = node.native.memory()
        assert records == int(((ref_node.count > 0) | ref_node.told).sum())
        assert worker.empty() == ref.empty()


@given(st.lists(signals, max_size=30), st.lists(st.integers(0, 4), min_size=1, max_size=15))
@settings(max_examples=150, deadline=None)
def test_told_state_matches_active_intents(intents, steps):
    """After every round, what owners were told equals 'some acted intent of the key is live'."""
    w = WorkerIntents(ImmediateTimer(), NUM_KEYS)
    node = NodeIntents(NUM_KEYS)
    for ks, start, length in intents:
        w.signal(np.array(ks, dtype=np.int64), start, start + length)
    clock = 0
    for step in steps:
        clock += step
        _round(node, w, clock)
        live = np.zeros(NUM_KEYS, dtype=bool)
        for ks, start, length in intents:
            # ImmediateTimer acts on everything not yet over at the first round that sees it.
            if clock < start + length:
                live[ks] = True
        assert np.array_equal(node.dense()[1], live)
    assert math.isinf(ImmediateTimer().horizon(0))


@given(st.integers(0, 2**32 - 1), st.sampled_from([400, 20_000]))
@settings(max_examples=20, deadline=None)
def test_counts_match_the_reference_over_many_keys(seed, num_keys):
    """Thousands of keys in flight at once: the counts' table grows through several doublings,
    and records leave it (backward-shift deletion, across the table's end) while others probe
    past them. After every round the counts, told flags, changes and the records kept match a
    reference; owners acknowledge only some changes and the rest are reported again."""
    rng = np.random.default_rng(seed)
    worker, ref = WorkerIntents(ImmediateTimer(), num_keys), ReferenceQueue()
    node = NodeIntents(num_keys)
    count = np.zeros(num_keys, dtype=np.int64)
    told = np.zeros(num_keys, dtype=bool)
    marked: list[int] = []  # keys changes() will look at, in the order they were marked
    clock = 0
    for _ in range(12):
        for _ in range(int(rng.integers(1, 6))):
            # Zipf-like keys: a hot few in most batches, a long tail that comes and goes.
            keys = ((rng.zipf(1.3, int(rng.integers(1, 1500))) - 1) % num_keys).astype(np.int64)
            start = clock + int(rng.integers(0, 4))
            end = start + int(rng.integers(1, 5))
            worker.signal(keys, start, end)
            ref.signal(keys, start, end)
        clock += int(rng.integers(0, 3))
        acted, expired = ref.collect(clock, math.inf)
        for batches, delta in ((acted, 1), (expired, -1)):
            for keys in batches:
                for k in keys.tolist():
                    count[k] += delta
                    if count[k] == (1 if delta > 0 else 0) and k not in marked:
                        marked.append(k)
        node.collect(worker, clock)
        np.testing.assert_array_equal(node.dense()[0], count)
        keys, flags = node.changes()
        want = [k for k in marked if (count[k] > 0) != told[k]]
        assert keys.tolist() == want
        assert flags.tolist() == [bool(count[k] > 0) for k in want]
        # The owners take in a random part; the rest went to a node that no longer owns them.
        taken = rng.random(len(keys)) < 0.7
        node.acknowledge(keys[taken], flags[taken])
        told[keys[taken]] = flags[taken]
        node.report_again(keys[~taken])
        marked = keys[~taken].tolist()
        np.testing.assert_array_equal(node.dense()[1], told)
        assert node.wants(np.arange(num_keys, dtype=np.int64)).tolist() == (count > 0).tolist()
        records, _ = node.native.memory()
        kept = (count > 0) | told
        kept[marked] = True
        assert records == int(kept.sum())


def test_counts_keep_records_only_for_keys_with_intent():
    """Memory follows the keys with intent: once intents ended and owners were told, no record
    is left; a key reported again keeps one until changes() looked at it."""
    w = WorkerIntents(ImmediateTimer(), NUM_KEYS)
    node = NodeIntents(NUM_KEYS)
    w.signal(arr(1, 2, 3), 0, 5)
    _round(node, w, 0)
    assert node.native.memory()[0] == 3
    assert node.wants(arr(1, 4)).tolist() == [True, False]
    assert node.in_flight(arr(1)).tolist() == [False]  # told
    _round(node, w, 5)  # expired, and the owners told so
    assert node.native.memory()[0] == 0 and not node.pending()
    node.report_again(arr(7))
    assert node.pending() and node.native.memory()[0] == 1
    assert [a.tolist() for a in node.changes()] == [[], []]  # nothing differs from told
    assert node.native.memory()[0] == 0
    with pytest.raises(IndexError, match="outside"):
        node.report_again(arr(NUM_KEYS))
    with pytest.raises(ValueError, match="one flag per key"):
        node.native.acknowledge(arr(1, 2), np.ones(1, np.uint8))
    assert node.native.memory()[0] == 0  # nothing changed


def test_activity_says_in_one_call_what_a_round_would_find():
    """IntentCounts.activity: bit 0 keys wait for changes(), bit 1 a queue had intents signalled
    since its last collect, bit 2 every queue is empty (the engine's per-pass check)."""
    node = NodeIntents(10)
    a, b = WorkerIntents(ImmediateTimer(0), 10), WorkerIntents(ImmediateTimer(0), 10)
    queues = (a.queue, b.queue)
    assert node.native.activity(queues) == 4  # idle
    a.signal(np.array([1, 2], dtype=np.int64), 0, 5)
    assert node.native.activity(queues) == 2  # signalled, so not empty
    node.collect(a, 0)  # acted on: keys 1 and 2 crossed zero
    assert node.native.activity(queues) == 1
    node.changes()
    assert node.native.activity(queues) == 0  # acted on, not over yet
    node.collect(a, 5)  # over: counted out, so keys 1 and 2 cross zero again
    assert node.native.activity(queues) == 1 | 4
    with pytest.raises(TypeError, match="tuple of IntentQueue"):
        node.native.activity([a.queue])
    with pytest.raises(TypeError, match="tuple of IntentQueue"):
        node.native.activity((a.queue, 3))


def test_behind_when_waiting_intents_are_not_collected_within_the_patience():
    w = WorkerIntents(ActionTimer(lambda0=1, p=0.5), NUM_KEYS)
    node = NodeIntents(NUM_KEYS)
    since, patience = w.collected_at, w.patience_s
    assert patience == MIN_PATIENCE_S
    assert not w.behind(since + 100.0)  # nothing waits: nothing to hurry
    w.signal(arr(1), 50, 51)
    assert not w.behind(since + patience / 2) and w.behind(since + 2 * patience)
    node.collect(w, 5)
    assert w.collected_at >= since
    assert not w.behind(w.collected_at + 100.0)  # collected: nothing waits
    w.signal(arr(2), 60, 61)
    w.patience_s = 0.5  # the engine sets it from its rounds' mean time
    at = w.collected_at
    assert not w.behind(at + 0.4) and w.behind(at + 0.6)


def _yields_while_no_round_collects(node):
    """Worker.advance_clock on a node whose engine starts no round (quiesced): it yields its
    core at each clock once intents wait uncollected for longer than the patience, never
    while none wait, and no more once a round collected them."""
    import time

    import adapm.worker as worker_module

    w = node.worker()
    yields = []
    worker_module._yield_core = lambda: yields.append(w.clock)
    node.engine.quiesce(10.0)
    time.sleep(0.1)  # past any patience: but nothing waits
    for _ in range(5):
        w.advance_clock()
    idle = list(yields)
    w.intent(np.array([node.rank], dtype=np.int64), w.clock + 20)
    time.sleep(0.1)
    for _ in range(3):
        w.advance_clock()
    behind = list(yields)
    node.engine.resume()
    w.wait_sync()  # a round collects them
    for _ in range(3):
        w.advance_clock()
    node.barrier()
    return idle, behind, yields


def test_advance_clock_yields_the_core_only_while_the_engine_is_behind():
    from adapm.testing import run_cluster

    for idle, behind, every in run_cluster(
            _yields_while_no_round_collects, 2, timeout_s=90,
            config=dict(num_keys=8, value_length=2, connect_timeout_s=20,
                        request_timeout_s=20)):
        assert idle == []
        assert behind == [6, 7, 8]  # the clocks after the intent came, at clock 5
        assert every == behind
