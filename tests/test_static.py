"""Several real node processes on loopback (adapm.testing.run_cluster), no mocks.

Covers exact sums under concurrent pushes from many workers of many nodes, set/push ordering,
duplicates and per-key lengths across nodes, read-your-writes through one worker, the traffic
counters, timeouts that name both ranks, a failed communication thread surfacing in every call,
and the cluster fixture itself (it must fail loudly).

Job functions are module-level so that the spawned children can import them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adapm
from adapm.testing import ClusterFailure, run_cluster

# Short timeouts: a broken rank must fail the test quickly, never hang it.
FAST = dict(connect_timeout_s=20, request_timeout_s=20)


def cluster(fn, world_size, *, args=(), timeout_s=60, **config):
    return run_cluster(fn, world_size, args=args, timeout_s=timeout_s, config={**FAST, **config})


# --- exact sums under concurrent pushes ---------------------------------------------------------

S_KEYS, S_DIM, S_NODES, S_THREADS = 50, 3, 3, 2


def initial(num_keys=S_KEYS, dim=S_DIM):
    return (np.arange(num_keys)[:, None] * 10 + np.arange(dim)).astype(np.float32)


def _push_list(worker, batches):
    for keys, updates in batches:
        # One small integer per key, the same for each of its floats (so that a torn read, with
        # some floats of a row before an update and some after, can be seen).
        rows = np.repeat(np.array(updates, np.float32)[:, None], S_DIM, axis=1)
        worker.push(np.array(keys, np.int64), rows)
    worker.wait()


def _read_until(worker, stop, torn):
    everything = np.arange(S_KEYS)
    base = initial()
    out = np.empty((S_KEYS, S_DIM), np.float32)
    while True:
        last = stop.is_set()
        worker.pull(everything, out=out)
        diff = out - base
        torn[0] += int(np.count_nonzero(np.any(diff != diff[:, :1], axis=1)))
        torn[1] += 1
        if last:
            return


def _exact_sums_job(node, schedule):
    workers = [node.worker() for _ in range(S_THREADS)]
    everything = np.arange(S_KEYS)
    if node.rank == 0:  # initial values: set by rank 0, mostly on remote keys
        workers[0].set(everything, initial())
        workers[0].wait()
    node.barrier()
    stop, torn = threading.Event(), [0, 0]
    reader = threading.Thread(target=_read_until, args=(node.worker(), stop, torn))
    reader.start()
    threads = [threading.Thread(target=_push_list, args=(w, schedule[node.rank][i]))
               for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    reader.join()
    node.barrier()
    return workers[1].pull(everything), node.stats(), torn


_batch = st.integers(1, 8).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, S_KEYS - 1), min_size=n, max_size=n),
    st.lists(st.integers(-4, 4), min_size=n, max_size=n),
))
_schedule = st.lists(
    st.lists(st.lists(_batch, max_size=6), min_size=S_THREADS, max_size=S_THREADS),
    min_size=S_NODES, max_size=S_NODES,
)


@pytest.mark.parametrize("management", ["static_partition", None])
@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(schedule=_schedule)
def test_exact_sums(management, schedule):
    extra = {} if management is None else {"management": management}
    results = cluster(_exact_sums_job, S_NODES, args=(schedule,), num_keys=S_KEYS,
                      value_length=S_DIM, **extra)
    expected = initial().astype(np.float64)
    pushed_keys = 0
    for per_node in schedule:
        for batches in per_node:
            for keys, updates in batches:
                np.add.at(expected, keys, np.repeat(np.array(updates)[:, None], S_DIM, axis=1))
                pushed_keys += len(keys)
    for rank, (values, stats, (torn, reads)) in enumerate(results):
        np.testing.assert_array_equal(values, expected, err_msg=f"rank {rank}")
        assert reads >= 1
        assert torn == 0, f"rank {rank}: {torn} rows read half-updated in {reads} pulls"
    assert sum(s["local_push_keys"] + s["remote_push_keys"] for _, s, _ in results) == pushed_keys
    if management != "static_partition":
        return
    # Pushes to keys whose home is another rank are remote, the rest local (static homes).
    for rank, (_, stats, _) in enumerate(results):
        keys = [k for batches in schedule[rank] for ks, _ in batches for k in ks]
        assert stats["remote_push_keys"] == sum(1 for k in keys if k % S_NODES != rank)
        assert stats["local_push_keys"] == sum(1 for k in keys if k % S_NODES == rank)


# --- set/push ordering, duplicates, per-key lengths ----------------------------------------------


def _set_then_push_job(node):
    w = node.worker()
    n = node.world_size
    keys = np.arange(12)
    if node.rank == 0:
        # Same worker: the set reaches each owner before the push that follows it.
        w.set(keys, np.full((12, 2), 5, np.float32))
        w.push(keys, np.ones((12, 2), np.float32))
        w.wait()
    node.barrier()
    first = w.pull(keys)
    node.barrier()
    # Now every rank overwrites the keys it does not own, then pushes its rank to all keys.
    foreign = keys[keys % n != node.rank]
    w.set(foreign[foreign % n == (node.rank + 1) % n], np.full((4, 2), 100, np.float32))
    w.wait()
    node.barrier()
    w.push(keys, np.full((12, 2), node.rank, np.float32))
    w.wait()
    node.barrier()
    return first, w.pull(keys)


def test_set_then_push_across_nodes():
    results = cluster(_set_then_push_job, 3, num_keys=12, value_length=2)
    total_ranks = 0 + 1 + 2
    for rank, (first, second) in enumerate(results):
        np.testing.assert_array_equal(first, np.full((12, 2), 6), err_msg=f"rank {rank}")
        # Each key was set to 100 by exactly one rank (the one just before its home), then every
        # rank pushed its rank number.
        np.testing.assert_array_equal(second, np.full((12, 2), 100 + total_ranks),
                                      err_msg=f"rank {rank}")


def _duplicates_job(node):
    w = node.worker()
    if node.rank == 0:
        # Keys 1, 3, 5 live on rank 1; key 2 is local. Duplicates add up on the owner.
        w.push([1, 1, 3, 1, 2, 2], np.array([[1, 0], [2, 0], [5, 5], [4, 0], [7, 7], [1, 1]],
                                            np.float32))
        w.wait()
    node.barrier()
    request = [3, 1, 1, 0, 3, 2, 5, 1]
    pulled = w.pull(request)
    out = np.full((len(request), 2), -1, np.float32)
    same = w.pull(request, out=out) is out
    return pulled, out, same


def test_duplicates_in_remote_pull_and_push():
    results = cluster(_duplicates_job, 2, num_keys=8, value_length=2)
    values = {0: [0, 0], 1: [7, 0], 2: [8, 8], 3: [5, 5], 5: [0, 0]}
    expected = np.array([values[k] for k in [3, 1, 1, 0, 3, 2, 5, 1]], np.float32)
    for rank, (pulled, out, same) in enumerate(results):
        np.testing.assert_array_equal(pulled, expected, err_msg=f"rank {rank}")
        np.testing.assert_array_equal(out, expected, err_msg=f"rank {rank} (out=)")
        assert same


P_LENGTHS = np.array([1, 3, 2, 4, 1, 2, 5, 1, 3])


def _packed(keys, base):
    return np.concatenate([base * 100 + k * 10 + np.arange(P_LENGTHS[k]) for k in keys]).astype(
        np.float32)


def _per_key_lengths_job(node):
    w = node.worker()
    n = node.world_size
    all_keys = np.arange(len(P_LENGTHS))
    # Each rank sets the keys of the next rank, so all sets are remote.
    mine = all_keys[all_keys % n == (node.rank + 1) % n]
    w.set(mine, _packed(mine, 0))
    w.wait()
    node.barrier()
    # Then every rank pushes 1 to every float of a request with duplicates.
    request = np.array([6, 1, 6, 0, 8, 3])
    w.push(request, np.ones(int(P_LENGTHS[request].sum()), np.float32))
    w.wait()
    node.barrier()
    everything = w.pull(all_keys)
    mixed = np.array([8, 2, 2, 7, 1])
    buf = np.full(int(P_LENGTHS[mixed].sum()), -1, np.float32)
    w.pull(mixed, out=buf)
    return everything, buf


def test_per_key_lengths_across_nodes():
    n = 3
    results = cluster(_per_key_lengths_job, n, num_keys=len(P_LENGTHS), value_length=P_LENGTHS)
    counts = np.bincount([6, 1, 6, 0, 8, 3], minlength=len(P_LENGTHS)) * n
    offsets = np.concatenate(([0], np.cumsum(P_LENGTHS)))
    expect = _packed(range(len(P_LENGTHS)), 0) + np.repeat(counts, P_LENGTHS)
    mixed = np.concatenate([expect[offsets[k]:offsets[k + 1]] for k in [8, 2, 2, 7, 1]])
    for rank, (everything, buf) in enumerate(results):
        assert everything.shape == (int(P_LENGTHS.sum()),)
        np.testing.assert_array_equal(everything, expect, err_msg=f"rank {rank}")
        np.testing.assert_array_equal(buf, mixed, err_msg=f"rank {rank} (out=)")


def _read_your_writes_job(node, rounds):
    w = node.worker()
    seen = []
    if node.rank == 1:
        remote = [0, 2, 4]  # homes on rank 0
        for i in range(rounds):
            # No wait() in between: the pull follows the push through the same worker.
            w.push(remote, np.ones((3, 2), np.float32))
            seen.append(w.pull(remote)[:, 0].tolist())
            if i % 5 == 4:
                w.set([2], np.full((1, 2), -i, np.float32))
                seen.append(w.pull([2])[:, 0].tolist())
        w.wait()
    node.barrier()
    return seen, w.pull([0, 2, 4])


def test_remote_pull_sees_own_earlier_pushes():
    rounds = 30
    results = cluster(_read_your_writes_job, 2, args=(rounds,), num_keys=6, value_length=2)
    seen = results[1][0]
    expect = []
    model = np.zeros(6)
    for i in range(rounds):
        model[[0, 2, 4]] += 1
        expect.append(model[[0, 2, 4]].tolist())
        if i % 5 == 4:
            model[2] = -i
            expect.append([model[2]])
    assert seen == expect
    for rank, (_, final) in enumerate(results):
        np.testing.assert_array_equal(final[:, 0], model[[0, 2, 4]], err_msg=f"rank {rank}")


def _only_requests_job(node, seconds):
    """Rank 0 only pulls and pushes keys of rank 1 (served there in C, native/zmq_io.c) for
    longer than the failure timeout; rank 1's engine never sees one of them."""
    w = node.worker()
    node.barrier()
    if node.rank == 0:
        remote = np.array([1, 3, 5], np.int64)  # homed on rank 1
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            w.push(remote, np.ones((3, 2), np.float32))
            w.pull(remote)
        w.wait()
    node.barrier()
    return node.stats()


