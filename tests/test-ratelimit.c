/*
 * test-ratelimit.c - the rate limiting queue (wq_add_rate_limited,
 * wq_num_requeues, wq_forget) against Kubernetes client-go's
 * util/workqueue/rate_limiting_queue_test.go, plus the libwq specifics of
 * the contract: where failure counts live (a key's slot, state
 * WQ_KEY_FAILING, stats.failing), merging, and eviction of idle failure
 * counts when the table is full.
 *
 * Clock: see test-delay.c. wq_test_clock_set() fakes libwq's
 * CLOCK_MONOTONIC in this process; it is set to T0 before each queue is
 * created (so the token bucket starts at T0 too) and only moves when a
 * test steps it. Every wq_get uses timeout 0.
 *
 * client-go's TestRateLimitingQueue reads each AddRateLimited's wait entry
 * from the delaying queue's channel: every call makes its own entry with
 * its own readyAt. In libwq a key already waiting keeps the earlier ready
 * time (one entry per key), so to see each delay the key is taken out of
 * the waiting set between the calls: the clock is stepped to its ready
 * time, it is got and done (its failure count survives wq_done). The
 * delay is read as wq_dump's ready_ns minus the fake now.
 */
#include "t.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* num_requeues with a check of the return value. */
#define requeues(q, k) wq_num_requeues((q), KS(k))

/* A queue with client-go's NewItemExponentialFailureRateLimiter(base, max)
   as its only limiter. */
static wq *exp_q(const char *tag, uint64_t base, uint64_t max, uint32_t cap)
{
    struct wq_options o = { .capacity = cap,
                            .rl_limiters = WQ_RL_EXPONENTIAL,
                            .rl_base_delay_ns = base,
                            .rl_max_delay_ns = max };
    return t_track(t_create(tag, &o, NULL));
}

/* Step the fake clock to `key`'s ready time, get it (it must be the front
   key) and mark it done: the key leaves the waiting set, and keeps its
   failure count. */
#define step_out(q, k) step_out_((q), (k), __LINE__)
static void step_out_(wq *q, const char *key, int line)
{
    t_clock_step(t_ready_in_(q, key, line));
    t_expect_get_(q, key, strlen(key), line);
    if (wq_done(q, KS(key)) != 0)
        fail_msg("line %d: wq_done(%s) failed", line, key);
}

/* ================================================================== */
/* client-go rate_limiting_queue_test.go                               */
/* ================================================================== */

/* TestRateLimitingQueue */
static void rate_limiting_queue(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = exp_q("rlq", 1 * MS, 1 * SEC, 0);

    assert_int_equal(wq_add_rate_limited(q, KS("one")), 0);
    assert_int_equal(T_READY_IN(q, "one"), 1 * MS);
    step_out(q, "one");
    assert_int_equal(wq_add_rate_limited(q, KS("one")), 0);
    assert_int_equal(T_READY_IN(q, "one"), 2 * MS);
    assert_int_equal(requeues(q, "one"), 2);

    assert_int_equal(wq_add_rate_limited(q, KS("two")), 0);
    assert_int_equal(T_READY_IN(q, "two"), 1 * MS);
    step_out(q, "two"); /* one is still waiting, 1 ms later */
    assert_int_equal(wq_add_rate_limited(q, KS("two")), 0);
    assert_int_equal(T_READY_IN(q, "two"), 2 * MS);

    /* Forget while "one" waits: the count goes, the wait stays. */
    assert_int_equal(wq_forget(q, KS("one")), 0);
    assert_int_equal(requeues(q, "one"), 0);
    assert_true(t_key_state(q, "one") & WQ_KEY_WAITING);
    assert_int_equal(requeues(q, "two"), 2);

    /* Let both fire, in ready order, then the first When of "one" again. */
    t_clock_step(2 * MS);
    assert_int_equal(t_queued(q), 2);
    T_EXPECT_GET(q, "one");
    T_EXPECT_GET(q, "two");
    T_EXPECT_DONE(q, "one");
    T_EXPECT_DONE(q, "two");
    assert_int_equal(wq_add_rate_limited(q, KS("one")), 0);
    assert_int_equal(T_READY_IN(q, "one"), 1 * MS);
    assert_int_equal(requeues(q, "one"), 1);
    assert_int_equal(requeues(q, "two"), 2);
    t_close(q);
}

