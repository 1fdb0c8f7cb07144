"""The owner's decisions and relocations in native code (native/directory.c) against their
reference in numpy.

The engine decides on intent reports and carries the decision out in one native pass
(``Directory.decide``: relocations out, replica set-ups, home updates), and takes relocations
in with another (``Directory.moves_in``). The reference is what the Python pieces say:
``DensePolicy.on_intent``, ``Store.remove`` / ``insert`` / ``promote`` / ``gather``,
``Router.moved_out`` / ``moved_in`` / ``update_home`` and the policy's ``take`` / ``install``
(tests/engine_reference.py).
Random sequences of intent reports, relocations in, replica set-ups and pushes run on both, and
afterwards every array agrees: the store's directory and values (replicas' unsent updates
included), the routing state, the home table and the masks, and every move sent to each peer.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import adapm
from adapm._engine.events import Received
from adapm._engine.intents import NodeIntents, WorkerIntents
from adapm._engine.timing import ImmediateTimer
from adapm._engine.routing import group_by_node, home_keys, home_of
from adapm._engine.state import NodeState
from adapm._store import NONE, OWNER, REPLICA, Store
from adapm._wire.protocol import (
    DELTA_LAST, DTYPES, HOME_UPDATES, MOVE_SECTIONS, NO_MOVES, RELOCATIONS, SETUPS, Kind, Message,
    decode, message,
)

from engine_reference import DensePolicy, Router, mask_words

NUM_KEYS = 12


def _moves(relocations=(), setups=()) -> list:
    """A carrier's 12 move arrays with these sections, the others empty."""
    out = list(NO_MOVES)
    if relocations:
        out[0:6] = relocations
    if setups:
        out[6:9] = setups
    return out


def _merged(held: list) -> list:
    """The flat move arrays of one peer's moves, held per section as a list of array lists:
    each section's parts concatenated (as the engine sends them)."""
    out = []
    for section, parts in zip(MOVE_SECTIONS, held):
        if not parts:
            out.extend(np.empty(0, dtype=DTYPES[role]) for role in section)
        else:
            out.extend(np.concatenate(column) for column in zip(*parts))
    return out


def _decide(node: NodeState, keys, reporter: int, flags) -> int:
    """Node ``reporter`` reports ``flags`` (intent or not) for ``keys`` (owned here), as a SYNC
    is decided on: the replicas the decision dropped at the owner (no variant without masks
    decides anything)."""
    if node.variant < 0 or not len(keys):
        return 0
    dropped, _, _ = node.directory.decide(
        node.variant, reporter, np.ascontiguousarray(keys, dtype=np.int64),
        np.ascontiguousarray(flags, dtype=bool).view(np.uint8))
    return dropped


def _config(world_size: int, rank: int, lengths, management="adaptive") -> adapm.Config:
    return adapm.Config(num_keys=NUM_KEYS, value_length=lengths, world_size=world_size,
                        rank=rank, rendezvous="127.0.0.1:1", management=management)


