/* Keys in use by a node's workers: see pins.h. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime under -std=c11 */
#include "pins.h"

#include <time.h>

int pins_init(pins_t *p) {
    if (km_init(&p->map) < 0) return -1;
    if (km_init(&p->deferred) < 0) {
        km_free(&p->map);
        return -1;
    }
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        km_free(&p->map);
        km_free(&p->deferred);
        return -1;
    }
    return 0;
}

void pins_free(pins_t *p) {
    km_free(&p->map);
    km_free(&p->deferred);
    pthread_mutex_destroy(&p->lock);
}

/* Milliseconds of the monotonic clock, modulo 2^30 (a map value is a non-negative int32). */
int32_t pins_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int32_t)(((int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000) & ((1 << 30) - 1));
}

int pins_defer(pins_t *p, int64_t key) {
    const int32_t now = pins_now_ms(), first = km_get(&p->deferred, key); /* -1: not deferred yet */
    if (first >= 0) return ((now - first) & ((1 << 30) - 1)) < PINS_MAX_DEFER_MS;
    if (km_reserve(&p->deferred, 1) < 0) return 0;
    km_put(&p->deferred, key, now);
    return 1;
}

/* pins_change's work, the pins locked by the caller. */
static int change_locked(pins_t *p, const int64_t *release, int64_t nr, const int64_t *take,
                         int64_t nt) {
    /* One look-up per key (km_add): a worker's sample (KGE: 1,200 keys a batch, many of them
     * in the last sample too) cost a del and a put per key each way: the pins took 2.8% of a
     * KGE worker's samples on 2 nodes, 2.1% with this. Releases first: a key not pinned is
     * ignored, whatever take holds. */
    for (int64_t i = 0; i < nr; i++) km_add(&p->map, release[i], -1);
    if (km_reserve(&p->map, nt) < 0) return -1;
    for (int64_t i = 0; i < nt; i++) km_add(&p->map, take[i], 1);
    return 0;
}

int pins_change(pins_t *p, const int64_t *release, int64_t nr, const int64_t *take, int64_t nt) {
    pins_lock(p);
    const int rc = change_locked(p, release, nr, take, nt);
    pins_unlock(p);
    return rc;
}

int pins_try_change(pins_t *p, const int64_t *release, int64_t nr, const int64_t *take,
                    int64_t nt, int *rc) {
    if (pthread_mutex_trylock(&p->lock) != 0) return 0;
    *rc = change_locked(p, release, nr, take, nt);
    pins_unlock(p);
    return 1;
}
