/* The owner's fast paths inside ZmqIO.poll (zmq_io.h): a peer's pulls, pushes and sets of keys
 * owned here, and a peer's SYNC that the directory can answer (sync_fast.h), served without
 * Python: checks, store, the answer encoded and sent. */
#include "zmq_io.h"

#define FAST_MAX 32 /* requests per wire message the fast path takes at most */

/* --- the owner's fast path: a peer's pulls, pushes and sets of keys owned here ------------ */

typedef struct {
    int kind;
    int64_t req, nbytes; /* nbytes: the request's share of the wire (header and arrays) */
    carr_t a[3];
} fast_req_t;

/* The arrays of the message whose header is w into a[]: inline in the payload pl (plen bytes,
 * from *pat on) or in frames of their own (f[*own] on). Their bytes, or -1 if the framing is
 * not what the decoder wants. */
int64_t take_arrays(const wire_header_t *w, zmsg_t *f, int nf, const uint8_t *pl,
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
            if (*own >= nf || Z.msg_size(&f[*own]) != (size_t)bytes) return -1;
            a[i].p = Z.msg_data(&f[(*own)++]);
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

/* Parses the wire message in frames f[0..nf) (header, payload, own frames) into requests the
 * fast path may take: only pulls, pushes and sets sent by rank from its own workers (origin
 * rank, no hop, no extra fields), framed exactly as the decoder wants them. Returns their
 * number, or 0 if the message is not one for the fast path. */
static int fast_parse(zmsg_t *f, int nf, int rank, fast_req_t *out) {
    if (nf < 2) return 0;
    const uint8_t *h = Z.msg_data(&f[0]), *pl = Z.msg_data(&f[1]);
    const size_t hlen = Z.msg_size(&f[0]), plen = Z.msg_size(&f[1]);
    size_t at = 0, pat = 0;
    int own = 2, n = 0;
    while (at < hlen) {
        wire_header_t w;
        if (n == FAST_MAX || wire_header(h + at, hlen - at, &w) < 0) return 0;
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
 * size (header and arrays) in *req and *nbytes; 0 if the message is anything else. */
static int sync_parse(zmsg_t *f, int nf, int rank, carr_t *a, int64_t *req, int64_t *nbytes) {
    if (nf < 2) return 0;
    const uint8_t *h = Z.msg_data(&f[0]), *pl = Z.msg_data(&f[1]);
    const size_t hlen = Z.msg_size(&f[0]), plen = Z.msg_size(&f[1]);
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

static int grow_missing(ZmqIOObject *self, int64_t n) {
    if (n <= self->missing_cap) return 0;
    int64_t *grown = PyMem_RawRealloc(self->missing, (size_t)n * sizeof(int64_t));
    if (!grown) return -1;
    self->missing = grown;
    self->missing_cap = n;
    return 0;
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


/* try_fast: serves the ZeroMQ message in parts[first..end) here if it is a peer's pulls, pushes or sets
 * of keys all owned here (the Python path would serve it just so, _serve in serve.py): checks,
 * store, the answers (PULL_RESP, ACK) encoded and sent to the peer. 1 if served (the caller
 * closes the parts), 0 if Python is to take it. Without the GIL. Answers do not wait for moves
 * this node holds for the peer (NodeState._release): they report nothing about keys that move,
 * and every key they concern stays here. */
static int serve_fast(ZmqIOObject *self, Py_ssize_t first, Py_ssize_t end, int rank);

static int serve_sync(ZmqIOObject *self, Py_ssize_t first, Py_ssize_t end, int rank);

int try_fast(ZmqIOObject *self, Py_ssize_t first, Py_ssize_t end) {
    if (end - first < 3) return 0;
    const int rank = sender_of(self, &self->parts[first], &self->parts[end - 1]);
    if (rank < 0 || rank == self->rank || !self->peers[rank]) return 0;
    if (!self->passed[rank]
        && (pulls_take_answer(self, first, end, rank) || serve_fast(self, first, end, rank)
            || serve_sync(self, first, end, rank)))
        return 1;
    /* Python takes it, and every later message of this peer in this poll: they are handled
     * in the order they came (a worker's push before its next pull of the same key). */
    self->passed[rank] = 1;
    return 0;
}

/* Counts a wire message in (the parts first+1..end) and its answer out, both served here, as
 * `messages` requests of counter `served`. */
static void count_served(ZmqIOObject *self, Py_ssize_t first, Py_ssize_t end, int rank,
                         int64_t messages, int64_t out_bytes, int served) {
    int64_t wire_in = 0;
    for (Py_ssize_t i = first + 1; i < end; i++) wire_in += (int64_t)Z.msg_size(&self->parts[i]);
    self->counts[C_WIRE_IN]++;
    self->counts[C_MSGS_IN] += messages;
    self->counts[C_BYTES_IN] += wire_in;
    self->counts[C_WIRE_OUT]++;
    self->counts[C_MSGS_OUT] += messages;
    self->counts[C_BYTES_OUT] += out_bytes;
    self->counts[served] += messages;
    self->heard[rank] = 1;
}

/* Sends the two frames of an answer to rank (libzmq owns them either way). */
static void send_answer(ZmqIOObject *self, zmsg_t *hm, zmsg_t *pm, int rank) {
    if (Z.msg_send(hm, self->peers[rank], Z_SNDMORE) < 0) {
        self->send_failed = Z.errno_();
        Z.msg_close(hm);
        Z.msg_close(pm);
    } else if (Z.msg_send(pm, self->peers[rank], 0) < 0) {
        self->send_failed = Z.errno_();
        Z.msg_close(pm);
    }
}

static int serve_fast(ZmqIOObject *self, Py_ssize_t first, Py_ssize_t end, int rank) {
    fast_req_t q[FAST_MAX];
    const int n = fast_parse(&self->parts[first + 1], (int)(end - first - 1), rank, q);
    if (!n) return 0;
    size_t hsize = 0, psize = 0;
    int64_t floats[FAST_MAX], most = 0;
    for (int i = 0; i < n; i++) {
        if (directory_owns_request(self->directory, q[i].kind, q[i].a) != 1) return 0;
        const int64_t keys = q[i].a[0].n;
        most = keys > most ? keys : most;
        floats[i] = q[i].kind == WIRE_PULL ? directory_request_floats(self->directory, q[i].a) : 0;
        hsize += WIRE_HEADER_BYTES + 8 * (q[i].kind == WIRE_PULL ? 2 : 1);
        psize += padded(8 * (size_t)keys) + padded(4 * (size_t)floats[i]);
    }
    if (grow_missing(self, most) < 0) return 0;
    /* From here on the message is this path's: a push is applied at once. */
    zmsg_t hm, pm;
    if (Z.msg_init_size(&hm, hsize) < 0) return 0;
    if (Z.msg_init_size(&pm, psize) < 0) {
        Z.msg_close(&hm);
        return 0;
    }
    uint8_t *hp = Z.msg_data(&hm), *pp = Z.msg_data(&pm);
    for (int i = 0; i < n; i++) {
        const fast_req_t *r = &q[i];
        const int64_t keys = r->a[0].n, pos_bytes = 8 * keys;
        memcpy(pp, r->a[1].p, (size_t)pos_bytes); /* the positions, echoed */
        memset(pp + pos_bytes, 0, padded((size_t)pos_bytes) - (size_t)pos_bytes);
        uint8_t *values = pp + padded((size_t)pos_bytes);
        const int64_t nmiss = directory_serve_owned(self->directory, r->kind, r->a,
                                                    (float *)values, floats[i], self->missing);
        if (nmiss) self->send_failed = -1; /* cannot be: only this thread removes keys */
        int64_t lengths[2] = {pos_bytes, 4 * floats[i]};
        const int answer = r->kind == WIRE_PULL ? WIRE_PULL_RESP : WIRE_ACK;
        const int narr = answer == WIRE_PULL_RESP ? 2 : 1;
        if (narr == 2) {
            memset(values + lengths[1], 0, padded((size_t)lengths[1]) - (size_t)lengths[1]);
            pp = values + padded((size_t)lengths[1]);
        } else {
            pp = values;
        }
        put_header(hp, answer, narr, self->rank, r->req, -1, lengths);
        hp += WIRE_HEADER_BYTES + 8 * narr;
        const int64_t answer_bytes = WIRE_HEADER_BYTES + 8 * narr + lengths[0]
                                     + (narr == 2 ? lengths[1] : 0);
        const int k = r->kind == WIRE_PULL ? C_PULL_IN : r->kind == WIRE_PUSH ? C_PUSH_IN : C_SET_IN;
        self->counts[k]++;
        self->counts[k + 1] += r->nbytes;
        const int o = narr == 2 ? C_PULL_RESP_OUT : C_ACK_OUT;
        self->counts[o]++;
        self->counts[o + 1] += answer_bytes;
    }
    send_answer(self, &hm, &pm, rank);
    count_served(self, first, end, rank, n, (int64_t)(hsize + psize), C_SERVED);
    return 1;
}

/* serve_sync: serves the ZeroMQ message in parts[first..end) here if it is one SYNC of rank's
 * round that the directory can answer without Python (directory_sync_fast; the Python path,
 * NodeState._sync, would answer it just so): its SYNC_RESP, with the moves held for rank, is
 * encoded and sent; or one SYNC_RESP to a request of this node's round that the directory
 * takes in without Python (directory_answer_fast). 1 if served or taken or failed
 * (send_failed then says why), 0 if Python is to take it (nothing changed). Without the GIL. */
static int serve_sync(ZmqIOObject *self, Py_ssize_t first, Py_ssize_t end, int rank) {
    carr_t a[22];
    int64_t req, in_bytes;
    int narr = sync_parse(&self->parts[first + 1], (int)(end - first - 1), rank, a, &req,
                          &in_bytes);
    if (!narr) return 0;
    const char *fatal = "";
    if (narr < 0) { /* an answer to a request of this node's round (answer_fast.c) */
        const int got = directory_answer_fast(self->directory, rank, req, a, -narr, &fatal);
        if (got < 0) {
            self->send_failed = -2;
            self->fatal = fatal;
        } else if (got > 0) {
            self->synced = 1;
            self->counts[C_SYNC_RESP_IN]++;
            self->counts[C_SYNC_RESP_IN_BYTES] += in_bytes;
            self->counts[C_ANSWERS_NATIVE]++;
            int64_t wire_in = 0;
            for (Py_ssize_t i = first + 1; i < end; i++)
                wire_in += (int64_t)Z.msg_size(&self->parts[i]);
            self->counts[C_WIRE_IN]++;
            self->counts[C_MSGS_IN]++;
            self->counts[C_BYTES_IN] += wire_in;
            self->heard[rank] = 1;
        }
        return got != 0;
    }
    sync_fast_answer_t ans;
    const int got = directory_sync_fast(self->directory, rank, a, narr, &ans, &fatal);
    if (got <= 0) {
        if (got < 0) {
            self->send_failed = -2;
            self->fatal = fatal;
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
        psize += padded((size_t)lengths[i]);
    }
    const size_t hsize = WIRE_HEADER_BYTES + 8 * (size_t)ans.narrays;
    zmsg_t hm, pm;
    if (Z.msg_init_size(&hm, hsize) < 0) {
        self->send_failed = -2;
        self->fatal = "out of memory for the answer to a SYNC";
        return 1;
    }
    if (Z.msg_init_size(&pm, psize) < 0) {
        Z.msg_close(&hm);
        self->send_failed = -2;
        self->fatal = "out of memory for the answer to a SYNC";
        return 1;
    }
    put_header(Z.msg_data(&hm), WIRE_SYNC_RESP, ans.narrays, self->rank, req, -1, lengths);
    uint8_t *pp = Z.msg_data(&pm);
    for (int i = 0; i < ans.narrays; i++) {
        if (lengths[i]) memcpy(pp, ans.a[i].p, (size_t)lengths[i]);
        memset(pp + lengths[i], 0, padded((size_t)lengths[i]) - (size_t)lengths[i]);
        pp += padded((size_t)lengths[i]);
    }
    directory_sync_sent(self->directory, rank);
    send_answer(self, &hm, &pm, rank);
    self->synced = 1;
    self->counts[C_SYNC_IN]++;
    self->counts[C_SYNC_IN_BYTES] += in_bytes;
    self->counts[C_SYNC_RESP_OUT]++;
    self->counts[C_SYNC_RESP_OUT_BYTES] += (int64_t)hsize + arrays;
    count_served(self, first, end, rank, 1, (int64_t)(hsize + psize), C_SYNCS_SERVED);
    return 1;
}

