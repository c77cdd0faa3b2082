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
 * (owner, owner_gen, in its run record); slot->held says whether the scan is
 * needed at all.
 * The generation makes a reused slot never inherit a previous holder's
 * keys. A slot is given up in one place (slot_free), whether its holder
 * died, closed, or was killed on purpose by its supervisor.
 */
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"

enum { LEASE_STARTING, LEASE_HELD, LEASE_STOP };

struct wq_lease {
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* CLOCK_MONOTONIC */
    pthread_mutex_t *target;
    int state;
    int stop;                   /* set (atomically) before the join: an idle
                                   write waiting for the region lock gives up */
    int err;
    shmq *q;                    /* set once registered: the idle reaper's */
};

/* How often a lease thread looks for dead holders on a queue nobody
   waits on, and how old the last reap must be for it to bother. */
#define IDLE_TICK_NS (250ull * 1000 * 1000)
#define IDLE_REAP_NS (500ull * 1000 * 1000)

/*
 * The idle reaper. Dead holders are found by whoever takes the lock, but
 * a queue that nobody gets from (the workers are dead, the producers
 * only add) would keep a dead holder's key forever. So each lease thread
 * looks now and then: if keys are processing and nobody reaped for
 * IDLE_REAP_NS, it takes the region lock, without waiting for it (its own
 * handle may hold it while stopping this very thread), and reaps. A dead
 * holder's key is back within about a second of its death. The same tick
 * writes what the store is due (wq__store_idle: deferred changes, a NONE
 * snapshot, a dead process's marks), which on a queue nobody calls would
 * otherwise wait in the region for the next call; it never waits for the
 * region lock either.
 */
static void idle_reap(shmq *q)
{
    struct wq_hdr *h = q->hdr;
    if (wq_load_relaxed(&h->processing) == 0 ||
        wq__now_mono() - wq_load_relaxed(&h->last_reap_ns) < IDLE_REAP_NS)
        return;
    if (wq__lock_try(q) < 0)
        return;   /* busy: its holder reaps, or we look again soon */
    wq__procs_reap(q);   /* the requeues' failure counts: written below */
    wq__unlock(q);
}

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
    while (l->state != LEASE_STOP) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += (long)IDLE_TICK_NS;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) == ETIMEDOUT && l->q &&
            l->state != LEASE_STOP && rc == 0) {
            shmq *q = l->q;
            pthread_mutex_unlock(&l->mu);
            idle_reap(q);
            wq__store_idle(q, &l->stop);
            pthread_mutex_lock(&l->mu);
        }
    }
    pthread_mutex_unlock(&l->mu);
    if (rc == 0)
        pthread_mutex_unlock(l->target);
    return NULL;
}

