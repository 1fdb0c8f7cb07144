"""Channels: a node's engine work split over several threads by key (``Config.channels``).

Each channel is a whole engine over its share of the keys, key k in channel
``(k // world_size) % channels`` (:func:`~.routing.channel_of`): a
:class:`~.state.NodeState` with a native directory of its own, an engine thread
(:class:`~.loop.EngineLoop`) and sockets of its own, and its share of the node's store (a held
map and slot allocator per channel, native/store.h), so the channels' threads never write the
same structure and their native calls, which release the GIL, run side by side. Channel c of
one node talks only to channel c of the others: every channel is a job of ``world_size`` nodes
over its keys, and the management decisions, rounds and timers of each are its own.

:class:`ChannelEngine` offers the node and its workers the one-engine contract
(:class:`~.contracts.Engine`) over the channels' loops: a worker's request goes to the channel
of its keys (split when they span several), ``wait_sync`` and the rounds after a barrier to
every channel, collectives to channel 0; intents are split by channel as they are signalled
(:class:`SplitIntents`); statistics add up (:class:`ChannelStates`). A worker's pull or push of
keys held elsewhere goes through the native I/O of their channel's transport when all its keys
are of one channel (:class:`ChannelNative`), else the loops' path, split.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

import numpy as np

from ..errors import AdaPMError
from .events import Op, Request
from .routing import channel_of, segment_index


class Joined:
    """A request split over channels: done when every channel's part is. ``parts`` are the
    channels' calls (:class:`~.events.Call`), ``channels`` their channel numbers."""

    __slots__ = ("what", "parts", "channels")

    def __init__(self, what: str, parts: list, channels: list) -> None:
        self.what, self.parts, self.channels = what, parts, channels

    @property
    def done(self) -> bool:
        return all(call.done for call in self.parts)

    @property
    def error(self) -> Optional[BaseException]:
        """The first part's error (once done; None before or without one)."""
        for call in self.parts:
            if call.done and call.error is not None:
                return call.error
        return None


class SplitIntents:
    """A worker's intents over the channels: what ``WorkerIntents`` offers the worker's thread
    (``signal``, ``late``, ``behind``), each call split by channel or asked of every channel.
    """

    __slots__ = ("queues", "world_size")

    def __init__(self, queues: list, world_size: int) -> None:
        self.queues = queues
        self.world_size = world_size

    def signal(self, keys: np.ndarray, start: int, end: int) -> None:
        """Copies each channel's ``keys`` (checked int64) into its queue for [start, end)."""
        for c, at in split(keys, self.world_size, len(self.queues)):
            self.queues[c].signal(keys[at], start, end)

    def late(self, clock: int) -> bool:
        return any(queue.late(clock) for queue in self.queues)

    def behind(self, now: float) -> bool:
        return any(queue.behind(now) for queue in self.queues)


class ChannelNative:
    """The channels' native I/O (``ZmqIO``) as one, for a worker's pull or push of keys held
    elsewhere: a call whose keys are all of one channel goes through that channel's; one that
    spans channels is declined (None), and the worker takes the engine loops' path, split by
    channel there. Keys of one channel stay in order on that channel's path, as before."""

    __slots__ = ("ios", "world_size")

    def __init__(self, ios: list, world_size: int) -> None:
        self.ios = ios
        self.world_size = world_size

    def _one(self, keys: np.ndarray):
        channel = channel_of(keys, self.world_size, len(self.ios))
        first = int(channel[0]) if len(channel) else 0
        return self.ios[first] if (channel == first).all() else None

    def pull(self, keys, positions, out, length):
        io = self._one(keys)
        return None if io is None else io.pull(keys, positions, out, length)

    def push(self, keys, positions, rows, length, worker, clock):
        io = self._one(keys)
        return None if io is None else io.push(keys, positions, rows, length, worker, clock)


