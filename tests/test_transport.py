"""The ZeroMQ transport on its own, both ways it can receive and send: in C over the sockets'
libzmq handles (``adapm._native.ZmqIO``, the default) and through pyzmq (the fallback where
pyzmq's libzmq cannot be reached from C). Two transports in one process talk over loopback
TCP; every test runs against both ways, which must behave alike: what arrives, what is dropped
and counted, the counters, and arrays that stay valid after the sender let go of them.
"""

from __future__ import annotations

import gc
import sys
import time

import numpy as np
import pytest
import zmq

from adapm._wire.protocol import Encoded, Kind, encode, message
from adapm._wire.zmq_transport import Transport, identity_of
from adapm.errors import TransportError

TOKEN = "t0ken"


@pytest.fixture(params=[True, False], ids=["native", "pyzmq"])
def pair(request):
    a = Transport(0, "127.0.0.1", native_io=request.param)
    b = Transport(1, "127.0.0.1", native_io=request.param)
    addresses = [a.address, b.address]
    a.connect(addresses, TOKEN)
    b.connect(addresses, TOKEN)
    # The native way must really be the one tested where it is asked for (this platform's
    # pyzmq wheels ship a shared libzmq), not a silent fallback.
    assert (a._io is not None) == request.param and (b._io is not None) == request.param
    yield a, b
    a.close()
    b.close()


def _receive(t: Transport, count: int, timeout_s: float = 10.0) -> list:
    """(src, message) pairs until ``count`` messages came (or the time is up)."""
    out = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        for src, messages in t.poll(50):
            out.extend((src, m) for m in messages)
    return out


def _pull(req_id: int, keys) -> object:
    keys = np.asarray(keys, dtype=np.int64)
    return message(Kind.PULL, 0, req_id, [keys, np.arange(len(keys), dtype=np.int64)], o=0)


def test_small_and_large_messages_arrive_whole_and_in_order(pair):
    a, b = pair
    big = np.arange(200_000, dtype=np.int64)  # 1.6 MB: a frame of its own, not copied
    a.send(1, [_pull(1, [5]), _pull(2, [7, 9])])
    a.send(1, [_pull(3, big)])
    del big
    gc.collect()  # the sender's array is gone; the frame it became is not
    got = _receive(b, 3)
    assert [(src, m.kind, m.req_id) for src, m in got] == [(0, Kind.PULL, 1), (0, Kind.PULL, 2),
                                                          (0, Kind.PULL, 3)]
    assert got[0][1].arrays[0].tolist() == [5] and got[1][1].arrays[0].tolist() == [7, 9]
    np.testing.assert_array_equal(got[2][1].arrays[0], np.arange(200_000))
    assert got[2][1].header == {"k": int(Kind.PULL), "s": 0, "i": 3, "o": 0, "h": 0}
    sent, received = a.traffic.snapshot(), b.traffic.snapshot()
    assert sent["messages_sent"] == received["messages_received"] == 3
    assert sent["wire_messages_sent"] == received["wire_messages_received"] == 2
    assert sent["bytes_sent"] == received["bytes_received"] > 2 * 200_000 * 8
    assert sent["bytes_sent_pull"] == received["bytes_received_pull"]


def test_an_encoded_message_goes_alone_and_in_its_place(pair):
    """A message encoded already (a round's SYNC, Directory.round_build) among others to the
    same peer: sent as a wire message of its own between them, in order, and counted as one
    message of its kind. Its large arrays travel as frames of their own (memoryviews)."""
    a, b = pair
    big = np.arange(20_000, dtype=np.int64)  # 160 kB of keys and of positions: own frames
    inner = _pull(2, big)
    frames = encode([inner])
    frames = [memoryview(f) if isinstance(f, np.ndarray) else f for f in frames]
    assert len(frames) == 4  # headers, payload, keys, positions
    a.send(1, [_pull(1, [5]), Encoded(Kind.PULL, 0, 2, frames, inner.nbytes), _pull(3, [7])])
    got = _receive(b, 3)
    assert [(src, m.kind, m.req_id) for src, m in got] == [(0, Kind.PULL, 1), (0, Kind.PULL, 2),
                                                          (0, Kind.PULL, 3)]
    np.testing.assert_array_equal(got[1][1].arrays[0], big)
    sent, received = a.traffic.snapshot(), b.traffic.snapshot()
    assert sent["messages_sent"] == received["messages_received"] == 3
    assert sent["wire_messages_sent"] == received["wire_messages_received"] == 3
    assert sent["bytes_sent"] == received["bytes_received"]
    assert sent["bytes_sent_pull"] == received["bytes_received_pull"]