def test_requests_served_in_c_keep_their_sender_alive():
    """A peer heard from only through requests the transport serves itself is alive: the
    failure detector is told (rank 0 sends nothing else, not even heartbeats, while it
    keeps sending requests), so nobody is declared failed."""
    results = cluster(_only_requests_job, 2, args=(3.0,), num_keys=6, value_length=2,
                      failure_timeout_s=1.0, management="static_partition")
    served = results[1]["messages_served_natively"]
    assert served > 50 and served >= results[1]["messages_received"] - 10, results[1]
    assert results[0]["remote_push_keys"] > 0



def _burst_job(node, sets):
    """Rank 0 sets rank 1's keys one at a time, as fast as it can: its engine bundles the sets
    that queue up while it is busy into wire messages of many requests (pushes would go
    through the transport one by one, ZmqIO.push)."""
    w = node.worker()
    before = node.stats()
    node.barrier()  # rank 1 measures before rank 0 makes it serve anything
    if node.rank == 0:
        for i in range(sets):
            w.set(np.array([2 * (i % 50) + 1]), np.full((1, 2), i, np.float32))  # odd: rank 1's
        w.wait()
    node.barrier()
    after = node.stats()
    out = w.pull(np.arange(1, 100, 2))
    return {k: after.get(k, 0) - before.get(k, 0) for k in (
        "messages_received_set", "wire_messages_received", "messages_served_natively")}, out


