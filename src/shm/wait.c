/*
 * wait.c - sleeping and waking: futexes on 32-bit sequence words in the
 * region, the one sleep loop, and the one wake rule.
 *
 * Why not pthread_cond_t: glibc's process-shared condition variables are
 * not robust (glibc bug 21422): a waiter killed inside pthread_cond_wait
 * can make later signals hang. A futex word holds no waiter state at all,
 * so a dead sleeper leaves nothing behind. All queue state stays under
 * the robust mutex; the word only says "something changed".
 *
 * Wake rule: a lock holder that makes a key available (or ends what a
 * drainer waits for) calls wq__wake_getters / wq__wake_drainers. Those
 * bump the sequence word at once, under the lock (release order, so a
 * sleeper that reads the word under the lock cannot miss it), and only
 * record how many sleepers are owed a FUTEX_WAKE; wq__unlock issues the
 * wakes after releasing the lock, so a woken sleeper never runs into the
 * lock its waker still holds. No other code issues FUTEX_WAKE.
 *
 * Sleep: wq__sleep is the one place a thread blocks on the region. It
 * is entered with the lock held, reads the word, counts itself as a
 * sleeper, unlocks, waits, and locks again. Non-private futexes (the
 * words are shared between processes), absolute CLOCK_MONOTONIC deadlines
 * (FUTEX_WAIT_BITSET).
 */
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shm.h"

int wq__futex_wait(uint32_t *word, uint32_t val, uint64_t deadline_mono)
{
    struct timespec ts, *tp = NULL;
    if (deadline_mono != UINT64_MAX) {
        ts.tv_sec = (time_t)(deadline_mono / 1000000000ull);
        ts.tv_nsec = (long)(deadline_mono % 1000000000ull);
        tp = &ts;
    }
    long rc = syscall(SYS_futex, word, FUTEX_WAIT_BITSET, val, tp, NULL,
                      FUTEX_BITSET_MATCH_ANY);
    if (rc == 0)
        return 0;
    return errno == ETIMEDOUT ? -ETIMEDOUT : 0; /* EAGAIN, EINTR: re-check */
}

void wq__futex_wake(uint32_t *word, int n)
{
    syscall(SYS_futex, word, FUTEX_WAKE, n, NULL, NULL, 0);
}

/*
 * Lock held: n more keys are available to blocked getters. Each sleeper
 * gets at most one wake on its way: wake_pending counts the wakes issued
 * whose sleepers have not locked again, and a sleeper that has one coming
 * is not woken again. The woken getter passes the wake on if more keys
 * are queued (queue.c), so a burst of adds costs one FUTEX_WAKE per
 * sleeper, not one per add. A count left by a woken process that died
 * before locking is cleared when its slot is reaped (procs.c) or by
 * repair; until then sleepers still wake every WQ_REAP_INTERVAL_NS.
 */
void wq__wake_getters(shmq *q, int n)
{
    WQ_ASSERT_LOCKED(q);
    struct wq_hdr *h = q->hdr;
    if (WQ_LIKELY(h->waiters == 0) || n <= 0 || h->wake_pending >= h->waiters)
        return;
    uint32_t owed = h->waiters - h->wake_pending;
    if ((uint32_t)n > owed)
        n = (int)owed;
    h->wake_pending += (uint32_t)n;
    wq_bump_release(&h->wake_seq);
    q->wake_get = n > INT_MAX - q->wake_get ? INT_MAX : q->wake_get + n;
}

/* Lock held: every drainer is owed a wake. */
void wq__wake_drainers(shmq *q)
{
    WQ_ASSERT_LOCKED(q);
    if (q->hdr->drainers == 0)
        return;
    wq_bump_release(&q->hdr->idle_seq);
    q->wake_idle = true;
}

/* Lock held: every sleeper of either kind re-evaluates (shutdown, repair). */
void wq__wake_all(shmq *q)
{
    WQ_ASSERT_LOCKED(q);
    wq_bump_release(&q->hdr->wake_seq);
    wq_bump_release(&q->hdr->idle_seq);
    q->wake_get = INT_MAX;
    q->wake_idle = true;
}

/* Called by wq__unlock, after the unlock. */
void wq__wake_flush(shmq *q, int get, bool idle)
{
    if (get > 0)
        wq__futex_wake(&q->hdr->wake_seq, get);
    if (idle)
        wq__futex_wake(&q->hdr->idle_seq, INT_MAX);
}

/*
 * Lock held on entry. Sleep on `word` (wake_seq for getters, idle_seq for
 * drainers) until it changes, `until` passes, or a signal: the caller
 * has bounded `until` by its deadline, the reap interval and any ready
 * time. Returns 0 with the lock held again (the caller re-checks), or a
 * negative errno from the lock without it.
 */
int wq__sleep(shmq *q, uint32_t *word, uint64_t deadline, uint64_t until, bool getter)
{
    struct wq_hdr *h = q->hdr;
    uint32_t seq = wq_load_acquire(word);
    if (until > deadline)
        until = deadline;
    bool published = false;
    if (getter) {
        wq_add_relaxed(&h->waiters, 1);   /* publishers read it unlocked */
        q->procs[q->slot].waiting++;
        /* Counted, then look at the lanes: a producer publishes, then
           reads waiters (lanes.c). One of us sees the other. */
        wq_fence_full();
        published = wq_load_relaxed(&h->lanes_pending) != 0;
    } else {
        h->drainers++;
    }
    wq__unlock(q);
    if (!published)   /* else the relock applies them */
        wq__futex_wait(word, seq, until);
    WQ_FAULT("wait.woken");
    /* wq__lock, not wq__lock_consumer: a key may be waiting for this very
       getter, which must not nap behind whoever holds the lock now. */
    int rc = getter ? wq__lock(q) : wq__lock_look(q);
    if (rc < 0)
        return rc;
    /* Our slot may have been re-registered meanwhile (fork, repair): the
       counts are only ever decremented, never below zero. Only a getter
       has a slot (a drainer may be an observer's, WQ_OBSERVE). */
    if (getter) {
        struct wq_proc *me = &q->procs[q->slot];
        if (h->wake_pending > 0)
            h->wake_pending--;   /* ours, or one whose sleeper took longer */
        if (h->waiters > 0)
            wq_sub_relaxed(&h->waiters, 1);
        if (me->waiting > 0)
            me->waiting--;
    } else if (h->drainers > 0) {
        h->drainers--;
    }
    return 0;
}
