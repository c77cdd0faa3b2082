/*
 * test-store-restore.c - the LMDB store (wq_options.store_path): what a
 * new region is rebuilt from. Single process unless stated.
 *
 *   - restore after wq_unlink, for each durability (PROCESS, FSYNC, and
 *     NONE with wq_snapshot): queued keys in first-add order, processing
 *     keys back queued (processed once more), a waiting key with its
 *     remaining delay, failure counts, results; a clean done key never
 *     comes back; removals are stored too (second restore);
 *   - geometry taken from the store when the options leave it 0;
 *   - no double restore: an attacher with WQ_CREATE and the same store,
 *     and a reopen without wq_unlink, keep the region as it is.
 *
 * Store directories live under one mkdtemp directory in /tmp. main()
 * runs the cmocka group in a child and removes that directory (and any
 * /dev/shm object of the child) whatever happened to the child, so a
 * crash or a watchdog exit leaves nothing behind (t_guard_main).
 * (What reaches the store when: test-store-durability.c; stores that
 * cannot be used: test-store-errors.c.)
 */
#include "t.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lmdb.h>

#include "store/format.h"

/* ------------------------------------------------------------------ */
/* Restore after wq_unlink                                             */
/* ------------------------------------------------------------------ */

static void restore_round(int durability)
{
    char ctx[64];
    snprintf(ctx, sizeof ctx, "restore/%s", t_durability_name(durability));
    const char *store = t_mkstore();
    const char *name = t_qname("restore");
    struct wq_options o = t_store_opts(store, durability);
    wq *q = t_track(T_OPEN(name, &o));
    char k[16];
    struct wq_stats s;

    s = t_stats(q);
    assert_int_equal(s.has_store, 1);
    assert_int_equal(s.durability, (uint64_t)durability);

    for (char c = 'a'; c <= 'z'; c++) {
        snprintf(k, sizeof k, "key-%c", c);
        assert_int_equal(wq_add(q, KS(k)), 0);
    }
    T_EXPECT_GET(q, "key-a"); /* processing at the end */
    T_EXPECT_GET(q, "key-b");
    T_EXPECT_GET(q, "key-c");
    assert_int_equal(wq_finish(q, KS("key-c"), 3, "bad"), 0); /* idle, result */
    T_EXPECT_GET(q, "key-d");
    assert_int_equal(wq_done(q, KS("key-d")), 0);              /* clean: gone */
    assert_int_equal(wq_add_after(q, KS("wait-1h"), HOUR), 0); /* waiting 1 h */
    assert_int_equal(wq_add_rate_limited(q, KS("rl-2h")), 0);  /* waiting 2 h, 1 failure */
    assert_int_equal(wq_add_rate_limited(q, KS("key-e")), 1);  /* queued, 1 failure */
    assert_int_equal(wq_num_requeues(q, KS("key-e")), 1);
    T_EXPECT_STATS(q, 26, 22, 2, 2, ctx);

    s = t_stats(q);
    if (durability == WQ_DURABLE_NONE) {
        if (s.store_unsynced == 0)
            fail_msg("%s: store_unsynced 0 before any snapshot (interval 60 s)", ctx);
        int n = wq_snapshot(q);
        if (n <= 0)
            fail_msg("%s: wq_snapshot = %d, expected > 0", ctx, n);
        s = t_stats(q);
        if (s.store_unsynced != 0)
            fail_msg("%s: store_unsynced %" PRIu64 " after wq_snapshot", ctx,
                     s.store_unsynced);
    } else {
        printf("  %s: store_unsynced before close: %" PRIu64 "\n", ctx, s.store_unsynced);
    }

    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
    T_EXPECT_NO_SHM(name, "after wq_unlink");

    q = t_track(T_OPEN(name, &o));   /* WQ_CREATE | WQ_EXCL: a new region */
    /* What comes back, in first-add order: a, b (were processing), then
       e .. z; c is idle with its result; d is gone. */
    const char *order[24];
    static char names[24][16];
    int no = 0;
    for (char c = 'a'; c <= 'z'; c++) {
        if (c == 'c' || c == 'd')
            continue;
        snprintf(names[no], sizeof names[no], "key-%c", c);
        order[no] = names[no];
        no++;
    }
    assert_int_equal(no, 24);

    s = t_stats(q);
    /* c is idle, kept only for its result: not failing (no count). */
    if (s.live != 26 || s.queued != 24 || s.waiting != 2 || s.processing != 0 ||
        s.failing != 0 || s.idle_results != 1 || s.results != 1)
        fail_msg("%s: restored live %" PRIu64 " queued %" PRIu64 " waiting %" PRIu64
                 " processing %" PRIu64 " failing %" PRIu64 " idle_results %" PRIu64
                 " results %" PRIu64 ", expected 26 24 2 0 0 1 1", ctx, s.live, s.queued,
                 s.waiting, s.processing, s.failing, s.idle_results, s.results);
    assert_int_equal(s.has_store, 1);
    assert_int_equal(s.durability, (uint64_t)durability);
    assert_int_equal(s.capacity, 64);
    assert_int_equal(s.max_key_len, 32);
    t_check_clean(q, ctx);

    uint64_t now = t_now_ns();
    struct t_dump d = t_dump_all(q);
    if (d.n != 27) {
        for (size_t i = 0; i < d.n; i++)
            fprintf(stderr, "  dump: %s state 0x%x pos %" PRIu64 "\n", d.v[i].key,
                    d.v[i].state, d.v[i].position);
        fail_msg("%s: %zu keys restored, expected 27", ctx, d.n);
    }
    for (int i = 0; i < 24; i++) {
        const struct t_dkey *e = &d.v[i]; /* queued keys come first, in FIFO order */
        if (strcmp(e->key, order[i]) != 0 || !(e->state & WQ_KEY_QUEUED) ||
            e->position != (uint64_t)i) {
            for (size_t j = 0; j < d.n; j++)
                fprintf(stderr, "  dump: %s state 0x%x pos %" PRIu64 "\n", d.v[j].key,
                        d.v[j].state, d.v[j].position);
            fail_msg("%s: FIFO position %d holds %s (state 0x%x, pos %" PRIu64
                     "), expected %s queued", ctx, i, e->key, e->state, e->position, order[i]);
        }
        if (e->state & (WQ_KEY_PROCESSING | WQ_KEY_WAITING))
            fail_msg("%s: %s state 0x%x", ctx, e->key, e->state);
        /* a and b were requeued by wq_close (not a crash): no failure */
        if (e->failures != (strcmp(e->key, "key-e") == 0 ? 1u : 0u))
            fail_msg("%s: %s has %u failures", ctx, e->key, e->failures);
        if (t_dump_count(&d, order[i]) != 1)
            fail_msg("%s: %s appears %d times", ctx, order[i], t_dump_count(&d, order[i]));
    }
    const struct t_dkey *w = t_dump_find(&d, "wait-1h");
    if (w == NULL || w->state != WQ_KEY_WAITING || w->failures != 0)
        fail_msg("%s: wait-1h %s (state 0x%x failures %u), expected waiting", ctx,
                 w ? "present" : "absent", w ? w->state : 0, w ? w->failures : 0);
    int64_t rem = (int64_t)(w->ready - now);
    if (rem > (int64_t)HOUR || rem < (int64_t)(HOUR - 5 * SEC))
        fail_msg("%s: wait-1h ready in %.3f s, expected within [3595, 3600]", ctx,
                 (double)rem / 1e9);
    const struct t_dkey *r = t_dump_find(&d, "rl-2h");
    if (r == NULL || r->state != WQ_KEY_WAITING || r->failures != 1)
        fail_msg("%s: rl-2h %s (state 0x%x failures %u), expected waiting, 1 failure",
                 ctx, r ? "present" : "absent", r ? r->state : 0, r ? r->failures : 0);
    rem = (int64_t)(r->ready - now);
    if (rem > (int64_t)(2 * HOUR) || rem < (int64_t)(2 * HOUR - 5 * SEC))
        fail_msg("%s: rl-2h ready in %.3f s, expected within [7195, 7200]", ctx,
                 (double)rem / 1e9);
    const struct t_dkey *c = t_dump_find(&d, "key-c");
    if (c == NULL || c->state != WQ_KEY_FAILING || c->result != WQ_STATE_FAILED ||
        c->code != 3 || strcmp(c->message, "bad") != 0)
        fail_msg("%s: key-c %s (state 0x%x result %d code %d msg '%s'), expected "
                 "idle FAILED 3 'bad'", ctx, c ? "present" : "absent", c ? c->state : 0,
                 c ? (int)c->result : -1, c ? c->code : 0, c ? c->message : "");
    if (t_dump_count(&d, "key-d") != 0)
        fail_msg("%s: key-d (done clean) came back", ctx);
    t_dump_free(&d);

    struct wq_result res;
    assert_int_equal(wq_result(q, KS("key-c"), &res), 0);
    assert_int_equal(res.state, WQ_STATE_FAILED);
    assert_int_equal(res.code, 3);
    assert_string_equal(res.message, "bad");
    assert_true(res.updated_ns > 0);
    assert_int_equal(wq_result(q, KS("key-d"), &res), 0);
    assert_int_equal(res.state, WQ_STATE_NONE);
    assert_int_equal(wq_result(q, KS("key-a"), &res), 0);
    assert_int_equal(res.state, WQ_STATE_PENDING);
    assert_int_equal(wq_num_requeues(q, KS("key-e")), 1);
    assert_int_equal(wq_num_requeues(q, KS("rl-2h")), 1);
    assert_int_equal(wq_num_requeues(q, KS("wait-1h")), 0);
    assert_int_equal(wq_num_requeues(q, KS("key-c")), 0);

    /* Every queued key is processed once more, in order, then nothing. */
    for (int i = 0; i < 24; i++) {
        T_EXPECT_GET(q, order[i]);
        assert_int_equal(wq_done(q, KS(order[i])), 0);
    }
    char buf[T_KEYBUF];
    assert_int_equal(wq_get(q, buf, sizeof buf, 0), -EAGAIN);
    s = t_stats(q);
    /* key-e keeps its failure count (failing), key-c its result (an idle
       result, not failing) */
    if (s.live != 2 || s.waiting != 2 || s.failing != 1 || s.idle_results != 1)
        fail_msg("%s: after the drain live %" PRIu64 " waiting %" PRIu64 " failing %"
                 PRIu64 " idle_results %" PRIu64 ", expected 2 2 1 1", ctx, s.live,
                 s.waiting, s.failing, s.idle_results);

    /* The removals reached the store: a second restore brings back only
       the two waiting keys and the two idle ones. */
    if (durability == WQ_DURABLE_NONE) {
        int n = wq_snapshot(q);
        if (n <= 0)
            fail_msg("%s: second wq_snapshot = %d, expected > 0 (22 removals)", ctx, n);
    }
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
    q = t_track(T_OPEN(name, &o));
    s = t_stats(q);
    if (s.live != 2 || s.waiting != 2 || s.queued != 0 || s.failing != 1 ||
        s.idle_results != 1 || s.results != 1)
        fail_msg("%s: second restore live %" PRIu64 " waiting %" PRIu64 " queued %" PRIu64
                 " failing %" PRIu64 " idle_results %" PRIu64 " results %" PRIu64
                 ", expected 2 2 0 1 1 1", ctx, s.live, s.waiting, s.queued, s.failing,
                 s.idle_results, s.results);
    d = t_dump_all(q);
    assert_int_equal(d.n, 4);
    assert_int_equal(t_dump_count(&d, "wait-1h") + t_dump_count(&d, "rl-2h") +
                     t_dump_count(&d, "key-c") + t_dump_count(&d, "key-e"), 4);
    t_dump_free(&d);
    assert_int_equal(wq_num_requeues(q, KS("key-e")), 1);
    t_check_clean(q, ctx);
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
}