def test_a_burst_of_bundled_requests_is_served_in_c():
    """However many requests one wire message bundles, the owner serves them in C (bundles of
    more than 32 went to Python before: none of this burst was served natively), in order."""
    sets = 4000
    results = cluster(_burst_job, 2, args=(sets,), num_keys=100, value_length=2,
                      management="static_partition")
    got, out = results[1]
    assert got["messages_received_set"] == sets, got
    assert got["wire_messages_received"] < sets / 4, got  # bundled, as the test intends
    # A heartbeat in the same receive sends the rest of that poll's messages through Python.
    assert got["messages_served_natively"] >= 0.98 * sets, got
    last = np.arange(sets - 50, sets, dtype=np.float32)  # the last set of each key wins
    for _, values in results:
        np.testing.assert_array_equal(values, np.repeat(last[:, None], 2, axis=1))


def _large_batches_job(node, num_keys, dim):
    w = node.worker()
    keys = np.arange(num_keys)
    updates = np.ones((num_keys, dim), np.float32)
    w.push(keys, updates)  # messages of about 1 MB each, well above zmq's copy threshold
    updates[:] = 1000  # the caller may reuse its buffer at once, even before wait()
    w.push(keys[::-1], updates[:, :] * 0 + node.rank)
    w.wait()
    node.barrier()
    out = np.empty((num_keys, dim), np.float32)
    w.pull(keys, out=out)
    return float(out.min()), float(out.max()), bool(np.all(out == out[0, 0]))


