/* CPython binding of wv.c: the skip-gram batch trainer and the corpus tokenizer. Conventions
 * as module.c: every buffer checked while holding the GIL, one call into wv.c with the GIL
 * released, nothing written when a check fails, the buffers stay the caller's.
 */
#include "binding.h"
#include "wv.h"

static PyObject *py_wv_train_batch(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "wv_train_batch";
    static char *kwlist[] = {"dim", "values", "updates", "in_rows", "out_rows", "windows",
                             "sentence_ends", "pool", "negatives", "lr", "seed", "sgd", "width",
                             NULL};
    long long dim, negatives, width = 0;
    double lr;
    int sgd = 0;
    PyObject *ovalues, *oupdates, *oin, *oout, *owin, *oends, *opool, *oseed;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LOOOOOOOLdO|pL", kwlist, &dim, &ovalues,
                                     &oupdates, &oin, &oout, &owin, &oends, &opool, &negatives,
                                     &lr, &oseed, &sgd, &width))
        return NULL;
    if (!PyLong_Check(oseed))
        return PyErr_Format(PyExc_TypeError, "%s: seed must be an int", fn);
    const unsigned long long seed = PyLong_AsUnsignedLongLong(oseed);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return PyErr_Format(PyExc_ValueError, "%s: seed must be in [0, 2**64)", fn);
    }
    if (dim < 1 || dim > WV_MAX_DIM)
        return PyErr_Format(PyExc_ValueError, "%s: dim %lld outside [1, %d]", fn, dim,
                            WV_MAX_DIM);
    if (negatives < 0)
        return PyErr_Format(PyExc_ValueError, "%s: negatives must be >= 0, got %lld", fn,
                            negatives);
    if (width == 0) width = 2 * dim;
    if (width < (sgd ? dim : 2 * dim) || width > 2 * (long long)WV_MAX_DIM)
        return PyErr_Format(PyExc_ValueError, "%s: width %lld: rows need the vector (dim = %lld "
                            "floats)%s, and at most %d floats", fn, width, dim,
                            sgd ? "" : " and its AdaGrad accumulator (2 * dim)", 2 * WV_MAX_DIM);
    views_t vs = {.n = 0};
    Py_buffer *values, *updates, *in_rows, *out_rows, *windows, *ends, *pool;
    if (!(values = take(&vs, ovalues, fn, "values", F32, 1, 0)) ||
        !(updates = take(&vs, oupdates, fn, "updates", F32, 1, 0)) ||
        !(in_rows = take(&vs, oin, fn, "in_rows", I64, 0, 1)) ||
        !(out_rows = take(&vs, oout, fn, "out_rows", I64, 0, 1)) ||
        !(windows = take(&vs, owin, fn, "windows", I64, 0, 1)) ||
        !(ends = take(&vs, oends, fn, "sentence_ends", I64, 0, 1)) ||
        !(pool = take(&vs, opool, fn, "pool", I64, 0, 1)))
        goto fail;
    const int64_t nvalues = count(values), npos = count(in_rows);
    if (nvalues % width) {
        PyErr_Format(PyExc_ValueError, "%s: values has %lld floats, not a whole number of rows "
                     "of width = %lld", fn, (long long)nvalues, width);
        goto fail;
    }
    if (count(updates) != nvalues) {
        PyErr_Format(PyExc_ValueError, "%s: updates has %lld floats, values %lld", fn,
                     (long long)count(updates), (long long)nvalues);
        goto fail;
    }
    if (count(out_rows) != npos || count(windows) != npos) {
        PyErr_Format(PyExc_ValueError, "%s: in_rows, out_rows and windows need one entry per "
                     "position, got %lld, %lld, %lld", fn, (long long)npos,
                     (long long)count(out_rows), (long long)count(windows));
        goto fail;
    }
    if (check_no_overlap(&vs, values, fn, "values") < 0 ||
        check_no_overlap(&vs, updates, fn, "updates") < 0)
        goto fail;
    const wv_batch_t batch = {
        .dim = dim,
        .width = width,
        .values = values->buf,
        .updates = updates->buf,
        .num_rows = nvalues / width,
        .in_rows = in_rows->buf,
        .out_rows = out_rows->buf,
        .windows = windows->buf,
        .num_positions = npos,
        .sentence_ends = ends->buf,
        .num_sentences = count(ends),
        .pool = pool->buf,
        .pool_size = count(pool),
        .negatives = negatives,
        .lr = (float)lr,
        .seed = seed,
        .sgd = sgd,
    };
    double loss;
    int64_t pairs;
    wv_fault_t fault;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = wv_train_batch(&batch, &loss, &pairs, &fault);
    Py_END_ALLOW_THREADS
    if (rc != WV_OK) {
        static const char *names[] = {"in_rows", "out_rows", "windows", "sentence_ends", "pool"};
        static const char *why[] = {"a row outside [0, len(values) / width)",
                                    "a row outside [0, len(values) / width)",
                                    "a window below 1",
                                    "not ascending within [0, positions], ending at positions",
                                    "empty with negatives > 0, or a row outside the values"};
        PyErr_Format(PyExc_ValueError, "%s: %s[%lld]: %s", fn, names[fault.where],
                     (long long)fault.position, why[fault.where]);
        goto fail;
    }
    release_views(&vs);
    return Py_BuildValue("(dL)", loss, (long long)pairs);
