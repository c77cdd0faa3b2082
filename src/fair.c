/*
 * fair.c - the order of hand-outs in fair mode (WQ_FAIR): priorities,
 * tenant round-robin, re-added keys keeping their place, and a share of
 * hand-outs for the oldest key so no priority starves. wq_add_opts.
 *
 * In fair mode the ring is unused. Queued entries sit in two binary heaps
 * in the region, each entry in both:
 *   P  ordered by (priority desc, start tag asc, add order asc)
 *   A  ordered by add order (entry->seq, the moment the key became dirty)
 * A hand-out normally takes P's top; every fair_share-th takes A's top
 * (the oldest key), which bounds any key's wait whatever the load above
 * it. The chosen entry leaves both heaps.
 *
 * Start tags (start-time fair queueing with unit cost), per priority: when
 * a key becomes dirty it gets tag = max(vtime[prio], last[tenant, prio]) +
 * 1 and last[tenant, prio] = tag; vtime[prio] is the tag of the last key
 * of that priority handed out from P. A tenant with a
 * long backlog has tags far ahead of vtime, so a newcomer's single key
 * (tag vtime + 1) goes first: tenants take turns. Counters that fell
 * behind vtime are equivalent to fresh ones, so the per-tenant counters
 * need no cleanup: they are a fixed table indexed by the tenant's hash.
 *
 * A key re-added while processing gets its tag and add order at the
 * re-add; its wq_done puts it in the heaps with them, so it goes ahead of
 * everything added after the re-add (the default mode puts it last).
 *
 * Crash safety: entry state, seq, tag and priority are the truth; the
 * heaps are rebuilt from the QUEUED entries by repair (wq__fair_rebuild).
 * All calls need the region lock (and busy for mutations).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

enum { HP, HA };

static inline uint32_t *heap_of(wq *q, int h)
{
    return h == HP ? q->fheap_p : q->fheap_a;
}

static inline uint32_t *pos_of(wq *q, int h, uint32_t idx)
{
    return h == HP ? &q->fx[idx].hp : &q->fx[idx].ha;
}

static inline bool older(const wq *q, uint32_t a, uint32_t b)
{
    return (int32_t)(wq__entry(q, a)->seq - wq__entry(q, b)->seq) < 0;
}

static inline bool before(wq *q, int h, uint32_t a, uint32_t b)
{
    if (h == HP) {
        const struct wq_fx *x = &q->fx[a], *y = &q->fx[b];
        if (x->prio != y->prio)
            return x->prio > y->prio;
        if (x->tag != y->tag)
            return x->tag < y->tag;
    }
    return older(q, a, b);
}

static inline void place(wq *q, int h, uint32_t pos, uint32_t idx)
{
    heap_of(q, h)[pos] = idx;
    *pos_of(q, h, idx) = pos;
}

static void sift_up(wq *q, int h, uint32_t pos)
{
    uint32_t *heap = heap_of(q, h), idx = heap[pos];
    while (pos > 0) {
        uint32_t parent = (pos - 1) / 2;
        if (!before(q, h, idx, heap[parent]))
            break;
        place(q, h, pos, heap[parent]);
        WQ_STEP("fair.up");
        pos = parent;
    }
    place(q, h, pos, idx);
}

static void sift_down(wq *q, int h, uint32_t pos, uint32_t n)
{
    uint32_t *heap = heap_of(q, h), idx = heap[pos];
    for (;;) {
        uint32_t c = 2 * pos + 1;
        if (c >= n)
            break;
        if (c + 1 < n && before(q, h, heap[c + 1], heap[c]))
            c++;
        if (!before(q, h, heap[c], idx))
            break;
        place(q, h, pos, heap[c]);
        WQ_STEP("fair.down");
        pos = c;
    }
    place(q, h, pos, idx);
}

/* Remove idx from heap h of n members (n - 1 remain). */
static void heap_remove(wq *q, int h, uint32_t idx, uint32_t n)
{
    uint32_t *heap = heap_of(q, h), pos = *pos_of(q, h, idx);
    if (pos >= n || heap[pos] != idx)
        return;   /* corrupt: repair rebuilds */
    uint32_t last = heap[n - 1];
    if (pos == n - 1)
        return;
    place(q, h, pos, last);
    sift_down(q, h, pos, n - 1);
    sift_up(q, h, *pos_of(q, h, last));
}

uint32_t wq__fair_tenant_len(const wq *q, const struct wq_entry *e)
{
    if (q->g.tenant_sep < 0)
        return 0;
    const unsigned char *p = memchr(e->key, q->g.tenant_sep, e->keylen);
    return p ? (uint32_t)(p - e->key) : e->keylen;   /* no separator: itself */
}

/* Counters in the tag table: a tenant's last tag within a priority, and a
   priority's virtual time. Hashed, so unrelated ones rarely share. */
static uint64_t *last_tag(wq *q, const struct wq_entry *e, uint32_t tl, int32_t prio)
{
    uint64_t h = wq__fnv1a(e->key, tl) ^ ((uint64_t)(uint32_t)prio * 0x9e3779b97f4a7c15ull);
    return &q->ftags[(h ^ (h >> 29)) & (q->g.ftag_slots - 1)];
}

static uint64_t *vtime(wq *q, int32_t prio)
{
    uint64_t h = ((uint64_t)(uint32_t)prio + 0x51ed270b) * 0xd6e8feb86659fd93ull;
    return &q->ftags[(h ^ (h >> 32)) & (q->g.ftag_slots - 1)];
}