def test_many_large_sends_release_their_arrays(pair):
    """Arrays sent without copying are let go of once sent (libzmq's I/O thread queues them,
    the next call frees them), so a long run does not keep every array it ever sent."""
    a, b = pair
    rows = np.ones(100_000, dtype=np.int64)
    before = sys.getrefcount(rows)
    for i in range(200):
        a.send(1, [_pull(i + 1, rows)])
    assert sys.getrefcount(rows) > before  # held while in flight, not copied
    assert len(_receive(b, 200)) == 200
    deadline = time.monotonic() + 10
    while sys.getrefcount(rows) > before and time.monotonic() < deadline:
        a.poll(10)  # where the releases are taken in
        gc.collect()
    assert sys.getrefcount(rows) == before


def test_wake_returns_a_blocked_poll_at_once(pair):
    _, b = pair
    started = time.monotonic()
    b.wake()
    assert b.poll(5000) == []
    assert time.monotonic() - started < 2.5


def test_a_stranger_and_garbage_are_dropped_and_counted(pair):
    a, b = pair
    ctx = zmq.Context.instance()
    socks = []
    try:
        # A connection with an identity nobody has, claiming rank 0 in its headers.
        stranger = ctx.socket(zmq.DEALER)
        stranger.setsockopt(zmq.IDENTITY, b"0:not-the-token")
        # Another stranger, sending frames that are no message.
        garbage = ctx.socket(zmq.DEALER)
        garbage.setsockopt(zmq.IDENTITY, identity_of(0, TOKEN) + b"x")
        socks = [stranger, garbage]
        for s in socks:
            s.setsockopt(zmq.LINGER, 0)
            s.connect(b.address)
        stranger.send_multipart(encode([_pull(9, [1])]))
        garbage.send_multipart([b"\xb1garbage", b""])
        a.send(1, [_pull(10, [2])])  # the real rank 0 still gets through
        got = []
        deadline = time.monotonic() + 10
        counters = b.traffic.counters
        while time.monotonic() < deadline and (
                not got or counters["dropped_forged_messages"] + counters[
                    "dropped_malformed_messages"] < 2):
            for src, messages in b.poll(50):
                got.extend(m.req_id for m in messages)
        assert got == [10]
        assert counters["dropped_forged_messages"] == 1
        assert counters["dropped_malformed_messages"] == 1
        assert counters["messages_received"] == 1
    finally:
        for s in socks:
            s.close(linger=0)


def test_malformed_frames_from_a_member_are_dropped(pair):
    """Frames that are no message, from rank 0's own connection: dropped and counted, and
    what rank 0 sends next is taken in."""
    a, b = pair
    a.send(1, [_pull(1, [3])])
    assert [m.req_id for _, m in _receive(b, 1)] == [1]
    # Truncated header frame from rank 0's own DEALER (the transport's socket, raw).
    a.peers[1].send_multipart([b"\xb1\x01", b""])
    a.send(1, [_pull(2, [4])])
    got = [m.req_id for _, m in _receive(b, 1)]
    assert got == [2]
    assert b.traffic.counters["dropped_malformed_messages"] == 1


def _sync(req_id: int, n: int) -> object:
    """A SYNC of ``n`` delta entries (as NodeState._returned builds one)."""
    from adapm._wire.protocol import NO_MOVES

    keys, none = np.arange(n, dtype=np.int64), np.empty(0, dtype=np.int64)
    return message(Kind.SYNC, 0, req_id,
                   [none, none, np.empty(0, dtype=np.int8), keys, np.arange(n, dtype=np.int64),
                    np.ones(2 * n, dtype=np.float32), np.full(n, -1, dtype=np.int64), none,
                    none, none, *NO_MOVES], o=0)


def test_a_rounds_syncs_go_out_in_order_and_are_counted(pair):
    """send_round: a round's SYNCs, encoded already, each a wire message of its own to its
    peer, in the order given (one native call where the native I/O is there), counted as
    SYNCs; a rank without a connection is refused before anything is sent."""
    a, b = pair
    syncs = [_sync(5, 3), _sync(6, 40_000)]  # the second's arrays travel as frames of their own
    parts = [(1, m.req_id, encode([m]), m.nbytes) for m in syncs]
    with pytest.raises(TransportError, match="rank 0: no connection to rank 7"):
        a.send_round([(7, 4, encode([_sync(4, 1)]), 0), *parts])
    a.send(1, [_pull(1, [5])])
    a.send_round(parts)
    got = _receive(b, 3)
    assert [(m.kind, m.req_id) for _, m in got] == [(Kind.PULL, 1), (Kind.SYNC, 5), (Kind.SYNC, 6)]
    np.testing.assert_array_equal(got[2][1].arrays[3], np.arange(40_000))
    sent, received = a.traffic.snapshot(), b.traffic.snapshot()
    assert sent["messages_sent_sync"] == received["messages_received_sync"] == 2
    assert sent["bytes_sent_sync"] == received["bytes_received_sync"] == sum(
        m.nbytes for m in syncs)
    assert sent["wire_messages_sent"] == received["wire_messages_received"] == 3
    assert sent["bytes_sent"] == received["bytes_received"]
    if a._io is not None:  # the native send notes when rank 1 was last sent something
        assert a._io.sent_at()[1] > 0.0
