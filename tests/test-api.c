/*
 * test-api.c - edge cases of the public API with exact error codes:
 * capacity, key sizes, binary keys, buffers, timeouts, Done of keys not
 * processing, names, options, foreign and tampered shm objects,
 * permissions, counters, dump, the fast paths, wq_check, and the fork /
 * crash / close semantics of handles.
 *
 * Everything here is single-threaded in the test process, plus forked
 * children that report through exit codes and a shared mapping.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_timedjoin_np, setgroups */
#endif
#include "t.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
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
    q = t_create("keylen4096", T_OPTS(.capacity = 16, .max_key_len = WQ_MAX_KEY_LEN), NULL);
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

static void defaults(void **state)
{
    (void)state;
    const char *name = t_qname("defaults");
    struct wq_options o = { .flags = WQ_CREATE };
    wq *q = NULL;

    assert_int_equal(wq_open(name, &o, &q), 0);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.capacity, 65536);
    assert_int_equal(st.max_key_len, 256);
    assert_int_equal(st.max_procs, 256);
    assert_int_equal(st.processes, 1);
    assert_int_equal(st.queued, 0);
    assert_int_equal(st.processing, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.live, 0);
    assert_int_equal(st.adds_total, 0);
    assert_int_equal(st.coalesced_total, 0);
    assert_int_equal(st.retries_total, 0);
    assert_int_equal(st.crash_requeues_total, 0);
    assert_int_equal(st.repairs_total, 0);
    assert_int_equal(st.shutting_down, 0);
    assert_true(st.region_bytes > 0);
    char p[512];
    struct stat sb;
    t_shm_path(name, p, sizeof p);
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal((uint64_t)sb.st_size, st.region_bytes);
    assert_string_equal(wq_name(q), name);
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
/* Names, open and unlink                                              */
/* ------------------------------------------------------------------ */

static void bad_names(void **state)
{
    (void)state;
    struct wq_options o = { .capacity = 16, .flags = WQ_CREATE };
    char long201[202], long200[201];
    wq *q = (wq *)&o; /* sentinel: must stay untouched on failure */
    const char *bad[] = { "", "a/b", "with space", "/abc", "a\nb", "a*b",
                          "caf\xc3\xa9", NULL };

    memset(long201, 'a', 201);
    long201[201] = '\0';
    for (int i = 0; bad[i] != NULL; i++) {
        int rc = wq_open(bad[i], &o, &q);
        if (rc != -EINVAL)
            fail_msg("wq_open(\"%s\") = %d, expected -EINVAL", bad[i], rc);
        assert_ptr_equal(q, (wq *)&o);
        assert_int_equal(wq_unlink(bad[i]), -EINVAL);
    }
    assert_int_equal(wq_open(long201, &o, &q), -EINVAL);
    assert_int_equal(wq_unlink(long201), -EINVAL);
    assert_int_equal(wq_open(NULL, &o, &q), -EINVAL);
    assert_int_equal(wq_unlink(NULL), -EINVAL);
    assert_ptr_equal(q, (wq *)&o);
    assert_false(t_shm_exists("with space"));
    assert_false(t_shm_exists(long201));

    /* Exactly 200 characters is fine. */
    int pl = snprintf(long200, sizeof long200, "t%ld-long200-", (long)getpid());
    memset(long200 + pl, 'x', (size_t)(200 - pl));
    long200[200] = '\0';
    assert_int_equal(strlen(long200), 200);
    int rc = wq_open(long200, &o, &q);
    assert_int_equal(rc, 0);
    assert_string_equal(wq_name(q), long200);
    assert_int_equal(wq_add(q, KS("k")), 0);
    wq_close(q);
    assert_int_equal(wq_unlink(long200), 0);
    assert_false(t_shm_exists(long200));

    /* NULL out. */
    const char *name = t_qname("nullout");
    assert_int_equal(wq_open(name, &o, NULL), -EINVAL);
    assert_false(t_shm_exists(name));
}

