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
"""

from __future__ import annotations

import operator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InvalidArgument, InvalidType
from .data import distinct

# Rows of a table are initialised in chunks of this many keys, each from its own generator
# seeded by (seed, chunk): the values do not depend on the world size or on who writes them.
_INIT_CHUNK = 4096
_INITS = ("normal", "uniform", "zeros", "keep")


class _Table(nn.Module):
    """What Embedding and EmbeddingBag share: the key range, pulls, initialisation, and the rows
    pulled since the last optimizer step (``pending``). A forward in training mode with grad
    enabled keeps its rows until the optimizer's ``step`` or ``zero_grad``: evaluate under
    ``torch.no_grad()`` or ``model.eval()``."""

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
        if device is not None and torch.device(device).type != "cpu":
            raise InvalidArgument(f"{kind}: adapm rows are pulled into CPU tensors; move the "
                                  f"output to {device} (device={device!r} is not supported)")
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
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        self.offset = offset
        self.row_length = int(lengths[0])  # weights, then optimizer state
        # A node whose keys differ in length takes and gives values packed back to back.
        self._packed = not store.uniform_length
        self.worker = worker
        self.pending: list[tuple[np.ndarray, np.ndarray, torch.Tensor]] = []
        self._init_rows(init, float(scale), _int(seed, f"{kind}: seed", low=0))

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
            node.barrier()
            # Replicas held here (intent signalled before construction) see the rows after a
            # sync round that starts now, when every rank's writes are in the main copies.
            self.worker.wait_sync()

    def _pull_rows(self, indices: torch.Tensor, what: str):
        """Distinct rows of ``indices``: (inverse indices into them, leaf weights tensor)."""
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
        rows = self.worker.pull(keys).reshape(len(keys), self.row_length)
        weights = torch.from_numpy(np.ascontiguousarray(rows[:, :self.embedding_dim]))
        weights.requires_grad_(self.training and torch.is_grad_enabled())
        if weights.requires_grad:
            self.pending.append((keys, rows, weights))
        pad = None
        if self.padding_idx is not None:
            at = np.flatnonzero(unique == self.padding_idx)
            pad = int(at[0]) if len(at) else None
        return torch.from_numpy(inverse).reshape(indices.shape), weights, pad

    def weight(self) -> torch.Tensor:
        """The whole table's current weights (num_embeddings, embedding_dim), pulled: for
        evaluation and export (a copy; writing to it changes nothing)."""
        keys = np.arange(self.offset, self.offset + self.num_embeddings, dtype=np.int64)
        rows = self.worker.pull(keys).reshape(len(keys), self.row_length)
        return torch.from_numpy(np.ascontiguousarray(rows[:, :self.embedding_dim]))

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
    as after ``adapm.init(..., restore=checkpoint)``) and ``seed``. ``max_norm`` and ``scale_grad_by_freq`` are not supported; updates are
    always sparse (``sparse`` is accepted for compatibility).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 max_norm: float | None = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, sparse: bool = True, *, worker=None,
                 offset: int = 0, init: str = "normal", scale: float = 1.0, seed: int = 0,
                 device=None, dtype=None) -> None:
        _unsupported("Embedding", max_norm=max_norm, scale_grad_by_freq=scale_grad_by_freq)
        super().__init__("Embedding", num_embeddings, embedding_dim, padding_idx, worker, offset,
                         init, scale, seed, dtype, device)

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
        _unsupported("EmbeddingBag", max_norm=max_norm, scale_grad_by_freq=scale_grad_by_freq,
                     _weight=_weight)
        if mode not in ("sum", "mean", "max"):
            raise InvalidArgument(f"EmbeddingBag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
        super().__init__("EmbeddingBag", num_embeddings, embedding_dim, padding_idx, worker,
                         offset, init, scale, seed, dtype, device)
        self.mode = mode
        self.include_last_offset = bool(include_last_offset)

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(input, torch.Tensor):
            self._check_bags(input, offsets, per_sample_weights)
        inverse, weights, pad = self._pull_rows(input, "input")
        if offsets is not None:
            offsets = offsets.to(inverse.dtype)  # torch wants both of one dtype
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
