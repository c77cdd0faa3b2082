/*
 * test-mp-fair.c - fair mode (WQ_FAIR) across processes: the core
 * semantics of test-queue.c still hold when the hand-out order is
 * priorities, tenant turns and the oldest-key share.
 *
 *   - figure 2 across processes: a worker process holds A while another
 *     process re-adds it and adds D, E; after the worker's wq_done A is
 *     handed out in the order of its re-add (B C A D E);
 *   - client-go's TestBasic: 50 producer processes add their key 50 times
 *     each with random priorities (tenants "t0" .. "t4"), 10 consumer
 *     processes get and done; per-key witnesses in a shared mapping check
 *     that no key ever has two holders at once and that every key is
 *     processed after its last add; shutdown and drain variants, children
 *     that wq_open() and children that inherit the handle;
 *   - client-go's TestAddWhileProcessing, with priorities: each key is
 *     re-added once while processing and handed out exactly twice;
 *   - order across processes: producers in several processes add keys of
 *     random priorities and tenants; a single consumer sees priorities
 *     never rise and, within a tenant and priority, each producer's add
 *     order;
 *   - crashes: a child gets a key and dies by SIGKILL (itself, or killed
 *     while the parent waits; also after the key was re-added while it
 *     was held): the key is never handed out while its holder lives, comes
 *     back (through the rate limiter) within 2 s exactly once, wq_check is
 *     clean and crash_requeues_total is 1.
 *
 * Only the main thread of the test process uses cmocka asserts; children
 * write to the failure board (t.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "t.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static wq *make_fair(const char *tag, uint32_t capacity, uint32_t fair_share,
                     int tenant_sep, const char **name_out)
{
    struct wq_options o = { .capacity = capacity,
                            .flags = WQ_FAIR,
                            .fair_share = fair_share,
                            .tenant_sep = tenant_sep };

    return t_create(tag, &o, name_out);
}

/* ================================================================== */
/* Figure 2 across processes                                           */
/* ================================================================== */

struct fig2 {
    atomic_int got;
    atomic_int go;
};

static void fig2_run(int inherit)
{
    const char *name;
    wq *q = make_fair(inherit ? "fig2-pi" : "fig2-po", 64, 1000, -1, &name);
    struct fig2 *f = t_shared_alloc(sizeof *f);
    char buf[T_KEYBUF + 1], order[64] = "";
    size_t used = 0;
    int n;

    assert_int_equal(wq_add(q, KS("A")), 0);
    assert_int_equal(wq_add(q, KS("B")), 0);
    assert_int_equal(wq_add(q, KS("C")), 0);
    pid_t pid = t_fork(20);
    if (pid == 0) {
        wq *cq = q;
        char kb[T_KEYBUF];
        if (!inherit && wq_open(name, NULL, &cq) != 0)
            _exit(1);
        int k = wq_get(cq, kb, sizeof kb, 5 * SEC);
        if (k != 1 || kb[0] != 'A') {
            t_failf(__FILE__, __LINE__, "worker got %d", k);
            _exit(2);
        }
        atomic_store(&f->got, 1);
        if (t_wait_count(&f->go, 1, 5000) != 0)
            _exit(3);
        int rc = wq_done(cq, KS("A"));
        wq_close(cq);
        _exit(rc == 0 ? 0 : 4);
    }
    assert_int_equal(t_wait_count(&f->got, 1, 5000), 0);
    assert_int_equal(wq_add(q, KS("A")), 0);      /* re-add while held */
    assert_int_equal(wq_add(q, KS("D")), 0);
    assert_int_equal(wq_add(q, KS("A")), 1);      /* coalesced */
    assert_int_equal(wq_add(q, KS("E")), 0);
    assert_int_equal(wq_len(q), 4);
    atomic_store(&f->go, 1);
    assert_int_equal(t_wait(pid, 5000), 0);
    T_ASSERT_BOARD_CLEAN();
    while ((n = wq_get(q, buf, T_KEYBUF, 0)) > 0) {
        buf[n] = '\0';
        used += (size_t)snprintf(order + used, sizeof order - used, "%s%s",
                                 used ? " " : "", buf);
        assert_int_equal(wq_done(q, buf, (size_t)n), 0);
    }
    assert_int_equal(n, -EAGAIN);
    assert_string_equal(order, "B C A D E");
    struct wq_stats st;
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.processes, 1);
    assert_int_equal(st.live, 0);
    assert_int_equal(st.crash_requeues_total, 0);
    t_check_clean(q, NULL);
    wq_close(q);
    t_shared_free(f, sizeof *f);
}

