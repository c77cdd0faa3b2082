/*
 * test-store-durability.c - the LMDB store (wq_options.store_path): what
 * reaches it, and when. Single process unless stated.
 *
 *   - WQ_DURABLE_NONE: keys not snapshotted are lost, snapshotted ones
 *     come back; the periodic snapshot (100 ms) runs under a lock;
 *   - a full store (WQ_TEST_STORE_MAX_MAP, fault build only): the add that
 *     does not fit fails and changes nothing, every add that returned 0
 *     is restored; wq_finish_get and wq_done_get hand the next key out
 *     when the finish's write does not fit;
 *   - wq_snapshot without a store;
 *   - FSYNC groups: an adder waits for a process of the last group, whose
 *     add joins its commit (LMDB's transaction count, read by a child, is
 *     the witness); a removal made meanwhile is left to the waiter; the
 *     wait ends at its deadline when nobody comes.
 *   - FSYNC deferred changes: a removal is not committed on its own but
 *     with the next new key, at 1024 listed, by wq_snapshot or once the
 *     interval passed; a killed process's is kept by the region.
 *   - an observer's reap is written at once;
 *   - a store reader that hangs: a restore fails, a salvage goes on.
 *
 * Store directories live under one mkdtemp directory in /tmp. main()
 * runs the cmocka group in a child and removes that directory (and any
 * /dev/shm object of the child) whatever happened to the child, so a
 * crash or a watchdog exit leaves nothing behind (t_guard_main).
 *
 * Linked against libwq-fault.la (for WQ_TEST_STORE_MAX_MAP,
 * WQ_TEST_SYNC_WAIT_US, WQ_TEST_STALL_MS and WQ_FAULT_HANG).
 */
#include "t.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lmdb.h>

#include "shm/shm.h"
#include "store/format.h"

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
    /* The world stops: the region goes without wq_unlink (which would
       write what the store lacks first), as at a reboot. */
    char path[300];
    t_shm_path(name, path, sizeof path);
    assert_int_equal(unlink(path), 0);
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

/* A new queue on store s whose LMDB map is capped at 256 KiB (until
   WQ_TEST_STORE_MAX_MAP is unset): a few hundred keys of DISK_KEYLEN fill
   it. */
static wq *capped_store_open(const char *name, const char *s)
{
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.capacity = 65536;
    o.max_key_len = 200;
    o.store_path = s;
    o.flags = WQ_CREATE | WQ_EXCL;
    setenv("WQ_TEST_STORE_MAX_MAP", "262144", 1);
    return t_track(T_OPEN(name, &o));
}

static void test_full_store(void **state)
{
    (void)state;
    const char *s = t_mkstore();
    const char *name = t_qname("full");
    wq *q = capped_store_open(name, s);
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

/* A store whose map is full: the flush that wq_finish_get and
   wq_done_get make after their done reports -ENOSPC, and they used to
   return it with the next key handed out into the buffer: nobody held
   that key, and the pool stranded it. Now they return the key, as
   wq_done and wq_get ignore a flush's failure (what is not written stays
   listed for a later flush), and nothing is lost. */
static void test_full_store_turns(void **state)
{
    (void)state;
    const char *s = t_mkstore();
    const char *name = t_qname("fullturn");
    wq *q = capped_store_open(name, s);
    char k[DISK_KEYLEN], a[T_KEYBUF], b[T_KEYBUF];
    int ok = 0, rc = 0;
    for (; ok < DISK_MAX && (rc = wq_add(q, (disk_key(k, ok), k), sizeof k)) == 0; ok++)
        ;
    if (rc != -ENOSPC && rc != -EIO)
        fail_msg("filling the store: %d adds, then %d (%s)", ok, rc, wq_strerror(rc));
    assert_true(ok >= 3);
    char msg[256];
    memset(msg, 'm', 255);
    msg[255] = 0;   /* a long message: more for the store to write */
    struct wq_finish_opts f = { .code = 1, .message = msg };
    assert_int_equal(wq_get(q, a, sizeof a, 0), DISK_KEYLEN);
    disk_key(k, 0);
    assert_memory_equal(a, k, DISK_KEYLEN);
    assert_int_equal(wq_finish_get(q, a, DISK_KEYLEN, &f, b, sizeof b, 0), DISK_KEYLEN);
    disk_key(k, 1);
    assert_memory_equal(b, k, DISK_KEYLEN);
    struct wq_result r;
    assert_int_equal(wq_result(q, a, DISK_KEYLEN, &r), 0);
    assert_int_equal(r.state, WQ_STATE_FAILED);
    assert_int_equal(r.code, 1);
    assert_int_equal(wq_result(q, b, DISK_KEYLEN, &r), 0);
    assert_int_equal(r.state, WQ_STATE_RUNNING);
    assert_int_equal(t_stats(q).processing, 1);
    assert_int_equal(wq_done_get(q, b, DISK_KEYLEN, a, sizeof a, 0), DISK_KEYLEN);
    disk_key(k, 2);
    assert_memory_equal(a, k, DISK_KEYLEN);
    assert_int_equal(t_stats(q).processing, 1);
    assert_int_equal(wq_done(q, a, DISK_KEYLEN), 0);
    T_EXPECT_STATS(q, (uint64_t)ok - 3, (uint64_t)ok - 3, 0, 0, "three turns");
    t_check_clean(q, "full store, after the turns");
    t_close(q);
    unsetenv("WQ_TEST_STORE_MAX_MAP");
    assert_int_equal(wq_unlink(name), 0);
    /* Nothing the turns did is lost: the store has A's outcome, and B and
       C are gone from it. */
    struct wq_options z;
    memset(&z, 0, sizeof z);
    z.store_path = s;
    z.flags = WQ_CREATE | WQ_EXCL;
    q = t_track(T_OPEN(name, &z));
    disk_key(k, 0);
    assert_int_equal(wq_result(q, k, sizeof k, &r), 0);
    assert_int_equal(r.state, WQ_STATE_FAILED);
    assert_int_equal(r.code, 1);
    for (int i = 1; i <= 2; i++) {
        disk_key(k, i);
        assert_int_equal(wq_result(q, k, sizeof k, &r), 0);
        assert_int_equal(r.state, WQ_STATE_NONE);
    }
    T_EXPECT_STATS(q, (uint64_t)ok - 3, (uint64_t)ok - 3, 0, 0, "restored after the turns");
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
}

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

/* Durability can be asked for: a level given on a restore is honoured
   (and kept by the store), one not given is the store's own, a new
   store without one is PROCESS. (WQ_DURABLE_PROCESS used to be 0, "not
   given", so a store last used with NONE stayed NONE whatever was asked.) */
static void test_durability_asked_for(void **state)
{
    (void)state;
    const char *store = t_mkstore();
    const char *name = t_qname("asked");
    struct wq_options o = { .store_path = store, .flags = WQ_CREATE | WQ_EXCL };
    wq *q = t_track(T_OPEN(name, &o));
    assert_int_equal(t_stats(q).durability, WQ_DURABLE_PROCESS);   /* the default */
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
    const int levels[] = { WQ_DURABLE_NONE, WQ_DURABLE_PROCESS, WQ_DURABLE_FSYNC,
                           WQ_DURABLE_PROCESS };
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        o.durability = levels[i];
        q = t_track(T_OPEN(name, &o));
        assert_int_equal(wq_add(q, KS("k")), i == 0 ? 0 : 1);   /* restored after the first */
        if (t_stats(q).durability != (uint64_t)levels[i])
            fail_msg("restore asked for %s, got %s", t_durability_name(levels[i]),
                     t_durability_name((int)t_stats(q).durability));
        wq_snapshot(q);
        t_close(q);
        assert_int_equal(wq_unlink(name), 0);
        /* Not given: the store's own level, the one asked for last. */
        o.durability = 0;
        q = t_track(T_OPEN(name, &o));
        assert_int_equal(t_stats(q).durability, (uint64_t)levels[i]);
        assert_int_equal(wq_len(q), 1);
        t_close(q);
        assert_int_equal(wq_unlink(name), 0);
    }
}

