"""Where keys live: home nodes, and vectorised grouping of a batch by destination node.

The routing itself (location hints, forward pointers, ownership epochs, the home table) is the
native directory's (native/directory.h); its numpy reference is in tests/engine_reference.py.
"""

from __future__ import annotations

import numpy as np


def home_of(keys: np.ndarray, world_size: int) -> np.ndarray:
    """Home node of each key: ``k % world_size``. The home always knows a key's owner."""
    return keys % world_size


def channel_of(keys: np.ndarray, world_size: int, channels: int) -> np.ndarray:
    """Channel of each key on every node, ``(k // world_size) % channels``: a node's home keys
    (every world_size-th key) go round its channels one by one, so each channel holds an equal
    share of every node's keys (``Config.channels``; native/store.h's ``store_shard``)."""
    return (keys // world_size) % channels


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
