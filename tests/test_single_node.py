"""A node on its own (world size 1, no launcher, no sockets): the API contract of DESIGN section 2.

Every test that starts a node shuts it down, through the ``make_node`` fixture or a ``with``
block, so that the next test can call ``adapm.init`` again.
"""

from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adapm


@pytest.fixture(autouse=True)
def _single_node(no_launcher):
    """Every test here runs adapm.init() as a single node (tests/conftest.py)."""


@pytest.fixture
def make_node():
    """``make_node(**settings)`` starts a node; every node started is shut down afterwards."""
    nodes = []

    def make(num_keys=20, value_length=3, **settings):
        node = adapm.init(num_keys=num_keys, value_length=value_length, **settings)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        node.shutdown()


@pytest.fixture
def node(make_node):
    return make_node()


# --- basic semantics -------------------------------------------------------------------------


def test_single_node_identity(node):
    assert node.rank == 0
    assert node.world_size == 1
    assert node.engine is None and node.transport is None  # no sockets for one node


def test_values_start_at_zero(node):
    w = node.worker()
    values = w.pull(np.arange(20))
    assert values.dtype == np.float32
    assert values.shape == (20, 3)
    assert not values.any()


def test_push_adds_and_pull_reads(node):
    w = node.worker()
    keys = np.array([0, 5, 19])
    upd = np.arange(9, dtype=np.float32).reshape(3, 3)
    w.push(keys, upd)
    np.testing.assert_array_equal(w.pull(keys), upd)
    w.push(keys, upd)
    np.testing.assert_array_equal(w.pull(keys), 2 * upd)
    # Untouched keys stay zero.
    others = np.setdiff1d(np.arange(20), keys)
    assert not w.pull(others).any()


def test_push_does_not_keep_caller_buffer(node):
    w = node.worker()
    upd = np.ones((2, 3), np.float32)
    w.push([1, 2], upd)
    upd[:] = 100  # the caller may reuse its buffer at once
    np.testing.assert_array_equal(w.pull([1, 2]), np.ones((2, 3)))


def test_pull_result_is_a_copy(node):
    w = node.worker()
    w.push([4], np.full((1, 3), 2, np.float32))
    got = w.pull([4])
    got[:] = -7
    np.testing.assert_array_equal(w.pull([4]), np.full((1, 3), 2))


def test_set_overwrites(node):
    w = node.worker()
    w.push([3, 4], np.ones((2, 3), np.float32))
    w.set([3], np.full((1, 3), 7, np.float32))
    np.testing.assert_array_equal(w.pull([3, 4]), [[7, 7, 7], [1, 1, 1]])


def test_set_then_push(node):
    w = node.worker()
    w.set([8, 9], np.array([[1, 2, 3], [4, 5, 6]], np.float32))
    w.push([9, 8], np.array([[10, 10, 10], [-1, -1, -1]], np.float32))
    np.testing.assert_array_equal(w.pull([8, 9]), [[0, 1, 2], [14, 15, 16]])


def test_pull_duplicates_in_request_order(node):
    w = node.worker()
    keys = np.arange(20)
    w.set(keys, np.repeat(keys[:, None], 3, axis=1).astype(np.float32) * 10)
    request = [3, 1, 3, 0, 19, 3, 1]
    got = w.pull(request)
    assert got.shape == (7, 3)
    np.testing.assert_array_equal(got[:, 0], np.array(request) * 10)
    np.testing.assert_array_equal(got, np.repeat(np.array(request)[:, None] * 10, 3, axis=1))


def test_push_duplicates_add_up(node):
    w = node.worker()
    w.push([2, 2, 5, 2], np.array([[1, 0, 0], [0, 1, 0], [9, 9, 9], [0, 0, 4]], np.float32))
    np.testing.assert_array_equal(w.pull([2, 5]), [[1, 1, 4], [9, 9, 9]])


