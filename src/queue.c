/*
 * queue.c - client-go's Interface over the region: wq_add, wq_get,
 * wq_done, wq_len, the shutdown calls and the two fast paths.
 *
 * Each operation is one critical section (hash computed before locking).
 * Mutations follow the commit-point rule of layout.h: the entry's state
 * store decides the outcome, the index, ring, free list and counters
 * follow it and are rebuilt by repair when cut short. hdr->busy brackets
 * every multi-store mutation.
 *
 * Waking: whoever makes a key available while sleepers are counted bumps
 * wake_seq under the lock and issues FUTEX_WAKE(1) after unlocking. A
 * getter that takes a key and sees more queued with sleepers waiting
 * passes the wake on, so a wake consumed by a sleeper that then died or
 * lost the race is not lost for long; sleepers also wake every
 * WQ_REAP_INTERVAL_NS to requeue dead holders' keys.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>

#include "internal.h"

#define key_ok wq__key_ok

/* Lock held: note a wake for one sleeper, to be issued after unlock. */
static inline bool note_wake(wq *q)
{
    if (WQ_LIKELY(q->hdr->waiters == 0))
        return false;
    atomic_fetch_add_explicit(&q->hdr->wake_seq, 1, memory_order_release);
    return true;
}

/* Lock held; rare paths (requeues, shutdown): wake n sleepers now. */
void wq__wake_getters(wq *q, int n)
{
    if (q->hdr->waiters == 0)
        return;
    atomic_fetch_add_explicit(&q->hdr->wake_seq, 1, memory_order_release);
    wq__futex_wake(&q->hdr->wake_seq, n);
}

void wq__wake_drainers(wq *q)
{
    if (q->hdr->drainers == 0)
        return;
    atomic_fetch_add_explicit(&q->hdr->idle_seq, 1, memory_order_release);
    wq__futex_wake(&q->hdr->idle_seq, INT_MAX);
}

static inline void held_dec(wq *q, const struct wq_entry *e)
{
    if (e->owner < q->max_procs) {
        struct wq_proc *p = &q->procs[e->owner];
        if (wq__gen16(p->gen) == e->owner_gen && p->held > 0)
            p->held--;
    }
}

/*
 * Lock and busy held. Take a free entry for a new key and write the key;
 * its state stays 0 (free) until wq__commit_new. NIL with *err = -ENOSPC
 * when `capacity` keys are live, -EBADMSG on a corrupt free list, and
 * -WQ_EFLUSH when the only room is held by removals the store has not
 * seen yet (the caller flushes and retries).
 */
uint32_t wq__new_entry(wq *q, const void *key, size_t len, uint32_t hash, int *err)
{
    if (atomic_load_explicit(&q->hdr->live, memory_order_relaxed) >= q->capacity) {
        *err = -ENOSPC;
        return WQ_NIL;
    }
    uint32_t idx = wq__entry_alloc(q);
    if (idx == WQ_NIL || idx == WQ_LOOKUP_CORRUPT || idx == WQ_EVICTING) {
        *err = idx == WQ_LOOKUP_CORRUPT ? -EBADMSG
             : idx == WQ_EVICTING || q->g.has_store ? -WQ_EFLUSH : -ENOSPC;
        return WQ_NIL;
    }
    WQ_STEP("add.alloc");
    struct wq_entry *e = wq__entry(q, idx);
    memcpy(e->key, key, len);
    e->keylen = (uint16_t)len;
    e->hash = hash;
    e->owner = WQ_OWNER_NONE;
    e->failures = 0;
    e->rslot = WQ_NIL;
    e->seq = q->hdr->seq_next++;
    if (q->fair)
        q->fx[idx].prio = 0;
    WQ_STEP("add.key");
    return idx;
}

/*
 * Lock and busy held. Make a new entry live in `state` (DIRTY|QUEUED or
 * WAITING): the state store commits, then the index and the ring follow.
 * The caller has set t_b (and, for WAITING, pushes it on the heap).
 * With PROCESS or FSYNC durability, and not while restoring, the key
 * starts STORING instead (invisible until stored, store.c): the return
 * value is then 1, and nothing is pushed on the ring or heap.
 */
