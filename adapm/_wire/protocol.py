"""Wire format: a binary header frame, then raw array frames. Never pickle.

One ZeroMQ message carries one or more *logical* messages to the same node (a bundle: the
communication thread sends everything it has for a peer after each pass of its loop in one
ZeroMQ message, in the order it was posted).

Frames of a ZeroMQ message (encoded and decoded in one native call, native/wire_module.c):

1. the headers, one per logical message, back to back: a fixed binary part (kind, sending rank,
   request id, and for keyed requests the origin rank, where answers go even when the request
   was forwarded, and the hops so far; every answer carries the id of its request), the byte
   length of each array (negative: the array has a frame of its own), and, for the few kinds
   that have them, extra fields as a msgpack map (an ERROR's text, a collective's epoch and
   kind, a failure notice's rank). In Python a header is a dict: ``k``, ``s``, ``i``, ``o``,
   ``h`` and the extra fields;
2. the payload: every small array, back to back, each starting at a multiple of 8 bytes;
3. one frame per large array (at least :data:`OWN_FRAME_BYTES`), sent without copying.

Small arrays share one frame because ZeroMQ's cost is per frame: a 6-array message costs ~50 us
of CPU as 7 frames and ~29 us as 2 (sender, I/O threads and receiver together; measured on the
2-core dev machine, 100 keys, 16 floats each). The array roles of each kind are fixed
(:data:`SCHEMA`), so a receiver wraps arrays with ``np.frombuffer`` without copying.

Keyed requests carry, besides the keys, each key's position in the origin's request. A node can
then serve part of a request and forward the rest, and the origin puts every partial answer in
its place. A keyed request has one or more *sections* (a ``SYNC`` has three: intent reports,
replica deltas, version checks), each starting with its keys and positions; the positions of
all sections together number the request's entries.

*Moves* (what an owner decided: keys relocated to the receiver, replicas for it, and home
updates for keys homed at the receiver) have no request of their own. They ride along with the
sync traffic that flows between two nodes every round anyway: ``SYNC`` and ``SYNC_RESP`` end with
the three move sections (:data:`MOVE_SECTIONS`, usually empty), and only moves that find no such
message in time go alone, as a ``MOVES`` message. A receiver takes a message's moves in before
the rest of it (a relocation before the answer that reports it). So two nodes exchange about one
message each way per round, whatever the owners decide. Empty move sections are left out on
the wire (the header lists fewer arrays) and read back as empty.
"""

from __future__ import annotations

import enum
from typing import Sequence

import msgpack
import numpy as np

from .._engine.routing import segment_index  # a pure helper: imports nothing of the engine
from .._native_loader import load as _load_native
from ..errors import TransportError


class Kind(enum.IntEnum):
    # keyed requests (served by the owner; forwarded or queued elsewhere)
    PULL = 1  # -> PULL_RESP
    PUSH = 2  # additive -> ACK
    SET = 3  # overwrite -> ACK
    SYNC = 4  # a sync round's request to one owner -> SYNC_RESP (sections: see SCHEMA)
    # answers (to the origin)
    PULL_RESP = 10
    ACK = 11
    SYNC_RESP = 12  # per entry: version (-1 for intent reports); new values where behind;
    #                 intent reports for keys not owned here: where to report them instead;
    #                 deltas and checks for keys that went to the origin: returned to it
    ERROR = 13  # header "msg": why a request could not be served
    FORWARDED = 14  # from a node that passed entries of the origin's request on: to which
    #                 ranks, how many entries each (so the origin knows whom it waits for)
    # owner -> node, unsolicited: relocations, replicas, home updates (MOVE_SECTIONS)
    MOVES = 20
    # control
    BARRIER = 30  # to rank 0: "e" sequence number of the collective, "t" its kind
    BARRIER_RELEASE = 31
    # liveness (handled by the engine loop, never by the state machine)
    HEARTBEAT = 32  # "I am alive"; sent only to peers that got nothing else for a while
    GOODBYE = 33  # a clean shutdown: this node's silence from now on is not a failure
    FAILED = 34  # "r": a rank this node found dead, "msg": how (every survivor stops)
    HELLO = 40  # rendezvous: "addr", "fp" (config fingerprint)
    TABLE = 41  # rendezvous answer: "addrs", "tok" (the job token)
    WAITING = 42  # rendezvous answer to a hello while ranks are missing: "missing"


