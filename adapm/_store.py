"""A node's store: values of the keys held here, and the directory that says which keys those are.

Layout (see native/store.h; the native code does every per-key loop):

- ``home``: one uint32 word per key homed on this node (``k % world_size == rank``): whether the
  main copy is here, and its version. Home keys have fixed rows at the bottom of ``slab``.
- every other key held here (homed elsewhere, or a replica of a home key) has an entry in a
  native hash map: its row, version and sync time. So per-key metadata is 4 B per home key plus
  an entry per key held beyond those, not a few words for every key of the space.
- ``slab``: float32 values; ``delta``: for replicas, updates not yet sent to the owner;
- ``seqs``: one seqlock word per stripe of keys.
- ``sample_pool``: the held keys of the sampling domain (:class:`SamplePool`, the ``local``
  sampler's), kept by the native store in the same calls that insert and remove keys.

``slab`` and ``delta`` reserve address space for every key (``MAP_NORESERVE``), but memory is only
committed for slots that are used, and slots are reused through free lists (native/slots.c,
owned by the native store: inserting a key takes a slot, removing it gives the slot back). So
the slabs never move (no reallocation racing with readers) and a node's memory follows the
number of keys it holds at the same time.

Thread safety: ``gather``/``scatter_*`` may be called from any number of threads at once.
``insert``/``remove`` (which also allocate and free slots) must be called from one thread at a
time; the node calls them from its communication thread only.
"""

from __future__ import annotations

import mmap

import numpy as np

from . import _native_loader
from ._engine import routing
from .config import Config
from .errors import ConfigError
from .sampling import Sampling

_native = _native_loader.load()

NONE = _native.KEY_NONE
OWNER = _native.KEY_OWNER
REPLICA = _native.KEY_REPLICA

# 2**14 stripes: with a few dozen threads, a negligible chance that two writers of different keys
# meet on one stripe. Each stripe's sequence word has a 64-byte line of its own (native
# seqlock.h, SEQ_STRIDE words): 1 MiB.
NUM_STRIPES = 1 << 14
SEQ_STRIDE = _native.SEQ_STRIDE
# Keys per native call when every key's state is scanned (owned_keys): 9 MiB of scratch; a
# scan takes ~7 ns a key.
SCAN_KEYS = 1 << 20


def _reserve_floats(count: int) -> tuple[mmap.mmap, np.ndarray]:
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    region = mmap.mmap(-1, max(count, 1) * 4, flags=flags)
    # Transparent huge pages where the kernel leaves it to madvise (the default on many
    # distributions; numpy does the same for its large arrays). Random rows of a 64 MB slab touch
    # thousands of 4 KiB pages per batch, and the TLB misses cost a quarter of a local pull:
    # bench/store.py, pull of 1k-10k keys at dim 16. Slots are handed out from the bottom of the
    # slab up (bump pointer + reuse), so at most one partly used 2 MiB page is committed extra.
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            region.madvise(advice)
        except OSError:  # kernel without THP: 4 KiB pages, correct, a little slower
            pass
    return region, np.frombuffer(region, dtype=np.float32, count=count)


