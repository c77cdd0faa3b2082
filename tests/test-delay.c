/*
 * test-delay.c - the delaying queue (wq_add_after) against Kubernetes
 * client-go's util/workqueue/delaying_queue_test.go, plus the libwq
 * specifics of the contract (wq.h "Delaying and rate limiting", API.md
 * "Semantics in detail").
 *
 * Clock: client-go's tests drive a fake clock. Here the test build of the
 * library (libwq-fault.a) offers wq_test_clock_set(): every CLOCK_MONOTONIC
 * reading libwq makes in this process returns the value we set. It is set
 * before the queue is created and stays at T0 (1000 s, so that no
 * arithmetic can underflow) until a test steps it. Blocking waits would
 * still sleep in real time, so every wq_get here uses timeout 0.
 *
 * Observing the queue: libwq has no timer goroutine. Waiting keys move to
 * the queue when a lock holder notices they are ready (every wq_get before
 * it pops, and wq_stats). So where client-go polls q.Len() after
 * fakeClock.Step() (waitForAdded), we read wq_stats().queued, which does
 * the move first; wq_len() alone may still show the count from before the
 * step. client-go's waitForWaitingQueueToFill (waiting for its goroutine
 * to take the entry from a channel) has no counterpart: wq_add_after has
 * put the key in the region's heap when it returns.
 */
#include "t.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

/* ================================================================== */
/* client-go delaying_queue_test.go                                    */
/* ================================================================== */

/* TestSimpleQueue */
static void simple_queue(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("simple", NULL, NULL));

    assert_int_equal(wq_add_after(q, KS("foo"), 50 * MS), 0);
    assert_int_equal(wq_len(q), 0); /* "should not have added" */
    assert_int_equal(t_queued(q), 0);
    assert_int_equal(t_waiting(q), 1);

    t_clock_step(60 * MS);
    assert_int_equal(t_queued(q), 1); /* waitForAdded(q, 1) */
    assert_int_equal(wq_len(q), 1); /* the stats call moved it */
    T_EXPECT_GET(q, "foo");
    T_EXPECT_DONE(q, "foo");

    /* "step past the next heartbeat": nothing may be added again. Go polls
       Len() for 30 ms; with a fake clock one look is deterministic. */
    t_clock_step(10 * SEC);
    assert_int_equal(t_queued(q), 0);
    assert_int_equal(wq_len(q), 0);
    assert_int_equal(t_waiting(q), 0);
    T_EXPECT_GET_RC(q, -EAGAIN);
    t_close(q);
}

/* TestDeduping */
static void deduping(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("dedup", NULL, NULL));

    assert_int_equal(wq_add_after(q, KS("foo"), 50 * MS), 0);
    /* merged into the waiting key, which keeps the earlier ready time */
    assert_int_equal(wq_add_after(q, KS("foo"), 70 * MS), 1);
    assert_int_equal(T_READY_IN(q, "foo"), 50 * MS);
    assert_int_equal(t_queued(q), 0);
    assert_int_equal(t_waiting(q), 1);

    /* step past the first block, we should receive now */
    t_clock_step(60 * MS);
    assert_int_equal(t_queued(q), 1);
    T_EXPECT_GET(q, "foo");
    T_EXPECT_DONE(q, "foo");

    /* step past the second add: it must not fire */
    t_clock_step(20 * MS);
    assert_int_equal(t_queued(q), 0);
    assert_int_equal(t_waiting(q), 0);
    T_EXPECT_GET_RC(q, -EAGAIN);

    /* test again, but this time the earlier should override */
    assert_int_equal(wq_add_after(q, KS("foo"), 50 * MS), 0);
    assert_int_equal(wq_add_after(q, KS("foo"), 30 * MS), 1);
    assert_int_equal(T_READY_IN(q, "foo"), 30 * MS);
    assert_int_equal(t_queued(q), 0);

    t_clock_step(40 * MS);
    assert_int_equal(t_queued(q), 1);
    T_EXPECT_GET(q, "foo");
    T_EXPECT_DONE(q, "foo");

    /* step past the second add */
    t_clock_step(20 * MS);
    assert_int_equal(t_queued(q), 0);
    assert_int_equal(t_waiting(q), 0);
    T_EXPECT_GET_RC(q, -EAGAIN);
    t_close(q);
}

