"""What the native engine passes (``adapm._native.Directory``) return, as numpy arrays.

Each pass returns bytearrays it sized itself (native/directory_module.c documents them); here
are their dtypes, in order, and the one helper that views them without copying.
"""

from __future__ import annotations

import numpy as np

_I8, _F4, _U8, _I1 = np.dtype("<i8"), np.dtype("<f4"), np.dtype("<u8"), np.dtype("i1")

# decide (and serve_sync's decision), per group: a count per rank, then the entries' arrays.
RELOCATIONS = (_I8, _I8, _F4, _I8, _U8, _U8, _I8)  # count, keys, values, versions, S, R, epochs
SETUPS = (_I8, _I8, _F4, _I8)  # count, keys, values, versions
HOME_UPDATES = (_I8, _I8, _I8, _I8)  # count, keys, owners, epochs
# serve_sync's answer: the keyed arrays of a SYNC_RESP (protocol.SCHEMA).
ANSWER = (_I8, _I8, _I8, _F4, _I8, _I8, _I8, _F4)
# round_requests: dropped keys, counts per section and rank, every entry's key, then the
# sections grouped by rank: intents (keys, positions, flags), deltas (keys, positions, rows,
# versions), checks (keys, positions, versions).
ROUND = (_I8, _I8, _I8, _I8, _I8, _I1, _I8, _I8, _F4, _I8, _I8, _I8, _I8)
KEYS = _I8


def views(buffers, dtypes) -> list:
    """numpy views of ``buffers`` (bytearrays from a native pass), one per dtype."""
    return [np.frombuffer(b, dtype=t) for b, t in zip(buffers, dtypes)]