/*
 * TestNewNamedRateLimitingWithCustomQueue (in some versions of the file):
 * DefaultControllerRateLimiter over a custom (priority) queue; one
 * AddRateLimited, then Get returns the key. libwq has no pluggable inner
 * queue, so the default queue stands in; the first default delay is
 * max(5 ms exponential, 0 from a full bucket) = 5 ms.
 */
static void named_custom_queue(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("named", NULL, NULL));

    assert_int_equal(wq_add_rate_limited(q, KS("one")), 0);
    assert_int_equal(T_READY_IN(q, "one"), 5 * MS);
    T_EXPECT_GET_RC(q, -EAGAIN);
    t_clock_step(5 * MS);
    T_EXPECT_GET(q, "one");
    T_EXPECT_DONE(q, "one");
    t_close(q);
}

/* ================================================================== */
/* libwq specifics                                                     */
/* ================================================================== */

/* AddRateLimited of a waiting key: When() still counts the failure (it is
   called before AddAfter in client-go), the add is merged (1) and the key
   keeps the earlier ready time. */
static void merged_while_waiting(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = exp_q("merge-wait", 1 * MS, 1 * SEC, 0);

    assert_int_equal(wq_add_rate_limited(q, KS("k")), 0);
    assert_int_equal(wq_add_rate_limited(q, KS("k")), 1);
    assert_int_equal(wq_add_rate_limited(q, KS("k")), 1);
    assert_int_equal(requeues(q, "k"), 3);
    assert_int_equal(T_READY_IN(q, "k"), 1 * MS);
    assert_int_equal(t_waiting(q), 1);
    step_out(q, "k");
    assert_int_equal(wq_add_rate_limited(q, KS("k")), 0);
    assert_int_equal(T_READY_IN(q, "k"), 8 * MS); /* 1 ms * 2^3 */
    assert_int_equal(requeues(q, "k"), 4);

    /* a plain delayed add merged with a rate limited one: earlier wins */
    assert_int_equal(wq_add_after(q, KS("w"), 1 * SEC), 0);
    assert_int_equal(wq_add_rate_limited(q, KS("w")), 1);
    assert_int_equal(T_READY_IN(q, "w"), 1 * MS);
    assert_int_equal(requeues(q, "w"), 1);
    assert_int_equal(t_stats(q).retries_total, 6);
    t_close(q);
}

/* AddRateLimited of a dirty key: merged (1), no wait, the count rises. */
static void rate_limited_dirty_key(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = exp_q("dirty", 1 * MS, 1 * SEC, 0);

    assert_int_equal(wq_add(q, KS("k")), 0);
    assert_int_equal(wq_add_rate_limited(q, KS("k")), 1);
    assert_int_equal(requeues(q, "k"), 1);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.waiting, 0);
    assert_int_equal(s.queued, 1);
    assert_int_equal(t_key_state(q, "k") & WQ_KEY_WAITING, 0);

    /* processing and dirty */
    T_EXPECT_GET(q, "k");
    assert_int_equal(wq_add(q, KS("k")), 0);
    assert_int_equal(wq_add_rate_limited(q, KS("k")), 1);
    assert_int_equal(requeues(q, "k"), 2);
    assert_int_equal(t_waiting(q), 0);
    T_EXPECT_DONE(q, "k");
    T_EXPECT_GET(q, "k");
    T_EXPECT_DONE(q, "k");
    t_clock_step(1 * SEC);
    T_EXPECT_GET_RC(q, -EAGAIN);
    assert_int_equal(requeues(q, "k"), 2);
    t_close(q);
}

