/* Store primitives: gather / scatter-add / set over key batches.
 *
 * Where values live: the slab, a float32 region that Python reserves (address space for every
 * key, committed only where written). Its bottom holds a fixed row for every key homed on this
 * node (k % world == rank), in home order; above that, rows handed out by the slot allocator
 * (slots.h) to keys homed elsewhere. A key homed here always uses its fixed row, whether it is
 * the owner copy or a replica.
 *
 * Which keys are held, with what version (compact state, DESIGN section 3):
 * - one 32-bit word per home key: HOME_OWNED while the main copy is here, and its version;
 * - every other key held here (a key homed elsewhere, or a replica of a home key) has an entry
 *   in the held map (held.h): slot word, version, sync time. So a node's metadata is 4 B per
 *   home key plus an entry per key it holds beyond those, not a few words per key of the space.
 * Versions count modulo 2^31 (VERSION_MASK): they are only compared for equality.
 *
 * Concurrency: one seqlock per stripe of keys (key & stripe_mask). Readers (gather) take no lock:
 * they copy and retry if a writer touched the stripe meanwhile. Writers (push, set, insert,
 * remove) spin on the stripe's sequence word. This keeps the common case, a pull of local keys,
 * free of atomic read-modify-writes per key, and it makes a key's directory entry and value
 * change together: a reader never sees a slot that was freed and reused under it. Batch calls
 * that may run beside the engine thread bracket themselves with store_enter/store_exit, so that
 * a rehash of the held map never frees a table under them.
 *
 * Channels (Config.channels = K): a node's engine work is split over K threads by key, key k
 * going to channel (k / world) % K (store_shard). Each channel's thread is the one inserting
 * and removing thread of its keys: they have a held map (held[c]) and a slot allocator of their
 * own, with a region of the slab of its own, so the K threads never write the same structure.
 * Wherever these comments say "the engine thread", read "the engine thread of the key's
 * channel". The sampler's pool, shared by all, is kept under a lock when K > 1.
 *
 * All functions are called with the GIL released and touch no Python object.
 */
#ifndef ADAPM_STORE_H
#define ADAPM_STORE_H

#include <stdint.h>

#include "held.h"
#include "seqlock.h"
#include "sampling.h"

enum { KEY_NONE = 0, KEY_OWNER = 1, KEY_REPLICA = 2 };

#define HOME_OWNED ((uint32_t)1 << 31)
#define VERSION_MASK ((int64_t)0x7fffffff)

typedef struct {
    int64_t num_keys;
    int64_t uniform_len;   /* > 0: every key has this many floats; 0: see lens */
    const int64_t *lens;   /* per-key lengths when uniform_len == 0 */
    int64_t rank, world;   /* the home partition: keys k with k % world == rank */
    int home_shift;        /* log2(world) when world is a power of two, else -1 */
    uint32_t *home;        /* per home key (index k / world): HOME_OWNED | version */
    const int64_t *home_off; /* lens given: each home key's row (float offset); NULL otherwise */
    int64_t home_floats;   /* the home rows' region at the bottom of the slab */
    held_map_t *held;      /* every other key held here: shards maps, by store_shard */
    int64_t shards;        /* channels: 1, or K (see Concurrency above) */
    float *slab;           /* values of held keys */
    float *delta;          /* replicas: updates not yet sent to the owner (same offsets as slab) */
    int64_t slab_floats;   /* capacity of slab and delta, for bounds checks */
    uint64_t *seqs;        /* stripe sequence words, SEQ_STRIDE words apart (one per cache
                            * line: seqlock.h); odd while a writer holds the stripe */
    uint64_t stripe_mask;  /* number of stripes - 1 (a power of two) */
    int64_t *access_stats; /* [replica reads, sum of read times (us), sum of synced_at (us)] */
    /* The `local` sampler's pool of the held keys of its domain (sampling.h), kept by
     * store_insert and store_remove as keys come and go, whatever moved them; pool.pool NULL:
     * none. *pool_count: its size, stored with release order by the one thread that inserts
     * and removes, read by workers (a drawn key may be gone by the time it is read: the
     * gather says so). */
    pool_t pool;
    int64_t *pool_count;
    int *pool_lock;        /* shards > 1: taken by whoever changes the pool */
} store_t;

