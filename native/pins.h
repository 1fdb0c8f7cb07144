/* Keys a node's workers are using right now, which its engine must not move away yet: the
 * local sample a worker pulled and has not pushed yet (adapm/_sampler.py). A count per key (a
 * key may be in several workers' samples), in a hash map sized by the keys pinned, behind a
 * mutex: worker threads pin and release, the engine thread asks (dir_sync_plan defers an
 * intent report that would relocate a pinned key; adapm/_engine/state.py reports the end of a
 * pinned replica's intent a round later). */
#ifndef ADAPM_PINS_H
#define ADAPM_PINS_H

#include <pthread.h>
#include <stdint.h>

#include "keymap.h"

typedef struct {
    keymap_t map;      /* key -> how many times it is pinned (> 0) */
    keymap_t deferred; /* key -> when a report on it was first deferred (ms, a 30-bit clock) */
    pthread_mutex_t lock;
} pins_t;

/* Reports on a key are deferred for at most this long in a row: pins that outlive their use (a
 * worker that samples and then stops without a clock or a push) hold a key back for a second,
 * not for ever. A local sample's use (pull to push) lasts a batch: milliseconds. */
#define PINS_MAX_DEFER_MS 1000

/* 0, or -1 if out of memory. */
int pins_init(pins_t *p);
void pins_free(pins_t *p);

/* Releases one pin of each of release[0..nr) (keys not pinned are ignored), then pins each of
 * take[0..nt) once. Returns 0, or -1 if out of memory (the releases are done, no key taken). */
int pins_change(pins_t *p, const int64_t *release, int64_t nr, const int64_t *take, int64_t nt);

/* pins_change if the pins are free now, without waiting: 1 if it ran (its result in *rc), 0 if
 * another thread holds them (nothing changed). A caller that holds the GIL may change the pins
 * this way without letting it go: it never waits on the engine thread, which may hold the pins
 * while it waits for the GIL (dir_sync_pins). */
int pins_try_change(pins_t *p, const int64_t *release, int64_t nr, const int64_t *take,
                    int64_t nt, int *rc);

/* Between pins_lock and pins_unlock (engine thread): whether a report on key may be deferred
 * (again), or not (deferred for PINS_MAX_DEFER_MS already, or out of memory: then it is taken
 * as it is). */
int pins_defer(pins_t *p, int64_t key);

/* The pins' clock: milliseconds of the monotonic clock, modulo 2^30. */
int32_t pins_now_ms(void);

/* Between pins_lock and pins_unlock (any thread): whether a report on key is being deferred
 * now (deferred less than PINS_MAX_DEFER_MS ago, at `now`, pins_now_ms's, and not taken
 * since): a peer waits for key. */
static inline int pins_waited(const pins_t *p, int64_t key, int32_t now) {
    const int32_t first = km_get(&p->deferred, key);
    return first >= 0 && ((now - first) & ((1 << 30) - 1)) < PINS_MAX_DEFER_MS;
}

/* Between pins_lock and pins_unlock (engine thread): a report on key was taken; a later one
 * may be deferred again. */
static inline void pins_settled(pins_t *p, int64_t key) {
    if (p->deferred.live) km_del(&p->deferred, key);
}

/* Between pins_lock and pins_unlock: whether key is pinned. */
static inline int pins_has(const pins_t *p, int64_t key) { return km_get(&p->map, key) > 0; }
static inline void pins_lock(pins_t *p) { pthread_mutex_lock(&p->lock); }
static inline void pins_unlock(pins_t *p) { pthread_mutex_unlock(&p->lock); }

#endif
