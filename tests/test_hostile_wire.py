"""A node never dies of a message: malformed, truncated, oversized and forged messages of every
kind, sent to a live node's socket during an exact-sum workload, are dropped and counted, and the
sums stay exact.

The job runs without authentication (loopback), so the stranger's messages reach the node and
what is tested is validation itself (adapm._wire.protocol.decode, the transport's sender check,
adapm._engine.validate). With authentication they would not even connect (tests/test_auth.py).
"""

from __future__ import annotations

import threading

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import adapm
from adapm._wire.protocol import DTYPES, ROLES, Kind, encode, message
from adapm.testing import free_port, listening, rss_bytes, run_cluster

NUM_KEYS, DIM, STEPS = 48, 2, 40
FAST = dict(connect_timeout_s=30, request_timeout_s=30)

# Ranks and hop counts are 32-bit fields of the binary header (request ids 64-bit): the
# extremes a sender can put there.
_ranks = st.sampled_from([-1, 0, 1, 2, 7, 2**31 - 1, -2**31])
_hops = st.one_of(st.integers(-3, 3), st.integers(-2**31, 2**31 - 1))
_numbers = st.one_of(st.integers(-3, 3), st.integers(-2**63, 2**63 - 1))


@st.composite
def _arrays(draw, kind: Kind) -> list:
    """Arrays of the kind's roles: lengths and contents drawn, sometimes consistent."""
    out = []
    keys_len = draw(st.integers(0, 6))
    for role in ROLES.get(kind, ()):
        dtype = DTYPES[role]
        n = draw(st.sampled_from([keys_len, keys_len * DIM, draw(st.integers(0, 9))]))
        if dtype.kind == "f":
            values = draw(st.lists(st.sampled_from([0.0, 1.0, -1e30, float("nan")]),
                                   min_size=n, max_size=n))
        else:
            info = np.iinfo(dtype)
            values = draw(st.lists(st.one_of(st.integers(max(-2, int(info.min)), NUM_KEYS + 2),
                                             st.integers(int(info.min), int(info.max))),
                                   min_size=n, max_size=n))
        out.append(np.array(values, dtype=dtype))
    return out


@st.composite
def well_formed(draw) -> list:
    """Frames of a decodable message of any kind with arbitrary (mostly wrong) contents."""
    kind = draw(st.sampled_from(list(Kind)))
    fields = draw(st.fixed_dictionaries({}, optional={
        "o": _ranks, "h": _hops, "e": _numbers, "t": st.sampled_from(["barrier", "x", 3]),
        "r": st.one_of(_ranks, _numbers), "msg": st.text(max_size=5)}))
    msg = message(kind, draw(_ranks), draw(_numbers), draw(_arrays(kind)), **fields)
    return [bytes(memoryview(f)) for f in encode([msg])]


@st.composite
def mangled(draw) -> list:
    """A well-formed message truncated, with a frame dropped or added, or bytes flipped."""
    frames = draw(well_formed())
    how = draw(st.sampled_from(["truncate", "drop", "extra", "flip"]))
    i = draw(st.integers(0, len(frames) - 1))
    if how == "truncate":
        frames[i] = frames[i][:draw(st.integers(0, max(0, len(frames[i]) - 1)))]
    elif how == "drop":
        del frames[i]
    elif how == "extra":
        frames.append(draw(st.binary(max_size=24)))
    elif frames[i]:
        at = draw(st.integers(0, len(frames[i]) - 1))
        frames[i] = frames[i][:at] + bytes([frames[i][at] ^ 0xFF]) + frames[i][at + 1:]
    return frames


garbage = st.lists(st.binary(max_size=40), min_size=1, max_size=4)
wire_message = st.one_of(garbage, well_formed(), mangled())
# The stranger's connection identity: none, a rank not in the job, the ranks' bare numbers and
# other spellings of them (b"01" was once read as rank 1), and a rank with a wrong job token.
# The ranks' own identities (b"<rank>:<token>") are not known to a stranger.
identity = st.sampled_from([None, b"7", b"1", b"0", b"01", b"00", b" 1", b"+1", b"1\x00",
                            b"0:" + b"0" * 32, b"1:"])


