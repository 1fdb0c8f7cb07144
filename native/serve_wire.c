/* A received wire message served or taken in without Python (serve_wire.h): the parsing, the
 * checks and the answers of the owner's fast paths, over plain frames and an answer sink, and
 * the binding that lets the in-process transport use them (Directory.serve_wire). */
#include "serve_wire.h"

#include "directory_object.h"

/* Requests of one wire message whose parse fits on the stack; a larger bundle (a worker's
 * burst of small pushes while the engine was busy: 5,000 one-key pushes came in bundles of up
 * to ~100) takes heap room of one entry per header the header frame can hold. Before, bundles
 * of more than 32 went to Python, 30-60 us a request. */
#define FAST_STACK 32
#define FRAMES_MAX 128 /* frames of a wire message Directory.serve_wire looks at */

const char *const counter_names[FAST_COUNTERS] = {
    "wire_messages_received", "messages_received", "bytes_received", "wire_messages_sent",
    "messages_sent", "bytes_sent", "messages_received_pull", "bytes_received_pull",
    "messages_received_push", "bytes_received_push", "messages_received_set",
    "bytes_received_set", "messages_sent_pull_resp", "bytes_sent_pull_resp",
    "messages_sent_ack", "bytes_sent_ack", "messages_served_natively",
    "messages_received_sync", "bytes_received_sync", "messages_sent_sync_resp",
    "bytes_sent_sync_resp", "syncs_served_natively", "messages_sent_pull", "bytes_sent_pull",
    "messages_received_pull_resp", "bytes_received_pull_resp", "pulls_sent_natively",
    "messages_received_sync_resp", "bytes_received_sync_resp", "answers_taken_natively",
    "messages_sent_push", "bytes_sent_push", "messages_received_ack", "bytes_received_ack",
    "pushes_sent_natively", "pushes_handed_to_engine",
};

typedef struct {
    int kind;
    int64_t req, nbytes; /* nbytes: the request's share of the wire (header and arrays) */
    carr_t a[3];
} fast_req_t;

int64_t take_arrays(const wire_header_t *w, const wframe_t *f, int nf, const uint8_t *pl,
                    size_t plen, size_t *pat, int *own, carr_t *a) {
    const char *role = wire_roles(w->kind);
    int64_t total = 0;
    for (int i = 0; i < w->narrays; i++, role++) {
        if (*role == '|') role++;
        const int64_t len = wire_get64(w->lengths + 8 * i), item = wire_itemsize(*role);
        if (len == INT64_MIN) return -1;
        const int64_t bytes = len < 0 ? -len : len;
        if (bytes % item) return -1;
        if (len < 0) {
            if (*own >= nf || f[*own].n != (size_t)bytes) return -1;
            a[i].p = f[(*own)++].p;
        } else {
            if ((size_t)bytes > plen - *pat) return -1;
            a[i].p = pl + *pat;
            *pat += (size_t)bytes + (bytes ? (size_t)(-bytes & 7) : 0);
            if (*pat > plen) *pat = plen;
        }
        a[i].n = bytes / item;
        total += bytes;
    }
    return total;
}

void put_header(uint8_t *p, int kind, int narrays, int32_t src, int64_t req, int32_t origin,
                const int64_t *lengths) {
    p[0] = WIRE_MAGIC;
    p[1] = (uint8_t)kind;
    p[2] = (uint8_t)narrays;
    p[3] = 0;
    const int32_t hops = 0;
    memcpy(p + 4, &src, 4);
    memcpy(p + 8, &req, 8);
    memcpy(p + 16, &origin, 4);
    memcpy(p + 20, &hops, 4);
    memcpy(p + WIRE_HEADER_BYTES, lengths, 8 * (size_t)narrays);
}

/* Parses the wire message in frames f[0..nf) (header, payload, own frames) into requests the
 * fast path may take: only pulls, pushes and sets sent by rank from its own workers (origin
 * rank, no hop, no extra fields), framed exactly as the decoder wants them. Returns their
 * number (at most cap), or 0 if the message is not one for the fast path. */
