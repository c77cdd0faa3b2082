/*
 * test-results.c - wq_finish and wq_result (wq.h, "Results").
 *
 * Exact states, codes and messages:
 *   - NONE for an unknown key; PENDING while queued or waiting; RUNNING
 *     while processing, also when re-added meanwhile (dirty);
 *   - wq_finish(0, msg) -> SUCCEEDED, code 0, the message, updated_ns a
 *     CLOCK_REALTIME reading taken during the call; code != 0 -> FAILED;
 *     NULL message -> ""; a long message is cut to 255 bytes + NUL;
 *   - wq_finish of a key that is not processing: -ENOENT, nothing recorded;
 *   - a re-added key shows PENDING, then RUNNING, with the previous
 *     outcome still reported; the next wq_finish replaces it;
 *   - results are in the region: visible from another process, and they
 *     outlive the process that recorded them;
 *   - wq_forget drops the result; result_capacity evicts the least
 *     recently updated result; wq_dump shows idle keys with results;
 *   - idle results never make an add fail: a full key table gives them up;
 *   - wq_finish_get records, then gets; a finish that fails pops nothing.
 * Every scenario ends with a clean wq_check.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "t.h"

static uint64_t real_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A new queue for results: keys up to 64 bytes. */
static wq *results_q(const char *tag, uint32_t capacity, uint32_t result_capacity)
{
    return t_create(tag, T_OPTS(.capacity = capacity, .max_key_len = 64,
                                .result_capacity = result_capacity), NULL);
}

/* add -> get -> finish, the key being the only queued one. */
static void run_once(wq *q, const char *key, int code, const char *msg)
{
    assert_int_equal(wq_add(q, KS(key)), 0);
    T_EXPECT_GET(q, key);
    assert_int_equal(wq_finish(q, KS(key), code, msg), 0);
}

static void assert_result(wq *q, const char *key, enum wq_state state, int code,
                          const char *msg)
{
    struct wq_result r = t_result(q, key);
    if (r.state != state || r.code != code || strcmp(r.message, msg) != 0)
        fail_msg("wq_result(%s) = {state %d, code %d, '%s'}, expected "
                 "{state %d, code %d, '%s'}", key, (int)r.state, r.code,
                 r.message, (int)state, code, msg);
}

static void assert_none(wq *q, const char *key)
{
    struct wq_result r = t_result(q, key);
    assert_int_equal(r.state, WQ_STATE_NONE);
    assert_int_equal(r.code, 0);
    assert_int_equal(r.updated_ns, 0);
    assert_string_equal(r.message, "");
}

/* ------------------------------------------------------------------ */

static void unknown_pending_running(void **state)
{
    (void)state;
    wq *q = results_q("states", 16, 0);

    assert_none(q, "nobody");

    /* Queued. */
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_result(q, "a", WQ_STATE_PENDING, 0, "");
    assert_int_equal(t_result(q, "a").updated_ns, 0);

    /* Waiting for a delay. */
    assert_int_equal(wq_add_after(q, KS("w"), 10 * SEC), 0);
    assert_result(q, "w", WQ_STATE_PENDING, 0, "");
    assert_int_equal(wq_len(q), 1);

    /* Processing. */
    T_EXPECT_GET(q, "a");
    assert_result(q, "a", WQ_STATE_RUNNING, 0, "");
    /* Re-added while processing: dirty, still RUNNING. */
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_result(q, "a", WQ_STATE_RUNNING, 0, "");
    assert_int_equal(wq_len(q), 0);
    /* And a delayed re-add of a processing key. */
    assert_int_equal(wq_add_after(q, KS("a"), 10 * SEC), 1);
    assert_result(q, "a", WQ_STATE_RUNNING, 0, "");
    t_check_clean(q, NULL);

    /* Finished while dirty: recorded, and queued again -> PENDING with the
       outcome that was just recorded. */
    uint64_t before = real_now();
    assert_int_equal(wq_finish(q, KS("a"), 0, "ok"), 0);
    uint64_t after = real_now();
    struct wq_result r = t_result(q, "a");
    assert_int_equal(r.state, WQ_STATE_PENDING);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.message, "ok");
    assert_in_range(r.updated_ns, before, after);
    assert_int_equal(wq_len(q), 1);
    t_check_clean(q, NULL);

    /* Waiting key still PENDING; unknown still NONE. */
    assert_result(q, "w", WQ_STATE_PENDING, 0, "");
    assert_none(q, "nobody");

    /* Argument errors. */
    struct wq_result rr;
    assert_int_equal(wq_result(q, KS("a"), NULL), -EINVAL);
    assert_int_equal(wq_result(NULL, KS("a"), &rr), -EINVAL);
    assert_int_equal(wq_result(q, "a", 0, &rr), -EINVAL);
    char big[65];
    memset(big, 'x', sizeof big);
    assert_int_equal(wq_result(q, big, sizeof big, &rr), -EMSGSIZE);
    assert_int_equal(wq_finish(q, big, sizeof big, 0, "x"), -EMSGSIZE);
    assert_int_equal(wq_finish(q, "a", 0, 0, "x"), -EINVAL);
    assert_int_equal(wq_finish(NULL, KS("a"), 0, "x"), -EINVAL);
    t_check_clean(q, NULL);
    wq_close(q);
}

