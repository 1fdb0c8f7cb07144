/* clock_gettime under -std=c11 */
#define _POSIX_C_SOURCE 200809L

#include "store.h"

#include <string.h>
#include <time.h>

#include "seqlock.h"


int64_t store_check_keys(const int64_t *keys, int64_t n, int64_t num_keys) {
    /* A key k is valid iff k >= 0 and num_keys - 1 - k >= 0: OR both into acc and look at the
     * sign bit once per block. Branch-free, so the compiler vectorises the block loop (with a
     * per-key compare and early exit it ran at one key per cycle, a visible part of a pull of
     * 1k keys). Unsigned arithmetic: the difference may wrap, but then k's own sign bit is set. */
    enum { BLOCK = 256 };
    const uint64_t top = (uint64_t)num_keys - 1;
    int64_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        uint64_t acc = 0;
        for (int j = 0; j < BLOCK; j++) acc |= (uint64_t)keys[i + j] | (top - (uint64_t)keys[i + j]);
        if (acc >> 63) break;  /* the first bad key is in this block: find it below */
    }
    for (; i < n; i++) {
        /* One unsigned compare catches negatives too. */
        if ((uint64_t)keys[i] >= (uint64_t)num_keys) return i;
    }
    return -1;
}

/* Software prefetching. A batch of random keys costs two dependent cache misses per key (the
 * directory entry slot[key], then the value row it points to) plus the stripe word; done one key
 * after the other, each key waits for DRAM twice. So the loops below run a pipeline: while
 * working on key i they fetch the directory entries of key i + 2*PREFETCH_AHEAD and, reading
 * the (by then cached) slot of key i + PREFETCH_AHEAD, its value row. The early reads are hints
 * only: a stale slot just prefetches the wrong line; every value is still read or written under
 * the seqlock protocol below. Callers guarantee that every key is in [0, num_keys)
 * (store_module.c range-checks the batch first), so the hint reads stay inside the directory
 * arrays.
 * Tuned with bench/store.py (random batches of 1k..100k keys, dims 16 and 128): without it a
 * gather of 100k random keys ran 2x (dim 16) to 2.5x (dim 128) slower and a scatter 3x; distances
 * from 8 to 32 perform alike, 4 loses up to 40% at dim 16. */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 12
#endif
/* Value rows longer than this many cache lines are left to the hardware prefetcher after their
 * first lines (it follows a sequential row by itself). bench/store.py, dim 128 (8 lines a row),
 * random batches: 1 or 2 lines make gather and scatter 1.5-2x slower, 8 lines ~8% slower. */
#ifndef PREFETCH_ROW_LINES
#define PREFETCH_ROW_LINES 4
#endif

/* What a specialised batch loop knows at compile time, so that its per-key lookups fold to a
 * few instructions: the row length (> 0: every key's, home rows at h * row_len; 0: per-key
 * lengths, home rows from home_off) and whether the world size is a power of two (home index
 * by mask and shift). Generic helpers reloading these from the store made a pull of home keys
 * cost 114 instructions per key against 68 with the dense directory (callgrind). */
typedef struct {
    int64_t row_len;
    int pow2;
} shape_t;

static inline __attribute__((always_inline)) int64_t home_row_shaped(const store_t *s, int64_t h,
                                                                     shape_t sh) {
    return sh.row_len ? h * sh.row_len : s->home_off[h];
}

/* store_lookup, with key's home index h (home_at) already known. */
static inline __attribute__((always_inline)) int64_t lookup_shaped(const store_t *s,
                                                                   const held_table_t *t,
                                                                   int64_t key, int64_t h,
                                                                   shape_t sh,
                                                                   held_entry_t **entry) {
    if (h >= 0 && (__atomic_load_n(&s->home[h], __ATOMIC_RELAXED) & HOME_OWNED)) {
        *entry = 0;
        return home_row_shaped(s, h, sh);
    }
    held_entry_t *e = held_find(t ? t : held_table(store_held(s, key)), key);
    *entry = e;
    return e ? __atomic_load_n(&e->raw, __ATOMIC_RELAXED) : -1;
}

