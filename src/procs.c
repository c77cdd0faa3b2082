/*
 * procs.c - the process table: registration, leases, dead-holder reaping.
 *
 * Each handle owns one slot of the process table. Liveness is a lease: a
 * robust process-shared mutex in the slot, locked for the handle's whole
 * life by a small lease thread that libwq starts for the handle. A robust
 * mutex belongs to a thread, so holding it from the thread that called
 * wq_open would make the handle look dead as soon as that thread exits;
 * the lease thread lives exactly as long as the handle instead.
 *
 * Probing a slot: pthread_mutex_trylock on its lease.
 *   EBUSY       the holder lives (however slow, or stopped by SIGSTOP).
 *   EOWNERDEAD  every thread of the holder's process is gone: it is dead.
 *   0           a LIVE slot nobody holds: its lease thread unlocked it,
 *               which only a close cut short does: dead as well.
 * PID reuse cannot fool this (the kernel marks the robust futex from the
 * dying thread's own list), and neither can a process in another PID
 * namespace that shares /dev/shm.
 *
 * Registration and release run under the region lock. Their commit point
 * is the slot's state store: a registrant killed before it leaves a FREE
 * slot (whose lease may be EOWNERDEAD; whoever locks it next makes it
 * consistent), one killed after it leaves a LIVE slot with a dead lease,
 * which the next reap reclaims.
 *
 * Keys held by a dead slot are found by scanning the entries for
 * (owner, owner_gen); slot->held says whether the scan is needed at all.
 * The generation makes a reused slot never inherit a previous holder's
 * keys.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"

enum { LEASE_STARTING, LEASE_HELD, LEASE_STOP };

struct wq_lease {
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t *target;
    int state;
    int err;
};

static void *lease_main(void *arg)
{
    struct wq_lease *l = arg;
    /* trylock: a FREE slot whose lease is held (a corrupt table) is not
       ours to wait for; registration moves on to another slot. */
    int rc = pthread_mutex_trylock(l->target);
    if (rc == EOWNERDEAD) {   /* a previous holder of this slot died */
        pthread_mutex_consistent(l->target);
        rc = 0;
    }
    pthread_mutex_lock(&l->mu);
    l->err = -rc;
    l->state = LEASE_HELD;
    pthread_cond_broadcast(&l->cv);
    while (l->state != LEASE_STOP)
        pthread_cond_wait(&l->cv, &l->mu);
    pthread_mutex_unlock(&l->mu);
    if (rc == 0)
        pthread_mutex_unlock(l->target);
    return NULL;
}

static void lease_stop(struct wq_lease *l)
{
    pthread_mutex_lock(&l->mu);
    l->state = LEASE_STOP;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thr, NULL);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

