/*
 * lock.c - the region lock: one robust, process-shared mutex.
 *
 * On EOWNERDEAD the new owner repairs the region (repair.c) and only then
 * calls pthread_mutex_consistent(); unlocking without it would leave the
 * mutex ENOTRECOVERABLE for everyone. If the dead holder was not in the
 * middle of a mutation (hdr->busy == 0) nothing needs rebuilding.
 *
 * A region whose busy flag is found set on a normal acquisition (a
 * mutation that failed half way, mutate.h rule 2, or a repair that failed
 * and was marked consistent so others get errors instead of a dead lock)
 * is repaired again here, as is one a holder flagged corrupt.
 *
 * wq__lock also registers the process (procs.c) when the handle holds no
 * slot: in a forked child's first call, after the pool's supervisor gave
 * its slot up (wq__shm_park). It is the lock of the calls that hold or
 * change keys; the calls that only look, or act on the queue as a whole,
 * take wq__lock_look, which never registers, so they work with a full
 * table and do not take back a slot given up.
 * wq__lock_consumer is wq__lock for the calls that take or finish keys
 * (get, done and their batches): they back off (acquire below), if
 * their caller hammers the lock, as wq__lock_enter at their start and
 * wq__lock_leave at their end measure. Other calls between two of them
 * (an add inside a reconcile) count as the caller's work.
 * wq__unlock issues the futex wakes the holder owed (wait.c): waking
 * after the unlock means a woken sleeper never blocks on our lock.
 * Every acquisition applies the adds published to lanes (lanes.c) before
 * the caller does anything: queue.c applies them, through the one add
 * path (the one call from here up).
 *
 * Mutex set-up checks every attribute call (as LMDB's lock-table set-up
 * does): a region must never be published with a lock that is not robust
 * and process-shared.
 */
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"

int wq__mutex_init(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    int rc = pthread_mutexattr_init(&a);
    if (rc)
        return -rc;
    if (WQ_FAIL("mutex.attr"))
        rc = ENOTSUP;
    if (!rc)
        rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (!rc)
        rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    if (!rc)
        rc = pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
    return -rc;
}

#ifdef WQ_DEBUG
/* One address per thread: who holds the lock, for WQ_ASSERT_LOCKED. */
static _Thread_local char me;

bool wq__lock_held(const shmq *q)
{
    return wq_load_relaxed(&q->holder) == (const void *)&me;
}
#define HOLDER_SET(q) wq_store_relaxed(&(q)->holder, (const void *)&me)
#define HOLDER_CLEAR(q) wq_store_relaxed(&(q)->holder, (const void *)NULL)
#else
#define HOLDER_SET(q) ((void)0)
#define HOLDER_CLEAR(q) ((void)0)
#endif

static int recover(shmq *q)
{
    /* A holder killed in or just after a doubling of the index or ring,
       outside a mutation (a batch's room, repair not needed), left pages
       in the unused area: give them back (a no-op on an empty area). */
    if (q->index_slots > 0)
        wq__region_release_area(q, false, q->index != q->iarea[1], 0);
    if (q->ring_slots > 0)
        wq__region_release_area(q, true, q->ring != q->rarea[1], 0);
    int rc = wq__repair(q, true, false, NULL, NULL);
    q->hdr->repairs_total++;
    /* It may have died applying lanes, between an add and its retiring:
       recount the grants, and apply every lane that holds adds. */
    wq__lanes_verify(q, true, NULL, NULL);
    /* Consistent even if repair failed: the next locker sees busy set and
       retries, instead of everyone being locked out for good. */
    pthread_mutex_consistent(&q->hdr->lock);
    return rc < 0 ? rc : 0;
}

/* A mutation left half done, or a structure a holder found damaged:
   repaired, and counted as recover()'s repairs are (wq_stats). A repair
   that failed is not counted: the next locker tries again. (wq__repair
   returns the violations it found and fixed, often more than 0.) */
static int damage(shmq *q)
{
    int rc = wq__repair(q, true, q->hdr->corrupt != 0, NULL, NULL);
    if (rc < 0)
        return rc;
    q->hdr->repairs_total++;
    return 0;
}

static void release(shmq *q)
{
    HOLDER_CLEAR(q);
    q->wake_get = 0;
    q->wake_idle = false;
    pthread_mutex_unlock(&q->hdr->lock);
}