static void test_restore_process(void **state)
{
    (void)state;
    restore_round(WQ_DURABLE_PROCESS);
}

static void test_restore_fsync(void **state)
{
    (void)state;
    restore_round(WQ_DURABLE_FSYNC);
}

static void test_restore_none(void **state)
{
    (void)state;
    restore_round(WQ_DURABLE_NONE);
}

/* ------------------------------------------------------------------ */
/* Geometry from the store                                             */
/* ------------------------------------------------------------------ */

static void test_geometry_from_store(void **state)
{
    (void)state;
    const char *store = t_mkstore();
    const char *name = t_qname("geom");
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.capacity = 100;
    o.max_key_len = 40;
    o.store_path = store;
    o.flags = WQ_CREATE | WQ_EXCL;
    wq *q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_add(q, KS("g1")), 0);
    assert_int_equal(wq_add(q, KS("g2")), 0);
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);

    struct wq_options z;
    memset(&z, 0, sizeof z);
    z.store_path = store;
    z.flags = WQ_CREATE | WQ_EXCL;
    q = t_track(T_OPEN(name, &z));
    struct wq_stats s;
    s = t_stats(q);
    if (s.capacity != 100 || s.max_key_len != 40)
        fail_msg("restored with capacity %" PRIu64 " max_key_len %" PRIu64
                 ", expected the store's 100 and 40", s.capacity, s.max_key_len);
    assert_int_equal(s.queued, 2);
    /* A 40-byte key fits, a 41-byte one does not. */
    char k[48];
    memset(k, 'x', sizeof k);
    assert_int_equal(wq_add(q, k, 40), 0);
    assert_int_equal(wq_add(q, k, 41), -EMSGSIZE);
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);

    /* A field given in the options wins; the ones left 0 come from the
       store. */
    z.capacity = 200;
    q = t_track(T_OPEN(name, &z));
    s = t_stats(q);
    if (s.capacity != 200 || s.max_key_len != 40)
        fail_msg("restored with capacity %" PRIu64 " max_key_len %" PRIu64
                 ", expected 200 (options) and 40 (store)", s.capacity, s.max_key_len);
    assert_int_equal(s.queued, 3);
    t_close(q);
}

