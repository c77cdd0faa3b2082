/*
 * test-shm.c - regressions of the shared-memory engine's defences, each a
 * defect the core once had (white-box: links libwq-fault.la and reaches
 * into the region through src/shm/shm.h where a corruption must be
 * staged):
 *   - wq_add_many on a queue with a store whose only room is held by
 *     removals the store has not written: all keys added, or none;
 *   - a store settle that meets a corrupt structure leaves the region for
 *     the next locker to repair (it used to clear busy over a half-done
 *     change);
 *   - a fair heap holding an index just past capacity, or far out of
 *     range: -EBADMSG and a repair, never a stray write;
 *   - the region lock must be robust and process-shared: a refused
 *     attribute fails wq_open and publishes nothing;
 *   - "lock held" preconditions are asserted (debug builds);
 *   - one liveness probe: a damaged lease asks the pid, and the reaper
 *     and wq_check agree about it;
 *   - errors: a damaged store is -EUCLEAN, not the region's -EBADMSG, and
 *     LMDB's "full" codes never surface as -EAGAIN;
 *   - WQ_RESTORE refuses a directory that holds no store, creating nothing;
 *   - the region is a sparse file whose entries and result slots are
 *     reserved as keys and results arrive: a new default queue takes
 *     under 1 MiB, freed entries are reused before new pages, and a
 *     growth the system refuses is -ENOSPC with the queue named, losing
 *     nothing (an add, a batch, a result) and evicting no idle key; a
 *     process killed in the middle of a growth costs nothing; damaged
 *     growth counts are reserved for, never trusted;
 *   - a big queue prefetches behind its front: a bad ring slot or a
 *     garbage hash there changes nothing the caller sees; a get that
 *     meets a corrupt front flags the region for the next locker.
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
#include <sys/wait.h>
#include <unistd.h>

#include "shm/shm.h"
#include "store/format.h"

static void get_done(wq *q, const char *key)
{
    T_EXPECT_GET(q, key);
    T_EXPECT_DONE(q, key);
}

/* Capacity 4, store with WQ_DURABLE_NONE and a long snapshot interval:
   two keys done become zombies (their removals not written yet). A batch
   of 4 new keys needs their entries: it makes the room first and adds
   all four (it used to add two and return -ENOSPC). */
static void test_add_many_room_from_zombies(void **state)
{
    (void)state;
    struct wq_options o = { .capacity = 4, .store_path = t_mkstore(),
                            .durability = WQ_DURABLE_NONE,
                            .snapshot_interval_ms = 3600 * 1000 };
    wq *q = t_track(t_create("manyzomb", &o, NULL));
    assert_int_equal(wq_add(q, KS("z1")), 0);
    assert_int_equal(wq_add(q, KS("z2")), 0);
    get_done(q, "z1");
    get_done(q, "z2");
    struct iovec keys[4] = { { "n1", 2 }, { "n2", 2 }, { "n3", 2 }, { "n4", 2 } };
    assert_int_equal(wq_add_many(q, keys, 4), 0);
    assert_int_equal(wq_len(q), 4);
    struct iovec more[1] = { { "n5", 2 } };
    assert_int_equal(wq_add_many(q, more, 1), -ENOSPC);   /* really full */
    assert_int_equal(wq_len(q), 4);
    for (int i = 1; i <= 4; i++) {
        char k[4];
        snprintf(k, sizeof k, "n%d", i);
        get_done(q, k);
    }
    t_check_clean(q, __func__);
    t_close(q);
}

/* Without a store the same batch evicts idle keys kept for a failure
   count, in place, and a batch that cannot fit adds nothing. */
static void test_add_many_all_or_none(void **state)
{
    (void)state;
    struct wq_options o = { .capacity = 4 };
    wq *q = t_track(t_create("manyall", &o, NULL));
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_add(q, KS("b")), 0);
    struct iovec keys[3] = { { "c", 1 }, { "d", 1 }, { "e", 1 } };
    assert_int_equal(wq_add_many(q, keys, 3), -ENOSPC);
    assert_int_equal(wq_len(q), 2);
    assert_int_equal(t_key_state(q, "c"), 0);
    struct iovec dup[3] = { { "c", 1 }, { "c", 1 }, { "a", 1 } };
    assert_int_equal(wq_add_many(q, dup, 3), 2);   /* 1 new, 2 coalesced */
    assert_int_equal(wq_len(q), 3);
    t_check_clean(q, __func__);
    t_close(q);
}

/* A corrupt ring count makes the settle of a stored key fail to queue
   it. The region must be left for repair (flagged): the next locker
   rebuilds the ring and the key is handed out once. */
static void test_settle_failure_repaired(void **state)
{
    (void)state;
    struct wq_options o = { .capacity = 4, .store_path = t_mkstore() };
    wq *q = t_track(t_create("settle", &o, NULL));
    struct wq_shm *s = wq__shm(q);
    /* head 0, count == capacity: no push fits, no index is out of range */
    s->hdr->ring_pos = (uint64_t)4 << 32;
    uint64_t repairs = s->hdr->repairs_total;
    /* Stored: the add succeeded. The settle flagged the region and left it
       for the next locker: the add's own last look (is its key still
       there?) locks once more, and repairs it. */
    assert_int_equal(wq_add(q, KS("k")), 0);
    assert_int_equal(s->hdr->repairs_total, repairs + 1);
    assert_int_equal(s->hdr->corrupt, 0);
    t_check_clean(q, __func__);
    assert_int_equal(wq_len(q), 1);
    get_done(q, "k");
    T_EXPECT_GET_RC(q, -EAGAIN);
    t_check_clean(q, __func__);
    t_close(q);
}

/* Fair heaps with an index of exactly capacity (the first byte past the
   per-entry fair data: writing through it lands in the next section) or
   far out of range: the get reports -EBADMSG or hands out a real key,
   the next locker repairs, and every key comes out exactly once. */
