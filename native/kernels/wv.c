/* See wv.h. */
#include "wv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* ---- skip-gram with negative sampling ------------------------------------------------------- */

/* Scores beyond +-SCORE_LIMIT saturate the sigmoid in float (word2vec's MAX_EXP is 6; float's
 * sigmoid is 1 - 6e-8 at 16.6): the table covers [-SCORE_LIMIT, SCORE_LIMIT] in TABLE_STEPS
 * steps, and scores outside are computed exactly (they are rare once training has begun). */
#define SCORE_LIMIT 8.0
#define TABLE_STEPS 4096
static float sigmoid_table[TABLE_STEPS + 1];
static float log_sigmoid_table[TABLE_STEPS + 1]; /* log sigmoid(x) */
static int tables_ready;

void wv_init_tables(void) {
    if (tables_ready) return;
    for (int i = 0; i <= TABLE_STEPS; i++) {
        const double x = (2.0 * i / TABLE_STEPS - 1.0) * SCORE_LIMIT;
        sigmoid_table[i] = (float)sigmoid(x);
        log_sigmoid_table[i] = (float)-softplus(-x);
    }
    tables_ready = 1;
}

/* The table entry nearest to x (|x| <= SCORE_LIMIT). */
static inline int table_index(float x) {
    return (int)((x + (float)SCORE_LIMIT) * (float)(TABLE_STEPS / (2.0 * SCORE_LIMIT)) + 0.5f);
}

/* splitmix64: the pool draws (cheap, and fine for picking among a few thousand entries). */
static inline uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* A float dot product with eight independent partial sums: deterministic for a given length,
 * and gcc vectorises it without reassociating anything. */