class Reference:
    """The numpy pieces the native pass replaces, on a store of their own."""

    def __init__(self, config) -> None:
        self.rank, self.world_size = config.rank, config.world_size
        self.store = Store(config)
        self.store.insert(home_keys(self.rank, NUM_KEYS, self.world_size), OWNER)
        self.router = Router(self.rank, self.world_size, NUM_KEYS)
        self.policy = DensePolicy(config.management, self.rank, self.world_size, NUM_KEYS)

    def decide(self, keys, node, flags) -> tuple:
        """(replicas dropped, {peer: flat move arrays}) of node's reports for owned keys."""
        actions = self.policy.on_intent(keys, node, flags)
        moves: dict = {}

        def hold(peer, section, arrays):
            moves.setdefault(peer, [[], [], []])[section].append(arrays)

        for dst, ks in actions.relocate:
            sent = self.relocate_out(ks, dst)
            hold(dst, RELOCATIONS, sent)
            homes = home_of(ks, self.world_size)
            for home in np.unique(homes[(homes != dst) & (homes != self.rank)]):
                at = homes == home
                hold(int(home), HOME_UPDATES,
                     [ks[at], np.full(int(at.sum()), dst, dtype=np.int64), sent[5][at]])
        for dst, ks in actions.setup:
            versions = self.store.versions(ks)
            values = np.empty(self.store.floats_for(ks), dtype=np.float32)
            assert self.store.gather(ks, values, np.empty(len(ks), dtype=np.int64)) == 0
            hold(dst, SETUPS, [ks, values, versions])
        return actions.dropped, {peer: _merged(held) for peer, held in moves.items()}

    def setup_in(self, src, keys, values, versions, wants, now) -> np.ndarray:
        """Replicas from an owner, installed as the engine did in numpy; returns those taken."""
        store = self.store
        take = (store.states(keys) == NONE) & wants[keys]
        if take.any():
            store.insert(keys[take], REPLICA, store.select_rows(values, keys, take),
                         versions[take], synced_at=now)
            self.router.learn(keys, src, store.states(keys) == OWNER)
        return keys[take]

    def apply_answer(self, keys, flags, ni, src, pos, versions, refresh, values, told,
                     now) -> int:
        """A SYNC_RESP's answers for a round's entries, taken in as the engine did in numpy."""
        store = self.store
        answered = keys[pos]
        self.router.learn(answered, src, store.states(answered) == OWNER)
        reports = pos < ni
        told[keys[pos[reports]]] = flags[pos[reports]]
        synced, synced_versions = pos[~reports], versions[~reports]
        by_position = np.empty(len(keys), dtype=np.int64)
        by_position[synced] = synced_versions
        store.refresh(keys[refresh], values, by_position[refresh])
        answered = keys[synced]
        still = store.states(answered) == REPLICA
        store.set_synced(answered[still], synced_versions[still], now)
        return int(reports.sum())

    def round_requests(self, ikeys, iflags, held) -> tuple:
        """A round's SYNC requests, as the engine built them in numpy: (dropped keys,
        {owner: the 10 section arrays}, all entries' keys)."""
        store = self.store
        ending = ikeys[~iflags]
        drop = ending[store.states(ending) == REPLICA]
        dver = store.versions(drop) | DELTA_LAST  # no value is to come back for these
        _, drows = store.remove(drop, with_deltas=True)
        held = held[store.states(held) == REPLICA]
        deltas, nonzero = store.take_deltas(held)
        versions = store.versions(held)
        dkeys = np.concatenate((drop, held[nonzero]))
        drows = np.concatenate((drows, deltas))
        dver = np.concatenate((dver, versions[nonzero]))
        ckeys, cver = held[~nonzero], versions[~nonzero]
        keys = np.concatenate((ikeys, dkeys, ckeys))
        ni, nd = len(ikeys), len(dkeys)
        flags = iflags.astype(np.int8)
        out = {}
        for dst, positions in group_by_node(self.router.hint[keys]):
            a, b = np.searchsorted(positions, (ni, ni + nd))
            p_i, p_d, p_c = positions[:a], positions[a:b], positions[b:]
            d_index, c_index = p_d - ni, p_c - ni - nd
            out[dst] = [ikeys[p_i], p_i, flags[p_i], dkeys[d_index], p_d,
                        store.select_rows(drows, dkeys, d_index), dver[d_index],
                        ckeys[c_index], p_c, cver[c_index]]
        return drop, out, keys

    def serve_sync(self, origin, ikeys, ipos, iflags, dkeys, dpos, drows, dver, ckeys, cpos,
                   cver) -> tuple:
        """A SYNC from ``origin``, served as the engine did in numpy: (the answer's 8 keyed
        arrays or None, replicas dropped, {peer: moves}, entries queued here, {peer: entries
        forwarded}); entries are numbered over the sections."""
        store = self.store
        keys = np.concatenate((ikeys, dkeys, ckeys))
        ni, nd = len(ikeys), len(dkeys)
        owned = store.states(keys) == OWNER
        rest = np.flatnonzero(~owned)
        nxt = self.router.next_hop(keys[rest])
        report = rest < ni
        elsewhere, back = report & (nxt >= 0), ~report & (nxt == origin)
        positions = np.concatenate((ipos, dpos, cpos))
        back_index = rest[back]
        back_deltas = back_index[back_index < ni + nd] - ni
        redirected = [positions[rest[elsewhere]], nxt[elsewhere], positions[back_index],
                      store.select_rows(drows, dkeys, back_deltas)]
        keep = ~(elsewhere | back)
        rest, nxt = rest[keep], nxt[keep]
        queued = rest[nxt < 0].tolist()
        forwarded = {int(dst): rest[nxt == dst].tolist() for dst in np.unique(nxt[nxt >= 0])}
        oi, od = np.flatnonzero(owned[:ni]), np.flatnonzero(owned[ni:ni + nd])
        oc = np.flatnonzero(owned[ni + nd:])
        ikeys, ipos, iflags = ikeys[oi], ipos[oi], iflags[oi]
        drows = store.select_rows(drows, dkeys, od)
        dkeys, dpos, dver = dkeys[od], dpos[od], dver[od]
        ckeys, cpos, cver = ckeys[oc], cpos[oc], cver[oc]
        skeys, spos = np.concatenate((dkeys, ckeys)), np.concatenate((dpos, cpos))
        reported = store.versions(skeys)
        last = (dver >= 0) & ((dver & DELTA_LAST) != 0)  # a dropped replica's: no value back
        base = np.concatenate((np.where(last, dver & ~DELTA_LAST, dver), cver))
        behind = (base != reported) & ~np.concatenate((last, np.zeros(len(cver), bool)))
        store.scatter_add(dkeys, drows, np.empty(len(dkeys), dtype=np.int64))
        reported[:len(dkeys)] = (reported[:len(dkeys)] + 1) & 0x7FFFFFFF  # versions mod 2^31
        stale = skeys[behind]
        reported[behind] = store.versions(stale)
        values = np.empty(store.floats_for(stale), dtype=np.float32)
        assert store.gather(stale, values, np.empty(len(stale), dtype=np.int64)) == 0
        dropped, moves = self.decide(ikeys, origin, iflags) if len(ikeys) else (0, {})
        answer = None
        if owned.any() or len(redirected[0]) or len(redirected[2]):
            answer = [np.concatenate((ipos, spos)),
                      np.concatenate((np.full(len(ipos), -1, dtype=np.int64), reported)),
                      spos[behind], values, *redirected]
        return answer, dropped, moves, queued, forwarded

    def relocate_out(self, keys, dst):
        versions = self.store.versions(keys)
        values, _ = self.store.remove(keys)
        s, r = self.policy.take(keys)
        epochs = self.router.moved_out(keys, dst)
        # The old owner tells the homes; being one itself, it updates its own table.
        mine = home_of(keys, self.world_size) == self.rank
        self.router.update_home(keys[mine], np.full(int(mine.sum()), dst), epochs[mine])
        return [keys, values, versions, s, r, epochs]

    def relocate_in(self, keys, values, versions, s, r, epochs):
        store = self.store
        held = store.states(keys) == REPLICA
        if held.any():
            store.promote(keys[held], store.select_rows(values, keys, held), versions[held])
        if (~held).any():
            store.insert(keys[~held], OWNER, store.select_rows(values, keys, ~held),
                         versions[~held])
        self.policy.install(keys, s, r)
        self.router.moved_in(keys, epochs)


def _values(store) -> tuple:
    """Every held key's value and a replica's unsent delta, by key (slots may differ between
    stores; an owner's delta row is not used)."""
    held = store.local_keys()
    out = np.empty(store.floats_for(held), dtype=np.float32)
    store.gather(held, out, np.empty(len(held), dtype=np.int64))
    deltas = [store.delta[s:s + n].tolist() if state == REPLICA else None
              for s, n, state in zip(store.slots(held), store.lengths_of(held),
                                     store.states(held))]
    return held.tolist(), out.tolist(), deltas


def dense(node: NodeState) -> dict:
    """The node's native directory as dense arrays, named as the reference names them."""
    return node.directory_view()


def _agree(node: NodeState, ref: Reference) -> None:
    a, b = node.store, ref.store
    got, want = a.snapshot(), b.snapshot()
    for name in ("state", "version", "synced_at"):
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # Map entries only for the keys held here beyond the home keys' owner copies.
    home = np.arange(NUM_KEYS) % ref.world_size == ref.rank
    assert a.memory()[0] == int(((got["state"] != NONE) & ~(home & (got["state"] == OWNER))).sum())
    assert _values(a) == _values(b)
    got = dense(node)
    for name in ("hint", "forward", "epoch", "home_owner", "home_epoch"):
        np.testing.assert_array_equal(got[name], getattr(ref.router, name), err_msg=name)
    np.testing.assert_array_equal(got["intent"], ref.policy.intent.reshape(-1))
    np.testing.assert_array_equal(got["replicas"], ref.policy.replicas.reshape(-1))
    # Records only for keys whose state is not the default of a key nobody touched.
    records, _ = node.directory.memory()
    words = ref.policy.words
    active = ((ref.router.hint != np.arange(NUM_KEYS) % ref.world_size)
              | (ref.router.forward != -1) | (ref.router.epoch != 0)
              | ref.policy.intent.reshape(NUM_KEYS, words).any(axis=1)
              | ref.policy.replicas.reshape(NUM_KEYS, words).any(axis=1))
    homed = home_keys(ref.rank, NUM_KEYS, ref.world_size)
    active[homed[ref.router.home_epoch != 0]] = True
    assert records == int(active.sum())


def _masks(rng, n: int, world_size: int) -> np.ndarray:
    """Random masks over the ranks of the world (n keys, flat)."""
    words = (world_size + 63) // 64
    bits = rng.integers(0, 2**63, (n, words), dtype=np.uint64)
    if world_size % 64:
        bits[:, -1] &= np.uint64((1 << (world_size % 64)) - 1)
    return bits.reshape(-1)


