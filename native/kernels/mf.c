/* See mf.h. */
#include "mf.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Built for x86-64-v3 (AVX2, FMA) too where the CPU has it; see wv.c. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
static double train(const mf_batch_t *b, float *gw, float *gh) {
    const int64_t k = b->rank, width = 2 * k;
    double loss = 0.0;
    for (int64_t e = 0; e < b->num_entries; e++) {
        float *w = b->values + b->w_rows[e] * width, *h = b->values + b->h_rows[e] * width;
        const float rw = b->reg[b->w_rows[e]], rh = b->reg[b->h_rows[e]];
        float dot = 0.0f;
        for (int64_t z = 0; z < k; z++) dot += w[z] * h[z];
        const float err = b->x[e] - dot;
        loss += (double)err * (double)err;
        for (int64_t z = 0; z < k; z++) {
            gw[z] = -2.0f * err * h[z] + rw * w[z];
            gh[z] = -2.0f * err * w[z] + rh * h[z];
        }
        for (int64_t z = 0; z < k; z++) {
            const float a = w[k + z] + gw[z] * gw[z];
            w[k + z] = a;
            w[z] -= b->lr * gw[z] / sqrtf(a + MF_ADAGRAD_EPS);
        }
        for (int64_t z = 0; z < k; z++) {
            const float a = h[k + z] + gh[z] * gh[z];
            h[k + z] = a;
            h[z] -= b->lr * gh[z] / sqrtf(a + MF_ADAGRAD_EPS);
        }
    }
    return loss;
}

int64_t mf_train_batch(const mf_batch_t *b, double *loss) {
    for (int64_t e = 0; e < b->num_entries; e++) {
        if (b->w_rows[e] < 0 || b->w_rows[e] >= b->num_rows || b->h_rows[e] < 0 ||
            b->h_rows[e] >= b->num_rows)
            return -1 - e;
    }
    /* Updates as the difference after minus before (see wv.c: exact where a value at most
     * doubles or halves, and half the memory traffic of recording each change). */
    const int64_t floats = b->num_rows * 2 * b->rank;
    memcpy(b->updates, b->values, (size_t)floats * sizeof(float));
    float scratch[2 * MF_MAX_RANK]; /* the binding bounds rank */
    *loss = train(b, scratch, scratch + b->rank);
    for (int64_t i = 0; i < floats; i++) b->updates[i] = b->values[i] - b->updates[i];
    return 0;
}

/* ---- batch plans ----------------------------------------------------------------------------- */

/* Ascending sort of a batch's distinct keys, tmp: room for n more. LSD radix sort on 8-bit
 * digits of key - min, as many passes as the span of the keys needs (2 for a span under 65536):
 * branch-free, where a comparison sort of random keys mispredicts every other branch (a
 * quicksort took 25-40 us for 2 x 1,000 keys, this ~3 us). */
static void sort_keys(int64_t *a, int64_t n, int64_t *tmp) {
    if (n < 2) return;
    if (n <= 32) {
        for (int64_t i = 1; i < n; i++) {
            const int64_t v = a[i];
            int64_t j = i;
            for (; j > 0 && a[j - 1] > v; j--) a[j] = a[j - 1];
            a[j] = v;
        }
        return;
    }
    int64_t lo = a[0], hi = a[0];
    for (int64_t i = 1; i < n; i++) {
        lo = a[i] < lo ? a[i] : lo;
        hi = a[i] > hi ? a[i] : hi;
    }
    const uint64_t span = (uint64_t)(hi - lo);
    int64_t *src = a, *dst = tmp;
    for (int shift = 0; shift < 64 && (shift == 0 || (span >> shift)); shift += 8) {
        int64_t start[257] = {0};
        for (int64_t i = 0; i < n; i++) start[(((uint64_t)(src[i] - lo) >> shift) & 255) + 1]++;
        for (int b = 0; b < 256; b++) start[b + 1] += start[b];
        for (int64_t i = 0; i < n; i++) dst[start[((uint64_t)(src[i] - lo) >> shift) & 255]++] = src[i];
        int64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, (size_t)n * sizeof(int64_t));
}

