"""Failure detection: which peers to send a heartbeat now, and which peer has been silent too
long. Pure (times come in as arguments, nothing is sent here); the engine loop carries it out.

Every message from a peer proves it alive, so heartbeats go only to peers this node sent
nothing to for a while: a training job's sync rounds already exchange messages every few
milliseconds, and a heartbeat is sent only when a node is idle. A peer is declared failed when
nothing came from it for ``timeout_s``; a peer that said goodbye (a clean shutdown) is not.

A frozen *observer* must not blame others: when this node's own loop did not run for a good
part of the timeout (the process was stopped, or starved of CPU), the silence it sees is its
own, so the clocks of all peers start again instead.
"""

from __future__ import annotations

from typing import Optional

# Heartbeats per failure timeout: a peer must miss this many in a row before it is declared
# failed, so a delayed heartbeat or two (a busy machine) is not a failure.
HEARTBEATS_PER_TIMEOUT = 8
# The loop must look at least this often per timeout; a longer gap means this node was not
# running, and it starts the peers' clocks again rather than blame them.
_OWN_GAP_SHARE = 0.5


class Liveness:
    """Heartbeat schedule and silence of one node's peers. Not thread-safe (the engine loop)."""

    def __init__(self, rank: int, world_size: int, timeout_s: float, now: float) -> None:
        self.rank = rank
        self.timeout_s = timeout_s
        self.interval_s = timeout_s / HEARTBEATS_PER_TIMEOUT
        self.peers = [r for r in range(world_size) if r != rank]
        self.heard = {r: now for r in self.peers}
        self.sent = {r: now for r in self.peers}
        self.gone: set[int] = set()  # said goodbye: their silence is expected
        self._last_look = now

    def heard_from(self, rank: int, now: float) -> None:
        if rank in self.heard:
            self.heard[rank] = now

    def heard_until(self, rank: int, when: float) -> None:
        """``rank`` was heard from at ``when`` (the latest time told counts)."""
        if rank in self.heard and when > self.heard[rank]:
            self.heard[rank] = when

    def sent_to(self, rank: int, now: float) -> None:
        """This node sent ``rank`` something at ``now`` (the latest time told counts)."""
        if rank in self.sent and now > self.sent[rank]:
            self.sent[rank] = now

    def said_goodbye(self, rank: int) -> None:
        self.gone.add(rank)

    def heartbeats_due(self, now: float) -> list[int]:
        """Peers this node sent nothing to for an interval (send each a heartbeat)."""
        return [r for r in self.peers
                if r not in self.gone and now - self.sent[r] >= self.interval_s]

    def failed(self, now: float) -> Optional[tuple[int, float]]:
        """(rank, seconds of silence) of the peer silent longest, if longer than the timeout;
        else None."""
        own_gap = now - self._last_look
        self._last_look = now
        if own_gap > _OWN_GAP_SHARE * self.timeout_s:
            for r in self.peers:
                self.heard[r] = now
            return None
        worst, silence = None, 0.0
        for r in self.peers:
            if r in self.gone:
                continue
            quiet = now - self.heard[r]
            if quiet > silence:
                worst, silence = r, quiet
        if worst is not None and silence > self.timeout_s:
            return worst, silence
        return None

    def next_look_s(self, now: float) -> float:
        """Longest the loop may sleep before a heartbeat is due (never more than an interval)."""
        due = min((self.sent[r] + self.interval_s for r in self.peers if r not in self.gone),
                  default=now + self.interval_s)
        return max(0.0, min(due - now, self.interval_s))