static inline float dot8(const float *restrict a, const float *restrict b, int64_t n) {
    float p[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) p[k] += a[i + k] * b[i + k];
    for (; i < n; i++) p[0] += a[i] * b[i];
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

/* AdaGrad on one row: acc += g^2; vec += lr * g / sqrt(acc). */
static inline void adagrad_row(float *restrict row, const float *restrict g, float lr,
                               int64_t dim) {
    float *restrict acc = row + dim;
    for (int64_t j = 0; j < dim; j++) {
        const float a = acc[j] + g[j] * g[j];
        acc[j] = a;
        /* a >= g^2, so a == 0 only where g == 0: divide by 1 there (arithmetic, not a
         * branch, which keeps the loop vectorised). */
        const float step = lr * g[j] / (sqrtf(a) + (float)(a == 0.0f));
        row[j] += step;
    }
}

/* word2vec's SGD on one row: vec += lr * g (the accumulator is not touched). */
static inline void sgd_row(float *restrict row, const float *restrict g, float lr, int64_t dim) {
    for (int64_t j = 0; j < dim; j++) row[j] += lr * g[j];
}

int wv_check_batch(const wv_batch_t *b, wv_fault_t *f) {
    for (int64_t i = 0; i < b->num_positions; i++) {
        if (b->in_rows[i] < 0 || b->in_rows[i] >= b->num_rows) {
            *f = (wv_fault_t){WV_AT_IN_ROWS, i};
            return -1;
        }
        if (b->out_rows[i] < 0 || b->out_rows[i] >= b->num_rows) {
            *f = (wv_fault_t){WV_AT_OUT_ROWS, i};
            return -1;
        }
        if (b->windows[i] < 1) {
            *f = (wv_fault_t){WV_AT_WINDOWS, i};
            return -1;
        }
    }
    int64_t last = 0;
    for (int64_t s = 0; s < b->num_sentences; s++) {
        if (b->sentence_ends[s] < last || b->sentence_ends[s] > b->num_positions) {
            *f = (wv_fault_t){WV_AT_ENDS, s};
            return -1;
        }
        last = b->sentence_ends[s];
    }
    if (last != b->num_positions) {
        *f = (wv_fault_t){WV_AT_ENDS, b->num_sentences};
        return -1;
    }
    if (b->negatives > 0 && b->pool_size < 1 && b->num_positions > 0) {
        *f = (wv_fault_t){WV_AT_POOL, 0};
        return -1;
    }
    for (int64_t i = 0; i < b->pool_size; i++) {
        if (b->pool[i] < 0 || b->pool[i] >= b->num_rows) {
            *f = (wv_fault_t){WV_AT_POOL, i};
            return -1;
        }
    }
    return 0;
}

/* One score: its gradient factor (label - sigmoid(score)) and its loss. */
static inline float score_gradient(float score, int label, double *loss) {
    float s, log_s, log_not_s; /* sigmoid, log sigmoid(score), log sigmoid(-score) */
    if (score > -(float)SCORE_LIMIT && score < (float)SCORE_LIMIT) {
        const int i = table_index(score);
        s = sigmoid_table[i];
        log_s = log_sigmoid_table[i];
        log_not_s = log_sigmoid_table[TABLE_STEPS - i];
    } else {
        s = (float)sigmoid(score);
        log_s = (float)-softplus(-(double)score);
        log_not_s = (float)-softplus((double)score);
    }
    *loss -= label ? log_s : log_not_s;
    return (float)label - s;
}

/* Built for x86-64-v3 (AVX2, FMA) too where the CPU has it (chosen at load time); the default clone
 * keeps the baseline x86-64 instruction set. Same results up to float contraction. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
static void train(const wv_batch_t *b, float *neu1e, float *grad, double *loss_out,
                  int64_t *pairs_out) {
    const int64_t dim = b->dim, width = b->width ? b->width : 2 * dim;
    float *values = b->values;
    uint64_t rng = b->seed;
    double loss = 0.0;
    int64_t pairs = 0, start = 0;
    for (int64_t s = 0; s < b->num_sentences; start = b->sentence_ends[s], s++) {
        const int64_t end = b->sentence_ends[s];
        for (int64_t i = start; i < end; i++) {
            /* A window past the sentence is the sentence (and i + w cannot overflow). */
            const int64_t w = b->windows[i] < end - start ? b->windows[i] : end - start;
            const int64_t center = b->out_rows[i];
            const int64_t lo = i - w > start ? i - w : start, hi = i + w < end ? i + w : end - 1;
            for (int64_t c = lo; c <= hi; c++) {
                if (c == i) continue;
                pairs++;
                float *in = values + b->in_rows[c] * width;
                memset(neu1e, 0, (size_t)dim * sizeof(float));
                for (int64_t d = 0; d <= b->negatives; d++) {
                    int64_t target = center;
                    if (d > 0) {
                        const uint64_t r = next_random(&rng) >> 32;
                        target = b->pool[(int64_t)((r * (uint64_t)b->pool_size) >> 32)];
                        if (target == center) continue;
                    }
                    float *out = values + target * width;
                    const float g = score_gradient(dot8(in, out, dim), d == 0, &loss);
                    for (int64_t j = 0; j < dim; j++) {
                        neu1e[j] += g * out[j];
                        grad[j] = g * in[j];
                    }
                    if (b->sgd)
                        sgd_row(out, grad, b->lr, dim);
                    else
                        adagrad_row(out, grad, b->lr, dim);
                }
                if (b->sgd)
                    sgd_row(in, neu1e, b->lr, dim);
                else
                    adagrad_row(in, neu1e, b->lr, dim);
            }
        }
    }
    *loss_out = loss;
    *pairs_out = pairs;
}

int wv_train_batch(const wv_batch_t *b, double *loss, int64_t *pairs, wv_fault_t *fault) {
    if (wv_check_batch(b, fault) < 0) return WV_BAD_INPUT;
    /* The updates are the difference of the rows after and before training, not a second
     * buffer written beside each change: that halves the memory the inner loops touch (rows
     * are up to 2 * dim floats, a batch's rows exceed the L2 cache). The difference is exact where
     * the value at most doubles or halves (Sterbenz), so old + update == new there. */
    const int64_t floats = b->num_rows * (b->width ? b->width : 2 * b->dim);
    memcpy(b->updates, b->values, (size_t)floats * sizeof(float));
    float scratch[2 * WV_MAX_DIM]; /* the binding bounds dim by WV_MAX_DIM */
    train(b, scratch, scratch + b->dim, loss, pairs);
    for (int64_t i = 0; i < floats; i++) b->updates[i] = b->values[i] - b->updates[i];
    return WV_OK;
}

/* ---- tokenizer ------------------------------------------------------------------------------ */

struct wv_vocab {
    int32_t *table;   /* open addressing: id + 1, 0 when empty */
    int64_t capacity; /* a power of two */
    uint64_t *hashes; /* per id */
    int64_t *offset, *count;
    int32_t *length;
    int64_t size, room; /* ids used, ids allocated */
    char *bytes;
    int64_t used, bytes_room;
};