/*
 * Older versions of TestDeduping end with "test again, but this time item
 * is being processed in FIFO": Add, Get, AddAfter(5ms) of the processing
 * item, which must then still be known to the queue. libwq's contract for
 * that case: a processing key that is not dirty waits, is marked dirty
 * when ready, and is queued again at its wq_done.
 */
static void deduping_while_processing(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("dedup-proc", NULL, NULL));

    assert_int_equal(wq_add(q, KS("foo")), 0);
    T_EXPECT_GET(q, "foo");
    assert_int_equal(wq_add_after(q, KS("foo"), 5 * MS), 0); /* new wait */
    unsigned st = t_key_state(q, "foo");
    assert_true(st & WQ_KEY_PROCESSING);
    assert_true(st & WQ_KEY_WAITING);
    assert_false(st & WQ_KEY_DIRTY);
    assert_int_equal(T_READY_IN(q, "foo"), 5 * MS);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.processing, 1);
    assert_int_equal(s.waiting, 1);
    assert_int_equal(s.queued, 0);

    /* ready while processing: marked dirty, not handed out */
    t_clock_step(5 * MS);
    s = t_stats(q);
    assert_int_equal(s.waiting, 0);
    assert_int_equal(s.queued, 0);
    assert_int_equal(s.processing, 1);
    st = t_key_state(q, "foo");
    assert_true(st & WQ_KEY_PROCESSING);
    assert_true(st & WQ_KEY_DIRTY);
    assert_false(st & WQ_KEY_WAITING);
    T_EXPECT_GET_RC(q, -EAGAIN);

    /* queued again at its Done */
    T_EXPECT_DONE(q, "foo");
    assert_int_equal(t_queued(q), 1);
    T_EXPECT_GET(q, "foo");
    T_EXPECT_DONE(q, "foo");
    t_clock_step(1 * SEC);
    T_EXPECT_GET_RC(q, -EAGAIN);
    assert_int_equal(t_stats(q).live, 0);
    t_close(q);
}

/* TestAddTwoFireEarly */
static void add_two_fire_early(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("fire-early", NULL, NULL));

    assert_int_equal(wq_add_after(q, KS("foo"), 1 * SEC), 0);
    assert_int_equal(wq_add_after(q, KS("bar"), 50 * MS), 0);
    assert_int_equal(t_queued(q), 0);

    t_clock_step(60 * MS);
    assert_int_equal(t_queued(q), 1);
    T_EXPECT_GET(q, "bar");

    assert_int_equal(wq_add_after(q, KS("baz"), 2 * SEC), 0);

    t_clock_step(1 * SEC);
    assert_int_equal(t_queued(q), 1);
    T_EXPECT_GET(q, "foo");

    t_clock_step(2 * SEC);
    assert_int_equal(t_queued(q), 1);
    T_EXPECT_GET(q, "baz");
    t_close(q);
}

/* TestCopyShifting */
static void copy_shifting(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("copy-shift", NULL, NULL));

    assert_int_equal(wq_add_after(q, KS("foo"), 1 * SEC), 0);
    assert_int_equal(wq_add_after(q, KS("bar"), 500 * MS), 0);
    assert_int_equal(wq_add_after(q, KS("baz"), 250 * MS), 0);
    assert_int_equal(t_queued(q), 0);

    t_clock_step(2 * SEC);
    assert_int_equal(t_queued(q), 3);
    T_EXPECT_GET(q, "baz");
    T_EXPECT_GET(q, "bar");
    T_EXPECT_GET(q, "foo");
    t_close(q);
}

/*
 * BenchmarkDelayingQueue_AddAfter, as a test: N keys with random delays
 * below 10 minutes, step 11 minutes, get all N. The delays are drawn from
 * a coarse grid so that many keys share a ready time; the expected order is
 * by ready time, ties in the order of their add (wq.h), i.e. a stable sort.
 */
#define RAND_N 2000
struct rkey {
    uint64_t delay;
    int idx;
};

static int rkey_cmp(const void *a, const void *b)
{
    const struct rkey *x = a, *y = b;

    if (x->delay != y->delay)
        return x->delay < y->delay ? -1 : 1;
    return x->idx - y->idx;
}

