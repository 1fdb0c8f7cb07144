"""Many nodes in one thread: the engine of each, the in-process transport between them, and a
scheduler that decides which message is delivered next. For property tests.

Each simulated node is a real :class:`~adapm.node.Node` (store, worker handles, the same
``NodeState``) whose engine is a :class:`SimEngine` instead of a thread: a worker's request is
handled at once, and a blocking wait *runs the simulation* until the call is finished. Messages
wait on their link (order kept per link, as on a ZeroMQ connection); each step either delivers
the oldest message of a link or ticks a node, chosen by a seeded ``random.Random``, so a test
explores interleavings, replays them by seed, and hypothesis shrinks them. Time is virtual: it
advances a little with every step.

The C paths production runs are run here too (``Simulation(native=True)``, the default): a
received message goes to the native fast paths first (native/serve_wire.c), and a worker's pull
or push of keys held elsewhere goes through the native I/O (native/zmq_calls.c, a ``ZmqIO``
without sockets): a step may first route the calls queued on a node and submit the pushes
routing handed back, as an engine loop's pass begins, and a worker's wait for such a call runs
the simulation too.

With channels (``Config.channels`` > 1) every channel is a network of its own, as over ZeroMQ
(each channel's sockets): a node's :class:`~.channels.ChannelEngine` runs a SimEngine per
channel, and a step delivers on a link of any channel or ticks any channel's engine.

Failures are the test's: an exception in a node's engine propagates to the caller, and a wait
that the simulation cannot finish raises :class:`SimulationStuck` (a lost request or a hang).
"""

from __future__ import annotations

import functools
import random
from typing import Callable, Optional

from .._wire.inproc import InprocNetwork
from ..errors import AdaPMTimeout
from .events import (
    NATIVE_OPEN, NATIVE_QUEUED, Call, Finish, Op, Received, Request, Submitted, Tick,
    handed_pushes,
)
from .posting import Outbox
from .validate import problem

# Virtual seconds per step: rounds' idle gaps (a few ms) pass within tens of steps.
STEP_S = 0.0002


class SimulationStuck(AdaPMTimeout):
    """The simulation ran out of steps before a call finished: a lost request or a hang."""


class SimEngine:
    """What a Node's workers see of their engine (the :class:`~.contracts.Engine` contract),
    run by a :class:`Simulation`."""

    def __init__(self, state, transport, request_timeout_s: float, sim: "Simulation") -> None:
        self.state = state
        self.transport = transport
        self.rank = state.rank
        self.channel = state.channel
        self.request_timeout_s = request_timeout_s
        self.sim = sim
        self.error = None
        self.counters = {"late_answers": 0, "dropped_messages": 0}
        self.workers: list = []
        # As EngineLoop: the transport serves what it can in C (Simulation(native=True)), and
        # a worker's pull or push of keys held elsewhere goes through its native I/O (routed
        # and sent when this engine is stepped: Simulation.step).
        self.native = None
        self.native_error = None
        if sim.native and transport.serve_owned(state.directory):
            self.native = transport.native_io()
            state.serve_through(self.native)
        sim.engines.append(self)

    def start(self) -> None:
        pass

    def register_worker(self, worker):
        self.workers.append(worker)
        return self.state.register_worker(worker.clock)

    def submit(self, request: Request, what: str) -> Call:
        call = Call(what)
        self.sim.handle(self, Submitted(call, request))
        return call

    def cpu_seconds(self) -> float:
        """No engine thread of its own: its work is done in the caller's thread."""
        return 0.0

    def wake(self) -> None:
        pass

    def wait(self, call: Call, timeout_s: Optional[float] = None,
             deadline: Optional[float] = None) -> list:
        self.sim.run_until(lambda: call.done, what=f"rank {self.rank}: {call.what}")
        if call.error is not None:
            raise call.error
        return call.parts

    def wait_native(self, call, timeout_s: float) -> int:
        """Run the simulation until the native I/O's call ended; its state."""
        self.sim.run_until(lambda: call.wait(0) not in (NATIVE_QUEUED, NATIVE_OPEN),
                           what=f"rank {self.rank}: a native pull or push")
        return call.wait(0)

    def wait_routed(self, call, timeout_s: float) -> int:
        """Run the simulation until the native I/O's call is routed; its state."""
        self.sim.run_until(lambda: call.wait_routed(0) != NATIVE_QUEUED,
                           what=f"rank {self.rank}: routing a native push")
        return call.wait_routed(0)

    def native_pass(self) -> None:
        """What an engine loop's pass does with the native I/O before the rest: the workers'
        calls queued since are routed and sent, and the pushes routing could not take are
        submitted to the state machine (EngineLoop._take_handoffs)."""
        if self.native is None:
            return
        self.transport.route_queued()
        for event in handed_pushes(self.native):
            self.sim.handle(self, event)

    def raise_if_failed(self) -> None:
        pass

    def quiesce(self, timeout_s: float) -> None:
        self.state.closing = True
        self.sim.run_until(lambda: not self.state.round_running,
                           what=f"rank {self.rank}: quiesce")

    def resume(self) -> None:
        self.state.closing = False

    def stop(self, goodbye: bool = False) -> None:
        pass

    def fail_pending(self, error) -> None:
        pass


