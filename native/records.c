/* Records of active keys: see records.h. */
#include "records.h"

#include <stdlib.h>

#include "growable.h"

int rec_init(records_t *r, int64_t world_size, int64_t words) {
    memset(r, 0, sizeof(*r));
    r->world_size = world_size;
    r->words = words;
    return km_init(&r->map);
}

void rec_free(records_t *r) {
    km_free(&r->map);
    free(r->key);
    free(r->hint);
    free(r->forward);
    free(r->epoch);
    free(r->home_epoch);
    free(r->masks);
    free(r->free_list);
    memset(r, 0, sizeof(*r));
}


int rec_reserve(records_t *r, int64_t more) {
    if (km_reserve(&r->map, more) < 0) return -1;
    const int64_t fresh = more - r->nfree; /* records past the free ones */
    if (fresh <= 0 || r->len + fresh <= r->cap) return 0;
    int64_t cap = r->cap ? r->cap : 64;
    while (cap < r->len + fresh) cap *= 2;
    if (cap > INT32_MAX) return -1;
    /* Each array grows on its own; one that fails leaves the others larger, which is harmless:
     * cap changes only when all have grown. */
    if (grow_to((void **)&r->key, cap, sizeof(int64_t)) < 0
        || grow_to((void **)&r->hint, cap, sizeof(int32_t)) < 0
        || grow_to((void **)&r->forward, cap, sizeof(int32_t)) < 0
        || grow_to((void **)&r->epoch, cap, sizeof(int64_t)) < 0
        || grow_to((void **)&r->home_epoch, cap, sizeof(int64_t)) < 0
        || grow_to((void **)&r->masks, cap * 2 * r->words, sizeof(uint64_t)) < 0
        || grow_to((void **)&r->free_list, cap, sizeof(int32_t)) < 0)
        return -1;
    r->cap = cap;
    return 0;
}

int32_t rec_get(records_t *r, int64_t key) {
    int32_t i = rec_find(r, key);
    if (i >= 0) return i;
    i = r->nfree ? r->free_list[--r->nfree] : (int32_t)r->len++;
    r->key[i] = key;
    r->hint[i] = (int32_t)(key % r->world_size);
    r->forward[i] = -1;
    r->epoch[i] = 0;
    r->home_epoch[i] = 0;
    if (r->words) memset(r->masks + (int64_t)i * 2 * r->words, 0, 2 * r->words * sizeof(uint64_t));
    km_put(&r->map, key, i);
    return i;
}

void rec_tidy(records_t *r, int32_t i) {
    const int64_t key = r->key[i];
    if (r->hint[i] != key % r->world_size || r->forward[i] != -1 || r->epoch[i]
        || r->home_epoch[i])
        return;
    const uint64_t *m = r->masks + (int64_t)i * 2 * r->words;
    for (int64_t w = 0; w < 2 * r->words; w++)
        if (m[w]) return;
    km_del(&r->map, key);
    r->free_list[r->nfree++] = i; /* room: free_list has cap entries */
}

int64_t rec_bytes(const records_t *r) {
    const int64_t per = 2 * sizeof(int64_t) + 2 * sizeof(int32_t) + sizeof(int64_t)
                        + 2 * r->words * sizeof(uint64_t) + sizeof(int32_t);
    return km_bytes(&r->map) + r->cap * per;
}

void rec_set_hint(records_t *r, int64_t key, int64_t rank) {
    int32_t i = rec_find(r, key);
    if (i < 0) {
        if (rank == key % r->world_size) return;
        i = rec_get(r, key);
    }
    r->hint[i] = (int32_t)rank;
    rec_tidy(r, i);
}
