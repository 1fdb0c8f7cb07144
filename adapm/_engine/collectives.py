"""Rank 0's side of the collectives (``barrier``, ``checkpoint``, ``shutdown``): which node
arrived at which, and when all have. Pure, in the manner of :mod:`.liveness`: arrivals in, whom
to answer and how out; the state machine sends the answers.

Every node numbers its collectives alike (0, 1, ...) and names each one's kind (a ``tag``). A
node arrives at collective e only after e - 1 was released, which needed rank 0's own arrival
there, so an arrival is for the collective being gathered or, at the most, the next one.
"""

from __future__ import annotations

from typing import Optional


class Collectives:
    """Gathers arrivals on rank 0. Not thread-safe: the engine thread calls :meth:`problem`
    and :meth:`arrive`; :meth:`missing` is for any thread (a snapshot)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.next = 0  # the collective being gathered
        self._waiting: dict[int, list[tuple[int, int]]] = {}  # epoch -> [(rank, request id)]
        self._tags: dict[int, dict[int, str]] = {}  # epoch -> rank -> kind

    def problem(self, src: int, epoch: int) -> Optional[str]:
        """Why an arrival of ``src`` at ``epoch`` cannot be taken (the validator drops it), or
        None. Anything taken that never completes would pile up here for ever."""
        if not self.next <= epoch <= self.next + 1:
            return f"an arrival at collective #{epoch}, but rank 0 gathers #{self.next}"
        if src in self._tags.get(epoch, ()):
            return f"a second arrival of rank {src} at collective #{epoch}"
        return None

    def arrive(self, src: int, req_id: int, epoch: int, tag: str) -> tuple[list, Optional[str]]:
        """``src`` arrived at collective ``epoch`` of kind ``tag`` (its request ``req_id``).
        Returns the arrivals to answer now, [(rank, request id)], and None to release them, or
        the error text to fail them with: all of them once every rank arrived with one kind;
        every one so far (and every later one) when the kinds differ, since one node in, say,
        ``barrier()`` and another in ``shutdown()`` would otherwise pair up. ([], None) while
        the collective gathers."""
        waiters = self._waiting.setdefault(epoch, [])
        tags = self._tags.setdefault(epoch, {})
        waiters.append((src, req_id))
        tags[src] = tag
        if len(set(tags.values())) > 1:
            called = ", ".join(f"rank {r} {t}()" for r, t in sorted(tags.items()))
            failed = list(waiters)
            waiters.clear()  # the tags stay: later arrivals at this collective fail too
            return failed, (f"collective #{epoch} does not match across nodes: {called}; every "
                            f"node must call the same collectives in the same order")
        if len(tags) < self.world_size:
            return [], None
        del self._waiting[epoch], self._tags[epoch]
        self.next = epoch + 1
        return waiters, None

    def missing(self, epoch: int) -> list[int]:
        """Ranks that have not arrived at collective ``epoch``."""
        arrived = set(dict(self._tags.get(epoch, {})))
        return sorted(set(range(self.world_size)) - arrived)
