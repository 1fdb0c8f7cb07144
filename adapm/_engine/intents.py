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

import numpy as np

from .._native_loader import load as _load_native

_native = _load_native()

# The action horizon of a timer that acts at once (math.inf) as the native int64.
_NO_HORIZON = 2**63 - 1


class WorkerIntents:
    """One worker's intents: its action timer and native queue. ``signal`` is for the worker's
    thread, the rest for the engine thread (each native call holds the GIL, so they never
    interleave)."""

    __slots__ = ("timer", "queue", "signal")

    def __init__(self, timer, num_keys: int) -> None:
        self.timer = timer
        self.queue = _native.IntentQueue(num_keys)
        # signal(keys, start, end): copies keys (int64, checked) for clocks [start, end).
        self.signal = self.queue.signal

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

    def fresh(self) -> bool:
        """An intent was signalled since the last round collected this queue."""
        return self.queue.fresh()

    def served(self, clock: int, told: np.ndarray) -> bool:
        """Every intent active at ``clock`` was acted on and all its keys are ``told``."""
        return self.queue.served(clock, told.view(np.uint8))


class NodeIntents:
    """Per-key count of acted-on intents on this node, and what owners were last told.

    ``count[k]`` is the number of occurrences of k in this node's acted-on, unexpired intent
    batches (a key twice in one batch counts twice, and that batch's expiry takes both away):
    only whether it is zero matters. Each round counts each worker's batches in and out in one
    native call (:meth:`collect`) that also collects, once each, the keys whose count crossed
    zero (``mark`` says which are collected), and :meth:`changes` is one more pass over those:
    no sort (numpy needs one to count duplicates and another to dedupe; bench/adaptive.py,
    ~0.4 ms of a ~1.3 ms round).
    """

    def __init__(self, num_keys: int) -> None:
        self.count = np.zeros(num_keys, dtype=np.int32)
        self.told = np.zeros(num_keys, dtype=bool)
        self._mark = np.zeros(num_keys, dtype=np.uint8)
        self._dirty = np.empty(1024, dtype=np.int64)
        self._ndirty = 0

    def collect(self, worker: WorkerIntents, clock: int, force: bool = False) -> tuple:
        """A round at ``worker``'s ``clock``: its intents the timer says to act on are counted
        in, its acted-on intents that ended are counted out (one native call). Returns (keys
        acted on, whether any intent was acted on or expired)."""
        horizon = worker.horizon(clock, force)
        while True:  # the worker may signal between sizing and collecting: then size again
            self._reserve(worker.queue.queued_keys())
            done = worker.queue.collect(clock, horizon, self.count, self._mark, self._dirty,
                                        self._ndirty)
            if done is not None:
                break
        self._ndirty, acted, changed = done
        return acted, changed

    def _reserve(self, more: int) -> None:
        """Room in the dirty list for ``more`` keys."""
        need = self._ndirty + more
        if len(self._dirty) < need:
            grown = np.empty(max(need, 2 * len(self._dirty)), dtype=np.int64)
            grown[:self._ndirty] = self._dirty[:self._ndirty]
            self._dirty = grown

    def changes(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, has_intent) whose state differs from what owners were told, each key once, in
        the order they first changed; clears the dirty set."""
        n = self._ndirty
        keys = np.empty(n, dtype=np.int64)
        flags = np.empty(n, dtype=bool)
        m = _native.intent_changes(self.count, self.told, self._mark, self._dirty, n, keys, flags)
        self._ndirty = 0
        return keys[:m], flags[:m]

    def pending(self) -> bool:
        """Keys wait for :meth:`changes` to look at them."""
        return self._ndirty > 0

    def report_again(self, keys: np.ndarray) -> None:
        """``keys`` (unique) were reported but not taken in (the report went to a node that no
        longer owns them): the next :meth:`changes` looks at them again."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        fresh = keys[self._mark[keys] == 0]
        self._reserve(len(fresh))
        need = self._ndirty + len(fresh)
        self._mark[fresh] = 1
        self._dirty[self._ndirty:need] = fresh
        self._ndirty = need

    def acknowledge(self, keys: np.ndarray, has_intent: np.ndarray) -> None:
        self.told[keys] = has_intent

    def wants(self, keys: np.ndarray) -> np.ndarray:
        return self.count[keys] > 0

    def in_flight(self, keys: np.ndarray) -> np.ndarray:
        """Keys with acted-on intent whose owner has not answered the report yet.

        Read by worker threads while the engine thread writes: each element read is atomic, and
        a stale answer only means the request waits for the next arrival or round.
        """
        return (self.count[keys] > 0) & ~self.told[keys]