def test_large_batches():
    n, num_keys, dim = 3, 30_000, 16
    results = cluster(_large_batches_job, n, args=(num_keys, dim), num_keys=num_keys,
                      value_length=dim)
    expect = n + sum(range(n))
    for rank, (lo, hi, uniform) in enumerate(results):
        assert (lo, hi, uniform) == (expect, expect, True), f"rank {rank}"


def _few_keys_job(node):
    w = node.worker()
    w.push([0, 1, 1], np.ones((3, 1), np.float32))
    w.wait()
    node.barrier()
    return node.local_keys().tolist(), w.pull([1, 0])[:, 0].tolist()


def test_fewer_keys_than_nodes():
    """With 2 keys on 3 nodes, rank 2 holds nothing and still serves as a client."""
    results = cluster(_few_keys_job, 3, num_keys=2, management="static_partition")
    assert [local for local, _ in results] == [[0], [1], []]
    for rank, (_, values) in enumerate(results):
        assert values == [6, 3], f"rank {rank}"


def _native_rows_job(node):
    w = node.worker()
    return w.native_rows() is None, w.acts_on_intent


@pytest.mark.parametrize("management, none, acts", [("static_partition", True, False),
                                                    ("adaptive", False, True)])
def test_native_rows_where_keys_come_with_intent(management, none, acts):
    """A native training loop gets a node's rows where its batches' keys come here (with
    intent on several nodes, always on one), not under static partitioning on several nodes,
    where most of them stay elsewhere."""
    assert cluster(_native_rows_job, 2, num_keys=8, management=management) == [(none, acts)] * 2
    with adapm.init(num_keys=8, value_length=4) as node:  # one node: every key stays here
        w = node.worker()
        assert type(w.native_rows()).__name__ == "PyCapsule" and not w.acts_on_intent
    with adapm.init(num_keys=8, value_length=np.arange(1, 9)) as node:
        assert node.worker().native_rows() is None  # per-key lengths


# --- counters ----------------------------------------------------------------------------------


def _stats_job(node):
    w = node.worker()
    keys = np.arange(10)
    dim = 4
    before = node.stats()
    node.barrier()  # rank 1 measures before rank 0 makes it serve anything
    if node.rank == 0:
        w.pull(keys)
        w.push(keys, np.ones((10, dim), np.float32))
        w.set([1, 2], np.ones((2, dim), np.float32))
        w.wait()
    node.barrier()
    return before, node.stats()


def _access_wait_job(node):
    w = node.worker()
    dim = 4
    node.barrier()
    local = np.arange(0, 10, 2)  # even keys: homed on rank 0
    out = {}
    if node.rank == 0:
        for _ in range(20):
            w.pull(local)
            w.push(local, np.ones((len(local), dim), np.float32))
        out["after_local"] = node.stats()["access_wait_s"]
        started = time.perf_counter()
        w.pull(np.array([1, 2, 3]))  # 1 and 3 live on rank 1: one round trip
        out["pull_s"] = time.perf_counter() - started
        w.push(np.array([1]), np.ones((1, dim), np.float32))  # remote, not waited for here
        w.wait()
    node.barrier()
    out["stats"] = node.stats()
    return out


def test_access_wait_counts_the_time_a_worker_was_blocked_on_other_nodes():
    """stats()["access_wait_s"]: local accesses add nothing, a remote pull adds the time it
    blocked (no more than the call took), and the node that only served adds nothing."""
    r0, r1 = cluster(_access_wait_job, 2, num_keys=10, value_length=4,
                     management="static_partition")
    assert r0["after_local"] == 0.0
    waited = r0["stats"]["access_wait_s"]
    assert r0["stats"]["remote_pull_keys"] == 2
    assert 0.0 < waited <= r0["pull_s"]
    assert r1["stats"]["access_wait_s"] == 0.0