def test_keys_forms(node):
    """Python ints, numpy int scalars, lists, tuples, int32/uint arrays, 2-d arrays (flattened)."""
    w = node.worker()
    w.set(np.arange(20), np.repeat(np.arange(20)[:, None], 3, axis=1).astype(np.float32))
    assert w.pull(7).tolist() == [[7, 7, 7]]
    assert w.pull(np.int64(7)).tolist() == [[7, 7, 7]]
    assert w.pull(np.uint8(7)).tolist() == [[7, 7, 7]]
    assert w.pull((1, 2))[:, 0].tolist() == [1, 2]
    assert w.pull(np.array([5, 6], np.int32))[:, 0].tolist() == [5, 6]
    assert w.pull(np.array([5, 6], np.uint64))[:, 0].tolist() == [5, 6]
    got = w.pull(np.array([[1, 2], [3, 4]]))
    assert got.shape == (4, 3)
    assert got[:, 0].tolist() == [1, 2, 3, 4]
    # Non-contiguous key arrays are read correctly too.
    assert w.pull(np.arange(20)[::5])[:, 0].tolist() == [0, 5, 10, 15]


def test_empty_batches(node):
    w = node.worker()
    got = w.pull([])
    assert got.shape == (0, 3) and got.dtype == np.float32
    w.push([], np.empty((0, 3), np.float32))
    w.set(np.array([], np.int64), np.empty((0, 3), np.float32))
    assert not w.pull(np.arange(20)).any()


def test_non_contiguous_updates(node):
    w = node.worker()
    big = np.arange(24, dtype=np.float32).reshape(4, 6)
    upd = big[:, ::2]  # (4, 3), not contiguous
    w.push([0, 1, 2, 3], upd)
    np.testing.assert_array_equal(w.pull([0, 1, 2, 3]), upd)


def test_updates_as_nested_lists(node):
    w = node.worker()
    w.push([1], [[1, 2, 3]])
    w.set([2], [[4, 5, 6]])
    np.testing.assert_array_equal(w.pull([1, 2]), [[1, 2, 3], [4, 5, 6]])


# --- pull with out= ----------------------------------------------------------------------------


def test_pull_out_fills_and_returns_same_object(node):
    w = node.worker()
    w.push([1, 2], np.array([[1, 2, 3], [4, 5, 6]], np.float32))
    buf = np.full((3, 3), -1, np.float32)
    got = w.pull([2, 0, 1], out=buf)
    assert got is buf
    np.testing.assert_array_equal(buf, [[4, 5, 6], [0, 0, 0], [1, 2, 3]])


def test_pull_out_does_not_allocate():
    n, dim = 50_000, 16
    with adapm.init(num_keys=n, value_length=dim) as node:
        w = node.worker()
        keys = np.arange(n, dtype=np.int64)
        buf = np.empty((n, dim), np.float32)
        w.pull(keys, out=buf)  # warm-up: per-worker buffers grow once
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            before, _ = tracemalloc.get_traced_memory()
            got = w.pull(keys, out=buf)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert got is buf
        # The values take n * dim * 4 = 3.2 MB; a copy of keys or values would show up here.
        assert peak - before < 16 * 1024, f"pull(out=) allocated {peak - before} bytes"
        # For comparison, a pull without out= allocates the result.
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            before, _ = tracemalloc.get_traced_memory()
            w.pull(keys)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak - before >= n * dim * 4


# --- per-key lengths and length 1 ----------------------------------------------------------------


def test_per_key_lengths_packed(make_node):
    lengths = np.array([1, 3, 2, 4, 1, 5])
    node = make_node(num_keys=6, value_length=lengths)
    w = node.worker()
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    # Key k holds 10*k + [0, 1, ..., len(k)-1].
    everything = np.concatenate([10 * k + np.arange(lengths[k]) for k in range(6)]).astype(np.float32)
    w.set(np.arange(6), everything)
    got = w.pull(np.arange(6))
    assert got.shape == (int(lengths.sum()),)
    np.testing.assert_array_equal(got, everything)

    request = [3, 0, 3, 5]
    expect = np.concatenate([everything[offsets[k]:offsets[k + 1]] for k in request])
    got = w.pull(request)
    assert got.shape == (4 + 1 + 4 + 5,)
    np.testing.assert_array_equal(got, expect)

    # Pushing packed updates: key 1 gets +1 on all 3 floats (twice), key 4 gets +100.
    w.push([1, 4, 1], np.array([1, 1, 1, 100, 1, 1, 1], np.float32))
    np.testing.assert_array_equal(w.pull([1]), [12, 13, 14])
    np.testing.assert_array_equal(w.pull([4]), [140])

    buf = np.empty(2 + 5, np.float32)
    assert w.pull([2, 5], out=buf) is buf
    np.testing.assert_array_equal(buf, [20, 21, 50, 51, 52, 53, 54])