/* Most channels a node can have (the shards of its store). */
#define STORE_MAX_SHARDS 64

/* Replica-ness is a bit of the slot word, so that a read, which must not touch more cache lines
 * than it needs, learns it from the slot it loads anyway. DIRTY_BIT: a replica whose delta row
 * has had updates added since it was last taken (set by a push under the stripe lock, cleared
 * by store_take_deltas and store_refresh's promotion). A replica without it (and without
 * RESIDUE_BIT, below) has an all-zero delta row, so a round neither reads nor copies that row
 * (most replicas of a round have no new updates: KGE on 2 nodes, ~60%), and a refresh copies
 * the value without adding it. */
#define REPLICA_BIT ((int64_t)1 << 62)
#define DIRTY_BIT ((int64_t)1 << 61)
/* RESIDUE_BIT: a replica whose delta row holds what rounding left when its delta last went out
 * in bfloat16 (store_take_deltas_to, narrow), and nothing newer. It goes with the replica's next
 * delta, its drop, or the next round someone waits for (never lost, only late); a refresh adds
 * it to the value, as any update not sent yet. */
#define RESIDUE_BIT ((int64_t)1 << 60)
#define DELTA_BITS (DIRTY_BIT | RESIDUE_BIT) /* the delta row may hold something */
#define SLOT_OFFSET(raw) ((raw) & (RESIDUE_BIT - 1))

/* bfloat16: a float's top 16 bits, rounded toward zero (a NaN stays a NaN). What a delta row
 * sent narrow leaves behind, at most 2^-7 of each value, stays with the sender, and it has the
 * value's sign: whoever reads the row before it follows sees part of the update, never more
 * (rounding to nearest could overshoot: an AdaGrad accumulator, never negative, read below
 * zero where a replica became the main copy while its delta came back, examples/gnn). */
static inline uint16_t bf16_of(float f) {
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    const int nan = (u & 0x7fffffffu) > 0x7f800000u;
    return (uint16_t)((u >> 16) | (nan ? 0x40u : 0u));
}

static inline float float_of_bf16(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}

/* A SYNC's delta whose version has DELTA_NARROW set (bit 62 of a version >= 0: -1 says "no
 * version") carries its row as bfloat16, padded to a whole number of floats. */
#define DELTA_NARROW ((int64_t)1 << 62)
static inline int delta_narrow(int64_t version) { return (version >> 62) == 1; }
/* A SYNC's delta whose version (>= 0) has DELTA_LAST set (bit 61) is a dropped replica's last
 * one (dir_round_build): its holder keeps no copy, so the owner merges it and sends no value
 * back, however far behind the holder's version is (KGE, 2-4 nodes: 5-8% of the refreshes the
 * holders received went to replicas dropped in the same round, and were thrown away). */
#define DELTA_LAST ((int64_t)1 << 61)
static inline int delta_last(int64_t version) { return version >= 0 && (version & DELTA_LAST); }
/* The version without the marks. */
static inline int64_t delta_version(int64_t version) {
    return version < 0 ? version : version & ~(DELTA_NARROW | DELTA_LAST);
}
/* The floats a delta's row takes on the wire. */
static inline int64_t delta_row_floats(int64_t len, int64_t version) {
    return delta_narrow(version) ? (len + 1) / 2 : len;
}

/* A 64-bit division costs tens of cycles, more than the rest of a lookup: clusters of a power
 * of two nodes (home_shift >= 0) use a mask and a shift instead. */
static inline __attribute__((always_inline)) int64_t home_at_pow2(const store_t *s, int64_t key,
                                                                   int pow2) {
    if (pow2) return (key & (s->world - 1)) == s->rank ? key >> s->home_shift : -1;
    return key % s->world == s->rank ? key / s->world : -1;
}

static inline int64_t home_at(const store_t *s, int64_t key) { /* home index, or -1 */
    return s->home_shift >= 0 ? home_at_pow2(s, key, 1) : home_at_pow2(s, key, 0);
}