/* ------------------------------------------------------------------ */
/* No double restore                                                   */
/* ------------------------------------------------------------------ */

static int attach_child(const char *name, const char *store)
{
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.capacity = 64;
    o.max_key_len = 32;
    o.store_path = store;
    o.flags = WQ_CREATE;
    wq *q = NULL;
    int rc = wq_open(name, &o, &q);
    T_CHECK_EQ(rc, 0);
    struct wq_stats s;
    T_CHECK_EQ(wq_stats(q, &s), 0);
    T_CHECK_EQ(s.queued, 9);
    T_CHECK_EQ(s.processing, 1);
    T_CHECK_EQ(s.live, 10);
    T_CHECK_EQ(s.adds_total, 10);
    struct t_dump d = { 0 };
    T_CHECK_EQ(t_dump_collect(q, &d), 0);
    T_CHECK_EQ(d.n, 10);
    for (int i = 0; i < 10; i++) {
        char k[8];
        snprintf(k, sizeof k, "k%d", i);
        T_CHECK_EQ(t_dump_count(&d, k), 1);
    }
    t_dump_free(&d);
    wq_close(q);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Restore order whatever the add orders' span                         */
/* ------------------------------------------------------------------ */

/* Adds k0 .. k<n-1>, removes every key but those in keep[] (and k<readd>
   when >= 0, which is then added again: a later add order), restores,
   and expects exactly want[] in that order. A restore places records by
   their add order directly when the orders are dense, leaving holes for
   orders no longer used, and sorts them when the span is wide. */
static void order_round(const char *ctx, int n, const int *keep, int nkeep, int readd,
                        const int *want, int nwant)
{
    const char *store = t_mkstore();
    const char *name = t_qname("order");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_PROCESS);
    o.capacity = 4096;
    wq *q = t_track(T_OPEN(name, &o));
    char k[16], *kept = calloc((size_t)n, 1);
    assert_non_null(kept);
    for (int i = 0; i < nkeep; i++)
        kept[keep[i]] = 1;
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof k, "k%d", i);
        assert_int_equal(wq_add(q, KS(k)), 0);
    }
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof k, "k%d", i);
        if (!kept[i])
            assert_int_equal(wq_remove(q, KS(k)), 0);
    }
    free(kept);
    if (readd >= 0) {
        snprintf(k, sizeof k, "k%d", readd);
        assert_int_equal(wq_add(q, KS(k)), 0);
    }
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
    q = t_track(T_OPEN(name, &o));
    struct wq_stats st = t_stats(q);
    if (st.restored != (uint64_t)nwant || st.queued != (uint64_t)nwant)
        fail_msg("%s: restored %" PRIu64 " queued %" PRIu64 ", expected %d", ctx,
                 st.restored, st.queued, nwant);
    for (int i = 0; i < nwant; i++) {
        snprintf(k, sizeof k, "k%d", want[i]);
        T_EXPECT_GET(q, k);
        assert_int_equal(wq_done(q, KS(k)), 0);
    }
    char buf[T_KEYBUF];
    assert_int_equal(wq_get(q, buf, sizeof buf, 0), -EAGAIN);
    t_check_clean(q, ctx);
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
}

