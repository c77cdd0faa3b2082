/*
 * heap.c - the binary min-heaps of entry indices in the region: the delay
 * heap (waiting keys by ready time) and fair mode's two heaps (queued keys
 * by priority/tag/age, and by age). One implementation, one bounds rule.
 *
 * A heap is an array of entry indices in the region plus, in each member
 * entry, its position (entry->link for the delay heap, fx->hp / fx->ha in
 * fair mode), so removal and "moved up" are O(log n). The member count
 * lives in the header and is owned by the caller (delay.c, fair.c): every
 * call takes n, the number of members before the call, and the caller
 * stores the new count.
 *
 * Bounds rule: n is checked against the heap's reserved slots (wq__heap_room:
 * the delay heap's q->nheap, the fair heaps' q->nent); every entry index read
 * from a heap array is checked (< nent) before it is used; every
 * position read from an entry is checked (< n, and the array at that
 * position names the entry back). A violation returns -EBADMSG before any
 * write through the bad value, so a corrupt heap never causes a stray
 * write; the caller leaves busy set and the next locker rebuilds the heap
 * from the entries (repair.c). Data structure only: never calls up.
 *
 * The comparison is selected by a constant kind; each operation is one
 * always-inline body instantiated per kind, so the hot paths compare with
 * no indirect call.
 */
#include "shm.h"

static const char *const up_point[] = { "heap.up", "fair.up", "fair.up" };
static const char *const down_point[] = { "heap.down", "fair.down", "fair.down" };

WQ_INLINE uint32_t *arr(shmq *q, int k)
{
    return k == WQ_HEAP_DELAY ? q->heap : k == WQ_HEAP_PRIO ? q->fheap_p : q->fheap_a;
}

/* Where entry idx (< nent) keeps its position in heap k. */
WQ_INLINE uint32_t *pos_of(shmq *q, int k, uint32_t idx)
{
    return k == WQ_HEAP_DELAY ? &wq__entry(q, idx)->link
         : k == WQ_HEAP_PRIO  ? &q->fx[idx].hp : &q->fx[idx].ha;
}

/* Does a come out before b? Add order (entry->seq) breaks every tie;
   it wraps, so it is compared as a signed difference. */
WQ_INLINE bool before(const shmq *q, int k, uint32_t a, uint32_t b)
{
    const struct wq_entry *ea = wq__entry(q, a), *eb = wq__entry(q, b);
    if (k == WQ_HEAP_DELAY) {
        if (ea->t_b != eb->t_b)
            return ea->t_b < eb->t_b;
    } else if (k == WQ_HEAP_PRIO) {
        const struct wq_fx *x = &q->fx[a], *y = &q->fx[b];
        if (x->prio != y->prio)
            return x->prio > y->prio;
        if (x->tag != y->tag)
            return x->tag < y->tag;
    }
    return (int32_t)(ea->seq - eb->seq) < 0;
}

WQ_INLINE void place(shmq *q, int k, uint32_t pos, uint32_t idx)
{
    arr(q, k)[pos] = idx;
    *pos_of(q, k, idx) = pos;
}

/* Move the member at pos (idx, already checked) up to its place. */
WQ_INLINE int sift_up(shmq *q, int k, uint32_t pos, uint32_t idx)
{
    uint32_t *a = arr(q, k);
    while (pos > 0) {
        uint32_t parent = (pos - 1) / 2, p = a[parent];
        if (WQ_UNLIKELY(p >= q->nent))
            return -EBADMSG;
        if (!before(q, k, idx, p))
            break;
        place(q, k, pos, p);
        WQ_STEP(up_point[k]);
        pos = parent;
    }
    place(q, k, pos, idx);
    return 0;
}

WQ_INLINE int sift_down(shmq *q, int k, uint32_t pos, uint32_t idx, uint32_t n)
{
    uint32_t *a = arr(q, k);
    for (;;) {
        uint32_t c = 2 * pos + 1;
        if (c >= n)
            break;
        uint32_t x = a[c];
        if (WQ_UNLIKELY(x >= q->nent))
            return -EBADMSG;
        if (c + 1 < n) {
            uint32_t y = a[c + 1];
            if (WQ_UNLIKELY(y >= q->nent))
                return -EBADMSG;
            if (before(q, k, y, x)) {
                c++;
                x = y;
            }
        }
        if (!before(q, k, x, idx))
            break;
        place(q, k, pos, x);
        WQ_STEP(down_point[k]);
        pos = c;
    }
    place(q, k, pos, idx);
    return 0;
}

/* idx's checked position in heap k of n members, or -EBADMSG. */
WQ_INLINE int position(shmq *q, int k, uint32_t n, uint32_t idx, uint32_t *pos)
{
    if (WQ_UNLIKELY(n > wq__heap_room(q, k) || idx >= q->nent))
        return -EBADMSG;
    uint32_t p = *pos_of(q, k, idx);
    if (WQ_UNLIKELY(p >= n || arr(q, k)[p] != idx))
        return -EBADMSG;
    *pos = p;
    return 0;
}

