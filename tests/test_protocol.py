"""The wire format: every kind round-trips, and mangled frames are rejected, never misread.

Messages of every kind with random arrays (some large enough for a frame of their own) are
encoded and decoded back exactly. Then the frames are mangled — bytes flipped, frames cut,
extended, dropped, duplicated or replaced by random bytes — and decoding must either raise
TransportError or return messages that match the schema (kinds known, one array per role, the
role's dtype): a mangled message never crashes the decoder with another exception.
"""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from adapm._wire.protocol import (
    DTYPES, OWN_FRAME_BYTES, ROLES, SCHEMA, Kind, decode, encode, message,
)
from adapm.errors import TransportError

_KINDS_WITH_ARRAYS = sorted(SCHEMA)
_FIELDS = {Kind.BARRIER: {"e": 3}, Kind.BARRIER_RELEASE: {"e": 3}, Kind.ERROR: {"msg": "x"}}


@st.composite
def messages(draw):
    kind = draw(st.sampled_from(_KINDS_WITH_ARRAYS + [Kind.BARRIER, Kind.BARRIER_RELEASE,
                                                       Kind.ERROR]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    big = draw(st.booleans())
    arrays = []
    for role in ROLES.get(kind, ()):
        n = int(rng.integers(0, 6))
        if big and role == "rows":
            n = OWN_FRAME_BYTES // 4 + int(rng.integers(0, 50))  # a frame of its own
        arrays.append(rng.integers(-5, 5, n).astype(DTYPES[role]))
    fields = dict(_FIELDS.get(kind, {}))
    if kind in (Kind.PULL, Kind.PUSH, Kind.SET, Kind.SYNC):
        fields["o"] = draw(st.integers(0, 3))
    return message(kind, draw(st.integers(0, 3)), draw(st.integers(0, 2**40)), arrays, **fields)


def _as_bytes(frame) -> bytes:
    return frame.tobytes() if isinstance(frame, np.ndarray) else bytes(frame)


@given(st.lists(messages(), min_size=1, max_size=4))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_kind_round_trips(batch):
    frames = [_as_bytes(f) for f in encode(batch)]
    got = decode(frames)
    assert [m.kind for m in got] == [m.kind for m in batch]
    for sent, received in zip(batch, got):
        assert (received.src, received.req_id) == (sent.src, sent.req_id)
        assert len(received.arrays) == len(sent.arrays)
        for a, b in zip(sent.arrays, received.arrays):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        for name, value in sent.header.items():
            assert received.header[name] == value


mangles = st.sampled_from(["flip", "cut", "extend", "drop", "duplicate", "random", "swap"])


@given(st.lists(messages(), min_size=1, max_size=3), st.lists(st.tuples(mangles,
       st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4))
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mangled_frames_are_rejected_or_match_the_schema(batch, edits):
    frames = [bytearray(_as_bytes(f)) for f in encode(batch)]
    for how, where, value in edits:
        i = where % len(frames)
        frame = frames[i]
        if how == "flip" and frame:
            frame[where % len(frame)] ^= value or 1
        elif how == "cut":
            del frame[where % (len(frame) + 1):]
        elif how == "extend":
            frame.extend(bytes([value]) * (1 + where % 17))
        elif how == "drop" and len(frames) > 1:
            del frames[i]
        elif how == "duplicate":
            frames.insert(i, bytearray(frame))
        elif how == "random":
            frames[i] = bytearray(np.random.default_rng(where).integers(0, 256, where % 64,
                                                                       dtype=np.uint8))
        elif how == "swap" and len(frames) > 1:
            j = (i + 1) % len(frames)
            frames[i], frames[j] = frames[j], frames[i]
    try:
        got = decode([bytes(f) for f in frames])
    except TransportError:
        return
    for m in got:
        assert m.kind in Kind.__members__.values()
        roles = ROLES.get(m.kind, ())
        assert len(m.arrays) == len(roles)
        for role, array in zip(roles, m.arrays):
            assert array.dtype == DTYPES[role]
        assert isinstance(m.src, int) and isinstance(m.req_id, int)


odd_lengths = st.one_of(st.sampled_from([0, 8, 16, -8, -65536, 3, -3, 2**63 - 1, -(2**63)]),
                        st.integers(-2**63, 2**63 - 1))


@st.composite
def binary_headers(draw):
    """A binary header (native/wire_module.c) with any field values: kinds known and not, array
    counts right and wrong, lengths huge, negative, not whole items; flags and extra fields."""
    kind = draw(st.one_of(st.sampled_from([int(k) for k in Kind]), st.integers(0, 255)))
    lengths = draw(st.lists(odd_lengths, max_size=24))
    flags = draw(st.sampled_from([0, 0, 1, 2]))
    head = struct.pack("<BBBBiqii", draw(st.sampled_from([0xB1, 0xB1, 0x83])), kind,
                       len(lengths), flags, draw(st.integers(-2**31, 2**31 - 1)),
                       draw(st.integers(-2**63, 2**63 - 1)), draw(st.integers(-2**31, 2**31 - 1)),
                       draw(st.integers(-2**31, 2**31 - 1)))
    head += struct.pack(f"<{len(lengths)}q", *lengths)
    if flags & 1:
        extra = draw(st.one_of(st.binary(max_size=12), st.just(b"\x81\xa1k\x07"),
                               st.just(b"\x81\xa1e\x03"), st.just(b"\x05")))
        head += struct.pack("<I", len(extra) + draw(st.sampled_from([0, 0, 1, 2**31]))) + extra
    return head


@given(st.lists(binary_headers(), min_size=1, max_size=3), st.binary(max_size=64),
       st.lists(st.binary(max_size=70000), max_size=2))
@example([struct.pack("<BBBBiqiiq", 0xB1, 11, 1, 0, 1, 1, -1, 0, 2**63 - 1)], b"\0" * 8, [])
@example([struct.pack("<BBBBiqiiq", 0xB1, 11, 1, 0, 1, 1, -1, 0, -(2**63))], b"", [])
@example([struct.pack("<BBBBiqiiq", 0xB1, 11, 1, 0, 1, 1, -1, 0, -8)], b"", [b"\0" * 16])
@settings(max_examples=500, deadline=None)
def test_odd_headers_are_rejected_or_match_the_schema(headers, payload, own):
    """Binary headers with wrong or extreme field values: rejected (TransportError), or read as
    messages that match the schema, with extra fields that cannot override the fixed ones."""
    try:
        got = decode([b"".join(headers), payload, *own])
    except TransportError:
        return
    for m in got:
        assert type(m.src) is int and type(m.req_id) is int
        assert m.header["k"] == int(m.kind) and m.header["s"] == m.src
        assert len(m.arrays) == len(ROLES.get(m.kind, ()))
        for role, array in zip(ROLES.get(m.kind, ()), m.arrays):
            assert array.dtype == DTYPES[role]


@given(st.lists(st.binary(max_size=200), max_size=5))
@settings(max_examples=300, deadline=None)
def test_random_bytes_are_rejected_or_match_the_schema(frames):
    try:
        got = decode(frames)
    except TransportError:
        return
    for m in got:
        assert len(m.arrays) == len(ROLES.get(m.kind, ()))


def test_the_native_checks_read_the_same_schema():
    """native/check.c reads each kind's arrays by its own copy of the schema: it must agree."""
    from adapm._native_loader import load

    letters = {"keys": "k", "pos": "p", "rows": "r", "flags": "f", "ver": "v", "mask": "m",
               "rank": "n", "count": "c"}
    native = load()
    for kind in Kind:
        roles = native.wire_roles(int(kind))
        if kind not in SCHEMA:
            assert roles is None, kind
            continue
        assert roles is not None, kind
        expected = ["".join(letters[r] for r in section) for section in SCHEMA[kind]]
        assert roles.rstrip("|").split("|") == expected, kind
