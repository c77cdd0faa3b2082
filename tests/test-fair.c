/*
 * test-fair.c - fair mode (WQ_FAIR, wq.h "Priorities and fairness"),
 * single process, exact hand-out orders.
 *
 * What is checked, against the four rules of wq.h:
 *   1. a key re-added while processing is handed out, after its wq_done,
 *      in the order of the moment it was re-added (OpenKruise's "Learning
 *      Concurrent Reconciling", figure 2: the default mode puts it at the
 *      back, as client-go does; both modes are run step by step);
 *   2. higher priority first; merging keeps the higher priority and the
 *      earlier ready time; delays and rate limiting combine with a
 *      priority (the smaller delay wins when both are given);
 *   3. tenants take turns (start-time fair queueing): a tenant with
 *      100,000 keys queued does not delay another tenant's single key;
 *   4. no starvation: with fair_share = F, a key with r keys queued before
 *      it is handed out within F * (r + 1) hand-outs under an endless
 *      flood of higher priority keys (and not before, when F is large).
 * Plus wq_stats.fair, wq_dump's priority, seq and tenant_len,
 * option checks, and wq_check == 0 after every scenario.
 *
 * Where a test is not about starvation it uses fair_share = 1000 (so the
 * oldest-key rule does not interfere with the few hand-outs it makes), and
 * tenant_sep = -1 where tenants are not the point.
 *
 * Clock: the test build (libwq-fault.a) offers wq_test_clock_set(); it is
 * set to T0 before every test (see test-delay.c) and stepped by the
 * delay tests, so ready times are exact. Every wq_get uses timeout 0.
 */
#include "t.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

/* ------------------------------------------------------------------ */
/* Helpers (handles, clock, fixtures: t.h)                             */
/* ------------------------------------------------------------------ */

/* A default-mode queue (fair == 0) or a WQ_FAIR one. */
static wq *fair_q(const char *tag, int fair, uint32_t fair_share,
                  int tenant_sep, uint32_t capacity)
{
    struct wq_options o = { .capacity = capacity };

    if (fair) {
        o.flags = WQ_FAIR;
        o.fair_share = fair_share;
        o.tenant_sep = tenant_sep;
    }
    return t_track(t_create(tag, &o, NULL));
}

#define add_ok(q, k, e) assert_int_equal(wq_add((q), KS(k)), (e))

static int addx(wq *q, const char *k, int prio, uint64_t after, bool rl)
{
    struct wq_add_opts o = { .priority = prio, .after_ns = after,
                             .rate_limited = rl };
    return wq_add_opts(q, KS(k), &o);
}

/* Get (and done) everything queued now; the keys, space separated. */
static void drain_order(wq *q, char *out, size_t cap)
{
    char buf[T_KEYBUF + 1];
    size_t used = 0;
    int n;

    out[0] = '\0';
    while ((n = wq_get(q, buf, T_KEYBUF, 0)) > 0) {
        buf[n] = '\0';
        used += (size_t)snprintf(out + used, cap - used, "%s%s",
                                 used ? " " : "", buf);
        assert_true(used < cap);
        assert_int_equal(wq_done(q, buf, (size_t)n), 0);
    }
    assert_int_equal(n, -EAGAIN);
}

#define expect_drain(q, want) expect_drain_((q), (want), __LINE__)
static void expect_drain_(wq *q, const char *want, int line)
{
    char got[4096];

    drain_order(q, got, sizeof got);
    if (strcmp(got, want) != 0)
        fail_msg("line %d: hand-out order \"%s\", expected \"%s\"", line,
                 got, want);
}

#define info_of(q, k) info_of_((q), (k), __LINE__)
static struct wq_key_info info_of_(wq *q, const char *key, int line)
{
    struct wq_key_info ki;
    int found;
    int rc = t_key_lookup(q, key, &ki, &found);

    if (rc != 0 && rc != 1)
        fail_msg("line %d: wq_dump = %d", line, rc);
    if (!found)
        fail_msg("line %d: \"%s\" is not in the dump", line, key);
    return ki;
}

struct queued_order {
    char buf[4096];
    size_t used;
    int bad_pos;
    uint64_t n;
};

static int dump_order_cb(const struct wq_key_info *i, void *arg)
{
    struct queued_order *d = arg;
    if (!(i->state & WQ_KEY_QUEUED))
        return 0;
    if (i->position != d->n)
        d->bad_pos = 1;
    d->n++;
    d->used += (size_t)snprintf(d->buf + d->used, sizeof d->buf - d->used,
                                "%s%.*s", d->used ? " " : "", (int)i->len,
                                (const char *)i->key);
    return d->used >= sizeof d->buf;
}

/* wq_dump lists queued keys first, positions 0, 1, ... in hand-out order
   (fair mode: by priority, tag and add order; the oldest-key share is
   not predicted, so only with few hand-outs and a large fair_share). */
#define expect_dump(q, want) expect_dump_((q), (want), __LINE__)
static void expect_dump_(wq *q, const char *want, int line)
{
    struct queued_order d = { .used = 0 };
    d.buf[0] = '\0';
    assert_int_equal(wq_dump(q, dump_order_cb, &d), 0);
    if (strcmp(d.buf, want) != 0 || d.bad_pos)
        fail_msg("line %d: wq_dump queued order \"%s\"%s, expected \"%s\"",
                 line, d.buf, d.bad_pos ? " (positions wrong)" : "", want);
}

/* ------------------------------------------------------------------ */
/* 1. Figure 2: re-add while processing                                */
/* ------------------------------------------------------------------ */

/* A, B, C added; a worker gets A; A is re-added while processing (once or
   twice); D, E added; Done(A). */
static void figure2(int fair, int readds)
{
    wq *q = fair_q(fair ? "fig2-fair" : "fig2-default", fair, 1000, -1, 64);

    add_ok(q, "A", 0);
    add_ok(q, "B", 0);
    add_ok(q, "C", 0);
    T_EXPECT_GET(q, "A");                             /* figure 2(b) */
    add_ok(q, "A", 0);                              /* dirty, not queued */
    assert_int_equal(wq_len(q), 2);
    add_ok(q, "D", 0);                              /* figure 2(c) */
    if (readds == 2)
        add_ok(q, "A", 1);                          /* coalesced */
    add_ok(q, "E", 0);
    assert_int_equal(wq_len(q), 4);
    assert_int_equal(info_of(q, "A").state, WQ_KEY_PROCESSING | WQ_KEY_DIRTY);
    T_EXPECT_DONE(q, "A");                            /* figure 2(d) */
    assert_int_equal(wq_len(q), 5);
    expect_dump(q, fair ? "B C A D E" : "B C D E A");
    if (fair)
        expect_drain(q, "B C A D E"); /* A where its re-add put it */
    else
        expect_drain(q, "B C D E A"); /* A at the back (client-go) */

    struct wq_stats s = t_stats(q);
    assert_int_equal(s.adds_total, 6);
    assert_int_equal(s.coalesced_total, readds == 2 ? 1 : 0);
    assert_int_equal(s.live, 0);
    assert_int_equal(s.fair, fair ? 1 : 0);
    t_check_clean(q, NULL);
    t_close(q);
}

