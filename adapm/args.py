"""Validation of user input. Every check runs before any state changes and names the argument."""

from __future__ import annotations

import math
import numbers
from typing import Optional

import numpy as np

from .errors import InvalidArgument, InvalidType
from ._store import Store, _native


_INT64 = np.dtype(np.int64)
_FLOAT32 = np.dtype(np.float32)


def as_keys(keys, store: Store, name: str = "keys", check_range: bool = True) -> np.ndarray:
    """Keys as a contiguous int64 array (any shape is flattened), range-checked.

    Accepts numpy integer arrays, sequences of ints and single ints. Floats, bools and objects
    are refused even when their values are whole numbers: a float key is almost always a bug.

    ``check_range=False`` leaves the range check to the caller, for callers whose next step is a
    native store call (which range-checks every batch anyway, raising IndexError): on any error
    such a caller calls :func:`check_range_of` before raising, so a bad key is still reported first
    and as :class:`InvalidArgument`. Unsigned keys are always checked here (they are cast).
    """
    # Fast path for what training loops pass: a 1-d int64 array (exact type, native byte order;
    # anything else takes the general path below). A pull of 1k keys takes ~13 us in C, so each
    # generic numpy call here (reshape, ascontiguousarray: ~0.15 us) and the range pass (~0.4 us
    # for 1k keys) shows: bench/store.py.
    if type(keys) is np.ndarray and keys.dtype is _INT64 and keys.ndim == 1:
        flat = keys if keys.flags.c_contiguous else np.ascontiguousarray(keys)
    else:
        flat = _as_keys_general(keys, store, name)
    if check_range:
        check_range_of(flat, store, name)
    return flat


def check_range_of(flat: np.ndarray, store: Store, name: str = "keys") -> None:
    """Raise InvalidArgument naming the first key of ``flat`` (int64) outside [0, num_keys)."""
    bad = _native.check_keys(flat, store.num_keys)
    if bad >= 0:
        raise InvalidArgument(f"{name}[{bad}] = {flat[bad]} is outside [0, {store.num_keys})")


def _as_keys_general(keys, store: Store, name: str) -> np.ndarray:
    if isinstance(keys, np.ndarray):
        arr = keys
    elif isinstance(keys, numbers.Integral) and not isinstance(keys, bool):
        arr = np.array([keys])
    else:
        try:
            arr = np.asarray(keys)
        except Exception as exc:
            raise InvalidType(f"{name}: cannot read {type(keys).__name__} as integer keys") from exc
        if arr.size == 0:
            arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise InvalidType(f"{name} must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) >= store.num_keys:
        bad = int(np.argmax(arr.reshape(-1) >= store.num_keys))
        raise InvalidArgument(f"{name}[{bad}] = {arr.reshape(-1)[bad]} is outside [0, {store.num_keys})")
    return np.ascontiguousarray(arr.reshape(-1), dtype=np.int64)


def value_shape(store: Store, keys: np.ndarray) -> tuple:
    """Shape of the values of ``keys``: (n, L) for a uniform length, (total floats,) otherwise."""
    if store.uniform_length:
        return (len(keys), store.uniform_length)
    return (store.floats_for(keys),)


def as_values(values, store: Store, keys: np.ndarray, name: str) -> np.ndarray:
    """Values for ``keys`` as a contiguous float32 array of :func:`value_shape`.

    numpy arrays must already be float32 (a silent cast would hide a bug and cost a copy);
    plain sequences are converted. A uniform length of 1 also accepts shape (n,).
    """
    if type(values) is np.ndarray and values.dtype is _FLOAT32:  # the common case, cheaply
        expected = value_shape(store, keys)
        if values.shape == expected and values.flags.c_contiguous:
            return values
    if isinstance(values, np.ndarray):
        if values.dtype != np.float32:
            raise InvalidType(f"{name} must have dtype float32, got {values.dtype}")
        arr = values
    elif hasattr(values, "__array__") or isinstance(values, (list, tuple)):
        try:
            arr = np.asarray(values, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise InvalidType(f"{name}: cannot read {type(values).__name__} as float32") from exc
    else:
        raise InvalidType(f"{name} must be a float32 array, got {type(values).__name__}")
    expected = value_shape(store, keys)
    if arr.shape != expected and not (store.uniform_length == 1 and arr.shape == expected[:1]):
        raise InvalidArgument(f"{name} has shape {arr.shape}, expected {expected} for {len(keys)} keys")
    return np.ascontiguousarray(arr)


def check_out(out, store: Store, keys: np.ndarray) -> np.ndarray:
    """A caller's output buffer: float32, C-contiguous, writable, of :func:`value_shape`."""
    if type(out) is np.ndarray and out.dtype is _FLOAT32:  # the common case, cheaply
        flags = out.flags
        if out.shape == value_shape(store, keys) and flags.c_contiguous and flags.writeable:
            return out
    if not isinstance(out, np.ndarray):
        raise InvalidType(f"out must be a numpy float32 array, got {type(out).__name__}")
    if out.dtype != np.float32:
        raise InvalidType(f"out must have dtype float32, got {out.dtype}")
    expected = value_shape(store, keys)
    if out.shape != expected:
        raise InvalidArgument(f"out has shape {out.shape}, expected {expected} for {len(keys)} keys")
    flags = out.flags
    if not flags.c_contiguous or not flags.writeable:
        raise InvalidArgument("out must be C-contiguous and writable")
    return out


# The largest clock: far beyond any run (a clock per microsecond for 146,000 years), and room
# in an int64 for what is computed from it (end = start + 1). An intent "for ever" ends here.
MAX_CLOCK = 1 << 62


def as_clock(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidType(f"{name} must be an int clock, got {type(value).__name__}")
    if value < 0:
        raise InvalidArgument(f"{name} must be >= 0, got {value}")
    if value > MAX_CLOCK:  # never a raw OverflowError
        raise InvalidArgument(f"{name} must be <= 2**62, got {value}")
    return int(value)


def as_timeout(value, name: str = "timeout_s") -> Optional[float]:
    """``value`` as a timeout in seconds: None (the configured default) or a finite number > 0.
    NaN would wait forever and a negative number not at all, so both are errors."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidType(f"{name} must be a number of seconds or None, got "
                          f"{type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgument(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)
