"""State dicts of adapm tables sharded by rows, for ``torch.distributed.checkpoint`` (DCP).

``model.state_dict()`` pulls every table whole into the calling process (see
:mod:`adapm.torch.nn`). :func:`sharded_state_dict` gives each rank only its share of every
table, as a ``DTensor`` sharded by rows over the ranks (``Shard(0)``, torch.chunk's layout),
the convention of FSDP and TorchRec, so that DCP writes each rank's share itself and reads any
share back at any world size::

    import torch.distributed.checkpoint as dcp
    dcp.save({"model": sharded_state_dict(model), "optim": sharded_state_dict(opt)},
             checkpoint_id=path)                      # collective, each rank its rows
    # later, at any world size (the same tables):
    state = {"model": sharded_state_dict(model), "optim": sharded_state_dict(opt)}
    dcp.load(state, checkpoint_id=path)               # each rank reads its rows
    model.load_state_dict(state["model"]); opt.load_state_dict(state["optim"])   # collective

DCP needs a torch process group whose ranks are the node's: under ``torchrun``
``torch.distributed.init_process_group("gloo")`` (adapm then takes ``MASTER_PORT + 1``); under
another launcher any ``init_method`` with ``rank=node.rank, world_size=node.world_size``. With
one process and no process group, ``dcp.save(model.state_dict(), ...)`` and ``dcp.load`` with
whole tables work too (DCP then runs without collectives).
"""

from __future__ import annotations

import contextlib

import torch

from ..errors import InvalidType, StateError
from .nn import _Table

# One DeviceMesh per default process group (creating one is collective): id -> (group, mesh),
# the group held so that its id is not reused by another while the entry lives.
_meshes: dict = {}


def sharded_state_dict(obj) -> dict:
    """``obj.state_dict()`` (a module, or an adapm optimizer) with every adapm table's rows (and
    an AdaGrad optimizer's sums) as DTensors sharded by rows over the torch process group's
    ranks, each rank pulling only its share. Collective the first time in a process (it makes
    a CPU ``DeviceMesh`` over the default process group). Raises StateError when no process
    group matching the node's ranks is initialised (what to do is in the message)."""
    from .optim import _RowOptimizer

    if isinstance(obj, _RowOptimizer):
        tables = list(obj.tables)
    elif isinstance(obj, torch.nn.Module):
        tables = [m for m in obj.modules() if isinstance(m, _Table)]
    else:
        raise InvalidType("sharded_state_dict takes a module or an adapm.torch.optim "
                          f"optimizer, got {type(obj).__name__}")
    if not tables:
        return obj.state_dict()
    node = tables[0].worker.node
    mesh = _mesh(node)
    with _sharded(tables, mesh):
        return obj.state_dict()


def _mesh(node):
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise StateError(
            "sharded_state_dict needs a torch process group over the node's ranks (DCP's "
            "collectives): torch.distributed.init_process_group('gloo') under torchrun, or with "
            f"rank=node.rank, world_size=node.world_size ({node.world_size}) and an init_method "
            "under another launcher; without one, save whole tables with model.state_dict() or "
            "the node with node.checkpoint(path)")
    if dist.get_world_size() != node.world_size or dist.get_rank() != node.rank:
        raise StateError(
            f"sharded_state_dict: the torch process group is rank {dist.get_rank()} of "
            f"{dist.get_world_size()}, the adapm node rank {node.rank} of {node.world_size}; "
            "initialise it with rank=node.rank, world_size=node.world_size")
    from torch.distributed.device_mesh import init_device_mesh

    group = dist.group.WORLD
    entry = _meshes.get(id(group))
    if entry is None or entry[0] is not group:
        entry = _meshes[id(group)] = (group, init_device_mesh("cpu", (node.world_size,)))
    return entry[1]


@contextlib.contextmanager
def _sharded(tables, mesh):
    for table in tables:
        table._mesh = mesh
    try:
        yield
    finally:
        for table in tables:
            table._mesh = None