def test_stats_count_remote_keys_and_traffic():
    results = cluster(_stats_job, 2, num_keys=10, value_length=4, management="static_partition")
    (before0, s0), (before1, s1) = results
    for before in (before0, before1):
        for name in ("remote_pull_keys", "remote_push_keys", "messages_sent", "bytes_sent"):
            assert before[name] == 0, name
    # Rank 0 pulled and pushed keys 0..9: the odd ones live on rank 1.
    assert s0["remote_pull_keys"] == 5 and s0["local_pull_keys"] == 5
    assert s0["remote_push_keys"] == 5 and s0["local_push_keys"] == 5
    assert s0["remote_set_keys"] == 1 and s0["local_set_keys"] == 1
    assert s0["remote_access_share"] == pytest.approx(10 / 20)
    # One grouped message per destination and operation.
    assert s0["messages_sent_pull"] == 1 and s0["messages_sent_push"] == 1
    assert s0["messages_sent_set"] == 1
    assert s0["messages_received_pull_resp"] == 1 and s0["messages_received_ack"] == 2
    assert s0["messages_sent"] > 0 and s0["bytes_sent"] > 0
    assert s0["bytes_sent_pull"] >= 5 * 8  # five int64 keys
    assert s0["bytes_sent_push"] >= 5 * 8 + 5 * 4 * 4  # keys and float32 values
    assert s0["bytes_received_pull_resp"] >= 5 * 4 * 4
    # Rank 1 served them and accessed nothing itself.
    assert s1["remote_pull_keys"] == 0 and s1["local_pull_keys"] == 0
    assert s1["messages_received_pull"] == 1 and s1["messages_received_push"] == 1
    assert s1["messages_received_set"] == 1
    assert s1["messages_sent_pull_resp"] == 1 and s1["messages_sent_ack"] == 2
    # Every key of them owned there: served by the transport in C (native/zmq_io.c), counted
    # like the rest. The pull may have come in one receive with the barrier's release, which
    # goes to Python and takes the rest of that receive's messages of rank 0 with it (their
    # order kept); the push and set come after the pull's answer.
    assert s1["messages_served_natively"] in (2, 3) and s0["messages_served_natively"] == 0
    assert s1["bytes_received_pull"] == s0["bytes_sent_pull"]
    assert s1["bytes_received_push"] == s0["bytes_sent_push"]
    assert s1["bytes_sent_pull_resp"] == s0["bytes_received_pull_resp"]
    # Totals add up over kinds.
    # The same keys on every node from the start, and on one node: a script that reads
    # stats()["messages_sent_sync"] or ["wire_messages_sent"] works on any number of nodes (one
    # node lacked 39 of them, and a counter of a kind appeared once that kind was sent).
    ((one_before, one),) = cluster(_stats_job, 1, num_keys=10, value_length=4)
    assert set(before0) == set(s0) == set(before1) == set(s1) == set(one_before) == set(one)
    assert one["wire_messages_sent"] == one["messages_sent_sync"] == one["awaited_keys"] == 0
    for s in (s0, s1):
        kinds = [k for k in s if k.startswith("messages_sent_")]
        assert s["messages_sent"] == sum(s[k] for k in kinds)
        assert s["messages_received"] == sum(s[k] for k in s if k.startswith("messages_received_"))
        assert s["bytes_sent"] == sum(s[k] for k in s if k.startswith("bytes_sent_"))


# --- timeouts ----------------------------------------------------------------------------------


def _silent_peer_job(node, stopped, done, what):
    """Ranks > 0 stop serving (their communication threads end); rank 0 must time out, not hang.

    ``stopped[r]`` is set once rank r no longer serves; ``done`` once rank 0 has its answer.
    """
    if node.rank > 0:
        node.barrier()
        node.engine.stop()
        stopped[node.rank].set()
        finished = done.wait(30)
        node._release()  # no collective shutdown: this node cannot serve a barrier any more
        return finished
    node.barrier()
    if not all(event.wait(30) for event in stopped[1:]):
        node._release()
        return "a silent rank never stopped"
    w = node.worker()
    start = time.monotonic()
    try:
        if what == "pull":
            w.pull([0, 1, 3])  # 1, 3 live on rank 1
        elif what == "pull from two":
            w.pull([1, 2, 4, 5, 0])  # 1, 4 live on rank 1; 2, 5 on rank 2
        elif what == "push":
            w.push([1], np.ones((1, 2), np.float32))
            w.wait()
        elif what == "many pushes":
            for _ in range(4):  # four unanswered requests: the wait is still bounded by 1s
                w.push([0, 1, 3], np.ones((3, 2), np.float32))
            w.wait(timeout_s=1)
        else:
            node.barrier(timeout_s=1)
    except adapm.AdaPMTimeout as exc:
        result = (type(exc).__name__, isinstance(exc, TimeoutError), str(exc),
                  time.monotonic() - start)
    except BaseException as exc:  # anything else is a failure; report it, do not hang
        result = ("wrong error", False, repr(exc), time.monotonic() - start)
    else:
        result = ("no error", False, "", time.monotonic() - start)
    done.set()
    node._release()
    return result


