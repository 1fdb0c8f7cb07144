/* The wire format's headers (adapm/_wire/protocol.py): encode and decode in one C call per wire
 * message, instead of a msgpack map, a dict and a Python loop over the arrays per logical message
 * (bench/engine.py: decode and encode were ~10% of the engine thread in a 2-node KGE run).
 *
 * Frame 0 holds one fixed binary header per logical message, back to back (little-endian):
 *
 *   u8 magic (0xB1)  u8 kind  u8 narrays  u8 flags (bit 0: extra fields follow)
 *   i32 src  i64 req_id  i32 origin (-1: none)  i32 hops
 *   i64 length[narrays]     bytes of each array; negative: the array has a frame of its own
 *   [u32 nextra, nextra bytes: a msgpack map of the rare kinds' extra fields (ERROR's text,
 *    a collective's epoch and kind, FAILED's rank); packed and unpacked in Python]
 *
 * Frame 1 holds the small arrays back to back, each at a multiple of 8 bytes; every array of at
 * least OWN_FRAME_BYTES has a frame of its own after it, sent without copying. A carrier other
 * than MOVES whose moves are all empty leaves them out (narrays is 12 less); the decoder fills
 * in the shared empty arrays that protocol.NO_MOVES holds.
 *
 * The decoder checks the framing only (magic, known kind, the kind's number of arrays, lengths
 * that are whole numbers of items and fit their frames, every frame used exactly once); what the
 * contents mean to the node is checked later (check.c, validate.py). */
#include "check.h"
#include "module.h"
#include "wire.h"

#define MAGIC WIRE_MAGIC
#define HEADER_BYTES WIRE_HEADER_BYTES
#define MOVE_ARRAYS 12
#define OWN_FRAME_BYTES WIRE_OWN_FRAME_BYTES
#define MAX_ARRAYS WIRE_MAX_ARRAYS

/* Set once by wire_setup (protocol.py, at import): numpy.frombuffer, a dtype per role letter,
 * and the shared empty arrays of protocol.NO_MOVES and of each role. */
static PyObject *frombuffer, *kwnames, *dtypes[128], *empties[128], *no_moves;

static int known_kind(int kind) {
    switch (kind) {
    case 1: case 2: case 3: case 4: case 10: case 11: case 12: case 13: case 14: case 20:
    case 30: case 31: case 32: case 33: case 34: case 40: case 41: case 42:
        return 1;
    default:
        return 0;
    }
}

static int is_carrier(int kind) { return kind == WIRE_SYNC || kind == WIRE_SYNC_RESP; }

static inline void put32(uint8_t *p, int32_t v) { memcpy(p, &v, 4); }
static inline void put64(uint8_t *p, int64_t v) { memcpy(p, &v, 8); }

/* wire_setup(frombuffer, dtypes: {letter: dtype}, no_moves: tuple of 12 arrays) -> None */
static PyObject *wire_setup(PyObject *module, PyObject *args) {
    PyObject *fb, *dts, *nm;
    if (!PyArg_ParseTuple(args, "OO!O!", &fb, &PyDict_Type, &dts, &PyTuple_Type, &nm)) return NULL;
    if (PyTuple_GET_SIZE(nm) != MOVE_ARRAYS) {
        PyErr_SetString(PyExc_ValueError, "wire_setup: no_moves must hold 12 arrays");
        return NULL;
    }
    PyObject *key, *value;
    Py_ssize_t at = 0;
    while (PyDict_Next(dts, &at, &key, &value)) {
        const char *letter = PyUnicode_AsUTF8(key);
        if (!letter) return NULL;
        const unsigned char c = (unsigned char)letter[0];
        if (c >= 128) continue;
        Py_XSETREF(dtypes[c], Py_NewRef(value));
        PyObject *empty = PyObject_CallFunction(fb, "yO", "", value);
        if (!empty) return NULL;
        Py_XSETREF(empties[c], empty);
    }
    Py_XSETREF(frombuffer, Py_NewRef(fb));
    Py_XSETREF(no_moves, Py_NewRef(nm));
    if (!kwnames && !(kwnames = Py_BuildValue("(sss)", "dtype", "count", "offset"))) return NULL;
    Py_RETURN_NONE;
}