/* WQ_DURABLE_NONE loses only what was not written when the world stopped:
   the last process to close cleanly, and wq_unlink, write what the store
   lacks first. (Keys added just before a clean exit used to be lost at
   wqctl rm.) */
static void test_none_clean_exit_keeps(void **state)
{
    (void)state;
    const char *store = t_mkstore();
    const char *name = t_qname("noneclean");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_NONE);
    wq *q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_add(q, KS("a")), 0);
    pid_t c = t_fork(20);   /* a second process, attached while we add */
    if (c == 0) {
        wq *cq;
        if (wq_open(name, NULL, &cq) < 0 || wq_add(cq, KS("b")) < 0)
            _exit(1);
        wq_close(cq);   /* not the last: nothing written */
        _exit(0);
    }
    assert_int_equal(t_wait(c, 10000), 0);
    assert_int_equal(t_stats(q).store_unsynced, 2);
    t_close(q);   /* the last: both written */
    assert_int_equal(wq_unlink(name), 0);
    q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_len(q), 2);
    T_EXPECT_GET(q, "a");
    T_EXPECT_DONE(q, "a");
    assert_int_equal(wq_add(q, KS("c")), 0);   /* pending at the unlink */
    assert_int_equal(wq_unlink(name), 0);      /* writes them first */
    t_close(q);
    q = t_track(T_OPEN(name, &o));
    struct t_dump d = t_dump_all(q);
    assert_int_equal(d.n, 2);
    assert_int_equal(t_dump_count(&d, "b"), 1);
    assert_int_equal(t_dump_count(&d, "c"), 1);
    assert_int_equal(t_dump_count(&d, "a"), 0);   /* its done was written too */
    t_dump_free(&d);
    t_close(q);
}

/* A forked child that only removes and forgets takes no process slot,
   yet its close is the last (its parent closed first) and writes what
   the store lacks: after a restart (the region removed) the removed key
   is gone and the forgotten failure count is 0. */
static void test_none_child_close_last(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("nonechild");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_NONE);
    wq *q = T_OPEN(name, &o);
    atomic_int *stage = t_shared_alloc(sizeof *stage);
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_add_rate_limited(q, KS("b")), 0);   /* waits 2 h, 1 failure */
    assert_int_equal(wq_snapshot(q), 2);
    pid_t c = t_fork(20);
    if (c == 0) {
        while (atomic_load(stage) == 0)
            t_sleep_ms(1);
        if (wq_remove(q, KS("a")) != 0 || wq_forget(q, KS("b")) != 0)
            _exit(1);
        wq_close(q);   /* the last: writes both */
        _exit(0);
    }
    wq_close(q);   /* the last one attached, for all the table knows */
    atomic_store(stage, 1);
    assert_int_equal(t_wait(c, 10000), 0);
    char path[300];
    t_shm_path(name, path, sizeof path);
    assert_int_equal(unlink(path), 0);
    q = t_track(T_OPEN(name, &o));   /* restored from the store alone */
    struct t_dump d = t_dump_all(q);
    assert_int_equal(d.n, 1);
    assert_int_equal(t_dump_count(&d, "a"), 0);
    assert_int_equal(t_dump_count(&d, "b"), 1);
    t_dump_free(&d);
    assert_int_equal(wq_num_requeues(q, KS("b")), 0);
    t_close(q);
    t_shared_free(stage, sizeof *stage);
}

/* ------------------------------------------------------------------ */
/* FSYNC groups: adders in two processes share one commit              */
/* ------------------------------------------------------------------ */

/* What a child with an LMDB environment of its own sees of the store:
   the witness outside the library (which keeps ours open; LMDB allows
   one per process). txnid: the last transaction id (one per commit);
   short_file: data.mdb ends before the last page LMDB counts (a commit
   that freed many pages leaves the last ones unwritten: they are free). */
struct store_peek {
    uint64_t txnid;
    int short_file;
};

static struct store_peek store_peek(const char *dir)
{
    struct store_peek *out = t_shared_alloc(sizeof *out);
    pid_t c = t_fork(20);
    if (c == 0) {
        MDB_env *env;
        MDB_envinfo info;
        MDB_stat st;
        struct stat sb;
        char file[300];
        snprintf(file, sizeof file, "%s/data.mdb", dir);
        if (mdb_env_create(&env) != 0 ||
            mdb_env_open(env, dir, MDB_RDONLY | MDB_NOLOCK, 0600) != 0 ||
            mdb_env_info(env, &info) != 0 || mdb_env_stat(env, &st) != 0 ||
            stat(file, &sb) != 0)
            _exit(1);
        out->txnid = info.me_last_txnid;
        out->short_file = (uint64_t)(info.me_last_pgno + 1) * st.ms_psize > (uint64_t)sb.st_size;
        _exit(0);
    }
    assert_int_equal(t_wait(c, 10000), 0);
    struct store_peek v = *out;
    t_shared_free(out, sizeof *out);
    return v;
}

static uint64_t store_txnid(const char *dir)
{
    return store_peek(dir).txnid;
}

/* The journal of an FSYNC store as its file shows it, read here without
   the library: the highest group number (lsn) of a group header found at
   a 4 KiB boundary by its magic ("WQJ1"), 0 for none. Each flush that
   writes the journal takes the next number, so the difference between
   two readings counts the groups written in between. */
static uint64_t journal_lsn(const char *dir)
{
    char f[300];
    snprintf(f, sizeof f, "%s/journal", dir);
    int fd = open(f, O_RDONLY);
    if (fd < 0)
        return 0;
    static unsigned char buf[4u << 20];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    uint64_t best = 0;
    for (ssize_t off = 0; off + 40 <= n; off += 4096) {
        uint32_t magic;
        uint64_t lsn;
        memcpy(&magic, buf + off, 4);
        memcpy(&lsn, buf + off + 16, 8);
        if (magic == 0x314a5157u && lsn > best)
            best = lsn;
    }
    return best;
}

struct group_board {
    atomic_int stage;
};

/* Wait (at most 10 s) until an adder waits for this process: the wait
   is visible in the region's header. */
static int until_waited_for(wq *q)
{
    const struct wq_hdr *h = wq__shm(q)->hdr;
    for (int i = 0; i < 10000; i++) {
        if (__atomic_load_n(&h->sync_wait, __ATOMIC_RELAXED) != 0)
            return 0;
        t_sleep_ms(1);
    }
    t_failf(__FILE__, __LINE__, "no adder waited for us in 10 s");
    return 1;
}

static int until_stage(struct group_board *b, int stage)
{
    T_CHECK_EQ(t_wait_count(&b->stage, stage, 20000), 0);
    return 0;
}

/* One case: an FSYNC queue with a store, a waiting time long enough for
   a child under valgrind, our key `first` (if any) in a group of its
   own, then the child, started and at its stage 1. */
struct group_case {
    const char *store, *name;
    struct wq_options o;
    wq *q;
    struct group_board *b;
    pid_t child;
};

