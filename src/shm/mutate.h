/*
 * mutate.h - the crash protocol of a critical section, written once.
 *
 * A process may die at any instruction while it holds the region lock.
 * The next locker gets EOWNERDEAD and must find a region it can repair.
 * Three rules make that possible:
 *
 *   1. Commit point. Each entry's state word is the truth; an operation
 *      changes it with one store (the commit). Everything else (index,
 *      ring, heaps, free list, counters) follows the entries and can be
 *      rebuilt from them (repair.c).
 *   2. Busy bracket. wq__mut_begin() sets hdr->busy before the first
 *      shared store of a mutation and wq__mut_end() clears it after the
 *      last. Repair after a death runs only when busy is set. Error rule:
 *      a mutation that fails half way (a corrupt structure found, -EBADMSG)
 *      ends with busy still set, so the next locker, whoever it is,
 *      rebuilds the region before doing anything else. Nobody clears busy
 *      over a half-applied change.
 *   3. Pending counter. Counters that cannot be derived from entries
 *      (adds_total, crash_requeues_total) are announced with
 *      wq__mut_pend() before the commit and retired with wq__mut_settled()
 *      after they were bumped; repair counts a committed but uncounted
 *      operation exactly once (repair.c, settle_pending): the record
 *      keeps the counters' values from before, so a holder that died
 *      between its bump and the retiring is not counted twice.
 *
 * WQ_STEP names the point between two stores: a compiler barrier, and in
 * the fault-injection build a place where a test can kill the process.
 */
#ifndef WQ_MUTATE_H
#define WQ_MUTATE_H

#define WQ_STEP(point) do { wq_step_fence(); WQ_FAULT(point); } while (0)

static inline void wq__mut_begin(shmq *q)
{
    WQ_ASSERT_LOCKED(q);
    q->hdr->busy = 1;
}

/* rc < 0 leaves busy set (rule 2). Returns rc. */
static inline int wq__mut_end(shmq *q, int rc)
{
    if (WQ_LIKELY(rc >= 0)) {
        wq_step_fence();
        q->hdr->busy = 0;
    }
    return rc;
}

/* The end of a mutation that can fail only before its first change (no
   room, no memory: what it did before, a merge or an eviction, is whole):
   busy clears, but for -EBADMSG, a damaged region, which the next locker
   repairs. Returns rc. */
static inline int wq__mut_end_unchanged(shmq *q, int rc)
{
    wq__mut_end(q, rc == -EBADMSG ? rc : 0);
    return rc;
}

/* Inside a mutation (lock held, busy set): the transitions and the
   structures' writers assume it. */
#ifdef WQ_DEBUG
#define WQ_ASSERT_MUTATING(q) \
    WQ_ASSERT((q)->restoring || (wq__lock_held(q) && (q)->hdr->busy))
#else
#define WQ_ASSERT_MUTATING(q) ((void)0)
#endif

static inline void wq__mut_pend(shmq *q, uint32_t kind, uint32_t idx)
{
    struct wq_hdr *h = q->hdr;
    h->pend_count = kind == WQ_PEND_CRASH ? h->crash_requeues_total : h->adds_total;
    h->pend_count2 = h->retries_total;
    q->hdr->pend_idx = idx;
    wq_step_fence();   /* the entry is named before the record is armed */
    q->hdr->pend_kind = kind;
}

static inline void wq__mut_settled(shmq *q)
{
    q->hdr->pend_kind = WQ_PEND_NONE;   /* disarmed before the entry changes */
}

#endif
