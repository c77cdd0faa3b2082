/*
 * test-limiters.c - the rate limiters against Kubernetes client-go's
 * util/workqueue/default_rate_limiters_test.go, plus the token bucket
 * (client-go's BucketRateLimiter over golang.org/x/time/rate) that
 * default_rate_limiters_test.go does not cover, and the option checks.
 *
 * client-go calls limiter.When(item), NumRequeues(item) and Forget(item)
 * directly. libwq has its limiters only behind the queue:
 *   When(k)        = wq_add_rate_limited(q, k): the failure count of k rises
 *                    and k waits for the limiter's delay. We read the delay
 *                    as wq_dump's ready_ns minus the (fake) now: with the
 *                    test clock it is exact. A delay of 0 is a plain
 *                    wq_add: the key is queued at once.
 *                    The key is then taken out of the waiting set without
 *                    moving the clock (a direct wq_add of a waiting key
 *                    queues it at once and ends the wait), got and done, so
 *                    the next When(k) starts a new wait; the failure count
 *                    survives wq_done. Keeping the clock still matters for
 *                    the token bucket, which refills with time, and keeps
 *                    the 1000-call overflow loops far from any overflow of
 *                    the clock itself.
 *   NumRequeues(k) = wq_num_requeues(q, k);   Forget(k) = wq_forget(q, k).
 * The limiters are chosen at creation with wq_options.rl_limiters; the
 * delay is the maximum of the selected ones (client-go's MaxOfRateLimiter).
 *
 * Clock: wq_test_clock_set() (see test-delay.c), set to T0 before every
 * queue is created, so the bucket starts full at T0.
 */
#include "t.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* When() through the queue                                            */
/* ------------------------------------------------------------------ */

/* One client-go When(key): the delay the limiter gave. The key is left
   neither waiting nor queued, and the clock does not move (see top). */
static uint64_t when_(wq *q, const char *key, int line)
{
    struct wq_key_info ki = { 0 };
    uint64_t d = 0;
    int rc = wq_add_rate_limited(q, KS(key));

    if (rc != 0)
        fail_msg("line %d: wq_add_rate_limited(%s) = %d (%s), expected 0",
                 line, key, rc, wq_strerror(rc));
    if (!t_key_info(q, key, &ki))
        fail_msg("line %d: \"%s\" is not in the dump", line, key);
    if (ki.state & WQ_KEY_WAITING) {
        if (ki.ready_ns <= t_fake_now)
            fail_msg("line %d: \"%s\" waits with ready_ns %" PRIu64
                     " <= now %" PRIu64, line, key, ki.ready_ns, t_fake_now);
        d = ki.ready_ns - t_fake_now;
        rc = wq_add(q, KS(key)); /* pull it forward: queued at once */
        if (rc != 0)
            fail_msg("line %d: wq_add(%s) of a waiting key = %d", line, key,
                     rc);
    } else if (ki.state == (WQ_KEY_QUEUED | WQ_KEY_DIRTY)) {
        d = 0; /* delay 0: wq_add */
    } else {
        fail_msg("line %d: \"%s\" state 0x%x after wq_add_rate_limited", line,
                 key, ki.state);
    }
    t_expect_get_(q, key, strlen(key), line);
    rc = wq_done(q, KS(key));
    if (rc != 0)
        fail_msg("line %d: wq_done(%s) = %d", line, key, rc);
    return d;
}

#define expect_when(q, k, e) expect_when_((q), (k), (e), __LINE__)
static void expect_when_(wq *q, const char *key, uint64_t expect, int line)
{
    uint64_t got = when_(q, key, line);

    if (got != expect)
        fail_msg("line %d: When(%s) = %" PRIu64 " ns, expected %" PRIu64
                 " ns", line, key, got, expect);
}

#define expect_requeues(q, k, e) \
    assert_int_equal(wq_num_requeues((q), KS(k)), (e))

