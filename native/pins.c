/* Keys in use by a node's workers: see pins.h. */
#include "pins.h"

int pins_init(pins_t *p) {
    if (km_init(&p->map) < 0) return -1;
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        km_free(&p->map);
        return -1;
    }
    return 0;
}

void pins_free(pins_t *p) {
    km_free(&p->map);
    pthread_mutex_destroy(&p->lock);
}

int pins_change(pins_t *p, const int64_t *release, int64_t nr, const int64_t *take, int64_t nt) {
    int rc = 0;
    pins_lock(p);
    for (int64_t i = 0; i < nr; i++) {
        const int32_t count = km_del(&p->map, release[i]);
        if (count > 1) km_put(&p->map, release[i], count - 1); /* its slot is free again */
    }
    if (km_reserve(&p->map, nt) < 0) {
        rc = -1;
    } else {
        for (int64_t i = 0; i < nt; i++) {
            const int32_t count = km_del(&p->map, take[i]);
            km_put(&p->map, take[i], count > 0 ? count + 1 : 1);
        }
    }
    pins_unlock(p);
    return rc;
}
