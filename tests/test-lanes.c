/*
 * test-lanes.c - adds published without the region lock (wq_add_publish,
 * src/shm/lanes.c), white-box: links libwq-fault.la, holds the region
 * lock itself and reads the lanes through src/shm/shm.h.
 *   - a handle's first wq_add_publish takes the lock and a lane; the next
 *     64 (a lane's slots) complete while another process holds the
 *     lock, the next one waits
 *     for it; every locking call applies them first, in order, also
 *     around the same handle's locked adds;
 *   - coalescing: a key already in the handle's lane coalesces at once;
 *     a dirty key the handle has no hint of coalesces when applied;
 *     counts are exact, also after a locker was SIGKILLed between
 *     applying an add and retiring it (crash point lanes.applied), for a
 *     new key and a coalesced one;
 *   - a producer SIGKILLed after writing a slot and before publishing it
 *     leaves no add; one killed just after leaves the add; one killed at
 *     random leaves exactly the adds a witness outside the library saw
 *     acknowledged (and at most the one in flight), in order;
 *   - room: a queue of capacity 50 takes exactly 50 keys from a
 *     publisher and a plain adder together, the 51st is -ENOSPC, and no
 *     published add is ever refused when applied;
 *   - a wq_get asleep on an empty queue is woken by a published add at
 *     once, not at its 100 ms reap tick;
 *   - lanes go with process slots: 8 publishing handles take the 8 lanes,
 *     a 9th adds the locked way, and gets a lane when one closes; a dead
 *     publisher's adds are applied and its lane freed at the reap;
 *   - a shutdown applies what was published and takes the room back, so
 *     the next wq_add_publish is -ESHUTDOWN;
 *   - a damaged lane word is found by wq_check, named, and repaired;
 *   - two producers publishing flat out to one consumer: every key
 *     handed out once, each producer's keys in the order it added them.
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

#include "fault-api.h"
#include "shm/shm.h"

enum { WQ_DEFAULT_KEY_BUF = 256 };   /* wq_get's buffer: max_key_len */

struct board {
    atomic_int step;
    atomic_int done;
    atomic_int rc[WQ_LANE_SLOTS + 8];
    atomic_ullong acked;   /* a producer's adds that returned */
    atomic_ullong ns;
};

static bool wait_for(atomic_int *v, int want, int ms)
{
    return t_wait_count(v, want, ms) == 0;
}

/* Adds this handle's lane has been given (its tail). */
static uint32_t published(wq *q)
{
    struct wq_shm *s = wq__shm(q);
    return (uint32_t)__atomic_load_n(&s->lanes[s->lane].tl, __ATOMIC_ACQUIRE);
}

/* Adds in this handle's lane, published and not yet applied. */
static uint32_t unapplied(wq *q)
{
    struct wq_shm *s = wq__shm(q);
    if (s->lane >= WQ_LANES)
        return UINT32_MAX;
    const struct wq_lane *ln = &s->lanes[s->lane];
    return (uint32_t)__atomic_load_n(&ln->tl, __ATOMIC_ACQUIRE) -
           __atomic_load_n(&ln->head, __ATOMIC_ACQUIRE);
}

static void key_of(char *buf, size_t cap, const char *prefix, int i)
{
    snprintf(buf, cap, "%s%06d", prefix, i);
}

static void expect_keys(wq *q, const char *prefix, int from, int to)
{
    char k[64];
    for (int i = from; i < to; i++) {
        key_of(k, sizeof k, prefix, i);
        T_EXPECT_GET(q, k);
        T_EXPECT_DONE(q, k);
    }
}

/* Order: published adds come before whatever locks next, and around the
   handle's own locked adds; short and arena keys alike. */