static wq *limiter_q(const char *tag, unsigned limiters, uint64_t base,
                     uint64_t max, uint64_t fast, uint64_t slow,
                     uint32_t attempts)
{
    struct wq_options o = { .rl_limiters = limiters,
                            .rl_base_delay_ns = base,
                            .rl_max_delay_ns = max,
                            .rl_fast_delay_ns = fast,
                            .rl_slow_delay_ns = slow,
                            .rl_max_fast_attempts = attempts };
    return t_track(t_create(tag, &o, NULL));
}

static wq *bucket_q(const char *tag, double qps, uint32_t burst)
{
    struct wq_options o = { .rl_limiters = WQ_RL_BUCKET,
                            .rl_qps = qps,
                            .rl_burst = burst };
    return t_track(t_create(tag, &o, NULL));
}

/* ================================================================== */
/* client-go default_rate_limiters_test.go                             */
/* ================================================================== */

/* TestItemExponentialFailureRateLimiter */
static void item_exponential(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = limiter_q("exp", WQ_RL_EXPONENTIAL, 1 * MS, 1 * SEC, 0, 0, 0);

    expect_when(q, "one", 1 * MS);
    expect_when(q, "one", 2 * MS);
    expect_when(q, "one", 4 * MS);
    expect_when(q, "one", 8 * MS);
    expect_when(q, "one", 16 * MS);
    expect_requeues(q, "one", 5);

    expect_when(q, "two", 1 * MS);
    expect_when(q, "two", 2 * MS);
    expect_requeues(q, "two", 2);

    assert_int_equal(wq_forget(q, KS("one")), 0);
    expect_requeues(q, "one", 0);
    expect_when(q, "one", 1 * MS);
    t_close(q);
}

/* min(base * 2^i, max) without overflow. */
static uint64_t exp_delay(uint64_t base, uint64_t max, unsigned i)
{
    if (i >= 64 || base > (UINT64_MAX >> i))
        return max;
    return (base << i) > max ? max : base << i;
}

/* TestItemExponentialFailureRateLimiterOverFlow; every one of the 1000
   calls is checked too, not only the last. */
static void item_exponential_overflow(void **state)
{
    (void)state;
    t_watchdog(15);
    wq *q = limiter_q("exp-of1", WQ_RL_EXPONENTIAL, 1 * MS, 1000 * SEC, 0,
                      0, 0);

    for (int i = 0; i < 5; i++)
        (void)when_(q, "one", __LINE__);
    expect_when(q, "one", 32 * MS);

    for (unsigned i = 0; i < 1000; i++)
        expect_when(q, "overflow1", exp_delay(1 * MS, 1000 * SEC, i));
    expect_when(q, "overflow1", 1000 * SEC);
    expect_requeues(q, "overflow1", 1001);
    t_close(q);

    q = limiter_q("exp-of2", WQ_RL_EXPONENTIAL, 1 * MIN, 1000 * HOUR, 0, 0,
                  0);
    for (int i = 0; i < 2; i++)
        (void)when_(q, "two", __LINE__);
    expect_when(q, "two", 4 * MIN);

    for (unsigned i = 0; i < 1000; i++)
        expect_when(q, "overflow2", exp_delay(1 * MIN, 1000 * HOUR, i));
    expect_when(q, "overflow2", 1000 * HOUR);
    expect_requeues(q, "overflow2", 1001);
    t_close(q);
}

/* TestItemFastSlowRateLimiter */
static void item_fast_slow(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = limiter_q("fastslow", WQ_RL_FAST_SLOW, 0, 0, 5 * MS, 10 * SEC,
                      3);

    expect_when(q, "one", 5 * MS);
    expect_when(q, "one", 5 * MS);
    expect_when(q, "one", 5 * MS);
    expect_when(q, "one", 10 * SEC);
    expect_when(q, "one", 10 * SEC);
    expect_requeues(q, "one", 5);

    expect_when(q, "two", 5 * MS);
    expect_when(q, "two", 5 * MS);
    expect_requeues(q, "two", 2);

    assert_int_equal(wq_forget(q, KS("one")), 0);
    expect_requeues(q, "one", 0);
    expect_when(q, "one", 5 * MS);
    t_close(q);
}

