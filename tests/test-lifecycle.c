/*
 * test-lifecycle.c - what real controllers need from the library:
 *   - options are never silently ignored: WQ_CREATE of an existing queue
 *     with an option that differs fails, names it, and changes nothing
 *     (no store directory made); zero fields mean "whatever it has";
 *   - shutdown is not forever: wq_resume, across processes;
 *   - wq_remove: queued, waiting, idle keys go with their count and
 *     result; -EBUSY while processing; -ENOENT when not held; FIFO order
 *     of the others kept; fair mode; the store record goes too;
 *   - a key held by a dead process is never shown as held by a live one:
 *     wq_dump's start time and holder_alive, stats.processes counts live
 *     handles only, and on an idle queue the key is requeued within a
 *     second with nobody calling wq_get;
 *   - wq_len counts keys whose delay is over;
 *   - stats.restored; the time helpers; the rate limiter's delay
 *     histogram and the delayed keys gauge in wq_metrics.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "t.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* An option given that differs from the queue's: -EEXIST, the option
   named, nothing changed. Each row: a field set to a value other than
   the queue's. */
static void options_never_ignored(void **state)
{
    (void)state;
    const char *name;
    struct wq_options made = { .capacity = 16, .max_key_len = 32, .max_procs = 8,
                               .result_capacity = 4, .rl_base_delay_ns = 2 * MS };
    if (t_redis())
        made.max_procs = 0;   /* no process table */
    wq *q = t_create("opts", &made, &name);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/never-made", t_mkstore());
    struct {
        const char *what;
        struct wq_options o;
    } rows[] = {
        { "capacity 16, not 32", { .capacity = 32 } },
        { "max_key_len 32, not 64", { .max_key_len = 64 } },
        { "max_procs 8, not 9", { .max_procs = 9 } },
        { "result_capacity 4, not 5", { .result_capacity = 5 } },
        { "mode 0600, not 0666", { .mode = 0666 } },
        { "no store", { .store_path = dir } },
        { "the default mode, not WQ_FAIR", { .flags = WQ_FAIR } },
        { "metrics on, not WQ_NO_METRICS", { .flags = WQ_NO_METRICS } },
        { "rl_base_delay_ns 2000000, not 3000000", { .rl_base_delay_ns = 3 * MS } },
        { "rl_burst 100, not 5", { .rl_burst = 5 } },
        { "rl_limiters", { .rl_limiters = WQ_RL_BUCKET } },
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        struct wq_options o = rows[i].o;
        o.flags |= WQ_CREATE;
        wq *q2 = NULL;
        int rc = wq_open(name, &o, &q2);
        if (t_redis() && (o.max_procs || o.mode || o.store_path)) {
            /* Options with no meaning on Redis are refused, never ignored. */
            if (rc != -EINVAL)
                fail_msg("option \"%s\" on Redis: wq_open = %d (%s), expected -EINVAL",
                         rows[i].what, rc, wq_strerror(rc));
            assert_null(q2);
            continue;
        }
        if (rc != -EEXIST || !strstr(wq_last_error(), rows[i].what))
            fail_msg("option \"%s\": wq_open = %d (%s), wq_last_error \"%s\"", rows[i].what,
                     rc, wq_strerror(rc), wq_last_error());
        assert_null(q2);
    }
    assert_int_equal(access(dir, F_OK), -1);   /* no store directory made */
    /* Zero fields, and fields equal to the queue's, attach. */
    struct wq_options same = made;
    same.flags = WQ_CREATE;
    wq *q2;
    assert_int_equal(wq_open(name, &same, &q2), 0);
    wq_close(q2);
    struct wq_options zero = { .flags = WQ_CREATE };
    assert_int_equal(wq_open(name, &zero, &q2), 0);
    wq_close(q2);
    assert_int_equal(t_stats(q).capacity, 16);
    wq_close(q);
    if (t_redis())
        return;   /* stores are shared memory's */

    /* A queue with a store: another store, another durability. */
    const char *store = t_mkstore(), *sname = t_qname("optstore");
    struct wq_options so = { .store_path = store, .flags = WQ_CREATE | WQ_EXCL };
    q = t_track(T_OPEN(sname, &so));
    so.flags = WQ_CREATE;
    so.durability = WQ_DURABLE_FSYNC;
    assert_int_equal(wq_open(sname, &so, &q2), -EEXIST);
    assert_non_null(strstr(wq_last_error(), "durability process, not fsync"));
    so.durability = 0;
    so.store_path = dir;
    assert_int_equal(wq_open(sname, &so, &q2), -EEXIST);
    assert_non_null(strstr(wq_last_error(), "the store"));
    assert_int_equal(access(dir, F_OK), -1);
    so.store_path = store;   /* the same store: fine */
    assert_int_equal(wq_open(sname, &so, &q2), 0);
    wq_close(q2);
    t_close(q);

    /* The store directory removed since: said so, not "the store X, not X". */
    char gone[400];
    snprintf(gone, sizeof gone, "%s/gone", t_mkstore());
    const char *gname = t_qname("optgone");
    struct wq_options go = { .store_path = gone, .flags = WQ_CREATE | WQ_EXCL };
    q = t_track(T_OPEN(gname, &go));
    t_close(q);   /* the region stays, naming its store */
    char cmd[450];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", gone);
    assert_int_equal(system(cmd), 0);
    go.flags = WQ_CREATE;
    assert_int_equal(wq_open(gname, &go, &q2), -EEXIST);
    char want[1000];
    snprintf(want, sizeof want, "the store %s, and %s cannot be reached now (No such file or "
             "directory)", gone, gone);
    if (!strstr(wq_last_error(), want))
        fail_msg("wq_last_error \"%s\", want \"%s\"", wq_last_error(), want);
    assert_int_equal(wq_unlink(gname), 0);
}