static void open_missing(void **state)
{
    (void)state;
    const char *name = t_qname("missing");
    struct wq_options o = { .capacity = 16 };
    wq *q = (wq *)&o;

    assert_int_equal(wq_open(name, NULL, &q), -ENOENT);
    assert_int_equal(wq_open(name, &o, &q), -ENOENT);
    assert_ptr_equal(q, (wq *)&o);
    assert_int_equal(wq_unlink(name), -ENOENT);
    assert_false(t_shm_exists(name));
}

static void open_exists(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("exists", T_OPTS(.capacity = 16), &name);
    struct wq_options o = { .capacity = 32, .flags = WQ_CREATE | WQ_EXCL };
    wq *q2 = (wq *)&o;

    assert_int_equal(wq_add(q, KS("k")), 0);
    assert_int_equal(wq_open(name, &o, &q2), -EEXIST);
    assert_ptr_equal(q2, (wq *)&o);

    o.flags = WQ_EXCL; /* without WQ_CREATE */
    assert_int_equal(wq_open(name, &o, &q2), -EINVAL);
    const char *other = t_qname("excl-nocreate");
    assert_int_equal(wq_open(other, &o, &q2), -EINVAL);
    assert_false(t_shm_exists(other));

    /* WQ_CREATE on an existing queue attaches; its geometry wins. */
    o.flags = WQ_CREATE;
    assert_int_equal(wq_open(name, &o, &q2), 0);
    assert_int_equal(t_stats(q2).capacity, 16);
    assert_int_equal(wq_len(q2), 1);
    wq_close(q2);
    assert_int_equal(wq_open(name, NULL, &q2), 0);
    assert_int_equal(wq_len(q2), 1);
    T_EXPECT_GET(q2, "k");
    assert_int_equal(wq_done(q, KS("k")), 0); /* Done through another handle */
    wq_close(q2);
    wq_close(q);
}

static void unlink_while_attached(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("unlinked", T_OPTS(.capacity = 16), &name);
    struct wq_options o = { .capacity = 16, .flags = WQ_CREATE };
    wq *q2 = NULL;

    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_unlink(name), 0);
    assert_false(t_shm_exists(name));
    assert_int_equal(wq_unlink(name), -ENOENT);
    /* The attached handle keeps working on its mapping. */
    T_EXPECT_GET(q, "a");
    assert_int_equal(wq_done(q, KS("a")), 0);
    assert_int_equal(wq_add(q, KS("b")), 0);
    assert_int_equal(wq_open(name, NULL, &q2), -ENOENT);
    /* A new, empty queue under the same name. */
    assert_int_equal(wq_open(name, &o, &q2), 0);
    assert_int_equal(wq_len(q2), 0);
    assert_int_equal(wq_len(q), 1);
    assert_int_equal(wq_add(q2, KS("c")), 0);
    assert_int_equal(wq_len(q), 1);
    T_EXPECT_GET(q, "b");
    T_EXPECT_GET(q2, "c");
    assert_int_equal(wq_done(q, KS("c")), -ENOENT); /* c lives in the new one */
    assert_int_equal(wq_done(q2, KS("c")), 0);
    assert_int_equal(wq_done(q, KS("b")), 0);
    wq_close(q);
    wq_close(q2);
}

struct list_arg {
    const char *want;
    int seen;
};

static int list_cb(const char *name, void *arg)
{
    struct list_arg *l = arg;
    if (strcmp(name, l->want) == 0)
        l->seen++;
    return 0;
}

static int list_stop(const char *name, void *arg)
{
    (void)name;
    (void)arg;
    return 42;
}

static void list_queues(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("listed", T_OPTS(.capacity = 16), &name);
    struct list_arg l = { name, 0 };

    assert_int_equal(wq_list(list_cb, &l), 0);
    assert_int_equal(l.seen, 1);
    assert_int_equal(wq_list(list_stop, NULL), 42);
    wq_close(q);
}

static void max_procs(void **state)
{
    (void)state;
    const char *name = t_qname("maxprocs");
    struct wq_options o = { .capacity = 16, .max_procs = 2,
                            .flags = WQ_CREATE | WQ_EXCL };
    wq *a = NULL, *b = NULL, *c = (wq *)&o;

    assert_int_equal(wq_open(name, &o, &a), 0);
    assert_int_equal(t_stats(a).max_procs, 2);
    assert_int_equal(wq_open(name, NULL, &b), 0);
    assert_int_equal(t_stats(a).processes, 2);
    assert_int_equal(wq_open(name, NULL, &c), -EUSERS);
    assert_ptr_equal(c, (wq *)&o);
    wq_close(b);
    assert_int_equal(t_stats(a).processes, 1);
    assert_int_equal(wq_open(name, NULL, &c), 0);
    wq_close(c);
    wq_close(a);
}