fail:
    release_views(&vs);
    return NULL;
}

/* ---- batch building --------------------------------------------------------------------------- */

static int check_written(views_t *vs, int first, const char *fn) {
    for (int i = first; i < vs->n; i++)
        if (check_no_overlap(vs, &vs->v[i], fn, "an output") < 0) return -1;
    return 0;
}

static PyObject *py_wv_plan(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "wv_plan";
    static char *kwlist[] = {"tokens", "starts", "lengths", "keep", "window", "seed", "row_of",
                             "in_rows", "out_rows", "windows", "ends", "keys", NULL};
    PyObject *o[11];
    long long window;
    unsigned long long seed;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOLKOOOOOO", kwlist, &o[0], &o[1], &o[2],
                                     &o[3], &window, &seed, &o[4], &o[5], &o[6], &o[7], &o[8],
                                     &o[9]))
        return NULL;
    if (window < 1) return PyErr_Format(PyExc_ValueError, "%s: window must be >= 1", fn);
    views_t vs = {.n = 0};
    Py_buffer *tokens, *starts, *lengths, *keep, *row_of, *in_rows, *out_rows, *windows, *ends,
        *keys;
    if (!(tokens = take(&vs, o[0], fn, "tokens", I32, 0, 1)) ||
        !(starts = take(&vs, o[1], fn, "starts", I64, 0, 1)) ||
        !(lengths = take(&vs, o[2], fn, "lengths", I64, 0, 1)) ||
        !(keep = take(&vs, o[3], fn, "keep", F64, 0, 1)) ||
        !(row_of = take(&vs, o[4], fn, "row_of", I32, 1, 1)) ||
        !(in_rows = take(&vs, o[5], fn, "in_rows", I64, 1, 1)) ||
        !(out_rows = take(&vs, o[6], fn, "out_rows", I64, 1, 1)) ||
        !(windows = take(&vs, o[7], fn, "windows", I64, 1, 1)) ||
        !(ends = take(&vs, o[8], fn, "ends", I64, 1, 1)) ||
        !(keys = take(&vs, o[9], fn, "keys", I64, 1, 1)))
        goto fail;
    if (check_written(&vs, 4, fn) < 0) goto fail;
    const int64_t ns = count(starts), vocab = count(keep);
    const int64_t *len = lengths->buf;
    int64_t total = 0;
    for (int64_t s = 0; s < ns; s++) total += len[s] > 0 ? len[s] : 0;
    if (count(lengths) != ns || count(ends) < ns || count(row_of) < 2 * vocab ||
        count(in_rows) < total || count(out_rows) < total || count(windows) < total ||
        count(keys) < 2 * total) {
        PyErr_Format(PyExc_ValueError, "%s: starts and lengths need one item per sentence, ends "
                     "room for them, row_of 2 * len(keep) items, in_rows, out_rows and windows "
                     "room for %lld positions and keys for %lld", fn, (long long)total,
                     (long long)(2 * total));
        goto fail;
    }
    int64_t n, nk = 0;
    Py_BEGIN_ALLOW_THREADS
    n = wv_plan(tokens->buf, count(tokens), starts->buf, lengths->buf, ns, keep->buf, vocab,
                window, seed, row_of->buf, in_rows->buf, out_rows->buf, windows->buf, ends->buf,
                keys->buf, &nk);
    Py_END_ALLOW_THREADS
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "%s: sentence %lld lies outside tokens or holds a word "
                     "outside [0, len(keep))", fn, (long long)(-1 - n));
        goto fail;
    }
    release_views(&vs);
    return Py_BuildValue("(LL)", (long long)n, (long long)nk);