static void fig2_po(void **s) { (void)s; fig2_run(0); }
static void fig2_pi(void **s) { (void)s; fig2_run(1); }

/* ================================================================== */
/* TestBasic, fair                                                     */
/* ================================================================== */

/* The witnesses, the consumers and the checks: t.h. */
#define B_TENANTS 5
#define AFTER_SHUTDOWN "t9/added after shutdown!"

static int key_of(char *buf, size_t cap, int id)
{
    return snprintf(buf, cap, "t%d/k%d", id % B_TENANTS, id);
}

/* "t<t>/k<id>" -> id, or -1. */
static int parse_key(const unsigned char *buf, int n, int max)
{
    char tmp[40];
    int t, id;
    if (n < 5 || n > 38)
        return -1;
    memcpy(tmp, buf, (size_t)n);
    tmp[n] = '\0';
    if (sscanf(tmp, "t%d/k%d", &t, &id) != 2 || id < 0 || id >= max ||
        t != id % B_TENANTS)
        return -1;
    return id;
}

/* A producer's add: a random priority, every fifth a plain wq_add. */
static int basic_add(wq *q, const char *key, size_t len, int j,
                     unsigned *seed)
{
    int prio = (int)(rand_r(seed) % 12) - 2;

    return (j % 5 == 4) ? wq_add(q, key, len) : t_add_prio(q, key, len, prio);
}

static int basic_actor(struct t_actor *a)
{
    char key[40];

    if (a->id < T_BASIC_PRODUCERS) {
        unsigned seed = (unsigned)(a->id * 7919 + 17);
        int kl = key_of(key, sizeof key, a->id);
        return t_basic_produce(a, key, (size_t)kl, basic_add, &seed);
    }
    return t_basic_consume(a, parse_key, AFTER_SHUTDOWN);
}

static int add_after_shutdown(wq *q)
{
    return t_add_prio(q, KS(AFTER_SHUTDOWN), 3);
}

static void run_basic(enum t_mode mode, int drain)
{
    const char *name;
    /* fair_share 0: the default 8, so the oldest-key share is exercised */
    wq *q = make_fair(drain ? "basic-drain" : "basic-shutdown", 4096, 0, 0,
                      &name);
    struct t_basic *b = t_shared_alloc(sizeof *b);
    struct wq_stats st;

    t_watchdog(20 * t_scale());
    t_basic_run(mode, drain, q, name, b, basic_actor, add_after_shutdown);
    t_basic_check_stats(q, b, "", &st);
    assert_int_equal(st.fair, 1);
    t_check_clean(q, NULL);
    wq_close(q);
    t_shared_free(b, sizeof *b);
}

/* ================================================================== */
/* TestAddWhileProcessing, fair                                        */
/* ================================================================== */

/* The re-add while processing, with a random priority. */
static int readd(wq *q, const void *key, size_t len, unsigned *seed)
{
    return t_add_prio(q, key, len, (int)(rand_r(seed) % 7) - 3);
}

static int awp_actor(struct t_actor *a)
{
    struct t_awp *w = a->arg;
    char key[40];
    unsigned seed = (unsigned)(a->id * 104729 + 3);

    if (a->id < T_AWP_PRODUCERS) {
        int kl = key_of(key, sizeof key, a->id);
        T_CHECK_EQ(t_add_prio(a->q, key, (size_t)kl, (int)(rand_r(&seed) % 7) - 3), 0);
        atomic_fetch_add(&w->producers_done, 1);
        return 0;
    }
    return t_awp_consume(a, parse_key, readd, &seed, "");
}

static void run_awp(enum t_mode mode, int drain)
{
    const char *name;
    wq *q = make_fair(drain ? "awp-drain" : "awp-shutdown", 4096, 0, 0, &name);
    struct t_awp *w = t_shared_alloc(sizeof *w);

    t_watchdog(20 * t_scale());
    /* settle 50 ms: let the consumers work through the first round before
       shutting down, so most re-adds are accepted */
    t_awp_run(mode, drain, q, name, w, awp_actor, 50, "");
    t_check_clean(q, NULL);
    wq_close(q);
    t_shared_free(w, sizeof *w);
}

T_TEAM_PROC_CASES(basic, run_basic)
T_TEAM_PROC_CASES(add_while_processing, run_awp)

/* ================================================================== */
/* Order across processes                                              */
/* ================================================================== */

#define O_PRODUCERS 6
#define O_KEYS 100   /* per producer: 600 hand-outs, below fair_share */

