/*
 * test-keys.c - the calls on keys, with exact error codes: capacity, key
 * sizes, binary keys, wq_get buffers and timeouts, wq_done of keys that
 * are not processing, the counters of wq_stats, wq_dump, the fast paths
 * (wq_add_many, wq_done_get) and batches (wq_get_many, wq_done_many),
 * wq_check on a healthy queue, shutdown and
 * the error strings.
 *
 * Everything here is single-threaded in the test process. (Opening
 * queues: test-open.c; handles across fork, crash and close:
 * test-fork.c.)
 */
#include "t.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Capacity                                                            */
/* ------------------------------------------------------------------ */

static void capacity_full(void **state)
{
    (void)state;
    wq *q = t_create("cap", T_OPTS(.capacity = 8), NULL);
    char k[16];

    for (int i = 0; i < 8; i++) {
        snprintf(k, sizeof k, "k%d", i);
        assert_int_equal(wq_add(q, KS(k)), 0);
    }
    assert_int_equal(wq_add(q, KS("k8")), -ENOSPC);
    assert_int_equal(wq_len(q), 8);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.live, 8);
    assert_int_equal(st.queued, 8);
    assert_int_equal(st.capacity, 8);
    assert_int_equal(st.adds_total, 8);
    assert_int_equal(st.coalesced_total, 0);

    /* Coalescing into an existing key needs no slot. */
    assert_int_equal(wq_add(q, KS("k3")), 1);

    T_EXPECT_GET(q, "k0");
    /* A processing key still uses its slot. */
    assert_int_equal(wq_add(q, KS("k8")), -ENOSPC);
    /* Re-adding the processing key needs no new slot either. */
    assert_int_equal(wq_add(q, KS("k0")), 0);
    assert_int_equal(wq_add(q, KS("k0")), 1);
    assert_int_equal(wq_add(q, KS("k8")), -ENOSPC);
    assert_int_equal(wq_done(q, KS("k0")), 0);
    assert_int_equal(wq_len(q), 8);

    /* Nothing was lost, and the order is exact FIFO. */
    for (int i = 1; i < 8; i++) {
        snprintf(k, sizeof k, "k%d", i);
        T_EXPECT_GET(q, k);
        assert_int_equal(wq_done(q, KS(k)), 0);
    }
    T_EXPECT_GET(q, "k0");
    assert_int_equal(wq_done(q, KS("k0")), 0);
    assert_int_equal(t_get(q, 0), -EAGAIN);

    assert_int_equal(wq_add(q, KS("k8")), 0);
    T_EXPECT_GET(q, "k8");
    assert_int_equal(wq_done(q, KS("k8")), 0);

    st = t_stats(q);
    assert_int_equal(st.live, 0);
    assert_int_equal(st.adds_total, 10);
    assert_int_equal(st.coalesced_total, 2);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
}

/* ------------------------------------------------------------------ */
/* Keys                                                                */
/* ------------------------------------------------------------------ */

static void key_lengths(void **state)
{
    (void)state;
    wq *q = t_create("keylen", T_OPTS(.capacity = 64, .max_key_len = 16), NULL);
    unsigned char buf[WQ_MAX_KEY_LEN];
    const char *k16 = "0123456789abcdef";
    const char *k17 = "0123456789abcdefg";

    assert_int_equal(wq_add(q, "", 0), -EINVAL);
    assert_int_equal(wq_add(q, "x", 0), -EINVAL);
    assert_int_equal(wq_add(q, NULL, 3), -EINVAL);
    assert_int_equal(wq_add(q, k17, 17), -EMSGSIZE);
    assert_int_equal(wq_add(q, k16, 16), 0);
    assert_int_equal(wq_len(q), 1);
    assert_int_equal(t_stats(q).max_key_len, 16);

    assert_int_equal(wq_get(q, buf, 16, 0), 16);
    assert_memory_equal(buf, k16, 16);
    assert_int_equal(wq_done(q, k17, 17), -EMSGSIZE);
    assert_int_equal(wq_done(q, "", 0), -EINVAL);
    assert_int_equal(wq_done(q, NULL, 4), -EINVAL);
    assert_int_equal(wq_done(q, k16, 16), 0);

    /* NULL handles. */
    assert_int_equal(wq_add(NULL, "a", 1), -EINVAL);
    assert_int_equal(wq_get(NULL, buf, sizeof buf, 0), -EINVAL);
    assert_int_equal(wq_done(NULL, "a", 1), -EINVAL);
    assert_int_equal(wq_stats(NULL, NULL), -EINVAL);
    struct wq_stats st;
    assert_int_equal(wq_stats(NULL, &st), -EINVAL);
    assert_int_equal(wq_stats(q, NULL), -EINVAL);
    wq_close(NULL); /* no-op */
    wq_close(q);

    /* The largest allowed max_key_len. */
    q = t_create("keylen4096",
                 T_OPTS(.capacity = 16, .max_key_len = WQ_MAX_KEY_LEN), NULL);
    static unsigned char big[WQ_MAX_KEY_LEN + 1];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (unsigned char)(i * 7 + 3);
    assert_int_equal(wq_add(q, big, WQ_MAX_KEY_LEN + 1), -EMSGSIZE);
    assert_int_equal(wq_add(q, big, WQ_MAX_KEY_LEN), 0);
    assert_int_equal(wq_add(q, big, WQ_MAX_KEY_LEN - 1), 0); /* distinct */
    assert_int_equal(wq_get(q, buf, WQ_MAX_KEY_LEN, 0), WQ_MAX_KEY_LEN);
    assert_memory_equal(buf, big, WQ_MAX_KEY_LEN);
    assert_int_equal(wq_get(q, buf, WQ_MAX_KEY_LEN, 0), WQ_MAX_KEY_LEN - 1);
    assert_memory_equal(buf, big, WQ_MAX_KEY_LEN - 1);
    assert_int_equal(wq_done(q, big, WQ_MAX_KEY_LEN), 0);
    assert_int_equal(wq_done(q, big, WQ_MAX_KEY_LEN - 1), 0);
    wq_close(q);
}

