/* Matrix factorisation (the MF app, adapm/apps/mf.py): squared loss with L2 and AdaGrad as the
 * original AdaPM MF app, one call per mini-batch of entries; and the text readers and writer of
 * its data files (MatrixMarket coordinate entries and row<TAB>col<TAB>value lines).
 *
 * Memory is the caller's; no Python, no global state: calls on distinct buffers may run in
 * parallel.
 */
#ifndef ADAPM_KERNELS_MF_H
#define ADAPM_KERNELS_MF_H

#include <stdint.h>

#include "rows.h"

/* Largest rank accepted. */
#define MF_MAX_RANK 4096
/* AdaGrad's epsilon under the square root, as the original AdaPM MF app (ADAGRAD_EPS). */
#define MF_ADAGRAD_EPS 1e-6f

/* One batch. Every row of values is [factor | AdaGrad accumulator], 2 * rank floats. */
typedef struct {
    int64_t rank;
    float *values;          /* num_rows rows, trained in place */
    float *updates;         /* as values, not overlapping it: values after minus before */
    int64_t num_rows;
    const int64_t *w_rows;  /* per entry: the row of its row factor */
    const int64_t *h_rows;  /* per entry: the row of its column factor */
    const float *x;         /* per entry: its value */
    int64_t num_entries;
    const float *reg;       /* per row: its L2 weight (2 lambda / entries of its row or column) */
    float lr;
} mf_batch_t;

/* Trains the entries in order: err = x - <w, h>; g_w = -2 err h + reg_w w, g_h = -2 err w +
 * reg_h h (both from the values before the step); acc += g^2; factor -= lr g / sqrt(acc + eps)
 * for w, then h (a w row equal to its h row is updated twice, in sequence). *loss gets the sum
 * of err^2 before each step. Returns 0, or -1 - i when entry i names a row outside
 * [0, num_rows) (nothing written then). */
int64_t mf_train_batch(const mf_batch_t *b, double *loss);

/* Parses text[0..n) (complete lines; a missing last newline ends the last line too): lines of
 * "<int> <int> <number>" separated by blanks or tabs; empty lines and lines starting with '%'
 * (when skip_percent) are skipped. Writes each entry's ints minus `base` to rows and cols, its
 * number to vals (as float), its 1-based line number (counted from this call's first line) to
 * lines (capacity: the number of lines). Returns the number of entries, or -line for the first
 * line that does not parse. */
int64_t mf_parse(const char *text, int64_t n, int skip_percent, int64_t base, int64_t *rows,
                 int64_t *cols, float *vals, int64_t *lines);

/* As mf_parse, for lines of fields separated by `sep` (',' or '\t'; 0: mf_parse's blanks):
 * "<int>,<int>,<number>[,anything...]" (a CSV or TSV of ratings, as userId,movieId,rating,
 * timestamp), blanks around fields allowed; the ints are labels, written as they are (base is
 * not subtracted). */
int64_t mf_parse_sep(const char *text, int64_t n, int skip_percent, int64_t base, char sep,
                     int64_t *rows, int64_t *cols, float *vals, int64_t *lines);

/* Writes "<row + base> <col + base> <value>\n" per entry (value with 9 significant digits,
 * enough to read back the same float) to out; returns the bytes written, or -1 if out (cap
 * bytes) is too small (MF_FORMAT_MAX_LINE per entry always suffices). */
#define MF_FORMAT_MAX_LINE 64
int64_t mf_format(const int64_t *rows, const int64_t *cols, const float *vals, int64_t n,
                  int64_t base, char sep, char *out, int64_t cap);

/* One batch's plan: what mf_train_batch needs, from the batch's entries (indices into the
 * training entries rows[], cols[], vals[] of a num_rows-row matrix; key of row i: i, of
 * column j: num_rows + j). Writes the batch's distinct keys ascending to keys (capacity
 * 2 * n), per entry the position of its row key in keys to w_rows and of its column key to
 * h_rows, its value to x, and per key reg_of[key] to reg. row_of is scratch of one int32 per
 * key, every item -1 on entry and on return. Returns the number of keys, and in *row_keys how
 * many of them are row keys (the first ones); or -1 - i when points[i] is outside
 * [0, num_entries) or names a key outside [0, num_keys) (nothing written but keys then, row_of
 * restored). The same arrays as numpy's unique(rows, num_rows + cols, return_inverse). */