static void test_order(void **state)
{
    (void)state;
    wq *q = t_track(t_create("order", NULL, NULL));
    char k[64], lk[WQ_LANE_KEY];
    memset(lk, 'L', sizeof lk);
    assert_int_equal(wq_add_publish(q, KS("first")), 0);   /* locked: takes a lane */
    assert_true(wq__shm(q)->lane < WQ_LANES);
    assert_int_equal(unapplied(q), 0);
    for (int i = 0; i < 20; i++) {
        key_of(k, sizeof k, "k", i);
        assert_int_equal(wq_add_publish(q, KS(k)), 0);
    }
    assert_int_equal(wq_add_publish(q, lk, sizeof lk), 0);   /* 40 bytes: the arena */
    assert_int_equal(unapplied(q), 21);
    assert_int_equal(wq_len(q), 22);   /* it applies them first */
    assert_int_equal(unapplied(q), 0);
    struct wq_stats st = t_stats(q);
    assert_int_equal(unapplied(q), 0);
    assert_int_equal(st.queued, 22);
    assert_int_equal(st.adds_total, 22);
    assert_int_equal(st.coalesced_total, 0);
    T_EXPECT_GET(q, "first");
    T_EXPECT_DONE(q, "first");
    expect_keys(q, "k", 0, 20);
    T_EXPECT_GETN(q, lk, sizeof lk);
    assert_int_equal(wq_done(q, lk, sizeof lk), 0);
    /* A 41-byte key and a plain wq_add go the locked way, after the lane. */
    for (int i = 20; i < 25; i++) {
        key_of(k, sizeof k, "k", i);
        assert_int_equal(wq_add_publish(q, KS(k)), 0);
    }
    char lk49[WQ_LANE_KEY + 1];
    memset(lk49, 'M', sizeof lk49);
    assert_int_equal(wq_add_publish(q, lk49, sizeof lk49), 0);
    assert_int_equal(unapplied(q), 0);   /* its lock applied the five */
    assert_int_equal(wq_add_publish(q, KS("k000025")), 0);
    assert_int_equal(wq_add(q, KS("k000026")), 0);
    assert_int_equal(wq_add_publish(q, KS("k000027")), 0);
    assert_int_equal(unapplied(q), 1);
    expect_keys(q, "k", 20, 25);
    T_EXPECT_GETN(q, lk49, sizeof lk49);
    assert_int_equal(wq_done(q, lk49, sizeof lk49), 0);
    expect_keys(q, "k", 25, 28);
    T_EXPECT_STATS(q, 0, 0, 0, 0, __func__);
    t_check_clean(q, __func__);
    t_close(q);
}

/* Coalescing: known in the lane, or decided when applied; counted once. */
static void test_coalesce(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("coal", NULL, &name));
    wq *o = t_track(T_OPEN(name, NULL));
    assert_int_equal(wq_add(o, KS("y")), 0);   /* dirty; q has no hint of it */
    assert_int_equal(wq_add_publish(q, KS("x")), 0);
    /* x is dirty and this handle put it there: coalesced without the lock */
    assert_int_equal(wq_add_publish(q, KS("x")), 1);
    assert_int_equal(wq_add_publish(q, KS("a")), 0);
    assert_int_equal(wq_add_publish(q, KS("b")), 0);
    /* a is in the lane, not applied: dirty for anyone who locks */
    assert_int_equal(wq_add_publish(q, KS("a")), 1);
    /* y: published, and coalesced when applied */
    assert_int_equal(wq_add_publish(q, KS("y")), 0);
    assert_int_equal(unapplied(q), 3);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.adds_total, 4);
    assert_int_equal(st.coalesced_total, 3);
    assert_int_equal(st.queued, 4);
    T_EXPECT_GET(q, "y");
    T_EXPECT_DONE(q, "y");
    /* a processing key published again comes back at its done */
    T_EXPECT_GET(q, "x");
    assert_int_equal(wq_add_publish(q, KS("x")), 0);
    T_EXPECT_DONE(q, "x");
    T_EXPECT_GET(q, "a");
    T_EXPECT_GET(q, "b");
    T_EXPECT_GET(q, "x");
    T_EXPECT_DONE(q, "a");
    T_EXPECT_DONE(q, "b");
    T_EXPECT_DONE(q, "x");
    st = t_stats(q);
    assert_int_equal(st.adds_total, 5);
    assert_int_equal(st.coalesced_total, 3);
    t_check_clean(q, __func__);
    t_close(o);
    t_close(q);
}

/* The child of test_lock_held: a lane's worth of publications under the
   parent's lock,
   then one that must wait for it. */
static void lock_held_child(const char *name, struct board *b)
{
    wq *q;
    if (wq_open(name, NULL, &q) != 0)
        _exit(10);
    if (wq_add_publish(q, KS("c-first")) != 0)
        _exit(11);
    atomic_store(&b->done, 1);
    if (!wait_for(&b->step, 1, 10000))
        _exit(12);
    char k[64];
    for (int i = 0; i <= (int)WQ_LANE_SLOTS; i++) {
        key_of(k, sizeof k, "c", i);
        atomic_store(&b->rc[i], wq_add_publish(q, KS(k)));
        atomic_store(&b->done, 2 + i);
    }
    wq_close(q);
    _exit(0);
}