static void fair_corrupt(uint32_t bad, bool age_heap)
{
    struct wq_options o = { .capacity = 8, .flags = WQ_FAIR };
    wq *q = t_track(t_create(age_heap ? "fairage" : "fairprio", &o, NULL));
    const char *keys[] = { "t1/a", "t2/b", "t1/c", "t3/d" };
    for (int i = 0; i < 4; i++)
        assert_int_equal(wq_add(q, keys[i], strlen(keys[i])), 0);
    struct wq_shm *s = wq__shm(q);
    uint32_t *heap = age_heap ? s->fheap_a : s->fheap_p;
    heap[1] = bad;
    int got[4] = { 0 }, rounds = 0, n;
    char buf[T_KEYBUF];
    while ((n = wq_get(q, buf, sizeof buf, 0)) != -EAGAIN && rounds++ < 20) {
        if (n == -EBADMSG)
            continue;   /* the next call repairs */
        assert_true(n > 0);
        int i;
        for (i = 0; i < 4 && !((size_t)n == strlen(keys[i]) && !memcmp(buf, keys[i], n)); i++)
            ;
        assert_true(i < 4);
        got[i]++;
        assert_int_equal(wq_done(q, buf, (size_t)n), 0);
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(got[i], 1);
    t_check_clean(q, __func__);
    t_close(q);
}

static void test_fair_heap_index_past_capacity(void **state)
{
    (void)state;
    fair_corrupt(8, false);
    fair_corrupt(8, true);
    fair_corrupt(0x7fffffff, false);
}

/* A system that refuses a robust or process-shared mutex: wq_open fails
   and no region is published. */
static void test_mutex_attr_refused(void **state)
{
    (void)state;
    const char *name = t_qname("mutexattr");
    struct wq_options o = { .capacity = 4, .flags = WQ_CREATE };
    wq *q = NULL;
    assert_int_equal(wq_fault_arm("mutex.attr", 1, WQ_FAULT_FAIL), 0);
    assert_int_equal(wq_open(name, &o, &q), -ENOTSUP);
    wq_fault_arm(NULL, 0, 0);
    assert_null(q);
    char path[256];
    t_shm_path(name, path, sizeof path);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(wq_open(name, &o, &q), 0);   /* and works once allowed */
    wq_close(q);
}

/* Debug builds assert "lock held" where the comments require it: a ring
   push without the lock aborts. */
static void test_lock_held_asserted(void **state)
{
    (void)state;
#ifndef WQ_DEBUG
    skip();
#else
    struct wq_options o = { .capacity = 4 };
    wq *q = t_track(t_create("lockheld", &o, NULL));
    pid_t c = t_fork(10);
    if (c == 0) {
        signal(SIGABRT, SIG_DFL);
        struct wq_shm *s = wq__shm(q);
        s->hdr->busy = 1;   /* only the lock is missing */
        wq__ring_push(s, 0);
        _exit(0);
    }
    assert_int_equal(t_wait(c, 10000), 128 + SIGABRT);
    t_close(q);
#endif
}

/* A lease whose mutex word is damaged answers neither "held" nor "owner
   died": the pid decides. Dead pid: the slot is reaped and its key comes
   back. Live pid: the key stays with its holder, in the reaper and in
   wq_check's repair of an illegal slot state alike. */
static void damage_lease(struct wq_proc *p)
{
    memset(&p->lease, 0xff, sizeof p->lease);
}

static void test_damaged_lease_dead_pid(void **state)
{
    (void)state;
    struct wq_options o = { .capacity = 8, .rl_base_delay_ns = 1, .rl_max_delay_ns = 1 };
    const char *name;
    wq *q = t_track(t_create("leasedead", &o, &name));
    assert_int_equal(wq_add(q, KS("k")), 0);
    pid_t c = t_fork(10);
    if (c == 0) {
        wq *cq;
        char buf[T_KEYBUF];
        if (wq_open(name, NULL, &cq) < 0 || wq_get(cq, buf, sizeof buf, 0) != 1)
            _exit(1);
        raise(SIGKILL);
    }
    assert_int_equal(t_wait(c, 10000), 128 + SIGKILL);
    struct wq_shm *s = wq__shm(q);
    for (uint32_t i = 0; i < s->max_procs; i++)
        if (s->procs[i].state == WQ_PROC_LIVE && s->procs[i].pid == c)
            damage_lease(&s->procs[i]);
    assert_int_equal(wq_check(q, WQ_CHECK_REAP), 0);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.crash_requeues_total, 1);
    assert_int_equal(st.processes, 1);
    char buf[T_KEYBUF];
    assert_int_equal(wq_get(q, buf, sizeof buf, (int64_t)SEC), 1);
    t_close(q);
}

static void test_damaged_lease_live_pid(void **state)
{
    (void)state;
    struct wq_options o = { .capacity = 8 };
    const char *name;
    wq *q = t_track(t_create("leaselive", &o, &name));
    assert_int_equal(wq_add(q, KS("k")), 0);
    int *sync = t_shared_alloc(4096);
    pid_t c = t_fork(20);
    if (c == 0) {
        wq *cq;
        char buf[T_KEYBUF];
        if (wq_open(name, NULL, &cq) < 0 || wq_get(cq, buf, sizeof buf, 0) != 1)
            _exit(1);
        sync[0] = 1;
        pause();
        _exit(0);
    }
    while (!sync[0])
        t_sleep_ms(1);
    struct wq_shm *s = wq__shm(q);
    uint32_t slot = WQ_NIL;
    for (uint32_t i = 0; i < s->max_procs; i++)
        if (s->procs[i].state == WQ_PROC_LIVE && s->procs[i].pid == c)
            slot = i;
    assert_int_not_equal(slot, WQ_NIL);
    damage_lease(&s->procs[slot]);
    assert_int_equal(wq_check(q, WQ_CHECK_REAP), 0);   /* the reaper: alive */
    assert_int_equal(t_key_state(q, "k"), WQ_KEY_PROCESSING);
    s->procs[slot].state = 7;   /* an illegal state word: wq_check repairs it */
    assert_true(wq_check(q, WQ_CHECK_REPAIR) > 0);
    assert_int_equal(s->procs[slot].state, WQ_PROC_LIVE);   /* ... as alive */
    assert_int_equal(t_key_state(q, "k"), WQ_KEY_PROCESSING);
    assert_int_equal(t_stats(q).crash_requeues_total, 0);
    kill(c, SIGKILL);
    t_wait(c, 10000);
    t_shared_free(sync, 4096);
    /* The pid is gone now: the damaged lease's slot is reaped. */
    assert_int_equal(wq_check(q, WQ_CHECK_REAP), 0);
    assert_int_equal(t_stats(q).crash_requeues_total, 1);
    t_close(q);
}

/* Errors: a damaged store is -EUCLEAN, the region's corruption -EBADMSG;
   their messages differ and only the region's suggests a repair. LMDB's
   "full" codes never look like wq_get's "nothing queued". */
static void test_store_errors_distinct(void **state)
{
    (void)state;
    assert_int_equal(wq__lmdb_err(MDB_CORRUPTED), -EUCLEAN);
    assert_int_equal(wq__lmdb_err(MDB_PAGE_NOTFOUND), -EUCLEAN);
    assert_int_equal(wq__lmdb_err(MDB_READERS_FULL), -EUSERS);
    assert_int_equal(wq__lmdb_err(MDB_TXN_FULL), -ENOSPC);
    assert_int_equal(wq__lmdb_err(MDB_MAP_FULL), -ENOSPC);
    assert_int_not_equal(wq__lmdb_err(MDB_CURSOR_FULL), -EAGAIN);
    assert_string_not_equal(wq_strerror(-EUCLEAN), wq_strerror(-EBADMSG));
    assert_null(strstr(wq_strerror(-EUCLEAN), "repair"));
    assert_non_null(strstr(wq_strerror(-EBADMSG), "repair"));
}

/* A store record of an idle key with neither a failure count nor a
   result (libwq never writes one, but a store may hold it): the restore
   skips it without taking an entry, and the queue checks clean (it used
   to leak a slot: the free list came out one short). */
static void test_restore_idle_record_without_anything(void **state)
{
    (void)state;
    const char *dir = t_mkstore(), *name = t_qname("idlerec");
    struct wq_options o = { .capacity = 8, .store_path = dir, .flags = WQ_CREATE | WQ_EXCL };
    wq *q = t_track(t_create("idlerec-src", &o, NULL));
    assert_int_equal(wq_add(q, KS("kept")), 0);
    const char *src = wq_name(q);
    char srcname[256];
    snprintf(srcname, sizeof srcname, "%s", src);
    t_close(q);
    assert_int_equal(wq_unlink(srcname), 0);
    /* Add the odd record with a valid checksum, count and sum. */
    struct wq_env *e;
    assert_int_equal(wq__lmdb_env(dir, 0600, false, &e), 0);
    MDB_txn *txn;
    assert_int_equal(wq__lmdb_txn(e, 0, &txn), 0);
    struct wq_meta m;
    assert_int_equal(wq__lmdb_meta_get(txn, e, &m), 0);
    struct wq_rec r;
    memset(&r, 0, sizeof r);
    r.magic = WQ_REC_MAGIC;
    r.cls = WQ_CLS_IDLE;
    r.keylen = 4;
    r.order = m.next_order++;
    unsigned char lk[10];
    wq__lmdb_key(lk, "idle", 4, 0);
    r.check = wq__rec_check(lk, &r, "idle", "");
    unsigned char val[sizeof r + 4];
    memcpy(val, &r, sizeof r);
    memcpy(val + sizeof r, "idle", 4);
    MDB_val k = { 10, lk }, v = { sizeof val, val };
    assert_int_equal(mdb_put(txn, e->recs, &k, &v, 0), 0);
    m.records++;
    m.sum += r.check;
    assert_int_equal(wq__lmdb_meta_put(txn, e, &m), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
    o.flags = WQ_CREATE | WQ_EXCL | WQ_RESTORE;
    q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_len(q), 1);
    assert_int_equal(t_key_state(q, "idle"), 0);
    t_check_clean(q, "restored");
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.live, 1);
    t_close(q);
}