fail:
    release_views(&vs);
    return NULL;
}

static PyObject *py_wv_merge_pool(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "wv_merge_pool";
    static char *kwlist[] = {"keys", "drawn", "row_of", "pool", "extra_keys", "extra_first",
                             "drawn_values", "extra_values", NULL};
    PyObject *o[8] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO|OO", kwlist, &o[0], &o[1], &o[2],
                                     &o[3], &o[4], &o[5], &o[6], &o[7]))
        return NULL;
    if ((o[6] == NULL || o[6] == Py_None) != (o[7] == NULL || o[7] == Py_None))
        return PyErr_Format(PyExc_TypeError, "%s: drawn_values and extra_values go together",
                            fn);
    const int copy = o[6] != NULL && o[6] != Py_None;
    views_t vs = {.n = 0};
    Py_buffer *keys, *drawn, *row_of, *pool, *extra_keys, *extra_first, *drawn_values = NULL,
        *extra_values = NULL;
    if (!(keys = take(&vs, o[0], fn, "keys", I64, 0, 1)) ||
        !(drawn = take(&vs, o[1], fn, "drawn", I64, 0, 1)) ||
        (copy && !(drawn_values = take(&vs, o[6], fn, "drawn_values", F32, 0, 0))) ||
        !(row_of = take(&vs, o[2], fn, "row_of", I32, 1, 1)) ||
        !(pool = take(&vs, o[3], fn, "pool", I64, 1, 1)) ||
        !(extra_keys = take(&vs, o[4], fn, "extra_keys", I64, 1, 1)) ||
        !(extra_first = take(&vs, o[5], fn, "extra_first", I64, 1, 1)) ||
        (copy && !(extra_values = take(&vs, o[7], fn, "extra_values", F32, 1, 0))))
        goto fail;
    if (check_written(&vs, copy ? 3 : 2, fn) < 0) goto fail;
    const int64_t nk = count(keys), nd = count(drawn);
    if (count(pool) < nd || count(extra_keys) < nd || count(extra_first) < nd ||
        nk + nd > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: pool, extra_keys and extra_first need room for %lld "
                     "items", fn, (long long)nd);
        goto fail;
    }
    /* The drawn rows' width: drawn_values holds one row per drawn key. */
    const int64_t width = copy && nd ? count(drawn_values) / nd : 0;
    if (copy && (width * nd != count(drawn_values) || count(extra_values) < width * nd)) {
        PyErr_Format(PyExc_ValueError, "%s: drawn_values needs one row per drawn key (%lld, got "
                     "%lld floats) and extra_values room for as many rows", fn, (long long)nd,
                     (long long)count(drawn_values));
        goto fail;
    }
    int64_t ne;
    Py_BEGIN_ALLOW_THREADS
    ne = wv_merge_pool(keys->buf, nk, drawn->buf, nd, count(row_of), row_of->buf, pool->buf,
                       extra_keys->buf, extra_first->buf);
    if (ne > 0 && copy) { /* the extra keys' rows, in the batch's order of them */
        const float *from = drawn_values->buf;
        const int64_t *first = extra_first->buf;
        float *to = extra_values->buf;
        for (int64_t e = 0; e < ne; e++)
            memcpy(to + e * width, from + first[e] * width, (size_t)width * sizeof(float));
    }
    Py_END_ALLOW_THREADS
    if (ne < 0) {
        const int64_t bad = -1 - ne;
        if (bad < nd)
            PyErr_Format(PyExc_ValueError, "%s: drawn[%lld] is outside [0, len(row_of))", fn,
                         (long long)bad);
        else
            PyErr_Format(PyExc_ValueError, "%s: keys[%lld] is outside [0, len(row_of)) or "
                         "repeated", fn, (long long)(bad - nd));
        goto fail;
    }
    release_views(&vs);
    return PyLong_FromLongLong(ne);