/* The controller loop: get, fail -> AddRateLimited, Done; later succeed
   -> Forget, Done. Default limiter (5 ms, 10 ms, ...). */
static void controller_loop(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("loop", NULL, NULL));

    assert_int_equal(wq_add(q, KS("k")), 0);
    for (int i = 0; i < 3; i++) {
        T_EXPECT_GET(q, "k");
        /* processing and not dirty: a new wait starts */
        assert_int_equal(wq_add_rate_limited(q, KS("k")), 0);
        unsigned st = t_key_state(q, "k");
        assert_true(st & WQ_KEY_PROCESSING);
        assert_true(st & WQ_KEY_WAITING);
        assert_int_equal(T_READY_IN(q, "k"), (5 * MS) << i);
        T_EXPECT_DONE(q, "k");
        assert_int_equal(t_key_state(q, "k"), WQ_KEY_WAITING);
        assert_int_equal(requeues(q, "k"), i + 1);
        t_clock_step((5 * MS) << i);
    }
    T_EXPECT_GET(q, "k");
    assert_int_equal(wq_forget(q, KS("k")), 0);
    assert_int_equal(requeues(q, "k"), 0);
    T_EXPECT_DONE(q, "k");
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.live, 0);
    assert_int_equal(s.failing, 0);
    assert_int_equal(t_key_state(q, "k"), 0);
    assert_int_equal(s.retries_total, 3);
    t_close(q);
}

/* A key with failures and no other state is kept as WQ_KEY_FAILING until
   wq_forget; it is not live. */
static void failing_state(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = exp_q("failing", 1 * MS, 1 * SEC, 0);
    struct wq_key_info ki = { 0 };

    assert_int_equal(wq_add_rate_limited(q, KS("k")), 0);
    step_out(q, "k");
    assert_true(t_key_info(q, "k", &ki));
    assert_int_equal(ki.state, WQ_KEY_FAILING);
    assert_int_equal(ki.failures, 1);
    assert_int_equal(ki.ready_ns, 0);
    assert_int_equal(ki.owner_pid, 0);
    assert_true(ki.position == UINT64_MAX);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.failing, 1);
    assert_int_equal(s.live, 0);
    assert_int_equal(s.queued + s.processing + s.waiting, 0);
    assert_int_equal(requeues(q, "k"), 1);
    T_EXPECT_GET_RC(q, -EAGAIN);

    /* added again: live, no longer failing-only, count kept */
    assert_int_equal(wq_add(q, KS("k")), 0);
    s = t_stats(q);
    assert_int_equal(s.failing, 0);
    assert_int_equal(s.live, 1);
    assert_true(t_key_info(q, "k", &ki));
    assert_int_equal(ki.state, WQ_KEY_DIRTY | WQ_KEY_QUEUED);
    assert_int_equal(ki.failures, 1);
    T_EXPECT_GET(q, "k");
    T_EXPECT_DONE(q, "k");
    assert_int_equal(t_stats(q).failing, 1);

    /* Forget frees it */
    assert_int_equal(wq_forget(q, KS("k")), 0);
    s = t_stats(q);
    assert_int_equal(s.failing, 0);
    assert_int_equal(s.live, 0);
    assert_false(t_key_info(q, "k", NULL));
    assert_int_equal(wq_forget(q, KS("k")), 0);
    assert_int_equal(requeues(q, "k"), 0);

    /* Forget of a queued key resets the count, keeps it queued */
    assert_int_equal(wq_add_rate_limited(q, KS("k")), 0);
    assert_int_equal(wq_add(q, KS("k")), 0); /* pulled forward */
    assert_int_equal(wq_forget(q, KS("k")), 0);
    assert_int_equal(requeues(q, "k"), 0);
    assert_int_equal(t_queued(q), 1);
    T_EXPECT_GET(q, "k");
    T_EXPECT_DONE(q, "k");
    s = t_stats(q);
    assert_int_equal(s.failing, 0);
    assert_int_equal(s.live, 0);
    assert_int_equal(wq_check(q, 0), 0);
    t_close(q);
}

