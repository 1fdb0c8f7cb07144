"""The requests a node sent and waits on: a worker's call or a sync round's SYNC, each with what
its answers need (the keys by position) and where its entries are now (for error messages)."""

from __future__ import annotations

import numpy as np


class Outstanding:
    """A request this node sent and waits on. ``call`` is None for a sync round's requests.

    ``keys``/``positions``: what a worker's request asked for, by position in the worker's call
    (positions ascend), so an answer's positions name the keys it answers for. ``at``: rank ->
    entries unanswered there (the call's ``waiting_on``; for error messages only). ``round``:
    a round request's context (:class:`RoundContext`).
    """

    __slots__ = ("call", "remaining", "keys", "positions", "parts", "round", "clock", "at")

    def __init__(self, call, remaining: int, keys=None, positions=None, round=None,
                 clock: int = 0) -> None:
        self.call = call
        self.clock = clock  # the worker's clock when it asked (for the event stream)
        self.remaining = remaining
        self.keys = keys
        self.positions = positions
        self.parts: list = []
        self.round = round
        self.at: dict[int, int] = call.waiting_on if call is not None else {}


class RoundContext:
    """Context of a round's SYNC requests (one object for all of them): the round's keys by
    position (an answer's positions index them), and the reports' flags."""

    __slots__ = ("keys", "num_intents", "num_deltas", "flags")

    def __init__(self, keys: np.ndarray, num_intents: int, num_deltas: int,
                 flags: np.ndarray) -> None:
        self.keys = keys
        self.num_intents = num_intents
        self.num_deltas = num_deltas
        self.flags = flags


class Requests(dict):
    """The outstanding requests by id. Ids count up from 1 (``Directory.round_build`` numbers a
    round's SYNCs from :attr:`next_id` on, and :meth:`add_round` takes them in that order). The
    engine thread changes it; other threads may read snapshots."""

    __slots__ = ("next_id",)

    def __init__(self) -> None:
        super().__init__()
        self.next_id = 1

    def add(self, outstanding: Outstanding) -> int:
        req_id = self.next_id
        self.next_id += 1
        self[req_id] = outstanding
        return req_id

    def add_round(self, count: int, context: RoundContext) -> int:
        """A round's request of ``count`` entries."""
        return self.add(Outstanding(None, count, round=context))

    def ranks_waited_for(self, ids) -> list[int]:
        """The ranks holding unanswered entries of the round requests ``ids``, where they were
        passed on too (a snapshot; any thread)."""
        ranks = set()
        for req_id in list(ids):
            req = self.get(req_id)
            if req is not None and req.round is not None:
                ranks.update(rank for rank, n in dict(req.at).items() if n > 0)
        return sorted(ranks)