int wq__commit_new(wq *q, uint32_t idx, uint16_t state)
{
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    bool storing = wq__store_sync_adds(q) && !q->restoring;
    bool queue = (state & WQ_ST_QUEUED) && !storing;
    if (state & WQ_ST_QUEUED)
        wq__pend(q, WQ_PEND_ADD, idx);
    if (storing && (state & WQ_ST_QUEUED))
        e->t_b = 0;   /* "ready at once" when it becomes visible */
    /* Store marks go before the commit they describe: whatever instruction
       a holder dies at, a change the store has not seen is listed. */
    if (!q->restoring)
        wq__store_mark(q, idx);
    if (queue)
        wq__fair_dirty(q, idx);
    wq__set_state(e, storing ? WQ_ST_STORING : state);   /* commit */
    WQ_STEP("add.state");
    int rc = wq__table_insert(q, idx, e->hash);
    if (WQ_UNLIKELY(rc < 0))
        return rc;   /* busy stays set: the next locker rebuilds */
    WQ_STEP("add.index");
    if (queue && WQ_UNLIKELY((rc = wq__enqueue(q, idx)) < 0))
        return rc;
    WQ_STEP("add.ring");
    atomic_fetch_add_explicit(&h->live, 1, memory_order_relaxed);
    if (state & WQ_ST_QUEUED) {
        h->adds_total++;
        wq__pend(q, WQ_PEND_NONE, 0);
    }
    WQ_STEP("add.counters");
    return storing;
}

/*
 * Lock and busy held. The add of a key that has an entry and is not
 * dirty: waiting (leaves the heap), processing (marked dirty, queued at
 * its wq_done), retained, or a zombie awaiting its store removal (both
 * queued). *queued when it entered the ring.
 */
int wq__activate(wq *q, uint32_t idx, uint64_t now, bool *queued)
{
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = wq__st(e);
    int rc;
    if (st != WQ_ST_PROCESSING)   /* the store's class changes */
        wq__store_mark(q, idx);
    if ((st & WQ_ST_WAITING) && (rc = wq__heap_remove(q, idx)) < 0)
        return rc;
    wq__pend(q, WQ_PEND_MARK, idx);
    WQ_STEP("mark.busy");
    /* client-go's waiting loop adds a key at its ready time: queue
       duration counts from then, however late we noticed it. The time is
       written after the commit: before it, t_b is still the ready time
       that a repair would go by. */
    if ((st & WQ_ST_WAITING) && e->t_b < now)
        now = e->t_b;
    wq__fair_dirty(q, idx);   /* fair mode: its place is this moment */
    if (st & WQ_ST_PROCESSING) {
        wq__set_state(e, WQ_ST_PROCESSING | WQ_ST_DIRTY);   /* commit */
        WQ_STEP("add.mark");
        e->t_b = now;
    } else if ((st == 0 || st == WQ_ST_RETAINED) && wq__store_sync_adds(q) &&
               !q->restoring) {
        /* A zombie (its removal may already be written) or an idle key
           (stored as idle): like a new key, it stays invisible until the
           store has it as pending, so nothing is handed out unstored. */
        e->t_b = 0;
        wq__set_state(e, WQ_ST_STORING);   /* commit */
        WQ_STEP("add.mark");
        if (st == WQ_ST_RETAINED)
            h->failing--;
        atomic_fetch_add_explicit(&h->live, 1, memory_order_relaxed);
    } else {
        if (!q->fair)
            e->seq = h->seq_next++;
        wq__set_state(e, WQ_ST_DIRTY | WQ_ST_QUEUED);   /* commit */
        WQ_STEP("add.mark");
        e->t_b = now;
        if ((rc = wq__enqueue(q, idx)) < 0)
            return rc;
        WQ_STEP("mark.ring");
        if (st == WQ_ST_RETAINED)
            h->failing--;
        if (st == WQ_ST_RETAINED || st == 0)
            atomic_fetch_add_explicit(&h->live, 1, memory_order_relaxed);
        *queued = true;
    }
    h->adds_total++;
    wq__pend(q, WQ_PEND_NONE, 0);
    WQ_STEP("mark.counters");
    return 0;
}