/*
 * Spin, then sleep. Under contention between processes the lock is held
 * for well under a microsecond, while sleeping in the kernel and being
 * woken costs several (a futex wait, a wake syscall by the holder, a
 * context switch on each side). So a locker that finds the lock taken
 * retries for a while first: SPIN_TRIES trylocks, SPIN_PAUSES cpu pauses
 * apart (about 0.4 us each on this project's 2-vCPU AMD VM; at most some
 * 20 us in all), then blocks in pthread_mutex_lock as before. Measured
 * with wqbench on that VM (tools/PERFORMANCE.md, "Many processes"): 50
 * tries doubled drain with two consumers and mpmc; 200 was no better and
 * 2000 worse (a spinner that outlasts the holder's time slice only
 * delays it). trylock keeps the robust mutex's EOWNERDEAD path intact.
 *
 * Consumers back off instead when work is plentiful (tools/PERFORMANCE.md,
 * "Consumers that step aside"). Moving the lock between vCPUs costs more
 * than what it guards: on this VM a written cache line takes 220-235 ns
 * to reach the other vCPU (two processes bouncing one line; bare metal
 * takes 40-80, the project's later Intel VM 66, where two consumers
 * drain at parity with one), a whole get and done in one process about
 * 300 ns, and a hand-off moves the lock, the header, the ring and the
 * entry. Two consumers taking turns key by key ran at 0.3x of one, on
 * both VMs. So a consumer that finds the lock taken by another consumer
 * while at least BACKOFF_DEPTH keys are queued tries BACKOFF_TRIES
 * times, then naps and tries again, up to NAPS times (NAP_NS asked; with
 * Linux's default 50 us timer slack a nap lasts about 190 us on that VM,
 * 4 ms in all), then spins and blocks as above.
 * Meanwhile the holder takes the lock again and again from its own cache,
 * at one process's speed, without a wake to pay: a napper is not a futex
 * waiter. That is also why the naps are bounded: no release wakes a
 * napper, so a consumer behind a long holder (a repair, a growth, a
 * stopped process) waits in the kernel after some 4 ms, where the
 * release wakes it.
 *
 * With fewer keys queued a nap would delay the very key being added (the
 * add-to-get p99 at a paced 50,000 adds/s went from 60 to 100-180 us when
 * every consumer napped), so such a consumer never naps; the length is
 * read again before each nap. Adders never nap, so a producer is
 * not starved by its consumers; nor does a getter woken from its sleep
 * (wait.c), since a key waits for it. Nor does a consumer nap behind an
 * adder, or any holder but a get or a done (hdr->holder_consumer says
 * which locked last; a getter relocking after its sleep, or one that
 * repairs first, counts as none): an adder holds the lock for one key
 * and is gone, and consumers that napped behind a producer adding hot
 * keys flat out handed it the queue, processing 0.67-0.72M keys/s
 * against 1.40-1.49M (tools/PERFORMANCE.md, "Consumers step aside for
 * consumers only"). Tried: a 10 us nap asked
 * (about 100 us) drained with two consumers at 0.70-0.77x of one, 100 us
 * at 0.82x; one try instead of five napped so readily that mpmc's
 * consumers processed half as many keys. The nap is a raw syscall, as
 * the futex wait is: it must not add a cancellation point to wq_get or
 * wq_done.
 *
 * Only a consumer that hammers the lock naps: one whose caller works
 * less than HAMMER_NS between its calls, on average. Two consumers that
 * hammer gain from taking turns; a consumer that works on each key
 * leaves the lock free for as long as the work takes, so its rival
 * finds it taken only briefly, and a nap of some 190 us then costs it
 * more keys than the hand-offs do. Measured on the Intel VM with a busy
 * loop of W ns per key between get and done (tools/PERFORMANCE.md,
 * "Consumers that work on their keys"), two consumers: W = 100 and 250
 * ns drained faster when they napped (2.98M against 1.69M keys/s, 2.10M
 * against 1.74M), W = 500 ns and 1 us when they did not (1.80M against
 * 1.61M, 1.30M against 1.13M). A call's gap is about half a key's work
 * (get, work, done, get), some 170 ns at W = 250 and 300 at W = 500:
 * hence 250.
 *
 * Only the question starts a measure: after a wait behind a consumer
 * with plenty queued, the handle times the next SAMPLES gaps of its
 * caller (two, so that a caller alternating get and done has both
 * timed), from the end of a get or done (wq__lock_leave, after the
 * unlock, the wakes it owed and the store's work, which are the
 * library's time) to the start of the next (wq__lock_enter, before it
 * hashes a key), and averages them into
 * work_ns (1/8 each, so that one odd gap moves the average by little;
 * the first is taken whole, there being nothing to average with). A gap
 * counts at most GAP_MAX_NS: with four processes on the two vCPUs a
 * consumer is often preempted between two calls, and at 8 x HAMMER_NS
 * such consumers measured work they did not do and stopped stepping
 * aside (mpmc p2c2). A process that registers anew (a forked child)
 * measures afresh. Not after every wait: a consumer behind a producer
 * waits at nearly every call, and its two clock readings then cost it
 * 13-22% of the keys it processed (mpmc p1c1, p1c1-dg). Not on every
 * call either: timing one gap in 63 releases cost one-process rows 2-7%
 * (a counter and a branch on every release, the clock in line). Not
 * measured instead: the rate of keys or locks over the time outside
 * waits. Tried first, it also counts the hand-offs' own cost as work,
 * so two consumers that once fell to handing the lock over key by key
 * looked busy enough to stay there (drain C=2-b32 at 0.54x, pool-C=2 at
 * 0.46x).
 */
