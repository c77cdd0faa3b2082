/*
 * test-metrics.c - libwq's metrics (wq_metrics) against Kubernetes
 * client-go's util/workqueue/metrics_test.go, plus the histogram buckets,
 * the retry counter, delayed keys, WQ_NO_METRICS and metrics shared by
 * processes.
 *
 * client-go's test plugs a test MetricsProvider into the queue and reads
 * back each metric's last observation. libwq keeps Prometheus-style
 * metrics in the region: counters, two histograms (count, sum, cumulative
 * buckets with client-go's bounds 1e-8 .. 10 s) and two work gauges
 * computed at scrape time. So "the last observation was x" becomes "the
 * histogram holds exactly these observations": count, sum, and for every
 * bucket how many of them are <= its bound (compared in integer
 * nanoseconds, so an observation on a bound is inside it, as Prometheus
 * does with le). Sums are compared to well below a nanosecond (relative
 * 1e-12): float addition order may differ from ours in the last bit.
 *
 * Clock: wq_test_clock_set() (see test-delay.c) makes every duration
 * exact. Every wq_get uses timeout 0.
 */
#include "t.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Metrics helpers                                                     */
/* ------------------------------------------------------------------ */

static struct wq_metrics metrics_of(wq *q)
{
    struct wq_metrics m;
    int rc = wq_metrics(q, &m);

    assert_int_equal(rc, 0);
    return m;
}

/* client-go's bucket bounds, in ns: 1e-8 s .. 10 s */
static const uint64_t bound_ns[WQ_HIST_BUCKETS] = {
    10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000,
    1000000000, 10000000000ull,
};

static int secs_equal(double a, double e)
{
    double d = a > e ? a - e : e - a;
    double tol = 1e-15 + (e < 0 ? -e : e) * 1e-12;

    return d <= tol;
}

#define expect_secs(a, ns) expect_secs_((a), (ns), #a, __LINE__)
static void expect_secs_(double a, uint64_t ns, const char *what, int line)
{
    double e = (double)ns / 1e9;

    if (!secs_equal(a, e))
        fail_msg("line %d: %s = %.17g s, expected %.17g s (%" PRIu64 " ns)",
                 line, what, a, e, ns);
}

/* The histogram holds exactly the n observations obs[] (ns). */
static void expect_hist_(const struct wq_histogram *h, const char *what,
                         int line, const uint64_t *obs, size_t n)
{
    double sum = 0;

    if (h->count != n)
        fail_msg("line %d: %s.count = %" PRIu64 ", expected %zu", line, what,
                 h->count, n);
    for (size_t i = 0; i < n; i++)
        sum += (double)obs[i] / 1e9;
    if (!secs_equal(h->sum_seconds, sum))
        fail_msg("line %d: %s.sum_seconds = %.17g, expected %.17g", line,
                 what, h->sum_seconds, sum);
    for (int b = 0; b < WQ_HIST_BUCKETS; b++) {
        uint64_t c = 0;
        for (size_t i = 0; i < n; i++)
            c += obs[i] <= bound_ns[b];
        if (h->bucket[b] != c)
            fail_msg("line %d: %s.bucket[le=1e%d] = %" PRIu64 ", expected %"
                     PRIu64, line, what, b - 8, h->bucket[b], c);
    }
    if (h->bucket[WQ_HIST_BUCKETS] != n)
        fail_msg("line %d: %s.bucket[+Inf] = %" PRIu64 ", expected %zu", line,
                 what, h->bucket[WQ_HIST_BUCKETS], n);
}