/* The batch loops compute each key's home index once, when they prefetch its directory entry,
 * and keep it in a ring until they work on the key (2 * PREFETCH_AHEAD keys later). */
#define HOME_RING 64
_Static_assert(HOME_RING > 2 * PREFETCH_AHEAD && (HOME_RING & (HOME_RING - 1)) == 0,
               "the ring must hold every key between its prefetch and its turn");

static inline __attribute__((always_inline)) int64_t prefetch_dir(const store_t *s,
                                                                  const held_table_t *t,
                                                                  int64_t key, shape_t sh,
                                                                  int for_write) {
    const int64_t h = home_at_pow2(s, key, sh.pow2);
    if (h >= 0) __builtin_prefetch(&s->home[h], for_write, 3);
    else {
        if (!t) t = held_table(store_held(s, key));
        __builtin_prefetch(&t->entries[held_slot(t, key)], for_write, 3);
    }
    __builtin_prefetch(store_stripe(s, key), for_write, 3);
    return h;
}

/* The first lines of a row, for writing (hints). */
static inline __attribute__((always_inline)) void prefetch_lines(const float *row,
                                                                 int64_t floats) {
    int64_t bytes = floats * (int64_t)sizeof(float);
    if (bytes > PREFETCH_ROW_LINES * 64) bytes = PREFETCH_ROW_LINES * 64;
    const char *p = (const char *)row, *end = p + bytes;
    for (p = (const char *)((uintptr_t)p & ~(uintptr_t)63); p < end; p += 64)
        __builtin_prefetch(p, 1, 3);
}

static inline __attribute__((always_inline)) void prefetch_row(const store_t *s,
                                                               const held_table_t *t,
                                                               int64_t key, int64_t h,
                                                               shape_t sh, int for_write) {
    held_entry_t *e;
    const int64_t raw = lookup_shaped(s, t, key, h, sh, &e);
    if (raw < 0) return;
    const int64_t slot = SLOT_OFFSET(raw);
    if (slot >= s->slab_floats) return; /* an entry reused meanwhile: a hint only */
    int64_t bytes = (sh.row_len ? sh.row_len : s->lens[key]) * (int64_t)sizeof(float);
    if (bytes > PREFETCH_ROW_LINES * 64) bytes = PREFETCH_ROW_LINES * 64;
    /* A row need not start on a line boundary: touch its first and every following line. */
    const char *p = (const char *)(s->slab + slot), *end = p + bytes;
    for (p = (const char *)((uintptr_t)p & ~(uintptr_t)63); p < end; p += 64) {
        if (for_write) __builtin_prefetch(p, 1, 3);
        else __builtin_prefetch(p, 0, 3);
    }
    /* A replica's update is added to its delta row too (scatter_one), another region. */
    if (for_write && (raw & REPLICA_BIT)) prefetch_lines(s->delta + slot, bytes / 4);
}

/* The engine's passes over replicas in an answer's or a round's order (store_refresh,
 * store_take_deltas_to), working on key i: the directory entry and stripe of the key
 * 2 * PREFETCH_AHEAD on, the rows of the one PREFETCH_AHEAD on (its delta row, and its slab row
 * if `slab`). Hints only: an entry changed meanwhile costs a useless prefetch. */
static inline void prefetch_replica(const store_t *s, const int64_t *keys, int64_t i,
                                    int64_t n, int slab) {
    const int64_t far = i + 2 * PREFETCH_AHEAD, near = i + PREFETCH_AHEAD;
    if (far < n) {
        store_prefetch(s, keys[far]);
        __builtin_prefetch(store_stripe(s, keys[far]), 1, 3);
    }
    if (near >= n) return;
    held_entry_t *e;
    const int64_t raw = store_lookup(s, keys[near], &e);
    if (raw < 0 || !(raw & REPLICA_BIT)) return;
    const int64_t slot = SLOT_OFFSET(raw), len = key_len(s, keys[near]);
    if (slot + len > s->slab_floats) return;
    if (slab) prefetch_lines(s->slab + slot, len);
    prefetch_lines(s->delta + slot, len);
}