static void test_restore_order_spans(void **state)
{
    (void)state;
    /* Dense, with holes: every third key of the first 150 removed, then
       runs of 20 (longer than the restore's look-ahead). */
    int keep[300], nk = 0;
    for (int i = 0; i < 300; i++)
        if (i < 150 ? i % 3 != 1 : (i - 150) / 20 % 2 == 0)
            keep[nk++] = i;
    order_round("holes", 300, keep, nk, -1, keep, nk);
    /* Fewer records than the look-ahead, with holes. */
    const int some[] = { 1, 4, 5, 9, 11 };
    order_round("few", 12, some, 5, -1, some, 5);
    /* Wide: 6 keys left of 3000 (a span of 3000 orders for 6 records),
       k0 removed and added again, so it comes last. */
    const int few[] = { 500, 1200, 1201, 2500, 2999 };
    const int want[] = { 500, 1200, 1201, 2500, 2999, 0 };
    order_round("wide", 3000, few, 5, 0, want, 6);
}

/* ------------------------------------------------------------------ */
/* The two ways a restore visits the records                           */
/* ------------------------------------------------------------------ */

/* A queue of 300 keys in 6 tenants, every fifth removed, every seventh
   with a priority (fair), two waiting an hour, and one rate limited (a
   failure, waiting a few ms, so queued again by the restore). Before
   them, "res" was handed out and finished (with_result: kept idle with
   its result; else done and gone). Restored, the queue is drained into
   seq (the count returned); the waiting keys' delays are checked. */