def test_uniform_length_one_accepts_flat(make_node):
    node = make_node(num_keys=10, value_length=1)
    w = node.worker()
    w.push([1, 2, 1], np.array([1, 2, 3], np.float32))  # shape (n,)
    w.push([2], np.array([[5]], np.float32))  # shape (n, 1) too
    got = w.pull([1, 2, 3])
    assert got.shape == (3, 1)
    np.testing.assert_array_equal(got[:, 0], [4, 7, 0])
    w.set([3], np.array([9], np.float32))
    assert w.pull([3]).tolist() == [[9]]


def test_per_key_length_array_of_ones_is_not_uniform(make_node):
    """value_length given as an array (even all ones) means packed output."""
    node = make_node(num_keys=4, value_length=np.ones(4, np.int64))
    w = node.worker()
    w.push([0, 3], np.array([1, 2], np.float32))
    got = w.pull([0, 3])
    assert got.shape == (2,)
    np.testing.assert_array_equal(got, [1, 2])


# --- lifecycle ---------------------------------------------------------------------------------


def test_context_manager():
    with adapm.init(num_keys=5, value_length=2) as node:
        assert isinstance(node, adapm.Node)
        w = node.worker()
        w.push([1], np.ones((1, 2), np.float32))
        assert w.pull([1]).tolist() == [[1, 1]]
    with pytest.raises(adapm.StateError):
        w.pull([1])
    # The node is unregistered: a new one can start, and it starts from zeros.
    with adapm.init(num_keys=5, value_length=2) as node2:
        assert node2 is not node
        assert not node2.worker().pull([1]).any()


def test_context_manager_releases_on_error():
    with pytest.raises(RuntimeError, match="inside"):
        with adapm.init(num_keys=5) as node:
            raise RuntimeError("inside")
    with pytest.raises(adapm.StateError):
        node.worker()
    with adapm.init(num_keys=5):
        pass


def test_init_twice_then_again_after_shutdown():
    node = adapm.init(num_keys=5)
    try:
        with pytest.raises(adapm.StateError, match="already"):
            adapm.init(num_keys=5)
        # The running node is not disturbed by the refused init.
        w = node.worker()
        w.push([0], np.ones(1, np.float32))
        assert w.pull([0]).tolist() == [[1]]
    finally:
        node.shutdown()
    node.shutdown()  # idempotent
    again = adapm.init(num_keys=5)
    try:
        assert not again.worker().pull([0]).any()
    finally:
        again.shutdown()


def test_init_with_config():
    cfg = adapm.Config(num_keys=7, value_length=2)
    node = adapm.init(config=cfg)
    try:
        assert node.config is cfg
        assert node.worker().pull([6]).shape == (1, 2)
    finally:
        node.shutdown()


def test_local_keys_are_all_keys(make_node):
    node = make_node(num_keys=13)
    local = node.local_keys()
    assert local.dtype == np.int64
    np.testing.assert_array_equal(local, np.arange(13))
    w = node.worker()
    w.push([3], np.ones((1, 3), np.float32))
    np.testing.assert_array_equal(node.local_keys(), np.arange(13))


def test_stats_counters(node):
    w1, w2 = node.worker(), node.worker()
    s = node.stats()
    assert s["local_pull_keys"] == 0 and s["local_push_keys"] == 0
    w1.pull([1, 2, 2])
    w2.pull([5])
    w1.push([1, 1, 3, 4], np.ones((4, 3), np.float32))
    w2.set([7, 8], np.ones((2, 3), np.float32))
    w1.intent([1, 2, 3], 1, 4)
    s = node.stats()
    assert s["local_pull_keys"] == 4
    assert s["local_push_keys"] == 4
    assert s["local_set_keys"] == 2
    assert s["intents_signalled"] == 3
    for name in ("remote_pull_keys", "remote_push_keys", "remote_set_keys", "messages_sent",
                 "messages_received", "bytes_sent", "bytes_received", "relocations_in",
                 "relocations_out", "replica_setups", "replica_drops"):
        assert s[name] == 0, name
    assert s["remote_access_share"] == 0.0
    # Per-worker counters are kept on the handles and summed by the node.
    assert w1.counters["local_pull_keys"] == 3 and w2.counters["local_pull_keys"] == 1


