/*
 * test-store.c - the LMDB store (wq_options.store_path), single process
 * unless stated.
 *
 *   - restore after wq_unlink, for each durability (PROCESS, FSYNC, and
 *     NONE with wq_snapshot): queued keys in first-add order, processing
 *     keys back queued (processed once more), a waiting key with its
 *     remaining delay, failure counts, results; a clean done key never
 *     comes back; removals are stored too (second restore);
 *   - geometry taken from the store when the options leave it 0;
 *   - no double restore: an attacher with WQ_CREATE and the same store,
 *     and a reopen without wq_unlink, keep the region as it is;
 *   - WQ_DURABLE_NONE: keys not snapshotted are lost, snapshotted ones
 *     come back; the periodic snapshot (100 ms) runs under a lock;
 *   - damaged, foreign and unusable stores fail cleanly (-EBADMSG, -EIO,
 *     -ENOTDIR, ...) without a crash and without creating the region;
 *   - option checks and the permissions of the store files;
 *   - a full store (WQ_TEST_STORE_MAX_MAP, fault build only): the add that
 *     does not fit fails and changes nothing, every add that returned 0
 *     is restored;
 *   - wq_snapshot without a store.
 *
 * Store directories live under one mkdtemp directory in /tmp. main()
 * runs the cmocka group in a child and removes that directory (and any
 * /dev/shm object of the child) whatever happened to the child, so a
 * crash or a watchdog exit leaves nothing behind.
 *
 * Linked against libwq-fault.la (for WQ_TEST_STORE_MAX_MAP).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "t.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    if (s.live != 26 || s.queued != 24 || s.waiting != 2 || s.processing != 0 ||
        s.failing != 1 || s.results != 1)
        fail_msg("%s: restored live %" PRIu64 " queued %" PRIu64 " waiting %" PRIu64
                 " processing %" PRIu64 " failing %" PRIu64 " results %" PRIu64
                 ", expected 26 24 2 0 1 1", ctx, s.live, s.queued, s.waiting,
                 s.processing, s.failing, s.results);
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
    /* key-e keeps its failure count, key-c its result */
    if (s.live != 2 || s.waiting != 2 || s.failing != 2)
        fail_msg("%s: after the drain live %" PRIu64 " waiting %" PRIu64 " failing %"
                 PRIu64 ", expected 2 2 2", ctx, s.live, s.waiting, s.failing);

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
    if (s.live != 2 || s.waiting != 2 || s.queued != 0 || s.failing != 2 || s.results != 1)
        fail_msg("%s: second restore live %" PRIu64 " waiting %" PRIu64 " queued %" PRIu64
                 " failing %" PRIu64 " results %" PRIu64 ", expected 2 2 0 2 1", ctx,
                 s.live, s.waiting, s.queued, s.failing, s.results);
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
/* WQ_DURABLE_NONE                                                     */
/* ------------------------------------------------------------------ */

/* In a child: snapshot 5 keys, add 3 more, die without wq_close. */
static int none_child(const char *name, const char *store)
{
    struct wq_options o = t_store_opts(store, WQ_DURABLE_NONE);
    wq *q = NULL;
    T_CHECK_EQ(wq_open(name, &o, &q), 0);
    char k[8];
    for (int i = 0; i < 5; i++) {
        snprintf(k, sizeof k, "s%d", i);
        T_CHECK_EQ(wq_add(q, KS(k)), 0);
    }
    struct wq_stats s;
    T_CHECK_EQ(wq_stats(q, &s), 0);
    T_CHECK_EQ(s.store_unsynced, 5);
    int n = wq_snapshot(q);
    printf("  wq_snapshot after 5 adds: %d\n", n);
    fflush(stdout);
    T_CHECK(n > 0);
    T_CHECK_EQ(wq_stats(q, &s), 0);
    T_CHECK_EQ(s.store_unsynced, 0);
    for (int i = 0; i < 3; i++) {
        snprintf(k, sizeof k, "l%d", i);
        T_CHECK_EQ(wq_add(q, KS(k)), 0);
    }
    T_CHECK_EQ(wq_stats(q, &s), 0);
    T_CHECK_EQ(s.store_unsynced, 3);
    fflush(stdout);
    return 0; /* _exit without wq_close: the world stops here */
}

