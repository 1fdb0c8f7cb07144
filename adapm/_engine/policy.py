"""Management variants as policy objects: what an owner does when nodes' intent changes.

Pure: events in, actions out.

For every key it owns, a node keeps two bit masks over node ranks:

- ``intent[k]``: S, the nodes that currently have (acted-on) intent for k, the owner included;
- ``replicas[k]``: R, the nodes that hold a replica of k.

Events are batches of "node r has intent now" / "node r's intent ended" for keys this node owns.
The decision for each affected key (management ``adaptive``):

- S = {r}, r ≠ owner         → relocate k to r (value, version, S and R move; r becomes owner);
- |S| ≥ 2                    → a replica at every r ∈ S \\ ({owner} ∪ R);
- r ∈ R but r ∉ S            → r's replica is dropped (r dropped it before telling us);
- otherwise                  → nothing moves.

Variants (one class each, picked by :func:`make_policy`): ``relocation_only`` relocates to every
node that newly signals intent (the most recent wins, as in Lapse); ``replication_only`` never
relocates and replicates to every non-owner with intent; ``static_partition`` (no rounds at
all) and ``full_replication`` (every node replicates every key; rounds only sync them) ignore
intent. Besides deciding, a policy tells the engine what the variant needs of it
(:attr:`Policy.runs_rounds`, :attr:`Policy.reports_intents`, :attr:`Policy.replicates_everything`).

No sockets, no clocks, no store: :class:`Actions` says what to send, the caller does it. Masks
are uint64, so adaptive variants support up to 64 nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..config import MAX_INTENT_NODES as MAX_NODES


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


class Policy:
    """Base: ignores intent (a classic parameter server). Subclasses decide."""

    runs_rounds = True  # the engine runs sync rounds (intents, replica deltas, checks)
    reports_intents = True  # nodes tell owners when their intent for a key starts or ends
    replicates_everything = False  # every node holds a replica of every key it does not own

    def __init__(self, rank: int, world_size: int, num_keys: int) -> None:
        self.rank = rank
        self.world_size = world_size

    def on_intent(self, keys: np.ndarray, node: int, has_intent: np.ndarray) -> Actions:
        """Node ``node`` reports, per key (unique, owned here), whether it has intent now."""
        return Actions()

    def take(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-key state of keys that leave this node (relocation): (S, R) masks."""
        zero = np.zeros(len(keys), dtype=np.uint64)
        return zero, zero

    def install(self, keys: np.ndarray, intent: np.ndarray, replicas: np.ndarray) -> None:
        """Per-key state of keys relocated to this node."""


class StaticPartition(Policy):
    """Keys stay at their home; non-home access is remote. No rounds, no reports."""

    runs_rounds = False
    reports_intents = False


class FullReplication(Policy):
    """Every node holds every key (replicas of the keys homed elsewhere), synced every round."""

    reports_intents = False
    replicates_everything = True


class _MaskPolicy(Policy):
    """Keeps S and R per owned key (uint64 masks over ranks: at most 64 nodes)."""

    def __init__(self, rank: int, world_size: int, num_keys: int) -> None:
        if world_size > MAX_NODES:
            raise ValueError(f"management={self.name!r} supports at most {MAX_NODES} nodes")
        super().__init__(rank, world_size, num_keys)
        self.intent = np.zeros(num_keys, dtype=np.uint64)
        self.replicas = np.zeros(num_keys, dtype=np.uint64)
        self._not_own = ~_bit(rank)

    def on_intent(self, keys: np.ndarray, node: int, has_intent: np.ndarray) -> Actions:
        if len(keys) == 0:
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
        self._decide(keys, node, has_intent, before, after, replicas, actions)
        return actions

    def _decide(self, keys, node, has_intent, before, after, replicas, actions) -> None:
        raise NotImplementedError

    def _replicate(self, keys: np.ndarray, want: np.ndarray, actions: Actions) -> None:
        """A replica of each key at every node whose bit is set in ``want``."""
        if want.any():
            for node in range(self.world_size):  # a loop over nodes, never over keys
                if node == self.rank:
                    continue
                sel = (want & _BITS[node]) != 0
                if sel.any():
                    group = keys[sel]
                    actions.setup.append((node, group))
                    self.replicas[group] |= _BITS[node]

    def take(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, r = self.intent[keys].copy(), self.replicas[keys].copy()
        self.intent[keys] = 0
        self.replicas[keys] = 0
        return s, r

    def install(self, keys: np.ndarray, intent: np.ndarray, replicas: np.ndarray) -> None:
        """The new owner never holds a replica of its own keys."""
        self.intent[keys] = intent
        self.replicas[keys] = replicas & ~_bit(self.rank)


class Adaptive(_MaskPolicy):
    """S = {r}, r != owner: relocate to r; |S| >= 2: a replica at every other node in S."""

    name = "adaptive"

    def _decide(self, keys, node, has_intent, before, s, replicas, actions) -> None:
        others = s & self._not_own
        count = np.bitwise_count(s)
        single = (count == 1) & (others != 0)
        if single.any():
            actions.relocate.extend(_split_by_single_bit(keys[single], s[single]))
        self._replicate(keys, np.where(count >= 2, others & ~replicas, _ZERO), actions)


class ReplicationOnly(_MaskPolicy):
    """Never relocates: a replica at every non-owner with intent."""

    name = "replication_only"

    def _decide(self, keys, node, has_intent, before, s, replicas, actions) -> None:
        self._replicate(keys, s & self._not_own & ~replicas, actions)


class RelocationOnly(_MaskPolicy):
    """Relocates to every node that newly signals intent (the latest wins, as in Lapse)."""

    name = "relocation_only"

    def _decide(self, keys, node, has_intent, before, s, replicas, actions) -> None:
        if node == self.rank:
            return
        newly_on = keys[has_intent & ((before & _BITS[node]) == 0)]
        if len(newly_on):
            actions.relocate.append((node, newly_on))


POLICIES = {"adaptive": Adaptive, "relocation_only": RelocationOnly,
            "replication_only": ReplicationOnly, "static_partition": StaticPartition,
            "full_replication": FullReplication}


def make_policy(management: str, rank: int, world_size: int, num_keys: int) -> Policy:
    """The policy object of ``Config.management`` for one node."""
    return POLICIES[management](rank, world_size, num_keys)


def _split_by_single_bit(keys: np.ndarray, masks: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Group keys whose mask has exactly one bit set by that bit's index."""
    if len(keys) == 0:
        return []
    index = np.bitwise_count(masks - np.uint64(1)).astype(np.int64)
    order = np.argsort(index, kind="stable")
    index, keys = index[order], keys[order]
    cuts = np.flatnonzero(index[1:] != index[:-1]) + 1
    return [(int(i[0]), k) for i, k in zip(np.split(index, cuts), np.split(keys, cuts))]