static void succeeded_failed_messages(void **state)
{
    (void)state;
    wq *q = results_q("outcomes", 16, 0);

    /* Success. */
    assert_int_equal(wq_add(q, KS("ok")), 0);
    T_EXPECT_GET(q, "ok");
    uint64_t before = real_now();
    assert_int_equal(wq_finish(q, KS("ok"), 0, "ok"), 0);
    uint64_t after = real_now();
    struct wq_result r = t_result(q, "ok");
    assert_int_equal(r.state, WQ_STATE_SUCCEEDED);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.message, "ok");
    assert_in_range(r.updated_ns, before, after);
    t_check_clean(q, NULL);

    /* Failure. */
    assert_int_equal(wq_add(q, KS("bad")), 0);
    T_EXPECT_GET(q, "bad");
    before = real_now();
    assert_int_equal(wq_finish(q, KS("bad"), 7, "bad"), 0);
    after = real_now();
    r = t_result(q, "bad");
    assert_int_equal(r.state, WQ_STATE_FAILED);
    assert_int_equal(r.code, 7);
    assert_string_equal(r.message, "bad");
    assert_in_range(r.updated_ns, before, after);
    /* A negative code is a failure too. */
    run_once(q, "neg", -5, "minus five");
    assert_result(q, "neg", WQ_STATE_FAILED, -5, "minus five");
    t_check_clean(q, NULL);

    /* NULL message -> "". */
    run_once(q, "null", 3, NULL);
    assert_result(q, "null", WQ_STATE_FAILED, 3, "");
    run_once(q, "nullok", 0, NULL);
    assert_result(q, "nullok", WQ_STATE_SUCCEEDED, 0, "");

    /* 300 bytes -> the first 255 and a NUL. */
    char longmsg[301];
    for (int i = 0; i < 300; i++)
        longmsg[i] = (char)('a' + i % 26);
    longmsg[300] = '\0';
    run_once(q, "long", 1, longmsg);
    r = t_result(q, "long");
    assert_int_equal(r.state, WQ_STATE_FAILED);
    assert_int_equal(r.code, 1);
    assert_int_equal(strlen(r.message), 255);
    assert_memory_equal(r.message, longmsg, 255);
    assert_int_equal(r.message[255], '\0');
    /* Exactly 255 bytes fit whole. */
    longmsg[255] = '\0';
    run_once(q, "long255", 0, longmsg);
    r = t_result(q, "long255");
    assert_int_equal(r.state, WQ_STATE_SUCCEEDED);
    assert_string_equal(r.message, longmsg);

    /* The others are untouched. */
    assert_result(q, "ok", WQ_STATE_SUCCEEDED, 0, "ok");
    assert_result(q, "bad", WQ_STATE_FAILED, 7, "bad");
    t_check_clean(q, NULL);
    wq_close(q);
}