static void binary_keys(void **state)
{
    (void)state;
    wq *q = t_create("binary", T_OPTS(.capacity = 64, .max_key_len = 16), NULL);
    static const struct { const char *k; size_t l; } keys[] = {
        { "a\0b", 3 }, { "a\0c", 3 }, { "a", 1 }, { "a\0", 2 },
        { "\0", 1 }, { "\0\0", 2 }, { "b\0a", 3 },
    };
    const size_t n = sizeof keys / sizeof keys[0];

    for (size_t i = 0; i < n; i++)
        assert_int_equal(wq_add(q, keys[i].k, keys[i].l), 0);
    assert_int_equal(wq_len(q), (int)n);
    assert_int_equal(wq_add(q, "a\0b", 3), 1);
    assert_int_equal(wq_add(q, "a\0c", 3), 1);
    assert_int_equal(wq_add(q, "\0\0", 2), 1);
    assert_int_equal(wq_len(q), (int)n);
    for (size_t i = 0; i < n; i++)
        T_EXPECT_GETN(q, keys[i].k, keys[i].l);
    assert_int_equal(wq_done(q, "a\0d", 3), -ENOENT);
    assert_int_equal(wq_done(q, "\0\0\0", 3), -ENOENT);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(wq_done(q, keys[i].k, keys[i].l), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(wq_done(q, keys[i].k, keys[i].l), -ENOENT);
    assert_int_equal(t_stats(q).live, 0);
    wq_close(q);
}

/* ------------------------------------------------------------------ */
/* wq_get buffers and timeouts                                         */
/* ------------------------------------------------------------------ */

static void get_enobufs(void **state)
{
    (void)state;
    wq *q = t_create("enobufs", T_OPTS(.capacity = 64), NULL); /* max_key_len 256 */
    unsigned char buf[WQ_MAX_KEY_LEN];

    /* Checked first: on an empty queue it must not block. */
    uint64_t t0 = t_now_ns();
    assert_int_equal(wq_get(q, buf, 255, SEC), -ENOBUFS);
    assert_true(t_now_ns() - t0 < 200 * 1000000ull * t_scale());

    assert_int_equal(wq_add(q, KS("foo")), 0);
    assert_int_equal(wq_get(q, buf, 255, 0), -ENOBUFS);
    assert_int_equal(wq_get(q, buf, 3, 0), -ENOBUFS);
    assert_int_equal(wq_get(q, buf, 0, 0), -ENOBUFS);
    assert_int_equal(wq_len(q), 1); /* nothing popped */
    assert_int_equal(t_stats(q).processing, 0);
    assert_int_equal(wq_get(q, NULL, 256, 0), -EINVAL);
    assert_int_equal(wq_len(q), 1);

    assert_int_equal(wq_get(q, buf, 256, 0), 3);
    assert_memory_equal(buf, "foo", 3);
    assert_int_equal(wq_done(q, KS("foo")), 0);
    wq_close(q);
}

static void get_timeouts(void **state)
{
    (void)state;
    wq *q = t_create("timeouts", T_OPTS(.capacity = 64), NULL);
    unsigned char buf[256];

    assert_int_equal(wq_get(q, buf, sizeof buf, 0), -EAGAIN);

    uint64_t t0 = t_now_ns();
    assert_int_equal(wq_get(q, buf, sizeof buf, 50 * MS), -ETIMEDOUT);
    uint64_t el = t_now_ns() - t0;
    if (el < 50 * 1000000ull || el > 1000 * 1000000ull * t_scale())
        fail_msg("wq_get(50 ms) returned after %.1f ms", (double)el / 1e6);

    assert_int_equal(wq_get(q, buf, sizeof buf, -2), -EINVAL);
    assert_int_equal(wq_get(q, buf, sizeof buf, INT64_MIN), -EINVAL);
    assert_int_equal(wq_shutdown_drain(q, -2), -EINVAL);
    assert_false(wq_shutting_down(q)); /* validated before acting */
    /* wq_done_get validates its timeout before doing the Done. */
    assert_int_equal(wq_add(q, KS("x")), 0);
    assert_int_equal(wq_get(q, buf, sizeof buf, 0), 1);
    assert_int_equal(wq_done_get(q, "x", 1, buf, sizeof buf, -2), -EINVAL);
    assert_int_equal(t_stats(q).processing, 1);
    assert_int_equal(wq_done(q, KS("x")), 0);

    /* A queued key is returned at once whatever the timeout. */
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_get(q, buf, sizeof buf, 0), 1);
    assert_int_equal(wq_add(q, KS("b")), 0);
    assert_int_equal(wq_get(q, buf, sizeof buf, -1), 1);
    assert_int_equal(buf[0], 'b');
    assert_int_equal(wq_done(q, KS("a")), 0);
    assert_int_equal(wq_done(q, KS("b")), 0);
    wq_close(q);
}