static void add_after_random(void **state)
{
    (void)state;
    t_watchdog(15);
    wq *q = t_track(t_create("random", T_OPTS(.capacity = 4096), NULL));
    static struct rkey keys[RAND_N];
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    char k[32];

    for (int i = 0; i < RAND_N; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        /* 1 .. 1000 steps of 600 ms: below 10 minutes, never 0 */
        keys[i].delay = ((seed >> 33) % 1000 + 1) * 600 * MS - 1;
        keys[i].idx = i;
        snprintf(k, sizeof k, "%d", i);
        int rc = wq_add_after(q, KS(k), keys[i].delay);
        if (rc != 0)
            fail_msg("wq_add_after(%s) = %d", k, rc);
    }
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.waiting, RAND_N);
    assert_int_equal(s.queued, 0);
    assert_int_equal(s.live, RAND_N);
    qsort(keys, RAND_N, sizeof keys[0], rkey_cmp);
    assert_int_equal(s.next_ready_ns, T0 + keys[0].delay);
    t_clock_step(11 * MIN);
    assert_int_equal(t_queued(q), RAND_N);
    for (int i = 0; i < RAND_N; i++) {
        snprintf(k, sizeof k, "%d", keys[i].idx);
        T_EXPECT_GET(q, k);
    }
    T_EXPECT_GET_RC(q, -EAGAIN);
    for (int i = 0; i < RAND_N; i++) {
        snprintf(k, sizeof k, "%d", i);
        T_EXPECT_DONE(q, k);
    }

    /* Again, then take keys out of the middle of the heap (a direct add
       queues every 7th key at once) and move others earlier (every 5th
       gets a shorter delay, off the grid so that it ties with nothing).
       Expected: the direct adds first in their order, then the rest by
       ready time, ties in add order. */
    for (int i = 0; i < RAND_N; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        keys[i].delay = ((seed >> 33) % 1000 + 1) * 600 * MS - 1;
        keys[i].idx = i;
        snprintf(k, sizeof k, "%d", i);
        assert_int_equal(wq_add_after(q, KS(k), keys[i].delay), 0);
    }
    for (int i = 0; i < RAND_N; i += 5) {
        uint64_t d = keys[i].delay / 2 + 1 + (uint64_t)i;
        snprintf(k, sizeof k, "%d", i);
        assert_int_equal(wq_add_after(q, KS(k), d), 1);
        keys[i].delay = d;
    }
    int ndirect = 0;
    for (int i = 3; i < RAND_N; i += 7) {
        snprintf(k, sizeof k, "%d", i);
        assert_int_equal(wq_add(q, KS(k)), 0);
        keys[i].delay = 0; /* sorts first, by index = direct add order */
        ndirect++;
    }
    s = t_stats(q);
    assert_int_equal(s.queued, ndirect);
    assert_int_equal(s.waiting, RAND_N - ndirect);
    assert_int_equal(wq_check(q, 0), 0);
    qsort(keys, RAND_N, sizeof keys[0], rkey_cmp);
    assert_int_equal(s.next_ready_ns, t_fake_now + keys[ndirect].delay);
    t_clock_step(11 * MIN);
    assert_int_equal(t_queued(q), RAND_N);
    for (int i = 0; i < RAND_N; i++) {
        snprintf(k, sizeof k, "%d", keys[i].idx);
        T_EXPECT_GET(q, k);
    }
    T_EXPECT_GET_RC(q, -EAGAIN);
    assert_int_equal(wq_check(q, 0), 0);
    t_close(q);
}

/* ================================================================== */
/* libwq specifics                                                     */
/* ================================================================== */

/* client-go adds an entry when !readyAt.After(now): ready exactly at now. */
static void ready_time_boundary(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("boundary", NULL, NULL));

    assert_int_equal(wq_add_after(q, KS("a"), 50 * MS), 0);
    assert_int_equal(t_stats(q).next_ready_ns, T0 + 50 * MS);
    t_clock_step(50 * MS - NS);
    assert_int_equal(t_queued(q), 0);
    T_EXPECT_GET_RC(q, -EAGAIN);
    assert_int_equal(t_waiting(q), 1);
    t_clock_step(NS);
    T_EXPECT_GET(q, "a"); /* the get itself moves it */
    assert_int_equal(t_stats(q).next_ready_ns, 0);
    T_EXPECT_DONE(q, "a");

    /* a 1 ns delay */
    assert_int_equal(wq_add_after(q, KS("b"), 1), 0);
    assert_int_equal(T_READY_IN(q, "b"), 1);
    T_EXPECT_GET_RC(q, -EAGAIN);
    t_clock_step(NS);
    T_EXPECT_GET(q, "b");
    t_close(q);
}

