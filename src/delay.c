/*
 * delay.c - client-go's DelayingInterface: waiting keys and wq_add_after,
 * wq_add_rate_limited.
 *
 * Waiting entries (WQ_ST_WAITING) form a binary min-heap in the region,
 * ordered by (ready time, add sequence): heap[] holds entry indices and
 * each waiting entry's link holds its heap position, so removal and
 * "ready earlier" are O(log n). Ready times are CLOCK_MONOTONIC, which is
 * one clock for every process on the machine.
 *
 * No daemon: wq__promote() moves ready keys to the queue and is called by
 * every lock holder that is about to hand out keys (wq_get and friends,
 * wq_stats); sleepers bound their sleep by the earliest ready time, and an
 * add that becomes the new earliest wakes one of them to re-arm.
 *
 * Crash safety: the entry's WAITING bit and ready time are the truth; the
 * heap is a cache of them. Every heap mutation runs with hdr->busy set,
 * and repair rebuilds the heap from the entries (wq__heap_build).
 */
#include <errno.h>

#include "internal.h"

static inline bool before(const wq *q, uint32_t a, uint32_t b)
{
    const struct wq_entry *ea = wq__entry(q, a), *eb = wq__entry(q, b);
    if (ea->t_b != eb->t_b)
        return ea->t_b < eb->t_b;
    return (int32_t)(ea->seq - eb->seq) < 0;
}

static inline void place(wq *q, uint32_t pos, uint32_t idx)
{
    q->heap[pos] = idx;
    wq__entry(q, idx)->link = pos;
}

/* Every entry index read from heap[] is checked: a corrupt heap gives
   -EBADMSG (busy stays set, so the next locker rebuilds it), never a
   stray access. */
static int sift_up(wq *q, uint32_t pos)
{
    uint32_t idx = q->heap[pos];
    if (WQ_UNLIKELY(idx >= q->capacity))
        return -EBADMSG;
    while (pos > 0) {
        uint32_t parent = (pos - 1) / 2, p = q->heap[parent];
        if (WQ_UNLIKELY(p >= q->capacity))
            return -EBADMSG;
        if (!before(q, idx, p))
            break;
        place(q, pos, p);
        WQ_STEP("heap.up");
        pos = parent;
    }
    place(q, pos, idx);
    return 0;
}

static int sift_down(wq *q, uint32_t pos)
{
    uint32_t n = q->hdr->heap_count, idx = q->heap[pos];
    if (WQ_UNLIKELY(idx >= q->capacity || n > q->capacity))
        return -EBADMSG;
    for (;;) {
        uint32_t c = 2 * pos + 1;
        if (c >= n)
            break;
        uint32_t a = q->heap[c], b = c + 1 < n ? q->heap[c + 1] : 0;
        if (WQ_UNLIKELY(a >= q->capacity || b >= q->capacity))
            return -EBADMSG;
        if (c + 1 < n && before(q, b, a)) {
            c++;
            a = b;
        }
        if (!before(q, a, idx))
            break;
        place(q, pos, a);
        WQ_STEP("heap.down");
        pos = c;
    }
    place(q, pos, idx);
    return 0;
}

/* Lock and busy held; the entry is WAITING with its ready time set. */
int wq__heap_push(wq *q, uint32_t idx)
{
    uint32_t n = q->hdr->heap_count;
    if (WQ_UNLIKELY(n >= q->capacity))
        return -EBADMSG;
    place(q, n, idx);
    WQ_STEP("heap.push");
    q->hdr->heap_count = n + 1;
    return sift_up(q, n);
}

/* Lock and busy held: take a waiting entry out of the heap. */
int wq__heap_remove(wq *q, uint32_t idx)
{
    uint32_t n = q->hdr->heap_count, pos = wq__entry(q, idx)->link;
    if (WQ_UNLIKELY(n == 0 || n > q->capacity || pos >= n || q->heap[pos] != idx))
        return -EBADMSG;
    uint32_t last = q->heap[n - 1];
    if (WQ_UNLIKELY(last >= q->capacity))
        return -EBADMSG;
    q->hdr->heap_count = n - 1;
    WQ_STEP("heap.remove");
    if (pos != n - 1) {
        place(q, pos, last);
        int rc = sift_down(q, pos);
        uint32_t lp = wq__entry(q, last)->link;
        if (rc < 0 || lp >= n - 1)
            return -EBADMSG;
        return sift_up(q, lp);
    }
    return 0;
}

/* Lock and busy held: the entry's ready time moved earlier. */
void wq__heap_earlier(wq *q, uint32_t idx)
{
    uint32_t pos = wq__entry(q, idx)->link;
    if (pos < q->hdr->heap_count && pos < q->capacity && q->heap[pos] == idx)
        sift_up(q, pos);
}

/* Repair: heap[0..heap_count) already lists the waiting entries. */
void wq__heap_build(wq *q)
{
    uint32_t n = q->hdr->heap_count;
    for (uint32_t i = 0; i < n; i++)
        wq__entry(q, q->heap[i])->link = i;
    for (uint32_t i = n / 2; i-- > 0;)
        sift_down(q, i);
}