/* ------------------------------------------------------------------ */
/* wq_done of keys that are not processing                             */
/* ------------------------------------------------------------------ */

static void done_enoent(void **state)
{
    (void)state;
    wq *q = t_create("enoent", T_OPTS(.capacity = 64), NULL);

    assert_int_equal(wq_done(q, KS("x")), -ENOENT);
    assert_int_equal(wq_add(q, KS("a")), 0);
    /* Queued but not processing: -ENOENT and no second copy (client-go
       would push a duplicate). */
    assert_int_equal(wq_done(q, KS("a")), -ENOENT);
    assert_int_equal(wq_len(q), 1);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.queued, 1);
    assert_int_equal(st.processing, 0);
    assert_int_equal(st.live, 1);
    T_EXPECT_GET(q, "a");
    assert_int_equal(t_get(q, 0), -EAGAIN);
    assert_int_equal(wq_done(q, KS("a")), 0);
    assert_int_equal(wq_done(q, KS("a")), -ENOENT);
    assert_int_equal(t_get(q, 0), -EAGAIN);
    assert_int_equal(t_stats(q).live, 0);
    wq_close(q);
}

/* ------------------------------------------------------------------ */
/* Counters and dump                                                   */
/* ------------------------------------------------------------------ */

static void stats_counts(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("stats", T_OPTS(.capacity = 64), &name);
    struct wq_stats st;

    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_add(q, KS("b")), 0);
    assert_int_equal(wq_add(q, KS("c")), 0);
    assert_int_equal(wq_add(q, KS("a")), 1);
    assert_int_equal(wq_add(q, KS("b")), 1);
    T_EXPECT_GET(q, "a");
    assert_int_equal(wq_add(q, KS("a")), 0); /* dirty while processing: an add */
    assert_int_equal(wq_add(q, KS("a")), 1);

    st = t_stats(q);
    assert_int_equal(wq_len(q), 2);
    assert_int_equal(st.queued, 2);
    assert_int_equal(st.processing, 1);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.live, 3);
    assert_int_equal(st.capacity, 64);
    assert_int_equal(st.processes, 1);
    assert_int_equal(st.adds_total, 4);
    assert_int_equal(st.coalesced_total, 3);
    assert_int_equal(st.retries_total, 0);
    assert_int_equal(st.crash_requeues_total, 0);
    assert_int_equal(st.shutting_down, 0);

    assert_int_equal(wq_done(q, KS("a")), 0); /* back at the end: b c a */
    st = t_stats(q);
    assert_int_equal(st.queued, 3);
    assert_int_equal(st.processing, 0);
    assert_int_equal(st.live, 3);

    T_EXPECT_GET(q, "b");
    assert_int_equal(wq_done(q, KS("b")), 0);
    st = t_stats(q);
    assert_int_equal(wq_len(q), 2);
    assert_int_equal(st.queued, 2);
    assert_int_equal(st.live, 2);
    assert_int_equal(st.adds_total, 4);
    assert_int_equal(st.coalesced_total, 3);

    /* A second handle in the same process is a second table slot. */
    wq *q2 = NULL;
    assert_int_equal(wq_open(name, NULL, &q2), 0);
    assert_int_equal(t_stats(q).processes, 2);
    wq_close(q2);
    assert_int_equal(t_stats(q).processes, 1);

    T_EXPECT_GET(q, "c");
    T_EXPECT_GET(q, "a");
    assert_int_equal(wq_shutdown(q), 0);
    st = t_stats(q);
    assert_int_equal(st.shutting_down, 1);
    assert_int_equal(st.processing, 2);
    assert_int_equal(st.queued, 0);
    assert_int_equal(wq_done(q, KS("c")), 0);
    assert_int_equal(wq_done(q, KS("a")), 0);
    assert_int_equal(t_stats(q).live, 0);
    wq_close(q);
}

