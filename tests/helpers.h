/*
 * helpers.h - shared test scaffolding for the libwq cmocka programs.
 *
 * What it gives a test program:
 *   - unique queue names ("t<pid>-<tag>-<n>") that are remembered and
 *     removed by the per-test teardown, by an atexit handler and by the
 *     SIGALRM watchdog, so a failing or hanging test leaves nothing in
 *     /dev/shm;
 *   - fork helpers: children get SIG_DFL for every signal cmocka traps and
 *     a hard alarm(); the parent waits with a deadline and SIGKILLs
 *     stragglers;
 *   - shared anonymous mappings for cross-process witnesses and counters;
 *   - a failure board in shared memory that threads and forked children
 *     write to (cmocka asserts are only ever used in the main thread of the
 *     test process; a longjmp from another thread or from a child would
 *     corrupt the runner);
 *   - "teams": N actors running one function as threads sharing a handle,
 *     threads with their own handles, forked children opening the queue, or
 *     forked children using the inherited handle.
 *
 * Every helper that can block has a deadline; nothing here can hang CI.
 */
#ifndef WQ_TEST_HELPERS_H
#define WQ_TEST_HELPERS_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <sys/types.h>
#include <cmocka.h>

#include <wq.h>

/* ------------------------------------------------------------------ */
/* Names and cleanup                                                   */
/* ------------------------------------------------------------------ */

#define TH_MAX_NAMES 1024

/* A fresh unique queue name for `tag` (only [A-Za-z0-9._-] of it are kept).
   The name is registered for removal; the pointer stays valid for the life
   of the process. */
const char *th_qname(const char *tag);

/* Remove every registered queue (wq_unlink, then a plain unlink of
   /dev/shm/wq.<name> if the library refuses). Only in the process that
   registered them; a forked child never removes anything. */
void th_unlink_all(void);

/* Number of /dev/shm entries whose name contains this process's prefix
   ("t<pid>-"); their names go to buf (comma separated) when buf != NULL. */
int th_shm_leftovers(char *buf, size_t cap);

/* Path of the shm object of queue `name` in buf. */
void th_shm_path(const char *name, char *buf, size_t cap);

/* ------------------------------------------------------------------ */
/* cmocka fixtures                                                     */
/* ------------------------------------------------------------------ */

int th_group_setup(void **state);    /* board, atexit, watchdog handler */
int th_group_teardown(void **state); /* unlink all, fail on leftovers */
int th_setup(void **state);          /* reset board, arm watchdog */
int th_teardown(void **state);       /* kill children, unlink names */
/* A test to put last in every group: nothing of ours is left in /dev/shm. */
void th_test_no_leftovers(void **state);
/* For main(): final leftover check after the group ran; returns 0 or 1. */
int th_final_check(void);

/* Per-test watchdog (seconds). Armed by th_setup with a default; on expiry
   the process kills its children, unlinks its queues and _exits(124). */
void th_watchdog(unsigned seconds);

/* Print, clean everything up and _exit(1): for states from which the test
   program cannot safely continue (a thread that will not join). */
void th_fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* ------------------------------------------------------------------ */
/* Shared memory and time                                              */
/* ------------------------------------------------------------------ */

void *th_shared_alloc(size_t size); /* zeroed MAP_SHARED|MAP_ANONYMOUS */
void th_shared_free(void *p, size_t size);

/* Multiplier for deadlines (never for minimum durations): the value of
   WQ_TEST_TIMEOUT_SCALE if set (1..100), else 10 under valgrind, else 1. */
unsigned th_scale(void);

uint64_t th_now_ns(void);     /* CLOCK_MONOTONIC */
void th_sleep_ms(unsigned ms);

#define TH_MS ((int64_t)1000000)
#define TH_S  ((int64_t)1000000000)

/* ------------------------------------------------------------------ */
/* Failure board (any thread, any forked child)                        */
/* ------------------------------------------------------------------ */

void th_failf(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int th_failures(void);
const char *th_failure_msg(void); /* first failure recorded */
void th_failures_reset(void);

/* In the main thread: fail the cmocka test if the board has failures. */
#define TH_ASSERT_BOARD_CLEAN()                                              \
    do {                                                                     \
        if (th_failures() != 0)                                              \
            fail_msg("%d failure(s) in actors; first: %s", th_failures(),    \
                     th_failure_msg());                                      \
    } while (0)

/* For actor functions returning int: record and return 1. */
#define TH_CHECK(cond)                                                       \
    do {                                                                     \
        if (!(cond)) {                                                       \
            th_failf(__FILE__, __LINE__, "check failed: %s", #cond);         \
            return 1;                                                        \
        }                                                                    \
    } while (0)
#define TH_CHECK_EQ(a, b)                                                    \
    do {                                                                     \
        long long th_a_ = (long long)(a), th_b_ = (long long)(b);            \
        if (th_a_ != th_b_) {                                                \
            th_failf(__FILE__, __LINE__, "%s == %lld, expected %s == %lld",  \
                     #a, th_a_, #b, th_b_);                                  \
            return 1;                                                        \
        }                                                                    \
    } while (0)

/* ------------------------------------------------------------------ */
/* Processes                                                           */
/* ------------------------------------------------------------------ */

/* fork(); in the child: default signal dispositions for what cmocka and
   the watchdog trap, alarm(alarm_s) as a hard limit, no cleanup at exit.
   In the parent: the child is remembered so teardown can SIGKILL it.
   alarm_s, and the timeouts of th_wait and th_team_wait, are multiplied by
   th_scale().
   Children must leave with _exit(). */
pid_t th_fork(unsigned alarm_s);

/* Wait for `pid` at most timeout_ms. Returns its exit code (0..255),
   128 + signal number if it was killed, or -1 if it did not end in time
   (it is then SIGKILLed and reaped). */
int th_wait(pid_t pid, int timeout_ms);

/* SIGKILL and reap every child th_fork made that was not waited for. */
void th_kill_children(void);

/* ------------------------------------------------------------------ */
/* Teams of actors                                                     */
/* ------------------------------------------------------------------ */

enum th_mode {
    TH_THREADS_SHARED, /* threads of this process, one handle for all */
    TH_THREADS_OWN,    /* threads of this process, each opens its own */
    TH_PROCS_OPEN,     /* forked children, each wq_open()s the queue */
    TH_PROCS_INHERIT,  /* forked children using the parent's handle */
    TH_NMODES
};
const char *th_mode_name(enum th_mode m);
#define TH_MODE_IS_PROC(m) ((m) == TH_PROCS_OPEN || (m) == TH_PROCS_INHERIT)

struct th_actor {
    int id;            /* 0 .. n-1 */
    int n;             /* team size */
    enum th_mode mode;
    wq *q;             /* the handle this actor must use */
    const char *qname;
    void *arg;
};
/* Returns 0 on success; failures should also go to the board. */
typedef int (*th_actor_fn)(struct th_actor *a);

struct th_team;
/* Start n actors. mainq is the test's handle (used by SHARED and INHERIT).
   Returns NULL (board written) if something could not be started. */
struct th_team *th_team_start(enum th_mode mode, const char *qname, wq *mainq,
                              int n, th_actor_fn fn, void *arg);
/* Wait for every actor (deadline timeout_ms for the whole team). Returns
   the number of actors that failed (non-zero return, crash, or timeout:
   processes are SIGKILLed; threads that do not join are fatal). Frees t. */
int th_team_wait(struct th_team *t, int timeout_ms);

#endif /* WQ_TEST_HELPERS_H */
