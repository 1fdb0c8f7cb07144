"""The owner side of :class:`~.state.NodeState`: serve keyed requests, forward or queue the rest,
and carry out the policy's decisions (relocate, set up replicas).

Every keyed request (pull, push, set, and a sync round's intent reports, replica deltas and
version checks) carries the keys and their positions in the origin's request. A node

- serves the keys it owns and answers the origin directly (with those positions);
- forwards keys it does not own to the next hop (:meth:`~.routing.Router.next_hop`);
- holds keys that are in flight *to* it in a queue, and serves them when they arrive (requests
  wait where the key is going instead of bouncing).

Forward pointers always lead to a newer owner, so forwarding cannot loop; a hop limit turns any
bug into a loud error instead.
"""

from __future__ import annotations

import numpy as np

from .._store import NONE, OWNER, REPLICA
from .._wire.protocol import (
    CHECKS, DELTAS, HOME_UPDATES, INTENTS, NO_MOVES, RELOCATIONS, SETUPS, Kind, Message, subset,
)
from .routing import group_by_node
from .stream import Event

_NO_ROWS = np.empty(0, dtype=np.float32)
_I8, _F4, _U8 = np.dtype("<i8"), np.dtype("<f4"), np.dtype("<u8")
# What directory.decide returns, per group: a rank count, then the arrays of the entries.
_RELOCATION_DTYPES = (_I8, _I8, _F4, _I8, _U8, _U8, _I8, _I8)
_SETUP_DTYPES = (_I8, _I8, _F4, _I8)
_HOME_DTYPES = (_I8, _I8, _I8, _I8)


def _arrays(buffers: tuple, dtypes: tuple) -> list:
    return [np.frombuffer(b, dtype=t) for b, t in zip(buffers, dtypes)]
_NO_POS = np.empty(0, dtype=np.int64)