static int restore_drain(bool fair, bool with_result, char (*seq)[16], int cap)
{
    const char *store = t_mkstore();
    const char *name = t_qname(fair ? "visitf" : "visit");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_PROCESS);
    o.capacity = 1024;
    o.flags |= fair ? WQ_FAIR : 0;
    o.rl_base_delay_ns = 5 * MS;   /* t_store_opts gives 2 hours */
    wq *q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_add(q, KS("res")), 0);
    T_EXPECT_GET(q, "res");
    assert_int_equal(with_result ? wq_finish(q, KS("res"), 0, "kept") : wq_done(q, KS("res")),
                     0);
    char k[16];
    for (int i = 0; i < 300; i++) {
        snprintf(k, sizeof k, "t%d/k%d", i % 6, i);
        assert_int_equal(fair ? t_add_prio(q, KS(k), i % 7 == 0 ? 5 : 0) : wq_add(q, KS(k)),
                         0);
        if (i == 100)
            assert_int_equal(wq_add_after(q, KS("wait-a"), 3600 * SEC), 0);
        if (i == 200) {
            assert_int_equal(wq_add_rate_limited(q, KS("rl")), 0);
            assert_int_equal(wq_add_after(q, KS("wait-b"), 3600 * SEC), 0);
        }
    }
    for (int i = 0; i < 300; i += 5) {
        snprintf(k, sizeof k, "t%d/k%d", i % 6, i);
        assert_int_equal(wq_remove(q, KS(k)), 0);
    }
    t_sleep_ms(50);   /* rl's delay runs out */
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
    q = t_track(T_OPEN(name, &o));
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.queued, 241);
    assert_int_equal(st.waiting, 2);
    assert_int_equal(st.idle_results, with_result ? 1 : 0);
    uint64_t now = t_now_ns();
    struct t_dump d = t_dump_all(q);
    for (int i = 0; i < 2; i++) {
        const struct t_dkey *w = t_dump_find(&d, i ? "wait-b" : "wait-a");
        assert_non_null(w);
        assert_int_equal(w->state, WQ_KEY_WAITING);
        assert_true(w->ready > now + 3590 * SEC && w->ready <= now + 3600 * SEC);
    }
    t_dump_free(&d);
    assert_int_equal(wq_num_requeues(q, KS("rl")), 1);
    int n = 0, len;
    char buf[T_KEYBUF];
    while ((len = wq_get(q, buf, sizeof buf, 0)) > 0) {
        assert_true(n < cap && len < 16);
        memcpy(seq[n], buf, (size_t)len);
        seq[n++][len] = 0;
        assert_int_equal(wq_done(q, buf, (size_t)len), 0);
    }
    assert_int_equal(len, -EAGAIN);
    t_check_clean(q, fair ? "fair visit" : "visit");
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
    return n;
}

