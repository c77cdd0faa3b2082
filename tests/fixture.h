/*
 * fixture.h - fixtures shared by several cmocka programs, on top of
 * helpers.h (which every program uses). Each piece exists once here; a
 * program takes the ones it needs:
 *
 *   - time constants and KS();
 *   - handle tracking: the handles a test opened, closed by the teardown
 *     when a failed test left them open (cmocka leaves a failing test by
 *     longjmp);
 *   - the fake clock (wq_test_clock_set) with its setup/teardown pair, for
 *     the programs linked against libwq-fault.la (test-delay,
 *     test-ratelimit, test-limiters, test-metrics, test-fair);
 *   - queue helpers: create a queue, stats, a key's wq_dump entry, the
 *     checked wq_get / wq_done of the single-process programs;
 *   - store directories and the guardian main() of test-store and
 *     test-mp-store;
 *   - client-go's TestBasic and TestAddWhileProcessing workloads of
 *     test-queue (default mode) and test-mp-fair (WQ_FAIR).
 *
 * fixture.c links with libwq.la as well as with libwq-fault.la. The fake
 * clock is the one part that needs libwq-fault.la (wq_test_clock_set), so
 * it is inline here: a program that does not use it does not reference it.
 */
#ifndef WQ_TEST_FIXTURE_H
#define WQ_TEST_FIXTURE_H

#include "helpers.h"
#include "fault-api.h"

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

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

#define FX_KEYBUF 256 /* default max_key_len: wq_get buffers of the helpers */

/* A string as key and length: wq_add(q, KS("foo")). */
#define KS(s) (s), strlen(s)

/* ------------------------------------------------------------------ */
/* Handles                                                             */
/* ------------------------------------------------------------------ */

/* Remember q (at most 16 at a time; more fails the test); returns q. */
wq *track(wq *q);
/* Forget q and wq_close it. */
void close_q(wq *q);
/* wq_close every handle still remembered (for teardowns). */
void close_all(void);

/* ------------------------------------------------------------------ */
/* Fake clock                                                          */
/* ------------------------------------------------------------------ */

/* What the fake clock shows; 0 when it is off. */
extern uint64_t fake_now;

/* Every CLOCK_MONOTONIC reading libwq makes in this process returns t. */
static inline void clock_at(uint64_t t)
{
    fake_now = t;
    wq_test_clock_set(t);
}

static inline void clock_step(uint64_t d)
{
    clock_at(fake_now + d);
}

/* Per-test setup and teardown of the fake-clock programs: the clock is at
   T0 before the test creates a queue; the teardown closes the handles a
   failed test left open and turns the clock off. */
static inline int fx_clock_setup(void **state)
{
    clock_at(T0);
    return th_setup(state);
}

static inline int fx_clock_teardown(void **state)
{
    close_all();
    wq_test_clock_set(0);
    fake_now = 0;
    return th_teardown(state);
}

/* A cmocka test of a fake-clock program. */
#define FX_CLOCK_TEST(fn) \
    cmocka_unit_test_setup_teardown(fn, fx_clock_setup, fx_clock_teardown)

/* ------------------------------------------------------------------ */
/* Queues                                                              */
/* ------------------------------------------------------------------ */

/* Create the queue th_qname(tag) with the options *o (NULL: all defaults)
   and WQ_CREATE | WQ_EXCL, or fail the test. Its name goes to *name_out
   when name_out is not NULL. Not tracked. */
wq *create_q(const char *tag, const struct wq_options *o,
             const char **name_out);
/* create_q, tracked. */
wq *open_opts(const char *tag, const struct wq_options *o);

struct wq_stats stats_of(wq *q); /* wq_stats, which must succeed */
/* Queued keys, after the lock holder moved the ready ones (wq_stats does;
   wq_len alone may still show the count from before a clock step). */
uint64_t queued(wq *q);
uint64_t waiting(wq *q);

/* Look `key` up in wq_dump. Returns wq_dump's return value; *found tells
   whether the key was listed, *out is its entry (key and result_message
   cleared: they point into the dump). */
int dump_find(wq *q, const char *key, struct wq_key_info *out, int *found);
/* wq_dump entry of `key` to *out (may be NULL); returns 0 when the key is
   not in the dump. */
int key_info(wq *q, const char *key, struct wq_key_info *out);
/* State bits of `key` in wq_dump, 0 when absent. */
unsigned key_state(wq *q, const char *key);

/* Ready time of a waiting key minus fake_now. */
#define ready_in(q, k) ready_in_((q), (k), __LINE__)
uint64_t ready_in_(wq *q, const char *key, int line);

/* wq_get with timeout 0 must hand out `key`. */
#define expect_get(q, k) expect_get_((q), (k), __LINE__)
void expect_get_(wq *q, const char *key, int line);
/* wq_get with timeout 0 must return `expect` (an error code). */
#define expect_get_rc(q, e) expect_get_rc_((q), (e), __LINE__)
void expect_get_rc_(wq *q, int expect, int line);
#define expect_done(q, k) assert_int_equal(wq_done((q), KS(k)), 0)

/* wq_check_report finds nothing (violations are printed). */
void check_clean(wq *q);

/* ------------------------------------------------------------------ */
/* Store directories and the guardian main()                           */
/* ------------------------------------------------------------------ */