static void fig2_default(void **s) { (void)s; figure2(0, 1); }
static void fig2_fair(void **s) { (void)s; figure2(1, 1); }
static void fig2_default_twice(void **s) { (void)s; figure2(0, 2); }
static void fig2_fair_twice(void **s) { (void)s; figure2(1, 2); }

/* Both re-adds back to back, before anything else was added. */
static void fig2_twice_adjacent(void **state)
{
    (void)state;
    for (int fair = 0; fair <= 1; fair++) {
        wq *q = fair_q("fig2-adj", fair, 1000, -1, 64);
        add_ok(q, "A", 0);
        add_ok(q, "B", 0);
        add_ok(q, "C", 0);
        T_EXPECT_GET(q, "A");
        add_ok(q, "A", 0);
        add_ok(q, "A", 1);
        add_ok(q, "D", 0);
        add_ok(q, "E", 0);
        T_EXPECT_DONE(q, "A");
        expect_drain(q, fair ? "B C A D E" : "B C D E A");
        t_check_clean(q, NULL);
        t_close(q);
    }
}

/* The same with the fast path: wq_done_get(A) hands out B (A's re-add came
   after B and C), and A is then ahead of D. */
static void fig2_done_get(void **state)
{
    (void)state;
    for (int fair = 0; fair <= 1; fair++) {
        wq *q = fair_q("fig2-dg", fair, 1000, -1, 64);
        char buf[T_KEYBUF];
        add_ok(q, "A", 0);
        add_ok(q, "B", 0);
        add_ok(q, "C", 0);
        T_EXPECT_GET(q, "A");
        add_ok(q, "A", 0);
        add_ok(q, "D", 0);
        assert_int_equal(wq_done_get(q, KS("A"), buf, sizeof buf, 0), 1);
        assert_memory_equal(buf, "B", 1);
        T_EXPECT_DONE(q, "B");
        expect_drain(q, fair ? "C A D" : "C D A");
        t_check_clean(q, NULL);
        t_close(q);
    }
}

/* fair_share = 1 is "always the oldest": plain FIFO by add time, the
   moment of the re-add counting as A's add time. */
static void fig2_fair_share_1(void **state)
{
    (void)state;
    wq *q = fair_q("fig2-fs1", 1, 1, -1, 64);
    add_ok(q, "A", 0);
    add_ok(q, "B", 0);
    add_ok(q, "C", 0);
    T_EXPECT_GET(q, "A");
    add_ok(q, "A", 0);
    add_ok(q, "D", 0);
    add_ok(q, "E", 0);
    T_EXPECT_DONE(q, "A");
    expect_drain(q, "B C A D E");
    t_check_clean(q, NULL);
    t_close(q);
}

/* ------------------------------------------------------------------ */
/* 2. Interleaved re-adds of several processing keys                   */
/* ------------------------------------------------------------------ */

/* get A, get B, re-add B, add X, re-add A, add Y, done A, done B. */
static void readd_interleaved(void **state)
{
    (void)state;
    for (int fair = 0; fair <= 1; fair++) {
        wq *q = fair_q("readd-1", fair, 1000, -1, 64);
        add_ok(q, "A", 0);
        add_ok(q, "B", 0);
        T_EXPECT_GET(q, "A");
        T_EXPECT_GET(q, "B");
        add_ok(q, "B", 0);
        add_ok(q, "X", 0);
        add_ok(q, "A", 0);
        add_ok(q, "Y", 0);
        T_EXPECT_DONE(q, "A");
        T_EXPECT_DONE(q, "B");
        expect_drain(q, fair ? "B X A Y" : "X Y A B");
        t_check_clean(q, NULL);
        t_close(q);
    }
}

/* Dones in the other order than the re-adds: the order of the re-adds
   decides, not the order of the dones. get A, get B, re-add A, add X,
   re-add B, done B, done A. */
static void readd_done_reversed(void **state)
{
    (void)state;
    for (int fair = 0; fair <= 1; fair++) {
        wq *q = fair_q("readd-2", fair, 1000, -1, 64);
        add_ok(q, "A", 0);
        add_ok(q, "B", 0);
        T_EXPECT_GET(q, "A");
        T_EXPECT_GET(q, "B");
        add_ok(q, "A", 0);
        add_ok(q, "X", 0);
        add_ok(q, "B", 0);
        T_EXPECT_DONE(q, "B");
        T_EXPECT_DONE(q, "A");
        expect_drain(q, fair ? "A X B" : "X B A");
        t_check_clean(q, NULL);
        t_close(q);
    }
}

/* A hand-out happens between the re-add and the done: A, B, C; get A;
   re-add A; add D; get (B: A is not queued yet); done B; done A. */
static void readd_get_between(void **state)
{
    (void)state;
    for (int fair = 0; fair <= 1; fair++) {
        wq *q = fair_q("readd-3", fair, 1000, -1, 64);
        add_ok(q, "A", 0);
        add_ok(q, "B", 0);
        add_ok(q, "C", 0);
        T_EXPECT_GET(q, "A");
        add_ok(q, "A", 0);
        add_ok(q, "D", 0);
        T_EXPECT_GET(q, "B");
        T_EXPECT_DONE(q, "B");
        T_EXPECT_DONE(q, "A");
        expect_drain(q, fair ? "C A D" : "C D A");
        t_check_clean(q, NULL);
        t_close(q);
    }
}

/* After its done the re-added key is an ordinary queued key: a further add
   is coalesced and does not move it. A, B; get A; re-add A; add C; done A;
   add A (coalesced). */
static void readd_then_queued_add(void **state)
{
    (void)state;
    for (int fair = 0; fair <= 1; fair++) {
        wq *q = fair_q("readd-4", fair, 1000, -1, 64);
        add_ok(q, "A", 0);
        add_ok(q, "B", 0);
        T_EXPECT_GET(q, "A");
        add_ok(q, "A", 0);
        add_ok(q, "C", 0);
        T_EXPECT_DONE(q, "A");
        add_ok(q, "A", 1);
        expect_drain(q, fair ? "B A C" : "B C A");
        t_check_clean(q, NULL);
        t_close(q);
    }
}

/* Two keys re-added while processing, a third key handed out and re-added
   in between: A; get A; re-add A; add B; get B; re-add B; add C; done B;
   done A. */
