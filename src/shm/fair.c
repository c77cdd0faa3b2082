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
 * All calls need the region lock (and busy for mutations). The heaps are
 * heap.c's, with its bounds rule: a corrupt heap gives -EBADMSG.
 */
#include "shm.h"

uint32_t wq__fair_tenant_len(const shmq *q, const struct wq_entry *e)
{
    if (q->g.tenant_sep < 0)
        return 0;
    /* keylen and the key's block are region data: a damaged key has no
       tenant (repair frees such an entry later). */
    const unsigned char *r = wq__key_rest(q, e), *p;
    uint32_t len = e->keylen;
    if (!r)
        return 0;
    if (len <= WQ_KEY_INLINE) {
        p = memchr(r, q->g.tenant_sep, len);
        return p ? (uint32_t)(p - r) : len;   /* no separator: itself */
    }
    if ((p = memchr(e->k.pre, q->g.tenant_sep, WQ_KEY_PRE)))
        return (uint32_t)(p - e->k.pre);
    p = memchr(r, q->g.tenant_sep, len - WQ_KEY_PRE);
    return p ? WQ_KEY_PRE + (uint32_t)(p - r) : len;
}

/* Counters in the tag table: a tenant's last tag within a priority, and a
   priority's virtual time. Hashed, so unrelated ones rarely share. */
static uint64_t *last_tag(shmq *q, const struct wq_entry *e, uint32_t tl, int32_t prio)
{
    unsigned char buf[WQ_MAX_KEY_LEN];
    const unsigned char *k = tl ? wq__key(q, e, buf) : NULL;   /* tl > 0: a sound key */
    uint64_t h = (k ? wq__fnv1a(k, tl) : 0) ^ ((uint64_t)(uint32_t)prio * 0x9e3779b97f4a7c15ull);
    return &q->ftags[(h ^ (h >> 29)) & (q->g.ftag_slots - 1)];
}

static uint64_t *vtime(shmq *q, int32_t prio)
{
    uint64_t h = ((uint64_t)(uint32_t)prio + 0x51ed270b) * 0xd6e8feb86659fd93ull;
    return &q->ftags[(h ^ (h >> 32)) & (q->g.ftag_slots - 1)];
}

/* Lock and busy held: the key just became dirty (added, re-added while
   processing, fired, requeued): give it its add order and start tag. */
void wq__fair_dirty(shmq *q, uint32_t idx)
{
    if (!q->fair)
        return;
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    struct wq_fx *f = &q->fx[idx];
    wq_store_relaxed(&e->seq, h->seq_next++);
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
int wq__fair_push(shmq *q, uint32_t idx)
{
    struct wq_hdr *h = q->hdr;
    uint32_t n = h->fq_count;
    int rc = wq__heap_insert(q, WQ_HEAP_PRIO, n, idx);
    if (rc == 0)
        rc = wq__heap_insert(q, WQ_HEAP_AGE, n, idx);
    if (rc < 0)
        return rc;
    WQ_STEP("fair.place");
    wq_store_relaxed(&h->fq_count, n + 1);
    return 0;
}

/* Lock held: the entry the next hand-out takes (WQ_NIL if none). */
uint32_t wq__fair_front(shmq *q)
{
    struct wq_hdr *h = q->hdr;
    bool oldest = (h->fair_ticks + 1) % q->g.fair_share == 0;
    return wq__heap_top(q, oldest ? WQ_HEAP_AGE : WQ_HEAP_PRIO, h->fq_count);
}

/* Lock and busy held: idx (from wq__fair_front) was handed out. */
int wq__fair_pop(shmq *q, uint32_t idx)
{
    struct wq_hdr *h = q->hdr;
    uint32_t n = h->fq_count;
    bool by_priority = wq__heap_top(q, WQ_HEAP_PRIO, n) == idx;
    h->fair_ticks++;
    uint64_t *v = vtime(q, q->fx[idx].prio);   /* per priority: tenants take
                                                  turns within one */
    if (by_priority && q->fx[idx].tag > *v)
        *v = q->fx[idx].tag;
    int rc = wq__heap_delete(q, WQ_HEAP_PRIO, n, idx);
    if (rc == 0)
        rc = wq__heap_delete(q, WQ_HEAP_AGE, n, idx);
    if (rc < 0)
        return rc;
    WQ_STEP("fair.pop");
    wq_store_relaxed(&h->fq_count, n - 1);
    return 0;
}

/* Lock and busy held: a queued entry leaves both heaps (wq_remove). */
int wq__fair_remove(shmq *q, uint32_t idx)
{
    struct wq_hdr *h = q->hdr;
    uint32_t n = h->fq_count;
    int rc = wq__heap_delete(q, WQ_HEAP_PRIO, n, idx);
    if (rc == 0)
        rc = wq__heap_delete(q, WQ_HEAP_AGE, n, idx);
    if (rc < 0)
        return rc;
    wq_store_relaxed(&h->fq_count, n - 1);
    return 0;
}

/* Lock and busy held: merge a priority into the entry (fresh: set it). */
int wq__fair_prio(shmq *q, uint32_t idx, int prio, bool fresh)
{
    if (!q->fair)
        return 0;
    struct wq_fx *f = &q->fx[idx];
    if (!fresh && prio <= f->prio)
        return 0;
    f->prio = prio;
    WQ_STEP("fair.prio");
    if (wq__entry(q, idx)->state & WQ_ST_QUEUED)   /* a raise only moves it up */
        return wq__heap_raise(q, WQ_HEAP_PRIO, q->hdr->fq_count, idx);
    return 0;
}

/* Repair: both heaps from the QUEUED entries. */
int wq__fair_rebuild(shmq *q)
{
    if (!q->fair)
        return 0;
    uint32_t n = 0;
    for (uint32_t i = 0, used = wq__entries_used(q); i < used; i++)
        if (wq__entry(q, i)->state & WQ_ST_QUEUED) {
            q->fheap_p[n] = i;
            q->fheap_a[n] = i;
            n++;
        }
    wq_store_relaxed(&q->hdr->fq_count, n);
    int rc = wq__heap_build(q, WQ_HEAP_PRIO, n);
    return rc < 0 ? rc : wq__heap_build(q, WQ_HEAP_AGE, n);
}

static bool queued(const shmq *q, uint32_t idx)
{
    return wq__entry(q, idx)->state & WQ_ST_QUEUED;
}

/* Check only: both heaps hold exactly the QUEUED entries, in order. */
void wq__fair_verify(shmq *q, void (*violation)(void *c, const char *what), void *c)
{
    if (!q->fair)
        return;
    uint32_t n = q->hdr->fq_count, count = 0;
    char what[128];
    for (uint32_t i = 0, used = wq__entries_used(q); i < used; i++)
        count += queued(q, i);
    if (n != count || n > q->nent) {
        snprintf(what, sizeof what, "fair heaps: %u members, %u entries queued", n, count);
        violation(c, what);
        return;
    }
    wq__heap_verify(q, WQ_HEAP_PRIO, n, NULL, queued, violation, c);
    wq__heap_verify(q, WQ_HEAP_AGE, n, NULL, queued, violation, c);
}
