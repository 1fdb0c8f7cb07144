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

No sockets, no clocks, no store: :class:`Actions` says what to send, the caller does it. A mask
is ``ceil(world_size / 64)`` uint64 words per key (rank r is bit r % 64 of word r // 64), so the
intent-based variants run on any number of nodes; one word up to 64 nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .._native_loader import load as _load_native
from .routing import group_by_node

_native = _load_native()


@dataclass
class Actions:
    """What the owner must do after a batch of events."""

    relocate: list = field(default_factory=list)  # [(dst rank, keys)]
    setup: list = field(default_factory=list)  # [(dst rank, keys)]: send a replica to dst
    dropped: int = 0  # replicas removed from R (the holders already dropped them)

    def __bool__(self) -> bool:
        return bool(self.relocate or self.setup or self.dropped)


def mask_words(world_size: int) -> int:
    """uint64 words per key of an intent or replica mask over ``world_size`` ranks."""
    return (world_size + 63) // 64


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
        """Per-key state of keys that leave this node (relocation): (S, R) masks, flat."""
        zero = np.zeros(len(keys) * mask_words(self.world_size), dtype=np.uint64)
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
    """Keeps S and R per owned key (masks over ranks, :func:`mask_words` words per key). The
    per-key rules run in one native pass per batch (native/policy.c); subclasses only name
    theirs."""

    variant: int  # native/policy.h: POLICY_ADAPTIVE, ...

    def __init__(self, rank: int, world_size: int, num_keys: int) -> None:
        super().__init__(rank, world_size, num_keys)
        self.words = mask_words(world_size)
        self.num_keys = num_keys
        self._intent = self._replicas = None
        self._own_word, self._own_bit = divmod(rank, 64)

    # The engine keeps the masks in its native directory, per active key (native/records.h);
    # these dense ones exist only where this class's own methods are used, as the reference
    # the tests hold the native decisions against (and are made on first use).

    @property
    def intent(self) -> np.ndarray:
        if self._intent is None:
            self._intent = np.zeros((self.num_keys, self.words), dtype=np.uint64)
        return self._intent

    @property
    def replicas(self) -> np.ndarray:
        if self._replicas is None:
            self._replicas = np.zeros((self.num_keys, self.words), dtype=np.uint64)
        return self._replicas

    def on_intent(self, keys: np.ndarray, node: int, has_intent: np.ndarray) -> Actions:
        actions = Actions()
        if len(keys) == 0:
            return actions
        relocate_to = np.empty(len(keys), dtype=np.int64)
        setup = np.empty((len(keys), self.words), dtype=np.uint64)
        actions.dropped = _native.policy_decide(
            self.variant, self.rank, node, self.world_size, self.intent, self.replicas,
            np.ascontiguousarray(keys, dtype=np.int64),
            np.ascontiguousarray(has_intent, dtype=bool).view(np.uint8), relocate_to, setup)
        moving = np.flatnonzero(relocate_to >= 0)
        if len(moving):
            for dst, positions in group_by_node(relocate_to[moving]):
                actions.relocate.append((dst, keys[moving[positions]]))
        if setup.any():
            # (key, node) pairs from the set bits; one pass, whatever the number of nodes
            bits = np.unpackbits(setup.astype("<u8").view(np.uint8), axis=1, bitorder="little")
            index, nodes = np.nonzero(bits)
            for dst, positions in group_by_node(nodes):
                actions.setup.append((dst, keys[index[positions]]))
        return actions

    def take(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The masks of ``keys``, flat (``words`` per key, as they travel), and forgets them.

        With :meth:`install`, the reference of what native/directory.c does to the masks when
        it relocates keys (tests/test_directory.py)."""
        s, r = self.intent[keys].reshape(-1), self.replicas[keys].reshape(-1)
        self.intent[keys] = 0
        self.replicas[keys] = 0
        return s, r

    def install(self, keys: np.ndarray, intent: np.ndarray, replicas: np.ndarray) -> None:
        """Masks of keys relocated here (flat, as :meth:`take` gives them). The new owner never
        holds a replica of its own keys."""
        self.intent[keys] = intent.reshape(len(keys), self.words)
        held = replicas.reshape(len(keys), self.words).copy()
        held[:, self._own_word] &= ~np.uint64(1 << self._own_bit)
        self.replicas[keys] = held


class Adaptive(_MaskPolicy):
    """S = {r}, r != owner: relocate to r; |S| >= 2: a replica at every other node in S."""

    name = "adaptive"
    variant = 0


class ReplicationOnly(_MaskPolicy):
    """Never relocates: a replica at every non-owner with intent."""

    name = "replication_only"
    variant = 1


class RelocationOnly(_MaskPolicy):
    """Relocates to every node that newly signals intent (the latest wins, as in Lapse)."""

    name = "relocation_only"
    variant = 2


POLICIES = {"adaptive": Adaptive, "relocation_only": RelocationOnly,
            "replication_only": ReplicationOnly, "static_partition": StaticPartition,
            "full_replication": FullReplication}


def make_policy(management: str, rank: int, world_size: int, num_keys: int) -> Policy:
    """The policy object of ``Config.management`` for one node."""
    return POLICIES[management](rank, world_size, num_keys)

