"""Owner decisions as a pure state machine (no sockets): the paper's scenarios and the rules."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapm._engine.policy import make_policy

from engine_reference import DensePolicy


def keys(*ks):
    return np.array(ks, dtype=np.int64)


def on(n):
    return np.ones(n, dtype=bool)


def off(n):
    return np.zeros(n, dtype=bool)


def as_dict(pairs):
    return {dst: sorted(k.tolist()) for dst, k in pairs}


def test_non_overlapping_access_relocates():
    # Scenario 1: each key is needed by exactly one (non-owner) node -> relocation, no replicas.
    p = DensePolicy("adaptive", 0, 3, 10)
    a = p.on_intent(keys(1, 2), node=1, has_intent=on(2))
    assert as_dict(a.relocate) == {1: [1, 2]} and not a.setup
    b = p.on_intent(keys(3), node=2, has_intent=on(1))
    assert as_dict(b.relocate) == {2: [3]} and not b.setup


def test_partial_overlap_replicates_only_shared_keys():
    # Scenario 2: node 1 wants {1, 2}, node 2 wants {2, 3}; owner 0 wants nothing.
    p = DensePolicy("adaptive", 0, 3, 10)
    p.on_intent(keys(1), node=1, has_intent=on(1))  # alone -> relocate (caller moves it)
    p.take(keys(1))
    a = p.on_intent(keys(2), node=1, has_intent=on(1))
    assert as_dict(a.relocate) == {1: [2]}
    # Key 2 did not move in this pure test (the caller did not take it): node 2 joins.
    b = p.on_intent(keys(2, 3), node=2, has_intent=on(2))
    assert as_dict(b.relocate) == {2: [3]}
    assert as_dict(b.setup) == {1: [2], 2: [2]}


def test_hot_spot_replicates_and_main_copy_stays():
    p = DensePolicy("adaptive", 0, 4, 10)
    p.on_intent(keys(7), node=0, has_intent=on(1))  # the owner itself needs it
    a = p.on_intent(keys(7), node=1, has_intent=on(1))
    assert not a.relocate and as_dict(a.setup) == {1: [7]}
    b = p.on_intent(keys(7), node=2, has_intent=on(1))
    assert not b.relocate and as_dict(b.setup) == {2: [7]}  # no duplicate set-up for node 1
    c = p.on_intent(keys(7), node=3, has_intent=on(1))
    assert as_dict(c.setup) == {3: [7]}
    # Intents end one by one: replicas dropped, main copy never moves while >= 2 remain.
    d = p.on_intent(keys(7), node=1, has_intent=off(1))
    assert d.dropped == 1 and not d.relocate and not d.setup
    e = p.on_intent(keys(7), node=2, has_intent=off(1))
    assert e.dropped == 1 and not e.relocate  # S = {0, 3}: still replicated
    f = p.on_intent(keys(7), node=0, has_intent=off(1))
    # S = {3}, and 3 holds a replica: relocate to 3 (the replica becomes the main copy).
    assert as_dict(f.relocate) == {3: [7]}


def test_relocates_only_when_exactly_one_non_owner():
    p = DensePolicy("adaptive", 1, 3, 5)
    assert not p.on_intent(keys(0), node=1, has_intent=on(1))  # only the owner: nothing
    a = p.on_intent(keys(0), node=2, has_intent=on(1))  # {1, 2}: replicate, do not relocate
    assert not a.relocate and as_dict(a.setup) == {2: [0]}
    b = p.on_intent(keys(0), node=1, has_intent=off(1))  # {2}: now relocate
    assert as_dict(b.relocate) == {2: [0]}


def test_empty_intent_moves_nothing():
    p = DensePolicy("adaptive", 0, 2, 5)
    a = p.on_intent(keys(3), node=0, has_intent=off(1))
    assert not a


def test_variants():
    rel = DensePolicy("relocation_only", 0, 3, 5)
    rel.on_intent(keys(1), node=1, has_intent=on(1))
    a = rel.on_intent(keys(1), node=2, has_intent=on(1))
    assert as_dict(a.relocate) == {2: [1]} and not a.setup  # latest requester wins
    rep = DensePolicy("replication_only", 0, 3, 5)
    b = rep.on_intent(keys(1), node=1, has_intent=on(1))
    assert not b.relocate and as_dict(b.setup) == {1: [1]}
    for variant in ("static_partition", "full_replication"):  # no masks, nothing decides
        assert make_policy(variant).variant < 0
        with pytest.raises(ValueError, match="keeps no masks"):
            DensePolicy(variant, 0, 3, 5)


def test_take_and_install_move_the_masks():
    a = DensePolicy("adaptive", 0, 3, 5)
    a.on_intent(keys(4), node=1, has_intent=on(1))
    s, r = a.take(keys(4))
    assert a.intent[4] == 0
    b = DensePolicy("adaptive", 1, 3, 5)
    b.install(keys(4), s, r)
    # Node 2 joins at the new owner: replicate to 2 (1 is the owner and has intent).
    c = b.on_intent(keys(4), node=2, has_intent=on(1))
    assert as_dict(c.setup) == {2: [4]} and not c.relocate


events = st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 7), min_size=1,
                                                        max_size=8, unique=True), st.booleans()),
                  max_size=40)


@given(events)
@settings(max_examples=200, deadline=None)
def test_invariants_under_random_events(evs):
    """R ⊆ S \\ {owner}; every relocation targets the only node in S; replicas only if |S| >= 2."""
    p = DensePolicy("adaptive", 0, 4, 8)
    for node, ks, flag in evs:
        ks = np.array(ks, dtype=np.int64)
        acts = p.on_intent(ks, node=node, has_intent=np.full(len(ks), flag))
        for dst, moved in acts.relocate:
            assert dst != 0
            assert np.all(p.intent[moved] == np.uint64(1 << dst))
            p.take(moved)  # the caller moves them; this owner forgets (pure test: stays owner)
        for dst, group in acts.setup:
            assert np.all(np.bitwise_count(p.intent[group]) >= 2)
        assert np.all(p.replicas & ~p.intent == 0)
        assert np.all(p.replicas & np.uint64(1) == 0)


def _members(row) -> set:
    """The ranks in one key's mask (its uint64 words)."""
    return {w * 64 + b for w, word in enumerate(row) for b in range(64) if int(word) >> b & 1}