/* Forget of an unknown key, and the argument checks. */
static void forget_unknown_and_errors(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = t_track(t_create("errors", NULL, NULL));
    char longkey[T_KEYBUF + 1];

    assert_int_equal(wq_forget(q, KS("nope")), 0);
    assert_int_equal(requeues(q, "nope"), 0);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.live, 0);
    assert_int_equal(s.failing, 0);
    assert_false(t_key_info(q, "nope", NULL));

    memset(longkey, 'x', sizeof longkey);
    assert_int_equal(wq_add_rate_limited(q, longkey, sizeof longkey),
                     -EMSGSIZE);
    assert_int_equal(wq_forget(q, longkey, sizeof longkey), -EMSGSIZE);
    assert_int_equal(wq_num_requeues(q, longkey, sizeof longkey), -EMSGSIZE);
    assert_int_equal(wq_add_rate_limited(q, "x", 0), -EINVAL);
    assert_int_equal(wq_forget(q, "x", 0), -EINVAL);
    assert_int_equal(wq_num_requeues(q, "x", 0), -EINVAL);
    assert_int_equal(wq_add_rate_limited(q, NULL, 1), -EINVAL);
    assert_int_equal(wq_forget(q, NULL, 1), -EINVAL);
    assert_int_equal(wq_num_requeues(q, NULL, 1), -EINVAL);
    assert_int_equal(wq_add_rate_limited(NULL, "x", 1), -EINVAL);
    assert_int_equal(wq_forget(NULL, "x", 1), -EINVAL);
    assert_int_equal(wq_num_requeues(NULL, "x", 1), -EINVAL);

    /* key of exactly max_key_len is fine */
    assert_int_equal(wq_add_rate_limited(q, longkey, T_KEYBUF), 0);
    assert_int_equal(wq_num_requeues(q, longkey, T_KEYBUF), 1);
    assert_int_equal(wq_forget(q, longkey, T_KEYBUF), 0);
    assert_int_equal(wq_num_requeues(q, longkey, T_KEYBUF), 0);

    assert_int_equal(wq_shutdown(q), 0);
    assert_int_equal(wq_add_rate_limited(q, KS("k")), -ESHUTDOWN);
    assert_int_equal(t_waiting(q), 0);
    t_close(q);
}

/* A full table of idle failure counts never makes an add fail: an idle
   count is dropped for the new key. Live keys are never dropped. */
static void failing_keys_evicted_when_full(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = exp_q("evict", 1 * MS, 1 * SEC, 4);
    static const char *const f[] = { "f0", "f1", "f2", "f3" };
    static const char *const n[] = { "n0", "n1", "n2", "n3" };

    for (int i = 0; i < 4; i++)
        assert_int_equal(wq_add_rate_limited(q, KS(f[i])), 0);
    t_clock_step(1 * MS);
    for (int i = 0; i < 4; i++)
        T_EXPECT_GET(q, f[i]);
    for (int i = 0; i < 4; i++)
        T_EXPECT_DONE(q, f[i]);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.failing, 4);
    assert_int_equal(s.live, 0);

    for (int i = 0; i < 4; i++) {
        assert_int_equal(wq_add(q, KS(n[i])), 0);
        s = t_stats(q);
        assert_int_equal(s.failing, (uint64_t)(3 - i));
        assert_int_equal(s.live, (uint64_t)(i + 1));
        int left = 0;
        for (int j = 0; j < 4; j++) {
            int r = requeues(q, f[j]);
            assert_true(r == 0 || r == 1);
            left += r;
        }
        assert_int_equal(left, 3 - i);
    }
    /* capacity live keys: -ENOSPC, whatever the kind of add */
    assert_int_equal(wq_add(q, KS("x")), -ENOSPC);
    assert_int_equal(wq_add_after(q, KS("x"), 1 * MS), -ENOSPC);
    assert_int_equal(wq_add_rate_limited(q, KS("x")), -ENOSPC);
    assert_int_equal(requeues(q, "x"), 0);
    s = t_stats(q);
    assert_int_equal(s.live, 4);
    assert_int_equal(s.failing, 0);
    assert_int_equal(wq_check(q, 0), 0);
    t_close(q);
}