int64_t mf_plan(const mf_plan_t *p, const int64_t *points, int64_t n, int64_t *keys,
                int64_t *w_rows, int64_t *h_rows, float *x, float *reg, int64_t *row_keys) {
    const int64_t R = p->num_rows;
    for (int64_t i = 0; i < n; i++) { /* every index checked before anything is written */
        const int64_t e = points[i];
        if (e < 0 || e >= p->num_entries || p->rows[e] < 0 || p->rows[e] >= R ||
            p->cols[e] < 0 || p->cols[e] >= p->num_keys - R)
            return -1 - i;
    }
    /* Distinct row keys collect at the front of keys, distinct column keys from keys + n on
     * (at most n of each); row_of marks a key seen. */
    int64_t nr = 0, nc = 0;
    int64_t *col_keys = keys + n;
    for (int64_t i = 0; i < n; i++) {
        const int64_t e = points[i], r = p->rows[e], c = R + p->cols[e];
        if (p->row_of[r] < 0) {
            p->row_of[r] = 0;
            keys[nr++] = r;
        }
        if (p->row_of[c] < 0) {
            p->row_of[c] = 0;
            col_keys[nc++] = c;
        }
    }
    sort_keys(keys, nr, h_rows); /* h_rows: scratch until the last loop */
    sort_keys(col_keys, nc, h_rows);
    memmove(keys + nr, col_keys, (size_t)nc * sizeof(int64_t)); /* every row key < num_rows */
    const int64_t nk = nr + nc;
    for (int64_t j = 0; j < nk; j++) {
        p->row_of[keys[j]] = (int32_t)j;
        reg[j] = p->reg_of[keys[j]];
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t e = points[i];
        w_rows[i] = p->row_of[p->rows[e]];
        h_rows[i] = p->row_of[R + p->cols[e]];
        x[i] = p->vals[e];
    }
    for (int64_t j = 0; j < nk; j++) p->row_of[keys[j]] = -1;
    *row_keys = nr;
    return nk;
}

int64_t mf_columns(const mf_plan_t *p, const int64_t *points, int64_t n, int64_t batch_size,
                   int64_t *keys, int64_t *counts) {
    const int64_t R = p->num_rows;
    for (int64_t i = 0; i < n; i++) {
        const int64_t e = points[i];
        if (e < 0 || e >= p->num_entries || p->cols[e] < 0 || p->cols[e] >= p->num_keys - R)
            return -1 - i;
    }
    int64_t total = 0;
    for (int64_t b = 0, start = 0; start < n; b++, start += batch_size) {
        const int64_t end = n - start < batch_size ? n : start + batch_size, first = total;
        for (int64_t i = start; i < end; i++) {
            const int64_t c = R + p->cols[points[i]];
            if (p->row_of[c] < 0) {
                p->row_of[c] = 0;
                keys[total++] = c;
            }
        }
        for (int64_t j = first; j < total; j++) p->row_of[keys[j]] = -1;
        counts[b] = total - first;
    }
    return total;
}

/* ---- text ------------------------------------------------------------------------------------ */

static inline int blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

/* One id of a line: an int64 (not clamped: out of range is an error) from which base can be
 * subtracted without overflow. */
static int parse_id(const char **s, int64_t base, int64_t *out) {
    char *end;
    while (blank(**s)) (*s)++;
    if (!(**s >= '0' && **s <= '9') && **s != '-' && **s != '+') return -1;
    errno = 0;
    const long long v = strtoll(*s, &end, 10);
    if (end == *s || !blank(*end) || errno == ERANGE || v < INT64_MIN + base) return -1;
    *out = (int64_t)v - base;
    *s = end;
    return 0;
}

/* Parses one line (NUL-terminated copy) into an entry; 0 on success. */
static int parse_line(const char *s, int64_t base, int64_t *row, int64_t *col, float *val) {
    char *end;
    if (parse_id(&s, base, row) < 0 || parse_id(&s, base, col) < 0) return -1;
    while (blank(*s)) s++;
    const double v = strtod(s, &end);
    if (end == s) return -1;
    const float f = (float)v;
    if (!isfinite(f)) return -1; /* also a finite double beyond float's range */
    s = end;
    while (blank(*s)) s++;
    if (*s) return -1;
    *val = f;
    return 0;
}

/* One field of a separated line: blanks around it skipped; *s left after the separator (or at
 * the end). Returns the field's start, its length in *len; NULL when the line has no field left. */
static const char *field(const char **s, char sep, int64_t *len) {
    const char *p = *s;
    if (!p) return NULL;
    while (blank(*p) && *p != sep) p++;
    const char *start = p;
    while (*p && *p != sep) p++;
    const char *end = p;
    while (end > start && blank(end[-1])) end--;
    *len = end - start;
    *s = *p == sep ? p + 1 : NULL;
    return start;
}

/* Parses one line of fields separated by `sep` (',' or a tab): an integer row label, an integer
 * column label (each written plainly: no sign but '-', no leading zero) and a number; any
 * further fields (a timestamp) are ignored. 0 on success. */
static int parse_separated(const char *s, char sep, int64_t *row, int64_t *col, float *val) {
    char buf[64], *end;
    int64_t len;
    for (int f = 0; f < 3; f++) {
        const char *start = field(&s, sep, &len);
        if (!start || len == 0 || len >= (int64_t)sizeof buf) return -1;
        memcpy(buf, start, (size_t)len);
        buf[len] = '\0';
        errno = 0;
        if (f < 2) {
            /* A label is a plain integer: '0345' or '+345' would read as 345, one item with
             * '345' (the caller reads a table with such labels with its labels as text). */
            const char *digits = buf + (buf[0] == '-');
            if (!(digits[0] >= '0' && digits[0] <= '9') ||
                (digits[0] == '0' && (digits[1] || digits != buf)))
                return -1;
            const long long v = strtoll(buf, &end, 10);
            if (*end || errno == ERANGE) return -1;
            *(f == 0 ? row : col) = (int64_t)v;
        } else {
            const double v = strtod(buf, &end);
            const float x = (float)v;
            if (*end || !isfinite(x)) return -1;
            *val = x;
        }
    }
    return 0;
}