/*
 * Lock and busy held: the entry leaves the queue for good. With a store
 * (and `stored`) it stays as a zombie until the store has removed its
 * record (store.c frees it then); at shutdown, dropped waiting keys keep
 * their records (`stored` false) and are freed at once.
 */
int wq__release_as(wq *q, uint32_t idx, bool stored)
{
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = wq__st(e);
    wq__result_drop(q, idx);
    if (st == WQ_ST_RETAINED)
        h->failing--;
    else if (st != 0)
        atomic_fetch_sub_explicit(&h->live, 1, memory_order_relaxed);
    if (q->g.has_store && stored) {
        e->failures = 0;
        wq__store_zombie(q, idx);   /* commit: SDIRTY alone */
        WQ_STEP("release.state");
        return 0;
    }
    e->state = 0;   /* commit: forgotten */
    WQ_STEP("release.state");
    int rc = wq__table_remove(q, idx, e->hash);
    if (rc < 0)
        return rc;
    WQ_STEP("release.index");
    wq__entry_free(q, idx);
    WQ_STEP("release.free");
    return 0;
}

int wq__release(wq *q, uint32_t idx)
{
    return wq__release_as(q, idx, true);
}

/* Lock held. 0 new or marked, 1 coalesced, *queued when a key entered
   the ring. prio: WQ_FAIR priority to merge (0 for plain adds). */
static int add_locked(wq *q, const void *key, size_t len, uint32_t hash, uint64_t now,
                      int prio, bool *queued)
{
    struct wq_hdr *h = q->hdr;
    if (WQ_UNLIKELY(h->shutdown))
        return -ESHUTDOWN;
    uint32_t idx = wq__table_lookup(q, key, len, hash);
    int rc;
    if (idx != WQ_NIL) {
        if (WQ_UNLIKELY(idx == WQ_LOOKUP_CORRUPT))
            return -EBADMSG;
        struct wq_entry *e = wq__entry(q, idx);
        if (e->state & (WQ_ST_DIRTY | WQ_ST_STORING)) {
            h->coalesced_total++;
            if (q->fair) {   /* keeps the higher priority */
                h->busy = 1;
                wq__fair_prio(q, idx, prio, false);
                h->busy = 0;
            }
            return 1;
        }
        h->busy = 1;
        uint16_t st = wq__st(e);
        /* Idle, or processing (the run in progress was handed out: its
           re-add is a new add, as controller-runtime's): its own priority.
           Waiting: merge, keeping the higher. */
        bool fresh = st == WQ_ST_RETAINED || st == 0 || st == WQ_ST_PROCESSING;
        if (q->fair && fresh)
            q->fx[idx].prio = prio;
        else if (q->fair && prio > q->fx[idx].prio)
            q->fx[idx].prio = prio;
        if ((rc = wq__activate(q, idx, now, queued)) < 0)
            return rc;
        h->busy = 0;
        return 0;
    }
    h->busy = 1;
    WQ_STEP("add.busy");
    idx = wq__new_entry(q, key, len, hash, &rc);
    if (idx == WQ_NIL) {
        h->busy = 0;
        return rc;
    }
    wq__entry(q, idx)->t_b = now;
    if (q->fair)
        q->fx[idx].prio = prio;
    if ((rc = wq__commit_new(q, idx, WQ_ST_DIRTY | WQ_ST_QUEUED)) < 0)
        return rc;
    h->busy = 0;
    *queued = rc == 0;
    return 0;
}

/* Lock held. Pop the front into buf: its length, or -EAGAIN if empty.
   Ready waiting keys are queued first. `now` is a clock reading the
   caller already made (before locking, to keep it out of the critical
   section), or 0. */
