"""Round pacing (adapm._engine.pacing), on its own: when the next round may start."""

import pytest

from adapm._engine.pacing import MAX_IDLE_GAP_S, MIN_IDLE_GAP_S, RoundPacer


def test_quiet_rounds_space_out_and_a_busy_one_ends_that():
    p = RoundPacer()
    gaps, now = [], 1.0
    for _ in range(12):
        assert p.due(now)
        p.start(now, quiet=True)
        p.finish(now + 0.0005, empty=False)
        gaps.append(p.next_at - now)
        now = p.next_at
    assert gaps[0] == pytest.approx(MIN_IDLE_GAP_S)
    assert all(b == pytest.approx(min(2 * a, MAX_IDLE_GAP_S)) for a, b in zip(gaps, gaps[1:]))
    assert gaps[-1] == pytest.approx(MAX_IDLE_GAP_S)
    assert not p.due(now - 0.001)
    p.start(now, quiet=True)
    p.busy()  # this one changed something: the next may start at once
    p.finish(now + 0.002, empty=False)
    assert p.next_at == now and p.due(now + 0.002)
    p.start(now + 0.002, quiet=False)
    p.finish(now + 0.002, empty=True)  # nothing to send: a little wait
    assert p.next_at == pytest.approx(now + 0.002 + MIN_IDLE_GAP_S)
    p.hurry()  # someone waits
    assert p.due(0.0)


def test_statistics_count_only_rounds_that_sent_something():
    p = RoundPacer()
    p.start(1.0, quiet=False)
    p.finish(1.004, empty=False)
    p.start(2.0, quiet=False)
    p.finish(2.0, empty=True)
    p.start(3.0, quiet=False)
    p.finish(3.002, empty=False)
    assert p.started == p.done == 3
    assert p.stats() == {"rounds": 3, "empty_rounds": 1,
                         "mean_round_ms": pytest.approx(3.0)}


def test_a_cap_on_rounds_per_second_is_a_floor_under_the_gap():
    p = RoundPacer(max_rounds_per_s=100)
    p.start(1.0, quiet=False)
    p.busy()
    p.finish(1.001, empty=False)
    assert p.next_at == pytest.approx(1.01)