@st.composite
def cases(draw):
    world_size = draw(st.sampled_from([2, 3, 5, 70]))
    rank = draw(st.integers(0, world_size - 1))
    management = draw(st.sampled_from(["adaptive", "replication_only", "relocation_only"]))
    lengths = draw(st.one_of(st.integers(1, 3),
                             st.lists(st.integers(1, 3), min_size=NUM_KEYS, max_size=NUM_KEYS)))
    ops = draw(st.lists(st.tuples(st.sampled_from(["decide", "sync", "sync", "round", "round",
                                                   "answer", "answer", "masks", "in", "replica",
                                                   "setup", "push", "away"]),
                                  st.integers(0, 2**32 - 1)), max_size=25))
    return world_size, rank, management, lengths, ops


@given(cases())
@settings(max_examples=200, deadline=None)
# A push of zeros to a replica: its delta is still all zeros, so the round sends a version
# check, not a delta (the replica's dirty bit alone is not an update).
@example(case=(2, 0, "adaptive", 1, [("replica", 0), ("push", 0), ("round", 3)]))
@example(case=(2, 0, "adaptive", 1, [("replica", 0), ("push", 0), ("round", 0)]))
# An answer that refreshes a replica set up by an earlier step, at the seed's time: with a time
# of 0 (no engine's clock) the native refresh kept the older sync time, the reference did not.
@example(case=(2, 0, "adaptive", 1, [("setup", 1), ("answer", 0)]))
def test_native_decisions_and_relocations_match_the_reference(case):
    world_size, rank, management, lengths, ops = case
    config = _config(world_size, rank, np.array(lengths) if isinstance(lengths, list) else lengths,
                     management)
    store = Store(config)
    store.insert(home_keys(rank, NUM_KEYS, world_size), OWNER)
    node = NodeState(rank, world_size, store, config)
    ref = Reference(config)
    others = [r for r in range(world_size) if r != rank]
    for what, seed in ops:
        rng = np.random.default_rng(seed)
        state = store.snapshot()["state"]
        if what == "decide":  # a node's reports for some owned keys
            owned = np.flatnonzero(state == OWNER)
            if not len(owned):
                continue
            keys = rng.choice(owned, rng.integers(1, len(owned) + 1), replace=False)
            reporter = int(rng.integers(0, world_size))
            flags = rng.integers(0, 2, len(keys)).astype(bool)
            got = _decide(node, keys, reporter, flags)
            dropped, expected = ref.decide(keys, reporter, flags)
            assert got == dropped
            _same_moves(node.held_moves(), expected)
        elif what == "sync":  # a SYNC from some node, about any keys
            _check_sync(node, ref, rng, world_size)
        elif what == "round":  # this node's round: reports for keys owned elsewhere, replicas
            _check_round(node, ref, rng)
        elif what == "answer":  # a SYNC_RESP to a round of this node
            _check_answer(node, ref, rng, world_size, seed)
        elif what == "away":  # keys homed here that moved on: the home table names a peer
            homed = home_keys(rank, NUM_KEYS, world_size)
            gone = homed[state[homed] != OWNER]
            if len(gone):
                owners = rng.choice(others, len(gone)).astype(np.int64)
                epochs = np.full(len(gone), 10**6, dtype=np.int64)
                node.directory.update_home(gone, owners, epochs)
                ref.router.update_home(gone, owners, epochs)
        elif what == "masks":  # owned keys with other nodes' intents and replicas
            owned = np.flatnonzero(state == OWNER)
            if not len(owned):
                continue
            keys = rng.choice(owned, rng.integers(1, len(owned) + 1), replace=False)
            words = mask_words(world_size)
            s = _masks(rng, len(keys), world_size).reshape(len(keys), words)
            alone = rng.random(len(keys)) < 0.5  # S = {one rank}: adaptive relocates there
            s[alone] = 0
            for i in np.flatnonzero(alone):
                one = int(rng.integers(0, world_size))
                s[i, one // 64] = np.uint64(1 << (one % 64))
            r = s & _masks(rng, len(keys), world_size).reshape(len(keys), words)
            r[:, rank // 64] &= ~np.uint64(1 << (rank % 64))
            node.directory.set_masks(keys.astype(np.int64), s.reshape(-1), r.reshape(-1))
            ref.policy.intent[keys], ref.policy.replicas[keys] = s, r
        elif what == "in":
            candidates = np.flatnonzero(state != OWNER)
            if not len(candidates):
                continue
            keys = rng.choice(candidates, rng.integers(1, len(candidates) + 1), replace=False)
            n, words = len(keys), mask_words(world_size)
            values = rng.integers(-9, 9, store.floats_for(keys)).astype(np.float32)
            versions = rng.integers(0, 50, n)
            s = _masks(rng, n, world_size)
            r = _masks(rng, n, world_size)
            epochs = rng.integers(0, 20, n)
            src = int(rng.choice(others))
            counts = node.intents.native if node.intents is not None else None
            node.directory.moves_in(src, _moves(relocations=(keys, values, versions, s, r, epochs)),
                                    counts, 0.0)
            ref.relocate_in(keys, values, versions, s, r, epochs)
        elif what == "replica":
            free = np.flatnonzero(state == NONE)
            if not len(free):
                continue
            keys = rng.choice(free, rng.integers(1, len(free) + 1), replace=False)
            values = rng.integers(-9, 9, store.floats_for(keys)).astype(np.float32)
            versions = rng.integers(0, 50, len(keys))
            for s in (store, ref.store):
                s.insert(keys, REPLICA, values, versions)
            node.directory.replicas_added(keys)
        elif what == "setup":  # replicas from an owner, some of them wanted here
            free = np.flatnonzero(state != OWNER)
            if not len(free):
                continue
            keys = rng.choice(free, rng.integers(1, len(free) + 1), replace=False)
            values = rng.integers(-9, 9, store.floats_for(keys)).astype(np.float32)
            versions = rng.integers(0, 50, len(keys))
            wanted = rng.integers(0, 2, NUM_KEYS).astype(bool)
            src = int(rng.choice(others))
            node.directory.moves_in(src, _moves(setups=(keys, values, versions)),
                                    _wanting(np.flatnonzero(wanted)).native, float(seed))
            taken = ref.setup_in(src, keys, values, versions, wanted, float(seed))
            np.testing.assert_array_equal(store.synced_at(taken), ref.store.synced_at(taken))
        else:  # updates to held keys: replicas keep them as unsent deltas
            held = np.flatnonzero(state != NONE)
            if not len(held):
                continue
            keys = rng.choice(held, rng.integers(1, len(held) + 1), replace=False)
            values = rng.integers(-3, 3, store.floats_for(keys)).astype(np.float32)
            for s in (store, ref.store):
                s.scatter_add(keys, values, np.empty(len(keys), dtype=np.int64))
        _agree(node, ref)
    np.testing.assert_array_equal(np.frombuffer(node.directory.replica_keys(), dtype=np.int64),
                                  np.flatnonzero(store.snapshot()["state"] == REPLICA))


def _check_answer(node: NodeState, ref: Reference, rng, world_size: int, seed: int) -> None:
    """An answer to a round taken in natively and by the reference: the same hints, intents
    told, replica values, versions and sync times (compared by _agree and here)."""
    store = node.store
    ni = int(rng.integers(0, NUM_KEYS + 1))
    reports = rng.choice(NUM_KEYS, ni, replace=False)
    syncs = rng.choice(NUM_KEYS, int(rng.integers(0, NUM_KEYS + 1)), replace=False)
    keys = np.concatenate((reports, syncs)).astype(np.int64)  # a key may be in both
    flags = rng.integers(0, 2, ni).astype(bool)
    pos = rng.choice(len(keys), int(rng.integers(0, len(keys) + 1)), replace=False)
    versions = np.where(pos < ni, -1, rng.integers(0, 50, len(pos))).astype(np.int64)
    answered_syncs = pos[pos >= ni]
    refresh = np.sort(rng.choice(answered_syncs, int(rng.integers(0, len(answered_syncs) + 1)),
                                 replace=False)).astype(np.int64)
    values = rng.integers(-9, 9, store.floats_for(keys[refresh])).astype(np.float32)
    src = int(rng.integers(0, world_size))
    told = np.zeros(NUM_KEYS, dtype=bool)
    # The engine's clock is time.monotonic(), always > 0: store_refresh takes a time of 0 as
    # "leave the sync time" (native/store.h), so 0 is no time an answer can come at.
    now = seed + 1.0
    want = ref.apply_answer(keys, flags, ni, src, pos, versions, refresh, values, told, now)
    intents = NodeIntents(NUM_KEYS)  # nothing told yet
    got = node.directory.apply_answer(keys, flags.view(np.uint8), ni, src, pos, versions,
                                      refresh, values, intents.native, now)
    assert got == want
    np.testing.assert_array_equal(intents.dense()[1], told)
    np.testing.assert_array_equal(store.snapshot()["synced_at"],
                                  ref.store.snapshot()["synced_at"])


def _wanting(keys) -> NodeIntents:
    """Intent counts with acted-on intent for ``keys`` (through a worker's queue)."""
    worker = WorkerIntents(ImmediateTimer(), NUM_KEYS)
    worker.signal(np.asarray(keys, dtype=np.int64), 0, 1)
    intents = NodeIntents(NUM_KEYS)
    intents.collect(worker, 0)
    return intents


def _check_round(node: NodeState, ref: Reference, rng) -> None:
    """A round's requests built natively and by the reference: the same replicas dropped, the
    same requests per owner, the same entries."""
    store = node.store
    elsewhere = np.flatnonzero(store.snapshot()["state"] != OWNER)
    ikeys = rng.choice(elsewhere, rng.integers(0, len(elsewhere) + 1), replace=False)
    iflags = rng.integers(0, 2, len(ikeys)).astype(bool)
    held = np.frombuffer(node.directory.replica_keys(), dtype=np.int64).copy()
    drop, expected, keys = ref.round_requests(ikeys, iflags, held)
    out = node.directory.round_requests(ikeys, iflags.view(np.uint8))
    np.testing.assert_array_equal(out[0], drop)
    np.testing.assert_array_equal(out[2], keys)
    counts = out[1].reshape(3, node.world_size)
    starts = np.cumsum(counts, axis=1) - counts
    assert sorted(np.flatnonzero(counts.sum(axis=0)).tolist()) == sorted(expected)
    row_at = np.concatenate(([0], np.cumsum(store.lengths_of(out[6]))))
    for dst, want in expected.items():
        (ia, da, ca), (ni, nd, nc) = starts[:, dst], counts[:, dst]
        got = [out[3][ia:ia + ni], out[4][ia:ia + ni], out[5][ia:ia + ni],
               out[6][da:da + nd], out[7][da:da + nd], out[8][row_at[da]:row_at[da + nd]],
               out[9][da:da + nd], out[10][ca:ca + nc], out[11][ca:ca + nc],
               out[12][ca:ca + nc]]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def _check_sync(node: NodeState, ref: Reference, rng, world_size: int) -> None:
    """A random SYNC served by the node and by the reference: the same answer (with the moves
    for the origin riding along), the same moves held for other peers, the same entries queued
    and forwarded."""
    store = node.store
    origin = int(rng.integers(0, world_size))
    picked = rng.permutation(NUM_KEYS)
    ni, nd = (int(x) for x in rng.integers(0, 5, 2))
    nc = int(rng.integers(0, NUM_KEYS - ni - nd + 1)) if ni + nd < NUM_KEYS else 0
    ikeys = np.sort(rng.choice(NUM_KEYS, ni, replace=False)).astype(np.int64)
    dkeys, ckeys = picked[:nd].astype(np.int64), picked[nd:nd + nc].astype(np.int64)
    pos = rng.permutation(ni + nd + nc).astype(np.int64)
    arrays = [ikeys, pos[:ni], rng.integers(0, 2, ni).astype(np.int8),
              dkeys, pos[ni:ni + nd],
              rng.integers(-5, 5, store.floats_for(dkeys)).astype(np.float32),
              rng.integers(0, 4, nd).astype(np.int64),
              ckeys, pos[ni + nd:], rng.integers(0, 4, nc).astype(np.int64)]
    expected, dropped, moves, queued, forwarded = ref.serve_sync(
        origin, *[a.astype(bool) if i == 2 else a for i, a in enumerate(arrays)])
    entry_keys = np.concatenate((arrays[0], arrays[3], arrays[7]))
    if origin == node.rank:  # its own SYNC (keys on their way here): the native pass alone
        _check_own_sync(node, arrays, expected, dropped, moves, queued, forwarded, entry_keys)
        return
    drops = node.counters["replica_drops_at_owner"]
    sync = Message(Kind.SYNC, origin, 7, {"k": int(Kind.SYNC), "s": origin, "i": 7, "o": origin},
                   [*arrays, *NO_MOVES])
    out = [(ins.dst, ins.message) for ins in node.handle(Received(sync), 1.0)]
    assert node.counters["replica_drops_at_owner"] - drops == dropped
    answers = [m for dst, m in out if m.kind == Kind.SYNC_RESP]
    if expected is None:
        assert not answers
    else:
        (answer,) = answers
        assert answer.req_id == 7
        for got, want in zip(answer.arrays[:8], expected):
            np.testing.assert_array_equal(got, want)
    # Every peer's moves were held first, then rode along with the first carrier to it (the
    # answer, or a SYNC forwarded there), or are held still.
    held = node.held_moves()
    for dst, m in out:
        if m.kind in (Kind.SYNC, Kind.SYNC_RESP) and any(len(a) for a in m.moves()):
            assert dst not in held
            held[dst] = m.moves()
    _same_moves(held, moves)
    assert sorted(k for m in node.queued for k in m.keys().tolist()) == \
        sorted(entry_keys[queued].tolist())
    node.queued.clear()  # served by no later step (the reference forgets them too)
    sent = {}
    for dst, m in out:
        if m.kind == Kind.SYNC:
            sent.setdefault(dst, []).extend(m.keys().tolist())
    assert {d: sorted(k) for d, k in sent.items()} == \
        {d: sorted(entry_keys[e].tolist()) for d, e in forwarded.items()}


def _check_own_sync(node: NodeState, arrays: list, expected, dropped: int, moves: dict,
                    queued, forwarded: dict, entry_keys: np.ndarray) -> None:
    """A SYNC of the node's own (``node.handle`` would answer it to itself, as an answer to
    its own round): the native pass against the reference. Every move stays held (no carrier
    went to a peer); the entries not owned here are those queued (hop -1) or forwarded."""
    answer, decision, rest_index, rest_hop = node.directory.serve_sync(
        node.variant, node.rank, *arrays)
    assert (decision[0] if decision is not None else 0) == dropped
    if expected is None:
        assert answer is None
    else:
        for got, want in zip(answer[:8], expected):
            np.testing.assert_array_equal(got, want)
    _same_moves(node.held_moves(), moves)
    index = np.frombuffer(rest_index, dtype=np.int64) if rest_index is not None else []
    hops = np.frombuffer(rest_hop, dtype=np.int64) if rest_hop is not None else []
    assert sorted(entry_keys[[i for i, h in zip(index, hops) if h < 0]].tolist()) == \
        sorted(entry_keys[queued].tolist())
    sent = {}
    for i, hop in zip(index, hops):
        if hop >= 0:
            sent.setdefault(int(hop), []).append(int(entry_keys[i]))
    assert {d: sorted(k) for d, k in sent.items()} == \
        {d: sorted(entry_keys[e].tolist()) for d, e in forwarded.items()}


def _same_moves(held: dict, moves: dict) -> None:
    assert sorted(held) == sorted(moves)
    for peer, arrays in held.items():
        for got, want in zip(arrays, moves[peer]):
            np.testing.assert_array_equal(got, want)


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=10, deadline=None)
def test_records_of_many_keys_read_back_as_set(seed):
    """Thousands of records made and dropped at random: the directory's key map grows through
    several doublings and deletes by backward shift across its end (the tests above hold 12
    keys, which never leave its first 64 slots). Every key's masks read back as last set, and
    a record stays only for the keys whose masks are not empty."""
    num_keys, world_size, rank = 20_000, 2, 0
    config = adapm.Config(num_keys=num_keys, value_length=1, world_size=world_size, rank=rank,
                          rendezvous="127.0.0.1:1", management="adaptive")
    store = Store(config)
    owned = home_keys(rank, num_keys, world_size)
    store.insert(owned, OWNER)
    node = NodeState(rank, world_size, store, config)
    intent = np.zeros(num_keys, dtype=np.uint64)  # one mask word per key at 2 nodes
    replicas = np.zeros(num_keys, dtype=np.uint64)
    rng = np.random.default_rng(seed)
    for _ in range(8):
        keys = rng.choice(owned, int(rng.integers(1, len(owned))), replace=False)
        s = rng.integers(0, 4, len(keys)).astype(np.uint64)  # the bits of ranks 0 and 1
        s[rng.random(len(keys)) < 0.5] = 0  # half of them: back to no record
        r = s & rng.integers(0, 4, len(keys)).astype(np.uint64) & ~np.uint64(1 << rank)
        node.directory.set_masks(keys.astype(np.int64), s, r)
        intent[keys], replicas[keys] = s, r
        got = dense(node)
        np.testing.assert_array_equal(got["intent"], intent)
        np.testing.assert_array_equal(got["replicas"], replicas)
        assert node.directory.memory()[0] == int(((intent != 0) | (replicas != 0)).sum())


def _pins_node(num_keys: int) -> NodeState:
    """Rank 0 of a 2-node adaptive job, its home keys owned: for the pins (its directory's)."""
    config = adapm.Config(num_keys=num_keys, value_length=1, world_size=2, rank=0,
                          rendezvous="127.0.0.1:1", management="adaptive")
    store = Store(config)
    store.insert(home_keys(0, num_keys, 2), OWNER)
    return NodeState(0, 2, store, config)


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=10, deadline=None)
def test_pins_count_every_take_and_release(seed):
    """Workers pin their local samples and release them a clock later (``repin``): random
    samples with repeated keys, overlapping the last ones, through a map that grows through
    several doublings and deletes across its end. Each key's pin count equals the takes minus
    the releases that found it pinned (a release of a key not pinned is ignored, even if the
    same call takes it)."""
    num_keys = 50_000
    node = _pins_node(num_keys)  # kept: the directory works over its store
    directory = node.directory
    rng = np.random.default_rng(seed)
    count = np.zeros(num_keys, dtype=np.int64)
    samples: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * 3  # three workers' last
    for _ in range(30):
        worker = int(rng.integers(3))
        hot = rng.integers(0, num_keys, 64)  # keys many samples hold
        n = int(rng.integers(0, 3000))
        take = np.concatenate([rng.choice(hot, n // 2), rng.integers(0, num_keys, n - n // 2)])
        release = samples[worker]
        if rng.random() < 0.2:  # keys this worker did not pin: ignored where nobody did
            release = np.concatenate([release, rng.integers(0, num_keys, 50)])
        for key in release.tolist():
            count[key] = max(count[key] - 1, 0)
        np.add.at(count, take, 1)
        directory.repin(release.astype(np.int64), take.astype(np.int64))
        samples[worker] = take.astype(np.int64)
        got = np.frombuffer(directory.pinned(np.arange(num_keys, dtype=np.int64)), np.int32)
        np.testing.assert_array_equal(got, count)


def test_pins_changed_by_threads_at_once_are_all_counted():
    """A worker changes the pins holding the GIL when they are free, and lets the GIL go to
    wait when another thread holds them: one thread pins and releases large samples (which
    hold the pins without the GIL), another small ones at the same time. Every take and
    release counts, in either way, and a pin that both threads took is released by both."""
    num_keys = 100_000
    node = _pins_node(num_keys)  # kept: the directory works over its store
    directory = node.directory
    shared = np.arange(0, 100, dtype=np.int64)  # in both threads' samples
    errors = []

    def pinning(size: int, times: int, seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            last = np.empty(0, dtype=np.int64)
            for _ in range(times):
                take = np.concatenate([shared, rng.integers(0, num_keys, size)])
                directory.repin(last, take)
                last = take
            directory.repin(last, np.empty(0, dtype=np.int64))
        except BaseException as exc:  # noqa: BLE001 - raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=pinning, args=(40_000, 30, 1)),
               threading.Thread(target=pinning, args=(200, 3000, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a repin hung"
    assert not errors, errors
    left = np.frombuffer(directory.pinned(np.arange(num_keys, dtype=np.int64)), np.int32)
    assert not left.any(), f"{np.count_nonzero(left)} keys still pinned"


def test_deciding_on_a_key_not_owned_changes_nothing():
    config = _config(2, 0, 2)
    store = Store(config)
    store.insert(home_keys(0, NUM_KEYS, 2), OWNER)
    node = NodeState(0, 2, store, config)
    # rank 1 has intent: a report from 0 that ends would relocate
    node.directory.set_masks(np.array([0], np.int64), np.array([2], np.uint64),
                             np.zeros(1, np.uint64))
    before = store.snapshot()["state"], node.directory.dense()
    with pytest.raises(ValueError, match="key 1 is not owned here"):
        _decide(node, np.array([0, 1], dtype=np.int64), 0, np.zeros(2, dtype=bool))
    np.testing.assert_array_equal(store.snapshot()["state"], before[0])
    assert node.directory.dense() == before[1]
    assert not node.held_moves()
    with pytest.raises(ValueError, match="key 2 is owned here already"):
        node.directory.moves_in(1, _moves(relocations=(
            np.array([1, 2], dtype=np.int64), np.zeros(4, np.float32), np.zeros(2, np.int64),
            np.zeros(2, np.uint64), np.zeros(2, np.uint64), np.ones(2, np.int64))),
            node.intents.native, 1.0)
    np.testing.assert_array_equal(store.snapshot()["state"], before[0])


@pytest.mark.parametrize("management", ["adaptive", "full_replication"])
def test_staying_is_owned_or_a_replica_still_wanted(management):
    """What the local sampler may draw: keys owned here, and replicas this node still has
    acted-on intent for (a replica without is dropped by the next round: a push of it would go
    remote); under full replication, which keeps no intent, every replica."""
    config = _config(2, 0, 2, management)
    store = Store(config)
    store.insert(home_keys(0, NUM_KEYS, 2), OWNER)  # 0, 2, 4, ...
    store.insert(np.array([1, 3, 5], np.int64), REPLICA)
    node = NodeState(0, 2, store, config)
    if node.intents is not None:
        node.intents.native.set_counts(np.array([3, 4], np.int64), np.array([1, 2], np.int32))
    keys = np.array([0, 1, 3, 5, 7, 4, 3], np.int64)
    wanted_replica = [False, True, False] if node.intents is not None else [True, True, True]
    expected = [True, *wanted_replica, False, True, wanted_replica[1]]
    assert node.staying(keys).tolist() == expected
    assert node.staying(np.empty(0, np.int64)).tolist() == []
    with pytest.raises(IndexError):
        node.staying(np.array([NUM_KEYS], np.int64))


def test_round_requests_count_their_answers_in_the_directory():
    """Directory.round_open / round_answered: the count of a round request's unanswered entries
    that the transport (native/answer_fast.c) and NodeState share; a round's requests are
    registered in one call, each counted on its own; bad registrations are refused before
    anything is kept."""
    config = _config(2, 0, 2)
    store = Store(config)
    store.insert(home_keys(0, NUM_KEYS, 2), OWNER)
    directory = NodeState(0, 2, store, config).directory
    keys = np.array([1, 3, 5, 7], np.int64)
    flags = np.ones(2, np.uint8)
    assert directory.round_answered(9, 0) is None  # never opened
    directory.round_open([(9, 4), (11, 2)], keys, flags, 2, 1)
    with pytest.raises(ValueError, match="open already"):
        directory.round_open([(9, 4)], keys, flags, 2, 1)
    assert directory.round_answered(9, 0) == 4
    assert directory.round_answered(11, 0) == 2
    assert directory.round_answered(9, 3) == 1
    with pytest.raises(ValueError, match="waits for 1"):
        directory.round_answered(9, 2)
    assert directory.round_answered(9, 1) == 0
    assert directory.round_answered(9, 0) is None  # done: forgotten
    assert directory.round_answered(11, 2) == 0  # the other request of the round: its own count
    assert directory.round_answered(11, 0) is None
    for bad in ([[(10, 4)], keys, flags, 3, 2],  # intents and deltas beyond the keys
                [[(10, 4)], keys, flags[:1], 2, 1],  # a flag per report
                [[(10, 4), (12, 5)], keys, flags, 2, 1],  # more entries than keys, second
                [[(10, 4), (12, 0)], keys, flags, 2, 1],  # nothing to answer
                [[(10, 4), (10, 2)], keys, flags, 2, 1],  # one id twice
                [[(10, 4)], keys.astype(np.int32), flags, 2, 1]):
        with pytest.raises(ValueError):
            directory.round_open(*bad)
        assert directory.round_answered(10, 0) is None  # the first pair was not kept either
        assert directory.round_answered(12, 0) is None
    for bad in ([(10,)], [[10, 4]], [(10, "4")]):
        with pytest.raises(TypeError, match="tuples of ints"):
            directory.round_open(bad, keys, flags, 2, 1)
    assert directory.round_answered(10, 0) is None
    with pytest.raises(IndexError):
        directory.round_open([(10, 1)], np.array([NUM_KEYS], np.int64), flags, 0, 0)
    assert directory.round_answered(10, 0) is None


def test_native_directory_checks_its_buffers():
    config = _config(3, 0, 2)
    store = Store(config)
    store.insert(home_keys(0, NUM_KEYS, 3), OWNER)
    node = NodeState(0, 3, store, config)
    directory = node.directory
    keys = np.array([1], dtype=np.int64)  # homed at rank 1: not held here
    args = [np.zeros(2, np.float32), np.zeros(1, np.int64), np.zeros(1, np.uint64),
            np.zeros(1, np.uint64), np.ones(1, np.int64)]
    with pytest.raises(ValueError, match="values"):
        directory.relocate_in(keys, np.zeros(1, np.float32), *args[1:], np.empty(1, np.int8))
    with pytest.raises(ValueError, match="key 1 appears more than once"):
        directory.relocate_in(np.array([1, 1], np.int64), np.zeros(4, np.float32),
                              np.zeros(2, np.int64), np.zeros(2, np.uint64),
                              np.zeros(2, np.uint64), np.ones(2, np.int64), np.empty(2, np.int8))
    with pytest.raises(ValueError, match="one per key"):
        directory.relocate_in(keys, *args, np.empty(2, np.int8))
    for stray in (np.array([8], np.uint64), np.array([2**63], np.uint64)):  # rank 3, rank 63
        with pytest.raises(ValueError, match="rank >= world size 3"):
            directory.relocate_in(keys, args[0], args[1], stray, args[3], args[4],
                                  np.empty(1, np.int8))
    assert store.states(1) == NONE and dense(node)["hint"][1] == 1
    assert not len(store.native.free_slots())  # no slot was taken and left behind
    owned = np.array([0, 3], np.int64)
    flags = np.ones(2, np.uint8)
    with pytest.raises(IndexError):
        directory.decide(0, 1, np.array([NUM_KEYS], np.int64), np.ones(1, np.uint8))
    with pytest.raises(ValueError, match="one entry per key"):
        directory.decide(0, 1, owned, np.ones(3, np.uint8))
    with pytest.raises(ValueError, match="node outside"):
        directory.decide(0, 3, owned, flags)
    with pytest.raises(ValueError, match="bad variant"):
        directory.decide(7, 1, owned, flags)
    with pytest.raises(TypeError):
        directory.decide(0, 1, owned.astype(np.int32), flags)
    assert not dense(node)["intent"].any()  # nothing was decided
    before = directory.dense()
    counts = node.intents.native
    with pytest.raises(TypeError, match="IntentCounts"):
        directory.round_build(None, 0, True, 1)
    with pytest.raises(ValueError, match="variant"):
        directory.round_build(counts, 9, True, 1)
    with pytest.raises(ValueError, match="rank 3 of key 1"):
        directory.redirected(keys, np.ones(1, np.uint8), np.array([3], np.int64), 1, counts, 0)
    with pytest.raises(ValueError, match="one flag per key"):
        directory.redirected(keys, np.ones(2, np.uint8), np.array([2], np.int64), 1, counts, 0)
    with pytest.raises(ValueError, match="src outside"):
        directory.redirected(keys, np.ones(1, np.uint8), np.array([2], np.int64), 5, counts, 0)
    with pytest.raises(IndexError):
        directory.route_own(np.array([NUM_KEYS], np.int64), False, counts)
    with pytest.raises(TypeError, match="IntentCounts"):
        directory.route_own(keys, False, 3)
    with pytest.raises(ValueError, match="12 arrays"):
        directory.moves_in(1, list(NO_MOVES)[:11], counts, 0.0)
    with pytest.raises(ValueError, match="rank outside"):
        directory.take_moves(3)
    with pytest.raises(ValueError, match="one key per asked position"):
        directory.check_answer(np.arange(2, dtype=np.int64), keys, keys, 1, -1)
    assert directory.check_answer(np.array([4, 7], np.int64), np.array([1, 2], np.int64),
                                  np.array([7], np.int64), 1, 2) is None
    assert "did not ask for" in directory.check_answer(
        np.array([4, 7], np.int64), np.array([1, 2], np.int64), np.array([5], np.int64), 1, 2)
    assert "waits for" in directory.check_answer(
        np.array([4, 7], np.int64), np.array([1, 2], np.int64), np.array([4, 7], np.int64), 1,
        -1)
    assert "3 floats" in directory.check_answer(
        np.array([4, 7], np.int64), np.array([1, 2], np.int64), np.array([7], np.int64), 1, 3)
    assert directory.dense() == before  # none of them changed anything


def test_serve_sync_refuses_a_malformed_sync_before_changing_anything():
    config = _config(2, 0, 2)
    store = Store(config)
    store.insert(home_keys(0, NUM_KEYS, 2), OWNER)
    node = NodeState(0, 2, store, config)
    i64, f32 = np.int64, np.float32

    def sync(origin=1, **change):
        arrays = dict(ikeys=np.array([0], i64), ipos=np.array([0], i64),
                      iflags=np.ones(1, np.int8), dkeys=np.array([2], i64),
                      dpos=np.array([1], i64), drows=np.ones(2, f32), dver=np.zeros(1, i64),
                      ckeys=np.array([4], i64), cpos=np.array([2], i64),
                      cver=np.zeros(1, i64))
        arrays.update(change)
        return node.directory.serve_sync(node.variant, origin, *arrays.values())

    before = store.slab.copy(), store.snapshot()["version"], dense(node)["intent"].copy()
    for change, error in (
            (dict(ipos=np.array([0, 1], i64)), "one position"),
            (dict(iflags=np.ones(2, np.int8)), "one position"),
            (dict(dver=np.zeros(2, i64)), "one position"),
            (dict(cpos=np.zeros(0, i64)), "one position"),
            (dict(drows=np.ones(3, f32)), "rows hold 3 floats, their keys need 2"),
            (dict(ckeys=np.array([NUM_KEYS], i64)), "outside"),
            (dict(dkeys=np.array([-1], i64)), "outside")):
        with pytest.raises((ValueError, IndexError), match=error):
            sync(**change)
    with pytest.raises(TypeError):
        sync(drows=np.ones(2, np.float64))
    with pytest.raises(ValueError, match="origin"):
        sync(origin=2)
    np.testing.assert_array_equal(store.slab, before[0])
    np.testing.assert_array_equal(store.snapshot()["version"], before[1])
    np.testing.assert_array_equal(dense(node)["intent"], before[2])
    answer, decision, rest, _ = sync()  # the well-formed one is served
    assert answer is not None and decision is not None and rest is None
    assert store.versions(np.array([2]))[0] == 1  # the delta was merged

    plain = NodeState(0, 2, Store(_config(2, 0, 2, "full_replication")),
                      _config(2, 0, 2, "full_replication"))
    plain.store.insert(home_keys(0, NUM_KEYS, 2), OWNER)
    with pytest.raises(ValueError, match="does not act on intent"):
        plain.directory.serve_sync(plain.variant, 1, np.array([0], i64), np.array([0], i64),
                                   np.ones(1, np.int8), *[np.zeros(0, t) for t in
                                                          (i64, i64, f32, i64, i64, i64, i64)])


@st.composite
def syncs(draw):
    """A SYNC's sections and origin for a node of rank 0 of 2 with value length 2: keys may
    repeat; some SYNCs have a flaw (an array a size off, a key out of range, a bad origin)."""
    key = st.integers(0, 5)  # few keys: repeats are common
    ni, nd, nc = (draw(st.integers(0, 4)) for _ in range(3))
    arrays = [np.array(draw(st.lists(key, min_size=ni, max_size=ni)), np.int64),
              np.arange(ni, dtype=np.int64),
              np.array(draw(st.lists(st.integers(0, 1), min_size=ni, max_size=ni)), np.int8),
              np.array(draw(st.lists(key, min_size=nd, max_size=nd)), np.int64),
              np.arange(ni, ni + nd, dtype=np.int64), np.ones(2 * nd, np.float32),
              np.array(draw(st.lists(st.integers(0, 3), min_size=nd, max_size=nd)), np.int64),
              np.array(draw(st.lists(key, min_size=nc, max_size=nc)), np.int64),
              np.arange(ni + nd, ni + nd + nc, dtype=np.int64),
              np.array(draw(st.lists(st.integers(0, 3), min_size=nc, max_size=nc)), np.int64)]
    flaw = draw(st.sampled_from(["none", "none", "size", "range", "origin"]))
    origin = draw(st.integers(0, 1))
    if flaw == "size":  # one array a size off
        i = draw(st.integers(0, 9))
        arrays[i] = np.resize(arrays[i], max(len(arrays[i]) + draw(st.sampled_from([-1, 1])), 0))
    elif flaw == "range":  # a key outside the key space
        section = draw(st.sampled_from([0, 3, 7]))
        if len(arrays[section]):
            arrays[section][0] = draw(st.sampled_from([-1, NUM_KEYS, 2**62]))
    elif flaw == "origin":
        origin = draw(st.sampled_from([-1, 2]))
    return arrays, origin


@given(st.lists(syncs(), min_size=1, max_size=4))
@settings(max_examples=300, deadline=None)
def test_serve_sync_fuzzed(messages):
    """Random SYNCs from random origins: each is served or refused (ValueError, IndexError)
    with nothing changed, and the store stays consistent: every held key has its own slot."""
    config = _config(2, 0, 2)
    store = Store(config)
    store.insert(home_keys(0, NUM_KEYS, 2), OWNER)
    node = NodeState(0, 2, store, config)
    for arrays, origin in messages:
        before = (store.snapshot()["state"], store.slab.copy(), store.snapshot()["version"],
                  *(a.copy() for a in dense(node).values()))
        try:
            answer, decision, _, _ = node.directory.serve_sync(node.variant, origin, *arrays)
        except (ValueError, IndexError):
            after = (store.snapshot()["state"], store.slab, store.snapshot()["version"],
                     *dense(node).values())
            for a, b in zip(before, after):
                np.testing.assert_array_equal(a, b)
            continue
        snap = store.snapshot()  # the slots of keys that left are free again
        held = snap["state"] != NONE
        slots = snap["slot"][held]
        assert (snap["slot"][~held] == -1).all() and (slots >= 0).all()
        assert len(np.unique(slots)) == len(slots)
        free = np.frombuffer(store.native.free_slots(), dtype=np.int64)
        assert (free >= 0).all() and len(np.unique(free)) == len(free)  # each free once
        assert not set(free.tolist()) & set(slots.tolist())  # and none of them in use


def test_apply_answer_refuses_an_answer_that_does_not_fit_the_round():
    config = _config(2, 0, 2)
    store = Store(config)
    store.insert(home_keys(0, NUM_KEYS, 2), OWNER)
    store.insert(np.array([1, 3], np.int64), REPLICA, np.ones(4, np.float32))
    node = NodeState(0, 2, store, config)
    keys = np.array([5, 1, 3], np.int64)  # one report (key 5), two replicas
    flags = np.ones(1, np.uint8)
    i64 = np.int64

    def answer(pos, versions, refresh, values, src=1):
        return node.directory.apply_answer(keys, flags, 1, src, np.array(pos, i64),
                                           np.array(versions, i64), np.array(refresh, i64),
                                           np.array(values, np.float32),
                                           node.intents.native, 1.0)

    before = store.slab.copy(), store.snapshot()["version"], dense(node)["hint"].copy()
    for args, error in ((((3,), (7,), (), ()), "position 3 outside"),
                        (((1,), (7,), (2,), (0, 0)), "refresh position 2 is not"),
                        (((0,), (-1,), (0,), (0, 0)), "refresh position 0 is not"),
                        (((1,), (7,), (1,), (0,)), "values hold 1 floats"),
                        (((1, 2), (7,), (), ()), "a version per position")):
        with pytest.raises(ValueError, match=error):
            answer(*args)
    with pytest.raises(ValueError, match="src a rank"):
        answer((1,), (7,), (), (), src=2)
    np.testing.assert_array_equal(store.slab, before[0])
    np.testing.assert_array_equal(store.snapshot()["version"], before[1])
    np.testing.assert_array_equal(dense(node)["hint"], before[2])
    assert not node.intents.dense()[1].any()
    assert answer((0, 1, 2), (-1, 7, 8), (2,), (4, 4)) == 1  # a fitting answer is taken in
    assert node.intents.dense()[1][5] and store.versions(np.array([1, 3])).tolist() == [7, 8]


def test_a_sync_answer_that_answers_an_entry_twice_is_refused():
    """Each entry of a round's request is answered once (served, redirected or returned): an
    answer naming one twice is dropped before it is applied (validate.problem, native
    check_sync_answer), since it would decide on or re-report the same key twice."""
    from adapm._engine.events import Tick
    from adapm._engine.validate import problem

    config = adapm.Config(num_keys=NUM_KEYS, value_length=2, world_size=2, rank=0,
                          rendezvous="127.0.0.1:1", management="adaptive",
                          action_timing=False)
    store = Store(config)
    store.insert(home_keys(0, NUM_KEYS, 2), OWNER)
    node = NodeState(0, 2, store, config)
    # A worker's intent for keys 1 and 3 (homed at rank 1): the round reports both to it.
    node.register_worker(0).signal(np.array([1, 3], np.int64), 0, 10)
    (round_sent,) = node.handle(Tick([0]), 1.0)  # one SendRound, its one SYNC
    (sent,) = round_sent.sends()
    (sync,) = decode(sent.message.frames)
    assert sent.dst == 1 and sync.kind == Kind.SYNC and sync.arrays[0].tolist() == [1, 3]
    req_id = sync.req_id
    none, no_rows = np.empty(0, np.int64), np.empty(0, np.float32)

    def redirecting(entries):
        arrays = [none, none, none, no_rows, np.array(entries, np.int64),
                  np.ones(len(entries), np.int64), none, no_rows, *NO_MOVES]
        return Message(Kind.SYNC_RESP, 1, req_id, {"k": int(Kind.SYNC_RESP), "s": 1,
                                                    "i": req_id}, arrays)

    assert problem(redirecting([0, 1]), node) is None
    assert "answered twice" in problem(redirecting([0, 0]), node)


def test_a_key_a_peer_waits_for_is_not_drawn_again_for_a_local_sample():
    """An owner whose worker has a key pinned (its local sample, not pushed yet) defers a
    peer's report that would relocate it; until the report is taken, the key does not stay for
    the local sampler (``NodeState.staying``), so no later sample pins it anew and the report,
    coming again, moves it."""
    config = _config(2, 0, 2)
    store = Store(config)
    store.insert(home_keys(0, NUM_KEYS, 2), OWNER)  # 0, 2, 4, ...
    node = NodeState(0, 2, store, config)
    i64 = np.int64
    none, no_rows = np.empty(0, i64), np.empty(0, np.float32)
    keys = np.array([0, 2], i64)

    def report(req_id: int) -> list:
        """Rank 1's intent for key 0: what the owner answers."""
        sync = message(Kind.SYNC, 1, req_id,
                       [np.array([0], i64), np.array([0], i64), np.ones(1, np.int8), none, none,
                        no_rows, none, none, none, none, *NO_MOVES], o=1)
        return [ins.message for ins in node.handle(Received(sync), 1.0)]

    assert node.staying(keys).tolist() == [True, True]
    node.directory.repin(none, np.array([0], i64))  # a sample here holds key 0
    (answer,) = report(7)
    assert answer.kind == Kind.SYNC_RESP and node.counters["deferred_reports"] == 1
    assert store.states(keys).tolist() == [OWNER, OWNER]
    assert node.staying(keys).tolist() == [False, True]  # rank 1 waits for key 0
    node.directory.repin(np.array([0], i64), none)  # the sample was pushed
    assert node.staying(keys).tolist() == [False, True]  # until the report comes again
    (answer,) = report(8)
    assert node.counters["deferred_reports"] == 1 and node.counters["relocations_out"] == 1
    assert store.states(keys).tolist() == [NONE, OWNER]
    assert node.staying(keys).tolist() == [False, True]
