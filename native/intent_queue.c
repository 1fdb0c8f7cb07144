/* One worker's intent batches: see intent_queue.h. */
#include "intent_queue.h"

#include <stdlib.h>
#include <string.h>

#include "growable.h"
#include "intents.h"

static int before(const intent_batch_t *a, const intent_batch_t *b) {
    return a->order < b->order || (a->order == b->order && a->seq < b->seq);
}

static int reserve_one(batch_heap_t *h) {
    return grow_for_one((void **)&h->items, h->len, &h->cap, sizeof(intent_batch_t));
}

static int append(batch_heap_t *h, intent_batch_t item) {
    if (reserve_one(h) < 0) return -1;
    h->items[h->len++] = item;
    return 0;
}

static int heap_push(batch_heap_t *h, intent_batch_t item) {
    if (reserve_one(h) < 0) return -1;
    int64_t i = h->len++;
    while (i > 0) { /* sift up */
        const int64_t parent = (i - 1) / 2;
        if (!before(&item, &h->items[parent])) break;
        h->items[i] = h->items[parent];
        i = parent;
    }
    h->items[i] = item;
    return 0;
}

static intent_batch_t heap_pop(batch_heap_t *h) {
    const intent_batch_t top = h->items[0];
    const intent_batch_t last = h->items[--h->len];
    int64_t i = 0;
    for (;;) { /* sift the last item down from the root */
        int64_t child = 2 * i + 1;
        if (child >= h->len) break;
        if (child + 1 < h->len && before(&h->items[child + 1], &h->items[child])) child++;
        if (!before(&h->items[child], &last)) break;
        h->items[i] = h->items[child];
        i = child;
    }
    if (h->len) h->items[i] = last;
    return top;
}

void iq_init(intent_queue_t *q) { memset(q, 0, sizeof(*q)); }

void iq_free(intent_queue_t *q) {
    for (int64_t i = 0; i < q->pending.len; i++) free(q->pending.items[i].keys);
    for (int64_t i = 0; i < q->acted.len; i++) free(q->acted.items[i].keys);
    free(q->pending.items);
    free(q->acted.items);
    free(q->expired.items);
    iq_init(q);
}

int iq_signal(intent_queue_t *q, const int64_t *keys, int64_t n, int64_t start, int64_t end) {
    int64_t *copy = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (!copy) return -1;
    memcpy(copy, keys, (size_t)n * sizeof(int64_t));
    const intent_batch_t b = {start, start, end, q->next_seq, n, copy};
    if (heap_push(&q->pending, b) < 0) {
        free(copy);
        return -1;
    }
    q->next_seq++;
    q->queued_keys += n;
    q->signalled++;
    return 0;
}

int iq_collect(intent_queue_t *q, int64_t clock, int64_t horizon, intent_counts_t *counts,
               int64_t *acted_keys, int *changed) {
    int64_t acted = 0;
    int any = 0;
    q->signalled = 0;
    /* Expired first (batches acted on in an earlier round; a batch acted on now has
     * end > clock and stays), set aside and counted out last: counts go up before they go
     * down (as in intents.py), so a key in both keeps a positive count throughout. */
    q->expired.len = 0;
    while (q->acted.len && q->acted.items[0].order <= clock) {
        if (append(&q->expired, heap_pop(&q->acted)) < 0) return -1;
        any = 1;
    }
    while (q->pending.len && q->pending.items[0].order < horizon) {
        intent_batch_t b = heap_pop(&q->pending);
        if (b.end <= clock) { /* over before we acted: never counted, nothing to undo */
            q->queued_keys -= b.n;
            free(b.keys);
            continue;
        }
        if (intents_count(counts, b.keys, b.n, 1) < 0) return -1;
        acted += b.n;
        any = 1;
        b.order = b.end;
        if (heap_push(&q->acted, b) < 0) return -1;
    }
    for (int64_t i = 0; i < q->expired.len; i++) {
        intent_batch_t *b = &q->expired.items[i];
        if (intents_count(counts, b->keys, b->n, -1) < 0) return -1;
        q->queued_keys -= b->n;
        free(b->keys);
    }
    q->expired.len = 0;
    *acted_keys = acted;
    *changed = any;
    return 0;
}

int iq_late(const intent_queue_t *q, int64_t clock) {
    for (int64_t i = 0; i < q->pending.len; i++) {
        const intent_batch_t *b = &q->pending.items[i];
        if (b->start <= clock && clock < b->end) return 1;
    }
    return 0;
}

int iq_served(const intent_queue_t *q, int64_t clock, const intent_counts_t *counts) {
    if (iq_late(q, clock)) return 0;
    for (int64_t i = 0; i < q->acted.len; i++) {
        const intent_batch_t *b = &q->acted.items[i];
        if (b->start <= clock && clock < b->end)
            for (int64_t j = 0; j < b->n; j++)
                if (!ic_told(counts, b->keys[j])) return 0;
    }
    return 1;
}
