/*
 * t.h - the one helper layer of the libwq cmocka programs (built once as
 * tests/libt.la from t.c and t-queue.c, linked into every cmocka program).
 *
 * What it gives a test program:
 *   - unique queue names ("t<pid>-<tag>-<n>") that are remembered and
 *     removed by the per-test teardown, by an atexit handler and by the
 *     SIGALRM watchdog, so a failing or hanging test leaves nothing in
 *     /dev/shm; under tests/with-redis.sh they are redis:// names (the
 *     prefix WQ_TEST_PREFIX), and a Redis server the test can talk to,
 *     stop and restart (see "Redis" below);
 *   - the cmocka fixtures (T_TEST, T_CLOCK_TEST, T_STORE_TEST,
 *     T_NO_LEFTOVERS) and the end of main() (T_RUN_GROUP, t_guard_main);
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
 *     forked children using the inherited handle;
 *   - handle tracking (the teardown closes what a failed test left open),
 *     the fake clock of the fault build, queue helpers (create, open,
 *     stats, results, checked wq_get / wq_done, wq_dump collection,
 *     wq_check);
 *   - store directories under one top directory and the guardian main()
 *     that removes them whatever happens to the test process;
 *   - client-go's TestBasic and TestAddWhileProcessing workloads.
 *
 * Every helper that can block has a deadline; nothing here can hang CI.
 *
 * Names: functions and types are t_*, macros T_*. Exceptions, kept short
 * on purpose because test code is made of them and a prefix would only
 * lengthen every line without telling the reader anything: the time units
 * NS, US, MS, SEC, MIN, HOUR (nanoseconds, uint64_t), T0 (where the fake
 * clock starts) and KS(s) (a string as key and length). Helpers that check
 * and fail the test at the caller's line are macros (T_EXPECT_GET, ...)
 * over a t_*_ function that takes the line.
 *
 * libwq.la and libwq-fault.la: some programs link the fault build (crash
 * points, the test clock), the others the library as installed. libt.la is
 * compiled once and linked with either, so t.c and t-queue.c call only the
 * public API. The parts that need libwq-fault.la (the fake clock:
 * wq_test_clock_set) are static inline below: a program that does not use
 * them does not reference the symbol, and links with libwq.la (including
 * fault-api.h only declares it). Keep it that way: a t.c or t-queue.c
 * that called a fault-only function would no longer link with libwq.la.
 */
#ifndef WQ_TEST_T_H
#define WQ_TEST_T_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <cmocka.h>

#include <wq.h>
#include "fault-api.h"

/* ------------------------------------------------------------------ */
/* Constants                                                           */
/* ------------------------------------------------------------------ */

#define NS   ((uint64_t)1)
#define US   ((uint64_t)1000)
#define MS   ((uint64_t)1000000)
#define SEC  ((uint64_t)1000000000)
#define MIN  (60 * SEC)
#define HOUR (60 * MIN)
/* Where the fake clock starts: 1000 s, so that no arithmetic can
   underflow. */
#define T0   (1000 * SEC)

/* A string as key and length: wq_add(q, KS("foo")). */
#define KS(s) (s), strlen(s)

#define T_KEYBUF 256 /* the default max_key_len: wq_get buffers */

/* Options as an argument: t_create("x", T_OPTS(.capacity = 8), NULL). */
#define T_OPTS(...) (&(struct wq_options){ __VA_ARGS__ })

/* ------------------------------------------------------------------ */
/* Names and cleanup                                                   */
/* ------------------------------------------------------------------ */

#define T_MAX_NAMES 1024

/* A fresh unique queue name for `tag` (only [A-Za-z0-9._-] of it are kept):
   t_prefix() then "t<pid>-<tag>-<n>". The name is registered for removal;
   the pointer stays valid for the life of the process. */
const char *t_qname(const char *tag);

/* Remove every registered queue (wq_unlink, then, for a shared-memory
   name, a plain unlink of /dev/shm/wq.<name> if the library refuses).
   Only in the process that registered them; a forked child never removes
   anything. */
void t_unlink_all(void);

