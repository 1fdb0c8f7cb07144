/* The array checks of received messages (check.h; their Python spec: adapm/_engine/validate.py). */
#include "check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Kept in step with protocol.SCHEMA (tests/test_protocol.py compares them). */
#define MOVE_ROLES "krvmmv|krv|knv"
static const struct {
    int kind;
    const char *roles;
} SCHEMA[] = {
    {WIRE_PULL, "kp|"},
    {WIRE_PUSH, "kpr|"},
    {WIRE_SET, "kpr|"},
    {WIRE_SYNC, "kpf|kprv|kpv|" MOVE_ROLES},
    {WIRE_PULL_RESP, "pr|"},
    {WIRE_ACK, "p|"},
    {WIRE_SYNC_RESP, "pvprpnpr|" MOVE_ROLES},
    {WIRE_MOVES, MOVE_ROLES},
    {WIRE_FORWARDED, "nc|"},
};
#define MOVE_ARRAYS 12

const char *wire_roles(int kind) {
    for (size_t i = 0; i < sizeof SCHEMA / sizeof SCHEMA[0]; i++)
        if (SCHEMA[i].kind == kind) return SCHEMA[i].roles;
    return NULL;
}

int wire_count(int kind) {
    const char *r = wire_roles(kind);
    int n = 0;
    for (; r && *r; r++) n += *r != '|';
    return n;
}

int wire_itemsize(char role) {
    switch (role) {
    case 'r': return 4;
    case 'f': return 1;
    default: return 8;
    }
}

void check_scratch_free(check_scratch_t *s) {
    free(s->set);
    free(s->marks);
    memset(s, 0, sizeof *s);
}

/* Index of the first key that repeats an earlier one, -1 if none, -2 if out of memory.
 * Ascending batches (the usual order of moves) pass in one scan, others through the hash set. */
static int64_t first_repeat(check_scratch_t *s, const int64_t *keys, int64_t n) {
    if (keys_ascend(keys, n)) return -1;
    const int64_t cap = repeat_set_cap(n);
    if (cap > s->cap) {
        int64_t *grown = realloc(s->set, (size_t)cap * sizeof(int64_t));
        if (!grown) return -2;
        s->set = grown;
        s->cap = cap;
    }
    return repeat_scan(s->set, cap, keys, n);
}

static int unfit(char *why, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int unfit(char *why, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, CHECK_WHY, fmt, ap);
    va_end(ap);
    return 1;
}

/* "key K outside [0, num_keys)" naming the smallest key if it is negative, else the largest. */
static int keys_unfit(const directory_t *d, const char *prefix, const int64_t *keys, int64_t n,
                      char *why) {
    if (!n) return 0;
    int64_t lo = keys[0], hi = keys[0];
    for (int64_t i = 1; i < n; i++) {
        lo = keys[i] < lo ? keys[i] : lo;
        hi = keys[i] > hi ? keys[i] : hi;
    }
    const int64_t num_keys = d->store->num_keys;
    if (lo < 0 || hi >= num_keys)
        return unfit(why, "%skey %lld outside [0, %lld)", prefix, (long long)(lo < 0 ? lo : hi),
                     (long long)num_keys);
    if (d->channels > 1) /* each channel's peers send it only its keys */
        for (int64_t i = 0; i < n; i++)
            if (!dir_in_channel(d, keys[i]))
                return unfit(why, "%skey %lld is not of channel %lld of %lld", prefix,
                             (long long)keys[i], (long long)d->channel, (long long)d->channels);
    return 0;
}

static int rows_unfit(const directory_t *d, const char *prefix, const int64_t *keys, int64_t n,
                      int64_t floats, char *why) {
    const int64_t need = store_floats_of(d->store, keys, n);
    if (floats == need) return 0;
    return unfit(why, "%s%lld floats for %lld keys that hold %lld", prefix, (long long)floats,
                 (long long)n, (long long)need);
}

/* A SYNC's deltas: a row sent narrow (its version says so) takes half the floats. */
static int delta_rows_unfit(const directory_t *d, const int64_t *keys, const int64_t *versions,
                            int64_t n, int64_t floats, char *why) {
    int64_t need = 0;
    for (int64_t i = 0; i < n; i++)
        need += delta_row_floats(key_len(d->store, keys[i]), versions[i]);
    if (floats == need) return 0;
    return unfit(why, "%lld floats of deltas for %lld keys whose rows take %lld", (long long)floats,
                 (long long)n, (long long)need);
}

