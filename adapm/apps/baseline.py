"""The single-node baseline: the apps' kernels over a plain shared float32 array, no PM.

``--baseline`` runs the same kernels, data order and threads as a PM run, in one process, with
every parameter in one array that all worker threads read and write directly (Hogwild: reads
take no lock; adds to a row are serialised, so no update is lost, as in the PM's store). This is
the paper's "efficient single-node" reference, against which a distributed run is measured.

``ArrayNode`` and ``ArrayWorker`` offer the part of ``adapm.Node`` / ``adapm.Worker`` that the
apps' runner uses, so the runner has one code path. Intent is a no-op here.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .._native_loader import load as _load
from .._sampler import samples_out
from ..errors import InvalidArgument
from ..sampling import Sampling

_kernels = _load("adapm._kernels")


class ArrayNode:
    """One process holding every key in one shared array. Thread safety as ``adapm.Node``."""

    rank = 0
    world_size = 1

    def __init__(self, num_keys: int, value_length, sampling: Optional[Sampling],
                 seed: int = 0) -> None:
        if isinstance(value_length, (int, np.integer)):
            self.uniform_length = int(value_length)
            lens = np.full(num_keys, self.uniform_length, dtype=np.int64)
        else:
            self.uniform_length = 0
            lens = np.ascontiguousarray(value_length, dtype=np.int64)
        if sampling is not None and not sampling.replacement:
            raise InvalidArgument("sampling: the baseline draws with replacement only")
        self.num_keys = num_keys
        self.lens = lens
        self.offsets = np.cumsum(lens) - lens
        self.data = np.zeros(int(lens.sum()), dtype=np.float32)
        self.sampling = sampling
        self._seed = seed
        self._workers: list[ArrayWorker] = []

    def worker(self) -> "ArrayWorker":
        handle = ArrayWorker(self, len(self._workers))
        self._workers.append(handle)
        return handle

    def local_keys(self) -> np.ndarray:
        return np.arange(self.num_keys, dtype=np.int64)

    def barrier(self, timeout_s: Optional[float] = None) -> None:
        pass

    def trace_mark(self, label: str) -> None:
        pass  # no parameter manager, nothing to trace

    def stats(self) -> dict:
        totals = dict.fromkeys(ArrayWorker.COUNTERS, 0)
        for handle in self._workers:
            for name, value in handle.counters.items():
                totals[name] += value
        return totals

    def shutdown(self) -> None:
        pass


class ArrayWorker:
    """A worker thread's handle on an :class:`ArrayNode`: pull, push, set, sampling, clocks."""

    COUNTERS = ("local_pull_keys", "local_push_keys", "sampled_keys")

    def __init__(self, node: ArrayNode, index: int) -> None:
        self._node = node
        self.index = index
        self.clock = 0
        self.counters = dict.fromkeys(self.COUNTERS, 0)
        self._rng = np.random.default_rng([node._seed, 0, index])
        self._prepared: dict[int, int] = {}
        self._next_handle = 0

    def pull(self, keys: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Rows of ``keys`` (int64), packed; shape (n, L) for one length L. GIL released."""
        node = self._node
        keys = self._keys(keys)
        if out is None:
            shape = (len(keys), node.uniform_length) if node.uniform_length else \
                (int(node.lens[keys].sum()),)
            out = np.empty(shape, dtype=np.float32)
        _kernels.table_gather(node.data, node.offsets, node.lens, keys, out)
        self.counters["local_pull_keys"] += len(keys)
        return out

    def push(self, keys: np.ndarray, updates: np.ndarray) -> None:
        """Adds ``updates`` (packed rows) to the rows of ``keys``; duplicates add up."""
        node = self._node
        keys = self._keys(keys)
        _kernels.table_scatter_add(node.data, node.offsets, node.lens, keys, updates)
        self.counters["local_push_keys"] += len(keys)

    def set(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Overwrites the rows of ``keys`` (not on a hot path: initialisation only)."""
        node = self._node
        keys = self._keys(keys)
        flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        if node.uniform_length:
            node.data.reshape(-1, node.uniform_length)[keys] = flat.reshape(len(keys), -1)
        else:
            lens = node.lens[keys]
            starts = node.offsets[keys]
            index = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(lens.sum())
            node.data[index] = flat

    def table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(data, key_offset, key_len): the shared array and its layout, for a trainer whose
        native loop pulls and pushes by itself (``Trainer.chunked``: the table_gather /
        table_scatter_add of pull and push inside one call); it reports what it accessed with
        :meth:`count_accesses`."""
        node = self._node
        return node.data, node.offsets, node.lens

    def count_accesses(self, pulled: int, pushed: int) -> None:
        """Counts keys pulled and pushed through :meth:`table`'s arrays, as pull and push do."""
        self.counters["local_pull_keys"] += pulled
        self.counters["local_push_keys"] += pushed

    def intent(self, keys, start: int, end: Optional[int] = None) -> None:
        """Nothing to do: every key is local."""

    def advance_clock(self) -> int:
        self.clock += 1
        return self.clock

    def wait(self, timeout_s: Optional[float] = None) -> None:
        pass

    def wait_sync(self, timeout_s: Optional[float] = None) -> None:
        pass

    def prepare_sample(self, n: int, start: int, end: Optional[int] = None) -> int:
        handle = self._next_handle
        self._next_handle += 1
        self._prepared[handle] = int(n)
        return handle

    def pull_sample(self, handle: int, out: Optional[np.ndarray] = None):
        """Draws from the whole domain (every key is local), as the ``local`` scheme does."""
        n = self._prepared.pop(handle)
        keys = self._node.sampling.draw(self._rng, n)
        self.counters["sampled_keys"] += n
        return keys, self.pull(keys, out)

    def sample_keys(self, n: int, count: int = 1, out: Optional[np.ndarray] = None
                    ) -> np.ndarray:
        """The keys of ``count`` successive samples of ``n`` keys each, without their values,
        for a native loop that reads the rows itself (:meth:`table`): those that ``count``
        prepare_sample + pull_sample pairs, one after the other, would draw (the same stream,
        in the same order). int64, ``count * n`` keys sample after sample, in ``out`` when
        given (int64, C-contiguous, writable, that long). One draw per sample; counted as
        ``sampled_keys`` (the loop counts its reads with :meth:`count_accesses`)."""
        n, count = int(n), int(count)
        total = n * count
        out = samples_out(out, n, count)
        draw, rng = self._node.sampling.draw, self._rng
        for i in range(count):
            out[i * n:(i + 1) * n] = draw(rng, n)
        self.counters["sampled_keys"] += total
        return out

    def _keys(self, keys) -> np.ndarray:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if keys.ndim != 1:
            raise InvalidArgument(f"keys must be 1-d, got shape {keys.shape}")
        return keys