/* Number of /dev/shm entries whose name contains this process's prefix
   ("t<pid>-"); their names go to buf (comma separated) when buf != NULL. */
int t_shm_leftovers(char *buf, size_t cap);
/* Under Redis: number of keys whose name contains "t<pid>-" (this
   process's names) and that have no expiry (a key with a TTL goes by
   itself: the doorbells wq_unlink rings), on the server or on every
   master of the cluster; their names go to buf (comma separated) when buf
   != NULL, and with `remove` every such key is deleted, with a TTL or
   not. 0 when not under Redis, -1 when the server could not be asked (a
   warning is printed). The group teardown, T_NO_LEFTOVERS and the final
   check count these as leftovers, as they count /dev/shm objects. */
int t_redis_leftovers(char *buf, size_t cap, bool remove);

/* Path of the shm object of queue `name` in buf. */
void t_shm_path(const char *name, char *buf, size_t cap);
/* Whether the shm object of queue `name` exists. */
int t_shm_exists(const char *name);
/* Bytes of /dev/shm the object of queue `name` takes (its blocks, seen
   from outside the library; fails the test if it is gone). */
uint64_t t_shm_used(const char *name);
/* The slots of an array of `unit`-byte slots at byte `off` of a region
   up to the end of its first page: what a section's first growth
   reserves (region.c grows a page at a time up to 64 KiB, each step to
   a page's end; a section need not start on a page). */
static inline uint32_t t_first_page(uint64_t off, uint64_t unit)
{
    return (uint32_t)((4096 - off % 4096) / unit);
}
/* Nothing of queue `name` in /dev/shm: neither the object nor a temporary
   whose name mentions it (after a wq_open that failed). */
#define T_EXPECT_NO_SHM(name, ctx) t_expect_no_shm_((name), (ctx), __LINE__)
void t_expect_no_shm_(const char *name, const char *ctx, int line);

/* ------------------------------------------------------------------ */
/* Redis                                                               */
/* ------------------------------------------------------------------ */

/*
 * tests/with-redis.sh runs a program against its own redis-server (and
 * tests/with-redis-cluster.sh against its own three-master Redis
 * Cluster); both export WQ_TEST_PREFIX ("redis://127.0.0.1:PORT/"), which
 * t_qname puts before every name, so the same program makes Redis queues
 * (Makefile.am: REDIS_TESTS). A name made by hand gets the prefix only
 * if the program adds t_prefix() itself. Without the wrappers all of this
 * is off: t_redis() is false, t_prefix() "", the server helpers fail.
 */

/* WQ_TEST_PREFIX, or "" (at most T_MAX_PREFIX - 1 bytes: a longer one
   ends the program with status 99). */
#define T_MAX_PREFIX 256
const char *t_prefix(void);
/* Whether the queues are Redis queues (WQ_TEST_PREFIX is set). */
bool t_redis(void);

/* At the top of a test whose meaning is specific to shared memory (the
   region's layout, /dev/shm, the process table, the fake clock of the
   fault build, LMDB stores, wq_check repairing a damaged region ...):
   under Redis the test is skipped (cmocka's skip()), saying why. Only
   in the test's main thread. T_REDIS_ONLY: the converse. */
#define T_SHM_ONLY(why)                                                      \
    do {                                                                     \
        if (t_redis()) {                                                     \
            print_message("skipped under Redis: %s\n", (why));               \
            skip();                                                          \
        }                                                                    \
    } while (0)
#define T_REDIS_ONLY(why)                                                    \
    do {                                                                     \
        if (!t_redis()) {                                                    \
            print_message("skipped without Redis: %s\n", (why));             \
            skip();                                                          \
        }                                                                    \
    } while (0)

/* The server's port (WQ_TEST_REDIS_PORT: the first master under the
   cluster wrapper), 0 when there is none. */
int t_redis_port(void);
/* The cluster's nodes (WQ_TEST_CLUSTER_PORTS, masters first) into ports;
   returns how many there are (0: not a cluster). */
int t_redis_cluster_ports(int *ports, int max);