static void finish_not_processing(void **state)
{
    (void)state;
    wq *q = results_q("enoent", 16, 0);
    struct wq_stats st;

    /* Unknown key: -ENOENT, nothing appears. */
    assert_int_equal(wq_finish(q, KS("ghost"), 1, "boo"), -ENOENT);
    assert_none(q, "ghost");
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.results, 0);
    assert_int_equal(st.failing, 0);
    assert_int_equal(st.live, 0);

    /* Queued, not processing. */
    assert_int_equal(wq_add(q, KS("queued")), 0);
    assert_int_equal(wq_finish(q, KS("queued"), 1, "boo"), -ENOENT);
    assert_result(q, "queued", WQ_STATE_PENDING, 0, "");
    assert_int_equal(wq_len(q), 1);

    /* Waiting, not processing. */
    assert_int_equal(wq_add_after(q, KS("waiting"), 10 * SEC), 0);
    assert_int_equal(wq_finish(q, KS("waiting"), 1, "boo"), -ENOENT);
    assert_result(q, "waiting", WQ_STATE_PENDING, 0, "");

    /* Idle with a result: the result stays as it was. */
    T_EXPECT_GET(q, "queued");
    assert_int_equal(wq_finish(q, KS("queued"), 0, "first"), 0);
    uint64_t upd = t_result(q, "queued").updated_ns;
    assert_int_equal(wq_finish(q, KS("queued"), 9, "second"), -ENOENT);
    assert_result(q, "queued", WQ_STATE_SUCCEEDED, 0, "first");
    assert_int_equal(t_result(q, "queued").updated_ns, upd);
    /* Finishing twice: the second is -ENOENT. */
    assert_int_equal(wq_done(q, KS("queued")), -ENOENT);

    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.results, 1);
    t_check_clean(q, NULL);
    wq_close(q);
}

static void readd_keeps_previous_until_next_finish(void **state)
{
    (void)state;
    wq *q = results_q("readd", 16, 0);

    run_once(q, "k", 7, "bad");
    uint64_t upd1 = t_result(q, "k").updated_ns;
    assert_result(q, "k", WQ_STATE_FAILED, 7, "bad");

    /* Re-added: PENDING, previous outcome still shown. */
    assert_int_equal(wq_add(q, KS("k")), 0);
    struct wq_result r = t_result(q, "k");
    assert_int_equal(r.state, WQ_STATE_PENDING);
    assert_int_equal(r.code, 7);
    assert_string_equal(r.message, "bad");
    assert_int_equal(r.updated_ns, upd1);

    /* Processing: RUNNING, previous outcome still shown. */
    T_EXPECT_GET(q, "k");
    r = t_result(q, "k");
    assert_int_equal(r.state, WQ_STATE_RUNNING);
    assert_int_equal(r.code, 7);
    assert_string_equal(r.message, "bad");
    assert_int_equal(r.updated_ns, upd1);
    t_check_clean(q, NULL);

    /* The next finish replaces it. */
    t_sleep_ms(2);
    uint64_t before = real_now();
    assert_int_equal(wq_finish(q, KS("k"), 0, "fixed"), 0);
    uint64_t after = real_now();
    r = t_result(q, "k");
    assert_int_equal(r.state, WQ_STATE_SUCCEEDED);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.message, "fixed");
    assert_in_range(r.updated_ns, before, after);
    assert_true(r.updated_ns > upd1);

    /* Through a delay as well: waiting shows PENDING with the result. */
    assert_int_equal(wq_add_after(q, KS("k"), 20 * MS), 0);
    assert_result(q, "k", WQ_STATE_PENDING, 0, "fixed");
    char buf[64];
    int n = wq_get(q, buf, sizeof buf, 2 * SEC * (int64_t)t_scale());
    assert_int_equal(n, 1);
    assert_result(q, "k", WQ_STATE_RUNNING, 0, "fixed");
    assert_int_equal(wq_finish(q, KS("k"), 4, NULL), 0);
    assert_result(q, "k", WQ_STATE_FAILED, 4, "");

    struct wq_stats st;
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.results, 1);
    t_check_clean(q, NULL);
    wq_close(q);
}

/* Another process records an outcome and exits (without wq_close: it
   dies like a crashed process would); a third process reads it. */
