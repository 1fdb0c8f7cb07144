/* Is a received message fit to touch this node? The array checks of adapm/_engine/validate.py,
 * in one pass per message: keys in the key space, per-key arrays as long as their keys, rows as
 * long as their keys' values, moved keys distinct, relocations only of keys not owned here and
 * only to a directory that keeps masks, masks naming only ranks of the job, home updates only
 * for keys homed here, a sync round's answer only at positions of its request.
 *
 * They agree with the directory's own refusals (directory_module.c), so a message that passes is
 * never refused half-way through handling. Pure C over pointers and lengths (no Python): the
 * binding borrows the arrays, the engine's native message path calls them directly.
 *
 * Each check returns 0 (fine), 1 (unfit: `why` holds the reason, as validate.py words it), or -1
 * (out of memory). Not thread-safe per scratch: one scratch per engine thread. */
#ifndef ADAPM_CHECK_H
#define ADAPM_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "directory.h"

/* Whether keys[0..n) ascend strictly (then none repeats). */
static inline int keys_ascend(const int64_t *keys, int64_t n) {
    for (int64_t i = 1; i < n; i++)
        if (keys[i] <= keys[i - 1]) return 0;
    return 1;
}

/* The hash-set capacity repeat_scan needs for n keys (a power of two, at least 2n). */
static inline int64_t repeat_set_cap(int64_t n) {
    int64_t cap = 64;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

/* Index of the first of keys[0..n) (all >= 0) that repeats an earlier one, or -1, through set,
 * a scratch of cap = repeat_set_cap(n) entries (its contents are overwritten). */
static inline int64_t repeat_scan(int64_t *set, int64_t cap, const int64_t *keys, int64_t n) {
    for (int64_t i = 0; i < cap; i++) set[i] = -1; /* empty (keys are >= 0) */
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = keys[i];
        int64_t at = (int64_t)(((uint64_t)k * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
        while (set[at] >= 0 && set[at] != k) at = (at + 1) & (cap - 1);
        if (set[at] == k) return i;
        set[at] = k;
    }
    return -1;
}

/* Whether any of n masks (d->words words each) has a bit for a rank >= world_size. */
static inline int stray_rank_bits(const directory_t *d, const uint64_t *masks, int64_t n) {
    const int64_t used = d->world_size % 64;
    if (!used) return 0;
    const uint64_t stray = ~(((uint64_t)1 << used) - 1);
    for (int64_t i = 0; i < n; i++)
        if (masks[i * d->words + d->words - 1] & stray) return 1;
    return 0;
}

/* Message kinds (adapm/_wire/protocol.py, Kind) whose arrays are checked here. */
enum {
    WIRE_PULL = 1, WIRE_PUSH = 2, WIRE_SET = 3, WIRE_SYNC = 4, WIRE_PULL_RESP = 10,
    WIRE_ACK = 11, WIRE_SYNC_RESP = 12, WIRE_ERROR = 13, WIRE_FORWARDED = 14, WIRE_MOVES = 20
};

/* The arrays of a kind, flat over its sections, one letter per array: k keys, p positions,
 * v versions or epochs, n ranks, c counts (int64); r rows (float32); f flags (int8); m masks
 * (uint64). "|" ends a section. NULL: a kind without arrays. protocol.SCHEMA must agree (a test
 * compares them). */
const char *wire_roles(int kind);

/* Number of arrays of a kind (letters of wire_roles), 0 for a kind without arrays. */
int wire_count(int kind);

/* Item size in bytes of a role letter. */
int wire_itemsize(char role);

/* An array of a message: its data and its number of elements. */
typedef struct {
    const void *p;
    int64_t n;
} carr_t;

/* A hash set and marks sized by the largest batch seen; grows as needed. */
typedef struct {
    int64_t *set;
    int64_t cap;
    uint8_t *marks;
    int64_t marks_cap;
} check_scratch_t;

void check_scratch_free(check_scratch_t *s);

#define CHECK_WHY 192 /* room for a reason */

/* A keyed request's keyed sections and a carrier's moves: `a` holds wire_count(kind) arrays
 * (a kind that is neither keyed nor a carrier passes). */
int check_message(const directory_t *d, int kind, const carr_t *a, check_scratch_t *s,
                  char *why);

/* A SYNC_RESP's answer part (its first 8 arrays) against the request it answers: the round's
 * entries' keys[0..n), of which the first num_intents are intent reports and the next
 * num_deltas replica deltas; `remaining` entries unanswered; req_id names the request. */
int check_sync_answer(const directory_t *d, const int64_t *keys, int64_t n, int64_t num_intents,
                      int64_t num_deltas, int64_t remaining, int64_t req_id, const carr_t *a,
                      check_scratch_t *s, char *why);

#endif