/* Counts the keys it is called for; returns 7 (which stops the walk) at
   the second. */
static int stop_at_two(const struct wq_key_info *i, void *arg)
{
    int *n = arg;

    (void)i;
    return ++*n == 2 ? 7 : 0;
}

/* Index of the first entry of `key` in *d, -1 if it is not listed. */
static int dump_index(const struct t_dump *d, const char *key)
{
    const struct t_dkey *e = t_dump_find(d, key);

    return e != NULL ? (int)(e - d->v) : -1;
}

static void dump_order(void **state)
{
    (void)state;
    wq *q = t_create("dump", T_OPTS(.capacity = 64), NULL);
    struct t_dump d = t_dump_all(q);

    assert_int_equal(d.n, 0);
    t_dump_free(&d);

    const char *keys[] = { "x", "y", "a", "b", "c" };
    for (int i = 0; i < 5; i++)
        assert_int_equal(wq_add(q, KS(keys[i])), 0);
    T_EXPECT_GET(q, "x");
    T_EXPECT_GET(q, "y");
    assert_int_equal(wq_add(q, KS("y")), 0);   /* y: processing and dirty */
    assert_int_equal(wq_add(q, KS("d")), 0);   /* queue: a b c d */
    assert_int_equal(wq_add(q, KS("a")), 1);   /* coalesced: keeps its place */

    d = t_dump_all(q);
    assert_int_equal(d.n, 6);
    const char *fifo[] = { "a", "b", "c", "d" };
    for (int i = 0; i < 4; i++) {
        assert_string_equal(d.v[i].key, fifo[i]);
        assert_int_equal(d.v[i].len, 1);
        assert_int_equal(d.v[i].state, WQ_KEY_QUEUED | WQ_KEY_DIRTY);
        assert_int_equal(d.v[i].owner, 0);
        assert_int_equal(d.v[i].position, (uint64_t)i);
    }
    int ix = dump_index(&d, "x"), iy = dump_index(&d, "y");
    assert_true(ix >= 4);
    assert_true(iy >= 4);
    assert_int_equal(d.v[ix].state, WQ_KEY_PROCESSING);
    assert_int_equal(d.v[ix].owner, getpid());
    assert_true(d.v[ix].position == UINT64_MAX);
    assert_int_equal(d.v[iy].state, WQ_KEY_PROCESSING | WQ_KEY_DIRTY);
    assert_int_equal(d.v[iy].owner, getpid());
    assert_true(d.v[iy].position == UINT64_MAX);
    t_dump_free(&d);

    /* A non-zero return stops the walk and is returned. */
    int n = 0;
    assert_int_equal(wq_dump(q, stop_at_two, &n), 7);
    assert_int_equal(n, 2);

    assert_int_equal(wq_done(q, KS("y")), 0); /* queue: a b c d y */
    d = t_dump_all(q);
    assert_int_equal(d.n, 6);
    assert_string_equal(d.v[4].key, "y");
    assert_int_equal(d.v[4].position, 4);
    assert_int_equal(d.v[4].state, WQ_KEY_QUEUED | WQ_KEY_DIRTY);
    assert_string_equal(d.v[5].key, "x");
    t_dump_free(&d);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
}

/* ------------------------------------------------------------------ */
/* Fast paths                                                          */
/* ------------------------------------------------------------------ */

#define IOV(s) { .iov_base = (void *)(s), .iov_len = sizeof(s) - 1 }

