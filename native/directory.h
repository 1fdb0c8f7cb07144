/* A node's directory beyond the store: where keys went (forward pointers, location hints,
 * ownership epochs), the home table of the keys homed here, and the owner's per-key intent and
 * replica masks (see adapm/_engine/routing.py and policy.py). Relocations change all of it
 * together with the store, so they run here in one pass per batch: numpy needed ~15 calls per
 * relocated batch on each side (bench/adaptive.py, 2 nodes: ~0.15 ms per relocation message
 * taken in, ~15% of the engine thread's CPU). Touches no Python object.
 *
 * Memory: the home table's owners are dense over the home partition (4 B per key homed here);
 * everything else is a record per active key (records.h), so a key nobody touched costs nothing
 * here. Passes that may create records reserve room for one per key of their batch first
 * (dir_reserve; the bindings do it), so that they never fail halfway.
 */
#ifndef ADAPM_DIRECTORY_H
#define ADAPM_DIRECTORY_H

#include <stdint.h>

#include "intents.h"
#include "pins.h"
#include "records.h"
#include "replica_set.h"
#include "slots.h"
#include "store.h"

typedef struct {
    const store_t *store;
    slot_alloc_t *alloc;             /* the store's slot allocator */
    replica_set_t *held;             /* the keys held here as replicas */
    records_t *recs;                 /* hints, forward pointers, epochs, masks of active keys */
    int64_t rank, world_size, words; /* words: uint64 words per mask (ceil(world_size / 64)) */
    int masks;                       /* the variant keeps intent and replica masks */
    int32_t *home_owner;             /* per key of this channel homed here: dir_home_index */
    int64_t num_home;
    /* Channels (store.h): this directory is channel `channel` of `channels` and sees only its
     * keys, (key / world_size) % channels == channel (dir_in_channel; a message with others is
     * dropped by the checks). */
    int64_t channel, channels;
    pins_t *pins;                    /* keys the node's workers use now (pins.h) */
    /* This node's intent counts (Directory.use_counts), or NULL. With them, a key owned here
     * whose only state is this node's own intent (S = {rank}, nothing else in its record) needs
     * no record: the told flag of its count is that bit (see dir_policy_decide). */
    const intent_counts_t *counts;
    int average;                     /* Config.replica_updates "average": see sync_serve.c */
} directory_t;

/* Whether key belongs to this directory's channel. */
static inline int dir_in_channel(const directory_t *d, int64_t key) {
    return d->channels == 1 || (key / d->world_size) % d->channels == d->channel;
}

/* Index of a key homed here (and of this channel) in home_owner. */
static inline int64_t dir_home_index(const directory_t *d, int64_t key) {
    return key / d->world_size / d->channels;
}

/* This node's own bit of S for key owned here without a record: the told flag of its intent
 * count (0 without counts). */
static inline int dir_own_told(const directory_t *d, int64_t key) {
    if (!d->counts) return 0;
    const ic_rec_t *e = ic_find(d->counts, key);
    return e && e->told;
}

/* key's record, made if it has none (needs room: dir_reserve). A record made for a key owned
 * here takes in this node's own bit of S from the told flag (dir_own_told): every record of an
 * owned key then holds that bit itself. */
static inline int32_t dir_rec_get(const directory_t *d, int64_t key) {
    const int32_t found = rec_find(d->recs, key);
    if (found >= 0) return found;
    const int32_t r = rec_get(d->recs, key);
    if (d->recs->words && store_state(d->store, key) == KEY_OWNER && dir_own_told(d, key))
        rec_mask_words(d->recs, r)[d->rank / 64] |= (uint64_t)1 << (d->rank % 64);
    return r;
}

/* Room for n new records (one per key of a batch). 0, or -1 if out of memory. */
static inline int dir_reserve(const directory_t *d, int64_t n) { return rec_reserve(d->recs, n); }

/* Keys (unique, owned here) leave for dst: copies out their values (packed, key order),
 * versions, masks (S, R: `words` per key, then zeroed here) and new epochs (epoch + 1), marks
 * them not held (their slots are free again; slots: n entries of scratch), points their
 * forward pointer and hint to dst. Returns n, or -1 - i if keys[i] is not owned here (then
 * nothing changed), or -1 - n if values is too small. */
int64_t dir_relocate_out(const directory_t *d, const int64_t *keys, int64_t n, int64_t dst,
                         float *values, int64_t values_floats, int64_t *versions,
                         uint64_t *s_out, uint64_t *r_out, int64_t *epochs, int64_t *slots);

