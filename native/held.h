/* The keys a node holds outside its home partition's fixed rows: a hash map from key to its
 * slot word, version and sync time, sized by those keys, that workers read without a lock.
 *
 * A node keeps dense state only for the keys homed on it (store.h); every key held here that is
 * homed elsewhere (relocated in, or a replica), and every replica of a home key, has an entry
 * here instead. Open addressing with linear probing and tombstones, at most 3/4 full.
 *
 * Concurrency. Only the engine thread (the store's one inserting and removing thread) adds,
 * removes and rehashes entries, each under the key's stripe lock (store.h), so a reader's
 * seqlock check covers the entry as well as the value. A probe for one key never misses it
 * because of another key's insertion or removal (a removal leaves a tombstone, never a gap).
 * A rehash takes every stripe lock while it copies and publishes the new table, so readers
 * retry into the new table; the old one is freed only after every reader that may still hold
 * it has left (a grace period: each batch call counts itself in while it runs). */
#ifndef ADAPM_HELD_H
#define ADAPM_HELD_H

#include <stddef.h>
#include <stdint.h>

enum { HELD_EMPTY = -1, HELD_TOMB = -2 };

typedef struct {
    int64_t key;      /* HELD_EMPTY, HELD_TOMB or a key; written last when an entry is made */
    int64_t raw;      /* the slot word: value offset, | REPLICA_BIT for a replica */
    int64_t version;  /* owner: bumped by every write; replica: the owner's at the last sync */
    double synced_at; /* replicas: CLOCK_MONOTONIC seconds of the last sync */
} held_entry_t;

typedef struct {
    held_entry_t *entries;
    int64_t mask; /* capacity - 1 */
} held_table_t;

typedef struct {
    held_table_t *table;  /* the current table; readers load it inside a section */
    int64_t live, filled; /* entries; entries + tombstones (engine thread only) */
    uint64_t gen;         /* grace periods (see held_enter) */
    int64_t readers[2];   /* batch calls inside a section, by the parity of gen they saw */
} held_map_t;

/* An empty map; 0, or -1 if out of memory. */
int held_init(held_map_t *m);
void held_free(held_map_t *m);

/* A batch call that reads the map from a thread other than the engine thread (or at any time
 * a rehash may run) brackets its reads: enter returns a token for exit. Two atomic adds per
 * call, none per key. */
static inline int held_enter(held_map_t *m) {
    for (;;) {
        const uint64_t g = __atomic_load_n(&m->gen, __ATOMIC_SEQ_CST);
        const int p = (int)(g & 1);
        __atomic_fetch_add(&m->readers[p], 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&m->gen, __ATOMIC_SEQ_CST) == g) return p;
        __atomic_fetch_sub(&m->readers[p], 1, __ATOMIC_SEQ_CST); /* a grace period began */
    }
}

static inline void held_exit(held_map_t *m, int token) {
    __atomic_fetch_sub(&m->readers[token], 1, __ATOMIC_RELEASE);
}

static inline int64_t held_slot(const held_table_t *t, int64_t key) {
    return (int64_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 20) & t->mask;
}

/* The current table (inside a section, or on the engine thread). */
static inline held_table_t *held_table(const held_map_t *m) {
    return __atomic_load_n(&m->table, __ATOMIC_ACQUIRE);
}

/* key's entry in t, or NULL. A reader must check its stripe afterwards (seqlock). */
static inline held_entry_t *held_find(const held_table_t *t, int64_t key) {
    for (int64_t i = held_slot(t, key);; i = (i + 1) & t->mask) {
        held_entry_t *e = &t->entries[i];
        const int64_t k = __atomic_load_n(&e->key, __ATOMIC_ACQUIRE);
        if (k == key) return e;
        if (k == HELD_EMPTY) return NULL;
    }
}

/* Engine thread. Room for `more` new entries without allocating: rehashes into a larger
 * table if needed, holding all nstripes stripe locks of seqs (SEQ_STRIDE words apart)
 * meanwhile, then waits out the
 * readers of the old table and frees it. 0, or -1 if out of memory (nothing changed). The
 * caller holds no stripe lock. */
int held_reserve(held_map_t *m, int64_t more, uint64_t *seqs, int64_t nstripes);

/* Engine thread, holding key's stripe lock, with room reserved: a new entry for key (which
 * has none). */
held_entry_t *held_put(held_map_t *m, int64_t key, int64_t raw, int64_t version,
                       double synced_at);

/* Engine thread, holding the entry's key's stripe lock: the entry is gone. */
void held_del(held_map_t *m, held_entry_t *e);

/* Bytes the map holds now. */
int64_t held_bytes(const held_map_t *m);

/* Up to max keys of the map into out (any order); returns how many there are. */
int64_t held_keys(const held_map_t *m, int64_t *out, int64_t max);

#endif