/* wq_resume ends a shutdown for every process attached: adds accepted,
   a blocked get in another process hands keys out again, the keys that
   were queued are all still there. */
static void resume_across_processes(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("resume", NULL, &name);
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_add(q, KS("b")), 0);
    assert_int_equal(wq_shutdown(q), 0);
    assert_int_equal(wq_add(q, KS("c")), -ESHUTDOWN);
    int *sh = t_shared_alloc(4096);
    pid_t c = t_fork(20);
    if (c == 0) {   /* another process: sees the shutdown, then the resume */
        wq *cq;
        char buf[T_KEYBUF];
        if (wq_open(name, NULL, &cq) < 0 || !wq_shutting_down(cq))
            _exit(1);
        sh[0] = 1;
        while (wq_shutting_down(cq))
            usleep(1000);
        sh[1] = wq_add(cq, KS("c"));   /* accepted again */
        int n = wq_get(cq, buf, sizeof buf, (int64_t)SEC);
        sh[2] = n == 1 && buf[0] == 'a';
        wq_done(cq, buf, (size_t)n);
        wq_close(cq);
        _exit(0);
    }
    while (!sh[0])
        t_sleep_ms(1);
    assert_int_equal(t_stats(q).queued, 2);   /* kept while shut down */
    assert_int_equal(wq_resume(q), 0);
    assert_false(wq_shutting_down(q));
    assert_int_equal(t_wait(c, 10000), 0);
    assert_int_equal(sh[1], 0);
    assert_int_equal(sh[2], 1);
    T_EXPECT_GET(q, "b");
    T_EXPECT_DONE(q, "b");
    T_EXPECT_GET(q, "c");
    T_EXPECT_DONE(q, "c");
    assert_int_equal(wq_resume(q), 0);   /* not shut down: fine */
    t_check_clean(q, "resumed");
    t_shared_free(sh, 4096);
    wq_close(q);
}

/* A drain waiting when the queue is resumed ends with -ECANCELED. */
static void resume_cancels_drain(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("resumedrain", NULL, &name);
    assert_int_equal(wq_add(q, KS("held")), 0);
    T_EXPECT_GET(q, "held");
    pid_t c = t_fork(20);
    if (c == 0) {
        wq *cq;
        if (wq_open(name, NULL, &cq) < 0)
            _exit(1);
        int rc = wq_shutdown_drain(cq, (int64_t)(5 * SEC));
        wq_close(cq);
        _exit(rc == -ECANCELED ? 0 : 2);
    }
    for (int i = 0; i < 1000 && !wq_shutting_down(q); i++)
        t_sleep_ms(1);
    t_sleep_ms(20);
    assert_int_equal(wq_resume(q), 0);
    assert_int_equal(t_wait(c, 5000), 0);
    T_EXPECT_DONE(q, "held");
    wq_close(q);
}

/* wq_remove: queued (the others keep their order), waiting, idle with a
   failure count and a result; -EBUSY while processing; -ENOENT when the
   queue does not hold the key. */