_KINDS = {int(kind): kind for kind in Kind}

# Array roles. Per-key roles have one entry per key of their section; ROWS holds the keys'
# values packed back to back (a key's row length is its value length).
KEYS, POS, ROWS, FLAGS, VERSIONS, MASKS, RANKS = "keys", "pos", "rows", "flags", "ver", "mask", "rank"
COUNTS = "count"
DTYPES = {KEYS: np.dtype("<i8"), POS: np.dtype("<i8"), ROWS: np.dtype("<f4"),
          FLAGS: np.dtype("i1"), VERSIONS: np.dtype("<i8"), MASKS: np.dtype("<u8"),
          RANKS: np.dtype("<i8"), COUNTS: np.dtype("<i8")}

# SYNC sections, in order. Intents: "this node has intent: yes/no" per key. Deltas: a replica's
# accumulated updates and the version they are based on (a row as bfloat16 where the version
# says so: DELTA_NARROW below; a dropped replica's last delta, DELTA_LAST, gets no value back).
# Checks: a replica's version only.
INTENTS, DELTAS, CHECKS = 0, 1, 2

# Moves: relocations (key, value, version, intent mask S, replica mask R, epoch; a mask is
# ceil(world_size / 64) uint64 words per key), replicas (key, value, version), home updates
# (key, new owner, epoch).
RELOCATIONS, SETUPS, HOME_UPDATES = 0, 1, 2
MOVE_SECTIONS = ((KEYS, ROWS, VERSIONS, MASKS, MASKS, VERSIONS), (KEYS, ROWS, VERSIONS),
                 (KEYS, RANKS, VERSIONS))
MOVE_ARRAYS = sum(len(section) for section in MOVE_SECTIONS)

SCHEMA: dict[Kind, tuple[tuple[str, ...], ...]] = {
    Kind.PULL: ((KEYS, POS),),
    Kind.PUSH: ((KEYS, POS, ROWS),),
    Kind.SET: ((KEYS, POS, ROWS),),
    Kind.SYNC: ((KEYS, POS, FLAGS), (KEYS, POS, ROWS, VERSIONS), (KEYS, POS, VERSIONS),
                *MOVE_SECTIONS),
    Kind.PULL_RESP: ((POS, ROWS),),
    Kind.ACK: ((POS,),),
    Kind.SYNC_RESP: ((POS, VERSIONS, POS, ROWS, POS, RANKS, POS, ROWS), *MOVE_SECTIONS),
    Kind.MOVES: MOVE_SECTIONS,
    Kind.FORWARDED: ((RANKS, COUNTS),),
}
ROLES = {kind: tuple(role for section in sections for role in section)
         for kind, sections in SCHEMA.items()}
# Where each section's arrays are in a message's flat list: [(start, end)] per kind.
_SLICES = {kind: [(sum(len(s) for s in sections[:i]), sum(len(s) for s in sections[:i + 1]))
                  for i in range(len(sections))] for kind, sections in SCHEMA.items()}

# Request ids from here on belong to workers' pulls that the transport sends itself
# (native/zmq_calls.c, PULL_BASE); the engine's own count up from 1.
NATIVE_REQUESTS = 1 << 62
KEYED = frozenset({Kind.PULL, Kind.PUSH, Kind.SET, Kind.SYNC})
# Kinds that end with the move sections.
CARRIERS = frozenset({Kind.SYNC, Kind.SYNC_RESP, Kind.MOVES})
# Sections of a keyed request that hold keyed entries (the rest are moves).
_KEYED_SECTIONS = {Kind.PULL: 1, Kind.PUSH: 1, Kind.SET: 1, Kind.SYNC: 3}
ANSWERS = frozenset({Kind.PULL_RESP, Kind.ACK, Kind.SYNC_RESP, Kind.ERROR, Kind.BARRIER_RELEASE})

# Arrays at least this large get a frame of their own, sent without copying (pyzmq's own
# zero-copy threshold, zmq.COPY_THRESHOLD: below it, tracking a buffer costs more than a copy).
OWN_FRAME_BYTES = 65536
_ALIGN = 8