static void group_begin(struct group_case *g, const char *tag, const char *first,
                        int (*child)(const char *name, struct group_board *b))
{
    g->store = t_mkstore();
    g->name = t_qname(tag);
    g->o = t_store_opts(g->store, WQ_DURABLE_FSYNC);
    g->o.snapshot_interval_ms = 3600000;   /* no checkpoint by time: the groups alone */
    g->q = t_track(T_OPEN(g->name, &g->o));
    g->b = t_shared_alloc(sizeof *g->b);
    assert_int_equal(setenv("WQ_TEST_SYNC_WAIT_US", "20000000", 1), 0);
    if (first)
        assert_int_equal(wq_add(g->q, first, strlen(first)), 0);
    g->child = t_fork(60);
    if (g->child == 0)
        _exit(child(g->name, g->b));
    assert_int_equal(t_wait_count(&g->b->stage, 1, 20000), 0);
}

/* The child is gone: from the store alone, the region removed (as at a
   reboot), the queue holds `n` keys. */
static void group_end(struct group_case *g, uint64_t n)
{
    T_ASSERT_BOARD_CLEAN();
    assert_int_equal(unsetenv("WQ_TEST_SYNC_WAIT_US"), 0);
    t_shared_free(g->b, sizeof *g->b);
    t_close(g->q);
    char path[300];
    t_shm_path(g->name, path, sizeof path);
    assert_int_equal(unlink(path), 0);
    g->q = t_track(T_OPEN(g->name, &g->o));
    assert_int_equal(wq_len(g->q), n);
}

/* The second adder: c1 alone, c2 while the parent waits for it, then the
   done of c1 while the parent waits again (its removal left to him). */
static int group_child(const char *name, struct group_board *b)
{
    wq *q = NULL;
    char buf[T_KEYBUF];
    T_CHECK_EQ(wq_open(name, NULL, &q), 0);
    T_CHECK_EQ(wq_add(q, KS("c1")), 0);
    atomic_store(&b->stage, 1);
    T_CHECK_EQ(until_waited_for(q), 0);   /* the parent's add of p1 */
    T_CHECK_EQ(wq_add(q, KS("c2")), 0);
    atomic_store(&b->stage, 2);
    T_CHECK_EQ(until_stage(b, 3), 0);
    T_CHECK_EQ(until_waited_for(q), 0);   /* the parent's add of p2 */
    T_CHECK_EQ(wq_get(q, buf, sizeof buf, 0), 2);
    T_CHECK_EQ(memcmp(buf, "c1", 2), 0);
    T_CHECK_EQ(wq_done(q, KS("c1")), 0);
    /* Not written by us: p2 (waiting for its group) and c1's removal are
       both still listed. */
    struct wq_stats s;
    T_CHECK_EQ(wq_stats(q, &s), 0);
    T_CHECK_EQ(s.store_unsynced, 2);
    atomic_store(&b->stage, 4);
    T_CHECK_EQ(until_stage(b, 5), 0);
    wq_close(q);
    return 0;
}

static void test_fsync_group(void **state)
{
    (void)state;
    struct group_case g;
    group_begin(&g, "fsyncgrp", NULL, group_child);
    wq *q = g.q;
    const char *store = g.store;
    struct group_board *b = g.b;
    /* The child was in the last group and has not added since: our add
       waits for it, and its c2 joins the journal group of p1. LMDB takes
       no commit: the journal holds both. */
    uint64_t t0 = store_txnid(store), j0 = journal_lsn(store);
    uint64_t a = t_now_ns();
    assert_int_equal(wq_add(q, KS("p1")), 0);
    uint64_t waited = t_now_ns() - a;
    assert_int_equal(t_wait_count(&b->stage, 2, 20000), 0);
    assert_int_equal(journal_lsn(store) - j0, 1);
    assert_int_equal(store_txnid(store), t0);
    assert_true(waited < 20000000000ull);   /* ended by c2, not the deadline */
    assert_int_equal(wq_len(q), 3);
    /* Again, but the child only takes c1 and dones it: our wait ends at
       its deadline (3 s here: time for the child under valgrind), and
       our commit writes c1's removal. */
    assert_int_equal(setenv("WQ_TEST_SYNC_WAIT_US", "3000000", 1), 0);
    atomic_store(&b->stage, 3);
    j0 = journal_lsn(store);
    a = t_now_ns();
    assert_int_equal(wq_add(q, KS("p2")), 0);
    waited = t_now_ns() - a;
    assert_int_equal(t_wait_count(&b->stage, 4, 20000), 0);
    printf("  p2's add waited %.3f s for an adder that did not come\n", (double)waited / 1e9);
    assert_true(waited >= 2990000000ull);
    assert_int_equal(journal_lsn(store) - j0, 1);   /* p2 and c1's removal */
    assert_int_equal(store_txnid(store), t0);
    assert_int_equal(t_stats(q).store_unsynced, 0);
    /* The child left the groups: no wait now (the fsync alone). */
    a = t_now_ns();
    assert_int_equal(wq_add(q, KS("p3")), 0);
    waited = t_now_ns() - a;
    printf("  p3's add took %.3f s\n", (double)waited / 1e9);
    assert_true(waited < 500000000ull);
    atomic_store(&b->stage, 5);
    assert_int_equal(t_wait(g.child, 20000), 0);
    /* From the store alone: c1 gone, the others in the order added. */
    group_end(&g, 4);
    q = g.q;
    T_EXPECT_GET(q, "p1");
    T_EXPECT_GET(q, "c2");
    T_EXPECT_GET(q, "p2");
    T_EXPECT_GET(q, "p3");
    t_close(q);
}

/* The child adds x while the parent's add of x waits for its group: a
   coalesced add, which returns only once x is stored. */
static int coalesce_child(const char *name, struct group_board *b)
{
    wq *q = NULL;
    T_CHECK_EQ(wq_open(name, NULL, &q), 0);
    T_CHECK_EQ(wq_add(q, KS("c1")), 0);
    atomic_store(&b->stage, 1);
    T_CHECK_EQ(until_waited_for(q), 0);
    T_CHECK_EQ(wq_add(q, KS("x")), 1);   /* coalesced into the parent's */
    struct wq_key_info ki;
    T_CHECK_EQ(t_key_info(q, "x", &ki), 1);   /* found */
    T_CHECK_EQ(ki.state & WQ_KEY_STORING, 0);
    T_CHECK_EQ(ki.state & WQ_KEY_QUEUED, WQ_KEY_QUEUED);
    atomic_store(&b->stage, 2);
    wq_close(q);
    return 0;
}

static void test_fsync_group_coalesce(void **state)
{
    (void)state;
    struct group_case g;
    group_begin(&g, "fsynccoal", NULL, coalesce_child);
    uint64_t a = t_now_ns();
    assert_int_equal(wq_add(g.q, KS("x")), 0);   /* its wait ends when the child stores x */
    assert_true(t_now_ns() - a < 20000000000ull);
    assert_int_equal(t_wait(g.child, 20000), 0);
    assert_int_equal(g.b->stage, 2);
    group_end(&g, 2);
    T_EXPECT_GET(g.q, "c1");
    T_EXPECT_GET(g.q, "x");
    t_close(g.q);
}

/* A waiting adder SIGKILLed in its wait: the removal left to it is
   written by the next flush, its key (added, never acknowledged) is
   stored with the next group and handed out; nothing else changes. */