#define OBS(...) ((const uint64_t[]){ __VA_ARGS__ })
#define NOBS(...) (sizeof(OBS(__VA_ARGS__)) / sizeof(uint64_t))
/* expect_hist(m.queue_duration, 50 * US, 25 * US) */
#define expect_hist(h, ...) \
    expect_hist_(&(h), #h, __LINE__, OBS(__VA_ARGS__), NOBS(__VA_ARGS__))
#define expect_hist_empty(h) expect_hist_(&(h), #h, __LINE__, NULL, 0)

/* ================================================================== */
/* client-go metrics_test.go                                           */
/* ================================================================== */

/* TestMetrics */
static void metrics(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("metrics", NULL, NULL));
    struct wq_metrics m;

    m = metrics_of(q);
    assert_int_equal(m.adds_total, 0);
    assert_int_equal(m.depth, 0);
    expect_hist_empty(m.queue_duration);
    expect_hist_empty(m.work_duration);

    assert_int_equal(wq_add(q, KS("foo")), 0);
    m = metrics_of(q);
    assert_int_equal(m.adds_total, 1);
    assert_int_equal(m.depth, 1);

    t_clock_step(50 * US);

    /* Start processing */
    T_EXPECT_GET(q, "foo");
    m = metrics_of(q);
    expect_hist(m.queue_duration, 50 * US); /* 5e-05 */
    assert_int_equal(m.depth, 0);

    /* Add it back while processing; multiple adds of the same item are
       de-duped. */
    assert_int_equal(wq_add(q, KS("foo")), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(wq_add(q, KS("foo")), 1);
    m = metrics_of(q);
    assert_int_equal(m.adds_total, 2);
    assert_int_equal(m.coalesced_total, 4);
    /* "One thing remains in the queue": client-go's depth gauge is Inc'd
       at every Add that is not coalesced (also while processing) and Dec'd
       at Get, so it counts the dirty key that will be queued at Done. */
    if (m.depth != 1)
        fail_msg("depth = %" PRIu64 " while the key is processing and "
                 "dirty, expected 1 (client-go counts it)", m.depth);

    t_clock_step(25 * US);

    /* Finish it up */
    assert_int_equal(wq_done(q, KS("foo")), 0);
    m = metrics_of(q);
    expect_hist(m.work_duration, 25 * US); /* 2.5e-05 */
    /* One thing remains in the queue */
    assert_int_equal(m.depth, 1);

    /* It should be back on the queue; it waited since its re-add, 25 us
       ago (client-go records the add time at the Add, not at the Done) */
    T_EXPECT_GET(q, "foo");
    m = metrics_of(q);
    expect_hist(m.queue_duration, 50 * US, 25 * US);
    assert_int_equal(m.depth, 0);

    t_clock_step(1 * MS);
    m = metrics_of(q);
    expect_secs(m.unfinished_work_seconds, 1 * MS);
    expect_secs(m.longest_running_processor_seconds, 1 * MS);
    assert_int_equal(m.processing, 1);

    /* Finish that one up */
    assert_int_equal(wq_done(q, KS("foo")), 0);
    m = metrics_of(q);
    expect_hist(m.work_duration, 25 * US, 1 * MS); /* .001: on le=1e-3 */
    expect_hist(m.queue_duration, 50 * US, 25 * US);
    expect_secs(m.unfinished_work_seconds, 0);
    expect_secs(m.longest_running_processor_seconds, 0);
    assert_int_equal(m.depth, 0);
    assert_int_equal(m.adds_total, 2);
    assert_int_equal(m.processing, 0);
    assert_int_equal(m.retries_total, 0);
    t_close(q);
}

/*
 * TestMetricShutdown checks that client-go's goroutine updating the
 * unfinished-work gauges every tick stops at ShutDown. libwq has no such
 * updater: the gauges are computed at scrape time, so there is nothing to
 * stop. What maps: after shutdown, with nothing processing, time passing
 * changes no metric and wq_metrics keeps working.
 */
static void metric_shutdown(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("metric-shutdown", NULL, NULL));
    struct wq_metrics m;

    assert_int_equal(wq_add(q, KS("foo")), 0);
    T_EXPECT_GET(q, "foo");
    t_clock_step(1 * MS);
    m = metrics_of(q);
    expect_secs(m.unfinished_work_seconds, 1 * MS);
    assert_int_equal(wq_done(q, KS("foo")), 0);
    assert_int_equal(wq_shutdown(q), 0);
    struct wq_metrics before = metrics_of(q);

    t_clock_step(3600 * SEC);
    m = metrics_of(q);
    expect_secs(m.unfinished_work_seconds, 0);
    expect_secs(m.longest_running_processor_seconds, 0);
    assert_int_equal(m.adds_total, before.adds_total);
    assert_int_equal(m.depth, 0);
    expect_hist(m.queue_duration, 0);
    expect_hist(m.work_duration, 1 * MS);
    assert_int_equal(memcmp(&m.queue_duration, &before.queue_duration,
                            sizeof m.queue_duration), 0);
    assert_int_equal(memcmp(&m.work_duration, &before.work_duration,
                            sizeof m.work_duration), 0);
    t_close(q);
}

