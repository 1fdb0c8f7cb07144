"""Calls that wait for sync rounds: a worker's ``wait_sync`` and a plain "one more round". Pure,
in the manner of :mod:`.pacing`: round numbers come in, the calls to finish go out.

A waiter added while round r runs (or after it) waits for round r + 1 at least: the round that
was running may have collected the worker's intents before the worker signalled them. A worker's
``wait_sync`` also needs its intents active at its clock served (taken in by their owners, keys
arrived); until they are, each round that ends names it again, and the next round acts on all
that worker's intents at once, whatever its action timer says (:attr:`Waiters.forced`).
"""

from __future__ import annotations

from typing import Callable, Optional


class _Waiter:
    __slots__ = ("call", "worker", "clock", "first_round")

    def __init__(self, call, worker: Optional[int], clock: int, first_round: int) -> None:
        self.call = call
        self.worker = worker
        self.clock = clock
        self.first_round = first_round


class Waiters:
    """One node's waiting calls. Not thread-safe (the engine thread's)."""

    __slots__ = ("_waiting", "forced")

    def __init__(self) -> None:
        self._waiting: list[_Waiter] = []
        # Workers whose intents the next round acts on all at once (see the module docstring).
        self.forced: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def add(self, call, worker: Optional[int], clock: int, next_round: int) -> None:
        """``call`` finishes once round ``next_round`` (the next to start) or a later one has
        ended and, for ``worker`` (None: any round will do), once its intents active at
        ``clock`` are served."""
        if worker is not None:
            self.forced.add(worker)
        self._waiting.append(_Waiter(call, worker, clock, next_round))

    def take_forced(self) -> set[int]:
        """The workers to act on at once in the round starting now (and forget them)."""
        forced, self.forced = self.forced, set()
        return forced

    def round_done(self, done: int, served: Callable[[int, int], bool]) -> tuple[list, bool]:
        """Round ``done`` ended. ``served(worker, clock)``: that worker's intents active at
        ``clock`` are served. Returns the calls to finish now, and whether a waiter that round
        did not satisfy needs the next one (start it soon)."""
        finished, still, again = [], [], False
        for waiter in self._waiting:
            if done >= waiter.first_round and (
                    waiter.worker is None or served(waiter.worker, waiter.clock)):
                finished.append(waiter.call)
                continue
            if done >= waiter.first_round:
                waiter.first_round = done + 1
                again = True
                if waiter.worker is not None:
                    self.forced.add(waiter.worker)
            still.append(waiter)
        self._waiting = still
        return finished, again