fail:
    release_views(&vs);
    return NULL;
}

PyDoc_STRVAR(wv_plan_doc,
"wv_plan(tokens, starts, lengths, keep, window, seed, row_of, in_rows, out_rows, windows,\n"
"        ends, keys) -> (positions, num_keys)\n"
"\n"
"One batch's positions from the sentences tokens[starts[s] : starts[s] + lengths[s]] (int32\n"
"word ids < V = len(keep)): each token kept with probability keep[word] (float64;\n"
"subsampling, drawn from seed), each kept position's input row (key word) and output row (key\n"
"V + word) among keys (the batch's distinct keys in order of first use), a window uniform in\n"
"[1, window], and each sentence's exclusive end among the positions. row_of: int32 scratch of\n"
"2 * V items, all -1 (every call leaves it so). The GIL is released.");

PyDoc_STRVAR(wv_merge_pool_doc,
"wv_merge_pool(keys, drawn, row_of, pool, extra_keys, extra_first, drawn_values=None,\n"
"              extra_values=None) -> extras\n"
"\n"
"The rows of a drawn negative pool: a drawn key among keys (unique) gets its position there,\n"
"another one a new row len(keys) + e, where it is the e-th extra key (extra_keys[e], first drawn\n"
"at extra_first[e]). row_of: int32 scratch, all -1 (left so). With drawn_values (float32, one\n"
"row per drawn key) and extra_values (float32, room for as many rows), row e of extra_values\n"
"becomes row extra_first[e] of drawn_values for e < extras: the extra keys' values, copied in\n"
"the same call. The GIL is released.");

/* ---- tokenizer ------------------------------------------------------------------------------ */

static const char *VOCAB = "adapm._kernels.Vocab";

/* The capsule's vocabulary and a busy flag (one feed at a time: the GIL is released inside). */
typedef struct {
    wv_vocab_t *v;
    int busy;
} vocab_box_t;

static void vocab_destroy(PyObject *capsule) {
    vocab_box_t *box = PyCapsule_GetPointer(capsule, VOCAB);
    if (box) {
        wv_vocab_free(box->v);
        PyMem_Free(box);
    }
}

static vocab_box_t *vocab_of(PyObject *obj, const char *fn) {
    vocab_box_t *box = PyCapsule_GetPointer(obj, VOCAB);
    if (!box) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: vocab must come from vocab_new()", fn);
        return NULL;
    }
    if (box->busy) {
        PyErr_Format(PyExc_RuntimeError, "%s: the vocabulary is in use by another thread", fn);
        return NULL;
    }
    return box;
}

static PyObject *py_vocab_new(PyObject *module, PyObject *unused) {
    vocab_box_t *box = PyMem_Malloc(sizeof *box);
    if (!box) return PyErr_NoMemory();
    box->busy = 0;
    box->v = wv_vocab_new();
    if (!box->v) {
        PyMem_Free(box);
        return PyErr_NoMemory();
    }
    PyObject *capsule = PyCapsule_New(box, VOCAB, vocab_destroy);
    if (!capsule) {
        wv_vocab_free(box->v);
        PyMem_Free(box);
    }
    return capsule;
}

