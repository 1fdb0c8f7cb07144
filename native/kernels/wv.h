/* Word vectors (the WV app, adapm/apps/wv.py): skip-gram with negative sampling as word2vec
 * trains it, with AdaGrad as the original AdaPM word2vec app, one call per mini-batch of
 * sentences; and the corpus tokenizer that builds the vocabulary without a per-token Python loop.
 *
 * Memory is the caller's, except the tokenizer's own table. No Python, no global state beyond
 * a table of sigmoid values built once: calls on distinct buffers may run in parallel.
 */
#ifndef ADAPM_KERNELS_WV_H
#define ADAPM_KERNELS_WV_H

#include <stdint.h>

/* One batch. Every row of values is width floats: [vector | AdaGrad accumulator] (width
 * >= 2 * dim) under AdaGrad, the vector alone (width >= dim) under SGD, which has no
 * accumulator; floats past those are left alone. */
typedef struct {
    int64_t dim;
    int64_t width;                /* floats per row (0: 2 * dim, the AdaGrad layout) */
    float *values;                /* num_rows rows, trained in place */
    float *updates;               /* as values, must not overlap it: receives the changes */
    int64_t num_rows;
    const int64_t *in_rows;       /* per position: the row of its word's input vector */
    const int64_t *out_rows;      /* per position: the row of its word's output vector */
    const int64_t *windows;       /* per position: its reduced window, >= 1 */
    int64_t num_positions;
    const int64_t *sentence_ends; /* exclusive ends of the sentences, ascending, the last one
                                     num_positions (positions of one sentence are consecutive) */
    int64_t num_sentences;
    const int64_t *pool;          /* rows of output vectors that negatives are drawn from */
    int64_t pool_size;
    int64_t negatives;            /* per (word, context) pair */
    float lr;
    uint64_t seed;                /* of the draws from the pool */
    int sgd;                      /* 1: plain SGD (word2vec's, gensim's): vector += lr * g, the
                                     accumulator untouched; 0: AdaGrad */
} wv_batch_t;

enum { WV_OK = 0, WV_BAD_INPUT = -1 };

/* Largest dim accepted (the kernel keeps two rows of scratch on its stack). */
#define WV_MAX_DIM 4096

/* Fills the sigmoid tables (idempotent; call once before threads train, e.g. at import). */
void wv_init_tables(void);

/* What wv_check_batch found: the array and position of the first bad entry. */
enum { WV_AT_IN_ROWS, WV_AT_OUT_ROWS, WV_AT_WINDOWS, WV_AT_ENDS, WV_AT_POOL };

typedef struct {
    int where;        /* WV_AT_* */
    int64_t position;
} wv_fault_t;

/* Rows inside [0, num_rows), windows >= 1, sentence ends ascending within [0, num_positions]
 * with the last equal to num_positions, a non-empty pool when negatives > 0. Returns 0 or -1. */
int wv_check_batch(const wv_batch_t *b, wv_fault_t *fault);

/* Trains, as word2vec's skip-gram: for each position i of each sentence
 * (in order) and each context position c != i of the same sentence with |c - i| <= windows[i]
 * (in order), the input vector of c is trained to predict the output vector of i (label 1) and
 * `negatives` output vectors drawn uniformly from the pool (label 0; a draw equal to i's own
 * output row is skipped, as word2vec skips a negative equal to the word). Each output vector is
 * updated right after its score; the input vector after all of them, with the sum of its
 * gradients. AdaGrad on each update g (the gradient of the log-likelihood): acc += g * g;
 * vector += lr * g / sqrt(acc); or with sgd, as word2vec: vector += lr * g. updates gets values after minus values before (float
 * subtraction: exact where a value at most doubled or halved, so before + update == after). *loss gets the sum of
 * -log sigmoid(+-score) over all scores, *pairs the number of (word, context) pairs. Runs
 * wv_check_batch first: WV_BAD_INPUT with *fault set and nothing written when it fails. */
int wv_train_batch(const wv_batch_t *b, double *loss, int64_t *pairs, wv_fault_t *fault);

/* ---- tokenizer ------------------------------------------------------------------------------ */

/* A growing vocabulary: each distinct token gets an id in order of first appearance, with its
 * bytes and count. Tokens are separated by ASCII whitespace (space, \t, \n, \v, \f, \r); a line
 * is a sentence, cut every max_tokens tokens (word2vec cuts at 10,000). */
typedef struct wv_vocab wv_vocab_t;

wv_vocab_t *wv_vocab_new(void);
void wv_vocab_free(wv_vocab_t *v);

/* Tokenizes text[0..n) (complete lines; a missing last newline ends the last line too). Writes
 * each token's id to ids (capacity n / 2 + 1 always suffices) and the end of each sentence (a
 * count of tokens since the first token of this call) to ends (capacity: lines + n / max_tokens
 * + 1). Empty lines make no sentence. Returns 0 with *num_ids, *num_ends set, or -1 when out of
 * memory (the vocabulary may then hold tokens of this call). */
int wv_vocab_feed(wv_vocab_t *v, const char *text, int64_t n, int64_t max_tokens, int32_t *ids,
                  int64_t *num_ids, int64_t *ends, int64_t *num_ends);

int64_t wv_vocab_size(const wv_vocab_t *v);
int64_t wv_vocab_bytes(const wv_vocab_t *v); /* total bytes of all tokens */

/* Copies the tokens (bytes back to back), their byte offsets (size + 1 entries) and their
 * counts, in id order. */
void wv_vocab_export(const wv_vocab_t *v, char *bytes, int64_t *offsets, int64_t *counts);


/* ---- batch building ---------------------------------------------------------------------------
 * The bookkeeping around a batch in native code (per token in numpy it took ~1.0 s of a worker
 * thread's CPU per epoch beside the kernel's 2.5 s, README). row_of is the caller's scratch: one int32 per key (2 * V), all -1 between calls
 * (every call leaves it so). */

/* One batch's positions from the sentences [starts[s], starts[s] + lengths[s]) of tokens (word
 * ids < V): each token kept with probability keep[word] (subsampling; draws from seed), each
 * kept position gets its input row (key word) and output row (key V + word) among keys (the
 * batch's distinct keys in order of first use, input before output) and a window uniform in
 * [1, window]; ends[s] is the exclusive end of sentence s among the positions. Outputs have
 * room for sum(lengths) positions and 2 * sum(lengths) keys. Returns the number of positions
 * (*num_keys set), or -1 - s if sentence s lies outside tokens or a token is not < V. */
int64_t wv_plan(const int32_t *tokens, int64_t num_tokens, const int64_t *starts,
                const int64_t *lengths, int64_t num_sentences, const double *keep, int64_t vocab,
                int64_t window, uint64_t seed, int32_t *row_of, int64_t *in_rows,
                int64_t *out_rows, int64_t *windows, int64_t *ends, int64_t *keys,
                int64_t *num_keys);

/* Rows for a drawn negative pool: keys[0..nk) are the batch's rows; each drawn key gets its
 * row there, or a new row nk + e (the e-th extra key, at extra_keys[e], first drawn at
 * extra_first[e]). Returns the number of extra keys, -1 - j if drawn[j] is outside
 * [0, num_keys_total), or -1 - nd - i if keys[i] is outside it or repeated. */
int64_t wv_merge_pool(const int64_t *keys, int64_t nk, const int64_t *drawn, int64_t nd,
                      int64_t num_keys_total, int32_t *row_of, int64_t *pool,
                      int64_t *extra_keys, int64_t *extra_first);

#endif
