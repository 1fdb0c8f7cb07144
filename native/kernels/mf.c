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
 * column label and a number; any further fields (a timestamp) are ignored. 0 on success. */
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
            if (!(buf[0] >= '0' && buf[0] <= '9') && buf[0] != '-' && buf[0] != '+') return -1;
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
        if (len >= (int64_t)sizeof line || memchr(s, '\0', (size_t)len)) return -number;
        memcpy(line, s, (size_t)len);
        line[len] = '\0';
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