class Serving:
    """Mixin of NodeState (see there for the attributes)."""

    # --- entry -------------------------------------------------------------------------------

    def _keyed(self, msg: Message) -> None:
        """A keyed request: serve what is owned here, forward or queue the rest.

        Intent reports of a SYNC for keys that are elsewhere are not forwarded but answered
        with where to report them (the next hop): the origin reports them there with its next
        round, one message per owner, and not one forward per misrouted request
        (bench/adaptive.py, 4 nodes: ~12 forwarded SYNC messages per node and round, half of
        them forwarded again). Replica deltas and checks for keys that went to the origin
        itself (the delta crossed the relocation) go back inside the answer, which carries the
        relocation too. A key on its way here waits here; other deltas and checks are
        forwarded (a delta must reach the owner).
        """
        keys = msg.keys()
        owned = self.store.state[keys] == OWNER
        if owned.all():
            self._serve(msg)
            return
        rest_index = np.flatnonzero(~owned)
        nxt = self.router.next_hop(keys[rest_index])
        redirect = None
        if msg.kind == Kind.SYNC:
            ni, nd = len(msg.arrays[0]), len(msg.arrays[3])
            report = rest_index < ni
            elsewhere = report & (nxt >= 0)
            back = ~report & (nxt == msg.header["o"])
            if elsewhere.any() or back.any():
                positions = np.concatenate((msg.arrays[1], msg.arrays[4], msg.arrays[8]))
                back_index = rest_index[back]
                deltas = back_index[back_index < ni + nd] - ni
                redirect = (positions[rest_index[elsewhere]], nxt[elsewhere],
                            positions[back_index],
                            self.store.select_rows(msg.arrays[5], msg.arrays[3], deltas))
                keep = ~(elsewhere | back)
                rest_index, nxt = rest_index[keep], nxt[keep]
        if owned.any() or redirect is not None:
            self._serve(subset(msg, np.flatnonzero(owned), self.store), redirect)
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
            self._post(rest.header["o"], Kind.ERROR, rest.req_id,
                       msg=f"routing loop: keys {keys[rest_index][onward[:5]].tolist()} "
                           f"passed {hops} nodes (last rank {self.rank})")
            return
        for dst, positions in group_by_node(nxt[onward]):
            part = subset(rest, onward[positions], self.store)
            part.header["h"] = hops
            part.header["s"] = part.src = self.rank
            self.counters["forwarded_keys"] += len(positions)
            self._post_message(dst, part)

    def _retry_queued(self) -> None:
        """Keys arrived: serve (or pass on) what waited for them."""
        queued, self.queued = self.queued, []
        for msg in queued:
            self._keyed(msg)

    # --- serving owned keys ------------------------------------------------------------------

    def _serve(self, msg: Message, redirect=None) -> None:
        """Serve ``msg`` (all its keys are owned here); ``redirect``: (positions, ranks) of
        intent reports of the same SYNC to send back to the origin with the answer, and
        (positions, delta rows) of its deltas and checks that go back to the origin."""
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
            self._post(origin, Kind.ACK, msg.req_id, [positions])
        elif kind == Kind.SYNC:
            self._serve_sync(msg, origin, redirect)
        else:
            raise ValueError(f"not a keyed request: {kind.name}")

    def _serve_sync(self, msg: Message, origin: int, redirect=None) -> None:
        """A sync round's request: merge deltas, answer stale replicas, then decide on intents.

        Deltas first, so a dropped replica's last delta is in before the key can move. The
        answer is computed before the intents are acted on (a decision may move a key away),
        and posted after the relocations and replicas they cause: the origin receives those
        first, on the same connection.
        """
        store = self.store
        sections = msg.sections()
        redirected = (list(redirect) if redirect is not None
                      else [_NO_POS, _NO_POS, _NO_POS, _NO_ROWS])
        ikeys, ipos, iflags = sections[INTENTS]
        dkeys, dpos, drows, dver = sections[DELTAS]
        ckeys, cpos, cver = sections[CHECKS]
        if not len(dkeys) and not len(ckeys):  # intent reports only: the common case
            if len(ikeys):
                self._decide(ikeys, origin, iflags)
            self._post(origin, Kind.SYNC_RESP, msg.req_id,
                       [ipos, np.full(len(ipos), -1, dtype=np.int64), ipos[:0], _NO_ROWS,
                        *redirected, *NO_MOVES])
            return
        skeys = np.concatenate((dkeys, ckeys)) if len(ckeys) else dkeys
        spos = np.concatenate((dpos, cpos)) if len(ckeys) else dpos
        # Workers here may write between the reads below. A version we report must never be
        # newer than the value the holder ends up with (else the holder would think itself
        # current while it is not): report the version read *before* a value was taken.
        reported = store.version[skeys].copy()
        behind = np.concatenate((dver, cver)) != reported
        if len(dkeys):
            self._expect_none_missing(store.scatter_add(dkeys, drows, self._scratch(len(dkeys))))
            reported[:len(dkeys)] += 1  # the merge itself: holder's base + its delta = this version
        stale = skeys[behind]
        reported[behind] = store.version[stale]
        values = np.empty(store.floats_for(stale), dtype=np.float32)
        if len(stale):
            self._expect_none_missing(store.gather(stale, values, self._scratch(len(stale))))
        if len(ikeys):
            self._decide(ikeys, origin, iflags)
        self._post(origin, Kind.SYNC_RESP, msg.req_id,
                   [np.concatenate((ipos, spos)),
                    np.concatenate((np.full(len(ipos), -1, dtype=np.int64), reported)),
                    spos[behind], values, *redirected, *NO_MOVES])

    def _expect_none_missing(self, nmiss: int) -> None:
        if nmiss:
            # Only the engine removes keys, and it checked ownership just before.
            raise AssertionError(f"rank {self.rank}: {nmiss} owned keys vanished while serving")

    # --- carrying out the policy's decisions -------------------------------------------------

    def _decide(self, keys: np.ndarray, node: int, has_intent: np.ndarray) -> None:
        """Node ``node`` reports whether it has intent for ``keys`` (unique, owned here): the
        policy decides, and relocations, replica set-ups and home updates are carried out in
        one native pass (native/directory.c, ``dir_decide_*``); here they are only handed to
        the peers' held moves. Its reference in numpy: ``policy.on_intent`` and the pieces of
        tests/test_directory.py."""
        if self.directory is None or not len(keys):  # a variant without masks decides nothing
            return
        dropped, relocations, setups, homes = self.directory.decide(
            self.policy.variant, node, np.ascontiguousarray(keys, dtype=np.int64),
            np.ascontiguousarray(has_intent, dtype=bool).view(np.uint8))
        self.counters["replica_drops_at_owner"] += dropped
        if relocations is not None:
            self._relocated_out(*_arrays(relocations, _RELOCATION_DTYPES))
        if setups is not None:
            count, skeys, values, versions = _arrays(setups, _SETUP_DTYPES)
            for dst, a, b, fa, fb in self._runs(count, skeys):
                self._hold_move(dst, SETUPS, [skeys[a:b], values[fa:fb], versions[a:b]])
        if homes is not None:
            count, hkeys, owners, epochs = _arrays(homes, _HOME_DTYPES)
            for home, a, b, _, _ in self._runs(count, None):
                self._hold_move(home, HOME_UPDATES, [hkeys[a:b], owners[a:b], epochs[a:b]])

    def _relocated_out(self, count, keys, values, versions, intent, replicas, epochs,
                       slots) -> None:
        """Keys left (``directory.decide``), ordered by destination: their slots are free
        again, and each destination's part waits for a carrier to it."""
        store, words = self.store, self.policy.words
        store.removing(keys)
        store.release_slots(keys, slots)
        self.counters["relocations_out"] += len(keys)
        for dst, a, b, fa, fb in self._runs(count, keys):
            if self.sinks:
                self._emit(Event.DEALLOC, keys[a:b], dst)
            self._hold_move(dst, RELOCATIONS,
                            [keys[a:b], values[fa:fb], versions[a:b],
                             intent[a * words:b * words], replicas[a * words:b * words],
                             epochs[a:b]])

    def _runs(self, count: np.ndarray, keys):
        """(rank, first, end, first float, end float) of each rank's run of entries ordered by
        rank (``count[r]`` entries each); float bounds over the keys' packed values."""
        ranks = np.flatnonzero(count)
        ends = np.cumsum(count[ranks])
        if keys is None or self.store.uniform_length:
            length = self.store.uniform_length if keys is not None else 0
            return [(int(r), int(e - c), int(e), int(e - c) * length, int(e) * length)
                    for r, c, e in zip(ranks, count[ranks], ends)]
        float_ends = np.cumsum(self.store.lengths_of(keys))
        out = []
        for r, c, e in zip(ranks, count[ranks], ends):
            a, b = int(e - c), int(e)
            out.append((int(r), a, b, int(float_ends[a - 1]) if a else 0,
                        int(float_ends[b - 1]) if b else 0))
        return out

    def _relocate_in(self, src: int, keys, values, versions, intent, replicas, epochs) -> None:
        """Keys relocated here: a replica held here is promoted (its unsent updates are added to
        the value that came), others are inserted; masks, epochs, hints and the home table
        change in the same native pass (native/directory.c)."""
        store = self.store
        fresh = store.state[keys] != REPLICA
        slots = store.allocate_slots(keys[fresh])
        promoted = np.empty(len(keys), dtype=np.int8)
        try:
            self.directory.relocate_in(keys, values, versions, intent, replicas, epochs, slots,
                                       promoted)
        except ValueError:  # nothing changed (e.g. a key owned here already): slots go back
            store.release_slots(keys[fresh], slots)
            raise
        promoted = promoted.view(bool)
        if promoted.any():
            self._replicas_removed(keys[promoted])
        store.inserted(keys[fresh])
        self.counters["relocations_in"] += len(keys)
        if self.sinks:
            self._emit(Event.ALLOC, keys, src)
        self._arrived = True
        if self.queued:
            self._retry_queued()

    def _setup_in(self, src: int, keys, values, versions) -> None:
        """A replica from the owner: install it only if this node still wants the key."""
        store = self.store
        take = (store.state[keys] == NONE) & self.intents.wants(keys)
        if take.any():
            # synced_at first: workers may read the replica as soon as it is inserted, and a
            # read before this line would take the key's old synced_at as its refresh time
            # (bench/adaptive.py, replication_only: staleness of seconds in a 0.2 s run).
            store.synced_at[keys[take]] = self.now
            store.insert(keys[take], REPLICA, store.select_rows(values, keys, take),
                         versions[take])
            self._replicas_added(keys[take])
            if self.sinks:
                self._emit(Event.REPLICA_SETUP, keys[take], src)
            self.router.learn(keys, src, store.state[keys] == OWNER)
            self._arrived = True
        self.counters["replica_setups"] += int(take.sum())
        self.counters["replica_setups_discarded"] += int((~take).sum())