typedef struct {
    const int64_t *rows, *cols;  /* the training entries' row and column indices */
    const float *vals;           /* and their values */
    int64_t num_entries;
    int64_t num_rows;            /* keys of columns start here */
    int64_t num_keys;            /* length of reg_of and row_of */
    const float *reg_of;         /* per key: its L2 weight */
    int32_t *row_of;             /* scratch, see above */
} mf_plan_t;

int64_t mf_plan(const mf_plan_t *p, const int64_t *points, int64_t n, int64_t *keys,
                int64_t *w_rows, int64_t *h_rows, float *x, float *reg, int64_t *row_keys);

/* The column keys of a run of batches (batch b: points[b * batch_size, ...), as
 * mf_train_rows cuts them): each batch's distinct column keys (num_rows + column), in order of
 * first appearance, back to back in keys (room: n), and their number per batch in counts. What
 * a worker signals as intent per batch (its rows are signalled once per epoch). row_of as in
 * mf_plan (every item -1 on entry and on return). Returns the keys written, or -1 - i for the
 * first points[i] outside [0, num_entries) or naming a column outside [0, num_keys - num_rows)
 * (nothing written then). */
int64_t mf_columns(const mf_plan_t *p, const int64_t *points, int64_t n, int64_t batch_size,
                   int64_t *keys, int64_t *counts);

/* A run of batches in one call, over rows wherever they live (rows.h: the baseline's table, a
 * node's store): what the per-batch path does for each batch (mf_plan, a gather of its keys,
 * mf_train_batch, a scatter_add of the updates), in the same order with the same arithmetic, so
 * that the rows end as that path leaves them. Batch b is points[b * batch_size, min((b + 1) *
 * batch_size, n)); losses[b] gets its loss (mf_train_batch's) and keys[b] its number of distinct
 * keys (pulled and pushed once each). The scratch holds one batch of up to batch_size entries:
 * keys, reg and missing 2 * batch_size items, w_rows, h_rows and x batch_size, values and
 * updates 2 * batch_size rows of 2 * rank floats.
 *
 * Every point is checked before anything is written (as mf_plan): returns -1 - i for the first
 * bad points[i]. A gather or scatter_add that fails (-1: a table that does not cover the plan's
 * keys) returns -1 - n - b for batch b (batches before it trained, nothing of b written).
 *
 * Else it returns the number of batches trained, and *stop says why it returned:
 * - MF_DONE: every batch;
 * - MF_STOP_PULL: the next batch has keys whose rows are not held here; nothing of it was
 *   written (the caller trains it through the node, which fetches them, and calls again from
 *   the batch after it);
 * - MF_STOP_PUSH: the last batch trained had keys that left between its gather and its
 *   scatter_add (another thread moved them away): their keys went to left_keys and their
 *   updates to left_rows (room for 2 * batch_size keys and rows), *num_left of them; the
 *   caller pushes them through the node, which sends them where the keys went. */
enum { MF_DONE = 0, MF_STOP_PULL = 1, MF_STOP_PUSH = 2 };

typedef struct {
    mf_plan_t plan;
    const rows_t *rows;
    int64_t rank;
    float lr;
    int64_t batch_size;
    int64_t *scratch_keys, *w_rows, *h_rows, *missing;
    float *x, *reg, *values, *updates;
    int64_t *left_keys;  /* MF_STOP_PUSH's outputs (see above) */
    float *left_rows;
} mf_run_t;

int64_t mf_train_rows(const mf_run_t *r, const int64_t *points, int64_t n, double *losses,
                      int64_t *keys, int *stop, int64_t *num_left);

#endif
