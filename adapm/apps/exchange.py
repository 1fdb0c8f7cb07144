"""Small collective exchanges between the nodes of an app, through reserved keys of the PM.

The apps need a few collectives besides training: per-epoch numbers of every node (times,
losses, ``stats()``) and the parts of a distributed evaluation, gathered on every node. Rather
than a second channel, each rank writes a JSON document into its own reserved keys (``set``),
the nodes meet, and every rank reads all of them: the parameter manager is the blackboard, as
the original AdaPM apps aggregate evaluation results through the PS.

Bytes travel as float32 values in [0, 65535] (two bytes each), which every path of the PM
copies exactly; no bit pattern of a payload can be a NaN that a copy might rewrite.
"""

from __future__ import annotations

import json
import math

import numpy as np

from ..errors import AdaPMError

# Room per rank for one JSON document: a node's stats() (~60 counters) takes ~2 KiB.
PAYLOAD_BYTES = 16 * 1024
_HEADER_FLOATS = 2  # the payload's length, as two 16-bit halves


def keys_per_rank(row_floats: int) -> int:
    """Reserved keys each rank needs when a key holds ``row_floats`` floats."""
    return math.ceil((PAYLOAD_BYTES // 2 + _HEADER_FLOATS) / row_floats)


class Exchange:
    """All-gather of JSON documents over the keys [base, base + world_size * keys_per_rank).

    Collective: every node calls :meth:`allgather` the same number of times, from one thread.
    Blocking (two barriers); raises what ``barrier`` raises on a peer that does not come.
    """

    def __init__(self, node, worker, base: int, row_floats: int, uniform: bool) -> None:
        """``uniform``: the job has one value length (pull/set take (n, row_floats) arrays)."""
        self._node, self._worker = node, worker
        self._uniform = uniform
        self._row_floats = row_floats
        self._per_rank = keys_per_rank(row_floats)
        self._base = base

    @staticmethod
    def num_keys(world_size: int, row_floats: int) -> int:
        return world_size * keys_per_rank(row_floats)

    def allgather(self, document) -> list:
        """Every rank's ``document`` (JSON-serialisable), in rank order."""
        node, w = self._node, self._worker
        data = np.frombuffer(json.dumps(document).encode(), dtype=np.uint8)
        if len(data) > PAYLOAD_BYTES:
            raise AdaPMError(f"rank {node.rank}: exchange payload of {len(data)} bytes exceeds "
                             f"{PAYLOAD_BYTES}")
        size = self._per_rank * self._row_floats
        floats = np.zeros(size, dtype=np.float32)
        floats[0], floats[1] = len(data) >> 16, len(data) & 0xFFFF
        padded = np.zeros(len(data) + len(data) % 2, dtype=np.uint8)
        padded[:len(data)] = data
        floats[_HEADER_FLOATS:_HEADER_FLOATS + len(padded) // 2] = padded.view("<u2")
        mine = self._base + node.rank * self._per_rank + np.arange(self._per_rank)
        w.set(mine, floats.reshape(self._per_rank, -1) if self._uniform else floats)
        w.wait()
        node.barrier()
        every = w.pull(self._base + np.arange(node.world_size * self._per_rank)).reshape(-1)
        node.barrier()  # nobody writes the next round before everyone has read this one
        out = []
        for rank in range(node.world_size):
            part = every[rank * size:(rank + 1) * size]
            length = (int(part[0]) << 16) | int(part[1])
            if length > PAYLOAD_BYTES or not np.all(part == np.rint(part)):
                raise AdaPMError(f"rank {node.rank}: exchange slot of rank {rank} is corrupt")
            halves = part[_HEADER_FLOATS:_HEADER_FLOATS + (length + 1) // 2].astype("<u2")
            out.append(json.loads(halves.view(np.uint8)[:length].tobytes()))
        return out


class LocalExchange:
    """The exchange of a one-process run (the baseline): nothing to meet."""

    def allgather(self, document) -> list:
        return [json.loads(json.dumps(document))]