/* Keys (unique, not owned here) arrive as main copies with values (packed, key order),
 * versions, masks and epochs: a replica held here is promoted (its unsent updates are added;
 * it leaves d->held),
 * other keys get a slot and are inserted (slots: n entries of scratch). The new owner's replica
 * bit is cleared, the epoch installed, the hint set to this node and, for keys homed here, the
 * home table updated if the epoch is newer. was_replica[i] says which were promoted. Returns
 * n, or -1 - i if keys[i] is owned here already, -1 - n if values is too short, or -2 - n if
 * no slot could be had (out of memory); then nothing changed. */
int64_t dir_relocate_in(const directory_t *d, const int64_t *keys, int64_t n,
                        const float *values, int64_t values_floats, const int64_t *versions,
                        const uint64_t *s_in, const uint64_t *r_in, const int64_t *epochs,
                        int64_t *slots, int8_t *was_replica);

/* The policy's verdicts on node's reports for keys[0..n) (owned here, unique), over the masks
 * of their records (policy_decide_key); needs room for n records. Returns the replicas dropped
 * from R. own_acked: node is this node and the caller acknowledges the reports in d->counts at
 * once (a round's own reports): a key without a record then gets none. Its S is this node's
 * bit at most (an owned key's record stays while it has another bit, a replica or an epoch),
 * so the verdict is "nothing moves", and the bit is the told flag the acknowledgement sets.
 * (bench/adaptive.py, whose nodes mostly report their own keys: the decisions and records went
 * from 17.6% of the engine thread's samples to 14.5-15.9%; the look-up of the record stays.) */
int64_t dir_policy_decide(const directory_t *d, int variant, int64_t node, const int64_t *keys,
                          int64_t n, const uint8_t *has_intent, int64_t *relocate_to,
                          uint64_t *setup, int own_acked);

/* An owner's decision on one node's intent reports, carried out (see adapm/_engine/state.py,
 * NodeState._decided): policy_decide's verdicts (relocate_to[i], setup[i][words]) for keys[i]
 * become relocations (dir_relocate_out, grouped by destination), replica set-ups (the value and
 * version to send, grouped by destination) and home updates (relocated keys homed neither here
 * nor at their new owner, grouped by home; those homed here update the home table directly).
 * First dir_decide_sizes says how large the outputs are; the caller allocates them. */
typedef struct {
    int64_t relocations, relocation_floats; /* keys relocated, floats of their values */
    int64_t setups, setup_floats;           /* (key, node) pairs that get a replica */
    int64_t home_updates;                   /* to other nodes */
} decide_sizes_t;

/* out->relocations = -1 if a verdict names a rank >= world_size (masks with stray bits). */
void dir_decide_sizes(const directory_t *d, const int64_t *keys, int64_t n,
                      const int64_t *relocate_to, const uint64_t *setup, decide_sizes_t *out);

/* Every array is sized by dir_decide_sizes (per relocation, per set-up pair, per home update;
 * masks `words` per relocation; r_slots is scratch); the *_count arrays have world_size entries: how many of the
 * entries, which are ordered by rank, go to each rank. Within a rank, entries keep the order
 * of keys. */
typedef struct {
    int64_t *r_count, *r_keys, *r_versions, *r_epochs, *r_slots;
    float *r_values;
    uint64_t *r_s, *r_r;
    int64_t *s_count, *s_keys, *s_versions;
    float *s_values;
    int64_t *h_count, *h_keys, *h_owners, *h_epochs;
} decide_out_t;

/* Carries out the verdicts (keys owned here, unique, as policy_decide had them); cursor:
 * scratch of max(world_size, setups) entries. Returns 0, or -1 if a relocated or replicated key is not owned here (a
 * relocation is then partly done: callers check ownership before policy_decide). */
int64_t dir_decide_execute(const directory_t *d, const int64_t *keys, int64_t n,
                           const int64_t *relocate_to, const uint64_t *setup,
                           const decide_sizes_t *sizes, decide_out_t *o, int64_t *cursor);

/* Where a request for a key not owned here goes next (see Router.next_hop): to the owner the
 * home table names for keys homed here, else where this node sent the key; -1: on its way here
 * (or never here and not homed here, which only a request that saw it sent here can ask). */
static inline int64_t dir_next_hop(const directory_t *d, int64_t key) {
    const int64_t nxt = key % d->world_size == d->rank ? d->home_owner[dir_home_index(d, key)]
                                                       : rec_forward(d->recs, key);
    return nxt == d->rank ? -1 : nxt;
}

/* Serving a SYNC (see adapm/_engine/state.py, NodeState._sync): its sections and who sent it.
 * Entries are numbered over the sections in order (intents, deltas, checks). */
typedef struct {
    int64_t origin;
    const int64_t *ikeys, *ipos;
    const uint8_t *iflags;
    int64_t ni;
    const int64_t *dkeys, *dpos, *dver;
    const float *drows; /* the deltas' rows, packed */
    int64_t nd;
    const int64_t *ckeys, *cpos, *cver;
    int64_t nc;
    int variant; /* the management policy (policy.h) the owned reports are decided by */
} sync_request_t;

