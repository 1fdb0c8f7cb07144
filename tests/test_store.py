"""The native store's slots (native/slots.c) and held map (native/held.c): inserting a key homed
elsewhere takes a slot and a map entry, removing it gives both back; home keys keep fixed rows.

Random sequences of inserts and removes over keys of mixed value lengths, on a node of a random
cluster size, against a dict of what each held key's value must be: values survive every other
key's coming and going (and the map's rehashes), held keys never share slab floats, freed slots
are reused (the slab's used part never exceeds the most floats held at once), the store reports
exactly the keys held with their states, and bad batches change nothing.
"""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import adapm
from adapm._store import NONE, OWNER, REPLICA, Store

NUM_KEYS = 16


def _store(lengths, rank=0, world_size=1) -> Store:
    return Store(adapm.Config(num_keys=NUM_KEYS, value_length=lengths, rank=rank,
                              world_size=world_size, rendezvous="127.0.0.1:1"))


def _slots_handed_out(store: Store) -> int:
    """Slots the allocator has made so far: held keys' (homed elsewhere) and free ones."""
    held = store.local_keys()
    return int((held % store.world_size != store.rank).sum()) + len(store.native.free_slots()) // 8


@given(st.lists(st.integers(1, 3), min_size=NUM_KEYS, max_size=NUM_KEYS),
       st.integers(1, 3).flatmap(lambda w: st.tuples(st.just(w), st.integers(0, w - 1))),
       st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, NUM_KEYS - 1), min_size=1,
                                                  max_size=6, unique=True)), max_size=30))
@settings(max_examples=200, deadline=None)
def test_slots_are_taken_given_back_and_reused(lengths, cluster, ops):
    world_size, rank = cluster
    store = _store(np.array(lengths), rank, world_size)
    expected: dict[int, list] = {}
    states: dict[int, int] = {}
    peak = {1: 0, 2: 0, 3: 0}  # most keys homed elsewhere of each value length held at once
    for step, (insert, keys) in enumerate(ops):
        keys = np.array(keys, dtype=np.int64)
        if insert:
            keys = keys[store.states(keys) == NONE]
            values = np.arange(store.floats_for(keys), dtype=np.float32) + 100 * step
            state = OWNER if step % 2 else REPLICA
            store.insert(keys, state, values, np.full(len(keys), step, np.int64))
            at = 0
            for k in keys.tolist():
                expected[k] = values[at:at + lengths[k]].tolist()
                states[k] = state
                at += lengths[k]
        else:
            values, _ = store.remove(keys)
            at = 0
            for k in keys.tolist():
                if k in expected:
                    assert values[at:at + lengths[k]].tolist() == expected.pop(k)
                    states.pop(k)
                at += lengths[k]
        held = np.array(sorted(expected), dtype=np.int64)
        np.testing.assert_array_equal(store.local_keys(), held)
        snap = store.snapshot()
        assert snap["state"].tolist() == [states.get(k, NONE) for k in range(NUM_KEYS)]
        assert ((snap["version"] >= 0) == (snap["state"] != NONE)).all()
        out = np.empty(store.floats_for(held), dtype=np.float32)
        assert store.gather(held, out, np.empty(len(held), dtype=np.int64)) == 0
        assert out.tolist() == [x for k in held.tolist() for x in expected[k]]
        floats = set()
        for k in held.tolist():
            start = int(snap["slot"][k])
            span = set(range(start, start + lengths[k]))
            assert not span & floats  # no two held keys share a float
            floats |= span
        for length in peak:
            peak[length] = max(peak[length], sum(lengths[k] == length for k in expected
                                                 if k % world_size != rank))
        # Reuse: a freed slot goes back to its length's list and is taken before a new one,
        # so no more slots exist than the most keys of each length held at once.
        assert _slots_handed_out(store) == sum(peak.values())


