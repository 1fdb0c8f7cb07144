"""Checkpoint files: every key's value once, in plain formats, replaced atomically.

A checkpoint is a directory ``path``:

==============================  =========================================================
``manifest.json``               format and version, ``num_keys``, the value lengths, the
                                world size and number of shards that wrote it, every
                                file's sha256 and row count, the user's ``meta``
``shard-RRRRR.keys.npy``        int64, strictly ascending: the keys rank R held as main copy
``shard-RRRRR.values.npy``      float32, flat: those keys' values back to back, in key order
``value_lengths.npy``           int64 per key, only when value lengths differ per key
==============================  =========================================================

The shards partition ``[0, num_keys)``: every key is in exactly one of them, whichever node
held it, so a checkpoint does not depend on where keys were and restores on any number of
nodes. A value is all of a key's floats, including whatever the application keeps in it
(optimizer accumulators). Any tool that reads ``.npy`` (numpy, or its documented header plus
raw little-endian data) reads the files; a key's values start at the sum of the lengths of the
shard's keys before it.

Atomic replacement. Writers fill the sibling directory ``<path>.partial`` (the manifest last),
then one process swaps it in: rename ``path`` to ``<path>.previous``, rename ``<path>.partial``
to ``path``, delete ``<path>.previous``. At every instant one complete checkpoint can be found:
at ``path`` when it has a manifest, else (a crash between the two renames) at
``<path>.previous``, which :meth:`Checkpoint.open` falls back to. The next checkpoint to the
same path cleans up after a crashed one (moves ``<path>.previous`` back when ``path`` is
missing, removes a stale ``.partial`` or ``.previous``).

This module is the file format and the swap; :meth:`adapm.Node.checkpoint` runs the collective
protocol (which node writes what, and when) around :class:`ShardWriter`.
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

import numpy as np

from .errors import CheckpointError, ConfigError, InvalidArgument

FORMAT = "adapm-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
LENGTHS_FILE = "value_lengths.npy"
PARTIAL_SUFFIX = ".partial"
PREVIOUS_SUFFIX = ".previous"
KEY_DTYPE = np.dtype("<i8")
VALUE_DTYPE = np.dtype("<f4")
# Floats read from the store per call while a shard is written (16 MiB): bounds the memory a
# checkpoint needs beyond the store, whatever a node holds.
BATCH_FLOATS = 1 << 22
# Bytes per read while hashing a file.
HASH_BLOCK = 1 << 20
# Keys shown in an error message.
_SHOWN = 5

PathLike = Union[str, "os.PathLike[str]"]


def shard_files(rank: int) -> tuple[str, str]:
    """File names of rank ``rank``'s shard: (keys, values)."""
    return f"shard-{rank:05d}.keys.npy", f"shard-{rank:05d}.values.npy"


def _shard_info_file(rank: int) -> str:
    return f"shard-{rank:05d}.json"


def _failure_file(rank: int) -> str:
    return f"shard-{rank:05d}.failed.json"


def _verdict_file(attempt: int) -> str:
    return f"verdict-{attempt}.json"


_PREPARED = "prepared.json"


def _final_path(path: PathLike) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgument(f"path: a directory path (str or os.PathLike), got "
                              f"{type(path).__name__}")
    text = os.fspath(path)
    if not text:
        raise InvalidArgument("path: must not be empty")
    return os.path.abspath(text)


# --- writing -----------------------------------------------------------------------------------


class _HashingWriter:
    """A binary file that hashes and counts what goes through it (np.lib.format writes its
    header here)."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        self.bytes += len(view)
        return self.handle.write(view)


class _NpyStream:
    """A 1-d ``.npy`` file written piece by piece, under a temporary name until :meth:`close`
    renames it into place (a reader never sees half a file under the final name)."""

    def __init__(self, path: str, dtype: np.dtype, length: int) -> None:
        self.path, self.dtype, self.length = path, dtype, length
        self._temp = path + ".tmp"
        # Open across calls (write, then close or abandon): no context manager fits.
        self._handle = open(self._temp, "wb")  # noqa: SIM115
        self._out = _HashingWriter(self._handle)
        self._written = 0
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
                  "shape": (length,)}
        np.lib.format.write_array_header_1_0(self._out, header)

    def write(self, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array, dtype=self.dtype)
        self._written += len(array)
        if self._written > self.length:
            raise CheckpointError(f"{self.path}: more than the announced {self.length} entries")
        self._out.write(array)

    def close(self) -> dict:
        """Flush to disk and rename into place; returns the file's manifest entry."""
        if self._written != self.length:
            raise CheckpointError(f"{self.path}: {self._written} entries written, "
                                  f"{self.length} announced")
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        os.replace(self._temp, self.path)
        return {"sha256": self._out.sha256.hexdigest(), "bytes": self._out.bytes,
                "rows": self.length}

    def abandon(self) -> None:
        self._handle.close()
        try:
            os.remove(self._temp)
        except OSError:
            pass