static int64_t fast_parse(const wframe_t *f, int nf, int rank, fast_req_t *out, int64_t cap) {
    if (nf < 2) return 0;
    const uint8_t *h = f[0].p, *pl = f[1].p;
    const size_t hlen = f[0].n, plen = f[1].n;
    size_t at = 0, pat = 0;
    int own = 2;
    int64_t n = 0;
    while (at < hlen) {
        wire_header_t w;
        if (n == cap || wire_header(h + at, hlen - at, &w) < 0) return 0;
        if ((w.kind != WIRE_PULL && w.kind != WIRE_PUSH && w.kind != WIRE_SET) || w.extra
            || w.narrays != wire_count(w.kind) || w.src != rank || w.origin != rank || w.hops
            || w.req < 0)
            return 0;
        fast_req_t *q = &out[n++];
        q->kind = w.kind;
        q->req = w.req;
        const int64_t bytes = take_arrays(&w, f, nf, pl, plen, &pat, &own, q->a);
        if (bytes < 0) return 0;
        q->nbytes = (int64_t)w.size + bytes;
        at += w.size;
    }
    return own == nf ? n : 0;
}

/* A wire message of one SYNC from rank's own round (origin rank, no hop, no extra fields):
 * its arrays into a (10, or 22 with moves), their number returned with its request id and
 * size (header and arrays) in *req and *nbytes; minus the number for a SYNC_RESP (8, or 20
 * with moves); 0 if the message is anything else. */
static int sync_parse(const wframe_t *f, int nf, int rank, carr_t *a, int64_t *req,
                      int64_t *nbytes) {
    if (nf < 2) return 0;
    const uint8_t *h = f[0].p, *pl = f[1].p;
    const size_t hlen = f[0].n, plen = f[1].n;
    wire_header_t w;
    if (wire_header(h, hlen, &w) < 0 || w.size != hlen || w.extra || w.src != rank || w.hops
        || w.req < 0)
        return 0;
    /* A peer's own SYNC (its moves included), or a SYNC_RESP (with or without moves). */
    if (w.kind == WIRE_SYNC ? (w.narrays != 10 && w.narrays != 22) || w.origin != rank
                            : w.kind != WIRE_SYNC_RESP || (w.narrays != 8 && w.narrays != 20))
        return 0;
    size_t pat = 0;
    int own = 2;
    const int64_t bytes = take_arrays(&w, f, nf, pl, plen, &pat, &own, a);
    if (bytes < 0 || own != nf) return 0;
    *req = w.req;
    *nbytes = (int64_t)w.size + bytes;
    return w.kind == WIRE_SYNC ? w.narrays : -w.narrays;
}

static int grow_missing(wserve_t *s, int64_t n) {
    if (n <= s->missing_cap) return 0;
    int64_t *grown = PyMem_RawRealloc(s->missing, (size_t)n * sizeof(int64_t));
    if (!grown) return -1;
    s->missing = grown;
    s->missing_cap = n;
    return 0;
}

static int64_t wire_size(const wframe_t *f, int nf) {
    int64_t n = 0;
    for (int i = 0; i < nf; i++) n += (int64_t)f[i].n;
    return n;
}

/* Counts a wire message in (frames f) and its answer out, both served here, as `messages`
 * requests of counter `served`. */
static void count_served(wserve_t *s, const wframe_t *f, int nf, int64_t messages,
                         int64_t out_bytes, int served) {
    int64_t *c = s->counts;
    c[C_WIRE_IN]++;
    c[C_MSGS_IN] += messages;
    c[C_BYTES_IN] += wire_size(f, nf);
    c[C_WIRE_OUT]++;
    c[C_MSGS_OUT] += messages;
    c[C_BYTES_OUT] += out_bytes;
    c[served] += messages;
}

