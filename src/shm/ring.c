/*
 * ring.c - the FIFO of entry indices.
 *
 * A circular array of uint32 entry indices, with a slot for each entry
 * ever used (e_fresh): its members are distinct queued entries, so it
 * can never overflow. Front index and count share one
 * 64-bit word (hdr->ring_pos) so that a push or a pop commits with a
 * single store: a holder killed mid-operation leaves either the old or
 * the new ring, never a torn one. A push writes the slot first, then the
 * word; repair appends a queued entry whose push was cut short.
 * All calls need the region lock (and a mutation in progress to change
 * it); wq_len reads the count without it (relaxed). Data structure only.
 *
 * Size. Like the index (table.c), the ring starts at one page and grows,
 * by a quarter (shm.h), up to capacity slots, into the other of two
 * areas: before an
 * entry past its size is taken (entry.c), the members are copied to the
 * same positions modulo the new size, front + k, so ring_pos stays valid
 * and one store of hdr->ring_at switches rings. A holder that dies
 * during the copy leaves the old ring in use; after the switch, the new
 * one complete. Either way the next locker gives the unused area's pages
 * back (lock.c).
 */
#include "shm.h"

static inline uint64_t pos_make(uint32_t head, uint32_t count)
{
    return (uint64_t)count << 32 | head;
}

int wq__ring_push(shmq *q, uint32_t idx)
{
    WQ_ASSERT_MUTATING(q);
    uint64_t pos = wq_load_relaxed(&q->hdr->ring_pos);
    uint32_t head = (uint32_t)pos, count = (uint32_t)(pos >> 32);
    if (WQ_UNLIKELY(head >= q->ring_slots || count >= q->ring_slots))
        return -EBADMSG;
    uint32_t tail = head + count;
    if (tail >= q->ring_slots)
        tail -= q->ring_slots;
    q->ring[tail] = idx;
    WQ_STEP("ring.push.slot");
    wq_store_relaxed(&q->hdr->ring_pos, pos_make(head, count + 1));
    return 0;
}

/* The front entry index, WQ_NIL when empty, WQ_CORRUPT when the
   ring or the index it holds is out of range. */
uint32_t wq__ring_front(shmq *q)
{
    if (wq__ring_count(q) == 0)
        return WQ_NIL;
    uint32_t idx = wq__ring_peek(q, 0);   /* WQ_NIL now: a bad word or slot */
    return WQ_LIKELY(idx != WQ_NIL) ? idx : WQ_CORRUPT;
}

/* Drop the front; only after wq__ring_front returned a valid index. */
void wq__ring_pop(shmq *q)
{
    WQ_ASSERT_MUTATING(q);
    uint64_t pos = wq_load_relaxed(&q->hdr->ring_pos);
    uint32_t head = (uint32_t)pos, count = (uint32_t)(pos >> 32);
    head = head + 1 == q->ring_slots ? 0 : head + 1;
    wq_store_relaxed(&q->hdr->ring_pos, pos_make(head, count - 1));
}

/*
 * Take idx out of the FIFO wherever it is, keeping the others' order:
 * the members behind it move up one place (O(count): wq_remove, an
 * operator's call). -EBADMSG when idx is not a member.
 */
int wq__ring_remove(shmq *q, uint32_t idx)
{
    WQ_ASSERT_MUTATING(q);
    uint64_t pos = wq_load_relaxed(&q->hdr->ring_pos);
    uint32_t head = (uint32_t)pos, count = (uint32_t)(pos >> 32), cap = q->ring_slots;
    if (WQ_UNLIKELY(head >= cap || count > cap))
        return -EBADMSG;
    uint32_t k = 0, at = head;
    for (; k < count && q->ring[at] != idx; k++)
        at = at + 1 == cap ? 0 : at + 1;
    if (k == count)
        return -EBADMSG;
    for (k++; k < count; k++) {
        uint32_t next = at + 1 == cap ? 0 : at + 1;
        q->ring[at] = q->ring[next];
        WQ_STEP("ring.remove.shift");
        at = next;
    }
    wq_store_relaxed(&q->hdr->ring_pos, pos_make(head, count - 1));
    return 0;
}

/* Publish the ring of `slots` slots in area as the one in use. */
static void switch_to(shmq *q, unsigned area, uint32_t slots)
{
    uint64_t at = (uint64_t)area << 32 | slots;
    q->hdr->ring_at = at;   /* commit */
    wq__ring_view(q, area, slots);
    q->ring_seen = at;
}

int wq__ring_grow(shmq *q, uint32_t need)
{
    WQ_ASSERT_LOCKED(q);
    if (need <= q->ring_slots)
        return 0;
    if (WQ_UNLIKELY(q->ring_slots == 0)) {
        wq__region_mark_corrupt(q);   /* a damaged word: repair makes one */
        return -EBADMSG;
    }
    unsigned from = q->ring == q->rarea[1], to = !from;
    uint32_t slots = wq__ring_size(q->capacity, need), old = q->ring_slots;
    uint64_t pos = wq_load_relaxed(&q->hdr->ring_pos);
    uint32_t head = (uint32_t)pos, count = (uint32_t)(pos >> 32);
    if (WQ_UNLIKELY(head >= old || count > old)) {
        wq__region_mark_corrupt(q);
        return -EBADMSG;
    }
    wq__region_release_area(q, true, to, 0);
    int rc = wq__region_reserve_area(q, true, to, slots);
    if (rc < 0)
        return rc;
    /* Member k from old[(head + k) % old] to new[(head + k) % slots], in
       runs that wrap in neither ring (at most three). */
    uint32_t *t = q->rarea[to];
    for (uint32_t left = count, r = head, w = head; left > 0;) {
        uint32_t n = left;
        n = n < old - r ? n : old - r;
        n = n < slots - w ? n : slots - w;
        memcpy(t + w, q->ring + r, (size_t)n * sizeof *t);
        left -= n;
        r = r + n == old ? 0 : r + n;
        w = w + n == slots ? 0 : w + n;
    }
    WQ_STEP("ring.grow.copy");
    switch_to(q, to, slots);
    WQ_STEP("ring.grow.switch");
    wq__region_release_area(q, true, from, 0);
    return 0;
}

/*
 * Repair: a ring whose word is damaged (no view) or too small for the
 * entries used is replaced by an empty one of the right size (its
 * members' order is lost; repair then appends every queued entry).
 * Otherwise only the pages of the unused area go back. -ENOSPC if the
 * pages are refused.
 */
int wq__ring_resize(shmq *q, bool *emptied)
{
    WQ_ASSERT_LOCKED(q);
    uint32_t want = wq__ring_need(q, wq__entries_used(q));
    unsigned area = q->ring_slots > 0 && q->ring == q->rarea[1];
    *emptied = false;
    if (q->ring_slots < want) {
        wq__region_release_area(q, true, area, 0);
        int rc = wq__region_reserve_area(q, true, area, want);
        if (rc < 0)
            return rc;
        wq_store_relaxed(&q->hdr->ring_pos, 0);
        switch_to(q, area, want);
        *emptied = true;
    }
    wq__region_release_area(q, true, !area, 0);
    return 0;
}