static inline int is_home(const store_t *s, int64_t key) { return home_at(s, key) >= 0; }

/* key's channel: (key / world) % shards. */
static inline int64_t store_shard(const store_t *s, int64_t key) {
    if (s->shards == 1) return 0;
    const int64_t q = s->home_shift >= 0 ? key >> s->home_shift : key / s->world;
    return q % s->shards;
}

/* The held map that has key's entry, if any. */
static inline held_map_t *store_held(const store_t *s, int64_t key) {
    return s->shards == 1 ? s->held : &s->held[store_shard(s, key)];
}

/* store_enter: a batch call that reads held maps beside the engine threads enters every shard
 * (held_enter); the tokens, one bit per shard, are for store_exit. */
static inline uint64_t store_enter(const store_t *s) {
    uint64_t tokens = 0;
    for (int64_t i = 0; i < s->shards; i++)
        tokens |= (uint64_t)held_enter(&s->held[i]) << i;
    return tokens;
}

static inline void store_exit(const store_t *s, uint64_t tokens) {
    for (int64_t i = 0; i < s->shards; i++) held_exit(&s->held[i], (int)((tokens >> i) & 1));
}

/* The fixed row of the key with home index h. */
static inline int64_t home_row_at(const store_t *s, int64_t h) {
    return s->home_off ? s->home_off[h] : h * s->uniform_len;
}

/* The fixed row of a key homed here. */
static inline int64_t home_row(const store_t *s, int64_t key) {
    return home_row_at(s, home_at(s, key));
}

/* Where key is held: its slot word (row offset, | REPLICA_BIT for a replica), or -1; *entry gets
 * its held-map entry (NULL for an owned home key or a key not held). Under the key's stripe (a
 * seqlock read or the lock), on the engine thread or inside a section. */
static inline int64_t store_lookup(const store_t *s, int64_t key, held_entry_t **entry) {
    const int64_t h = home_at(s, key);
    if (h >= 0 && (__atomic_load_n(&s->home[h], __ATOMIC_RELAXED) & HOME_OWNED)) {
        *entry = 0;
        return home_row_at(s, h);
    }
    held_entry_t *e = held_find(held_table(store_held(s, key)), key);
    *entry = e;
    return e ? __atomic_load_n(&e->raw, __ATOMIC_RELAXED) : -1;
}

/* How many keys ahead a loop over a batch calls store_prefetch. */
enum { STORE_AHEAD = 16 };

/* Starts loading what store_lookup will read of key: its home word, and the held map's slot
 * where its search begins. A batch loop that looks up each key calls it for the key
 * STORE_AHEAD on: a look-up that misses the cache costs ~100 ns, and a round classifies
 * thousands of reported keys (bench/adaptive.py: the owned-here test of a round's reports was
 * ~80% of Directory.round_build's time, nearly all of it waiting on those two loads). A hint:
 * nothing is read or locked. Engine thread (or inside a section). */
static inline void store_prefetch(const store_t *s, int64_t key) {
    const int64_t h = home_at(s, key);
    if (h >= 0) __builtin_prefetch(&s->home[h]);
    const held_table_t *t = held_table(store_held(s, key));
    __builtin_prefetch(&t->entries[held_slot(t, key)]);
}

/* KEY_NONE, KEY_OWNER or KEY_REPLICA: engine thread (or inside a section, as a snapshot). */
static inline int store_state(const store_t *s, int64_t key) {
    held_entry_t *e;
    const int64_t raw = store_lookup(s, key, &e);
    return raw < 0 ? KEY_NONE : (raw & REPLICA_BIT) ? KEY_REPLICA : KEY_OWNER;
}

/* A held key's version (-1 if not held): the owner's, which workers here may be bumping, or a
 * replica's last synced one. Engine thread, or inside a section. */
static inline int64_t store_version(const store_t *s, int64_t key) {
    const int64_t h = home_at(s, key);
    if (h >= 0) {
        const uint32_t w = __atomic_load_n(&s->home[h], __ATOMIC_ACQUIRE);
        if (w & HOME_OWNED) return (int64_t)(w & ~HOME_OWNED);
    }
    held_entry_t *e = held_find(held_table(store_held(s, key)), key);
    return e ? __atomic_load_n(&e->version, __ATOMIC_ACQUIRE) : -1;
}