/* A numpy view of count items of role at byte offset of buf (read-only if buf is). */
static PyObject *view_of(PyObject *buf, char role, int64_t count, int64_t offset) {
    if (!count) return Py_NewRef(empties[(unsigned char)role]);
    PyObject *c = PyLong_FromLongLong(count), *o = PyLong_FromLongLong(offset);
    if (!c || !o) {
        Py_XDECREF(c);
        Py_XDECREF(o);
        return NULL;
    }
    PyObject *argv[4] = {buf, dtypes[(unsigned char)role], c, o};
    PyObject *r = PyObject_Vectorcall(frombuffer, argv, 1, kwnames);
    Py_DECREF(c);
    Py_DECREF(o);
    return r;
}

PyObject *wire_view(PyObject *buf, char role, int64_t count, int64_t offset) {
    if (!frombuffer) {
        PyErr_SetString(PyExc_RuntimeError, "wire_view: wire_setup has not run");
        return NULL;
    }
    return view_of(buf, role, count, offset);
}

static PyObject *malformed(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    PyObject *text = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (!text) return NULL;
    PyObject *r = Py_BuildValue("(OO)", Py_None, text);
    Py_DECREF(text);
    return r;
}

/* wire_decode(buffers) -> (messages, None) or (None, why). buffers: the frames' buffers (bytes
 * or memoryview). Each message: (kind, src, req_id, origin, hops, arrays, nbytes, extra or
 * None). The arrays are read-only numpy views of the frames. */