int64_t mf_parse(const char *text, int64_t n, int skip_percent, int64_t base, int64_t *rows,
                 int64_t *cols, float *vals, int64_t *lines) {
    return mf_parse_sep(text, n, skip_percent, base, 0, rows, cols, vals, lines);
}

int64_t mf_parse_sep(const char *text, int64_t n, int skip_percent, int64_t base, char sep,
                     int64_t *rows, int64_t *cols, float *vals, int64_t *lines) {
    char line[256];
    int64_t count = 0, number = 0, i = 0;
    while (i < n) {
        int64_t j = i;
        while (j < n && text[j] != '\n') j++;
        number++;
        int64_t len = j - i;
        const char *s = text + i;
        i = j + 1;
        int64_t lead = 0;
        while (lead < len && blank(s[lead])) lead++;
        if (lead == len || (skip_percent && s[lead] == '%')) continue;
        size_t used = (size_t)len;
        if (sep) { /* fields past the third (a timestamp, a review) are not read: any length */
            int seps = 0;
            for (size_t k = 0; k < used; k++)
                if (s[k] == sep && ++seps == 3) {
                    used = k;
                    break;
                }
        }
        if (used >= sizeof line || memchr(s, '\0', used)) return -number;
        memcpy(line, s, used);
        line[used] = '\0';
        if ((sep ? parse_separated(line, sep, rows + count, cols + count, vals + count)
                 : parse_line(line, base, rows + count, cols + count, vals + count)) < 0)
            return -number;
        lines[count++] = number;
    }
    return count;
}

int64_t mf_format(const int64_t *rows, const int64_t *cols, const float *vals, int64_t n,
                  int64_t base, char sep, char *out, int64_t cap) {
    int64_t at = 0;
    for (int64_t e = 0; e < n; e++) {
        if (cap - at < MF_FORMAT_MAX_LINE) return -1;
        const int w = snprintf(out + at, MF_FORMAT_MAX_LINE, "%lld%c%lld%c%.9g\n",
                               (long long)(rows[e] + base), sep, (long long)(cols[e] + base), sep,
                               (double)vals[e]);
        if (w < 0 || w >= MF_FORMAT_MAX_LINE) return -1;
        at += w;
    }
    return at;
}

/* ---- a run of batches over rows wherever they live (rows.h) -------------------------------- */

int64_t mf_train_rows(const mf_run_t *r, const int64_t *points, int64_t n, double *losses,
                      int64_t *keys, int *stop, int64_t *num_left) {
    const mf_plan_t *p = &r->plan;
    const rows_t *rows = r->rows;
    const int64_t R = p->num_rows, width = 2 * r->rank;
    *stop = MF_DONE;
    *num_left = 0;
    for (int64_t i = 0; i < n; i++) { /* mf_plan's check, for the whole run before any batch */
        const int64_t e = points[i];
        if (e < 0 || e >= p->num_entries || p->rows[e] < 0 || p->rows[e] >= R ||
            p->cols[e] < 0 || p->cols[e] >= p->num_keys - R)
            return -1 - i;
    }
    int64_t b = 0;
    for (int64_t start = 0; start < n; b++, start += r->batch_size) {
        const int64_t m = n - start < r->batch_size ? n - start : r->batch_size;
        int64_t row_keys;
        const int64_t nk = mf_plan(p, points + start, m, r->scratch_keys, r->w_rows, r->h_rows,
                                   r->x, r->reg, &row_keys);
        if (nk < 0) return -1 - (start - 1 - nk); /* not reached: checked above */
        const int64_t away = rows->gather(rows->ctx, r->scratch_keys, nk, r->values,
                                          nk * width, r->missing);
        if (away < 0) return -1 - n - b;
        if (away > 0) { /* nothing of this batch written: the caller trains it */
            *stop = MF_STOP_PULL;
            return b;
        }
        const mf_batch_t batch = {.rank = r->rank, .values = r->values, .updates = r->updates,
                                  .num_rows = nk, .w_rows = r->w_rows, .h_rows = r->h_rows,
                                  .x = r->x, .num_entries = m, .reg = r->reg, .lr = r->lr};
        mf_train_batch(&batch, &losses[b]); /* its rows are the plan's: always in range */
        keys[b] = nk;
        const int64_t left = rows->scatter_add(rows->ctx, r->scratch_keys, nk, r->updates,
                                               nk * width, r->missing);
        if (left < 0) return -1 - n - b; /* not reached: the gather checked the same keys */
        if (left > 0) { /* keys that left meanwhile: their updates go back to the caller */
            rows_hand_back(r->scratch_keys, r->updates, width, r->missing, left, r->left_keys,
                           r->left_rows);
            *stop = MF_STOP_PUSH;
            *num_left = left;
            return b + 1;
        }
    }
    return b;
}
