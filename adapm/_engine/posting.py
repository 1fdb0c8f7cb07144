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

from .._wire.protocol import CARRIERS, MOVE_ARRAYS, Encoded, Kind, Message, message
from .events import Finish, Send


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

    def send_encoded(self, dst: int, encoded: Encoded) -> None:
        """A message encoded already, with the moves held for ``dst`` in it (a round's SYNC:
        ``Directory.round_build`` took them)."""
        self.out.append(Send(dst, encoded))

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
