"""Where a handled event's messages go (adapm._engine.posting), over a real native directory:
moves decided for a peer ride on the next carrier to it, or go on their own before any other
message to it; and how a runner's outbox orders what it sends."""

import numpy as np

import adapm
from adapm._engine.events import Finish, Send, SendRound
from adapm._engine.posting import Outbox, Posting
from adapm._engine.routing import home_keys
from adapm._engine.state import NodeState
from adapm._store import OWNER, Store
from adapm._wire.protocol import MOVE_ARRAYS, NO_MOVES, Kind, encode, message


def _owner_with_a_relocation_for_rank_1():
    """Rank 0 of 2 (adaptive), owning its home keys, has decided to relocate key 0 to rank 1
    (rank 1 reported intent, nobody else has any): that move is held for rank 1."""
    config = adapm.Config(num_keys=8, value_length=2, world_size=2, rank=0,
                          rendezvous="127.0.0.1:1", management="adaptive")
    store = Store(config)
    store.insert(home_keys(0, 8, 2), OWNER)
    node = NodeState(0, 2, store, config)  # kept: its directory works over the store
    node.directory.decide(node.variant, 1, np.array([0], dtype=np.int64),
                          np.ones(1, dtype=np.uint8))
    assert node.moves_held()
    return node, Posting(0, node.directory)


def _relocated(arrays) -> list:
    """The keys a carrier relocates (its move arrays' first: the relocations' keys)."""
    return arrays[-MOVE_ARRAYS].tolist()


def test_a_plain_message_goes_after_the_moves_held_for_its_peer():
    node, posting = _owner_with_a_relocation_for_rank_1()
    posting.post(1, Kind.ACK, 5, [np.arange(1, dtype=np.int64)])
    posting.post(1, Kind.ACK, 6, [np.arange(1, dtype=np.int64)])
    out = posting.take()
    assert [(type(i), i.dst, i.message.kind) for i in out] == [
        (Send, 1, Kind.MOVES), (Send, 1, Kind.ACK), (Send, 1, Kind.ACK)]
    assert _relocated(out[0].message.arrays) == [0]
    assert not node.moves_held() and posting.take() == []


def test_a_carrier_takes_the_moves_along():
    node, posting = _owner_with_a_relocation_for_rank_1()
    answer = [np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64),
              np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32),
              np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64),
              np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)]
    posting.post(1, Kind.SYNC_RESP, 9, [*answer, *NO_MOVES])
    (send,) = posting.take()
    assert send.dst == 1 and send.message.kind == Kind.SYNC_RESP
    assert _relocated(send.message.arrays) == [0]
    assert not node.moves_held()


def test_a_message_to_itself_is_kept_here_and_moves_wait_for_a_release():
    node, posting = _owner_with_a_relocation_for_rank_1()
    msg = message(Kind.ACK, 0, 3, [np.arange(1, dtype=np.int64)])
    posting.post_message(0, msg)
    assert list(posting.local) == [msg] and posting.take() == []
    assert node.moves_held()  # nothing went to rank 1
    posting.release_all()
    (send,) = posting.take()
    assert (send.dst, send.message.kind) == (1, Kind.MOVES)
    assert _relocated(send.message.arrays) == [0]
    posting.release_all()  # nothing held any more: nothing sent
    assert posting.take() == [] and not node.moves_held()


class _Recorder:
    """A transport that notes what it is asked to send."""

    def __init__(self):
        self.sent = []

    def send(self, dst, messages):
        self.sent.append(("send", dst, [(m.kind, m.req_id) for m in messages]))

    def send_round(self, parts):
        self.sent.append(("send_round", [(dst, req_id) for dst, req_id, _, _ in parts]))


def _parts(*peers):
    frames = encode([message(Kind.PULL, 0, 1, [np.arange(1, dtype=np.int64)] * 2, o=0)])
    return [(dst, 10 + dst, frames, 24) for dst in peers]


def test_a_round_sent_first_goes_in_one_call_and_later_messages_after_it():
    """A round's SYNCs that nothing was posted before since the last flush go out first, in
    one transport call; what is posted after them to the same peers follows them."""
    outbox, transport = Outbox(), _Recorder()
    call = object()
    done = outbox.carry([SendRound(0, _parts(1, 2)), Finish(call, []),
                         Send(1, message(Kind.ACK, 0, 5, [np.arange(1, dtype=np.int64)]))])
    assert [f.call for f in done] == [call] and outbox
    assert outbox.flush(transport) == ([1, 2], [1])
    assert transport.sent == [("send_round", [(1, 11), (2, 12)]),
                              ("send", 1, [(Kind.ACK, 5)])]
    assert not outbox and outbox.flush(transport) == ([], [])


def test_a_round_after_other_messages_takes_its_place_among_them():
    """Messages posted to a peer before a round's SYNC go before it: the SYNCs then join each
    peer's messages in order (a second round in one flush too)."""
    outbox, transport = Outbox(), _Recorder()
    outbox.carry([Send(2, message(Kind.ACK, 0, 5, [np.arange(1, dtype=np.int64)])),
                  SendRound(0, _parts(1, 2))])
    outbox.carry([SendRound(0, _parts(1))])
    assert outbox.flush(transport) == ([], [2, 1])
    assert transport.sent == [("send", 2, [(Kind.ACK, 5), (Kind.SYNC, 12)]),
                              ("send", 1, [(Kind.SYNC, 11), (Kind.SYNC, 11)])]