/* WQ_RESTORE: the store must exist; a mistyped path creates nothing. */
static void test_restore_needs_a_store(void **state)
{
    (void)state;
    const char *dir = t_mkstore();
    char missing[512];
    snprintf(missing, sizeof missing, "%s/nope", dir);
    const char *name = t_qname("restoreflag");
    struct wq_options o = { .store_path = missing, .flags = WQ_CREATE | WQ_RESTORE };
    wq *q = NULL;
    assert_int_equal(wq_open(name, &o, &q), -ENODATA);
    assert_int_equal(access(missing, F_OK), -1);
    o.store_path = dir;   /* exists, but holds no store */
    assert_int_equal(wq_open(name, &o, &q), -ENODATA);
    char data[600];
    snprintf(data, sizeof data, "%s/data.mdb", dir);
    assert_int_equal(access(data, F_OK), -1);
    o.flags = WQ_RESTORE;   /* without WQ_CREATE */
    assert_int_equal(wq_open(name, &o, &q), -EINVAL);
    o.flags = WQ_CREATE;    /* make one, then restore it */
    assert_int_equal(wq_open(name, &o, &q), 0);
    assert_int_equal(wq_add(q, KS("x")), 0);
    wq_close(q);
    assert_int_equal(wq_unlink(name), 0);
    o.flags = WQ_CREATE | WQ_RESTORE | WQ_EXCL;
    assert_int_equal(wq_open(name, &o, &q), 0);
    assert_int_equal(wq_len(q), 1);
    wq_close(q);
}

static void add_keys(wq *q, const char *prefix, int n)
{
    for (int i = 0; i < n; i++) {
        char k[32];
        snprintf(k, sizeof k, "%s-%05d", prefix, i);
        assert_int_equal(wq_add(q, k, strlen(k)), 0);
    }
}

/* Keys "<prefix>-<from>" .. "<prefix>-<to - 1>", numbered as add_keys does. */
static void add_keys_from(wq *q, const char *prefix, int from, int to)
{
    for (int i = from; i < to; i++) {
        char k[32];
        snprintf(k, sizeof k, "%s-%05d", prefix, i);
        assert_int_equal(wq_add(q, k, strlen(k)), 0);
    }
}

static void drain_all(wq *q)
{
    char buf[300];
    int n;
    while ((n = wq_get(q, buf, sizeof buf, 0)) > 0)
        assert_int_equal(wq_done(q, buf, (size_t)n), 0);
    assert_int_equal(n, -EAGAIN);
}

/* Add k1, k2, ... until every reserved entry is used (one is already);
   returns how many are reserved. */
static uint32_t fill_reserved(wq *q)
{
    struct wq_shm *s = wq__shm(q);
    uint32_t g = s->hdr->grown_ent;
    for (uint32_t i = s->hdr->e_fresh; i < g; i++) {
        char k[32];
        snprintf(k, sizeof k, "k%u", i);
        assert_int_equal(wq_add(q, k, strlen(k)), 0);
    }
    assert_int_equal(s->hdr->e_fresh, g);
    return g;
}

/* A default queue (capacity 65536, max_key_len 256: a 41 MB object)
   takes 32 KiB of /dev/shm when new, with an index and a ring of one
   page each; 5000 keys reserve entries for about 5000 (one step past at
   most), an index of 16384 slots (the first power of two over 2 * 5000
   + 1, reached by five doublings: in the second area, the first given
   back) and a ring of 8192, and 5000 other keys after those are done
   reuse the same entries, index and ring: nothing more is reserved but
   a page of the key arena for the run record of the key processed. */
static void test_region_grows_with_keys(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("grow", NULL, &name));
    struct wq_shm *s = wq__shm(q);
    struct wq_stats st = t_stats(q);
    uint64_t base = t_shm_used(name);
    assert_int_equal(st.region_used, base);
    assert_int_equal(base, 32 * 1024);
    assert_true(st.region_bytes > 38u * 1024 * 1024);   /* the address space */
    assert_int_equal(s->hdr->grown_ent, 0);
    assert_int_equal(s->hdr->e_fresh, 0);
    assert_int_equal(s->hdr->index_at, WQ_INDEX_MIN);   /* area 0 */

    add_keys(q, "first", 5000);
    uint64_t unit = s->entry_size;   /* no delay heap slot: nothing waits (delay.c) */
    uint32_t grown = s->hdr->grown_ent;
    assert_int_equal(s->hdr->e_fresh, 5000);
    assert_true(grown >= 5000 && grown <= 5000 + 5000 / 32 + 65536 / unit + 1);
    assert_int_equal(s->hdr->index_at, 16384);   /* 1024, 2048, .., 16384: area 0 */
    /* 1024, 2048, 3072, 4096, 5120: a page at least, a quarter rounded
       down to pages above 4096 */
    assert_int_equal(s->hdr->ring_at, 5120);
    uint64_t used = t_shm_used(name);
    uint64_t index = (16384 - WQ_INDEX_MIN) * sizeof(struct wq_islot) +
                     (5120 - WQ_RING_MIN) * sizeof(uint32_t);   /* and ring */
    /* Entries and heap slots, each section's ends rounded to pages. */
    assert_true(used >= base + index + grown * unit - 2 * 4096);
    assert_true(used <= base + index + grown * unit + 4 * 4096);
    assert_int_equal(t_stats(q).region_used, used);

    /* Keys processed one at a time need one run record (keys.c) and one
       delay heap slot for the wait each may start (delay.c): the key
       arena's first page (to its end: the arena need not start on one)
       and the heap's. */
    assert_int_equal(s->hdr->grown_heap, 0);
    drain_all(q);
    assert_int_equal(s->hdr->grown_keys, t_first_page(s->g.off_keys, WQ_KEY_GRAIN));
    assert_int_equal(s->hdr->grown_heap, 1024);
    assert_int_equal(t_shm_used(name), used + 2 * 4096);
    used += 2 * 4096;
    add_keys(q, "second", 5000);
    assert_int_equal(s->hdr->e_fresh, 5000);
    assert_int_equal(s->hdr->grown_ent, grown);
    assert_int_equal(s->hdr->index_at, 16384);
    assert_int_equal(t_shm_used(name), used);
    assert_int_equal(wq_len(q), 5000);
    t_check_clean(q, __func__);
    drain_all(q);
    t_close(q);
}