static PyObject *py_vocab_feed(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "vocab_feed";
    static char *kwlist[] = {"vocab", "text", "max_tokens", "ids", "ends", NULL};
    PyObject *ovocab, *otext, *oids, *oends;
    long long max_tokens;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOLOO", kwlist, &ovocab, &otext,
                                     &max_tokens, &oids, &oends))
        return NULL;
    vocab_box_t *box = vocab_of(ovocab, fn);
    if (!box) return NULL;
    if (max_tokens < 1)
        return PyErr_Format(PyExc_ValueError, "%s: max_tokens must be >= 1", fn);
    Py_buffer text;
    if (PyObject_GetBuffer(otext, &text, PyBUF_SIMPLE) < 0) return NULL;
    views_t vs = {.n = 0};
    Py_buffer *ids, *ends;
    if (!(ids = take(&vs, oids, fn, "ids", I32, 1, 1)) ||
        !(ends = take(&vs, oends, fn, "ends", I64, 1, 1)))
        goto fail;
    if (check_no_overlap(&vs, ids, fn, "ids") < 0 || check_no_overlap(&vs, ends, fn, "ends") < 0)
        goto fail;
    if (overlap(&text, ids) || overlap(&text, ends)) {
        PyErr_Format(PyExc_ValueError, "%s: text shares memory with ids or ends", fn);
        goto fail;
    }
    const int64_t n = text.len;
    const char *t = text.buf;
    int64_t lines = 0;
    for (int64_t i = 0; i < n; i++) lines += t[i] == '\n';
    if (count(ids) < n / 2 + 1 || count(ends) < lines + n / max_tokens + 1) {
        PyErr_Format(PyExc_ValueError, "%s: ids needs room for %lld entries and ends for %lld",
                     fn, (long long)(n / 2 + 1), (long long)(lines + n / max_tokens + 1));
        goto fail;
    }
    int64_t nid, nend;
    int rc;
    box->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = wv_vocab_feed(box->v, t, n, max_tokens, ids->buf, &nid, ends->buf, &nend);
    Py_END_ALLOW_THREADS
    box->busy = 0;
    if (rc < 0) {
        PyErr_NoMemory();
        goto fail;
    }
    release_views(&vs);
    PyBuffer_Release(&text);
    return Py_BuildValue("(LL)", (long long)nid, (long long)nend);
fail:
    release_views(&vs);
    PyBuffer_Release(&text);
    return NULL;
}

static PyObject *py_vocab_size(PyObject *module, PyObject *ovocab) {
    vocab_box_t *box = vocab_of(ovocab, "vocab_size");
    if (!box) return NULL;
    return Py_BuildValue("(LL)", (long long)wv_vocab_size(box->v),
                         (long long)wv_vocab_bytes(box->v));
}

static PyObject *py_vocab_export(PyObject *module, PyObject *args) {
    static const char *fn = "vocab_export";
    PyObject *ovocab, *obytes, *ooffsets, *ocounts;
    if (!PyArg_ParseTuple(args, "OOOO", &ovocab, &obytes, &ooffsets, &ocounts)) return NULL;
    vocab_box_t *box = vocab_of(ovocab, fn);
    if (!box) return NULL;
    Py_buffer bytes;
    if (PyObject_GetBuffer(obytes, &bytes, PyBUF_WRITABLE) < 0) return NULL;
    views_t vs = {.n = 0};
    Py_buffer *offsets, *counts;
    if (!(offsets = take(&vs, ooffsets, fn, "offsets", I64, 1, 1)) ||
        !(counts = take(&vs, ocounts, fn, "counts", I64, 1, 1)))
        goto fail;
    if (check_no_overlap(&vs, offsets, fn, "offsets") < 0 ||
        check_no_overlap(&vs, counts, fn, "counts") < 0)
        goto fail;
    if (overlap(&bytes, offsets) || overlap(&bytes, counts)) {
        PyErr_Format(PyExc_ValueError, "%s: bytes shares memory with offsets or counts", fn);
        goto fail;
    }
    const int64_t size = wv_vocab_size(box->v), nbytes = wv_vocab_bytes(box->v);
    if (bytes.len != nbytes || count(offsets) != size + 1 || count(counts) != size) {
        PyErr_Format(PyExc_ValueError, "%s: need %lld bytes, %lld offsets and %lld counts", fn,
                     (long long)nbytes, (long long)(size + 1), (long long)size);
        goto fail;
    }
    wv_vocab_export(box->v, bytes.buf, offsets->buf, counts->buf);
    release_views(&vs);
    PyBuffer_Release(&bytes);
    Py_RETURN_NONE;
fail:
    release_views(&vs);
    PyBuffer_Release(&bytes);
    return NULL;
}