/* ------------------------------------------------------------------ */
/* Options                                                             */
/* ------------------------------------------------------------------ */

static void expect_open_rc(const char *what, struct wq_options o, int want)
{
    const char *name = t_qname("opts");
    wq *q = (wq *)&o;
    o.flags |= WQ_CREATE;
    int rc = wq_open(name, &o, &q);
    if (rc == 0)
        wq_close(q);
    if (rc != want)
        fail_msg("options %s: wq_open = %d (%s), expected %d (%s)", what, rc,
                 wq_strerror(rc), want, wq_strerror(want));
    if (want == 0) {
        assert_true(t_shm_exists(name));
        return;
    }
    assert_ptr_equal(q, (wq *)&o);
    if (t_shm_exists(name))
        fail_msg("options %s: refused but /dev/shm/wq.%s was created", what,
                 name);
}

#define OPT(field, value) ((struct wq_options){ .capacity = 16, \
                                                .field = (value) })
#define CAP_OPT(value) ((struct wq_options){ .capacity = (value) })

static void options_invalid(void **state)
{
    (void)state;
    expect_open_rc("flags 1<<5", OPT(flags, 1u << 5), -EINVAL);
    expect_open_rc("flags 1<<31", OPT(flags, 1u << 31), -EINVAL);
    expect_open_rc("mode 01000", OPT(mode, 01000), -EINVAL);
    expect_open_rc("mode 04600", OPT(mode, 04600), -EINVAL);
    expect_open_rc("mode 0x10000", OPT(mode, 0x10000), -EINVAL);
    expect_open_rc("capacity 2^31+1", CAP_OPT((1u << 31) + 1), -EINVAL);
    expect_open_rc("capacity UINT32_MAX", CAP_OPT(UINT32_MAX), -EINVAL);
    expect_open_rc("max_key_len 4097", OPT(max_key_len, 4097), -EINVAL);
    expect_open_rc("max_key_len UINT32_MAX", OPT(max_key_len, UINT32_MAX),
                   -EINVAL);
    expect_open_rc("max_procs 4097", OPT(max_procs, 4097), -EINVAL);
    expect_open_rc("durability 3", OPT(durability, 3), -EINVAL);
    expect_open_rc("durability -1", OPT(durability, -1), -EINVAL);
    expect_open_rc("rl_qps -1", OPT(rl_qps, -1.0), -EINVAL);
    {
        struct wq_options o = { .capacity = 16,
                                .rl_base_delay_ns = 2000000,
                                .rl_max_delay_ns = 1000000 };
        expect_open_rc("rl_base > rl_max", o, -EINVAL);
    }
}

static void options_notsup(void **state)
{
    (void)state;
    /* store options without a store are invalid, not unsupported */
    expect_open_rc("durability FSYNC without store", OPT(durability, WQ_DURABLE_FSYNC),
                   -EINVAL);
    expect_open_rc("durability NONE without store", OPT(durability, WQ_DURABLE_NONE),
                   -EINVAL);
    expect_open_rc("snapshot_interval_ms without store", OPT(snapshot_interval_ms, 100),
                   -EINVAL);
    expect_open_rc("empty store_path", OPT(store_path, ""), -EINVAL);
    /* Every option is implemented now; fair-mode options need WQ_FAIR. */
    expect_open_rc("fair_share without WQ_FAIR", OPT(fair_share, 4), -EINVAL);
    expect_open_rc("tenant_sep without WQ_FAIR", OPT(tenant_sep, ':'), -EINVAL);
    {
        struct wq_options o = { .capacity = 16, .flags = WQ_FAIR, .tenant_sep = 256 };
        expect_open_rc("tenant_sep 256", o, -EINVAL);
        o.tenant_sep = -2;
        expect_open_rc("tenant_sep -2", o, -EINVAL);
        o.tenant_sep = -1;
        expect_open_rc("WQ_FAIR, tenants off", o, 0);
    }
    expect_open_rc("WQ_FAIR", OPT(flags, WQ_FAIR), 0);
    /* Control: the same call with nothing unsupported works. */
    expect_open_rc("valid", CAP_OPT(16), 0);
}

