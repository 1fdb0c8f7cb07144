"""Where keys live: home nodes, and vectorised grouping of a batch by destination node."""

from __future__ import annotations

import numpy as np


def home_of(keys: np.ndarray, world_size: int) -> np.ndarray:
    """Home node of each key: ``k % world_size``. The home always knows a key's owner."""
    return keys % world_size


def home_keys(rank: int, num_keys: int, world_size: int) -> np.ndarray:
    """All keys whose home is ``rank``."""
    return np.arange(rank, num_keys, world_size, dtype=np.int64)


def group_by_node(nodes: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Split positions 0..len(nodes)-1 by destination: [(node, positions in request order)].

    One stable sort of the batch; the Python loop runs over distinct nodes only.
    """
    if len(nodes) == 0:
        return []
    first = nodes[0]
    if (nodes == first).all():  # one destination: the usual case for small batches
        return [(int(first), np.arange(len(nodes), dtype=np.int64))]
    order = np.argsort(nodes, kind="stable")
    ordered = nodes[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(nodes)]))
    return [(int(ordered[s]), order[s:e]) for s, e in zip(starts, ends)]


def segment_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Flat indices of the segments [starts[i], starts[i] + lengths[i]), concatenated.

    Used to pick or place variable-length values of some positions of a packed batch.
    """
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    seg_begin = np.cumsum(lengths) - lengths  # where each segment begins in the output
    return np.repeat(starts - seg_begin, lengths) + np.arange(total, dtype=np.int64)


class Router:
    """Routing state of one node: where it believes keys are, where it sent keys, and, for keys
    homed here, who owns them now, as dense numpy arrays.

    The engine keeps this state in its native directory instead (``_native.Directory``: the
    home table dense, the rest per active key, native/records.h); this class is the reference
    semantics the tests hold it against (tests/test_directory.py).

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
