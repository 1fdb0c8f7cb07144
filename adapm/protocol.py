"""Wire format: one msgpack header frame, then raw array frames. Never pickle.

The header is a small map: ``k`` (message kind), ``s`` (sender rank), ``i`` (request id; the
answer carries the same id), plus kind-specific scalar fields. The array frames that follow are
fixed per kind (:data:`SCHEMA`): keys are int64, values float32, versions int64, all
little-endian native numpy buffers, so a receiver wraps them with ``np.frombuffer`` without
copying.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

import msgpack
import numpy as np

from .errors import TransportError


class Kind(enum.IntEnum):
    PULL = 1  # keys -> PULL_RESP values
    PULL_RESP = 2
    PUSH = 3  # keys, values (additive) -> ACK
    SET = 4  # keys, values (overwrite) -> ACK
    ACK = 5
    ERROR = 6  # header "msg": why a request could not be served
    BARRIER = 7  # to rank 0: "e" epoch
    BARRIER_RELEASE = 8
    HELLO = 9  # rendezvous: "addr", "fp" (config fingerprint)
    TABLE = 10  # rendezvous answer: "addrs"


I64 = np.dtype("<i8")
F32 = np.dtype("<f4")

SCHEMA: dict[Kind, tuple[np.dtype, ...]] = {
    Kind.PULL: (I64,),
    Kind.PULL_RESP: (F32,),
    Kind.PUSH: (I64, F32),
    Kind.SET: (I64, F32),
}

# Kinds whose answer completes a waiting request.
ANSWERS = frozenset({Kind.PULL_RESP, Kind.ACK, Kind.ERROR, Kind.BARRIER_RELEASE})


@dataclass
class Message:
    kind: Kind
    src: int
    req_id: int
    header: dict
    arrays: list


def encode(kind: Kind, src: int, req_id: int, arrays: Sequence[np.ndarray] = (), **fields) -> list:
    """Frames of one message. Arrays must already have the kind's dtypes and be contiguous."""
    header = {"k": int(kind), "s": src, "i": req_id}
    header.update(fields)
    return [msgpack.packb(header), *arrays]


def decode(frames: Sequence) -> Message:
    """Parse frames (bytes or zmq.Frame); arrays are zero-copy views of the frames."""
    try:
        header = msgpack.unpackb(_buffer(frames[0]))
        kind = Kind(header["k"])
        dtypes = SCHEMA.get(kind, ())
        if len(frames) - 1 != len(dtypes):
            raise ValueError(f"{kind.name} carries {len(frames) - 1} arrays, expected {len(dtypes)}")
        arrays = [np.frombuffer(_buffer(f), dtype=d) for f, d in zip(frames[1:], dtypes)]
        return Message(kind, int(header["s"]), int(header["i"]), header, arrays)
    except (ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
        raise TransportError(f"malformed message: {exc}") from exc


def _buffer(frame):
    return frame.buffer if hasattr(frame, "buffer") else frame


def frame_bytes(frames: Sequence) -> int:
    """Total payload size of a message's frames, for the byte counters."""
    return sum(f.nbytes if isinstance(f, (np.ndarray, memoryview)) else len(f) for f in frames)