/* Remove p and everything below it; errors are ignored. */
void rm_rf(const char *p);
/* A fresh, empty store directory under the program's top directory
   (fx_guard_main makes it). */
const char *mkstore(void);
/* Remove every directory mkstore made (for teardowns). */
void stores_cleanup(void);

/* cmocka's test and skip filters from WQ_TEST_FILTER / WQ_TEST_SKIP
   (e.g. "test_full*"). */
void fx_test_filters(void);

struct fx_guard {
    const char *prog;      /* "test-store": names the top directory
                              /tmp/wq-<prog>-XXXXXX and the messages */
    unsigned max_stores;   /* mkstore fails the test beyond this many */
    unsigned topdir_mode;  /* chmod of the top directory; 0: as mkdtemp
                              made it */
    unsigned deadline_s;   /* the runner is killed after this many
                              seconds (times th_scale()) */
    int (*run_group)(void);
};

/* main() of a program with store directories: makes the top directory,
   runs g->run_group in a child (its own process group) and removes the
   top directory and any /dev/shm object of the child whatever happened
   to it. SIGTERM, SIGINT and SIGHUP are forwarded to the child.
   WQ_TEST_NOFORK runs the group in this process (debugging). Returns the
   exit status for main. */
int fx_guard_main(const struct fx_guard *g);

/* ------------------------------------------------------------------ */
/* TestBasic and TestAddWhileProcessing (client-go queue_test.go)      */
/* ------------------------------------------------------------------ */

/* The program writes the producers (actor ids 0 .. producers - 1: its
   keys, how it adds them) and calls the consumer below for the other
   ids; the runner starts the team, shuts the queue down and checks. A
   program's key format is read back by its parse function: the producer
   id of a key, -1 when it is not one of them (or id >= max). In messages
   a key is "<prefix><id>". */
typedef int (*fx_parse_fn)(const unsigned char *key, int len, int max);

#define B_PRODUCERS 50
#define B_ADDS 50
#define B_CONSUMERS 10

struct fx_basic {
    atomic_int active[B_PRODUCERS];     /* witness: holders right now */
    atomic_int violations;              /* times a witness exceeded 1 */
    atomic_int processed[B_PRODUCERS];
    atomic_ullong seq;                  /* a global order of events */
    atomic_ullong last_add[B_PRODUCERS];   /* seq before the last add */
    atomic_ullong last_start[B_PRODUCERS]; /* seq at a processing start */
    atomic_int got_after_shutdown;
    atomic_int producers_done;
};

/* *a = max(*a, v) */
void fx_atomic_max(atomic_ullong *a, unsigned long long v);
/* Wait until *v >= target, at most ms (times th_scale()): 0 or -1. */
int fx_wait_count(atomic_int *v, int target, int ms);

/* A TestBasic consumer: gets and dones until -ESHUTDOWN; the key
   after_shutdown must never be handed out, no key may have two holders. */
int fx_basic_consume(struct th_actor *a, fx_parse_fn parse,
                     const char *after_shutdown);
/* Run TestBasic on q (its name `name`, b zeroed in shared memory):
   B_PRODUCERS + B_CONSUMERS actors of `actor`, then wq_shutdown (drain:
   wq_shutdown_drain) once the producers are done, then add_after_shutdown
   (which must be refused with -ESHUTDOWN). Checks the team, the witnesses
   and an empty queue. */
void fx_basic_run(enum th_mode mode, int drain, wq *q, const char *name,
                  struct fx_basic *b, th_actor_fn actor,
                  int (*add_after_shutdown)(wq *q));
/* After fx_basic_run: every key processed after its last add, every add
   counted once, nothing left; the stats go to *st. */
void fx_basic_check_stats(wq *q, struct fx_basic *b, const char *prefix,
                          struct wq_stats *st);

#define W_PRODUCERS 50
#define W_CONSUMERS 10

struct fx_awp {
    atomic_int active[W_PRODUCERS];
    atomic_int violations;
    atomic_int count[W_PRODUCERS];    /* times handed out */
    atomic_int readd_ok[W_PRODUCERS]; /* re-add while processing gave 0 */
    atomic_int readd_refused[W_PRODUCERS]; /* ... gave -ESHUTDOWN */
    atomic_int producers_done;
    atomic_int shutdown_started;
};

/* A TestAddWhileProcessing consumer: re-adds each key once while
   processing it, with readd(q, key, len, seed); it then comes back once
   after its wq_done, unless the queue was shut down meanwhile. */
int fx_awp_consume(struct th_actor *a, fx_parse_fn parse,
                   int (*readd)(wq *q, const void *key, size_t len,
                                unsigned *seed),
                   unsigned *seed, const char *prefix);
/* Run TestAddWhileProcessing on q: W_PRODUCERS + W_CONSUMERS actors of
   `actor`; settle_ms after the producers are done, the queue is shut
   down (drain: wq_shutdown_drain). Checks the team, the witnesses, every
   key handed out once plus once per accepted re-add, and the stats. */
void fx_awp_run(enum th_mode mode, int drain, wq *q, const char *name,
                struct fx_awp *w, th_actor_fn actor, unsigned settle_ms,
                const char *prefix);

#endif /* WQ_TEST_FIXTURE_H */
