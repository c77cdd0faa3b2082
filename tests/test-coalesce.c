/*
 * test-coalesce.c - the coalesced add without the lock (src/shm/queue.c,
 * add_fast), white-box: links libwq-fault.la and holds the region lock
 * itself through src/shm/shm.h.
 *   - a plain add of a key that is dirty (queued, or processing and
 *     added again) completes while another process holds the region
 *     lock, for keys in the entry and keys in the arena; an add that has
 *     to change something (a processing key, a new key) waits for it;
 *   - such adds are counted exactly, in the adder's process slot, which
 *     keeps its count after the adder closes, dies (SIGKILL) before and
 *     after the reap, or is released; wq_stats and wq_metrics agree;
 *   - a hint naming another key's entry, or an entry given back, is
 *     never trusted: the add goes the locked way and is a new add; in a
 *     region flagged damaged it goes the locked way, which repairs;
 *   - a forked child's inherited handle never counts in its parent's
 *     slot;
 *   - what a producer writes before wq_add is seen by the worker that
 *     gets the key afterwards, across processes, with most adds taking
 *     the lock-free way: a witness outside the library (a shared
 *     mapping of versions) finds no lost update, at the end of a flat-out
 *     run and add by add in rounds whose version stores are plain.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "t.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shm/shm.h"

static char g_long[101];   /* a key that lives in the arena */

/* A 100-byte key whose hint slot is not that of "k" in queue q (the
   hash seed is the region's own): two keys sharing a slot would each
   evict the other's hint, and the test expects both to hit. */
static const char *long_key(wq *q)
{
    struct wq_shm *s = wq__shm(q);
    uint32_t hk = wq__hash(s->seed, "k", 1) % WQ_HINTS;
    for (int shift = 0;; shift++) {
        for (size_t i = 0; i < sizeof g_long - 1; i++)
            g_long[i] = (char)('a' + (i + (size_t)shift) % 26);
        if (wq__hash(s->seed, g_long, sizeof g_long - 1) % WQ_HINTS != hk)
            return g_long;
    }
}

/* What the parent and one child tell each other. */
struct board {
    atomic_int step;       /* the parent's: how far it got */
    atomic_int done;       /* the child's: how far it got */
    atomic_int rc[8];      /* the child's wq_add results */
};

static bool wait_for(atomic_int *v, int want, int ms)
{
    return t_wait_count(v, want, ms) == 0;
}

static uint64_t slot_count(wq *q)
{
    struct wq_shm *s = wq__shm(q);
    return s->procs[s->slot].coalesced;
}

/* The child of test_no_lock: its own handle; its adds while the parent
   holds the lock. */
static void no_lock_child(const char *name, struct board *b)
{
    wq *q;
    if (wq_open(name, NULL, &q) != 0)
        _exit(10);
    const char *lk = long_key(q);
    /* First sight of each key: the locked way, which leaves the hint. */
    atomic_store(&b->rc[0], wq_add(q, KS("k")));
    atomic_store(&b->rc[1], wq_add(q, KS(lk)));
    atomic_store(&b->done, 1);
    if (!wait_for(&b->step, 1, 10000))   /* the parent holds the lock */
        _exit(11);
    atomic_store(&b->rc[2], wq_add(q, KS("k")));
    atomic_store(&b->rc[3], wq_add(q, KS(lk)));
    atomic_store(&b->done, 2);
    if (!wait_for(&b->step, 2, 10000))   /* it got k and locks again */
        _exit(12);
    atomic_store(&b->done, 3);
    atomic_store(&b->rc[4], wq_add(q, KS("k")));   /* processing: marks dirty */
    atomic_store(&b->done, 4);
    if (!wait_for(&b->step, 3, 10000))   /* locked once more */
        _exit(13);
    atomic_store(&b->rc[5], wq_add(q, KS("k")));   /* processing and dirty */
    atomic_store(&b->done, 5);
    if (!wait_for(&b->step, 4, 10000))
        _exit(14);
    wq_close(q);
    _exit(0);
}