/* The rate limiter parameters are implemented (wq.h): valid ones are
   accepted, inconsistent ones refused with -EINVAL. */
static void options_limiter(void **state)
{
    (void)state;
    {
        struct wq_options o = { .capacity = 16,
                                .rl_base_delay_ns = 1000000,
                                .rl_max_delay_ns = 1000000000 };
        expect_open_rc("rl_base/max_delay", o, 0);
    }
    expect_open_rc("rl_base == rl_max",
                   ((struct wq_options){ .capacity = 16,
                                         .rl_base_delay_ns = 7000000,
                                         .rl_max_delay_ns = 7000000 }), 0);
    expect_open_rc("rl_max_delay", OPT(rl_max_delay_ns, 1000000000), 0);
    /* A zero rl_max_delay_ns means the default (1000 s), not 0. */
    expect_open_rc("rl_base_delay alone", OPT(rl_base_delay_ns, 1000000), 0);
    expect_open_rc("rl_qps 5", OPT(rl_qps, 5.0), 0);
    expect_open_rc("rl_burst 10", OPT(rl_burst, 10), 0);
    expect_open_rc("rl_limiters exp|bucket", OPT(rl_limiters, WQ_RL_EXPONENTIAL |
                                                       WQ_RL_BUCKET), 0);
    expect_open_rc("rl_limiters 1<<3", OPT(rl_limiters, 1u << 3), -EINVAL);
    expect_open_rc("rl_limiters 1<<31", OPT(rl_limiters, 1u << 31), -EINVAL);
    expect_open_rc("FAST_SLOW without parameters",
                   OPT(rl_limiters, WQ_RL_FAST_SLOW), -EINVAL);
    expect_open_rc("FAST_SLOW without attempts",
                   ((struct wq_options){ .capacity = 16,
                                         .rl_limiters = WQ_RL_FAST_SLOW,
                                         .rl_fast_delay_ns = 1000000,
                                         .rl_slow_delay_ns = 9000000 }),
                   -EINVAL);
    expect_open_rc("FAST_SLOW fast > slow",
                   ((struct wq_options){ .capacity = 16,
                                         .rl_limiters = WQ_RL_FAST_SLOW,
                                         .rl_fast_delay_ns = 9000000,
                                         .rl_slow_delay_ns = 1000000,
                                         .rl_max_fast_attempts = 3 }),
                   -EINVAL);
    expect_open_rc("FAST_SLOW complete",
                   ((struct wq_options){ .capacity = 16,
                                         .rl_limiters = WQ_RL_FAST_SLOW,
                                         .rl_fast_delay_ns = 1000000,
                                         .rl_slow_delay_ns = 9000000,
                                         .rl_max_fast_attempts = 3 }), 0);
}

static void options_mode(void **state)
{
    (void)state;
    char p[512];
    struct stat sb;
    const char *n1 = t_qname("mode-default");
    const char *n2 = t_qname("mode-0640");
    struct wq_options o = { .capacity = 16, .flags = WQ_CREATE };
    wq *q1, *q2;

    assert_int_equal(wq_open(n1, &o, &q1), 0);
    t_shm_path(n1, p, sizeof p);
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0600);
    assert_int_equal(sb.st_uid, geteuid());

    o.mode = 0640;
    assert_int_equal(wq_open(n2, &o, &q2), 0);
    t_shm_path(n2, p, sizeof p);
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0640);
    wq_close(q1);
    wq_close(q2);
}

/* ------------------------------------------------------------------ */
/* Foreign, truncated and tampered shm objects                         */
/* ------------------------------------------------------------------ */

static void write_object(const char *name, const void *data, size_t len,
                         int excl)
{
    char p[512];
    t_shm_path(name, p, sizeof p);
    int fd = open(p, O_RDWR | O_CREAT | (excl ? O_EXCL : O_TRUNC), 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 0), 0);
    if (len > 0)
        assert_int_equal(pwrite(fd, data, len, 0), (ssize_t)len);
    assert_int_equal(ftruncate(fd, (off_t)len), 0);
    close(fd);
}

