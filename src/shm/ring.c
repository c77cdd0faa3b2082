/*
 * ring.c - the FIFO of entry indices.
 *
 * A circular array of `capacity` uint32 entry indices; queued <= live <=
 * capacity, so it can never overflow. Front index and count share one
 * 64-bit word (hdr->ring_pos) so that a push or a pop commits with a
 * single store: a holder killed mid-operation leaves either the old or
 * the new ring, never a torn one. A push writes the slot first, then the
 * word; repair appends a queued entry whose push was cut short.
 * All calls need the region lock (and a mutation in progress to change
 * it); wq_len reads the count without it (relaxed). Data structure only.
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
    if (WQ_UNLIKELY(head >= q->capacity || count >= q->capacity))
        return -EBADMSG;
    uint32_t tail = head + count;
    if (tail >= q->capacity)
        tail -= q->capacity;
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
    head = head + 1 == q->capacity ? 0 : head + 1;
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
    uint32_t head = (uint32_t)pos, count = (uint32_t)(pos >> 32), cap = q->capacity;
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
