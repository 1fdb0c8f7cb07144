/* Serving a SYNC at the owner: see directory.h (dir_sync_plan, dir_sync_serve). */
#include "directory.h"
#include "policy.h"

#include <string.h>

/* Config.replica_updates "average": a replica's delta is divided by the number of nodes that
 * use the key now (signalled intent for it, the S mask; every node under full replication,
 * which keeps no masks), at least 1. Those nodes each moved the row for a round as if alone,
 * from the same stale value; summed, plain SGD overshoots by that factor and diverges at 8
 * nodes (docs/benchmarks.md, the 16-core section): averaged, a round's moves are local SGD's
 * model average. The owner's own pushes are applied directly and count in full. Returns
 * whether the delta was divided: the holder's base + its delta is then not the owner's value,
 * so the answer refreshes the replica. */
static int average_delta(const directory_t *d, int64_t key, float *row, int64_t len) {
    int64_t users = 0;
    if (!d->masks) {
        users = d->world_size;
    } else {
        const uint64_t *m = rec_masks(d->recs, key);
        for (int64_t i = 0; m && i < d->words; i++) users += __builtin_popcountll(m[i]);
    }
    if (users <= 1) return 0;
    const float scale = 1.0f / (float)users;
    for (int64_t f = 0; f < len; f++) row[f] *= scale;
    return 1;
}

static inline int64_t entry_pos(const sync_request_t *r, int64_t e) {
    if (e < r->ni) return r->ipos[e];
    e -= r->ni;
    return e < r->nd ? r->dpos[e] : r->cpos[e - r->nd];
}

/* Whether the origin's report on an owned key would relocate it (the policy run on copies of
 * the key's masks: nothing changes). */
static int would_relocate(const directory_t *d, const sync_request_t *r, int64_t key,
                          uint8_t has_intent) {
    enum { MAX_WORDS = 64 };
    const int64_t w = d->words;
    if (w > MAX_WORDS) return 0; /* beyond 4096 ranks reports are not deferred */
    uint64_t m[2 * MAX_WORDS], want[MAX_WORDS];
    const uint64_t *masks = rec_masks(d->recs, key);
    if (masks) {
        memcpy(m, masks, (size_t)(2 * w) * sizeof(uint64_t));
    } else { /* this node's own bit, if any, is its told flag (dir_policy_decide) */
        memset(m, 0, (size_t)(2 * w) * sizeof(uint64_t));
        if (dir_own_told(d, key)) m[d->rank / 64] |= (uint64_t)1 << (d->rank % 64);
    }
    int64_t dropped = 0;
    return policy_decide_key(r->variant, d->rank, r->origin, w, m, m + w, has_intent, want,
                             &dropped) >= 0;
}

pins_t *dir_sync_pins(const directory_t *d, const sync_request_t *r) {
    return d->masks && r->ni && r->variant == POLICY_ADAPTIVE ? d->pins : NULL;
}

void dir_sync_plan(const directory_t *d, const sync_request_t *r, sync_plan_t *p) {
    const store_t *s = d->store;
    const int64_t n = r->ni + r->nd + r->nc;
    p->owned_intents = p->owned_syncs = p->owned_sync_floats = 0;
    p->redirects = p->backs = p->back_floats = p->rest = p->deferred = 0;
    pins_t *pins = dir_sync_pins(d, r); /* locked by the caller */
    for (int64_t e = 0; e < n; e++) {
        int section;
        if (e + STORE_AHEAD < n) store_prefetch(s, sync_entry_key(r, e + STORE_AHEAD, &section));
        const int64_t key = sync_entry_key(r, e, &section);
        p->hop[e] = -1;
        if (store_state(s, key) == KEY_OWNER) {
            if (section == 0 && pins) {
                if (pins_has(pins, key) && would_relocate(d, r, key, r->iflags[e])
                    && pins_defer(pins, key)) {
                    p->where[e] = SYNC_REDIRECT; /* deferred: see SYNC_* in directory.h */
                    p->hop[e] = d->rank;
                    p->redirects++;
                    p->deferred++;
                    continue;
                }
                pins_settled(pins, key);
            }
            p->where[e] = SYNC_OWNED;
            if (section == 0) p->owned_intents++;
            else {
                p->owned_syncs++;
                p->owned_sync_floats += key_len(s, key);
            }
            continue;
        }
        const int64_t nxt = dir_next_hop(d, key);
        if (section == 0 && nxt >= 0) { /* the origin reports it there with its next round */
            p->where[e] = SYNC_REDIRECT;
            p->hop[e] = nxt;
            p->redirects++;
        } else if (section != 0 && nxt == r->origin) { /* crossed the key's move to the origin */
            p->where[e] = SYNC_BACK;
            p->backs++;
            if (section == 1) p->back_floats += key_len(s, key);
        } else {
            p->where[e] = nxt >= 0 ? SYNC_FORWARD : SYNC_QUEUE;
            p->hop[e] = nxt;
            p->rest++;
        }
    }
}

