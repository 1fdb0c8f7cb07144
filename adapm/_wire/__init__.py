"""The wire: framing (:mod:`.protocol`), transports (ZeroMQ, in-process) and the rendezvous.

A transport moves whole logical messages between ranks and counts them; it knows nothing of
keys. Both backends keep the engine's contract (:class:`adapm._engine.contracts.Transport`).
"""