static void add_many(void **state)
{
    (void)state;
    wq *q = t_create("addmany", T_OPTS(.capacity = 6), NULL);
    static char big[300];
    memset(big, 'z', sizeof big);

    struct iovec v1[] = { IOV("x"), IOV("y"), IOV("x"), IOV("z") };
    assert_int_equal(wq_add_many(q, v1, 4), 1);
    assert_int_equal(wq_len(q), 3);
    struct iovec v2[] = { IOV("y"), IOV("w") };
    assert_int_equal(wq_add_many(q, v2, 2), 1);
    assert_int_equal(wq_len(q), 4);

    /* One invalid key adds none. */
    struct iovec v3[] = { IOV("p"), { .iov_base = (void *)"", .iov_len = 0 },
                          IOV("q") };
    assert_int_equal(wq_add_many(q, v3, 3), -EINVAL);
    struct iovec v4[] = { IOV("p"), { .iov_base = big, .iov_len = 300 } };
    assert_int_equal(wq_add_many(q, v4, 2), -EMSGSIZE);
    struct iovec v5[] = { IOV("p"), { .iov_base = NULL, .iov_len = 3 } };
    assert_int_equal(wq_add_many(q, v5, 2), -EINVAL);
    assert_int_equal(wq_add_many(q, NULL, 2), -EINVAL);
    assert_int_equal(wq_len(q), 4);

    /* Capacity 6, 4 live: three new keys do not fit, none is added. */
    struct iovec v6[] = { IOV("n1"), IOV("n2"), IOV("n3") };
    assert_int_equal(wq_add_many(q, v6, 3), -ENOSPC);
    assert_int_equal(wq_len(q), 4);
    struct iovec v7[] = { IOV("n1"), IOV("n2") };
    assert_int_equal(wq_add_many(q, v7, 2), 0);
    assert_int_equal(wq_len(q), 6);
    struct iovec v8[] = { IOV("x"), IOV("n3") };
    assert_int_equal(wq_add_many(q, v8, 2), -ENOSPC);
    struct iovec v9[] = { IOV("x"), IOV("y") };
    assert_int_equal(wq_add_many(q, v9, 2), 2);

    struct wq_stats st = t_stats(q);
    assert_int_equal(st.adds_total, 6);
    assert_int_equal(st.coalesced_total, 4);

    const char *order[] = { "x", "y", "z", "w", "n1", "n2" };
    for (int i = 0; i < 6; i++)
        T_EXPECT_GET(q, order[i]);
    assert_int_equal(t_get(q, 0), -EAGAIN);
    for (int i = 0; i < 6; i++)
        assert_int_equal(wq_done(q, KS(order[i])), 0);

    assert_int_equal(wq_shutdown(q), 0);
    assert_int_equal(wq_add_many(q, v9, 2), -ESHUTDOWN);
    assert_int_equal(t_stats(q).live, 0);
    wq_close(q);
}

static void done_get(void **state)
{
    (void)state;
    wq *q = t_create("doneget", T_OPTS(.capacity = 16), NULL);
    unsigned char buf[256];

    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_add(q, KS("b")), 0);
    T_EXPECT_GET(q, "a");
    assert_int_equal(wq_done_get(q, "a", 1, buf, sizeof buf, 0), 1);
    assert_int_equal(buf[0], 'b');
    assert_int_equal(wq_done(q, KS("a")), -ENOENT); /* a was done, and gone */

    /* A failing Done pops nothing. */
    assert_int_equal(wq_add(q, KS("c")), 0);
    assert_int_equal(wq_done_get(q, "zz", 2, buf, sizeof buf, 0), -ENOENT);
    assert_int_equal(wq_done_get(q, "", 0, buf, sizeof buf, 0), -EINVAL);
    assert_int_equal(wq_len(q), 1);
    assert_int_equal(t_stats(q).processing, 1);

    /* b re-added while processing goes behind c at its Done. */
    assert_int_equal(wq_add(q, KS("b")), 0);
    assert_int_equal(wq_done_get(q, "b", 1, buf, sizeof buf, 0), 1);
    assert_int_equal(buf[0], 'c');
    assert_int_equal(wq_done_get(q, "c", 1, buf, sizeof buf, 0), 1);
    assert_int_equal(buf[0], 'b');

    /* Nothing queued: the Done still happens, the get says -EAGAIN. */
    assert_int_equal(wq_done_get(q, "b", 1, buf, sizeof buf, 0), -EAGAIN);
    assert_int_equal(t_stats(q).processing, 0);
    assert_int_equal(t_stats(q).live, 0);
    assert_int_equal(wq_done_get(q, "b", 1, buf, sizeof buf, 0), -ENOENT);

    assert_int_equal(wq_add(q, KS("d")), 0);
    T_EXPECT_GET(q, "d");
    uint64_t t0 = t_now_ns();
    assert_int_equal(wq_done_get(q, "d", 1, buf, sizeof buf, 50 * MS),
                     -ETIMEDOUT);
    assert_true(t_now_ns() - t0 >= 50 * 1000000ull);
    assert_int_equal(t_stats(q).live, 0);
    wq_close(q);
}