/* Lock and busy held: the key just became dirty (added, re-added while
   processing, fired, requeued): give it its add order and start tag. */
void wq__fair_dirty(wq *q, uint32_t idx)
{
    if (!q->fair)
        return;
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    struct wq_fx *f = &q->fx[idx];
    e->seq = h->seq_next++;
    uint32_t tl = wq__fair_tenant_len(q, e);
    uint64_t *last = last_tag(q, e, tl, f->prio);
    uint64_t v = *vtime(q, f->prio);
    uint64_t tag = (*last > v ? *last : v) + 1;
    f->tag = tag;
    f->tenant_len = tl;
    *last = tag;
    WQ_STEP("fair.tag");
}

/* Lock and busy held; the entry is QUEUED with its tag and seq set. */
int wq__fair_push(wq *q, uint32_t idx)
{
    struct wq_hdr *h = q->hdr;
    uint32_t n = h->fq_count;
    if (WQ_UNLIKELY(n >= q->capacity))
        return -EBADMSG;
    place(q, HP, n, idx);
    place(q, HA, n, idx);
    WQ_STEP("fair.place");
    h->fq_count = n + 1;
    sift_up(q, HP, n);
    sift_up(q, HA, n);
    return 0;
}

/* Lock held: the entry the next hand-out takes (WQ_NIL if none). */
uint32_t wq__fair_front(wq *q)
{
    struct wq_hdr *h = q->hdr;
    uint32_t n = h->fq_count;
    if (n == 0)
        return WQ_NIL;
    if (WQ_UNLIKELY(n > q->capacity))
        return WQ_LOOKUP_CORRUPT;
    bool oldest = (h->fair_ticks + 1) % q->g.fair_share == 0;
    uint32_t idx = oldest ? q->fheap_a[0] : q->fheap_p[0];
    return idx < q->capacity ? idx : WQ_LOOKUP_CORRUPT;
}

/* Lock and busy held: idx (from wq__fair_front) was handed out. */
void wq__fair_pop(wq *q, uint32_t idx)
{
    struct wq_hdr *h = q->hdr;
    uint32_t n = h->fq_count;
    bool by_priority = q->fheap_p[0] == idx;
    h->fair_ticks++;
    uint64_t *v = vtime(q, q->fx[idx].prio);   /* per priority: tenants take
                                                  turns within one */
    if (by_priority && q->fx[idx].tag > *v)
        *v = q->fx[idx].tag;
    heap_remove(q, HP, idx, n);
    heap_remove(q, HA, idx, n);
    WQ_STEP("fair.pop");
    h->fq_count = n - 1;
}

/* Lock and busy held: merge a priority into the entry (fresh: set it). */
void wq__fair_prio(wq *q, uint32_t idx, int prio, bool fresh)
{
    if (!q->fair)
        return;
    struct wq_fx *f = &q->fx[idx];
    if (!fresh && prio <= f->prio)
        return;
    f->prio = prio;
    WQ_STEP("fair.prio");
    struct wq_entry *e = wq__entry(q, idx);
    uint32_t n = q->hdr->fq_count;
    if ((e->state & WQ_ST_QUEUED) && f->hp < n && q->fheap_p[f->hp] == idx)
        sift_up(q, HP, f->hp);   /* a raise only moves it up */
}

/* Repair: both heaps from the QUEUED entries. */
void wq__fair_rebuild(wq *q)
{
    if (!q->fair)
        return;
    struct wq_hdr *h = q->hdr;
    uint32_t n = 0;
    for (uint32_t i = 0; i < q->capacity; i++)
        if (wq__entry(q, i)->state & WQ_ST_QUEUED) {
            place(q, HP, n, i);
            place(q, HA, n, i);
            n++;
        }
    h->fq_count = n;
    for (uint32_t i = n / 2; i-- > 0;) {
        sift_down(q, HP, i, n);
        sift_down(q, HA, i, n);
    }
}

/* Check only: both heaps hold exactly the QUEUED entries, in order. */
void wq__fair_verify(wq *q, void (*violation)(void *c, const char *what), void *c)
{
    if (!q->fair)
        return;
    uint32_t n = q->hdr->fq_count, queued = 0;
    char what[128];
    for (uint32_t i = 0; i < q->capacity; i++)
        queued += (wq__entry(q, i)->state & WQ_ST_QUEUED) != 0;
    if (n != queued || n > q->capacity) {
        snprintf(what, sizeof what, "fair heaps: %u members, %u entries queued", n, queued);
        violation(c, what);
        return;
    }
    for (int h = HP; h <= HA; h++) {
        uint32_t *heap = heap_of(q, h);
        for (uint32_t i = 0; i < n; i++) {
            uint32_t idx = heap[i];
            if (idx >= q->capacity || !(wq__entry(q, idx)->state & WQ_ST_QUEUED) ||
                *pos_of(q, h, idx) != i ||
                (i > 0 && heap[(i - 1) / 2] < q->capacity &&
                 before(q, h, idx, heap[(i - 1) / 2]))) {
                snprintf(what, sizeof what, "fair heap %c position %u: entry %u out of place",
                         h == HP ? 'P' : 'A', i, idx);
                violation(c, what);
            }
        }
    }
}
