"""A store holding given rows, and a worker over it whose other keys are "elsewhere", for the
tests of the native training loops over a node's store (test_mf_kernel, test_kge_chunked,
test_wv_chunked)."""

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


class SplitWorker:
    """A worker of a node whose store holds some keys, the rest "elsewhere" (a plain array of
    rows that pull and push route to), drawing its samples from its own stream (naive draws
    from ``sampling``): what a PM worker does for keys held on another node, without the other
    node. ``accessed``: keys pulled and pushed, natively or not."""

    acts_on_intent = False

    def __init__(self, store: Store, elsewhere: np.ndarray, sampling, seed: int) -> None:
        self.store, self.elsewhere = store, elsewhere
        self.sampling, self.rng = sampling, np.random.default_rng(seed)
        self.accessed = [0, 0]
        self.prepared: dict = {}

    def native_rows(self):
        return self.store.native.rows()

    def count_accesses(self, pulled: int, pushed: int) -> None:
        self.accessed[0] += pulled
        self.accessed[1] += pushed

    def sample_keys(self, n, count=1, out=None):
        keys = np.concatenate([self.sampling.draw(self.rng, n) for _ in range(count)])
        if out is None:
            return keys
        out[:] = keys
        return out

    def prepare_sample(self, n, start):
        self.prepared[len(self.prepared)] = self.sampling.draw(self.rng, n)
        return len(self.prepared) - 1

    def pull_sample(self, handle, out=None):
        keys = self.prepared.pop(handle)
        return keys, self.pull(keys, out)

    def pull(self, keys, out=None):
        if out is None:
            out = np.empty((len(keys), self.elsewhere.shape[1]), np.float32)
        missing = np.empty(len(keys), np.int64)
        pos = missing[:self.store.gather(keys, out, missing)]
        out[pos] = self.elsewhere[keys[pos]]
        self.accessed[0] += len(keys)
        return out

    def push(self, keys, updates):
        updates = updates.reshape(len(keys), -1)
        missing = np.empty(len(keys), np.int64)
        pos = missing[:self.store.scatter_add(keys, updates, missing)]
        np.add.at(self.elsewhere, keys[pos], updates[pos])
        self.accessed[1] += len(keys)
