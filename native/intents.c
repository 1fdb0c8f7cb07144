/* Intent counts: see intents.h. */
#include "intents.h"

int64_t intents_count(int32_t *counts, int64_t num_keys, const int64_t *keys, int64_t n,
                      int delta, int64_t *crossed) {
    int64_t ncrossed = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t key = keys[i];
        if (key < 0 || key >= num_keys) return -1 - i;
        const int32_t before = counts[key];
        if (delta > 0) {
            counts[key] = before + 1;
            if (before == 0) crossed[ncrossed++] = key;
        } else {
            if (before <= 0) return -1 - i;
            counts[key] = before - 1;
            if (before == 1) crossed[ncrossed++] = key;
        }
    }
    return ncrossed;
}