@pytest.mark.parametrize("what,world_size,pattern", [
    ("pull", 2, r"rank 0: no answer from rank 1 to PULL of 2 keys within 1s"),
    ("pull from two", 3, r"rank 0: no answer from ranks \[1, 2\] to PULL of 4 keys within 1s"),
    ("push", 2, r"rank 0: no answer from rank 1 to PUSH of 1 keys within 1s"),
    ("many pushes", 2, r"rank 0: no answer from rank 1 to PUSH of 2 keys within 1s"),
    ("barrier", 2, r"rank 0: barrier \(collective #1\): ranks \[1\] did not arrive within 1s"),
    ("barrier", 3, r"rank 0: barrier \(collective #1\): ranks \[1, 2\] did not arrive within 1s"),
], ids=["pull", "pull from two", "push", "many pushes", "barrier", "barrier of 3"])
def test_timeout_names_both_ranks(what, world_size, pattern):
    ctx = mp.get_context("spawn")
    stopped, done = [ctx.Event() for _ in range(world_size)], ctx.Event()
    start = time.monotonic()
    results = run_cluster(_silent_peer_job, world_size, args=(stopped, done, what), timeout_s=60,
                          config=dict(num_keys=6, value_length=2, request_timeout_s=1,
                                      connect_timeout_s=5, management="static_partition"))
    elapsed = time.monotonic() - start
    name, is_builtin_timeout, message, waited = results[0]
    assert name == "AdaPMTimeout", (name, message)
    assert is_builtin_timeout
    assert re.search(pattern, message), message
    # One timeout per call, not one per outstanding request or per silent peer.
    assert 0.9 <= waited < 2.5, waited
    assert results[1:] == [True] * (world_size - 1)
    assert elapsed < 30


def _forwarded_silent_job(node, stopped, done):
    """Key 1 (homed on rank 1) moves to rank 2, which then stops serving. Rank 0, which never
    learnt where key 1 went, asks its home; rank 1 passes the pull on to rank 2 and says so.
    Rank 0's timeout must name rank 2, the rank it actually waits for, not rank 1."""
    node.barrier()
    if node.rank == 2:
        w = node.worker()
        w.intent([1], 0, 1_000_000)
        w.wait_sync()
        assert 1 in node.local_keys()
    node.barrier()
    if node.rank == 2:
        node.engine.stop()
        stopped.set()
        finished = done.wait(30)
        node._release()
        return finished
    if node.rank == 1:
        finished = done.wait(30)
        node._release()
        return finished
    stopped.wait(30)
    start = time.monotonic()
    try:
        node.worker().pull([1])
    except adapm.AdaPMTimeout as exc:
        result = (str(exc), time.monotonic() - start)
    except BaseException as exc:
        result = (repr(exc), time.monotonic() - start)
    else:
        result = ("no error", time.monotonic() - start)
    done.set()
    node._release()
    return result


def test_timeout_names_the_rank_a_request_was_passed_on_to():
    ctx = mp.get_context("spawn")
    stopped, done = ctx.Event(), ctx.Event()
    results = run_cluster(_forwarded_silent_job, 3, args=(stopped, done), timeout_s=60,
                          config=dict(num_keys=6, value_length=2, request_timeout_s=1,
                                      connect_timeout_s=10, failure_timeout_s=30,
                                      management="relocation_only"))
    message, waited = results[0]
    assert re.search(r"rank 0: no answer from rank 2 \(passed on there by another node\) to "
                     r"PULL of 1 keys within 1s", message), message
    assert 0.9 <= waited < 2.5, waited
    assert results[1:] == [True, True]