/* A queue big enough to prefetch ahead of the front (queue.c: at least
   WQ_PREFETCH_MIN entries reserved; the index slots of 16 keys at a time,
   from the front). The prefetch reads ring slots and entries behind the
   front, which must change nothing: keys come out in add order.
   bad_ring: ring slot 40 holds an index far past the entries; the get
   that meets it at the front fails with -EBADMSG and flags the region,
   the next repairs, and that key comes out last. Otherwise: entry 20's
   hash is garbage; the get at position 16 prefetches with it (the region
   stays unflagged), and the done of key 20, which needs the hash to drop
   it from the index, flags the region for repair without the caller
   seeing it. */
static void prefetch_damaged(bool bad_ring)
{
    const uint32_t n = WQ_PREFETCH_MIN + 100;
    struct wq_options o = { .capacity = n, .max_key_len = 16 };
    wq *q = t_track(t_create(bad_ring ? "pfring" : "pfhash", &o, NULL));
    struct wq_shm *s = wq__shm(q);
    add_keys(q, "k", (int)n);
    assert_true(s->hdr->grown_ent >= WQ_PREFETCH_MIN);
    uint32_t head = (uint32_t)s->hdr->ring_pos, bad = bad_ring ? 40 : 20;
    uint32_t at = (head + bad) % s->ring_slots;
    if (bad_ring)
        s->ring[at] = 0xfffffff0u;
    else
        wq__entry(s, s->ring[at])->hash ^= 0x9e3779b9u;
    char want[32], buf[32];
    for (uint32_t i = 0; i < n; i++) {
        snprintf(want, sizeof want, "k-%05u", i);
        if (i == bad && bad_ring) {
            assert_int_equal(s->hdr->corrupt, 0);
            assert_int_equal(wq_get(q, buf, sizeof buf, 0), -EBADMSG);
            assert_int_equal(s->hdr->corrupt, 1);
            continue;
        }
        T_EXPECT_GET(q, want);
        if (i < bad)
            assert_int_equal(s->hdr->corrupt, 0);
        T_EXPECT_DONE(q, want);
        if (i == bad)
            assert_int_equal(s->hdr->corrupt, 1);   /* the index kept its own hash */
    }
    if (bad_ring) {
        T_EXPECT_GET(q, "k-00040");
        T_EXPECT_DONE(q, "k-00040");
    }
    T_EXPECT_GET_RC(q, -EAGAIN);
    assert_int_equal(s->hdr->corrupt, 0);   /* repaired by the next locker */
    t_check_clean(q, __func__);
    t_close(q);
}

static void test_prefetch_ahead_damaged(void **state)
{
    (void)state;
    prefetch_damaged(false);
    prefetch_damaged(true);
}

/* The system refuses a growth (the fault point stands for a full tmpfs;
   tests/run-shm-full.sh fills a real one): the add that needed it is
   -ENOSPC naming the queue and what it needed, a batch adds none of its
   keys, a result is refused with its key still processing; keys that
   need no room still work, and the next growth that succeeds goes on. */
static void test_growth_refused(void **state)
{
    (void)state;
    wq *q = t_track(t_create("growno", NULL, NULL));
    struct wq_shm *s = wq__shm(q);
    assert_int_equal(wq_add(q, KS("a")), 0);
    uint32_t g = fill_reserved(q);

    wq_fault_arm("region.grow", 1, WQ_FAULT_FAIL_ON);
    assert_int_equal(wq_add(q, KS("over")), -ENOSPC);
    char want[128];
    snprintf(want, sizeof want, "queue '%s': no room in /dev/shm to grow its region to ",
             wq_name(q));
    assert_non_null(strstr(wq_last_error(), want));
    assert_non_null(strstr(wq_last_error(), " entries ("));
    assert_int_equal(wq_len(q), (int)g);
    assert_int_equal(t_key_state(q, "over"), 0);
    assert_int_equal(s->hdr->grown_ent, g);

    wq_fault_arm("region.grow", 1, WQ_FAULT_FAIL_ON);
    struct iovec batch[3] = { { "b1", 2 }, { "b2", 2 }, { "a", 1 } };
    assert_int_equal(wq_add_many(q, batch, 3), -ENOSPC);
    assert_int_equal(wq_len(q), (int)g);
    assert_int_equal(t_key_state(q, "b1"), 0);
    assert_int_equal(wq_add(q, KS("a")), 1);   /* coalesced: needs no room */

    wq_fault_arm(NULL, 0, 0);
    assert_int_equal(wq_add_many(q, batch, 3), 1);   /* a coalesced */
    assert_int_equal(wq_len(q), (int)g + 2);

    /* Results: the first one needs the result slots' first pages. */
    T_EXPECT_GET(q, "a");
    wq_fault_arm("region.grow", 1, WQ_FAULT_FAIL_ON);
    assert_int_equal(wq_finish(q, KS("a"), 3, "partial"), -ENOSPC);
    assert_non_null(strstr(wq_last_error(), " result slots ("));
    assert_int_equal(t_key_state(q, "a"), WQ_KEY_PROCESSING);
    wq_fault_arm(NULL, 0, 0);
    assert_int_equal(wq_finish(q, KS("a"), 3, "partial"), 0);
    struct wq_result r;
    assert_int_equal(wq_result(q, KS("a"), &r), 0);
    assert_int_equal(r.code, 3);
    assert_string_equal(r.message, "partial");
    t_check_clean(q, __func__);
    drain_all(q);
    t_close(q);
}

/* Short of pages is not full: a refused growth drops no idle key (one
   kept for its result stays), and a batch whose new keys fit in freed
   entries needs no growth, so a refusal does not stop it. */
static void test_growth_refused_keeps_idle(void **state)
{
    (void)state;
    wq *q = t_track(t_create("growidle", NULL, NULL));
    struct wq_shm *s = wq__shm(q);
    assert_int_equal(wq_add(q, KS("a")), 0);
    T_EXPECT_GET(q, "a");
    assert_int_equal(wq_finish(q, KS("a"), 7, "kept"), 0);
    uint32_t g = fill_reserved(q);
    wq_fault_arm("region.grow", 1, WQ_FAULT_FAIL_ON);
    assert_int_equal(wq_add(q, KS("over")), -ENOSPC);
    struct wq_result r;
    assert_int_equal(wq_result(q, KS("a"), &r), 0);
    assert_int_equal(r.state, WQ_STATE_FAILED);
    assert_int_equal(r.code, 7);
    assert_string_equal(r.message, "kept");

    T_EXPECT_GET(q, "k1");
    T_EXPECT_DONE(q, "k1");   /* its entry goes to the free list */
    wq_fault_arm("region.grow", 1, WQ_FAULT_FAIL_ON);
    struct iovec one[2] = { { "new1", 4 }, { "k2", 2 } };
    assert_int_equal(wq_add_many(q, one, 2), 1);   /* k2 coalesced */
    wq_fault_arm(NULL, 0, 0);
    assert_int_equal(s->hdr->grown_ent, g);
    assert_int_equal(wq_len(q), (int)g - 1);
    t_check_clean(q, __func__);
    drain_all(q);
    t_close(q);
}

/* Damaged growth counts are not trusted: a count past the capacity is
   reserved for (up to the capacity) before anything is touched there,
   and one below the entries in use is raised to them: no key is lost. */