static uint64_t hash_bytes(const char *s, int64_t n) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (int64_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    return h ^ (h >> 29);
}

wv_vocab_t *wv_vocab_new(void) {
    wv_vocab_t *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    v->capacity = 1 << 16;
    v->table = calloc((size_t)v->capacity, sizeof(int32_t));
    if (!v->table) {
        free(v);
        return NULL;
    }
    return v;
}

void wv_vocab_free(wv_vocab_t *v) {
    if (!v) return;
    free(v->table);
    free(v->hashes);
    free(v->offset);
    free(v->count);
    free(v->length);
    free(v->bytes);
    free(v);
}

static int grow_table(wv_vocab_t *v) {
    const int64_t cap = 2 * v->capacity;
    int32_t *t = calloc((size_t)cap, sizeof(int32_t));
    if (!t) return -1;
    for (int64_t id = 0; id < v->size; id++) {
        int64_t at = (int64_t)(v->hashes[id] & (uint64_t)(cap - 1));
        while (t[at]) at = (at + 1) & (cap - 1);
        t[at] = (int32_t)(id + 1);
    }
    free(v->table);
    v->table = t;
    v->capacity = cap;
    return 0;
}

static int grow_ids(wv_vocab_t *v) {
    const int64_t room = v->room ? 2 * v->room : 1024;
    uint64_t *h = realloc(v->hashes, (size_t)room * sizeof *h);
    if (!h) return -1;
    v->hashes = h;
    int64_t *o = realloc(v->offset, (size_t)room * sizeof *o);
    if (!o) return -1;
    v->offset = o;
    int64_t *c = realloc(v->count, (size_t)room * sizeof *c);
    if (!c) return -1;
    v->count = c;
    int32_t *l = realloc(v->length, (size_t)room * sizeof *l);
    if (!l) return -1;
    v->length = l;
    v->room = room;
    return 0;
}

/* The id of token s[0..n), added when new; -1 when out of memory. */
static int64_t lookup(wv_vocab_t *v, const char *s, int64_t n) {
    const uint64_t h = hash_bytes(s, n);
    int64_t at = (int64_t)(h & (uint64_t)(v->capacity - 1));
    for (;;) {
        const int32_t slot = v->table[at];
        if (!slot) break;
        const int64_t id = slot - 1;
        if (v->hashes[id] == h && v->length[id] == n && !memcmp(v->bytes + v->offset[id], s, n))
            return id;
        at = (at + 1) & (v->capacity - 1);
    }
    if (v->size >= INT32_MAX - 1) return -1;
    if (v->size == v->room && grow_ids(v) < 0) return -1;
    if (v->used + n > v->bytes_room) {
        int64_t room = v->bytes_room ? 2 * v->bytes_room : 1 << 16;
        while (room < v->used + n) room *= 2;
        char *bytes = realloc(v->bytes, (size_t)room);
        if (!bytes) return -1;
        v->bytes = bytes;
        v->bytes_room = room;
    }
    const int64_t id = v->size++;
    memcpy(v->bytes + v->used, s, (size_t)n);
    v->offset[id] = v->used;
    v->used += n;
    v->length[id] = (int32_t)n;
    v->hashes[id] = h;
    v->count[id] = 0;
    v->table[at] = (int32_t)(id + 1);
    if (2 * v->size > v->capacity && grow_table(v) < 0) return -1; /* load <= 1/2 */
    return id;
}

static inline int is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

int wv_vocab_feed(wv_vocab_t *v, const char *text, int64_t n, int64_t max_tokens, int32_t *ids,
                  int64_t *num_ids, int64_t *ends, int64_t *num_ends) {
    int64_t nid = 0, nend = 0, in_line = 0, i = 0;
    while (i < n) {
        const unsigned char c = (unsigned char)text[i];
        if (c == '\n') {
            if (in_line) ends[nend++] = nid;
            in_line = 0;
            i++;
            continue;
        }
        if (is_space(c)) {
            i++;
            continue;
        }
        int64_t j = i + 1;
        while (j < n && !is_space((unsigned char)text[j])) j++;
        const int64_t id = lookup(v, text + i, j - i);
        if (id < 0) return -1;
        v->count[id]++;
        ids[nid++] = (int32_t)id;
        if (++in_line == max_tokens) {
            ends[nend++] = nid;
            in_line = 0;
        }
        i = j;
    }
    if (in_line) ends[nend++] = nid;
    *num_ids = nid;
    *num_ends = nend;
    return 0;
}