/* Entry e's key and the section it is in (0 intents, 1 deltas, 2 checks). */
static inline int64_t sync_entry_key(const sync_request_t *r, int64_t e, int *section) {
    if (e < r->ni) {
        *section = 0;
        return r->ikeys[e];
    }
    e -= r->ni;
    if (e < r->nd) {
        *section = 1;
        return r->dkeys[e];
    }
    *section = 2;
    return r->ckeys[e - r->nd];
}

/* What happens to each entry: served here (owned), an intent report answered with where to
 * report it, a delta or check for a key that went to the origin itself (back in the answer),
 * held here (the key is on its way here) or forwarded (next hop). Under the adaptive policy an
 * owned key's report whose verdict would relocate the key while a worker here has it pinned
 * (pins.h: in a local sample it has not pushed yet) is deferred: answered as a redirect to this
 * node, not decided, so the origin reports it again with a later round and the key moves there
 * once the pins are gone, instead of between the worker's read and its push, which then went
 * remote (most of KGE's remote accesses). Measured on a 2-node KGE run: remote share 0.35% ->
 * 0.007%, and MRR higher, not lower (bench notes, issue 25). Giving the origin a replica
 * meanwhile (the pinning owner counted in S for that decision) cost quality, replica staleness
 * on KGE's positives: measured again in session 34, the 2-node workers' waits for keys vanished
 * but MRR was 0.91-0.98 of the baseline's at epochs 2-4 against 0.99-1.01 (8 seeds each), and
 * in session 40 (three alternating pairs of 32 seeds: 0.82 against 0.87 at epoch 2, 0.94
 * against 0.96 at epoch 4; the waits 80-95% shorter, epochs alike; docs/quality.md). */
enum { SYNC_OWNED = 0, SYNC_REDIRECT = 1, SYNC_BACK = 2, SYNC_QUEUE = 3, SYNC_FORWARD = 4 };

typedef struct {
    int8_t *where;  /* per entry: SYNC_* */
    int64_t *hop;   /* per entry: the next hop (REDIRECT, FORWARD), else -1 */
    int64_t owned_intents, owned_syncs, owned_sync_floats; /* syncs: deltas and checks */
    int64_t redirects, backs, back_floats, rest;           /* rest: QUEUE and FORWARD */
    int64_t deferred; /* of the redirects: owned keys' reports deferred (pinned here) */
} sync_plan_t;

/* The pins a SYNC's plan consults (its reports on pinned owned keys may be deferred), or NULL.
 * The caller holds them locked (pins_lock) from dir_sync_plan until the decision on the owned
 * reports has been carried out (dm_decide): a worker that pins a key of its local sample
 * (Directory.repin, which waits for the lock) then either pins it before the plan looks, and
 * the report is deferred, or after the key has left, and its read finds it gone and draws
 * again. Released between the two, a key could pass the check unpinned, be pinned and read by
 * the worker, and leave before the worker's push, which then went remote. */
pins_t *dir_sync_pins(const directory_t *d, const sync_request_t *r);

/* Decides where each entry goes (changes nothing); the pins of dir_sync_pins locked. */
void dir_sync_plan(const directory_t *d, const sync_request_t *r, sync_plan_t *p);

/* The answer to the origin and what is left, sized by the plan: positions and versions per
 * owned entry (intents first, version -1, then deltas and checks); refresh positions and
 * values (up to owned_sync_floats) for replicas that are behind; redirect positions and ranks;
 * back positions (backs) and rows (back_floats); rest entries and their hops (-1: queue). The
 * owned intent reports go to ikeys/iflags (owned_intents), for the policy. */
typedef struct {
    int64_t *positions, *versions;
    int64_t *refresh_pos;
    float *values;
    int64_t *redirect_pos, *redirect_ranks, *back_pos;
    float *back_rows;
    int64_t *rest_index, *rest_hop;
    int64_t *ikeys;
    uint8_t *iflags;
    int64_t *skeys; /* scratch: owned_syncs */
    float *srows;   /* scratch: owned deltas' rows (owned_sync_floats) */
    int64_t *missing; /* scratch: owned_syncs */
    uint8_t *behind;  /* scratch: owned_syncs */
    int64_t nrefresh, nvalues; /* out */
} sync_answer_t;

/* Merges the owned deltas into the store (each owned replica delta or check then answered
 * with the version after the merge, and the value where the holder is behind: the version is
 * read before the value, so it is never newer than it), and fills the answer. Returns 0, or
 * -1 if a key owned at planning time vanished (only this thread removes keys: cannot happen). */
