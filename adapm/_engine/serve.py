"""The owner side of :class:`~.state.NodeState`: serve keyed requests, forward or queue the rest,
and carry out the policy's decisions (relocate, set up replicas).

Every keyed request (pull, push, set, and a sync round's intent reports, replica deltas and
version checks) carries the keys and their positions in the origin's request. A node

- serves the keys it owns and answers the origin directly (with those positions);
- forwards keys it does not own to the next hop (``Directory.next_hop``);
- holds keys that are in flight *to* it in a queue, and serves them when they arrive (requests
  wait where the key is going instead of bouncing).

Forward pointers always lead to a newer owner, so forwarding cannot loop; a hop limit turns any
bug into a loud error instead.
"""

from __future__ import annotations

import numpy as np

from .._store import OWNER
from .._wire.protocol import NO_MOVES, Kind, Message, subset
from . import native
from .routing import group_by_node
from .stream import Event



class Serving:
    """Mixin of NodeState (see there for the attributes)."""

    # --- entry -------------------------------------------------------------------------------

    def _keyed(self, msg: Message) -> None:
        """A keyed request: serve what is owned here, forward or queue the rest."""
        if msg.kind == Kind.SYNC:
            self._sync(msg)
            return
        keys = msg.keys()
        owned = self.store.states(keys) == OWNER
        if owned.all():
            self._serve(msg)
            return
        rest_index = np.flatnonzero(~owned)
        if len(rest_index) < len(keys):
            self._serve(subset(msg, np.flatnonzero(owned), self.store))
        self._pass_on(msg, rest_index, np.frombuffer(
            self.directory.next_hop(keys[rest_index]), dtype=np.int64))

    def _sync(self, msg: Message) -> None:
        """A sync round's request, served in one native pass (``Directory.serve_sync``, its
        reference in numpy is in tests/test_directory.py): deltas merged first (a dropped
        replica's last delta is in before its key can move), replicas answered with the version
        and, where behind, the value, then intent reports decided on; the answer is posted
        after the moves the decision causes, so the origin receives those first.

        Entries for keys not owned here: an intent report is answered with where to report it
        (the next hop): the origin reports it there with its next round, one message per owner,
        not one forward per misrouted report (bench/adaptive.py, 4 nodes: ~12 forwarded SYNC
        messages per node and round, half of them forwarded again). A delta or check for a key
        that went to the origin itself (it crossed the relocation) goes back in the answer,
        which carries the relocation too. A key on its way here waits here; other deltas and
        checks are forwarded (a delta must reach the owner).
        """
        answer, decision, rest_index, rest_hop = self.directory.serve_sync(
            self.variant, msg.header["o"], *msg.arrays[:10])
        if decision is not None:
            self._decided(decision)
        if answer is not None:
            arrays = answer
            if len(arrays[5]):  # redirects to this node: reports deferred (keys pinned here)
                self.counters["deferred_reports"] += int(np.count_nonzero(arrays[5] == self.rank))
            self._post(msg.header["o"], Kind.SYNC_RESP, msg.req_id, [*arrays, *NO_MOVES])
        if rest_index is not None:
            self._pass_on(msg, np.frombuffer(rest_index, dtype=native.KEYS),
                          np.frombuffer(rest_hop, dtype=native.KEYS))

    def _pass_on(self, msg: Message, rest_index: np.ndarray, nxt: np.ndarray) -> None:
        """The entries at ``rest_index`` of a keyed request are not owned here: wait here for
        those on their way here (``nxt`` -1), forward the others to ``nxt``."""
        if not len(rest_index):
            return
        rest = subset(msg, rest_index, self.store)
        here = np.flatnonzero(nxt < 0)
        if len(here):
            self.queued.append(subset(rest, here, self.store))
            self.counters["queued_keys"] += len(here)
        onward = np.flatnonzero(nxt >= 0)
        if not len(onward):
            return
        hops = rest.header.get("h", 0) + 1  # forwards so far, this one included
        if hops > self.max_hops:
            keys = rest.keys()
            self._post(rest.header["o"], Kind.ERROR, rest.req_id,
                       msg=f"routing loop: keys {keys[onward[:5]].tolist()} "
                           f"passed {hops} nodes (last rank {self.rank})")
            return
        ranks, counts = [], []
        for dst, positions in group_by_node(nxt[onward]):
            part = subset(rest, onward[positions], self.store)
            part.header["h"] = hops
            part.header["s"] = part.src = self.rank
            self.counters["forwarded_keys"] += len(positions)
            self._post_message(dst, part)
            ranks.append(dst)
            counts.append(len(positions))
        # The origin learns whom it waits for now (a timeout names that rank, not this one).
        self._post(rest.header["o"], Kind.FORWARDED, rest.req_id,
                   [np.array(ranks, dtype=np.int64), np.array(counts, dtype=np.int64)])

    def _native_served(self, counters: dict, arrived: bool, relocated_in: bool,
                       answered: tuple) -> None:
        """What the SYNCs the transport served, and the answers it took in, without Python
        (native/sync_fast.h, native/answer_fast.c) leave for this object: the counters; where
        keys arrived, the requests that wait for them go on (as :meth:`_take_moves` would);
        then the round requests answered (``answered``: Rounds._answers_taken). (The local
        sampler's pool followed the store in C.)"""
        mine = self.counters
        for name, value in counters.items():
            mine[name] += value
        if relocated_in and self.queued:
            self._retry_queued()
        if arrived:
            self._arrived = True
        if len(answered[0]) or answered[1] or answered[2] or answered[3]:
            self._answers_taken(*answered)

    def _retry_queued(self) -> None:
        """Keys arrived: serve (or pass on) what waited for them."""
        queued, self.queued = self.queued, []
        for msg in queued:
            self._keyed(msg)

    # --- serving owned keys ------------------------------------------------------------------

    def _serve(self, msg: Message) -> None:
        """Serve a pull, push or set all of whose keys are owned here."""
        kind, origin = msg.kind, msg.header["o"]
        keys, positions = msg.arrays[0], msg.arrays[1]
        store = self.store
        if kind == Kind.PULL:
            values = np.empty(store.floats_for(keys), dtype=np.float32)
            self._expect_none_missing(store.gather(keys, values, self._scratch(len(keys))))
            self._post(origin, Kind.PULL_RESP, msg.req_id, [positions, values])
        elif kind in (Kind.PUSH, Kind.SET):
            values = msg.arrays[2]
            scatter = store.scatter_add if kind == Kind.PUSH else store.scatter_set
            self._expect_none_missing(scatter(keys, values, self._scratch(len(keys))))
            if origin == self.rank:  # counted as remote by its worker, applied here
                self._own_updates_here[kind == Kind.SET] += len(keys)
            self._post(origin, Kind.ACK, msg.req_id, [positions])
        else:
            raise ValueError(f"not a keyed request: {kind.name}")

    def _expect_none_missing(self, nmiss: int) -> None:
        if nmiss:
            # Only the engine removes keys, and it checked ownership just before.
            raise AssertionError(f"rank {self.rank}: {nmiss} owned keys vanished while serving")

    # --- carrying out the policy's decisions -------------------------------------------------

    def _decided(self, decision: tuple) -> None:
        """What a native decision (``serve_sync``, ``round_build``, ``redirected``; each runs
        native/directory.c's ``dir_decide_*``, whose numpy reference is in
        tests/engine_reference.py) did: its moves are held for the peers in the directory
        already (``take_moves``); here the keys that left are counted (and reported to the
        event stream)."""
        dropped, relocated, per_rank = decision
        self.counters["replica_drops_at_owner"] += dropped
        if relocated is None:
            return
        keys = np.frombuffer(relocated, dtype=native.KEYS)
        self.counters["relocations_out"] += len(keys)
        if self.sinks:
            count = np.frombuffer(per_rank, dtype=native.KEYS)
            ends = np.cumsum(count)
            for dst in np.flatnonzero(count):
                self._emit(Event.DEALLOC, keys[ends[dst] - count[dst]:ends[dst]], int(dst))

    def _take_moves(self, src: int, moves) -> None:
        """A carrier's moves from ``src`` (its 12 move arrays), in one native pass
        (``Directory.moves_in``): keys relocated here (a replica held here is promoted: its
        unsent updates are added to the value that came; others are inserted; masks, epochs,
        hints and the home table change in the same pass), replicas from their owner that
        this node still wants, and home updates."""
        counts = self.intents.native if self.intents is not None else None
        got = self.directory.moves_in(src, moves, counts, self.now)
        if got is None:
            return
        relocated, taken, discarded = got
        taken = np.frombuffer(taken, dtype=native.KEYS)
        counters = self.counters
        counters["relocations_in"] += len(relocated)
        counters["replica_setups"] += len(taken)
        counters["replica_setups_discarded"] += discarded
        if self.sinks:
            if len(relocated):
                self._emit(Event.ALLOC, relocated, src)
            if len(taken):
                self._emit(Event.REPLICA_SETUP, taken, src)
        if len(relocated) or len(taken):
            self._arrived = True
        if len(relocated) and self.queued:
            self._retry_queued()