class ChannelStates:
    """The node's view of its channels' states: the queries of :class:`~.contracts.EngineState`
    that the node, its workers and the benchmarks make, over every channel (sums, or the
    channel a key belongs to). Any thread, as each state's queries."""

    def __init__(self, states: list) -> None:
        self.states = states
        self.world_size = states[0].world_size
        self.channels = len(states)

    def _split(self, keys: np.ndarray) -> list:
        return split(keys, self.world_size, self.channels)

    def staying(self, keys: np.ndarray) -> np.ndarray:
        out = np.zeros(len(keys), dtype=bool)
        for c, at in self._split(keys):
            out[at] = self.states[c].staying(keys[at])
        return out

    def sample_pins(self):
        pins = [state.sample_pins() for state in self.states]
        if pins[0] is None:
            return None

        def repin(release: np.ndarray, take: np.ndarray) -> None:
            parts = [[_NO_KEYS, _NO_KEYS] for _ in pins]
            for which, keys in ((0, release), (1, take)):
                if len(keys):
                    for c, at in self._split(keys):
                        parts[c][which] = keys[at]
            for c, (gone, new) in enumerate(parts):
                if len(gone) or len(new):
                    pins[c](gone, new)
        return repin

    def held_draw(self):
        """None: a sample's keys span the channels, each with pins of its own, so the sampler
        draws, checks and pins them in steps (``staying``, :meth:`sample_pins`)."""
        return None

    @property
    def counters(self) -> dict:
        return _summed(state.counters for state in self.states)

    def stats(self) -> dict:
        stats = [state.stats() for state in self.states]
        out = _summed(stats)
        rounds = sum(s["rounds"] for s in stats)
        # Each channel's mean over its rounds, weighted by them.
        out["mean_round_ms"] = (sum(s["mean_round_ms"] * s["rounds"] for s in stats) / rounds
                                if rounds else 0.0)
        return out

    def own_updates_served_here(self) -> tuple:
        served = [state.own_updates_served_here() for state in self.states]
        return tuple(sum(column) for column in zip(*served))

    def replicas_held(self) -> int:
        return sum(state.replicas_held() for state in self.states)

    def memory(self) -> dict:
        parts = [state.memory() for state in self.states]
        return {name: tuple(sum(column) for column in zip(*(p[name] for p in parts)))
                for name in parts[0]}

    def barrier_missing(self, epoch: int) -> list:
        return self.states[0].barrier_missing(epoch)  # collectives go through channel 0


_NO_KEYS = np.empty(0, dtype=np.int64)


def split(keys: np.ndarray, world_size: int, channels: int) -> list:
    """[(channel, positions of ``keys`` in it, ascending)] for the channels that have any."""
    channel = channel_of(keys, world_size, channels)
    out = []
    for c in range(channels):
        at = np.flatnonzero(channel == c)
        if len(at):
            out.append((c, at))
    return out


def _first(values):
    """The first value that is not None, or None."""
    return next((v for v in values if v is not None), None)