static void visible_across_processes(void **state)
{
    (void)state;
    wq *q = results_q("xproc", 16, 0);
    const char *name = wq_name(q);
    uint64_t *when = t_shared_alloc(4096);

    assert_int_equal(wq_add(q, KS("x")), 0);
    assert_int_equal(wq_add(q, KS("y")), 0);
    pid_t c = t_fork(10);
    if (c == 0) {
        wq *cq;
        char buf[64];
        if (wq_open(name, NULL, &cq) != 0)
            _exit(2);
        if (wq_get(cq, buf, sizeof buf, 0) != 1 || buf[0] != 'x')
            _exit(3);
        when[0] = real_now();
        if (wq_finish(cq, KS("x"), 12, "from child") != 0)
            _exit(4);
        when[1] = real_now();
        if (wq_get(cq, buf, sizeof buf, 0) != 1 || buf[0] != 'y')
            _exit(5);
        if (wq_finish(cq, KS("y"), 0, "y done") != 0)
            _exit(6);
        _exit(0);   /* no wq_close */
    }
    assert_int_equal(t_wait(c, 10000), 0);

    struct wq_result r = t_result(q, "x");
    assert_int_equal(r.state, WQ_STATE_FAILED);
    assert_int_equal(r.code, 12);
    assert_string_equal(r.message, "from child");
    assert_in_range(r.updated_ns, when[0], when[1]);
    assert_result(q, "y", WQ_STATE_SUCCEEDED, 0, "y done");
    t_check_clean(q, NULL);

    /* A fresh process sees the same. */
    pid_t d = t_fork(10);
    if (d == 0) {
        wq *dq;
        struct wq_result dr;
        if (wq_open(name, NULL, &dq) != 0)
            _exit(2);
        if (wq_result(dq, KS("x"), &dr) != 0 || dr.state != WQ_STATE_FAILED ||
            dr.code != 12 || strcmp(dr.message, "from child") != 0 ||
            dr.updated_ns != r.updated_ns)
            _exit(3);
        if (wq_result(dq, KS("y"), &dr) != 0 || dr.state != WQ_STATE_SUCCEEDED ||
            dr.code != 0 || strcmp(dr.message, "y done") != 0)
            _exit(4);
        if (wq_result(dq, KS("z"), &dr) != 0 || dr.state != WQ_STATE_NONE)
            _exit(5);
        wq_close(dq);
        _exit(0);
    }
    assert_int_equal(t_wait(d, 10000), 0);

    /* The processes are gone; the results stay. */
    assert_result(q, "x", WQ_STATE_FAILED, 12, "from child");
    t_check_clean(q, NULL);
    t_shared_free(when, 4096);
    wq_close(q);
}

/* wq_forget resets the failure count and keeps the result (a reconciler
   that records its outcome and then forgets, client-go's idiom, keeps
   it); wq_remove drops both. Idle keys kept only for a result are not
   "failing": stats count them apart. */
static void forget_keeps_result(void **state)
{
    (void)state;
    wq *q = results_q("forget", 16, 0);
    struct wq_stats st;

    run_once(q, "f", 5, "five");
    run_once(q, "s", 0, "fine");
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.results, 2);
    assert_int_equal(st.failing, 0);        /* no failure count */
    assert_int_equal(st.idle_results, 2);   /* idle, kept for their results */
    assert_int_equal(st.live, 0);           /* queued+processing+waiting */

    assert_int_equal(wq_forget(q, KS("f")), 0);
    assert_result(q, "f", WQ_STATE_FAILED, 5, "five");   /* kept */
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.results, 2);
    assert_int_equal(st.idle_results, 2);
    t_check_clean(q, NULL);

    assert_int_equal(wq_remove(q, KS("f")), 0);   /* the way to drop it */
    assert_none(q, "f");
    assert_int_equal(wq_remove(q, KS("f")), -ENOENT);
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.results, 1);
    assert_int_equal(st.idle_results, 1);
    assert_int_equal(st.live, 0);
    /* Forgetting again, or an unknown key: fine. */
    assert_int_equal(wq_forget(q, KS("s")), 0);
    assert_int_equal(wq_forget(q, KS("nobody")), 0);
    assert_result(q, "s", WQ_STATE_SUCCEEDED, 0, "fine");
    t_check_clean(q, NULL);

    /* A key with a result and a failure count: forget drops the count
       only; the key counts as failing until then. */
    assert_int_equal(wq_add(q, KS("rl")), 0);
    T_EXPECT_GET(q, "rl");
    assert_int_equal(wq_add_rate_limited(q, KS("rl")), 0);
    assert_int_equal(wq_finish(q, KS("rl"), 1, "retry"), 0);
    assert_int_equal(wq_num_requeues(q, KS("rl")), 1);
    assert_result(q, "rl", WQ_STATE_PENDING, 1, "retry");
    assert_int_equal(wq_forget(q, KS("rl")), 0);
    assert_int_equal(wq_num_requeues(q, KS("rl")), 0);
    /* Still waiting (wq_forget does not remove it from the queue). */
    struct wq_result r = t_result(q, "rl");
    assert_int_equal(r.state, WQ_STATE_PENDING);
    assert_int_equal(r.code, 1);
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.results, 2);
    assert_int_equal(st.live, 1);
    t_check_clean(q, NULL);
    wq_close(q);
}