static void test_lock_held(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("held", NULL, &name));
    struct wq_shm *s = wq__shm(q);
    struct board *b = t_shared_alloc(sizeof *b);
    pid_t pid = t_fork(60);
    if (pid == 0)
        lock_held_child(name, b);
    assert_true(wait_for(&b->done, 1, 10000));
    assert_int_equal(wq__lock(s), 0);
    atomic_store(&b->step, 1);
    /* a lane's worth without the lock */
    bool fast = wait_for(&b->done, 1 + (int)WQ_LANE_SLOTS, 10000);
    t_sleep_ms(200);
    int early = atomic_load(&b->done);
    wq__unlock(s);
    assert_true(fast);
    assert_int_equal(early, 1 + (int)WQ_LANE_SLOTS);   /* the next waited for the lock */
    assert_int_equal(t_wait(pid, 10000), 0);
    for (int i = 0; i <= (int)WQ_LANE_SLOTS; i++)
        assert_int_equal(b->rc[i], 0);
    T_EXPECT_GET(q, "c-first");
    T_EXPECT_DONE(q, "c-first");
    expect_keys(q, "c", 0, 1 + (int)WQ_LANE_SLOTS);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.adds_total, 2 + WQ_LANE_SLOTS);
    assert_int_equal(st.coalesced_total, 0);
    t_check_clean(q, __func__);
    t_shared_free(b, sizeof *b);
    t_close(q);
}

/* A locker killed after applying an add and before retiring it: the next
   locker retires it without making or counting it again. */
static void test_applier_killed(void **state)
{
    (void)state;
    for (int nth = 1; nth <= 4; nth++) {
        const char *name;
        wq *q = t_track(t_create("applier", NULL, &name));
        assert_int_equal(wq_add(q, KS("y")), 0);   /* the child has no hint of it */
        pid_t pid = t_fork(60);
        if (pid == 0) {
            wq *c;
            if (wq_open(name, NULL, &c) != 0)
                _exit(10);
            /* x locked; then a, b, y (coalesces when applied), c */
            const char *keys[] = { "x", "a", "b", "y", "c" };
            for (int i = 0; i < 5; i++)
                if (wq_add_publish(c, KS(keys[i])) != 0)
                    _exit(11);
            if (unapplied(c) != 4)
                _exit(12);
            wq_fault_arm("lanes.applied", (unsigned)nth, WQ_FAULT_KILL);
            (void)wq_len(c);
            struct wq_stats st;
            (void)wq_stats(c, &st);   /* dies applying the nth */
            _exit(13);
        }
        assert_int_equal(t_wait(pid, 10000), 128 + SIGKILL);
        struct wq_stats st = t_stats(q);   /* repairs, applies the rest */
        assert_int_equal(st.adds_total, 5);
        assert_int_equal(st.coalesced_total, 1);
        assert_int_equal(st.queued, 5);
        T_EXPECT_GET(q, "y");
        T_EXPECT_DONE(q, "y");
        T_EXPECT_GET(q, "x");
        T_EXPECT_GET(q, "a");
        T_EXPECT_GET(q, "b");
        T_EXPECT_GET(q, "c");
        T_EXPECT_DONE(q, "x");
        T_EXPECT_DONE(q, "a");
        T_EXPECT_DONE(q, "b");
        T_EXPECT_DONE(q, "c");
        t_check_clean(q, __func__);
        t_close(q);
        assert_int_equal(wq_unlink(name), 0);
    }
}

/* A producer killed at a crash point of its publication. */
static void test_producer_points(void **state)
{
    (void)state;
    static const struct {
        const char *point;
        unsigned nth;   /* killed at its nth time */
        int present;    /* keys k0.. that must be there */
    } c[] = {
        { "lanes.written", 5, 5 },
        { "lanes.published", 5, 6 },
        /* The first publication into an applied lane, killed before it
           set the lane's bit: a getter reaps the producer, which marks
           the lane, and applies it. */
        { "lanes.published", 1, 2 },
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        const char *name;
        wq *q = t_track(t_create("point", NULL, &name));
        pid_t pid = t_fork(60);
        if (pid == 0) {
            wq *p;
            if (wq_open(name, NULL, &p) != 0)
                _exit(10);
            if (wq_add_publish(p, KS("k000000")) != 0)   /* locked: no point */
                _exit(11);
            wq_fault_arm(c[i].point, c[i].nth, WQ_FAULT_KILL);
            char k[64];
            for (int j = 1; j < 10; j++) {
                key_of(k, sizeof k, "k", j);
                if (wq_add_publish(p, KS(k)) != 0)
                    _exit(12);
            }
            _exit(13);
        }
        assert_int_equal(t_wait(pid, 10000), 128 + SIGKILL);
        if (c[i].nth == 1) {
            assert_int_equal(t_stats(q).queued, 1);   /* no bit: not applied yet */
            T_EXPECT_GET(q, "k000000");
            T_EXPECT_DONE(q, "k000000");
            char buf[WQ_DEFAULT_KEY_BUF];
            uint64_t t0 = t_now_ns();
            int n = wq_get(q, buf, sizeof buf, 5 * 1000000000ll);
            assert_int_equal(n, 7);
            assert_memory_equal(buf, "k000001", 7);
            assert_true(t_now_ns() - t0 < 1000ull * 1000000 * t_scale());
            T_EXPECT_DONE(q, "k000001");
            assert_int_equal(t_stats(q).adds_total, 2);
        } else {
            struct wq_stats st = t_stats(q);
            assert_int_equal(st.queued, (uint64_t)c[i].present);
            assert_int_equal(st.adds_total, (uint64_t)c[i].present);
            expect_keys(q, "k", 0, c[i].present);
        }
        T_EXPECT_GET_RC(q, -EAGAIN);
        assert_int_equal(wq_check(q, WQ_CHECK_REAP), 0);
        t_check_clean(q, __func__);
        t_close(q);
        assert_int_equal(wq_unlink(name), 0);
    }
}

