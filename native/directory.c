/* Relocations over the store and the directory: see directory.h. */
#include "directory.h"

#include <string.h>

int64_t dir_relocate_out(const directory_t *d, const int64_t *keys, int64_t n, int64_t dst,
                         float *values, int64_t values_floats, int64_t *versions,
                         uint64_t *s_out, uint64_t *r_out, int64_t *epochs, int64_t *slots_out) {
    const store_t *s = d->store;
    int64_t need = 0;
    for (int64_t i = 0; i < n; i++) {
        if (s->state[keys[i]] != KEY_OWNER) return -1 - i;
        need += key_len(s, keys[i]);
    }
    if (need > values_floats) return -1 - n;
    store_remove(s, keys, n, values, NULL, values_floats, slots_out);
    const int64_t w = d->words;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i];
        versions[i] = s->version[key]; /* after removal: no write can follow */
        memcpy(s_out + i * w, d->intent + key * w, (size_t)w * sizeof(uint64_t));
        memcpy(r_out + i * w, d->replicas + key * w, (size_t)w * sizeof(uint64_t));
        memset(d->intent + key * w, 0, (size_t)w * sizeof(uint64_t));
        memset(d->replicas + key * w, 0, (size_t)w * sizeof(uint64_t));
        epochs[i] = d->epoch[key] + 1;
        d->forward[key] = (int32_t)dst;
        d->hint[key] = (int32_t)dst;
    }
    return n;
}

int64_t dir_relocate_in(const directory_t *d, const int64_t *keys, int64_t n,
                        const float *values, int64_t values_floats, const int64_t *versions,
                        const uint64_t *s_in, const uint64_t *r_in, const int64_t *epochs,
                        const int64_t *slots, int64_t nslots, int8_t *was_replica) {
    const store_t *s = d->store;
    int64_t need = 0, fresh = 0;
    for (int64_t i = 0; i < n; i++) {
        const int8_t state = s->state[keys[i]];
        if (state == KEY_OWNER) return -1 - i;
        const int64_t len = key_len(s, keys[i]);
        if (state != KEY_REPLICA) { /* inserted at the next slot: it must fit the slab */
            if (fresh >= nslots) return -1 - n;
            if (slots[fresh] < 0 || slots[fresh] + len > s->slab_floats) return -1 - n;
            fresh++;
        }
        need += len;
    }
    if (need > values_floats) return -1 - n;
    const int64_t w = d->words, own_word = d->rank / 64;
    const uint64_t own_bit = (uint64_t)1 << (d->rank % 64);
    int64_t off = 0, j = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i], len = key_len(s, key);
        was_replica[i] = s->state[key] == KEY_REPLICA;
        if (was_replica[i]) /* value = the owner's + our unsent updates */
            store_refresh(s, keys + i, 1, values + off, len, versions + i, 1);
        else
            store_insert(s, keys + i, 1, slots + j++, KEY_OWNER, values + off, len, versions + i);
        off += len;
        memcpy(d->intent + key * w, s_in + i * w, (size_t)w * sizeof(uint64_t));
        memcpy(d->replicas + key * w, r_in + i * w, (size_t)w * sizeof(uint64_t));
        d->replicas[key * w + own_word] &= ~own_bit; /* the owner holds no replica of its own */
        d->epoch[key] = epochs[i];
        d->hint[key] = (int32_t)d->rank;
        if (key % d->world_size == d->rank) {
            const int64_t h = key / d->world_size;
            if (epochs[i] > d->home_epoch[h]) {
                d->home_owner[h] = (int32_t)d->rank;
                d->home_epoch[h] = epochs[i];
            }
        }
    }
    return n;
}
