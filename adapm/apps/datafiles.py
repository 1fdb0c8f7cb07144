"""What the apps' data files share: :class:`DataError`, where in a file a byte offset is, and
writing a file whole or not at all."""

from __future__ import annotations

import os
from typing import BinaryIO, Callable

from ..errors import AdaPMError


class DataError(AdaPMError, ValueError):
    """A data file is missing, empty or malformed; the message names the file and the line."""


def line_at(data: bytes, offset: int) -> tuple[int, str]:
    """The 1-based number and the text (shortened) of the line of ``data`` holding ``offset``."""
    start = data.rfind(b"\n", 0, offset) + 1
    end = data.find(b"\n", offset)
    text = data[start:end if end >= 0 else len(data)].decode("utf-8", "replace")
    return data.count(b"\n", 0, offset) + 1, text if len(text) <= 80 else text[:77] + "..."


def write_atomically(path, write: Callable[[BinaryIO], object]) -> None:
    """``write(f)`` into ``path + ".tmp"`` (binary), then rename it over ``path``: readers see the
    old file or the whole new one, never a part."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)