static void remove_keys(void **state)
{
    (void)state;
    wq *q = t_track(t_create("remove", T_OPTS(.rl_base_delay_ns = 1 * HOUR,
                                                .rl_max_delay_ns = 2 * HOUR), NULL));
    const char *keys[] = { "a", "b", "c", "d", "e" };
    for (int i = 0; i < 5; i++)
        assert_int_equal(wq_add(q, KS(keys[i])), 0);
    assert_int_equal(wq_remove(q, KS("c")), 0);       /* from the middle */
    assert_int_equal(wq_remove(q, KS("c")), -ENOENT);
    assert_int_equal(wq_remove(q, KS("nope")), -ENOENT);
    assert_int_equal(wq_len(q), 4);
    T_EXPECT_GET(q, "a");
    assert_int_equal(wq_remove(q, KS("a")), -EBUSY);  /* processing: unchanged */
    assert_int_equal(t_key_state(q, "a"), WQ_KEY_PROCESSING);
    assert_int_equal(wq_add_rate_limited(q, KS("a")), 0);   /* processing + waiting */
    assert_int_equal(wq_finish(q, KS("a"), 4, "bad"), 0);  /* waiting, count, result */
    assert_int_equal(t_key_state(q, "a"), WQ_KEY_WAITING);
    assert_int_equal(wq_remove(q, KS("a")), 0);       /* waiting: gone, and its count */
    assert_int_equal(wq_num_requeues(q, KS("a")), 0);
    assert_int_equal(t_result(q, "a").state, WQ_STATE_NONE);
    T_EXPECT_GET(q, "b");
    assert_int_equal(wq_add_rate_limited(q, KS("b")), 0);
    T_EXPECT_DONE(q, "b");
    assert_int_equal(wq_remove(q, KS("b")), 0);       /* waiting after its done */
    T_EXPECT_GET(q, "d");
    T_EXPECT_GET(q, "e");
    assert_int_equal(wq_finish(q, KS("d"), 1, "kept"), 0);   /* idle, a result */
    assert_int_equal(wq_remove(q, KS("d")), 0);
    assert_int_equal(t_key_state(q, "d"), 0);
    T_EXPECT_DONE(q, "e");
    T_EXPECT_GET_RC(q, -EAGAIN);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.live, 0);
    assert_int_equal(st.results, 0);
    assert_int_equal(st.failing, 0);
    t_check_clean(q, "remove");
    t_close(q);

    /* Fair mode: the heaps lose it, the order of the rest holds. */
    q = t_track(t_create("removefair", T_OPTS(.flags = WQ_FAIR), NULL));
    for (int i = 0; i < 5; i++)
        assert_int_equal(wq_add(q, KS(keys[i])), 0);
    assert_int_equal(wq_remove(q, KS("b")), 0);
    assert_int_equal(wq_remove(q, KS("d")), 0);
    T_EXPECT_GET(q, "a");
    T_EXPECT_GET(q, "c");
    T_EXPECT_GET(q, "e");
    T_EXPECT_GET_RC(q, -EAGAIN);
    t_check_clean(q, "remove fair");
    t_close(q);
}

/* With a store, the removal reaches it: a restore does not bring the
   key back. */
static void remove_from_store(void **state)
{
    (void)state;
    T_SHM_ONLY("the LMDB store");
    const char *store = t_mkstore(), *name = t_qname("removestore");
    struct wq_options o = { .store_path = store, .flags = WQ_CREATE | WQ_EXCL };
    wq *q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_add(q, KS("poison")), 0);
    assert_int_equal(wq_add(q, KS("fine")), 0);
    assert_int_equal(wq_remove(q, KS("poison")), 0);
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
    q = t_track(T_OPEN(name, &o));
    assert_int_equal(t_stats(q).restored, 1);
    assert_int_equal(t_key_state(q, "poison"), 0);
    T_EXPECT_GET(q, "fine");
    T_EXPECT_DONE(q, "fine");
    t_close(q);
}

struct dump_one {
    const char *key;
    struct wq_key_info info;
    int found;
};

static int find_one(const struct wq_key_info *ki, void *arg)
{
    struct dump_one *d = arg;
    if (ki->len == strlen(d->key) && memcmp(ki->key, d->key, ki->len) == 0) {
        d->info = *ki;
        d->found++;
    }
    return 0;
}

/* A holder that dies: until the requeue, wq_dump says its holder is not
   alive, stats.processes no longer counts it, and on an idle queue (no
   wq_get anywhere) its key is back within a second. */