uint64_t wq__next_ready(const wq *q)
{
    uint32_t n = q->hdr->heap_count;
    if (n == 0 || n > q->capacity || q->heap[0] >= q->capacity)
        return 0;
    return wq__entry(q, q->heap[0])->t_b;
}

/* Lock held: move every key whose ready time has come to the queue (or
   mark it dirty if it is processing). Returns how many were queued. */
uint32_t wq__promote(wq *q, uint64_t now)
{
    struct wq_hdr *h = q->hdr;
    uint32_t queued = 0;
    if (h->shutdown)
        return 0;   /* client-go: after shutdown the waiting loop is gone */
    while (h->heap_count > 0 && h->heap_count <= q->capacity) {
        uint32_t idx = q->heap[0];
        if (WQ_UNLIKELY(idx >= q->capacity))
            break;   /* corrupt: left to wq_check */
        struct wq_entry *e = wq__entry(q, idx);
        if (WQ_UNLIKELY(!(e->state & WQ_ST_WAITING) || e->link != 0)) {
            h->corrupt = 1;   /* the next locker rebuilds the heap */
            break;
        }
        if (e->t_b > now)
            break;
        bool in_ring = false;
        h->busy = 1;
        if (wq__activate(q, idx, now, &in_ring) < 0)
            break;   /* busy stays set: the next locker repairs */
        h->busy = 0;
        queued += in_ring;
    }
    return queued;
}

/* Lock held, at shutdown: client-go's waiting loop stops, so waiting keys
   never fire. They leave the queue; a key that is also processing stays
   processing, and a failure count keeps its slot (RETAINED). */
void wq__drop_waiting(wq *q)
{
    struct wq_hdr *h = q->hdr;
    while (h->heap_count > 0 && h->heap_count <= q->capacity) {
        uint32_t idx = q->heap[h->heap_count - 1];
        if (idx >= q->capacity)
            break;
        struct wq_entry *e = wq__entry(q, idx);
        h->busy = 1;
        WQ_STEP("drop.busy");
        /* With a store, dropped waiting keys keep their records (wq.h):
           nothing here marks them. */
        if (e->state & WQ_ST_PROCESSING) {
            wq__set_state(e, WQ_ST_PROCESSING);   /* commit */
            WQ_STEP("drop.state");
            h->heap_count--;
        } else if (e->failures > 0 || wq__has_result(q, e)) {
            wq__set_state(e, WQ_ST_RETAINED);   /* commit: idle, keeps count/result */
            WQ_STEP("drop.state");
            h->heap_count--;
            h->failing++;
            atomic_fetch_sub_explicit(&h->live, 1, memory_order_relaxed);
        } else {
            h->heap_count--;
            WQ_STEP("drop.heap");
            if (wq__release_as(q, idx, false) < 0)
                return;
        }
        h->busy = 0;
    }
}

/*
 * Lock and busy held. Make a live entry that is not dirty wait until
 * `ready` (keeping an earlier ready time it already has). Returns 1 when
 * merged into an existing wait, 0 when a new wait started.
 */
int wq__delay_entry(wq *q, uint32_t idx, uint64_t ready)
{
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = wq__st(e);
    if (st == WQ_ST_STORING) {   /* not visible yet: keep the earlier time */
        if (e->t_b != 0 && ready < e->t_b) {
            wq__store_mark(q, idx);
            e->t_b = ready;
        }
        return 1;
    }
    if (st & WQ_ST_WAITING) {
        if (ready < e->t_b) {
            wq__store_mark(q, idx);
            e->t_b = ready;
            WQ_STEP("wait.earlier");
            wq__heap_earlier(q, idx);
        }
        return 1;
    }
    wq__store_mark(q, idx);
    e->t_b = ready;
    e->seq = h->seq_next++;
    WQ_STEP("wait.ready");
    if ((st == WQ_ST_RETAINED || st == 0) && wq__store_sync_adds(q) && !q->restoring) {
        /* Idle or a zombie with a store: invisible until stored again,
           as a new key (see wq__activate). */
        wq__set_state(e, WQ_ST_STORING);   /* commit */
        WQ_STEP("wait.state");
        if (st == WQ_ST_RETAINED)
            h->failing--;
        atomic_fetch_add_explicit(&h->live, 1, memory_order_relaxed);
        return 0;
    }
    if (st == WQ_ST_RETAINED || st == 0) {   /* idle, or a zombie */
        wq__set_state(e, WQ_ST_WAITING);   /* commit */
        WQ_STEP("wait.state");
        if (st == WQ_ST_RETAINED)
            h->failing--;
        atomic_fetch_add_explicit(&h->live, 1, memory_order_relaxed);
    } else {
        wq__set_state(e, st | WQ_ST_WAITING);   /* commit: processing */
        WQ_STEP("wait.state");
    }
    return wq__heap_push(q, idx);
}