static unsigned char *read_object(const char *name, size_t *len)
{
    char p[512];
    struct stat sb;
    t_shm_path(name, p, sizeof p);
    int fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &sb), 0);
    unsigned char *buf = malloc((size_t)sb.st_size + 1);
    assert_non_null(buf);
    assert_int_equal(pread(fd, buf, (size_t)sb.st_size, 0), sb.st_size);
    close(fd);
    *len = (size_t)sb.st_size;
    return buf;
}

static void expect_eproto(const char *name, const char *what)
{
    struct wq_options o = { .capacity = 16, .flags = WQ_CREATE };
    wq *q = (wq *)&o;
    int rc = wq_open(name, NULL, &q);
    if (rc == 0)
        wq_close(q);
    if (rc != -EPROTO)
        fail_msg("%s: wq_open(attach) = %d (%s), expected -EPROTO", what, rc,
                 wq_strerror(rc));
    rc = wq_open(name, &o, &q);
    if (rc == 0)
        wq_close(q);
    if (rc != -EPROTO)
        fail_msg("%s: wq_open(WQ_CREATE) = %d (%s), expected -EPROTO", what,
                 rc, wq_strerror(rc));
    assert_ptr_equal(q, (wq *)&o);
}

static void eproto_garbage(void **state)
{
    (void)state;
    const char *name = t_qname("garbage");
    size_t len = 64 * 1024;
    unsigned char *junk = malloc(len);
    uint64_t x = 0x9e3779b97f4a7c15ull;

    assert_non_null(junk);
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        junk[i] = (unsigned char)x;
    }

    write_object(name, junk, len, 1);
    expect_eproto(name, "random 64 KiB");
    /* Nothing was written into a foreign object. */
    size_t got;
    unsigned char *after = read_object(name, &got);
    assert_int_equal(got, len);
    assert_memory_equal(after, junk, len);
    free(after);
    /* It exists: WQ_EXCL says so rather than replacing it. */
    {
        struct wq_options o = { .capacity = 16, .flags = WQ_CREATE | WQ_EXCL };
        wq *q = NULL;
        int rc = wq_open(name, &o, &q);
        if (rc == 0)
            wq_close(q);
        assert_int_equal(rc, -EEXIST);
    }

    write_object(name, junk, 0, 0);
    expect_eproto(name, "empty object");
    write_object(name, junk, 100, 0);
    expect_eproto(name, "100 random bytes");
    memset(junk, 0, len);
    write_object(name, junk, len, 0);
    expect_eproto(name, "64 KiB of zeros");
    free(junk);
}

static void eproto_tampered(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("tamper", T_OPTS(.capacity = 64, .max_key_len = 32), &name);
    size_t len;

    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_add(q, KS("b")), 0);
    wq_close(q);
    unsigned char *orig = read_object(name, &len);
    unsigned char *mod = malloc(len);
    assert_non_null(mod);
    assert_true(len > 4096);

    /* Control: the untouched object opens and kept its keys. */
    assert_int_equal(wq_open(name, NULL, &q), 0);
    assert_int_equal(wq_len(q), 2);
    wq_close(q);

    /* The magic number (the first bytes of the header). */
    for (size_t off = 0; off < 8; off++) {
        char what[64];
        memcpy(mod, orig, len);
        mod[off] ^= 0xff;
        write_object(name, mod, len, 0);
        snprintf(what, sizeof what, "header byte %zu flipped", off);
        expect_eproto(name, what);
    }

    write_object(name, orig, len / 2, 0);
    expect_eproto(name, "truncated to half");
    write_object(name, orig, len - 1, 0);
    expect_eproto(name, "one byte short");
    write_object(name, orig, 64, 0);
    expect_eproto(name, "only 64 bytes");

    /* Restored, it works again. */
    write_object(name, orig, len, 0);
    assert_int_equal(wq_open(name, NULL, &q), 0);
    assert_int_equal(wq_len(q), 2);
    T_EXPECT_GET(q, "a");
    assert_int_equal(wq_done(q, KS("a")), 0);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    free(orig);
    free(mod);
}