def _attacked_job(node, attacks):
    """Both ranks push ones to every key while intents move keys; a stranger's socket sends
    ``attacks`` to rank 1 meanwhile."""
    import zmq

    w = node.worker()
    rng = np.random.default_rng(node.rank)
    stop = threading.Event()

    def attack():
        context = zmq.Context.instance()
        for ident, frames in attacks:
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if ident is not None:
                sock.setsockopt(zmq.IDENTITY, ident)
            sock.connect(node.transport.address)
            sock.send_multipart(frames)
            stop.wait(0.01)
            sock.close()

    attacker = threading.Thread(target=attack) if node.rank == 1 else None
    node.barrier()
    if attacker is not None:
        attacker.start()
    for step in range(STEPS):
        w.intent(rng.choice(NUM_KEYS, 8, replace=False), w.clock + 1, w.clock + 3)
        w.push(np.arange(NUM_KEYS), np.ones((NUM_KEYS, DIM), np.float32))
        w.advance_clock()
        if step % 8 == 7:
            w.wait_sync()
    if attacker is not None:
        attacker.join()
    w.wait_sync()
    node.barrier()
    return w.pull(np.arange(NUM_KEYS)), node.stats()


def _check(attacks) -> dict:
    results = run_cluster(_attacked_job, 2, args=(attacks,), timeout_s=120,
                          config=dict(num_keys=NUM_KEYS, value_length=DIM, **FAST))
    for values, _ in results:
        np.testing.assert_array_equal(values, np.full((NUM_KEYS, DIM), 2 * STEPS, np.float32))
    return results[1][1]


@given(attacks=st.lists(st.tuples(identity, wire_message), min_size=1, max_size=25))
# No shrinking: each example starts a cluster (shrinking one took over five minutes).
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          database=None, phases=[Phase.explicit, Phase.generate])
def test_node_survives_hostile_messages_and_sums_stay_exact(attacks):
    stats = _check(attacks)
    # Every message that reached the node was dropped: none of them is fit to take in. (Not
    # every one reaches it: libzmq refuses a connection whose identity is still in use by the
    # stranger's previous one, and a message of no headers is no message.)
    assert stats["dropped_messages"] <= len(attacks), stats


def test_each_kind_of_bad_message_is_counted():
    """One of each, from a connection libzmq lets in: each one is counted as dropped."""
    forged = message(Kind.PUSH, 0, 1, [np.arange(2), np.arange(2), np.ones(2 * DIM, np.float32)],
                     o=0, h=0)
    out_of_range = message(Kind.PULL, 9, 1, [np.array([NUM_KEYS]), np.arange(1)], o=9, h=0)
    answer_to_nothing_asked = message(Kind.PULL_RESP, 12, 12345,
                                      [np.arange(1), np.ones(DIM, np.float32)])
    # A failure notice stops every node that takes it in: from a stranger it must not count.
    failure_notice = message(Kind.FAILED, 1, 0, r=0, msg="")
    rank0_notice = message(Kind.FAILED, 0, 0, r=1, msg="")
    # A write as rank 0 would make, to keys rank 1 owns: from b"00" it was once taken as one.
    write = message(Kind.PUSH, 0, 1, [np.array([1, 3]), np.arange(2), np.ones(2 * DIM, np.float32)],
                    o=0, h=0)
    # A fresh identity each: libzmq refuses a connection whose identity is still in use.
    attacks = [
        (b"7", [b"\xc1"]),  # a 1-byte frame: not a message at all
        (b"8", [bytes(memoryview(f)) for f in encode([forged])]),  # names rank 0, comes from 8
        (b"9", [bytes(memoryview(f)) for f in encode([out_of_range])]),  # rank 9 is no peer
        (b"12", [bytes(memoryview(f)) for f in encode([answer_to_nothing_asked])]),  # no peer
        (b"10", [bytes(memoryview(f)) for f in encode([failure_notice])]),  # names rank 1
        (b"1", [bytes(memoryview(f)) for f in encode([failure_notice])]),  # "from" rank 1 itself
        (b"00", [bytes(memoryview(f)) for f in encode([rank0_notice])]),  # rank 0, spelt "00"
        (b"000", [bytes(memoryview(f)) for f in encode([write])]),  # and so on
    ]
    stats = _check(attacks)  # the sums are exact: the write was not taken
    assert stats["dropped_malformed_messages"] == 1, stats
    assert stats["dropped_forged_messages"] == 7, stats
    assert stats["dropped_messages"] == 8, stats


def _goodbye_then_death(node):
    """A stranger tells rank 0 "goodbye" in rank 1's name; then rank 1 dies without one. Rank
    0's next call must raise NodeFailure within failure_timeout_s, not wait for a timeout."""
    import os
    import time

    import zmq

    node.barrier()
    if node.rank == 1:
        time.sleep(1.0)  # the forged goodbye is in
        os._exit(0)
    context = zmq.Context()
    for ident in (b"01", b"1", b"1:" + b"f" * 32):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, ident)
        sock.connect(node.transport.address)
        sock.send_multipart(encode([message(Kind.GOODBYE, 1, 0)]))
        sock.close(linger=2000)
    context.term()
    time.sleep(2.0)  # rank 1 is dead by now
    start = time.monotonic()
    try:
        node.worker().pull([1])  # homed on rank 1
    except adapm.NodeFailure as exc:
        waited, stats = time.monotonic() - start, node.stats()
        node._release()  # rank 1 is gone: no shutdown collective
        return "NodeFailure", exc.rank, waited, stats
    except adapm.AdaPMError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start, None
    return "no error", None, time.monotonic() - start, None