class Message:
    """One logical message. ``arrays`` are the kind's arrays, flat over its sections.

    Decoded arrays are read-only views of the received frames (the message keeps them alive).
    ``nbytes``: its share of the wire (header + arrays), for the byte counters.
    """

    __slots__ = ("kind", "src", "req_id", "header", "arrays", "nbytes")

    def __init__(self, kind: Kind, src: int, req_id: int, header: dict, arrays: list,
                 nbytes: int = 0) -> None:
        self.kind = kind
        self.src = src
        self.req_id = req_id
        self.header = header
        self.arrays = arrays
        self.nbytes = nbytes

    def sections(self) -> list[list[np.ndarray]]:
        """The arrays by section (moves included, for the kinds that carry them)."""
        arrays = self.arrays
        return [arrays[a:b] for a, b in _SLICES[self.kind]]

    def moves(self) -> list[np.ndarray]:
        """The move arrays of a carrier kind, flat over :data:`MOVE_SECTIONS`."""
        return self.arrays[-MOVE_ARRAYS:]

    def keys(self) -> np.ndarray:
        """The keys of a keyed request, all its keyed sections in order."""
        sections = self.sections()[:_KEYED_SECTIONS[self.kind]]
        if len(sections) == 1:
            return sections[0][0]
        return np.concatenate([s[0] for s in sections])


class Encoded:
    """A message that native code encoded for the wire already (a sync round's SYNC:
    ``Directory.round_build``): its ``frames``, which a transport sends as a wire message of
    their own, in order with the messages around it. ``kind``, ``src``, ``req_id`` and
    ``nbytes`` as :class:`Message`'s, for the counters."""

    __slots__ = ("kind", "src", "req_id", "frames", "nbytes")

    def __init__(self, kind: Kind, src: int, req_id: int, frames: list, nbytes: int) -> None:
        self.kind = kind
        self.src = src
        self.req_id = req_id
        self.frames = frames
        self.nbytes = nbytes


def runs(messages: Sequence) -> list:
    """``messages`` cut into what goes as one wire message each, in order: a run of
    :class:`Message` (encoded together), or one :class:`Encoded`."""
    out, run = [], []
    for m in messages:
        if type(m) is Encoded:
            if run:
                out.append(run)
                run = []
            out.append(m)
        else:
            run.append(m)
    if run:
        out.append(run)
    return out


def message(kind: Kind, src: int, req_id: int, arrays: Sequence[np.ndarray] = (),
            **fields) -> Message:
    """A message to send. Arrays must already have the kind's dtypes and be contiguous; the
    caller must not change them afterwards (they may be sent later, or read by a local thread)."""
    header = {"k": int(kind), "s": src, "i": req_id}
    header.update(fields)
    return Message(kind, src, req_id, header, list(arrays))


# Header fields that the binary header holds; any other field of a header (an ERROR's text, a
# collective's epoch and kind, a failure notice's rank) travels as msgpack after it.
_FIXED = frozenset({"k", "s", "i", "o", "h"})


def encode(messages: Sequence[Message]) -> list:
    """Frames of one ZeroMQ message carrying ``messages`` in order; sets each one's ``nbytes``.

    One native call (native/wire_module.c): the binary headers, the small arrays packed into
    one payload frame, the large ones as frames of their own (not copied).
    """
    frames, sizes = _native.wire_encode(specs(messages))
    for m, size in zip(messages, sizes):
        m.nbytes = size
    return frames


def specs(messages: Sequence[Message]) -> list:
    """What the native encoder takes for ``messages`` (``wire_encode``, ``ZmqIO.send``)."""
    out = []
    for m in messages:
        header = m.header
        extra = None
        if len(header) > 3 and not _FIXED.issuperset(header):
            extra = msgpack.packb({k: v for k, v in header.items() if k not in _FIXED})
        out.append((int(m.kind), m.src, m.req_id, header.get("o", -1), header.get("h", 0),
                    extra, m.arrays))
    return out


def decode(frames: Sequence) -> list[Message]:
    """Parse frames (bytes or zmq.Frame); arrays are zero-copy views of the frames.

    One native call parses the binary headers and makes the arrays; a malformed message
    (unknown kind, wrong number of arrays, lengths that do not fit the frames) raises
    TransportError, and nothing of it is used.
    """
    parsed, why = _native.wire_decode([_buffer(f) for f in frames])
    if why is not None:
        raise TransportError(f"malformed message: {why}")
    return messages_from(parsed)