/* Before a batch loop: the home indices of its first keys (prefetch_ahead does the rest). */
static inline void ring_start(const store_t *s, const int64_t *keys, int64_t n, int64_t *ring) {
    for (int64_t j = 0; j < n && j < 2 * PREFETCH_AHEAD; j++) ring[j] = home_at(s, keys[j]);
}

/* Working on key i: prefetches ahead and records their home indices in the ring. */
static inline __attribute__((always_inline)) void prefetch_ahead(const store_t *s,
                                                                 const held_table_t *t,
                                                                 const int64_t *keys, int64_t i,
                                                                 int64_t n, shape_t sh,
                                                                 int for_write, int64_t *ring) {
    const int64_t far = i + 2 * PREFETCH_AHEAD, near = i + PREFETCH_AHEAD;
    if (far < n) ring[far & (HOME_RING - 1)] = prefetch_dir(s, t, keys[far], sh, for_write);
    if (near < n) prefetch_row(s, t, keys[near], ring[near & (HOME_RING - 1)], sh, for_write);
}

/* Copies one key's value; the body of store_gather. len is a compile-time constant in the
 * specialised loops, so the copy becomes a few vector moves instead of a memcpy call.
 * Returns 0: not held here, 1: main copy, 2: replica (then *synced: its sync time). */
static inline __attribute__((always_inline)) int gather_one(const store_t *s, int64_t key,
                                                            int64_t h, int64_t len, shape_t sh,
                                                            float *dst, double *synced) {
    const uint64_t *seq = store_stripe(s, key);
    for (;;) {
        const uint64_t v = read_begin(seq);
        held_entry_t *e;
        /* The table is reloaded under the seqlock: a rehash publishes a new one. */
        const int64_t raw = lookup_shaped(s, held_table(store_held(s, key)), key, h, sh, &e);
        if (raw < 0) {
            if (read_changed(seq, v)) continue;
            return 0;
        }
        /* An entry removed and reused under us holds another key's row: in the slab, but
         * maybe of another length. The check below then fails and we retry. */
        const int64_t slot = SLOT_OFFSET(raw);
        if (slot + len > s->slab_floats) continue;
        memcpy(dst, s->slab + slot, (size_t)len * sizeof(float));
        const int replica = (raw & REPLICA_BIT) != 0;
        if (replica) *synced = e->synced_at;
        if (!read_changed(seq, v)) return replica ? 2 : 1;
    }
}

/* Staleness bookkeeping of replica reads: per batch, one clock read and three atomic adds. */
typedef struct { int64_t reads; double synced_sum; } replica_reads_t;

static inline void note_replica_read(replica_reads_t *r, double synced_at) {
    r->reads++;
    r->synced_sum += synced_at;
}

static void flush_replica_reads(const store_t *s, const replica_reads_t *r) {
    if (!r->reads || !s->access_stats) return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const double now_us = (double)now.tv_sec * 1e6 + (double)now.tv_nsec * 1e-3;
    __atomic_fetch_add(&s->access_stats[0], r->reads, __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->access_stats[1], (int64_t)(now_us * (double)r->reads), __ATOMIC_RELAXED);
    __atomic_fetch_add(&s->access_stats[2], (int64_t)(r->synced_sum * 1e6), __ATOMIC_RELAXED);
}

/* One loop of store_gather for rows of LEN floats (a constant in the common cases), specialised
 * on the world size's shape (POW2). */
