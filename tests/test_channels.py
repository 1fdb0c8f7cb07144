"""Channels (``Config.channels``): a node's engine split over threads by key, each channel a
whole engine over its keys with sockets and a share of the store of its own.

Real node processes on loopback. The sums stay exact while intents relocate and replicate keys
of every channel (each channel's own sockets carry its traffic); requests whose keys span
channels (uniform and per-key lengths) are split and answered whole; a checkpoint written with
channels restores on one node; a member's message that names another channel's keys is dropped
and counted; nodes that disagree on the number of channels are refused at the rendezvous.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import adapm
from adapm._engine.routing import channel_of
from adapm._wire.protocol import Kind, encode, message
from adapm.errors import ConfigError
from adapm.testing import run_cluster

FAST = {"connect_timeout_s": 30, "request_timeout_s": 30}
NUM_KEYS, DIM = 96, 2


def _schedule_job(node, steps, seed):
    """Random intents (relocations: one node wants a key; replicas: several), pushes of ones
    and pulls; returns the final values, stats and per-channel messages sent."""
    w = node.worker()
    rng = np.random.default_rng(seed * 31 + node.rank)
    pushed = np.zeros(NUM_KEYS, np.int64)
    for _ in range(steps):
        wanted = rng.choice(NUM_KEYS, 12, replace=False)
        w.intent(wanted, w.clock + 1, w.clock + 1 + int(rng.integers(1, 4)))
        keys = rng.choice(NUM_KEYS, 20)  # duplicates too
        w.push(keys, np.ones((len(keys), DIM), np.float32))
        np.add.at(pushed, keys, 1)
        w.pull(rng.choice(NUM_KEYS, 10))
        w.advance_clock()
        if rng.random() < 0.2:
            w.wait_sync()
    w.wait_sync()
    node.barrier()
    values = w.pull(np.arange(NUM_KEYS))
    # stats() counts every channel's: between two looks at the channels' own counters.
    sent = [t.traffic.snapshot()["messages_sent"] for t in node.transports]
    stats = node.stats()
    later = [t.traffic.snapshot()["messages_sent"] for t in node.transports]
    return values, stats, (sent, later), pushed


@pytest.mark.parametrize("world_size,channels,management",
                         [(2, 2, "adaptive"), (3, 3, "adaptive"), (2, 3, "replication_only"),
                          (2, 2, "static_partition")])
def test_sums_stay_exact_over_channels(world_size, channels, management):
    results = run_cluster(_schedule_job, world_size, args=(60, channels), timeout_s=120,
                          config=dict(FAST, num_keys=NUM_KEYS, value_length=DIM,
                                      channels=channels, management=management))
    expected = sum(r[3] for r in results).astype(np.float32)
    for values, stats, (sent, later), _ in results:
        np.testing.assert_array_equal(values, np.repeat(expected[:, None], DIM, axis=1))
        assert all(n > 0 for n in sent), sent  # every channel's sockets carried messages
        assert sum(sent) <= stats["messages_sent"] <= sum(later)
    moved = sum(r[1]["relocations_in"] for r in results)
    replicated = sum(r[1]["replica_setups"] for r in results)
    if management == "adaptive":
        assert moved > 0 and replicated > 0
    if management == "replication_only":
        assert replicated > 0 and moved == 0


def test_a_trace_records_every_channels_events(tmp_path):
    """The channels' engine threads share the node's trace recorder (their calls take turns):
    every relocation and replica of every channel is in it, and its summary adds up."""
    from adapm.trace import load

    directory = str(tmp_path / "trace")
    results = run_cluster(_schedule_job, 2, args=(40, 5), timeout_s=120,
                          config=dict(FAST, num_keys=NUM_KEYS, value_length=DIM, channels=2,
                                      trace_dir=directory))
    trace = load(directory)
    rows = trace.events.to_pylist()
    rounds = [r for r in trace.rounds.to_pylist() if not r["final"]]
    for rank, (_, stats, _, _) in enumerate(results):
        for channel in (0, 1):  # each channel's rounds, numbered by it
            numbers = sorted(r["round"] for r in rounds
                             if r["rank"] == rank and r["channel"] == channel)
            assert numbers and numbers == list(range(1, len(numbers) + 1)), (rank, channel)
        for event, counter in (("alloc", "relocations_in"), ("replica_setup", "replica_setups")):
            keys = [r["key"] for r in rows if r["rank"] == rank and r["event"] == event]
            assert len(keys) == stats[counter], (rank, event)
        moved = [r["key"] for r in rows if r["rank"] == rank and r["event"] == "alloc"]
        assert set(channel_of(np.array(moved, np.int64), 2, 2)) == {0, 1}, "both channels"
        # The traffic rows name the round they were taken at: channel and number, as in rounds.
        ran = {(r["channel"], r["round"]) for r in rounds if r["rank"] == rank}
        traffic = [r for r in trace.traffic.to_pylist() if r["rank"] == rank]
        assert {r["channel"] for r in traffic} == {-1, 0, 1}, "both channels' rounds, the end"
        assert all((r["channel"], r["round"]) in ran for r in traffic if r["round"] != -1)


def _untouched_job(node):
    return node.engine.state.memory(), node.store.memory()


def test_untouched_keys_cost_what_they_cost_with_one_channel():
    """The home table is split over the channels, not repeated: a key nobody touched costs 4
    bytes on its home node (its owner) plus the store's 4 (its word), however many channels."""
    num_keys = 1_000_000
    per_channels = {}
    for channels in (1, 3):
        results = run_cluster(_untouched_job, 2, timeout_s=90,
                              config=dict(FAST, num_keys=num_keys, channels=channels))
        per_channels[channels] = results
        for memory, (entries, store_bytes) in results:
            records, table_bytes = memory["directory"]
            assert records == 0 and entries == 0
            home = num_keys // 2
            assert 4 * home <= table_bytes < 4 * home + 64 * 1024 * channels
            assert 4 * home <= store_bytes < 4 * home + 64 * 1024 * channels
    dense = [results[0][0]["directory"][1] for results in per_channels.values()]
    assert abs(dense[0] - dense[1]) < 64 * 1024 * 3, dense