def _comm_failure_job(node, rank0_stopped, done):
    """A failure of rank 1's communication thread (here a receive failure the test injects; a
    peer's bad message no longer is one, see test_protocol) must surface in every call,
    including a pull already waiting for an answer, as an AdaPMError naming rank 1."""
    from adapm.errors import TransportError

    node.barrier()
    if node.rank == 0:
        node.engine.stop()  # so that rank 1's pull below stays unanswered
        rank0_stopped.set()
        done.wait(30)
        node._release()
        return None
    rank0_stopped.wait(30)
    w = node.worker()
    in_flight = {}

    def pull_in_flight():
        start = time.monotonic()
        try:
            w.pull([0, 2])  # homes on rank 0, which does not answer
            in_flight["error"] = None
        except BaseException as exc:
            in_flight["error"] = exc
        in_flight["waited"] = time.monotonic() - start

    puller = threading.Thread(target=pull_in_flight)
    puller.start()
    time.sleep(0.3)  # let the pull be sent

    def broken_poll(timeout_ms, hold=False):
        raise TransportError("rank 1: receive failed: injected by the test")

    node.transport.poll = broken_poll
    node.transport.wake()
    puller.join(15)
    failed_pull = in_flight.get("error")
    later = []
    for call in (lambda: w.pull([1]), lambda: w.push([1], np.ones((1, 1), np.float32)),
                 lambda: node.worker(), lambda: node.barrier(timeout_s=1)):
        try:
            call()
            later.append(None)
        except BaseException as exc:
            later.append((type(exc).__name__, isinstance(exc, adapm.AdaPMError), str(exc)))
    done.set()
    node._release()
    return (type(failed_pull).__name__, isinstance(failed_pull, adapm.AdaPMError),
            str(failed_pull), in_flight.get("waited"), later)


def test_communication_thread_failure_surfaces():
    ctx = mp.get_context("spawn")
    results = cluster(_comm_failure_job, 2, args=(ctx.Event(), ctx.Event()), num_keys=4,
                      management="static_partition")
    name, is_adapm, message, waited, later = results[1]
    assert is_adapm and name != "AdaPMTimeout", (name, message)
    assert "rank 1: communication thread failed" in message
    assert "injected by the test" in message
    assert waited is not None and waited < 10  # completed by the failure, not by a timeout (20 s)
    assert len(later) == 4
    for outcome in later:
        assert outcome is not None, "a call on a node with a failed communication thread passed"
        assert outcome[1], outcome
        assert "rank 1: communication thread failed" in outcome[2]


# --- the cluster fixture itself ------------------------------------------------------------------


def _rank_one_raises(node):
    if node.rank == 1:
        raise ValueError("deliberate failure on rank 1")
    return node.rank


def _rank_one_exits(node):
    if node.rank == 1:
        os._exit(3)
    return node.rank


def _rank_one_hangs(node):
    if node.rank == 1:
        time.sleep(100)
    return node.rank


def _leaks_thread(node):
    threading.Thread(target=time.sleep, args=(30,), name="adapm-leaked", daemon=True).start()
    return node.rank


def _returns_rank(node, extra):
    return node.rank, node.world_size, extra


def test_cluster_returns_results_by_rank():
    assert cluster(_returns_rank, 3, args=("x",), num_keys=3) == [
        (0, 3, "x"), (1, 3, "x"), (2, 3, "x")]


def test_cluster_failure_names_failing_rank():
    start = time.monotonic()
    with pytest.raises(ClusterFailure) as info:
        run_cluster(_rank_one_raises, 2, timeout_s=60, config=dict(num_keys=4, connect_timeout_s=3))
    message = str(info.value)
    failed = re.search(r"ranks \[([\d, ]*)\] failed", message)
    assert failed and 1 in [int(r) for r in failed.group(1).split(",")], message
    assert "--- rank 1 ---" in message
    assert "deliberate failure on rank 1" in message
    assert time.monotonic() - start < 30
    assert not mp.active_children()


def test_cluster_failure_expected():
    outcome = run_cluster(_rank_one_raises, 2, timeout_s=60, expect_failure=True,
                          config=dict(num_keys=4, connect_timeout_s=3))
    assert outcome[1][0] == "error"
    assert "deliberate failure on rank 1" in outcome[1][1]


def test_cluster_failure_on_silent_exit():
    with pytest.raises(ClusterFailure) as info:
        run_cluster(_rank_one_exits, 2, timeout_s=60, config=dict(num_keys=4, connect_timeout_s=3))
    message = str(info.value)
    assert "rank 1 exited with code 3" in message


def test_cluster_failure_on_hang_is_bounded():
    start = time.monotonic()
    with pytest.raises(ClusterFailure) as info:
        run_cluster(_rank_one_hangs, 2, timeout_s=5, config=dict(num_keys=4))
    elapsed = time.monotonic() - start
    message = str(info.value)
    hung = re.search(r"ranks \[([\d, ]*)\] did not finish within 5s", message)
    assert hung, message
    assert 1 in [int(r) for r in hung.group(1).split(",")]
    assert 5 <= elapsed < 20, elapsed
    assert not mp.active_children()  # the hung children were killed