/* Delta row src (as sent: narrow if ver says so) as len floats at dst. */
static void widen_row(float *dst, const float *src, int64_t len, int64_t ver) {
    if (!delta_narrow(ver)) {
        memcpy(dst, src, (size_t)len * sizeof(float));
        return;
    }
    const uint16_t *b = (const uint16_t *)src;
    for (int64_t j = 0; j < len; j++) dst[j] = float_of_bf16(b[j]);
}

int64_t dir_sync_serve(const directory_t *d, const sync_request_t *r, const sync_plan_t *p,
                       sync_answer_t *a) {
    const store_t *s = d->store;
    const int64_t n = r->ni + r->nd + r->nc;
    int64_t oi = 0, os = 0, rd = 0, bk = 0, rest = 0, back_floats = 0, delta_floats = 0;
    int64_t row = 0; /* float offset of delta e's row in drows */
    int64_t ndeltas = 0;
    /* When every delta is owned here, came in float32 and none is scaled (averaged), the
     * request's rows are merged as they came: no copy of them (a copy per SYNC otherwise). */
    int direct = !d->average;
    for (int64_t e = r->ni; direct && e < r->ni + r->nd; e++)
        direct = p->where[e] == SYNC_OWNED && !delta_narrow(r->dver[e - r->ni]);
    /* Owned deltas and checks are answered after the owned intents, in entry order. */
    int64_t *svers = a->versions + p->owned_intents;
    int64_t *spos = a->positions + p->owned_intents;
    for (int64_t e = 0; e < n; e++) {
        int section;
        const int64_t key = sync_entry_key(r, e, &section), pos = entry_pos(r, e);
        const int64_t len = section == 1 ? key_len(s, key) : 0;
        const int64_t dver = section == 1 ? r->dver[e - r->ni] : 0;
        switch (p->where[e]) {
        case SYNC_OWNED:
            if (section == 0) {
                a->positions[oi] = pos;
                a->versions[oi] = -1;
                a->ikeys[oi] = key;
                a->iflags[oi++] = r->iflags[e];
            } else {
                /* The version the holder's base is compared with: read before the merge. */
                a->skeys[os] = key;
                spos[os] = pos;
                svers[os] = store_version(s, key);
                a->behind[os] = 0;
                if (section == 1) {
                    if (!direct) widen_row(a->srows + delta_floats, r->drows + row, len, dver);
                    if (d->average)
                        a->behind[os] = (uint8_t)average_delta(d, key, a->srows + delta_floats,
                                                               len);
                    delta_floats += len;
                    ndeltas++;
                }
                os++;
            }
            break;
        case SYNC_REDIRECT:
            a->redirect_pos[rd] = pos;
            a->redirect_ranks[rd++] = p->hop[e];
            break;
        case SYNC_BACK:
            a->back_pos[bk++] = pos;
            if (section == 1) {
                widen_row(a->back_rows + back_floats, r->drows + row, len, dver);
                back_floats += len;
            }
            break;
        default:
            a->rest_index[rest] = e;
            a->rest_hop[rest++] = p->hop[e];
        }
        row += delta_row_floats(len, dver);
    }
    /* Entries whose base differs from the version read are behind, but for a dropped
     * replica's last delta (nothing there to refresh). Then the owned deltas are merged: the
     * first ndeltas entries of skeys (the deltas section comes first). */
    int64_t base_index = 0;
    uint8_t *behind = a->behind;
    for (int64_t e = r->ni; e < n; e++) {
        if (p->where[e] != SYNC_OWNED) continue;
        const int delta = e < r->ni + r->nd;
        const int64_t v = delta ? r->dver[e - r->ni] : r->cver[e - r->ni - r->nd];
        if (delta && delta_last(v))
            behind[base_index] = 0;
        else
            behind[base_index] = behind[base_index]
                                 || (delta ? delta_version(v) : v) != svers[base_index];
        base_index++;
    }
    if (ndeltas && store_scatter(s, a->skeys, ndeltas, direct ? r->drows : a->srows,
                                 delta_floats, a->missing, 0) != 0)
        return -1;
    for (int64_t j = 0; j < ndeltas; j++) /* the holder's base + its delta */
        svers[j] = (svers[j] + 1) & VERSION_MASK;
    /* Values for those behind: the version read again (after the merge), then the value. */
    int64_t nref = 0;
    for (int64_t j = 0; j < os; j++) {
        if (!behind[j]) continue;
        svers[j] = store_version(s, a->skeys[j]);
        a->refresh_pos[nref] = spos[j];
        a->skeys[nref++] = a->skeys[j]; /* compacted in place: j >= nref */
    }
    int64_t nvalues = 0;
    for (int64_t j = 0; j < nref; j++) nvalues += key_len(s, a->skeys[j]);
    if (nref && store_gather(s, a->skeys, nref, a->values, nvalues, a->missing) != 0)
        return -1;
    a->nrefresh = nref;
    a->nvalues = nvalues;
    return 0;
}