/* In a child: interval 100 ms; after 300 ms a lock-taking call has
   written everything. */
static int interval_child(const char *name, const char *store)
{
    struct wq_options o = t_store_opts(store, WQ_DURABLE_NONE);
    o.snapshot_interval_ms = 100;
    wq *q = NULL;
    T_CHECK_EQ(wq_open(name, &o, &q), 0);
    char k[8];
    for (int i = 0; i < 10; i++) {
        snprintf(k, sizeof k, "i%d", i);
        T_CHECK_EQ(wq_add(q, KS(k)), 0);
    }
    struct wq_stats s;
    T_CHECK_EQ(wq_stats(q, &s), 0);
    printf("  interval 100 ms: store_unsynced right after 10 adds: %" PRIu64 "\n",
           s.store_unsynced);
    t_sleep_ms(300);
    /* wq_stats takes the lock: the snapshot is due, so it runs there. */
    T_CHECK_EQ(wq_stats(q, &s), 0);
    if (s.store_unsynced != 0) {
        t_failf(__FILE__, __LINE__, "interval 100 ms: 300 ms later wq_stats reports "
                 "store_unsynced %" PRIu64 ", expected 0 (the due snapshot did not run "
                 "under wq_stats' lock)", s.store_unsynced);
        /* Diagnose: does a mutating call run it? (i0 comes back queued.) */
        char buf[T_KEYBUF];
        int n = wq_get(q, buf, sizeof buf, 0);
        T_CHECK_EQ(wq_stats(q, &s), 0);
        printf("  interval 100 ms: after a wq_get (= %d) store_unsynced is %" PRIu64 "\n",
               n, s.store_unsynced);
    }
    fflush(stdout);
    return 0; /* no wq_close */
}

static void test_none_durability(void **state)
{
    (void)state;
    const char *store = t_mkstore();
    const char *name = t_qname("none");
    pid_t c = t_fork(20);
    if (c == 0)
        _exit(none_child(name, store));
    int st = t_wait(c, 15000);
    T_ASSERT_BOARD_CLEAN();
    assert_int_equal(st, 0);
    assert_int_equal(wq_unlink(name), 0);
    struct wq_options o = t_store_opts(store, WQ_DURABLE_NONE);
    wq *q = t_track(T_OPEN(name, &o));
    struct t_dump d = t_dump_all(q);
    for (int i = 0; i < 3; i++) {
        char k[8];
        snprintf(k, sizeof k, "l%d", i);
        if (t_dump_count(&d, k) != 0)
            fail_msg("NONE: %s was never snapshotted but came back", k);
    }
    if (d.n != 5)
        fail_msg("NONE: %zu keys restored, expected the 5 snapshotted", d.n);
    for (int i = 0; i < 5; i++) {
        char k[8];
        snprintf(k, sizeof k, "s%d", i);
        if (strcmp(d.v[i].key, k) != 0 || !(d.v[i].state & WQ_KEY_QUEUED))
            fail_msg("NONE: position %d holds %s (0x%x), expected %s queued", i,
                     d.v[i].key, d.v[i].state, k);
    }
    t_dump_free(&d);
    T_EXPECT_STATS(q, 5, 5, 0, 0, "NONE restore");
    struct wq_stats s;
    s = t_stats(q);
    assert_int_equal(s.durability, WQ_DURABLE_NONE);
    assert_int_equal(s.has_store, 1);
    t_check_clean(q, "NONE");
    t_close(q);

    /* The periodic snapshot. */
    const char *store2 = t_mkstore();
    const char *name2 = t_qname("interval");
    c = t_fork(20);
    if (c == 0)
        _exit(interval_child(name2, store2));
    st = t_wait(c, 15000);
    assert_int_equal(st, 0); /* the board is checked after the restore */
    assert_int_equal(wq_unlink(name2), 0);
    o.store_path = store2;
    q = t_track(T_OPEN(name2, &o));
    T_EXPECT_STATS(q, 10, 10, 0, 0, "interval restore");
    d = t_dump_all(q);
    assert_int_equal(d.n, 10);
    for (int i = 0; i < 10; i++) {
        char k[8];
        snprintf(k, sizeof k, "i%d", i);
        if (strcmp(d.v[i].key, k) != 0)
            fail_msg("interval: position %d holds %s, expected %s", i, d.v[i].key, k);
    }
    t_dump_free(&d);
    t_close(q);
    T_ASSERT_BOARD_CLEAN();
}