def _write_npy(path: str, array: np.ndarray, dtype: np.dtype) -> dict:
    stream = _NpyStream(path, dtype, len(array))
    try:
        stream.write(array)
        return stream.close()
    except BaseException:
        stream.abandon()
        raise


def _write_json(path: str, document) -> None:
    """``document`` as JSON at ``path``, atomically (temporary name, fsync, rename)."""
    temp = path + ".tmp"
    with open(temp, "w") as f:
        json.dump(document, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def _read_json(path: str):
    with open(path) as f:
        return json.load(f)


def _fsync_dir(path: str) -> None:
    """Make renames and new entries in directory ``path`` durable (where the OS allows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems do not sync directories; the rename order still holds
        pass
    finally:
        os.close(fd)


def _has_manifest(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, MANIFEST))


def _lengths_array(num_keys: int, value_length) -> np.ndarray | None:
    """Per-key lengths as int64, or None for one uniform length."""
    if isinstance(value_length, (int, np.integer)):
        return None
    lengths = np.asarray(value_length, dtype=np.int64)
    if lengths.shape != (num_keys,):
        raise InvalidArgument(f"value_length: {lengths.shape} entries for {num_keys} keys")
    return lengths


def _batches(keys: np.ndarray, lengths: np.ndarray | None, uniform: int,
             max_floats: int) -> list[slice]:
    """Slices of ``keys`` whose values take at most ``max_floats`` floats each (at least one key
    per slice)."""
    if not len(keys):
        return []
    if lengths is None:
        step = max(1, max_floats // uniform)
        return [slice(i, min(i + step, len(keys))) for i in range(0, len(keys), step)]
    ends = np.cumsum(lengths[keys])
    cuts = np.unique(np.searchsorted(ends, np.arange(max_floats, int(ends[-1]), max_floats),
                                     side="right"))
    bounds = [0, *[int(c) for c in cuts if 0 < c < len(keys)], len(keys)]
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


@dataclass
class Verdict:
    """Rank 0's finding about the shards of one attempt: ``ok`` (``id`` names the checkpoint
    about to be swapped in), ``retry`` (keys were on their way between nodes) or ``error``."""

    status: str
    message: str = ""
    id: str = ""


class ShardWriter:
    """One node's part in writing checkpoint ``path`` (the protocol: :meth:`adapm.Node.
    checkpoint`). Every node writes its shard into ``<path>.partial``; rank 0 also prepares
    that directory, checks the shards together, writes the manifest and swaps it in.

    Messages between the nodes (rank 0 prepared the directory, its verdict on the shards) go
    through files in that directory: it is on a filesystem every node sees anyway.
    """

    def __init__(self, path: PathLike, rank: int, world_size: int, num_keys: int,
                 value_length, meta=None) -> None:
        self.path = _final_path(path)
        self.partial = self.path + PARTIAL_SUFFIX
        self.previous = self.path + PREVIOUS_SUFFIX
        self.rank, self.world_size, self.num_keys = rank, world_size, num_keys
        self.lengths = _lengths_array(num_keys, value_length)
        self.uniform = 0 if self.lengths is not None else int(value_length)
        try:
            self.meta = json.loads(json.dumps(meta if meta is not None else {},
                                              allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"meta: must be JSON-serialisable (no NaN): {exc}") from None
        self._shards: list[dict] = []

    # --- every node --------------------------------------------------------------------------

    def check_path(self) -> None:
        """CheckpointError unless ``path`` is free to be (re)written (:func:`path_problem`)."""
        problem = path_problem(self.path)
        if problem is not None:
            raise CheckpointError(problem)

    def check_prepared(self, tag: str) -> None:
        """CheckpointError unless rank 0 prepared the directory for collective ``tag``."""
        try:
            ok = _read_json(os.path.join(self.partial, _PREPARED)).get("tag") == tag
        except (OSError, ValueError):
            ok = False
        if not ok:
            raise CheckpointError(f"rank {self.rank}: checkpoint {self.path}: rank 0 did not "
                                  f"prepare {self.partial} (see rank 0's error); is it on a "
                                  f"filesystem shared by every node?")

    def write_shard(self, keys: np.ndarray, fetch: Callable[[np.ndarray], np.ndarray]) -> None:
        """Write this node's shard: ``keys`` (int64, strictly ascending) and their values, read
        in batches by ``fetch(keys_batch) -> packed float32 values``."""
        # An earlier attempt's notes must not stand for this one.
        for stale in (_failure_file(self.rank), _shard_info_file(self.rank)):
            try:
                os.remove(os.path.join(self.partial, stale))
            except FileNotFoundError:
                pass
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        key_name, value_name = shard_files(self.rank)
        floats = (len(keys) * self.uniform if self.lengths is None
                  else int(self.lengths[keys].sum()))
        files = {key_name: _write_npy(os.path.join(self.partial, key_name), keys, KEY_DTYPE)}
        stream = _NpyStream(os.path.join(self.partial, value_name), VALUE_DTYPE, floats)
        try:
            for part in _batches(keys, self.lengths, self.uniform, BATCH_FLOATS):
                stream.write(fetch(keys[part]))
            files[value_name] = stream.close()
        except BaseException:
            stream.abandon()
            raise
        info = {"rank": self.rank, "keys": key_name, "values": value_name, "rows": len(keys),
                "floats": floats, "files": files}
        _write_json(os.path.join(self.partial, _shard_info_file(self.rank)), info)

    def report_failure(self, error: BaseException, retry: bool = False) -> None:
        """This node could not write its shard (best effort: rank 0 finds no shard otherwise).
        ``retry``: keys moved while they were read; the next attempt may succeed."""
        try:
            _write_json(os.path.join(self.partial, _failure_file(self.rank)),
                        {"rank": self.rank, "error": f"{type(error).__name__}: {error}",
                         "retry": retry})
        except OSError:
            pass

    def read_verdict(self, attempt: int) -> Verdict:
        try:
            return Verdict(**_read_json(os.path.join(self.partial, _verdict_file(attempt))))
        except (OSError, ValueError, TypeError) as exc:
            return Verdict("error", f"rank {self.rank}: no verdict from rank 0 on the shards "
                                    f"in {self.partial} ({exc}); see rank 0's error")

    def check_committed(self, checkpoint_id: str) -> None:
        """CheckpointError unless the checkpoint ``checkpoint_id`` is in place at ``path``."""
        try:
            found = _read_json(os.path.join(self.path, MANIFEST)).get("id")
        except (OSError, ValueError) as exc:
            found = f"none ({exc})"
        if found != checkpoint_id:
            raise CheckpointError(f"rank {self.rank}: checkpoint {self.path}: rank 0 did not "
                                  f"put it in place (manifest id {found}); see rank 0's error")

    # --- rank 0 ------------------------------------------------------------------------------

    def prepare(self, tag: str) -> None:
        """Clean up after a crashed checkpoint to ``path`` and start an empty ``.partial``."""
        self.check_path()
        path, previous = self.path, self.previous
        if _has_manifest(previous):
            if _has_manifest(path):  # crashed after the swap: the old one is not needed
                shutil.rmtree(previous)
            else:  # crashed between the renames: the old checkpoint goes back in place
                if os.path.isdir(path):
                    os.rmdir(path)  # empty (check_path)
                os.rename(previous, path)
                _fsync_dir(os.path.dirname(path))
        elif os.path.lexists(previous):
            shutil.rmtree(previous)  # half deleted after a swap
        if os.path.lexists(self.partial):
            shutil.rmtree(self.partial)
        os.makedirs(self.partial)
        _write_json(os.path.join(self.partial, _PREPARED), {"tag": tag})

    def verify(self, give_up: bool) -> Verdict:
        """Whether the shards together hold every key of [0, num_keys) exactly once.

        Missing or doubled keys mean that keys were on their way between nodes when the shards
        were read (a relocation decided just before the nodes went quiet): ``retry``, unless
        ``give_up``. A shard that is missing, failed or inconsistent is an ``error``.
        """
        errors, retry = [], []
        shards = []
        for rank in range(self.world_size):
            failed = os.path.join(self.partial, _failure_file(rank))
            if os.path.exists(failed):
                report = _read_json(failed)
                (retry if report.get("retry") else errors).append(
                    f"rank {rank}: {report.get('error')}")
                continue
            try:
                shards.append(_read_json(os.path.join(self.partial, _shard_info_file(rank))))
            except (OSError, ValueError) as exc:
                errors.append(f"rank {rank} wrote no shard ({exc})")
        if errors:
            return Verdict("error", "; ".join(errors))
        if retry:
            return self._retry_or_error(give_up, "; ".join(retry))
        seen = np.zeros(self.num_keys, dtype=bool)
        doubled = []
        for shard in shards:
            keys = _load_npy(os.path.join(self.partial, shard["keys"]), KEY_DTYPE, shard["rows"])
            if len(keys) and (keys[0] < 0 or keys[-1] >= self.num_keys
                              or np.any(keys[1:] <= keys[:-1])):
                return Verdict("error", f"rank {shard['rank']}: shard keys not strictly "
                                        f"ascending in [0, {self.num_keys})")
            floats = (len(keys) * self.uniform if self.lengths is None
                      else int(self.lengths[keys].sum()))
            if floats != shard["floats"]:
                return Verdict("error", f"rank {shard['rank']}: {shard['floats']} floats written "
                                        f"for keys that take {floats}")
            again = keys[seen[keys]]
            doubled.extend(again[:_SHOWN].tolist())
            seen[keys] = True
        missing = np.flatnonzero(~seen)
        if len(missing) or doubled:
            return self._retry_or_error(
                give_up, f"{len(missing)} keys in no shard (first: "
                         f"{missing[:_SHOWN].tolist()}), keys in two shards: {doubled}")
        self._shards = shards
        return Verdict("ok", id=uuid.uuid4().hex)

    def _retry_or_error(self, give_up: bool, text: str) -> Verdict:
        if give_up:
            return Verdict("error", f"the nodes' shards did not settle: {text}")
        return Verdict("retry", text)

    def post_verdict(self, attempt: int, verdict: Verdict) -> None:
        _write_json(os.path.join(self.partial, _verdict_file(attempt)), vars(verdict))

    def commit(self, checkpoint_id: str) -> None:
        """Write the manifest of the verified shards and swap ``.partial`` in at ``path``."""
        partial = self.partial
        files: dict[str, dict] = {}
        shards = []
        for shard in sorted(self._shards, key=lambda s: s["rank"]):
            files.update(shard["files"])
            shards.append({name: shard[name] for name in ("rank", "keys", "values", "rows",
                                                          "floats")})
        if self.lengths is None:
            value_length = self.uniform
        else:
            files[LENGTHS_FILE] = _write_npy(os.path.join(partial, LENGTHS_FILE), self.lengths,
                                             KEY_DTYPE)
            value_length = {"file": LENGTHS_FILE}
        for name in os.listdir(partial):  # the nodes' notes to each other are not part of it
            if name not in files:
                os.remove(os.path.join(partial, name))
        from . import __version__

        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "id": checkpoint_id,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "adapm_version": __version__, "num_keys": self.num_keys,
            "value_length": value_length, "key_dtype": KEY_DTYPE.str,
            "value_dtype": VALUE_DTYPE.str, "world_size": self.world_size,
            "num_shards": len(shards), "shards": shards, "files": files, "meta": self.meta,
        }
        _write_json(os.path.join(partial, MANIFEST), manifest)
        _fsync_dir(partial)
        self._swap()

    def _swap(self) -> None:
        """``.partial`` becomes ``path``; at every instant ``path`` or ``.previous`` holds a
        complete checkpoint (see the module docstring)."""
        path, previous, parent = self.path, self.previous, os.path.dirname(self.path)
        if os.path.lexists(path):
            os.rename(path, previous)
        os.rename(self.partial, path)
        _fsync_dir(parent)
        if os.path.lexists(previous):
            shutil.rmtree(previous)


# --- reading -----------------------------------------------------------------------------------


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(HASH_BLOCK)
            if not block:
                return digest.hexdigest()
            digest.update(block)


def _load_npy(path: str, dtype: np.dtype, rows: int) -> np.ndarray:
    """A 1-d array of ``rows`` entries of ``dtype`` from ``path`` (memory-mapped)."""
    if rows == 0:
        array = np.load(path)
    else:
        array = np.load(path, mmap_mode="r")
    if array.dtype != dtype or array.shape != (rows,):
        raise CheckpointError(f"{path}: holds {array.dtype}{list(array.shape)}, the manifest "
                              f"says {dtype}[{rows}]")
    return array


def resolve(path: PathLike) -> str:
    """The directory that holds the checkpoint written to ``path``: ``path`` itself, or
    ``<path>.previous`` when a swap was interrupted between its two renames."""
    final = _final_path(path)
    for candidate in (final, final + PREVIOUS_SUFFIX):
        if _has_manifest(candidate):
            return candidate
    raise CheckpointError(f"checkpoint {final}: no {MANIFEST} there (not a checkpoint, or "
                          f"none was completed)")


def path_problem(path: PathLike) -> str | None:
    """Why a checkpoint may not be written at ``path``, or None: it must be missing, an empty
    directory, or a checkpoint (a crashed swap's ``.previous`` counts). Reads names only."""
    path = _final_path(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"checkpoint {path}: exists and is not a directory"
    if os.path.isdir(path) and not _has_manifest(path) and os.listdir(path) and \
            not _has_manifest(path + PREVIOUS_SUFFIX):
        return (f"checkpoint {path}: a non-empty directory that is not a checkpoint (no "
                f"{MANIFEST}); refusing to replace it")
    return None


class Checkpoint:
    """A checkpoint opened for reading (see :func:`load`). Files are checked against their
    sha256 from the manifest when first read; every error names the path."""

    def __init__(self, directory: str, manifest: dict) -> None:
        self.directory = directory
        self.manifest = manifest
        self._verified: set[str] = set()
        try:
            self.num_keys = int(manifest["num_keys"])
            self.world_size = int(manifest["world_size"])
            self.shards = list(manifest["shards"])
            self.files = dict(manifest["files"])
            self.meta = manifest.get("meta", {})
            value_length = manifest["value_length"]
            if isinstance(value_length, dict):
                self.uniform = 0
                self.lengths = self._array(value_length["file"], KEY_DTYPE)
                if len(self.lengths) != self.num_keys:
                    raise CheckpointError(f"checkpoint {directory}: {len(self.lengths)} value "
                                          f"lengths for {self.num_keys} keys")
            else:
                self.uniform, self.lengths = int(value_length), None
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {directory}: malformed {MANIFEST} "
                                  f"({type(exc).__name__}: {exc})") from None

    @property
    def value_length(self) -> int | np.ndarray:
        """The value length as a Config takes it: an int, or the per-key array."""
        return self.uniform if self.lengths is None else np.array(self.lengths)

    def check_matches(self, num_keys: int, value_length) -> None:
        """ConfigError naming the path and the difference unless a job of ``num_keys`` keys
        with ``value_length`` (int or per-key array) can restore this checkpoint."""
        where = f"checkpoint {self.directory}"
        if num_keys != self.num_keys:
            raise ConfigError(f"{where} holds num_keys={self.num_keys}, this job has "
                              f"num_keys={num_keys}")
        mine = np.broadcast_to(np.asarray(value_length, dtype=np.int64), (num_keys,))
        theirs = (np.broadcast_to(np.int64(self.uniform), (num_keys,))
                  if self.lengths is None else self.lengths)
        differ = np.flatnonzero(mine != theirs)
        if len(differ):
            k = int(differ[0])
            raise ConfigError(f"{where}: value lengths differ for {len(differ)} keys, e.g. key "
                              f"{k}: {int(theirs[k])} floats in the checkpoint, {int(mine[k])} "
                              f"in this job")

    def _array(self, name: str, dtype: np.dtype, rows: int | None = None) -> np.ndarray:
        """File ``name`` of the manifest, its checksum verified (once), memory-mapped."""
        entry = self.files.get(name)
        path = os.path.join(self.directory, name)
        if entry is None:
            raise CheckpointError(f"checkpoint {self.directory}: {name} is not in {MANIFEST}")
        if name not in self._verified:
            try:
                digest = _sha256(path)
            except OSError as exc:
                raise CheckpointError(f"checkpoint {self.directory}: cannot read {name} "
                                      f"({exc})") from None
            if digest != entry["sha256"]:
                raise CheckpointError(f"checkpoint {self.directory}: {name} is corrupt (sha256 "
                                      f"{digest[:16]}..., the manifest says "
                                      f"{entry['sha256'][:16]}...)")
            self._verified.add(name)
        return _load_npy(path, dtype, entry["rows"] if rows is None else rows)

    def read(self, keys) -> np.ndarray:
        """Values of ``keys`` (int, any order, repeats allowed), packed float32 back to back in
        request order. Reads (and verifies) only the shards that hold some of them."""
        keys = np.ascontiguousarray(keys, dtype=np.int64).reshape(-1)
        if len(keys) and (keys.min() < 0 or keys.max() >= self.num_keys):
            raise InvalidArgument(f"keys: outside [0, {self.num_keys}) of checkpoint "
                                  f"{self.directory}")
        lengths = (np.full(len(keys), self.uniform, dtype=np.int64) if self.lengths is None
                   else self.lengths[keys])
        starts = np.cumsum(lengths) - lengths
        out = np.empty(int(lengths.sum()), dtype=np.float32)
        order = np.argsort(keys, kind="stable")
        wanted = keys[order]
        found = np.zeros(len(keys), dtype=np.int64)
        for shard in self.shards:
            shard_keys = self._array(shard["keys"], KEY_DTYPE, shard["rows"])
            if not len(shard_keys) or not len(wanted):
                continue
            at = np.minimum(np.searchsorted(shard_keys, wanted), len(shard_keys) - 1)
            hit = shard_keys[at] == wanted
            if not hit.any():
                continue
            values = self._array(shard["values"], VALUE_DTYPE, shard["floats"])
            where, rows = order[hit], at[hit]
            if self.lengths is None:
                out.reshape(len(keys), self.uniform)[where] = \
                    values.reshape(-1, self.uniform)[rows]
            else:
                from ._engine.routing import segment_index

                row_lengths = self.lengths[shard_keys]
                row_starts = np.cumsum(row_lengths) - row_lengths
                out[segment_index(starts[where], lengths[where])] = \
                    values[segment_index(row_starts[rows], lengths[where])]
            found[where] += 1
        if np.any(found != 1):
            bad = keys[found != 1]
            raise CheckpointError(f"checkpoint {self.directory}: keys {bad[:_SHOWN].tolist()} "
                                  f"are not in exactly one shard")
        return out

    def __repr__(self) -> str:
        length = self.uniform if self.lengths is None else "per key"
        return (f"<adapm checkpoint {self.directory}: {self.num_keys} keys, value length "
                f"{length}, written by {self.world_size} nodes>")


def load(path: PathLike) -> Checkpoint:
    """Open the checkpoint at ``path`` for reading: its manifest is read and checked (format,
    version); shard files are verified against their checksums as they are read.

    CheckpointError naming the path when there is none, or its manifest is unreadable or of
    another format or version.
    """
    directory = resolve(path)
    manifest_path = os.path.join(directory, MANIFEST)
    try:
        manifest = _read_json(manifest_path)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {directory}: unreadable {MANIFEST} ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {directory}: {MANIFEST} is not an adapm checkpoint "
                              f"manifest (format {FORMAT!r} expected)")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {directory}: format version {version!r}; this adapm "
                              f"reads version {FORMAT_VERSION}")
    return Checkpoint(directory, manifest)


def checkpoint_meta(path: PathLike) -> dict:
    """The ``meta`` document that ``Node.checkpoint(path, meta=...)`` stored (``{}`` if none).
    Reads only the manifest."""
    return load(path).meta
