"""Embedding tables whose rows live in adapm: ``Embedding`` and ``EmbeddingBag``.

A table is a range of adapm keys, ``[offset, offset + num_embeddings)``; several tables share
one node's key space through their offsets. Each key's value is the row's ``embedding_dim``
weights, followed by room for optimizer state (AdaGrad keeps its accumulator there, as the
native apps do): a node for AdaGrad-trained tables has ``value_length = 2 * embedding_dim``.
Tables of different widths can share a node whose keys differ in length (``value_length`` an
array): each table's keys need one length of their own.

Forward pulls the batch's distinct rows (one ``pull`` per call, local when their intent was
signalled, see :class:`~adapm.torch.IntentLoader`) into a leaf tensor that requires grad, and
computes the output with torch's own ``F.embedding`` / ``F.embedding_bag`` on it; backward fills
that tensor's gradient; ``adapm.torch.optim`` pushes the sparse row updates. The module has no
``nn.Parameter`` (its rows are not in this process): give the embeddings to an adapm optimizer
and the rest of the model to a torch one.

Construction is collective when the node has several ranks: every rank constructs the same
tables in the same order, and the initial rows (written once, by the ranks in turn) are in
place on return (a barrier).

torch's habits hold:

- ``weight`` is a property: a pulled copy of the whole table (num_embeddings, embedding_dim) on
  the table's device; writing to it changes nothing in adapm (assigning it raises).
- ``state_dict()`` holds the table under ``"weight"``: the whole table, pulled (not collective,
  so ``torch.save(model.state_dict())`` on rank 0 works), up to ``full_state_limit`` bytes; a
  bigger table raises :class:`~adapm.CheckpointError` naming ``node.checkpoint`` and
  :func:`sharded_state_dict` rather than silently saving nothing. ``sharded_state_dict(model)``
  gives each rank's share of rows as a ``DTensor`` sharded by rows (``Shard(0)``), which
  ``torch.distributed.checkpoint`` (``dcp.save`` / ``dcp.load``) reshards at any world size.
- ``load_state_dict()`` takes either (a full tensor, or a DTensor) and is **collective** when
  the node has several ranks: every rank calls it with the same state (each writes its share
  of rows, then the ranks meet), at any world size. Optimizer state lives in the row after the
  weights and is loaded by the optimizer's ``load_state_dict``; loading the weights keeps it.
- The table has a device (``device=``, ``.to(device)``, ``.cuda()``, ``model.to(device)``): a
  forward pulls the rows into host memory (pinned when the device is CUDA) and copies them to
  the device asynchronously; the optimizer copies gradients back the same way. The rows stay
  float32 in adapm: ``to("meta")``, ``half()`` and other dtypes are refused with an error.
"""

from __future__ import annotations

import gc
import operator
import weakref

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import AdaPMTimeout, CheckpointError, InvalidArgument, InvalidType, StateError
from .data import distinct

# Rows of a table are initialised in chunks of this many keys, each from its own generator
# seeded by (seed, chunk): the values do not depend on the world size or on who writes them.
_INIT_CHUNK = 4096
_INITS = ("normal", "uniform", "zeros", "keep")

# Each node's live tables (weak: a table that is gone frees its keys), to refuse a table whose
# keys overlap another's in part (a forgotten offset re-initialised the other's rows).
_LIVE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

# Whole-table pulls (weight, state_dict, loads) go this many keys at a time, so that a big
# table needs no second full-size buffer of whole rows beside the result.
_GATHER_CHUNK = 65536


def _claim_keys(kind: str, node, offset: int, n: int) -> None:
    """Refuses keys [offset, offset + n) where they overlap a live table's keys on ``node`` in
    part. The very same range is another table over the same keys (a model built again: its
    rows start again), not a mistake."""
    for collected in (False, True):
        clash = next((other for other in (ref() for ref in _LIVE.get(node, ()))
                      if other is not None
                      and (other.offset, other.num_embeddings) != (offset, n)
                      and offset < other.offset + other.num_embeddings
                      and other.offset < offset + n), None)
        if clash is None:
            return
        if not collected:  # a table that is gone but for a reference cycle does not count
            gc.collect()
    raise InvalidArgument(
        f"{kind}: keys [{offset}, {offset + n}) overlap those of a live table on this node, "
        f"[{clash.offset}, {clash.offset + clash.num_embeddings}) ({type(clash).__name__}): "
        f"tables must not share keys (offset= places a table; a model built again needs the "
        f"old one gone first: del it and its optimizer)")