static int waiter_child(const char *name, struct group_board *b)
{
    wq *q = NULL;
    T_CHECK_EQ(wq_open(name, NULL, &q), 0);
    atomic_store(&b->stage, 1);
    wq_add(q, KS("w1"));   /* waits for the parent: killed in there */
    t_failf(__FILE__, __LINE__, "the waiting add returned");
    return 1;
}

static void test_fsync_group_kill(void **state)
{
    (void)state;
    struct group_case g;
    group_begin(&g, "fsynckill", "p1", waiter_child);   /* p1: a group of ours */
    wq *q = g.q;
    const char *store = g.store;
    pid_t c = g.child;
    assert_int_equal(until_waited_for(q), 0);   /* the child waits for us */
    uint64_t t0 = store_txnid(store), j0 = journal_lsn(store);
    T_EXPECT_GET(q, "p1");
    assert_int_equal(wq_done(q, KS("p1")), 0);   /* left to the waiter */
    assert_int_equal(journal_lsn(store), j0);
    assert_int_equal(t_stats(q).store_unsynced, 2);   /* p1's removal, w1 */
    assert_int_equal(kill(c, SIGKILL), 0);
    assert_int_equal(t_wait(c, 10000), 128 + SIGKILL);
    /* Our next add does not wait for a dead process's key: it writes
       the removal and w1 with p2, in one journal group. */
    uint64_t a = t_now_ns();
    assert_int_equal(wq_add(q, KS("p2")), 0);
    assert_true(t_now_ns() - a < 10000000000ull);
    assert_int_equal(journal_lsn(store) - j0, 1);
    assert_int_equal(store_txnid(store), t0);
    assert_int_equal(t_stats(q).store_unsynced, 0);
    assert_int_equal(wq_check(q, 0), 0);
    T_EXPECT_GET(q, "w1");
    T_EXPECT_GET(q, "p2");
    T_EXPECT_DONE(q, "w1");
    T_EXPECT_DONE(q, "p2");
    assert_int_equal(wq_add(q, KS("p3")), 0);
    group_end(&g, 1);   /* the store agrees: p3 alone */
    T_EXPECT_GET(g.q, "p3");
    t_close(g.q);
}

/* ------------------------------------------------------------------ */
/* FSYNC: changes that need no fsync wait for one                      */
/* ------------------------------------------------------------------ */

/* get and done the key at the front, which must be k */
static void cycle_out(wq *q, const char *k)
{
    T_EXPECT_GET(q, k);
    T_EXPECT_DONE(q, k);
}

/* The queue's region removed (as at a reboot) and rebuilt from the store
   alone: it holds exactly `keys`, in this order. */
static wq *from_store(wq *q, const char *name, const struct wq_options *o,
                      const char *const *keys, size_t n)
{
    t_close(q);
    char path[300];
    t_shm_path(name, path, sizeof path);
    assert_int_equal(unlink(path), 0);
    q = t_track(T_OPEN(name, o));
    assert_int_equal(wq_len(q), n);
    for (size_t i = 0; i < n; i++)
        cycle_out(q, keys[i]);
    return q;
}

/* In a child: add key k (its first store write opens the store), with
   SIGCHLD ignored, as daemons do: the library's own children are then
   reaped by the system, and it must still hear how they ended. */
static int add_child(const char *name, const char *k)
{
    signal(SIGCHLD, SIG_IGN);
    wq *q = NULL;
    T_CHECK_EQ(wq_open(name, NULL, &q), 0);
    T_CHECK_EQ(wq_add(q, KS(k)), 0);
    wq_close(q);
    return 0;
}

/* In a child: take key k, done it, then wait to be killed. */
static int deferred_child(const char *name, const char *k, struct group_board *b)
{
    wq *q = NULL;
    char buf[T_KEYBUF];
    T_CHECK_EQ(wq_open(name, NULL, &q), 0);
    T_CHECK_EQ(wq_get(q, buf, sizeof buf, 0), (int)strlen(k));
    T_CHECK_EQ(memcmp(buf, k, strlen(k)), 0);
    T_CHECK_EQ(wq_done(q, KS(k)), 0);
    atomic_store(&b->stage, 1);
    for (;;)
        pause();
}

/* An FSYNC store writes a journal group where it used to commit to
   LMDB, and every group is synced, so a removal is not written on its
   own: it waits for the next new key's group, DEFER_MAX (1024) listed,
   wq_snapshot, or the interval (an hour here: never). The last three
   write everything listed and then checkpoint: LMDB takes the journal's
   groups in one commit. The witnesses: LMDB's transaction count read by
   a child, the journal's group numbers read from its file, and the store
   read alone. */
static void test_fsync_deferred(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("fsyncdef");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_FSYNC);
    o.snapshot_interval_ms = 3600000;
    o.capacity = 4096;
    wq *q = t_track(T_OPEN(name, &o));
    uint64_t t0 = store_txnid(store), j0 = journal_lsn(store);
    assert_int_equal(j0, 0);   /* no group before the first add */
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_add(q, KS("b")), 0);
    assert_int_equal(wq_add(q, KS("c")), 0);
    assert_int_equal(journal_lsn(store) - j0, 3);   /* an add: a group */
    assert_int_equal(store_txnid(store), t0);       /* and no commit */
    cycle_out(q, "a");
    cycle_out(q, "b");
    assert_int_equal(journal_lsn(store) - j0, 3);   /* a done: nothing */
    assert_int_equal(t_stats(q).store_unsynced, 2);
    assert_int_equal(wq_add(q, KS("d")), 0);   /* one group: d, a and b gone */
    assert_int_equal(journal_lsn(store) - j0, 4);
    assert_int_equal(t_stats(q).store_unsynced, 0);
    cycle_out(q, "c");
    assert_int_equal(wq_snapshot(q), 1);   /* c's removal, then a checkpoint */
    assert_int_equal(journal_lsn(store) - j0, 5);
    assert_int_equal(store_txnid(store) - t0, 1);
    assert_int_equal(wq_snapshot(q), 0);   /* nothing left: nothing written */
    assert_int_equal(journal_lsn(store) - j0, 5);
    assert_int_equal(store_txnid(store) - t0, 1);

    /* 1030 keys in one call: one group; the snapshot's checkpoint puts
       them in LMDB. Then the 1024th listed removal writes them all, and
       a checkpoint. */
    enum { N = 1030 };
    static char kb[N][8];
    struct iovec keys[N];
    for (int i = 0; i < N; i++) {
        snprintf(kb[i], sizeof kb[i], "k%d", i);
        keys[i] = (struct iovec){ kb[i], strlen(kb[i]) };
    }
    assert_int_equal(wq_add_many(q, keys, N), 0);   /* none coalesced */
    assert_int_equal(journal_lsn(store) - j0, 6);
    assert_int_equal(wq_snapshot(q), 0);
    assert_int_equal(store_txnid(store) - t0, 2);
    uint64_t t1 = store_txnid(store);
    cycle_out(q, "d");
    for (int i = 0; i < 1022; i++)
        cycle_out(q, kb[i]);
    assert_int_equal(t_stats(q).store_unsynced, 1023);
    assert_int_equal(store_txnid(store), t1);
    assert_int_equal(journal_lsn(store) - j0, 6);
    cycle_out(q, kb[1022]);   /* the 1024th */
    assert_int_equal(t_stats(q).store_unsynced, 0);
    assert_int_equal(journal_lsn(store) - j0, 7);
    assert_int_equal(store_txnid(store) - t1, 1);
    /* That commit freed pages it had allocated, and LMDB does not write
       those: data.mdb now ends before LMDB's last page. Such a store is
       sound: the child opening it below and the restore at the end must
       not call it damaged (they did, before 2026-11-26). */
    assert_true(store_peek(store).short_file);
    pid_t s1 = t_fork(60);   /* a process opening the store afresh: its add works */
    if (s1 == 0)
        _exit(add_child(name, "s1"));
    assert_int_equal(t_wait(s1, 20000), 0);
    assert_int_equal(journal_lsn(store) - j0, 8);
    assert_int_equal(store_txnid(store), t1 + 1);
    t1 = store_txnid(store);

    /* A process that made a deferred removal and was killed: the region
       keeps it, the next add writes it. */
    struct group_board *b = t_shared_alloc(sizeof *b);
    pid_t c = t_fork(60);
    if (c == 0)
        _exit(deferred_child(name, kb[1023], b));
    assert_int_equal(t_wait_count(&b->stage, 1, 20000), 0);
    assert_int_equal(kill(c, SIGKILL), 0);
    assert_int_equal(t_wait(c, 10000), 128 + SIGKILL);
    t_shared_free(b, sizeof *b);
    assert_int_equal(t_stats(q).store_unsynced, 1);
    assert_int_equal(journal_lsn(store) - j0, 8);
    assert_int_equal(wq_add(q, KS("e")), 0);
    assert_int_equal(journal_lsn(store) - j0, 9);
    assert_int_equal(store_txnid(store), t1);
    assert_int_equal(t_stats(q).store_unsynced, 0);
    assert_int_equal(wq_check(q, 0), 0);
    const char *left[] = { kb[1024], kb[1025], kb[1026], kb[1027], kb[1028], kb[1029], "s1",
                           "e" };
    signal(SIGCHLD, SIG_IGN);   /* the restore's reader child: as add_child */
    q = from_store(q, name, &o, left, sizeof left / sizeof *left);
    signal(SIGCHLD, SIG_DFL);
    t_close(q);
}