static int get_locked(wq *q, void *buf, uint64_t now)
{
    struct wq_hdr *h = q->hdr;
    if (now == 0 && (q->metrics || h->heap_count > 0))
        now = wq__now_mono();
    if (h->heap_count > 0)
        wq__promote(q, now);
    uint32_t idx = q->fair ? wq__fair_front(q) : wq__ring_front(q);
    if (idx == WQ_NIL)
        return -EAGAIN;
    if (WQ_UNLIKELY(idx == WQ_LOOKUP_CORRUPT))
        return -EBADMSG;
    struct wq_entry *e = wq__entry(q, idx);
    uint32_t len = e->keylen;
    if (WQ_UNLIKELY(!(e->state & WQ_ST_QUEUED) || len == 0 || len > q->max_key_len))
        return -EBADMSG;
    memcpy(buf, e->key, len);
    h->busy = 1;
    WQ_STEP("get.busy");
    e->owner = (uint16_t)q->slot;
    e->owner_gen = wq__gen16(q->gen);
    e->t_start = now;
    WQ_STEP("get.owner");
    wq__set_state(e, WQ_ST_PROCESSING);   /* commit */
    WQ_STEP("get.state");
    if (q->fair)
        wq__fair_pop(q, idx);
    else
        wq__ring_pop(q);
    WQ_STEP("get.ring");
    atomic_fetch_add_explicit(&h->processing, 1, memory_order_relaxed);
    q->procs[q->slot].held++;
    if (q->metrics) {
        wq__observe(&h->qdur, now > e->t_b ? now - e->t_b : 0);
        h->sum_start += now;
    }
    WQ_STEP("get.counters");
    h->busy = 0;
    return (int)len;
}

/* Lock held. *queued when a re-added key went back into the ring. */
/* An outcome to record with a done (wq_finish), or none (wq_done). */
struct outcome {
    bool record;
    int code;
    const char *message;
};
static const struct outcome NO_OUTCOME = { false, 0, NULL };

static int done_locked(wq *q, const void *key, size_t len, uint32_t hash, uint64_t now,
                       struct outcome out, bool *queued)
{
    struct wq_hdr *h = q->hdr;
    uint32_t idx = wq__table_lookup(q, key, len, hash);
    if (idx == WQ_NIL)
        return -ENOENT;
    if (WQ_UNLIKELY(idx == WQ_LOOKUP_CORRUPT))
        return -EBADMSG;
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = wq__st(e);
    if (!(st & WQ_ST_PROCESSING))
        return -ENOENT;
    int rc = 0;
    h->busy = 1;
    WQ_STEP("done.busy");
    /* The outcome first: a holder killed before the state commit leaves
       the key processing (requeued as a crash) with its outcome kept. */
    if (out.record) {
        wq__store_mark(q, idx);
        if ((rc = wq__result_record(q, idx, out.code, out.message)) < 0)
            return rc;
    }
    if (st & WQ_ST_DIRTY) {
        if (!q->fair)
            e->seq = h->seq_next++;   /* client-go: the back of the queue */
        wq__set_state(e, WQ_ST_DIRTY | WQ_ST_QUEUED);   /* commit */
        WQ_STEP("done.state");
        if ((rc = wq__enqueue(q, idx)) < 0)
            return rc;
        WQ_STEP("done.ring");
        *queued = true;
    } else if (st & WQ_ST_WAITING) {
        wq__store_mark(q, idx);
        wq__set_state(e, WQ_ST_WAITING);   /* commit: still waiting for its delay */
        WQ_STEP("done.state");
    } else if (e->failures > 0 || wq__has_result(q, e)) {
        wq__store_mark(q, idx);
        wq__set_state(e, WQ_ST_RETAINED);   /* commit: idle, keeps its count or result */
        WQ_STEP("done.state");
        h->failing++;
        atomic_fetch_sub_explicit(&h->live, 1, memory_order_relaxed);
    } else if ((rc = wq__release(q, idx)) < 0) {
        return rc;
    }
    if (q->metrics) {
        wq__observe(&h->wdur, now - e->t_start);
        h->sum_start -= e->t_start;
    }
    held_dec(q, e);
    uint32_t left = atomic_fetch_sub_explicit(&h->processing, 1, memory_order_relaxed) - 1;
    WQ_STEP("done.counters");
    h->busy = 0;
    if (left == 0)
        wq__wake_drainers(q);
    return 0;
}