static void lease_stop(struct wq_lease *l)
{
    pthread_mutex_lock(&l->mu);
    __atomic_store_n(&l->stop, 1, __ATOMIC_RELEASE);
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
    pthread_condattr_t ca;
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    l->target = target;
    l->state = LEASE_STARTING;

    /* The lease thread must never run the application's signal handlers. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);   /* room for a repair */
    int rc = pthread_create(&l->thr, &attr, lease_main, l);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        free(l);
        /* EAGAIN here means "no thread left", not "try again": callers
           would mistake it for wq_get's "nothing queued". */
        return rc == EAGAIN ? -ENOMEM : -rc;
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

static uint32_t find_free_slot(shmq *q, uint32_t from)
{
    for (uint32_t i = from; i < q->max_procs; i++)
        if (q->procs[i].state == WQ_PROC_FREE)
            return i;
    return WQ_NIL;
}

/*
 * Lock held: does the handle that registered this slot still live? The
 * one liveness probe. EBUSY: it lives (however slow or stopped).
 * EOWNERDEAD: its lease thread died, so its process is gone. 0: a LIVE
 * slot whose lease nobody holds, which only a close cut short between
 * releasing the lease and freeing the slot leaves: gone as well. Any
 * other answer means the lease word itself is damaged: then, and only
 * then, the pid decides (a process that no longer exists is dead; one
 * that exists, or that we may not signal, is taken as alive), so a key is
 * never requeued while its holder may live.
 */
bool wq__lease_alive(struct wq_proc *p)
{
    int rc = pthread_mutex_trylock(&p->lease);
    if (rc == EBUSY)
        return true;
    if (rc == EOWNERDEAD)
        pthread_mutex_consistent(&p->lease);
    if (rc == 0 || rc == EOWNERDEAD) {
        pthread_mutex_unlock(&p->lease);
        return false;
    }
    return !(p->pid > 0 && kill(p->pid, 0) < 0 && errno == ESRCH);
}

/* Lock held. Also used in a forked child, whose inherited handle still
   names the parent's slot and lease thread: neither is ours. */
int wq__procs_register(shmq *q)
{
    unsigned fg = wq_load_relaxed(&wq__fork_gen);
    wq_store_relaxed(&q->lane, WQ_NIL);   /* a lane goes with the slot */
    if (q->forkgen != fg) {
        /* The parent's lease thread does not exist here; its record is
           our private copy: release the memory, touch nothing in it. */
        free(q->lease);
        q->lease = NULL;
        q->slot = WQ_NIL;
        /* A parent's thread may have been publishing at the fork. */
        wq_store_relaxed(&q->lane_busy, 0);
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
    p->sync_mark = q->hdr->sync_prev;   /* in no fsync group (store.c) */
    p->since_ns = wq__now_real();
    WQ_STEP("procs.register.fields");
    p->state = WQ_PROC_LIVE;
    WQ_STEP("procs.register.live");
    q->slot = i;
    q->gen = p->gen;
    q->lease = l;
    q->forkgen = fg;
    pthread_mutex_lock(&l->mu);
    l->q = q;   /* from now on its thread also reaps an idle queue */
    pthread_mutex_unlock(&l->mu);
    return 0;
}

/*
 * Lock held. Give back every entry that slot/gen holds (entry.c,
 * wq__entry_requeue: at once on a close, through the rate limiter after a
 * crash); returns how many. Each entry is one mutation of its own.
 */
static int requeue_owned(shmq *q, uint32_t slot, uint32_t gen, bool crash)
{
    struct wq_proc *p = &q->procs[slot];
    int n = 0;
    bool queued_any = false, damaged = false;
    uint64_t now = wq__now_mono();
    for (uint32_t idx = 0; idx < wq__entries_used(q) && p->held > 0 && !wq__region_broken(q); idx++) {
        struct wq_entry *e = wq__entry(q, idx);
        if (!(wq__st(e) & WQ_ST_PROCESSING))
            continue;
        const struct wq_run *r = wq__entry_run(q, e, idx);
        if (!r) {
            damaged = true;   /* its holder unknown: repair requeues it */
            continue;
        }
        if (r->owner != slot || r->owner_gen != wq__gen16(gen))
            continue;
        wq__mut_begin(q);
        if (wq__mut_end(q, wq__entry_requeue(q, idx, crash, now, &queued_any)) < 0)
            break;   /* corrupt: busy stays set, repair redoes it */
        n++;
    }
    if (damaged)
        wq__region_mark_corrupt(q);   /* after this slot's own keys went back */
    /* A sleeper re-arms for the new earliest ready time, or takes a
       queued key. */
    if (n > 0)
        wq__wake_getters(q, queued_any ? n : 1);
    return n;
}

/*
 * Lock held: the one way a process slot is given up. Its keys go back
 * (as crashes when its holder died, as on a close otherwise), its
 * sleepers stop counting, and the slot is free for the next registrant.
 * Returns the keys given back.
 */
/* Our own handle gives its slot (and lane) up: a thread of ours that is
   publishing to the lane finishes first, so the lane never has two
   writers (lanes.c). Lock held; a publication takes no lock. */
static void lane_quiet(shmq *q)
{
    while (__atomic_exchange_n(&q->lane_busy, 1, __ATOMIC_ACQUIRE))
        wq__cpu_relax();
    wq_store_relaxed(&q->lane, WQ_NIL);
    __atomic_store_n(&q->lane_busy, 0, __ATOMIC_RELEASE);
}

static int slot_free(shmq *q, uint32_t i, bool crash)
{
    struct wq_proc *p = &q->procs[i];
    int n = p->held > 0 ? requeue_owned(q, i, p->gen, crash) : 0;
    if (q->hdr->waiters >= p->waiting)
        wq_sub_relaxed(&q->hdr->waiters, p->waiting);
    if (p->waiting > 0)
        q->hdr->wake_pending = 0;   /* it may have held a wake: wake afresh */
    p->waiting = 0;
    WQ_STEP("reap.waiters");
    wq__lanes_free_slot(q, i);
    p->state = WQ_PROC_FREE;
    return n;
}

/* Lock held: no other handle is attached (the caller holds no slot). */
static bool none_live(shmq *q)
{
    for (uint32_t i = 0; i < q->max_procs; i++)
        if (q->procs[i].state == WQ_PROC_LIVE && wq__lease_alive(&q->procs[i]))
            return false;
    return true;
}

/*
 * The pool's supervisor (pool.c) before it forks: give our slot up, so
 * that max_procs workers fit beside it. Only a slot that holds no key
 * and no sleeping get of ours is given up (-EBUSY otherwise: kept). The
 * handle registers again at its next call that holds or changes keys
 * (wq__lock); looking calls work without a slot.
 */
int wq__shm_park(wq *pub)
{
    shmq *q = wq__shm(pub);
    if (q->pub.observe || q->forkgen != wq_load_relaxed(&wq__fork_gen))
        return 0;   /* no slot of ours: an observer, a forked child's copy */
    int rc = wq__lock_look(q);
    if (rc < 0)
        return rc;
    if (!q->lease) {   /* registration changes under the lock: look now */
        wq__unlock(q);
        return 0;   /* parked already (by another thread) */
    }
    bool ours = wq__slot_held(q);
    if (ours && (q->procs[q->slot].held > 0 || q->procs[q->slot].waiting > 0)) {
        wq__unlock(q);
        return -EBUSY;
    }
    lease_stop(q->lease);   /* the lease is free before the slot is */
    q->lease = NULL;
    lane_quiet(q);   /* its lane goes with the slot */
    if (ours)
        slot_free(q, q->slot, false);
    wq_store_relaxed(&q->slot, WQ_NIL);   /* add_fast reads it unlocked */
    wq__unlock(q);
    return 0;
}

/* wq_close: give back our keys (not a crash), then our slot. Returns
   true when no other live handle is attached: the caller was the last. */
bool wq__procs_unregister(shmq *q)
{
    if (q->forkgen != wq_load_relaxed(&wq__fork_gen)) {
        /* A forked child that took no slot (it only looked, or acted on
           the queue as a whole): the slot and the lease thread named are
           the parent's; only the memory copy is ours. */
        free(q->lease);
        q->lease = NULL;
    }
    if (q->slot == WQ_NIL || !q->lease) {
        /* No slot of ours. An observer's close writes nothing; any other
           handle without one (a forked child's, a supervisor's parked by
           wq__shm_park) may be the last, whose close writes what the
           store lacks (its removals, say). */
        if (q->pub.observe || wq__lock_look(q) < 0)
            return false;
        bool last = none_live(q);
        wq__unlock(q);
        return last;
    }
    bool last = false;
    int rc = wq__lock(q);
    if (rc == 0) {
        struct wq_proc *p = &q->procs[q->slot];
        if (p->held > 0)
            requeue_owned(q, q->slot, q->gen, false);
    }
    if (q->lease)   /* a registration that failed in wq__lock stopped it */
        lease_stop(q->lease);   /* the lease is free before the slot is */
    q->lease = NULL;
    if (rc == 0) {
        WQ_STEP("procs.unregister.lease");
        lane_quiet(q);
        slot_free(q, q->slot, false);
        last = none_live(q);
        wq__unlock(q);
    }
    wq_store_relaxed(&q->lane, WQ_NIL);
    q->slot = WQ_NIL;
    return last;
}

/* Lock held: every coalesced add, those counted under the lock and those
   counted in the slots (layout.h: a slot's count is never reset). */
uint64_t wq__procs_coalesced(const shmq *q)
{
    uint64_t n = q->hdr->coalesced_total;
    for (uint32_t i = 0; i < q->max_procs; i++)
        n += wq_load_relaxed(&q->procs[i].coalesced);
    return n;
}

/* Lock held. Reclaim the slots of dead processes and requeue their keys.
   Returns the number of keys requeued. */
unsigned wq__procs_reap(shmq *q)
{
    unsigned requeued = 0, me = wq__my_slot(q);
    for (uint32_t i = 0; i < q->max_procs; i++) {
        struct wq_proc *p = &q->procs[i];
        if (i == me || p->state == WQ_PROC_FREE || wq__lease_alive(p))
            continue;
        requeued += (unsigned)slot_free(q, i, true);
    }
    q->hdr->last_reap_ns = wq__now_mono();
    q->hdr->reap_tick = 0;
    return requeued;
}

/*
 * Lock held. The caller killed this process on purpose (a pool being
 * stopped): give its keys back like a close would, at the back of the
 * queue without a failure, instead of as crashes. Only slots whose lease
 * says their holder is gone are touched. Returns the keys given back.
 */
int wq__procs_release_pid(shmq *q, pid_t pid)
{
    int n = 0;
    uint32_t me = wq__my_slot(q);
    for (uint32_t i = 0; i < q->max_procs; i++) {
        struct wq_proc *p = &q->procs[i];
        if (p->pid != pid || i == me || p->state != WQ_PROC_LIVE || wq__lease_alive(p))
            continue;
        n += slot_free(q, i, false);
    }
    return n;
}

int wq__shm_release_pid(wq *pub, pid_t pid)
{
    shmq *q = wq__shm(pub);
    int rc = wq__lock_look(q);
    if (rc < 0)
        return rc;
    rc = wq__procs_release_pid(q, pid);
    wq__unlock(q);
    if (rc > 0 && q->g.has_store)
        wq__store_after(q);   /* the released keys' requeues (as wq__shm_check) */
    return rc;
}

/* Lock held. The periodic reap of busy queues: a clock read every
   WQ_REAP_TICKS operations, a table scan every WQ_REAP_INTERVAL_NS. */
void wq__procs_maybe_reap(shmq *q)
{
    if (WQ_LIKELY(++q->hdr->reap_tick < WQ_REAP_TICKS))
        return;
    q->hdr->reap_tick = 0;
    if (wq__now_mono() - q->hdr->last_reap_ns >= WQ_REAP_INTERVAL_NS)
        wq__procs_reap(q);
}
