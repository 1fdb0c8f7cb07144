"""Loads the compiled extension; a missing build fails loudly with the command that fixes it."""

from __future__ import annotations

import importlib

from .errors import AdaPMError

FIX = "pip install -e '.[dev]'  (or: make install) in the adapm source tree"


def load():
    try:
        return importlib.import_module("adapm._native")
    except ImportError as exc:
        raise AdaPMError(
            f"adapm's native extension adapm._native is not built or does not load ({exc}). "
            f"Build it with: {FIX}"
        ) from exc
