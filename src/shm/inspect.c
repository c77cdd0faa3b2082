/*
 * inspect.c - views for tools: wq_stats and wq_dump.
 * Both run under the region lock so what they report is one consistent
 * moment, and both bounds-check every index they follow. Both first move
 * keys whose delay is over to the queue (as any lock holder may), so they
 * never report a key as waiting after its ready time.
 */
#include <stdlib.h>
#include <sys/stat.h>

#include "shm.h"

int wq__shm_stats(wq *pub, struct wq_stats *out)
{
    shmq *q = wq__shm(pub);
    /* A due snapshot (WQ_DURABLE_NONE) is taken by whoever comes by. */
    if (q->g.has_store)
        wq__store_after(q);
    int rc = wq__lock_look(q);
    if (rc < 0)
        return rc;
    struct wq_hdr *h = q->hdr;
    struct wq_stats s;
    memset(&s, 0, sizeof s);
    s.now_ns = wq__now_mono();
    wq__promote(q, s.now_ns);
    s.queued = wq__queued(q) <= q->capacity ? wq__queued(q) : q->capacity;
    s.fair = q->fair;
    /* Counters from shared memory are clamped like every index: a damaged
       one shows as the bound until the next repair, never as garbage. */
    s.processing = h->processing <= q->capacity ? h->processing : q->capacity;
    s.live = h->live <= q->capacity ? h->live : q->capacity;
    s.waiting = h->heap_count;
    s.failing = h->failing;
    s.idle_results = h->retained >= h->failing ? h->retained - h->failing : 0;
    s.restored = h->restored;
    s.results = h->r_count;
    s.has_store = q->g.has_store;
    s.durability = q->g.durability;
    s.store_unsynced = q->g.has_store ? h->sq_count : 0;
    s.result_capacity = q->result_capacity;
    s.next_ready_ns = wq__next_ready(q);
    s.capacity = q->capacity;
    for (uint32_t i = 0; i < q->max_procs; i++)   /* live handles only */
        s.processes += q->procs[i].state == WQ_PROC_LIVE && wq__lease_alive(&q->procs[i]);
    s.adds_total = h->adds_total;
    s.coalesced_total = wq__procs_coalesced(q);
    s.retries_total = h->retries_total;
    s.crash_requeues_total = h->crash_requeues_total;
    s.max_key_len = q->max_key_len;
    s.max_procs = q->max_procs;
    s.region_bytes = q->size;
    struct stat st;
    if (fstat(q->fd, &st) == 0)
        s.region_used = (uint64_t)st.st_blocks * 512;
    s.repairs_total = h->repairs_total;
    s.shutting_down = h->shutdown != 0;
    wq__unlock(q);
    *out = s;
    return 0;
}

/* kbuf: room for max_key_len bytes, kept while fn reads ki->key. */
static void fill(shmq *q, const struct wq_entry *e, struct wq_key_info *ki,
                 struct wq_result *res, unsigned char *kbuf)
{
    ki->key = wq__key(q, e, kbuf);   /* sound: the callers skip damaged keys */
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
    if (e->state & WQ_ST_STORING)
        ki->state |= WQ_KEY_STORING;   /* added, waiting for its store commit */
    ki->ready_ns = (e->state & WQ_ST_WAITING) ? e->t_b : 0;
    ki->failures = e->failures;
    ki->seq = e->seq;
    ki->priority = 0;
    ki->tenant_len = 0;
    uint32_t idx = (uint32_t)(((const unsigned char *)e - q->entries) / q->entry_size);
    if (q->fair) {
        ki->priority = q->fx[idx].prio;
        ki->tenant_len = wq__fair_tenant_len(q, e);
    }
    wq__result_read(q, e, res);
    ki->result = res->state;
    ki->result_code = res->code;
    ki->result_message = res->message;
    ki->owner_pid = 0;
    ki->started_ns = 0;
    ki->holder_alive = false;
    const struct wq_run *r = (e->state & WQ_ST_PROCESSING) ? wq__entry_run(q, e, idx) : NULL;
    if (r && r->owner < q->max_procs) {
        struct wq_proc *p = &q->procs[r->owner];
        bool same = wq__run_holder(q, r) == p;
        ki->owner_pid = p->pid;
        ki->started_ns = r->t_start;
        /* The holder lives if its slot is still its own and its lease is
           held: a dead holder is never shown as a live one. */
        ki->holder_alive = same && wq__lease_alive(p);
    }
    ki->position = UINT64_MAX;
}

