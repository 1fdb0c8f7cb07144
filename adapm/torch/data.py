"""Intent from the data loader: keys computed where a batch is built, signalled before it is trained.

Two wrappers around an ordinary ``torch.utils.data.DataLoader``:

- :class:`IntentCollate` wraps its ``collate_fn``. It runs wherever the loader builds batches, in
  the training process or in the loader's worker processes (``num_workers > 0``), and returns a
  :class:`KeyedBatch`: the batch and the distinct keys it will access. It touches no node:
  loader workers never open a socket, and a node started before they fork stays intact (the
  child only inherits memory; it runs none of the node's threads and uses none of its sockets).
- :class:`IntentLoader` wraps the loader in the training process. It keeps ``ahead`` batches
  ready beyond the one being trained, signals ``worker.intent(keys, c, c + 1)`` for the batch
  that will be trained at clock ``c`` as soon as that batch is fetched, yields the plain batches,
  and advances the worker's clock as they are consumed.
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import default_collate

from .._store import _native
from ..errors import InvalidArgument, InvalidType, StateError


class KeyedBatch(NamedTuple):
    """What :class:`IntentCollate` returns: the collated batch and its keys (distinct int64, in
    order of first appearance). A named tuple, so that it pickles between processes and ``pin_memory`` keeps it."""

    batch: Any
    keys: np.ndarray


def distinct(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct keys in order of first appearance, each position's index among them) of a 1-d
    int64 array: one native O(n) pass (a sort-based ``np.unique`` or ``torch.unique`` of a
    batch's 13k indices costs 20x more, a tenth of a CTR step)."""
    flat = np.ascontiguousarray(flat, dtype=np.int64)
    unique = np.empty_like(flat)
    inverse = np.empty_like(flat)
    count = _native.unique_inverse(flat, unique, inverse)
    return unique[:count], inverse


def as_key_array(keys, what: str) -> np.ndarray:
    """Distinct int64 keys (in order of first appearance) of a tensor, array or sequence of
    integers of any shape."""
    if isinstance(keys, torch.Tensor):
        if keys.dtype.is_floating_point or keys.dtype.is_complex or keys.dtype == torch.bool:
            raise InvalidType(f"{what}: keys must be integers, got a tensor of {keys.dtype}")
        keys = keys.detach().cpu().numpy()
    arr = np.asarray(keys)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise InvalidType(f"{what}: keys must be integers, got dtype {arr.dtype}")
    return distinct(arr.astype(np.int64, copy=False).reshape(-1))[0]


def jagged_keys(features, offsets) -> np.ndarray:
    """The distinct adapm keys of a TorchRec ``KeyedJaggedTensor`` (duck-typed: ``keys()`` and
    ``features[name].values()``): each feature's indices plus its table's first key,
    ``offsets[name]`` (``EmbeddingBagCollection.offsets``). Features without an offset are
    left out. Pure (no node): for a ``keys_fn`` of :class:`IntentCollate`, e.g.
    ``functools.partial(keys_of, offsets=collection.offsets)`` with ``keys_of(batch, offsets)``
    returning ``jagged_keys(batch["sparse"], offsets)``."""
    if not (callable(getattr(features, "keys", None)) and hasattr(features, "__getitem__")):
        raise InvalidType(f"jagged_keys: features must be a KeyedJaggedTensor, got "
                          f"{type(features).__name__}")
    parts = []
    for name in features.keys():
        if name in offsets:
            values = features[name].values()
            parts.append(as_key_array(values, f"jagged_keys: feature {name!r}") + offsets[name])
    if not parts:
        return np.empty(0, dtype=np.int64)
    return distinct(np.concatenate(parts))[0]


class IntentCollate:
    """``collate_fn`` wrapper: ``IntentCollate(collate_fn, keys_fn)(samples)`` returns
    ``KeyedBatch(collate_fn(samples), keys)`` with ``keys`` the distinct keys of
    ``keys_fn(batch)`` (a tensor, array or sequence of integers of any shape).

    ``collate_fn`` None means torch's ``default_collate``. Pure: it never touches a node, so it
    may run in loader worker processes. With the ``spawn`` start method both functions must be
    picklable (module-level functions, not lambdas), as for any ``collate_fn``; and with
    ``num_workers > 0`` the batches must pickle too (a class defined in ``__main__`` may not):
    torch's loader only prints a batch that fails to pickle and then waits for it forever,
    unless the DataLoader has a ``timeout``.
    """

    def __init__(self, collate_fn: Callable | None = None,
                 keys_fn: Callable | None = None) -> None:
        if keys_fn is None or not callable(keys_fn):
            raise InvalidArgument("IntentCollate: keys_fn must be a callable batch -> keys")
        if collate_fn is not None and not callable(collate_fn):
            raise InvalidArgument("IntentCollate: collate_fn must be callable or None")
        self.collate_fn = collate_fn if collate_fn is not None else default_collate
        self.keys_fn = keys_fn

    def __call__(self, samples) -> KeyedBatch:
        batch = self.collate_fn(samples)
        return KeyedBatch(batch, as_key_array(self.keys_fn(batch), "IntentCollate keys_fn"))