/* Start a thread that locks `target` and holds it until lease_stop. */
static int lease_start(pthread_mutex_t *target, struct wq_lease **out)
{
    struct wq_lease *l = calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->target = target;
    l->state = LEASE_STARTING;

    /* The lease thread must never run the application's signal handlers. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    int rc = pthread_create(&l->thr, &attr, lease_main, l);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        free(l);
        return -rc;
    }
    pthread_mutex_lock(&l->mu);
    while (l->state == LEASE_STARTING)
        pthread_cond_wait(&l->cv, &l->mu);
    rc = l->err;
    pthread_mutex_unlock(&l->mu);
    if (rc < 0) {
        lease_stop(l);
        return rc;
    }
    *out = l;
    return 0;
}

static uint32_t find_free_slot(wq *q, uint32_t from)
{
    for (uint32_t i = from; i < q->max_procs; i++)
        if (q->procs[i].state == WQ_PROC_FREE)
            return i;
    return WQ_NIL;
}

/* Lock held: does someone hold this slot's lease? */
bool wq__lease_held(struct wq_proc *p)
{
    int rc = pthread_mutex_trylock(&p->lease);
    if (rc == EBUSY)
        return true;
    if (rc == EOWNERDEAD)
        pthread_mutex_consistent(&p->lease);
    if (rc == 0 || rc == EOWNERDEAD)
        pthread_mutex_unlock(&p->lease);
    return false;
}

/* Lock held. Also used in a forked child, whose inherited handle still
   names the parent's slot and lease thread: neither is ours. */
int wq__procs_register(wq *q)
{
    unsigned fg = atomic_load_explicit(&wq__fork_gen, memory_order_relaxed);
    if (atomic_load_explicit(&q->forkgen, memory_order_relaxed) != fg) {
        /* The parent's lease thread does not exist here; its record is
           our private copy: release the memory, touch nothing in it. */
        free(q->lease);
        q->lease = NULL;
        q->slot = WQ_NIL;
    } else if (q->lease) {
        /* Our slot was taken from us (a corrupt table repaired): give up
           its lease and register afresh; the keys we held went back. */
        lease_stop(q->lease);
        q->lease = NULL;
        q->slot = WQ_NIL;
    }
    struct wq_lease *l = NULL;
    uint32_t i = WQ_NIL;
    int rc = -EUSERS;
    for (int pass = 0; pass < 2 && !l; pass++) {
        if (pass == 1)
            wq__procs_reap(q);
        for (i = find_free_slot(q, 0); i != WQ_NIL; i = find_free_slot(q, i + 1)) {
            rc = lease_start(&q->procs[i].lease, &l);
            if (rc == 0)
                break;
            if (rc != -EBUSY)
                return rc;
        }
    }
    if (!l)
        return rc == -EBUSY ? -EUSERS : rc;
    struct wq_proc *p = &q->procs[i];
    p->pid = (int32_t)getpid();
    p->gen++;
    p->held = 0;
    p->waiting = 0;
    p->since_ns = wq__now_real();
    WQ_STEP("procs.register.fields");
    p->state = WQ_PROC_LIVE;
    WQ_STEP("procs.register.live");
    q->slot = i;
    q->gen = p->gen;
    q->lease = l;
    atomic_store_explicit(&q->forkgen, fg, memory_order_relaxed);
    return 0;
}

/* wq_close: give back our keys (not a crash), then our slot. */
void wq__procs_unregister(wq *q)
{
    unsigned fg = atomic_load_explicit(&wq__fork_gen, memory_order_relaxed);
    if (atomic_load_explicit(&q->forkgen, memory_order_relaxed) != fg) {
        /* A forked child that never used the handle: the slot and the
           lease thread are the parent's; only the memory copy is ours. */
        free(q->lease);
        q->lease = NULL;
        return;
    }
    if (q->slot == WQ_NIL || !q->lease)
        return;
    int rc = wq__lock(q);
    if (rc == 0) {
        struct wq_proc *p = &q->procs[q->slot];
        wq__requeue_owned(q, q->slot, q->gen, false);
        if (q->hdr->waiters >= p->waiting)
            q->hdr->waiters -= p->waiting;
        p->waiting = 0;
    }
    lease_stop(q->lease);   /* the lease is free before the slot is */
    q->lease = NULL;
    if (rc == 0) {
        WQ_STEP("procs.unregister.lease");
        q->procs[q->slot].state = WQ_PROC_FREE;
        wq__unlock(q);
    }
    q->slot = WQ_NIL;
}

/*
 * Lock held. Give back every entry that slot/gen holds; returns how many.
 * On close (crash false) each goes to the back of the queue at once. After
 * a crash it goes through the rate limiter, as the API promises: its
 * failure count rises, so a key that kills every worker backs off; it
 * waits for the limiter's delay (keeping an earlier wait it had). Each
 * commits with the entry's state store; repair redoes what follows.
 */
int wq__requeue_owned(wq *q, uint32_t slot, uint32_t gen, bool crash)
{
    struct wq_hdr *h = q->hdr;
    struct wq_proc *p = &q->procs[slot];
    int n = 0, rc;
    bool queued_any = false;
    if (p->held == 0)
        return 0;
    uint64_t now = wq__now_mono();
    for (uint32_t idx = 0; idx < q->capacity && p->held > 0; idx++) {
        struct wq_entry *e = wq__entry(q, idx);
        uint16_t st = wq__st(e);
        if (!(st & WQ_ST_PROCESSING) || e->owner != slot || e->owner_gen != wq__gen16(gen))
            continue;
        h->busy = 1;
        if (crash)
            wq__pend(q, WQ_PEND_CRASH, idx);
        WQ_STEP("requeue.busy");
        uint64_t delay = crash ? wq__limiter_when(q, e, now) : 0;
        /* The failure counts either way; but a key re-added meanwhile has
           an acknowledged add pending, and after shutdown nothing fires:
           both go back to the queue at once. */
        if ((st & WQ_ST_DIRTY) || h->shutdown)
            delay = 0;
        if (crash)
            wq__store_mark(q, idx);   /* its failure count rose */
        if (delay > 0) {
            uint64_t ready = now + delay < now ? UINT64_MAX : now + delay;
            bool waiting = st & WQ_ST_WAITING;
            if (!waiting) {
                e->t_b = ready;
                e->seq = h->seq_next++;
            } else if (ready < e->t_b) {
                e->t_b = ready;
            }
            wq__set_state(e, WQ_ST_WAITING);   /* commit */
            WQ_STEP("requeue.state");
            if (waiting)
                wq__heap_earlier(q, idx);
            else if ((rc = wq__heap_push(q, idx)) < 0)
                return n;   /* corrupt: busy stays set, repair redoes it */
        } else {
            if ((st & WQ_ST_WAITING) && wq__heap_remove(q, idx) < 0)
                return n;
            e->t_b = now;
            e->seq = h->seq_next++;
            if (!(st & WQ_ST_DIRTY))
                wq__fair_dirty(q, idx);   /* a re-added key keeps its place */
            wq__set_state(e, WQ_ST_DIRTY | WQ_ST_QUEUED);   /* commit */
            WQ_STEP("requeue.state");
            if (wq__enqueue(q, idx) < 0)
                return n;
            queued_any = true;
        }
        WQ_STEP("requeue.ring");
        atomic_fetch_sub_explicit(&h->processing, 1, memory_order_relaxed);
        if (q->metrics)
            h->sum_start -= e->t_start;
        p->held--;
        if (crash) {
            h->crash_requeues_total++;
            h->retries_total++;
        }
        wq__pend(q, WQ_PEND_NONE, 0);
        WQ_STEP("requeue.counters");
        h->busy = 0;
        n++;
    }
    if (n > 0) {
        /* A sleeper re-arms for the new earliest ready time, or takes a
           queued key. */
        wq__wake_getters(q, queued_any ? n : 1);
        if (atomic_load_explicit(&h->processing, memory_order_relaxed) == 0)
            wq__wake_drainers(q);
    }
    return n;
}

static bool holder_dead(struct wq_proc *p)
{
    int rc = pthread_mutex_trylock(&p->lease);
    if (rc == EOWNERDEAD)
        pthread_mutex_consistent(&p->lease);
    else if (rc != 0)
        return false;   /* EBUSY: alive */
    pthread_mutex_unlock(&p->lease);
    return true;
}

/* Lock held. Reclaim the slots of dead processes and requeue their keys.
   Returns the number of keys requeued. */
unsigned wq__procs_reap(wq *q)
{
    unsigned requeued = 0;
    for (uint32_t i = 0; i < q->max_procs; i++) {
        struct wq_proc *p = &q->procs[i];
        if (i == q->slot || p->state != WQ_PROC_LIVE || !holder_dead(p))
            continue;
        requeued += (unsigned)wq__requeue_owned(q, i, p->gen, true);
        if (q->hdr->waiters >= p->waiting)
            q->hdr->waiters -= p->waiting;
        p->waiting = 0;
        WQ_STEP("reap.waiters");
        p->state = WQ_PROC_FREE;
    }
    q->hdr->last_reap_ns = wq__now_mono();
    q->hdr->reap_tick = 0;
    return requeued;
}

/*
 * Lock held. The caller killed these processes on purpose (a pool being
 * stopped): give their keys back like a close would, at the back of the
 * queue without a failure, instead of as crashes. Only slots whose lease
 * says their holder is gone are touched.
 */
void wq__procs_release_pids(wq *q, const pid_t *pids, unsigned n)
{
    for (uint32_t i = 0; i < q->max_procs; i++) {
        struct wq_proc *p = &q->procs[i];
        bool ours = false;
        for (unsigned k = 0; k < n && !ours; k++)
            ours = pids[k] == p->pid;
        if (!ours || i == q->slot || p->state != WQ_PROC_LIVE || !holder_dead(p))
            continue;
        wq__requeue_owned(q, i, p->gen, false);
        if (q->hdr->waiters >= p->waiting)
            q->hdr->waiters -= p->waiting;
        p->waiting = 0;
        WQ_STEP("reap.waiters");
        p->state = WQ_PROC_FREE;
    }
}

/* Lock held. The periodic reap of busy queues: a clock read every
   WQ_REAP_TICKS operations, a table scan every WQ_REAP_INTERVAL_NS. */
void wq__procs_maybe_reap(wq *q)
{
    if (WQ_LIKELY(++q->hdr->reap_tick < WQ_REAP_TICKS))
        return;
    q->hdr->reap_tick = 0;
    if (wq__now_mono() - q->hdr->last_reap_ns >= WQ_REAP_INTERVAL_NS)
        wq__procs_reap(q);
}