/* The interval: a deferred removal is written by the first call that
   finds it passed since the last such write (5 s here: the steps between
   two sleeps take far less, even under valgrind). The count listed is
   read from the header: wq_stats would write what is due. */
static void test_fsync_deferred_interval(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("fsyncivl");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_FSYNC);
    o.snapshot_interval_ms = 5000;
    wq *q = t_track(T_OPEN(name, &o));
    const struct wq_hdr *h = wq__shm(q)->hdr;
    assert_int_equal(wq_add(q, KS("x")), 0);
    assert_int_equal(wq_add(q, KS("y")), 0);
    assert_int_equal(wq_add(q, KS("z")), 0);
    /* A checkpoint now: a journal holding groups is due at the interval
       too, and the lease thread would checkpoint it while we sleep. */
    assert_int_equal(wq_snapshot(q), 0);
    t_sleep_ms(5100);
    uint64_t t0 = store_txnid(store);
    cycle_out(q, "x");   /* due: written by the done itself */
    assert_int_equal(h->sq_count, 0);
    assert_int_equal(store_txnid(store) - t0, 1);
    cycle_out(q, "y");   /* not due: deferred */
    assert_int_equal(h->sq_count, 1);
    assert_int_equal(store_txnid(store) - t0, 1);
    t_sleep_ms(5100);
    T_EXPECT_GET(q, "z");   /* due: y's removal written by the get */
    assert_int_equal(h->sq_count, 0);
    assert_int_equal(store_txnid(store) - t0, 2);
    T_EXPECT_DONE(q, "z");   /* deferred; the last close writes it */
    assert_int_equal(h->sq_count, 1);
    q = from_store(q, name, &o, NULL, 0);
    t_close(q);
}

/* A store queue damaged under a pending removal (its head out of range):
   the flush that meets it flags the region, the lock after rebuilds the
   queue from the entries' marks, and the flush goes on: the removal is
   written, not dropped with a success (it returned 0 before). */
static void test_store_queue_damaged(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("sqbad");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_FSYNC);
    o.snapshot_interval_ms = 3600000;
    wq *q = t_track(T_OPEN(name, &o));
    struct wq_hdr *h = wq__shm(q)->hdr;
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_add(q, KS("b")), 0);
    cycle_out(q, "a");   /* deferred */
    assert_int_equal(h->sq_count, 1);
    uint64_t repairs = t_stats(q).repairs_total, t0 = store_txnid(store);
    h->sq_head = wq__shm(q)->capacity + 7;
    assert_int_equal(wq_snapshot(q), 1);
    assert_int_equal(t_stats(q).repairs_total, repairs + 1);
    assert_int_equal(store_txnid(store) - t0, 1);
    assert_int_equal(h->sq_count, 0);
    assert_int_equal(wq_check(q, 0), 0);
    const char *left[] = { "b" };
    q = from_store(q, name, &o, left, 1);
    t_close(q);
}

/* The entry holding key k, or NULL (any state). */
static struct wq_entry *entry_of(wq *q, const char *k)
{
    struct wq_shm *s = wq__shm(q);
    size_t len = strlen(k);
    for (uint32_t i = 0; i < __atomic_load_n(&s->hdr->e_fresh, __ATOMIC_ACQUIRE); i++) {
        struct wq_entry *e = wq__entry(s, i);
        if (__atomic_load_n(&e->state, __ATOMIC_ACQUIRE) && wq__key_eq(s, e, k, len))
            return e;
    }
    return NULL;
}

struct drop_board {
    atomic_int stage;
    int rc;
    char err[512];
};

/* An adder: opens (stage 1), adds "victim" once told to (stage 2), and
   reports what its add said (stage 3). */
static int drop_child(const char *name, struct drop_board *b)
{
    wq *q = NULL;
    T_CHECK_EQ(wq_open(name, NULL, &q), 0);
    atomic_store(&b->stage, 1);
    T_CHECK_EQ(t_wait_count(&b->stage, 2, 20000), 0);
    b->rc = wq_add(q, KS("victim"));
    snprintf(b->err, sizeof b->err, "%s", wq_last_error());
    atomic_store(&b->stage, 3);
    wq_close(q);
    return 0;
}

static pid_t drop_start(const char *name, struct drop_board *b)
{
    pid_t c = t_fork(60);
    if (c == 0)
        _exit(drop_child(name, b));
    assert_int_equal(t_wait_count(&b->stage, 1, 20000), 0);
    return c;
}

/* A thorough repair drops a damaged key while its FSYNC adder, and a
   second adder that coalesced into it, wait for the flush lock (held
   here) to store it. Both adds used to succeed (0 and 1): the key was
   "not STORING" any more, as if stored, yet it is in neither the region
   nor the store. Both now fail with -EBADMSG and say why; an add with no
   repair meanwhile is not affected. */