/* Relocations (a[0..6)), replica set-ups (a[6..9)), home updates (a[9..12)). */
static int moves_unfit(const directory_t *d, const carr_t *a, check_scratch_t *s, char *why) {
    static const char *names[2] = {"relocation", "replica"};
    const carr_t *sections[2] = {a, a + 6};
    char prefix[32];
    for (int i = 0; i < 2; i++) {
        const carr_t *m = sections[i];
        const int64_t *keys = m[0].p, n = m[0].n;
        snprintf(prefix, sizeof prefix, "%s: ", names[i]);
        if (keys_unfit(d, prefix, keys, n, why) || rows_unfit(d, prefix, keys, n, m[1].n, why))
            return 1;
        if (m[2].n != n)
            return unfit(why, "%s: %lld versions for %lld keys", names[i], (long long)m[2].n,
                         (long long)n);
        const int64_t rep = first_repeat(s, keys, n);
        if (rep == -2) return -1;
        if (rep >= 0) return unfit(why, "%s: a key named twice", names[i]);
    }
    const int64_t *keys = a[0].p, n = a[0].n;
    if (a[3].n != n * d->words || a[4].n != n * d->words || a[5].n != n)
        return unfit(why, "relocation: masks or epochs do not match its keys");
    if (n) {
        if (!d->masks) return unfit(why, "relocation: this node's management never relocates");
        for (int64_t i = 0; i < n; i++)
            if (store_state(d->store, keys[i]) == KEY_OWNER)
                return unfit(why, "relocation of a key this node owns already");
        if (stray_rank_bits(d, a[3].p, n) || stray_rank_bits(d, a[4].p, n))
            return unfit(why, "relocation: a mask names a rank outside the job");
    }
    const int64_t *hkeys = a[9].p, *ranks = a[10].p, *epochs = a[11].p, nh = a[9].n;
    if (keys_unfit(d, "home update: ", hkeys, nh, why)) return 1;
    if (a[10].n != nh || a[11].n != nh)
        return unfit(why, "home update: ranks or epochs do not match its keys");
    for (int64_t i = 0; i < nh; i++)
        if (hkeys[i] % d->world_size != d->rank || ranks[i] < 0 || ranks[i] >= d->world_size
            || epochs[i] < 0)
            return unfit(why, "home update for a key homed elsewhere, to a rank not in the job, "
                              "or with a negative epoch");
    return 0;
}

/* The keyed sections of a keyed request (1, or 3 for a SYNC): keys, then per-key arrays. */
static int keyed_unfit(const directory_t *d, int kind, const carr_t *a, check_scratch_t *s,
                       char *why) {
    const char *roles = wire_roles(kind);
    const int sections = kind == WIRE_SYNC ? 3 : 1;
    if (kind == WIRE_SYNC && a[0].n) {
        if (!d->masks)
            return unfit(why, "intent reports to a node whose management does not act on intent");
        const int64_t rep = first_repeat(s, a[0].p, a[0].n);
        if (rep == -2) return -1;
        if (rep >= 0) return unfit(why, "intent reports that name a key twice");
    }
    int at = 0;
    for (int section = 0; section < sections; section++, roles++) {
        const int64_t *keys = a[at].p, n = a[at].n;
        if (keys_unfit(d, "", keys, n, why)) return 1;
        for (at++, roles++; *roles != '|'; roles++, at++) {
            if (*roles == 'r' && kind == WIRE_SYNC) { /* the deltas: rows, then versions */
                if (a[at + 1].n != n)
                    return unfit(why, "%lld versions for %lld deltas", (long long)a[at + 1].n,
                                 (long long)n);
                if (delta_rows_unfit(d, keys, a[at + 1].p, n, a[at].n, why)) return 1;
            } else if (*roles == 'r') {
                if (rows_unfit(d, "", keys, n, a[at].n, why)) return 1;
            } else if (a[at].n != n) {
                return unfit(why, "%lld entries for %lld keys", (long long)a[at].n, (long long)n);
            }
        }
    }
    return 0;
}