def test_a_forged_goodbye_does_not_switch_off_failure_detection():
    results = run_cluster(_goodbye_then_death, 2, timeout_s=120, expect_failure=True,
                          config=dict(num_keys=NUM_KEYS, value_length=DIM, failure_timeout_s=3,
                                      connect_timeout_s=30, request_timeout_s=60))
    status, result = results[0]
    assert status == "ok", result
    kind, rank, waited, stats = result
    assert (kind, rank) == ("NodeFailure", 1), (kind, rank)
    assert waited < 20, waited  # failure_timeout_s, not the 60 s request timeout
    assert stats["dropped_forged_messages"] == 3, stats


def test_oversized_frame_is_refused_before_it_is_buffered():
    """A frame larger than any legitimate one: libzmq disconnects the sender (MAXMSGSIZE)."""
    huge = [b"\x80" + bytes(64 << 20)]
    stats = _check([(b"7", huge)])
    assert stats["bytes_received"] < (64 << 20), stats


# A flood of ~FLOOD_BYTES in FLOOD_FRAME-sized messages: many times what a bounded receive
# buffer (Transport.RECEIVE_HWM messages per connection) may hold.
FLOOD_FRAME, FLOOD_BYTES = 64 << 10, 768 << 20


def _flooded_job(node, ready, flooded, sent_count):
    """Rank 1's engine stops reading for a while; a stranger in rank 0's process floods it
    meanwhile. Returns (rank 0) the messages libzmq accepted from the stranger, or (rank 1) the
    growth of its resident memory while blind, its statistics and a sum computed afterwards."""
    import time

    import zmq

    node.barrier()
    if node.rank == 0:
        ready.wait(30)
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, b"7")
        sock.connect(node.transport.peers[1].getsockopt(zmq.LAST_ENDPOINT).decode())
        frame = b"\xc1" + bytes(FLOOD_FRAME - 1)  # not a message: dropped when read
        sent, deadline = 0, time.monotonic() + 3
        while sent * FLOOD_FRAME < FLOOD_BYTES and time.monotonic() < deadline:
            try:
                sock.send(frame, zmq.NOBLOCK, copy=False)
                sent += 1
            except zmq.Again:  # held back: the receiver reads no more until its engine does
                time.sleep(0.001)
        sent_count.value = sent
        flooded.set()
        sock.close(linger=60_000)  # everything accepted is delivered, none thrown away
        node.barrier()
        return sent
    poll = node.transport.poll
    blind = threading.Event()
    blind.set()

    def blind_poll(timeout_ms, hold=False):
        while blind.is_set():
            time.sleep(0.01)
        return poll(timeout_ms, hold)

    node.transport.poll = blind_poll
    node.transport.wake()
    baseline = peak = rss_bytes()
    ready.set()
    while not flooded.wait(0.02):
        peak = max(peak, rss_bytes())
    time.sleep(0.3)  # what is still on its way in
    peak = max(peak, rss_bytes())
    blind.clear()
    node.transport.poll = poll
    node.barrier()
    deadline = time.monotonic() + 60
    while node.stats()["dropped_malformed_messages"] < sent_count.value and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    w = node.worker()
    w.push([0, 1], np.ones((2, DIM), np.float32))
    w.wait()
    return peak - baseline, node.stats(), w.pull([0, 1])