static void test_no_lock(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("nolock", NULL, &name));
    struct wq_shm *s = wq__shm(q);
    const char *lk = long_key(q);
    assert_int_equal(wq_add(q, KS("k")), 0);
    assert_int_equal(wq_add(q, KS(lk)), 0);
    struct board *b = t_shared_alloc(sizeof *b);
    pid_t pid = t_fork(60);
    if (pid == 0)
        no_lock_child(name, b);
    assert_true(wait_for(&b->done, 1, 10000));
    assert_int_equal(b->rc[0], 1);
    assert_int_equal(b->rc[1], 1);
    assert_int_equal(t_stats(q).coalesced_total, 2);

    /* Both keys are queued: the child's adds complete under our lock. */
    assert_int_equal(wq__lock(s), 0);
    atomic_store(&b->step, 1);
    bool fast = wait_for(&b->done, 2, 10000);
    wq__unlock(s);
    assert_true(fast);
    assert_int_equal(b->rc[2], 1);
    assert_int_equal(b->rc[3], 1);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.coalesced_total, 4);   /* two in the child's slot */
    assert_int_equal(st.adds_total, 2);
    assert_int_equal(st.queued, 2);

    /* k processing: an add must mark it, which takes the lock. */
    T_EXPECT_GET(q, "k");
    assert_int_equal(wq__lock(s), 0);
    atomic_store(&b->step, 2);
    assert_true(wait_for(&b->done, 3, 10000));
    t_sleep_ms(200);
    int early = atomic_load(&b->done);
    wq__unlock(s);
    assert_int_equal(early, 3);   /* it waited for the lock */
    assert_true(wait_for(&b->done, 4, 10000));
    assert_int_equal(b->rc[4], 0);

    /* Processing and dirty: coalesced again, without the lock. */
    assert_int_equal(wq__lock(s), 0);
    atomic_store(&b->step, 3);
    fast = wait_for(&b->done, 5, 10000);
    wq__unlock(s);
    assert_true(fast);
    assert_int_equal(b->rc[5], 1);
    atomic_store(&b->step, 4);
    assert_int_equal(t_wait(pid, 10000), 0);
    st = t_stats(q);
    assert_int_equal(st.coalesced_total, 5);   /* still, after its close */
    assert_int_equal(st.adds_total, 3);

    /* k comes back at done, behind the long key (client-go). */
    T_EXPECT_DONE(q, "k");
    T_EXPECT_GET(q, lk);
    T_EXPECT_GET(q, "k");
    assert_int_equal(wq_done(q, KS(lk)), 0);
    T_EXPECT_DONE(q, "k");
    T_EXPECT_STATS(q, 0, 0, 0, 0, __func__);
    t_check_clean(q, __func__);
    t_shared_free(b, sizeof *b);
    t_close(q);
}

/* Counted exactly, in the slot while its process lives, then in the queue,
   however the process went: close, SIGKILL then reap, or release. */
static void test_counts(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("counts", NULL, &name));
    assert_int_equal(wq_add(q, KS("k")), 0);
    struct board *b = t_shared_alloc(sizeof *b);
    enum { N = 1000 };
    for (int how = 0; how < 3; how++) {
        atomic_store(&b->done, 0);
        pid_t pid = t_fork(60);
        if (pid == 0) {
            wq *c;
            if (wq_open(name, NULL, &c) != 0)
                _exit(10);
            uint64_t before = slot_count(c);   /* a reused slot keeps its count */
            for (int i = 0; i < N; i++)
                if (wq_add(c, KS("k")) != 1)
                    _exit(11);
            /* all but the first went without the lock */
            atomic_store(&b->rc[0], (int)(slot_count(c) - before));
            if (how == 0)
                wq_close(c);
            atomic_store(&b->done, 1);
            if (how == 0)
                _exit(0);
            pause();   /* killed here */
            _exit(12);
        }
        assert_true(wait_for(&b->done, 1, 20000));
        assert_int_equal(b->rc[0], N - 1);
        uint64_t want = (uint64_t)(how + 1) * N;
        if (how > 0) {
            /* Dead but not reaped: its slot still counts. */
            kill(pid, SIGKILL);
            assert_int_equal(t_wait(pid, 10000), 128 + SIGKILL);
            assert_int_equal(t_stats(q).coalesced_total, want);
            if (how == 1) {
                assert_int_equal(wq_release_pid(q, pid), 0);
            } else {
                struct wq_shm *s = wq__shm(q);
                assert_int_equal(wq__lock(s), 0);
                assert_int_equal(wq__procs_reap(s), 0);   /* it held no key */
                wq__unlock(s);
            }
        } else {
            assert_int_equal(t_wait(pid, 10000), 0);
        }
        struct wq_stats st = t_stats(q);
        struct wq_metrics m;
        assert_int_equal(wq_metrics(q, &m), 0);
        assert_int_equal(st.coalesced_total, want);
        assert_int_equal(m.coalesced_total, want);
        assert_int_equal(st.adds_total, 1);
    }
    /* The slots keep their counts (never reset): the queue's count is
       what it counted under the lock plus every slot's. */
    struct wq_shm *s = wq__shm(q);
    uint64_t slots = 0;
    for (uint32_t i = 0; i < s->max_procs; i++)
        slots += s->procs[i].coalesced;
    assert_int_equal(slots, 3 * (N - 1));
    assert_int_equal(s->hdr->coalesced_total + slots, 3 * N);
    t_check_clean(q, __func__);
    t_shared_free(b, sizeof *b);
    t_close(q);
}