PyDoc_STRVAR(wv_train_batch_doc,
"wv_train_batch(dim, values, updates, in_rows, out_rows, windows, sentence_ends, pool,\n"
"               negatives, lr, seed, sgd=False, width=2*dim) -> (loss_sum, pairs)\n"
"\n"
"Trains one batch of skip-gram with negative sampling in place, as word2vec does it, with\n"
"AdaGrad, or with word2vec's plain SGD when sgd (see native/kernels/wv.h for the exact order\n"
"of updates).\n"
"\n"
"values: float32, writable, rows of width floats: [vector | AdaGrad accumulator] (width >=\n"
"2*dim), or under sgd the vector alone (width >= dim; SGD has no accumulator). updates:\n"
"float32, the size of values, not overlapping it: receives values after minus values before\n"
"(exact where a value at most doubled or halved). in_rows, out_rows, windows: int64, one per position of the batch's words (the rows of\n"
"its input and output vectors, its reduced window >= 1). sentence_ends: int64, exclusive ends of\n"
"the sentences, ascending, the last one the number of positions. pool: int64 rows of output\n"
"vectors; each pair's negatives are drawn uniformly from it (seeded by seed). lr: the\n"
"learning rate (as float32). Returns the summed -log sigmoid(+-score) of every score and the\n"
"number of (word, context) pairs.\n"
"\n"
"Every index is checked before anything is written (TypeError for a dtype, ValueError for a\n"
"size or index; values and updates untouched then). Blocking; the GIL is released for the\n"
"whole computation. Thread-safe for calls on distinct buffers.");

PyDoc_STRVAR(vocab_new_doc,
"vocab_new() -> vocabulary\n\nAn empty vocabulary for vocab_feed (an opaque capsule).");

PyDoc_STRVAR(vocab_feed_doc,
"vocab_feed(vocab, text, max_tokens, ids, ends) -> (num_ids, num_ends)\n"
"\n"
"Tokenizes text (bytes-like, complete lines) on ASCII whitespace: each token's id (new tokens\n"
"get the next id, in order of appearance; every token is counted) goes to ids (int32, room for\n"
"len(text) // 2 + 1), and each sentence's exclusive end, counted in tokens from this call's\n"
"first, to ends (int64, room for the number of newlines + len(text) // max_tokens + 1). A line\n"
"is a sentence, cut every max_tokens tokens; empty lines make none. The GIL is released while\n"
"tokenizing; one call at a time per vocabulary (RuntimeError otherwise).");

PyDoc_STRVAR(vocab_size_doc,
"vocab_size(vocab) -> (tokens, total_bytes)\n\nDistinct tokens so far and their total bytes.");

PyDoc_STRVAR(vocab_export_doc,
"vocab_export(vocab, bytes, offsets, counts) -> None\n"
"\n"
"Copies the tokens in id order: their bytes back to back into bytes (writable, exactly\n"
"total_bytes), their start offsets into offsets (int64, tokens + 1 entries, the last\n"
"total_bytes) and their counts into counts (int64, tokens entries).");

PyMethodDef wv_methods[] = {
    {"wv_plan", (PyCFunction)(void (*)(void))py_wv_plan, METH_VARARGS | METH_KEYWORDS,
     wv_plan_doc},
    {"wv_merge_pool", (PyCFunction)(void (*)(void))py_wv_merge_pool,
     METH_VARARGS | METH_KEYWORDS, wv_merge_pool_doc},
    {"wv_train_batch", (PyCFunction)(void (*)(void))py_wv_train_batch,
     METH_VARARGS | METH_KEYWORDS, wv_train_batch_doc},
    {"vocab_new", py_vocab_new, METH_NOARGS, vocab_new_doc},
    {"vocab_feed", (PyCFunction)(void (*)(void))py_vocab_feed, METH_VARARGS | METH_KEYWORDS,
     vocab_feed_doc},
    {"vocab_size", py_vocab_size, METH_O, vocab_size_doc},
    {"vocab_export", py_vocab_export, METH_VARARGS, vocab_export_doc},
    {NULL, NULL, 0, NULL},
};