static void test_store_add_dropped(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("sqdrop");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_FSYNC);
    o.snapshot_interval_ms = 3600000;   /* wq_stats writes nothing (we hold the flush lock) */
    wq *q = t_track(T_OPEN(name, &o));
    struct wq_shm *s = wq__shm(q);
    assert_int_equal(wq_add(q, KS("a")), 0);
    struct drop_board *b = t_shared_alloc(2 * sizeof *b);
    pid_t c1 = drop_start(name, &b[0]), c2 = drop_start(name, &b[1]);
    assert_int_equal(pthread_mutex_lock(&s->hdr->flush_lock), 0);
    /* Released before any assertion: a failing one would leave it held
       for the teardown's wq_unlink, which flushes. */
    atomic_store(&b[0].stage, 2);
    struct wq_entry *e = NULL;
    uint64_t end = t_now_ns() + 20000000000ull * t_scale();
    while (!e && t_now_ns() < end) {   /* marked, waiting to be stored */
        e = entry_of(q, "victim");
        if (!e || !(__atomic_load_n(&e->state, __ATOMIC_ACQUIRE) & WQ_ST_STORING)) {
            e = NULL;
            t_sleep_ms(1);
        }
    }
    uint64_t merged = __atomic_load_n(&s->hdr->coalesced_total, __ATOMIC_RELAXED);
    if (e)
        atomic_store(&b[1].stage, 2);   /* coalesces into the STORING key */
    while (e && __atomic_load_n(&s->hdr->coalesced_total, __ATOMIC_RELAXED) == merged &&
           t_now_ns() < end)
        t_sleep_ms(1);
    bool coalesced = __atomic_load_n(&s->hdr->coalesced_total, __ATOMIC_RELAXED) == merged + 1;
    int fixed = -1;
    bool gone = false;
    if (e && coalesced) {
        uint64_t repairs = s->hdr->repairs_total;
        e->keylen = 0xffff;   /* damage: the repair drops the entry */
        /* Violations found, then repaired; or none left, when a locker
           (a lease thread's tick) met the damage first and repaired it
           (CI's valgrind run saw 0 here). */
        fixed = wq_check(q, WQ_CHECK_REPAIR);
        if (fixed == 0 && s->hdr->repairs_total > repairs)
            fixed = 1;
        gone = entry_of(q, "victim") == NULL;
    }
    assert_int_equal(pthread_mutex_unlock(&s->hdr->flush_lock), 0);
    assert_non_null(e);
    assert_true(coalesced);
    assert_true(fixed > 0);
    assert_true(gone);
    assert_int_equal(t_wait(c1, 20000), 0);
    assert_int_equal(t_wait(c2, 20000), 0);
    T_ASSERT_BOARD_CLEAN();
    char want[512];
    snprintf(want, sizeof want, "queue '%s': the region was repaired while this add waited "
             "for its store commit, and a key it added is gone: it may not be stored; add it "
             "again", name);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(b[i].stage, 3);
        assert_int_equal(b[i].rc, -EBADMSG);
        assert_string_equal(b[i].err, want);
    }
    t_shared_free(b, 2 * sizeof *b);
    /* Added again, it is stored; an add with no repair meanwhile returns 0. */
    assert_int_equal(wq_add(q, KS("victim")), 0);
    assert_int_equal(wq_check(q, 0), 0);
    const char *left[] = { "a", "victim" };
    q = from_store(q, name, &o, left, 2);
    t_close(q);
}

/* ------------------------------------------------------------------ */
/* The lease thread's writes (idle queues)                             */
/* ------------------------------------------------------------------ */

/* Wait (at most 10 s, times t_scale) until the store queue is empty and
   an FSYNC store's journal checkpointed (j_tail back at 0): relaxed reads
   of the header, which take no lock and write nothing. */
static bool until_written(wq *q)
{
    const struct wq_hdr *h = wq__shm(q)->hdr;
    uint64_t end = t_now_ns() + 10000000000ull * t_scale();
    while (__atomic_load_n(&h->sq_count, __ATOMIC_RELAXED) != 0 ||
           __atomic_load_n(&h->j_tail, __ATOMIC_RELAXED) != 0) {
        if (t_now_ns() > end)
            return false;
        t_sleep_ms(5);
    }
    return true;
}

/* A queue nobody calls: what the store is due is written by the lease
   thread of a process that merely has it open. FSYNC: a deferred removal
   once the interval passed, and the new key of an adder killed before
   its commit (invisible until then: a later add of anything used to be
   the only way it became visible). NONE: the periodic snapshot. */
static void test_idle_writes(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("idlefs");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_FSYNC);
    o.snapshot_interval_ms = 300;
    wq *q = t_track(T_OPEN(name, &o));
    const struct wq_hdr *h = wq__shm(q)->hdr;
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_add(q, KS("b")), 0);
    assert_int_equal(wq_snapshot(q), 0);   /* the journal checkpointed: nothing due */
    t_sleep_ms(400);
    cycle_out(q, "a");   /* due: written by the done itself */
    cycle_out(q, "b");   /* deferred */
    assert_int_equal(h->sq_count, 1);
    uint64_t t0 = store_txnid(store);
    assert_true(until_written(q));
    assert_int_equal(store_txnid(store) - t0, 1);

    t_close(q);

    /* A fresh queue with an interval long enough for the child to reach
       its own commit before anything is due (seconds under valgrind). */
    store = t_mkstore();
    name = t_qname("idlelate");
    o = t_store_opts(store, WQ_DURABLE_FSYNC);
    o.snapshot_interval_ms = 1500 * t_scale();
    q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_add(q, KS("early")), 0);
    cycle_out(q, "early");   /* its removal deferred: not due for 1.5 s */
    pid_t c = t_fork(60);   /* killed at its journal write: "late" is STORING */
    if (c == 0) {
        wq *cq = NULL;
        if (wq_open(name, NULL, &cq) < 0)
            _exit(1);
        wq_fault_arm("store.journal", 1, WQ_FAULT_KILL);
        wq_add(cq, KS("late"));
        _exit(2);
    }
    assert_int_equal(t_wait(c, 20000), 128 + SIGKILL);
    assert_int_equal(wq__shm(q)->hdr->sq_count, 2);   /* early's removal, late */
    assert_int_equal(wq_len(q), 0);   /* nobody can get late yet */
    t0 = store_txnid(store);
    assert_true(until_written(q));
    assert_int_equal(store_txnid(store) - t0, 1);
    assert_int_equal(wq_len(q), 1);
    const char *left[] = { "late" };
    q = from_store(q, name, &o, left, 1);
    t_close(q);

    store = t_mkstore();
    name = t_qname("idlenone");
    o = t_store_opts(store, WQ_DURABLE_NONE);
    o.snapshot_interval_ms = 300;
    q = t_track(T_OPEN(name, &o));
    t_sleep_ms(400);
    t0 = store_txnid(store);
    assert_int_equal(wq_add(q, KS("n1")), 0);   /* due: this add writes it */
    assert_int_equal(wq_add(q, KS("n2")), 0);   /* not due */
    assert_int_equal(wq__shm(q)->hdr->sq_count, 1);
    assert_true(until_written(q));
    assert_int_equal(store_txnid(store) - t0, 2);
    const char *both[] = { "n1", "n2" };
    q = from_store(q, name, &o, both, 2);
    t_close(q);
}

struct closer {
    wq *q;
    atomic_int done;
};

static void *closer_main(void *arg)
{
    struct closer *c = arg;
    t_close(c->q);
    atomic_store(&c->done, 1);
    return NULL;
}

/*
 * wq_close holds the region lock while it stops its lease thread. That
 * thread used to write a reaped key's failure count with a flush that
 * blocks on the flush lock and then the region lock: held up at the flush
 * lock (taken here, as a flusher of another process would) until the
 * close began, it then waited for the region lock the close held, and the
 * close waited for it forever. The lease thread's writes now never wait
 * for either lock.
 */