/* Lock held on entry, released on return: hand out a key or sleep. */
static int get_wait(wq *q, void *buf, uint64_t deadline, uint64_t now)
{
    struct wq_hdr *h = q->hdr;
    for (;; now = 0) {
        int n = get_locked(q, buf, now);
        if (n > 0) {
            bool more = wq__queued(q) > 0 && note_wake(q);
            wq__unlock(q);
            if (more)
                wq__futex_wake(&h->wake_seq, 1);
            return n;
        }
        if (n == -EAGAIN && h->shutdown)
            n = -ESHUTDOWN;
        else if (n == -EAGAIN && wq__procs_reap(q) > 0)
            continue;   /* a dead holder's key may be first in line now */
        if (n != -EAGAIN || deadline == 0) {
            wq__unlock(q);
            return n;
        }
        now = wq__now_mono();
        if (now >= deadline) {
            wq__unlock(q);
            return -ETIMEDOUT;
        }
        uint64_t until = now + WQ_REAP_INTERVAL_NS < deadline ? now + WQ_REAP_INTERVAL_NS
                                                              : deadline;
        uint64_t ready = wq__next_ready(q);   /* sleep no longer than a delay */
        if (ready && ready < until)
            until = ready > now ? ready : now + 1;
        uint32_t seq = atomic_load_explicit(&h->wake_seq, memory_order_acquire);
        struct wq_proc *me = &q->procs[q->slot];
        h->waiters++;
        me->waiting++;
        wq__unlock(q);
        wq__futex_wait(&h->wake_seq, seq, until);
        int rc = wq__lock(q);
        if (rc < 0)
            return rc;
        me = &q->procs[q->slot];
        if (h->waiters > 0)
            h->waiters--;
        if (me->waiting > 0)
            me->waiting--;
    }
}

int wq__add_prio(wq *q, const void *key, size_t len, int prio)
{
    if (!q)
        return -EINVAL;
    int rc = key_ok(q, key, len);
    if (rc < 0)
        return rc;
    uint32_t hash = wq__hash(q->seed, key, len);
    /* The index slot is a likely cache miss: start it while we lock. */
    __builtin_prefetch(&q->index[wq__home(q, hash)]);
    uint64_t now = wq__metrics_now(q);
    for (int tries = 0;; tries++) {
        if ((rc = wq__lock(q)) < 0)
            return rc;
        bool queued = false;
        rc = add_locked(q, key, len, hash, now, prio, &queued);
        bool wake = queued && note_wake(q);
        wq__unlock(q);
        if (wake)
            wq__futex_wake(&q->hdr->wake_seq, 1);
        if (rc != -WQ_EFLUSH)
            break;
        int room = wq__store_make_room(q, tries);
        if (room < 0)
            return room;
    }
    return wq__store_finish_add(q, key, len, rc);
}

int wq_add(wq *q, const void *key, size_t len)
{
    return wq__add_prio(q, key, len, 0);
}

static int get_args(wq *q, void *buf, size_t cap, int64_t timeout_ns, uint64_t *deadline)
{
    if (!q || !buf)
        return -EINVAL;
    if (cap < q->max_key_len)
        return -ENOBUFS;
    return wq__deadline(timeout_ns, deadline);
}

int wq_get(wq *q, void *buf, size_t cap, int64_t timeout_ns)
{
    uint64_t deadline;
    int rc = get_args(q, buf, cap, timeout_ns, &deadline);
    if (rc < 0)
        return rc;
    uint64_t now = wq__metrics_now(q);
    if ((rc = wq__lock(q)) < 0)
        return rc;
    wq__procs_maybe_reap(q);
    rc = get_wait(q, buf, deadline, now);
    if (WQ_UNLIKELY(q->g.has_store))
        wq__store_after(q);   /* crash requeues, periodic snapshots */
    return rc;
}