/* A producer SIGKILLed at a random moment: exactly the adds it saw
   acknowledged (a witness in a shared mapping), and at most the one it
   was making, are in the queue, in order. */
static void test_producer_random_kill(void **state)
{
    (void)state;
    struct board *b = t_shared_alloc(sizeof *b);
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    for (int round = 0; round < 20; round++) {
        const char *name;
        wq *q = t_track(t_create("random", NULL, &name));
        atomic_store(&b->acked, 0);
        atomic_store(&b->done, 0);
        pid_t pid = t_fork(60);
        if (pid == 0) {
            wq *p;
            if (wq_open(name, NULL, &p) != 0)
                _exit(10);
            atomic_store(&b->done, 1);
            char k[64];
            for (int j = 0; j < 50000; j++) {
                key_of(k, sizeof k, "k", j);
                if (wq_add_publish(p, KS(k)) != 0)
                    _exit(12);
                atomic_store(&b->acked, (unsigned long long)j + 1);
            }
            pause();
            _exit(13);
        }
        assert_true(wait_for(&b->done, 1, 10000));
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        usleep((useconds_t)(rng % 3000));
        kill(pid, SIGKILL);
        assert_int_equal(t_wait(pid, 10000), 128 + SIGKILL);
        uint64_t acked = atomic_load(&b->acked);
        struct wq_stats st = t_stats(q);
        assert_in_range(st.queued, acked, acked + 1);
        assert_int_equal(st.adds_total, st.queued);
        expect_keys(q, "k", 0, (int)st.queued);
        assert_int_equal(wq_check(q, WQ_CHECK_REAP), 0);
        t_close(q);
        assert_int_equal(wq_unlink(name), 0);
    }
    t_shared_free(b, sizeof *b);
}

/* Capacity 50: a publisher and a plain adder in another process get
   exactly 50 keys in, the 51st is refused; nothing published is lost. */
static void test_capacity(void **state)
{
    (void)state;
    const char *name;
    struct wq_options o = { .capacity = 50 };
    wq *q = t_track(t_create("cap", &o, &name));
    struct wq_shm *s = wq__shm(q);
    char k[64];
    for (int i = 0; i < 10; i++) {
        key_of(k, sizeof k, "p", i);
        assert_int_equal(wq_add_publish(q, KS(k)), 0);
    }
    assert_true(s->hdr->lane_granted > 0);   /* room held for the lane */
    wq *a = t_track(T_OPEN(name, NULL));
    for (int i = 0; i < 40; i++) {
        key_of(k, sizeof k, "a", i);
        assert_int_equal(wq_add(a, KS(k)), 0);   /* the lane's room comes back */
    }
    assert_int_equal(wq_add(a, KS("a-over")), -ENOSPC);
    assert_int_equal(wq_add_publish(q, KS("p-over")), -ENOSPC);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.live, 50);
    assert_int_equal(st.adds_total, 50);
    /* room again: the publisher fills it, through its lane */
    expect_keys(q, "p", 0, 10);
    for (int i = 10; i < 20; i++) {
        key_of(k, sizeof k, "p", i);
        assert_int_equal(wq_add_publish(q, KS(k)), 0);
    }
    assert_int_equal(wq_add_publish(q, KS("p-over")), -ENOSPC);
    st = t_stats(q);
    assert_int_equal(st.live, 50);
    assert_true(s->hdr->live + s->hdr->lane_granted <= 50);
    expect_keys(q, "a", 0, 40);
    expect_keys(q, "p", 10, 20);
    t_check_clean(q, __func__);
    t_close(a);
    t_close(q);
}

/* An idle key kept for its failure count comes back live without a new
   entry: it takes room from the lanes' unused grants, never from adds
   already published; capacity holds exactly. */