def _reference_decide(variant, rank, S, R, keys, node, has_intent):
    """The rules of the policy module docstring over Python sets (S[k], R[k]): the oracle of the
    native pass, independent of its bit arithmetic."""
    dropped, relocations, setups = 0, {}, {}
    for k, flag in zip(keys.tolist(), has_intent.tolist()):
        was_on = node in S[k]
        if flag:
            S[k].add(node)
        else:
            S[k].discard(node)
        dropped += len(R[k] - S[k])
        R[k] &= S[k]
        want, dst = set(), None
        if variant == "adaptive":
            if len(S[k]) == 1 and rank not in S[k]:
                dst = next(iter(S[k]))
            elif len(S[k]) >= 2:
                want = S[k] - {rank} - R[k]
        elif variant == "replication_only":
            want = S[k] - {rank} - R[k]
        elif node != rank and flag and not was_on:
            dst = node
        R[k] |= want
        if dst is not None:
            relocations.setdefault(dst, []).append(k)
        for d in want:
            setups.setdefault(d, []).append(k)
    return (dropped, {d: sorted(v) for d, v in relocations.items()},
            {d: sorted(v) for d, v in setups.items()})


@st.composite
def report_batches(draw):
    world_size = draw(st.sampled_from([2, 3, 6, 64, 65, 130]))
    rank = draw(st.integers(0, world_size - 1))
    # A few nodes report, so that sets grow; ranks on both sides of the 64-bit word boundaries.
    nodes = st.one_of(st.integers(0, min(world_size, 4) - 1),
                      st.integers(max(0, world_size - 4), world_size - 1),
                      st.integers(0, world_size - 1))
    batches = draw(st.lists(st.tuples(nodes, st.lists(st.tuples(st.integers(0, 11), st.booleans()),
                                                       min_size=1, max_size=12,
                                                       unique_by=lambda t: t[0])),
                            max_size=30))
    return world_size, rank, batches


@given(st.sampled_from(["adaptive", "replication_only", "relocation_only"]), report_batches())
@settings(max_examples=300, deadline=None)
def test_native_decisions_match_the_rules(variant, case):
    """Differential: the native pass gives the sets and actions of the rules, for masks of one
    word and of several (more than 64 nodes)."""
    world_size, rank, batches = case
    p = DensePolicy(variant, rank, world_size, 12)
    S = [set() for _ in range(12)]
    R = [set() for _ in range(12)]
    for node, entries in batches:
        ks = np.array([k for k, _ in entries], dtype=np.int64)
        flags = np.array([f for _, f in entries], dtype=bool)
        dropped, relocations, setups = _reference_decide(variant, rank, S, R, ks, node, flags)
        acts = p.on_intent(ks, node=node, has_intent=flags)
        assert acts.dropped == dropped
        assert as_dict(acts.relocate) == relocations
        assert as_dict(acts.setup) == setups
        assert [_members(row) for row in p.intent] == S
        assert [_members(row) for row in p.replicas] == R


def test_masks_travel_with_relocated_keys_beyond_64_nodes():
    a = DensePolicy("adaptive", 0, 130, 5)
    a.on_intent(keys(4), node=129, has_intent=on(1))
    a.on_intent(keys(4), node=70, has_intent=on(1))  # S = {129, 70}: replicas at both
    s, r = a.take(keys(4))
    b = DensePolicy("adaptive", 70, 130, 5)
    b.install(keys(4), s, r)
    assert _members(b.intent[4]) == {70, 129} and _members(b.replicas[4]) == {129}
    c = b.on_intent(keys(4), node=129, has_intent=off(1))  # S = {70}: the owner alone, stays
    assert not c.relocate and not c.setup and c.dropped == 1


def test_native_decisions_check_their_input():
    p = DensePolicy("adaptive", 0, 4, 8)
    with pytest.raises(IndexError, match="outside"):
        p.on_intent(keys(3, 8), node=1, has_intent=on(2))
    assert not p.intent.any()  # nothing changed before the error
    with pytest.raises(ValueError):
        p.on_intent(keys(3, 4), node=1, has_intent=on(1))
    with pytest.raises(ValueError, match="rank, node"):
        p.on_intent(keys(3), node=4, has_intent=on(1))
