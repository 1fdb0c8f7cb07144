"""Intent bookkeeping: per worker (signalled → acted → expired) and per node (who to tell).

Worker side: ``Worker.intent`` hands the keys to the worker's :class:`WorkerIntents`, a native
queue (native/intent_queue.h) that copies them, so signalling never slows the worker down,
however far ahead or however many keys. Once per round the engine collects each worker's queue
in one native call: batches the action timer says to act on are counted in, batches whose
end has passed are counted out.

Node side: :class:`NodeIntents` counts acted-on intents per key over all workers of the node.
Only 0→1 and 1→0 transitions matter to owners ("node has intent" / "intent ended"), and what is
sent is level-triggered: each round sends, for keys whose count crossed zero, the current state
where it differs from what the owner last acknowledged. So an intent that starts and ends between
two rounds costs nothing, and a retried message can never apply twice.
"""

from __future__ import annotations

import time

import numpy as np

from .._native_loader import load as _load_native
from .timing import ActionTimer, ImmediateTimer

_native = _load_native()

# The action horizon of a timer that acts at once (math.inf) as the native int64.
_NO_HORIZON = 2**63 - 1

# A worker whose queue holds intents that no round has collected for longer than PATIENCE_ROUNDS
# of the node's mean round times (at least MIN_PATIENCE_S) is "behind" (WorkerIntents.behind):
# the running round is held up (the demo's KGE: median 0.8 ms, the held-up ones 5-30 ms). In
# time, not in clocks: a worker whose clocks are short (bench/adaptive.py: ~10 us) is always a
# few clocks past the last collect, and yielding there ran a round every ~3 clocks, at a third
# of the throughput.
PATIENCE_ROUNDS = 2.0
MIN_PATIENCE_S = 0.002


class WorkerIntents:
    """One worker's intents: its action timer and native queue. ``signal`` is for the worker's
    thread, the rest for the engine thread (each native call holds the GIL, so they never
    interleave)."""

    __slots__ = ("timer", "queue", "signal", "collected_at", "patience_s")

    def __init__(self, timer, num_keys: int) -> None:
        self.timer = timer
        self.queue = _native.IntentQueue(num_keys)
        # signal(keys, start, end): copies keys (int64, checked) for clocks [start, end).
        self.signal = self.queue.signal
        # When a round last collected this queue (time.monotonic; the engine thread writes it,
        # the worker's reads it: one float attribute), and how long past that is late.
        self.collected_at = time.monotonic()
        self.patience_s = MIN_PATIENCE_S

    @classmethod
    def configured(cls, config, clock: int, num_keys: int) -> "WorkerIntents":
        """A worker's intents as ``config`` times them (``action_timing``: the learned timer;
        otherwise act on each intent as soon as a round sees it), its clock at ``clock``."""
        if config.action_timing:
            timer = ActionTimer(config.timing_alpha, config.timing_p, config.timing_lambda0, clock)
        else:
            timer = ImmediateTimer(clock)
        return cls(timer, num_keys)

    def horizon(self, clock: int, force: bool = False) -> int:
        """A round at the worker's ``clock``: act on intents with start below this. ``force``
        acts on every intent active now (``wait_sync`` needs that), whatever the timer says."""
        horizon = self.timer.horizon(clock)
        if force:
            horizon = max(horizon, clock + 1)
        return int(min(horizon, _NO_HORIZON))

    def empty(self) -> bool:
        """No intent signalled, waiting or acted on: nothing here depends on the clock."""
        return self.queue.empty()

    def idle(self, clock: int) -> bool:
        """A round at ``clock`` has nothing to collect here: no intent signalled, waiting or
        acted on, and the clock has not moved since the last round (the timer learns only from
        clocks that moved)."""
        return clock == self.timer.last_clock and self.queue.empty()

    def late(self, clock: int) -> bool:
        """An intent active at ``clock`` waits for a round to act on it: the worker reached it
        before the engine did (the worker's thread asks, on an access that found keys
        missing; ``Worker.pull``). O(batches waiting), one native call."""
        return self.queue.late(clock)

    def fresh(self) -> bool:
        """An intent was signalled since the last round collected this queue."""
        return self.queue.fresh()

    def behind(self, now: float) -> bool:
        """Intents wait in this queue and no round has collected it for longer than
        ``patience_s`` before ``now`` (time.monotonic): the round they wait for is late (for the
        worker's thread; see ``Worker.advance_clock``). Two float attributes the engine thread
        writes, and one native flag."""
        return now - self.collected_at > self.patience_s and self.queue.fresh()

    def served(self, clock: int, node: "NodeIntents") -> bool:
        """Every intent active at ``clock`` was acted on and all its keys are told."""
        return self.queue.served(clock, node.native)