/* Run redis-cli against the server (t_redis_cli_at: against 127.0.0.1:
   port; both with -c under the cluster wrapper) with the commands
   printf(fmt, ...), one per line, quoted as redis-cli quotes ("a b" is
   one argument): t_redis_cli("CONFIG SET appendfsync always"),
   t_redis_cli("DEBUG SLEEP 0.5"), t_redis_cli("EXISTS \"%s\"", key).
   Returns what redis-cli printed (raw: a value per line; an error reply
   as its text, "ERR ..."), trailing newlines removed, in a buffer that
   the next call overwrites (64 KiB, longer output is cut); NULL (the
   reason on stderr) when redis-cli could not run, wrote to stderr (could
   not connect, ...), or took more than 10 s (times t_scale()): it is
   killed then. Not thread safe: the main thread, or a forked child.
   A server with a password: set REDISCLI_AUTH. */
const char *t_redis_cli(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
const char *t_redis_cli_at(int port, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The server under tests/with-redis.sh (not under the cluster wrapper),
   from WQ_TEST_REDIS_DIR and WQ_TEST_REDIS_PORT. Each returns 0, or -1
   with the reason on stderr; each waits at most 10 s (times t_scale()).
   t_redis_stop(sig): signal the server (found by its working directory,
   whoever started it) and wait until it is gone and its port closed:
   SIGTERM is a clean shutdown (the AOF is written out), SIGKILL a crash
   (only what appendfsync put on disk survives); 0 when none was running.
   t_redis_start(): start it again as the wrapper did (the same command
   line: port, directory, --appendonly ...) and wait until it answers
   PING, its data loaded. It runs as a child of this process, and the
   wrapper stops it at the end whatever happens to the program.
   t_redis_restart(): t_redis_stop(SIGTERM), then t_redis_start().
   For persistence, run the program with WQ_TEST_REDIS_ARGS="--appendonly
   yes --appendfsync always" in the environment of the wrapper. Only in
   the process that runs the tests (not in a forked child). */
int t_redis_stop(int sig);
int t_redis_start(void);
int t_redis_restart(void);

/* ------------------------------------------------------------------ */
/* cmocka fixtures and main()                                          */
/* ------------------------------------------------------------------ */

int t_group_setup(void **state);    /* board, atexit, watchdog handler */
int t_group_teardown(void **state); /* unlink all, fail on leftovers */
int t_setup(void **state);          /* reset board, arm watchdog */
/* Kill children, close the tracked handles, unlink the names. */
int t_teardown(void **state);
/* A test to put last in every group: nothing of ours is left in /dev/shm. */
void t_test_no_leftovers(void **state);
/* Final leftover check after the group ran; returns 0 or 1. */
int t_final_check(void);

/* cmocka's test and skip filters from WQ_TEST_FILTER / WQ_TEST_SKIP
   (e.g. "test_full*"). */
void t_test_filters(void);
/* After the group: remove the store directories (if any), check for
   leftovers; returns the exit status (0 when no test failed and nothing
   was left behind, else 1). */
int t_exit_status(int failed);

/* A test with the plain fixtures, and the last test of every group. */
#define T_TEST(fn) cmocka_unit_test_setup_teardown(fn, t_setup, t_teardown)
#define T_NO_LEFTOVERS cmocka_unit_test(t_test_no_leftovers)

/* Run the group `tests` (an array) named `name` with the filters and the
   group fixtures; the value is the exit status for main(). */
#define T_RUN_GROUP(name, tests)                                             \
    (t_test_filters(),                                                       \
     t_exit_status(cmocka_run_group_tests_name((name), (tests),              \
                                               t_group_setup,                \
                                               t_group_teardown)))

/* Per-test watchdog (seconds). Armed by t_setup with a default; on expiry
   the process kills its children, unlinks its queues and _exits(124). */
void t_watchdog(unsigned seconds);

/* Print, clean everything up and _exit(1): for states from which the test
   program cannot safely continue (a thread that will not join). */
void t_fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* ------------------------------------------------------------------ */
/* Shared memory and time                                              */
/* ------------------------------------------------------------------ */

void *t_shared_alloc(size_t size); /* zeroed MAP_SHARED|MAP_ANONYMOUS */
void t_shared_free(void *p, size_t size);

/* Multiplier for deadlines (never for minimum durations): the value of
   WQ_TEST_TIMEOUT_SCALE if set (1..100), else 10 under valgrind, else 1. */
unsigned t_scale(void);

uint64_t t_now_ns(void);     /* CLOCK_MONOTONIC */
void t_sleep_ms(unsigned ms);

/* *a = max(*a, v) */
void t_atomic_max(atomic_ullong *a, unsigned long long v);
/* Wait until *v >= target, at most ms (times t_scale()): 0 or -1. */
int t_wait_count(atomic_int *v, int target, int ms);

/* ------------------------------------------------------------------ */
/* Failure board (any thread, any forked child)                        */
/* ------------------------------------------------------------------ */

void t_failf(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int t_failures(void);
const char *t_failure_msg(void); /* first failure recorded */
void t_failures_reset(void);

/* In the main thread: fail the cmocka test if the board has failures. */
#define T_ASSERT_BOARD_CLEAN()                                               \
    do {                                                                     \
        if (t_failures() != 0)                                               \
            fail_msg("%d failure(s) in actors; first: %s", t_failures(),     \
                     t_failure_msg());                                       \
    } while (0)

/* For actor functions returning int: record and return 1. */
#define T_CHECK(cond)                                                        \
    do {                                                                     \
        if (!(cond)) {                                                       \
            t_failf(__FILE__, __LINE__, "check failed: %s", #cond);          \
            return 1;                                                        \
        }                                                                    \
    } while (0)
#define T_CHECK_EQ(a, b)                                                     \
    do {                                                                     \
        long long t_a_ = (long long)(a), t_b_ = (long long)(b);              \
        if (t_a_ != t_b_) {                                                  \
            t_failf(__FILE__, __LINE__, "%s == %lld, expected %s == %lld",   \
                    #a, t_a_, #b, t_b_);                                     \
            return 1;                                                        \
        }                                                                    \
    } while (0)

/* ------------------------------------------------------------------ */
/* Processes                                                           */
/* ------------------------------------------------------------------ */

/* fork(); in the child: default signal dispositions for what cmocka and
   the watchdog trap, alarm(alarm_s) as a hard limit, no cleanup at exit.
   In the parent: the child is remembered so teardown can SIGKILL it.
   alarm_s, and the timeouts of t_wait and t_team_wait, are multiplied by
   t_scale().
   Children must leave with _exit(). */
pid_t t_fork(unsigned alarm_s);

/* Wait for `pid` at most timeout_ms. Returns its exit code (0..255),
   128 + signal number if it was killed, or -1 if it did not end in time
   (it is then SIGKILLed and reaped). */
int t_wait(pid_t pid, int timeout_ms);

/* Wait until child pid stops at crash point `point` (WQ_FAULT_STOP),
   15 s at most (times t_scale()); it stays waitable. Fails the test,
   naming `who`, if it ends or does not stop. */
void t_wait_stopped(pid_t pid, const char *who, const char *point);

/* SIGKILL and reap every child t_fork made that was not waited for. */
void t_kill_children(void);

#define T_NOBODY 65534 /* uid and gid of nobody */
/* In a child running as root: become uid/gid `uid` with no supplementary
   groups. 0, or -1 if any step failed or the ids did not change. */
int t_drop_to(uid_t uid);

/* ------------------------------------------------------------------ */
/* Teams of actors                                                     */
/* ------------------------------------------------------------------ */

enum t_mode {
    T_THREADS_SHARED, /* threads of this process, one handle for all */
    T_THREADS_OWN,    /* threads of this process, each opens its own */
    T_PROCS_OPEN,     /* forked children, each wq_open()s the queue */
    T_PROCS_INHERIT,  /* forked children using the parent's handle */
    T_NMODES
};
const char *t_mode_name(enum t_mode m);
#define T_MODE_IS_PROC(m) ((m) == T_PROCS_OPEN || (m) == T_PROCS_INHERIT)

struct t_actor {
    int id;            /* 0 .. n-1 */
    int n;             /* team size */
    enum t_mode mode;
    wq *q;             /* the handle this actor must use */
    const char *qname;
    void *arg;
};
/* Returns 0 on success; failures should also go to the board. */
typedef int (*t_actor_fn)(struct t_actor *a);

struct t_team;
/* Start n actors. mainq is the test's handle (used by SHARED and INHERIT).
   Returns NULL (board written) if something could not be started. */
struct t_team *t_team_start(enum t_mode mode, const char *qname, wq *mainq,
                            int n, t_actor_fn fn, void *arg);
/* Wait for every actor (deadline timeout_ms for the whole team). Returns
   the number of actors that failed (non-zero return, crash, or timeout:
   processes are SIGKILLed; threads that do not join are fatal). Frees t. */
int t_team_wait(struct t_team *t, int timeout_ms);

/* ------------------------------------------------------------------ */
/* Handles                                                             */
/* ------------------------------------------------------------------ */

/* Remember q (at most 16 at a time; more fails the test); returns q.
   t_teardown closes it if the test did not: close it with t_close, never
   with wq_close. Nothing else here tracks a handle by itself. */
wq *t_track(wq *q);
/* Forget q (if tracked) and wq_close it. */
void t_close(wq *q);
/* wq_close every handle still tracked (t_teardown does). */
void t_close_all(void);

/* ------------------------------------------------------------------ */
/* Fake clock (libwq-fault.la only: inline, see the top)               */
/* ------------------------------------------------------------------ */

/* What the fake clock shows; 0 when it is off. */
extern uint64_t t_fake_now;

/* Every CLOCK_MONOTONIC reading libwq makes in this process returns t. */
static inline void t_clock_at(uint64_t t)
{
    t_fake_now = t;
    wq_test_clock_set(t);
}

static inline void t_clock_step(uint64_t d)
{
    t_clock_at(t_fake_now + d);
}

/* Per-test setup and teardown of the fake-clock programs: the clock is at
   T0 before the test creates a queue; the teardown closes the handles a
   failed test left open (with the clock still set) and turns the clock
   off. */
static inline int t_clock_setup(void **state)
{
    t_clock_at(T0);
    return t_setup(state);
}

static inline int t_clock_teardown(void **state)
{
    int rc = t_teardown(state);

    wq_test_clock_set(0);
    t_fake_now = 0;
    return rc;
}

/* A cmocka test of a fake-clock program. */
#define T_CLOCK_TEST(fn) \
    cmocka_unit_test_setup_teardown(fn, t_clock_setup, t_clock_teardown)

/* ------------------------------------------------------------------ */
/* Queues                                                              */
/* ------------------------------------------------------------------ */

/* Create the queue t_qname(tag) with the options *o (NULL: all defaults)
   and WQ_CREATE | WQ_EXCL, or fail the test. Its name goes to *name_out
   when name_out is not NULL. Not tracked. */
wq *t_create(const char *tag, const struct wq_options *o,
             const char **name_out);
/* wq_open(name, o) (the flags as given), which must succeed. Not
   tracked. */
#define T_OPEN(name, o) t_open_((name), (o), __LINE__)
wq *t_open_(const char *name, const struct wq_options *o, int line);

/* wq_add_opts with a priority only. */
int t_add_prio(wq *q, const void *key, size_t len, int prio);

/* wq_stats, which must succeed (fields it does not write read 0xa5...). */
struct wq_stats t_stats(wq *q);
/* Queued keys, after the lock holder moved the ready ones (wq_stats does;
   wq_len alone may still show the count from before a clock step). */
uint64_t t_queued(wq *q);
uint64_t t_waiting(wq *q);
/* live, queued, processing and waiting of wq_stats are these. */
#define T_EXPECT_STATS(q, live, queued, processing, waiting, ctx)            \
    t_expect_stats_((q), (live), (queued), (processing), (waiting), (ctx),   \
                    __LINE__)
void t_expect_stats_(wq *q, uint64_t live, uint64_t queued,
                     uint64_t processing, uint64_t waiting, const char *ctx,
                     int line);

/* wq_result of `key`, which must succeed (fields it does not write read
   0xa5...). */
struct wq_result t_result(wq *q, const char *key);

/* wq_get into a buffer of WQ_MAX_KEY_LEN bytes; its return value. */
int t_get(wq *q, int64_t timeout);
/* wq_get with timeout 0 must hand out `key` (a string; GETN: len bytes). */
#define T_EXPECT_GET(q, k) t_expect_get_((q), (k), strlen(k), __LINE__)
#define T_EXPECT_GETN(q, k, len) t_expect_get_((q), (k), (len), __LINE__)
void t_expect_get_(wq *q, const void *key, size_t len, int line);
/* wq_get with timeout 0 must return `expect` (an error code). */
#define T_EXPECT_GET_RC(q, e) t_expect_get_rc_((q), (e), __LINE__)
void t_expect_get_rc_(wq *q, int expect, int line);
#define T_EXPECT_DONE(q, k) assert_int_equal(wq_done((q), KS(k)), 0)

/* wq_check_report(q, 0) finds nothing; the violations are printed with
   ctx (may be NULL). */
void t_check_clean(wq *q, const char *ctx);

/* ------------------------------------------------------------------ */
/* wq_dump                                                             */
/* ------------------------------------------------------------------ */

/* Look `key` up in wq_dump. Returns wq_dump's return value; *found tells
   whether the key was listed, *out is its entry (key and result_message
   cleared: they point into the dump). */
int t_key_lookup(wq *q, const char *key, struct wq_key_info *out,
                 int *found);
/* wq_dump entry of `key` to *out (may be NULL); returns 0 when the key is
   not in the dump. */
int t_key_info(wq *q, const char *key, struct wq_key_info *out);
/* State bits of `key` in wq_dump, 0 when absent. */
unsigned t_key_state(wq *q, const char *key);

/* Ready time of a waiting key minus t_fake_now. */
#define T_READY_IN(q, k) t_ready_in_((q), (k), __LINE__)
uint64_t t_ready_in_(wq *q, const char *key, int line);

/* Every entry of a wq_dump, in its order, copied. */
struct t_dkey {
    char key[T_KEYBUF + 1]; /* the first T_KEYBUF bytes, NUL terminated */
    size_t len;
    unsigned state;
    pid_t owner;
    uint64_t position, ready;
    uint32_t failures;
    enum wq_state result;
    int code;
    char message[256];      /* "(null)" when result_message is NULL */
};
struct t_dump {
    struct t_dkey *v;
    size_t n, cap;
};
/* Collect into *d (zeroed first: { 0 }); returns wq_dump's return value
   (-ENOMEM if memory ran out). No cmocka: usable in children. */
int t_dump_collect(wq *q, struct t_dump *d);
/* t_dump_collect, which must return 0. Free it with t_dump_free. */
struct t_dump t_dump_all(wq *q);
/* The first entry of `key` (a string), or NULL; how many entries it has. */
const struct t_dkey *t_dump_find(const struct t_dump *d, const char *key);
int t_dump_count(const struct t_dump *d, const char *key);
void t_dump_free(struct t_dump *d);

/* ------------------------------------------------------------------ */
/* Store directories and the guardian main()                           */
/* ------------------------------------------------------------------ */

/* Remove p and everything below it; errors are ignored. */
void t_rm_rf(const char *p);
/* A fresh, empty store directory under the program's top directory
   (t_guard_main makes it). */
const char *t_mkstore(void);
/* Remove every directory t_mkstore made (for teardowns). */
void t_stores_cleanup(void);
/* Per-test teardown of the programs with store directories: t_teardown,
   then remove the stores and undo what a test may have changed for them
   (WQ_TEST_STORE_MAX_MAP, the umask). Their setup is t_setup. */
int t_store_teardown(void **state);
#define T_STORE_TEST(fn) \
    cmocka_unit_test_setup_teardown(fn, t_setup, t_store_teardown)

/* The options of the single-process store tests: capacity 64, max_key_len
   32, the store and durability given (NONE: snapshot interval 60 s, so
   only wq_snapshot writes), the exponential limiter with a base delay of
   2 h (a rate limited add of a fresh key waits exactly 2 h), WQ_CREATE |
   WQ_EXCL. */
struct wq_options t_store_opts(const char *store, int durability);
/* "PROCESS", "FSYNC", "NONE" or "?". */
const char *t_durability_name(int durability);

struct t_guard {
    const char *prog;      /* "test-store-restore": names the group, the
                              top directory /tmp/wq-<prog>-XXXXXX and the
                              messages */
    unsigned max_stores;   /* t_mkstore fails the test beyond this many */
    unsigned topdir_mode;  /* chmod of the top directory; 0: as mkdtemp
                              made it */
    unsigned deadline_s;   /* the runner is killed after this many
                              seconds (times t_scale()) */
    const struct CMUnitTest *tests; /* the group: T_GUARD_TESTS(array) */
    size_t ntests;
};
#define T_GUARD_TESTS(array) \
    .tests = (array), .ntests = sizeof(array) / sizeof((array)[0])

/* main() of a program with store directories: makes the top directory,
   runs the group (as T_RUN_GROUP does) in a child (its own process group)
   and removes the top directory and any /dev/shm object of the child
   whatever happened to it. SIGTERM, SIGINT and SIGHUP are forwarded to
   the child. WQ_TEST_NOFORK runs the group in this process (debugging).
   Returns the exit status for main. */
int t_guard_main(const struct t_guard *g);

/* ------------------------------------------------------------------ */
/* TestBasic and TestAddWhileProcessing (client-go queue_test.go)      */
/* ------------------------------------------------------------------ */

/* The program writes the producers (actor ids 0 .. producers - 1: its
   keys, how it adds them) and calls the consumer below for the other
   ids; the runner starts the team, shuts the queue down and checks. A
   program's key format is read back by its parse function: the producer
   id of a key, -1 when it is not one of them (or id >= max). In messages
   a key is "<prefix><id>". The programs that run them (test-queue,
   test-mp-fair) name their parts alike, as each part means the same in
   both: basic_actor, basic_add, add_after_shutdown, run_basic, awp_actor,
   readd, run_awp, parse_key. */
typedef int (*t_parse_fn)(const unsigned char *key, int len, int max);

#define T_BASIC_PRODUCERS 50
#define T_BASIC_ADDS 50
#define T_BASIC_CONSUMERS 10

struct t_basic {
    atomic_int active[T_BASIC_PRODUCERS];     /* witness: holders right now */
    atomic_int violations;                    /* times a witness exceeded 1 */
    atomic_int processed[T_BASIC_PRODUCERS];
    atomic_ullong seq;                        /* a global order of events */
    atomic_ullong last_add[T_BASIC_PRODUCERS];   /* seq before the last add */
    atomic_ullong last_start[T_BASIC_PRODUCERS]; /* seq at a processing start */
    atomic_int got_after_shutdown;
    atomic_int producers_done;
};

/* A TestBasic producer: T_BASIC_ADDS adds of `key` with add(q, key, len,
   j) (0 or 1 each), 1 ms apart, each recorded in the witnesses first. */
int t_basic_produce(struct t_actor *a, const char *key, size_t len,
                    int (*add)(wq *q, const char *key, size_t len, int j,
                               unsigned *seed),
                    unsigned *seed);
/* A TestBasic consumer: gets and dones until -ESHUTDOWN; the key
   after_shutdown must never be handed out, no key may have two holders. */
int t_basic_consume(struct t_actor *a, t_parse_fn parse,
                    const char *after_shutdown);
/* Run TestBasic on q (its name `name`, b zeroed in shared memory):
   T_BASIC_PRODUCERS + T_BASIC_CONSUMERS actors of `actor`, then
   wq_shutdown (drain: wq_shutdown_drain) once the producers are done,
   then add_after_shutdown (which must be refused with -ESHUTDOWN). Checks
   the team, the witnesses and an empty queue. */
void t_basic_run(enum t_mode mode, int drain, wq *q, const char *name,
                 struct t_basic *b, t_actor_fn actor,
                 int (*add_after_shutdown)(wq *q));
/* After t_basic_run: every key processed after its last add, every add
   counted once, nothing left; the stats go to *st. */
void t_basic_check_stats(wq *q, struct t_basic *b, const char *prefix,
                         struct wq_stats *st);

/* The cmocka cases of a team workload, runner(mode, drain) with drain 0
   (wq_shutdown) and 1 (wq_shutdown_drain): T_TEAM_PROC_CASES defines
   fn_shutdown_po, fn_shutdown_pi, fn_drain_po and fn_drain_pi (forked
   children that wq_open the queue, that inherit the handle); T_TEAM_CASES
   also fn_shutdown_ts, fn_shutdown_to, fn_drain_ts and fn_drain_to
   (threads sharing a handle, with a handle each). The _TESTS macros list
   them in a tests array. */
#define T_TEAM_PROC_CASES(fn, runner)                                        \
    static void fn##_shutdown_po(void **s) { (void)s; runner(T_PROCS_OPEN, 0); }    \
    static void fn##_shutdown_pi(void **s) { (void)s; runner(T_PROCS_INHERIT, 0); } \
    static void fn##_drain_po(void **s) { (void)s; runner(T_PROCS_OPEN, 1); }       \
    static void fn##_drain_pi(void **s) { (void)s; runner(T_PROCS_INHERIT, 1); }
#define T_TEAM_CASES(fn, runner)                                             \
    static void fn##_shutdown_ts(void **s) { (void)s; runner(T_THREADS_SHARED, 0); } \
    static void fn##_shutdown_to(void **s) { (void)s; runner(T_THREADS_OWN, 0); }    \
    static void fn##_drain_ts(void **s) { (void)s; runner(T_THREADS_SHARED, 1); }    \
    static void fn##_drain_to(void **s) { (void)s; runner(T_THREADS_OWN, 1); }       \
    T_TEAM_PROC_CASES(fn, runner)
#define T_TEAM_PROC_TESTS(fn)                                                \
    T_TEST(fn##_shutdown_po), T_TEST(fn##_shutdown_pi),                      \
    T_TEST(fn##_drain_po), T_TEST(fn##_drain_pi)
#define T_TEAM_TESTS(fn)                                                     \
    T_TEST(fn##_shutdown_ts), T_TEST(fn##_shutdown_to),                      \
    T_TEST(fn##_shutdown_po), T_TEST(fn##_shutdown_pi),                      \
    T_TEST(fn##_drain_ts), T_TEST(fn##_drain_to),                            \
    T_TEST(fn##_drain_po), T_TEST(fn##_drain_pi)

#define T_AWP_PRODUCERS 50
#define T_AWP_CONSUMERS 10

struct t_awp {
    atomic_int active[T_AWP_PRODUCERS];
    atomic_int violations;
    atomic_int count[T_AWP_PRODUCERS];    /* times handed out */
    atomic_int readd_ok[T_AWP_PRODUCERS]; /* re-add while processing gave 0 */
    atomic_int readd_refused[T_AWP_PRODUCERS]; /* ... gave -ESHUTDOWN */
    atomic_int producers_done;
    atomic_int shutdown_started;
};

/* A TestAddWhileProcessing consumer: re-adds each key once while
   processing it, with readd(q, key, len, seed); it then comes back once
   after its wq_done, unless the queue was shut down meanwhile. */
int t_awp_consume(struct t_actor *a, t_parse_fn parse,
                  int (*readd)(wq *q, const void *key, size_t len,
                               unsigned *seed),
                  unsigned *seed, const char *prefix);
/* Run TestAddWhileProcessing on q: T_AWP_PRODUCERS + T_AWP_CONSUMERS
   actors of `actor`; settle_ms after the producers are done, the queue is
   shut down (drain: wq_shutdown_drain). Checks the team, the witnesses,
   every key handed out once plus once per accepted re-add, and the
   stats. */
void t_awp_run(enum t_mode mode, int drain, wq *q, const char *name,
               struct t_awp *w, t_actor_fn actor, unsigned settle_ms,
               const char *prefix);

#endif /* WQ_TEST_T_H */