#define GATHER_UNIFORM(LEN, POW2)                                                       \
    do {                                                                                \
        const shape_t sh = {(LEN), (POW2)};                                             \
        for (int64_t i = 0; i < n; i++) {                                               \
            prefetch_ahead(s, t, keys, i, n, sh, 0, ring);                              \
            double synced = 0.0;                                                        \
            const int got = gather_one(s, keys[i], ring[i & (HOME_RING - 1)], (LEN), sh, \
                                       out + i * (LEN), &synced);                       \
            if (!got) missing[nmiss++] = i;                                             \
            else if (got == 2) note_replica_read(&reads, synced);                       \
        }                                                                               \
    } while (0)

/* Runs LOOP(LEN, POW2) with common embedding sizes as constant row lengths (the copy becomes a
 * few vector moves) and the world's shape known; ulen and s are the caller's. */
#define DISPATCH_SHAPES(LOOP)                                     \
    do {                                                          \
        const int pow2_ = s->home_shift >= 0;                     \
        switch (ulen) {                                           \
        case 16: if (pow2_) LOOP(16, 1); else LOOP(16, 0); break;  \
        case 32: if (pow2_) LOOP(32, 1); else LOOP(32, 0); break;  \
        case 64: if (pow2_) LOOP(64, 1); else LOOP(64, 0); break;  \
        case 128: if (pow2_) LOOP(128, 1); else LOOP(128, 0); break; \
        default: if (pow2_) LOOP(ulen, 1); else LOOP(ulen, 0); break; \
        }                                                         \
    } while (0)

int64_t store_gather(const store_t *s, const int64_t *keys, int64_t n, float *out,
                     int64_t out_floats, int64_t *missing) {
    int64_t nmiss = 0;
    replica_reads_t reads = {0, 0.0};
    const int64_t ulen = s->uniform_len;
    if (ulen && n > out_floats / ulen) return -1;
    const uint64_t tokens = store_enter(s);
    /* for prefetching only; NULL: a table per key (channels) */
    const held_table_t *t = s->shards == 1 ? held_table(s->held) : NULL;
    int64_t ring[HOME_RING];
    ring_start(s, keys, n, ring);
    if (ulen) {
        DISPATCH_SHAPES(GATHER_UNIFORM);
    } else {
        const shape_t sh = {0, s->home_shift >= 0};
        int64_t off = 0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t key = keys[i];
            const int64_t len = s->lens[key];
            if (off + len > out_floats) {
                nmiss = -1;
                break;
            }
            prefetch_ahead(s, t, keys, i, n, sh, 0, ring);
            double synced = 0.0;
            const int got =
                gather_one(s, key, ring[i & (HOME_RING - 1)], len, sh, out + off, &synced);
            if (!got) missing[nmiss++] = i;
            else if (got == 2) note_replica_read(&reads, synced);
            off += len;
        }
    }
    store_exit(s, tokens);
    if (nmiss >= 0) flush_replica_reads(s, &reads);
    return nmiss;
}

int64_t store_missing(const store_t *s, const int64_t *keys, int64_t n, int64_t *missing) {
    if (store_check_keys(keys, n, s->num_keys) >= 0) return -1;
    int64_t nmiss = 0;
    const uint64_t tokens = store_enter(s);
    for (int64_t i = 0; i < n; i++)
        if (store_state(s, keys[i]) == KEY_NONE) missing[nmiss++] = i;
    store_exit(s, tokens);
    return nmiss;
}

/* An owner copy's write: a new version, so replicas learn they are behind. Under the lock. */
static inline void bump_version(const store_t *s, int64_t h, held_entry_t *e) {
    if (e) {
        __atomic_store_n(&e->version, (e->version + 1) & VERSION_MASK, __ATOMIC_RELEASE);
    } else {
        uint32_t *w = &s->home[h];
        __atomic_store_n(w, HOME_OWNED | (uint32_t)((*w + 1) & VERSION_MASK), __ATOMIC_RELEASE);
    }
}