static void test_growth_counts_damaged(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("growbad", T_OPTS(.capacity = 3000, .max_key_len = 16), &name));
    struct wq_shm *s = wq__shm(q);
    add_keys(q, "k", 10);
    uint32_t g = s->hdr->grown_ent;
    assert_true(g >= 10 && g < 3000);
    uint64_t used = t_shm_used(name);

    s->hdr->grown_ent = 0xffffffffu;
    t_check_clean(q, __func__);   /* the locker repaired it */
    assert_int_equal(s->hdr->grown_ent, 3000);
    assert_int_equal(s->hdr->e_fresh, 10);
    uint64_t unit = s->entry_size;
    assert_true(t_shm_used(name) >= used + (3000 - g) * unit - 2 * 4096);
    assert_int_equal(wq_len(q), 10);

    s->hdr->grown_ent = 3;
    t_check_clean(q, __func__);
    assert_int_equal(s->hdr->grown_ent, 10);
    assert_int_equal(s->hdr->e_fresh, 10);
    assert_int_equal(wq_len(q), 10);
    add_keys(q, "more", 5);
    assert_int_equal(wq_len(q), 15);
    t_check_clean(q, __func__);

    /* The delay heap's count (delay.c): past the capacity, the handle
       keeps the count it knew; below the keys waiting, repair asks for
       what they need. The waiting key stays. The heap grows to the end
       of its first page (its slots need not start on one). */
    const uint32_t hpage = t_first_page(s->g.off_heap, sizeof(uint32_t));
    assert_int_equal(wq_add_after(q, KS("w-0"), 3600000000000ull), 0);
    assert_int_equal(s->hdr->grown_heap, hpage);
    s->hdr->grown_heap = 0xffffffffu;
    t_check_clean(q, __func__);
    assert_int_equal(s->hdr->grown_heap, hpage);
    s->hdr->grown_heap = 0;
    t_check_clean(q, __func__);
    assert_int_equal(s->hdr->grown_heap, hpage);
    assert_int_equal(t_key_state(q, "w-0"), WQ_KEY_WAITING);
    assert_int_equal(t_stats(q).waiting, 1);
    /* And when the system refuses the heap's page then, the key waits no
       longer (only a damaged region gets here) instead of the repair
       failing at every lock until /dev/shm has room. */
    uint64_t repairs = t_stats(q).repairs_total;
    s->hdr->grown_heap = 0;
    wq_fault_arm("region.grow.heap", 1, WQ_FAULT_FAIL_ON);
    /* the check's lock finds the count flagged and repairs first */
    assert_int_equal(wq_check(q, WQ_CHECK_REPAIR), 0);
    assert_int_equal(t_stats(q).repairs_total, repairs + 1);
    assert_int_equal(s->hdr->busy, 0);
    assert_int_equal(s->hdr->grown_heap, 0);
    assert_int_equal(t_key_state(q, "w-0"), WQ_KEY_DIRTY | WQ_KEY_QUEUED);
    assert_int_equal(wq_len(q), 16);
    t_check_clean(q, __func__);
    wq_fault_arm(NULL, 0, 0);
    /* A damaged processing count must not size the heap's pages (it
       would ask for capacity's): the get is refused, the region flagged,
       and the next locker recounts. */
    s->hdr->processing = 2500;
    char buf[32];
    assert_int_equal(wq_get(q, buf, sizeof buf, 0), -EBADMSG);
    assert_int_equal(s->hdr->grown_heap, 0);
    t_check_clean(q, __func__);
    assert_int_equal(s->hdr->processing, 0);
    drain_all(q);
    assert_int_equal(s->hdr->grown_heap, hpage);   /* the first get asked again */
    t_close(q);
}

/* A process SIGKILLed in the middle of a growth (its pages reserved, the
   count not yet moved) while holding the lock: the next locker repairs;
   every key it added before is there once, the one it was adding is not,
   and the next growth takes the same pages again and goes on. */
static void test_killed_while_growing(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("growkill", T_OPTS(.max_key_len = 16), &name));
    struct wq_shm *s = wq__shm(q);
    volatile int *added = t_shared_alloc(sizeof *added);
    assert_int_equal(wq_add(q, KS("first")), 0);
    uint32_t g = s->hdr->grown_ent;
    pid_t pid = t_fork(30);
    if (pid == 0) {
        wq *c;
        if (wq_open(name, NULL, &c) < 0)
            _exit(2);
        wq_fault_arm("region.grow.entries", 1, WQ_FAULT_KILL);
        for (int i = 0; i < 100000; i++) {
            char k[16];
            snprintf(k, sizeof k, "c%d", i);
            if (wq_add(c, k, strlen(k)) != 0)
                _exit(3);
            *added = i + 1;
        }
        _exit(4);   /* never grew */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGKILL);
    int n = *added;
    assert_int_equal((uint32_t)n + 1, g);   /* it died adding the first key past g */
    assert_int_equal(wq_len(q), n + 1);   /* repairs: the lock's holder died */
    assert_int_equal(s->hdr->grown_ent, g);
    char k[16];
    snprintf(k, sizeof k, "c%d", n);
    assert_int_equal(t_key_state(q, k), 0);
    t_check_clean(q, __func__);
    assert_int_equal(wq_add(q, k, strlen(k)), 0);   /* grows now */
    assert_true(s->hdr->grown_ent > g);
    assert_int_equal(wq_len(q), n + 2);
    t_check_clean(q, __func__);
    drain_all(q);
    t_shared_free((void *)added, sizeof *added);
    t_close(q);
}

/* Keys "<prefix>-00000".. come out in add order, then the queue is empty. */
static void drain_in_order(wq *q, const char *prefix, int n)
{
    char want[32], buf[32];
    for (int i = 0; i < n; i++) {
        snprintf(want, sizeof want, "%s-%05d", prefix, i);
        int len = wq_get(q, buf, sizeof buf, 0);
        assert_int_equal(len, (int)strlen(want));
        buf[len] = 0;
        assert_string_equal(buf, want);
        assert_int_equal(wq_done(q, buf, (size_t)len), 0);
    }
    char b[32];
    assert_int_equal(wq_get(q, b, sizeof b, 0), -EAGAIN);
}

/* The index starts at one page and doubles into the other area when a
   new key would take it past load 0.5, giving the old area's pages
   back. A refused doubling fails that add with -ENOSPC and its message,
   a batch adds none of its keys, a coalesced add needs nothing, and the
   next doubling that succeeds goes on; every key is there in order. */
static void test_index_grows(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("idxgrow", T_OPTS(.capacity = 4000, .max_key_len = 16), &name));
    struct wq_shm *s = wq__shm(q);
    assert_int_equal(s->hdr->index_at, WQ_INDEX_MIN);
    add_keys(q, "k", 511);   /* 2 * 511 + 1 <= 1024 */
    assert_int_equal(s->hdr->index_at, WQ_INDEX_MIN);
    uint64_t used = t_shm_used(name);
    uint32_t ents = s->hdr->grown_ent;
    add_keys_from(q, "k", 511, 512);
    assert_int_equal(s->hdr->index_at, 1ull << 32 | 2048);
    /* The index moved (its page given back, two taken), and the entries
       took a page if the 512th did not fit in theirs (they grow a page
       at a time here). */
    uint64_t ent_page = s->hdr->grown_ent != ents ? 4096 : 0;
    assert_true(s->hdr->grown_ent == ents || ents < 512);
    assert_int_equal(t_shm_used(name), used - 4096 + 8192 + ent_page);
    t_check_clean(q, __func__);

    add_keys_from(q, "k", 512, 1023);
    assert_int_equal(s->hdr->index_at, 1ull << 32 | 2048);
    wq_fault_arm("region.index", 1, WQ_FAULT_FAIL_ON);
    assert_int_equal(wq_add(q, KS("k-01023")), -ENOSPC);
    char want[160];
    snprintf(want, sizeof want, "queue '%s': no room in /dev/shm to grow its region to "
             "4096 index slots (16384 bytes more, ", wq_name(q));
    assert_memory_equal(wq_last_error(), want, strlen(want));
    struct iovec batch[2] = { { "k-01023", 7 }, { "k-01024", 7 } };
    assert_int_equal(wq_add_many(q, batch, 2), -ENOSPC);
    assert_int_equal(wq_add(q, KS("k-00000")), 1);   /* coalesced: needs no room */
    assert_int_equal(wq_len(q), 1023);
    assert_int_equal(t_key_state(q, "k-01023"), 0);
    assert_int_equal(s->hdr->index_at, 1ull << 32 | 2048);
    wq_fault_arm(NULL, 0, 0);
    assert_int_equal(wq_add_many(q, batch, 2), 0);
    assert_int_equal(s->hdr->index_at, 4096);   /* back in area 0 */
    add_keys_from(q, "k", 1025, 4000);   /* a full queue's 8001, in area 1 */
    assert_int_equal(s->hdr->index_at, 1ull << 32 | 8001);
    assert_int_equal(wq_add(q, KS("one-more")), -ENOSPC);
    t_check_clean(q, __func__);
    drain_in_order(q, "k", 4000);
    t_close(q);
}