static void eviction_least_recently_updated(void **state)
{
    (void)state;
    wq *q = results_q("evict", 16, 3);
    struct wq_stats st;

    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.result_capacity, 3);

    run_once(q, "a", 1, "a1");
    run_once(q, "b", 2, "b1");
    run_once(q, "c", 0, "c1");
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.results, 3);
    run_once(q, "d", 4, "d1");   /* evicts a */
    assert_none(q, "a");
    assert_result(q, "b", WQ_STATE_FAILED, 2, "b1");
    assert_result(q, "c", WQ_STATE_SUCCEEDED, 0, "c1");
    assert_result(q, "d", WQ_STATE_FAILED, 4, "d1");
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.results, 3);
    assert_int_equal(st.failing, 0);
    assert_int_equal(st.idle_results, 3);
    t_check_clean(q, NULL);

    /* Re-finishing b moves it to the back: order c, d, b. Reading a
       result is not an update: read c (the oldest) first, it still goes. */
    run_once(q, "b", 0, "b2");
    assert_result(q, "c", WQ_STATE_SUCCEEDED, 0, "c1");
    run_once(q, "e", 5, "e1");   /* evicts c */
    assert_none(q, "a");
    assert_none(q, "c");
    assert_result(q, "b", WQ_STATE_SUCCEEDED, 0, "b2");
    assert_result(q, "d", WQ_STATE_FAILED, 4, "d1");
    assert_result(q, "e", WQ_STATE_FAILED, 5, "e1");
    t_check_clean(q, NULL);

    /* Order now d, b, e: re-finishing d (the oldest) saves it, and b
       goes instead. */
    run_once(q, "d", 0, "d2");   /* order: b, e, d */
    run_once(q, "f", 6, "f1");   /* evicts b */
    assert_none(q, "b");
    assert_result(q, "d", WQ_STATE_SUCCEEDED, 0, "d2");
    assert_result(q, "e", WQ_STATE_FAILED, 5, "e1");
    assert_result(q, "f", WQ_STATE_FAILED, 6, "f1");
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.results, 3);
    assert_int_equal(st.failing, 0);
    assert_int_equal(st.idle_results, 3);
    assert_int_equal(st.live, 0);
    t_check_clean(q, NULL);
    wq_close(q);
}

/* What wq_dump lists: how many keys (n), how often `key` (found), and the
   entry of `key` (k, zeroed when it is absent). */
struct dump_seen {
    size_t n;
    int found;
    struct t_dkey k;
};

static struct dump_seen dump_key(wq *q, const char *key)
{
    struct t_dump d = t_dump_all(q);
    const struct t_dkey *e = t_dump_find(&d, key);
    struct dump_seen s = { .n = d.n, .found = t_dump_count(&d, key) };

    if (e != NULL)
        s.k = *e;
    t_dump_free(&d);
    return s;
}