static void dead_holder_shown_and_requeued(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("deadholder", T_OPTS(.rl_base_delay_ns = 1 * MS), &name);
    assert_int_equal(wq_add(q, KS("k")), 0);
    int *sh = t_shared_alloc(4096);
    uint64_t before = t_now_ns();
    pid_t c = t_fork(20);
    if (c == 0) {
        wq *cq;
        char buf[T_KEYBUF];
        if (wq_open(name, NULL, &cq) < 0 || wq_get(cq, buf, sizeof buf, 0) != 1)
            _exit(1);
        sh[0] = 1;
        pause();
        _exit(0);
    }
    while (!sh[0])
        t_sleep_ms(1);
    struct dump_one d = { .key = "k" };
    assert_int_equal(wq_dump(q, find_one, &d), 0);
    assert_int_equal(d.found, 1);
    assert_int_equal(d.info.owner_pid, c);
    assert_true(d.info.holder_alive);
    assert_true(d.info.started_ns >= before && d.info.started_ns <= t_now_ns());
    assert_int_equal(t_stats(q).processes, 2);
    assert_int_equal(kill(c, SIGKILL), 0);
    assert_int_equal(t_wait(c, 5000), 128 + SIGKILL);
    uint64_t died = t_now_ns();
    /* Nobody gets from the queue: only the idle reaper can bring k back. */
    bool dead_seen = false;
    for (;;) {
        d.found = 0;
        assert_int_equal(wq_dump(q, find_one, &d), 0);
        if (d.found && (d.info.state & WQ_KEY_PROCESSING)) {
            assert_false(d.info.holder_alive);   /* never a live holder */
            dead_seen = true;
        }
        if (d.found && !(d.info.state & WQ_KEY_PROCESSING))
            break;
        if (t_now_ns() - died > 2 * SEC * t_scale())
            fail_msg("a dead holder's key was not requeued on an idle queue");
        t_sleep_ms(10);
    }
    uint64_t took = t_now_ns() - died;
    printf("  dead holder's key requeued %.0f ms after its death (dead holder seen in "
           "the dump: %s)\n", (double)took / 1e6, dead_seen ? "yes" : "no");
    if (took > 1000 * MS * t_scale())
        fail_msg("requeued after %.0f ms, more than a second", (double)took / 1e6);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.processes, 1);
    assert_int_equal(st.crash_requeues_total, 1);
    t_shared_free(sh, 4096);
    t_check_clean(q, "dead holder");
    wq_close(q);
}

/* wq_len counts a key whose delay is over, without a wq_get moving it. */
static void len_counts_ready_keys(void **state)
{
    (void)state;
    wq *q = t_track(t_create("lenready", NULL, NULL));
    assert_int_equal(wq_add_after(q, KS("w"), 20 * MS), 0);
    assert_int_equal(wq_len(q), 0);
    uint64_t t0 = t_now_ns();
    while (wq_len(q) == 0) {
        if (t_now_ns() - t0 > 2 * SEC * t_scale())
            fail_msg("wq_len stayed 0 after the delay");
        t_sleep_ms(2);
    }
    assert_true(t_now_ns() - t0 >= 15 * MS);
    assert_int_equal(wq_len(q), 1);
    T_EXPECT_GET(q, "w");
    T_EXPECT_DONE(q, "w");
    t_close(q);
}

/* The rate limiter's delays, as a histogram, and the delayed keys. */
static void metrics_rate_limit_delay(void **state)
{
    (void)state;
    /* Delays long enough that the keys still wait when the metrics are
       read (real time: a Redis queue's clock is the server's). */
    wq *q = t_track(t_create("rlhist", T_OPTS(.rl_limiters = WQ_RL_EXPONENTIAL,
                                              .rl_base_delay_ns = 100 * MS), NULL));
    uint64_t t0 = t_now_ns();
    assert_int_equal(wq_add_rate_limited(q, KS("a")), 0);   /* 100 ms */
    assert_int_equal(wq_add_rate_limited(q, KS("b")), 0);   /* 100 ms */
    assert_int_equal(wq_add_rate_limited(q, KS("b")), 1);   /* 200 ms, merged */
    struct wq_metrics m;
    assert_int_equal(wq_metrics(q, &m), 0);
    bool in_time = t_now_ns() - t0 < 90 * MS;
    assert_int_equal(m.rate_limit_delay.count, 3);
    assert_true(m.rate_limit_delay.sum_seconds > 0.399 &&
                m.rate_limit_delay.sum_seconds < 0.401);
    assert_int_equal(m.rate_limit_delay.bucket[6], 0);   /* le 1e-2 s */
    assert_int_equal(m.rate_limit_delay.bucket[7], 2);   /* le 1e-1 s */
    assert_int_equal(m.rate_limit_delay.bucket[8], 3);   /* le 1 s */
    if (in_time)   /* else a delay may have run out already */
        assert_int_equal(m.waiting, 2);                  /* the delayed keys */
    /* The time helpers. */
    assert_int_equal(WQ_SEC(5), (int64_t)5000000000);
    assert_int_equal(WQ_MSEC(3), (int64_t)3000000);
    assert_int_equal(WQ_USEC(7), (int64_t)7000);
    t_close(q);
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        T_STORE_TEST(options_never_ignored),
        T_TEST(resume_across_processes),
        T_TEST(resume_cancels_drain),
        T_TEST(remove_keys),
        T_STORE_TEST(remove_from_store),
        T_TEST(dead_holder_shown_and_requeued),
        T_TEST(len_counts_ready_keys),
        T_TEST(metrics_rate_limit_delay),
        T_NO_LEFTOVERS,
    };
    static const struct t_guard g = {
        .prog = "test-lifecycle",
        .max_stores = 16,
        .deadline_s = 120,
        T_GUARD_TESTS(tests),
    };
    return t_guard_main(&g);
}