/* Fair mode: hand-out order of the priority heap (priority, tag, add
   order); the oldest-key share is not predicted. */
static int cmp_fair(const void *a, const void *b, void *arg)
{
    const shmq *q = arg;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    const struct wq_fx *fx = &q->fx[x], *fy = &q->fx[y];
    if (fx->prio != fy->prio)
        return fx->prio > fy->prio ? -1 : 1;
    if (fx->tag != fy->tag)
        return fx->tag < fy->tag ? -1 : 1;
    int32_t d = (int32_t)(wq__entry(q, x)->seq - wq__entry(q, y)->seq);
    return d < 0 ? -1 : d > 0;
}

static int dump_fair_queued(shmq *q, wq_dump_fn fn, void *arg)
{
    uint32_t n = q->hdr->fq_count;
    if (n > q->nent)
        return -EBADMSG;
    uint32_t *order = malloc((n ? n : 1) * sizeof *order);
    if (!order)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        order[i] = q->fheap_p[i];
        if (order[i] >= q->nent) {
            free(order);
            return -EBADMSG;
        }
    }
    qsort_r(order, n, sizeof *order, cmp_fair, q);
    int rc = 0;
    struct wq_key_info ki;
    struct wq_result res;
    unsigned char kbuf[WQ_MAX_KEY_LEN];
    for (uint32_t k = 0; k < n && rc == 0; k++) {
        struct wq_entry *e = wq__entry(q, order[k]);
        if (!wq__key_ok(q, e))
            continue;
        fill(q, e, &ki, &res, kbuf);
        ki.position = k;
        rc = fn(&ki, arg);
    }
    free(order);
    return rc;
}

int wq__shm_dump(wq *pub, wq_dump_fn fn, void *arg)
{
    shmq *q = wq__shm(pub);
    struct wq_result res;
    int rc = wq__lock_look(q);
    if (rc < 0)
        return rc;
    struct wq_key_info ki;
    unsigned char kbuf[WQ_MAX_KEY_LEN];
    wq__promote(q, wq__now_mono());
    uint64_t pos = q->hdr->ring_pos;
    uint32_t head = (uint32_t)pos, count = (uint32_t)(pos >> 32);
    if (head >= q->ring_slots || count > q->ring_slots) {
        rc = -EBADMSG;
        goto out;
    }
    if (q->fair && (rc = dump_fair_queued(q, fn, arg)) != 0)
        goto out;
    for (uint32_t k = 0, r = head; k < count; k++) {
        uint32_t idx = q->ring[r];
        r = r + 1 == q->ring_slots ? 0 : r + 1;
        if (idx >= q->nent) {
            rc = -EBADMSG;
            goto out;
        }
        struct wq_entry *e = wq__entry(q, idx);
        if (!wq__key_ok(q, e))
            continue;
        fill(q, e, &ki, &res, kbuf);
        ki.position = k;
        if ((rc = fn(&ki, arg)) != 0)
            goto out;
    }
    for (uint32_t idx = 0, used = wq__entries_used(q); idx < used; idx++) {
        struct wq_entry *e = wq__entry(q, idx);
        if (wq__st(e) == 0 || (e->state & WQ_ST_QUEUED) || !wq__key_ok(q, e))
            continue;   /* free, or a removal the store has yet to write */
        fill(q, e, &ki, &res, kbuf);
        if ((rc = fn(&ki, arg)) != 0)
            goto out;
    }
out:
    wq__unlock(q);
    return rc;
}