/* Applies one key's update under its stripe's lock; the body of store_scatter. */
static inline __attribute__((always_inline)) int scatter_one(const store_t *s, int64_t key,
                                                             int64_t h, int64_t len, shape_t sh,
                                                             const float *src, int mode) {
    uint64_t *seq = store_stripe(s, key);
    int held = 1;
    write_lock(seq);
    held_entry_t *e;
    const int64_t raw = lookup_shaped(s, held_table(store_held(s, key)), key, h, sh, &e);
    const int replica = raw >= 0 && (raw & REPLICA_BIT);
    if (raw >= 0 && (!replica || mode == 0)) {
        const int64_t slot = SLOT_OFFSET(raw);
        float *dst = s->slab + slot;
        if (!replica) bump_version(s, h, e);
        if (mode == 0 && replica) { /* its row and its delta row in one pass over src */
            float *restrict row = dst, *restrict d = s->delta + slot;
            const float *restrict u = src;
            for (int64_t j = 0; j < len; j++) {
                row[j] += u[j];
                d[j] += u[j];
            }
            if (!(raw & DIRTY_BIT)) __atomic_store_n(&e->raw, raw | DIRTY_BIT, __ATOMIC_RELAXED);
        } else if (mode == 0) {
            for (int64_t j = 0; j < len; j++) dst[j] += src[j];
        } else {
            memcpy(dst, src, (size_t)len * sizeof(float));
        }
    } else {
        held = 0;
    }
    write_unlock(seq);
    return held;
}

/* One loop of store_scatter; see GATHER_UNIFORM. */
#define SCATTER_UNIFORM(LEN, POW2)                                                         \
    do {                                                                                   \
        const shape_t sh = {(LEN), (POW2)};                                                \
        for (int64_t i = 0; i < n; i++) {                                                  \
            prefetch_ahead(s, t, keys, i, n, sh, 1, ring);                                 \
            if (!scatter_one(s, keys[i], ring[i & (HOME_RING - 1)], (LEN), sh,             \
                             vals + i * (LEN), mode))                                      \
                missing[nmiss++] = i;                                                      \
        }                                                                                  \
    } while (0)

int64_t store_scatter(const store_t *s, const int64_t *keys, int64_t n, const float *vals,
                      int64_t vals_floats, int64_t *missing, int mode) {
    int64_t nmiss = 0;
    const int64_t ulen = s->uniform_len;
    if (ulen && n > vals_floats / ulen) return -1;
    const uint64_t tokens = store_enter(s);
    /* for prefetching only; NULL: a table per key (channels) */
    const held_table_t *t = s->shards == 1 ? held_table(s->held) : NULL;
    int64_t ring[HOME_RING];
    ring_start(s, keys, n, ring);
    if (ulen) {
        DISPATCH_SHAPES(SCATTER_UNIFORM);
    } else {
        const shape_t sh = {0, s->home_shift >= 0};
        int64_t off = 0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t key = keys[i];
            const int64_t len = s->lens[key];
            if (off + len > vals_floats) {
                nmiss = -1;
                break;
            }
            prefetch_ahead(s, t, keys, i, n, sh, 1, ring);
            if (!scatter_one(s, key, ring[i & (HOME_RING - 1)], len, sh, vals + off, mode))
                missing[nmiss++] = i;
            off += len;
        }
    }
    store_exit(s, tokens);
    return nmiss;
}

/* The sampler's pool follows keys[0..n), just inserted (add) or removed (sampling.h skips keys
 * outside its domain, and those it holds already or does not hold). */
static void pool_follow(const store_t *s, const int64_t *keys, int64_t n, int add) {
    if (!s->pool.pool || !n) return;
    /* Channels: the engine threads of several take turns (a short critical section a batch). */
    if (s->shards > 1) spin_lock(s->pool_lock);
    const int64_t count = *s->pool_count;
    __atomic_store_n(s->pool_count,
                     add ? pool_add(&s->pool, count, keys, n) : pool_remove(&s->pool, count, keys, n),
                     __ATOMIC_RELEASE);
    if (s->shards > 1) spin_unlock(s->pool_lock);
}

