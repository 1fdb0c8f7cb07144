"""The engine's event stream: what happened to which keys on this node, and when.

:class:`~.state.NodeState` reports, per batch of keys, every change of where keys are and of what
this node wants (:class:`Event`), and one :class:`RoundRecord` per sync round, to the sinks
subscribed to it (``NodeState.subscribe``). Parameter-placement traces are such a sink; so is
the consistency test that holds the stream against ``stats()``.

Off costs nothing: with no sink subscribed, each site is one check of an empty list per batch
(not per key), and no array is copied or built. A sink is called on the engine thread, inside
``handle``: it must be quick and must not call back into the engine; the arrays it gets are its
own (copies, or arrays the engine no longer writes), so it may keep them.

Times are the engine's (``time.monotonic`` under the real loop, virtual in the simulator);
``clock`` is the smallest worker clock of the node at that moment (for ``REMOTE_ACCESS``: the
clock of the worker whose request it was). Initially every key is at its home
(``key % world_size``), as a main copy, and no node has intent; under ``full_replication``
every node also holds a replica of every key homed elsewhere.
"""

from __future__ import annotations

import enum
from typing import Protocol

import numpy as np


class Event(enum.IntEnum):
    """What happened to a batch of keys on the node that reports it."""

    ALLOC = 1  # the main copy arrived here (relocation; a replica held here became the main copy)
    DEALLOC = 2  # the main copy left; ``peer``: where it went
    REPLICA_SETUP = 3  # a replica was installed here; ``peer``: the owner that sent it
    REPLICA_DROP = 4  # the replica here was dropped (this node's intent ended)
    INTENT_START = 5  # this node now has acted-on intent (the owner took the report in)
    INTENT_STOP = 6  # this node's intent ended (the owner took the report in)
    REMOTE_ACCESS = 7  # a worker's pull, push or set of these keys was served by ``peer``


class RoundRecord:
    """One finished sync round of a node: ``number`` (1, 2, ...; each channel counts its own),
    ``start`` and ``end`` (engine time), ``empty`` (it had nothing to send), ``counters``: the
    engine's counters at its end (a copy; names in ``state.COUNTERS``), and ``channel``: the
    node's engine channel that ran it (``Config.channels``; 0 with one)."""

    __slots__ = ("number", "start", "end", "empty", "counters", "channel")

    def __init__(self, number: int, start: float, end: float, empty: bool,
                 counters: dict, channel: int = 0) -> None:
        self.number = number
        self.start = start
        self.end = end
        self.empty = empty
        self.counters = counters
        self.channel = channel


class EventSink(Protocol):
    """What a subscriber implements (called on the engine thread; see the module docstring)."""

    def on_keys(self, event: Event, keys: np.ndarray, now: float, clock: int,
                peer: int) -> None: ...

    def on_round(self, record: RoundRecord) -> None: ...
