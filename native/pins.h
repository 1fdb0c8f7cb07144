/* Keys a node's workers are using right now, which its engine must not relocate away: the
 * local sample a worker pulled and has not pushed yet (adapm/sampling.py). A count per key (a
 * key may be in several workers' samples), in a hash map sized by the keys pinned, behind a
 * mutex: worker threads pin and release, the engine thread asks (dir_policy_decide). */
#ifndef ADAPM_PINS_H
#define ADAPM_PINS_H

#include <pthread.h>
#include <stdint.h>

#include "keymap.h"

typedef struct {
    keymap_t map; /* key -> how many times it is pinned (> 0) */
    pthread_mutex_t lock;
} pins_t;

/* 0, or -1 if out of memory. */
int pins_init(pins_t *p);
void pins_free(pins_t *p);

/* Releases one pin of each of release[0..nr) (keys not pinned are ignored), then pins each of
 * take[0..nt) once. Returns 0, or -1 if out of memory (the releases are done, no key taken). */
int pins_change(pins_t *p, const int64_t *release, int64_t nr, const int64_t *take, int64_t nt);

/* Between pins_lock and pins_unlock: whether key is pinned. */
static inline int pins_has(const pins_t *p, int64_t key) { return km_get(&p->map, key) > 0; }
static inline void pins_lock(pins_t *p) { pthread_mutex_lock(&p->lock); }
static inline void pins_unlock(pins_t *p) { pthread_mutex_unlock(&p->lock); }

#endif
