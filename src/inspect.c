/*
 * inspect.c - views for tools: wq_stats and wq_dump.
 * Both run under the region lock so what they report is one consistent
 * moment, and both bounds-check every index they follow. Both first move
 * keys whose delay is over to the queue (as any lock holder may), so they
 * never report a key as waiting after its ready time.
 */
#include <errno.h>

#include "internal.h"

int wq_stats(wq *q, struct wq_stats *out)
{
    if (!q || !out)
        return -EINVAL;
    int rc = wq__lock(q);
    if (rc < 0)
        return rc;
    struct wq_hdr *h = q->hdr;
    struct wq_stats s = {0};
    s.now_ns = wq__now_mono();
    wq__promote(q, s.now_ns);
    s.queued = wq__queued(q);
    s.fair = q->fair;
    s.processing = atomic_load_explicit(&h->processing, memory_order_relaxed);
    s.live = atomic_load_explicit(&h->live, memory_order_relaxed);
    s.waiting = h->heap_count;
    s.failing = h->failing;
    s.results = h->r_count;
    s.has_store = q->g.has_store;
    s.durability = q->g.durability;
    s.store_unsynced = q->g.has_store ? h->sq_count : 0;
    s.result_capacity = q->result_capacity;
    s.next_ready_ns = wq__next_ready(q);
    s.capacity = q->capacity;
    for (uint32_t i = 0; i < q->max_procs; i++)
        s.processes += q->procs[i].state == WQ_PROC_LIVE;
    s.adds_total = h->adds_total;
    s.coalesced_total = h->coalesced_total;
    s.retries_total = h->retries_total;
    s.crash_requeues_total = h->crash_requeues_total;
    s.max_key_len = q->max_key_len;
    s.max_procs = q->max_procs;
    s.region_bytes = q->size;
    s.repairs_total = h->repairs_total;
    s.shutting_down = h->shutdown != 0;
    wq__unlock(q);
    *out = s;
    return 0;
}

static void fill(const wq *q, const struct wq_entry *e, struct wq_key_info *ki)
{
    ki->key = e->key;
    ki->len = e->keylen;
    ki->state = 0;
    if (e->state & WQ_ST_DIRTY)
        ki->state |= WQ_KEY_DIRTY;
    if (e->state & WQ_ST_QUEUED)
        ki->state |= WQ_KEY_QUEUED;
    if (e->state & WQ_ST_PROCESSING)
        ki->state |= WQ_KEY_PROCESSING;
    if (e->state & WQ_ST_WAITING)
        ki->state |= WQ_KEY_WAITING;
    if (e->state & WQ_ST_RETAINED)
        ki->state |= WQ_KEY_FAILING;
    ki->ready_ns = (e->state & WQ_ST_WAITING) ? e->t_b : 0;
    ki->failures = e->failures;
    ki->result = WQ_STATE_NONE;
    ki->result_code = 0;
    ki->result_message = "";
    if (wq__has_result(q, e)) {
        const struct wq_rslot *r = &q->rslots[e->rslot];
        ki->result = r->code == 0 ? WQ_STATE_SUCCEEDED : WQ_STATE_FAILED;
        ki->result_code = r->code;
        ki->result_message = r->message;   /* NUL-terminated by snprintf */
    }
    if (e->state & WQ_ST_PROCESSING)
        ki->result = WQ_STATE_RUNNING;
    else if (e->state & (WQ_ST_QUEUED | WQ_ST_DIRTY | WQ_ST_WAITING))
        ki->result = WQ_STATE_PENDING;
    ki->owner_pid = 0;
    if ((e->state & WQ_ST_PROCESSING) && e->owner < q->max_procs)
        ki->owner_pid = q->procs[e->owner].pid;
    ki->position = UINT64_MAX;
}

int wq_dump(wq *q, wq_dump_fn fn, void *arg)
{
    if (!q || !fn)
        return -EINVAL;
    int rc = wq__lock(q);
    if (rc < 0)
        return rc;
    struct wq_key_info ki;
    wq__promote(q, wq__now_mono());
    uint64_t pos = atomic_load_explicit(&q->hdr->ring_pos, memory_order_relaxed);
    uint32_t head = (uint32_t)pos, count = (uint32_t)(pos >> 32);
    if (head >= q->capacity || count > q->capacity) {
        rc = -EBADMSG;
        goto out;
    }
    for (uint32_t k = 0, r = head; k < count; k++) {
        uint32_t idx = q->ring[r];
        r = r + 1 == q->capacity ? 0 : r + 1;
        if (idx >= q->capacity) {
            rc = -EBADMSG;
            goto out;
        }
        struct wq_entry *e = wq__entry(q, idx);
        if (e->keylen == 0 || e->keylen > q->max_key_len)
            continue;
        fill(q, e, &ki);
        ki.position = k;
        if ((rc = fn(&ki, arg)) != 0)
            goto out;
    }
    for (uint32_t idx = 0; idx < q->capacity; idx++) {
        struct wq_entry *e = wq__entry(q, idx);
        if (e->state == 0 || (e->state & WQ_ST_QUEUED) || e->keylen == 0 ||
            e->keylen > q->max_key_len)
            continue;
        fill(q, e, &ki);
        if ((rc = fn(&ki, arg)) != 0)
            goto out;
    }
out:
    wq__unlock(q);
    return rc;
}