/* The keys of v[0..n) as "k1,k2,...", for exact comparisons. */
static const char *joined(const struct iovec *v, int n)
{
    static char out[1024];
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < n && at < sizeof out - 1; i++)
        at += (size_t)snprintf(out + at, sizeof out - at, "%s%.*s", i ? "," : "",
                               (int)v[i].iov_len, (const char *)v[i].iov_base);
    return out;
}

static void get_many_done_many(void **state)
{
    (void)state;
    wq *q = t_create("getmany", T_OPTS(.capacity = 16, .max_key_len = 200), NULL);
    static char buf[1600];
    struct iovec v[8];

    /* Arguments first: nothing is handed out. */
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_get_many(q, buf, sizeof buf, v, 0, 0), -EINVAL);
    assert_int_equal(wq_get_many(q, buf, sizeof buf, NULL, 2, 0), -EINVAL);
    assert_int_equal(wq_get_many(q, NULL, sizeof buf, v, 2, 0), -EINVAL);
    assert_int_equal(wq_get_many(NULL, buf, sizeof buf, v, 2, 0), -EINVAL);
    assert_int_equal(wq_get_many(q, buf, sizeof buf, v, 2, -2), -EINVAL);
    assert_int_equal(wq_get_many(q, buf, 199, v, 2, 0), -ENOBUFS);
    T_EXPECT_STATS(q, 1, 1, 0, 0, "after refused get_many");

    /* Up to n keys, in queue order, lengths set. */
    struct iovec add[] = { IOV("b"), IOV("cc"), IOV("d"), IOV("e") };
    assert_int_equal(wq_add_many(q, add, 4), 0);
    assert_int_equal(wq_get_many(q, buf, sizeof buf, v, 3, 0), 3);
    assert_string_equal(joined(v, 3), "a,b,cc");
    assert_int_equal(v[2].iov_len, 2);
    assert_ptr_equal(v[0].iov_base, buf);   /* packed back to back */
    assert_ptr_equal(v[2].iov_base, buf + 2);
    T_EXPECT_STATS(q, 5, 2, 3, 0, "three handed out");
    assert_int_equal(wq_get_many(q, buf, sizeof buf, v, 8, 0), 2);   /* what is queued */
    assert_string_equal(joined(v, 2), "d,e");
    assert_int_equal(wq_get_many(q, buf, sizeof buf, v, 8, 0), -EAGAIN);
    uint64_t t0 = t_now_ns();
    assert_int_equal(wq_get_many(q, buf, sizeof buf, v, 8, 50 * MS), -ETIMEDOUT);
    assert_true(t_now_ns() - t0 >= 50 * 1000000ull);

    /* done_many: processing keys done, the rest skipped and counted out;
       b, re-added while processing, goes behind f in the batch's order. */
    assert_int_equal(wq_add(q, KS("b")), 0);
    assert_int_equal(wq_add(q, KS("f")), 0);
    struct iovec d1[] = { IOV("a"), IOV("b"), IOV("zz"), IOV("cc"), IOV("a") };
    assert_int_equal(wq_done_many(q, d1, 5), 3);
    T_EXPECT_STATS(q, 4, 2, 2, 0, "a, b, cc done");
    assert_int_equal(wq_done(q, KS("cc")), -ENOENT);

    /* One invalid key: nothing is done. */
    struct iovec d2[] = { IOV("d"), { .iov_base = (void *)"", .iov_len = 0 } };
    assert_int_equal(wq_done_many(q, d2, 2), -EINVAL);
    static char big[300];
    memset(big, 'z', sizeof big);
    struct iovec d3[] = { IOV("d"), { .iov_base = big, .iov_len = 201 } };
    assert_int_equal(wq_done_many(q, d3, 2), -EMSGSIZE);
    assert_int_equal(wq_done_many(q, d3, 0), -EINVAL);
    assert_int_equal(wq_done_many(q, NULL, 1), -EINVAL);
    T_EXPECT_STATS(q, 4, 2, 2, 0, "refused done_many");

    struct iovec d4[] = { IOV("d"), IOV("e") };
    assert_int_equal(wq_done_many(q, d4, 2), 2);
    assert_int_equal(wq_get_many(q, buf, sizeof buf, v, 8, 0), 2);
    assert_string_equal(joined(v, 2), "f,b");
    assert_int_equal(wq_done_many(q, v, 2), 2);
    T_EXPECT_STATS(q, 0, 0, 0, 0, "all done");

    /* A key that would not fit in what is left of buf stays queued. */
    static char k150[3][150];
    struct iovec long3[3];
    for (int i = 0; i < 3; i++) {
        memset(k150[i], 'A' + i, sizeof k150[i]);
        long3[i] = (struct iovec){ k150[i], sizeof k150[i] };
    }
    assert_int_equal(wq_add_many(q, long3, 3), 0);
    assert_int_equal(wq_get_many(q, buf, 200, v, 8, 0), 1);
    assert_int_equal(v[0].iov_len, 150);
    assert_int_equal(((char *)v[0].iov_base)[149], 'A');
    assert_int_equal(wq_get_many(q, buf, 400, v, 8, 0), 2);
    assert_int_equal(((char *)v[1].iov_base)[0], 'C');
    assert_ptr_equal(v[1].iov_base, buf + 150);
    assert_int_equal(wq_done_many(q, v, 2), 2);
    assert_int_equal(wq_done_many(q, long3, 3), 1);   /* B and C were done */
    T_EXPECT_STATS(q, 0, 0, 0, 0, "long keys done");

    struct wq_stats st = t_stats(q);
    assert_int_equal(st.adds_total, 10);

    /* Shut down and empty: -ESHUTDOWN, as wq_get. */
    assert_int_equal(wq_shutdown(q), 0);
    assert_int_equal(wq_get_many(q, buf, sizeof buf, v, 8, 0), -ESHUTDOWN);
    wq_close(q);
}