/* TestMaxOfRateLimiter: MaxOf(FastSlow(5ms, 3s, 3), Exponential(1ms, 1s)) */
static void max_of(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = limiter_q("maxof", WQ_RL_FAST_SLOW | WQ_RL_EXPONENTIAL, 1 * MS,
                      1 * SEC, 5 * MS, 3 * SEC, 3);

    expect_when(q, "one", 5 * MS);
    expect_when(q, "one", 5 * MS);
    expect_when(q, "one", 5 * MS);
    expect_when(q, "one", 3 * SEC);
    expect_when(q, "one", 3 * SEC);
    expect_requeues(q, "one", 5);

    expect_when(q, "two", 5 * MS);
    expect_when(q, "two", 5 * MS);
    expect_requeues(q, "two", 2);

    assert_int_equal(wq_forget(q, KS("one")), 0);
    expect_requeues(q, "one", 0);
    expect_when(q, "one", 5 * MS);

    /* long past the fast attempts: the exponential one is capped at its
       max (1 s), so the slow delay (3 s) stays the maximum */
    for (int i = 0; i < 15; i++)
        (void)when_(q, "three", __LINE__);
    expect_when(q, "three", 3 * SEC);
    t_close(q);
}

/*
 * TestWithMaxWaitRateLimiter wraps a custom StepRateLimiter (a count shared
 * by all items: 5 ms for the first 100 calls, then 1000 s) in
 * NewWithMaxWaitRateLimiter(..., 500 s), and expects 5 ms x 100 then
 * 500 s x 100. libwq has neither user-supplied limiters nor a max-wait
 * wrapper: the limiter set is fixed at creation (exponential, bucket,
 * fast/slow), so nothing of this test maps. The closest libwq notion, the
 * per-key cap rl_max_delay_ns of the exponential limiter, is tested by
 * exponential_max_cap below.
 */
static void with_max_wait_rate_limiter(void **state)
{
    (void)state;
    skip(); /* no custom limiters and no WithMaxWait wrapper in libwq */
}

/* The per-key cap: base 5 ms, max 500 s: 5 ms * 2^i until 2^17 * 5 ms
   (655.36 s) would pass 500 s, then exactly 500 s for ever. */
static void exponential_max_cap(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = limiter_q("expcap", WQ_RL_EXPONENTIAL, 5 * MS, 500 * SEC, 0, 0,
                      0);

    for (unsigned i = 0; i < 17; i++)
        expect_when(q, "k", (5 * MS) << i);
    for (unsigned i = 17; i < 100; i++)
        expect_when(q, "k", 500 * SEC);
    expect_requeues(q, "k", 100);
    t_close(q);
}

/* ================================================================== */
/* The token bucket (client-go BucketRateLimiter, x/time/rate)         */
/* ================================================================== */

/*
 * rate.Limiter semantics: tokens refill at qps per second up to burst;
 * every reservation takes one token even if the count goes negative, and
 * waits deficit / qps. The bucket starts full and is shared by all keys.
 * Defaults (zero qps and burst): 10 qps, burst 100.
 */
static void bucket_burst_then_rate(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = bucket_q("bucket", 0, 0);
    char k[16];

    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof k, "b%d", i);
        expect_when(q, k, 0);
    }
    expect_when(q, "b100", 100 * MS);
    expect_when(q, "b101", 200 * MS);
    expect_when(q, "b0", 300 * MS); /* the same key takes tokens too */
    /* client-go's BucketRateLimiter keeps no per-key state: its
       NumRequeues is always 0, and so is libwq's with the bucket alone. */
    expect_requeues(q, "b0", 0);
    expect_requeues(q, "b101", 0);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.retries_total, 103);
    assert_int_equal(s.failing, 0);   /* no per-key counts: no idle slots */
    t_close(q);
}

/* Refill with time, capped at burst; fractions of a token. qps 4 keeps
   the arithmetic exact in binary floating point (1/4 s per token). */
