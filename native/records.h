/* The directory's per-key state beyond the store, kept only for *active* keys: a record per key
 * whose state differs from the default of a key nobody touched, found through a key map
 * (keymap.h). Fields and their defaults:
 *
 * - hint: the rank this node believes owns the key (default: its home, key % world_size);
 * - forward: where this node last sent the key (default -1: never had it);
 * - epoch: the key's ownership epoch while owned here (default 0);
 * - home_epoch: for keys homed here, the epoch of the owner the home table names (default 0);
 * - masks (variants that act on intent): the owner's intent mask S and replica mask R,
 *   `words` uint64 each (default: empty).
 *
 * A dense array per field cost 36 B per key and node at 2 nodes, whatever the keys used (a key
 * nobody touched has every default), so a node's directory grew with the key space; records
 * cost about 90 B per active key (a 64-byte record with one mask word each, its map entry and
 * free-list slot) and nothing for the others (rec_bytes). A record goes when its
 * fields are back at their defaults (rec_tidy).
 *
 * Single-threaded (the engine thread). Passes that may create records reserve room first
 * (rec_reserve), so that creating one never fails halfway through a pass. */
#ifndef ADAPM_RECORDS_H
#define ADAPM_RECORDS_H

#include <stdint.h>
#include <string.h>

#include "keymap.h"

/* One record: its fields together, so that a record costs one or two cache lines to read or
 * make, not one per field (a per-field array each took a miss of its own: the owner's decisions
 * on a node's own reports, ~40 per clock on bench/adaptive.py, read and wrote six of them). The
 * masks follow in the same slot: rec_mask_words. */
typedef struct {
    int64_t key;
    int64_t epoch, home_epoch;
    int32_t hint, forward;
} rec_t;

typedef struct {
    keymap_t map;           /* key -> record index */
    int64_t world_size;
    int64_t words;          /* uint64 words per mask; 0: no masks kept */
    int64_t len, cap;       /* records handed out (used or free) / allocated */
    int64_t stride;         /* bytes per record: rec_t, then 2 * words mask words, padded */
    unsigned char *slab;    /* cap records, stride bytes each, 64-byte aligned */
    int32_t *free_list;     /* indices of free records */
    int64_t nfree;
} records_t;

/* Record i (an index the map or rec_get gave). */
static inline rec_t *rec_at(const records_t *r, int32_t i) {
    return (rec_t *)(r->slab + (int64_t)i * r->stride);
}

/* Record i's masks: S (words), then R (words). */
static inline uint64_t *rec_mask_words(const records_t *r, int32_t i) {
    return (uint64_t *)(r->slab + (int64_t)i * r->stride + sizeof(rec_t));
}

int rec_init(records_t *r, int64_t world_size, int64_t words);
void rec_free(records_t *r);

/* Room for `more` new records without allocating. 0, or -1 if out of memory (unchanged). */
int rec_reserve(records_t *r, int64_t more);

/* The key's record, or -1. */
static inline int32_t rec_find(const records_t *r, int64_t key) { return km_get(&r->map, key); }

/* The key's record, created with the defaults if it has none (needs room: rec_reserve). */
int32_t rec_get(records_t *r, int64_t key);

/* Drops the record if every field is at its default. */
void rec_tidy(records_t *r, int32_t i);

/* Records in use, and the bytes records and map hold. */
static inline int64_t rec_count(const records_t *r) { return r->map.live; }
int64_t rec_bytes(const records_t *r);

/* Field reads, the default for a key without a record. */
static inline int64_t rec_hint(const records_t *r, int64_t key) {
    const int32_t i = rec_find(r, key);
    return i < 0 ? key % r->world_size : rec_at(r, i)->hint;
}

static inline int64_t rec_forward(const records_t *r, int64_t key) {
    const int32_t i = rec_find(r, key);
    return i < 0 ? -1 : rec_at(r, i)->forward;
}

static inline int64_t rec_epoch(const records_t *r, int64_t key) {
    const int32_t i = rec_find(r, key);
    return i < 0 ? 0 : rec_at(r, i)->epoch;
}

static inline int64_t rec_home_epoch(const records_t *r, int64_t key) {
    const int32_t i = rec_find(r, key);
    return i < 0 ? 0 : rec_at(r, i)->home_epoch;
}

/* The key's S and R masks (words each, R after S), or NULL when it has no record. */
static inline const uint64_t *rec_masks(const records_t *r, int64_t key) {
    const int32_t i = rec_find(r, key);
    return i < 0 ? NULL : rec_mask_words(r, i);
}

/* Sets the hint (needs room unless the hint is the home). */
void rec_set_hint(records_t *r, int64_t key, int64_t rank);

#endif