WQ_INLINE int insert_k(shmq *q, int k, uint32_t n, uint32_t idx)
{
    if (WQ_UNLIKELY(n >= wq__heap_room(q, k) || idx >= q->nent))
        return -EBADMSG;
    place(q, k, n, idx);
    return sift_up(q, k, n, idx);
}

WQ_INLINE int delete_k(shmq *q, int k, uint32_t n, uint32_t idx)
{
    uint32_t pos;
    int rc = position(q, k, n, idx, &pos);
    if (rc < 0)
        return rc;
    uint32_t *a = arr(q, k), last = a[n - 1];
    if (WQ_UNLIKELY(last >= q->nent))
        return -EBADMSG;
    if (pos == n - 1)
        return 0;
    /* The last member fills the hole and moves whichever way it must:
       up if it comes before the hole's parent, else down. */
    if (pos > 0) {
        uint32_t parent = a[(pos - 1) / 2];
        if (WQ_UNLIKELY(parent >= q->nent))
            return -EBADMSG;
        if (before(q, k, last, parent))
            return sift_up(q, k, pos, last);
    }
    return sift_down(q, k, pos, last, n - 1);
}

WQ_INLINE int raise_k(shmq *q, int k, uint32_t n, uint32_t idx)
{
    uint32_t pos;
    int rc = position(q, k, n, idx, &pos);
    return rc < 0 ? rc : sift_up(q, k, pos, idx);
}

WQ_INLINE int build_k(shmq *q, int k, uint32_t n)
{
    uint32_t *a = arr(q, k);
    if (WQ_UNLIKELY(n > wq__heap_room(q, k)))
        return -EBADMSG;
    for (uint32_t i = 0; i < n; i++) {
        if (WQ_UNLIKELY(a[i] >= q->nent))
            return -EBADMSG;
        *pos_of(q, k, a[i]) = i;
    }
    for (uint32_t i = n / 2; i-- > 0;) {
        int rc = sift_down(q, k, i, a[i], n);
        if (rc < 0)
            return rc;
    }
    return 0;
}

#define BY_KIND(k, call)                                        \
    switch (k) {                                                \
    case WQ_HEAP_DELAY: { const int kk = WQ_HEAP_DELAY; return call; } \
    case WQ_HEAP_PRIO:  { const int kk = WQ_HEAP_PRIO;  return call; } \
    default:            { const int kk = WQ_HEAP_AGE;   return call; } \
    }

int wq__heap_insert(shmq *q, int k, uint32_t n, uint32_t idx)
{
    WQ_ASSERT_LOCKED(q);
    BY_KIND(k, insert_k(q, kk, n, idx));
}

int wq__heap_delete(shmq *q, int k, uint32_t n, uint32_t idx)
{
    WQ_ASSERT_LOCKED(q);
    BY_KIND(k, delete_k(q, kk, n, idx));
}

int wq__heap_raise(shmq *q, int k, uint32_t n, uint32_t idx)
{
    WQ_ASSERT_LOCKED(q);
    BY_KIND(k, raise_k(q, kk, n, idx));
}

int wq__heap_build(shmq *q, int k, uint32_t n)
{
    WQ_ASSERT_LOCKED(q);
    BY_KIND(k, build_k(q, kk, n));
}


/* Check only: heap k lists n entries once each (seen: a bitmap the
   caller clears), each at the position it records, in heap order;
   member(idx) says whether the entry belongs. Calls bad() per violation. */
void wq__heap_verify(shmq *q, int k, uint32_t n, uint64_t *seen,
                     bool (*member)(const shmq *q, uint32_t idx),
                     void (*bad)(void *c, const char *what), void *c)
{
    static const char *const names[] = { "heap", "fair heap P", "fair heap A" };
    uint32_t *a = arr(q, k);
    char what[160];
    if (n > wq__heap_room(q, k)) {
        snprintf(what, sizeof what, "%s: count %u out of range", names[k], n);
        bad(c, what);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t idx = a[i];
        const char *why = NULL;
        if (idx >= q->nent)
            why = "out of range";
        else if (!member(q, idx))
            why = "not a member";
        else if (*pos_of(q, k, idx) != i)
            why = "records another position";
        else if (seen && (seen[idx >> 6] >> (idx & 63) & 1))
            why = "listed twice";
        else if (i > 0 && a[(i - 1) / 2] < q->nent && before(q, k, idx, a[(i - 1) / 2]))
            why = "before its parent";
        if (idx < q->nent && seen)
            seen[idx >> 6] |= 1ull << (idx & 63);
        if (why) {
            snprintf(what, sizeof what, "%s position %u: entry %u %s", names[k], i, idx, why);
            bad(c, what);
        }
    }
}