/* ------------------------------------------------------------------ */
/* Damaged, foreign and unusable stores                                */
/* ------------------------------------------------------------------ */

struct child_result {
    int rc;
    int add_rc;
    int len_before, len_after;
};

/* wq_open in a child (a crash there must not take the runner down).
   Returns the child's status as t_wait does; *res holds wq_open's rc. */
static int open_in_child(const char *name, const struct wq_options *o,
                         struct child_result *res, uid_t uid)
{
    res->rc = 1;
    res->add_rc = 1;
    pid_t c = t_fork(20);
    if (c == 0) {
        if (uid != 0 && t_drop_to(uid) != 0)
            _exit(90);
        wq *q = NULL;
        int rc = wq_open(name, o, &q);
        res->rc = rc;
        if (rc == 0) {
            /* Opened (a readable store): a write must then fail cleanly. */
            res->len_before = wq_len(q);
            res->add_rc = wq_add(q, KS("new-key"));
            res->len_after = wq_len(q);
            wq_close(q);
            wq_unlink(name);
        }
        _exit(0);
    }
    return t_wait(c, 15000);
}

static void populate(const char *name, const char *store, int nkeys)
{
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.store_path = store;
    o.max_key_len = 32;
    o.flags = WQ_CREATE | WQ_EXCL;
    wq *q = t_track(T_OPEN(name, &o));
    for (int i = 0; i < nkeys; i++) {
        char k[16];
        snprintf(k, sizeof k, "p%d", i);
        assert_int_equal(wq_add(q, KS(k)), 0);
    }
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
}

static off_t file_size(const char *p)
{
    struct stat st;
    if (stat(p, &st) != 0)
        fail_msg("stat(%s): %s", p, strerror(errno));
    return st.st_size;
}

static void fill_random(const char *path, off_t from, off_t to)
{
    int fd = open(path, O_WRONLY);
    if (fd < 0)
        fail_msg("open(%s): %s", path, strerror(errno));
    unsigned char buf[4096];
    unsigned x = 12345;
    for (off_t off = from; off < to; off += (off_t)sizeof buf) {
        for (size_t i = 0; i < sizeof buf; i++) {
            x = x * 1103515245u + 12345u;
            buf[i] = (unsigned char)(x >> 16);
        }
        size_t n = (size_t)(to - off) < sizeof buf ? (size_t)(to - off) : sizeof buf;
        if (pwrite(fd, buf, n, off) != (ssize_t)n)
            fail_msg("pwrite(%s): %s", path, strerror(errno));
    }
    close(fd);
}

/* Expect a clean failure with one of the given errnos (0-terminated). */
static void expect_open_fails_(const char *name, const struct wq_options *o,
                               const char *ctx, const int *allowed, int line)
{
    struct child_result *res = t_shared_alloc(sizeof *res);
    int st = open_in_child(name, o, res, 0);
    if (st != 0)
        fail_msg("line %d: %s: wq_open crashed the process (status %d%s)", line, ctx,
                 st, st > 128 ? ", killed by a signal" : "");
    int ok = 0;
    for (const int *a = allowed; *a; a++)
        ok |= res->rc == *a;
    if (!ok)
        fail_msg("line %d: %s: wq_open = %d (%s)", line, ctx, res->rc,
                 res->rc <= 0 ? wq_strerror(res->rc) : "");
    printf("  %s: wq_open = %s\n", ctx, wq_strerror(res->rc));
    t_shared_free(res, sizeof *res);
    t_expect_no_shm_(name, ctx, line);
}
#define expect_open_fails(n, o, c, ...)                                      \
    do {                                                                     \
        static const int allowed_[] = { __VA_ARGS__, 0 };                    \
        expect_open_fails_((n), (o), (c), allowed_, __LINE__);               \
    } while (0)