static void readd_chain(void **state)
{
    (void)state;
    for (int fair = 0; fair <= 1; fair++) {
        wq *q = fair_q("readd-5", fair, 1000, -1, 64);
        add_ok(q, "A", 0);
        T_EXPECT_GET(q, "A");
        add_ok(q, "A", 0);
        add_ok(q, "B", 0);
        T_EXPECT_GET(q, "B");
        add_ok(q, "B", 0);
        add_ok(q, "C", 0);
        T_EXPECT_DONE(q, "B");
        T_EXPECT_DONE(q, "A");
        expect_drain(q, fair ? "A B C" : "C B A");
        t_check_clean(q, NULL);
        t_close(q);
    }
}

/* A key re-added while processing and done with wq_finish (the outcome
   path) keeps its place as with wq_done; a key re-added and done twice in a
   row (two runs) each time takes the place of its latest re-add. */
static void readd_finish_and_rerun(void **state)
{
    (void)state;
    for (int fair = 0; fair <= 1; fair++) {
        wq *q = fair_q("readd-6", fair, 1000, -1, 64);
        add_ok(q, "A", 0);
        add_ok(q, "B", 0);
        T_EXPECT_GET(q, "A");
        add_ok(q, "A", 0);
        add_ok(q, "C", 0);
        assert_int_equal(wq_finish(q, KS("A"), 0, "ok"), 0);
        /* fair: B A C; default: B C A */
        T_EXPECT_GET(q, "B");
        T_EXPECT_DONE(q, "B");
        if (fair) {
            T_EXPECT_GET(q, "A");
            add_ok(q, "A", 0);   /* second run, re-added behind C */
            add_ok(q, "D", 0);
            T_EXPECT_DONE(q, "A");
            expect_drain(q, "C A D");
        } else {
            T_EXPECT_GET(q, "C");
            T_EXPECT_DONE(q, "C");
            T_EXPECT_GET(q, "A");
            add_ok(q, "A", 0);
            add_ok(q, "D", 0);
            T_EXPECT_DONE(q, "A");
            expect_drain(q, "D A");
        }
        t_check_clean(q, NULL);
        t_close(q);
    }
}

/* A processing key whose re-add is a wq_add_many in the middle of a batch
   takes the place of that batch position. */
static void readd_add_many(void **state)
{
    (void)state;
    for (int fair = 0; fair <= 1; fair++) {
        wq *q = fair_q("readd-7", fair, 1000, -1, 64);
        struct iovec v[3] = { { (void *)"X", 1 }, { (void *)"A", 1 },
                              { (void *)"Y", 1 } };
        add_ok(q, "A", 0);
        add_ok(q, "B", 0);
        T_EXPECT_GET(q, "A");
        assert_int_equal(wq_add_many(q, v, 3), 0);
        T_EXPECT_DONE(q, "A");
        expect_drain(q, fair ? "B X A Y" : "B X Y A");
        t_check_clean(q, NULL);
        t_close(q);
    }
}

/* ------------------------------------------------------------------ */
/* 3. Priorities                                                       */
/* ------------------------------------------------------------------ */

static void prio_merge(void **state)
{
    (void)state;
    wq *q = fair_q("prio-merge", 1, 1000, -1, 64);

    assert_int_equal(t_add_prio(q, KS("k1"), 1), 0);
    assert_int_equal(t_add_prio(q, KS("k1"), 5), 1);      /* merged, raised */
    assert_int_equal(info_of(q, "k1").priority, 5);
    assert_int_equal(t_add_prio(q, KS("k2"), 5), 0);
    assert_int_equal(t_add_prio(q, KS("k2"), 1), 1);      /* merged, kept */
    assert_int_equal(info_of(q, "k2").priority, 5);
    add_ok(q, "k2", 1);                         /* plain add: priority 0 */
    assert_int_equal(info_of(q, "k2").priority, 5);
    assert_int_equal(wq_add_opts(q, KS("k0"), NULL), 0);  /* NULL: wq_add */
    assert_int_equal(wq_add_opts(q, KS("k0"), NULL), 1);
    assert_int_equal(info_of(q, "k0").priority, 0);
    assert_int_equal(info_of(q, "k0").state, WQ_KEY_QUEUED | WQ_KEY_DIRTY);

    struct wq_stats s = t_stats(q);
    assert_int_equal(s.adds_total, 3);
    assert_int_equal(s.coalesced_total, 4);
    expect_drain(q, "k1 k2 k0");
    t_check_clean(q, NULL);
    t_close(q);
}

/* Higher first; equal priority in add order; negative priorities are
   below the default 0. */
static void prio_order(void **state)
{
    (void)state;
    wq *q = fair_q("prio-order", 1, 1000, -1, 64);
    static const struct { const char *k; int p; } adds[] = {
        { "n1", -2 }, { "z1", 0 }, { "m1", 3 }, { "h1", 7 }, { "z2", 0 },
        { "m2", 3 },  { "n2", -2 }, { "h2", 7 }, { "m3", 3 }, { "z3", 0 },
    };
    for (size_t i = 0; i < sizeof adds / sizeof adds[0]; i++)
        assert_int_equal(t_add_prio(q, KS(adds[i].k), adds[i].p), 0);
    for (size_t i = 0; i < sizeof adds / sizeof adds[0]; i++)
        assert_int_equal(info_of(q, adds[i].k).priority, adds[i].p);
    /* seq is the add order (not asserted as consecutive: wraps) */
    assert_true(info_of(q, "n1").seq != info_of(q, "z1").seq);
    expect_dump(q, "h1 h2 m1 m2 m3 z1 z2 z3 n1 n2");
    expect_drain(q, "h1 h2 m1 m2 m3 z1 z2 z3 n1 n2");
    assert_int_equal(t_stats(q).fair, 1);
    t_check_clean(q, NULL);
    t_close(q);
}

/* A raised priority moves a queued key ahead of keys it was behind. */
static void prio_raise_moves(void **state)
{
    (void)state;
    wq *q = fair_q("prio-raise", 1, 1000, -1, 64);
    assert_int_equal(t_add_prio(q, KS("a"), 2), 0);
    assert_int_equal(t_add_prio(q, KS("b"), 2), 0);
    assert_int_equal(t_add_prio(q, KS("c"), 0), 0);
    T_EXPECT_GET(q, "a");
    assert_int_equal(t_add_prio(q, KS("c"), 4), 1);
    T_EXPECT_GET(q, "c");
    T_EXPECT_GET(q, "b");
    T_EXPECT_GET_RC(q, -EAGAIN);
    T_EXPECT_DONE(q, "a");
    T_EXPECT_DONE(q, "b");
    T_EXPECT_DONE(q, "c");
    t_check_clean(q, NULL);
    t_close(q);
}

/* A key re-added while processing: re-adds merge among themselves (the
   higher wins) and the key is handed out by that priority after its
   wq_done. */