/* ================================================================== */
/* libwq specifics                                                     */
/* ================================================================== */

/* Observations on, just below and just above the bucket bounds. */
static void histogram_buckets(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("buckets", NULL, NULL));
    static const uint64_t d[] = {
        0, 1, 10, 11, 99, 100, 101, 999, 1000, 10 * US, 10 * US + 1,
        100 * US, 1 * MS, 1 * MS + 1, 10 * MS, 100 * MS - 1, 100 * MS,
        1 * SEC, 10 * SEC, 10 * SEC + 1, 100 * SEC,
    };
    const size_t n = sizeof d / sizeof d[0];
    static uint64_t zeros[sizeof d / sizeof d[0]];
    struct wq_metrics m;

    /* queue durations d[i], work durations 0 */
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(wq_add(q, KS("k")), 0);
        t_clock_step(d[i]);
        T_EXPECT_GET(q, "k");
        T_EXPECT_DONE(q, "k");
    }
    m = metrics_of(q);
    expect_hist_(&m.queue_duration, "queue_duration", __LINE__, d, n);
    expect_hist_(&m.work_duration, "work_duration", __LINE__, zeros, n);

    /* work durations d[i] */
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(wq_add(q, KS("k")), 0);
        T_EXPECT_GET(q, "k");
        t_clock_step(d[i]);
        T_EXPECT_DONE(q, "k");
    }
    m = metrics_of(q);
    uint64_t all[2 * (sizeof d / sizeof d[0])];
    memcpy(all, zeros, sizeof zeros);
    memcpy(all + n, d, sizeof d);
    expect_hist_(&m.work_duration, "work_duration", __LINE__, all, n + n);
    assert_int_equal(m.queue_duration.count, n + n);
    assert_int_equal(m.adds_total, n + n);
    t_close(q);
}

/* Two keys processing: the gauges sum ages / take the oldest. */
static void work_gauges(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("gauges", NULL, NULL));
    struct wq_metrics m;

    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_add(q, KS("b")), 0);
    T_EXPECT_GET(q, "a");
    t_clock_step(1 * MS);
    T_EXPECT_GET(q, "b");
    t_clock_step(2 * MS);
    m = metrics_of(q);
    assert_int_equal(m.processing, 2);
    expect_secs(m.unfinished_work_seconds, 5 * MS);
    expect_secs(m.longest_running_processor_seconds, 3 * MS);
    expect_hist(m.queue_duration, 0, 1 * MS);

    T_EXPECT_DONE(q, "a");
    m = metrics_of(q);
    expect_secs(m.unfinished_work_seconds, 2 * MS);
    expect_secs(m.longest_running_processor_seconds, 2 * MS);
    expect_hist(m.work_duration, 3 * MS);
    t_clock_step(10 * SEC);
    m = metrics_of(q);
    expect_secs(m.unfinished_work_seconds, 10 * SEC + 2 * MS);
    expect_secs(m.longest_running_processor_seconds, 10 * SEC + 2 * MS);
    T_EXPECT_DONE(q, "b");
    m = metrics_of(q);
    expect_secs(m.unfinished_work_seconds, 0);
    expect_secs(m.longest_running_processor_seconds, 0);
    expect_hist(m.work_duration, 3 * MS, 10 * SEC + 2 * MS);
    assert_int_equal(m.processing, 0);
    t_close(q);
}

/* retries_total counts every wq_add_after and wq_add_rate_limited call
   (client-go's AddAfter counts a retry whatever happens next). */