static void bucket_refill(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = bucket_q("refill", 4, 2);

    expect_when(q, "k1", 0);
    expect_when(q, "k2", 0);
    expect_when(q, "k3", 250 * MS); /* tokens -1 */
    t_clock_step(125 * MS);           /* -0.5 */
    expect_when(q, "k4", 375 * MS); /* -1.5 */
    t_clock_step(1 * SEC);            /* 2.5, capped at 2 */
    expect_when(q, "k5", 0);
    expect_when(q, "k6", 0);
    expect_when(q, "k7", 250 * MS); /* -1 */
    t_clock_step(250 * MS);           /* 0 */
    expect_when(q, "k8", 250 * MS); /* -1 */
    t_clock_step(375 * MS);           /* 0.5 */
    expect_when(q, "k9", 125 * MS); /* -0.5 */
    t_clock_step(3600 * SEC);         /* a long idle time: 2 */
    expect_when(q, "k10", 0);
    expect_when(q, "k11", 0);
    expect_when(q, "k12", 250 * MS);
    expect_when(q, "k13", 500 * MS);
    t_close(q);
}

/* client-go's DefaultControllerRateLimiter, libwq's default (zero
   options): MaxOf(Exponential(5ms, 1000s), Bucket(10 qps, burst 100)). */
static void default_controller_rate_limiter(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("default", NULL, NULL));
    char k[16];

    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof k, "k%d", i);
        expect_when(q, k, 5 * MS);
    }
    expect_when(q, "k100", 100 * MS); /* bucket: 1 token short */
    expect_when(q, "k0", 200 * MS);   /* exp 10 ms, bucket 200 ms */
    t_clock_step(1 * SEC);              /* tokens -2 + 10 = 8 */
    expect_when(q, "k0", 20 * MS);    /* exp 20 ms, bucket 0 */
    expect_requeues(q, "k0", 3);
    assert_int_equal(wq_forget(q, KS("k0")), 0);
    expect_when(q, "k0", 5 * MS);

    /* the same through explicit options */
    struct wq_options o = { .rl_limiters = WQ_RL_EXPONENTIAL | WQ_RL_BUCKET,
                            .rl_base_delay_ns = 5 * MS,
                            .rl_max_delay_ns = 1000 * SEC,
                            .rl_qps = 10,
                            .rl_burst = 100 };
    wq *q2 = t_track(t_create("explicit", &o, NULL));
    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof k, "k%d", i);
        expect_when(q2, k, 5 * MS);
    }
    expect_when(q2, "k100", 100 * MS);
    expect_when(q2, "k0", 200 * MS);
    t_close(q2);
    t_close(q);
}

/* ================================================================== */
/* Options                                                             */
/* ================================================================== */

static int try_open(const struct wq_options *o)
{
    struct wq_options opt = *o;
    wq *q = NULL;
    int rc;

    opt.flags |= WQ_CREATE | WQ_EXCL;
    rc = wq_open(t_qname("opts"), &opt, &q);
    if (rc == 0)
        wq_close(q);
    return rc;
}

static void limiter_options(void **state)
{
    (void)state;
    t_watchdog(10);
    struct wq_options o;

#define TRY(expect, ...)                                                     \
    do {                                                                     \
        o = (struct wq_options){ __VA_ARGS__ };                              \
        int rc_ = try_open(&o);                                              \
        if (rc_ != (expect))                                                 \
            fail_msg("wq_open(%s) = %d (%s), expected %d", #__VA_ARGS__,    \
                     rc_, wq_strerror(rc_), (expect));                       \
    } while (0)

    TRY(-EINVAL, .rl_limiters = 1u << 3);
    TRY(-EINVAL, .rl_limiters = 1u << 31);
    TRY(-EINVAL, .rl_limiters = WQ_RL_FAST_SLOW);
    TRY(-EINVAL, .rl_limiters = WQ_RL_FAST_SLOW, .rl_fast_delay_ns = MS,
        .rl_slow_delay_ns = SEC);
    TRY(-EINVAL, .rl_limiters = WQ_RL_FAST_SLOW, .rl_fast_delay_ns = MS,
        .rl_max_fast_attempts = 3);
    TRY(-EINVAL, .rl_limiters = WQ_RL_FAST_SLOW, .rl_slow_delay_ns = SEC,
        .rl_max_fast_attempts = 3);
    TRY(-EINVAL, .rl_limiters = WQ_RL_FAST_SLOW, .rl_fast_delay_ns = 2 * SEC,
        .rl_slow_delay_ns = SEC, .rl_max_fast_attempts = 3);
    TRY(-EINVAL, .rl_base_delay_ns = 2 * SEC, .rl_max_delay_ns = SEC);
    TRY(-EINVAL, .rl_qps = -1);
    TRY(0, .rl_limiters = WQ_RL_FAST_SLOW, .rl_fast_delay_ns = SEC,
        .rl_slow_delay_ns = SEC, .rl_max_fast_attempts = 1);
    TRY(0, .rl_limiters = WQ_RL_EXPONENTIAL | WQ_RL_BUCKET | WQ_RL_FAST_SLOW,
        .rl_fast_delay_ns = MS, .rl_slow_delay_ns = SEC,
        .rl_max_fast_attempts = 1);
    TRY(0, .rl_base_delay_ns = SEC, .rl_max_delay_ns = SEC);
    TRY(0, .rl_qps = 0.5, .rl_burst = 1);
#undef TRY
}

