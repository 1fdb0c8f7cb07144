"""Is a received message fit to touch this node's state? Checked before the state machine sees it.

The decoder (:func:`adapm._wire.protocol.decode`) already guarantees the framing: known kind,
integer header fields, the kind's number of arrays, each a whole number of its dtype. Here come
the checks that need the node: sender and origin ranks, keys in ``[0, num_keys)``, per-key
arrays as long as their keys, rows as long as their keys' values, home updates only for keys
homed here, answers only to requests this node has open, at positions it asked for. A message
that fails is dropped whole (nothing of it is applied) and the reason is returned for the
counters and the log. The array checks of keyed requests, moves and sync answers are one native
pass per message (``Directory.check_message`` and ``check_sync_answer``, native/check.c: they
were ~30 numpy calls per SYNC, a sixth of the engine thread's time in a 2-node KGE run); the
rest is a few comparisons of header fields.

They agree with the native directory's own refusals (native/directory_module.c), so that a
message that passes here is never refused half-way through handling: relocated and replicated
keys distinct, none relocated to a node that owns it already or whose management variant never
relocates, intent masks naming only ranks of the job, a SYNC's intent reports distinct (and
only to a variant that acts on intent). Answers that a node posts to itself (the answer to a
request of its own that another node passed back to it) are checked the same way
(``local=True``): a peer chooses their contents as much as those of any message it sends.
Collective arrivals at rank 0 are bounded: one per rank, for the collective being gathered or
the next one only, so no sender can make rank 0 hold more than two collectives' arrivals.

What these checks cannot tell is whether a well-formed message from a member of the job is
*true* (a forged but consistent answer); that is what authentication (CURVE) is for.
"""

from __future__ import annotations

from typing import Optional


from .._wire.protocol import ANSWERS, CARRIERS, KEYED, NATIVE_REQUESTS, Kind, Message

_FROM_PEERS = frozenset(Kind) - {Kind.HELLO, Kind.TABLE, Kind.WAITING}
# Kinds whose keys, per-key arrays, rows and moves are checked natively.
_CHECKED = KEYED | CARRIERS


# Longest collective kind name ("barrier", "shutdown", a checkpoint's tag with its path).
_MAX_TAG_CHARS = 4096


def problem(msg: Message, state, local: bool = False) -> Optional[str]:
    """Why ``msg`` must be dropped, or None when it may be handled by ``state``.

    ``local``: a message this node posted to itself (its sender is this node).
    """
    world = state.world_size
    src = msg.src
    if not 0 <= src < world or (src == state.rank) != local:
        return f"sender rank {src} is not a peer"
    if msg.kind not in _FROM_PEERS:
        return f"{msg.kind.name} is not sent between nodes"
    if msg.req_id < 0:
        return f"negative request id {msg.req_id}"
    if msg.kind in KEYED:
        origin, hops = msg.header.get("o"), msg.header.get("h", 0)
        if type(origin) is not int or not 0 <= origin < world:
            return f"origin rank {origin!r} is not in the job"
        if type(hops) is not int or hops < 0:
            return f"hop count {hops!r}"
    if msg.kind in _CHECKED:
        # Keys, per-key arrays, rows and moves: one native pass (native/check.c).
        why = state.directory.check_message(msg.kind, msg.arrays)
        if why is not None:
            return why
    if msg.kind in ANSWERS:
        return _answer_problem(msg, state)
    if msg.kind == Kind.FORWARDED:
        ranks, counts = msg.arrays
        if len(ranks) != len(counts) or (len(ranks) and (
                int(ranks.min()) < 0 or int(ranks.max()) >= world or int(counts.min()) <= 0)):
            return "a forward notice with ranks not in the job or counts that are not positive"
    if msg.kind == Kind.FAILED:  # "rank r failed": every node stops, so it must name a rank
        failed = msg.header.get("r")
        if type(failed) is not int or not 0 <= failed < world:
            return f"a failure notice naming rank {failed!r}"
    if msg.kind == Kind.BARRIER:
        return _barrier_problem(msg, state)
    return None


def _barrier_problem(msg: Message, state) -> Optional[str]:
    if state.rank != 0:
        return "a barrier arrival at a rank other than 0"
    epoch, tag = msg.header.get("e"), msg.header.get("t")
    if type(epoch) is not int or not isinstance(tag, str) or len(tag) > _MAX_TAG_CHARS:
        return "a barrier arrival without epoch and kind"
    return state.collectives.problem(msg.src, epoch)


def _answer_problem(msg: Message, state) -> Optional[str]:
    req = state.requests.get(msg.req_id)
    if req is None:
        if msg.req_id >= NATIVE_REQUESTS and state.native_calls is not None:
            # An answer to a worker's pull that the transport sent (native/zmq_calls.c): checked
            # there, against that pull (False: none open, a late answer).
            if msg.kind == Kind.ERROR:
                return None if isinstance(msg.header.get("msg"), str) else "an error without text"
            why = state.native_calls.native_answer(int(msg.kind), msg.req_id, msg.src,
                                                   msg.arrays, None, False)
            return why if isinstance(why, str) else None
        return None  # a late answer to a request given up on: the state counts and drops it
    if msg.kind == Kind.ERROR:
        if req.round is not None:
            # A sync round has no caller to hand an error to; its requests are served or
            # passed on, never refused: what would stop this node is not taken from a peer.
            return (f"an ERROR answers request {msg.req_id} of a sync round: "
                    f"{str(msg.header.get('msg'))[:300]}")
        return None if isinstance(msg.header.get("msg"), str) else "an error without text"
    if msg.kind == Kind.BARRIER_RELEASE:
        if msg.src != 0:
            return "a barrier release not from rank 0"
        if req.positions is not None or req.round is not None:
            return f"a barrier release for request {msg.req_id}, which is no barrier"
        return None
    positions = msg.arrays[0]
    if req.round is not None:
        if msg.kind != Kind.SYNC_RESP:
            return f"{msg.kind.name} answers a sync round"
        return _sync_answer_problem(msg, req.round, state)
    if msg.kind == Kind.SYNC_RESP:
        return "a SYNC_RESP answers a worker's request"
    if req.positions is None:
        return f"{msg.kind.name} answers request {msg.req_id}, which asked for no keys"
    # Positions it asked for, no more than it waits for, and a pull's values as long as their
    # keys': one native pass.
    why = state.directory.check_answer(
        req.positions, req.keys, positions, req.remaining,
        len(msg.arrays[1]) if msg.kind == Kind.PULL_RESP else -1)
    return None if why is None else f"request {msg.req_id}: {why}"


def _sync_answer_problem(msg: Message, context, state) -> Optional[str]:
    """A SYNC_RESP against the round request it answers: one native pass (native/check.c)."""
    # The transport may have taken answers of it in since the state last looked: the count
    # of unanswered entries is the directory's then (Directory.round_answered).
    remaining = state.directory.round_answered(msg.req_id, 0)
    if remaining is None:
        remaining = state.requests[msg.req_id].remaining
    return state.directory.check_sync_answer(
        context.keys, context.num_intents, context.num_deltas, remaining, msg.req_id,
        msg.arrays[:8])
