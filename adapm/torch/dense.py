"""Dense parameters kept consistent across nodes through adapm, without a second framework.

The parameters (a dense layer's weights, say) are laid out back to back over a range of adapm
keys, ``value_length`` floats per key. Every node signals intent for those keys for the whole run,
so the adaptive manager holds a replica of them on every node and merges every node's updates
into the main copy each sync round, sending the merged values back. Each node trains its dense
parameters with any torch optimizer and calls :meth:`DenseSync.step` after it: the node's own
change since the last call is pushed, and the parameters take the current merged values. This
is asynchronous data parallelism with the staleness of a sync round (a few milliseconds), the
same consistency the embeddings have; ``torch.nn.parallel.DistributedDataParallel`` over
``torch.distributed`` (gloo) is the synchronous alternative (see the README).
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import InvalidArgument, InvalidType
from .nn import _int

# Intent "for the whole run": an end clock no worker reaches.
_FOREVER = 2 ** 62


class DenseSync:
    """Keeps ``params`` (float32 tensors on the CPU or an accelerator, e.g.
    ``mlp.parameters()``) equal on every node.

    Parameters on a CUDA device travel through pinned host buffers of this object: their
    values are copied to the host asynchronously (one wait for all), and the merged values
    back to the device asynchronously (ordered on the current stream before the next
    kernels that read them). The same code runs for CPU parameters, where the copies are
    plain ones.

    ``worker``: this thread's adapm worker; ``offset``: the first of the keys used (they must
    fit the node, have one value length and be used for nothing else:
    ``DenseSync.keys_needed(params, value_length)`` tells how many). Construction is collective: every rank constructs the same DenseSync in
    the same order; on return every rank's parameters hold rank 0's values. Blocking calls
    raise ``AdaPMTimeout`` like the worker's. Not thread-safe.
    """

    def __init__(self, params, worker, offset: int) -> None:
        self.params = [p for p in params]
        if not self.params:
            raise InvalidArgument("DenseSync: no parameters given")
        for p in self.params:
            if not isinstance(p, torch.Tensor) or p.dtype != torch.float32:
                raise InvalidType("DenseSync: parameters must be float32 tensors, got "
                                  f"{getattr(p, 'dtype', type(p).__name__)}")
            if p.device.type == "meta":
                raise InvalidArgument("DenseSync: parameters on the meta device hold no values; "
                                      "move the model to a real device (model.to_empty(...) "
                                      "and initialise it) first")
        if worker is None or not hasattr(worker, "node"):
            raise InvalidArgument("DenseSync: worker= must be an adapm worker handle")
        node = worker.node
        store = node.store
        offset = _int(offset, "DenseSync: offset", low=0)
        if offset >= store.num_keys:
            raise InvalidArgument(f"DenseSync: offset {offset} is outside the node's "
                                  f"{store.num_keys} keys")
        length = int(store.lengths_of(np.array([offset], dtype=np.int64))[0])
        self.numel = sum(p.numel() for p in self.params)
        rows = self.keys_needed(self.params, length)
        if offset + rows > store.num_keys:
            raise InvalidArgument(f"DenseSync: keys [{offset}, {offset + rows}) do not fit the "
                                  f"node's {store.num_keys} keys")
        if np.any(store.lengths_of(np.arange(offset, offset + rows, dtype=np.int64)) != length):
            raise InvalidArgument(f"DenseSync: the keys [{offset}, {offset + rows}) must have one "
                                  f"value length (the first has {length})")
        self._packed = not store.uniform_length
        self.worker = worker
        self.keys = np.arange(offset, offset + rows, dtype=np.int64)
        # Host buffers, pinned when a parameter is on CUDA (asynchronous copies): the
        # parameters gathered, and the merged values pulled (the snapshot of the last step).
        pin = any(p.device.type == "cuda" for p in self.params)
        self._gathered = torch.zeros(rows * length, dtype=torch.float32, pin_memory=pin)
        self._pulled = torch.zeros(rows * length, dtype=torch.float32, pin_memory=pin)
        self._flat = self._gathered.numpy()
        worker.intent(self.keys, worker.clock, _FOREVER)
        if node.rank == 0:
            self._gather_params()
            worker.set(self.keys, self._values(self._flat))
            worker.wait()
        if node.world_size > 1:
            node.barrier(name="DenseSync")
            # A replica set up here before rank 0's values were in is refreshed by a round
            # that starts after the barrier.
            worker.wait_sync()
        self._snapshot = self._pull_into_params()

    @staticmethod
    def keys_needed(params, value_length: int) -> int:
        """How many keys of ``value_length`` floats the parameters take."""
        return -(-sum(p.numel() for p in params) // value_length)

    def step(self) -> None:
        """Push this node's change of the parameters since the last call, then set them to the
        current merged values (this node's pushes in, other nodes' as of the last sync round)."""
        self._gather_params()
        delta = self._flat - self._snapshot
        self.worker.push(self.keys, self._values(delta))
        self._snapshot = self._pull_into_params()

    def _values(self, flat: np.ndarray) -> np.ndarray:
        """``flat`` (all keys' floats) in the layout the node's set and push take."""
        return flat if self._packed else flat.reshape(len(self.keys), -1)

    def _gather_params(self) -> None:
        """The parameters into ``self._flat``: every copy issued, then one wait for those on
        CUDA."""
        at = 0
        for p in self.params:
            n = p.numel()
            self._gathered[at:at + n].copy_(p.detach().reshape(-1), non_blocking=True)
            at += n
        if self._gathered.is_pinned():
            torch.cuda.synchronize()

    def _pull_into_params(self) -> np.ndarray:
        """Pulls the merged values into the pinned buffer and copies them to the parameters
        (asynchronously on CUDA: the next gather's wait orders the buffer's reuse after them).
        Returns the values (a view of the buffer, valid until the next pull)."""
        values = self._pulled.numpy()
        self.worker.pull(self.keys, out=values if self._packed
                         else values.reshape(len(self.keys), -1))
        at = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(self._pulled[at:at + n].reshape(p.shape), non_blocking=True)
                at += n
        return values