#define SPIN_TRIES 50
#define SPIN_PAUSES 16
#define BACKOFF_DEPTH 32
#define BACKOFF_TRIES 5
#define NAPS 20
#define NAP_NS 100000
#define HAMMER_NS 250
#define GAP_MAX_NS (3 * HAMMER_NS)
#define SAMPLES 2

static int spin(pthread_mutex_t *m, int tries)
{
    int rc = EBUSY;
    for (int i = 0; rc == EBUSY && i < tries; i++) {
        for (int k = 0; k < SPIN_PAUSES; k++)
            wq__cpu_relax();
        rc = pthread_mutex_trylock(m);
    }
    return rc;
}

/* The queue's length read without the lock: a hint, as wq_len's is. */
WQ_INLINE bool plentiful(const shmq *q)
{
    return wq__queued(q) >= BACKOFF_DEPTH;
}

/* Whether the holder is a consumer, as it said when it locked: a hint. */
WQ_INLINE bool behind_consumer(const shmq *q)
{
    return wq_load_relaxed(&q->hdr->holder_consumer) != 0;
}

/* Lock held, just acquired. The word shares ring_pos's line, which
   nappers read and gets and adds write; stored only when it changes, so
   a caller that only looks (stats, a flush) leaves that line clean. A
   holder that must repair first (EOWNERDEAD) is no consumer: it may hold
   the lock for long. */
static void note_holder(shmq *q, bool consumer)
{
    if (wq_load_relaxed(&q->hdr->holder_consumer) != (uint32_t)consumer)
        wq_store_relaxed(&q->hdr->holder_consumer, (uint32_t)consumer);
}

/* Out of line, both: the clock must not weigh on the calls that take
   no sample. wq__clock_mono, not the queue's clock: this times real
   work, which a test's clock does not see. */
__attribute__((noinline, cold)) static void sample_open(shmq *q)
{
    wq_store_relaxed(&q->left_at, wq__clock_mono());
}

__attribute__((noinline, cold)) static void sample_close(shmq *q, uint64_t left)
{
    uint64_t now = wq__clock_mono(), w = wq_load_relaxed(&q->work_ns);
    uint32_t n = wq_load_relaxed(&q->samples);
    uint64_t gap = now > left ? now - left : 0;
    if (gap > GAP_MAX_NS)
        gap = GAP_MAX_NS;
    wq_store_relaxed(&q->left_at, 0);
    wq_store_relaxed(&q->samples, n ? n - 1 : 0);
    wq_store_relaxed(&q->work_ns, w ? w - w / 8 + gap / 8 : gap);
}

void wq__lock_leave(shmq *q)
{
    if (WQ_UNLIKELY(wq_load_relaxed(&q->samples) != 0))
        sample_open(q);
}

void wq__lock_enter(shmq *q)
{
    uint64_t left = wq_load_relaxed(&q->left_at);
    if (WQ_UNLIKELY(left != 0))
        sample_close(q, left);
}

/* A consumer's wait for the lock, found taken. A handle with nothing
   measured yet (work_ns 0) naps: it may well hammer, and a nap costs a
   worker one wait at most. */
static int back_off(shmq *q)
{
    pthread_mutex_t *m = &q->hdr->lock;
    int rc = spin(m, BACKOFF_TRIES);
    if (rc != EBUSY || !plentiful(q) || !behind_consumer(q))
        return rc == EBUSY ? spin(m, SPIN_TRIES) : rc;
    /* Whether to nap is asked: time the caller after this call. */
    wq_store_relaxed(&q->samples, SAMPLES);
    bool naps = wq_load_relaxed(&q->work_ns) < HAMMER_NS;
    for (int i = 0; naps && rc == EBUSY && i < NAPS && plentiful(q) && behind_consumer(q);
         i++) {
        struct timespec nap = { 0, NAP_NS };
        WQ_FAULT(i == 0 ? "lock.nap" : "lock.nap.again");
        syscall(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, &nap, NULL);
        rc = pthread_mutex_trylock(m);
    }
    return rc == EBUSY ? spin(m, SPIN_TRIES) : rc;
}