int store_reserve(const store_t *s, int64_t shard, int64_t n) {
    return held_reserve(&s->held[shard], n, s->seqs, (int64_t)s->stripe_mask + 1);
}

int64_t store_insert(const store_t *s, const int64_t *keys, int64_t n, const int64_t *slots,
                     int8_t new_state, const float *vals, int64_t vals_floats,
                     const int64_t *versions, double now) {
    /* Everything checked and reserved before the first change. */
    int64_t off = 0, entries[STORE_MAX_SHARDS] = {0};
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i], len = key_len(s, key);
        const int64_t slot = is_home(s, key) ? home_row(s, key) : slots[i];
        if (slot < 0 || slot + len > s->slab_floats) return -1;
        if (vals && off + len > vals_floats) return -1;
        entries[store_shard(s, key)] += !is_home(s, key) || new_state == KEY_REPLICA;
        off += len;
    }
    for (int64_t c = 0; c < s->shards; c++)
        if (entries[c] && store_reserve(s, c, entries[c]) < 0) return -1;
    off = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i], len = key_len(s, key);
        const int64_t home = is_home(s, key);
        const int64_t slot = home ? home_row(s, key) : slots[i];
        const int64_t version = (versions ? versions[i] : 0) & VERSION_MASK;
        uint64_t *seq = store_stripe(s, key);
        write_lock(seq);
        if (vals) memcpy(s->slab + slot, vals + off, (size_t)len * sizeof(float));
        else memset(s->slab + slot, 0, (size_t)len * sizeof(float));
        /* Only replicas use their delta row: an owner's stays untouched (not committed). */
        if (new_state == KEY_REPLICA) memset(s->delta + slot, 0, (size_t)len * sizeof(float));
        if (new_state == KEY_REPLICA)
            held_put(store_held(s, key), key, slot | REPLICA_BIT, version, now);
        else if (home)
            __atomic_store_n(&s->home[home_at(s, key)], HOME_OWNED | (uint32_t)version,
                             __ATOMIC_RELEASE);
        else
            held_put(store_held(s, key), key, slot, version, 0.0);
        write_unlock(seq);
        off += len;
    }
    pool_follow(s, keys, n, 1);
    return n;
}

/* Engine thread, under key's lock: key is no longer held here. */
static void forget(const store_t *s, int64_t key, held_entry_t *e) {
    if (e) held_del(store_held(s, key), e);
    else __atomic_store_n(&s->home[home_at(s, key)], 0u, __ATOMIC_RELEASE);
}

int64_t store_remove(const store_t *s, const int64_t *keys, int64_t n, float *vals_out,
                     float *deltas_out, int64_t out_floats, int64_t *slots_out,
                     int64_t *versions_out) {
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i];
        const int64_t len = key_len(s, key);
        if (off + len > out_floats) {
            pool_follow(s, keys, i, 0);
            return -1;
        }
        uint64_t *seq = store_stripe(s, key);
        write_lock(seq);
        held_entry_t *e;
        const int64_t raw = store_lookup(s, key, &e);
        const int64_t slot = raw < 0 ? -1 : SLOT_OFFSET(raw);
        slots_out[i] = slot;
        if (versions_out) versions_out[i] = raw < 0 ? -1 : store_version(s, key);
        if (slot >= 0) {
            if (vals_out) memcpy(vals_out + off, s->slab + slot, (size_t)len * sizeof(float));
            /* An owner's delta row is never written, a clean replica's is all zeros. */
            if (deltas_out && (raw & REPLICA_BIT) && (raw & DELTA_BITS))
                memcpy(deltas_out + off, s->delta + slot, (size_t)len * sizeof(float));
            else if (deltas_out)
                memset(deltas_out + off, 0, (size_t)len * sizeof(float));
            forget(s, key, e);
        }
        write_unlock(seq);
        off += len;
    }
    pool_follow(s, keys, n, 0);
    return n;
}