static void prio_readd_while_processing(void **state)
{
    (void)state;
    wq *q = fair_q("prio-readd", 1, 1000, -1, 64);

    assert_int_equal(t_add_prio(q, KS("A"), 0), 0);
    T_EXPECT_GET(q, "A");
    assert_int_equal(t_add_prio(q, KS("A"), 0), 0);   /* marked dirty */
    assert_int_equal(t_add_prio(q, KS("B"), 1), 0);
    assert_int_equal(t_add_prio(q, KS("C"), 2), 0);
    assert_int_equal(t_add_prio(q, KS("A"), 3), 1);   /* merged into the dirty mark */
    assert_int_equal(info_of(q, "A").state, WQ_KEY_PROCESSING | WQ_KEY_DIRTY);
    assert_int_equal(info_of(q, "A").priority, 3);
    T_EXPECT_DONE(q, "A");
    expect_drain(q, "A C B");
    t_check_clean(q, NULL);
    t_close(q);
}

/* The run in progress does not lend its priority to the re-add: the add
   it came from was handed out already (controller-runtime's priority queue
   makes a new item for an add of a locked key, with the add's priority;
   wq.h merges priorities only into a key "already queued"). Otherwise a
   key that is re-added during each of its runs keeps a one-time urgent
   priority forever. */
static void prio_readd_new_priority(void **state)
{
    (void)state;
    wq *q = fair_q("prio-readd-new", 1, 1000, -1, 64);

    assert_int_equal(t_add_prio(q, KS("A"), 5), 0);
    T_EXPECT_GET(q, "A");
    assert_int_equal(t_add_prio(q, KS("A"), 0), 0);   /* marked dirty */
    assert_int_equal(t_add_prio(q, KS("B"), 1), 0);
    T_EXPECT_DONE(q, "A");
    assert_int_equal(info_of(q, "A").priority, 0);
    expect_drain(q, "B A");
    t_check_clean(q, NULL);
    t_close(q);
}

/* Merging keeps the higher priority also below zero, and a plain add
   (priority 0) raises a negative priority to 0. */
static void prio_merge_negative(void **state)
{
    (void)state;
    wq *q = fair_q("prio-neg", 1, 1000, -1, 64);

    assert_int_equal(t_add_prio(q, KS("n"), -5), 0);
    assert_int_equal(t_add_prio(q, KS("m"), -3), 0);
    assert_int_equal(t_add_prio(q, KS("n"), -2), 1);
    assert_int_equal(info_of(q, "n").priority, -2);   /* higher of -5, -2 */
    assert_int_equal(t_add_prio(q, KS("p"), -5), 0);
    add_ok(q, "p", 1);                                /* priority 0 */
    assert_int_equal(info_of(q, "p").priority, 0);
    expect_drain(q, "p n m");
    t_check_clean(q, NULL);
    t_close(q);
}

/* Default mode: priority is refused, everything else of wq_add_opts works;
   fair-only options are refused. */
static void prio_default_mode(void **state)
{
    (void)state;
    T_SHM_ONLY("the fake clock");
    wq *q = fair_q("prio-default", 0, 0, 0, 64);

    assert_int_equal(t_add_prio(q, KS("a"), 3), -EINVAL);
    assert_int_equal(t_add_prio(q, KS("a"), -1), -EINVAL);
    assert_int_equal(t_add_prio(q, KS("a"), 0), 0);
    assert_int_equal(t_add_prio(q, KS("a"), 0), 1);
    assert_int_equal(wq_add_opts(q, KS("b"), NULL), 0);
    assert_int_equal(addx(q, "w", 0, 10 * MS, false), 0);
    assert_int_equal(info_of(q, "w").state, WQ_KEY_WAITING);
    assert_int_equal(info_of(q, "w").ready_ns, T0 + 10 * MS);
    assert_int_equal(info_of(q, "a").priority, 0);
    assert_int_equal(wq_len(q), 2);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.fair, 0);
    t_clock_step(10 * MS);
    expect_drain(q, "a b w");
    t_check_clean(q, NULL);
    t_close(q);

    /* fair_share / tenant_sep without WQ_FAIR */
    struct wq_options o = { .flags = WQ_CREATE, .fair_share = 4 };
    wq *x = NULL;
    assert_int_equal(wq_open(t_qname("bad-fs"), &o, &x), -EINVAL);
    o.fair_share = 0;
    o.tenant_sep = ':';
    assert_int_equal(wq_open(t_qname("bad-ts"), &o, &x), -EINVAL);
    o.tenant_sep = -1;
    assert_int_equal(wq_open(t_qname("bad-ts2"), &o, &x), -EINVAL);
    assert_null(x);
}

/* Invalid arguments of wq_add_opts on a fair queue. */
static void prio_bad_args(void **state)
{
    (void)state;
    wq *q = fair_q("prio-args", 1, 1000, -1, 64);
    struct wq_add_opts o = { .priority = 1 };
    char big[T_KEYBUF + 2];

    memset(big, 'k', sizeof big);
    assert_int_equal(wq_add_opts(NULL, KS("a"), &o), -EINVAL);
    assert_int_equal(wq_add_opts(q, NULL, 1, &o), -EINVAL);
    assert_int_equal(wq_add_opts(q, "a", 0, &o), -EINVAL);
    assert_int_equal(wq_add_opts(q, big, sizeof big, &o), -EMSGSIZE);
    struct wq_add_opts r = { .priority = 1, .reserved = { 0, 0, 0, 1 } };
    assert_int_equal(wq_add_opts(q, KS("a"), &r), -EINVAL);
    assert_int_equal(t_stats(q).live, 0);
    assert_int_equal(wq_shutdown(q), 0);
    assert_int_equal(wq_add_opts(q, KS("a"), &o), -ESHUTDOWN);
    t_check_clean(q, NULL);
    t_close(q);
}

/* after_ns with a priority: waits, then is handed out with its priority
   ahead of lower priority keys added before it. */
static void prio_after(void **state)
{
    (void)state;
    T_SHM_ONLY("the fake clock");
    wq *q = fair_q("prio-after", 1, 1000, -1, 64);

    assert_int_equal(addx(q, "hi", 5, 10 * MS, false), 0);
    struct wq_key_info ki = info_of(q, "hi");
    assert_int_equal(ki.state, WQ_KEY_WAITING);
    assert_int_equal(ki.priority, 5);
    assert_int_equal(ki.ready_ns, T0 + 10 * MS);
    add_ok(q, "p0", 0);
    add_ok(q, "p1", 0);
    add_ok(q, "p2", 0);
    T_EXPECT_GET(q, "p0");
    t_clock_step(9 * MS);
    T_EXPECT_GET(q, "p1");
    t_clock_step(1 * MS);
    T_EXPECT_GET(q, "hi");
    T_EXPECT_GET(q, "p2");
    T_EXPECT_GET_RC(q, -EAGAIN);
    T_EXPECT_DONE(q, "p0");
    T_EXPECT_DONE(q, "p1");
    T_EXPECT_DONE(q, "p2");
    T_EXPECT_DONE(q, "hi");
    t_check_clean(q, NULL);
    t_close(q);
}