/* A hint is only a hint: one naming another key's entry, or an entry
   given back and taken by another key, sends the add the locked way. */
static void test_hint_not_trusted(void **state)
{
    (void)state;
    wq *q = t_track(t_create("hint", NULL, NULL));
    struct wq_shm *s = wq__shm(q);
    /* b: a key whose hint slot is not a's (the seed is the region's). */
    uint32_t ha = wq__hash(s->seed, "a", 1), hb;
    char b[2] = "b";
    while ((hb = wq__hash(s->seed, b, 1)) % WQ_HINTS == ha % WQ_HINTS)
        b[0]++;
    assert_int_equal(wq_add(q, KS("a")), 0);
    T_EXPECT_GET(q, "a");
    T_EXPECT_DONE(q, "a");                     /* a's entry is free */
    assert_int_equal(wq_add(q, KS(b)), 0);     /* and b takes it */
    assert_int_equal(wq_add(q, KS("a")), 0);   /* a new add, not coalesced */
    /* Point a's hint at b's entry: the key differs, a's add is locked. */
    uint32_t ib = (uint32_t)s->hints[hb % WQ_HINTS];
    assert_int_equal((uint32_t)(s->hints[hb % WQ_HINTS] >> 32), hb);
    s->hints[ha % WQ_HINTS] = (uint64_t)ha << 32 | ib;
    assert_int_equal(wq_add(q, KS("a")), 1);   /* coalesced, found by the index */
    assert_int_equal(slot_count(q), 0);
    /* A hint past the reserved entries is not read. */
    s->hints[ha % WQ_HINTS] = (uint64_t)ha << 32 | 0xfffffff0u;
    assert_int_equal(wq_add(q, KS("a")), 1);
    assert_int_equal(slot_count(q), 0);
    /* The locked add put the hint right: the next one is lock-free. */
    assert_int_equal(wq_add(q, KS("a")), 1);
    assert_int_equal(slot_count(q), 1);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.adds_total, 3);
    assert_int_equal(st.coalesced_total, 3);
    T_EXPECT_GET(q, b);
    T_EXPECT_GET(q, "a");
    T_EXPECT_DONE(q, b);
    T_EXPECT_DONE(q, "a");
    /* a's entry went back (state 0): its hint still names it, and an add
       of a is new. */
    uint64_t before = slot_count(q);
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(slot_count(q), before);
    assert_int_equal(wq_add(q, KS("a")), 1);   /* dirty now: lock-free */
    assert_int_equal(slot_count(q), before + 1);
    /* A region flagged damaged: the add leaves it to the locked way,
       which repairs first (and still finds a dirty). */
    s->hdr->corrupt = 1;
    assert_int_equal(wq_add(q, KS("a")), 1);
    assert_int_equal(slot_count(q), before + 1);
    assert_int_equal(s->hdr->corrupt, 0);
    T_EXPECT_GET(q, "a");
    T_EXPECT_DONE(q, "a");
    t_check_clean(q, __func__);
    t_close(q);
}

/* A forked child's copy of the handle names its parent's slot: its adds
   register it first and count in its own slot. */