WQ_INLINE int acquire(shmq *q, bool consumer)
{
    pthread_mutex_t *m = &q->hdr->lock;
    int rc = pthread_mutex_trylock(m);
    if (WQ_LIKELY(rc != EBUSY))
        return rc;
    rc = consumer ? back_off(q) : spin(m, SPIN_TRIES);
    return rc == EBUSY ? pthread_mutex_lock(m) : rc;
}

/* The mutex was just acquired with `rc` (0 or EOWNERDEAD): note the
   holder, repair what needs it (and reap the dead holders a repair
   after a holder's death exposes, unless the caller is the lease thread,
   whose idle reaper does). 0 with the lock held, or a negative errno
   with it released. */
WQ_INLINE int acquired(shmq *q, int rc, bool reap)
{
    HOLDER_SET(q);
    wq__region_bounds(q);   /* before repair: it reads entries too */
    if (WQ_UNLIKELY(rc == EOWNERDEAD)) {
        rc = recover(q);
        if (rc == 0 && reap)
            wq__procs_reap(q);
    } else if (WQ_UNLIKELY(q->hdr->busy || q->hdr->corrupt)) {
        rc = damage(q);
    }
    /* Adds published to lanes come before whatever the holder does. One
       that found the region damaged (or left a mutation half done)
       stopped there: repaired at once, since the holder's own mutation
       must not end that bracket, and applied again. */
    for (int i = 0; i < 2 && rc == 0 && WQ_UNLIKELY(wq_load_relaxed(&q->hdr->lanes_pending) != 0);
         i++) {
        wq__queue_apply_lanes(q);
        if (WQ_UNLIKELY(q->hdr->busy || q->hdr->corrupt))
            rc = damage(q);
    }
    if (WQ_UNLIKELY(rc < 0))
        release(q);
    return rc;
}

/* In both locks (wq__lock is on every add, get and done). */
WQ_INLINE int lock_look(shmq *q, bool consumer)
{
    int rc = acquire(q, consumer);
    if (WQ_UNLIKELY(rc != 0 && rc != EOWNERDEAD))
        return rc == ENOTRECOVERABLE ? -ENOTRECOVERABLE : -rc;
    note_holder(q, consumer && rc == 0);
    return acquired(q, rc, true);
}

int wq__lock_look(shmq *q)
{
    return lock_look(q, false);
}

WQ_INLINE int lock_slot(shmq *q, bool consumer)
{
    int rc = lock_look(q, consumer);
    if (rc < 0)
        return rc;
    /* Register after a fork, after wq__shm_park, or if our slot is no
       longer ours (it can only be taken from a live handle by repairing
       a corrupt table). An observer (WQ_OBSERVE) never holds a slot. */
    if (!q->pub.observe && WQ_UNLIKELY(!wq__slot_held(q))) {
        rc = wq__procs_register(q);
        if (rc < 0) {
            wq__unlock(q);   /* with the wakes a reap on the way owes */
            return rc;
        }
        /* A forked child's caller is not its parent's: measure afresh
           (a gap open across the fork would read as work). */
        wq_store_relaxed(&q->samples, 0);
        wq_store_relaxed(&q->left_at, 0);
        wq_store_relaxed(&q->work_ns, 0);
    }
    return 0;
}

int wq__lock(shmq *q)
{
    return lock_slot(q, false);
}

int wq__lock_consumer(shmq *q)
{
    return lock_slot(q, true);
}

/*
 * The lock if it is free now (the idle reaper's): 0 with the lock held,
 * repaired like wq__lock does, but this handle's registration is not
 * touched (the caller may be the lease thread that registration stops);
 * -EBUSY when someone holds it; other errors as wq__lock.
 */
int wq__lock_try(shmq *q)
{
    int rc = pthread_mutex_trylock(&q->hdr->lock);
    if (rc == EBUSY)
        return -EBUSY;
    if (WQ_UNLIKELY(rc != 0 && rc != EOWNERDEAD))
        return rc == ENOTRECOVERABLE ? -ENOTRECOVERABLE : -rc;
    note_holder(q, false);
    return acquired(q, rc, false);
}

void wq__unlock(shmq *q)
{
    int get = q->wake_get;
    bool idle = q->wake_idle;
    release(q);
    if (WQ_UNLIKELY(get | idle))
        wq__wake_flush(q, get, idle);
}