int check_message(const directory_t *d, int kind, const carr_t *a, check_scratch_t *s,
                  char *why) {
    if (kind == WIRE_SYNC || kind == WIRE_SYNC_RESP || kind == WIRE_MOVES) {
        const int r = moves_unfit(d, a + wire_count(kind) - MOVE_ARRAYS, s, why);
        if (r) return r;
    }
    if (kind == WIRE_PULL || kind == WIRE_PUSH || kind == WIRE_SET || kind == WIRE_SYNC)
        return keyed_unfit(d, kind, a, s, why);
    return 0;
}

/* Whether positions p[0..n) are all in [0, limit). */
static int within(const int64_t *p, int64_t n, int64_t limit) {
    for (int64_t i = 0; i < n; i++)
        if (p[i] < 0 || p[i] >= limit) return 0;
    return 1;
}

int check_sync_answer(const directory_t *d, const int64_t *keys, int64_t n, int64_t num_intents,
                      int64_t num_deltas, int64_t remaining, int64_t req_id, const carr_t *a,
                      check_scratch_t *s, char *why) {
    /* positions, versions, refresh positions, values, redirected, ranks, returned, rows */
    const int64_t *pos = a[0].p, *refresh = a[2].p, *moved = a[4].p, *ranks = a[5].p,
                  *back = a[6].p;
    static const char *names[4] = {"answered", "refreshed", "redirected", "returned"};
    const int which[4] = {0, 2, 4, 6};
    for (int i = 0; i < 4; i++)
        if (!within(a[which[i]].p, a[which[i]].n, n))
            return unfit(why, "sync answer: %s position outside the round's %lld entries",
                         names[i], (long long)n);
    /* Each entry is answered once: served, redirected or returned. */
    if (n > s->marks_cap) {
        uint8_t *grown = realloc(s->marks, (size_t)n);
        if (!grown) return -1;
        s->marks = grown;
        s->marks_cap = n;
    }
    memset(s->marks, 0, (size_t)n);
    for (int64_t i = 0; i < a[0].n; i++) {
        if (s->marks[pos[i]]) return unfit(why, "sync answer: an entry answered twice");
        s->marks[pos[i]] = 1;
    }
    for (int64_t i = 0; i < a[4].n; i++) {
        if (s->marks[moved[i]]) return unfit(why, "sync answer: an entry answered twice");
        s->marks[moved[i]] = 2;
    }
    for (int64_t i = 0; i < a[6].n; i++) {
        if (s->marks[back[i]]) return unfit(why, "sync answer: an entry answered twice");
        s->marks[back[i]] = 2;
    }
    if (a[2].n) {
        /* Each refresh must be of an answered entry past the intent reports (a replica's). */
        for (int64_t i = 0; i < a[2].n; i++)
            if (refresh[i] < num_intents || s->marks[refresh[i]] != 1)
                return unfit(why, "sync answer: a refresh of an entry that is not an answered "
                                  "replica entry");
    }
    if (a[1].n != a[0].n || a[5].n != a[4].n)
        return unfit(why, "sync answer: versions or ranks do not match their positions");
    for (int64_t i = 0; i < a[5].n; i++)
        if (ranks[i] < 0 || ranks[i] >= d->world_size)
            return unfit(why, "sync answer: a redirect to a rank not in the job");
    for (int64_t i = 0; i < a[4].n; i++)
        if (moved[i] >= num_intents)
            return unfit(why, "sync answer: a redirect of an entry that is no intent report");
    for (int64_t i = 0; i < a[6].n; i++)
        if (back[i] < num_intents)
            return unfit(why, "sync answer: an intent report returned as a delta");
    if (a[0].n + a[4].n + a[6].n > remaining)
        return unfit(why, "more answers than request %lld waits for", (long long)req_id);
    /* Rows come back for refreshed entries and for returned deltas (not for returned checks). */
    const store_t *st = d->store;
    int64_t need = 0;
    for (int64_t i = 0; i < a[2].n; i++) need += key_len(st, keys[refresh[i]]);
    if (need != a[3].n)
        return unfit(why, "%lld floats for %lld keys that hold %lld", (long long)a[3].n,
                     (long long)a[2].n, (long long)need);
    int64_t deltas = 0;
    need = 0;
    for (int64_t i = 0; i < a[6].n; i++)
        if (back[i] < num_intents + num_deltas) {
            need += key_len(st, keys[back[i]]);
            deltas++;
        }
    if (need != a[7].n)
        return unfit(why, "%lld floats for %lld keys that hold %lld", (long long)a[7].n,
                     (long long)deltas, (long long)need);
    return 0;
}