static void test_retained_room(void **state)
{
    (void)state;
    const char *name;
    struct wq_options o = { .capacity = 50 };
    wq *q = t_track(t_create("retained", &o, &name));
    struct wq_shm *s = wq__shm(q);
    wq *a = t_track(T_OPEN(name, NULL));
    assert_int_equal(wq_add_rate_limited(a, KS("x")), 0);
    assert_int_equal(wq_add(a, KS("x")), 0);   /* ready now */
    T_EXPECT_GET(a, "x");
    T_EXPECT_DONE(a, "x");                      /* retained: its failure count */
    char k[64];
    for (int i = 0; i < 10; i++) {
        key_of(k, sizeof k, "p", i);
        assert_int_equal(wq_add_publish(q, KS(k)), 0);
    }
    (void)t_stats(q);   /* applied; the lane granted the rest of the room */
    assert_int_equal(s->hdr->live + s->hdr->lane_granted, 50);
    assert_int_equal(wq_add(a, KS("x")), 0);   /* room taken back from the lane */
    assert_true(s->hdr->live + s->hdr->lane_granted <= 50);
    for (int i = 10; i < 49; i++) {
        key_of(k, sizeof k, "p", i);
        assert_int_equal(wq_add_publish(q, KS(k)), 0);
    }
    assert_int_equal(wq_add_publish(q, KS("p-over")), -ENOSPC);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.live, 50);
    assert_int_equal(st.queued, 50);
    assert_true(s->hdr->live + s->hdr->lane_granted <= 50);
    expect_keys(q, "p", 0, 10);
    T_EXPECT_GET(q, "x");
    T_EXPECT_DONE(q, "x");
    expect_keys(q, "p", 10, 49);
    t_close(a);
    t_close(q);
}

/* A getter asleep on an empty queue wakes at a published add. */
static void test_wake(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("wake", NULL, &name));
    struct wq_shm *s = wq__shm(q);
    struct board *b = t_shared_alloc(sizeof *b);
    assert_int_equal(wq_add_publish(q, KS("first")), 0);   /* takes the lane */
    T_EXPECT_GET(q, "first");
    T_EXPECT_DONE(q, "first");
    enum { ROUNDS = 8 };
    pid_t pid = t_fork(60);
    if (pid == 0) {
        wq *c;
        if (wq_open(name, NULL, &c) != 0)
            _exit(10);
        char buf[WQ_DEFAULT_KEY_BUF];
        for (int r = 0; r < ROUNDS; r++) {
            atomic_store(&b->done, 1 + 2 * r);
            int n = wq_get(c, buf, sizeof buf, 10 * 1000000000ll);
            uint64_t at = t_now_ns();
            if (n <= 0)
                _exit(11);
            atomic_store(&b->ns, at);
            if (wq_done(c, buf, (size_t)n) != 0)
                _exit(12);
            atomic_store(&b->done, 2 + 2 * r);
        }
        wq_close(c);
        _exit(0);
    }
    uint64_t worst = 0;
    char k[64];
    for (int r = 0; r < ROUNDS; r++) {
        assert_true(wait_for(&b->done, 1 + 2 * r, 10000));
        /* asleep: counted in waiters */
        uint64_t end = t_now_ns() + 10ull * 1000000000;
        while (__atomic_load_n(&s->hdr->waiters, __ATOMIC_ACQUIRE) == 0 && t_now_ns() < end)
            t_sleep_ms(1);
        t_sleep_ms(5);
        key_of(k, sizeof k, "w", r);
        uint32_t before = published(q);
        uint64_t t0 = t_now_ns();
        assert_int_equal(wq_add_publish(q, KS(k)), 0);
        assert_int_equal(published(q), before + 1);   /* not the locked way */
        assert_true(wait_for(&b->done, 2 + 2 * r, 10000));
        uint64_t d = atomic_load(&b->ns) - t0;
        worst = d > worst ? d : worst;
    }
    assert_int_equal(t_wait(pid, 10000), 0);
    printf("worst wake after a publication: %.2f ms\n", (double)worst / 1e6);
    /* The reap tick would give 0-100 ms; every round must beat 40 ms. */
    assert_true(worst < 40ull * 1000000 * t_scale());
    t_shared_free(b, sizeof *b);
    t_close(q);
}

/* 8 lanes for 8 publishing handles; the 9th adds the locked way until a
   lane is free; a dead publisher's adds are applied and its lane freed. */