/* Re-adding a waiting key: earlier ready time and higher priority win,
   whatever the order of the adds. */
static void prio_after_merge(void **state)
{
    (void)state;
    T_SHM_ONLY("the fake clock");
    wq *q = fair_q("prio-after-merge", 1, 1000, -1, 64);

    assert_int_equal(addx(q, "w", 0, 100 * MS, false), 0);
    assert_int_equal(addx(q, "w", 0, 10 * MS, false), 1);
    assert_int_equal(info_of(q, "w").ready_ns, T0 + 10 * MS);
    assert_int_equal(addx(q, "w", 0, SEC, false), 1);
    assert_int_equal(info_of(q, "w").ready_ns, T0 + 10 * MS);

    assert_int_equal(addx(q, "v", 2, 10 * MS, false), 0);
    assert_int_equal(addx(q, "v", 7, 50 * MS, false), 1);
    struct wq_key_info ki = info_of(q, "v");
    assert_int_equal(ki.state, WQ_KEY_WAITING);
    assert_int_equal(ki.priority, 7);
    assert_int_equal(ki.ready_ns, T0 + 10 * MS);
    assert_int_equal(addx(q, "v", 1, 5 * MS, false), 1);
    ki = info_of(q, "v");
    assert_int_equal(ki.priority, 7);
    assert_int_equal(ki.ready_ns, T0 + 5 * MS);

    /* A delayed add of a queued key is merged, not delayed; its priority
       still merges. */
    add_ok(q, "q", 0);
    assert_int_equal(addx(q, "q", 4, SEC, false), 1);
    ki = info_of(q, "q");
    assert_int_equal(ki.state, WQ_KEY_QUEUED | WQ_KEY_DIRTY);
    assert_int_equal(ki.priority, 4);

    /* An undelayed add of a waiting key queues it at once. */
    assert_int_equal(addx(q, "u", 1, SEC, false), 0);
    assert_int_equal(t_add_prio(q, KS("u"), 0), 0);
    ki = info_of(q, "u");
    assert_int_equal(ki.state, WQ_KEY_QUEUED | WQ_KEY_DIRTY);
    assert_int_equal(ki.priority, 1);

    assert_int_equal(t_stats(q).waiting, 2);
    T_EXPECT_GET(q, "q");
    t_clock_step(5 * MS);
    T_EXPECT_GET(q, "v");    /* ready and 7 */
    T_EXPECT_GET(q, "u");
    T_EXPECT_GET_RC(q, -EAGAIN);
    t_clock_step(4 * MS);
    T_EXPECT_GET_RC(q, -EAGAIN); /* w is ready at +10 ms */
    t_clock_step(1 * MS);
    T_EXPECT_GET(q, "w");
    T_EXPECT_GET_RC(q, -EAGAIN);
    T_EXPECT_DONE(q, "q");
    T_EXPECT_DONE(q, "v");
    T_EXPECT_DONE(q, "u");
    T_EXPECT_DONE(q, "w");
    t_check_clean(q, NULL);
    t_close(q);
}

/* after_ns and rate_limited together: the smaller delay wins, in both
   directions; the failure count rises either way. */
static void prio_after_and_rl(void **state)
{
    (void)state;
    T_SHM_ONLY("the fake clock");
    for (int dir = 0; dir < 2; dir++) {
        struct wq_options o = { .capacity = 64, .flags = WQ_FAIR,
                                .fair_share = 1000, .tenant_sep = -1,
                                .rl_limiters = WQ_RL_EXPONENTIAL,
                                .rl_base_delay_ns = dir == 0 ? SEC : 10 * MS };
        wq *q = t_track(t_create("prio-rl", &o, NULL));
        uint64_t after = dir == 0 ? 10 * MS : SEC;

        assert_int_equal(addx(q, "r", 3, after, true), 0);
        struct wq_key_info ki = info_of(q, "r");
        assert_int_equal(ki.state, WQ_KEY_WAITING);
        assert_int_equal(ki.ready_ns, T0 + 10 * MS);
        assert_int_equal(ki.priority, 3);
        assert_int_equal(wq_num_requeues(q, KS("r")), 1);
        add_ok(q, "z", 0);
        t_clock_step(9 * MS);
        assert_int_equal(t_stats(q).waiting, 1);
        t_clock_step(1 * MS);
        T_EXPECT_GET(q, "r");        /* priority 3 before z */
        T_EXPECT_GET(q, "z");
        T_EXPECT_DONE(q, "r");
        T_EXPECT_DONE(q, "z");
        assert_int_equal(wq_forget(q, KS("r")), 0);
        t_check_clean(q, NULL);
        t_close(q);
        t_clock_at(T0);
    }
}

/* ------------------------------------------------------------------ */
/* 4. Starvation bound                                                 */
/* ------------------------------------------------------------------ */

/* Flood: every round adds two new priority-10 keys, then gets and dones
   one key. Returns the round (1-based) in which `target` was handed out,
   or 0 if it was not within max_gets. */
static int flood_until(wq *q, const char *target, int max_gets, int *next_id)
{
    char buf[T_KEYBUF + 1], k[32];

    for (int g = 1; g <= max_gets; g++) {
        for (int j = 0; j < 2; j++) {
            snprintf(k, sizeof k, "h%d", (*next_id)++);
            assert_int_equal(t_add_prio(q, KS(k), 10), 0);
        }
        int n = wq_get(q, buf, T_KEYBUF, 0);
        assert_true(n > 0);
        buf[n] = '\0';
        assert_int_equal(wq_done(q, buf, (size_t)n), 0);
        if (strcmp(buf, target) == 0)
            return g;
    }
    return 0;
}

static void starve_bound(void **state)
{
    (void)state;
    wq *q = fair_q("starve-4", 1, 4, -1, 4096);
    int id = 0;

    /* L is the oldest: r = 0, within 4 gets. */
    assert_int_equal(t_add_prio(q, KS("L"), 0), 0);
    int g = flood_until(q, "L", 4, &id);
    if (g == 0)
        fail_msg("L not handed out within 4 gets under the flood");
    print_message("  L handed out at get %d of at most 4\n", g);

    /* Several low keys: Li has i keys queued before it (the flood keys
       queued now are younger), so it comes out within 4 * (i + 1) gets
       counted from the moment they were added. */
    char buf[T_KEYBUF + 1];
    int n;
    while ((n = wq_get(q, buf, T_KEYBUF, 0)) > 0)     /* empty the queue */
        assert_int_equal(wq_done(q, buf, (size_t)n), 0);
    for (int i = 0; i < 5; i++) {
        char k[8];
        snprintf(k, sizeof k, "L%d", i);
        assert_int_equal(t_add_prio(q, KS(k), i - 3), 0);     /* all below 10 */
    }
    int total = 0;
    for (int i = 0; i < 5; i++) {
        char k[8];
        snprintf(k, sizeof k, "L%d", i);
        g = flood_until(q, k, 4 * (i + 1) - total, &id);
        if (g == 0)
            fail_msg("%s not handed out within %d gets", k, 4 * (i + 1));
        total += g;
    }
    t_check_clean(q, NULL);
    t_close(q);
}

