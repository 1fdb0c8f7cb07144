/* A received wire message served or taken in without Python, whatever carried it: a peer's
 * pulls, pushes and sets of keys owned here, a peer's SYNC the directory can answer
 * (sync_fast.h), an answer to this node's round request (answer_fast.c). The transports hand it
 * the message's frames and a sink for the answer: ZmqIO inside its poll (zmq_serve.c), the
 * in-process transport of the simulator through Directory.serve_wire (below), so that the
 * simulator's schedules run the C path production runs. Engine thread only (the directory's
 * and the store's engine-side calls), without the GIL. */
#ifndef ADAPM_SERVE_WIRE_H
#define ADAPM_SERVE_WIRE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "wire.h"

/* One frame of a wire message: the header frame, the payload frame, then the frames of the
 * arrays that travel on their own (wire_module.c). */
typedef struct {
    const uint8_t *p;
    size_t n;
} wframe_t;

/* Where an answer goes. open: room for an answer of a header frame of hsize bytes and a payload
 * frame of psize bytes (*h, *p; 0, or -1 out of memory: nothing to send), and with own (not
 * NULL) a third frame, own_bytes of a malloc'd buffer the sink takes over and frees (free())
 * whatever happens, so that a large array is not copied into the payload; an open answer is
 * always sent, to the peer whose message is served (send: 0, or an errno if the transport
 * refused it, which then owns and frees the frames all the same). */
typedef struct wsink {
    int (*open)(struct wsink *, size_t hsize, size_t psize, void *own, size_t own_bytes,
                uint8_t **h, uint8_t **p);
    int (*send)(struct wsink *);
} wsink_t;

/* Counters of what was served or taken in here, in the transport's names (adapm/_wire/
 * traffic.py), added to its own. */
enum {
    C_WIRE_IN, C_MSGS_IN, C_BYTES_IN, C_WIRE_OUT, C_MSGS_OUT, C_BYTES_OUT,
    C_PULL_IN, C_PULL_IN_BYTES, C_PUSH_IN, C_PUSH_IN_BYTES, C_SET_IN, C_SET_IN_BYTES,
    C_PULL_RESP_OUT, C_PULL_RESP_OUT_BYTES, C_ACK_OUT, C_ACK_OUT_BYTES, C_SERVED,
    C_SYNC_IN, C_SYNC_IN_BYTES, C_SYNC_RESP_OUT, C_SYNC_RESP_OUT_BYTES, C_SYNCS_SERVED,
    C_PULL_OUT, C_PULL_OUT_BYTES, C_PULL_RESP_IN, C_PULL_RESP_IN_BYTES, C_PULLS_NATIVE,
    C_SYNC_RESP_IN, C_SYNC_RESP_IN_BYTES, C_ANSWERS_NATIVE, C_PUSH_OUT, C_PUSH_OUT_BYTES,
    C_ACK_IN, C_ACK_IN_BYTES, C_PUSHES_NATIVE, C_PUSHES_HANDED, FAST_COUNTERS
};
extern const char *const counter_names[FAST_COUNTERS];

/* What serving needs besides the message: the node's Directory and rank, the counters, a
 * scratch for the store's calls (grown here; PyMem_Raw), and, after a call, what happened. */
typedef struct {
    PyObject *directory;
    int32_t rank;
    int64_t *counts;        /* FAST_COUNTERS */
    int64_t *missing;
    int64_t missing_cap;
    int failed;             /* 0; an errno of a refused answer; -1 owned keys vanished (cannot
                             * be); -2 a served SYNC or a taken answer failed: fatal says why */
    const char *fatal;
    int synced;             /* a SYNC was served, or an answer taken: NodeState has things to
                             * take up (Directory.native_taken) */
    int answered;           /* an answer to this node's round was taken that leaves none of
                             * its registered requests outstanding: the round can end */
} wserve_t;

/* Serves or takes in the wire message in frames f[0..nf) from rank (a peer, never this node):
 * 1 if done here (with its answer sent to sink), 0 if Python is to take it (nothing changed). */
int wire_serve(wserve_t *s, wsink_t *sink, int rank, const wframe_t *f, int nf);

/* The arrays of the message whose header is w into a[]: inline in the payload pl (plen bytes,
 * from *pat on) or in the frames f[*own..nf) of their own. Their bytes, or -1 if the framing is
 * not what the decoder wants. */
int64_t take_arrays(const wire_header_t *w, const wframe_t *f, int nf, const uint8_t *pl,
                    size_t plen, size_t *pat, int *own, carr_t *a);

/* Writes a wire header (wire.h) at p: no hops, no extra fields. */
void put_header(uint8_t *p, int kind, int narrays, int32_t src, int64_t req, int32_t origin,
                const int64_t *lengths);
static inline size_t padded(size_t bytes) { return bytes + (-bytes & 7); }

/* Directory.serve_wire(rank, frames, counts): see wire_serve; the binding for the in-process
 * transport (serve_wire.c; the method table in directory_module.c says more). */
PyObject *Directory_serve_wire(PyObject *self, PyObject *args);
/* Adds SERVE_WIRE_COUNTERS, the counters' names in order, to the module. */
int register_serve_wire(PyObject *module);

#endif