def _summed(dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for name, value in d.items():
            out[name] = out.get(name, 0) + value
    return out


class LockedSink:
    """An event subscriber (:class:`~.stream.EventSink`, a trace recorder) that the channels'
    engine threads share: their calls take turns."""

    def __init__(self, sink) -> None:
        self._sink = sink
        self._lock = threading.Lock()

    def on_keys(self, event, keys: np.ndarray, now: float, clock: int, peer: int) -> None:
        with self._lock:
            self._sink.on_keys(event, keys, now, clock, peer)

    def on_round(self, record) -> None:
        with self._lock:
            self._sink.on_round(record)


class ChannelEngine:
    """The :class:`~.contracts.Engine` of a node with several channels, over their loops
    (index = channel). ``submit``, ``wait``, ``wake``, ``raise_if_failed`` and
    ``cpu_seconds`` are for any thread; the rest for the node."""

    def __init__(self, loops: list, store) -> None:
        self.loops = loops
        self.channels = len(loops)
        first = loops[0]
        self.rank = first.rank
        self.request_timeout_s = first.request_timeout_s
        self.world_size = first.state.world_size
        self.store = store
        self.state = ChannelStates([loop.state for loop in loops])
        self.native = ChannelNative([loop.native for loop in loops], self.world_size) \
            if all(loop.native is not None for loop in loops) else None
        self._intents: list = []  # each worker's SplitIntents (index = worker), or None

    @property
    def native_error(self) -> Optional[AdaPMError]:
        """What fail_pending failed the native calls with (any channel's)."""
        return _first(loop.native_error for loop in self.loops)

    @property
    def error(self) -> Optional[AdaPMError]:
        """What ended a channel's engine (the first found), or None."""
        return _first(loop.error for loop in self.loops)

    @property
    def counters(self) -> dict:
        return _summed(loop.counters for loop in self.loops)

    # --- the node ------------------------------------------------------------------------------

    def start(self) -> None:
        for loop in self.loops:
            loop.start()

    def register_worker(self, worker):
        queues = [loop.register_worker(worker) for loop in self.loops]
        intents = None if queues[0] is None else SplitIntents(queues, self.world_size)
        self._intents.append(intents)  # list.append is atomic; the node calls in index order
        return intents

    def quiesce(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for loop in self.loops:
            loop.quiesce(max(0.0, deadline - time.monotonic()))

    def resume(self) -> None:
        for loop in self.loops:
            loop.resume()

    def stop(self, goodbye: bool = False) -> None:
        for loop in self.loops:
            loop.stop(goodbye)

    def fail_pending(self, error: AdaPMError) -> None:
        for loop in self.loops:
            loop.fail_pending(error)

    # --- any thread ----------------------------------------------------------------------------

    def submit(self, request: Request, what: str) -> Joined:
        """Hand ``request`` to the channels it concerns: a :class:`Joined` of their calls.
        Never blocks. The request's arrays belong to the engines now."""
        op = request.op
        if op is Op.BARRIER:  # rank 0's channel 0 gathers the collectives
            return Joined(what, [self.loops[0].submit(request, what)], [0])
        if op is Op.WAIT_SYNC or op is Op.ROUND or op is Op.AWAIT_INTENT:
            numbers = range(self.channels)
            if op is Op.AWAIT_INTENT:
                # Only where the intent is late: a forced round in every channel cost the
                # others a round each. A channel not late now has acted on what the worker
                # needs (keys still on their way are waited for by its access); none late:
                # nothing to wait for.
                queues = self._intents[request.worker].queues
                numbers = [c for c in numbers if queues[c].late(request.clock)]
            return Joined(what, [self.loops[c].submit(Request(op, worker=request.worker,
                                                              clock=request.clock), what)
                                 for c in numbers], list(numbers))
        keys = request.keys
        parts = split(keys, self.world_size, self.channels)
        if len(parts) <= 1:  # one channel's keys (or none): the request as it is
            first = parts[0][0] if parts else 0
            return Joined(what, [self.loops[first].submit(request, what)], [first])
        calls, numbers = [], []
        uniform = self.store.uniform_length
        lengths = None if uniform or request.rows is None else self.store.lens[keys]
        starts = None if lengths is None else np.cumsum(lengths) - lengths
        for c, at in parts:
            rows = request.rows
            if rows is not None:
                rows = rows.reshape(len(keys), -1)[at].reshape(-1) if uniform else \
                    rows[segment_index(starts[at], lengths[at])]
            calls.append(self.loops[c].submit(
                Request(op, keys[at], request.positions[at], rows, worker=request.worker,
                        clock=request.clock), what))
            numbers.append(c)
        return Joined(what, calls, numbers)

    def wait(self, call: Joined, timeout_s: Optional[float] = None,
             deadline: Optional[float] = None) -> list:
        """Block until ``call`` is finished: every channel's parts, or the first error
        (AdaPMTimeout naming this rank and what was awaited) once all ended."""
        timeout_s = self.request_timeout_s if timeout_s is None else timeout_s
        if deadline is None:
            deadline = time.monotonic() + timeout_s
        parts: list = []
        first_error: Optional[BaseException] = None
        for c, part in zip(call.channels, call.parts):
            try:
                parts.extend(self.loops[c].wait(part, timeout_s, deadline))
            except AdaPMError as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        return parts

    def wake(self) -> None:
        for loop in self.loops:
            loop.wake()

    # A native call's own wait (the simulator's loops run the one simulation of every channel).
    def wait_native(self, call, timeout_s: float) -> int:
        return self.loops[0].wait_native(call, timeout_s)

    def wait_routed(self, call, timeout_s: float) -> int:
        return self.loops[0].wait_routed(call, timeout_s)

    def cpu_seconds(self) -> float:
        return sum(loop.cpu_seconds() for loop in self.loops)

    def raise_if_failed(self) -> None:
        error = self.error
        if error is not None:
            raise error


__all__ = ["ChannelEngine", "ChannelNative", "ChannelStates", "Joined", "LockedSink",
           "SplitIntents"]