/* The default fair_share is 8. */
static void starve_default_share(void **state)
{
    (void)state;
    wq *q = fair_q("starve-8", 1, 0, -1, 4096);
    int id = 0;

    assert_int_equal(t_add_prio(q, KS("L"), -5), 0);
    int g = flood_until(q, "L", 8, &id);
    if (g == 0)
        fail_msg("L not handed out within 8 gets (default fair_share)");
    t_check_clean(q, NULL);
    t_close(q);
}

/* fair_share = 1000: L waits as long as the flood keeps ahead. */
static void starve_large_share(void **state)
{
    (void)state;
    wq *q = fair_q("starve-1000", 1, 1000, -1, 4096);
    int id = 0;

    assert_int_equal(t_add_prio(q, KS("L"), 0), 0);
    assert_int_equal(flood_until(q, "L", 100, &id), 0);
    assert_int_equal(info_of(q, "L").state, WQ_KEY_QUEUED | WQ_KEY_DIRTY);
    t_check_clean(q, NULL);
    t_close(q);
}

/* The oldest-key rule also serves a key that was re-added while
   processing, by the age of its re-add. */
static void starve_readd(void **state)
{
    (void)state;
    wq *q = fair_q("starve-readd", 1, 4, -1, 4096);
    int id = 0;

    assert_int_equal(t_add_prio(q, KS("L"), 0), 0);
    T_EXPECT_GET(q, "L");
    assert_int_equal(t_add_prio(q, KS("L"), 0), 0);   /* the oldest add once done */
    T_EXPECT_DONE(q, "L");
    int g = flood_until(q, "L", 4, &id);
    if (g == 0)
        fail_msg("re-added L not handed out within 4 gets");
    t_check_clean(q, NULL);
    t_close(q);
}

/* ------------------------------------------------------------------ */
/* 5. Tenants                                                          */
/* ------------------------------------------------------------------ */

#define FLOOD 100000

/* Adds "a/<i>" for i in [0, n) with wq_add_many in batches of 1000. */
static void add_tenant_flood(wq *q, const char *tenant, int n)
{
    static char keys[1000][24];
    struct iovec v[1000];

    for (int base = 0; base < n; base += 1000) {
        int m = n - base < 1000 ? n - base : 1000;
        for (int i = 0; i < m; i++) {
            int l = snprintf(keys[i], sizeof keys[i], "%s/%d", tenant, base + i);
            v[i].iov_base = keys[i];
            v[i].iov_len = (size_t)l;
        }
        assert_int_equal(wq_add_many(q, v, (size_t)m), 0);
    }
}

/* Gets (and dones) until `target`; returns the 1-based get count, 0 if not
   within max. */
static int gets_until(wq *q, const char *target, int max)
{
    char buf[T_KEYBUF + 1];

    for (int g = 1; g <= max; g++) {
        int n = wq_get(q, buf, T_KEYBUF, 0);
        if (n < 0)
            fail_msg("wq_get = %d (%s) at get %d looking for %s", n,
                     wq_strerror(n), g, target);
        buf[n] = '\0';
        assert_int_equal(wq_done(q, buf, (size_t)n), 0);
        if (strcmp(buf, target) == 0)
            return g;
    }
    return 0;
}

static void tenant_flood(void **state)
{
    (void)state;
    wq *q = fair_q("tenant-flood", 1, 1000, 0, FLOOD + 1024);
    struct iovec v = { (void *)"b/x", 3 };

    add_tenant_flood(q, "a", FLOOD);
    assert_int_equal(wq_add_many(q, &v, 1), 0);
    int g = gets_until(q, "b/x", 2);
    if (g == 0)
        fail_msg("b/x not handed out within 2 gets behind %d keys of a/",
                 FLOOD);

    /* Half of a/ later, a new tenant is again served at once ... */
    for (int i = 0; i < FLOOD / 2; i++) {
        char buf[T_KEYBUF];
        int n = wq_get(q, buf, T_KEYBUF, 0);
        assert_true(n > 0);
        assert_int_equal(wq_done(q, buf, (size_t)n), 0);
    }
    add_ok(q, "c/y", 0);
    if (gets_until(q, "c/y", 2) == 0)
        fail_msg("c/y not handed out within 2 gets");

    /* ... and a tenant that was idle while a/ was served gets no credit
       for it: its 5 keys alternate with a/'s, never two in a row. */
    for (int i = 0; i < 5; i++) {
        char k[8];
        snprintf(k, sizeof k, "b/%d", i);
        add_ok(q, k, 0);
    }
    char buf[T_KEYBUF + 1], order[256] = "";
    int bs = 0, prev_b = 0, adjacent = 0;
    size_t used = 0;
    for (int i = 0; i < 11 && bs < 5; i++) {
        int n = wq_get(q, buf, T_KEYBUF, 0);
        assert_true(n > 0);
        buf[n] = '\0';
        assert_int_equal(wq_done(q, buf, (size_t)n), 0);
        int is_b = buf[0] == 'b';
        used += (size_t)snprintf(order + used, sizeof order - used, "%s%s",
                                 used ? " " : "", buf);
        if (is_b && prev_b)
            adjacent = 1;
        bs += is_b;
        prev_b = is_b;
    }
    if (bs != 5 || adjacent)
        fail_msg("after an idle spell, b/ got: %s", order);
    t_check_clean(q, NULL);
    t_close(q);
}

/* Tenant round-robin off: b/x waits behind all of a/. */
static void tenant_off_flood(void **state)
{
    (void)state;
    wq *q = fair_q("tenant-off", 1, 1000, -1, FLOOD + 1024);

    add_tenant_flood(q, "a", FLOOD);
    add_ok(q, "b/x", 0);
    assert_int_equal(gets_until(q, "b/x", 1000), 0);
    assert_int_equal(info_of(q, "b/x").state, WQ_KEY_QUEUED | WQ_KEY_DIRTY);
    t_check_clean(q, NULL);
    t_close(q);
}

/* Start-time fair queueing tags: three tenants with three keys each, all
   added before the first get, interleave a b c a b c a b c. */