class Simulation:
    """``world_size`` nodes of ``config`` (a :class:`~adapm.config.Config`, rank ignored)."""

    def __init__(self, config, seed: int = 0, max_steps: int = 200_000,
                 native: bool = True) -> None:
        from ..node import Node  # the node module imports the engine, not the other way

        # native: received messages go to the native fast paths first, as over ZeroMQ (False:
        # every message through NodeState, the reference the native paths must match).
        self.native = native
        self.world_size = config.world_size
        self.rng = random.Random(seed)
        self.now = 1.0
        self.max_steps = max_steps
        self.steps = 0
        self.engines: list[SimEngine] = []
        # One network per channel; by_channel[c][rank] takes channel c's messages to rank.
        self.networks = [InprocNetwork(self.world_size) for _ in range(config.channels)]
        self.network = self.networks[0]
        self.nodes = [
            Node(config.replace(rank=rank),
                 transport=[network.endpoint(rank) for network in self.networks]
                 if config.channels > 1 else self.network.endpoint(rank),
                 engine_class=functools.partial(SimEngine, sim=self))
            for rank in range(self.world_size)
        ]
        self.by_channel = [sorted((e for e in self.engines if e.channel == c),
                                  key=lambda e: e.rank) for c in range(config.channels)]

    # --- running -----------------------------------------------------------------------------

    def handle(self, engine: SimEngine, event) -> None:
        self.now += STEP_S
        outbox = Outbox()
        for ins in outbox.carry(engine.state.handle(event, self.now)):
            self._finish(engine, ins)
        outbox.flush(engine.transport)

    def _finish(self, engine: SimEngine, ins: Finish) -> None:
        if ins.call.abandoned:
            engine.counters["late_answers"] += 1
        ins.call.finish(ins.parts, ins.error)  # raises if it was finished before

    def step(self) -> None:
        """Deliver one wire message on a random link, or tick a random node."""
        self.steps += 1
        for engine in self.engines:
            # A loop's pass begins so (ZmqIO.poll, then the handoffs), but a call queued
            # meanwhile may also wait for the next pass, after messages that came first.
            if self.rng.random() < 0.5:
                engine.native_pass()
        links = [(c, src, dst) for c, network in enumerate(self.networks)
                 for src, dst in network.links_with_mail()]
        if links and self.rng.random() < 0.8:
            c, src, dst = links[self.rng.randrange(len(links))]
            engine = self.by_channel[c][dst]
            frames = self.networks[c].take(src, dst)
            if engine.transport.serve(src, frames):
                return  # served or taken in by the native paths (EngineLoop: inside poll)
            for msg in engine.transport.receive(frames):
                # As EngineLoop: the validator first; what it refuses is a counted drop.
                if problem(msg, engine.state) is not None:
                    engine.counters["dropped_messages"] += 1
                    continue
                self.handle(engine, Received(msg))
        else:
            engine = self.engines[self.rng.randrange(len(self.engines))]
            self.handle(engine, Tick([w.clock for w in engine.workers]))

    def run_until(self, condition: Callable[[], bool], what: str = "a condition") -> None:
        start = self.steps
        while not condition():
            if self.steps - start >= self.max_steps:
                raise SimulationStuck(f"{what}: not done after {self.max_steps} simulated steps")
            self.step()

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def settle(self) -> None:
        """Run until no message is in flight and no round runs (rounds may still be due)."""
        self.run_until(lambda: not any(n.links_with_mail() for n in self.networks)
                       and not any(e.state.round_running or e.state.moves_held()
                                   for e in self.engines),
                       what="settle")

    # --- collectives (every node at once) ----------------------------------------------------

    def barrier(self) -> None:
        """``node.barrier()`` on every node: all arrive, then each refreshes its replicas."""
        for kind in (Op.BARRIER, Op.ROUND):
            calls = []
            for node in self.nodes:
                epoch = node._barrier_epoch
                calls.append(node.engine.submit(Request(kind, epoch=epoch), f"{kind.name}"))
            for call in calls:
                self.run_until(lambda: call.done, what=f"{kind.name}")
                if call.error is not None:
                    raise call.error
        for node in self.nodes:
            node._barrier_epoch += 1

    def close(self) -> None:
        for node in self.nodes:
            node._release()