def _spanning_job(node):
    """Static partitioning: every key homed elsewhere is remote; pushes, sets and pulls whose
    keys span every channel, with per-key lengths, go out split and come back whole."""
    w = node.worker()
    lengths = node.config.value_length
    keys = np.arange(NUM_KEYS)[::-1].copy()  # every channel, mixed order
    rows = np.concatenate([np.full(lengths[k], k + 1, np.float32) for k in keys])
    for _ in range(3):
        w.push(keys, rows)
    w.wait()
    node.barrier()
    pulled = w.pull(keys)
    node.barrier()
    if node.rank == 0:
        w.set(keys[:40], np.concatenate([np.full(lengths[k], -k, np.float32) for k in keys[:40]]))
        w.wait()
    node.barrier()
    return pulled, w.pull(keys), node.stats()


def test_requests_spanning_channels_are_split_and_answered_whole():
    lengths = (np.arange(NUM_KEYS) % 3 + 1).astype(np.int64)
    results = run_cluster(_spanning_job, 2, timeout_s=90,
                          config=dict(FAST, num_keys=NUM_KEYS, value_length=lengths, channels=3,
                                      management="static_partition"))
    keys = np.arange(NUM_KEYS)[::-1]
    summed = np.concatenate([np.full(lengths[k], 6 * (k + 1), np.float32) for k in keys])
    after_set = np.concatenate([np.full(lengths[k], -k if i < 40 else 6 * (k + 1), np.float32)
                                for i, k in enumerate(keys)])
    for pulled, final, stats in results:
        np.testing.assert_array_equal(pulled, summed)
        np.testing.assert_array_equal(final, after_set)
        assert stats["remote_push_keys"] > 0 and stats["remote_pull_keys"] > 0


def _native_io_job(node):
    """Static partitioning, uniform lengths: a pull or push of keys all of one channel goes
    through that channel's native I/O; one that spans channels through the loops, split."""
    w = node.worker()
    keys = np.arange(NUM_KEYS)
    others = keys[keys % 2 != node.rank]  # homed on the other node: remote
    for c in range(2):
        one = others[channel_of(others, 2, 2) == c]
        w.push(one, np.full((len(one), DIM), c + 1, np.float32))
        w.pull(one)
    w.push(others, np.ones((len(others), DIM), np.float32))  # spans both channels
    w.wait()
    node.barrier()
    return w.pull(keys), node.stats()


def test_a_request_of_one_channel_goes_through_its_native_io():
    results = run_cluster(_native_io_job, 2, timeout_s=90,
                          config=dict(FAST, num_keys=NUM_KEYS, value_length=DIM, channels=2,
                                      management="static_partition"))
    keys = np.arange(NUM_KEYS)
    # Each key was pushed by the node it is not homed on: its channel's number plus 1, then 1.
    want = np.repeat((channel_of(keys, 2, 2) + 2.0)[:, None], DIM, axis=1)
    for values, stats in results:
        np.testing.assert_array_equal(values, want)
        assert stats["pulls_sent_natively"] >= 2 and stats["pushes_sent_natively"] >= 2, stats
        assert stats["remote_push_keys"] == 2 * NUM_KEYS // 2, stats


def _checkpoint_job(node, path):
    w = node.worker()
    w.intent(np.arange(node.rank, NUM_KEYS, 3), 1, 1000)  # relocated and replicated keys
    w.advance_clock()
    w.wait_sync()
    w.push(np.arange(NUM_KEYS), np.full((NUM_KEYS, DIM), node.rank + 1, np.float32))
    node.checkpoint(path)
    return node.stats()["replica_setups"] + node.stats()["relocations_in"]


def test_checkpoint_with_channels_restores_on_one_node(tmp_path):
    path = str(tmp_path / "ckpt")
    moved = run_cluster(_checkpoint_job, 2, args=(path,), timeout_s=90,
                        config=dict(FAST, num_keys=NUM_KEYS, value_length=DIM, channels=2))
    assert sum(moved) > 0
    with adapm.init(restore=path) as node:
        values = node.worker().pull(np.arange(NUM_KEYS))
    np.testing.assert_array_equal(values, np.full((NUM_KEYS, DIM), 3, np.float32))