static PyObject *wire_decode(PyObject *module, PyObject *arg) {
    if (!frombuffer) {
        PyErr_SetString(PyExc_RuntimeError, "wire_decode: wire_setup was not called");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(arg, "wire_decode: a sequence of buffers");
    if (!seq) return NULL;
    const Py_ssize_t nframes = PySequence_Fast_GET_SIZE(seq);
    PyObject **frames = PySequence_Fast_ITEMS(seq);
    PyObject *out = NULL, *result = NULL;
    Py_buffer hv = {0}, pv = {0};
    int held = 0;
    if (nframes < 2) {
        result = malformed("%zd frames, expected at least 2", nframes);
        goto done;
    }
    if (PyObject_GetBuffer(frames[0], &hv, PyBUF_SIMPLE) < 0) goto done;
    held = 1;
    if (PyObject_GetBuffer(frames[1], &pv, PyBUF_SIMPLE) < 0) goto done;
    held = 2;
    if (!(out = PyList_New(0))) goto done;
    const uint8_t *h = hv.buf;
    const Py_ssize_t hlen = hv.len, plen = pv.len;
    Py_ssize_t at = 0, own = 2;
    int64_t payload_at = 0;
    while (at < hlen) {
        const uint8_t *p = h + at;
        wire_header_t w;
        if (wire_header(p, (size_t)(hlen - at), &w) < 0) {
            result = malformed("a header at byte %zd is cut short, not one, or has unknown "
                               "flags", at);
            goto done;
        }
        const int kind = w.kind, narrays = w.narrays;
        if (!known_kind(kind)) {
            result = malformed("unknown kind %d", kind);
            goto done;
        }
        const char *roles = wire_roles(kind);
        const int count = wire_count(kind);
        const int left_out = is_carrier(kind) && narrays == count - MOVE_ARRAYS;
        if (narrays != count && !left_out) {
            result = malformed("kind %d carries %d arrays, expected %d", kind, narrays, count);
            goto done;
        }
        const Py_ssize_t size = (Py_ssize_t)w.size;
        PyObject *extra = NULL;
        if (w.extra && !(extra = PyBytes_FromStringAndSize((const char *)w.extra, w.nextra)))
            goto done;
        int64_t nbytes = size;
        PyObject *arrays = PyList_New(0);
        if (!arrays) {
            Py_XDECREF(extra);
            goto done;
        }
        const char *r = roles;
        for (int i = 0; i < narrays; i++, r++) {
            while (*r == '|') r++;
            const int64_t n = wire_get64(w.lengths + 8 * i), item = wire_itemsize(*r);
            const int64_t bytes = n == INT64_MIN ? 1 : n < 0 ? -n : n; /* INT64_MIN: refused */
            PyObject *view = NULL;
            if (n == INT64_MIN || bytes % item) {
                Py_DECREF(arrays);
                Py_XDECREF(extra);
                result = malformed("kind %d: array %d of %lld bytes is no whole number of "
                                   "%lld-byte items", kind, i, (long long)n, (long long)item);
                goto done;
            }
            if (n < 0) {
                if (own >= nframes) {
                    Py_DECREF(arrays);
                    Py_XDECREF(extra);
                    result = malformed("%zd frames, the headers describe more", nframes);
                    goto done;
                }
                Py_buffer fv;
                if (PyObject_GetBuffer(frames[own], &fv, PyBUF_SIMPLE) < 0) {
                    Py_DECREF(arrays);
                    Py_XDECREF(extra);
                    goto done;
                }
                const Py_ssize_t flen = fv.len;
                PyBuffer_Release(&fv);
                if (flen != bytes) {
                    Py_DECREF(arrays);
                    Py_XDECREF(extra);
                    result = malformed("frame %zd has %zd bytes, its header says %lld", own,
                                       flen, (long long)bytes);
                    goto done;
                }
                view = view_of(frames[own], *r, bytes / item, 0);
                own++;
            } else {
                if (bytes > plen - payload_at) {
                    Py_DECREF(arrays);
                    Py_XDECREF(extra);
                    result = malformed("the arrays overrun the payload frame of %zd bytes", plen);
                    goto done;
                }
                view = view_of(frames[1], *r, bytes / item, payload_at);
                payload_at += bytes + (bytes ? (-bytes & 7) : 0);
            }
            nbytes += bytes;
            if (!view || PyList_Append(arrays, view) < 0) {
                Py_XDECREF(view);
                Py_DECREF(arrays);
                Py_XDECREF(extra);
                goto done;
            }
            Py_DECREF(view);
        }
        if (left_out)
            for (int i = 0; i < MOVE_ARRAYS; i++)
                if (PyList_Append(arrays, PyTuple_GET_ITEM(no_moves, i)) < 0) {
                    Py_DECREF(arrays);
                    Py_XDECREF(extra);
                    goto done;
                }
        PyObject *msg = Py_BuildValue("(iiLiiNLN)", kind, (int)w.src, (long long)w.req,
                                      (int)w.origin, (int)w.hops, arrays, (long long)nbytes,
                                      extra ? extra : Py_NewRef(Py_None));
        if (!msg || PyList_Append(out, msg) < 0) {
            Py_XDECREF(msg);
            goto done;
        }
        Py_DECREF(msg);
        at += size;
    }
    if (own != nframes) {
        result = malformed("%zd frames, the headers describe %zd", nframes, own);
        goto done;
    }
    result = Py_BuildValue("(OO)", out, Py_None);
done:
    if (held >= 1) PyBuffer_Release(&hv);
    if (held >= 2) PyBuffer_Release(&pv);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return result;
}

/* wire_encode(messages) -> (frames, nbytes). messages: (kind, src, req_id, origin, hops, extra
 * (bytes or None), arrays) each. frames: [headers (bytes), payload (bytes), *own-frame arrays];
 * nbytes: each message's share of the wire (header and arrays), for the byte counters. */
static PyObject *wire_encode(PyObject *module, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "wire_encode: a sequence of messages");
    if (!seq) return NULL;
    const Py_ssize_t nmsg = PySequence_Fast_GET_SIZE(seq);
    PyObject **msgs = PySequence_Fast_ITEMS(seq);
    PyObject *frames = NULL, *sizes = NULL, *headers = NULL, *payload = NULL, *result = NULL;
    Py_buffer *views = NULL;
    int *count = NULL; /* arrays per message, after leaving out empty moves */
    Py_ssize_t nviews = 0, total_arrays = 0;
    /* Pass 1: borrow every array, size the frames. */
    for (Py_ssize_t m = 0; m < nmsg; m++) {
        PyObject *t = msgs[m];
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 7 || !PyList_Check(PyTuple_GET_ITEM(t, 6))) {
            PyErr_SetString(PyExc_TypeError, "wire_encode: (kind, src, req_id, origin, hops, "
                                             "extra, arrays) per message");
            goto done;
        }
        total_arrays += PyList_GET_SIZE(PyTuple_GET_ITEM(t, 6));
    }
    if (!(views = PyMem_Calloc((size_t)(total_arrays ? total_arrays : 1), sizeof(Py_buffer)))
        || !(count = PyMem_Calloc((size_t)(nmsg ? nmsg : 1), sizeof(int)))) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t header_bytes = 0, payload_bytes = 0;
    for (Py_ssize_t m = 0; m < nmsg; m++) {
        PyObject *t = msgs[m];
        const long kind = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        if (kind == -1 && PyErr_Occurred()) goto done;
        PyObject *arrays = PyTuple_GET_ITEM(t, 6), *extra = PyTuple_GET_ITEM(t, 5);
        const Py_ssize_t n = PyList_GET_SIZE(arrays);
        if (!known_kind((int)kind) || n != wire_count((int)kind) || n > MAX_ARRAYS) {
            PyErr_Format(PyExc_ValueError, "wire_encode: kind %ld with %zd arrays", kind, n);
            goto done;
        }
        if (extra != Py_None && !PyBytes_Check(extra)) {
            PyErr_SetString(PyExc_TypeError, "wire_encode: extra must be bytes or None");
            goto done;
        }
        const Py_ssize_t first = nviews;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (PyObject_GetBuffer(PyList_GET_ITEM(arrays, i), &views[nviews], PyBUF_C_CONTIGUOUS) < 0)
                goto done;
            nviews++;
        }
        int c = (int)n;
        if (is_carrier((int)kind)) {
            int empty = 1;
            for (Py_ssize_t i = n - MOVE_ARRAYS; i < n; i++) empty &= views[first + i].len == 0;
            if (empty) c -= MOVE_ARRAYS;
        }
        count[m] = c;
        header_bytes += HEADER_BYTES + 8 * c + (extra != Py_None ? 4 + PyBytes_GET_SIZE(extra) : 0);
        for (int i = 0; i < c; i++) {
            const Py_ssize_t len = views[first + i].len;
            if (len && len < OWN_FRAME_BYTES) payload_bytes += len + (-len & 7);
        }
    }
    if (!(headers = PyBytes_FromStringAndSize(NULL, header_bytes))
        || !(payload = PyBytes_FromStringAndSize(NULL, payload_bytes))
        || !(frames = PyList_New(0)) || !(sizes = PyList_New(nmsg)))
        goto done;
    if (PyList_Append(frames, headers) < 0 || PyList_Append(frames, payload) < 0) goto done;
    /* Pass 2: write. */
    uint8_t *h = (uint8_t *)PyBytes_AS_STRING(headers), *pl = (uint8_t *)PyBytes_AS_STRING(payload);
    Py_ssize_t v = 0;
    for (Py_ssize_t m = 0; m < nmsg; m++) {
        PyObject *t = msgs[m], *arrays = PyTuple_GET_ITEM(t, 6), *extra = PyTuple_GET_ITEM(t, 5);
        const long long src = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 1)),
                        req = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2)),
                        origin = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 3)),
                        hops = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 4));
        if (PyErr_Occurred()) goto done;
        if (src < INT32_MIN || src > INT32_MAX || origin < INT32_MIN || origin > INT32_MAX
            || hops < INT32_MIN || hops > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "wire_encode: rank or hop count out of range");
            goto done;
        }
        const int c = count[m];
        h[0] = MAGIC;
        h[1] = (uint8_t)PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        h[2] = (uint8_t)c;
        h[3] = extra != Py_None;
        put32(h + 4, (int32_t)src);
        put64(h + 8, req);
        put32(h + 16, (int32_t)origin);
        put32(h + 20, (int32_t)hops);
        int64_t nbytes = HEADER_BYTES + 8 * c;
        for (int i = 0; i < c; i++) {
            const Py_buffer *b = &views[v + i];
            const Py_ssize_t len = b->len;
            nbytes += len;
            if (len >= OWN_FRAME_BYTES) {
                put64(h + HEADER_BYTES + 8 * i, -(int64_t)len);
                if (PyList_Append(frames, PyList_GET_ITEM(arrays, i)) < 0) goto done;
                continue;
            }
            put64(h + HEADER_BYTES + 8 * i, len);
            if (!len) continue;
            memcpy(pl, b->buf, (size_t)len);
            pl += len;
            const Py_ssize_t pad = -len & 7;
            memset(pl, 0, (size_t)pad);
            pl += pad;
        }
        v += PyList_GET_SIZE(arrays);
        h += HEADER_BYTES + 8 * c;
        if (extra != Py_None) {
            const uint32_t ne = (uint32_t)PyBytes_GET_SIZE(extra);
            memcpy(h, &ne, 4);
            memcpy(h + 4, PyBytes_AS_STRING(extra), ne);
            h += 4 + ne;
            nbytes += 4 + ne;
        }
        PyObject *size = PyLong_FromLongLong(nbytes);
        if (!size) goto done;
        PyList_SET_ITEM(sizes, m, size);
    }
    result = Py_BuildValue("(OO)", frames, sizes);