/* wq_add_after with delay 0 is wq_add, return values included. */
static void zero_delay_is_add(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("zero", NULL, NULL));

    assert_int_equal(wq_add_after(q, KS("a"), 0), 0); /* newly queued */
    assert_int_equal(wq_len(q), 1);                   /* at once */
    assert_int_equal(t_waiting(q), 0);
    assert_int_equal(wq_add_after(q, KS("a"), 0), 1); /* coalesced */
    assert_int_equal(wq_len(q), 1);
    T_EXPECT_GET(q, "a");
    assert_int_equal(wq_add_after(q, KS("a"), 0), 0); /* marked dirty */
    assert_int_equal(wq_add_after(q, KS("a"), 0), 1);
    assert_int_equal(wq_len(q), 0);
    T_EXPECT_DONE(q, "a");
    assert_int_equal(wq_len(q), 1);
    T_EXPECT_GET(q, "a");
    T_EXPECT_DONE(q, "a");
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.adds_total, 2);
    assert_int_equal(s.coalesced_total, 2);
    assert_int_equal(s.retries_total, 4); /* every wq_add_after call */
    t_close(q);
}

/* A direct wq_add of a waiting key queues it at once, ends the wait, and
   the key does not fire a second time (client-go would). */
static void direct_add_of_waiting_key(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("direct", NULL, NULL));

    assert_int_equal(wq_add_after(q, KS("a"), 50 * MS), 0);
    assert_int_equal(wq_add_after(q, KS("b"), 60 * MS), 0);
    assert_int_equal(t_waiting(q), 2);
    assert_int_equal(wq_add(q, KS("a")), 0); /* newly queued */
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.waiting, 1);
    assert_int_equal(s.queued, 1);
    assert_int_equal(s.live, 2);
    assert_int_equal(s.next_ready_ns, T0 + 60 * MS);
    unsigned st = t_key_state(q, "a");
    assert_true(st & WQ_KEY_QUEUED);
    assert_false(st & WQ_KEY_WAITING);
    assert_int_equal(wq_add(q, KS("a")), 1); /* now simply dirty */
    T_EXPECT_GET(q, "a");
    T_EXPECT_DONE(q, "a");

    t_clock_step(100 * MS);
    assert_int_equal(t_queued(q), 1); /* only b */
    T_EXPECT_GET(q, "b");
    T_EXPECT_DONE(q, "b");
    T_EXPECT_GET_RC(q, -EAGAIN);
    s = t_stats(q);
    assert_int_equal(s.waiting, 0);
    assert_int_equal(s.live, 0);
    t_close(q);
}

/* wq_add_after of a key already dirty merges (returns 1) and creates no
   wait; the key is not handed out a second time later. */
static void add_after_of_dirty_key(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("dirty", NULL, NULL));

    /* queued */
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_add_after(q, KS("a"), 10 * MS), 1);
    assert_int_equal(t_waiting(q), 0);
    assert_int_equal(t_key_state(q, "a") & WQ_KEY_WAITING, 0);
    T_EXPECT_GET(q, "a");
    T_EXPECT_DONE(q, "a");
    t_clock_step(20 * MS);
    T_EXPECT_GET_RC(q, -EAGAIN);

    /* processing and re-added (dirty) */
    assert_int_equal(wq_add(q, KS("b")), 0);
    T_EXPECT_GET(q, "b");
    assert_int_equal(wq_add(q, KS("b")), 0);
    assert_int_equal(wq_add_after(q, KS("b"), 10 * MS), 1);
    assert_int_equal(t_waiting(q), 0);
    T_EXPECT_DONE(q, "b");
    T_EXPECT_GET(q, "b");
    T_EXPECT_DONE(q, "b");
    t_clock_step(20 * MS);
    T_EXPECT_GET_RC(q, -EAGAIN);
    assert_int_equal(t_stats(q).live, 0);
    t_close(q);
}

/* A processing key given a delay: done before it is ready, it just waits;
   re-added directly while processing+waiting, the wait ends. */