/* serve_fast's work on the n requests parsed into q (floats: room for n counts). */
static int serve_parsed(wserve_t *s, wsink_t *sink, int rank, const wframe_t *f, int nf,
                        const fast_req_t *q, int64_t *floats, int64_t n) {
    if (!n) return 0;
    size_t hsize = 0, psize = 0;
    int64_t most = 0;
    for (int64_t i = 0; i < n; i++) {
        if (directory_owns_request(s->directory, q[i].kind, q[i].a) != 1) return 0;
        const int64_t keys = q[i].a[0].n;
        most = keys > most ? keys : most;
        floats[i] = q[i].kind == WIRE_PULL ? directory_request_floats(s->directory, q[i].a) : 0;
        hsize += WIRE_HEADER_BYTES + 8 * (q[i].kind == WIRE_PULL ? 2 : 1);
        psize += padded(8 * (size_t)keys) + padded(4 * (size_t)floats[i]);
    }
    uint8_t *hp, *pp;
    if (grow_missing(s, most) < 0 || sink->open(sink, hsize, psize, NULL, 0, &hp, &pp) < 0)
        return 0;
    /* From here on the message is this path's: a push is applied at once. */
    int64_t *c = s->counts;
    for (int64_t i = 0; i < n; i++) {
        const fast_req_t *r = &q[i];
        const int64_t keys = r->a[0].n, pos_bytes = 8 * keys;
        memcpy(pp, r->a[1].p, (size_t)pos_bytes); /* the positions, echoed */
        memset(pp + pos_bytes, 0, padded((size_t)pos_bytes) - (size_t)pos_bytes);
        uint8_t *values = pp + padded((size_t)pos_bytes);
        const int64_t nmiss = directory_serve_owned(s->directory, r->kind, r->a,
                                                    (float *)values, floats[i], s->missing);
        if (nmiss) s->failed = -1; /* cannot be: only this thread removes keys */
        int64_t lengths[2] = {pos_bytes, 4 * floats[i]};
        const int answer = r->kind == WIRE_PULL ? WIRE_PULL_RESP : WIRE_ACK;
        const int narr = answer == WIRE_PULL_RESP ? 2 : 1;
        if (narr == 2) {
            memset(values + lengths[1], 0, padded((size_t)lengths[1]) - (size_t)lengths[1]);
            pp = values + padded((size_t)lengths[1]);
        } else {
            pp = values;
        }
        put_header(hp, answer, narr, s->rank, r->req, -1, lengths);
        hp += WIRE_HEADER_BYTES + 8 * narr;
        const int64_t answer_bytes = WIRE_HEADER_BYTES + 8 * narr + lengths[0]
                                     + (narr == 2 ? lengths[1] : 0);
        const int k = r->kind == WIRE_PULL   ? C_PULL_IN
                      : r->kind == WIRE_PUSH ? C_PUSH_IN
                                             : C_SET_IN;
        c[k]++;
        c[k + 1] += r->nbytes;
        const int o = narr == 2 ? C_PULL_RESP_OUT : C_ACK_OUT;
        c[o]++;
        c[o + 1] += answer_bytes;
    }
    const int e = sink->send(sink);
    if (e) s->failed = e;
    count_served(s, f, nf, n, (int64_t)(hsize + psize), C_SERVED);
    return 1;
}

/* A peer's pulls, pushes and sets of keys all owned here (the Python path would serve them
 * just so, NodeState._serve): checks, store, the answers (PULL_RESP, ACK) in one message.
 * Answers do not wait for moves this node holds for the peer (Posting.release): they report
 * nothing about keys that move, and every key they concern stays here. */
static int serve_fast(wserve_t *s, wsink_t *sink, int rank, const wframe_t *f, int nf) {
    if (nf < 2) return 0;
    fast_req_t q_stack[FAST_STACK];
    int64_t floats_stack[FAST_STACK];
    fast_req_t *q = q_stack;
    int64_t *floats = floats_stack;
    /* Every request has a header of at least WIRE_HEADER_BYTES in the header frame. */
    const int64_t cap = (int64_t)(f[0].n / WIRE_HEADER_BYTES);
    if (cap > FAST_STACK) {
        q = PyMem_RawMalloc((size_t)cap * sizeof *q);
        floats = PyMem_RawMalloc((size_t)cap * sizeof *floats);
        if (!q || !floats) { /* Python takes it */
            PyMem_RawFree(q);
            PyMem_RawFree(floats);
            return 0;
        }
    }
    const int served = serve_parsed(s, sink, rank, f, nf, q, floats,
                                    fast_parse(f, nf, rank, q, cap));
    if (q != q_stack) {
        PyMem_RawFree(q);
        PyMem_RawFree(floats);
    }
    return served;
}

/* One SYNC of rank's round that the directory can answer without Python (directory_sync_fast;
 * the Python path, NodeState._sync, would answer it just so): its SYNC_RESP, with the moves
 * held for rank, encoded and sent; or one SYNC_RESP to a request of this node's round that the
 * directory takes in without Python (directory_answer_fast). 1 if served or taken or failed
 * (s->failed then says why), 0 if Python is to take it (nothing changed). */
