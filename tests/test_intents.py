"""Intent bookkeeping without sockets: acting, expiry, 0->1 / 1->0 aggregation."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from adapm._engine.intents import NodeIntents, WorkerIntents
from adapm._engine.timing import ActionTimer, ImmediateTimer


def arr(*ks):
    return np.array(ks, dtype=np.int64)


def test_acts_per_timer_and_expires():
    w = WorkerIntents(ActionTimer(lambda0=1, p=0.5))  # small horizon: Q(2) at p=0.5 is 2
    w.signal(arr(1, 2), 1, 3)
    w.signal(arr(3), 100, 101)
    acted, expired = w.collect(clock=0)
    assert [a.tolist() for a in acted] == [[1, 2]] and expired == []
    acted, expired = w.collect(clock=3)
    assert acted == [] and [e.tolist() for e in expired] == [[1, 2]]
    acted, _ = w.collect(clock=99)
    assert [a.tolist() for a in acted] == [[3]]


def test_intent_over_before_acting_is_dropped():
    w = WorkerIntents(ActionTimer(lambda0=1, p=0.5))
    w.signal(arr(5), 2, 4)
    acted, expired = w.collect(clock=10)
    assert acted == [] and expired == []


def test_force_acts_on_active_intents():
    w = WorkerIntents(ActionTimer(lambda0=0.001, p=0.5))
    w.signal(arr(5), 0, 10)
    assert w.has_unacted_active(0)
    acted, _ = w.collect(clock=0, force=True)
    assert [a.tolist() for a in acted] == [[5]]
    assert not w.has_unacted_active(0)
    assert [b.tolist() for b in w.active_batches(0)] == [[5]]


def test_node_aggregates_transitions_only():
    n = NodeIntents(10)
    n.add([arr(1, 1, 2)])  # duplicates in one batch count once
    n.add([arr(2, 3)])
    keys, flags = n.changes()
    assert keys.tolist() == [1, 2, 3] and flags.all()
    n.acknowledge(keys, flags)
    n.remove([arr(2, 3)])  # key 2 still wanted by the first batch
    keys, flags = n.changes()
    assert keys.tolist() == [3] and not flags.any()
    n.acknowledge(keys, flags)
    n.add([arr(4)])
    n.remove([arr(4)])  # starts and ends between two rounds: nothing to tell
    assert n.changes()[0].tolist() == []


@given(st.lists(st.tuples(st.lists(st.integers(0, 9), min_size=1, max_size=5),
                          st.integers(0, 20), st.integers(1, 10)), max_size=30),
       st.lists(st.integers(0, 4), min_size=1, max_size=15))
@settings(max_examples=150, deadline=None)
def test_told_state_matches_active_intents(intents, steps):
    """After every round, what owners were told equals 'some acted intent of the key is live'."""
    w = WorkerIntents(ImmediateTimer())
    node = NodeIntents(10)
    for ks, start, length in intents:
        w.signal(np.array(ks, dtype=np.int64), start, start + length)
    clock = 0
    for step in steps:
        clock += step
        acted, expired = w.collect(clock)
        node.add(acted)
        node.remove(expired)
        keys, flags = node.changes()
        node.acknowledge(keys, flags)
        live = np.zeros(10, dtype=bool)
        for ks, start, length in intents:
            # ImmediateTimer acts on everything not yet over at the first round that sees it.
            if clock < start + length:
                live[ks] = True
        assert np.array_equal(node.told, live)