static int done_call(wq *q, const void *key, size_t len, struct outcome out)
{
    if (!q)
        return -EINVAL;
    int rc = key_ok(q, key, len);
    if (rc < 0)
        return rc;
    uint32_t hash = wq__hash(q->seed, key, len);
    __builtin_prefetch(&q->index[wq__home(q, hash)]);
    uint64_t now = wq__metrics_now(q);
    if ((rc = wq__lock(q)) < 0)
        return rc;
    bool queued = false;
    rc = done_locked(q, key, len, hash, now, out, &queued);
    bool wake = queued && note_wake(q);
    wq__unlock(q);
    if (wake)
        wq__futex_wake(&q->hdr->wake_seq, 1);
    /* The done is applied; a removal the store cannot take now stays
       listed and is written by a later flush (wq.h, Persistence). */
    if (rc >= 0)
        wq__store_after(q);
    return rc;
}

int wq_done(wq *q, const void *key, size_t len)
{
    return done_call(q, key, len, NO_OUTCOME);
}

int wq_finish(wq *q, const void *key, size_t len, int code, const char *message)
{
    struct outcome out = { true, code, message };
    return done_call(q, key, len, out);
}

int wq_done_get(wq *q, const void *done_key, size_t done_len, void *buf, size_t cap,
                int64_t timeout_ns)
{
    uint64_t deadline;
    int rc = get_args(q, buf, cap, timeout_ns, &deadline);
    if (rc < 0 || (rc = key_ok(q, done_key, done_len)) < 0)
        return rc;
    uint32_t hash = wq__hash(q->seed, done_key, done_len);
    uint64_t now = wq__metrics_now(q);   /* one reading serves both halves */
    if ((rc = wq__lock(q)) < 0)
        return rc;
    bool queued = false;
    rc = done_locked(q, done_key, done_len, hash, now, NO_OUTCOME, &queued);
    if (rc < 0) {
        wq__unlock(q);
        return rc;
    }
    /* A key we just requeued may be handed straight back to us; any
       sleeper is woken by get_wait's pass-on if more remain. */
    wq__procs_maybe_reap(q);
    rc = get_wait(q, buf, deadline, now);
    if (WQ_UNLIKELY(q->g.has_store)) {
        int st = wq__store_after(q);   /* the done's removal, before we return */
        if (st < 0 && rc >= 0)
            rc = st;   /* the key is still ours: the caller sees the error */
    }
    return rc;
}

/* Exact number of distinct keys in the batch that have no entry yet. */
static int count_new(wq *q, const struct iovec *keys, const uint32_t *hashes, size_t n,
                     size_t *out)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    uint32_t *seen = calloc(cap, sizeof *seen);   /* batch index + 1 */
    if (!seen)
        return -ENOMEM;
    size_t fresh = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t idx = wq__table_lookup(q, keys[i].iov_base, keys[i].iov_len, hashes[i]);
        if (idx == WQ_LOOKUP_CORRUPT) {
            free(seen);
            return -EBADMSG;
        }
        if (idx != WQ_NIL)
            continue;
        size_t s = hashes[i] & (cap - 1);
        for (;; s = (s + 1) & (cap - 1)) {
            if (seen[s] == 0) {
                seen[s] = (uint32_t)i + 1;
                fresh++;
                break;
            }
            const struct iovec *o = &keys[seen[s] - 1];
            if (hashes[seen[s] - 1] == hashes[i] && o->iov_len == keys[i].iov_len &&
                memcmp(o->iov_base, keys[i].iov_base, o->iov_len) == 0)
                break;
        }
    }
    free(seen);
    *out = fresh;
    return 0;
}

