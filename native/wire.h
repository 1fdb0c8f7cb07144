/* The wire format's fixed header (see wire_module.c for the whole format): parsed here for the
 * decoder (wire_module.c) and for the transport's fast paths (zmq_serve.c, zmq_calls.c), which
 * read messages without making Python objects. */
#ifndef ADAPM_WIRE_H
#define ADAPM_WIRE_H

#include <stdint.h>
#include <string.h>

#define WIRE_MAGIC 0xB1
#define WIRE_HEADER_BYTES 24
#define WIRE_OWN_FRAME_BYTES 65536 /* arrays this large travel in frames of their own */
#define WIRE_MAX_ARRAYS 24

typedef struct {
    int kind, narrays, flags;
    int32_t src, origin, hops;
    int64_t req;
    const uint8_t *lengths; /* narrays little-endian int64: bytes (negative: own frame) */
    const uint8_t *extra;   /* the extra fields (msgpack), NULL if none */
    uint32_t nextra;
    size_t size;            /* bytes of this header in the header frame, extra included */
} wire_header_t;

static inline int64_t wire_get64(const uint8_t *p) { int64_t v; memcpy(&v, p, 8); return v; }
static inline int32_t wire_get32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

/* Parses the header at p (avail bytes left in the header frame). 0, or -1 if it is cut short,
 * not a header (magic) or has unknown flags. Kind and array count are the caller's to check. */
static inline int wire_header(const uint8_t *p, size_t avail, wire_header_t *h) {
    if (avail < WIRE_HEADER_BYTES || p[0] != WIRE_MAGIC) return -1;
    h->kind = p[1];
    h->narrays = p[2];
    h->flags = p[3];
    h->src = wire_get32(p + 4);
    h->req = wire_get64(p + 8);
    h->origin = wire_get32(p + 16);
    h->hops = wire_get32(p + 20);
    h->lengths = p + WIRE_HEADER_BYTES;
    h->extra = NULL;
    h->nextra = 0;
    size_t size = WIRE_HEADER_BYTES + 8 * (size_t)h->narrays;
    if (avail < size) return -1;
    if (h->flags & 1) {
        if (avail < size + 4) return -1;
        uint32_t n;
        memcpy(&n, p + size, 4);
        if ((size_t)n > avail - size - 4) return -1;
        h->extra = p + size + 4;
        h->nextra = n;
        size += 4 + n;
    } else if (h->flags) {
        return -1;
    }
    h->size = size;
    return 0;
}

#endif
