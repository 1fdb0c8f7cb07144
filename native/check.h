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

/* Message kinds (adapm/_wire/protocol.py, Kind) whose arrays are checked here. */
enum {
    WIRE_PULL = 1, WIRE_PUSH = 2, WIRE_SET = 3, WIRE_SYNC = 4, WIRE_PULL_RESP = 10,
    WIRE_ACK = 11, WIRE_SYNC_RESP = 12, WIRE_FORWARDED = 14, WIRE_MOVES = 20
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
