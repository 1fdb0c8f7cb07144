"""Owner decisions: relocate or replicate. A pure state machine: events in, actions out.

For every key it owns, a node keeps two bit masks over node ranks:

- ``intent[k]``: S, the nodes that currently have (acted-on) intent for k, the owner included;
- ``replicas[k]``: R, the nodes that hold a replica of k.

Events are batches of "node r has intent now" / "node r's intent ended" for keys this node owns.
The decision for each affected key (management ``adaptive``):

- S = {r}, r ≠ owner         → relocate k to r (value, version, S and R move; r becomes owner);
- |S| ≥ 2                    → a replica at every r ∈ S \\ ({owner} ∪ R);
- r ∈ R but r ∉ S            → r's replica is dropped (r dropped it before telling us);
- otherwise                  → nothing moves.

Variants: ``relocation_only`` relocates to every node that newly signals intent (the most recent
wins, as in Lapse); ``replication_only`` never relocates and replicates to every non-owner with
intent; ``static_partition`` and ``full_replication`` ignore intent.

No sockets, no clocks, no store: :class:`Actions` says what to send, the caller does it. Masks
are uint64, so adaptive variants support up to 64 nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import MAX_INTENT_NODES as MAX_NODES


@dataclass
class Actions:
    """What the owner must do after a batch of events."""

    relocate: list = field(default_factory=list)  # [(dst rank, keys)]
    setup: list = field(default_factory=list)  # [(dst rank, keys)]: send a replica to dst
    dropped: int = 0  # replicas removed from R (the holders already dropped them)

    def __bool__(self) -> bool:
        return bool(self.relocate or self.setup or self.dropped)


def _bit(rank: int) -> np.uint64:
    return np.uint64(1) << np.uint64(rank)


_BITS = [_bit(rank) for rank in range(MAX_NODES)]
_ZERO = np.uint64(0)


class OwnerPolicy:
    """Per-key S and R masks of the keys this node owns, and the decision rule."""

    def __init__(self, rank: int, world_size: int, num_keys: int, management: str) -> None:
        if world_size > MAX_NODES and management in ("adaptive", "relocation_only",
                                                      "replication_only"):
            raise ValueError(f"management={management!r} supports at most {MAX_NODES} nodes")
        self.rank = rank
        self.world_size = world_size
        self.management = management
        self.intent = np.zeros(num_keys, dtype=np.uint64)
        self.replicas = np.zeros(num_keys, dtype=np.uint64)
        self._not_own = ~_bit(rank) if rank < MAX_NODES else ~_ZERO

    def on_intent(self, keys: np.ndarray, node: int, has_intent: np.ndarray) -> Actions:
        """Node ``node`` reports, per key (unique, owned here), whether it has intent now."""
        if self.management in ("static_partition", "full_replication") or len(keys) == 0:
            return Actions()
        # Few numpy calls per batch: reports often carry a handful of keys, and the fixed
        # cost per call then dominates (bench/adaptive.py, 4 nodes: ~1,400 small forwarded
        # reports per node and run).
        bit = _BITS[node]
        before = self.intent[keys]
        after = np.where(has_intent, before | bit, before & ~bit)
        self.intent[keys] = after
        actions = Actions()
        replicas = self.replicas[keys]
        stale = replicas & ~after  # R <- R ∩ S: replicas whose holder no longer has intent
        if stale.any():
            replicas = replicas & after
            self.replicas[keys] = replicas
            actions.dropped = int(np.bitwise_count(stale).sum())
        if self.management == "relocation_only":
            newly_on = keys[has_intent & ((before & bit) == 0)] if node != self.rank else keys[:0]
            if len(newly_on):
                actions.relocate.append((node, newly_on))
            return actions
        return self._decide(keys, after, replicas, actions)

    def _decide(self, keys: np.ndarray, s: np.ndarray, replicas: np.ndarray,
                actions: Actions) -> Actions:
        """Actions for ``keys`` given their S (``s``) and R (``replicas``) masks."""
        others = s & self._not_own
        if self.management == "adaptive":
            count = np.bitwise_count(s)
            single = (count == 1) & (others != 0)  # S = {r}, r != owner: relocate to r
            if single.any():
                actions.relocate.extend(_split_by_single_bit(keys[single], s[single]))
            want = np.where(count >= 2, others & ~replicas, _ZERO)
        else:  # replication_only: any non-owner with intent gets a replica
            want = others & ~replicas
        if want.any():
            # A loop over nodes, never over keys.
            for node in range(self.world_size):
                if node == self.rank:
                    continue
                sel = (want & _BITS[node]) != 0
                if sel.any():
                    group = keys[sel]
                    actions.setup.append((node, group))
                    self.replicas[group] |= _BITS[node]
        return actions

    def take(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Masks of keys that leave this node (relocation); clears them here."""
        s, r = self.intent[keys].copy(), self.replicas[keys].copy()
        self.intent[keys] = 0
        self.replicas[keys] = 0
        return s, r

    def install(self, keys: np.ndarray, intent: np.ndarray, replicas: np.ndarray) -> None:
        """Masks of keys relocated to this node. The new owner never holds a replica of its own."""
        self.intent[keys] = intent
        self.replicas[keys] = replicas & ~_bit(self.rank)


def _split_by_single_bit(keys: np.ndarray, masks: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Group keys whose mask has exactly one bit set by that bit's index."""
    if len(keys) == 0:
        return []
    index = np.bitwise_count(masks - np.uint64(1)).astype(np.int64)
    order = np.argsort(index, kind="stable")
    index, keys = index[order], keys[order]
    cuts = np.flatnonzero(index[1:] != index[:-1]) + 1
    return [(int(i[0]), k) for i, k in zip(np.split(index, cuts), np.split(keys, cuts))]