static int serve_sync(wserve_t *s, wsink_t *sink, int rank, const wframe_t *f, int nf) {
    carr_t a[22];
    int64_t req, in_bytes;
    int narr = sync_parse(f, nf, rank, a, &req, &in_bytes);
    if (!narr) return 0;
    const char *fatal = "";
    int64_t *c = s->counts;
    if (narr < 0) { /* an answer to a request of this node's round (answer_fast.c) */
        const int got = directory_answer_fast(s->directory, rank, req, a, -narr, &fatal);
        if (got < 0) {
            s->failed = -2;
            s->fatal = fatal;
        } else if (got > 0) {
            /* Python's part of an answer is bookkeeping that can wait for the round's last
             * one (a poll that holds goes on waiting until then): at 4 nodes a round's three
             * answers woke the engine loop three times. */
            s->synced = 1;
            s->answered = s->answered || directory_round_answered(s->directory);
            c[C_SYNC_RESP_IN]++;
            c[C_SYNC_RESP_IN_BYTES] += in_bytes;
            c[C_ANSWERS_NATIVE]++;
            c[C_WIRE_IN]++;
            c[C_MSGS_IN]++;
            c[C_BYTES_IN] += wire_size(f, nf);
        }
        return got != 0;
    }
    sync_fast_answer_t ans = {.own = NULL};
    const int got = directory_sync_fast(s->directory, rank, a, narr, &ans, &fatal);
    if (got <= 0) {
        if (got < 0) {
            s->failed = -2;
            s->fatal = fatal;
        }
        return got < 0;
    }
    /* From here on the SYNC is served: its answer must go out. */
    const char *role = wire_roles(WIRE_SYNC_RESP);
    int64_t lengths[20], arrays = 0;
    size_t psize = 0;
    for (int i = 0; i < ans.narrays; i++, role++) {
        if (*role == '|') role++;
        lengths[i] = ans.a[i].n * wire_itemsize(*role);
        arrays += lengths[i];
        if (i == 3 && ans.own) lengths[i] = -lengths[i]; /* the values: a frame of their own */
        else psize += padded((size_t)lengths[i]);
    }
    const size_t hsize = WIRE_HEADER_BYTES + 8 * (size_t)ans.narrays;
    const size_t own_bytes = ans.own ? (size_t)-lengths[3] : 0;
    uint8_t *hp, *pp;
    if (sink->open(sink, hsize, psize, ans.own, own_bytes, &hp, &pp) < 0) {
        s->failed = -2;
        s->fatal = "out of memory for the answer to a SYNC";
        return 1;
    }
    put_header(hp, WIRE_SYNC_RESP, ans.narrays, s->rank, req, -1, lengths);
    for (int i = 0; i < ans.narrays; i++) {
        if (lengths[i] < 0) continue;
        if (lengths[i]) memcpy(pp, ans.a[i].p, (size_t)lengths[i]);
        memset(pp + lengths[i], 0, padded((size_t)lengths[i]) - (size_t)lengths[i]);
        pp += padded((size_t)lengths[i]);
    }
    directory_sync_sent(s->directory, rank);
    const int e = sink->send(sink);
    if (e) s->failed = e;
    s->synced = 1;
    c[C_SYNC_IN]++;
    c[C_SYNC_IN_BYTES] += in_bytes;
    c[C_SYNC_RESP_OUT]++;
    c[C_SYNC_RESP_OUT_BYTES] += (int64_t)hsize + arrays;
    count_served(s, f, nf, 1, (int64_t)(hsize + psize + own_bytes), C_SYNCS_SERVED);
    return 1;
}

int wire_serve(wserve_t *s, wsink_t *sink, int rank, const wframe_t *f, int nf) {
    return serve_fast(s, sink, rank, f, nf) || serve_sync(s, sink, rank, f, nf);
}

/* --- the in-process transport's binding -------------------------------------------------- */

/* An answer in two raw buffers (and the third the answer hands over, if any), made into bytes
 * after the call (the GIL is released in it). */
typedef struct {
    wsink_t sink;
    uint8_t *h, *p, *own;
    size_t hsize, psize, own_bytes;
    int sent;
} bytes_sink_t;

static int bytes_open(wsink_t *sink, size_t hsize, size_t psize, void *own, size_t own_bytes,
                      uint8_t **h, uint8_t **p) {
    bytes_sink_t *b = (bytes_sink_t *)sink;
    b->own = own; /* freed by the caller, as h and p */
    b->own_bytes = own_bytes;
    b->h = PyMem_RawMalloc(hsize ? hsize : 1);
    b->p = PyMem_RawMalloc(psize ? psize : 1);
    if (!b->h || !b->p) {
        PyMem_RawFree(b->h);
        PyMem_RawFree(b->p);
        b->h = b->p = NULL;
        return -1;
    }
    b->hsize = hsize;
    b->psize = psize;
    *h = b->h;
    *p = b->p;
    return 0;
}

