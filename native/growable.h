/* Growable arrays of the native engine: room for one more item, by doubling. */
#ifndef ADAPM_GROWABLE_H
#define ADAPM_GROWABLE_H

#include <stdint.h>
#include <stdlib.h>

/* Makes room for item number len in *items (capacity *cap, items of itemsize bytes): doubles
 * the capacity when full (64 at first). Returns 0, or -1 if out of memory (nothing changed). */
static inline int grow_for_one(void **items, int64_t len, int64_t *cap, size_t itemsize) {
    if (len < *cap) return 0;
    const int64_t grown_cap = *cap ? 2 * *cap : 64;
    void *grown = realloc(*items, (size_t)grown_cap * itemsize);
    if (!grown) return -1;
    *items = grown;
    *cap = grown_cap;
    return 0;
}

/* Reallocates *items to hold cap items of itemsize bytes (at least one, so that a zero-size
 * field still gets a pointer). Returns 0, or -1 if out of memory (*items unchanged). */
static inline int grow_to(void **items, int64_t cap, size_t itemsize) {
    void *grown = realloc(*items, (size_t)(cap ? cap : 1) * itemsize);
    if (!grown) return -1;
    *items = grown;
    return 0;
}

/* A reusable buffer for scratch that outlives one call (its contents are not kept when it
 * grows). */
typedef struct {
    void *p;
    int64_t cap; /* bytes */
} scratch_buf_t;

/* Room for at least `bytes` in b (its old contents are lost if it grows): the buffer, or NULL
 * if out of memory (b unchanged). */
static inline void *scratch_room(scratch_buf_t *b, int64_t bytes) {
    if (b->p && bytes <= b->cap) return b->p;
    int64_t cap = b->cap ? b->cap : 256;
    while (cap < bytes) cap *= 2;
    void *p = malloc((size_t)cap);
    if (!p) return NULL;
    free(b->p);
    b->p = p;
    b->cap = cap;
    return p;
}

static inline void scratch_free(scratch_buf_t *b) {
    free(b->p);
    b->p = NULL;
    b->cap = 0;
}

#endif
