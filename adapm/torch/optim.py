"""Optimizers for adapm-backed tables: sparse row updates pushed to adapm, with torch's semantics.

``SGD`` and ``Adagrad`` take the tables (an ``nn.Module``, whose adapm ``Embedding`` /
``EmbeddingBag`` submodules are found, or the tables themselves) and have the usual shape:
``zero_grad()``, then forward and backward, then ``step()``. A step pushes, per table, one
update for the distinct rows its forward calls pulled since the last step, as torch's optimizer
with ``sparse=True`` embeddings updates them: only rows with a gradient change, gradients of
several forward calls of one table add up, and AdaGrad's accumulator counts the squared
gradient sum of a row's own steps. AdaGrad keeps the accumulator in the row's value, after the
weights (the node's ``value_length`` is then at least ``2 * embedding_dim``); it is stored less
``initial_accumulator_value``, so rows start at zero without a pass over the table.

Updates are additive pushes: concurrent updates of a row from several nodes all land (none is
lost), each computed from the row as it was pulled for the forward (asynchronous SGD, as the
native apps).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..errors import InvalidArgument, InvalidType
from .nn import _Table


class _RowOptimizer:
    """Shared by SGD and Adagrad: which tables, and the pending rows of a step."""

    name = "optimizer"

    def __init__(self, tables, lr: float) -> None:
        if isinstance(tables, _Table):
            tables = [tables]
        elif isinstance(tables, torch.nn.Module):
            tables = [m for m in tables.modules() if isinstance(m, _Table)]
        else:
            try:
                tables = list(tables)
            except TypeError:
                raise InvalidType(f"{self.name}: give an nn.Module or adapm tables, got "
                                  f"{type(tables).__name__}") from None
            if not all(isinstance(t, _Table) for t in tables):
                raise InvalidType(f"{self.name} updates adapm.torch.Embedding/EmbeddingBag "
                                  "tables only; use a torch optimizer for nn.Parameters")
        if not tables:
            raise InvalidArgument(f"{self.name}: no adapm.torch.Embedding/EmbeddingBag given")
        self.tables = tables
        self.lr = _nonnegative(lr, f"{self.name}: lr")
        self.steps = [0] * len(tables)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the rows pulled since the last step (their gradients with them)."""
        for table in self.tables:
            table.pending.clear()

    def step(self, closure: Callable | None = None):
        """Pushes each table's update (non-blocking for remote rows, see ``Worker.push``)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for i, table in enumerate(self.tables):
            got = _gathered(table)
            table.pending.clear()
            if got is None:
                continue
            keys, rows, grads = got
            self.steps[i] += 1
            table.worker.push(keys, table.as_values(self._update(table, rows, grads,
                                                                   self.steps[i])))
        return loss

    def state_dict(self) -> dict:
        """What this process keeps of the optimizer's state (torch's name): the steps taken per
        table (AdaGrad's ``lr_decay`` depends on them). The per-row state lives in the rows, so
        a node checkpoint (``Node.checkpoint``) holds it. JSON-serialisable."""
        return {"steps": list(self.steps)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` of an optimizer over the same tables."""
        steps = state.get("steps") if isinstance(state, dict) else None
        if not isinstance(steps, list) or len(steps) != len(self.tables) or not all(
                type(n) is int and n >= 0 for n in steps):
            raise InvalidArgument(f"{self.name}.load_state_dict: expected {{'steps': [one "
                                  f"count >= 0 per table, {len(self.tables)} in all]}}, got "
                                  f"{state!r:.200}")
        self.steps = list(steps)

    def _update(self, table: _Table, rows: np.ndarray, grads: np.ndarray,
                step: int) -> np.ndarray:
        raise NotImplementedError


class SGD(_RowOptimizer):
    """Plain SGD on rows: ``w -= lr * grad`` (``maximize`` flips the sign), as ``torch.optim.SGD``
    with sparse gradients. Momentum, weight decay and Nesterov are not supported (torch's sparse
    SGD has no per-row state for them either)."""

    name = "SGD"

    def __init__(self, tables, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *,
                 maximize: bool = False) -> None:
        for what, value in (("momentum", momentum), ("weight_decay", weight_decay),
                            ("nesterov", nesterov)):
            if value:
                raise InvalidArgument(f"SGD: {what} is not supported for rows in adapm")
        super().__init__(tables, lr)
        self.maximize = bool(maximize)

    def _update(self, table, rows, grads, step):
        update = np.zeros_like(rows)
        update[:, :table.embedding_dim] = (self.lr if self.maximize else -self.lr) * grads
        return update


class Adagrad(_RowOptimizer):
    """AdaGrad on rows, as ``torch.optim.Adagrad`` with sparse gradients: per row,
    ``acc += grad**2``, ``w -= clr * grad / (sqrt(acc) + eps)`` with
    ``clr = lr / (1 + (step - 1) * lr_decay)``; ``acc`` starts at ``initial_accumulator_value``.
    ``weight_decay`` is not supported (torch refuses it with sparse gradients too)."""

    name = "Adagrad"

    def __init__(self, tables, lr: float = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, *, maximize: bool = False) -> None:
        if weight_decay:
            raise InvalidArgument("Adagrad: weight_decay is not supported for rows in adapm")
        super().__init__(tables, lr)
        for table in self.tables:
            if table.row_length < 2 * table.embedding_dim:
                raise InvalidArgument(
                    f"Adagrad keeps its accumulator with each row: the table at keys from "
                    f"{table.offset} has rows of {table.row_length} floats, it needs "
                    f"2 * embedding_dim = {2 * table.embedding_dim} (adapm.init(value_length=...))")
        self.lr_decay = _nonnegative(lr_decay, "Adagrad: lr_decay")
        self.initial_accumulator_value = _nonnegative(initial_accumulator_value,
                                                      "Adagrad: initial_accumulator_value")
        self.eps = _nonnegative(eps, "Adagrad: eps")
        self.maximize = bool(maximize)

    def _update(self, table, rows, grads, step):
        dim = table.embedding_dim
        if self.maximize:
            grads = -grads
        squared = grads * grads
        acc = rows[:, dim:2 * dim] + np.float32(self.initial_accumulator_value) + squared
        clr = self.lr / (1 + (step - 1) * self.lr_decay)
        update = np.zeros_like(rows)
        update[:, :dim] = -clr * (grads / (np.sqrt(acc) + np.float32(self.eps)))
        update[:, dim:2 * dim] = squared
        return update


def _gathered(table: _Table):
    """(keys, rows, grads) of the table's pulls since the last step, one entry per distinct
    key (gradients of repeated pulls summed; the rows as first pulled), or None."""
    parts = [(keys, rows, weights.grad) for keys, rows, weights in table.pending
             if weights.grad is not None]
    if not parts:
        return None
    if len(parts) == 1:
        keys, rows, grad = parts[0]
        return keys, rows, grad.numpy()
    keys = np.concatenate([p[0] for p in parts])
    unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    grads = np.zeros((len(unique), table.embedding_dim), dtype=np.float32)
    np.add.at(grads, inverse, np.concatenate([p[2].numpy() for p in parts]))
    rows = np.concatenate([p[1] for p in parts])[first]
    return unique, rows, grads


def _nonnegative(value, what: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InvalidType(f"{what} must be a number, got {value!r}") from None
    if not value >= 0:
        raise InvalidArgument(f"{what} must be >= 0, got {value}")
    return value