/* ------------------------------------------------------------------ */
/* Permissions                                                         */
/* ------------------------------------------------------------------ */

static void eacces_nobody(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        skip(); /* needs root to create the object and drop to nobody */
        return;
    }
    const char *name;
    wq *q = t_create("eacces", T_OPTS(.capacity = 16), &name);
    assert_int_equal(wq_add(q, KS("k")), 0);

    pid_t pid = t_fork(10);
    if (pid == 0) {
        struct wq_options o = { .capacity = 16, .flags = WQ_CREATE };
        wq *q2 = NULL;
        if (t_drop_to(T_NOBODY) != 0) {
            fprintf(stderr, "child: cannot become nobody\n");
            _exit(2);
        }
        int r1 = wq_open(name, NULL, &q2);
        int r2 = wq_open(name, &o, &q2);
        if (r1 != -EACCES || r2 != -EACCES) {
            fprintf(stderr, "child (uid 65534): wq_open attach = %d, create "
                    "= %d, expected -EACCES (%d) for both\n", r1, r2, -EACCES);
            _exit(1);
        }
        _exit(0);
    }
    assert_int_equal(t_wait(pid, 5000), 0);
    /* The refused attach changed nothing. */
    assert_int_equal(wq_len(q), 1);
    assert_int_equal(t_stats(q).processes, 1);
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
/* Fork, crash and close                                               */
/* ------------------------------------------------------------------ */

/* A child using the inherited handle gets a key and _exits without Done:
   the parent sees it requeued, counted as a crash requeue. The key the
   parent holds stays the parent's. */
static void fork_child_exits_holding(void **state)
{
    (void)state;
    wq *q = t_create("fork-exit", T_OPTS(.capacity = 16), NULL);
    int *shared = t_shared_alloc(4096);
    pid_t parent = getpid();

    assert_int_equal(wq_add(q, KS("p")), 0);
    T_EXPECT_GET(q, "p");
    assert_int_equal(wq_add(q, KS("k")), 0);

    pid_t pid = t_fork(10);
    if (pid == 0) {
        unsigned char buf[256];
        struct t_dump d = { 0 };
        /* The child is not taken for its parent. */
        if (t_dump_collect(q, &d) != 0) _exit(10);
        const struct t_dkey *ep = t_dump_find(&d, "p");
        if (ep == NULL || ep->owner != parent ||
            ep->state != WQ_KEY_PROCESSING) _exit(11);
        int n = wq_get(q, buf, sizeof buf, 0);
        if (n != 1 || buf[0] != 'k') _exit(12);
        t_dump_free(&d);
        if (t_dump_collect(q, &d) != 0) _exit(13);
        const struct t_dkey *ek = t_dump_find(&d, "k");
        if (ek == NULL || ek->owner != getpid()) _exit(14);
        shared[0] = 1;
        _exit(0); /* no wq_done, no wq_close */
    }
    assert_int_equal(t_wait(pid, 5000), 0);
    assert_int_equal(shared[0], 1);

    uint64_t t0 = t_now_ns();
    unsigned char buf[256];
    int n = wq_get(q, buf, sizeof buf, 2 * SEC * t_scale());
    uint64_t el = t_now_ns() - t0;
    if (n != 1 || buf[0] != 'k')
        fail_msg("dead child's key not requeued: wq_get = %d (%s) after "
                 "%.0f ms", n, n < 0 ? wq_strerror(n) : "?", (double)el / 1e6);
    if (el > 1500 * 1000000ull * t_scale())
        fail_msg("requeue took %.0f ms", (double)el / 1e6);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.crash_requeues_total, 1);
    assert_int_equal(st.processing, 2);

    struct t_dump d = t_dump_all(q);
    const struct t_dkey *ep = t_dump_find(&d, "p"), *ek = t_dump_find(&d, "k");
    assert_true(ep != NULL && ek != NULL);
    assert_int_equal(ep->owner, getpid());
    assert_int_equal(ek->owner, getpid());
    t_dump_free(&d);
    assert_int_equal(wq_done(q, KS("p")), 0);
    assert_int_equal(wq_done(q, KS("k")), 0);
    assert_int_equal(t_get(q, 0), -EAGAIN);
    assert_int_equal(t_stats(q).crash_requeues_total, 1);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free(shared, 4096);
}