/*
 * The body of wq_add_after and wq_add_rate_limited. Lock held.
 * *wake: a key was queued, or the earliest ready time changed.
 */
static int add_delayed(wq *q, const void *key, size_t len, uint32_t hash, bool limited,
                       uint64_t delay, int prio, bool *wake)
{
    struct wq_hdr *h = q->hdr;
    if (h->shutdown)
        return -ESHUTDOWN;
    uint64_t now = wq__now_mono();
    uint32_t idx = wq__table_lookup(q, key, len, hash);
    if (idx == WQ_LOOKUP_CORRUPT)
        return -EBADMSG;
    int err = 0, rc;
    h->busy = 1;
    WQ_STEP("delay.busy");
    bool fresh = idx == WQ_NIL;
    if (fresh && (idx = wq__new_entry(q, key, len, hash, &err)) == WQ_NIL) {
        h->busy = 0;
        return err;
    }
    struct wq_entry *e = wq__entry(q, idx);
    if (limited && !fresh)
        wq__store_mark(q, idx);   /* its failure count is about to change */
    if (limited) {   /* with an explicit delay too, the smaller one wins */
        uint64_t d = wq__limiter_when(q, e, now);
        delay = delay && delay < d ? delay : d;
    }
    if (q->fair) {
        uint16_t s0 = wq__st(e);
        if (fresh || s0 == WQ_ST_RETAINED || s0 == 0 || s0 == WQ_ST_PROCESSING)
            q->fx[idx].prio = prio;
        else
            wq__fair_prio(q, idx, prio, false);
    }
    h->retries_total++;
    WQ_STEP("delay.counted");
    uint16_t st = wq__st(e);
    if (st & WQ_ST_DIRTY) {   /* already going to be handed out */
        h->coalesced_total++;
        h->busy = 0;
        return 1;
    }
    if (delay == 0) {   /* client-go: AddAfter(0) is Add */
        bool queued = false;
        if (fresh) {
            e->t_b = now;
            rc = wq__commit_new(q, idx, WQ_ST_DIRTY | WQ_ST_QUEUED);
            queued = rc == 0;
        } else if (st == WQ_ST_STORING) {
            rc = wq__delay_entry(q, idx, now);   /* merged */
            if (rc >= 0)
                h->coalesced_total++;
        } else {
            rc = wq__activate(q, idx, now, &queued);
        }
        if (rc < 0)
            return rc;   /* busy stays set: the next locker repairs */
        h->busy = 0;
        *wake = queued;
        return st == WQ_ST_STORING ? 1 : 0;
    }
    uint64_t ready = now + delay < now ? UINT64_MAX : now + delay;
    uint64_t top = wq__next_ready(q);
    if (fresh) {
        e->t_b = ready;
        e->seq = h->seq_next++;
        if ((rc = wq__commit_new(q, idx, WQ_ST_WAITING)) < 0 ||
            (rc == 0 && (rc = wq__heap_push(q, idx)) < 0))
            return rc;
        rc = 0;
    } else if ((rc = wq__delay_entry(q, idx, ready)) < 0) {
        return rc;
    }
    WQ_STEP("delay.heap");
    h->busy = 0;
    *wake = top == 0 || ready < top;
    if (rc == 1)
        h->coalesced_total++;
    return rc;
}

int wq__add_delayed_prio(wq *q, const void *key, size_t len, bool limited, uint64_t delay,
                         int prio)
{
    if (!q)
        return -EINVAL;
    int rc = wq__key_ok(q, key, len);
    if (rc < 0)
        return rc;
    uint32_t hash = wq__hash(q->seed, key, len);
    for (int tries = 0;; tries++) {
        if ((rc = wq__lock(q)) < 0)
            return rc;
        bool wake = false;
        rc = add_delayed(q, key, len, hash, limited, delay, prio, &wake);
        if (wake)
            wq__wake_getters(q, 1);
        wq__unlock(q);
        if (rc != -WQ_EFLUSH)
            break;
        int room = wq__store_make_room(q, tries);
        if (room < 0)
            return room;
    }
    return wq__store_finish_add(q, key, len, rc);
}

int wq_add_after(wq *q, const void *key, size_t len, uint64_t delay_ns)
{
    return wq__add_delayed_prio(q, key, len, false, delay_ns, 0);
}

int wq_add_rate_limited(wq *q, const void *key, size_t len)
{
    return wq__add_delayed_prio(q, key, len, true, 0, 0);
}

int wq_add_opts(wq *q, const void *key, size_t len, const struct wq_add_opts *o)
{
    if (!o)
        return wq_add(q, key, len);
    if (!q)
        return -EINVAL;
    if (o->priority != 0 && !q->fair)
        return -EINVAL;   /* the default mode stays client-go's */
    if (!o->after_ns && !o->rate_limited)
        return wq__add_prio(q, key, len, o->priority);
    return wq__add_delayed_prio(q, key, len, o->rate_limited, o->after_ns, o->priority);
}
