"""Calls waiting for sync rounds (adapm._engine.waiters), on their own: whom a round lets go."""

from hypothesis import given, settings
from hypothesis import strategies as st

from adapm._engine.waiters import Waiters


def test_a_call_waits_for_a_round_that_starts_after_it():
    w = Waiters()
    assert not w
    w.add("plain", None, 0, next_round=3)  # round 2 was running when it came
    assert w and w.take_forced() == set()
    assert w.round_done(2, lambda worker, clock: True) == ([], False)
    assert w.round_done(3, lambda worker, clock: True) == (["plain"], False)
    assert not w


def test_a_wait_sync_waits_until_its_intents_are_served_and_forces_them():
    w = Waiters()
    w.add("sync", 1, 7, next_round=1)
    assert w.take_forced() == {1} and w.take_forced() == set()
    asked = []

    def not_yet(worker, clock):
        asked.append((worker, clock))
        return False

    # Round 1 ended and worker 1's intents at clock 7 are not served: the next round is
    # needed at once, and acts on all of that worker's intents again.
    assert w.round_done(1, not_yet) == ([], True)
    assert asked == [(1, 7)] and w.forced == {1}
    assert w.take_forced() == {1}
    assert w.round_done(2, lambda worker, clock: True) == (["sync"], False)


@given(st.lists(st.tuples(st.sampled_from(["add", "round"]), st.integers(0, 3),
                          st.integers(0, 2), st.booleans()), max_size=40))
@settings(max_examples=200, deadline=None)
def test_every_call_finishes_once_at_the_first_round_it_may(steps):
    """Random adds and round ends against the rule: a call added when rounds ``done`` had
    ended finishes at the first round after ``done + 1`` or later whose end finds it served;
    never twice, never before."""
    w = Waiters()
    done = 0
    served_now: set = set()
    pending = {}  # call -> (worker, first round)
    finished = set()
    for n, (op, worker, clock, serve) in enumerate(steps):
        if op == "add":
            worker = None if worker == 3 else worker
            call = f"call{n}"
            w.add(call, worker, clock, next_round=done + 2)  # a round may be running
            pending[call] = (worker, clock, done + 2)
        else:
            done += 1
            served_now = {(worker, clock)} if serve else set()
            got, again = w.round_done(done, lambda wk, ck: (wk, ck) in served_now)
            want = [c for c, (wk, ck, first) in pending.items()
                    if done >= first and (wk is None or (wk, ck) in served_now)]
            assert got == want
            assert not finished & set(got)
            finished.update(got)
            for c in got:
                del pending[c]
            assert again == any(done >= first for _, _, first in pending.values())
    assert bool(w) == bool(pending)