/* A child that holds a key is alive while stopped (the key is not
   requeued), and once SIGKILLed the key comes back. */
static void fork_child_stopped_then_killed(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("fork-kill", T_OPTS(.capacity = 16), &name);
    volatile int *shared = t_shared_alloc(4096);

    assert_int_equal(wq_add(q, KS("k")), 0);
    pid_t pid = t_fork(10);
    if (pid == 0) {
        wq *q2 = NULL;
        unsigned char buf[256];
        if (wq_open(name, NULL, &q2) != 0) _exit(10);
        if (wq_get(q2, buf, sizeof buf, 0) != 1) _exit(11);
        shared[0] = 1;
        for (;;)
            pause();
    }
    uint64_t deadline = t_now_ns() + 5 * 1000000000ull * t_scale();
    while (shared[0] == 0 && t_now_ns() < deadline)
        t_sleep_ms(1);
    assert_int_equal(shared[0], 1);

    assert_int_equal(kill(pid, SIGSTOP), 0);
    int st;
    assert_int_equal(waitpid(pid, &st, WUNTRACED), pid);
    assert_true(WIFSTOPPED(st));
    assert_int_equal(t_get(q, 300 * MS), -ETIMEDOUT);
    assert_int_equal(wq_check(q, WQ_CHECK_REAP), 0);
    assert_int_equal(t_get(q, 0), -EAGAIN);
    struct t_dump d = t_dump_all(q);
    assert_int_equal(d.n, 1);
    assert_int_equal(d.v[0].state, WQ_KEY_PROCESSING);
    assert_int_equal(d.v[0].owner, pid);
    t_dump_free(&d);
    assert_int_equal(t_stats(q).crash_requeues_total, 0);

    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(t_wait(pid, 5000), 128 + SIGKILL);

    uint64_t t0 = t_now_ns();
    unsigned char buf[256];
    int n = wq_get(q, buf, sizeof buf, 2 * SEC * t_scale());
    uint64_t el = t_now_ns() - t0;
    if (n != 1 || buf[0] != 'k')
        fail_msg("killed child's key not requeued: wq_get = %d after %.0f ms",
                 n, (double)el / 1e6);
    if (el > 1500 * 1000000ull * t_scale())
        fail_msg("requeue took %.0f ms", (double)el / 1e6);
    assert_int_equal(t_stats(q).crash_requeues_total, 1);
    assert_int_equal(wq_done(q, KS("k")), 0);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free((void *)shared, 4096);
}

/* wq_close requeues the keys the handle holds, at the back, and that is
   not a crash. Same for a child's own handle and an inherited one. */
static void close_requeues(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("close", T_OPTS(.capacity = 16), &name);
    wq *q2 = NULL;

    assert_int_equal(wq_add(q, KS("k")), 0);
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_open(name, NULL, &q2), 0);
    T_EXPECT_GET(q2, "k");
    wq_close(q2);
    assert_int_equal(wq_len(q), 2);
    T_EXPECT_GET(q, "a");
    T_EXPECT_GET(q, "k");
    assert_int_equal(wq_done(q, KS("a")), 0);
    assert_int_equal(wq_done(q, KS("k")), 0);
    assert_int_equal(t_stats(q).crash_requeues_total, 0);
    assert_int_equal(t_stats(q).processes, 1);

    /* A child with its own handle. */
    assert_int_equal(wq_add(q, KS("m")), 0);
    pid_t pid = t_fork(10);
    if (pid == 0) {
        unsigned char buf[256];
        wq *q3 = NULL;
        if (wq_open(name, NULL, &q3) != 0) _exit(10);
        if (wq_get(q3, buf, sizeof buf, 0) != 1) _exit(11);
        wq_close(q3);
        _exit(0);
    }
    assert_int_equal(t_wait(pid, 5000), 0);
    T_EXPECT_GET(q, "m"); /* at once: close requeued it synchronously */
    assert_int_equal(wq_done(q, KS("m")), 0);

    /* A child with the inherited handle; the parent holds "p" meanwhile. */
    assert_int_equal(wq_add(q, KS("p")), 0);
    T_EXPECT_GET(q, "p");
    assert_int_equal(wq_add(q, KS("n")), 0);
    pid = t_fork(10);
    if (pid == 0) {
        unsigned char buf[256];
        if (wq_get(q, buf, sizeof buf, 0) != 1 || buf[0] != 'n') _exit(11);
        wq_close(q);
        _exit(0);
    }
    assert_int_equal(t_wait(pid, 5000), 0);
    T_EXPECT_GET(q, "n");
    struct t_dump d = t_dump_all(q);
    const struct t_dkey *ep = t_dump_find(&d, "p");
    assert_true(ep != NULL);
    assert_int_equal(ep->state, WQ_KEY_PROCESSING);
    assert_int_equal(ep->owner, getpid());
    t_dump_free(&d);
    assert_int_equal(wq_done(q, KS("n")), 0);
    assert_int_equal(wq_done(q, KS("p")), 0);

    struct wq_stats st = t_stats(q);
    assert_int_equal(st.crash_requeues_total, 0);
    assert_int_equal(st.processes, 1);
    assert_int_equal(st.live, 0);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
}

