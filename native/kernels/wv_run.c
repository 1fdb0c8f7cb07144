/* See wv_run.h. */
#include "wv_run.h"

#include <string.h>

#include "wv.h"

int64_t wv_plan_run(const int32_t *tokens, int64_t num_tokens, const int64_t *starts,
                    const int64_t *lengths, int64_t nb, int64_t *batches, const double *keep,
                    int64_t vocab, int64_t window, int32_t *row_of, int64_t *rows3, int64_t cap,
                    int64_t *ends, int64_t *keys) {
    int64_t s0 = 0, p0 = 0, k0 = 0;
    for (int64_t b = 0; b < nb; b++) {
        int64_t *row = batches + b * WV_B_COLS, nk = 0;
        const int64_t ns = row[WV_B_SENTENCES];
        const int64_t n = wv_plan(tokens, num_tokens, starts + s0, lengths + s0, ns, keep, vocab,
                                  window, (uint64_t)row[WV_B_PLAN_SEED], row_of, rows3 + p0,
                                  rows3 + cap + p0, rows3 + 2 * cap + p0, ends + s0, keys + k0,
                                  &nk);
        if (n < 0) return -1 - (s0 + (-1 - n));
        row[WV_B_POSITIONS] = n;
        row[WV_B_KEYS] = nk;
        s0 += ns;
        p0 += n;
        k0 += nk;
    }
    return p0;
}

/* The whole run's checks (wv_train_run's first pass): every plan row, window and sentence end
 * inside its batch, every key inside the rows' keys and distinct within its batch (marked in
 * row_of, which is left all -1), every sample inside the rows' keys. */
typedef struct {
    int64_t sentences, positions, keys, samples;
} offsets_t;

/* Where batch `first`'s parts start in the run's arrays. */
static offsets_t offsets_of(const wv_run_t *r, const int64_t *batches, int64_t first) {
    offsets_t o = {0, 0, 0, 0};
    for (int64_t b = 0; b < first; b++) {
        const int64_t *row = batches + b * WV_B_COLS;
        o.sentences += row[WV_B_SENTENCES];
        o.positions += row[WV_B_POSITIONS];
        o.keys += row[WV_B_KEYS];
        o.samples += WV_POOL(r->negatives, row[WV_B_POSITIONS]);
    }
    return o;
}

static int64_t check_run(const wv_run_t *r, int64_t first, int64_t last,
                         const int64_t *batches, const int64_t *rows3, int64_t cap,
                         const int64_t *ends, const int64_t *keys, const int64_t *samples,
                         int64_t *at) {
    const int64_t num_keys = r->num_keys;
    const offsets_t o = offsets_of(r, batches, first);
    int64_t s0 = o.sentences, p0 = o.positions, k0 = o.keys, d0 = o.samples;
    for (int64_t b = first; b < last; b++) {
        const int64_t *row = batches + b * WV_B_COLS;
        const int64_t ns = row[WV_B_SENTENCES], np = row[WV_B_POSITIONS], nk = row[WV_B_KEYS];
        for (int64_t i = p0; i < p0 + np; i++) {
            if (rows3[i] < 0 || rows3[i] >= nk || rows3[cap + i] < 0 || rows3[cap + i] >= nk ||
                rows3[2 * cap + i] < 1) {
                *at = b;
                return WV_RUN_BAD_PLAN;
            }
        }
        int64_t last = 0;
        for (int64_t s = s0; s < s0 + ns; s++) {
            if (ends[s] < last || ends[s] > np) {
                *at = b;
                return WV_RUN_BAD_PLAN;
            }
            last = ends[s];
        }
        if (last != np) {
            *at = b;
            return WV_RUN_BAD_PLAN;
        }
        for (int64_t i = k0; i < k0 + nk; i++) {
            const int64_t key = keys[i];
            if (key < 0 || key >= num_keys || r->row_of[key] >= 0) {
                for (int64_t j = k0; j < i; j++) r->row_of[keys[j]] = -1;
                *at = i;
                return WV_RUN_BAD_KEY;
            }
            r->row_of[key] = 0;
        }
        for (int64_t i = k0; i < k0 + nk; i++) r->row_of[keys[i]] = -1;
        const int64_t nd = WV_POOL(r->negatives, np);
        for (int64_t j = d0; j < d0 + nd; j++) {
            if (samples[j] < 0 || samples[j] >= num_keys) {
                *at = j;
                return WV_RUN_BAD_SAMPLE;
            }
        }
        s0 += ns;
        p0 += np;
        k0 += nk;
        d0 += nd;
    }
    return 0;
}

