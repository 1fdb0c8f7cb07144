"""A store holding given rows, for the tests of the native training loops over a node's store
(test_mf_kernel, test_kge_chunked)."""

from __future__ import annotations

import numpy as np

from adapm import Config
from adapm._store import OWNER, Store


def store_with(data: np.ndarray, width: int, held: np.ndarray) -> Store:
    """A rank-0 store of a 2-node job holding the keys ``held`` (owner copies) with the rows of
    ``data``, through its public insert."""
    nkeys = len(data) // width
    store = Store(Config(num_keys=nkeys, value_length=width, rank=0, world_size=2,
                         rendezvous="127.0.0.1:1"))
    store.insert(held, OWNER, data.reshape(nkeys, width)[held].reshape(-1),
                 np.zeros(len(held), np.int64))
    return store
