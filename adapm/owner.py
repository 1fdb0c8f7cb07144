"""Serving keyed requests: what a node does for keys it owns, once owned, or is about to own.

Runs on the communication thread only, which is the only thread that changes the directory
(inserts and removes keys). Every keyed request (pull, push, set, and a sync round's intent
reports, replica deltas and version checks) carries the keys and their positions in the origin's
request. A node

- serves the keys it owns and answers the origin directly (with those positions);
- forwards keys it does not own to the next hop: where it sent the key (``forward[k]``), or, at
  the key's home, the owner the home was last told of;
- holds keys that are in flight *to* it in a queue, and serves them when they arrive (requests
  wait where the key is going instead of bouncing).

Following forward pointers always leads to a newer owner (a pointer is written when a node hands
the key on), so forwarding cannot loop; a hop limit turns any bug into a loud error instead.

Owner decisions come from :class:`~adapm.policy.OwnerPolicy`; this module executes them:
relocation (value, version, masks and an ownership epoch move; the home is told) and replica
set-ups (a copy of the value to each new holder).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from . import routing
from .policy import OwnerPolicy
from .protocol import CHECKS, DELTAS, INTENTS, Kind, Message, subset
from .store import NONE, OWNER, REPLICA

if TYPE_CHECKING:
    from .comm import Comm

_NO_ROWS = np.empty(0, dtype=np.float32)


class Owner:
    """Directory-changing side of a node: serve, forward, queue, relocate, replicate."""

    def __init__(self, comm: "Comm", management: str) -> None:
        self.comm = comm
        self.store = comm.store
        self.rank = comm.rank
        self.world_size = comm.world_size
        n = self.store.num_keys
        self.policy = OwnerPolicy(self.rank, self.world_size, n, management)
        self.forward = np.full(n, -1, dtype=np.int32)  # where this node last sent each key
        self.epoch = np.zeros(n, dtype=np.int64)  # ownership epoch, moves with the key
        # Home bookkeeping (meaningful for keys whose home is this node).
        self.owner_at_home = routing.home_of(np.arange(n, dtype=np.int64), self.world_size).astype(
            np.int32)
        self.home_epoch = np.zeros(n, dtype=np.int64)
        self.queued: list[Message] = []
        self.max_hops = 4 * self.world_size
        self.counters = {"relocations_in": 0, "relocations_out": 0, "replica_setups": 0,
                         "replica_setups_discarded": 0, "forwarded_keys": 0, "queued_keys": 0}

    # --- entry point -------------------------------------------------------------------------

    def handle(self, message: Message) -> None:
        """A keyed request: serve what is owned here, forward or queue the rest."""
        keys = message.keys()
        owned = self.store.state[keys] == OWNER
        if owned.all():
            self._serve(message)
            return
        if owned.any():
            self._serve(subset(message, np.flatnonzero(owned), self.store))
        rest_index = np.flatnonzero(~owned)
        rest = subset(message, rest_index, self.store)
        nxt = self.next_hop(keys[rest_index])
        here = np.flatnonzero(nxt < 0)
        if len(here):
            self.queued.append(subset(rest, here, self.store))
            self.counters["queued_keys"] += len(here)
        onward = np.flatnonzero(nxt >= 0)
        if not len(onward):
            return
        hops = rest.header.get("h", 0) + 1  # forwards so far, this one included
        if hops > self.max_hops:
            self.comm.reply(rest.header["o"], Kind.ERROR, rest.req_id,
                            msg=f"routing loop: keys {keys[rest_index][onward[:5]].tolist()} "
                                f"passed {hops} nodes (last rank {self.rank})")
            return
        for dst, positions in routing.group_by_node(nxt[onward]):
            part = subset(rest, onward[positions], self.store)
            part.header["h"] = hops
            part.header["s"] = part.src = self.rank
            self.counters["forwarded_keys"] += len(positions)
            self.comm.post_message(dst, part)

    def next_hop(self, keys: np.ndarray) -> np.ndarray:
        """Where to send requests for keys not owned here; -1: the key is on its way here."""
        nxt = self.forward[keys].astype(np.int64)
        at_home = routing.home_of(keys, self.world_size) == self.rank
        nxt = np.where(at_home, self.owner_at_home[keys], nxt)
        return np.where(nxt == self.rank, -1, nxt)

    def retry_queued(self) -> None:
        """Keys arrived: serve (or pass on) what waited for them."""
        queued, self.queued = self.queued, []
        for message in queued:
            self.handle(message)

    # --- serving owned keys ------------------------------------------------------------------

    def _serve(self, message: Message) -> None:
        kind, origin = message.kind, message.header["o"]
        keys, positions = message.arrays[0], message.arrays[1]
        store = self.store
        if kind == Kind.PULL:
            values = np.empty(store.floats_for(keys), dtype=np.float32)
            self._expect_none_missing(store.gather(keys, values, self.comm.scratch(len(keys))))
            self.comm.reply(origin, Kind.PULL_RESP, message.req_id, [positions, values])
        elif kind in (Kind.PUSH, Kind.SET):
            values = message.arrays[2]
            scratch = self.comm.scratch(len(keys))
            nmiss = (store.scatter_add if kind == Kind.PUSH else store.scatter_set)(
                keys, values, scratch)
            self._expect_none_missing(nmiss)
            self.comm.reply(origin, Kind.ACK, message.req_id, [positions])
        elif kind == Kind.SYNC:
            self._serve_sync(message, origin)
        else:
            raise ValueError(f"not a keyed request: {kind.name}")

    def _serve_sync(self, message: Message, origin: int) -> None:
        """A sync round's request: merge deltas, answer stale replicas, then decide on intents.

        Deltas first, so a dropped replica's last delta is in before the key can move. The
        answer is computed before the intents are acted on (a decision may move a key away),
        and posted after the relocations and replicas they cause: the origin receives those
        first, on the same connection.
        """
        store = self.store
        sections = message.sections()
        ikeys, ipos, iflags = sections[INTENTS]
        dkeys, dpos, drows, dver = sections[DELTAS]
        ckeys, cpos, cver = sections[CHECKS]
        if not len(dkeys) and not len(ckeys):  # intent reports only: the common case
            if len(ikeys):
                self.execute(self.policy.on_intent(ikeys, origin, iflags.astype(bool)))
            self.comm.reply(origin, Kind.SYNC_RESP, message.req_id,
                            [ipos, np.full(len(ipos), -1, dtype=np.int64), ipos[:0], _NO_ROWS])
            return
        skeys = np.concatenate((dkeys, ckeys)) if len(ckeys) else dkeys
        spos = np.concatenate((dpos, cpos)) if len(ckeys) else dpos
        # Workers here may write between the reads below. A version we report must never be
        # newer than the value the holder ends up with (else the holder would think itself
        # current while it is not): report the version read *before* a value was taken.
        reported = store.version[skeys].copy()
        behind = np.concatenate((dver, cver)) != reported
        if len(dkeys):
            self._expect_none_missing(store.scatter_add(dkeys, drows,
                                                        self.comm.scratch(len(dkeys))))
            reported[:len(dkeys)] += 1  # the merge itself: holder's base + its delta = this version
        stale = skeys[behind]
        reported[behind] = store.version[stale]
        values = np.empty(store.floats_for(stale), dtype=np.float32)
        if len(stale):
            self._expect_none_missing(store.gather(stale, values, self.comm.scratch(len(stale))))
        if len(ikeys):
            self.execute(self.policy.on_intent(ikeys, origin, iflags.astype(bool)))
        self.comm.reply(origin, Kind.SYNC_RESP, message.req_id,
                        [np.concatenate((ipos, spos)),
                         np.concatenate((np.full(len(ipos), -1, dtype=np.int64), reported)),
                         spos[behind], values])

    def own_intents(self, keys: np.ndarray, has_intent: np.ndarray) -> None:
        """This node's own intent changed for ``keys``, which it owns: decide and act now."""
        self.execute(self.policy.on_intent(keys, self.rank, has_intent))

    def _expect_none_missing(self, nmiss: int) -> None:
        if nmiss:
            # Only this thread removes keys, and it checked ownership just before.
            raise AssertionError(f"rank {self.rank}: {nmiss} owned keys vanished while serving")

    # --- executing owner decisions -----------------------------------------------------------

    def execute(self, actions) -> None:
        for dst, keys in actions.relocate:
            self.relocate_out(dst, keys)
        for dst, keys in actions.setup:
            self.send_setup(dst, keys)
        self.comm.counters["replica_drops_at_owner"] += actions.dropped

    def relocate_out(self, dst: int, keys: np.ndarray) -> None:
        store = self.store
        values, _ = store.remove(keys)
        versions = store.version[keys].copy()  # after removal: no write can follow here
        intent, replicas = self.policy.take(keys)
        epochs = self.epoch[keys] + 1
        self.forward[keys] = dst
        self.comm.hint[keys] = dst
        self.counters["relocations_out"] += len(keys)
        self.comm.post(dst, Kind.RELOCATE, 0, [keys, values, versions, intent, replicas, epochs])
        # The new owner updates the homes it is itself (relocate_in); tell the others.
        elsewhere = routing.home_of(keys, self.world_size) != dst
        self._tell_homes(keys[elsewhere], np.full(int(elsewhere.sum()), dst, dtype=np.int64),
                         epochs[elsewhere])

    def _tell_homes(self, keys: np.ndarray, owners: np.ndarray, epochs: np.ndarray) -> None:
        for home, positions in routing.group_by_node(routing.home_of(keys, self.world_size)):
            if home == self.rank:
                self.update_home(keys[positions], owners[positions], epochs[positions])
            else:
                self.comm.post(home, Kind.OWNER_UPDATE, 0,
                               [keys[positions], owners[positions], epochs[positions]])

    def update_home(self, keys: np.ndarray, owners: np.ndarray, epochs: np.ndarray) -> None:
        """Home bookkeeping: keep the owner with the newest epoch (updates may cross)."""
        newer = epochs > self.home_epoch[keys]
        self.owner_at_home[keys[newer]] = owners[newer]
        self.home_epoch[keys[newer]] = epochs[newer]

    def relocate_in(self, message: Message) -> None:
        keys, values, versions, intent, replicas, epochs = message.arrays
        store = self.store
        state = store.state[keys]
        if np.any(state == OWNER):
            raise AssertionError(f"rank {self.rank}: received keys it already owns")
        held = state == REPLICA
        if held.any():
            # Our replica's unsent updates are not in the value we got: promote adds them.
            store.promote(keys[held], store.select_rows(values, keys, held), versions[held])
        if (~held).any():
            store.insert(keys[~held], OWNER, store.select_rows(values, keys, ~held), versions[~held])
        self.comm.sync.replicas_removed(keys[held])
        self.policy.install(keys, intent, replicas)
        self.epoch[keys] = epochs
        self.comm.hint[keys] = self.rank
        at_home = routing.home_of(keys, self.world_size) == self.rank
        if at_home.any():
            self.update_home(keys[at_home], np.full(int(at_home.sum()), self.rank), epochs[at_home])
        self.counters["relocations_in"] += len(keys)
        self.comm.notify_arrivals()
        if self.queued:
            self.retry_queued()

    def send_setup(self, dst: int, keys: np.ndarray) -> None:
        versions = self.store.version[keys].copy()  # before the value: never newer than it
        values = np.empty(self.store.floats_for(keys), dtype=np.float32)
        self._expect_none_missing(self.store.gather(keys, values, self.comm.scratch(len(keys))))
        self.comm.post(dst, Kind.SETUP, 0, [keys, values, versions])

    def setup_in(self, message: Message) -> None:
        """A replica from the owner: install it only if this node still wants the key."""
        keys, values, versions = message.arrays
        take = (self.store.state[keys] == NONE) & self.comm.sync.node.wants(keys)
        if take.any():
            # synced_at first: workers may read the replica as soon as it is inserted, and a
            # read before this line took the key's old synced_at (0 for a first replica) as
            # its refresh time, adding hours of "staleness" (bench/adaptive.py,
            # replication_only: mean_staleness_ms of seconds in a 0.2 s run).
            self.store.synced_at[keys[take]] = time.monotonic()
            self.store.insert(keys[take], REPLICA, self.store.select_rows(values, keys, take),
                              versions[take])
            self.comm.sync.replicas_added(keys[take])
            self.comm.learn_owner(keys, message.src)
            self.comm.notify_arrivals()
        self.counters["replica_setups"] += int(take.sum())
        self.counters["replica_setups_discarded"] += int((~take).sum())
