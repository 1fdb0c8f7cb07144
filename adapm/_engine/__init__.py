"""The engine: one node's directory and protocol as a pure state machine, and the loop around it.

- :mod:`.state` — :class:`~.state.NodeState`, changed only by ``handle(event) -> instructions``;
- :mod:`.loop` — the engine thread: polls a transport, feeds events in, carries instructions out;
- :mod:`.sim` — many nodes in one thread over the in-process transport, for property tests;
- :mod:`.contracts` — the state machine's surface (``EngineState``), what both runners offer a
  node (``Engine``), and what they need of a transport (``Transport``), as Protocols;
- pure helpers: :mod:`.routing`, :mod:`.policy`, :mod:`.intents`, :mod:`.timing`,
  :mod:`.pacing` (when rounds start), :mod:`.collectives` (rank 0's barriers),
  :mod:`.liveness`.

Nothing here is public API; importing this package imports nothing else.
"""
