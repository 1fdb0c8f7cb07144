"""Is a received message fit to touch this node's state? Checked before the state machine sees it.

The decoder (:func:`adapm._wire.protocol.decode`) already guarantees the framing: known kind,
integer header fields, the kind's number of arrays, each a whole number of its dtype. Here come
the checks that need the node: sender and origin ranks, keys in ``[0, num_keys)``, per-key
arrays as long as their keys, rows as long as their keys' values, home updates only for keys
homed here, answers only to requests this node has open, at positions it asked for. A message
that fails is dropped whole (nothing of it is applied) and the reason is returned for the
counters and the log. Vectorised numpy per array, no per-key Python.

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

import numpy as np

from .._store import OWNER
from .._wire.protocol import ANSWERS, CARRIERS, KEYED, MOVE_ARRAYS, Kind, Message

_FROM_PEERS = frozenset(Kind) - {Kind.HELLO, Kind.TABLE, Kind.WAITING}


# Longest collective kind name ("barrier", "shutdown", a checkpoint's tag with its path).
_MAX_TAG_CHARS = 4096


def problem(msg: Message, state, local: bool = False) -> Optional[str]:
    """Why ``msg`` must be dropped, or None when it may be handled by ``state``.

    ``local``: a message this node posted to itself (its sender is this node).
    """
    world, store = state.world_size, state.store
    src = msg.src
    if not 0 <= src < world or (src == state.rank) != local:
        return f"sender rank {src} is not a peer"
    if msg.kind not in _FROM_PEERS:
        return f"{msg.kind.name} is not sent between nodes"
    if msg.req_id < 0:
        return f"negative request id {msg.req_id}"
    if msg.kind in CARRIERS:
        why = _moves_problem(msg.moves(), state)
        if why:
            return why
    if msg.kind in KEYED:
        return _keyed_problem(msg, state)
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
    # A node arrives at collective e only once e - 1 was released, which needs rank 0's own
    # arrival there: so every arrival is for the collective being gathered (the next one, at
    # the most, is tolerated). Anything else would pile up at rank 0 for ever.
    low = state.barrier_next
    if not low <= epoch <= low + 1:
        return f"an arrival at collective #{epoch}, but rank 0 gathers #{low}"
    if msg.src in state.barrier_tags.get(epoch, ()):
        return f"a second arrival of rank {msg.src} at collective #{epoch}"
    return None


def _distinct(keys: np.ndarray) -> bool:
    return len(keys) < 2 or len(np.unique(keys)) == len(keys)


def _keys_problem(keys: np.ndarray, num_keys: int) -> Optional[str]:
    if len(keys) and (int(keys.min()) < 0 or int(keys.max()) >= num_keys):
        bad = int(keys.min()) if int(keys.min()) < 0 else int(keys.max())
        return f"key {bad} outside [0, {num_keys})"
    return None


def _rows_problem(keys: np.ndarray, rows: np.ndarray, store) -> Optional[str]:
    need = store.floats_for(keys)
    if len(rows) != need:
        return f"{len(rows)} floats for {len(keys)} keys that hold {need}"
    return None


def _keyed_problem(msg: Message, state) -> Optional[str]:
    world, store = state.world_size, state.store
    origin, hops = msg.header.get("o"), msg.header.get("h", 0)
    if type(origin) is not int or not 0 <= origin < world:
        return f"origin rank {origin!r} is not in the job"
    if type(hops) is not int or hops < 0:
        return f"hop count {hops!r}"
    sections = msg.sections()
    keyed = 3 if msg.kind == Kind.SYNC else 1
    if msg.kind == Kind.SYNC and len(sections[0][0]):
        if state.variant < 0:
            return "intent reports to a node whose management does not act on intent"
        if not _distinct(sections[0][0]):
            return "intent reports that name a key twice"
    for section in sections[:keyed]:
        keys = section[0]
        why = _keys_problem(keys, store.num_keys)
        if why:
            return why
        for array in section[1:]:
            if array.dtype.kind == "f":
                why = _rows_problem(keys, array, store)
                if why:
                    return why
            elif len(array) != len(keys):
                return f"{len(array)} entries for {len(keys)} keys"
    return None


def _moves_problem(moves: list, state) -> Optional[str]:
    store, world = state.store, state.world_size
    words = (world + 63) // 64
    relocations, setups, homes = moves[:6], moves[6:9], moves[9:MOVE_ARRAYS]
    for name, arrays in (("relocation", relocations), ("replica", setups)):
        keys = arrays[0]
        why = _keys_problem(keys, store.num_keys) or _rows_problem(keys, arrays[1], store)
        if why:
            return f"{name}: {why}"
        if len(arrays[2]) != len(keys):
            return f"{name}: {len(arrays[2])} versions for {len(keys)} keys"
        if not _distinct(keys):
            return f"{name}: a key named twice"
    keys = relocations[0]
    if any(len(mask) != len(keys) * words for mask in relocations[3:5]) or \
            len(relocations[5]) != len(keys):
        return "relocation: masks or epochs do not match its keys"
    if len(keys):
        if state.variant < 0:
            return "relocation: this node's management never relocates"
        if np.any(store.states(keys) == OWNER):
            return "relocation of a key this node owns already"
        spare = world % 64  # bits of the last mask word past the last rank must be clear
        if spare and any(np.any(mask[words - 1::words] >> np.uint64(spare))
                         for mask in relocations[3:5]):
            return "relocation: a mask names a rank outside the job"
    keys, ranks, epochs = homes
    why = _keys_problem(keys, store.num_keys)
    if why:
        return f"home update: {why}"
    if len(ranks) != len(keys) or len(epochs) != len(keys):
        return "home update: ranks or epochs do not match its keys"
    if len(keys) and (np.any(keys % world != state.rank) or int(ranks.min()) < 0
                      or int(ranks.max()) >= world):
        return "home update for a key homed elsewhere, or to a rank not in the job"
    return None


def _answer_problem(msg: Message, state) -> Optional[str]:
    req = state.requests.get(msg.req_id)
    if req is None:
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
    asked = req.positions
    if asked is None:
        return f"{msg.kind.name} answers request {msg.req_id}, which asked for no keys"
    at = np.searchsorted(asked, positions)
    if len(positions) and (int(at.max()) >= len(asked) or np.any(asked[at] != positions)):
        return f"answer positions that request {msg.req_id} did not ask for"
    if len(positions) > req.remaining:
        return f"more answers than request {msg.req_id} waits for"
    if msg.kind == Kind.PULL_RESP:
        return _rows_problem(req.keys[at], msg.arrays[1], state.store)
    return None


def _sync_answer_problem(msg: Message, context, state) -> Optional[str]:
    positions, versions, refresh, values, moved, ranks, back, rows = msg.arrays[:8]
    keys = context.keys
    n = len(keys)
    for name, pos in (("answered", positions), ("refreshed", refresh), ("redirected", moved),
                      ("returned", back)):
        if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= n):
            return f"sync answer: {name} position outside the round's {n} entries"
    if len(refresh) and (int(refresh.min()) < context.num_intents
                         or not np.isin(refresh, positions).all()):
        return "sync answer: a refresh of an entry that is not an answered replica entry"
    if len(versions) != len(positions) or len(ranks) != len(moved):
        return "sync answer: versions or ranks do not match their positions"
    if len(ranks) and (int(ranks.min()) < 0 or int(ranks.max()) >= state.world_size):
        return "sync answer: a redirect to a rank not in the job"
    if len(moved) and int(moved.max()) >= context.num_intents:
        return "sync answer: a redirect of an entry that is no intent report"
    if len(back) and int(back.min()) < context.num_intents:
        return "sync answer: an intent report returned as a delta"
    if len(positions) + len(moved) + len(back) > state.requests[msg.req_id].remaining:
        return f"more answers than request {msg.req_id} waits for"
    # Rows come back for returned deltas only, not for returned version checks.
    deltas = back[back < context.num_intents + context.num_deltas]
    return (_rows_problem(keys[refresh], values, state.store)
            or _rows_problem(keys[deltas], rows, state.store))