static void test_idle_close(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("idleclose");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_PROCESS);
    wq *q = t_track(T_OPEN(name, &o));
    struct wq_hdr *h = wq__shm(q)->hdr;
    assert_int_equal(wq_add(q, KS("k")), 0);
    pid_t c = t_fork(60);   /* gets k and dies holding it */
    if (c == 0) {
        wq *cq = NULL;
        char buf[T_KEYBUF];
        if (wq_open(name, NULL, &cq) < 0 || wq_get(cq, buf, sizeof buf, 0) != 1)
            _exit(1);
        raise(SIGKILL);
        _exit(2);
    }
    assert_int_equal(t_wait(c, 20000), 128 + SIGKILL);
    assert_int_equal(pthread_mutex_lock(&h->flush_lock), 0);
    /* Our lease thread reaps k (back with a failure count, listed for
       the store) within about a second, then tries to write it. */
    uint64_t end = t_now_ns() + 10000000000ull * t_scale();
    while (__atomic_load_n(&h->processing, __ATOMIC_RELAXED) != 0 && t_now_ns() < end)
        t_sleep_ms(5);
    bool reaped = __atomic_load_n(&h->processing, __ATOMIC_RELAXED) == 0;
    t_sleep_ms(300);   /* its write reaches the flush lock */
    uint32_t listed = __atomic_load_n(&h->sq_count, __ATOMIC_RELAXED);
    struct closer cl = { .q = q };
    pthread_t t;
    int e = pthread_create(&t, NULL, closer_main, &cl);
    if (e == 0)
        t_sleep_ms(300);   /* the close holds the region lock, joining */
    assert_int_equal(pthread_mutex_unlock(&h->flush_lock), 0);
    assert_int_equal(e, 0);
    end = t_now_ns() + 10000000000ull * t_scale();
    while (!atomic_load(&cl.done) && t_now_ns() < end)
        t_sleep_ms(5);
    if (!atomic_load(&cl.done))
        t_fatal("wq_close and its lease thread are deadlocked");
    pthread_join(t, NULL);
    assert_true(reaped);
    assert_int_equal(listed, 1);   /* k's failure count: a write was due */
    /* The last close wrote the failure count: k comes back with it,
       waiting out its backoff (2 h: t_store_opts). */
    char path[300];
    t_shm_path(name, path, sizeof path);
    assert_int_equal(unlink(path), 0);
    q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_len(q), 0);
    assert_int_equal(t_stats(q).waiting, 1);
    assert_int_equal(wq_num_requeues(q, KS("k")), 1);
    t_close(q);
}

/*
 * The lease thread of a process that never wrote to the store (it only
 * attached) must not open the store's environment: that takes LMDB's
 * writer lock, which a flusher of another process holds while it waits
 * for the region lock, which our wq_close holds while it stops the lease
 * thread. Here the parent is that flusher (the flush lock and LMDB's
 * writer lock held, then the region lock wanted) and the child attaches,
 * lets a snapshot fall due, and closes. When the lease thread opened the
 * environment before it tried the flush lock, the close and the parent
 * waited for each other (a helper's review found it).
 */
static void test_idle_close_env(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("idleenv");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_NONE);
    o.snapshot_interval_ms = 300;
    wq *q = t_track(T_OPEN(name, &o));
    struct wq_shm *s = wq__shm(q);
    struct group_board *b = t_shared_alloc(sizeof *b);
    pid_t c = t_fork(60);
    if (c == 0) {
        wq *cq = NULL;
        if (until_stage(b, 1) || wq_open(name, NULL, &cq) < 0)
            _exit(1);
        t_sleep_ms(1000);   /* ticks: a snapshot is due */
        atomic_store(&b->stage, 2);
        wq_close(cq);
        _exit(0);
    }
    assert_int_equal(wq_add(q, KS("x")), 0);
    t_sleep_ms(400);
    assert_int_equal(wq_add(q, KS("y")), 0);   /* due: x and y written */
    assert_int_equal(wq_add(q, KS("z")), 0);   /* listed, due in 300 ms */
    assert_int_equal(s->hdr->sq_count, 1);
    struct wq_env *env;
    MDB_txn *txn;
    assert_int_equal(wq__lmdb_env(s->g.store_path, 0600, false, &env), 0);
    assert_int_equal(pthread_mutex_lock(&s->hdr->flush_lock), 0);
    assert_int_equal(wq__lmdb_txn(env, 0, &txn), 0);   /* LMDB's writer lock */
    atomic_store(&b->stage, 1);
    int st = t_wait_count(&b->stage, 2, 20000);
    t_sleep_ms(200);   /* the close holds the region lock, joining */
    int lr = -EBUSY;
    uint64_t end = t_now_ns() + 5000000000ull * t_scale();
    while (lr == -EBUSY && t_now_ns() < end) {   /* as a flusher: the region lock */
        if ((lr = wq__lock_try(s)) == -EBUSY)
            t_sleep_ms(5);
    }
    if (lr == 0)
        wq__unlock(s);
    mdb_txn_abort(txn);
    assert_int_equal(pthread_mutex_unlock(&s->hdr->flush_lock), 0);
    assert_int_equal(st, 0);
    assert_int_equal(lr, 0);
    assert_int_equal(t_wait(c, 20000), 0);
    t_shared_free(b, sizeof *b);
    const char *all[] = { "x", "y", "z" };
    q = from_store(q, name, &o, all, 3);
    t_close(q);
}

/* A full queue whose room is held by deferred removals: an add makes
   room by writing them (synced), and loses nothing. */
static void test_fsync_deferred_full(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("fsyncfull");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_FSYNC);   /* capacity 64 */
    o.snapshot_interval_ms = 3600000;
    wq *q = t_track(T_OPEN(name, &o));
    static char kb[74][8];
    struct iovec keys[74];
    for (int i = 0; i < 74; i++) {
        snprintf(kb[i], sizeof kb[i], "f%d", i);
        keys[i] = (struct iovec){ kb[i], strlen(kb[i]) };
    }
    assert_int_equal(wq_add_many(q, keys, 64), 0);
    assert_int_equal(wq_add(q, KS("over")), -ENOSPC);
    for (int i = 0; i < 10; i++)
        cycle_out(q, kb[i]);
    assert_int_equal(t_stats(q).store_unsynced, 10);
    uint64_t t0 = store_txnid(store);
    assert_int_equal(wq_add_many(q, keys + 64, 10), 0);
    assert_int_equal(t_stats(q).store_unsynced, 0);
    assert_true(store_txnid(store) - t0 >= 1);
    assert_int_equal(wq_len(q), 64);
    const char *left[64];
    for (int i = 0; i < 64; i++)
        left[i] = kb[10 + i];
    q = from_store(q, name, &o, left, 64);
    /* Restored with only the store's path, the queue is the same one: the
       interval too (it came back as 1 s, and the full options then met
       -EEXIST). */
    t_close(q);
    char path[300];
    t_shm_path(name, path, sizeof path);
    assert_int_equal(unlink(path), 0);
    struct wq_options only = { .flags = WQ_CREATE, .store_path = store };
    q = t_track(T_OPEN(name, &only));
    t_close(q);
    o.flags &= ~(unsigned)WQ_EXCL;   /* it exists: the same settings, asked again */
    q = t_track(T_OPEN(name, &o));
    t_close(q);
}

/* An observer (WQ_OBSERVE, as wqctl check) that reaps a dead holder's
   key writes the requeue to the store at once: its close writes nothing,
   and the queue's only worker is dead. After a restart (the region
   removed) the key comes back with its crash counted. */
