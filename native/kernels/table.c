/* Plain shared array table ops (see table.h). */
#include "table.h"

#include <string.h>

#include "common.h"

int table_check_keys(const table_t *t, const int64_t *keys, int64_t n, int64_t packed_floats,
                     int64_t *bad_pos) {
    int64_t sum = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = keys[i];
        *bad_pos = i;
        if (k < 0 || k >= t->num_keys) return TABLE_KEY_RANGE;
        const int64_t len = t->key_len[k];
        if (!range_inside(t->key_offset[k], len, t->data_floats)) return TABLE_ROW_OUTSIDE;
        /* len <= data_floats, so sum stays below packed_floats + data_floats: no overflow */
        sum += len;
        if (sum > packed_floats) return TABLE_PACKED_SIZE;
    }
    *bad_pos = -1;
    return sum == packed_floats ? TABLE_OK : TABLE_PACKED_SIZE;
}

int table_gather(const table_t *t, const int64_t *keys, int64_t n, float *out, int64_t out_floats,
                 int64_t *bad_pos) {
    const int err = table_check_keys(t, keys, n, out_floats, bad_pos);
    if (err != TABLE_OK) return err;
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = keys[i], len = t->key_len[k];
        memcpy(out, t->data + t->key_offset[k], (size_t)len * sizeof(float));
        out += len;
    }
    return TABLE_OK;
}

int table_scatter_add(const table_t *t, const int64_t *keys, int64_t n, const float *upd,
                      int64_t upd_floats, int64_t *bad_pos) {
    const int err = table_check_keys(t, keys, n, upd_floats, bad_pos);
    if (err != TABLE_OK) return err;
    for (int64_t i = 0; i < n; i++) {
        const int64_t k = keys[i], len = t->key_len[k];
        float *restrict row = t->data + t->key_offset[k];
        const float *restrict src = upd;
        for (int64_t j = 0; j < len; j++) row[j] += src[j];
        upd += len;
    }
    return TABLE_OK;
}
