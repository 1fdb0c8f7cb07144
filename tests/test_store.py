"""The native store's slots (native/slots.c): inserting takes a slot, removing gives it back.

Random sequences of inserts and removes over keys of mixed value lengths, against a dict of
what each held key's value must be: values survive every other key's coming and going, held
keys never share slab floats, freed slots are reused (the slab's used part never exceeds the
most floats held at once), and bad batches change nothing.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adapm
from adapm._store import NONE, OWNER, REPLICA, Store

NUM_KEYS = 16


def _store(lengths) -> Store:
    return Store(adapm.Config(num_keys=NUM_KEYS, value_length=lengths))


def _slots_handed_out(store: Store) -> int:
    """Slots the allocator has made so far: held keys' and free ones."""
    return int((store.state != NONE).sum()) + len(store.native.free_slots()) // 8


@given(st.lists(st.integers(1, 3), min_size=NUM_KEYS, max_size=NUM_KEYS),
       st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, NUM_KEYS - 1), min_size=1,
                                                  max_size=6, unique=True)), max_size=30))
@settings(max_examples=200, deadline=None)
def test_slots_are_taken_given_back_and_reused(lengths, ops):
    store = _store(np.array(lengths))
    expected: dict[int, list] = {}
    peak = {1: 0, 2: 0, 3: 0}  # most keys of each value length held at once
    for step, (insert, keys) in enumerate(ops):
        keys = np.array(keys, dtype=np.int64)
        if insert:
            keys = keys[store.state[keys] == NONE]
            values = np.arange(store.floats_for(keys), dtype=np.float32) + 100 * step
            store.insert(keys, OWNER if step % 2 else REPLICA, values)
            at = 0
            for k in keys.tolist():
                expected[k] = values[at:at + lengths[k]].tolist()
                at += lengths[k]
        else:
            values, _ = store.remove(keys)
            at = 0
            for k in keys.tolist():
                if k in expected:
                    assert values[at:at + lengths[k]].tolist() == expected.pop(k)
                at += lengths[k]
        held = np.array(sorted(expected), dtype=np.int64)
        out = np.empty(store.floats_for(held), dtype=np.float32)
        assert store.gather(held, out, np.empty(len(held), dtype=np.int64)) == 0
        assert out.tolist() == [x for k in held.tolist() for x in expected[k]]
        floats = set()
        for k in held.tolist():
            start = int(store.slot[k] & ((1 << 62) - 1))
            span = set(range(start, start + lengths[k]))
            assert not span & floats  # no two held keys share a float
            floats |= span
        for length in peak:
            peak[length] = max(peak[length], sum(lengths[k] == length for k in expected))
        # Reuse: a freed slot goes back to its length's list and is taken before a new one,
        # so no more slots exist than the most keys of each length held at once.
        assert _slots_handed_out(store) == sum(peak.values())


def test_bad_batches_change_nothing():
    store = _store(2)
    store.insert(np.array([1, 2], np.int64), OWNER, np.ones(4, np.float32))
    state, slot = store.state.copy(), store.slot.copy()
    for keys, error in ((np.array([2, 3], np.int64), "key 2 is held here already"),
                        (np.array([3, 3], np.int64), "key 3 appears more than once")):
        with pytest.raises(ValueError, match=error):
            store.insert(keys, OWNER)
    with pytest.raises(ValueError, match="must match"):
        store.insert(np.array([3], np.int64), OWNER, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="appears more than once"):
        store.remove(np.array([1, 1], np.int64))
    with pytest.raises(IndexError):
        store.insert(np.array([NUM_KEYS], np.int64), OWNER)
    np.testing.assert_array_equal(store.state, state)
    np.testing.assert_array_equal(store.slot, slot)
    assert not len(store.native.free_slots())
