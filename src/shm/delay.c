/*
 * delay.c - waiting keys over time: moving ready keys to the queue, the
 * next ready time sleepers bound their sleep by, and dropping waits at
 * shutdown. (Adds with a delay are queue.c's one add path; the delay
 * heap itself is heap.c, its count kept by entry.c.)
 *
 * Waiting entries (WQ_ST_WAITING) form a binary min-heap in the region,
 * ordered by (ready time, add sequence). Ready times are CLOCK_MONOTONIC,
 * which is one clock for every process on the machine.
 *
 * No daemon: wq__promote() moves ready keys to the queue and is called by
 * every lock holder that is about to hand out keys (wq_get and friends,
 * wq_stats); sleepers bound their sleep by the earliest ready time, and an
 * add that becomes the new earliest wakes one of them to re-arm.
 *
 * Crash safety: the entry's WAITING bit and ready time are the truth; the
 * heap is a cache of them, rebuilt by repair.
 *
 * Room (layout.h, grown_heap): without a store the heap's pages grow
 * with what may wait, not with the entries. A key being processed may
 * start to wait at its done or requeue, which must not fail for want of
 * a page, so its get asks for its slot (wq__entry_hand_out); an add that
 * starts a wait for any other key asks for one too (queue.c). Both fail
 * with -ENOSPC before changing anything when the system refuses.
 */
#include "shm.h"

int wq__delay_room(shmq *q, uint32_t extra)
{
    WQ_ASSERT_LOCKED(q);
    const struct wq_hdr *h = q->hdr;
    if (q->g.has_store)
        return 0;   /* the heap grows with the entries */
    /* Counts from the region: damaged ones would size the pages asked
       for (up to capacity's) and refuse every get; repair recounts. */
    if (WQ_UNLIKELY(h->heap_count > q->nheap || h->processing > h->live ||
                    h->live > q->capacity))
        return wq__region_mark_corrupt(q);
    /* A processing key that already waits is counted twice: a slot more
       than it needs, never one less. */
    uint64_t need = (uint64_t)h->heap_count + h->processing + extra;
    if (need <= q->nheap)
        return 0;
    return wq__region_grow_heap(q, need < q->capacity ? (uint32_t)need : q->capacity);
}

uint64_t wq__next_ready(const shmq *q)
{
    uint32_t idx = wq__heap_top(q, WQ_HEAP_DELAY, q->hdr->heap_count);
    return idx < q->nent ? wq__entry(q, idx)->t_b : 0;
}

/* Lock held: move every key whose ready time has come to the queue (or
   mark it dirty if it is processing). Returns how many were queued. */
uint32_t wq__promote(shmq *q, uint64_t now)
{
    struct wq_hdr *h = q->hdr;
    uint32_t queued = 0;
    if (h->shutdown)
        return 0;   /* client-go: after shutdown the waiting loop is gone */
    while (!wq__region_broken(q)) {
        uint32_t idx = wq__heap_top(q, WQ_HEAP_DELAY, h->heap_count);
        if (idx == WQ_NIL)
            break;
        if (WQ_UNLIKELY(idx == WQ_CORRUPT)) {
            h->corrupt = 1;   /* the next locker rebuilds the heap */
            break;
        }
        struct wq_entry *e = wq__entry(q, idx);
        if (WQ_UNLIKELY(!(e->state & WQ_ST_WAITING) || e->link != 0)) {
            h->corrupt = 1;
            break;
        }
        if (e->t_b > now)
            break;
        bool in_queue = false;
        wq__mut_begin(q);
        if (wq__mut_end(q, wq__entry_mark_dirty(q, idx, now, &in_queue)) < 0)
            break;   /* busy stays set: the next locker repairs */
        queued += in_queue;
    }
    return queued;
}

/* Lock held, at shutdown: client-go's waiting loop stops, so waiting keys
   never fire (entry.c, wq__entry_drop_wait). */
void wq__drop_waiting(shmq *q)
{
    struct wq_hdr *h = q->hdr;
    while (h->heap_count > 0 && !wq__region_broken(q)) {
        if (h->heap_count > wq__heap_room(q, WQ_HEAP_DELAY) ||
            q->heap[h->heap_count - 1] >= q->nent) {
            h->corrupt = 1;
            return;
        }
        uint32_t idx = q->heap[h->heap_count - 1];
        wq__mut_begin(q);
        WQ_STEP("drop.busy");
        if (wq__mut_end(q, wq__entry_drop_wait(q, idx)) < 0)
            return;
    }
}