class Store:
    """Values and directory of one node. See the module docstring for thread safety."""

    def __init__(self, config: Config) -> None:
        self.num_keys = config.num_keys
        self.uniform_length = config.uniform_length
        if self.uniform_length:
            self.lens = None
            capacity = self.num_keys * self.uniform_length
        else:
            self.lens = config.value_length
            capacity = int(self.lens.sum())
        self.rank, self.world_size = config.rank, config.world_size
        homes = len(range(self.rank, self.num_keys, self.world_size))
        try:
            self.home = np.zeros(homes, dtype=np.uint32)
            self._slab_region, self.slab = _reserve_floats(capacity)
            self._delta_region, self.delta = _reserve_floats(capacity)
        except (MemoryError, OSError) as exc:
            # What the sizes ask for, not numpy's or mmap's words for it.
            raise ConfigError(
                f"num_keys={self.num_keys:,} with {capacity:,} floats of values in all: this "
                f"node cannot reserve the {2 * 4 * capacity / 2**30:,.1f} GiB of address space "
                f"for them (values and replica deltas) and {4 * homes / 2**30:,.1f} GiB for "
                f"its home table ({type(exc).__name__}: {exc})") from None
        self.seqs = np.zeros(NUM_STRIPES * SEQ_STRIDE, dtype=np.uint64)
        # [replica reads, sum of read times (us), sum of their synced_at (us)], kept by gather.
        self.access_stats = np.zeros(3, dtype=np.int64)
        self.native = _native.Store(
            self.num_keys, self.rank, self.world_size, self.home, self.slab, self.delta,
            self.seqs, self.access_stats, self.lens, self.uniform_length, config.channels
        )
        # Fast paths of Worker.pull/push (see native/store_module.c, fast_call): bound methods,
        # no Python wrapper, since they exist to save the per-call overhead.
        self.gather_fast = self.native.gather_fast
        self.scatter_add_fast = self.native.scatter_add_fast
        self.scatter_set_fast = self.native.scatter_set_fast
        # Held keys of the sampling domain (local sampling draws among them).
        self.sample_pool = (SamplePool(config.sampling, self.native)
                            if config.sampling is not None else None)

    # --- sizes -------------------------------------------------------------------------------

    def lengths_of(self, keys: np.ndarray) -> np.ndarray:
        """Per-key value lengths of ``keys`` (int64)."""
        if self.uniform_length:
            return np.full(len(keys), self.uniform_length, dtype=np.int64)
        return self.lens[keys]

    def floats_for(self, keys: np.ndarray) -> int:
        """Number of floats that the values of ``keys`` take back to back."""
        if self.uniform_length:
            return len(keys) * self.uniform_length
        return int(self.lens[keys].sum())

    # --- batch access (any thread) -----------------------------------------------------------

    def gather(self, keys: np.ndarray, out: np.ndarray, missing: np.ndarray) -> int:
        """Copy local values of ``keys`` into ``out``; returns how many positions went to ``missing``."""
        return self.native.gather(keys, out, missing)

    def scatter_add(self, keys: np.ndarray, vals: np.ndarray, missing: np.ndarray) -> int:
        return self.native.scatter_add(keys, vals, missing)

    def scatter_set(self, keys: np.ndarray, vals: np.ndarray, missing: np.ndarray) -> int:
        return self.native.scatter_set(keys, vals, missing)

    def states(self, keys: np.ndarray) -> np.ndarray:
        """``NONE``, ``OWNER`` or ``REPLICA`` per key (int8; a snapshot; any thread)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        out = np.empty(len(keys), dtype=np.int8)
        self.native.inspect(keys, out, None, None, None)
        return out

    def versions(self, keys: np.ndarray) -> np.ndarray:
        """Per key: the owner copy's version, or a replica's last synced one; -1 if not held."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        out = np.empty(len(keys), dtype=np.int64)
        self.native.inspect(keys, None, out, None, None)
        return out

    def synced_at(self, keys: np.ndarray) -> np.ndarray:
        """Per key: a replica's last sync (``time.monotonic()`` seconds); 0.0 for other keys."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        out = np.empty(len(keys), dtype=np.float64)
        self.native.inspect(keys, None, None, out, None)
        return out

    def slots(self, keys: np.ndarray) -> np.ndarray:
        """Per key: the offset of its row in ``slab`` (and ``delta``), or -1 if not held."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        out = np.empty(len(keys), dtype=np.int64)
        self.native.inspect(keys, None, None, None, out)
        return out

    def snapshot(self) -> dict[str, np.ndarray]:
        """Dense per-key arrays over the whole key space (state, version, synced_at, slot), for
        tests and inspection: O(num_keys)."""
        keys = np.arange(self.num_keys, dtype=np.int64)
        out = {"state": np.empty(self.num_keys, dtype=np.int8),
               "version": np.empty(self.num_keys, dtype=np.int64),
               "synced_at": np.empty(self.num_keys, dtype=np.float64),
               "slot": np.empty(self.num_keys, dtype=np.int64)}
        self.native.inspect(keys, out["state"], out["version"], out["synced_at"], out["slot"])
        return out

    def holds(self, keys: np.ndarray) -> np.ndarray:
        """Whether each key has a main copy or replica here now (a snapshot; any thread)."""
        return self.states(keys) != NONE

    def local_keys(self) -> np.ndarray:
        """Keys with a main copy or replica here, ascending (inserting thread)."""
        return np.sort(np.frombuffer(self.native.held_keys(), dtype=np.int64))

    def owned_keys(self) -> np.ndarray:
        """Keys whose main copy is here, ascending (any thread; see :meth:`_scan`)."""
        return self._scan(lambda states: states == OWNER)

    def held_keys_snapshot(self) -> np.ndarray:
        """Keys with a main copy or replica here, ascending (any thread; see :meth:`_scan`)."""
        return self._scan(lambda states: states != NONE)

    def _scan(self, select) -> np.ndarray:
        """Keys whose state ``select`` picks, ascending: a snapshot per chunk of the key space.
        O(num_keys): a scan of every key's state in chunks of :data:`SCAN_KEYS`, which reads
        the held map safely while the engine thread changes it (``held_keys`` does not)."""
        parts = []
        for first in range(0, self.num_keys, SCAN_KEYS):
            keys = np.arange(first, min(first + SCAN_KEYS, self.num_keys), dtype=np.int64)
            parts.append(keys[select(self.states(keys))])
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def memory(self) -> tuple[int, int]:
        """(keys in the held map, bytes of per-key metadata: home words and the held map)."""
        return self.native.memory()

    def mean_staleness_ms(self) -> float:
        """Mean time since the last sync of the replica read, over all replica reads so far."""
        reads, read_us, synced_us = (int(x) for x in self.access_stats)
        return (read_us - synced_us) / reads / 1000.0 if reads else 0.0

    def select_rows(self, values: np.ndarray, keys: np.ndarray, select: np.ndarray) -> np.ndarray:
        """The packed values of ``keys[select]`` out of ``values``, the packed values of ``keys``.

        ``select`` is a boolean mask or an index array over ``keys``.
        """
        if self.uniform_length:
            rows = values.reshape(len(keys), self.uniform_length)
            return np.ascontiguousarray(rows[select].reshape(-1))
        lengths = self.lens[keys]
        starts = np.cumsum(lengths) - lengths
        return values[routing.segment_index(starts[select], lengths[select])]

    # --- moving keys in and out (one thread at a time) ---------------------------------------

    def insert(self, keys: np.ndarray, state: int, values: np.ndarray | None = None,
               versions: np.ndarray | None = None, synced_at: float = 0.0) -> None:
        """Make ``keys`` (unique, not held here) local with ``state``; zeros when ``values`` is
        None; replicas count as synced at ``synced_at``. ValueError (nothing changed) for a key
        held already or repeated."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        self.native.insert(keys, int(state), values, versions, float(synced_at))

    def take_deltas(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Replicas' accumulated updates, moved out (zeroed here): (the rows of the keys that
        had any, packed back to back in key order; which keys had any)."""
        deltas = np.empty(self.floats_for(keys), dtype=np.float32)
        nonzero = np.empty(len(keys), dtype=np.int8)
        written = self.native.take_deltas(keys, deltas, nonzero)
        return deltas[:written], nonzero.astype(bool)

    def refresh(self, keys: np.ndarray, values: np.ndarray, versions: np.ndarray) -> int:
        """Replicas (others skipped): value = values + updates made here since the last take."""
        return self.native.refresh(keys, values, versions, False)

    def set_synced(self, keys: np.ndarray, versions: np.ndarray, now: float) -> None:
        """Replicas (others skipped) now stand at ``versions``, synced at ``now``."""
        self.native.set_synced(np.ascontiguousarray(keys, dtype=np.int64),
                               np.ascontiguousarray(versions, dtype=np.int64), float(now))

    def promote(self, keys: np.ndarray, values: np.ndarray, versions: np.ndarray) -> int:
        """Replicas become main copies: value = values + their unsent updates."""
        return self.native.refresh(keys, values, versions, True)

    def remove(self, keys: np.ndarray, with_deltas: bool = False):
        """Drop ``keys`` (unique, held here). Returns (values, deltas or None), packed back to back."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        total = self.floats_for(keys)
        values = np.empty(total, dtype=np.float32)
        deltas = np.empty(total, dtype=np.float32) if with_deltas else None
        self.native.remove(keys, values, deltas)
        return values, deltas


class SamplePool:
    """A node's held keys of the sampling domain, for the ``local`` scheme: ``keys[:count]``.

    The native store keeps it (``Store.keep_pool``): every insert and remove of a key, by any
    path (the engine, the transport serving a SYNC), changes it in the same native call.
    Workers read ``keys[:count]`` at any time and must check that a drawn key is still held
    (the store's gather does).
    """

    def __init__(self, sampling: Sampling, native) -> None:
        """``native``: the ``_native.Store`` that keeps it."""
        self.low = sampling.low
        # Entries past count keep old, in-domain keys: a racing reader draws a valid key.
        self.keys = np.full(sampling.size, sampling.low, dtype=np.int64)
        self._pos = np.full(sampling.size, -1, dtype=np.int64)
        self._count = np.zeros(1, dtype=np.int64)
        native.keep_pool(self.keys, self._pos, self._count, self.low)

    @property
    def count(self) -> int:
        """How many keys the pool holds now (a snapshot)."""
        return int(self._count[0])

    @property
    def counter(self) -> np.ndarray:
        """The one-entry int64 array the store keeps :attr:`count` in, for native readers that
        read it live (``Directory.draw_held``); not to be written."""
        return self._count