class _Table(nn.Module):
    """What Embedding and EmbeddingBag share: the key range, pulls, initialisation, and the rows
    pulled since the last optimizer step (``pending``). A forward in training mode with grad
    enabled keeps its rows until the optimizer's ``step`` (or its second ``zero_grad`` without
    a backward: see ``zero_grad``): evaluate under ``torch.no_grad()`` or ``model.eval()``."""

    def __init__(self, kind: str, num_embeddings: int, embedding_dim: int,
                 padding_idx: int | None, worker, offset: int, init: str, scale: float,
                 seed: int, dtype, device) -> None:
        super().__init__()
        self._kind = kind
        if worker is None or not hasattr(worker, "pull") or not hasattr(worker, "node"):
            raise InvalidArgument(f"{kind}: worker= must be an adapm worker handle "
                                  "(node.worker() of a node from adapm.init())")
        num_embeddings = _int(num_embeddings, f"{kind}: num_embeddings", low=1)
        embedding_dim = _int(embedding_dim, f"{kind}: embedding_dim", low=1)
        offset = _int(offset, f"{kind}: offset", low=0)
        node = worker.node
        store = node.store
        if offset + num_embeddings > store.num_keys:
            raise InvalidArgument(
                f"{kind}: keys [{offset}, {offset + num_embeddings}) do not fit the node's "
                f"{store.num_keys} keys (offset + num_embeddings <= num_keys)")
        if dtype not in (None, torch.float32):
            raise InvalidType(f"{kind}: adapm rows are float32, got dtype={dtype}")
        device = _device(kind, "device", torch.device("cpu") if device is None else device)
        if padding_idx is not None:
            padding_idx = _int(padding_idx, f"{kind}: padding_idx", low=-num_embeddings)
            if padding_idx >= num_embeddings:
                raise InvalidArgument(f"{kind}: padding_idx must be within num_embeddings")
            padding_idx %= num_embeddings
        if init not in _INITS:
            raise InvalidArgument(f"{kind}: init must be one of {_INITS}, got {init!r}")
        keys = np.arange(offset, offset + num_embeddings, dtype=np.int64)
        lengths = np.unique(store.lengths_of(keys))
        if len(lengths) != 1 or lengths[0] < embedding_dim:
            raise InvalidArgument(
                f"{kind}: every key of the table needs a value of at least embedding_dim = "
                f"{embedding_dim} floats; the node's keys [{offset}, {offset + num_embeddings}) "
                f"have {', '.join(map(str, lengths[:4]))} (adapm.init(value_length=...))")
        _claim_keys(kind, node, offset, num_embeddings)
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        self.offset = offset
        self.row_length = int(lengths[0])  # weights, then optimizer state
        # A node whose keys differ in length takes and gives values packed back to back.
        self._packed = not store.uniform_length
        self.worker = worker
        self.device = device
        self.pending: list[tuple[np.ndarray, np.ndarray, torch.Tensor]] = []
        self.spared: set = set()  # ids of pending entries a zero_grad kept (see zero_grad)
        self._mesh = None  # a DeviceMesh while sharded_state_dict() runs
        self._requires_grad = True  # requires_grad_(False) freezes the table
        self._init_rows(init, float(scale), _int(seed, f"{kind}: seed", low=0))
        live = _LIVE.setdefault(node, [])
        live[:] = [ref for ref in live if ref() is not None]
        live.append(weakref.ref(self))

    # --- rows --------------------------------------------------------------------------------

    def _init_rows(self, init: str, scale: float, seed: int) -> None:
        """Writes every row once over the cluster (chunk c by rank c % world_size): weights from
        ``init``, optimizer state zero, the padding row zero; then a barrier. ``"keep"`` writes
        nothing: the rows are what the node holds (restored from a checkpoint)."""
        node = self.worker.node
        n, dim, length = self.num_embeddings, self.embedding_dim, self.row_length
        chunks = range(0) if init == "keep" else range(node.rank, -(-n // _INIT_CHUNK),
                                                         node.world_size)
        for chunk in chunks:
            first = chunk * _INIT_CHUNK
            count = min(_INIT_CHUNK, n - first)
            rows = np.zeros((count, length), dtype=np.float32)
            rng = np.random.default_rng([seed, chunk])
            if init == "normal":
                rows[:, :dim] = rng.standard_normal((count, dim), dtype=np.float32) * scale
            elif init == "uniform":
                rows[:, :dim] = rng.uniform(-scale, scale, (count, dim)).astype(np.float32)
            if self.padding_idx is not None and first <= self.padding_idx < first + count:
                rows[self.padding_idx - first] = 0.0
            self.worker.set(np.arange(first, first + count, dtype=np.int64) + self.offset,
                            self.as_values(rows))
        self.worker.wait()
        if node.world_size > 1:
            # Named: a rank that builds its tables meets only ranks that build theirs.
            node.barrier(name=self._kind)
            # Replicas held here (intent signalled before construction) see the rows after a
            # sync round that starts now, when every rank's writes are in the main copies.
            self.worker.wait_sync()

    def _pull_rows(self, indices: torch.Tensor, what: str):
        """Distinct rows of ``indices``: (inverse indices into them, leaf weights tensor on the
        table's device, position of the padding row among them or None).

        The rows are pulled into host memory (pinned for a CUDA device, so that the copy to the
        device is asynchronous) and their weights copied once to the device: the same code on
        every device, where on the CPU the "copy" is the host tensor itself."""
        if not isinstance(indices, torch.Tensor):
            raise InvalidType(f"{self._kind}: {what} must be a tensor of indices, got "
                              f"{type(indices).__name__}")
        if indices.dtype not in (torch.int64, torch.int32):
            raise InvalidType(f"{self._kind}: {what} must be an integer tensor (torch.long or "
                              f"torch.int), got {indices.dtype}")
        unique, inverse = distinct(indices.detach().cpu().reshape(-1).numpy())
        if len(unique) and (unique.min() < 0 or unique.max() >= self.num_embeddings):
            bad = int(unique.min() if unique.min() < 0 else unique.max())
            raise InvalidArgument(f"{self._kind}: {what} holds index {bad}, outside "
                                  f"[0, {self.num_embeddings})")
        keys = unique + self.offset
        host = self._pull_host(keys)
        weights = host[:, :self.embedding_dim]
        if self.row_length != self.embedding_dim:
            # The weights alone, contiguous (and pinned for CUDA): a strided source would make
            # torch stage the copy to the device through pageable memory, synchronously.
            weights = torch.empty(weights.shape, dtype=torch.float32,
                                  pin_memory=host.is_pinned()).copy_(weights)
        weights = weights.to(self.device, non_blocking=True)  # the CPU: the tensor itself
        weights.requires_grad_(self._requires_grad and self.training and
                               torch.is_grad_enabled())
        if weights.requires_grad:
            # The host rows stay referenced until the step (the optimizer's "rows as pulled").
            self.pending.append((keys, host.numpy(), weights))
        pad = None
        if self.padding_idx is not None:
            at = np.flatnonzero(unique == self.padding_idx)
            pad = int(at[0]) if len(at) else None
        inverse = torch.from_numpy(inverse).reshape(indices.shape).to(self.device,
                                                                      non_blocking=True)
        return inverse, weights, pad

    def _pull_host(self, keys: np.ndarray) -> torch.Tensor:
        """Whole rows of ``keys`` (len(keys), row_length), pulled straight into host memory that
        is pinned when the table's device is CUDA (torch's caching host allocator reuses it and
        keeps it until copies from it are done)."""
        size = len(keys) * self.row_length
        buf = torch.empty(size if self._packed else (len(keys), self.row_length),
                          dtype=torch.float32, pin_memory=self.device.type == "cuda")
        self.worker.pull(keys, out=buf.numpy())
        return buf.reshape(len(keys), self.row_length)

    # --- the whole table: weight, state_dict, load_state_dict ----------------------------------

    #: Largest table (bytes of the part pulled, float32) that ``weight`` and a full
    #: ``state_dict()`` pull into one process; a bigger one raises CheckpointError naming
    #: ``node.checkpoint`` and ``sharded_state_dict``. Set it on the class or on one table.
    full_state_limit = 1 << 30

    @property
    def weight(self) -> torch.Tensor:
        """The whole table's current weights (num_embeddings, embedding_dim), pulled, on the
        table's device: a copy for evaluation and export (writing to it changes nothing in
        adapm; use ``load_state_dict({"weight": ...})`` to write rows). Blocking; pulls every
        row (remote ones from their nodes): up to ``full_state_limit`` bytes."""
        return self._gather(0, self.embedding_dim, "weight").to(self.device)

    @weight.setter
    def weight(self, value) -> None:
        raise StateError(f"{self._kind}: weight is a pulled copy of rows that live in adapm; "
                         "write rows with load_state_dict({'weight': tensor}) (collective)")

    def _gather(self, first: int, stop: int, what: str, shift: float = 0.0) -> torch.Tensor:
        """Columns [first, stop) of every row, pulled into one CPU tensor (plus ``shift``)."""
        n = self.num_embeddings
        size = n * (stop - first) * 4
        if size > self.full_state_limit:
            raise CheckpointError(
                f"{self._kind} at keys from {self.offset}: its {what} ({size / 2**30:.2f} GiB) is "
                f"more than full_state_limit ({self.full_state_limit / 2**30:.2f} GiB) allows "
                "to pull into one process; save the table with node.checkpoint(path) (collective, "
                "restores on any world size), or with dcp.save(adapm.torch.sharded_state_dict("
                "model), ...) (each rank its share), or raise full_state_limit")
        out = torch.empty((n, stop - first), dtype=torch.float32)
        for at in range(0, n, _GATHER_CHUNK):
            keys = np.arange(at, min(n, at + _GATHER_CHUNK), dtype=np.int64) + self.offset
            out[at:at + len(keys)] = self._pull_host(keys)[:, first:stop]
        if shift:
            out += shift
        return out

    def _share(self, rank: int, world: int) -> tuple[int, int]:
        """Rows [start, stop) of ``rank`` in torch's ``Shard(0)`` layout (``torch.chunk``: pieces
        of ceil(n / world) rows, the last ones shorter or empty)."""
        piece = -(-self.num_embeddings // world)
        return (min(self.num_embeddings, rank * piece),
                min(self.num_embeddings, (rank + 1) * piece))

    def _export(self, first: int, stop: int, what: str, shift: float = 0.0):
        """Columns [first, stop) of the table for a state dict: the whole table (a CPU tensor),
        or, inside :func:`sharded_state_dict`, this rank's share as a DTensor."""
        if self._mesh is None:
            return self._gather(first, stop, what, shift)
        from torch.distributed.tensor import DTensor, Shard

        node = self.worker.node
        start, end = self._share(node.rank, node.world_size)
        local = torch.empty((end - start, stop - first), dtype=torch.float32)
        for at in range(start, end, _GATHER_CHUNK):
            keys = np.arange(at, min(end, at + _GATHER_CHUNK), dtype=np.int64) + self.offset
            local[at - start:at - start + len(keys)] = self._pull_host(keys)[:, first:stop]
        if shift:
            local += shift
        return DTensor.from_local(local, self._mesh, [Shard(0)], run_check=False,
                                  shape=torch.Size((self.num_embeddings, stop - first)),
                                  stride=(stop - first, 1))

    def _import(self, value, first: int, stop: int, what: str, shift: float = 0.0) -> None:
        """Writes ``value`` (the whole table, or a DTensor of :meth:`_export`'s layout) into
        columns [first, stop) of every row, less ``shift``; the rest of each row is kept.
        Collective: each rank writes its share of the rows, then the ranks meet."""
        node = self.worker.node
        start, end = self._share(node.rank, node.world_size)
        shape = (self.num_embeddings, stop - first)
        if not isinstance(value, torch.Tensor):
            raise InvalidType(f"{self._kind}: {what} must be a tensor of shape {shape}, got "
                              f"{type(value).__name__}")
        if tuple(value.shape) != shape:
            raise InvalidArgument(f"{self._kind} at keys from {self.offset}: {what} has shape "
                                  f"{tuple(value.shape)}, the table needs {shape}")
        if not value.dtype.is_floating_point:
            raise InvalidType(f"{self._kind}: {what} must be floating point, got {value.dtype}")
        if value.device.type == "meta":
            raise InvalidArgument(f"{self._kind}: {what} is on the meta device (it holds no "
                                  "values); load real tensors (torch.load, dcp.load) first")
        local = _local_rows(value, self._share, node.rank, node.world_size, f"{self._kind}: {what}")
        if local is None:
            local = value[start:end]
        local = local.detach().to("cpu", torch.float32)
        for at in range(start, end, _GATHER_CHUNK):
            keys = np.arange(at, min(end, at + _GATHER_CHUNK), dtype=np.int64) + self.offset
            rows = self._pull_host(keys)
            rows[:, first:stop] = local[at - start:at - start + len(keys)]
            if shift:
                rows[:, first:stop] -= shift
            self.worker.set(keys, self.as_values(rows.numpy()))
        self.worker.wait()
        if node.world_size > 1:
            try:
                # Named: a rank that loads meets only ranks that load (a user's barrier on a
                # rank that did not load fails both at once, instead of pairing with this).
                node.barrier(name=f"{self._kind}.load_state_dict")
            except AdaPMTimeout as exc:
                # torch users often load on rank 0 alone: say what this load needs.
                raise AdaPMTimeout(f"{self._kind} at keys from {self.offset}: loading {what} "
                                   "is collective: every rank calls load_state_dict with the "
                                   f"same state ({exc})") from exc
            self.worker.wait_sync()  # replicas held here take the new rows

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        destination[prefix + "weight"] = self._export(0, self.embedding_dim, "weight")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        key = prefix + "weight"
        if strict:  # as torch's: other keys under this table's prefix are unexpected
            unexpected_keys.extend(k for k in state_dict
                                   if k.startswith(prefix) and k != key
                                   and k[len(prefix):].split(".", 1)[0] not in self._modules)
        if key not in state_dict:
            missing_keys.append(key)
            return
        self._import(state_dict[key], 0, self.embedding_dim, f"state_dict[{key!r}]")

    def __getstate__(self):
        # torch.save(model), copy.deepcopy(model): the rows live in adapm, not in this object
        raise TypeError(f"an adapm.torch {self._kind} cannot be pickled or copied (its rows "
                        "live in adapm): torch.save(model.state_dict()) instead, and "
                        "load_state_dict into a model built again")

    def _start_from(self, weight, freeze: bool) -> None:
        """Construction's end with torch's ``_weight`` / ``_freeze``: the rows written (the
        rest of each row zero), collective as a load."""
        if weight is not None:
            self._import(weight, 0, self.embedding_dim, "_weight")
        if freeze:
            self.requires_grad_(False)

    def requires_grad_(self, requires_grad: bool = True) -> "_Table":
        """torch's way to freeze a module: a frozen table's forward output has no gradient
        for its rows, keeps no rows for an optimizer, and its rows do not change. Call it on
        the table: a parent module's ``requires_grad_`` reaches only its parameters."""
        self._requires_grad = bool(requires_grad)
        return super().requires_grad_(requires_grad)

    # --- devices -------------------------------------------------------------------------------

    def _apply(self, fn, *args, **kwargs):
        # model.to(...), .cuda(), .cpu(), .half(), .to_empty(...) all come here with a function
        # of a tensor; a probe tensor tells where and as what it would put the rows.
        try:
            probe = fn(torch.empty(0))
        except (RuntimeError, AssertionError) as exc:
            raise InvalidArgument(f"{self._kind}: cannot move to that device: {exc}") from exc
        if isinstance(probe, torch.Tensor):
            if probe.dtype != torch.float32:
                raise InvalidType(f"{self._kind}: adapm rows are float32 (asked for "
                                  f"{probe.dtype}); cast the outputs instead, e.g. "
                                  "table(idx).to(dtype)")
            self.device = _device(self._kind, "to()", probe.device)
        return super()._apply(fn, *args, **kwargs)

    def as_values(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` (n, row_length) in the layout the node's set and push take."""
        return rows.reshape(-1) if self._packed else rows

    def extra_repr(self) -> str:
        text = f"{self.num_embeddings}, {self.embedding_dim}, keys from {self.offset}"
        if self.padding_idx is not None:
            text += f", padding_idx={self.padding_idx}"
        return text


class Embedding(_Table):
    """``torch.nn.Embedding`` whose rows live in adapm (see the module docstring).

    Same call as torch's for ``num_embeddings``, ``embedding_dim`` and ``padding_idx`` (its row
    starts at zero and gets no update). adapm's own, keyword-only: ``worker`` (the handle that
    pulls; the one the IntentLoader signals on), ``offset`` (the table's first key), ``init``
    ("normal": N(0, scale^2), torch's default with scale 1; "uniform": U(-scale, scale);
    "zeros"; "keep": write nothing, the rows and their optimizer state are what the node holds,
    as after ``adapm.init(..., restore=checkpoint)``) and ``seed``. ``device``: where a forward
    copies the rows and computes (the rows themselves stay in adapm; see the module docstring).
    ``max_norm`` and ``scale_grad_by_freq`` are not supported; updates are always sparse
    (``sparse`` is accepted for compatibility). ``_weight`` (the rows to start from, every rank
    the same; collective as a load) and ``_freeze``, and :meth:`from_pretrained`, as torch's.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, sparse: bool = True, _weight=None,
                 _freeze: bool = False, device=None, dtype=None, *, worker=None,
                 offset: int = 0, init: str = "normal", scale: float = 1.0,
                 seed: int = 0) -> None:
        _unsupported("Embedding", max_norm=max_norm, scale_grad_by_freq=scale_grad_by_freq)
        _check_weight("Embedding", _weight, num_embeddings, embedding_dim)
        super().__init__("Embedding", num_embeddings, embedding_dim, padding_idx, worker, offset,
                         "zeros" if _weight is not None else init, scale, seed, dtype, device)
        self._start_from(_weight, _freeze)

    @classmethod
    def from_pretrained(cls, embeddings: torch.Tensor, freeze: bool = True,
                        padding_idx: int | None = None, max_norm: float | None = None,
                        norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                        sparse: bool = True, *, worker=None, offset: int = 0) -> "Embedding":
        """torch's: a table of ``embeddings``' rows (2-d), frozen unless ``freeze=False``;
        plus adapm's ``worker`` and ``offset``. Collective (every rank, the same rows)."""
        _check_weight("Embedding.from_pretrained", embeddings, None, None)
        rows, dim = embeddings.shape
        return cls(rows, dim, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   _weight=embeddings, _freeze=freeze, worker=worker, offset=offset)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        inverse, weights, pad = self._pull_rows(input, "input")
        return F.embedding(inverse, weights, padding_idx=pad)


class EmbeddingBag(_Table):
    """``torch.nn.EmbeddingBag`` whose rows live in adapm (see :class:`Embedding` for the
    adapm-specific arguments). ``mode`` "sum", "mean" or "max"; ``forward(input, offsets=None,
    per_sample_weights=None)`` as torch's: a 2-d ``input`` is one bag per row, a 1-d one needs
    ``offsets`` (bag starts; with ``include_last_offset`` also the end)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, max_norm: float | None = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "mean",
                 sparse: bool = True, _weight=None, include_last_offset: bool = False,
                 padding_idx: int | None = None, *, worker=None, offset: int = 0,
                 init: str = "normal", scale: float = 1.0, seed: int = 0, device=None,
                 dtype=None) -> None:
        _unsupported("EmbeddingBag", max_norm=max_norm, scale_grad_by_freq=scale_grad_by_freq)
        if mode not in ("sum", "mean", "max"):
            raise InvalidArgument(f"EmbeddingBag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
        _check_weight("EmbeddingBag", _weight, num_embeddings, embedding_dim)
        super().__init__("EmbeddingBag", num_embeddings, embedding_dim, padding_idx, worker,
                         offset, "zeros" if _weight is not None else init, scale, seed, dtype,
                         device)
        self.mode = mode
        self.include_last_offset = bool(include_last_offset)
        self._start_from(_weight, False)

    @classmethod
    def from_pretrained(cls, embeddings: torch.Tensor, freeze: bool = True,
                        max_norm: float | None = None, norm_type: float = 2.0,
                        scale_grad_by_freq: bool = False, mode: str = "mean",
                        sparse: bool = True, include_last_offset: bool = False,
                        padding_idx: int | None = None, *, worker=None,
                        offset: int = 0) -> "EmbeddingBag":
        """torch's (see :meth:`Embedding.from_pretrained`)."""
        _check_weight("EmbeddingBag.from_pretrained", embeddings, None, None)
        rows, dim = embeddings.shape
        table = cls(rows, dim, max_norm, norm_type, scale_grad_by_freq, mode, sparse,
                    embeddings, include_last_offset, padding_idx, worker=worker, offset=offset)
        return table.requires_grad_(not freeze)

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(input, torch.Tensor):
            self._check_bags(input, offsets, per_sample_weights)
        inverse, weights, pad = self._pull_rows(input, "input")
        if offsets is not None:  # torch wants both of one dtype, on one device
            offsets = offsets.to(device=inverse.device, dtype=inverse.dtype)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.to(inverse.device)
        return F.embedding_bag(inverse, weights, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset, padding_idx=pad)

    def _check_bags(self, input, offsets, per_sample_weights) -> None:
        """torch's checks, as adapm errors naming the argument, before anything is pulled."""
        if input.dim() == 2:
            if offsets is not None:
                raise InvalidArgument("EmbeddingBag: offsets must be None for a 2-d input "
                                      "(each row is a bag)")
        elif input.dim() == 1:
            if offsets is None:
                raise InvalidArgument("EmbeddingBag: a 1-d input needs offsets (bag starts)")
            if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or \
                    offsets.dtype not in (torch.int64, torch.int32):
                raise InvalidType("EmbeddingBag: offsets must be a 1-d integer tensor")
            if len(offsets) and int(offsets[0]) != 0:
                raise InvalidArgument(f"EmbeddingBag: offsets[0] must be 0, got {int(offsets[0])}")
            if len(offsets) > 1 and bool((offsets[1:] < offsets[:-1]).any()):
                raise InvalidArgument("EmbeddingBag: offsets must be non-decreasing")
            if len(offsets) and int(offsets[-1]) > len(input):
                raise InvalidArgument(f"EmbeddingBag: offsets[-1] = {int(offsets[-1])} is past "
                                      f"the end of input ({len(input)} indices)")
            if self.include_last_offset and (not len(offsets) or int(offsets[-1]) != len(input)):
                raise InvalidArgument("EmbeddingBag: with include_last_offset, offsets[-1] must "
                                      f"be len(input) = {len(input)}")
        else:
            raise InvalidArgument(f"EmbeddingBag: input must be 1-d or 2-d, got {input.dim()}-d")
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise InvalidArgument("EmbeddingBag: per_sample_weights need mode='sum'")
            if not isinstance(per_sample_weights, torch.Tensor) or \
                    per_sample_weights.shape != input.shape:
                raise InvalidArgument("EmbeddingBag: per_sample_weights must be a tensor of "
                                      f"input's shape {tuple(input.shape)}")
            if per_sample_weights.dtype != torch.float32:  # torch's: the rows' dtype
                raise InvalidType("EmbeddingBag: per_sample_weights must be float32 as the "
                                  f"rows, got {per_sample_weights.dtype}")


class EmbeddingBagCollection(nn.Module):
    """Several :class:`EmbeddingBag` tables fed by one TorchRec ``KeyedJaggedTensor``, as
    ``torchrec.EmbeddingBagCollection``: ``tables`` maps each feature name to its table (every
    table its own key range, ``offset``). ``forward(features)`` takes a ``KeyedJaggedTensor``
    (duck-typed: anything with ``keys()`` and ``features[name]`` giving ``values()``,
    ``offsets()`` (batch + 1 entries) and ``weights_or_none()``; torchrec is not needed) and
    returns ``{feature: (batch, embedding_dim) tensor}`` (torchrec's ``KeyedTensor.to_dict()``),
    one pull per table. Features of the input without a table are ignored, as torchrec does; a
    table's feature missing from the input is an error. ``offsets`` gives each feature's first
    key, for :func:`adapm.torch.jagged_keys` in an ``IntentCollate``."""

    def __init__(self, tables) -> None:
        super().__init__()
        try:
            items = dict(tables).items()
        except (TypeError, ValueError):
            raise InvalidType("EmbeddingBagCollection: tables must map feature names to "
                              f"adapm.torch.EmbeddingBag tables, got {type(tables).__name__}") \
                from None
        if not items:
            raise InvalidArgument("EmbeddingBagCollection: no tables given")
        for name, table in items:
            if not isinstance(name, str) or not isinstance(table, EmbeddingBag):
                raise InvalidType("EmbeddingBagCollection: tables must map feature names (str) "
                                  f"to adapm.torch.EmbeddingBag tables, got {name!r}: "
                                  f"{type(table).__name__}")
        node = next(iter(items))[1].worker.node  # tables of other nodes share no keys
        spans = sorted((t.offset, t.offset + t.num_embeddings, name) for name, t in items
                       if t.worker.node is node)
        for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
            if start < end:  # two features on one key range: one's rows would be the other's
                raise InvalidArgument(f"EmbeddingBagCollection: tables {first!r} and {second!r} "
                                      f"share keys (from {start}); give each its own offset=")
        self.tables = nn.ModuleDict(dict(items))

    @property
    def offsets(self) -> dict[str, int]:
        """Each feature's first adapm key (its table's ``offset``)."""
        return {name: table.offset for name, table in self.tables.items()}

    def forward(self, features) -> dict[str, torch.Tensor]:
        if not (callable(getattr(features, "keys", None)) and hasattr(features, "__getitem__")):
            raise InvalidType("EmbeddingBagCollection: features must be a KeyedJaggedTensor "
                              f"(keys(), features[name]), got {type(features).__name__}")
        present = set(features.keys())
        missing = [name for name in self.tables if name not in present]
        if missing:
            raise InvalidArgument(f"EmbeddingBagCollection: the input has no feature(s) "
                                  f"{missing} (it has {sorted(present)})")
        out = {}
        for name, table in self.tables.items():
            jagged = features[name]
            offsets = jagged.offsets()
            weights = getattr(jagged, "weights_or_none", lambda: None)()
            if not table.include_last_offset:
                offsets = offsets[:-1]  # torchrec's offsets end with the total length
            out[name] = table(jagged.values(), offsets, per_sample_weights=weights)
        return out


def _check_weight(kind: str, weight, rows, dim) -> None:
    """torch's ``_weight`` (or ``from_pretrained``'s embeddings): None, or a real floating
    tensor of shape (rows, dim) (any 2-d shape for None), checked before anything is built."""
    if weight is None:
        return
    if not isinstance(weight, torch.Tensor) or not weight.dtype.is_floating_point:
        raise InvalidType(f"{kind}: the weights must be a floating point tensor, got "
                          f"{getattr(weight, 'dtype', type(weight).__name__)}")
    if weight.dim() != 2 or (rows is not None and tuple(weight.shape) != (rows, dim)):
        want = f"({rows}, {dim})" if rows is not None else "2-d"
        raise InvalidArgument(f"{kind}: the weights have shape {tuple(weight.shape)}, "
                              f"expected {want}")
    if weight.device.type == "meta":
        raise InvalidArgument(f"{kind}: the weights are on the meta device (no values)")


def _int(value, what: str, low: int) -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise InvalidType(f"{what} must be an int, got {type(value).__name__}") from None
    if value < low:
        raise InvalidArgument(f"{what} must be >= {low}, got {value}")
    return value


def _unsupported(kind: str, **given) -> None:
    for name, value in given.items():
        if value not in (None, False):
            raise InvalidArgument(f"{kind}: {name} is not supported for rows in adapm")


def _device(kind: str, what: str, device) -> torch.device:
    """A device rows can be copied to: the CPU or an accelerator, not ``meta``."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidArgument(f"{kind}: {what} must be a torch device, got {device!r}") from exc
    if device.type == "meta":
        raise InvalidArgument(
            f"{kind}: the rows live in adapm and are pulled to a real device; 'meta' holds no "
            "values (use device='cpu' or 'cuda', or build the model without adapm tables on "
            "meta)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgument(f"{kind}: {what} {device} but torch sees no CUDA device here")
    return device


def _local_rows(value, share, rank: int, world: int, what: str):
    """This rank's rows of a DTensor sharded by rows as :func:`sharded_state_dict` makes it
    (None for a plain tensor)."""
    try:
        from torch.distributed.tensor import DTensor, Shard
    except ImportError:  # pragma: no cover - torch without DTensor
        return None
    if not isinstance(value, DTensor):
        return None
    mesh = value.device_mesh
    if mesh.ndim != 1 or mesh.size() != world or tuple(value.placements) != (Shard(0),):
        raise InvalidArgument(f"{what}: a DTensor must be sharded by rows (Shard(0)) over one "
                              f"mesh dimension of the node's {world} ranks, as "
                              "adapm.torch.sharded_state_dict makes it; got "
                              f"{value.placements} over {mesh}")
    start, end = share(rank, world)
    local = value.to_local()
    if local.shape[0] != end - start:
        raise InvalidArgument(f"{what}: this rank holds {local.shape[0]} rows of the DTensor, "
                              f"rows [{start}, {end}) expected (torch.chunk's layout)")
    return local