/* Key: "t<tenant>/p<prio+10>/w<producer>/<i>" */
static int order_actor(struct t_actor *a)
{
    unsigned seed = (unsigned)(a->id * 31337 + 1);
    char key[64];

    for (int i = 0; i < O_KEYS; i++) {
        int tenant = (int)(rand_r(&seed) % 4);
        int prio = (int)(rand_r(&seed) % 5) - 2;
        int kl = snprintf(key, sizeof key, "t%d/p%d/w%d/%d", tenant, prio + 10,
                          a->id, i);
        T_CHECK_EQ(t_add_prio(a->q, key, (size_t)kl, prio), 0);
    }
    return 0;
}

static void order_run(enum t_mode mode)
{
    const char *name;
    wq *q = make_fair("order", 4096, 1000, 0, &name);
    /* last index seen per (tenant, prio, producer) */
    int last[4][5][O_PRODUCERS];
    char buf[T_KEYBUF + 1];
    int n, prev_prio = 1000, got = 0;

    memset(last, -1, sizeof last);
    struct t_team *t = t_team_start(mode, name, q, O_PRODUCERS, order_actor,
                                      NULL);
    assert_int_equal(t_team_wait(t, 8000), 0);
    T_ASSERT_BOARD_CLEAN();
    while ((n = wq_get(q, buf, T_KEYBUF, 0)) > 0) {
        int tn, p, w, i;
        buf[n] = '\0';
        if (sscanf(buf, "t%d/p%d/w%d/%d", &tn, &p, &w, &i) != 4 || tn < 0 ||
            tn > 3 || p < 8 || p > 12 || w < 0 || w >= O_PRODUCERS)
            fail_msg("unexpected key \"%s\"", buf);
        p -= 10;
        if (p > prev_prio)
            fail_msg("get %d: \"%s\" (priority %d) after priority %d", got,
                     buf, p, prev_prio);
        if (i <= last[tn][p + 2][w])
            fail_msg("get %d: \"%s\" after index %d of the same producer, "
                     "tenant and priority", got, buf, last[tn][p + 2][w]);
        last[tn][p + 2][w] = i;
        prev_prio = p;
        got++;
        assert_int_equal(wq_done(q, buf, (size_t)n), 0);
    }
    assert_int_equal(n, -EAGAIN);
    assert_int_equal(got, O_PRODUCERS * O_KEYS);
    t_check_clean(q, NULL);
    wq_close(q);
}

static void order_po(void **s) { (void)s; order_run(T_PROCS_OPEN); }
static void order_pi(void **s) { (void)s; order_run(T_PROCS_INHERIT); }

/* ================================================================== */
/* Crashes                                                             */
/* ================================================================== */

#define C_KEYS 30

struct crash {
    atomic_int got;         /* the child holds its key */
    atomic_int readded;     /* the parent re-added it */
    char key[64];
    int len;
};

enum crash_kind {
    CRASH_SELF,       /* the child raises SIGKILL right after its get */
    CRASH_KILLED,     /* the child waits; the parent checks the key is not
                         handed out while it lives, then kills it */
    CRASH_DIRTY,      /* as KILLED, the key re-added while held */
};

