/*
 * fault.c - crash points for the fault-injection build (libwq-fault.la,
 * test only; the release library is built without WQ_FAULT_INJECTION and
 * contains none of this).
 *
 * A test arms one named point (see WQ_STEP in shm/mutate.h) and an
 * occurrence count; when the process reaches that point for the n-th
 * time it kills itself with SIGKILL (or _exit, to check that a plain exit
 * inside a critical section is handled the same way), or stops until the
 * test continues it (a race made to happen in one order). Recording mode
 * lists every point reached, so tests can sweep all of them without a
 * hand-kept list going stale.
 */
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <pthread.h>

#include "internal.h"
#include "fault-api.h"

#define MAX_SEEN 256

static char armed[64];
static unsigned countdown;
static int how;
static bool recording;
static const char *seen[MAX_SEEN];
static unsigned nseen;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

void wq__fault_hit(const char *point)
{
    if (recording) {
        pthread_mutex_lock(&mu);
        unsigned i;
        for (i = 0; i < nseen && strcmp(seen[i], point) != 0; i++)
            ;
        if (i == nseen && nseen < MAX_SEEN)
            seen[nseen++] = point;   /* string literals: static storage */
        pthread_mutex_unlock(&mu);
    }
    if (armed[0] && how != WQ_FAULT_FAIL && how != WQ_FAULT_FAIL_ON &&
        strcmp(point, armed) == 0 && --countdown == 0) {
        if (how == WQ_FAULT_EXIT)
            _exit(WQ_FAULT_EXIT_CODE);
        while (how == WQ_FAULT_HANG)
            pause();
        if (how == WQ_FAULT_STOP) {
            raise(SIGSTOP);
            return;
        }
        raise(SIGKILL);
        _exit(WQ_FAULT_EXIT_CODE);   /* not reached */
    }
}

bool wq__fault_fail(const char *point)
{
    if (!armed[0] || strcmp(point, armed) != 0)
        return false;
    if (how == WQ_FAULT_FAIL_ON) {
        if (countdown <= 1)
            return true;
        countdown--;
        return false;
    }
    return how == WQ_FAULT_FAIL && --countdown == 0;
}

int wq_fault_arm(const char *point, unsigned nth, int mode)
{
    if (!point) {
        armed[0] = 0;
        return 0;
    }
    if (strlen(point) >= sizeof armed || nth == 0 ||
        (mode != WQ_FAULT_KILL && mode != WQ_FAULT_EXIT && mode != WQ_FAULT_FAIL &&
         mode != WQ_FAULT_FAIL_ON && mode != WQ_FAULT_HANG &&
         mode != WQ_FAULT_STOP))
        return -EINVAL;
    strcpy(armed, point);
    countdown = nth;
    how = mode;
    return 0;
}

void wq_fault_record(bool on)
{
    pthread_mutex_lock(&mu);
    recording = on;
    if (on)
        nseen = 0;
    pthread_mutex_unlock(&mu);
}

extern uint64_t wq__test_clock;

void wq_test_clock_set(uint64_t now_ns)
{
    wq_store_relaxed(&wq__test_clock, now_ns);
}

int wq_fault_seen(const char **names, int max)
{
    pthread_mutex_lock(&mu);
    int n = (int)nseen < max ? (int)nseen : max;
    for (int i = 0; i < n; i++)
        names[i] = seen[i];
    pthread_mutex_unlock(&mu);
    return n;
}