def test_a_flood_waits_in_the_sender_not_in_the_node():
    """While a node's engine does not read, its socket takes at most a bounded number of
    messages per connection (ZMQ_RCVHWM; the sender's libzmq then holds them back, so nothing
    is lost); then the node reads them all, counts every one as dropped, and goes on working."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    ready, flooded, sent_count = ctx.Event(), ctx.Event(), ctx.Value("q", 0)
    sent, (growth, stats, values) = run_cluster(
        _flooded_job, 2, args=(ready, flooded, sent_count), timeout_s=180,
        config=dict(num_keys=NUM_KEYS, value_length=DIM, failure_timeout_s=30, **FAST))
    assert sent > 0
    assert stats["dropped_malformed_messages"] == sent, (sent, stats)
    # Unbounded, the node would have buffered the whole flood (FLOOD_BYTES).
    assert growth < FLOOD_BYTES / 4, (growth, sent)
    np.testing.assert_array_equal(values, np.ones((2, DIM), np.float32))


# --- the rendezvous ------------------------------------------------------------------------------


def _rendezvous_rank(rank: int, port: int, results):
    """A rank of a 2-node job that meets at ``port``; reports its sum or its error."""
    import os

    for var in [v for v in os.environ if v.startswith(("ADAPM_", "OMPI_", "PMI_"))]:
        del os.environ[var]
    import adapm

    try:
        config = adapm.Config(num_keys=4, rank=rank, world_size=2, rendezvous=f"127.0.0.1:{port}",
                              connect_timeout_s=30, request_timeout_s=30)
        with adapm.init(config=config) as node:
            w = node.worker()
            w.push(np.arange(4), np.ones((4, 1), np.float32))
            w.wait()
            node.barrier()
            results.put((rank, float(w.pull(np.arange(4)).sum())))
    except BaseException as exc:
        results.put((rank, f"{type(exc).__name__}: {exc}"))


def test_the_rendezvous_ignores_what_is_not_a_hello():
    """Garbage, maps that are no hello (no address, a bad one, a rank that is no integer) and
    an oversized frame sent to rank 0's rendezvous before rank 1 checks in: ignored, and the
    job forms."""
    import multiprocessing as mp
    import time

    import msgpack
    import zmq

    port = free_port()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    rank0 = ctx.Process(target=_rendezvous_rank, args=(0, port, results))
    rank0.start()
    context = zmq.Context()
    junk = [[b"\xc1"], [msgpack.packb(7)], [msgpack.packb({"s": 1})],
            [msgpack.packb({"s": 1, "addr": "tcp://nowhere", "fp": []})],
            [msgpack.packb({"s": "1", "addr": "tcp://127.0.0.1:9", "fp": []})],
            [msgpack.packb({"s": 1, "addr": "tcp://127.0.0.1:9", "fp": []}), b"extra"],
            [b"\x80" + bytes(1 << 20)]]
    try:
        deadline = time.monotonic() + 60
        while not listening(port):  # then every junk message reaches rank 0 at once
            assert time.monotonic() < deadline and rank0.is_alive(), "rank 0 never listened"
            time.sleep(0.05)
        for frames in junk:
            sock = context.socket(zmq.DEALER)
            sock.connect(f"tcp://127.0.0.1:{port}")
            sock.send_multipart(frames)
            sock.close(linger=2000)
        rank1 = ctx.Process(target=_rendezvous_rank, args=(1, port, results))
        rank1.start()
        got = dict(results.get(timeout=60) for _ in range(2))
    finally:
        context.term()
        for proc in (rank0, locals().get("rank1")):
            if proc is not None:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
    assert got == {0: 8.0, 1: 8.0}, got
    assert rank0.exitcode == 0


@pytest.mark.parametrize("answer", [
    b"\xc1",
    msgpack.packb(5),
    msgpack.packb({"k": int(Kind.TABLE), "addrs": "tcp://127.0.0.1:9"}),
    msgpack.packb({"k": int(Kind.TABLE), "addrs": ["tcp://127.0.0.1:9"]}),  # one of 2
    msgpack.packb({"k": int(Kind.TABLE), "addrs": ["tcp://127.0.0.1:9", 5]}),
    msgpack.packb({"k": int(Kind.TABLE), "addrs": ["tcp://127.0.0.1:9", "tcp://127.0.0.1:10"]}),
    msgpack.packb({"k": int(Kind.ERROR)}),
], ids=["garbage", "no map", "no list", "too short", "no address", "not ours", "error no text"])
def test_a_malformed_rendezvous_answer_is_a_clear_error(no_launcher, answer):
    """Whoever answers on the rendezvous port (without authentication, any local process can):
    a member that gets no well-formed table raises TransportError naming the rendezvous."""
    import threading

    import zmq

    import adapm

    port = free_port()
    context = zmq.Context()
    host = context.socket(zmq.ROUTER)
    host.bind(f"tcp://127.0.0.1:{port}")

    def answer_the_hello():
        if host.poll(30_000):
            identity, _ = host.recv_multipart()
            host.send_multipart([identity, answer])

    fake = threading.Thread(target=answer_the_hello)
    fake.start()
    try:
        config = adapm.Config(num_keys=4, rank=1, world_size=2, rendezvous=f"127.0.0.1:{port}",
                              connect_timeout_s=30)
        with pytest.raises(adapm.errors.TransportError,
                           match=r"rank 1: the rendezvous at tcp://127.0.0.1:\d+ answered with "
                                 r"something that is not this job's address table"):
            adapm.init(config=config)
    finally:
        fake.join(30)
        host.close(linger=0)
        context.term()
