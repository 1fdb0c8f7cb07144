/* Open addressing, shared by the key map (keymap.h) and the intent counts (intents.h): a table
 * of fixed-size slots whose first field is the key (int64; OA_EMPTY in a free slot), capacity a
 * power of two, linear probing from the key's Fibonacci hash, and deletion by backward shift.
 * Touches no Python object. */
#ifndef ADAPM_OPENADDR_H
#define ADAPM_OPENADDR_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { OA_EMPTY = -1 };

/* The key's first slot (Fibonacci hashing: consecutive keys spread over the table). */
static inline int64_t oa_home(int64_t key, int64_t mask) {
    return (int64_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}

/* A table of `capacity` slots of `size` bytes, every one free (malloc'd: free() it); NULL if
 * out of memory. */
static inline void *oa_new(size_t size, int64_t capacity) {
    unsigned char *slots = malloc((size_t)capacity * size);
    if (!slots) return NULL;
    const int64_t empty = OA_EMPTY;
    for (int64_t i = 0; i < capacity; i++) memcpy(slots + (size_t)i * size, &empty, sizeof empty);
    return slots;
}

/* The key in slot i of a table of `size`-byte slots. */
static inline int64_t oa_key(const unsigned char *slots, size_t size, int64_t i) {
    int64_t key;
    memcpy(&key, slots + (size_t)i * size, sizeof key);
    return key;
}

/* Empties slot i, which holds a key, by backward shift (Knuth's Algorithm R): the slots after
 * the hole whose key could not sit in it move up, so no tombstone is left. Lookups stay as
 * short as the live keys make them, and a table whose keys come and go (intent counts, records
 * of active keys, pins: a few hundred each per clock) never fills with tombstones, which forced
 * a rehash, a fresh table and its page faults every few thousand deletions. Moves other slots:
 * no slot index may be kept across it. */
static inline void oa_delete(unsigned char *slots, size_t size, int64_t mask, int64_t i) {
    for (int64_t j = (i + 1) & mask;; j = (j + 1) & mask) {
        const int64_t k = oa_key(slots, size, j);
        if (k == OA_EMPTY) break;
        const int64_t home = oa_home(k, mask);
        /* The slot at j stays where its key's home lies cyclically in (i, j]. */
        const int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        memcpy(slots + (size_t)i * size, slots + (size_t)j * size, size);
        i = j;
    }
    const int64_t empty = OA_EMPTY;
    memcpy(slots + (size_t)i * size, &empty, sizeof empty);
}

#endif