int64_t wv_vocab_size(const wv_vocab_t *v) { return v->size; }

int64_t wv_vocab_bytes(const wv_vocab_t *v) { return v->used; }

void wv_vocab_export(const wv_vocab_t *v, char *bytes, int64_t *offsets, int64_t *counts) {
    if (v->used) memcpy(bytes, v->bytes, (size_t)v->used);
    for (int64_t id = 0; id < v->size; id++) {
        offsets[id] = v->offset[id];
        counts[id] = v->count[id];
    }
    offsets[v->size] = v->used;
}

/* ---- batch building ---------------------------------------------------------------------------- */

/* A uniform draw in [0, 1) with 53 random bits. */
static inline double uniform(uint64_t *state) {
    return (double)(next_random(state) >> 11) * (1.0 / 9007199254740992.0);
}

/* The row of key among keys, appended when new. */
static inline int64_t row_for(int64_t key, int32_t *row_of, int64_t *keys, int64_t *nk) {
    if (row_of[key] < 0) {
        row_of[key] = (int32_t)*nk;
        keys[(*nk)++] = key;
    }
    return row_of[key];
}

int64_t wv_plan(const int32_t *tokens, int64_t num_tokens, const int64_t *starts,
                const int64_t *lengths, int64_t num_sentences, const double *keep, int64_t vocab,
                int64_t window, uint64_t seed, int32_t *row_of, int64_t *in_rows,
                int64_t *out_rows, int64_t *windows, int64_t *ends, int64_t *keys,
                int64_t *num_keys) {
    for (int64_t s = 0; s < num_sentences; s++) {
        if (starts[s] < 0 || lengths[s] < 0 || starts[s] > num_tokens - lengths[s]) return -1 - s;
        for (int64_t t = starts[s]; t < starts[s] + lengths[s]; t++)
            if (tokens[t] < 0 || tokens[t] >= vocab) return -1 - s;
    }
    uint64_t rng = seed;
    int64_t n = 0, nk = 0;
    for (int64_t s = 0; s < num_sentences; s++) {
        for (int64_t t = starts[s]; t < starts[s] + lengths[s]; t++) {
            const int64_t word = tokens[t];
            if (!(uniform(&rng) < keep[word])) continue;
            in_rows[n] = row_for(word, row_of, keys, &nk);
            out_rows[n] = row_for(vocab + word, row_of, keys, &nk);
            windows[n] = 1 + (int64_t)(((next_random(&rng) >> 32) * (uint64_t)window) >> 32);
            n++;
        }
        ends[s] = n;
    }
    for (int64_t i = 0; i < nk; i++) row_of[keys[i]] = -1;
    *num_keys = nk;
    return n;
}

int64_t wv_merge_pool(const int64_t *keys, int64_t nk, const int64_t *drawn, int64_t nd,
                      int64_t num_keys_total, int32_t *row_of, int64_t *pool,
                      int64_t *extra_keys, int64_t *extra_first) {
    for (int64_t j = 0; j < nd; j++)
        if (drawn[j] < 0 || drawn[j] >= num_keys_total) return -1 - j;
    for (int64_t i = 0; i < nk; i++) {
        if (keys[i] < 0 || keys[i] >= num_keys_total || row_of[keys[i]] >= 0) {
            for (int64_t k = 0; k < i; k++) row_of[keys[k]] = -1;
            return -1 - nd - i; /* outside, or repeated */
        }
        row_of[keys[i]] = (int32_t)i;
    }
    int64_t ne = 0;
    for (int64_t j = 0; j < nd; j++) {
        const int64_t key = drawn[j];
        if (row_of[key] < 0) {
            row_of[key] = (int32_t)(nk + ne);
            extra_keys[ne] = key;
            extra_first[ne++] = j;
        }
        pool[j] = row_of[key];
    }
    for (int64_t i = 0; i < nk; i++) row_of[keys[i]] = -1;
    for (int64_t e = 0; e < ne; e++) row_of[extra_keys[e]] = -1;
    return ne;
}