static void crash_run(enum crash_kind kind, int inherit)
{
    const char *name;
    wq *q = make_fair("crash", 256, 0, 0, &name);
    struct crash *c = t_shared_alloc(sizeof *c);
    char keys[C_KEYS][32];
    int seen[C_KEYS] = { 0 };
    unsigned seed = (unsigned)(kind * 10 + inherit + 12345);
    char buf[T_KEYBUF + 1];

    t_watchdog(15 * t_scale());
    for (int i = 0; i < C_KEYS; i++) {
        snprintf(keys[i], sizeof keys[i], "t%u/k%d", rand_r(&seed) % 4, i);
        assert_int_equal(t_add_prio(q, KS(keys[i]), (int)(rand_r(&seed) % 9) - 4), 0);
    }
    pid_t pid = t_fork(20);
    if (pid == 0) {
        wq *cq = q;
        if (!inherit && wq_open(name, NULL, &cq) != 0)
            _exit(1);
        char kb[T_KEYBUF];
        int n = wq_get(cq, kb, sizeof kb, 5 * SEC);
        if (n <= 0 || (size_t)n > sizeof c->key) {
            t_failf(__FILE__, __LINE__, "victim's wq_get = %d", n);
            _exit(2);
        }
        memcpy(c->key, kb, (size_t)n);
        c->len = n;
        atomic_store(&c->got, 1);
        if (kind == CRASH_SELF)
            raise(SIGKILL);
        for (;;)
            pause();
    }
    assert_int_equal(t_wait_count(&c->got, 1, 5000), 0);
    int victim = -1;
    for (int i = 0; i < C_KEYS; i++)
        if ((size_t)c->len == strlen(keys[i]) &&
            memcmp(c->key, keys[i], (size_t)c->len) == 0)
            victim = i;
    assert_true(victim >= 0);
    if (kind == CRASH_DIRTY)
        assert_int_equal(t_add_prio(q, keys[victim], strlen(keys[victim]), 7), 0);

    if (kind == CRASH_SELF) {
        assert_int_equal(t_wait(pid, 5000), 128 + SIGKILL);
    } else {
        /* The holder lives: everything else comes out, the victim never. */
        int n;
        for (int got = 0; got < C_KEYS - 1; got++) {
            n = wq_get(q, buf, T_KEYBUF, SEC);
            assert_true(n > 0);
            buf[n] = '\0';
            int i = atoi(strchr(buf, 'k') + 1);
            assert_true(i >= 0 && i < C_KEYS && i != victim);
            assert_int_equal(seen[i], 0);
            seen[i] = 1;
            assert_int_equal(wq_done(q, buf, (size_t)n), 0);
        }
        assert_int_equal(wq_get(q, buf, T_KEYBUF, 300 * MS), -ETIMEDOUT);
        struct wq_stats st;
        assert_int_equal(wq_stats(q, &st), 0);
        assert_int_equal(st.processing, 1);
        assert_int_equal(st.crash_requeues_total, 0);
        assert_int_equal(kill(pid, SIGKILL), 0);
        assert_int_equal(t_wait(pid, 5000), 128 + SIGKILL);
    }

    /* The victim comes back (dead holder reaped by a waiting get, then the
       rate limiter's delay) within 2 s, exactly once; every other key once. */
    uint64_t t0 = t_now_ns();
    int n, victim_seen = 0;
    while ((n = wq_get(q, buf, T_KEYBUF, 2 * SEC * t_scale())) > 0) {
        buf[n] = '\0';
        int i = atoi(strchr(buf, 'k') + 1);
        assert_true(i >= 0 && i < C_KEYS);
        if (i == victim) {
            victim_seen++;
            if (t_now_ns() - t0 > 2 * (uint64_t)SEC * t_scale())
                fail_msg("the victim's key came back after %.2f s",
                         (double)(t_now_ns() - t0) / 1e9);
        } else {
            if (seen[i])
                fail_msg("key %s handed out twice", buf);
            seen[i] = 1;
        }
        assert_int_equal(wq_done(q, buf, (size_t)n), 0);
        if (victim_seen && wq_len(q) == 0)
            break;
    }
    assert_int_equal(victim_seen, 1);
    for (int i = 0; i < C_KEYS; i++)
        if (i != victim && !seen[i])
            fail_msg("key %s never handed out", keys[i]);
    /* Nothing more: no second copy of the victim fires later. */
    assert_int_equal(wq_get(q, buf, T_KEYBUF, 200 * MS), -ETIMEDOUT);

    struct wq_stats st;
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.crash_requeues_total, 1);
    assert_int_equal(st.processing, 0);
    assert_int_equal(st.queued, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.processes, 1);
    assert_int_equal(wq_num_requeues(q, KS(keys[victim])), 1);
    t_check_clean(q, NULL);
    T_ASSERT_BOARD_CLEAN();
    wq_close(q);
    t_shared_free(c, sizeof *c);
}

static void crash_self_po(void **s) { (void)s; crash_run(CRASH_SELF, 0); }
static void crash_self_pi(void **s) { (void)s; crash_run(CRASH_SELF, 1); }
static void crash_killed_po(void **s) { (void)s; crash_run(CRASH_KILLED, 0); }
static void crash_killed_pi(void **s) { (void)s; crash_run(CRASH_KILLED, 1); }
static void crash_dirty_po(void **s) { (void)s; crash_run(CRASH_DIRTY, 0); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        T_TEST(fig2_po),
        T_TEST(fig2_pi),
        T_TEAM_PROC_TESTS(basic),
        T_TEAM_PROC_TESTS(add_while_processing),
        T_TEST(order_po),
        T_TEST(order_pi),
        T_TEST(crash_self_po),
        T_TEST(crash_self_pi),
        T_TEST(crash_killed_po),
        T_TEST(crash_killed_pi),
        T_TEST(crash_dirty_po),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("mp-fair", tests);
}
