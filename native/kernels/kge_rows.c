/* See kge_rows.h. */
#include "kge_rows.h"

#include <string.h>

#include "kge.h"
#include "unique.h" /* native/unique.c, compiled into this module too: KGETrainer.plan's call */

int64_t kge_train_rows(const kge_run_t *r, const int64_t *points, int64_t n,
                       const int64_t *samples, double *losses, int64_t *keys, int *stop,
                       int64_t *num_left, int64_t *at) {
    const rows_t *rows = r->rows;
    const int64_t E = r->num_entities, K = r->negs_per_side, bs = r->batch_size;
    int64_t we, wr;
    kge_widths(r->model, r->dim, &we, &wr); /* the binding checked model and dim */
    const int64_t width = 2 * we, max_rows = KGE_RUN_ROWS_PER_TRIPLE(K) * bs;
    *stop = KGE_DONE;
    *num_left = 0;
    /* The whole run is checked before any batch: a bad id fails the call, not its middle. */
    for (int64_t i = 0; i < n; i++) {
        const int64_t h = points[3 * i], rel = points[3 * i + 1], t = points[3 * i + 2];
        if (h < 0 || h >= E || t < 0 || t >= E || rel < 0 || rel >= rows->num_keys - E) {
            *at = i;
            return KGE_RUN_BAD_POINT;
        }
    }
    for (int64_t j = 0; j < 2 * K * n; j++) {
        if (samples[j] < 0 || samples[j] >= E) {
            *at = j;
            return KGE_RUN_BAD_SAMPLE;
        }
    }
    /* The int scratch regions: a batch's keys to look up (flat, then its triples' rows in
     * place: flat is not read after unique_inverse), each key's index among the distinct ones,
     * the keys gathered ([distinct | sample]), the rows' offsets in values, the negatives' rows,
     * and the positions the rows report missing. */
    int64_t *flat = r->iscratch, *inverse = flat + max_rows, *batch_keys = inverse + max_rows,
            *offsets = batch_keys + max_rows, *negatives = offsets + max_rows,
            *missing = negatives + max_rows;
    for (int64_t i = 0; i < max_rows; i++) offsets[i] = i * width; /* as KGETrainer.row_offsets */
    int64_t b = 0;
    for (int64_t start = 0; start < n; b++, start += bs) {
        const int64_t m = n - start < bs ? n - start : bs, ns = 2 * K * m;
        const int64_t *p = points + 3 * start;
        /* KGETrainer.plan: [heads | relations + E | tails], their distinct keys in order of
         * first appearance, and each triple's (head, relation, tail) rows among them. */
        for (int64_t i = 0; i < m; i++) {
            flat[i] = p[3 * i];
            flat[m + i] = p[3 * i + 1] + E;
            flat[2 * m + i] = p[3 * i + 2];
        }
        const int64_t nu = unique_inverse(flat, 3 * m, batch_keys, inverse);
        if (nu < 0) {
            *at = b;
            return KGE_RUN_NO_MEMORY;
        }
        int64_t *triples = flat;
        for (int64_t i = 0; i < m; i++) {
            triples[3 * i] = inverse[i];
            triples[3 * i + 1] = inverse[m + i];
            triples[3 * i + 2] = inverse[2 * m + i];
        }
        /* KGETrainer.step: the sample's rows after the keys' (one gather of both: the same
         * values as its pull and pull_sample, one pass over the rows' locks); neg_tails the
         * first half of them, neg_heads the second. */
        memcpy(batch_keys + nu, samples + 2 * K * start, (size_t)ns * sizeof(int64_t));
        for (int64_t j = 0; j < ns; j++) negatives[j] = nu + j;
        const int64_t nk = nu + ns;
        const int64_t away = rows->gather(rows->ctx, batch_keys, nk, r->values, nk * width,
                                          missing);
        if (away < 0) {
            *at = b;
            return KGE_RUN_ROWS_FAILED;
        }
        if (away > 0) { /* nothing of this batch written: the caller trains it */
            *stop = KGE_STOP_PULL;
            return b;
        }
        const kge_batch_t batch = {
            .model = r->model, .dim = r->dim, .values = r->values, .num_values = nk * width,
            .offsets = offsets, .num_rows = nk, .triples = triples, .num_triples = m,
            .neg_heads = negatives + ns / 2, .neg_tails = negatives, .negs_per_side = K,
            .updates = r->updates, .lr = r->lr, .reg_entity = r->reg_entity,
            .reg_relation = r->reg_relation};
        double bce, reg;
        kge_fault_t fault;
        const int rc = kge_train_batch(&batch, &bce, &reg, &fault);
        if (rc != KGE_OK) { /* KGE_BAD_ROW is not reached: every row is the plan's */
            *at = b;
            return rc == KGE_NO_MEMORY ? KGE_RUN_NO_MEMORY : KGE_RUN_ROWS_FAILED;
        }
        losses[b] = bce + reg; /* as step's return: the two sums added in double */
        keys[b] = nk;
        const int64_t left = rows->scatter_add(rows->ctx, batch_keys, nk, r->updates,
                                               nk * width, missing);
        if (left < 0) { /* not reached: the gather checked the same keys */
            *at = b;
            return KGE_RUN_ROWS_FAILED;
        }
        if (left > 0) { /* keys that left meanwhile: their updates go back to the caller */
            rows_hand_back(batch_keys, r->updates, width, missing, left, r->left_keys,
                           r->left_rows);
            *stop = KGE_STOP_PUSH;
            *num_left = left;
            return b + 1;
        }
    }
    return b;
}