/*
 * A restore visits the records where they lie in the store when nothing
 * visible depends on it (dense add orders, no results), else in first-add
 * order. Both must give the same queue: the same keys handed out in the
 * same order, in the default mode (first-add order, the rate-limited key
 * in its place) and in fair mode (priorities, tenants' turns), with the
 * waiting keys still waiting. An idle key's result makes the second way.
 */
static void test_restore_visit_orders(void **state)
{
    (void)state;
    static char a[300][16], b[300][16];
    for (int fair = 0; fair <= 1; fair++) {
        int na = restore_drain(fair, false, a, 300);
        int nb = restore_drain(fair, true, b, 300);
        assert_int_equal(na, 241);
        assert_int_equal(nb, 241);
        for (int i = 0; i < na; i++)
            if (strcmp(a[i], b[i]) != 0)
                fail_msg("%s: position %d: %s restored where they lie, %s in first-add "
                         "order", fair ? "fair" : "default", i, a[i], b[i]);
        if (fair)
            continue;
        int j = 0;   /* first-add order, explicitly */
        for (int i = 0; i < 300; i++) {
            char k[16];
            snprintf(k, sizeof k, "t%d/k%d", i % 6, i);
            if (i % 5 != 0)
                assert_string_equal(a[j++], k);
            if (i == 200)
                assert_string_equal(a[j++], "rl");
        }
    }
}

/* Queue `tag` with a store holding keys[0..3] queued, then without its
   region, the store rewritten as version 1 wrote it (no checksums: a
   restore checks no counts, and rewrites it as version 2) with key i at
   add order orders[i]. Returns the options to restore it with. */