class NodeIntents:
    """Per-key count of acted-on intents on this node, and what owners were last told.

    A key's count is the number of its occurrences in this node's acted-on, unexpired intent
    batches (a key twice in one batch counts twice, and that batch's expiry takes both away):
    only whether it is zero matters. Each round counts each worker's batches in and out in one
    native call (:meth:`collect`) that also collects, once each, the keys whose count crossed
    zero, and :meth:`changes` is one more pass over those: no sort (numpy needs one to count
    duplicates and another to dedupe; bench/adaptive.py, ~0.4 ms of a ~1.3 ms round).

    The counts live in native code (``_native.IntentCounts``, native/intents.h), kept only for
    keys with intent (dense arrays cost 6 B per key of the key space on every node). Engine
    thread only.
    """

    def __init__(self, num_keys: int) -> None:
        self.native = _native.IntentCounts(num_keys)

    def collect(self, worker: WorkerIntents, clock: int, force: bool = False) -> tuple:
        """A round at ``worker``'s ``clock``: its intents the timer says to act on are counted
        in, its acted-on intents that ended are counted out (one native call). Returns (keys
        acted on, whether any intent was acted on or expired)."""
        got = self.native.collect(worker.queue, clock, worker.horizon(clock, force))
        worker.collected_at = time.monotonic()
        return got

    def collect_all(self, workers: list, clocks: list, forced: set, now: float,
                    mean_round_s: float) -> tuple[int, bool]:
        """A round collects every worker (:meth:`collect`; worker i at ``clocks[i]``, 0 if it
        has none yet), acting on all intents active now of the workers in ``forced`` (by
        index). A worker with no intent whose clock did not move is only looked at (an app's
        lead worker while the others train: collecting it would change nothing). Sets each
        worker's patience from the node's ``mean_round_s``. Returns (keys acted on, whether any
        intent was acted on or expired)."""
        # How long a worker's intents may wait uncollected before the worker yields its core to
        # let the late round finish (WorkerIntents.behind; Worker.advance_clock).
        patience = max(MIN_PATIENCE_S, PATIENCE_ROUNDS * mean_round_s)
        acted_total, changed_any = 0, False
        for index, worker in enumerate(workers):
            clock = clocks[index] if index < len(clocks) else 0
            worker.patience_s = patience
            force = index in forced
            if not force and worker.idle(clock):
                worker.collected_at = now
                continue
            acted, changed = self.collect(worker, clock, force=force)
            acted_total += acted
            changed_any = changed_any or changed
        return acted_total, changed_any

    def changes(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, has_intent) whose state differs from what owners were told, each key once, in
        the order they first changed; clears the collected set."""
        keys, flags = self.native.changes()
        return np.frombuffer(keys, dtype=np.int64), np.frombuffer(flags, dtype=bool)

    def pending(self) -> bool:
        """Keys wait for :meth:`changes` to look at them."""
        return self.native.pending()

    def report_again(self, keys: np.ndarray) -> None:
        """``keys`` were reported but not taken in (the report went to a node that no longer
        owns them): the next :meth:`changes` looks at them again."""
        self.native.report_again(np.ascontiguousarray(keys, dtype=np.int64))

    def acknowledge(self, keys: np.ndarray, has_intent: np.ndarray) -> None:
        self.native.acknowledge(np.ascontiguousarray(keys, dtype=np.int64),
                                np.ascontiguousarray(has_intent, dtype=bool).view(np.uint8))

    def wants(self, keys: np.ndarray) -> np.ndarray:
        return np.frombuffer(self.native.wants(keys), dtype=bool)

    def in_flight(self, keys: np.ndarray) -> np.ndarray:
        """Keys with acted-on intent whose owner has not answered the report yet."""
        return np.frombuffer(self.native.in_flight(keys), dtype=bool)

    def dense(self) -> tuple[np.ndarray, np.ndarray]:
        """(count int32, told bool) over the whole key space: copies, for tests."""
        count, told = self.native.dense()
        return np.frombuffer(count, dtype=np.int32), np.frombuffer(told, dtype=bool)