/* A replica's sync time (0 if key is not a replica here). Engine thread, or inside a section. */
static inline double store_synced_at(const store_t *s, int64_t key) {
    held_entry_t *e;
    const int64_t raw = store_lookup(s, key, &e);
    return raw >= 0 && (raw & REPLICA_BIT) ? e->synced_at : 0.0;
}

/* Engine thread: replicas (others skipped) now stand at version, synced at now. */
void store_set_synced(const store_t *s, const int64_t *keys, int64_t n, const int64_t *versions,
                      double now);

/* The engine thread of channel shard, holding no stripe lock: room in its held map for n more
 * keys. 0, or -1 if out of memory (nothing changed). */
int store_reserve(const store_t *s, int64_t shard, int64_t n);

static inline int64_t key_len(const store_t *s, int64_t key) {
    return s->uniform_len ? s->uniform_len : s->lens[key];
}

/* The sequence word of key's stripe (seqlock.h). */
static inline uint64_t *store_stripe(const store_t *s, int64_t key) {
    return &s->seqs[((uint64_t)key & s->stripe_mask) * SEQ_STRIDE];
}

/* The second stage after store_prefetch (call it for a key whose store_prefetch ran some keys
 * earlier, so that its look-up hits the cache): starts loading the key's stripe word and the
 * first lines of its value row and, for a replica, of its delta row, which a refresh reads and
 * writes; with deltas_only, only a replica with DIRTY_BIT's stripe word and delta row (what
 * store_has_delta reads). A hint: the look-up is unlocked, a row being moved meanwhile only
 * prefetches the wrong lines. Engine thread (or inside a section). */
static inline void store_prefetch_rows(const store_t *s, int64_t key, int deltas_only) {
    enum { LINES = 4 }; /* the hardware prefetcher follows a row from there */
    held_entry_t *e;
    const int64_t raw = store_lookup(s, key, &e);
    if (raw < 0 || (deltas_only && (raw & (REPLICA_BIT | DIRTY_BIT)) != (REPLICA_BIT | DIRTY_BIT)))
        return;
    __builtin_prefetch(store_stripe(s, key), 1);
    const int64_t slot = SLOT_OFFSET(raw);
    if (slot >= s->slab_floats) return;
    int64_t bytes = key_len(s, key) * (int64_t)sizeof(float);
    if (bytes > LINES * 64) bytes = LINES * 64;
    for (int64_t at = 0; at < bytes; at += 64) {
        if (!deltas_only) __builtin_prefetch((const char *)(s->slab + slot) + at, 1);
        if (raw & REPLICA_BIT) __builtin_prefetch((const char *)(s->delta + slot) + at, 1);
    }
}

/* Floats of the values of keys[0..n) (checked) back to back. */
static inline int64_t store_floats_of(const store_t *s, const int64_t *keys, int64_t n) {
    if (s->uniform_len) return n * s->uniform_len;
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) total += s->lens[keys[i]];
    return total;
}

/* Index of the first key outside [0, num_keys), or -1 when all are valid. The functions below
 * expect checked keys (they prefetch directory entries of keys ahead of the one they work on). */
int64_t store_check_keys(const int64_t *keys, int64_t n, int64_t num_keys);

/* The positions of keys not held here now to missing[] (a snapshot; nothing read or written);
 * returns how many, or -1 if a key lies outside [0, num_keys). Any thread. */
int64_t store_missing(const store_t *s, const int64_t *keys, int64_t n, int64_t *missing);

/* Copies the values of locally held keys into out (request order, rows packed back to back).
 * Positions of keys not held here go to missing[]; their rows in out are left untouched.
 * Returns the number of missing positions, or -1 if out is too small (out_floats). */
int64_t store_gather(const store_t *s, const int64_t *keys, int64_t n, float *out,
                     int64_t out_floats, int64_t *missing);