static struct wq_options v1_store(const char *tag, const char **name,
                                  const char *const keys[4], const uint64_t orders[4])
{
    const char *store = t_mkstore();
    *name = t_qname(tag);
    struct wq_options o = t_store_opts(store, WQ_DURABLE_PROCESS);
    wq *q = t_track(T_OPEN(*name, &o));
    for (int i = 0; i < 4; i++)
        assert_int_equal(wq_add(q, KS(keys[i])), 0);
    t_close(q);
    assert_int_equal(wq_unlink(*name), 0);

    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi recs, meta;
    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_set_maxdbs(env, 4), 0);
    assert_int_equal(mdb_env_open(env, store, MDB_NOTLS, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, "records", 0, &recs), 0);
    assert_int_equal(mdb_dbi_open(txn, "meta", 0, &meta), 0);
    /* Every record as version 1 wrote it: its header without the check. */
    unsigned char lk[4][10], val[4][WQ_REC1_SIZE + 64];
    size_t vlen[4];
    int n = 0;
    MDB_cursor *c;
    MDB_val k, v;
    assert_int_equal(mdb_cursor_open(txn, recs, &c), 0);
    for (int rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        struct wq_rec r;
        assert_true(n < 4 && k.mv_size == 10 && v.mv_size >= sizeof r &&
                    v.mv_size - sizeof r <= 64);
        memcpy(&r, v.mv_data, sizeof r);
        int i = 0;
        while (i < 4 && (r.keylen != strlen(keys[i]) ||
                         memcmp((const char *)v.mv_data + sizeof r, keys[i], r.keylen) != 0))
            i++;
        assert_true(i < 4);
        r.magic = WQ_REC_MAGIC1;
        r.order = orders[i];
        memcpy(lk[n], k.mv_data, 10);
        memcpy(val[n], &r, WQ_REC1_SIZE);
        memcpy(val[n] + WQ_REC1_SIZE, (const char *)v.mv_data + sizeof r,
               v.mv_size - sizeof r);
        vlen[n++] = WQ_REC1_SIZE + v.mv_size - sizeof r;
    }
    mdb_cursor_close(c);
    assert_int_equal(n, 4);
    for (int i = 0; i < n; i++) {
        MDB_val nk = { 10, lk[i] }, nv = { vlen[i], val[i] };
        assert_int_equal(mdb_put(txn, recs, &nk, &nv, 0), 0);
    }
    /* The meta as version 1 wrote it: 120 bytes, version 1. */
    unsigned char m[sizeof(struct wq_meta)];
    MDB_val mk = { 4, "meta" }, mv;
    assert_int_equal(mdb_get(txn, meta, &mk, &mv), 0);
    assert_true(mv.mv_size >= 120 && mv.mv_size <= sizeof m);
    memcpy(m, mv.mv_data, mv.mv_size);
    uint32_t one = 1;
    memcpy(m + offsetof(struct wq_meta, version), &one, sizeof one);
    MDB_val nm = { 120, m };
    assert_int_equal(mdb_put(txn, meta, &mk, &nm, 0), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
    return o;
}

/* Add orders 0 and 2^64 - 1, the widest span there is, with two in
   between: the records restore in that order. (A span computed as
   hi - lo + 1 wrapped to 0 once, and the restore wrote before the 0-byte
   array it then made.) */
static void test_restore_extreme_orders(void **state)
{
    (void)state;
    static const char *const keys[] = { "k0", "k1", "k2", "k3" };
    static const uint64_t orders[] = { 5, UINT64_MAX, 0, 6 };
    const char *name;
    struct wq_options o = v1_store("extreme", &name, keys, orders);
    wq *q = t_track(T_OPEN(name, &o));
    T_EXPECT_STATS(q, 4, 4, 0, 0, "extreme orders restored");
    T_EXPECT_GET(q, "k2");
    T_EXPECT_GET(q, "k0");
    T_EXPECT_GET(q, "k3");
    T_EXPECT_GET(q, "k1");
    t_check_clean(q, "extreme orders");
    t_close(q);
}

/* Two records with one add order, in a dense span (so the restore visits
   them where they lie and finds the clash only when the keys enter the
   queue): every key comes back, the two tied keys between the others. */
static void test_restore_shared_order(void **state)
{
    (void)state;
    static const char *const keys[] = { "k0", "k1", "k2", "k3" };
    static const uint64_t orders[] = { 5, 7, 7, 9 };
    const char *name;
    struct wq_options o = v1_store("shared", &name, keys, orders);
    wq *q = t_track(T_OPEN(name, &o));
    T_EXPECT_STATS(q, 4, 4, 0, 0, "shared order restored");
    T_EXPECT_GET(q, "k0");
    char a[T_KEYBUF], b[T_KEYBUF];
    int la = wq_get(q, a, sizeof a, 0), lb = wq_get(q, b, sizeof b, 0);
    assert_int_equal(la, 2);
    assert_int_equal(lb, 2);
    if (!((memcmp(a, "k1", 2) == 0 && memcmp(b, "k2", 2) == 0) ||
          (memcmp(a, "k2", 2) == 0 && memcmp(b, "k1", 2) == 0)))
        fail_msg("the tied keys came out as %.2s, %.2s", a, b);
    T_EXPECT_GET(q, "k3");
    assert_int_equal(wq_done(q, KS("k0")), 0);
    assert_int_equal(wq_done(q, KS("k1")), 0);
    assert_int_equal(wq_done(q, KS("k2")), 0);
    assert_int_equal(wq_done(q, KS("k3")), 0);
    t_check_clean(q, "shared order");
    t_close(q);
}

