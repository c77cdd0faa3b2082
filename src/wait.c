/*
 * wait.c - futex sleep and wake on a 32-bit sequence word in the region.
 *
 * Why not pthread_cond_t: glibc's process-shared condition variables are
 * not robust (glibc bug 21422): a waiter killed inside pthread_cond_wait
 * can make later signals hang. A futex word holds no waiter state at all,
 * so a dead sleeper leaves nothing behind. All queue state stays under
 * the robust mutex; the word only says "something changed".
 *
 * Protocol (see layout.h): the sleeper reads the word under the lock,
 * unlocks, then FUTEX_WAITs on that value; a waker changes the word under
 * the lock and FUTEX_WAKEs after unlocking. A change that lands between
 * the sleeper's unlock and its wait makes the wait return at once.
 * Non-private futexes, because the word is shared between processes.
 * Deadlines are absolute CLOCK_MONOTONIC (FUTEX_WAIT_BITSET).
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

int wq__futex_wait(_Atomic uint32_t *word, uint32_t val, uint64_t deadline_mono)
{
    struct timespec ts, *tp = NULL;
    if (deadline_mono != UINT64_MAX) {
        ts.tv_sec = (time_t)(deadline_mono / 1000000000ull);
        ts.tv_nsec = (long)(deadline_mono % 1000000000ull);
        tp = &ts;
    }
    long rc = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_BITSET, val, tp,
                      NULL, FUTEX_BITSET_MATCH_ANY);
    if (rc == 0)
        return 0;
    return errno == ETIMEDOUT ? -ETIMEDOUT : 0; /* EAGAIN, EINTR: re-check */
}

void wq__futex_wake(_Atomic uint32_t *word, int n)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, n, NULL, NULL, 0);
}