/* Another process's handle still sees the old table until it locks:
   it must then use the new one (its lookups find every key, so its adds
   coalesce and its dones find their keys). */
static void test_index_grown_by_another(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("idxother", T_OPTS(.capacity = 5000, .max_key_len = 16), &name));
    assert_int_equal(wq_add(q, KS("k-00000")), 0);
    pid_t pid = t_fork(30);
    if (pid == 0) {
        wq *c;
        if (wq_open(name, NULL, &c) < 0)
            _exit(2);
        for (int i = 1; i < 3000; i++) {
            char k[16];
            snprintf(k, sizeof k, "k-%05d", i);
            if (wq_add(c, k, strlen(k)) != 0)
                _exit(3);
        }
        wq_close(c);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(wq__shm(q)->hdr->index_at, 1ull << 32 | 8192);   /* 3 doublings: area 1 */
    for (int i = 0; i < 3000; i++) {
        char k[16];
        snprintf(k, sizeof k, "k-%05d", i);
        assert_int_equal(wq_add(q, k, strlen(k)), 1);
    }
    assert_int_equal(wq_len(q), 3000);
    t_check_clean(q, __func__);
    drain_in_order(q, "k", 3000);
    t_close(q);
}

/* A process of its own opens queue `name` and is SIGKILLed at `point`
   while adding keys[0] (n == 1) or the batch of n keys. */
static void die_adding(const char *name, const char *point, const struct iovec *keys, size_t n)
{
    pid_t pid = t_fork(30);
    if (pid == 0) {
        wq *c;
        if (wq_open(name, NULL, &c) < 0)
            _exit(2);
        wq_fault_arm(point, 1, WQ_FAULT_KILL);
        if (n == 1)
            (void)wq_add(c, keys[0].iov_base, keys[0].iov_len);
        else
            (void)wq_add_many(c, keys, n);
        _exit(3);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGKILL);
}

/* A holder SIGKILLed while doubling the index, in the copy (the old
   table still in use) or just after the switch (the old area's pages
   not given back yet), in an add (a mutation: the next locker repairs)
   or in a batch's room-making (none: nothing to repair): every key added
   before is there once and in order, the ones being added are not, the
   index is the old one (repaired: sized for the entries used) or the
   new one, and no page of the other area is left. */
static void test_killed_while_growing_index(void **state)
{
    (void)state;
    static const char *const points[] = { "table.grow.copy", "table.grow.switch",
                                          "table.grow.switch" };
    for (int p = 0; p < 3; p++) {
        const char *name;
        char qn[16];
        snprintf(qn, sizeof qn, "idxkill%d", p);
        wq *q = t_track(t_create(qn, T_OPTS(.capacity = 4000, .max_key_len = 16), &name));
        struct wq_shm *s = wq__shm(q);
        add_keys(q, "k", 511);
        uint64_t used = t_shm_used(name);
        struct iovec batch[2] = { { "k-00511", 7 }, { "k-00512", 7 } };
        die_adding(name, points[p], batch, p < 2 ? 1 : 2);
        assert_int_equal(wq_len(q), 511);   /* the lock's holder died */
        assert_int_equal(t_key_state(q, "k-00511"), 0);
        assert_int_equal(t_key_state(q, "k-00512"), 0);
        if (p < 2) {
            /* Repaired: sized for the 511 entries used, in the area in use. */
            assert_int_equal(s->hdr->index_at, p ? (1ull << 32 | WQ_INDEX_MIN) : WQ_INDEX_MIN);
            assert_int_equal(t_shm_used(name), used);
        } else {
            /* The doubled table stands; the old one's page is given back. */
            assert_int_equal(s->hdr->index_at, 1ull << 32 | 2048);
            assert_int_equal(t_shm_used(name), used - 4096 + 8192);
        }
        t_check_clean(q, __func__);
        assert_int_equal(wq_add(q, KS("k-00511")), 0);   /* doubles now, or did */
        assert_int_equal(wq_add(q, KS("k-00512")), 0);
        assert_int_equal(s->hdr->index_at, p == 1 ? 2048 : 1ull << 32 | 2048);
        assert_int_equal(t_shm_used(name), used - 4096 + 8192);
        t_check_clean(q, __func__);
        drain_in_order(q, "k", 513);
        t_close(q);
    }
}

/* A damaged index word (no legal size, an area that does not exist, a
   size too small for the entries used) is not followed, by a handle that
   had the good one or by one opened after the damage (odd b): the next
   locker rebuilds the index from the entries, sized for them, and every
   key is found again. */
/* The handle's hints (queue.c, add_fast) would coalesce an add of a
   queued key without the lock, and so without the index or the ring:
   forgotten, the add below is the locker that meets the damaged word. */
static void forget_hints(wq *q)
{
    struct wq_shm *s = wq__shm(q);
    assert_non_null(s->hints);
    memset(s->hints, 0, WQ_HINTS * sizeof *s->hints);
}

static void test_index_word_damaged(void **state)
{
    (void)state;
    static const uint64_t bad[] = { 1000, 1000, 5ull << 32 | 1024, 5ull << 32 | 1024,
                                    1024, 1024, 0, 0 };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        const char *name;
        wq *q = t_track(t_create("idxbad", T_OPTS(.capacity = 4000, .max_key_len = 16), &name));
        struct wq_shm *s = wq__shm(q);
        add_keys(q, "k", 600);
        assert_int_equal(s->hdr->index_at, 1ull << 32 | 2048);
        s->hdr->index_at = bad[b];
        forget_hints(q);
        wq *r = q;
        if (b & 1)
            assert_int_equal(wq_open(name, NULL, &r), 0);
        assert_int_equal(wq_add(r, KS("k-00007")), 1);   /* found: coalesced */
        if (r != q)
            wq_close(r);
        assert_int_equal(s->hdr->index_at, 2048);
        assert_int_equal(wq_len(q), 600);
        t_check_clean(q, __func__);
        drain_in_order(q, "k", 600);
        t_close(q);
    }
}

/* A key's stored hash damaged before the index doubles: the doubling,
   which places keys by their entries' hashes, checks each against its
   key, fails that add with -EBADMSG and flags the region; the next
   locker repairs (the hash from the key), and the key is found again,
   once, in its place in the FIFO. */