static void test_fork_child(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("fork", NULL, &name));
    struct wq_shm *s = wq__shm(q);
    assert_int_equal(wq_add(q, KS("k")), 0);
    assert_int_equal(wq_add(q, KS("k")), 1);
    assert_int_equal(slot_count(q), 1);
    uint32_t parent = s->slot;
    struct board *b = t_shared_alloc(sizeof *b);
    pid_t pid = t_fork(60);
    if (pid == 0) {
        atomic_store(&b->rc[0], wq_add(q, KS("k")));   /* registers: locked */
        atomic_store(&b->rc[1], (int)(s->slot != parent));
        atomic_store(&b->rc[2], wq_add(q, KS("k")));   /* its own slot */
        atomic_store(&b->rc[3], (int)s->procs[s->slot].coalesced);
        _exit(0);   /* no close: the slot is reaped */
    }
    assert_int_equal(t_wait(pid, 10000), 0);
    assert_int_equal(b->rc[0], 1);
    assert_int_equal(b->rc[1], 1);
    assert_int_equal(b->rc[2], 1);
    assert_int_equal(b->rc[3], 1);
    assert_int_equal(s->procs[parent].coalesced, 1);
    assert_int_equal(t_stats(q).coalesced_total, 3);   /* ours, its two */
    assert_int_equal(wq_release_pid(q, pid), 0);
    assert_int_equal(t_stats(q).coalesced_total, 3);
    T_EXPECT_GET(q, "k");
    T_EXPECT_DONE(q, "k");
    t_check_clean(q, __func__);
    t_shared_free(b, sizeof *b);
    t_close(q);
}

/*
 * The witness of the two tests below, outside the library: a shared
 * mapping of versions. The producer writes a key's version, then adds
 * the key; a worker gets a key, reads its version, records the highest
 * it processed, then wq_done. Versions are written and read with plain
 * (relaxed) atomics, so that no locked instruction of the test's own
 * orders them: only the library's fences do.
 */
enum { HOT = 64, RKEYS = 16, WORKERS = 2 };
struct witness {
    unsigned long long version[HOT];
    atomic_ullong processed[HOT];
    atomic_int ready;
    atomic_ullong fast, adds;
};

static int key_of(const char *k, int len)
{
    int n = 0;
    for (int i = 1; i < len; i++)
        n = n * 10 + (k[i] - '0');
    return n;
}

static void worker(const char *name, struct witness *w)
{
    wq *q;
    if (wq_open(name, NULL, &q) != 0)
        _exit(10);
    atomic_fetch_add(&w->ready, 1);
    char buf[T_KEYBUF];
    int len;
    while ((len = wq_get(q, buf, sizeof buf, -1)) > 0) {
        int k = key_of(buf, len);
        if (k < 0 || k >= HOT)
            _exit(11);
        unsigned long long v = __atomic_load_n(&w->version[k], __ATOMIC_RELAXED);
        /* a short piece of work, so keys stay queued while adds arrive */
        for (volatile int spin = 0; spin < 200; spin++)
            ;
        t_atomic_max(&w->processed[k], v);
        if (wq_done(q, buf, (size_t)len) != 0)
            _exit(12);
    }
    _exit(len == -ESHUTDOWN ? 0 : 13);
}

/* A queue, its witness and WORKERS workers waiting for keys. */
static wq *witness_start(const char *tag, const char **name, struct witness **w, pid_t *pids)
{
    wq *q = t_track(t_create(tag, NULL, name));
    *w = t_shared_alloc(sizeof **w);
    for (int i = 0; i < WORKERS; i++)
        if ((pids[i] = t_fork(120)) == 0)
            worker(*name, *w);
    assert_int_equal(t_wait_count(&(*w)->ready, WORKERS, 20000), 0);
    return q;
}

/* The producer `prod` ended well; drain, stop the workers, and check
   that every key was processed at its last version. */
static void witness_end(wq *q, struct witness *w, pid_t *pids, pid_t prod, int keys)
{
    assert_int_equal(t_wait(prod, 120000), 0);
    assert_int_equal(wq_shutdown_drain(q, 30 * SEC), 0);
    for (int i = 0; i < WORKERS; i++)
        assert_int_equal(t_wait(pids[i], 30000), 0);
    int lost = 0;
    for (int k = 0; k < keys; k++)
        if (w->processed[k] != w->version[k]) {
            printf("key k%d: version %llu, processed %llu\n", k, w->version[k],
                   (unsigned long long)w->processed[k]);
            lost++;
        }
    assert_int_equal(lost, 0);
    T_EXPECT_STATS(q, 0, 0, 0, 0, __func__);
    t_check_clean(q, __func__);
}

/* A producer's handle on the witness's queue, and its slot's count. */
static wq *producer_open(const char *name, uint64_t *before)
{
    wq *p;
    if (wq_open(name, NULL, &p) != 0)
        _exit(10);
    *before = slot_count(p);
    return p;
}

