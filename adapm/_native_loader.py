"""Loads the compiled extension; a missing build fails loudly with the command that fixes it."""

from __future__ import annotations

import importlib

from .errors import AdaPMError

FIX = "pip install -e '.[dev]'  (or: make install) in the adapm source tree"


def load(name: str = "adapm._native"):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise AdaPMError(
            f"adapm's native extension {name} is not built or does not load ({exc}). "
            f"Build it with: {FIX}"
        ) from exc


def name_thread(name: str) -> None:
    """Names the calling OS thread (what ``top -H``, ``ps -L``, perf and gdb show; its first
    15 bytes): the library's threads call it first, so that a profile tells them apart."""
    load().name_thread(name)