int64_t store_take_deltas(const store_t *s, const int64_t *keys, int64_t n, float *out,
                          int64_t out_floats, int8_t *nonzero) {
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i];
        const int64_t len = key_len(s, key);
        if (off + len > out_floats) return -1;
        uint64_t *seq = store_stripe(s, key);
        int any = 0;
        write_lock(seq);
        held_entry_t *e;
        const int64_t raw = store_lookup(s, key, &e);
        if (raw >= 0 && (raw & REPLICA_BIT) && (raw & DELTA_BITS)) { /* else: all zeros */
            float *d = s->delta + SLOT_OFFSET(raw);
            for (int64_t j = 0; j < len; j++) {
                out[off + j] = d[j];
                any |= d[j] != 0.0f;
            }
            if (any) memset(d, 0, (size_t)len * sizeof(float));
            __atomic_store_n(&e->raw, raw & ~DELTA_BITS, __ATOMIC_RELAXED);
        }
        write_unlock(seq);
        nonzero[i] = (int8_t)any;
        if (any) off += len; /* packed: rows of keys without updates are overwritten */
    }
    return off;
}

void store_states(const store_t *s, const int64_t *keys, int64_t n, int8_t *out) {
    const uint64_t tokens = store_enter(s);
    for (int64_t i = 0; i < n; i++) {
        const uint64_t *seq = store_stripe(s, keys[i]);
        int state;
        uint64_t v;
        do { /* an entry removed and reused under the read: read again */
            v = read_begin(seq);
            state = store_state(s, keys[i]);
        } while (read_changed(seq, v));
        out[i] = (int8_t)state;
    }
    store_exit(s, tokens);
}

int store_has_delta(const store_t *s, int64_t key, int residue) {
    uint64_t *seq = store_stripe(s, key);
    int any = 0;
    write_lock(seq);
    held_entry_t *e;
    const int64_t raw = store_lookup(s, key, &e);
    if (raw >= 0 && (raw & REPLICA_BIT) && (raw & (residue ? DELTA_BITS : DIRTY_BIT))) {
        const float *d = s->delta + SLOT_OFFSET(raw);
        for (int64_t j = 0, len = key_len(s, key); j < len && !any; j++) any = d[j] != 0.0f;
        if (!any) __atomic_store_n(&e->raw, raw & ~DELTA_BITS, __ATOMIC_RELAXED);
    }
    write_unlock(seq);
    return any;
}

int store_replica_peek(const store_t *s, int64_t key, int64_t *version, int residue) {
    held_entry_t *e;
    const int64_t raw = store_lookup(s, key, &e);
    if (raw < 0 || !(raw & REPLICA_BIT)) return -1;
    *version = __atomic_load_n(&e->version, __ATOMIC_ACQUIRE);
    return (raw & (residue ? DELTA_BITS : DIRTY_BIT)) ? store_has_delta(s, key, residue) : 0;
}

/* Row d out to out as bfloat16 (len values, padded with a zero to whole floats), what
 * rounding leaves staying in d; whether any is left. */
static int narrow_out(float *d, uint16_t *out, int64_t len) {
    int left = 0;
    for (int64_t j = 0; j < len; j++) {
        const uint16_t b = bf16_of(d[j]);
        out[j] = b;
        /* Exact: a float and its top bits share their exponent. An infinity or NaN went as it
         * was (its difference with itself would be a NaN). */
        const float r = d[j] - float_of_bf16(b);
        d[j] = r == r ? r : 0.0f;
        left |= d[j] != 0.0f;
    }
    if (len & 1) out[len] = 0;
    return left;
}

