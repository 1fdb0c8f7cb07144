"""Rank 0's gathering of the nodes' collectives (adapm._engine.collectives), on its own: the
real nodes' barriers, checkpoints and shutdowns over it are tested in test_static, test_errors
and test_checkpoint."""

from hypothesis import given, settings
from hypothesis import strategies as st

from adapm._engine.collectives import Collectives


def test_a_collective_is_released_when_every_rank_arrived():
    c = Collectives(3)
    assert c.arrive(2, 7, 0, "barrier") == ([], None)
    assert c.missing(0) == [0, 1]
    assert c.arrive(0, 8, 0, "barrier") == ([], None)
    assert c.problem(1, 0) is None and c.problem(1, 1) is None  # this one or the next
    assert c.arrive(1, 9, 0, "barrier") == ([(2, 7), (0, 8), (1, 9)], None)
    assert c.next == 1 and c.missing(1) == [0, 1, 2]
    assert "rank 0 gathers #1" in c.problem(1, 0)  # released: a late arrival is refused
    assert "rank 0 gathers #1" in c.problem(1, 3)


def test_kinds_that_differ_fail_every_arrival_of_that_collective():
    c = Collectives(3)
    c.arrive(0, 1, 0, "barrier")
    waiters, error = c.arrive(1, 2, 0, "shutdown")
    assert waiters == [(0, 1), (1, 2)]
    assert "rank 0 barrier(), rank 1 shutdown()" in error
    waiters, error = c.arrive(2, 3, 0, "barrier")  # a later arrival fails too
    assert waiters == [(2, 3)] and error is not None
    assert c.next == 0  # never released


def test_a_second_arrival_is_refused():
    c = Collectives(2)
    c.arrive(1, 1, 0, "barrier")
    assert "second arrival of rank 1" in c.problem(1, 0)
    assert c.problem(0, 0) is None


@given(st.integers(1, 6), st.randoms(use_true_random=False), st.integers(1, 4))
@settings(max_examples=100, deadline=None)
def test_every_collective_is_released_once_with_its_arrivals(world_size, rnd, rounds):
    """Ranks arrive in any order (each at its next collective once the one before was
    released): each collective is released once, to exactly its arrivals, in order."""
    c = Collectives(world_size)
    at = [0] * world_size  # each rank's next collective
    released = []
    pending = {}
    while min(at) < rounds:
        # a rank may arrive at its next collective once the one before it was released
        ready = [r for r in range(world_size) if at[r] < rounds and at[r] <= c.next
                 and (r, at[r]) not in pending]
        rank = rnd.choice(ready)
        epoch = at[rank]
        assert c.problem(rank, epoch) is None
        pending[rank, epoch] = True
        waiters, error = c.arrive(rank, 100 * epoch + rank, epoch, "barrier")
        assert error is None
        if waiters:
            assert sorted(waiters) == [(r, 100 * epoch + r) for r in range(world_size)]
            released.append(epoch)
            for r in range(world_size):
                del pending[r, epoch]
                at[r] += 1
    assert released == list(range(rounds))