static int bytes_send(wsink_t *sink) {
    ((bytes_sink_t *)sink)->sent = 1;
    return 0;
}


/* serve_wire(rank, frames, counts) -> None | list: see the method table (directory_module.c). */
PyObject *Directory_serve_wire(PyObject *self, PyObject *args) {
    int rank;
    PyObject *frames, *counts_obj;
    if (!PyArg_ParseTuple(args, "iO!O", &rank, &PyList_Type, &frames, &counts_obj)) return NULL;
    const int32_t me = (int32_t)((DirectoryObject *)self)->d.rank;
    if (rank < 0 || rank >= ((DirectoryObject *)self)->d.world_size || rank == me) {
        PyErr_Format(PyExc_ValueError, "serve_wire: rank %d is not a peer of rank %d", rank,
                     (int)me);
        return NULL;
    }
    Py_buffer counts;
    if (PyObject_GetBuffer(counts_obj, &counts, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)
        < 0)
        return NULL;
    if (counts.itemsize != 8 || !counts.format || !strchr("qlQL", counts.format[0])
        || counts.len != 8 * FAST_COUNTERS) {
        PyBuffer_Release(&counts);
        PyErr_Format(PyExc_ValueError, "serve_wire: counts must be %d writable int64",
                     FAST_COUNTERS);
        return NULL;
    }
    const Py_ssize_t nf = PyList_GET_SIZE(frames);
    if (nf > FRAMES_MAX) { /* no message the fast paths take has this many */
        PyBuffer_Release(&counts);
        Py_RETURN_NONE;
    }
    Py_buffer views[FRAMES_MAX];
    wframe_t f[FRAMES_MAX];
    Py_ssize_t got = 0;
    for (; got < nf; got++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(frames, got), &views[got], PyBUF_SIMPLE) < 0)
            break;
        f[got].p = views[got].buf;
        f[got].n = (size_t)views[got].len;
    }
    PyObject *out = NULL;
    if (got == nf) {
        wserve_t s = {.directory = self, .rank = me, .counts = counts.buf};
        bytes_sink_t sink = {.sink = {bytes_open, bytes_send}};
        int served;
        Py_BEGIN_ALLOW_THREADS
        served = wire_serve(&s, &sink.sink, rank, f, (int)nf);
        Py_END_ALLOW_THREADS
        PyMem_RawFree(s.missing);
        if (s.failed) {
            PyErr_Format(PyExc_RuntimeError, "serving a message of rank %d or taking an answer: %s",
                         rank, s.failed == -1 ? "owned keys vanished" : s.fatal ? s.fatal : "?");
        } else if (!served) {
            out = Py_NewRef(Py_None);
        } else if (!sink.sent) {
            out = PyList_New(0);
        } else if (!sink.own) {
            out = Py_BuildValue("[y#y#]", (const char *)sink.h, (Py_ssize_t)sink.hsize,
                                (const char *)sink.p, (Py_ssize_t)sink.psize);
        } else {
            out = Py_BuildValue("[y#y#y#]", (const char *)sink.h, (Py_ssize_t)sink.hsize,
                                (const char *)sink.p, (Py_ssize_t)sink.psize,
                                (const char *)sink.own, (Py_ssize_t)sink.own_bytes);
        }
        PyMem_RawFree(sink.h); /* copied into bytes, or not needed */
        PyMem_RawFree(sink.p);
        free(sink.own); /* malloc'd by the directory's scratch (growable.h) */
    }
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    PyBuffer_Release(&counts);
    return out;
}

int register_serve_wire(PyObject *module) {
    PyObject *names = PyTuple_New(FAST_COUNTERS);
    if (!names) return -1;
    for (int i = 0; i < FAST_COUNTERS; i++) {
        PyObject *name = PyUnicode_FromString(counter_names[i]);
        if (!name) {
            Py_DECREF(names);
            return -1;
        }
        PyTuple_SET_ITEM(names, i, name);
    }
    if (PyModule_AddObject(module, "SERVE_WIRE_COUNTERS", names) < 0) {
        Py_DECREF(names);
        return -1;
    }
    return 0;
}
