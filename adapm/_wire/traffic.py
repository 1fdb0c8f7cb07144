"""Traffic counters of one node's transport: logical messages, wire messages and bytes, per kind.

``messages_*`` and ``bytes_*`` count logical messages; a wire message may carry several
(``wire_messages_*``). Per-kind bytes are each message's header and arrays; the totals also
include framing and padding. Written by the engine thread only; ``snapshot`` may be read from
any thread (a copy of plain ints).
"""

from __future__ import annotations

from .protocol import Kind

_TOTALS = {d: (f"wire_messages_{d}", f"messages_{d}", f"bytes_{d}") for d in ("sent", "received")}
_NAMES: dict = {}  # (direction, kind) -> per-kind counter names
# The kinds nodes send each other (the rendezvous's are its own socket's): their per-kind
# counters exist from the start, at 0, so that stats() has the same keys on any number of nodes
# and at any time.
_NODE_KINDS = tuple(kind for kind in Kind if kind < Kind.HELLO)


class Traffic:
    def __init__(self) -> None:
        # dropped_forged_messages: wire messages whose headers named another sender than the
        # rank their connection authenticated as, or (without authentication) connected as;
        # dropped_malformed_messages: wire messages that could not be decoded
        # (adapm._wire.zmq_transport); neither is counted as received. refused_handshakes:
        # connections refused at the security handshake (with authentication only).
        self.counters = {"messages_sent": 0, "messages_received": 0, "bytes_sent": 0,
                         "bytes_received": 0, "wire_messages_sent": 0,
                         "wire_messages_received": 0, "dropped_forged_messages": 0,
                         "dropped_malformed_messages": 0, "refused_handshakes": 0}
        self.by_kind: dict[str, int] = {
            f"{what}_{d}_{kind.name.lower()}": 0
            for kind in _NODE_KINDS for d in ("sent", "received") for what in ("messages", "bytes")}
        # Counters kept elsewhere and added in (the native I/O's fast path: ZmqIO.counters).
        self.extra = None

    def count(self, direction: str, wire_bytes: int, messages) -> None:
        """One wire message of ``wire_bytes`` carrying ``messages`` (each with kind and nbytes)."""
        wire, logical, size = _TOTALS[direction]
        counters, by_kind = self.counters, self.by_kind
        counters[wire] += 1
        counters[logical] += len(messages)
        counters[size] += wire_bytes
        for m in messages:
            names = _NAMES.get((direction, m.kind))
            if names is None:
                name = m.kind.name.lower()
                names = _NAMES[direction, m.kind] = (f"messages_{direction}_{name}",
                                                    f"bytes_{direction}_{name}")
            by_kind[names[0]] = by_kind.get(names[0], 0) + 1
            by_kind[names[1]] = by_kind.get(names[1], 0) + m.nbytes

    def count_round(self, direction: str, kind, n: int, wire_bytes: int, nbytes: int) -> None:
        """``n`` wire messages of one logical message of ``kind`` each (a round's SYNCs),
        ``wire_bytes`` in all, their messages ``nbytes``."""
        wire, logical, size = _TOTALS[direction]
        counters, by_kind = self.counters, self.by_kind
        counters[wire] += n
        counters[logical] += n
        counters[size] += wire_bytes
        names = _NAMES.get((direction, kind))
        if names is None:
            name = kind.name.lower()
            names = _NAMES[direction, kind] = (f"messages_{direction}_{name}",
                                               f"bytes_{direction}_{name}")
        by_kind[names[0]] = by_kind.get(names[0], 0) + n
        by_kind[names[1]] = by_kind.get(names[1], 0) + nbytes

    def snapshot(self) -> dict:
        out = dict(self.counters)
        out.update(dict(self.by_kind))
        if self.extra is not None:
            for name, value in self.extra().items():
                out[name] = out.get(name, 0) + value
        return out