static void dump_shows_results(void **state)
{
    (void)state;
    wq *q = results_q("dump", 16, 0);

    run_once(q, "failed", 3, "three");
    run_once(q, "ok", 0, "fine");
    assert_int_equal(wq_add(q, KS("queued")), 0);

    struct dump_seen s = dump_key(q, "failed");
    assert_int_equal(s.n, 3);
    assert_int_equal(s.found, 1);
    assert_int_equal(s.k.state, WQ_KEY_FAILING);
    assert_int_equal(s.k.owner, 0);
    assert_true(s.k.position == UINT64_MAX);
    assert_int_equal(s.k.failures, 0);
    assert_int_equal(s.k.result, WQ_STATE_FAILED);
    assert_int_equal(s.k.code, 3);
    assert_string_equal(s.k.message, "three");

    s = dump_key(q, "ok");
    assert_int_equal(s.found, 1);
    assert_int_equal(s.k.state, WQ_KEY_FAILING);
    assert_int_equal(s.k.result, WQ_STATE_SUCCEEDED);
    assert_int_equal(s.k.code, 0);
    assert_string_equal(s.k.message, "fine");

    s = dump_key(q, "queued");
    assert_int_equal(s.found, 1);
    assert_int_equal(s.k.state, WQ_KEY_QUEUED | WQ_KEY_DIRTY);
    assert_int_equal(s.k.result, WQ_STATE_PENDING);
    assert_int_equal(s.k.code, 0);
    assert_string_equal(s.k.message, "");

    /* Re-added and processing: RUNNING with the previous outcome. */
    T_EXPECT_GET(q, "queued");
    assert_int_equal(wq_add(q, KS("failed")), 0);
    T_EXPECT_GET(q, "failed");
    s = dump_key(q, "failed");
    assert_int_equal(s.found, 1);
    assert_int_equal(s.k.state, WQ_KEY_PROCESSING);
    assert_int_equal(s.k.owner, getpid());
    assert_int_equal(s.k.result, WQ_STATE_RUNNING);
    assert_int_equal(s.k.code, 3);
    assert_string_equal(s.k.message, "three");
    assert_int_equal(wq_finish(q, KS("failed"), 0, "recovered"), 0);
    assert_int_equal(wq_finish(q, KS("queued"), 0, NULL), 0);
    s = dump_key(q, "failed");
    assert_int_equal(s.k.state, WQ_KEY_FAILING);
    assert_int_equal(s.k.result, WQ_STATE_SUCCEEDED);
    assert_string_equal(s.k.message, "recovered");

    /* Forgotten: still there (a forget keeps the result); removed: gone
       from the dump. */
    assert_int_equal(wq_forget(q, KS("ok")), 0);
    s = dump_key(q, "ok");
    assert_int_equal(s.found, 1);
    assert_int_equal(wq_remove(q, KS("ok")), 0);
    s = dump_key(q, "ok");
    assert_int_equal(s.found, 0);
    assert_int_equal(s.n, 2);
    t_check_clean(q, NULL);
    wq_close(q);
}

/* capacity 4 (results default to 4 too): four finished idle keys hold
   every slot; four new live keys still fit, a fifth does not. */
static void full_table_gives_up_idle_results(void **state)
{
    (void)state;
    wq *q = results_q("full", 4, 0);
    struct wq_stats st;
    static const char *old[] = { "o0", "o1", "o2", "o3" };
    static const char *fresh[] = { "n0", "n1", "n2", "n3" };

    for (int i = 0; i < 4; i++)
        run_once(q, old[i], i, "old");
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.result_capacity, 4);
    assert_int_equal(st.results, 4);
    assert_int_equal(st.failing, 0);
    assert_int_equal(st.idle_results, 4);
    assert_int_equal(st.live, 0);
    t_check_clean(q, NULL);

    for (int i = 0; i < 4; i++) {
        int rc = wq_add(q, KS(fresh[i]));
        if (rc != 0)
            fail_msg("wq_add(%s) with %d idle results = %d (%s)", fresh[i],
                     4 - i, rc, wq_strerror(rc));
        assert_result(q, fresh[i], WQ_STATE_PENDING, 0, "");
        t_check_clean(q, NULL);
    }
    assert_int_equal(wq_add(q, KS("n4")), -ENOSPC);
    assert_none(q, "n4");
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.live, 4);
    assert_int_equal(st.queued, 4);
    assert_int_equal(st.results, 0);
    assert_int_equal(st.failing, 0);
    assert_int_equal(st.idle_results, 0);
    for (int i = 0; i < 4; i++)
        assert_none(q, old[i]);
    /* Re-adding a queued key still coalesces when full. */
    assert_int_equal(wq_add(q, KS("n0")), 1);
    t_check_clean(q, NULL);

    /* The new keys finish and keep results again. */
    for (int i = 0; i < 4; i++) {
        T_EXPECT_GET(q, fresh[i]);
        assert_int_equal(wq_finish(q, KS(fresh[i]), 0, "new"), 0);
    }
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.results, 4);
    assert_int_equal(st.live, 0);
    for (int i = 0; i < 4; i++)
        assert_result(q, fresh[i], WQ_STATE_SUCCEEDED, 0, "new");
    t_check_clean(q, NULL);
    wq_close(q);
}

