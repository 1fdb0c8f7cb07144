/* CPython binding of wv.c: the skip-gram batch trainer and the corpus tokenizer. Conventions
 * as module.c: every buffer checked while holding the GIL, one call into wv.c with the GIL
 * released, nothing written when a check fails, the buffers stay the caller's.
 */
#include "binding.h"
#include "wv.h"

static PyObject *py_wv_train_batch(PyObject *module, PyObject *args, PyObject *kwargs) {
    static const char *fn = "wv_train_batch";
    static char *kwlist[] = {"dim", "values", "updates", "in_rows", "out_rows", "windows",
                             "sentence_ends", "pool", "negatives", "lr", "seed", NULL};
    long long dim, negatives;
    double lr;
    PyObject *ovalues, *oupdates, *oin, *oout, *owin, *oends, *opool, *oseed;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LOOOOOOOLdO", kwlist, &dim, &ovalues,
                                     &oupdates, &oin, &oout, &owin, &oends, &opool, &negatives,
                                     &lr, &oseed))
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
    if (nvalues % (2 * dim)) {
        PyErr_Format(PyExc_ValueError, "%s: values has %lld floats, not a whole number of rows "
                     "of 2 * dim = %lld", fn, (long long)nvalues, 2 * dim);
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
        .values = values->buf,
        .updates = updates->buf,
        .num_rows = nvalues / (2 * dim),
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
        static const char *why[] = {"a row outside [0, len(values) / (2 * dim))",
                                    "a row outside [0, len(values) / (2 * dim))",
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
"               negatives, lr, seed) -> (loss_sum, pairs)\n"
"\n"
"Trains one batch of skip-gram with negative sampling in place, as word2vec does it, with\n"
"AdaGrad (see native/kernels/wv.h for the exact order of updates).\n"
"\n"
"values: float32, writable, rows of 2*dim floats ([vector | AdaGrad accumulator]). updates:\n"
"float32, the size of values, not overlapping it: receives values after minus values before\n"
"(exact where a value at most doubled or halved). in_rows, out_rows, windows: int64, one per position of the batch's words (the rows of\n"
"its input and output vectors, its reduced window >= 1). sentence_ends: int64, exclusive ends of\n"
"the sentences, ascending, the last one the number of positions. pool: int64 rows of output\n"
"vectors; each pair's negatives are drawn uniformly from it (seeded by seed). lr: the AdaGrad\n"
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
    {"wv_train_batch", (PyCFunction)(void (*)(void))py_wv_train_batch,
     METH_VARARGS | METH_KEYWORDS, wv_train_batch_doc},
    {"vocab_new", py_vocab_new, METH_NOARGS, vocab_new_doc},
    {"vocab_feed", (PyCFunction)(void (*)(void))py_vocab_feed, METH_VARARGS | METH_KEYWORDS,
     vocab_feed_doc},
    {"vocab_size", py_vocab_size, METH_O, vocab_size_doc},
    {"vocab_export", py_vocab_export, METH_VARARGS, vocab_export_doc},
    {NULL, NULL, 0, NULL},
};