static void tenant_three(void **state)
{
    (void)state;
    static const char *const order[] = { "a/1", "a/2", "a/3", "b/1", "b/2",
                                         "b/3", "c/1", "c/2", "c/3" };
    /* Added tenant after tenant, and interleaved the other way round. */
    for (int variant = 0; variant < 2; variant++) {
        wq *q = fair_q("tenant-three", 1, 1000, 0, 4096);
        for (int i = 0; i < 9; i++) {
            int j = variant == 0 ? i : (i % 3) * 3 + (i / 3);
            add_ok(q, order[j], 0);
        }
        expect_dump(q, "a/1 b/1 c/1 a/2 b/2 c/2 a/3 b/3 c/3");
        expect_drain(q, "a/1 b/1 c/1 a/2 b/2 c/2 a/3 b/3 c/3");
        t_check_clean(q, NULL);
        t_close(q);
    }
}

/* Checks that `got` (space separated) alternates tenants in its first n
   keys (tenant: the first byte) and keeps add order inside each tenant
   (keys of one tenant end in increasing digits). */
static void expect_turns(const char *got, int n)
{
    char copy[512], *save = NULL, prev_t = 0;
    int last[256];
    int i = 0;

    memset(last, -1, sizeof last);
    snprintf(copy, sizeof copy, "%s", got);
    for (char *k = strtok_r(copy, " ", &save); k && i < n;
         k = strtok_r(NULL, " ", &save), i++) {
        unsigned char t = (unsigned char)k[0];
        int d = atoi(k + strlen(k) - 1);
        if (i > 0 && (char)t == prev_t)
            fail_msg("tenants do not take turns in \"%s\" (key %d)", got, i);
        if (d <= last[t])
            fail_msg("add order inside tenant %c broken in \"%s\"", t, got);
        last[t] = d;
        prev_t = (char)t;
    }
}

/* Tenants and priorities: priority first, tenants take turns inside a
   priority. */
static void tenant_with_priority(void **state)
{
    (void)state;
    wq *q = fair_q("tenant-prio", 1, 1000, 0, 4096);
    char got[256];

    assert_int_equal(t_add_prio(q, KS("a/1"), 0), 0);
    assert_int_equal(t_add_prio(q, KS("a/2"), 0), 0);
    assert_int_equal(t_add_prio(q, KS("a/3"), 5), 0);
    assert_int_equal(t_add_prio(q, KS("a/4"), 5), 0);
    assert_int_equal(t_add_prio(q, KS("b/1"), 0), 0);
    assert_int_equal(t_add_prio(q, KS("b/2"), 5), 0);
    assert_int_equal(t_add_prio(q, KS("b/3"), 5), 0);
    drain_order(q, got, sizeof got);
    print_message("  order: %s\n", got);
    /* priority 5 first: a/3 a/4 b/2 b/3 in turns; then a/1 a/2 b/1 */
    expect_turns(got, 4);
    expect_turns(got + 16, 3);
    if (strncmp(got, "a/3 b/2 a/4 b/3 ", 16) != 0 &&
        strncmp(got, "b/2 a/3 b/3 a/4 ", 16) != 0)
        fail_msg("priority 5 keys not first, in turns: \"%s\"", got);
    if (strcmp(got + 16, "a/1 b/1 a/2") != 0)
        fail_msg("priority 0 keys: \"%s\", expected \"a/1 b/1 a/2\" last",
                 got);
    t_check_clean(q, NULL);
    t_close(q);
}

/* Turns are taken among keys of one priority: a tenant with many low
   priority keys queued is not pushed back among high priority keys by
   them (wq.h rule 3: "among keys of one priority, tenants take turns").
   Start tags kept per tenant across priorities would give b b a a. */
static void tenant_turns_per_priority(void **state)
{
    (void)state;
    wq *q = fair_q("tenant-prio2", 1, 1000, 0, 4096);
    char got[512];

    for (int i = 0; i < 10; i++) {
        char k[8];
        snprintf(k, sizeof k, "a/%d", i);
        assert_int_equal(t_add_prio(q, KS(k), 0), 0);
    }
    assert_int_equal(t_add_prio(q, KS("a/x"), 5), 0);
    assert_int_equal(t_add_prio(q, KS("a/y"), 5), 0);
    assert_int_equal(t_add_prio(q, KS("b/x"), 5), 0);
    assert_int_equal(t_add_prio(q, KS("b/y"), 5), 0);
    drain_order(q, got, sizeof got);
    print_message("  order: %s\n", got);
    if (strncmp(got, "a/x b/x a/y b/y ", 16) != 0)
        fail_msg("priority 5: \"%.15s\", expected \"a/x b/x a/y b/y\"", got);
    if (strncmp(got + 16, "a/0 a/1 a/2 ", 12) != 0)
        fail_msg("then a/0 .. a/9 in add order: \"%s\"", got);
    t_check_clean(q, NULL);
    t_close(q);
}

/* A key without the separator is a tenant of its own (the whole key:
   tenant_len == len); a key that starts with it is in tenant "". So
   x1 x2 x3 are three tenants, each with its first key, and they are all
   served before a/'s second key. */
static void tenant_no_separator(void **state)
{
    (void)state;
    wq *q = fair_q("tenant-nosep", 1, 1000, 0, 4096);

    add_ok(q, "x1", 0);
    add_ok(q, "x2", 0);
    add_ok(q, "x3", 0);
    add_ok(q, "a/1", 0);
    add_ok(q, "a/2", 0);
    add_ok(q, "a/3", 0);
    add_ok(q, "/z", 0);          /* empty tenant part */
    add_ok(q, "/y", 0);
    assert_int_equal(info_of(q, "x1").tenant_len, 2);
    assert_int_equal(info_of(q, "x2").tenant_len, 2);
    expect_drain(q, "x1 x2 x3 a/1 /z a/2 /y a/3");
    t_check_clean(q, NULL);
    t_close(q);
}

/* Another separator, and only the first one counts. */
static void tenant_custom_sep(void **state)
{
    (void)state;
    wq *q = fair_q("tenant-colon", 1, 1000, ':', 4096);

    add_ok(q, "ns:a:1", 0);
    add_ok(q, "ns:a:2", 0);
    add_ok(q, "ns:b:1", 0);
    add_ok(q, "ot:x", 0);
    expect_drain(q, "ns:a:1 ot:x ns:a:2 ns:b:1");
    t_check_clean(q, NULL);
    t_close(q);
}

/* wq_dump's tenant_len: "the part of the key before the first tenant_sep
   is its tenant" (wq.h rule 3), so "a/1" names tenant "a" (1 byte), "/z"
   the empty tenant, "ns:a:1" with ':' the tenant "ns"; a key without the
   separator is its own tenant (the whole key). */