static void processing_key_delayed(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("proc-delay", NULL, NULL));

    /* done before ready */
    assert_int_equal(wq_add(q, KS("a")), 0);
    T_EXPECT_GET(q, "a");
    assert_int_equal(wq_add_after(q, KS("a"), 10 * MS), 0);
    assert_int_equal(wq_add_after(q, KS("a"), 20 * MS), 1); /* merged */
    T_EXPECT_DONE(q, "a");
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.processing, 0);
    assert_int_equal(s.waiting, 1);
    assert_int_equal(s.queued, 0);
    assert_int_equal(t_key_state(q, "a"), WQ_KEY_WAITING);
    assert_int_equal(T_READY_IN(q, "a"), 10 * MS);
    t_clock_step(10 * MS);
    assert_int_equal(t_queued(q), 1);
    T_EXPECT_GET(q, "a");
    T_EXPECT_DONE(q, "a");

    /* processing + waiting, then a direct add: dirty now, no wait left */
    assert_int_equal(wq_add(q, KS("b")), 0);
    T_EXPECT_GET(q, "b");
    assert_int_equal(wq_add_after(q, KS("b"), 10 * MS), 0);
    assert_int_equal(wq_add(q, KS("b")), 0);
    s = t_stats(q);
    assert_int_equal(s.waiting, 0);
    unsigned st = t_key_state(q, "b");
    assert_true(st & WQ_KEY_PROCESSING);
    assert_true(st & WQ_KEY_DIRTY);
    assert_false(st & WQ_KEY_WAITING);
    T_EXPECT_DONE(q, "b");
    T_EXPECT_GET(q, "b");
    T_EXPECT_DONE(q, "b");
    t_clock_step(50 * MS);
    T_EXPECT_GET_RC(q, -EAGAIN);
    assert_int_equal(t_stats(q).live, 0);
    t_close(q);
}

/* Shutdown drops waiting keys (client-go's waiting loop stops). */
static void shutdown_drops_waiting(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("shutdown", NULL, NULL));

    assert_int_equal(wq_add_after(q, KS("w1"), 1 * SEC), 0);
    assert_int_equal(wq_add_after(q, KS("w2"), 2 * SEC), 0);
    assert_int_equal(wq_add(q, KS("c")), 0);
    assert_int_equal(t_waiting(q), 2);
    assert_int_equal(wq_shutdown(q), 0);

    struct wq_stats s = t_stats(q);
    assert_int_equal(s.waiting, 0);
    assert_int_equal(s.queued, 1);
    assert_int_equal(s.live, 1);
    assert_int_equal(s.next_ready_ns, 0);
    assert_int_equal(t_key_state(q, "w1"), 0);
    assert_int_equal(t_key_state(q, "w2"), 0);
    T_EXPECT_GET(q, "c"); /* queued keys are still handed out */
    T_EXPECT_DONE(q, "c");
    T_EXPECT_GET_RC(q, -ESHUTDOWN);

    t_clock_step(3 * SEC);
    T_EXPECT_GET_RC(q, -ESHUTDOWN);
    s = t_stats(q);
    assert_int_equal(s.queued, 0);
    assert_int_equal(s.waiting, 0);
    assert_int_equal(s.live, 0);
    assert_int_equal(wq_add_after(q, KS("w3"), 1 * SEC), -ESHUTDOWN);
    assert_int_equal(wq_add_after(q, KS("w3"), 0), -ESHUTDOWN);
    assert_int_equal(t_waiting(q), 0);
    assert_int_equal(wq_check(q, 0), 0);
    t_close(q);
}

/* Shutdown and keys that are processing: a pending wait is dropped (the
   key is not queued again at its Done); a wait that already fired made
   the key dirty, and a dirty key is queued again at Done and handed out
   (client-go: Get returns queued items after ShutDown). */
static void shutdown_processing_waiting(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("shutdown-proc", NULL, NULL));

    assert_int_equal(wq_add(q, KS("p")), 0);
    assert_int_equal(wq_add(q, KS("r")), 0);
    T_EXPECT_GET(q, "p");
    T_EXPECT_GET(q, "r");
    assert_int_equal(wq_add_after(q, KS("p"), 1 * SEC), 0);
    assert_int_equal(wq_add_after(q, KS("r"), 10 * MS), 0);
    t_clock_step(10 * MS);
    assert_int_equal(t_waiting(q), 1); /* r fired: processing + dirty */
    assert_int_equal(wq_shutdown(q), 0);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.waiting, 0);
    assert_int_equal(s.processing, 2);
    assert_int_equal(t_key_state(q, "p"), WQ_KEY_PROCESSING);
    T_EXPECT_DONE(q, "p");
    T_EXPECT_GET_RC(q, -ESHUTDOWN);
    T_EXPECT_DONE(q, "r");
    T_EXPECT_GET(q, "r");
    T_EXPECT_DONE(q, "r");
    t_clock_step(2 * SEC);
    T_EXPECT_GET_RC(q, -ESHUTDOWN);
    s = t_stats(q);
    assert_int_equal(s.live, 0);
    assert_int_equal(wq_check(q, 0), 0);
    t_close(q);
}