int64_t store_take_deltas_to(const store_t *s, const int64_t *keys, int64_t n, float *base,
                             int64_t base_floats, const int64_t *offsets, int narrow) {
    for (int64_t i = 0; i < n; i++)
        if (offsets[i] < 0
            || offsets[i] + delta_row_floats(key_len(s, keys[i]), narrow ? DELTA_NARROW : 0)
                   > base_floats)
            return -1;
    for (int64_t i = 0; i < n; i++) {
        prefetch_replica(s, keys, i, n, 0);
        const int64_t key = keys[i], len = key_len(s, key);
        float *out = base + offsets[i];
        uint64_t *seq = store_stripe(s, key);
        write_lock(seq);
        held_entry_t *e;
        const int64_t raw = store_lookup(s, key, &e);
        if (raw >= 0 && (raw & REPLICA_BIT) && (raw & DELTA_BITS)) {
            float *d = s->delta + SLOT_OFFSET(raw);
            int64_t bits = raw & ~DELTA_BITS;
            if (narrow) {
                if (narrow_out(d, (uint16_t *)out, len)) bits |= RESIDUE_BIT;
            } else {
                memcpy(out, d, (size_t)len * sizeof(float));
                memset(d, 0, (size_t)len * sizeof(float));
            }
            __atomic_store_n(&e->raw, bits, __ATOMIC_RELAXED);
        } else {
            memset(out, 0, (size_t)delta_row_floats(len, narrow ? DELTA_NARROW : 0)
                               * sizeof(float));
        }
        write_unlock(seq);
    }
    return 0;
}

int64_t store_refresh(const store_t *s, const int64_t *keys, int64_t n, const float *vals,
                      int64_t vals_floats, const int64_t *versions, int promote, double now) {
    int64_t off = 0, changed = 0;
    for (int64_t i = 0; i < n; i++) {
        prefetch_replica(s, keys, i, n, 1);
        const int64_t key = keys[i];
        const int64_t len = key_len(s, key);
        if (off + len > vals_floats) return -1;
        uint64_t *seq = store_stripe(s, key);
        write_lock(seq);
        held_entry_t *e;
        const int64_t raw = store_lookup(s, key, &e);
        if (raw >= 0 && (raw & REPLICA_BIT)) {
            const int64_t slot = SLOT_OFFSET(raw);
            float *dst = s->slab + slot, *d = s->delta + slot;
            if (raw & DELTA_BITS)
                for (int64_t j = 0; j < len; j++) dst[j] = vals[off + j] + d[j];
            else
                memcpy(dst, vals + off, (size_t)len * sizeof(float));
            /* Promotion folds our own unsent updates in: a new version. */
            const int64_t version = (versions[i] + (promote ? 1 : 0)) & VERSION_MASK;
            if (!promote) {
                __atomic_store_n(&e->version, version, __ATOMIC_RELEASE);
                if (now > 0) e->synced_at = now;
            } else {
                if (raw & DELTA_BITS) memset(d, 0, (size_t)len * sizeof(float));
                if (is_home(s, key)) { /* back to the fixed row's word (the row is the same) */
                    held_del(store_held(s, key), e);
                    __atomic_store_n(&s->home[home_at(s, key)],
                                     HOME_OWNED | (uint32_t)version, __ATOMIC_RELEASE);
                } else {
                    __atomic_store_n(&e->version, version, __ATOMIC_RELEASE);
                    __atomic_store_n(&e->raw, slot, __ATOMIC_RELEASE);
                }
            }
            changed++;
        }
        write_unlock(seq);
        off += len;
    }
    return changed;
}

void store_set_synced(const store_t *s, const int64_t *keys, int64_t n, const int64_t *versions,
                      double now) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t *seq = store_stripe(s, keys[i]);
        write_lock(seq);
        held_entry_t *e;
        const int64_t raw = store_lookup(s, keys[i], &e);
        if (raw >= 0 && (raw & REPLICA_BIT)) {
            __atomic_store_n(&e->version, versions[i] & VERSION_MASK, __ATOMIC_RELEASE);
            e->synced_at = now;
        }
        write_unlock(seq);
    }
}