static void test_no_double_restore(void **state)
{
    (void)state;
    const char *store = t_mkstore();
    const char *name = t_qname("nodouble");
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.capacity = 64;
    o.max_key_len = 32;
    o.store_path = store;
    o.flags = WQ_CREATE | WQ_EXCL;
    wq *a = t_track(T_OPEN(name, &o));
    char k[8];
    for (int i = 0; i < 10; i++) {
        snprintf(k, sizeof k, "k%d", i);
        assert_int_equal(wq_add(a, KS(k)), 0);
    }
    T_EXPECT_GET(a, "k0"); /* A holds k0 */

    /* Another process opens with WQ_CREATE and the same store: it
       attaches, nothing is restored into the running region. */
    pid_t c = t_fork(20);
    if (c == 0)
        _exit(attach_child(name, store));
    int st = t_wait(c, 15000);
    T_ASSERT_BOARD_CLEAN();
    assert_int_equal(st, 0);
    T_EXPECT_STATS(a, 10, 9, 1, 0, "after the second open");
    struct wq_stats s;
    s = t_stats(a);
    assert_int_equal(s.adds_total, 10);
    t_check_clean(a, "nodouble");

    /* The same in this process, with a second handle. */
    struct wq_options o2 = o;
    o2.flags = WQ_CREATE;
    wq *b = t_track(T_OPEN(name, &o2));
    T_EXPECT_STATS(b, 10, 9, 1, 0, "second handle");
    t_close(b);
    o2.flags = WQ_CREATE | WQ_EXCL;
    wq *x = NULL;
    assert_int_equal(wq_open(name, &o2, &x), -EEXIST);

    /* Close (k0 goes to the back of the queue) and reopen without
       unlinking: the region's state stays, nothing is restored (a restore
       would put k0 first, in first-add order). */
    t_close(a);
    o2.flags = WQ_CREATE;
    a = t_track(T_OPEN(name, &o2));
    T_EXPECT_STATS(a, 10, 10, 0, 0, "reopen without unlink");
    s = t_stats(a);
    assert_int_equal(s.adds_total, 10);
    struct t_dump d = t_dump_all(a);
    assert_int_equal(d.n, 10);
    for (int i = 0; i < 10; i++) {
        snprintf(k, sizeof k, "k%d", (i + 1) % 10);
        if (strcmp(d.v[i].key, k) != 0)
            fail_msg("reopen without unlink: position %d holds %s, expected %s "
                     "(the region's order, k0 last)", i, d.v[i].key, k);
    }
    t_dump_free(&d);
    t_check_clean(a, "reopen");
    t_close(a);
}

/* ------------------------------------------------------------------ */
/* main: the group in a child, then every store removed                */
/* ------------------------------------------------------------------ */

int main(void)
{
    static const struct CMUnitTest tests[] = {
        T_STORE_TEST(test_restore_process),
        T_STORE_TEST(test_restore_fsync),
        T_STORE_TEST(test_restore_none),
        T_STORE_TEST(test_geometry_from_store),
        T_STORE_TEST(test_no_double_restore),
        T_STORE_TEST(test_restore_order_spans),
        T_STORE_TEST(test_restore_visit_orders),
        T_STORE_TEST(test_restore_extreme_orders),
        T_STORE_TEST(test_restore_shared_order),
        T_NO_LEFTOVERS,
    };
    static const struct t_guard g = {
        .prog = "test-store-restore",
        .max_stores = 64,
        .deadline_s = 300,
        T_GUARD_TESTS(tests),
    };
    return t_guard_main(&g);
}