/* Adds vals to locally held keys (replicas also record the update in delta). Same conventions.
 * mode 0: add; mode 1: set (owner copies only: a replica's set is sent to the owner). */
int64_t store_scatter(const store_t *s, const int64_t *keys, int64_t n, const float *vals,
                      int64_t vals_floats, int64_t *missing, int mode);

/* Makes keys (not held here) held: value from vals (or zeros when vals is NULL), at the given
 * slots, with the given state and versions (zeros when NULL); a replica is synced at now and its
 * delta starts at zero. Returns n, or -1 if out of memory or a slot is out of range (then
 * nothing changed: room in the held map is reserved first). */
int64_t store_insert(const store_t *s, const int64_t *keys, int64_t n, const int64_t *slots,
                     int8_t new_state, const float *vals, int64_t vals_floats,
                     const int64_t *versions, double now);

/* Replicas only: moves each key's delta out (zeroing it), atomically per key; nonzero[i] tells
 * whether key i had any update. Only the rows of keys with updates are written, packed back to
 * back in key order (what the sync round sends). Returns the number of floats written, or -1 if
 * out is too small (out_floats). Keys that are not replicas count as without updates. */
int64_t store_take_deltas(const store_t *s, const int64_t *keys, int64_t n, float *out,
                          int64_t out_floats, int8_t *nonzero);

/* Engine thread: whether key is a replica whose delta holds an update not taken yet (a nonzero
 * float). Only a replica with DIRTY_BIT (with residue != 0: or RESIDUE_BIT) is looked at; one
 * whose delta adds up to zeros loses both bits. A snapshot: a worker may add to the delta right
 * after. */
int store_has_delta(const store_t *s, int64_t key, int residue);

/* Engine thread: -1 if key is not a replica here; else store_has_delta's answer, with the
 * replica's version in *version: one look-up where store_state, store_has_delta and
 * store_version took three (a sync round asks this of every replica it holds), and the
 * stripe's lock only for a replica with DIRTY_BIT (only workers' pushes set it, under the lock;
 * every other change of a replica's entry is this thread's). residue: as store_has_delta's. */
int store_replica_peek(const store_t *s, int64_t key, int64_t *version, int residue);

/* KEY_NONE, KEY_OWNER or KEY_REPLICA of each key into out: any thread, a consistent snapshot
 * per key (Store.inspect's, without the rest). */
void store_states(const store_t *s, const int64_t *keys, int64_t n, int8_t *out);

/* Engine thread. Replicas with DIRTY_BIT or RESIDUE_BIT (store_has_delta): moves each key's
 * delta out to base + offsets[i] (zeroing it), atomically per key; a key that is not one writes
 * zeros there. narrow: as bfloat16 (delta_row_floats: half the bytes), what rounding leaves
 * staying in the delta row (RESIDUE_BIT) for the next delta, the drop or a refresh. Returns
 * 0, or -1 (nothing written) if a row would end past base_floats. */
int64_t store_take_deltas_to(const store_t *s, const int64_t *keys, int64_t n, float *base,
                             int64_t base_floats, const int64_t *offsets, int narrow);

/* Replicas only (others are skipped): value = vals + delta (updates made here since the delta
 * was last taken stay visible), version = versions[i], and, when now > 0, synced at now (as
 * store_set_synced: one look-up and lock for both). promote != 0 instead makes the key the
 * owner copy (its delta is folded in and cleared). Returns the number of keys changed. */
int64_t store_refresh(const store_t *s, const int64_t *keys, int64_t n, const float *vals,
                      int64_t vals_floats, const int64_t *versions, int promote, double now);

/* Removes keys: copies value (and, for replicas, delta into deltas_out when not NULL; an owner's
 * row there is zeros) out, then marks them not held. Writes each key's former slot into slots_out (-1 if it was not held) and, when
 * versions_out is not NULL, its version at removal (-1 if not held). Engine thread. */
int64_t store_remove(const store_t *s, const int64_t *keys, int64_t n, float *vals_out,
                     float *deltas_out, int64_t out_floats, int64_t *slots_out,
                     int64_t *versions_out);

#endif
