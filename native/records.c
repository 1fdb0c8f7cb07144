/* Records of active keys: see records.h. */
#include "records.h"

#include <stdlib.h>

#include "growable.h"

int rec_init(records_t *r, int64_t world_size, int64_t words) {
    memset(r, 0, sizeof(*r));
    r->world_size = world_size;
    r->words = words;
    /* Rounded up to 32 bytes: two records share a line without masks, one has its own with a
     * mask word each (48 -> 64 bytes), so that a record never straddles two lines there. */
    r->stride = ((int64_t)sizeof(rec_t) + 2 * words * (int64_t)sizeof(uint64_t) + 31) & ~31;
    return km_init(&r->map);
}

void rec_free(records_t *r) {
    km_free(&r->map);
    free(r->slab);
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
    /* C11's aligned_alloc: the size, cap (a power of two >= 64) times a multiple of 32 bytes,
     * is a multiple of the alignment. */
    void *slab = aligned_alloc(64, (size_t)(cap * r->stride));
    if (!slab) return -1;
    /* The free list grows first: if it fails, the slab is let go and nothing changed. */
    if (grow_to((void **)&r->free_list, cap, sizeof(int32_t)) < 0) {
        free(slab);
        return -1;
    }
    if (r->len) memcpy(slab, r->slab, (size_t)(r->len * r->stride));
    free(r->slab);
    r->slab = slab;
    r->cap = cap;
    return 0;
}

int32_t rec_get(records_t *r, int64_t key) {
    int32_t i = rec_find(r, key);
    if (i >= 0) return i;
    i = r->nfree ? r->free_list[--r->nfree] : (int32_t)r->len++;
    rec_t *e = rec_at(r, i);
    e->key = key;
    e->hint = (int32_t)(key % r->world_size);
    e->forward = -1;
    e->epoch = 0;
    e->home_epoch = 0;
    if (r->words) memset(rec_mask_words(r, i), 0, 2 * r->words * sizeof(uint64_t));
    km_put(&r->map, key, i);
    return i;
}

void rec_tidy(records_t *r, int32_t i) {
    const rec_t *e = rec_at(r, i);
    const int64_t key = e->key;
    if (e->hint != key % r->world_size || e->forward != -1 || e->epoch || e->home_epoch)
        return;
    const uint64_t *m = rec_mask_words(r, i);
    for (int64_t w = 0; w < 2 * r->words; w++)
        if (m[w]) return;
    km_del(&r->map, key);
    r->free_list[r->nfree++] = i; /* room: free_list has cap entries */
}

int64_t rec_bytes(const records_t *r) {
    return km_bytes(&r->map) + r->cap * (r->stride + (int64_t)sizeof(int32_t));
}

void rec_set_hint(records_t *r, int64_t key, int64_t rank) {
    int32_t i = rec_find(r, key);
    if (i < 0) {
        if (rank == key % r->world_size) return;
        i = rec_get(r, key);
    }
    rec_at(r, i)->hint = (int32_t)rank;
    rec_tidy(r, i);
}
