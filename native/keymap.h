/* A hash map from key (int64, >= 0) to a small int (int32): open addressing (openaddr.h), linear probing
 * and backward-shift deletion (no tombstones), capacity a power of two, at most 3/4 full. It holds the
 * directory's records of *active* keys (directory.h), so that a node's memory follows the keys
 * it works with, not the key space. Single-threaded: the engine thread only. Touches no Python
 * object. */
#ifndef ADAPM_KEYMAP_H
#define ADAPM_KEYMAP_H

#include <stddef.h>
#include <stdint.h>

#include "openaddr.h"

enum { KM_EMPTY = OA_EMPTY };

/* A key and its value in one 16-byte slot: a lookup loads one cache line, not one in an array
 * of keys and another in an array of values (4 more bytes per slot than two arrays; the
 * directory's records and the pins look a key up in every round and every pin). */
typedef struct {
    int64_t key; /* KM_EMPTY or a key */
    int32_t val;
    int32_t spare;
} km_slot_t;

_Static_assert(offsetof(km_slot_t, key) == 0, "openaddr.h: the key comes first in a slot");

typedef struct {
    km_slot_t *slots;
    int64_t mask;   /* capacity - 1 */
    int64_t live;   /* keys in the map */
} keymap_t;

/* An empty map; returns 0, or -1 if out of memory. */
int km_init(keymap_t *m);
void km_free(keymap_t *m);

/* The key's first slot (openaddr.h). */
static inline int64_t km_slot(const keymap_t *m, int64_t key) { return oa_home(key, m->mask); }

/* The value of key, or -1 if it is not in the map. */
static inline int32_t km_get(const keymap_t *m, int64_t key) {
    for (int64_t i = km_slot(m, key);; i = (i + 1) & m->mask) {
        const int64_t k = m->slots[i].key;
        if (k == key) return m->slots[i].val;
        if (k == KM_EMPTY) return -1;
    }
}

/* Asks the CPU to load key's first slot (a hint: changes nothing). Batch loops call it a few
 * keys ahead, so that the cache misses of a batch's lookups overlap instead of following one
 * another (a map of active keys is larger than the caches on big jobs). */
static inline void km_prefetch(const keymap_t *m, int64_t key) {
    __builtin_prefetch(&m->slots[km_slot(m, key)]);
}

/* How many keys ahead the batch loops prefetch. */
enum { KM_AHEAD = 8 };

/* Room for `more` insertions without allocating (rehashes into a larger table if needed, which
 * also drops the tombstones). Returns 0, or -1 if out of memory (the map is unchanged). */
int km_reserve(keymap_t *m, int64_t more);

/* Inserts key (not in the map) with val. Needs room (km_reserve). */
void km_put(keymap_t *m, int64_t key, int32_t val);

/* Adds delta to key's value in one look-up: a key not in the map is inserted with delta when
 * delta > 0 (needs room: km_reserve) and stays out otherwise; a key whose value falls to 0 or
 * below is removed (moving other keys' slots, as km_del). Returns the new value, 0 for a key
 * not in the map now. For counts (the pins): a del and a put per change cost two look-ups and
 * a backward shift, even where the count stays above zero. */
int32_t km_add(keymap_t *m, int64_t key, int32_t delta);

/* Removes key; returns its value, or -1 if it was not in the map. Moves other keys' slots
 * (never their values): no slot index may be kept across it. */
int32_t km_del(keymap_t *m, int64_t key);

/* Bytes the map holds. */
int64_t km_bytes(const keymap_t *m);

#endif