static void test_index_grows_damaged_hash(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("idxdmg", T_OPTS(.capacity = 4000, .max_key_len = 16), &name));
    struct wq_shm *s = wq__shm(q);
    add_keys(q, "k", 511);
    assert_int_equal(s->hdr->index_at, WQ_INDEX_MIN);
    wq__entry(s, 5)->hash ^= 0x80000000u;   /* k-00005's */
    assert_int_equal(wq_add(q, KS("k-00511")), -EBADMSG);
    assert_int_equal(s->hdr->corrupt, 1);
    assert_int_equal(s->hdr->index_at, WQ_INDEX_MIN);   /* the old table stays */
    assert_int_equal(wq_add(q, KS("k-00511")), 0);   /* repaired, then doubled */
    assert_int_equal(s->hdr->corrupt, 0);
    assert_int_equal(s->hdr->index_at, 1ull << 32 | 2048);
    forget_hints(q);
    assert_int_equal(wq_add(q, KS("k-00005")), 1);   /* found: coalesced */
    assert_int_equal(wq_len(q), 512);
    t_check_clean(q, __func__);
    drain_in_order(q, "k", 512);
    t_close(q);
}

/* Names "c-<i>" whose home slot in a table of `slots` is `home`, n of
   them, found by trying (about slots tries each). */
static void same_home(const struct wq_shm *s, uint32_t slots, uint32_t home, int n,
                      char (*keys)[16])
{
    for (int i = 0, found = 0; found < n; i++) {
        snprintf(keys[found], 16, "c-%d", i);
        if (wq__home_in(slots, wq__hash(s->seed, keys[found], strlen(keys[found]))) == home)
            found++;
    }
}

/* One get and done of the queue's front, which must be `want`. */
static void take(wq *q, const char *want)
{
    T_EXPECT_GET(q, want);
    T_EXPECT_DONE(q, want);
}

/* A long cluster in the index (layout.h: a slot's tag holds distances up
   to 14, "15 or more" sends the reader to the entry; a capacity of 2^24
   leaves 7 tag bits and no distance at all). 40 keys share home slot
   100 and 10 more home at 110, inside the first run, so they sit 10 to
   19 slots from home and the last 20 of the first kind 30 to 49. Every
   key is found (an add coalesces), the repair check finds every tag
   right, and removals from the cluster's head shift the rest back with
   their distances made shorter; the FIFO order is kept. */
static void test_index_long_cluster(void **state)
{
    (void)state;
    static const uint32_t caps[] = { 4000, 1u << 24 };
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        wq *q = t_track(t_create("cluster", T_OPTS(.capacity = caps[c], .max_key_len = 16), NULL));
        struct wq_shm *s = wq__shm(q);
        assert_int_equal(s->hdr->index_at, WQ_INDEX_MIN);
        assert_int_equal(s->ibits, c ? 25 : 12);
        assert_int_equal(s->idmax, c ? 0 : 15);
        char a[40][16], b[10][16];
        same_home(s, WQ_INDEX_MIN, 100, 40, a);
        same_home(s, WQ_INDEX_MIN, 110, 10, b);
        for (int i = 0; i < 20; i++)
            assert_int_equal(wq_add(q, a[i], strlen(a[i])), 0);
        for (int i = 0; i < 10; i++)
            assert_int_equal(wq_add(q, b[i], strlen(b[i])), 0);
        for (int i = 20; i < 40; i++)
            assert_int_equal(wq_add(q, a[i], strlen(a[i])), 0);
        /* Slots 100..149, in add order; the last one 49 from its home. */
        for (uint32_t i = 100; i < 150; i++)
            assert_int_not_equal(s->index[i].w, 0);
        assert_int_equal(s->index[150].w, 0);
        uint32_t last = s->index[149].w;
        assert_int_equal(last & ~s->irmask, wq__table_tag(s, wq__hash(s->seed, a[39], strlen(a[39])), 49));
        if (!c)
            assert_int_equal(last >> s->idshift, 15);
        t_check_clean(q, __func__);
        forget_hints(q);
        for (int i = 0; i < 40; i++)
            assert_int_equal(wq_add(q, a[i], strlen(a[i])), 1);
        for (int i = 0; i < 10; i++)
            assert_int_equal(wq_add(q, b[i], strlen(b[i])), 1);
        for (int i = 0; i < 5; i++) {
            take(q, a[i]);
            t_check_clean(q, __func__);
        }
        assert_int_equal(s->index[145].w, 0);
        forget_hints(q);
        for (int i = 5; i < 40; i++)
            assert_int_equal(wq_add(q, a[i], strlen(a[i])), 1);
        for (int i = 0; i < 10; i++)
            assert_int_equal(wq_add(q, b[i], strlen(b[i])), 1);
        for (int i = 5; i < 20; i++)
            take(q, a[i]);
        for (int i = 0; i < 10; i++)
            take(q, b[i]);
        for (int i = 20; i < 40; i++)
            take(q, a[i]);
        T_EXPECT_GET_RC(q, -EAGAIN);
        for (uint32_t i = 0; i < WQ_INDEX_MIN; i++)
            assert_int_equal(s->index[i].w, 0);
        t_check_clean(q, __func__);
        t_close(q);
    }
}

/* n keys out and done, in order "<prefix>-<from>".. */
static void take_in_order(wq *q, const char *prefix, int from, int n)
{
    char want[32], buf[32];
    for (int i = from; i < from + n; i++) {
        snprintf(want, sizeof want, "%s-%05d", prefix, i);
        int len = wq_get(q, buf, sizeof buf, 0);
        assert_int_equal(len, (int)strlen(want));
        buf[len] = 0;
        assert_string_equal(buf, want);
        assert_int_equal(wq_done(q, buf, (size_t)len), 0);
    }
}

/* The ring starts at one page (1024 slots) and grows (to 2048, 3072..)
   when an entry past its size is taken, keeping the FIFO order even when
   its members wrap around the old ring's end; a refused growth fails the
   add with its message and changes nothing. Fills one ring with
   k-0..1023, takes 300 out (their entries are freed), adds n-0..299
   (reusing them: the ring wraps, nothing grows), then one more new key:
   the growth. Then a full ring of 2048 whose front is at 1900 grows to
   3072: its members wrap around both rings' ends (three runs). */
static void test_ring_grows(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("ringgrow", T_OPTS(.capacity = 5000, .max_key_len = 16), &name));
    struct wq_shm *s = wq__shm(q);
    assert_int_equal(s->hdr->ring_at, WQ_RING_MIN);
    add_keys(q, "k", 1024);
    take_in_order(q, "k", 0, 300);
    add_keys(q, "n", 300);
    assert_int_equal(s->hdr->ring_at, WQ_RING_MIN);
    assert_int_equal(s->hdr->e_fresh, 1024);
    assert_int_equal((uint32_t)s->hdr->ring_pos, 300);   /* the front: wrapped */

    wq_fault_arm("region.ring", 1, WQ_FAULT_FAIL_ON);
    assert_int_equal(wq_add(q, KS("x-00000")), -ENOSPC);
    char want[160];
    snprintf(want, sizeof want, "queue '%s': no room in /dev/shm to grow its region to "
             "2048 ring slots (8192 bytes more, ", wq_name(q));
    assert_memory_equal(wq_last_error(), want, strlen(want));
    assert_int_equal(wq_len(q), 1024);
    assert_int_equal(s->hdr->ring_at, WQ_RING_MIN);
    wq_fault_arm(NULL, 0, 0);

    uint64_t used = t_shm_used(name);
    assert_int_equal(wq_add(q, KS("x-00000")), 0);
    assert_int_equal(s->hdr->ring_at, 1ull << 32 | 2048);
    assert_int_equal(t_shm_used(name), used - 4096 + 8192);   /* the old page given back */
    t_check_clean(q, __func__);
    take_in_order(q, "k", 300, 724);
    take_in_order(q, "n", 0, 300);
    take_in_order(q, "x", 0, 1);
    assert_int_equal((uint32_t)s->hdr->ring_pos, 1325);
    add_keys(q, "m", 1600);   /* 1025 entries reused, 575 fresh */
    take_in_order(q, "m", 0, 575);
    add_keys(q, "p", 1023);   /* 575 reused, 448 fresh: 2048 used */
    assert_int_equal(s->hdr->e_fresh, 2048);
    assert_int_equal(s->hdr->ring_at, 1ull << 32 | 2048);
    assert_int_equal(s->hdr->ring_pos, 2048ull << 32 | 1900);   /* full, front at 1900 */
    assert_int_equal(wq_add(q, KS("z-00000")), 0);
    assert_int_equal(s->hdr->ring_at, 3072);   /* area 0 again */
    assert_int_equal(s->hdr->ring_pos, 2049ull << 32 | 1900);
    t_check_clean(q, __func__);
    take_in_order(q, "m", 575, 1025);
    take_in_order(q, "p", 0, 1023);
    drain_in_order(q, "z", 1);
    t_close(q);
}

