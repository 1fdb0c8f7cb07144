"""Owner decisions as a pure state machine (no sockets): the paper's scenarios and the rules."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapm._engine.policy import make_policy


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
    p = make_policy("adaptive", 0, 3, 10)
    a = p.on_intent(keys(1, 2), node=1, has_intent=on(2))
    assert as_dict(a.relocate) == {1: [1, 2]} and not a.setup
    b = p.on_intent(keys(3), node=2, has_intent=on(1))
    assert as_dict(b.relocate) == {2: [3]} and not b.setup


def test_partial_overlap_replicates_only_shared_keys():
    # Scenario 2: node 1 wants {1, 2}, node 2 wants {2, 3}; owner 0 wants nothing.
    p = make_policy("adaptive", 0, 3, 10)
    p.on_intent(keys(1), node=1, has_intent=on(1))  # alone -> relocate (caller moves it)
    p.take(keys(1))
    a = p.on_intent(keys(2), node=1, has_intent=on(1))
    assert as_dict(a.relocate) == {1: [2]}
    # Key 2 did not move in this pure test (the caller did not take it): node 2 joins.
    b = p.on_intent(keys(2, 3), node=2, has_intent=on(2))
    assert as_dict(b.relocate) == {2: [3]}
    assert as_dict(b.setup) == {1: [2], 2: [2]}


def test_hot_spot_replicates_and_main_copy_stays():
    p = make_policy("adaptive", 0, 4, 10)
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
    p = make_policy("adaptive", 1, 3, 5)
    assert not p.on_intent(keys(0), node=1, has_intent=on(1))  # only the owner: nothing
    a = p.on_intent(keys(0), node=2, has_intent=on(1))  # {1, 2}: replicate, do not relocate
    assert not a.relocate and as_dict(a.setup) == {2: [0]}
    b = p.on_intent(keys(0), node=1, has_intent=off(1))  # {2}: now relocate
    assert as_dict(b.relocate) == {2: [0]}


def test_empty_intent_moves_nothing():
    p = make_policy("adaptive", 0, 2, 5)
    a = p.on_intent(keys(3), node=0, has_intent=off(1))
    assert not a


def test_variants():
    rel = make_policy("relocation_only", 0, 3, 5)
    rel.on_intent(keys(1), node=1, has_intent=on(1))
    a = rel.on_intent(keys(1), node=2, has_intent=on(1))
    assert as_dict(a.relocate) == {2: [1]} and not a.setup  # latest requester wins
    rep = make_policy("replication_only", 0, 3, 5)
    b = rep.on_intent(keys(1), node=1, has_intent=on(1))
    assert not b.relocate and as_dict(b.setup) == {1: [1]}
    for variant in ("static_partition", "full_replication"):
        assert not make_policy(variant, 0, 3, 5).on_intent(keys(1), node=1, has_intent=on(1))


def test_take_and_install_move_the_masks():
    a = make_policy("adaptive", 0, 3, 5)
    a.on_intent(keys(4), node=1, has_intent=on(1))
    s, r = a.take(keys(4))
    assert a.intent[4] == 0
    b = make_policy("adaptive", 1, 3, 5)
    b.install(keys(4), s, r)
    # Node 2 joins at the new owner: replicate to 2 (1 is the owner and has intent).
    c = b.on_intent(keys(4), node=2, has_intent=on(1))
    assert as_dict(c.setup) == {2: [4]} and not c.relocate


def test_too_many_nodes_for_masks():
    with pytest.raises(ValueError):
        make_policy("adaptive", 0, 65, 5)


events = st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 7), min_size=1,
                                                        max_size=8, unique=True), st.booleans()),
                  max_size=40)


@given(events)
@settings(max_examples=200, deadline=None)
def test_invariants_under_random_events(evs):
    """R ⊆ S \\ {owner}; every relocation targets the only node in S; replicas only if |S| >= 2."""
    p = make_policy("adaptive", 0, 4, 8)
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


def test_config_refuses_too_many_nodes_for_intent_variants():
    from adapm import Config, ConfigError

    for variant in ("adaptive", "replication_only", "relocation_only"):
        with pytest.raises(ConfigError, match="at most 64 nodes"):
            Config(num_keys=10, world_size=65, rendezvous="127.0.0.1:5000", management=variant)
    Config(num_keys=10, world_size=65, rendezvous="127.0.0.1:5000", management="static_partition")


def _reference_decide(variant, rank, intent, replicas, keys, node, has_intent):
    """The rules of the policy module docstring, written with numpy (the native pass must agree)."""
    bit, own = np.uint64(1 << node), np.uint64(1 << rank)
    before = intent[keys]
    after = np.where(has_intent, before | bit, before & ~bit)
    intent[keys] = after
    held = replicas[keys]
    dropped = int(np.bitwise_count(held & ~after).sum())
    held = held & after
    count = np.bitwise_count(after)
    relocate_to = np.full(len(keys), -1, dtype=np.int64)
    if variant == "adaptive":
        single = (count == 1) & ((after & ~own) != 0)
        relocate_to[single] = np.bitwise_count(after[single] - np.uint64(1))
        want = np.where(count >= 2, after & ~own & ~held, np.uint64(0))
    elif variant == "replication_only":
        want = after & ~own & ~held
    else:
        want = np.zeros(len(keys), dtype=np.uint64)
        if node != rank:
            relocate_to[has_intent & ((before & bit) == 0)] = node
    replicas[keys] = held | want
    relocations = {int(d): sorted(keys[relocate_to == d].tolist()) for d in np.unique(relocate_to)
                   if d >= 0}
    setups = {d: sorted(keys[(want & np.uint64(1 << d)) != 0].tolist()) for d in range(64)
              if np.any((want & np.uint64(1 << d)) != 0)}
    return dropped, relocations, setups


reports = st.lists(st.tuples(st.integers(0, 5),
                             st.lists(st.tuples(st.integers(0, 11), st.booleans()), min_size=1,
                                      max_size=12, unique_by=lambda t: t[0])),
                   max_size=30)


@given(st.sampled_from(["adaptive", "replication_only", "relocation_only"]),
       st.integers(0, 5), reports)
@settings(max_examples=300, deadline=None)
def test_native_decisions_match_the_rules(variant, rank, batches):
    """Differential: the native pass gives the masks and actions of the numpy rules."""
    p = make_policy(variant, rank, 6, 12)
    intent = np.zeros(12, dtype=np.uint64)
    replicas = np.zeros(12, dtype=np.uint64)
    for node, entries in batches:
        ks = np.array([k for k, _ in entries], dtype=np.int64)
        flags = np.array([f for _, f in entries], dtype=bool)
        dropped, relocations, setups = _reference_decide(variant, rank, intent, replicas, ks,
                                                         node, flags)
        acts = p.on_intent(ks, node=node, has_intent=flags)
        assert acts.dropped == dropped
        assert as_dict(acts.relocate) == relocations
        assert as_dict(acts.setup) == setups
        assert np.array_equal(p.intent, intent) and np.array_equal(p.replicas, replicas)


def test_native_decisions_check_their_input():
    p = make_policy("adaptive", 0, 4, 8)
    with pytest.raises(IndexError, match="outside"):
        p.on_intent(keys(3, 8), node=1, has_intent=on(2))
    assert not p.intent.any()  # nothing changed before the error
    with pytest.raises(ValueError):
        p.on_intent(keys(3, 4), node=1, has_intent=on(1))