static void retries_total(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("retries", NULL, NULL));
    struct wq_metrics m;

    assert_int_equal(wq_add(q, KS("plain")), 0); /* not a retry */
    assert_int_equal(wq_add_after(q, KS("a"), 10 * MS), 0);
    assert_int_equal(wq_add_after(q, KS("a"), 20 * MS), 1);  /* merged */
    assert_int_equal(wq_add_after(q, KS("b"), 0), 0);        /* = wq_add */
    assert_int_equal(wq_add_after(q, KS("b"), 5 * MS), 1);   /* dirty */
    assert_int_equal(wq_add_rate_limited(q, KS("c")), 0);
    assert_int_equal(wq_add_rate_limited(q, KS("c")), 1);    /* merged */
    assert_int_equal(wq_add_rate_limited(q, KS("plain")), 1); /* queued */
    m = metrics_of(q);
    assert_int_equal(m.retries_total, 7);
    assert_int_equal(t_stats(q).retries_total, 7);
    assert_int_equal(m.waiting, 2);
    assert_int_equal(m.depth, 2);     /* plain, b */
    assert_int_equal(m.adds_total, 2); /* waiting keys not yet added */
    t_close(q);
}

/*
 * A delayed key is added to the queue when it becomes ready: client-go's
 * waiting loop calls Add at its ready time, so adds_total and depth count
 * it from then, and its queue_duration runs from its ready time to the
 * Get. libwq moves ready keys lazily (at the next wq_get / wq_stats);
 * the ready time is still the time the key entered the queue.
 */
static void waiting_key_metrics(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("waiting", NULL, NULL));
    struct wq_metrics m;

    assert_int_equal(wq_add_after(q, KS("k"), 50 * MS), 0);
    m = metrics_of(q);
    assert_int_equal(m.adds_total, 0);
    assert_int_equal(m.depth, 0);
    assert_int_equal(m.waiting, 1);
    assert_int_equal(m.retries_total, 1);

    t_clock_step(80 * MS);
    assert_int_equal(t_queued(q), 1); /* moved now, 30 ms after ready */
    m = metrics_of(q);
    assert_int_equal(m.adds_total, 1);
    assert_int_equal(m.depth, 1);
    assert_int_equal(m.waiting, 0);
    t_clock_step(5 * MS);
    T_EXPECT_GET(q, "k");
    m = metrics_of(q);
    expect_hist(m.queue_duration, 35 * MS);
    T_EXPECT_DONE(q, "k");
    t_close(q);
}

/* The same when the first lock holder after the ready time is the get
   itself (no wq_stats in between). */
static void waiting_key_queue_duration_from_ready(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("waiting-get", NULL, NULL));
    struct wq_metrics m;

    assert_int_equal(wq_add_after(q, KS("k"), 50 * MS), 0);
    t_clock_step(80 * MS);
    T_EXPECT_GET(q, "k");
    m = metrics_of(q);
    assert_int_equal(m.adds_total, 1);
    expect_hist(m.queue_duration, 30 * MS);
    T_EXPECT_DONE(q, "k");
    t_close(q);
}

/* A processing key whose wait fires is added (dirty) at its ready time:
   client-go's waiting loop calls Add then, which counts in adds_total and
   depth and starts its queue time; it is got after its Done. */
static void processing_key_wait_fires_metrics(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("waiting-proc", NULL, NULL));
    struct wq_metrics m;

    assert_int_equal(wq_add(q, KS("k")), 0);
    T_EXPECT_GET(q, "k");
    assert_int_equal(wq_add_after(q, KS("k"), 10 * MS), 0);
    t_clock_step(30 * MS);
    assert_int_equal(t_queued(q), 0); /* fired: processing + dirty */
    m = metrics_of(q);
    assert_int_equal(m.adds_total, 2);
    assert_int_equal(m.waiting, 0);
    T_EXPECT_DONE(q, "k");
    t_clock_step(5 * MS);
    T_EXPECT_GET(q, "k");
    m = metrics_of(q);
    expect_hist(m.queue_duration, 0, 25 * MS);
    expect_hist(m.work_duration, 30 * MS);
    T_EXPECT_DONE(q, "k");
    t_close(q);
}