/*
 * No lost update, flat out: one producer bumps version[k] and adds k,
 * over HOT keys, for 1.5 s. Most adds coalesce, and most of those take
 * the lock-free way (asserted).
 */
static void test_no_lost_update(void **state)
{
    (void)state;
    const char *name;
    struct witness *w;
    pid_t pids[WORKERS];
    wq *q = witness_start("witness", &name, &w, pids);
    pid_t prod = t_fork(120);
    if (prod == 0) {
        uint64_t before, x = 88172645463325252ull, n = 0, end = t_now_ns() + 1500 * MS;
        wq *p = producer_open(name, &before);
        while (t_now_ns() < end) {
            for (int i = 0; i < 1000; i++, n++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                int k = (int)(x % HOT);
                char key[8];
                int len = snprintf(key, sizeof key, "k%d", k);
                __atomic_store_n(&w->version[k], w->version[k] + 1, __ATOMIC_RELAXED);
                if (wq_add(p, key, (size_t)len) < 0)
                    _exit(11);
            }
        }
        atomic_store(&w->fast, slot_count(p) - before);
        atomic_store(&w->adds, n);
        wq_close(p);
        _exit(0);
    }
    witness_end(q, w, pids, prod, HOT);
    struct wq_stats st = t_stats(q);
    printf("%llu adds, %llu coalesced, %llu of them without the lock\n",
           (unsigned long long)w->adds, (unsigned long long)st.coalesced_total,
           (unsigned long long)w->fast);
    assert_int_equal(st.adds_total + st.coalesced_total, w->adds);
    assert_true(w->fast > 0 && w->fast * 2 > st.coalesced_total);
    t_shared_free(w, sizeof *w);
    t_close(q);
}

/*
 * The same promise, checked add by add. Each round the producer stores
 * the round number as the version of each of RKEYS keys and adds every
 * key twice (the second add of a key still queued takes the lock-free
 * way), then waits until the workers have processed every key at that
 * version. An add that coalesced into a key a worker had already taken,
 * without that worker seeing the version, leaves the key behind, and the
 * round times out naming it.
 */
static void test_rounds_no_lost_update(void **state)
{
    (void)state;
    const char *name;
    struct witness *w;
    pid_t pids[WORKERS];
    wq *q = witness_start("rounds", &name, &w, pids);
    int rounds = getenv("WQ_TEST_VALGRIND") ? 50 : 3000;
    pid_t prod = t_fork(120);
    if (prod == 0) {
        uint64_t before;
        wq *p = producer_open(name, &before);
        char key[8];
        for (int r = 1; r <= rounds; r++) {
            for (int k = 0; k < RKEYS; k++) {
                int len = snprintf(key, sizeof key, "k%d", k);
                __atomic_store_n(&w->version[k], (unsigned long long)r, __ATOMIC_RELAXED);
                for (int twice = 0; twice < 2; twice++)
                    if (wq_add(p, key, (size_t)len) < 0)
                        _exit(11);
            }
            uint64_t end = t_now_ns() + 10 * SEC;
            for (int k = 0; k < RKEYS; k++)
                while (atomic_load(&w->processed[k]) < (unsigned long long)r) {
                    if (t_now_ns() > end) {
                        printf("round %d: key k%d processed at version %llu only\n", r, k,
                               (unsigned long long)atomic_load(&w->processed[k]));
                        _exit(20);
                    }
                    sched_yield();
                }
        }
        atomic_store(&w->fast, slot_count(p) - before);
        atomic_store(&w->adds, (unsigned long long)rounds * RKEYS * 2);
        wq_close(p);
        _exit(0);
    }
    witness_end(q, w, pids, prod, RKEYS);
    printf("%llu adds checked one by one, %llu of them without the lock\n",
           (unsigned long long)w->adds, (unsigned long long)w->fast);
    assert_true(w->fast > 0);
    t_shared_free(w, sizeof *w);
    t_close(q);
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        T_TEST(test_no_lock),
        T_TEST(test_counts),
        T_TEST(test_hint_not_trusted),
        T_TEST(test_fork_child),
        T_TEST(test_no_lost_update),
        T_TEST(test_rounds_no_lost_update),
        T_NO_LEFTOVERS,
    };
    static const struct t_guard g = {
        .prog = "test-coalesce",
        .deadline_s = 180,
        T_GUARD_TESTS(tests),
    };
    return t_guard_main(&g);
}
