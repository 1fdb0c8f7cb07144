"""Negative sampling: distributions, schemes, bad input; on one node and on real 2-node clusters."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

import adapm
from adapm._native_loader import load as _load_native
from adapm._store import NONE
from adapm.testing import run_cluster

_native = _load_native()

FAST = dict(connect_timeout_s=20, request_timeout_s=20)
# A chi-square test at this level fails a correct sampler once in 10^4 runs; draws are seeded,
# so a given version of the code passes or fails deterministically.
P_MIN = 1e-4


def single(sampling, num_keys=100, value_length=2):
    return adapm.init(config=adapm.Config(num_keys=num_keys, value_length=value_length,
                                          sampling=sampling))


def draw(worker, n, times=1):
    keys = [worker.pull_sample(worker.prepare_sample(n, worker.clock))[0] for _ in range(times)]
    return np.concatenate(keys)


@pytest.mark.parametrize("scheme", ["local", "naive"])
def test_uniform_distribution(scheme):
    with single(adapm.Sampling(20, 70, scheme=scheme, seed=3)) as node:
        keys = draw(node.worker(), 1000, times=20)
        assert keys.min() >= 20 and keys.max() < 70
        counts = np.bincount(keys - 20, minlength=50)
        assert scipy_stats.chisquare(counts).pvalue > P_MIN


@pytest.mark.parametrize("scheme", ["local", "naive"])
def test_weighted_distribution(scheme):
    weights = np.arange(40, dtype=np.float64) ** 0.75  # key 10 has weight 0: never drawn
    with single(adapm.Sampling(10, 50, weights=weights, scheme=scheme, seed=5)) as node:
        keys = draw(node.worker(), 1000, times=30)
        counts = np.bincount(keys - 10, minlength=40)
        assert counts[0] == 0
        expected = weights[1:] / weights.sum() * len(keys)
        assert scipy_stats.chisquare(counts[1:], expected).pvalue > P_MIN


@pytest.mark.parametrize("scheme", ["local", "naive"])
@pytest.mark.parametrize("weighted", [False, True])
def test_without_replacement_is_distinct(scheme, weighted):
    weights = np.linspace(1, 5, 60) if weighted else None
    sampling = adapm.Sampling(0, 60, weights=weights, replacement=False, scheme=scheme)
    with single(sampling) as node:
        w = node.worker()
        for n in (1, 7, 59, 60):
            keys = draw(w, n)
            assert len(np.unique(keys)) == n
        with pytest.raises(adapm.InvalidArgument, match="61 distinct keys"):
            w.prepare_sample(61, 0)


@pytest.mark.parametrize("scheme", ["local", "naive"])
def test_distinct_keys_of_a_skewed_distribution_follow_successive_sampling(scheme):
    """replacement=False with one heavy key: each sample is drawn as successive picks, each by
    weight among the keys not yet picked (rejecting repeats of the heavy key gave up: 'could
    not draw 50 keys in 1000 rounds', on one node holding every key). Inclusion frequencies
    against the exact ones, by enumerating the ordered draws of 3 of 6 keys."""
    import itertools

    weights = np.array([1e6, 1.0, 2.0, 3.0, 4.0, 5.0])
    sampling = adapm.Sampling(0, 6, weights=weights, replacement=False, scheme=scheme, seed=7)
    exact = np.zeros(6)
    for picks in itertools.permutations(range(6), 3):
        p, left = 1.0, weights.sum()
        for k in picks:
            p *= weights[k] / left
            left -= weights[k]
        exact[list(picks)] += p
    with single(sampling, num_keys=6) as node:
        w = node.worker()
        samples = [draw(w, 3) for _ in range(3000)]
        assert all(len(np.unique(keys)) == 3 for keys in samples)
        counts = np.bincount(np.concatenate(samples), minlength=6)
        assert counts[0] == 3000  # the heavy key is in every sample
        assert scipy_stats.chisquare(counts[1:], exact[1:] * 3000 * 2 / exact[1:].sum()
                                     ).pvalue > P_MIN
    heavy = adapm.Sampling(0, 100, weights=np.r_[1e6, np.ones(99)], replacement=False,
                           scheme=scheme)
    with single(heavy) as node:
        w = node.worker()
        for n in (50, 100):
            keys = draw(w, n)
            assert len(keys) == len(np.unique(keys)) == n and 0 in keys


def test_values_belong_to_the_drawn_keys():
    sampling = adapm.Sampling(0, 100)
    lengths = np.arange(100) % 3 + 1
    with adapm.init(config=adapm.Config(num_keys=100, value_length=lengths,
                                        sampling=sampling)) as node:
        w = node.worker()
        keys = np.arange(100)
        w.set(keys, np.repeat(keys, lengths).astype(np.float32))
        drawn, values = w.pull_sample(w.prepare_sample(500, 0))
        assert np.array_equal(values, np.repeat(drawn, lengths[drawn]).astype(np.float32))
        s = node.stats()
        assert s["sampled_keys"] == s["sampled_local_keys"] == 500
        assert s["sampled_remote_keys"] == 0


def test_bad_input_changes_nothing():
    with single(adapm.Sampling(0, 10)) as node:
        w = node.worker()
        for bad_n in (0, -3, 2.5, "4", True):
            with pytest.raises((adapm.InvalidArgument, adapm.InvalidType), match="n:"):
                w.prepare_sample(bad_n, 0)
        for start, end in ((-1, None), (5, 5), (5, 2), ("a", None)):
            with pytest.raises((adapm.InvalidArgument, adapm.InvalidType)):
                w.prepare_sample(3, start, end)
        h = w.prepare_sample(3, 0)
        w.pull_sample(h)
        with pytest.raises(adapm.InvalidArgument, match="pulled once"):
            w.pull_sample(h)
        for bad in (h + 1, -1, "0", 1.0):
            with pytest.raises((adapm.InvalidArgument, adapm.InvalidType), match="handle"):
                w.pull_sample(bad)
        # another worker's handle is not this one's (handles were counters from 0 per worker:
        # the other's first handle was this one's first, and was taken)
        a, b = node.worker(), node.worker()
        mine, theirs = a.prepare_sample(3, 0), b.prepare_sample(3, 0)
        with pytest.raises(adapm.InvalidArgument, match="not a prepared sample of this worker"):
            a.pull_sample(theirs)
        a.pull_sample(mine)
        b.pull_sample(theirs)
        assert node.stats()["sampled_keys"] == 9
        assert node.stats()["intents_signalled"] == 0


def test_a_pull_sample_that_failed_can_be_tried_again():
    """replacement=False asking more keys than the node holds: the pull raises, and the handle
    stays for a pull after the keys came (it was used up by the failed pull)."""
    results = run_cluster(_retry_job, 2, timeout_s=60,
                          config={**FAST, "num_keys": 20, "value_length": 2,
                                  "sampling": adapm.Sampling(0, 20, replacement=False)})
    assert results == [("StateError", 12), ("StateError", 12)]


def _retry_job(node):
    w = node.worker()
    h = w.prepare_sample(12, w.clock + 1)  # 10 of the 20 keys are held here
    try:
        w.pull_sample(h)
        failed = "pulled"
    except adapm.StateError:
        failed = "StateError"
    w.intent(np.arange(20), w.clock + 1, w.clock + 3)  # now every key comes here (a replica)
    w.advance_clock()
    w.wait_sync()
    keys, _ = w.pull_sample(h)
    node.barrier()
    return failed, len(np.unique(keys))


def _numpy_alias_draw(rng, prob, alias, low, n):
    """Vose's alias draw in numpy steps: what Sampling.draw computed before its native call."""
    index = rng.integers(0, len(prob), n, dtype=np.int64)
    take_alias = rng.random(n) >= prob[index]
    index[take_alias] = alias[index[take_alias]]
    return index + low


@settings(max_examples=60, deadline=None)
@given(size=st.one_of(st.integers(1, 40), st.integers(1, 300_000)),
       sizes=st.lists(st.integers(0, 2_000), min_size=1, max_size=4),
       seed=st.integers(0, 2**32 - 1),
       bits=st.sampled_from([np.random.PCG64, np.random.MT19937, np.random.Philox,
                             np.random.SFC64]))
def test_weighted_draws_read_numpys_stream_bit_for_bit(size, sizes, seed, bits):
    """Sampling.draw's native alias draw gives what numpy's Generator gives for the same
    steps, and leaves the generator where numpy would: the one-worker runs and the baseline's
    draws stay what they were. One draw per sample, and several samples in one call."""
    weights = np.random.default_rng(size).random(size) ** 4
    weights[0] += 1.0  # a positive sum
    sampling = adapm.Sampling(10, 10 + size, weights=weights)
    prob, alias, _ = sampling._alias
    ours, theirs = np.random.Generator(bits(seed)), np.random.Generator(bits(seed))
    for n in sizes:
        np.testing.assert_array_equal(sampling.draw(ours, n),
                                      _numpy_alias_draw(theirs, prob, alias, 10, n))
    out = np.full(sum(sizes) + 3, -1, dtype=np.int64)
    with ours.bit_generator.lock:
        _native.alias_draw(ours.bit_generator, prob, alias, 10, out, np.array(sizes))
    expected = [_numpy_alias_draw(theirs, prob, alias, 10, n) for n in sizes]
    np.testing.assert_array_equal(out[:sum(sizes)], np.concatenate(expected))
    assert (out[sum(sizes):] == -1).all()  # nothing written past the samples
    assert ours.integers(0, 2**62) == theirs.integers(0, 2**62)  # the same state after


def test_the_native_alias_draw_checks_its_arguments():
    sampling = adapm.Sampling(0, 5, weights=np.arange(1.0, 6.0))
    prob, alias, _ = sampling._alias
    rng = np.random.default_rng(0)
    out = np.empty(4, dtype=np.int64)
    with pytest.raises(TypeError, match="BitGenerator"):
        _native.alias_draw(rng, prob, alias, 0, out)  # the Generator, not its bit generator
    with pytest.raises(TypeError, match="item size"):
        _native.alias_draw(rng.bit_generator, prob, alias, 0, out.astype(np.int32))
    with pytest.raises(ValueError, match="one equal length"):
        _native.alias_draw(rng.bit_generator, prob, alias[:4], 0, out)
    for sizes in ([5], [2, 3], [-1]):
        with pytest.raises(ValueError, match="sizes"):
            _native.alias_draw(rng.bit_generator, prob, alias, 0, out, np.array(sizes))
    state = rng.bit_generator.state
    with pytest.raises(ValueError):
        _native.alias_draw(rng.bit_generator, prob[:0], alias[:0], 0, out)
    assert rng.bit_generator.state == state  # refused before drawing anything


@given(st.integers(-5, 120), st.integers(-5, 120))
@settings(max_examples=60, deadline=None)
def test_bad_domains_are_config_errors(low, high):
    if 0 <= low < high <= 100:
        adapm.Config(num_keys=100, sampling=adapm.Sampling(low, high))
        return
    with pytest.raises(adapm.ConfigError, match="sampling"):
        adapm.Config(num_keys=100, sampling=adapm.Sampling(low, high))


def test_bad_weights_and_schemes():
    for weights in ([1.0, -1.0, 2.0], [0.0, 0.0, 0.0], [1.0, float("nan"), 1.0], [1.0, 2.0]):
        with pytest.raises(adapm.ConfigError, match="weight"):
            adapm.Sampling(0, 3, weights=np.array(weights))
    for weights in ("abc", [1.0, "x", 2.0], [[1.0], [2.0, 3.0]]):
        with pytest.raises(adapm.ConfigError, match="weights must be numbers"):
            adapm.Sampling(0, 3, weights=weights)
    for weights, shown in (([1.0, -1.5, 2.0], "entry 1 is -1.5;"),
                           ([1.0, 1.0, float("nan")], "entry 2 is nan;")):
        with pytest.raises(adapm.ConfigError, match=shown):  # the value, not a literal "%g"
            adapm.Sampling(0, 3, weights=np.array(weights))
    with pytest.raises(adapm.ConfigError, match="scheme"):
        adapm.Sampling(0, 3, scheme="pool")
    with pytest.raises(adapm.ConfigError, match="sampling"):
        adapm.Config(num_keys=10, sampling=(0, 3))


def test_no_domain_is_a_state_error():
    with adapm.init(num_keys=10) as node:
        w = node.worker()
        with pytest.raises(adapm.StateError, match="no sampling domain"):
            w.prepare_sample(1, 0)
        with pytest.raises(adapm.StateError, match="no sampling domain"):
            w.pull_sample(0)


# --- real processes ------------------------------------------------------------------------

DOMAIN = 2000


def _naive_job(node):
    w = node.worker()
    handles = [w.prepare_sample(200, 1) for _ in range(5)]
    w.advance_clock()
    w.wait_sync()
    node.barrier()
    pulled = [w.pull_sample(h) for h in handles]
    return node.stats(), [k.tolist() for k, _ in pulled]


def test_naive_draws_are_local_after_wait_sync():
    config = dict(num_keys=DOMAIN, value_length=4, sampling=adapm.Sampling(0, DOMAIN,
                                                                           scheme="naive"), **FAST)
    for rank, (s, keys) in enumerate(run_cluster(_naive_job, 2, config=config, timeout_s=90)):
        assert s["sampled_keys"] == 1000
        assert s["sampled_remote_keys"] == 0 and s["remote_pull_keys"] == 0, (rank, s)
        assert s["intents_signalled"] == 1000
        # Most draws are homed on the other node: they were moved here by the intent.
        assert sum(k % 2 != rank for ks in keys for k in ks) > 300


def _mover(node, stop):
    """Keeps keys of the domain moving: intents for random batches, clock after clock."""
    w = node.worker()
    rng = np.random.default_rng(node.rank)
    while not stop.is_set():
        w.intent(rng.integers(0, DOMAIN, 300), w.clock + 1, w.clock + 3)
        w.advance_clock()
        w.wait_sync()


@contextlib.contextmanager
def _keys_moving(node):
    """A thread runs :func:`_mover` on ``node`` while the block runs; its error, if any, is
    raised after the block."""
    stop = threading.Event()
    errors = []

    def guarded():
        try:
            _mover(node, stop)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    mover = threading.Thread(target=guarded)
    mover.start()
    try:
        yield
    finally:
        stop.set()
        mover.join()
    if errors:
        raise errors[0]


def _batches_until_moved(node, minimum, deadline_s=60.0):
    """Yields batch numbers: at least ``minimum``, then on until a key moved into this node
    (or ``deadline_s`` passed, and the caller's check fails). On a loaded machine the worker's
    batches, all local, can end before the mover's first relocation reaches this node; the
    test would then check nothing (CI saw it once in many runs)."""
    deadline = time.monotonic() + deadline_s
    batch = 0
    while batch < minimum or (time.monotonic() < deadline and not _moved(node.stats())):
        yield batch
        batch += 1


def _moved(s):
    return s["relocations_in"] + s["replica_setups"] > 0


def _local_job(node):
    w = node.worker()
    if node.rank == 0:
        keys = np.arange(DOMAIN)
        w.set(keys, np.repeat(keys, 4).reshape(-1, 4).astype(np.float32))
        w.wait()
    node.barrier()
    wrong = 0
    zeros = np.zeros((100, 4), np.float32)
    batches = 0
    with _keys_moving(node):
        for batches in _batches_until_moved(node, 300):
            keys, values = w.pull_sample(w.prepare_sample(100, w.clock))
            wrong += int(np.count_nonzero(values != keys[:, None]))
            # The sample's push must stay local too (its keys are pinned from before they are
            # read until the next clock), whatever the engine decides meanwhile.
            w.push(keys, zeros)
            w.advance_clock()
    node.barrier()
    # No node starts a round from here on, so nothing moves any more (a round's moves reach a
    # node before the barrier's release): the pool must hold exactly the domain's held keys,
    # whichever path took each key in or out (the engine, or the transport serving a SYNC).
    node.engine.quiesce(30)
    node._barrier(None, refresh=False)  # as a checkpoint meets: no round after it
    state = node.engine.state
    pool = state.store.sample_pool
    pooled = np.sort(pool.keys[:pool.count])
    held = np.flatnonzero(state.store.states(np.arange(DOMAIN, dtype=np.int64)) != NONE)
    node.engine.resume()
    s = node.stats()
    return s, wrong, pooled.tolist() == held.tolist(), batches + 1


def test_local_draws_never_go_remote_while_keys_move():
    config = dict(num_keys=DOMAIN, value_length=4, sampling=adapm.Sampling(0, DOMAIN), **FAST)
    results = run_cluster(_local_job, 2, config=config, timeout_s=120)
    for rank, (s, wrong, pool_is_held, batches) in enumerate(results):
        assert wrong == 0, f"rank {rank}: sampled values that are not their key's"
        assert s["sampled_keys"] == 100 * batches
        assert s["sampled_remote_keys"] == 0, (rank, s)
        # A sample's push stays local: its keys are pinned before they are read, and the
        # engine keeps the pins locked from its check to a key's leaving (dir_sync_pins).
        # Before that, the demo's pushes of sampled keys went remote 80-220 times per node and
        # run; this test's timing did not show it (0 in 2,000 samples with the old code).
        assert s["remote_push_keys"] == 0, (rank, s)
        assert _moved(s), "no key moved: the test is void"
        assert pool_is_held, f"rank {rank}: the sample pool is not the held keys"
    # The peers' sync rounds were answered inside the transport (native/sync_fast.c) here too.
    assert sum(s["syncs_served_natively"] for s, *_ in results) > 0


def _sample_keys_job(node):
    """sample_keys while the mover keeps keys moving: every run's keys held here and pinned
    once per draw until the next clock, their pushes local."""
    w = node.worker()
    directory, store = node.engine.state.directory, node.engine.state.store
    bad_held = bad_pins = batches = 0
    with _keys_moving(node):
        for batches in _batches_until_moved(node, 200):
            keys = w.sample_keys(60, 4)
            bad_held += int(np.count_nonzero(store.states(keys) == NONE))
            # Pinned as often as drawn (the mover's worker pins nothing).
            pins = np.frombuffer(directory.pinned(keys), dtype=np.int32)
            bad_pins += int(np.count_nonzero(pins != np.bincount(keys)[keys]))
            w.push(keys, np.ones((len(keys), 4), np.float32))
            w.advance_clock()
    every = np.arange(DOMAIN, dtype=np.int64)
    left = np.frombuffer(directory.pinned(every), dtype=np.int32)
    # The native draw refuses bad arguments, and gives up (-2, nothing pinned) on a pool of
    # keys none of which is held here.
    pool, bits, out = store.sample_pool, np.random.default_rng(0).bit_generator, np.empty(9, int)
    refused = []
    for args in ((np.random.default_rng(0), pool.keys, pool.counter, None, out, 5),
                 (bits, pool.keys, pool.counter[:0], None, out, 5),
                 (bits, pool.keys, pool.counter, None, out, 0),
                 (bits, pool.keys, pool.counter, None, out.astype(np.int32), 5)):
        try:
            directory.draw_held(*args)
        except (TypeError, ValueError) as exc:
            refused.append(type(exc).__name__)
    elsewhere = every[store.states(every) == NONE]
    gave_up = directory.draw_held(bits, elsewhere, np.array([len(elsewhere)]), None, out, 3) \
        if len(elsewhere) else -2
    left += np.frombuffer(directory.pinned(every), dtype=np.int32)
    w.wait()
    return (bad_held, bad_pins, int(np.count_nonzero(left)), node.stats(), refused, gave_up,
            batches + 1)


def test_sample_keys_are_held_and_pinned_until_the_next_clock():
    config = dict(num_keys=DOMAIN, value_length=4, sampling=adapm.Sampling(0, DOMAIN), **FAST)
    results = run_cluster(_sample_keys_job, 2, config=config, timeout_s=120)
    for rank, (bad_held, bad_pins, left, s, refused, gave_up, batches) in enumerate(results):
        assert refused == ["TypeError", "ValueError", "ValueError", "TypeError"], refused
        assert gave_up == -2, gave_up
        assert bad_held == 0, f"rank {rank}: {bad_held} sampled keys not held here"
        assert bad_pins == 0, f"rank {rank}: {bad_pins} sampled keys pinned otherwise than drawn"
        assert left == 0, f"rank {rank}: {left} keys still pinned after the last clock"
        assert s["sampled_keys"] == batches * 240 and s["remote_push_keys"] == 0, (rank, s)
        assert _moved(s), "no key moved: the test is void"


def test_the_draw_reads_the_held_map_while_the_engine_copies_it():
    """Directory.draw_held tests each drawn key in the store's held map while the engine thread,
    without the GIL, inserts and removes keys and so copies the map and frees the old table
    (tests/held_draw_race.py). The draw reads inside a reader's section, as the store's batch
    calls do; without it this crashed within seconds (SIGSEGV; 3 of 3 runs of 3 s), and a
    2-node KGE run crashed so about once in 300."""
    job = str(Path(__file__).with_name("held_draw_race.py"))
    done = subprocess.run([sys.executable, job, "3"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    draws, copies = (int(x) for x in done.stdout.split()[1::2])
    assert draws > 100 and copies > 5, done.stdout  # both sides ran: the race was there


@pytest.mark.parametrize("scheme", ["local", "naive"])
def test_pull_sample_into_out(scheme):
    lengths = np.where(np.arange(60) < 40, 3, 5)  # the domain [0, 40) has one length
    config = adapm.Config(num_keys=60, value_length=lengths,
                          sampling=adapm.Sampling(0, 40, scheme=scheme))
    with adapm.init(config=config) as node:
        w = node.worker()
        w.set(np.arange(40), np.repeat(np.arange(40), 3).astype(np.float32))
        h = w.prepare_sample(8, 0)
        with pytest.raises(adapm.InvalidArgument, match="shape"):
            w.pull_sample(h, out=np.empty(23, np.float32))
        with pytest.raises(adapm.InvalidType, match="float32"):
            w.pull_sample(h, out=np.empty(24, np.float64))
        out = np.full(24, -1, np.float32)
        keys, values = w.pull_sample(h, out=out)  # the handle survived the bad calls
        assert values is out and np.array_equal(out, np.repeat(keys, 3).astype(np.float32))
    config = adapm.Config(num_keys=60, value_length=lengths,
                          sampling=adapm.Sampling(30, 50, scheme=scheme))
    with adapm.init(config=config) as node:
        w = node.worker()
        with pytest.raises(adapm.InvalidArgument, match="differ in value length"):
            w.pull_sample(w.prepare_sample(2, 0), out=np.empty(6, np.float32))
    with single(adapm.Sampling(0, 100, scheme=scheme), value_length=4) as node:
        w = node.worker()
        out = np.empty((10, 4), np.float32)
        keys, values = w.pull_sample(w.prepare_sample(10, 0), out=out)
        assert values is out and len(keys) == 10


def _pinned_sample_job(node):
    """Rank 0 pulls a local sample, which pins its keys until rank 0's next clock; then rank 1
    wants every key of the domain. Rank 1's reports on the pinned keys are deferred (its other
    keys move at once); rank 0 pushes its sample, still owned here, and advances its clock;
    then the pinned keys move to rank 1 too."""
    w = node.worker()
    node.barrier()
    keys = None
    if node.rank == 0:
        keys, _ = w.pull_sample(w.prepare_sample(50, w.clock))
    node.barrier()
    result = None
    if node.rank == 1:
        w.intent(np.arange(DOMAIN), w.clock + 1, w.clock + 1000)
        w.advance_clock()
    else:
        # Rank 1's first round reaches rank 0 within milliseconds (its reports on the sample's
        # keys are deferred there, and asked again each round, for up to a second).
        deadline = time.monotonic() + 0.5
        while node.stats()["deferred_reports"] < len(np.unique(keys)) and \
                time.monotonic() < deadline:
            time.sleep(0.002)
        deferred = node.stats()["deferred_reports"]
        before = node.stats()["remote_push_keys"]
        w.push(keys, np.ones((len(keys), 4), np.float32))
        result = (deferred, len(np.unique(keys)), node.stats()["remote_push_keys"] - before,
                  np.bincount(keys, minlength=DOMAIN).tolist())
        w.advance_clock()  # the pins go: the keys may leave
    node.barrier()
    if node.rank == 1:
        w.wait_sync()  # every intent served: every key of the domain is here now
    node.barrier()
    held = node.local_keys()
    return result, w.pull(np.arange(DOMAIN))[:, 0].tolist(), len(held), node.stats()


def test_a_local_sample_stays_here_until_its_push():
    config = dict(num_keys=DOMAIN, value_length=4, sampling=adapm.Sampling(0, DOMAIN), **FAST)
    (result, values0, _, _), (_, values1, held1, stats1) = run_cluster(
        _pinned_sample_job, 2, config=config, timeout_s=90)
    deferred, sampled, remote, counts = result
    assert deferred >= sampled > 0, result  # every sampled key's report was deferred
    assert remote == 0, result  # so the push stayed local
    assert held1 == DOMAIN  # then they moved: every key rank 0 owned is rank 1's now
    assert stats1["relocations_in"] == DOMAIN // 2 and stats1["replica_setups"] == 0, stats1
    assert values0 == values1 == [float(c) for c in counts]  # every push arrived, once


def _skewed_local_job(node):
    """Nearly all of the weight lies on keys homed at the other node: drawing from the whole
    distribution and keeping what is held here would almost never succeed."""
    w = node.worker()
    node.barrier()
    keys = draw(w, 500, times=4)
    held = node.store.snapshot()["state"][keys] != 0
    return keys.tolist(), bool(held.all()), node.stats()


def test_local_draws_by_weight_when_little_of_the_distribution_is_held():
    # Key k is homed at rank k % 2; the keys of rank 1 carry 10^6 times the weight of rank 0's.
    weights = np.where(np.arange(DOMAIN) % 2 == 1, 1e6, 1.0)
    weights[:100] *= np.arange(1, 101)  # and, among the rest, a skew to check the distribution
    config = dict(num_keys=DOMAIN, value_length=4, management="static_partition",
                  sampling=adapm.Sampling(0, DOMAIN, weights=weights, seed=7), **FAST)
    for rank, (keys, held, stats) in enumerate(run_cluster(_skewed_local_job, 2, config=config,
                                                           timeout_s=90)):
        keys = np.array(keys)
        assert held and (keys % 2 == rank).all(), rank
        assert stats["sampled_remote_keys"] == 0
        if rank == 0:
            # By weight among the keys held here: the first 100 even keys weigh 1..100 x.
            mine = np.arange(0, DOMAIN, 2)
            p = weights[mine] / weights[mine].sum()
            counts = np.bincount(keys // 2, minlength=len(mine))
            first = slice(0, 50)  # keys 0..98, weights 1..99: enough draws each
            expected = p[first] * len(keys)
            observed = counts[first]
            rest_e, rest_o = len(keys) - expected.sum(), len(keys) - observed.sum()
            chi = scipy_stats.chisquare(np.append(observed, rest_o), np.append(expected, rest_e))
            assert chi.pvalue > P_MIN, chi
