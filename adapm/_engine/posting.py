"""Where the messages of one handled event go, and the rule that orders them: a key's move goes
before anything else to the same peer.

A decision's relocations, replica set-ups and home updates are held per peer in the native
directory (native/outbox.h) and wait for a message that carries them: every round exchanges a
SYNC and a SYNC_RESP with each peer it has business with, so a relocation or replica decided
while serving a peer's SYNC goes out with the answer, and home updates with the next round's
SYNC (bench/adaptive.py, 2 nodes: ~5.5 messages per node and round when each kind went on its
own, one after the other). Held moves for a peer always go before any other message to it (a
relocation before the answer that reports it, before a request forwarded to the new owner); and
when a round starts, or at a Tick with no round running, whatever waits goes alone
(:meth:`Posting.release_all`), so nothing waits longer than a round.
"""

from __future__ import annotations

import collections
from typing import Optional

from .._wire.protocol import CARRIERS, MOVE_ARRAYS, Kind, Message, message
from .events import Finish, Send, SendRound


class Posting:
    """The instructions (:class:`~.events.Send`, :class:`~.events.Finish`) of the event being
    handled, in order, and the messages a node posts to itself (handled after the event, in
    the order posted). Engine thread only."""

    __slots__ = ("rank", "directory", "out", "local")

    def __init__(self, rank: int, directory) -> None:
        self.rank = rank
        self.directory = directory  # the native Directory: the moves held per peer
        self.out: list = []
        self.local: collections.deque[Message] = collections.deque()

    def take(self) -> list:
        """The instructions posted since the last take."""
        out, self.out = self.out, []
        return out

    def post(self, dst: int, kind: Kind, req_id: int, arrays=(), **fields) -> None:
        self.post_message(dst, message(kind, self.rank, req_id, arrays, **fields))

    def post_message(self, dst: int, msg: Message) -> None:
        """``msg`` to ``dst``: to itself, queued here; a carrier takes the moves held for
        ``dst`` along; any other message goes after them."""
        if dst == self.rank:
            self.local.append(msg)
        elif msg.kind in CARRIERS:
            moves = self.directory.take_moves(dst)
            if moves is not None:
                msg.arrays[-MOVE_ARRAYS:] = moves
            self.out.append(Send(dst, msg))
        else:
            self.release(dst)
            self.out.append(Send(dst, msg))

    def send_round(self, parts: list) -> None:
        """A round's SYNCs, encoded already with the moves held for their owners
        (``Directory.round_build`` took them): ``parts``, one ``(dst, req_id, frames, nbytes)``
        per peer; one instruction for all (:class:`~.events.SendRound`)."""
        self.out.append(SendRound(self.rank, parts))

    def finish(self, call, parts: list, error=None) -> None:
        self.out.append(Finish(call, parts, error))

    def release(self, dst: int) -> None:
        """The moves held for ``dst``, on their own (one MOVES message), if any."""
        moves = self.directory.take_moves(dst)
        if moves is not None:
            self.out.append(Send(dst, message(Kind.MOVES, self.rank, 0, moves)))

    def release_all(self) -> None:
        for dst in self.directory.held_peers():
            self.release(dst)

    def take_held(self) -> dict:
        """Takes the moves held for every peer: {rank: the 12 move arrays} (tests)."""
        return {dst: list(self.directory.take_moves(dst)) for dst in self.directory.held_peers()}


class Outbox:
    """What the runner of a state machine (the engine loop, the simulator) carries out of the
    instructions it was given: the messages, per peer in the order posted, until it sends them
    (:meth:`flush`); the calls to complete, handed back at once. A round's SYNCs
    (:class:`~.events.SendRound`) that come before anything else since the last flush go out
    first, all in one call (``Transport.send_round``); after other messages they take their
    place among each peer's messages. Not thread-safe (the runner's thread)."""

    __slots__ = ("round", "by_peer")

    def __init__(self) -> None:
        self.round: Optional[SendRound] = None
        self.by_peer: dict[int, list] = {}

    def __bool__(self) -> bool:
        return self.round is not None or bool(self.by_peer)

    def carry(self, instructions: list) -> list:
        """Takes ``instructions`` (Send, SendRound, Finish, in order); returns the Finishes,
        in order, for the caller to complete now."""
        finished = []
        by_peer = self.by_peer
        for ins in instructions:
            kind = type(ins)
            if kind is Send:
                by_peer.setdefault(ins.dst, []).append(ins.message)
            elif kind is SendRound:
                if self.round is None and not by_peer:
                    self.round = ins  # nothing posted before it: it goes first, in one call
                else:
                    for send in ins.sends():
                        by_peer.setdefault(send.dst, []).append(send.message)
            else:
                finished.append(ins)
        return finished

    def flush(self, transport) -> tuple[list, list]:
        """Sends what was carried: the round's SYNCs first, then each peer's messages as one
        wire message (``transport.send``). Returns the ranks the round went to and the other
        ranks sent to (either may repeat the other's)."""
        sync, self.round = self.round, None
        by_peer, self.by_peer = self.by_peer, {}
        round_peers = []
        if sync is not None:
            transport.send_round(sync.parts)
            round_peers = [part[0] for part in sync.parts]
        for dst, messages in by_peer.items():
            transport.send(dst, messages)
        return round_peers, list(by_peer)