static void tenant_len_dump(void **state)
{
    (void)state;
    wq *q = fair_q("tenant-len", 1, 1000, 0, 64);
    add_ok(q, "a/1", 0);
    add_ok(q, "/z", 0);
    add_ok(q, "x1", 0);
    add_ok(q, "ns/a/b", 0);
    assert_int_equal(info_of(q, "x1").tenant_len, 2);
    assert_int_equal(info_of(q, "a/1").tenant_len, 1);
    assert_int_equal(info_of(q, "/z").tenant_len, 0);
    assert_int_equal(info_of(q, "ns/a/b").tenant_len, 2);
    expect_drain(q, "a/1 /z x1 ns/a/b");
    t_check_clean(q, NULL);
    t_close(q);

    q = fair_q("tenant-len-colon", 1, 1000, ':', 64);
    add_ok(q, "ns:a:1", 0);
    add_ok(q, "ns/x", 0);
    assert_int_equal(info_of(q, "ns:a:1").tenant_len, 2);
    assert_int_equal(info_of(q, "ns/x").tenant_len, 4);
    expect_drain(q, "ns:a:1 ns/x");
    t_check_clean(q, NULL);
    t_close(q);
}

/* A tenant's backlog does not delay another tenant's single key after a
   high priority key of the backlogged tenant was handed out (wq.h rule 3:
   "a tenant that adds 100,000 keys does not delay another tenant's single
   key behind them"). */
static void tenant_flood_after_priority(void **state)
{
    (void)state;
    wq *q = fair_q("tenant-flood-prio", 1, 1000, 0, FLOOD + 1024);

    add_tenant_flood(q, "a", FLOOD);
    assert_int_equal(t_add_prio(q, KS("a/hi"), 10), 0);
    T_EXPECT_GET(q, "a/hi");
    T_EXPECT_DONE(q, "a/hi");
    add_ok(q, "b/x", 0);
    int g = gets_until(q, "b/x", 2);
    if (g == 0) {
        int more = gets_until(q, "b/x", FLOOD + 1);
        fail_msg("b/x not handed out within 2 gets after a/hi: it was "
                 "handed out at get %d after a/hi", 2 + more);
    }
    t_check_clean(q, NULL);
    t_close(q);
}

/* ------------------------------------------------------------------ */
/* 6. Stats                                                            */
/* ------------------------------------------------------------------ */

static void stats_fair(void **state)
{
    (void)state;
    T_SHM_ONLY("the fake clock");
    wq *q = fair_q("stats-fair", 1, 1000, 0, 4096);

    struct wq_stats s = t_stats(q);
    assert_int_equal(s.fair, 1);
    add_ok(q, "a/1", 0);
    add_ok(q, "a/2", 0);
    add_ok(q, "b/1", 0);
    add_ok(q, "c/1", 0);
    T_EXPECT_GET(q, "a/1");
    T_EXPECT_GET(q, "b/1");
    T_EXPECT_GET(q, "c/1");
    T_EXPECT_GET(q, "a/2");
    add_ok(q, "b/1", 0);                           /* re-added */
    assert_int_equal(addx(q, "d/1", 0, SEC, false), 0);   /* waiting */
    s = t_stats(q);
    assert_int_equal(s.queued, 0);
    assert_int_equal(s.processing, 4);
    assert_int_equal(s.waiting, 1);
    assert_int_equal(s.live, 5);
    T_EXPECT_DONE(q, "a/1");
    T_EXPECT_DONE(q, "a/2");
    T_EXPECT_DONE(q, "c/1");
    T_EXPECT_DONE(q, "b/1");
    t_clock_step(SEC);
    s = t_stats(q);
    assert_int_equal(s.queued, 2);                 /* b/1 and d/1 */
    assert_int_equal(s.waiting, 0);
    expect_drain(q, "b/1 d/1");
    s = t_stats(q);
    assert_int_equal(s.live, 0);
    assert_int_equal(s.fair, 1);
    assert_int_equal(s.adds_total, 6);
    t_check_clean(q, NULL);
    t_close(q);
}

/* A second handle (attach only) sees the fair geometry of the region. */
static void stats_attach(void **state)
{
    (void)state;
    struct wq_options o = { .capacity = 64, .flags = WQ_FAIR,
                            .fair_share = 1000, .tenant_sep = -1 };
    wq *q = t_track(t_create("stats-attach", &o, NULL)), *q2 = NULL;
    const char *name = wq_name(q);

    assert_int_equal(wq_open(name, NULL, &q2), 0);
    t_track(q2);
    assert_int_equal(t_stats(q2).fair, 1);
    assert_int_equal(t_add_prio(q2, KS("lo"), 1), 0);
    assert_int_equal(t_add_prio(q2, KS("hi"), 2), 0);
    T_EXPECT_GET(q, "hi");
    T_EXPECT_DONE(q2, "hi");
    T_EXPECT_GET(q2, "lo");
    t_close(q2);              /* gives "lo" back: queued again */
    T_EXPECT_GET(q, "lo");
    T_EXPECT_DONE(q, "lo");
    t_check_clean(q, NULL);
    t_close(q);
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        T_CLOCK_TEST(fig2_default),
        T_CLOCK_TEST(fig2_fair),
        T_CLOCK_TEST(fig2_default_twice),
        T_CLOCK_TEST(fig2_fair_twice),
        T_CLOCK_TEST(fig2_twice_adjacent),
        T_CLOCK_TEST(fig2_done_get),
        T_CLOCK_TEST(fig2_fair_share_1),
        T_CLOCK_TEST(readd_interleaved),
        T_CLOCK_TEST(readd_done_reversed),
        T_CLOCK_TEST(readd_get_between),
        T_CLOCK_TEST(readd_then_queued_add),
        T_CLOCK_TEST(readd_chain),
        T_CLOCK_TEST(readd_finish_and_rerun),
        T_CLOCK_TEST(readd_add_many),
        T_CLOCK_TEST(prio_merge),
        T_CLOCK_TEST(prio_order),
        T_CLOCK_TEST(prio_raise_moves),
        T_CLOCK_TEST(prio_readd_while_processing),
        T_CLOCK_TEST(prio_readd_new_priority),
        T_CLOCK_TEST(prio_merge_negative),
        T_CLOCK_TEST(prio_default_mode),
        T_CLOCK_TEST(prio_bad_args),
        T_CLOCK_TEST(prio_after),
        T_CLOCK_TEST(prio_after_merge),
        T_CLOCK_TEST(prio_after_and_rl),
        T_CLOCK_TEST(starve_bound),
        T_CLOCK_TEST(starve_default_share),
        T_CLOCK_TEST(starve_large_share),
        T_CLOCK_TEST(starve_readd),
        T_CLOCK_TEST(tenant_flood),
        T_CLOCK_TEST(tenant_off_flood),
        T_CLOCK_TEST(tenant_three),
        T_CLOCK_TEST(tenant_with_priority),
        T_CLOCK_TEST(tenant_turns_per_priority),
        T_CLOCK_TEST(tenant_no_separator),
        T_CLOCK_TEST(tenant_custom_sep),
        T_CLOCK_TEST(tenant_len_dump),
        T_CLOCK_TEST(tenant_flood_after_priority),
        T_CLOCK_TEST(stats_fair),
        T_CLOCK_TEST(stats_attach),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("fair", tests);
}