/* wq_finish_get with code and message, and optionally forget. */
static int finish_get_(wq *q, const char *key, int code, const char *msg, bool forget,
                       char *buf, size_t cap, int64_t timeout)
{
    struct wq_finish_opts f = { .code = code, .message = msg, .forget = forget };
    return wq_finish_get(q, key, strlen(key), &f, buf, cap, timeout);
}

/* wq_finish_get: the outcome recorded (and the failures forgotten when
   asked), then the next key, in one call; a finish that fails changes
   nothing and pops nothing. */
static void finish_get(void **state)
{
    (void)state;
    wq *q = results_q("finget", 16, 0);
    char buf[64];

    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_add(q, KS("b")), 0);
    T_EXPECT_GET(q, "a");
    assert_int_equal(finish_get_(q, "a", 0, "a ok", false, buf, sizeof buf, 0), 1);
    assert_memory_equal(buf, "b", 1);
    assert_result(q, "a", WQ_STATE_SUCCEEDED, 0, "a ok");
    assert_result(q, "b", WQ_STATE_RUNNING, 0, "");
    T_EXPECT_STATS(q, 1, 0, 1, 0, "b handed out by the finish of a");

    /* Arguments are checked before the finish: nothing recorded. */
    struct wq_finish_opts bad = { .code = 3, .message = "x", .reserved = { 0, 1 } };
    assert_int_equal(wq_finish_get(q, KS("b"), &bad, buf, sizeof buf, 0), -EINVAL);
    assert_int_equal(finish_get_(q, "b", 3, "x", false, buf, sizeof buf, -2), -EINVAL);
    assert_int_equal(finish_get_(q, "b", 3, "x", false, NULL, sizeof buf, 0), -EINVAL);
    assert_int_equal(finish_get_(q, "b", 3, "x", false, buf, 1, 0), -ENOBUFS);
    assert_int_equal(finish_get_(q, "", 3, "x", false, buf, sizeof buf, 0), -EINVAL);
    assert_result(q, "b", WQ_STATE_RUNNING, 0, "");

    /* A key that is not processing: -ENOENT, nothing recorded or popped. */
    assert_int_equal(wq_add(q, KS("c")), 0);
    assert_int_equal(finish_get_(q, "ghost", 1, "boo", false, buf, sizeof buf, 0), -ENOENT);
    assert_int_equal(finish_get_(q, "c", 1, "boo", true, buf, sizeof buf, 0), -ENOENT);
    assert_none(q, "ghost");
    assert_result(q, "c", WQ_STATE_PENDING, 0, "");
    T_EXPECT_STATS(q, 2, 1, 1, 0, "after the refused finishes");

    /* b re-added while processing goes behind c; c, finished, hands b
       out again, which shows RUNNING with the outcome of its last run.
       NULL opts: a plain done (c keeps no result). */
    assert_int_equal(wq_add(q, KS("b")), 0);
    assert_int_equal(finish_get_(q, "b", 7, "b failed", false, buf, sizeof buf, 0), 1);
    assert_memory_equal(buf, "c", 1);
    assert_int_equal(wq_finish_get(q, KS("c"), NULL, buf, sizeof buf, 0), 1);
    assert_memory_equal(buf, "b", 1);
    assert_none(q, "c");
    assert_result(q, "b", WQ_STATE_RUNNING, 7, "b failed");

    /* Nothing queued: the finish happens, the get says -EAGAIN, or
       -ETIMEDOUT after waiting. */
    assert_int_equal(finish_get_(q, "b", 0, NULL, false, buf, sizeof buf, 0), -EAGAIN);
    assert_result(q, "b", WQ_STATE_SUCCEEDED, 0, "");
    T_EXPECT_STATS(q, 0, 0, 0, 0, "all finished");
    assert_int_equal(finish_get_(q, "b", 0, "again", false, buf, sizeof buf, 0), -ENOENT);
    assert_result(q, "b", WQ_STATE_SUCCEEDED, 0, "");
    assert_int_equal(wq_add(q, KS("d")), 0);
    T_EXPECT_GET(q, "d");
    uint64_t t0 = t_now_ns();
    assert_int_equal(finish_get_(q, "d", 2, "d failed", false, buf, sizeof buf, 50 * MS),
                     -ETIMEDOUT);
    assert_true(t_now_ns() - t0 >= 50 * MS);
    assert_result(q, "d", WQ_STATE_FAILED, 2, "d failed");

    /* forget: the failure count goes with the finish, not before a
       finish that fails. f and g have failed twice (rate-limited re-adds
       while processing); h once. */
    const char *fk[] = { "f", "g", "h" };
    for (int i = 0; i < 3; i++)
        assert_int_equal(wq_add(q, KS(fk[i])), 0);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 3 - round; i++) {
            T_EXPECT_GET(q, fk[i]);
            assert_int_equal(wq_add_rate_limited(q, KS(fk[i])), 0);
        }
        for (int i = 0; i < 3 - round; i++)
            assert_int_equal(wq_done(q, KS(fk[i])), 0);
        while (t_queued(q) < 3)   /* the rate limiter's delays */
            t_sleep_ms(1);
    }
    assert_int_equal(wq_num_requeues(q, KS("f")), 2);
    assert_int_equal(wq_num_requeues(q, KS("g")), 2);
    assert_int_equal(wq_num_requeues(q, KS("h")), 1);
    T_EXPECT_GET(q, "h");   /* h was re-added first in round 2 */
    T_EXPECT_GET(q, "f");
    assert_int_equal(finish_get_(q, "g", 0, "g", true, buf, sizeof buf, 0), -ENOENT);
    assert_int_equal(wq_num_requeues(q, KS("g")), 2);   /* queued: not forgotten */
    assert_int_equal(finish_get_(q, "f", 0, "f ok", true, buf, sizeof buf, 0), 1);
    assert_memory_equal(buf, "g", 1);
    assert_int_equal(wq_num_requeues(q, KS("f")), 0);
    assert_result(q, "f", WQ_STATE_SUCCEEDED, 0, "f ok");
    assert_int_equal(finish_get_(q, "g", 5, "g failed", false, buf, sizeof buf, 0), -EAGAIN);
    assert_int_equal(wq_num_requeues(q, KS("g")), 2);   /* no forget asked */
    assert_result(q, "g", WQ_STATE_FAILED, 5, "g failed");
    struct wq_stats st;
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.failing, 1);   /* g, idle with its count (h is processing) */

    /* Shut down with nothing queued: finished, then -ESHUTDOWN. */
    assert_int_equal(finish_get_(q, "h", 0, "h ok", true, buf, sizeof buf, 0), -EAGAIN);
    assert_int_equal(wq_num_requeues(q, KS("h")), 0);
    assert_int_equal(wq_add(q, KS("e")), 0);
    T_EXPECT_GET(q, "e");
    assert_int_equal(wq_shutdown(q), 0);
    assert_int_equal(finish_get_(q, "e", 0, "e ok", true, buf, sizeof buf, SEC), -ESHUTDOWN);
    assert_result(q, "e", WQ_STATE_SUCCEEDED, 0, "e ok");

    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.results, 7);   /* a, b, d, e, f, g, h */
    assert_int_equal(st.failing, 1);   /* g */
    assert_int_equal(st.live, 0);
    t_check_clean(q, NULL);
    wq_close(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        T_TEST(unknown_pending_running),
        T_TEST(succeeded_failed_messages),
        T_TEST(finish_not_processing),
        T_TEST(readd_keeps_previous_until_next_finish),
        T_TEST(visible_across_processes),
        T_TEST(forget_keeps_result),
        T_TEST(eviction_least_recently_updated),
        T_TEST(dump_shows_results),
        T_TEST(full_table_gives_up_idle_results),
        T_TEST(finish_get),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("results", tests);
}
