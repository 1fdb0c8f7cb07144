"""Wire format: one msgpack header frame, then raw array frames. Never pickle.

The header is a small map: ``k`` (message kind), ``s`` (sending rank), ``i`` (request id; every
answer carries the id of its request), and for keyed requests ``o`` (origin rank: answers go
there, even when the request was forwarded) and ``h`` (hops so far). The array frames that follow
are fixed per kind (:data:`SCHEMA`), so a receiver wraps them with ``np.frombuffer`` without
copying.

Keyed requests carry, besides the keys, each key's position in the origin's request. A node can
then serve part of a request and forward the rest, and the origin puts every partial answer in
its place.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

import msgpack
import numpy as np

from .errors import TransportError


class Kind(enum.IntEnum):
    # keyed requests (served by the owner; forwarded or queued elsewhere)
    PULL = 1  # -> PULL_RESP
    PUSH = 2  # additive -> ACK
    SET = 3  # overwrite -> ACK
    INTENT = 4  # "this node has intent: yes/no" per key -> ACK
    DELTA = 5  # replica delta + holder's version -> SYNC_RESP
    CHECK = 6  # holder's version only -> SYNC_RESP
    # answers (to the origin)
    PULL_RESP = 10
    ACK = 11
    SYNC_RESP = 12  # new versions; new values where the holder was behind
    ERROR = 13  # header "msg": why a request could not be served
    # owner -> node, unsolicited
    RELOCATE = 20  # the key moves: value, version, intent and replica masks, epoch
    SETUP = 21  # a replica for the receiver
    OWNER_UPDATE = 22  # to a key's home: new owner and epoch
    # control
    BARRIER = 30  # to rank 0: "e" epoch
    BARRIER_RELEASE = 31
    WAKE = 32  # from a local thread to its communication thread: "w" worker index or -1
    HELLO = 40  # rendezvous: "addr", "fp" (config fingerprint)
    TABLE = 41  # rendezvous answer: "addrs"


# Array roles. Per-key roles have one entry per key of the message; ROWS holds the keys'
# values packed back to back (a key's row length is its value length).
KEYS, POS, ROWS, FLAGS, VERSIONS, MASKS, RANKS = "keys", "pos", "rows", "flags", "ver", "mask", "rank"
DTYPES = {KEYS: "<i8", POS: "<i8", ROWS: "<f4", FLAGS: "i1", VERSIONS: "<i8", MASKS: "<u8",
          RANKS: "<i8"}

SCHEMA: dict[Kind, tuple[str, ...]] = {
    Kind.PULL: (KEYS, POS),
    Kind.PUSH: (KEYS, POS, ROWS),
    Kind.SET: (KEYS, POS, ROWS),
    Kind.INTENT: (KEYS, POS, FLAGS),
    Kind.DELTA: (KEYS, POS, ROWS, VERSIONS),
    Kind.CHECK: (KEYS, POS, VERSIONS),
    Kind.PULL_RESP: (POS, ROWS),
    Kind.ACK: (POS,),
    Kind.SYNC_RESP: (POS, VERSIONS, POS, ROWS),
    Kind.RELOCATE: (KEYS, ROWS, VERSIONS, MASKS, MASKS, VERSIONS),
    Kind.SETUP: (KEYS, ROWS, VERSIONS),
    Kind.OWNER_UPDATE: (KEYS, RANKS, VERSIONS),
}

KEYED = frozenset({Kind.PULL, Kind.PUSH, Kind.SET, Kind.INTENT, Kind.DELTA, Kind.CHECK})
ANSWERS = frozenset({Kind.PULL_RESP, Kind.ACK, Kind.SYNC_RESP, Kind.ERROR, Kind.BARRIER_RELEASE})


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
        roles = SCHEMA.get(kind, ())
        if len(frames) - 1 != len(roles):
            raise ValueError(f"{kind.name} carries {len(frames) - 1} arrays, expected {len(roles)}")
        arrays = [np.frombuffer(_buffer(f), dtype=DTYPES[r]) for f, r in zip(frames[1:], roles)]
        return Message(kind, int(header["s"]), int(header["i"]), header, arrays)
    except (ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
        raise TransportError(f"malformed message: {exc}") from exc


def subset(message: Message, index: np.ndarray, store) -> Message:
    """The part of a keyed request for the keys at ``index`` (positions into its keys)."""
    keys = message.arrays[0]
    arrays = []
    for role, array in zip(SCHEMA[message.kind], message.arrays):
        arrays.append(store.select_rows(array, keys, index) if role == ROWS else array[index])
    return Message(message.kind, message.src, message.req_id, dict(message.header), arrays)


def _buffer(frame):
    return frame.buffer if hasattr(frame, "buffer") else frame


def frame_bytes(frames: Sequence) -> int:
    """Total payload size of a message's frames, for the byte counters."""
    return sum(f.nbytes if isinstance(f, (np.ndarray, memoryview)) else len(f) for f in frames)
