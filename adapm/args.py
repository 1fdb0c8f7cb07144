"""Validation of user input. Every check runs before any state changes and names the argument."""

from __future__ import annotations

import numbers

import numpy as np

from .errors import InvalidArgument, InvalidType
from .store import Store, _native


def as_keys(keys, store: Store, name: str = "keys") -> np.ndarray:
    """Keys as a contiguous int64 array (any shape is flattened), range-checked.

    Accepts numpy integer arrays, sequences of ints and single ints. Floats, bools and objects
    are refused even when their values are whole numbers: a float key is almost always a bug.
    """
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
    flat = np.ascontiguousarray(arr.reshape(-1), dtype=np.int64)
    bad = _native.check_keys(flat, store.num_keys)
    if bad >= 0:
        raise InvalidArgument(f"{name}[{bad}] = {flat[bad]} is outside [0, {store.num_keys})")
    return flat


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
    if not isinstance(out, np.ndarray):
        raise InvalidType(f"out must be a numpy float32 array, got {type(out).__name__}")
    if out.dtype != np.float32:
        raise InvalidType(f"out must have dtype float32, got {out.dtype}")
    expected = value_shape(store, keys)
    if out.shape != expected:
        raise InvalidArgument(f"out has shape {out.shape}, expected {expected} for {len(keys)} keys")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise InvalidArgument("out must be C-contiguous and writable")
    return out


def as_clock(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidType(f"{name} must be an int clock, got {type(value).__name__}")
    if value < 0:
        raise InvalidArgument(f"{name} must be >= 0, got {value}")
    return int(value)