static void test_observer_reap_written(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("obsreap");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_PROCESS);
    wq *q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_add(q, KS("k")), 0);
    t_close(q);
    pid_t c = t_fork(20);
    if (c == 0) {
        wq *w = NULL;
        char buf[WQ_MAX_KEY_LEN];
        if (wq_open(name, NULL, &w) != 0 || wq_get(w, buf, sizeof buf, 0) != 1)
            _exit(1);
        raise(SIGKILL);
    }
    assert_int_equal(t_wait(c, 10000), 128 + SIGKILL);
    const struct wq_options look = { .flags = WQ_OBSERVE };
    wq *ob = NULL;
    assert_int_equal(wq_open(name, &look, &ob), 0);
    T_EXPECT_STATS(ob, 1, 0, 1, 0, "held by the dead worker");
    /* Nothing else after the check: wq_stats would write the store too. */
    assert_int_equal(wq_check(ob, WQ_CHECK_REAP), 0);   /* a crash is no violation */
    wq_close(ob);
    char path[300];
    t_shm_path(name, path, sizeof path);
    assert_int_equal(unlink(path), 0);
    q = t_track(T_OPEN(name, &o));   /* restored from the store alone */
    assert_int_equal(wq_num_requeues(q, KS("k")), 1);
    /* The crash's requeue waits out its backoff (the limiter's 2 h). */
    T_EXPECT_STATS(q, 1, 0, 0, 1, "restored");
    t_close(q);
}

/* ------------------------------------------------------------------ */
/* A reader that hangs (a cycle of pages)                              */
/* ------------------------------------------------------------------ */

struct hung_lines {
    int cut, n;
    char stalled[120];   /* the words of a hung walk */
    char last[300];
};

static void hung_line(const char *what, void *arg)
{
    struct hung_lines *l = arg;
    printf("  salvage: %s\n", what);
    fflush(stdout);
    l->n++;
    if (strncmp(what, "walk cut short: ", 16) == 0 && strcmp(what + 16, l->stalled) == 0)
        l->cut++;
    snprintf(l->last, sizeof l->last, "%s", what);
}

/* The store's reader walks LMDB in a child; one that stops making
   progress (WQ_FAULT_HANG at its nth record: what a cycle of pages does)
   is killed after the stall time (200 ms times t_scale() here,
   WQ_TEST_STALL_MS: a slow build's reader must not look hung). A
   restore then fails and builds nothing; a salvage goes on from the last
   record read and keeps every record; a walk that hangs before its first
   record ends the salvage after three such walks in a row. */
static void test_hung_walk(void **state)
{
    (void)state;
    enum { N = 5000 };
    const char *store = t_mkstore(), *name = t_qname("hung");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_PROCESS);
    o.capacity = 8192;
    wq *q = t_track(T_OPEN(name, &o));
    static char kb[N][8];
    static struct iovec keys[N];
    for (int i = 0; i < N; i++) {
        snprintf(kb[i], sizeof kb[i], "h%d", i);
        keys[i] = (struct iovec){ kb[i], strlen(kb[i]) };
    }
    assert_int_equal(wq_add_many(q, keys, N), 0);
    t_close(q);
    char path[300];
    t_shm_path(name, path, sizeof path);
    assert_int_equal(unlink(path), 0);

    char ms[16], stalled[120];
    snprintf(ms, sizeof ms, "%u", (unsigned)(200 * t_scale()));
    snprintf(stalled, sizeof stalled, "walking it made no progress for %s ms (a cycle of "
             "pages?)", ms);
    assert_int_equal(setenv("WQ_TEST_STALL_MS", ms, 1), 0);
    assert_int_equal(wq_fault_arm("store.read.record", 2000, WQ_FAULT_HANG), 0);
    wq *r = (wq *)&o;
    assert_int_equal(wq_open(name, &o, &r), -EUCLEAN);
    assert_ptr_equal(r, (wq *)&o);
    if (!strstr(wq_last_error(), stalled))
        fail_msg("a hung restore said: %s", wq_last_error());
    assert_int_equal(access(path, F_OK), -1);   /* no region was built */
    assert_int_equal(errno, ENOENT);

    /* Each walk hangs at its 2000th record, after sending a buffer or
       more: every next walk starts after the last record read. */
    struct hung_lines l = { 0 };
    snprintf(l.stalled, sizeof l.stalled, "%s", stalled);
    assert_int_equal(wq_store_salvage(store, NULL, hung_line, &l), N);
    assert_in_range(l.cut, 2, 10);
    assert_int_equal(l.n, l.cut + 1);
    assert_non_null(strstr(l.last, "kept 5000 records; dropped 0 damaged, 0 missing (LMDB "
                                   "could not walk all of it); the damaged store is kept at"));
    wq_fault_arm(NULL, 0, 0);
    o.flags = WQ_CREATE | WQ_RESTORE;
    q = t_track(T_OPEN(name, &o));
    T_EXPECT_STATS(q, N, N, 0, 0, "restored from the salvaged store");
    static bool seen[N];
    memset(seen, 0, sizeof seen);
    char buf[WQ_MAX_KEY_LEN + 1];
    for (int i = 0; i < N; i++) {
        int n = wq_get(q, buf, sizeof buf, 0);
        assert_in_range(n, 2, 5);
        buf[n] = 0;
        int k = atoi(buf + 1);
        assert_in_range(k, 0, N - 1);
        assert_false(seen[k]);
        seen[k] = true;
    }
    assert_int_equal(wq_get(q, buf, sizeof buf, 0), -EAGAIN);
    t_close(q);
    assert_int_equal(unlink(path), 0);

    /* Hung before the first record, every time: three walks, then the
       salvage ends (without the bound it steps through the key space,
       a stall time a step). */
    assert_int_equal(wq_fault_arm("store.read.record", 1, WQ_FAULT_HANG), 0);
    memset(&l, 0, sizeof l);
    snprintf(l.stalled, sizeof l.stalled, "%s", stalled);
    assert_int_equal(wq_store_salvage(store, NULL, hung_line, &l), 0);
    wq_fault_arm(NULL, 0, 0);
    unsetenv("WQ_TEST_STALL_MS");
    assert_int_equal(l.cut, 3);
    assert_int_equal(l.n, 5);   /* and the meta, which no walk sent, and the summary */
    assert_non_null(strstr(l.last, "kept 0 records; dropped 0 damaged"));
}

/* ------------------------------------------------------------------ */
/* main: the group in a child, then every store removed                */
/* ------------------------------------------------------------------ */

int main(void)
{
    static const struct CMUnitTest tests[] = {
        T_STORE_TEST(test_none_durability),
        T_STORE_TEST(test_durability_asked_for),
        T_STORE_TEST(test_none_clean_exit_keeps),
        T_STORE_TEST(test_none_child_close_last),
        T_STORE_TEST(test_full_store),
        T_STORE_TEST(test_full_store_turns),
        T_STORE_TEST(test_snapshot_no_store),
        T_STORE_TEST(test_fsync_group),
        T_STORE_TEST(test_fsync_group_coalesce),
        T_STORE_TEST(test_fsync_group_kill),
        T_STORE_TEST(test_fsync_deferred),
        T_STORE_TEST(test_fsync_deferred_interval),
        T_STORE_TEST(test_fsync_deferred_full),
        T_STORE_TEST(test_store_queue_damaged),
        T_STORE_TEST(test_store_add_dropped),
        T_STORE_TEST(test_idle_writes),
        T_STORE_TEST(test_idle_close),
        T_STORE_TEST(test_idle_close_env),
        T_STORE_TEST(test_observer_reap_written),
        T_STORE_TEST(test_hung_walk),
        T_NO_LEFTOVERS,
    };
    static const struct t_guard g = {
        .prog = "test-store-durability",
        .max_stores = 64,
        .deadline_s = 300,
        T_GUARD_TESTS(tests),
    };
    return t_guard_main(&g);
}
