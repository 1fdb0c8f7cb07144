"""Sync rounds: the requester side of the adaptive protocol. Runs on the communication thread.

A round
1. collects every worker's intents (the action timer decides which to act on now),
2. reports to owners, per key, the node's intent state where it changed (0→1, 1→0); a replica
   whose intent ended is dropped here first and its last delta goes along (nothing is lost),
3. sends every replica's accumulated delta or, if it has none, its version to the owner, which
   merges and answers with the new value only where the replica is behind,
4. groups all of that per destination node: one SYNC message per node (sections: intent
   reports, deltas, version checks), and none to nodes with nothing to say (no empty
   all-to-all),
5. completes when every position of every request is answered (answers may come from the node
   a request was forwarded to). The next round starts after that.

``wait_sync`` and ``barrier`` ask for a round that *starts* after their call and wait for it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

from . import routing
from .intents import NodeIntents, WorkerIntents, unique
from .protocol import Kind, Message
from .store import OWNER, REPLICA
from .timing import ActionTimer, ImmediateTimer

if TYPE_CHECKING:
    from .comm import Comm

# After a round with nothing to send, wait this long before the next: an idle node polls
# intents 1000 times a second at most, instead of spinning.
_IDLE_ROUND_GAP_S = 0.001
# Longest sleep in poll while a round is running or nothing is due (also: how quickly the
# communication thread notices a stop request).
IDLE_POLL_MS = 50


class Waiter:
    """Someone waiting for a round that started after it asked, plus an extra condition."""

    __slots__ = ("first_round", "condition", "on_done")

    def __init__(self, first_round: int, condition: Optional[Callable[[], bool]],
                 on_done: Callable[[], None]) -> None:
        self.first_round = first_round
        self.condition = condition
        self.on_done = on_done


class SyncLoop:
    def __init__(self, comm: "Comm", config) -> None:
        self.comm = comm
        self.store = comm.store
        self.config = config
        self.node = NodeIntents(self.store.num_keys)
        self.workers: list[tuple[object, WorkerIntents]] = []  # (Worker, its intents)
        self.replica_keys = np.empty(0, dtype=np.int64)  # sorted
        self.rounds_started = 0
        self.rounds_done = 0
        self.round_time_total = 0.0
        self._round_start = 0.0
        self._open: dict[int, object] = {}  # req_id -> Pending of the running round
        self._next_round_at = 0.0
        self._forced: set[int] = set()
        self.waiters: list[Waiter] = []
        self.counters = {"intents_acted": 0, "replica_drops": 0}
        self.min_gap = 1.0 / config.max_rounds_per_s if config.max_rounds_per_s else 0.0
        self.closing = False  # set by shutdown: start no more rounds

    # --- registration (any thread; list.append is atomic) ------------------------------------

    def new_worker_intents(self, worker) -> WorkerIntents:
        if self.config.action_timing:
            timer = ActionTimer(self.config.timing_alpha, self.config.timing_p,
                                self.config.timing_lambda0, worker.clock)
        else:
            timer = ImmediateTimer(worker.clock)
        intents = WorkerIntents(timer)
        self.workers.append((worker, intents))
        return intents

    # --- bookkeeping of replicas held here ---------------------------------------------------

    def replicas_added(self, keys: np.ndarray) -> None:
        # Not np.union1d: its np.unique hashes, ~10x slower than this sort (intents.unique).
        self.replica_keys = unique(np.concatenate((self.replica_keys, keys)))

    def replicas_removed(self, keys: np.ndarray) -> None:
        if len(keys):
            self.replica_keys = np.setdiff1d(self.replica_keys, keys, assume_unique=True)

    # --- waiting -----------------------------------------------------------------------------

    def request_round(self, on_done: Callable[[], None], worker_index: Optional[int] = None,
                      condition: Optional[Callable[[], bool]] = None) -> None:
        """Call ``on_done`` after a round that starts from now on, once ``condition`` holds.

        ``worker_index``: act on all of that worker's active intents in that round (wait_sync).
        """
        if worker_index is not None:
            self._forced.add(worker_index)
        self.waiters.append(Waiter(self.rounds_started + 1, condition, on_done))
        self._next_round_at = 0.0

    def poll_timeout_ms(self) -> int:
        """How long the loop may sleep in poll before the next round is due."""
        if self._open:
            return IDLE_POLL_MS
        wait_s = self._next_round_at - time.monotonic()
        return max(0, min(IDLE_POLL_MS, int(wait_s * 1000 + 0.999)))

    def waiting_on(self) -> list[int]:
        """Ranks the running round still waits for (read from other threads: a snapshot)."""
        return sorted({pending.dst for pending in list(self._open.values())})

    def worker_by_index(self, index: int):
        for worker, _ in self.workers:
            if worker.index == index:
                return worker
        raise KeyError(index)

    # --- the round ---------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Start a round if none is running and one is due."""
        if self._open or now < self._next_round_at or self.closing:
            return
        self.rounds_started += 1
        self._round_start = now
        for dst, arrays, count, on_answer in self._build_round():
            req_id, pending = self.comm.new_internal_request(dst, Kind.SYNC, count, on_answer)
            self._open[req_id] = pending
            self.comm.post(dst, Kind.SYNC, req_id, arrays, o=self.comm.rank)
        if not self._open:
            self._finish_round(now, empty=True)

    def answered(self, req_id: int) -> None:
        """A request of the running round is fully answered."""
        self._open.pop(req_id, None)
        if not self._open:
            self._finish_round(time.monotonic(), empty=False)

    def _finish_round(self, now: float, empty: bool) -> None:
        self.rounds_done += 1
        if not empty:
            self.round_time_total += now - self._round_start
        gap = _IDLE_ROUND_GAP_S if empty else 0.0
        self._next_round_at = self._round_start + max(self.min_gap, gap)
        still = []
        for waiter in self.waiters:
            if self.rounds_done >= waiter.first_round and (waiter.condition is None
                                                           or waiter.condition()):
                waiter.on_done()
            else:
                if self.rounds_done >= waiter.first_round:
                    waiter.first_round = self.rounds_done + 1
                    self._next_round_at = 0.0
                still.append(waiter)
        self.waiters = still

    def _build_round(self) -> list:
        """This round's requests: [(owner, SYNC arrays, number of entries, answer handler)]."""
        store, node = self.store, self.node
        for worker, intents in self.workers:
            acted, expired = intents.collect(worker.clock, force=worker.index in self._forced)
            node.add(acted)
            node.remove(expired)
            self.counters["intents_acted"] += sum(len(k) for k in acted)
        self._forced.clear()
        ikeys, iflags = node.changes()
        if self.config.management == "full_replication":
            # Every key is everywhere and stays: owners need not hear of intents (and replicas
            # are never dropped). Taken as told, so wait_sync sees them served.
            node.acknowledge(ikeys, iflags)
            ikeys, iflags = ikeys[:0], iflags[:0]
        owned = store.state[ikeys] == OWNER
        if owned.any():
            # This node owns these keys: its owner part decides now, without a message to
            # itself (bench/adaptive.py: most reports are about a node's own keys).
            mine, mine_flags = ikeys[owned], iflags[owned]
            self.comm.owner.own_intents(mine, mine_flags)
            node.acknowledge(mine, mine_flags)
            ikeys, iflags = ikeys[~owned], iflags[~owned]
        # A replica whose intent ended is dropped now; its last delta travels with the report.
        ending = ikeys[~iflags]
        drop = ending[store.state[ending] == REPLICA]
        dkeys, drows, dver = [], [], []
        if len(drop):
            dver.append(store.version[drop].copy())
            _, deltas = store.remove(drop, with_deltas=True)
            drows.append(deltas)
            dkeys.append(drop)
            self.replicas_removed(drop)
            self.counters["replica_drops"] += len(drop)
        held = self.replica_keys
        ckeys = cver = held[:0]
        if len(held):
            deltas, nonzero = store.take_deltas(held)
            versions = store.version[held].copy()
            if nonzero.any():
                dkeys.append(held[nonzero])
                drows.append(store.select_rows(deltas, held, nonzero))
                dver.append(versions[nonzero])
            ckeys, cver = held[~nonzero], versions[~nonzero]
        if dkeys:
            dkeys, drows, dver = (np.concatenate(x) for x in (dkeys, drows, dver))
        else:
            dkeys, drows, dver = held[:0], np.empty(0, dtype=np.float32), held[:0]
        if not (len(ikeys) or len(dkeys) or len(ckeys)):
            return []
        return self._grouped(ikeys, iflags, dkeys, drows, dver, ckeys, cver)

    def _grouped(self, ikeys, iflags, dkeys, drows, dver, ckeys, cver) -> list:
        """One SYNC request per destination (the owner we believe in).

        Entries are numbered over the sections in order (intents, deltas, checks); a request
        carries each entry's number as its position, and answers name those.
        """
        keys = np.concatenate((ikeys, dkeys, ckeys))
        ni, nd = len(ikeys), len(dkeys)
        flags = iflags.astype(np.int8)
        out = []
        on_answer = self._on_answer(keys, ni, iflags)
        for dst, positions in routing.group_by_node(self.comm.hint[keys]):
            # positions ascend (a stable sort); cut them into the three sections
            a, b = np.searchsorted(positions, (ni, ni + nd))
            p_i, p_d, p_c = positions[:a], positions[a:b], positions[b:]
            d_index, c_index = p_d - ni, p_c - ni - nd
            arrays = [ikeys[p_i], p_i, flags[p_i],
                      dkeys[d_index], p_d, self.store.select_rows(drows, dkeys, d_index),
                      dver[d_index],
                      ckeys[c_index], p_c, cver[c_index]]
            out.append((dst, arrays, len(positions), on_answer))
        return out

    # --- answers (communication thread) ------------------------------------------------------

    def _on_answer(self, keys: np.ndarray, num_intents: int, flags: np.ndarray):
        """Apply a (partial) SYNC_RESP: intent reports taken in; replicas' versions and values."""
        def apply(message: Message) -> None:
            positions, versions, refresh_positions, values = message.arrays
            store = self.store
            self.comm.learn_owner(keys[positions], message.src)
            reports = positions < num_intents
            if reports.any():
                reported = positions[reports]
                self.node.acknowledge(keys[reported], flags[reported])
                self.comm.notify_arrivals()
                synced, versions = positions[~reports], versions[~reports]
            else:
                synced = positions
            if len(refresh_positions):
                by_position = np.empty(len(keys), dtype=np.int64)
                by_position[synced] = versions
                store.refresh(keys[refresh_positions], values, by_position[refresh_positions])
            answered = keys[synced]
            still = store.state[answered] == REPLICA
            store.version[answered[still]] = versions[still]
            store.synced_at[answered[still]] = time.monotonic()
        return apply

    # --- queries -----------------------------------------------------------------------------

    def worker_intents_served(self, worker) -> bool:
        """Owners have taken in every active intent of the worker.

        An owner answers an intent report only after it sent the relocation or replica it
        decided on, over the same connection, so the keys have arrived by then. (Under
        ``relocation_only`` a key that several nodes want follows the latest of them, so it may
        have moved on again.)
        """
        for w, intents in self.workers:
            if w is worker:
                if intents.has_unacted_active(worker.clock):
                    return False
                return all(np.all(self.node.told[keys])
                           for keys in intents.active_batches(worker.clock))
        return True

    def stats(self) -> dict:
        done = max(self.rounds_done, 1)
        return {"rounds": self.rounds_done, "mean_round_ms": 1000.0 * self.round_time_total / done,
                **self.counters}
