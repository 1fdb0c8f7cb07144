/* Moves held per peer (outbox.h). */
#include "outbox.h"

#include <stdlib.h>
#include <string.h>

int outbox_init(outbox_t *ob, int64_t world_size, int64_t words) {
    ob->world_size = world_size;
    ob->words = words;
    ob->peers = calloc((size_t)world_size, sizeof(outbox_peer_t));
    ob->need = calloc((size_t)world_size * OUTBOX_ARRAYS, sizeof(int64_t));
    return ob->peers && ob->need ? 0 : -1;
}

void outbox_free(outbox_t *ob) {
    if (ob->peers)
        for (int64_t r = 0; r < ob->world_size; r++)
            for (int i = 0; i < OUTBOX_ARRAYS; i++) free(ob->peers[r].a[i].p);
    free(ob->peers);
    free(ob->need);
    ob->peers = NULL;
    ob->need = NULL;
}

static int reserve(outbox_buf_t *b, int64_t more) {
    if (b->len + more <= b->cap) return 0;
    int64_t cap = b->cap ? 2 * b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    uint8_t *grown = realloc(b->p, (size_t)cap);
    if (!grown) return -1;
    b->p = grown;
    b->cap = cap;
    return 0;
}

int outbox_reserve_decision(outbox_t *ob, const directory_t *d, const int64_t *keys, int64_t n,
                            const int64_t *relocate_to, const uint64_t *setup) {
    const int64_t world = ob->world_size, w = ob->words;
    int64_t *need = ob->need;
    memset(need, 0, (size_t)world * OUTBOX_ARRAYS * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i], row = 4 * key_len(d->store, key), dst = relocate_to[i];
        if (dst >= 0 && dst < world) {
            int64_t *r = need + dst * OUTBOX_ARRAYS;
            r[0] += 8, r[1] += row, r[2] += 8, r[3] += 8 * w, r[4] += 8 * w, r[5] += 8;
            /* dir_decide_execute's rule: the old owner tells a key's home unless the home is
             * the new owner or this node. */
            const int64_t home = key % world;
            if (home != dst && home != d->rank) {
                int64_t *h = need + home * OUTBOX_ARRAYS;
                h[9] += 8, h[10] += 8, h[11] += 8;
            }
        }
        for (int64_t j = 0; j < w; j++)
            for (uint64_t bits = setup[i * w + j]; bits; bits &= bits - 1) {
                const int64_t to = j * 64 + __builtin_ctzll(bits);
                if (to >= world) continue;
                int64_t *s = need + to * OUTBOX_ARRAYS;
                s[6] += 8, s[7] += row, s[8] += 8;
            }
    }
    for (int64_t r = 0; r < world; r++)
        for (int i = 0; i < OUTBOX_ARRAYS; i++)
            if (need[r * OUTBOX_ARRAYS + i] && reserve(&ob->peers[r].a[i],
                                                       need[r * OUTBOX_ARRAYS + i]) < 0)
                return -1; /* buffers only grew: nothing held changed */
    return 0;
}

static void put(outbox_buf_t *b, const void *src, int64_t bytes) {
    if (!bytes) return;
    memcpy(b->p + b->len, src, (size_t)bytes);
    b->len += bytes;
}

void outbox_append_decision(outbox_t *ob, const directory_t *d, const decide_out_t *o,
                            const decide_sizes_t *sizes) {
    const int64_t world = ob->world_size, w = ob->words;
    int64_t r_at = 0, r_floats = 0, s_at = 0, s_floats = 0, h_at = 0;
    for (int64_t dst = 0; dst < world; dst++) {
        outbox_buf_t *a = ob->peers[dst].a;
        const int64_t m = sizes->relocations ? o->r_count[dst] : 0;
        if (m) {
            const int64_t f = store_floats_of(d->store, o->r_keys + r_at, m);
            put(&a[0], o->r_keys + r_at, 8 * m);
            put(&a[1], o->r_values + r_floats, 4 * f);
            put(&a[2], o->r_versions + r_at, 8 * m);
            put(&a[3], o->r_s + r_at * w, 8 * m * w);
            put(&a[4], o->r_r + r_at * w, 8 * m * w);
            put(&a[5], o->r_epochs + r_at, 8 * m);
            r_at += m;
            r_floats += f;
        }
        const int64_t sp = sizes->setups ? o->s_count[dst] : 0;
        if (sp) {
            const int64_t f = store_floats_of(d->store, o->s_keys + s_at, sp);
            put(&a[6], o->s_keys + s_at, 8 * sp);
            put(&a[7], o->s_values + s_floats, 4 * f);
            put(&a[8], o->s_versions + s_at, 8 * sp);
            s_at += sp;
            s_floats += f;
        }
        const int64_t h = sizes->home_updates ? o->h_count[dst] : 0;
        if (h) {
            put(&a[9], o->h_keys + h_at, 8 * h);
            put(&a[10], o->h_owners + h_at, 8 * h);
            put(&a[11], o->h_epochs + h_at, 8 * h);
            h_at += h;
        }
    }
}

void outbox_copy(const outbox_t *ob, int64_t dst, int i, void *out) {
    const outbox_buf_t *b = &ob->peers[dst].a[i];
    if (b->len) memcpy(out, b->p, (size_t)b->len);
}

/* Buffers above this many bytes are freed when emptied: one large decision does not keep its
 * room for good. */
#define KEEP_BYTES (4 << 20)

void outbox_clear(outbox_t *ob, int64_t dst) {
    for (int i = 0; i < OUTBOX_ARRAYS; i++) {
        outbox_buf_t *b = &ob->peers[dst].a[i];
        b->len = 0;
        if (b->cap > KEEP_BYTES) {
            free(b->p);
            b->p = NULL;
            b->cap = 0;
        }
    }
}

int64_t outbox_capacity(const outbox_t *ob) {
    int64_t bytes = 0;
    for (int64_t r = 0; r < ob->world_size; r++)
        for (int i = 0; i < OUTBOX_ARRAYS; i++) bytes += ob->peers[r].a[i].cap;
    return bytes;
}