static void test_lanes_and_slots(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("slots", NULL, &name));
    wq *h[WQ_LANES + 1];
    char k[64];
    for (unsigned i = 0; i <= WQ_LANES; i++) {
        h[i] = i == 0 ? q : t_track(T_OPEN(name, NULL));
        key_of(k, sizeof k, "h", (int)i);
        assert_int_equal(wq_add_publish(h[i], KS(k)), 0);
    }
    for (unsigned i = 0; i < WQ_LANES; i++)
        assert_int_equal(wq__shm(h[i])->lane, i);
    assert_int_equal(wq__shm(h[WQ_LANES])->lane, WQ_NIL);
    assert_int_equal(wq_add_publish(h[WQ_LANES], KS("h-more")), 0);   /* locked */
    assert_int_equal(wq__shm(h[WQ_LANES])->lane, WQ_NIL);
    t_close(h[3]);
    assert_int_equal(wq_add_publish(h[WQ_LANES], KS("h-again")), 0);
    assert_int_equal(wq__shm(h[WQ_LANES])->lane, 3);
    assert_int_equal(wq_add_publish(h[WQ_LANES], KS("h-lane")), 0);
    assert_int_equal(unapplied(h[WQ_LANES]), 1);
    /* A publisher that dies with adds in its lane */
    t_close(h[5]);
    pid_t pid = t_fork(60);
    if (pid == 0) {
        wq *c;
        if (wq_open(name, NULL, &c) != 0)
            _exit(10);
        for (int j = 0; j < 4; j++) {
            key_of(k, sizeof k, "dead", j);
            if (wq_add_publish(c, KS(k)) != 0)
                _exit(11);
        }
        if (wq__shm(c)->lane != 5 || unapplied(c) != 3)
            _exit(12);
        raise(SIGKILL);
        _exit(13);
    }
    assert_int_equal(t_wait(pid, 10000), 128 + SIGKILL);
    assert_int_equal(wq__shm(q)->lanes[5].owner != 0, 1);
    assert_int_equal(wq_check(q, WQ_CHECK_REAP), 0);
    assert_int_equal(wq__shm(q)->lanes[5].owner, 0);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.queued, WQ_LANES + 1 + 3 + 4);
    for (unsigned i = 0; i <= WQ_LANES; i++) {
        key_of(k, sizeof k, "h", (int)i);
        T_EXPECT_GET(q, k);
    }
    T_EXPECT_GET(q, "h-more");
    T_EXPECT_GET(q, "h-again");
    T_EXPECT_GET(q, "h-lane");
    for (int j = 0; j < 4; j++) {
        key_of(k, sizeof k, "dead", j);
        T_EXPECT_GET(q, k);
    }
    for (unsigned i = 0; i <= WQ_LANES; i++)
        if (i != 3 && i != 5 && i != 0)
            t_close(h[i]);
    t_close(q);
}

/* Shutdown applies what was published and takes the lanes' room back. */
static void test_shutdown(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(t_create("shut", NULL, &name));
    wq *o = t_track(T_OPEN(name, NULL));
    char k[64];
    for (int i = 0; i < 6; i++) {
        key_of(k, sizeof k, "s", i);
        assert_int_equal(wq_add_publish(q, KS(k)), 0);
    }
    assert_int_equal(unapplied(q), 5);
    assert_int_equal(wq_shutdown(o), 0);
    assert_int_equal(unapplied(q), 0);
    assert_int_equal(wq__shm(q)->hdr->lane_granted, 0);
    assert_int_equal(wq_add_publish(q, KS("late")), -ESHUTDOWN);
    for (int i = 0; i < 6; i++) {
        key_of(k, sizeof k, "s", i);
        T_EXPECT_GET(o, k);
        T_EXPECT_DONE(o, k);
    }
    T_EXPECT_GET_RC(o, -ESHUTDOWN);
    assert_int_equal(wq_resume(o), 0);
    assert_int_equal(wq_add_publish(q, KS("s000006")), 0);   /* locked: room again */
    assert_int_equal(wq_add_publish(q, KS("s000007")), 0);
    assert_int_equal(unapplied(q), 1);
    expect_keys(o, "s", 6, 8);
    t_close(o);
    t_close(q);
}

struct collect {
    int n;
    char lines[8][200];
};

static void collect(const char *what, void *arg)
{
    struct collect *c = arg;
    if (c->n < 8)
        snprintf(c->lines[c->n], sizeof c->lines[0], "%s", what);
    c->n++;
}

