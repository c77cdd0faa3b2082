/*
 * metrics.c - client-go's workqueue metrics, kept in the region so that
 * every process reports the same numbers: wq_metrics.
 *
 * Histograms (queue duration: add -> get, work duration: get -> done) use
 * client-go's buckets, 10 ns to 10 s by powers of ten. They are stored
 * non-cumulative, written and read under the lock (plain increments: a
 * locked read-modify-write would cost ~20 cycles three times per
 * observation, for nothing), and made cumulative when read. The two gauges come from the processing entries:
 * unfinished work = processing * now - sum of their start times
 * (hdr->sum_start, kept exact by get/done and rebuilt by repair), and the
 * longest running processor needs the oldest start time, found by a pass
 * over the entries (O(capacity); scrape-time only, never on a hot path).
 */
#include "shm.h"

void wq__observe(struct wq_hist *h, uint64_t ns)
{
    uint64_t bound = 10;   /* 1e-8 s */
    int b = 0;
    while (b < WQ_HIST_BUCKETS && ns > bound) {
        bound *= 10;
        b++;
    }
    h->bucket[b]++;
    h->count++;
    h->sum_ns += ns;
}

static void read_hist(const struct wq_hist *h, struct wq_histogram *out)
{
    uint64_t acc = 0;
    for (int b = 0; b <= WQ_HIST_BUCKETS; b++) {
        acc += h->bucket[b];
        out->bucket[b] = acc;
    }
    out->count = h->count;
    out->sum_seconds = (double)h->sum_ns / 1e9;
}

int wq__shm_metrics(wq *pub, struct wq_metrics *out)
{
    shmq *q = wq__shm(pub);
    int rc = wq__lock_look(q);
    if (rc < 0)
        return rc;
    struct wq_hdr *h = q->hdr;
    uint64_t now = wq__now_mono();
    wq__promote(q, now);
    struct wq_metrics m = {0};
    m.depth = wq__queued(q);
    m.adds_total = h->adds_total;
    read_hist(&h->qdur, &m.queue_duration);
    read_hist(&h->wdur, &m.work_duration);
    read_hist(&h->rldelay, &m.rate_limit_delay);
    m.retries_total = h->retries_total;
    m.coalesced_total = wq__procs_coalesced(q);
    m.crash_requeues_total = h->crash_requeues_total;
    m.waiting = h->heap_count;
    m.processing = h->processing;
    uint64_t oldest = now;
    if (m.processing > 0) {
        /* client-go's depth counts every add not yet handed out, so a key
           re-added while processing is in it (it is not in the ring). */
        for (uint32_t i = 0, used = wq__entries_used(q); i < used; i++) {
            const struct wq_entry *e = wq__entry(q, i);
            if (!(e->state & WQ_ST_PROCESSING))
                continue;
            m.depth += (e->state & WQ_ST_DIRTY) != 0;
            const struct wq_run *r = wq__entry_run(q, e, i);
            if (r && r->t_start < oldest)
                oldest = r->t_start;
        }
    }
    if (q->metrics && m.processing > 0) {
        /* Modular arithmetic: the sums may wrap, their difference (the
           total age) does not. */
        m.unfinished_work_seconds = (double)(m.processing * now - h->sum_start) / 1e9;
        m.longest_running_processor_seconds = (double)(now - oldest) / 1e9;
    }
    wq__unlock(q);
    *out = m;
    return 0;
}