/* The fast paths see waiting keys like wq_add / wq_get do. */
static void fast_paths(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("fast-paths", NULL, NULL));
    char buf[T_KEYBUF];
    struct iovec v[2] = { { (void *)"a", 1 }, { (void *)"b", 1 } };

    /* wq_add_many of a waiting key queues it at once and ends the wait */
    assert_int_equal(wq_add_after(q, KS("a"), 10 * MS), 0);
    assert_int_equal(wq_add_many(q, v, 2), 0);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.waiting, 0);
    assert_int_equal(s.queued, 2);
    T_EXPECT_GET(q, "a");

    /* wq_done_get moves ready keys before it pops */
    assert_int_equal(wq_add_after(q, KS("c"), 10 * MS), 0);
    t_clock_step(10 * MS);
    int n = wq_done_get(q, KS("a"), buf, sizeof buf, 0);
    assert_int_equal(n, 1);
    assert_int_equal(buf[0], 'b');
    n = wq_done_get(q, KS("b"), buf, sizeof buf, 0);
    assert_int_equal(n, 1);
    assert_int_equal(buf[0], 'c');
    n = wq_done_get(q, KS("c"), buf, sizeof buf, 0);
    assert_int_equal(n, -EAGAIN);
    t_clock_step(1 * SEC);
    T_EXPECT_GET_RC(q, -EAGAIN);
    assert_int_equal(t_stats(q).live, 0);
    t_close(q);
}

/* Delays so long that now + delay does not fit: the key waits (it must
   not wrap around into the past and fire at once). */
static void huge_delay(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("huge", NULL, NULL));

    assert_int_equal(wq_add_after(q, KS("a"), UINT64_MAX), 0);
    assert_int_equal(wq_add_after(q, KS("b"), UINT64_MAX - T0 + 1), 0);
    assert_int_equal(wq_add_after(q, KS("c"), (uint64_t)INT64_MAX + 1), 0);
    assert_int_equal(wq_add_after(q, KS("d"), 1 * SEC), 0);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.waiting, 4);
    assert_int_equal(s.queued, 0);
    assert_int_equal(s.next_ready_ns, T0 + 1 * SEC);
    assert_true(T_READY_IN(q, "a") > (uint64_t)INT64_MAX);
    assert_true(T_READY_IN(q, "b") > (uint64_t)INT64_MAX);
    assert_true(T_READY_IN(q, "c") > (uint64_t)INT64_MAX - T0);
    t_clock_step(1000 * SEC);
    assert_int_equal(t_queued(q), 1);
    T_EXPECT_GET(q, "d");
    T_EXPECT_GET_RC(q, -EAGAIN);
    assert_int_equal(t_waiting(q), 3);
    /* an earlier ready time still wins */
    assert_int_equal(wq_add_after(q, KS("a"), 1 * SEC), 1);
    t_clock_step(1 * SEC);
    T_EXPECT_GET(q, "a");
    assert_int_equal(wq_check(q, 0), 0);
    t_close(q);
}

/* Keys with the same ready time fire in the order they were added, also
   when they were added among other keys and after a merge. */
static void same_ready_time_in_add_order(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("ties", NULL, NULL));
    static const char *const order[] = { "e", "b", "d", "a", "c", "f" };

    assert_int_equal(wq_add_after(q, KS("late"), 200 * MS), 0);
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(wq_add_after(q, KS(order[i]), 100 * MS), 0);
        if (i == 2) /* a later wait merged into d keeps d's time */
            assert_int_equal(wq_add_after(q, KS("d"), 150 * MS), 1);
    }
    assert_int_equal(wq_add_after(q, KS("early"), 50 * MS), 0);
    t_clock_step(1 * SEC);
    assert_int_equal(t_queued(q), 8);
    T_EXPECT_GET(q, "early");
    for (size_t i = 0; i < 6; i++)
        T_EXPECT_GET(q, order[i]);
    T_EXPECT_GET(q, "late");
    T_EXPECT_GET_RC(q, -EAGAIN);
    t_close(q);
}