/* A lane word out of order: named by wq_check, repaired. */
static void test_damaged_lane(void **state)
{
    (void)state;
    wq *q = t_track(t_create("damaged", NULL, NULL));
    struct wq_shm *s = wq__shm(q);
    assert_int_equal(wq_add_publish(q, KS("a")), 0);
    assert_int_equal(wq_add_publish(q, KS("b")), 0);
    uint32_t l = s->lane;
    struct wq_lane *ln = &s->lanes[l];
    uint32_t head = ln->head;
    __atomic_store_n(&ln->tl, (uint64_t)(head + 200) << 32 | (head + 100), __ATOMIC_SEQ_CST);
    /* Its bit lost too, so that no lock applies (and repairs) it first. */
    __atomic_store_n(&s->hdr->lanes_pending, 0, __ATOMIC_SEQ_CST);
    struct collect c = { 0 };
    int found = wq_check_report(q, 0, collect, &c);
    assert_true(found >= 1);
    char want[160];
    snprintf(want, sizeof want, "lane %u: head %u, tail %u, limit %u out of order; its adds "
             "are lost", l, head, head + 100, head + 200);
    bool seen = false;
    for (int i = 0; i < c.n && i < 8; i++)
        seen |= strcmp(c.lines[i], want) == 0;
    if (!seen)
        for (int i = 0; i < c.n && i < 8; i++)
            printf("report: %s\n", c.lines[i]);
    assert_true(seen);
    assert_true(wq_check(q, WQ_CHECK_REPAIR) >= 1);
    assert_int_equal(wq_check(q, 0), 0);
    /* Damaged while its bit is set: the lock that applies it finds it,
       repairs at once, and the call goes on. */
    assert_int_equal(wq_add_publish(q, KS("b2")), 0);   /* locked: room again */
    uint64_t repairs = t_stats(q).repairs_total;
    assert_int_equal(wq_add_publish(q, KS("b3")), 0);
    assert_int_equal(unapplied(q), 1);
    head = ln->head;
    __atomic_store_n(&ln->tl, (uint64_t)(head + 200) << 32 | (head + 100), __ATOMIC_SEQ_CST);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.repairs_total, repairs + 1);
    assert_int_equal(st.queued, 2);   /* a, b2; b3 was in the damaged lane */
    assert_int_equal(wq_check(q, 0), 0);
    T_EXPECT_GET(q, "a");   /* applied before the damage */
    T_EXPECT_DONE(q, "a");
    T_EXPECT_GET(q, "b2");   /* b was in the damaged lane */
    T_EXPECT_DONE(q, "b2");
    T_EXPECT_GET_RC(q, -EAGAIN);
    /* the handle publishes again */
    assert_int_equal(wq_add_publish(q, KS("c")), 0);
    assert_int_equal(wq_add_publish(q, KS("d")), 0);
    T_EXPECT_GET(q, "c");
    T_EXPECT_GET(q, "d");
    T_EXPECT_DONE(q, "c");
    T_EXPECT_DONE(q, "d");
    assert_int_equal(wq_check(q, 0), 0);
    /* A published slot whose length was damaged: the check names it
       (its lane's bit lost too, so no lock applied it), then applying
       drops it, applies the next one, and the lock repairs at once. */
    assert_int_equal(wq_add_publish(q, KS("e")), 0);
    assert_int_equal(wq_add_publish(q, KS("f")), 0);
    assert_int_equal(unapplied(q), 2);
    uint32_t at = ln->head;
    ln->s[at % WQ_LANE_SLOTS].len = 0;
    uint32_t bits = __atomic_exchange_n(&s->hdr->lanes_pending, 0, __ATOMIC_SEQ_CST);
    c.n = 0;
    assert_int_equal(wq_check_report(q, 0, collect, &c), 1);
    snprintf(want, sizeof want, "lane %u: its add at %u has a key of 0 bytes; it is dropped",
             l, at);
    assert_string_equal(c.lines[0], want);
    repairs = t_stats(q).repairs_total;   /* no bit: nothing applied */
    __atomic_fetch_or(&s->hdr->lanes_pending, bits, __ATOMIC_SEQ_CST);
    T_EXPECT_GET(q, "f");
    T_EXPECT_DONE(q, "f");
    T_EXPECT_GET_RC(q, -EAGAIN);
    assert_int_equal(t_stats(q).repairs_total, repairs + 1);
    assert_int_equal(wq_check(q, 0), 0);
    /* Bits for lanes that do not exist (found by the fuzzer: the applier
       read past the lanes): dropped, with the real lane's applied. What
       follows the lanes (the key arena) is made to look like a ninth lane
       holding an add of "ghost", which must not be made. The arena's
       first bytes are "h"'s run record, its second "g"'s (keys.c); the
       test puts them back around the fake lane. */
    assert_int_equal(wq_add(q, KS("h")), 0);
    T_EXPECT_GET(q, "h");
    assert_int_equal(wq_add_publish(q, KS("g")), 0);
    assert_int_equal(unapplied(q), 1);
    struct wq_lane *ninth = &s->lanes[WQ_LANES];
    unsigned char *nb = (unsigned char *)ninth;
    assert_ptr_equal(nb, s->karena);   /* the layout this relies on */
    assert_int_equal(s->hdr->k_top, WQ_RUN_GRAINS);
    const size_t run = WQ_RUN_GRAINS * WQ_KEY_GRAIN;
    unsigned char saved[3 * 64];
    memcpy(saved, nb, sizeof saved);
    memset(nb, 0, sizeof saved);
    ninth->s[0].len = 5;
    memcpy(ninth->s[0].key, "ghost", 5);
    __atomic_store_n(&ninth->tl, (uint64_t)WQ_LANE_SLOTS << 32 | 1, __ATOMIC_SEQ_CST);
    __atomic_fetch_or(&s->hdr->lanes_pending, 0xffffff00u | 1u << l, __ATOMIC_SEQ_CST);
    T_EXPECT_GET(q, "g");
    assert_int_equal(s->hdr->k_top, 2 * WQ_RUN_GRAINS);
    memcpy(nb, saved, run);
    memcpy(nb + 2 * run, saved + 2 * run, sizeof saved - 2 * run);
    T_EXPECT_DONE(q, "g");
    T_EXPECT_DONE(q, "h");
    T_EXPECT_GET_RC(q, -EAGAIN);
    assert_int_equal(t_key_state(q, "ghost"), 0);
    assert_int_equal(__atomic_load_n(&s->hdr->lanes_pending, __ATOMIC_SEQ_CST), 0);
    assert_int_equal(wq_check(q, 0), 0);
    t_close(q);
}