@pytest.mark.parametrize("world_size", [1, 2])
def test_bad_batches_change_nothing(world_size):
    store = _store(2, 0, world_size)
    store.insert(np.array([1, 2], np.int64), OWNER, np.ones(4, np.float32))
    before = store.snapshot()
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
    # Buffers of another dtype than the binding reads (native/store_module.c, batch_view).
    missing = np.empty(2, np.int64)
    for call, args in ((store.gather, (np.array([1, 2], np.int32), np.empty(4, np.float32),
                                       missing)),
                       (store.gather, (np.array([1, 2]), np.empty(4, np.float64), missing)),
                       (store.scatter_add, (np.array([1, 2]), np.ones(4, np.float64), missing)),
                       (store.scatter_set, (np.array([1, 2]), np.ones(4, np.float32),
                                            np.empty(2, np.int32)))):
        with pytest.raises(TypeError, match="buffer of"):
            call(*args)
    for name, array in store.snapshot().items():
        np.testing.assert_array_equal(array, before[name], err_msg=name)
    assert not len(store.native.free_slots())


def test_readers_and_writers_meet_rehashes_of_the_held_map():
    """Workers pull and push the same keys while the inserting thread moves thousands of other
    keys in and out (each batch grows or refills the held map, so tables are replaced under the
    workers): no push is lost, and no pull sees a torn or foreign row."""
    num_keys, dim = 40_000, 4
    store = Store(adapm.Config(num_keys=num_keys, value_length=dim, rank=0, world_size=2,
                               rendezvous="127.0.0.1:1"))
    store.insert(np.arange(0, num_keys, 2, dtype=np.int64), OWNER)  # the home keys
    hot = np.array([0, 2, 1, 3, 5, 7], dtype=np.int64)  # home owners and keys in the map
    store.insert(hot[2:], OWNER)
    pushes, errors = 2000, []

    def worker():
        rows = np.ones((len(hot), dim), dtype=np.float32)
        out = np.empty((len(hot), dim), dtype=np.float32)
        missing = np.empty(len(hot), dtype=np.int64)
        try:
            for _ in range(pushes):
                assert store.scatter_add(hot, rows, missing) == 0
                assert store.gather(hot, out, missing) == 0
                assert (out == out[:, :1]).all(), "a torn row"
        except AssertionError as e:
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    others = np.arange(9, num_keys, 2, dtype=np.int64)  # homed elsewhere, never the hot keys
    rng = np.random.default_rng(0)
    while any(t.is_alive() for t in threads):
        batch = rng.choice(others, size=5000, replace=False)
        store.insert(batch, REPLICA, np.full(len(batch) * dim, 7, np.float32))
        store.remove(batch)
    for t in threads:
        t.join()
    assert not errors, errors
    out = np.empty((len(hot), dim), dtype=np.float32)
    assert store.gather(hot, out, np.empty(len(hot), dtype=np.int64)) == 0
    assert (out == 2 * pushes).all()
    assert store.memory()[0] == len(hot) - 2  # only the hot keys homed elsewhere are left


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_sampling_pool_follows_every_insert_and_remove(world_size):
    """The local sampler's pool (Store.keep_pool) holds exactly the held keys of its domain,
    whatever inserts and removes them: the store's own calls keep it."""
    store = Store(adapm.Config(num_keys=NUM_KEYS, value_length=1, world_size=world_size,
                               rendezvous="127.0.0.1:1", sampling=adapm.Sampling(2, 8)))
    pool = store.sample_pool
    assert pool.count == 0
    store.insert(np.array([1, 3, 5, 9], np.int64), OWNER)  # 1 and 9 are outside the domain
    assert sorted(pool.keys[:pool.count].tolist()) == [3, 5]
    store.insert(np.array([6], np.int64), REPLICA)
    store.remove(np.array([3, 9], np.int64))
    assert sorted(pool.keys[:pool.count].tolist()) == [5, 6]
    with pytest.raises(RuntimeError, match="keeps a pool already"):
        store.native.keep_pool(np.zeros(6, np.int64), np.zeros(6, np.int64),
                               np.zeros(1, np.int64), 2)
    assert sorted(pool.keys[:pool.count].tolist()) == [5, 6]