/* More keys than one lock acquisition of wq_done_many takes (64), and a
   blocked wq_get_many woken by another process's batch. */
static void many_batches(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("manybatch", T_OPTS(.capacity = 256, .max_key_len = 16), &name);
    enum { N = 150 };
    static char kb[N][16];
    struct iovec add[N];
    for (int i = 0; i < N; i++) {
        int len = snprintf(kb[i], sizeof kb[i], "k%03d", i);
        add[i] = (struct iovec){ kb[i], (size_t)len };
    }
    assert_int_equal(wq_add_many(q, add, N), 0);
    static char buf[N * 16];
    struct iovec v[N];
    assert_int_equal(wq_get_many(q, buf, sizeof buf, v, N, 0), N);
    for (int i = 0; i < N; i++)
        if (v[i].iov_len != 4 || memcmp(v[i].iov_base, kb[i], 4) != 0)
            fail_msg("key %d handed out as '%.*s', expected '%s'", i, (int)v[i].iov_len,
                     (const char *)v[i].iov_base, kb[i]);
    /* Re-add every third key while processing: at done_many they queue
       in the batch's order. */
    for (int i = 0; i < N; i += 3)
        assert_int_equal(wq_add(q, kb[i], 4), 0);
    assert_int_equal(wq_done_many(q, v, N), N);
    T_EXPECT_STATS(q, N / 3, N / 3, 0, 0, "every third key re-queued");
    assert_int_equal(wq_get_many(q, buf, sizeof buf, v, N, 0), N / 3);
    for (int i = 0; i < N / 3; i++)
        if (memcmp(v[i].iov_base, kb[3 * i], 4) != 0)
            fail_msg("re-queued key %d is '%.*s', expected '%s'", i, (int)v[i].iov_len,
                     (const char *)v[i].iov_base, kb[3 * i]);
    assert_int_equal(wq_done_many(q, v, N / 3), N / 3);

    /* A blocked wq_get_many takes the whole batch another process adds. */
    pid_t pid = t_fork(10);
    if (pid == 0) {
        t_sleep_ms(100);
        struct iovec two[] = { IOV("late1"), IOV("late2") };
        _exit(wq_add_many(q, two, 2) == 0 ? 0 : 1);
    }
    uint64_t t0 = t_now_ns();
    assert_int_equal(wq_get_many(q, buf, sizeof buf, v, 4, 5 * SEC * t_scale()), 2);
    assert_true(t_now_ns() - t0 >= 90 * 1000000ull);
    assert_string_equal(joined(v, 2), "late1,late2");
    assert_int_equal(t_wait(pid, 5000), 0);
    assert_int_equal(wq_done_many(q, v, 2), 2);
    T_EXPECT_STATS(q, 0, 0, 0, 0, "end");
    (void)name;
    wq_close(q);
}

/* ------------------------------------------------------------------ */
/* wq_check                                                            */
/* ------------------------------------------------------------------ */

static void count_report(const char *what, void *arg)
{
    (void)what;
    (*(int *)arg)++;
}