def test_intent_clock_and_sync_accepted(node):
    w = node.worker()
    assert w.clock == 0
    w.intent([1, 2], 0)
    w.intent(np.array([3]), 1, 5)
    w.intent([4], start=2, end=3)
    w.intent([4], np.int64(2), np.int32(3))
    w.intent([], 7)
    assert w.advance_clock() == 1
    assert w.advance_clock() == 2
    assert w.clock == 2
    w.wait()
    w.wait_sync()
    w.wait_sync(timeout_s=1.0)
    node.barrier()
    node.barrier(timeout_s=1.0)
    # Under one node intent changes nothing observable: values and local keys are as before.
    assert not w.pull([1, 2, 3, 4]).any()
    np.testing.assert_array_equal(node.local_keys(), np.arange(20))


def test_workers_have_own_clocks(node):
    a, b = node.worker(), node.worker()
    a.advance_clock()
    a.advance_clock()
    b.advance_clock()
    assert (a.clock, b.clock) == (2, 1)
    assert a.index != b.index


def test_concurrent_pushes_from_threads_are_exact(make_node):
    """Many threads pushing to the same keys at once: no update is lost."""
    node = make_node(num_keys=64, value_length=8)
    threads_n, rounds = 4, 200
    keys = np.arange(64)
    workers = [node.worker() for _ in range(threads_n)]

    def run(w, seed):
        rng = np.random.default_rng(seed)
        for _ in range(rounds):
            batch = rng.choice(keys, size=16)  # duplicates included
            w.push(batch, np.ones((16, 8), np.float32))
            w.pull(batch)

    threads = [threading.Thread(target=run, args=(w, i)) for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = workers[0].pull(keys)
    assert np.all(total == total[:, :1])  # every float of a key got the same updates
    assert total.sum() == threads_n * rounds * 16 * 8
    # Recompute the exact per-key counts from the same seeds.
    expect = np.zeros(64)
    for i in range(threads_n):
        rng = np.random.default_rng(i)
        for _ in range(rounds):
            np.add.at(expect, rng.choice(keys, size=16), 1)
    np.testing.assert_array_equal(total[:, 0], expect)


# --- property: random operation sequences against a numpy model --------------------------------

NUM_KEYS, DIM = 12, 2

_keys = st.lists(st.integers(0, NUM_KEYS - 1), min_size=0, max_size=8)
_op = st.one_of(
    st.tuples(st.just("push"), _keys, st.integers(0, 2**16)),
    st.tuples(st.just("set"), st.lists(st.integers(0, NUM_KEYS - 1), unique=True, max_size=6),
              st.integers(0, 2**16)),
    st.tuples(st.just("pull"), _keys, st.just(0)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, max_size=25))
def test_random_sequences_match_numpy_model(ops):
    model = np.zeros((NUM_KEYS, DIM), np.float32)
    with adapm.init(num_keys=NUM_KEYS, value_length=DIM) as node:
        w = node.worker()
        for kind, keys, seed in ops:
            keys = np.array(keys, dtype=np.int64)
            vals = np.random.default_rng(seed).integers(-50, 50, size=(len(keys), DIM))
            vals = vals.astype(np.float32)
            if kind == "push":
                w.push(keys, vals)
                np.add.at(model, keys, vals)
            elif kind == "set":
                w.set(keys, vals)
                model[keys] = vals
            else:
                np.testing.assert_array_equal(w.pull(keys), model[keys])
        np.testing.assert_array_equal(w.pull(np.arange(NUM_KEYS)), model)
        assert node.stats()["local_push_keys"] == sum(len(k) for op, k, _ in ops if op == "push")