SECRET = "channels-test-secret-5b1d09ce7f"


def _foreign_keys_job(node, seed):
    """Rank 1's keys (a member) send rank 0's channel-0 socket pushes and pulls of channel-1
    keys, while both ranks train; returns the values and rank 0's stats."""
    w = node.worker()
    stop, sent = threading.Event(), [0]
    foreign = np.flatnonzero(channel_of(np.arange(NUM_KEYS), 2, 2) == 1)
    foreign = foreign[foreign % 2 == 0]  # homed at rank 0, of channel 1

    def attack():
        import zmq

        from adapm._wire.auth import JobKeys
        rng = np.random.default_rng(seed)
        context = zmq.Context()
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        JobKeys(SECRET, 2, 1).make_client(sock, 0)
        sock.connect(node.transports[0].address)
        try:
            while not stop.is_set():
                keys = rng.choice(foreign, 3, replace=False).astype(np.int64)
                pos = np.arange(3, dtype=np.int64)
                for kind, arrays in ((Kind.PUSH, [keys, pos, np.ones(3 * DIM, np.float32)]),
                                     (Kind.PULL, [keys, pos])):
                    sock.send_multipart(encode([message(kind, 1, 10 ** 6 + sent[0], arrays,
                                                        o=1, h=0)]), copy=False)
                    sent[0] += 1
                stop.wait(0.001)
        finally:
            sock.close(linger=2000)
            context.term()

    thread = threading.Thread(target=attack) if node.rank == 0 else None
    node.barrier()
    if thread is not None:
        thread.start()
    for _ in range(40):
        w.intent(np.arange(NUM_KEYS)[node.rank::2], w.clock + 1)
        w.push(np.arange(NUM_KEYS), np.ones((NUM_KEYS, DIM), np.float32))
        w.advance_clock()
    if thread is not None:
        stop.set()
        thread.join()
    w.wait_sync()
    node.barrier()
    return w.pull(np.arange(NUM_KEYS)), node.stats(), sent[0]


def test_a_message_with_another_channels_keys_is_dropped():
    results = run_cluster(_foreign_keys_job, 2, args=(0,), timeout_s=120,
                          config=dict(FAST, num_keys=NUM_KEYS, value_length=DIM, channels=2,
                                      auth=True, secret=SECRET))
    for values, _, _ in results:
        np.testing.assert_array_equal(values, np.full((NUM_KEYS, DIM), 80, np.float32))
    _, stats, sent = results[0]
    assert sent > 0
    assert stats["dropped_messages"] >= sent, (sent, stats)


def test_nodes_that_disagree_on_channels_are_refused(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import os, adapm
        rank = int(os.environ["ADAPM_RANK"])
        adapm.init(num_keys=10, channels=1 + rank, connect_timeout_s=20).shutdown()
    """))
    run = subprocess.run([sys.executable, "-m", "adapm.launch", "-n", "2", sys.executable,
                          str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "channels" in run.stderr and "refused" in run.stderr, run.stderr[-2000:]


@given(st.one_of(st.integers(max_value=0), st.integers(min_value=65), st.booleans(),
                 st.just(2.0), st.just("2")))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_bad_channels_are_a_config_error(channels):
    with pytest.raises(ConfigError, match="channels"):
        adapm.Config(num_keys=10, channels=channels)


def test_channels_from_the_environment():
    assert adapm.Config.from_env({"ADAPM_CHANNELS": "4"}, num_keys=10).channels == 4
    with pytest.raises(ConfigError, match="ADAPM_CHANNELS"):
        adapm.Config.from_env({"ADAPM_CHANNELS": "four"}, num_keys=10)


@given(st.lists(st.integers(0, 10 ** 6), max_size=50), st.integers(1, 9), st.integers(1, 8))
def test_every_nodes_home_keys_spread_evenly_over_channels(keys, world_size, channels):
    ch = channel_of(np.array(keys, np.int64), world_size, channels)
    assert ((0 <= ch) & (ch < channels)).all()
    home = np.arange(0, 1000 * world_size * channels, world_size)  # rank 0's home keys
    counts = np.bincount(channel_of(home, world_size, channels), minlength=channels)
    assert counts.min() == counts.max()


def _thread_names_job(node):
    """The OS names of this process's threads (Linux: /proc), and Python's."""
    names = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as fh:
            names.add(fh.read().strip())
    return sorted(names), sorted(t.name for t in threading.enumerate())


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads Linux's /proc")
def test_each_channels_engine_thread_names_itself():
    """top -H, perf and gdb tell the engine threads from the workers and from each other."""
    config = dict(FAST, num_keys=NUM_KEYS, value_length=DIM, channels=2)
    results = run_cluster(_thread_names_job, 2, timeout_s=90, config=config)
    for rank, (os_names, py_names) in enumerate(results):
        assert {"adapm-engine", "adapm-engine-c1"} <= set(os_names), os_names
        assert {f"adapm-engine-{rank}", f"adapm-engine-{rank}-c1"} <= set(py_names), py_names