class IntentLoader:
    """Loader wrapper in the training process: yields the batches of ``loader`` (built with
    ``collate_fn=IntentCollate(...)``) and signals each batch's keys as intent of ``worker``
    for the clock at which it is trained.

    The batch yielded when ``worker.clock == c`` is trained at clock ``c``; asking for the next
    batch means the previous one is done, so the clock advances by one per batch. Up to
    ``ahead`` batches beyond the current one are fetched early and their intent signalled then:
    ``ahead`` batches of lead in which the manager relocates or replicates their keys. The first
    batch of an iteration has no lead: before yielding it, the loader waits until its keys are
    local (``worker.wait_sync()``, a sync round, once per iteration). When an
    iteration ends early (``break``, an exception, the iterator dropped), the clock moves past
    the batches fetched but not trained, so no intent of this iteration outlives it.

    Each ``iter()`` is one epoch, starting at the worker's current clock. The loader owns the
    clock of ``worker`` while it iterates: do not advance it yourself meanwhile, and do not
    iterate two loaders over one worker at the same time (give each its own ``node.worker()``).
    Not thread-safe, like the worker.

    ``mark_epochs`` (default True): each iteration is marked in the node's trace (when it
    records one) as an epoch, ``"epoch N start"`` / ``"epoch N end"`` with N the epoch after the
    highest one marked on the node so far (whichever loader iterates), so that ``adapm trace
    summary --per-epoch`` and the plots split by epoch. An iteration inside an epoch that the
    script marked itself (``node.trace_mark("epoch 3 start")``) is not marked again.
    """

    def __init__(self, loader, worker, ahead: int = 4, mark_epochs: bool = True) -> None:
        if worker is None:
            raise InvalidArgument("IntentLoader needs a worker: IntentLoader(loader, "
                                  "node.worker(), ahead=...) with a node from adapm.init()")
        for attr in ("intent", "advance_clock", "clock", "wait_sync"):
            if not hasattr(worker, attr):
                raise InvalidType(f"IntentLoader: worker must be an adapm Worker "
                                  f"(node.worker()), got {type(worker).__name__}")
        try:
            ahead = operator.index(ahead)
        except TypeError:
            raise InvalidType(f"IntentLoader: ahead must be an int, got {ahead!r}") from None
        if ahead < 1:
            raise InvalidArgument(f"IntentLoader: ahead must be >= 1 batch, got {ahead}")
        _check_sampler(loader, getattr(worker, "node", None))
        self.loader = loader
        self.worker = worker
        self.ahead = ahead
        self.mark_epochs = bool(mark_epochs)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        worker, ahead = self.worker, self.ahead
        source = iter(self.loader)
        ready: collections.deque = collections.deque()
        next_clock = worker.clock  # the clock of the next batch fetched
        exhausted = False
        first = True
        node = getattr(worker, "node", None) if self.mark_epochs else None
        if node is not None:
            # unnumbered: the trace numbers it, or leaves it out inside the script's own epoch
            node.trace_mark("epoch start")
        try:
            while True:
                while not exhausted and len(ready) <= ahead:
                    try:
                        item = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    if not isinstance(item, KeyedBatch):
                        raise InvalidType(
                            "IntentLoader: the loader's batches carry no keys; build the "
                            "DataLoader with collate_fn=adapm.torch.IntentCollate(collate_fn, "
                            f"keys_fn) (got a batch of type {type(item).__name__})")
                    try:
                        worker.intent(item.keys, next_clock, next_clock + 1)
                    except InvalidArgument as exc:
                        raise InvalidArgument(
                            f"IntentLoader: the keys IntentCollate's keys_fn gave for a batch: "
                            f"{exc} (a table's keys are its offset plus the row index: "
                            "table.offset + indices for each table)") from exc
                    next_clock += 1
                    ready.append(item.batch)
                if not ready:
                    return
                if first:
                    # The first batch has no lead: wait (one sync round, once per iteration)
                    # until its rows are local rather than pull them remotely.
                    worker.wait_sync()
                    first = False
                batch = ready.popleft()
                yield batch
                worker.advance_clock()
        finally:
            # Ended early: the yielded batch counts as trained; the fetched ones never will be.
            try:
                while worker.clock < next_clock:
                    worker.advance_clock()
            except StateError:  # the node was shut down meanwhile: no clock to keep
                pass
            del source  # a multi-process loader iterator shuts its workers down
            if node is not None:
                node.trace_mark("epoch end")


def _check_sampler(loader, node) -> None:
    """A DistributedSampler must shard by the node's ranks: one built for another world (a torch
    process group of other ranks, say) would train some examples twice and others never."""
    sampler = getattr(loader, "sampler", None)
    if node is None or not isinstance(sampler, torch.utils.data.DistributedSampler):
        return
    if (sampler.num_replicas, sampler.rank) != (node.world_size, node.rank):
        raise InvalidArgument(
            f"IntentLoader: the loader's DistributedSampler shards for rank {sampler.rank} of "
            f"{sampler.num_replicas}, the adapm node is rank {node.rank} of {node.world_size}; "
            "build it with DistributedSampler(dataset, num_replicas=node.world_size, "
            "rank=node.rank)")
