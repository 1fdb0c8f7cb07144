/* The key map: see keymap.h. */
#include "keymap.h"

#include <stdlib.h>
#include <string.h>

enum { KM_MIN_CAPACITY = 64 };

static int km_alloc(keymap_t *m, int64_t capacity) {
    int64_t *keys = malloc((size_t)capacity * sizeof(int64_t));
    int32_t *vals = malloc((size_t)capacity * sizeof(int32_t));
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return -1;
    }
    memset(keys, 0xff, (size_t)capacity * sizeof(int64_t)); /* all KM_EMPTY (-1) */
    m->keys = keys;
    m->vals = vals;
    m->mask = capacity - 1;
    m->live = 0;
    return 0;
}

int km_init(keymap_t *m) { return km_alloc(m, KM_MIN_CAPACITY); }

void km_free(keymap_t *m) {
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
}

int km_reserve(keymap_t *m, int64_t more) {
    const int64_t capacity = m->mask + 1;
    if (4 * (m->live + more) <= 3 * capacity) return 0;
    int64_t grown = KM_MIN_CAPACITY;
    while (2 * (m->live + more) > grown) grown *= 2; /* at most half full after a rehash */
    keymap_t next;
    if (km_alloc(&next, grown) < 0) return -1;
    for (int64_t i = 0; i < capacity; i++)
        if (m->keys[i] >= 0) km_put(&next, m->keys[i], m->vals[i]);
    km_free(m);
    *m = next;
    return 0;
}

void km_put(keymap_t *m, int64_t key, int32_t val) {
    int64_t i = km_slot(m, key);
    while (m->keys[i] >= 0) i = (i + 1) & m->mask;
    m->keys[i] = key;
    m->vals[i] = val;
    m->live++;
}

int32_t km_del(keymap_t *m, int64_t key) {
    int64_t i = km_slot(m, key);
    for (;; i = (i + 1) & m->mask) {
        const int64_t k = m->keys[i];
        if (k == KM_EMPTY) return -1;
        if (k == key) break;
    }
    const int32_t val = m->vals[i];
    /* Backward-shift deletion (Knuth's Algorithm R): the entries after the hole that could
     * not sit in it move up, so no tombstone is left. Lookups stay as short as the live keys
     * make them, and a map whose keys come and go (intent counts, records of active keys: a
     * few hundred each per clock) never fills with tombstones, which forced a rehash, a fresh
     * table and its page faults every few thousand deletions. */
    for (int64_t j = (i + 1) & m->mask;; j = (j + 1) & m->mask) {
        const int64_t k = m->keys[j];
        if (k == KM_EMPTY) break;
        const int64_t home = km_slot(m, k);
        /* The entry at j stays where its home lies cyclically in (i, j]. */
        const int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        m->keys[i] = k;
        m->vals[i] = m->vals[j];
        i = j;
    }
    m->keys[i] = KM_EMPTY;
    m->live--;
    return val;
}

int64_t km_bytes(const keymap_t *m) {
    return (m->mask + 1) * (int64_t)(sizeof(int64_t) + sizeof(int32_t));
}