/* A direct add of a waiting key is an add at that time. */
static void direct_add_of_waiting_key_metrics(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("waiting-direct", NULL, NULL));
    struct wq_metrics m;

    assert_int_equal(wq_add_after(q, KS("k"), 50 * MS), 0);
    t_clock_step(10 * MS);
    assert_int_equal(wq_add(q, KS("k")), 0);
    m = metrics_of(q);
    assert_int_equal(m.adds_total, 1);
    assert_int_equal(m.depth, 1);
    assert_int_equal(m.waiting, 0);
    t_clock_step(1 * MS);
    T_EXPECT_GET(q, "k");
    m = metrics_of(q);
    expect_hist(m.queue_duration, 1 * MS);
    T_EXPECT_DONE(q, "k");
    t_clock_step(1 * SEC);
    m = metrics_of(q);
    assert_int_equal(m.adds_total, 1); /* never fired a second time */
    t_close(q);
}

/* WQ_NO_METRICS: histograms and work gauges stay 0; counters count. */
static void no_metrics(void **state)
{
    (void)state;
    t_watchdog(10);
    struct wq_options o = { .flags = WQ_NO_METRICS };
    wq *q = t_track(t_create("no-metrics", &o, NULL));
    struct wq_metrics m;

    assert_int_equal(wq_add(q, KS("k")), 0);
    t_clock_step(1 * MS);
    T_EXPECT_GET(q, "k");
    t_clock_step(1 * MS);
    m = metrics_of(q);
    expect_secs(m.unfinished_work_seconds, 0);
    expect_secs(m.longest_running_processor_seconds, 0);
    T_EXPECT_DONE(q, "k");
    assert_int_equal(wq_add_after(q, KS("w"), 1 * MS), 0);
    m = metrics_of(q);
    expect_hist_empty(m.queue_duration);
    expect_hist_empty(m.work_duration);
    assert_int_equal(m.adds_total, 1);
    assert_int_equal(m.retries_total, 1);
    assert_int_equal(m.waiting, 1);
    assert_int_equal(wq_metrics(q, NULL), -EINVAL);
    assert_int_equal(wq_metrics(NULL, &m), -EINVAL);
    t_close(q);
}

/* Metrics live in the region: a child process with its own (fake) clock
   gets and finishes the key; the parent sees its observations. */
static const char *xp_name;

static int xp_child(void)
{
    wq *q = NULL;
    char buf[T_KEYBUF];

    wq_test_clock_set(T0 + 2 * MS);
    T_CHECK_EQ(wq_open(xp_name, NULL, &q), 0);
    int n = wq_get(q, buf, sizeof buf, 0);
    T_CHECK_EQ(n, 1);
    T_CHECK(buf[0] == 'k');
    wq_test_clock_set(T0 + 5 * MS);
    T_CHECK_EQ(wq_done(q, "k", 1), 0);
    T_CHECK_EQ(wq_add(q, "x", 1), 0);
    wq_close(q);
    return 0;
}

static void metrics_across_processes(void **state)
{
    (void)state;
    t_watchdog(10);
    xp_name = t_qname("xproc");
    struct wq_options o = { .flags = WQ_CREATE | WQ_EXCL };
    wq *q = NULL;
    struct wq_metrics m;

    assert_int_equal(wq_open(xp_name, &o, &q), 0);
    t_track(q);
    assert_int_equal(wq_add(q, KS("k")), 0);
    pid_t pid = t_fork(10);
    if (pid == 0)
        _exit(xp_child());
    assert_int_equal(t_wait(pid, 5000), 0);
    T_ASSERT_BOARD_CLEAN();
    m = metrics_of(q);
    assert_int_equal(m.adds_total, 2);
    assert_int_equal(m.depth, 1);
    expect_hist(m.queue_duration, 2 * MS);
    expect_hist(m.work_duration, 3 * MS);
    t_close(q);
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        T_CLOCK_TEST(metrics),
        T_CLOCK_TEST(metric_shutdown),
        T_CLOCK_TEST(histogram_buckets),
        T_CLOCK_TEST(work_gauges),
        T_CLOCK_TEST(retries_total),
        T_CLOCK_TEST(waiting_key_metrics),
        T_CLOCK_TEST(waiting_key_queue_duration_from_ready),
        T_CLOCK_TEST(processing_key_wait_fires_metrics),
        T_CLOCK_TEST(direct_add_of_waiting_key_metrics),
        T_CLOCK_TEST(no_metrics),
        T_CLOCK_TEST(metrics_across_processes),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("metrics", tests);
}
