"""Numpy references of what the engine does natively, for the tests to hold it against.

- :class:`Router`: routing (hints, forward pointers, ownership epochs, the home table) as dense
  arrays; the engine keeps it in its native directory (native/directory.h, records.h).
- :class:`DensePolicy`: an owner's per-key intent and replica masks (S and R) as dense arrays,
  deciding through the same native per-key rules (``_native.policy_decide``, native/policy.c)
  that the directory runs on its records; :meth:`~DensePolicy.take` and
  :meth:`~DensePolicy.install` say what happens to the masks of a relocated key.

Nothing in the package uses them (they were the engine before it went native).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from adapm._engine.policy import make_policy
from adapm._engine.routing import group_by_node, home_of
from adapm._native_loader import load as _load_native

_native = _load_native()


def mask_words(world_size: int) -> int:
    """uint64 words per key of an intent or replica mask over ``world_size`` ranks."""
    return (world_size + 63) // 64


@dataclass
class Actions:
    """What the owner must do after a batch of events."""

    relocate: list = field(default_factory=list)  # [(dst rank, keys)]
    setup: list = field(default_factory=list)  # [(dst rank, keys)]: send a replica to dst
    dropped: int = 0  # replicas removed from R (the holders already dropped them)

    def __bool__(self) -> bool:
        return bool(self.relocate or self.setup or self.dropped)


class DensePolicy:
    """The masks of one owner under a management variant that keeps them (``adaptive``,
    ``replication_only``, ``relocation_only``): ``intent[k]`` (S) and ``replicas[k]`` (R),
    :func:`mask_words` words per key, rank r being bit r % 64 of word r // 64."""

    def __init__(self, management: str, rank: int, world_size: int, num_keys: int) -> None:
        variant = make_policy(management).variant
        if variant < 0:
            raise ValueError(f"{management} keeps no masks")
        self.variant = variant
        self.rank = rank
        self.world_size = world_size
        self.words = mask_words(world_size)
        self.num_keys = num_keys
        self.intent = np.zeros((num_keys, self.words), dtype=np.uint64)
        self.replicas = np.zeros((num_keys, self.words), dtype=np.uint64)
        self._own_word, self._own_bit = divmod(rank, 64)

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



class Router:
    """Routing state of one node: where it believes keys are, where it sent keys, and, for keys
    homed here, who owns them now, as dense numpy arrays.

    The engine keeps this state in its native directory (``_native.Directory``: the home table
    dense, the rest per active key, native/records.h); this class is the reference semantics
    the tests hold it against (tests/test_directory.py).

    - ``hint[k]``: the rank we believe owns k (a guess, corrected by every answer; a wrong guess
      costs a forward, never correctness);
    - ``forward[k]``: where this node last sent k (relocation), -1 if it never had it;
    - ``epoch[k]``: ownership epoch of k while owned here (counts relocations; moves with k);
    - the home table: for keys homed here (``k % world_size == rank``), the owner the home was
      last told of and its epoch, indexed by ``k // world_size`` (dense over the home partition
      only).

    Forward pointers always point to a newer owner, so following them cannot loop; at the home,
    the newest epoch wins (updates from old and new owners may cross).

    Not thread-safe: the engine thread writes; other threads may read ``hint`` (a racing read
    only costs a forward).
    """

    def __init__(self, rank: int, world_size: int, num_keys: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.hint = home_of(np.arange(num_keys, dtype=np.int64), world_size).astype(np.int32)
        self.forward = np.full(num_keys, -1, dtype=np.int32)
        self.epoch = np.zeros(num_keys, dtype=np.int64)
        num_home = len(range(rank, num_keys, world_size))
        self.home_owner = np.full(num_home, rank, dtype=np.int32)
        self.home_epoch = np.zeros(num_home, dtype=np.int64)

    def is_home(self, keys: np.ndarray) -> np.ndarray:
        return home_of(keys, self.world_size) == self.rank

    def owner_at_home(self, keys: np.ndarray) -> np.ndarray:
        """The owner the home table names for ``keys`` (all homed here)."""
        return self.home_owner[keys // self.world_size]

    def next_hop(self, keys: np.ndarray) -> np.ndarray:
        """Where to pass requests for ``keys``, which are not owned here; -1: on its way here.

        Keys homed here go to the owner the home knows; others to where this node sent them.
        A node that never had a key (no forward pointer) and is not its home is asked for it
        only by someone who saw the key sent here: it is on its way.
        """
        nxt = self.forward[keys].astype(np.int64)
        at_home = self.is_home(keys)
        if at_home.any():
            nxt[at_home] = self.owner_at_home(keys[at_home])
        nxt[nxt == self.rank] = -1
        return nxt

    def first_hop(self, keys: np.ndarray) -> np.ndarray:
        """Where a request of this node's own goes first: the hint, unless it names this node
        (which does not own the keys): then :meth:`next_hop`."""
        dst = self.hint[keys].astype(np.int64)
        here = dst == self.rank
        if here.any():
            dst[here] = self.next_hop(keys[here])
        return dst

    def learn(self, keys: np.ndarray, rank: int, owned_here: np.ndarray) -> None:
        """``rank`` answered for ``keys``: point the hint there, except for keys owned here.

        An owner may relocate a key to us right after answering for it, and the relocation
        arrives first (it is sent first): the answer must not point the hint away again
        (bench/adaptive.py: ~22k intent reports per node were forwarded home that way).
        """
        self.hint[keys[~owned_here]] = rank

    def moved_out(self, keys: np.ndarray, dst: int) -> np.ndarray:
        """Keys leave for ``dst``; returns their new epochs (the receiver installs them).

        With :meth:`moved_in`, the reference semantics of the relocations in
        native/directory.c, which the engine runs (tests/test_directory.py holds one against
        the other)."""
        epochs = self.epoch[keys] + 1
        self.epoch[keys] = 0  # kept only while owned here
        self.forward[keys] = dst
        self.hint[keys] = dst
        return epochs

    def moved_in(self, keys: np.ndarray, epochs: np.ndarray) -> None:
        self.epoch[keys] = epochs
        self.hint[keys] = self.rank
        at_home = self.is_home(keys)
        if at_home.any():
            self.update_home(keys[at_home], np.full(int(at_home.sum()), self.rank), epochs[at_home])

    def update_home(self, keys: np.ndarray, owners: np.ndarray, epochs: np.ndarray) -> None:
        """Home bookkeeping for keys homed here: keep the owner with the newest epoch."""
        if len(keys) > 1:  # merged updates may name a key twice: the newest must win
            order = np.argsort(epochs, kind="stable")
            keys, owners, epochs = keys[order], owners[order], epochs[order]
        index = keys // self.world_size
        newer = epochs > self.home_epoch[index]
        self.home_owner[index[newer]] = owners[newer]
        self.home_epoch[index[newer]] = epochs[newer]
