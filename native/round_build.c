/* A sync round's requests: see directory.h (dir_round_sizes, dir_round_build). */
#include "directory.h"

#include <string.h>

void dir_round_sizes(const directory_t *d, const round_in_t *in, round_sizes_t *z) {
    const store_t *s = d->store;
    z->drops = z->drop_floats = z->held_floats = 0;
    for (int64_t i = 0; i < in->nr; i++) {
        if (i + STORE_AHEAD < in->nr && !in->rflags[i + STORE_AHEAD])
            store_prefetch(s, in->rkeys[i + STORE_AHEAD]);
        const int64_t key = in->rkeys[i];
        if (!in->rflags[i] && store_state(s, key) == KEY_REPLICA) {
            z->drops++;
            z->drop_floats += key_len(s, key);
        }
    }
    for (int64_t i = 0; i < d->held->len; i++) z->held_floats += key_len(s, d->held->keys[i]);
}

/* Counting sort of one section by rank: for each of its n entries (keys[i], first entry
 * number base + i), writes key and position at the rank's run; returns 0, or -1 for a bad
 * hint. `cursor` holds each rank's next slot. */
static int64_t place_keys(const directory_t *d, const int64_t *keys, int64_t n, int64_t base,
                          int64_t *count, int64_t *cursor, int64_t *out_keys, int64_t *out_pos,
                          int64_t *at) {
    const int64_t world = d->world_size;
    const records_t *recs = d->recs;
    memset(count, 0, (size_t)world * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) { /* at[i]: the hint, until it is where entry i went */
        /* The record's map slot two stages ahead, the record one (see dir_policy_decide). */
        if (i + 2 * KM_AHEAD < n) km_prefetch(&recs->map, keys[i + 2 * KM_AHEAD]);
        if (i + KM_AHEAD < n) {
            const int32_t ahead = rec_find(recs, keys[i + KM_AHEAD]);
            if (ahead >= 0) __builtin_prefetch(rec_at(recs, ahead));
        }
        const int64_t dst = rec_hint(recs, keys[i]);
        if (dst < 0 || dst >= world) return -1;
        count[dst]++;
        at[i] = dst;
    }
    int64_t run = 0;
    for (int64_t r = 0; r < world; r++) {
        cursor[r] = run;
        run += count[r];
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t j = cursor[at[i]]++;
        out_keys[j] = keys[i];
        out_pos[j] = base + i;
        at[i] = j; /* where entry i went */
    }
    return 0;
}