static void check_healthy(void **state)
{
    (void)state;
    wq *q = t_create("check", T_OPTS(.capacity = 64), NULL);
    int reports = 0;

    assert_int_equal(wq_check(q, 0), 0);
    for (int i = 0; i < 40; i++) {
        char k[16];
        snprintf(k, sizeof k, "key-%d", i);
        assert_int_equal(wq_add(q, KS(k)), 0);
    }
    for (int i = 0; i < 20; i++) {
        unsigned char buf[256];
        int n = wq_get(q, buf, sizeof buf, 0);
        assert_true(n > 0);
        if (i % 2 == 0)
            assert_int_equal(wq_done(q, buf, (size_t)n), 0);
        else
            assert_int_equal(wq_add(q, buf, (size_t)n), 0);
    }
    assert_int_equal(wq_check(q, 0), 0);
    assert_int_equal(wq_check_report(q, 0, count_report, &reports), 0);
    assert_int_equal(reports, 0);
    assert_int_equal(wq_check(q, WQ_CHECK_REAP), 0);
    assert_int_equal(wq_check(q, WQ_CHECK_REPAIR), 0);
    assert_int_equal(wq_check(q, 1u << 9), -EINVAL);
    assert_int_equal(wq_check(NULL, 0), -EINVAL);
    assert_int_equal(t_stats(q).repairs_total, 0);
    wq_close(q);
}

/* ------------------------------------------------------------------ */
/* Shutdown                                                            */
/* ------------------------------------------------------------------ */

static void shutdown_basics(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("shutdown", T_OPTS(.capacity = 16), &name);
    wq *q2 = NULL;

    assert_false(wq_shutting_down(q));
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_add(q, KS("b")), 0);
    assert_int_equal(wq_shutdown(q), 0);
    assert_true(wq_shutting_down(q));
    assert_int_equal(wq_shutdown(q), 0); /* idempotent */
    assert_int_equal(wq_add(q, KS("c")), -ESHUTDOWN);
    assert_int_equal(wq_add(q, KS("a")), -ESHUTDOWN);
    /* Queued keys are still handed out, then -ESHUTDOWN, never blocking. */
    T_EXPECT_GET(q, "a");
    T_EXPECT_GET(q, "b");
    assert_int_equal(t_get(q, 0), -ESHUTDOWN);
    uint64_t t0 = t_now_ns();
    assert_int_equal(t_get(q, -1), -ESHUTDOWN);
    assert_int_equal(t_get(q, SEC), -ESHUTDOWN);
    assert_true(t_now_ns() - t0 < 200 * 1000000ull * t_scale());

    /* The flag lives in the region. */
    assert_int_equal(wq_open(name, NULL, &q2), 0);
    assert_true(wq_shutting_down(q2));
    assert_int_equal(t_stats(q2).shutting_down, 1);
    assert_int_equal(wq_add(q2, KS("d")), -ESHUTDOWN);

    /* Done still works, a drain with nothing processing returns 0. */
    assert_int_equal(wq_done(q2, KS("a")), 0);
    assert_int_equal(wq_done(q, KS("b")), 0);
    assert_int_equal(wq_shutdown_drain(q, SEC), 0);
    assert_int_equal(wq_shutdown_drain(q2, 0), 0);
    wq_close(q2);
    wq_close(q);
}

/* ------------------------------------------------------------------ */
/* Error strings                                                       */
/* ------------------------------------------------------------------ */

static void strerror_all(void **state)
{
    (void)state;
    const int codes[] = { EINVAL, ENOTSUP, ENOENT, EEXIST, EACCES, EPROTO,
                          EBADMSG, ENOTRECOVERABLE, ENOSPC, EMSGSIZE, ENOBUFS,
                          EAGAIN, ETIMEDOUT, ESHUTDOWN, ECANCELED, EUSERS,
                          ENOMEM, EPERM };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *a = wq_strerror(-codes[i]);
        const char *b = wq_strerror(codes[i]);
        assert_non_null(a);
        assert_non_null(b);
        assert_true(strlen(a) > 0);
        assert_string_equal(a, b);
    }
    assert_string_equal(wq_strerror(-EPERM),
                        "not allowed on a handle opened with WQ_OBSERVE (it holds no keys)");
    assert_non_null(wq_strerror(0));
    assert_non_null(wq_strerror(-123456));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        T_TEST(capacity_full),
        T_TEST(key_lengths),
        T_TEST(binary_keys),
        T_TEST(get_enobufs),
        T_TEST(get_timeouts),
        T_TEST(done_enoent),
        T_TEST(stats_counts),
        T_TEST(dump_order),
        T_TEST(add_many),
        T_TEST(done_get),
        T_TEST(get_many_done_many),
        T_TEST(many_batches),
        T_TEST(check_healthy),
        T_TEST(shutdown_basics),
        T_TEST(strerror_all),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("keys", tests);
}