/* Two producers flat out, one consumer: every key once, each producer's
   in its order (a witness: the consumer's record in a shared mapping). */
enum { FLAT_KEYS = 100000 };
struct flat {
    atomic_int next[2];     /* the next key index expected from producer p */
    atomic_int bad;
    atomic_int got;
};

static void test_flat_out(void **state)
{
    (void)state;
    const char *name;
    struct wq_options o = { .capacity = 2 * FLAT_KEYS };   /* never full */
    wq *q = t_track(t_create("flat", &o, &name));
    struct flat *f = t_shared_alloc(sizeof *f);
    int n = FLAT_KEYS / (int)t_scale();
    pid_t pids[3];
    for (int p = 0; p < 2; p++) {
        if ((pids[p] = t_fork(120)) == 0) {
            wq *c;
            if (wq_open(name, NULL, &c) != 0)
                _exit(10);
            char k[64];
            for (int i = 0; i < n; i++) {
                snprintf(k, sizeof k, "%d/%07d", p, i);
                if (wq_add_publish(c, KS(k)) != 0)
                    _exit(11);
            }
            wq_close(c);
            _exit(0);
        }
    }
    if ((pids[2] = t_fork(120)) == 0) {
        wq *c;
        if (wq_open(name, NULL, &c) != 0)
            _exit(10);
        char buf[WQ_DEFAULT_KEY_BUF + 1];
        while (atomic_load(&f->got) < 2 * n) {
            int len = wq_get(c, buf, sizeof buf - 1, 10 * 1000000000ll);
            if (len <= 0)
                _exit(12);
            buf[len] = 0;
            int p = buf[0] - '0', i = atoi(buf + 2);
            if (p < 0 || p > 1 || i != atomic_load(&f->next[p]))
                atomic_fetch_add(&f->bad, 1);
            atomic_store(&f->next[p], i + 1);
            atomic_fetch_add(&f->got, 1);
            if (wq_done(c, buf, (size_t)len) != 0)
                _exit(13);
        }
        wq_close(c);
        _exit(0);
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(t_wait(pids[i], 120000), 0);
    assert_int_equal(f->bad, 0);
    assert_int_equal(f->got, 2 * n);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.adds_total, (uint64_t)2 * n);
    assert_int_equal(st.coalesced_total, 0);
    assert_int_equal(st.live, 0);
    t_check_clean(q, __func__);
    t_shared_free(f, sizeof *f);
    t_close(q);
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        T_TEST(test_order),
        T_TEST(test_coalesce),
        T_TEST(test_lock_held),
        T_TEST(test_applier_killed),
        T_TEST(test_producer_points),
        T_TEST(test_producer_random_kill),
        T_TEST(test_capacity),
        T_TEST(test_retained_room),
        T_TEST(test_wake),
        T_TEST(test_lanes_and_slots),
        T_TEST(test_shutdown),
        T_TEST(test_damaged_lane),
        T_TEST(test_flat_out),
        T_NO_LEFTOVERS,
    };
    static const struct t_guard g = {
        .prog = "test-lanes",
        .deadline_s = 240,
        T_GUARD_TESTS(tests),
    };
    return t_guard_main(&g);
}