int64_t dir_round_build(const directory_t *d, const round_in_t *in, const round_sizes_t *z,
                        round_out_t *o) {
    const store_t *s = d->store;
    const int64_t world = d->world_size, nr = in->nr;
    int64_t *keys = o->keys, *ver = o->s_ver; /* per entry of deltas and checks, entry order */
    /* Drops: the version first (only this thread changes a replica's version), then the key
     * leaves with its last delta. */
    int64_t ndrop = 0;
    for (int64_t i = 0; i < nr; i++) {
        const int64_t key = in->rkeys[i];
        if (!in->rflags[i] && store_state(s, key) == KEY_REPLICA) {
            o->drop_keys[ndrop] = key;
            ver[ndrop++] = store_version(s, key);
        }
    }
    float *rows = o->s_rows; /* the drops' last deltas, packed in entry order */
    const int failed = ndrop && store_remove(s, o->drop_keys, ndrop, NULL, rows, z->drop_floats,
                                             o->drop_slots, NULL) < 0;
    if (!failed) slots_give(d->alloc, s, o->drop_keys, o->drop_slots, ndrop);
    /* What leaves has left: a worker's pin may go ahead while the deltas are copied. */
    if (in->release) pins_unlock(in->release);
    if (failed) return -1;
    /* Replicas still held: those with updates not taken yet send their delta, the others their
     * version alone; the delta row of a replica without DIRTY_BIT (store.h) is not read. A
     * worker may add to one found without updates here meanwhile: that update goes with the
     * next round. */
    int64_t nl = 0;
    int64_t *live_ver = o->s_off; /* each live replica's version; s_off is free until below */
    const int64_t *held = d->held->keys, nheld = d->held->len;
    for (int64_t i = 0; i < nheld; i++) {
        /* Each replica's entry some keys ahead; a dirty one's delta row and stripe half as
         * far (store_has_delta scans and clears it). */
        if (i + STORE_AHEAD < nheld) store_prefetch(s, held[i + STORE_AHEAD]);
        if (i + STORE_AHEAD / 2 < nheld) store_prefetch_rows(s, held[i + STORE_AHEAD / 2], 1);
        const int dirty = store_replica_peek(s, held[i], &live_ver[nl], in->exact);
        if (dirty < 0) continue;
        o->s_live[nl] = held[i];
        o->s_nonzero[nl++] = (int8_t)dirty;
    }
    /* Entries: intents (the reports), deltas (drops, then dirty replicas), checks. */
    memcpy(keys, in->rkeys, (size_t)nr * sizeof(int64_t));
    memcpy(keys + nr, o->drop_keys, (size_t)ndrop * sizeof(int64_t));
    int64_t ndel = ndrop;
    for (int64_t i = 0; i < nl; i++)
        if (o->s_nonzero[i]) {
            keys[nr + ndel] = o->s_live[i];
            ver[ndel++] = live_ver[i];
        }
    int64_t nc = 0;
    for (int64_t i = 0; i < nl; i++)
        if (!o->s_nonzero[i]) {
            keys[nr + ndel + nc] = o->s_live[i];
            ver[ndel + nc++] = live_ver[i];
        }
    o->nd = ndel;
    o->nc = nc;
    /* Each section grouped by hint; at[i]: where entry i of the section went. */
    int64_t *at = o->s_at, *cursor = o->s_cursor;
    if (place_keys(d, keys, nr, 0, o->counts, cursor, o->ikeys, o->ipos, at) < 0) return -1;
    for (int64_t i = 0; i < nr; i++) o->iflags[at[i]] = in->rflags[i];
    if (place_keys(d, keys + nr, ndel, nr, o->counts + world, cursor, o->dkeys, o->dpos, at) < 0)
        return -1;
    /* The versions first: a live replica's delta sent narrow says so in its version, a dropped
     * one's last delta that no value is to come back (DELTA_LAST). */
    const int64_t narrow = in->exact ? 0 : DELTA_NARROW;
    for (int64_t i = 0; i < ndel; i++)
        o->dver[at[i]] = ver[i] | (i >= ndrop ? narrow : DELTA_LAST);
    int64_t *off = o->s_off, run = 0; /* float offset of each grouped delta's row */
    for (int64_t j = 0; j < ndel; j++) {
        off[j] = run;
        run += delta_row_floats(key_len(s, o->dkeys[j]), o->dver[j]);
    }
    o->delta_floats = run;
    for (int64_t i = 0, pre = 0; i < ndrop; i++) { /* the drops' last deltas, taken above */
        const int64_t len = key_len(s, keys[nr + i]);
        memcpy(o->drows + off[at[i]], rows + pre, (size_t)len * sizeof(float));
        pre += len;
    }
    /* The dirty replicas' deltas go straight to their place (s_live is free again). */
    int64_t *dest = o->s_live;
    for (int64_t i = ndrop; i < ndel; i++) dest[i - ndrop] = off[at[i]];
    if (store_take_deltas_to(s, keys + nr + ndrop, ndel - ndrop, o->drows,
                             z->drop_floats + z->held_floats, dest, !in->exact) < 0)
        return -1;
    if (place_keys(d, keys + nr + ndel, nc, nr + ndel, o->counts + 2 * world, cursor, o->ckeys,
                   o->cpos, at) < 0)
        return -1;
    for (int64_t i = 0; i < nc; i++) o->cver[at[i]] = ver[ndel + i];
    rs_remove(d->held, o->drop_keys, ndrop);
    return 0;
}