int wq_add_many(wq *q, const struct iovec *keys, size_t n)
{
    uint32_t stack_h[64], *hashes = stack_h;
    int rc;
    if (!q || (!keys && n > 0) || n > INT_MAX)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if ((rc = key_ok(q, keys[i].iov_base, keys[i].iov_len)) < 0)
            return rc;
    if (n == 0)
        return 0;
    if (n > 64 && !(hashes = malloc(n * sizeof *hashes)))
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        hashes[i] = wq__hash(q->seed, keys[i].iov_base, keys[i].iov_len);
    if ((rc = wq__lock(q)) < 0)
        goto out;
    if (q->hdr->shutdown) {
        rc = -ESHUTDOWN;
        goto unlock;
    }
    size_t room = q->capacity - atomic_load_explicit(&q->hdr->live, memory_order_relaxed);
    if (n > room) {   /* may not fit: count exactly before changing anything */
        size_t fresh;
        if ((rc = count_new(q, keys, hashes, n, &fresh)) < 0)
            goto unlock;
        if (fresh > room) {
            rc = -ENOSPC;
            goto unlock;
        }
    }
    int coalesced = 0, queued_n = 0;
    uint64_t now = wq__metrics_now(q);
    for (size_t i = 0; i < n; i++) {
        bool queued = false;
        rc = add_locked(q, keys[i].iov_base, keys[i].iov_len, hashes[i], now, 0, &queued);
        if (rc < 0)
            goto unlock;
        coalesced += rc;
        queued_n += queued;
    }
    rc = coalesced;
    if (queued_n > 0)
        wq__wake_getters(q, queued_n);
unlock:
    wq__unlock(q);
    if (rc >= 0 && q->g.has_store) {
        int st = wq__store_after(q);
        if (st < 0)
            rc = st;
    }
out:
    if (hashes != stack_h)
        free(hashes);
    return rc == -WQ_EFLUSH ? -ENOSPC : rc;
}

int wq_len(wq *q)
{
    if (!q)
        return -EINVAL;
    uint32_t n = wq__queued(q);
    return n <= q->capacity ? (int)n : -EBADMSG;
}

int wq_shutdown(wq *q)
{
    if (!q)
        return -EINVAL;
    int rc = wq__lock(q);
    if (rc < 0)
        return rc;
    q->hdr->shutdown = 1;
    q->hdr->shutdown_calls++;
    wq__drop_waiting(q);
    atomic_fetch_add_explicit(&q->hdr->wake_seq, 1, memory_order_release);
    atomic_fetch_add_explicit(&q->hdr->idle_seq, 1, memory_order_release);
    wq__unlock(q);
    wq__futex_wake(&q->hdr->wake_seq, INT_MAX);
    wq__futex_wake(&q->hdr->idle_seq, INT_MAX);
    return 0;
}

int wq_shutdown_drain(wq *q, int64_t timeout_ns)
{
    uint64_t deadline;
    if (!q)
        return -EINVAL;
    int rc = wq__deadline(timeout_ns, &deadline);
    if (rc < 0 || (rc = wq__lock(q)) < 0)
        return rc;
    struct wq_hdr *h = q->hdr;
    h->shutdown = 1;
    wq__drop_waiting(q);
    uint32_t calls = h->shutdown_calls;
    atomic_fetch_add_explicit(&h->wake_seq, 1, memory_order_release);
    wq__futex_wake(&h->wake_seq, INT_MAX);
    h->drainers++;
    for (;;) {
        if (atomic_load_explicit(&h->processing, memory_order_relaxed) == 0) {
            rc = 0;
            break;
        }
        if (h->shutdown_calls != calls) {
            rc = -ECANCELED;
            break;
        }
        if (wq__procs_reap(q) > 0)
            continue;
        uint64_t now = wq__now_mono();
        if (now >= deadline) {
            rc = -ETIMEDOUT;
            break;
        }
        uint64_t until = now + WQ_REAP_INTERVAL_NS < deadline ? now + WQ_REAP_INTERVAL_NS
                                                              : deadline;
        uint32_t seq = atomic_load_explicit(&h->idle_seq, memory_order_acquire);
        wq__unlock(q);
        wq__futex_wait(&h->idle_seq, seq, until);
        if ((rc = wq__lock(q)) < 0)
            return rc;
    }
    if (h->drainers > 0)
        h->drainers--;
    wq__unlock(q);
    return rc;
}

bool wq_shutting_down(wq *q)
{
    return q && __atomic_load_n(&q->hdr->shutdown, __ATOMIC_RELAXED) != 0;
}