def test_cluster_failure_on_leaked_thread():
    with pytest.raises(ClusterFailure) as info:
        cluster(_leaks_thread, 2, num_keys=4)
    assert "threads left running" in str(info.value)
    assert "adapm-leaked" in str(info.value)


def _native_pulls_job(node, rounds):
    """Rank 1 sets keys it owns; rank 0 pulls them, through the transport on both sides
    (native/zmq_calls.c, native/zmq_serve.c), and pushes to them and sets them between pulls:
    each pull must show every earlier push and set of its worker (pushes go through the
    transport too, in order with the pulls; a set takes the engine's path, and so does what
    follows it while it is unanswered)."""
    w = node.worker()
    remote = np.array([1, 3, 5, 7], np.int64)  # homed on rank 1
    if node.rank == 1:
        w.set(remote, np.repeat(remote[:, None], 2, axis=1).astype(np.float32))
        w.wait()
    node.barrier()
    seen = []
    if node.rank == 0:
        expect = np.repeat(remote[:, None], 2, axis=1).astype(np.float32)
        out = np.empty((len(remote), 2), np.float32)
        for i in range(rounds):
            if i % 3 == 2:
                w.push(remote[::2], np.ones((2, 2), np.float32))
                expect[::2] += 1
            if i % 10 == 9:
                w.set(remote[1:2], np.full((1, 2), -i, np.float32))
                expect[1] = -i
                w.push(remote[1:2], np.ones((1, 2), np.float32))  # behind the set
                expect[1] += 1
            got = w.pull(remote, out=out)
            seen.append(bool((got == expect).all()))
            mixed = w.pull(np.array([0, 3, 2, 5], np.int64))  # local and remote keys
            seen.append(bool((mixed[[1, 3]] == expect[[1, 2]]).all()))
        w.wait()
    node.barrier()
    return node.stats(), seen


def test_pulls_through_the_transport_read_their_writes():
    results = cluster(_native_pulls_job, 2, args=(60,), num_keys=8, value_length=2,
                      management="static_partition")
    stats, seen = results[0]
    assert len(seen) == 120 and all(seen), seen
    # Most pulls and pushes went through the transport; those behind an unanswered set did
    # not.
    assert 60 <= stats["pulls_sent_natively"] < 120, stats
    # 20 pushes, and 6 right behind a set, which must not overtake it (`seen` says they did
    # not; such a push goes through the transport only once the set was answered).
    assert 10 <= stats["pushes_sent_natively"] <= 26, stats
    assert stats["remote_push_keys"] == 20 * 2 + 6, stats
    assert stats["remote_pull_keys"] == 60 * 4 + 60 * 2, stats
    assert results[1][0]["pulls_sent_natively"] == 0


def _handoff_job(node, batches):
    """Rank 0 signals intent for new keys of rank 1 two clocks ahead and pushes them one at a
    time while the sync round reports that intent: pushes whose keys are between that report
    and its answer cannot be routed by the transport and go to the engine loop
    (ZmqIO.handoffs), which holds them until the keys arrive; the others go to the owner, or
    are local once the keys came."""
    w = node.worker()
    node.barrier()
    pushed = np.zeros(node.config.num_keys, np.int64)
    if node.rank == 0:
        one = np.ones((1, 2), np.float32)
        for b in range(batches):
            keys = 2 * (np.arange(8) + 8 * b) + 1  # homed on rank 1, new each batch
            w.intent(keys, w.clock + 2, w.clock + 3)
            deadline = time.monotonic() + 0.03
            while time.monotonic() < deadline:
                for key in keys:
                    w.push(np.array([key]), one)
                    pushed[key] += 1
            for _ in range(3):
                w.advance_clock()
        w.wait_sync()
    node.barrier()
    out = w.pull(np.arange(node.config.num_keys))
    return node.stats(), pushed, out


def test_pushes_the_transport_cannot_route_go_to_the_engine_loop():
    results = cluster(_handoff_job, 2, args=(40,), num_keys=2 * 8 * 40, value_length=2,
                      action_timing=False)
    stats, pushed, _ = results[0]
    assert stats["pushes_handed_to_engine"] > 0, stats
    assert stats["pushes_sent_natively"] > 0, stats
    for rank, (_, _, values) in enumerate(results):  # every push counted once
        np.testing.assert_array_equal(values[:, 0], pushed.astype(np.float32), f"rank {rank}")