/* Zero limiter fields are the defaults; options of an attach are ignored. */
static void limiter_defaults_and_attach(void **state)
{
    (void)state;
    t_watchdog(10);

    /* exponential alone, zero fields: 5 ms .. 1000 s */
    wq *q = limiter_q("expdef", WQ_RL_EXPONENTIAL, 0, 0, 0, 0, 0);
    expect_when(q, "k", 5 * MS);
    expect_when(q, "k", 10 * MS);
    for (int i = 0; i < 60; i++)
        (void)when_(q, "k", __LINE__);
    expect_when(q, "k", 1000 * SEC);
    t_close(q);

    /* bucket alone with a burst of 1: 0, then 1 / 10 qps */
    q = bucket_q("burst1", 0, 1);
    expect_when(q, "a", 0);
    expect_when(q, "b", 100 * MS);
    t_close(q);

    /* bucket with qps 2, default burst 100 */
    q = bucket_q("qps2", 2, 0);
    for (int i = 0; i < 100; i++)
        (void)when_(q, "a", __LINE__);
    expect_when(q, "b", 500 * MS);
    t_close(q);

    /* attaching with other limiter options is refused; with none given
       it keeps the creator's */
    const char *name = t_qname("attach");
    struct wq_options c = { .flags = WQ_CREATE | WQ_EXCL,
                            .rl_limiters = WQ_RL_EXPONENTIAL,
                            .rl_base_delay_ns = 1 * MS,
                            .rl_max_delay_ns = 1 * SEC };
    struct wq_options a = { .flags = WQ_CREATE,
                            .rl_limiters = WQ_RL_FAST_SLOW,
                            .rl_fast_delay_ns = 7 * MS,
                            .rl_slow_delay_ns = 9 * SEC,
                            .rl_max_fast_attempts = 1 };
    wq *q1 = NULL, *q2 = NULL;
    assert_int_equal(wq_open(name, &c, &q1), 0);
    t_track(q1);
    assert_int_equal(wq_open(name, &a, &q2), -EEXIST);
    assert_non_null(strstr(wq_last_error(), "rl_limiters"));
    a.rl_limiters = 0;
    a.rl_fast_delay_ns = a.rl_slow_delay_ns = 0;
    a.rl_max_fast_attempts = 0;
    assert_int_equal(wq_open(name, &a, &q2), 0);
    t_track(q2);
    expect_when(q2, "k", 1 * MS);
    expect_when(q2, "k", 2 * MS);
    expect_when(q1, "k", 4 * MS);
    t_close(q2);
    t_close(q1);
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        T_CLOCK_TEST(item_exponential),
        T_CLOCK_TEST(item_exponential_overflow),
        T_CLOCK_TEST(item_fast_slow),
        T_CLOCK_TEST(max_of),
        T_CLOCK_TEST(with_max_wait_rate_limiter),
        T_CLOCK_TEST(exponential_max_cap),
        T_CLOCK_TEST(bucket_burst_then_rate),
        T_CLOCK_TEST(bucket_refill),
        T_CLOCK_TEST(default_controller_rate_limiter),
        T_CLOCK_TEST(limiter_options),
        T_CLOCK_TEST(limiter_defaults_and_attach),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("limiters", tests);
}