/* Keys "k-00000" .. "k-<n - 1>" come out once each, in any order, then
   the queue is empty. */
static void drain_each_once(wq *q, int n)
{
    bool *seen = calloc((size_t)n, sizeof *seen);
    assert_non_null(seen);
    char buf[32];
    for (int i = 0; i < n; i++) {
        int len = wq_get(q, buf, sizeof buf, 0);
        assert_int_equal(len, 7);
        buf[len] = 0;
        int k = atoi(buf + 2);
        assert_true(k >= 0 && k < n && !seen[k]);
        seen[k] = true;
        assert_int_equal(wq_done(q, buf, 7), 0);
    }
    assert_int_equal(wq_get(q, buf, sizeof buf, 0), -EAGAIN);
    free(seen);
}

/* Fair mode keeps its queue in heaps and its ring empty: the ring stays
   at one page however many keys come, takes no more pages, and a damaged
   ring word is replaced without touching the queue's order. */
static void test_ring_fair_stays(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("ringfair", T_OPTS(.capacity = 5000, .max_key_len = 16,
                                                .flags = WQ_FAIR), &name));
    struct wq_shm *s = wq__shm(q);
    add_keys(q, "k", 1500);
    assert_int_equal(s->hdr->ring_at, WQ_RING_MIN);
    assert_int_equal(s->hdr->index_at, 4096);   /* the index grows as ever */
    t_check_clean(q, __func__);
    s->hdr->ring_at = 7ull << 32 | 2048;
    assert_int_equal(wq_add(q, KS("k-00007")), 1);
    assert_int_equal(s->hdr->ring_at, WQ_RING_MIN);
    t_check_clean(q, __func__);
    drain_each_once(q, 1500);   /* fair mode's own order */
    t_close(q);
}

/* A holder SIGKILLed while doubling the ring, in the copy or after the
   switch: every key is there in FIFO order, the one being added is not,
   and no page of the unused area is left. */
static void test_killed_while_growing_ring(void **state)
{
    (void)state;
    static const char *const points[] = { "ring.grow.copy", "ring.grow.switch" };
    for (int p = 0; p < 2; p++) {
        const char *name;
        wq *q = t_track(t_create(p ? "ringkill2" : "ringkill1",
                                 T_OPTS(.capacity = 5000, .max_key_len = 16), &name));
        struct wq_shm *s = wq__shm(q);
        add_keys(q, "k", 1024);
        take_in_order(q, "k", 0, 300);
        add_keys(q, "n", 300);
        uint64_t used = t_shm_used(name);
        struct iovec key = { "x-00000", 7 };
        die_adding(name, points[p], &key, 1);
        assert_int_equal(wq_len(q), 1024);
        assert_int_equal(t_key_state(q, "x-00000"), 0);
        assert_int_equal(s->hdr->ring_at, p ? (1ull << 32 | 2048) : WQ_RING_MIN);
        assert_int_equal(t_shm_used(name), p ? used - 4096 + 8192 : used);
        t_check_clean(q, __func__);
        assert_int_equal(wq_add(q, KS("x-00000")), 0);
        assert_int_equal(s->hdr->ring_at, 1ull << 32 | 2048);
        t_check_clean(q, __func__);
        take_in_order(q, "k", 300, 724);
        take_in_order(q, "n", 0, 300);
        drain_in_order(q, "x", 1);
        t_close(q);
    }
}

/* A damaged ring word (no legal size, no such area, too small) is not
   followed: repair makes a ring of the right size and puts every queued
   key back in it (their order is lost with the word), none twice. */
static void test_ring_word_damaged(void **state)
{
    (void)state;
    /* 2560: in range and page-aligned, but not a size the ring grows
       through (1024, 2048, 3072, ...) */
    static const uint64_t bad[] = { 1000, 7ull << 32 | 2048, 1024, 1ull << 32 | 2560 };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        wq *q = t_track(t_create("ringbad", T_OPTS(.capacity = 5000, .max_key_len = 16), NULL));
        struct wq_shm *s = wq__shm(q);
        add_keys(q, "k", 1500);
        assert_int_equal(s->hdr->ring_at, 1ull << 32 | 2048);
        s->hdr->ring_at = bad[b];
        forget_hints(q);
        assert_int_equal(wq_add(q, KS("k-00007")), 1);   /* still queued: coalesced */
        assert_int_equal(s->hdr->ring_at & 0xffffffffu, 2048);
        assert_int_equal(wq_len(q), 1500);
        t_check_clean(q, __func__);
        drain_each_once(q, 1500);
        t_close(q);
    }
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        T_STORE_TEST(test_add_many_room_from_zombies),
        T_TEST(test_add_many_all_or_none),
        T_STORE_TEST(test_settle_failure_repaired),
        T_TEST(test_fair_heap_index_past_capacity),
        T_TEST(test_mutex_attr_refused),
        T_TEST(test_lock_held_asserted),
        T_TEST(test_damaged_lease_dead_pid),
        T_TEST(test_damaged_lease_live_pid),
        T_TEST(test_store_errors_distinct),
        T_STORE_TEST(test_restore_needs_a_store),
        T_STORE_TEST(test_restore_idle_record_without_anything),
        T_TEST(test_region_grows_with_keys),
        T_TEST(test_prefetch_ahead_damaged),
        T_TEST(test_growth_refused),
        T_TEST(test_growth_refused_keeps_idle),
        T_TEST(test_growth_counts_damaged),
        T_TEST(test_index_grows),
        T_TEST(test_index_grown_by_another),
        T_TEST(test_killed_while_growing_index),
        T_TEST(test_index_word_damaged),
        T_TEST(test_index_long_cluster),
        T_TEST(test_index_grows_damaged_hash),
        T_TEST(test_ring_grows),
        T_TEST(test_killed_while_growing_ring),
        T_TEST(test_ring_fair_stays),
        T_TEST(test_ring_word_damaged),
        T_TEST(test_killed_while_growing),
        T_NO_LEFTOVERS,
    };
    static const struct t_guard g = {
        .prog = "test-shm",
        .max_stores = 16,
        .deadline_s = 120,
        T_GUARD_TESTS(tests),
    };
    return t_guard_main(&g);
}