int64_t wv_train_run(const wv_run_t *r, int64_t first, int64_t last, const int64_t *batches,
                     const int64_t *rows3, int64_t cap, const int64_t *ends, const int64_t *keys,
                     const int64_t *samples, const double *lrs, double *losses, int64_t *counts,
                     int *stop, int64_t *num_left, int64_t *at) {
    const rows_t *rows = r->rows;
    const int64_t width = r->width, max_rows = r->max_rows;
    *stop = WV_RUN_DONE;
    *num_left = 0;
    const int64_t bad = check_run(r, first, last, batches, rows3, cap, ends, keys, samples, at);
    if (bad < 0) return bad;
    /* The int scratch regions: the keys gathered ([the batch's keys | its pool's others]), the
     * pool's rows, where each other key was first drawn, and the positions reported missing. */
    int64_t *gathered = r->iscratch, *pool = gathered + max_rows, *drawn_at = pool + max_rows,
            *missing = drawn_at + max_rows;
    const offsets_t o = offsets_of(r, batches, first);
    int64_t s0 = o.sentences, p0 = o.positions, k0 = o.keys, d0 = o.samples;
    for (int64_t b = first; b < last; b++) {
        const int64_t *row = batches + b * WV_B_COLS;
        const int64_t ns = row[WV_B_SENTENCES], np = row[WV_B_POSITIONS], nk = row[WV_B_KEYS];
        const int64_t nd = WV_POOL(r->negatives, np);
        /* WVTrainer.step: the pool's keys among the batch's rows (wv_merge_pool), the others
         * after them; one gather of both (the same values as its pull and pull_sample). */
        memcpy(gathered, keys + k0, (size_t)nk * sizeof(int64_t));
        const int64_t ne = wv_merge_pool(keys + k0, nk, samples + d0, nd, r->num_keys,
                                         r->row_of, pool, gathered + nk, drawn_at);
        if (ne < 0) { /* not reached: check_run checked the same keys */
            *at = b;
            return WV_RUN_BAD_KEY;
        }
        const int64_t nr = nk + ne;
        const int64_t away = rows->gather(rows->ctx, gathered, nr, r->values, nr * width,
                                          missing);
        if (away < 0) {
            *at = b;
            return WV_RUN_ROWS_FAILED;
        }
        if (away > 0) { /* nothing of this batch written: the caller trains it */
            *stop = WV_RUN_STOP_PULL;
            return b - first;
        }
        const wv_batch_t batch = {
            .dim = r->dim, .width = width, .values = r->values, .updates = r->updates,
            .num_rows = nr,
            .in_rows = rows3 + p0, .out_rows = rows3 + cap + p0, .windows = rows3 + 2 * cap + p0,
            .num_positions = np, .sentence_ends = ends + s0, .num_sentences = ns, .pool = pool,
            .pool_size = nd, .negatives = r->negatives, .lr = (float)lrs[b],
            .seed = (uint64_t)row[WV_B_TRAIN_SEED], .sgd = r->sgd};
        double loss;
        int64_t pairs;
        wv_fault_t fault;
        if (wv_train_batch(&batch, &loss, &pairs, &fault) != WV_OK) { /* not reached */
            *at = b;
            return WV_RUN_BAD_PLAN;
        }
        losses[b] = loss;
        counts[2 * b] = pairs;
        counts[2 * b + 1] = nr;
        const int64_t left = rows->scatter_add(rows->ctx, gathered, nr, r->updates, nr * width,
                                               missing);
        if (left < 0) { /* not reached: the gather checked the same keys */
            *at = b;
            return WV_RUN_ROWS_FAILED;
        }
        if (left > 0) { /* keys that left meanwhile: their updates go back to the caller */
            rows_hand_back(gathered, r->updates, width, missing, left, r->left_keys,
                           r->left_rows);
            *stop = WV_RUN_STOP_PUSH;
            *num_left = left;
            return b + 1 - first;
        }
        s0 += ns;
        p0 += np;
        k0 += nk;
        d0 += nd;
    }
    return last - first;
}