/* A child that exits holding nothing costs nothing: its slot is reaped,
   no key moves, nothing is counted. */
static void fork_child_exits_idle(void **state)
{
    (void)state;
    wq *q = t_create("fork-idle", T_OPTS(.capacity = 16), NULL);

    assert_int_equal(wq_add(q, KS("a")), 0);
    pid_t pid = t_fork(10);
    if (pid == 0) {
        if (wq_len(q) != 1) _exit(10);
        if (wq_add(q, "b", 1) != 0) _exit(11);
        _exit(0);
    }
    assert_int_equal(t_wait(pid, 5000), 0);
    assert_int_equal(wq_check(q, WQ_CHECK_REAP), 0);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.queued, 2);
    assert_int_equal(st.crash_requeues_total, 0);
    assert_int_equal(st.processes, 1);
    T_EXPECT_GET(q, "a");
    T_EXPECT_GET(q, "b");
    assert_int_equal(wq_done(q, KS("a")), 0);
    assert_int_equal(wq_done(q, KS("b")), 0);
    wq_close(q);
}

static void strerror_all(void **state)
{
    (void)state;
    const int codes[] = { EINVAL, ENOTSUP, ENOENT, EEXIST, EACCES, EPROTO,
                          EBADMSG, ENOTRECOVERABLE, ENOSPC, EMSGSIZE, ENOBUFS,
                          EAGAIN, ETIMEDOUT, ESHUTDOWN, ECANCELED, EUSERS,
                          ENOMEM };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *a = wq_strerror(-codes[i]);
        const char *b = wq_strerror(codes[i]);
        assert_non_null(a);
        assert_non_null(b);
        assert_true(strlen(a) > 0);
        assert_string_equal(a, b);
    }
    assert_non_null(wq_strerror(0));
    assert_non_null(wq_strerror(-123456));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        T_TEST(capacity_full),
        T_TEST(key_lengths),
        T_TEST(defaults),
        T_TEST(binary_keys),
        T_TEST(get_enobufs),
        T_TEST(get_timeouts),
        T_TEST(done_enoent),
        T_TEST(bad_names),
        T_TEST(open_missing),
        T_TEST(open_exists),
        T_TEST(unlink_while_attached),
        T_TEST(list_queues),
        T_TEST(max_procs),
        T_TEST(options_invalid),
        T_TEST(options_notsup),
        T_TEST(options_limiter),
        T_TEST(options_mode),
        T_TEST(eproto_garbage),
        T_TEST(eproto_tampered),
        T_TEST(eacces_nobody),
        T_TEST(stats_counts),
        T_TEST(dump_order),
        T_TEST(add_many),
        T_TEST(done_get),
        T_TEST(check_healthy),
        T_TEST(shutdown_basics),
        T_TEST(fork_child_exits_holding),
        T_TEST(fork_child_stopped_then_killed),
        T_TEST(close_requeues),
        T_TEST(fork_child_exits_idle),
        T_TEST(strerror_all),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("api", tests);
}
