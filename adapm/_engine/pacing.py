"""When a node's next sync round may start, and what its rounds took. Pure, in the manner of
:mod:`.timing`: times come in, nothing is read from a clock.

A round starts when it is due and needed (the state machine says which: a worker moved or
signalled intent, a replica is held, someone waits). While rounds change nothing, each waits
longer than the last (from :data:`MIN_IDLE_GAP_S`, doubling up to :data:`MAX_IDLE_GAP_S`), so an
idle node holding replicas costs little; a round that changed something lets the next start at
once, and one that had nothing to send waits a little (nothing to do now, maybe soon).
``Config.max_rounds_per_s`` puts a floor under the gap.
"""

from __future__ import annotations

# After a round that changed nothing, the next waits this long, doubling up to MAX_IDLE_GAP_S
# while rounds stay quiet (bench/idle.py: a node holding 50k replicas spent ~3% of a core at
# 40 ms, each round checks every replica's version).
MIN_IDLE_GAP_S = 0.001
MAX_IDLE_GAP_S = 0.2


class RoundPacer:
    """One node's round pacing and round statistics. Not thread-safe (the engine thread's);
    other threads may read the counts (ints, replaced whole)."""

    __slots__ = ("min_gap", "started", "done", "empty", "time_total", "start_time", "next_at",
                 "idle_gap", "quiet")

    def __init__(self, max_rounds_per_s: float = 0.0) -> None:
        self.min_gap = 1.0 / max_rounds_per_s if max_rounds_per_s else 0.0
        self.started = 0
        self.done = 0
        self.empty = 0  # rounds that had nothing to send (over at once)
        self.time_total = 0.0  # from start to last answer, over the rounds that sent something
        self.start_time = 0.0  # of the running (or last) round
        self.next_at = 0.0  # no round starts before this
        self.idle_gap = 0.0
        self.quiet = True  # the running round changed nothing so far

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def hurry(self) -> None:
        """Someone waits for a round: the next may start at once."""
        self.next_at = 0.0

    def start(self, now: float, quiet: bool) -> None:
        """A round starts at ``now``; ``quiet``: nobody waits and no worker moved, so it stays
        quiet unless it changes something (:meth:`busy`)."""
        self.started += 1
        self.start_time = now
        self.quiet = quiet

    def busy(self) -> None:
        """The running round changed something (intents acted on, deltas, refreshes)."""
        self.quiet = False

    def finish(self, now: float, empty: bool) -> None:
        """The running round is over at ``now`` (``empty``: it had nothing to send): when the
        next may start."""
        self.done += 1
        if empty:
            self.empty += 1
        else:
            self.time_total += now - self.start_time
        if self.quiet:
            self.idle_gap = min(max(2 * self.idle_gap, MIN_IDLE_GAP_S), MAX_IDLE_GAP_S)
        else:
            self.idle_gap = MIN_IDLE_GAP_S if empty else 0.0
        self.next_at = self.start_time + max(self.min_gap, self.idle_gap)

    def mean_s(self) -> float:
        """Mean time from a round's start to its last answer (rounds that sent something)."""
        return self.time_total / max(self.done - self.empty, 1)

    def stats(self) -> dict:
        """``rounds`` run (``empty_rounds`` of them had nothing to send); ``mean_round_ms``."""
        return {"rounds": self.done, "empty_rounds": self.empty,
                "mean_round_ms": 1000.0 * self.mean_s()}