int64_t dir_sync_serve(const directory_t *d, const sync_request_t *r, const sync_plan_t *p,
                       sync_answer_t *a);

/* A sync round's requests (see adapm/_engine/state.py, NodeState._build_round), after the
 * reports for keys owned here were decided: reports[nr] (keys not owned here, unique, and
 * whether this node has intent) and the replicas held here (held: d->held at the call). A
 * replica whose intent ended is dropped now (and leaves d->held) and its last delta goes
 * along; every other replica sends its delta, or its version alone when it has none. Entries are numbered over the sections
 * (intents, deltas, checks) and grouped by where this node believes each key is (its hint). */
typedef struct {
    const int64_t *rkeys;
    const uint8_t *rflags;
    int64_t nr;
    pins_t *release; /* locked by the caller: unlocked as soon as the dropped replicas have left,
                      * before the deltas are taken (NULL: nothing to unlock; dir_sync_pins) */
    int exact;       /* every delta in float32, residues included (someone waits for the round:
                      * wait_sync promises every push merged); else the live replicas' deltas go
                      * as bfloat16 (DELTA_NARROW) and the rounding stays here. Dropped
                      * replicas' last deltas are always float32. */
} round_in_t;

typedef struct {
    int64_t drops, drop_floats; /* replicas dropped now */
    int64_t held_floats;        /* floats of all held replicas' values (deltas' upper bound) */
} round_sizes_t;

void dir_round_sizes(const directory_t *d, const round_in_t *in, round_sizes_t *z);

/* Outputs (sized by dir_round_sizes; counts: 3 * world_size, per section and rank): the
 * dropped keys (their slots are free again; drop_slots is scratch); every entry's key in entry order (keys); per section,
 * ordered by rank and within a rank by entry: intents (keys, positions, flags), deltas (keys,
 * positions, rows, the versions they are based on), checks (keys, positions, versions).
 * Scratch (s_*), with nh = d->held->len: live nh, nonzero nh, ver / at / off nr + nh, cursor
 * world_size, rows drop_floats. */
typedef struct {
    int64_t *drop_keys, *drop_slots, *counts, *keys;
    int64_t *ikeys, *ipos;
    uint8_t *iflags;
    int64_t *dkeys, *dpos, *dver;
    float *drows;
    int64_t *ckeys, *cpos, *cver;
    int64_t nd, nc, delta_floats; /* out: entries of each section, floats of the deltas' rows
                                   * (a narrow row takes delta_row_floats) */
    int64_t *s_live, *s_ver, *s_at, *s_off, *s_cursor;
    int8_t *s_nonzero;
    float *s_rows;
} round_out_t;

/* Builds the requests; returns 0, or -1 if a hint names a rank outside the world. */
int64_t dir_round_build(const directory_t *d, const round_in_t *in, const round_sizes_t *z,
                        round_out_t *o);

/* Replicas from the owner src: keys[0..n) (unique) with values (packed) and versions. A key is
 * taken only if it is not held here and this node still wants it (wanted[i] != 0; NULL: none is
 * wanted): its synced_at becomes now, it gets a slot, is inserted as a replica and joins
 * d->held. If any was taken, every key of the batch not owned here gets src as its location
 * hint. Writes the taken keys to taken; scratch: rows (the values' floats), vers and slots
 * (n each). Returns how many were taken, or -1 if out of memory (none taken). */
int64_t dir_setup_in(const directory_t *d, int64_t src, const int64_t *keys, int64_t n,
                     const float *values, const int64_t *versions, const uint8_t *wanted,
                     double now, int64_t *taken, float *rows, int64_t *vers, int64_t *slots);

/* A SYNC_RESP's keyed part taken in at the round's origin (see adapm/_engine/state.py,
 * NodeState._apply_sync_answer): keys[nkeys] and flags[ni] are the round's entries (intent
 * reports first, ni of them, with whether this node has intent); the answer names positions
 * into them (pos[n], with versions[n]: -1 for reports) and refresh positions (refresh[nr],
 * values packed). Every answered key not owned here gets src as its hint; every answered report
 * counts as acknowledged (the caller tells the intent counts, intents.h); replicas that were behind take the value that came
 * (plus their own updates since) and its version; every answered replica takes its version and
 * synced_at = now. by_pos: nkeys scratch. Returns the number of reports acknowledged. */
int64_t dir_apply_answer(const directory_t *d, const int64_t *keys, int64_t nkeys,
                         const uint8_t *flags, int64_t ni, int64_t src, const int64_t *pos,
                         const int64_t *versions, int64_t n, const int64_t *refresh, int64_t nr,
                         const float *values, int64_t nvalues, double now, int64_t *by_pos);

#endif