/* A live key with a failure count keeps it when the table is full; only
   idle failing keys are dropped. */
static void live_failures_not_evicted(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = exp_q("evict-live", 1 * MS, 1 * SEC, 2);

    assert_int_equal(wq_add_rate_limited(q, KS("b")), 0);
    step_out(q, "b"); /* b: idle, failing */
    assert_int_equal(wq_add_rate_limited(q, KS("a")), 0); /* a: waiting */
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.failing, 1);
    assert_int_equal(s.live, 1);
    assert_int_equal(wq_add(q, KS("c")), 0); /* drops b's count */
    assert_int_equal(requeues(q, "b"), 0);
    assert_int_equal(requeues(q, "a"), 1);
    assert_int_equal(wq_add(q, KS("d")), -ENOSPC);
    assert_int_equal(requeues(q, "a"), 1);
    s = t_stats(q);
    assert_int_equal(s.failing, 0);
    assert_int_equal(s.live, 2);
    assert_int_equal(s.waiting, 1);
    t_close(q);
}

/* A failing key reuses its own slot: it can be delayed or rate limited
   again even when every other slot is live; a plain delayed add of a
   failing key starts a new wait and keeps the count. */
static void failing_key_reuses_its_slot(void **state)
{
    (void)state;
    t_watchdog(10);
    wq *q = exp_q("reuse", 1 * MS, 1 * SEC, 2);

    assert_int_equal(wq_add_rate_limited(q, KS("k")), 0);
    step_out(q, "k");
    assert_int_equal(wq_add(q, KS("x")), 0);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.live, 1);
    assert_int_equal(s.failing, 1);

    /* delayed add of the failing key: new wait, count kept */
    assert_int_equal(wq_add_after(q, KS("k"), 50 * MS), 0);
    assert_int_equal(T_READY_IN(q, "k"), 50 * MS);
    assert_int_equal(requeues(q, "k"), 1);
    s = t_stats(q);
    assert_int_equal(s.live, 2);
    assert_int_equal(s.failing, 0);
    assert_int_equal(s.waiting, 1);
    assert_int_equal(wq_add(q, KS("y")), -ENOSPC);
    t_clock_step(50 * MS);
    T_EXPECT_GET(q, "x");
    T_EXPECT_GET(q, "k");
    T_EXPECT_DONE(q, "k");
    assert_int_equal(t_stats(q).failing, 1);

    /* table full of live keys (x processing, y queued) but k has a slot */
    assert_int_equal(wq_add(q, KS("y")), 0); /* drops k's count */
    assert_int_equal(requeues(q, "k"), 0);
    assert_int_equal(wq_add_rate_limited(q, KS("k")), -ENOSPC);
    T_EXPECT_DONE(q, "x");
    assert_int_equal(wq_add_rate_limited(q, KS("k")), 0);
    assert_int_equal(T_READY_IN(q, "k"), 1 * MS);
    t_clock_step(1 * MS);
    T_EXPECT_GET(q, "y");
    T_EXPECT_GET(q, "k");
    assert_int_equal(wq_check(q, 0), 0);
    t_close(q);
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        T_CLOCK_TEST(rate_limiting_queue),
        T_CLOCK_TEST(named_custom_queue),
        T_CLOCK_TEST(merged_while_waiting),
        T_CLOCK_TEST(rate_limited_dirty_key),
        T_CLOCK_TEST(controller_loop),
        T_CLOCK_TEST(failing_state),
        T_CLOCK_TEST(forget_unknown_and_errors),
        T_CLOCK_TEST(failing_keys_evicted_when_full),
        T_CLOCK_TEST(live_failures_not_evicted),
        T_CLOCK_TEST(failing_key_reuses_its_slot),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("ratelimit", tests);
}