done:
    for (Py_ssize_t i = 0; i < nviews; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(count);
    Py_XDECREF(headers);
    Py_XDECREF(payload);
    Py_XDECREF(frames);
    Py_XDECREF(sizes);
    Py_DECREF(seq);
    return result;
}

/* wire_roles(kind) -> str or None (check.h): for the test that protocol.SCHEMA agrees */
static PyObject *wire_roles_py(PyObject *module, PyObject *arg) {
    const long kind = PyLong_AsLong(arg);
    if (kind == -1 && PyErr_Occurred()) return NULL;
    const char *roles = wire_roles((int)kind);
    if (!roles) Py_RETURN_NONE;
    return PyUnicode_FromString(roles);
}

static PyMethodDef wire_methods[] = {
    {"wire_setup", wire_setup, METH_VARARGS,
     "wire_setup(frombuffer, dtypes, no_moves) -> None. numpy.frombuffer, {role letter: dtype} "
     "and protocol.NO_MOVES, for the decoder's arrays (protocol.py calls it at import)."},
    {"wire_decode", wire_decode, METH_O,
     "wire_decode(buffers) -> (messages, None) or (None, why). One wire message's frames "
     "parsed (see native/wire_module.c): per logical message (kind, src, req_id, origin, hops, "
     "arrays, nbytes, extra msgpack bytes or None); the arrays are numpy views of the frames."},
    {"wire_encode", wire_encode, METH_O,
     "wire_encode(messages) -> (frames, nbytes). messages: (kind, src, req_id, origin, hops, "
     "extra, arrays) each, sent in order as one wire message; arrays of at least 64 KiB are "
     "frames of their own (the array objects, for a send without copying)."},
    {"wire_roles", wire_roles_py, METH_O,
     "wire_roles(kind) -> str or None. The arrays of a message kind as native/check.c reads "
     "them: a letter per array (k keys, p positions, v versions, n ranks, c counts, r rows, "
     "f flags, m masks), '|' after each section."},
    {NULL, NULL, 0, NULL},
};

PyObject *wire_decode_list(PyObject *buffers) { return wire_decode(NULL, buffers); }
PyObject *wire_encode_list(PyObject *specs) { return wire_encode(NULL, specs); }

int register_wire_functions(PyObject *module) { return PyModule_AddFunctions(module, wire_methods); }