static void test_corrupt_store(void **state)
{
    (void)state;
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.flags = WQ_CREATE | WQ_EXCL;
    char data[256];

    /* Garbage over the whole data.mdb. */
    const char *s1 = t_mkstore();
    const char *n1 = t_qname("garbage");
    populate(n1, s1, 20);
    snprintf(data, sizeof data, "%s/data.mdb", s1);
    fill_random(data, 0, file_size(data));
    o.store_path = s1;
    expect_open_fails(n1, &o, "garbage data.mdb", -EBADMSG, -EIO);

    /* Truncated to its two meta pages: the data pages are gone. */
    const char *s2 = t_mkstore();
    const char *n2 = t_qname("trunc");
    populate(n2, s2, 20);
    snprintf(data, sizeof data, "%s/data.mdb", s2);
    long psz = sysconf(_SC_PAGESIZE);
    if (truncate(data, 2 * psz) != 0)
        fail_msg("truncate: %s", strerror(errno));
    o.store_path = s2;
    expect_open_fails(n2, &o, "data.mdb truncated to its meta pages", -EBADMSG, -EIO);

    /* Truncated to 100 bytes (not even a meta page). */
    const char *s3 = t_mkstore();
    const char *n3 = t_qname("trunc100");
    populate(n3, s3, 20);
    snprintf(data, sizeof data, "%s/data.mdb", s3);
    if (truncate(data, 100) != 0)
        fail_msg("truncate: %s", strerror(errno));
    o.store_path = s3;
    expect_open_fails(n3, &o, "data.mdb truncated to 100 bytes", -EBADMSG, -EIO);

    /* Meta pages intact, garbage in every data page. LMDB has no page
       checksums; reported, not asserted. */
    const char *s4 = t_mkstore();
    const char *n4 = t_qname("datapages");
    populate(n4, s4, 20);
    snprintf(data, sizeof data, "%s/data.mdb", s4);
    fill_random(data, 2 * psz, file_size(data));
    o.store_path = s4;
    struct child_result *res = t_shared_alloc(sizeof *res);
    int st = open_in_child(n4, &o, res, 0);
    if (st != 0)
        printf("  garbage in the data pages only (meta intact): the opening process "
               "died (status %d) (informational)\n", st);
    else
        printf("  garbage in the data pages only (meta intact): wq_open = %s "
               "(informational)\n", wq_strerror(res->rc));
    t_shared_free(res, sizeof *res);
    t_unlink_all();
}

