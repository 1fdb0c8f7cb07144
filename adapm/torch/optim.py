"""Optimizers for adapm-backed tables: sparse row updates pushed to adapm, with torch's semantics.

``SGD`` and ``Adagrad`` take what torch's optimizers take, with adapm tables in the place of
parameters: a module (its adapm ``Embedding`` / ``EmbeddingBag`` submodules are found), a table,
an iterable of them, or parameter groups (dicts with ``"params"`` and per-group options, as
``torch.optim``: ``[{"params": deep, "lr": 0.05}, {"params": wide}]``). ``model.parameters()``
holds no adapm rows (they are not ``nn.Parameter`` objects of this process): give the dense
parameters to a torch optimizer and the model or its tables to these. ``param_groups`` is a
list of dicts as torch's (``"lr"`` may be changed between steps).

They have the usual shape: ``zero_grad()``, then forward and backward, then ``step()``. A step
pushes, per table, one update for the distinct rows its forward calls pulled since the last
step, as torch's optimizer with ``sparse=True`` embeddings updates them: only rows with a
gradient change, gradients of several forward calls of one table add up, and AdaGrad's
accumulator counts the squared gradient sum of a row's own steps. AdaGrad keeps the accumulator
in the row's value, after the weights (the node's ``value_length`` is then at least ``2 *
embedding_dim``); it is stored less ``initial_accumulator_value``, so rows start at zero
without a pass over the table. Gradients on a CUDA device come back through pinned host memory
(all tables' copies issued, then one wait).

Updates are additive pushes: concurrent updates of a row from several nodes all land (none is
lost), each computed from the row as it was pulled for the forward (asynchronous SGD, as the
native apps).

``state_dict()`` is torch's layout: ``{"state": {i: {"step": tensor, "sum": (n, dim) tensor}},
"param_groups": [...]}`` with ``i`` the table's index in order of the groups; ``"sum"``
(AdaGrad's accumulator, ``initial_accumulator_value`` included as torch's) is pulled like a
table's weights (see :mod:`adapm.torch.nn`: whole, or sharded inside
:func:`adapm.torch.sharded_state_dict`). ``load_state_dict()`` is collective when it carries
sums.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch

from .._native_loader import load as _load
from ..errors import InvalidArgument, InvalidType
from .nn import _Table

# The row updates: one native call per table and step, the GIL released (a dozen numpy
# operations each took the GIL back: issue 29's PyTorch path).
_kernels = _load("adapm._kernels")


class _RowOptimizer(torch.optim.Optimizer):
    """Shared by SGD and Adagrad: which tables in which groups, and the pending rows of a step.
    Not thread-safe (as the worker).

    A ``torch.optim.Optimizer`` to torch's LR schedulers and tools (``isinstance``,
    ``param_groups``, ``defaults``, ``state``, ``add_param_group``), without its constructor:
    that one takes tensors, and an adapm table is a module whose rows live in the PM."""

    name = "optimizer"
    has_sums = False  # whether each row keeps a state (after the weights) to save

    def __init__(self, params, defaults: dict) -> None:  # the base's is not called: above
        groups = _param_groups(params, self.name)
        self.defaults = dict(defaults)
        self.param_groups: list[dict] = []
        self.tables: list = []
        self.steps: list[int] = []
        # what torch.optim.Optimizer's hooks read (register_step_pre_hook and the rest)
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()
        # step() runs the step hooks (and shows in torch's profiler), as the base's constructor
        # arranges for every torch optimizer
        patch = getattr(self, "_patch_step_function", None)
        if patch is not None:
            patch()
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, param_group: dict) -> None:
        """torch's: another group of tables (``{"params": tables, "lr": ...}``), the options
        it leaves out taken from the defaults. Checked before anything changes."""
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise InvalidArgument(f"{self.name}.add_param_group: expected a dict with "
                                  f"'params', got {param_group!r:.200}")
        (group,) = _param_groups([param_group], self.name)
        unknown = set(group) - set(self.defaults) - {"params"}
        if unknown:
            raise InvalidArgument(f"{self.name}: unknown option(s) {sorted(unknown)} in a "
                                  f"parameter group (known: {sorted(self.defaults)})")
        group = {**self.defaults, **group}
        self._check_group(group)
        tables = self.tables + list(group["params"])
        if len({id(t) for t in tables}) != len(tables):
            raise InvalidArgument(f"{self.name}: a table is given twice")
        self._check_tables(group["params"])
        self.param_groups.append(group)
        self.tables = tables
        self.steps += [0] * len(group["params"])

    def _check_tables(self, tables: list) -> None:
        """Refuse tables this optimizer cannot train (InvalidArgument)."""

    @property
    def state(self) -> dict:
        """``{table: {"step": tensor}}``: the step count of each table (AdaGrad's sums live in
        the rows: ``state_dict()`` pulls them)."""
        return {t: {"step": torch.tensor(float(s))} for t, s in zip(self.tables, self.steps)}

    def __getstate__(self):
        raise TypeError(f"adapm.torch.optim.{self.name} cannot be pickled (its tables' rows "
                        "live in adapm): save optimizer.state_dict() instead")

    def __setstate__(self, state):  # never reached (see __getstate__)
        raise TypeError(f"adapm.torch.optim.{self.name} cannot be unpickled")

    def _check_group(self, group: dict) -> None:
        group["lr"] = _nonnegative(group["lr"], f"{self.name}: lr")
        group["maximize"] = bool(group["maximize"])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's: drops the gradients so far (the pulls whose backward ran). The rows of a
        forward whose backward is still to come stay for the next step, so that ``loss =
        f(model(x)); opt.zero_grad(); loss.backward(); opt.step()`` trains as torch's does (it
        pushed nothing). Such rows stay through one ``zero_grad``: at the next they are dropped
        too (a forward whose output was never differentiated)."""
        for table in self.tables:
            spared = table.spared
            kept = [entry for entry in table.pending
                    if entry[2].grad is None and id(entry) not in spared]
            table.pending[:] = kept
            table.spared = {id(entry) for entry in kept}

    def step(self, closure: Callable | None = None):
        """Pushes each table's update (non-blocking for remote rows, see ``Worker.push``)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        got = [_gathered(table) for table in self.tables]
        for table in self.tables:
            table.pending.clear()
            table.spared = set()
        grads = _to_host([g[2] for g in got if g is not None])
        i = 0
        for group in self.param_groups:
            for table in group["params"]:
                entry = got[i]
                if entry is not None:
                    keys, rows, _ = entry
                    self.steps[i] += 1
                    update = self._update(table, rows, grads.pop(0), self.steps[i], group)
                    table.worker.push(keys, table.as_values(update))
                i += 1
        return loss

    def state_dict(self, *, with_rows: bool = True) -> dict:
        """torch's layout (see the module docstring). ``with_rows=False`` leaves out the
        per-row state and gives steps as ints: a small JSON-serialisable document for
        ``Node.checkpoint(meta=...)``, whose keys already hold the per-row state. Blocking;
        pulls every row's state when there is one (not collective)."""
        state = {}
        for i, table in enumerate(self.tables):
            entry: dict = {"step": torch.tensor(float(self.steps[i])) if with_rows
                           else self.steps[i]}
            if with_rows and self.has_sums:
                group = self._group_of(i)
                entry["sum"] = table._export(table.embedding_dim, 2 * table.embedding_dim,
                                             "AdaGrad sums",
                                             group["initial_accumulator_value"])
            state[i] = entry
        groups, at = [], 0
        for group in self.param_groups:
            n = len(group["params"])
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": list(range(at, at + n))})
            at += n
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` of an optimizer over the same tables in the same
        groups (checked before anything changes): options per group, step counts, and the
        per-row state when the document carries it (``"sum"``: collective then, every rank
        calls it with the same document, at any world size). Also takes the ``{"steps":
        [...]}`` of earlier versions."""
        n = len(self.tables)
        if isinstance(state, dict) and set(state) == {"steps"}:  # earlier versions
            state = {"state": {i: {"step": s} for i, s in enumerate(state["steps"])}
                     if isinstance(state["steps"], list) else None,
                     "param_groups": None}
        if not isinstance(state, dict) or not isinstance(state.get("state"), dict):
            raise InvalidArgument(f"{self.name}.load_state_dict: expected {{'state': ..., "
                                  f"'param_groups': ...}} of {self.name}.state_dict(), got "
                                  f"{state!r:.200}")
        entries = {}
        for key, entry in state["state"].items():
            try:
                index = int(key)  # JSON makes the keys strings
            except (TypeError, ValueError):
                index = -1
            if not 0 <= index < n or not isinstance(entry, dict):
                raise InvalidArgument(f"{self.name}.load_state_dict: state of table {key!r}, "
                                      f"expected one entry per table 0..{n - 1}")
            entries[index] = entry
        steps = list(self.steps)
        for index, entry in entries.items():
            step = entry.get("step", 0)
            step = float(step.item() if isinstance(step, torch.Tensor) else step)
            if not (step >= 0 and step == int(step)):
                raise InvalidArgument(f"{self.name}.load_state_dict: step of table {index} must "
                                      f"be a count >= 0, got {step}")
            steps[index] = int(step)
        if len(entries) != n:
            raise InvalidArgument(f"{self.name}.load_state_dict: {len(entries)} tables in the "
                                  f"state, this optimizer has {n} (one count >= 0 per table)")
        groups = state.get("param_groups")
        if groups is not None:
            sizes = [len(g.get("params", ())) if isinstance(g, dict) else -1 for g in groups] \
                if isinstance(groups, list) else None
            if sizes != [len(g["params"]) for g in self.param_groups]:
                raise InvalidArgument(f"{self.name}.load_state_dict: parameter groups of sizes "
                                      f"{sizes}, this optimizer has "
                                      f"{[len(g['params']) for g in self.param_groups]}")
            new_groups = []
            for mine, theirs in zip(self.param_groups, groups):
                # as torch's: every key of the saved group but its params (an LR scheduler's
                # "initial_lr", say), the options checked
                group = {**mine, **{k: v for k, v in theirs.items() if k != "params"}}
                self._check_group(group)
                new_groups.append(group)
        else:
            new_groups = self.param_groups
        sums = [(i, e["sum"]) for i, e in entries.items() if "sum" in e]
        if sums and not self.has_sums:
            raise InvalidArgument(f"{self.name}.load_state_dict: the state has per-row sums "
                                  f"(AdaGrad's); {self.name} keeps none")
        for i, value in sums:  # shapes before anything is written
            table = self.tables[i]
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != (
                    table.num_embeddings, table.embedding_dim):
                raise InvalidArgument(
                    f"{self.name}.load_state_dict: sum of table {i} must be a tensor of shape "
                    f"{(table.num_embeddings, table.embedding_dim)}, got "
                    f"{getattr(value, 'shape', type(value).__name__)}")
        self.param_groups[:] = new_groups
        self.steps = steps
        for i, value in sorted(sums):
            table = self.tables[i]
            table._import(value, table.embedding_dim, 2 * table.embedding_dim,
                          f"state['state'][{i}]['sum']",
                          self._group_of(i)["initial_accumulator_value"])

    def _group_of(self, index: int) -> dict:
        for group in self.param_groups:
            if index < len(group["params"]):
                return group
            index -= len(group["params"])
        raise IndexError(index)

    def _update(self, table: _Table, rows: np.ndarray, grads: np.ndarray,
                step: int, group: dict) -> np.ndarray:
        raise NotImplementedError


class SGD(_RowOptimizer):
    """Plain SGD on rows: ``w -= lr * grad`` (``maximize`` flips the sign), as ``torch.optim.SGD``
    with sparse gradients. Momentum, weight decay and Nesterov are not supported (torch's sparse
    SGD has no per-row state for them either)."""

    name = "SGD"

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *,
                 maximize: bool = False, foreach=None, differentiable: bool = False,
                 fused=None) -> None:
        for what, value in (("momentum", momentum), ("weight_decay", weight_decay),
                            ("nesterov", nesterov), ("differentiable", differentiable)):
            if value:
                raise InvalidArgument(f"SGD: {what} is not supported for rows in adapm")
        # foreach and fused choose among torch's implementations; a step here is one native
        # update per table whatever they say
        super().__init__(params, {"lr": lr, "maximize": maximize})

    def _update(self, table, rows, grads, step, group):
        update = np.empty(rows.shape, dtype=np.float32)  # C order, whatever the rows' layout
        _kernels.sgd_rows(_float32(grads), update, table.embedding_dim, group["lr"],
                          group["maximize"])
        return update


class Adagrad(_RowOptimizer):
    """AdaGrad on rows, as ``torch.optim.Adagrad`` with sparse gradients: per row,
    ``acc += grad**2``, ``w -= clr * grad / (sqrt(acc) + eps)`` with
    ``clr = lr / (1 + (step - 1) * lr_decay)``; ``acc`` starts at ``initial_accumulator_value``.
    ``weight_decay`` is not supported (torch refuses it with sparse gradients too)."""

    name = "Adagrad"
    has_sums = True

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, foreach=None, *, maximize: bool = False,
                 differentiable: bool = False, fused=None) -> None:
        for what, value in (("weight_decay", weight_decay), ("differentiable", differentiable)):
            if value:
                raise InvalidArgument(f"Adagrad: {what} is not supported for rows in adapm")
        # foreach and fused: as SGD's
        super().__init__(params, {"lr": lr, "lr_decay": lr_decay,
                                  "initial_accumulator_value": initial_accumulator_value,
                                  "eps": eps, "maximize": maximize})

    def _check_tables(self, tables: list) -> None:
        for table in tables:
            if table.row_length < 2 * table.embedding_dim:
                raise InvalidArgument(
                    f"Adagrad keeps its accumulator with each row: the table at keys from "
                    f"{table.offset} has rows of {table.row_length} floats, it needs "
                    f"2 * embedding_dim = {2 * table.embedding_dim} (adapm.init(value_length=...))")

    def _check_group(self, group: dict) -> None:
        super()._check_group(group)
        group["lr_decay"] = _nonnegative(group["lr_decay"], "Adagrad: lr_decay")
        group["initial_accumulator_value"] = _nonnegative(
            group["initial_accumulator_value"], "Adagrad: initial_accumulator_value")
        group["eps"] = _nonnegative(group["eps"], "Adagrad: eps")

    def _update(self, table, rows, grads, step, group):
        clr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
        update = np.empty(rows.shape, dtype=np.float32)  # C order, whatever the rows' layout
        _kernels.adagrad_rows(np.ascontiguousarray(rows), _float32(grads), update,
                              table.embedding_dim, clr, group["eps"],
                              group["initial_accumulator_value"], group["maximize"])
        return update


def _float32(grads: np.ndarray) -> np.ndarray:
    """The gradients as the native update takes them (a copy only if they are not already)."""
    return np.ascontiguousarray(grads, dtype=np.float32)


def _gathered(table: _Table):
    """(keys, rows, grad tensor) of the table's pulls since the last step, one entry per
    distinct key (gradients of repeated pulls summed on their device; the rows as first
    pulled), or None."""
    parts = [(keys, rows, weights.grad) for keys, rows, weights in table.pending
             if weights.grad is not None]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    keys = np.concatenate([p[0] for p in parts])
    unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    grad = parts[0][2]
    grads = torch.zeros((len(unique), table.embedding_dim), dtype=grad.dtype, device=grad.device)
    grads.index_add_(0, torch.from_numpy(inverse).to(grad.device),
                     torch.cat([p[2] for p in parts]))
    rows = np.concatenate([p[1] for p in parts])[first]
    return unique, rows, grads


def _to_host(grads: list) -> list:
    """The gradients as float32 numpy arrays: those on an accelerator copied into pinned host
    memory asynchronously, all issued before one wait (the CPU ones are used in place)."""
    out, wait = [], False
    for grad in grads:
        if grad.device.type != "cpu":
            host = torch.empty(grad.shape, dtype=grad.dtype,
                               pin_memory=grad.device.type == "cuda")
            host.copy_(grad, non_blocking=True)
            wait = wait or grad.device.type == "cuda"
            grad = host
        out.append(grad)
    if wait:
        torch.cuda.synchronize()
    return [g.detach().numpy() for g in out]


def _param_groups(params, name: str) -> list[dict]:
    """torch's ``params`` argument with adapm tables: groups of ``{"params": [tables], ...}``."""
    hint = (f"give {name} the model (its adapm tables are found), the tables, or parameter "
            "groups [{'params': tables, 'lr': ...}]; dense nn.Parameters (model.parameters() "
            "holds only those: adapm rows are not nn.Parameters) go to a torch optimizer")
    if isinstance(params, (torch.nn.Module, dict)):
        params = [params]
    try:
        items = list(params)
    except TypeError:
        raise InvalidType(f"{name}: cannot take {type(params).__name__}; {hint}") from None
    if items and all(isinstance(item, dict) for item in items):
        groups = []
        for item in items:
            if "params" not in item:
                raise InvalidArgument(f"{name}: a parameter group needs 'params'; {hint}")
            groups.append({**item, "params": _tables(item["params"], name, hint)})
    elif any(isinstance(item, dict) for item in items):
        raise InvalidArgument(f"{name}: give either tables/modules or parameter groups "
                              f"(dicts), not both; {hint}")
    else:
        groups = [{"params": _tables(items, name, hint)}]
    for group in groups:
        if not group["params"]:
            raise InvalidArgument(f"{name}: no adapm.torch.Embedding/EmbeddingBag given; {hint}")
    return groups


def _tables(items, name: str, hint: str) -> list:
    if isinstance(items, torch.nn.Module):
        items = [items]
    try:
        items = list(items)
    except TypeError:
        raise InvalidType(f"{name}: cannot take {type(items).__name__}; {hint}") from None
    tables = []
    for item in items:
        if isinstance(item, torch.Tensor):
            raise InvalidType(f"{name} updates adapm.torch.Embedding/EmbeddingBag tables only; "
                              f"use a torch optimizer for nn.Parameters ({hint})")
        if not isinstance(item, torch.nn.Module):
            raise InvalidType(f"{name}: cannot take {type(item).__name__}; {hint}")
        tables += [m for m in item.modules() if isinstance(m, _Table)]
    # A module and its own submodules (model.modules()) name a table twice: once is meant.
    return list({id(t): t for t in tables}.values())


def _nonnegative(value, what: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InvalidType(f"{what} must be a number, got {value!r}") from None
    if not value >= 0:
        raise InvalidArgument(f"{what} must be >= 0, got {value}")
    return value