def messages_from(parsed: list) -> list[Message]:
    """Messages of what the native decoder parsed (``wire_decode``, ``ZmqIO.poll``); raises
    TransportError if a header's extra fields are malformed."""
    out = []
    for kind, src, req_id, origin, hops, arrays, nbytes, extra in parsed:
        header = {"k": kind, "s": src, "i": req_id}
        if origin >= 0:
            header["o"] = origin
            header["h"] = hops
        if extra is not None:
            header = {**_extra_fields(extra), **header}
        out.append(Message(_KINDS[kind], src, req_id, header, arrays, nbytes))
    return out


def _extra_fields(extra: bytes) -> dict:
    try:
        fields = msgpack.unpackb(extra)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise TransportError(f"malformed message: extra header fields: {exc}") from exc
    if not isinstance(fields, dict):
        raise TransportError(f"malformed message: extra header fields are a "
                             f"{type(fields).__name__}, not a map")
    return fields


# A SYNC delta whose version (>= 0) has this bit came as bfloat16 (native/store.h,
# DELTA_NARROW): its row takes ceil(length / 2) floats on the wire, and the bit is not part of
# the version.
DELTA_NARROW = 1 << 62
# A SYNC delta whose version (>= 0) has this bit is a dropped replica's last (native/store.h,
# DELTA_LAST): the owner merges it and answers no value. Kept by :func:`widened`.
DELTA_LAST = 1 << 61


def widened(message: Message, store) -> Message:
    """A SYNC whose narrow (bfloat16) delta rows are float32 again and whose delta versions lose
    that mark (DELTA_LAST stays): what :func:`subset` slices by row lengths (entries passed on to
    another node, or waiting here for their keys). The message itself when none is narrow."""
    dkeys, rows, versions = message.arrays[3], message.arrays[5], message.arrays[6]
    narrow = (versions >> 62) == 1
    if not narrow.any():
        return message
    lens = store.lengths_of(dkeys)
    sent = np.where(narrow, (lens + 1) // 2, lens)  # floats each row took on the wire
    at, start = np.cumsum(sent) - sent, np.cumsum(lens) - lens
    out = np.empty(int(lens.sum()), dtype=np.float32)
    wide = ~narrow
    out[segment_index(start[wide], lens[wide])] = rows[segment_index(at[wide], lens[wide])]
    halves = rows.view(np.uint16)[segment_index(2 * at[narrow], lens[narrow])]
    out[segment_index(start[narrow], lens[narrow])] = \
        (halves.astype(np.uint32) << 16).view(np.float32)
    arrays = list(message.arrays)
    arrays[5], arrays[6] = out, np.where(narrow, versions & ~DELTA_NARROW, versions)
    return Message(message.kind, message.src, message.req_id, dict(message.header), arrays)



def subset(message: Message, index: np.ndarray, store) -> Message:
    """The part of a keyed request for its entries at ``index`` (ascending, into ``keys()``),
    without moves (they were for the node that received the message)."""
    arrays = []
    offset = 0
    keyed = _KEYED_SECTIONS[message.kind]
    for section, roles in zip(message.sections()[:keyed], SCHEMA[message.kind][:keyed]):
        keys = section[0]
        lo, hi = np.searchsorted(index, (offset, offset + len(keys)))
        picked = index[lo:hi] - offset
        offset += len(keys)
        for role, array in zip(roles, section):
            arrays.append(store.select_rows(array, keys, picked) if role == ROWS
                          else array[picked])
    if message.kind in CARRIERS:
        arrays.extend(NO_MOVES)
    return Message(message.kind, message.src, message.req_id, dict(message.header), arrays)


NO_MOVES = tuple(np.empty(0, dtype=DTYPES[role]) for section in MOVE_SECTIONS for role in section)

_native = _load_native()
# The native codec's arrays: numpy views made by np.frombuffer, a dtype per role (the letters
# of native/check.c), and the decoder's stand-ins for moves left out.
_LETTERS = {KEYS: "k", POS: "p", ROWS: "r", FLAGS: "f", VERSIONS: "v", MASKS: "m", RANKS: "n",
            COUNTS: "c"}
_native.wire_setup(np.frombuffer, {_LETTERS[role]: dtype for role, dtype in DTYPES.items()},
                   NO_MOVES)


def _buffer(frame):
    return frame.buffer if hasattr(frame, "buffer") else frame


def frame_bytes(frames: Sequence) -> int:
    """Total size of a ZeroMQ message's frames."""
    return sum(f.nbytes if isinstance(f, (np.ndarray, memoryview)) else len(f) for f in frames)