static void test_foreign_store(void **state)
{
    (void)state;
    const char *s = t_mkstore();
    const char *name = t_qname("foreign");
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_set_mapsize(env, 1 << 20), 0);
    assert_int_equal(mdb_env_open(env, s, 0, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    char kb[16], vb[32];
    snprintf(kb, sizeof kb, "foreign-%d", (int)getpid());
    for (size_t i = 0; i < sizeof vb; i++)
        vb[i] = (char)(i * 37 + 11);
    MDB_val k = { strlen(kb), kb }, v = { sizeof vb, vb };
    assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(env);

    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.store_path = s;
    o.flags = WQ_CREATE | WQ_EXCL;
    expect_open_fails(name, &o, "foreign LMDB environment", -EBADMSG);

    /* The foreign environment was not written to. */
    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_open(env, s, MDB_RDONLY, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    MDB_stat ms;
    assert_int_equal(mdb_stat(txn, dbi, &ms), 0);
    MDB_val got;
    int grc = mdb_get(txn, dbi, &k, &got);
    mdb_txn_abort(txn);
    mdb_env_close(env);
    if (ms.ms_entries != 1 || grc != 0)
        fail_msg("foreign environment changed: %zu entries, our key %s", ms.ms_entries,
                 grc == 0 ? "present" : "missing");
}

static void test_store_path_is_file(void **state)
{
    (void)state;
    const char *dir = t_mkstore();
    char file[256];
    snprintf(file, sizeof file, "%s/plain-file", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs("not a directory\n", f);
    fclose(f);
    const char *name = t_qname("isfile");
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.store_path = file;
    o.flags = WQ_CREATE | WQ_EXCL;
    expect_open_fails(name, &o, "store_path is a regular file", -ENOTDIR, -EIO);
    assert_int_equal(file_size(file), 16);
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

/* In a child, as nobody: create a store with keys. */
static int nobody_populate(const char *name, const char *store)
{
    if (t_drop_to(T_NOBODY) != 0)
        return 90;
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.store_path = store;
    o.flags = WQ_CREATE | WQ_EXCL;
    wq *q = NULL;
    T_CHECK_EQ(wq_open(name, &o, &q), 0);
    for (int i = 0; i < 5; i++) {
        char k[8];
        snprintf(k, sizeof k, "n%d", i);
        T_CHECK_EQ(wq_add(q, KS(k)), 0);
    }
    wq_close(q);
    return 0;
}

static void check_perm_outcome(const char *ctx, int st, const struct child_result *res,
                               const char *name)
{
    if (st != 0)
        fail_msg("%s: the process died or could not drop privileges (status %d)", ctx, st);
    if (res->rc == 0) {
        /* Opened read-only: then the first write must fail and change
           nothing (wq.h: "gives -EIO ... from the call that needed it"). */
        printf("  %s: wq_open succeeded; wq_add = %s, len %d -> %d\n", ctx,
               wq_strerror(res->add_rc), res->len_before, res->len_after);
        if (res->add_rc != -EIO && res->add_rc != -EACCES && res->add_rc != -EROFS)
            fail_msg("%s: wq_open succeeded and wq_add = %d (%s), expected a clean "
                     "error", ctx, res->add_rc, wq_strerror(res->add_rc));
        if (res->len_after != res->len_before)
            fail_msg("%s: the failed add changed wq_len %d -> %d", ctx, res->len_before,
                     res->len_after);
    } else {
        printf("  %s: wq_open = %s\n", ctx, wq_strerror(res->rc));
        if (res->rc != -EACCES && res->rc != -EIO && res->rc != -EROFS &&
            res->rc != -EPERM)
            fail_msg("%s: wq_open = %d (%s), expected -EACCES/-EIO/-EROFS/-EPERM", ctx,
                     res->rc, res->rc < 0 ? wq_strerror(res->rc) : "?");
        T_EXPECT_NO_SHM(name, ctx);
    }
}

static void test_readonly_store(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        printf("  not root: the permission test needs setuid(%d)\n", T_NOBODY);
        skip();
    }
    struct child_result *res = t_shared_alloc(sizeof *res);
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.flags = WQ_CREATE | WQ_EXCL;

    /* An empty directory nobody may read but not write. */
    const char *s1 = t_mkstore();
    const char *n1 = t_qname("ro-empty");
    assert_int_equal(chown(s1, T_NOBODY, T_NOBODY), 0);
    assert_int_equal(chmod(s1, 0500), 0);
    o.store_path = s1;
    int st = open_in_child(n1, &o, res, T_NOBODY);
    check_perm_outcome("read-only empty store directory", st, res, n1);
    if (res->rc != 0 && count_entries(s1) != 0)
        fail_msg("read-only empty store: %d files created", count_entries(s1));

    /* A store with keys, made read-only afterwards. */
    const char *s2 = t_mkstore();
    const char *n2 = t_qname("ro-full");
    assert_int_equal(chown(s2, T_NOBODY, T_NOBODY), 0);
    pid_t c = t_fork(20);
    if (c == 0)
        _exit(nobody_populate(n2, s2));
    st = t_wait(c, 15000);
    T_ASSERT_BOARD_CLEAN();
    assert_int_equal(st, 0);
    assert_int_equal(wq_unlink(n2), 0);
    char p[256];
    struct stat before, after;
    snprintf(p, sizeof p, "%s/data.mdb", s2);
    assert_int_equal(stat(p, &before), 0);
    assert_int_equal(chmod(p, 0400), 0);
    snprintf(p, sizeof p, "%s/lock.mdb", s2);
    if (access(p, F_OK) == 0)
        assert_int_equal(chmod(p, 0400), 0);
    assert_int_equal(chmod(s2, 0500), 0);
    o.store_path = s2;
    memset(res, 0, sizeof *res);
    st = open_in_child(n2, &o, res, T_NOBODY);
    check_perm_outcome("read-only store with keys", st, res, n2);
    snprintf(p, sizeof p, "%s/data.mdb", s2);
    assert_int_equal(stat(p, &after), 0);
    if (after.st_size != before.st_size || after.st_mtim.tv_sec != before.st_mtim.tv_sec ||
        after.st_mtim.tv_nsec != before.st_mtim.tv_nsec)
        fail_msg("read-only store with keys: data.mdb was modified");

    /* Root's own view: the keys are all still there. */
    assert_int_equal(chmod(s2, 0700), 0);
    o.store_path = s2;
    wq *q = t_track(T_OPEN(n2, &o));
    T_EXPECT_STATS(q, 5, 5, 0, 0, "after the read-only attempt");
    t_close(q);
    t_shared_free(res, sizeof *res);
}

/* ------------------------------------------------------------------ */
/* Options and file modes                                              */
/* ------------------------------------------------------------------ */

static void expect_einval_(const struct wq_options *o, const char *ctx, int line)
{
    const char *name = t_qname("einval");
    wq *q = NULL;
    int rc = wq_open(name, o, &q);
    if (rc == 0)
        t_close(q);
    if (rc != -EINVAL)
        fail_msg("line %d: %s: wq_open = %d (%s), expected -EINVAL", line, ctx, rc,
                 wq_strerror(rc));
    t_expect_no_shm_(name, ctx, line);
}
#define expect_einval(o, c) expect_einval_((o), (c), __LINE__)

static int file_mode(const char *dir, const char *f)
{
    char p[256];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, f);
    if (stat(p, &st) != 0)
        fail_msg("stat(%s): %s", p, strerror(errno));
    return (int)(st.st_mode & 07777);
}

static void expect_modes(mode_t opt_mode, int want, mode_t mask)
{
    const char *s = t_mkstore();
    const char *name = t_qname("mode");
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.store_path = s;
    o.mode = opt_mode;
    o.flags = WQ_CREATE | WQ_EXCL;
    mode_t old = umask(mask);
    wq *q = NULL;
    int rc = wq_open(name, &o, &q);
    if (rc == 0) {
        t_track(q);
        rc = wq_add(q, KS("m"));
    }
    umask(old);
    if (rc != 0)
        fail_msg("mode 0%o, umask 0%03o: wq_open/wq_add = %d (%s)", (unsigned)opt_mode,
                 (unsigned)mask, rc, wq_strerror(rc));
    int md = file_mode(s, "data.mdb"), ml = file_mode(s, "lock.mdb");
    if (md != want || ml != want)
        fail_msg("mode 0%o, umask 0%03o: data.mdb 0%o lock.mdb 0%o, expected 0%o",
                 (unsigned)opt_mode, (unsigned)mask, md, ml, want);
    char shm[512];
    struct stat st;
    t_shm_path(name, shm, sizeof shm);
    assert_int_equal(stat(shm, &st), 0);
    if ((int)(st.st_mode & 0777) != want)
        fail_msg("shm object mode 0%o, expected 0%o", (unsigned)(st.st_mode & 0777), want);
    t_close(q);
}

static void test_options(void **state)
{
    (void)state;
    const char *s = t_mkstore();
    struct wq_options o;

    memset(&o, 0, sizeof o);
    o.flags = WQ_CREATE;
    o.durability = WQ_DURABLE_FSYNC;
    expect_einval(&o, "FSYNC without store_path");
    o.durability = WQ_DURABLE_NONE;
    expect_einval(&o, "NONE without store_path");
    o.snapshot_interval_ms = 100;
    expect_einval(&o, "NONE + interval without store_path");
    o.durability = WQ_DURABLE_PROCESS;
    expect_einval(&o, "interval without store_path");

    o.store_path = s;
    o.durability = WQ_DURABLE_PROCESS;
    o.snapshot_interval_ms = 100;
    expect_einval(&o, "interval with PROCESS");
    o.durability = WQ_DURABLE_FSYNC;
    expect_einval(&o, "interval with FSYNC");
    o.snapshot_interval_ms = 0;
    o.durability = 3;
    expect_einval(&o, "durability 3");
    o.durability = -1;
    expect_einval(&o, "durability -1");
    if (count_entries(s) != 0)
        fail_msg("a refused wq_open created %d files in the store", count_entries(s));

    /* Accepted: NONE with an interval, with a store. */
    o.durability = WQ_DURABLE_NONE;
    o.snapshot_interval_ms = 100;
    const char *name = t_qname("okopts");
    wq *q = t_track(T_OPEN(name, &o));
    struct wq_stats st;
    st = t_stats(q);
    assert_int_equal(st.has_store, 1);
    assert_int_equal(st.durability, WQ_DURABLE_NONE);
    t_close(q);

    /* Store files: 0600 by default, else exactly `mode`, umask or not. */
    expect_modes(0, 0600, 022);
    expect_modes(0640, 0640, 022);
    expect_modes(0640, 0640, 077);
}

/* ------------------------------------------------------------------ */
/* A full store                                                        */
/* ------------------------------------------------------------------ */

#define DISK_KEYLEN 150
#define DISK_MAX 20000

static void disk_key(char *k, int i)
{
    memset(k, 'x', DISK_KEYLEN);
    int n = snprintf(k, DISK_KEYLEN, "disk-%06d-", i);
    k[n] = 'x';
}

static int disk_idx(const struct wq_key_info *ki)
{
    if (ki->len != DISK_KEYLEN || memcmp(ki->key, "disk-", 5) != 0)
        return -1;
    return atoi((const char *)ki->key + 5);
}

struct disk_seen {
    unsigned char *count;
    int other;
    int watch;          /* index whose state is recorded */
    unsigned watch_state;
};

static int disk_cb(const struct wq_key_info *ki, void *arg)
{
    struct disk_seen *s = arg;
    int i = disk_idx(ki);
    if (i < 0 || i >= DISK_MAX)
        s->other++;
    else if (s->count[i] < 255)
        s->count[i]++;
    if (i == s->watch)
        s->watch_state = ki->state;
    return 0;
}

static void test_full_store(void **state)
{
    (void)state;
    const char *s = t_mkstore();
    const char *name = t_qname("full");
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.capacity = 65536;
    o.max_key_len = 200;
    o.store_path = s;
    o.flags = WQ_CREATE | WQ_EXCL;
    setenv("WQ_TEST_STORE_MAX_MAP", "262144", 1);
    wq *q = t_track(T_OPEN(name, &o));
    char k[DISK_KEYLEN];
    int ok = 0, fail_rc = 0;
    struct wq_stats before, after;
    for (int i = 0; i < DISK_MAX; i++) {
        disk_key(k, i);
        before = t_stats(q);
        int rc = wq_add(q, k, sizeof k);
        if (rc == 0) {
            ok++;
            continue;
        }
        fail_rc = rc;
        break;
    }
    printf("  map capped at 256 KiB: %d adds of %d-byte keys succeeded, then %s\n", ok,
           DISK_KEYLEN, fail_rc ? wq_strerror(fail_rc) : "none failed");
    if (fail_rc == 0)
        fail_msg("%d adds (%d bytes of keys) fit in a 256 KiB map: "
                 "WQ_TEST_STORE_MAX_MAP not honoured?", ok, ok * DISK_KEYLEN);
    if (fail_rc != -ENOSPC && fail_rc != -EIO)
        fail_msg("the add that did not fit returned %d (%s), expected -ENOSPC or -EIO",
                 fail_rc, wq_strerror(fail_rc));
    assert_true(ok > 0);
    /* The failed add changed nothing (checked at the end, so the restore
       is looked at too). */
    char changed[512] = "";
    after = t_stats(q);
    if (after.live != before.live || after.queued != before.queued ||
        after.adds_total != before.adds_total || after.live != (uint64_t)ok)
        snprintf(changed, sizeof changed, "after the failed add: live %" PRIu64 " queued %"
                 PRIu64 " adds_total %" PRIu64 ", before it %" PRIu64 " %" PRIu64 " %"
                 PRIu64 " (%d adds succeeded)", after.live, after.queued,
                 after.adds_total, before.live, before.queued, before.adds_total, ok);
    struct wq_result r;
    disk_key(k, ok);
    assert_int_equal(wq_result(q, k, sizeof k, &r), 0);
    assert_int_equal(r.state, WQ_STATE_NONE);
    char buf[T_KEYBUF];
    /* Nobody is handed the failed key. */
    struct disk_seen seen = { calloc(DISK_MAX, 1), 0, ok, 0 };
    assert_int_equal(wq_dump(q, disk_cb, &seen), 0);
    if (seen.count[ok] != 0 && !changed[0])
        snprintf(changed, sizeof changed, "the key whose add failed is listed by wq_dump "
                 "(state 0x%x)", seen.watch_state);
    else if (seen.count[ok] != 0)
        snprintf(changed + strlen(changed), sizeof changed - strlen(changed),
                 "; the key whose add failed is listed by wq_dump (state 0x%x)",
                 seen.watch_state);
    free(seen.count);
    t_check_clean(q, "full store");
    t_close(q);
    unsetenv("WQ_TEST_STORE_MAX_MAP");

    assert_int_equal(wq_unlink(name), 0);
    struct wq_options z;
    memset(&z, 0, sizeof z);
    z.store_path = s;
    z.flags = WQ_CREATE | WQ_EXCL;
    q = t_track(T_OPEN(name, &z));
    seen.count = calloc(DISK_MAX, 1);
    seen.other = 0;
    seen.watch = -1;
    assert_int_equal(wq_dump(q, disk_cb, &seen), 0);
    int missing = 0, dup = 0, extra = 0, first_missing = -1;
    for (int i = 0; i < DISK_MAX; i++) {
        if (i < ok && seen.count[i] == 0) {
            missing++;
            if (first_missing < 0)
                first_missing = i;
        }
        if (seen.count[i] > 1)
            dup++;
        if (i >= ok && seen.count[i] != 0)
            extra++;
    }
    free(seen.count);
    if (missing || dup || extra || seen.other)
        fail_msg("after restore: %d acknowledged keys missing (first %d), %d duplicated, "
                 "%d never acknowledged present, %d foreign", missing, first_missing, dup,
                 extra, seen.other);
    T_EXPECT_STATS(q, (uint64_t)ok, (uint64_t)ok, 0, 0, "full store restore");
    /* And the restored queue works. */
    int n = wq_get(q, buf, sizeof buf, 0);
    assert_int_equal(n, DISK_KEYLEN);
    assert_int_equal(wq_done(q, buf, (size_t)n), 0);
    t_check_clean(q, "full store restore");
    t_close(q);
    if (changed[0])
        fail_msg("%s", changed);
}

/* ------------------------------------------------------------------ */
/* wq_snapshot without a store                                         */
/* ------------------------------------------------------------------ */

static void test_snapshot_no_store(void **state)
{
    (void)state;
    const char *name = t_qname("nostore");
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.flags = WQ_CREATE | WQ_EXCL;
    wq *q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_add(q, KS("x")), 0);
    assert_int_equal(wq_snapshot(q), -ENOENT);
    struct wq_stats s;
    s = t_stats(q);
    assert_int_equal(s.has_store, 0);
    assert_int_equal(s.store_unsynced, 0);
    assert_int_equal(wq_snapshot(NULL), -EINVAL);
    t_close(q);
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
        T_STORE_TEST(test_none_durability),
        T_STORE_TEST(test_corrupt_store),
        T_STORE_TEST(test_foreign_store),
        T_STORE_TEST(test_store_path_is_file),
        T_STORE_TEST(test_readonly_store),
        T_STORE_TEST(test_options),
        T_STORE_TEST(test_full_store),
        T_STORE_TEST(test_snapshot_no_store),
        T_NO_LEFTOVERS,
    };
    static const struct t_guard g = {
        .prog = "test-store",
        .max_stores = 64,
        /* Traversable, so a child running as nobody reaches its store. */
        .topdir_mode = 0711,
        .deadline_s = 300,
        T_GUARD_TESTS(tests),
    };
    return t_guard_main(&g);
}
