/* Intent counts: see intents.h. */
#include "intents.h"

int64_t intents_count(int32_t *counts, int64_t num_keys, const int64_t *keys, int64_t n,
                      int delta, uint8_t *mark, int64_t *dirty, int64_t ndirty) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i];
        if (key < 0 || key >= num_keys) return -1 - i;
        const int32_t before = counts[key];
        int crossed;
        if (delta > 0) {
            counts[key] = before + 1;
            crossed = before == 0;
        } else {
            if (before <= 0) return -1 - i;
            counts[key] = before - 1;
            crossed = before == 1;
        }
        if (crossed && !mark[key]) {
            mark[key] = 1;
            dirty[ndirty++] = key;
        }
    }
    return ndirty;
}

int64_t intents_changes(const int32_t *counts, const uint8_t *told, uint8_t *mark,
                        const int64_t *dirty, int64_t ndirty, int64_t *out_keys,
                        uint8_t *out_flags) {
    int64_t m = 0;
    for (int64_t i = 0; i < ndirty; i++) {
        const int64_t key = dirty[i];
        mark[key] = 0;
        const uint8_t want = counts[key] > 0;
        if (want != (told[key] != 0)) {
            out_keys[m] = key;
            out_flags[m++] = want;
        }
    }
    return m;
}
