"""Whether an output path can be written, checked before any work starts: each check returns
one line saying why not (for ``parser.error``), or None. The apps check their outputs
(``--json``, ``--export``, ``--trace-dir``, ``--checkpoint-dir``) and the data generators their
output directory this way, so a mistake costs a line and exit code 2, not a traceback after
the work."""

from __future__ import annotations

import os
import tempfile
from typing import Optional


def file_problem(path) -> Optional[str]:
    """Why --json ``path`` could not be appended to, or None ('-' is stdout)."""
    if not path or path == "-":
        return None
    if os.path.isdir(path):
        return f"--json {path}: is a directory, not a file"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"--json {path}: directory {parent} does not exist"
    if not os.access(parent if not os.path.exists(path) else path, os.W_OK):
        return f"--json {path}: not writable"
    # os.access cannot tell everything (root on a read-only mount, /proc): open it as the run
    # will. An empty file left by a run that fails later is what --json would leave anyway.
    try:
        open(path, "a").close()
    except OSError as exc:
        return f"--json {path}: cannot write: {exc.strerror}"
    return None


def directory_problem(path, flag: Optional[str] = None) -> Optional[str]:
    """Why directory ``path`` could not be created or written into, or None; the line starts
    with ``flag`` (the option that named it: "--export") where given."""
    if not path:
        return None
    problem = _directory_problem(path)
    return f"{flag} {problem}" if problem and flag else problem


def _directory_problem(path) -> Optional[str]:
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path}: exists and is not a directory"
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{path}: {existing} is a file, so the directory cannot be made"
    if not os.access(existing, os.W_OK):
        return f"{path}: {existing} is not writable"
    # os.access cannot tell everything (root on a read-only mount, /proc): write a file there.
    try:
        fd, probe = tempfile.mkstemp(prefix=".adapm-probe-", dir=existing)
    except OSError as exc:
        return f"{path}: cannot write into {existing}: {exc.strerror}"
    os.close(fd)
    os.unlink(probe)
    return None