/* stats.next_ready_ns follows the earliest waiting key. */
static void next_ready(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("next-ready", NULL, NULL));

    assert_int_equal(t_stats(q).next_ready_ns, 0);
    assert_int_equal(t_stats(q).now_ns, T0);
    assert_int_equal(wq_add_after(q, KS("a"), 300 * MS), 0);
    assert_int_equal(t_stats(q).next_ready_ns, T0 + 300 * MS);
    assert_int_equal(wq_add_after(q, KS("b"), 100 * MS), 0);
    assert_int_equal(t_stats(q).next_ready_ns, T0 + 100 * MS);
    assert_int_equal(wq_add_after(q, KS("a"), 50 * MS), 1); /* earlier */
    assert_int_equal(t_stats(q).next_ready_ns, T0 + 50 * MS);
    t_clock_step(60 * MS);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.now_ns, T0 + 60 * MS);
    assert_int_equal(s.next_ready_ns, T0 + 100 * MS);
    assert_int_equal(s.queued, 1);
    t_clock_step(40 * MS);
    s = t_stats(q);
    assert_int_equal(s.next_ready_ns, 0);
    assert_int_equal(s.queued, 2);
    t_close(q);
}

/* Waiting keys use slots (-ENOSPC), and the argument checks. */
static void waiting_keys_are_live(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("capacity", T_OPTS(.capacity = 2), NULL));
    char longkey[T_KEYBUF + 2];

    assert_int_equal(wq_add_after(q, KS("a"), 10 * MS), 0);
    assert_int_equal(wq_add_after(q, KS("b"), 20 * MS), 0);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.live, 2);
    assert_int_equal(s.waiting, 2);
    assert_int_equal(wq_add_after(q, KS("c"), 10 * MS), -ENOSPC);
    assert_int_equal(wq_add(q, KS("c")), -ENOSPC);
    assert_int_equal(wq_add_after(q, KS("a"), 5 * MS), 1); /* no slot needed */
    assert_int_equal(t_waiting(q), 2);

    memset(longkey, 'x', sizeof longkey);
    assert_int_equal(wq_add_after(q, longkey, T_KEYBUF + 1, 10 * MS), -EMSGSIZE);
    assert_int_equal(wq_add_after(q, "x", 0, 10 * MS), -EINVAL);
    assert_int_equal(wq_add_after(q, NULL, 1, 10 * MS), -EINVAL);
    assert_int_equal(wq_add_after(NULL, "x", 1, 10 * MS), -EINVAL);

    t_clock_step(20 * MS);
    T_EXPECT_GET(q, "a");
    T_EXPECT_GET(q, "b");
    assert_int_equal(wq_add_after(q, KS("c"), 10 * MS), -ENOSPC);
    T_EXPECT_DONE(q, "a");
    assert_int_equal(wq_add_after(q, KS("c"), 10 * MS), 0);
    assert_int_equal(wq_check(q, 0), 0);
    t_close(q);
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        T_CLOCK_TEST(simple_queue),
        T_CLOCK_TEST(deduping),
        T_CLOCK_TEST(deduping_while_processing),
        T_CLOCK_TEST(add_two_fire_early),
        T_CLOCK_TEST(copy_shifting),
        T_CLOCK_TEST(add_after_random),
        T_CLOCK_TEST(ready_time_boundary),
        T_CLOCK_TEST(zero_delay_is_add),
        T_CLOCK_TEST(direct_add_of_waiting_key),
        T_CLOCK_TEST(add_after_of_dirty_key),
        T_CLOCK_TEST(processing_key_delayed),
        T_CLOCK_TEST(shutdown_drops_waiting),
        T_CLOCK_TEST(shutdown_processing_waiting),
        T_CLOCK_TEST(fast_paths),
        T_CLOCK_TEST(huge_delay),
        T_CLOCK_TEST(same_ready_time_in_add_order),
        T_CLOCK_TEST(next_ready),
        T_CLOCK_TEST(waiting_keys_are_live),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("delay", tests);
}
