/*
 * fixture.c - see fixture.h.
 *
 * Only the main thread of the test process uses cmocka asserts; the
 * workload consumers run in actors (threads or forked children) and write
 * to the failure board (helpers.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fixture.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Handles                                                             */
/* ------------------------------------------------------------------ */

#define MAX_OPEN 16
static wq *opened[MAX_OPEN];

wq *track(wq *q)
{
    for (int i = 0; i < MAX_OPEN; i++) {
        if (opened[i] == NULL) {
            opened[i] = q;
            return q;
        }
    }
    fail_msg("too many open handles");
    return q;
}

void close_q(wq *q)
{
    for (int i = 0; i < MAX_OPEN; i++)
        if (opened[i] == q)
            opened[i] = NULL;
    wq_close(q);
}

void close_all(void)
{
    for (int i = 0; i < MAX_OPEN; i++) {
        if (opened[i] != NULL) {
            wq_close(opened[i]);
            opened[i] = NULL;
        }
    }
}

/* ------------------------------------------------------------------ */
/* Fake clock (the functions are inline in fixture.h)                  */
/* ------------------------------------------------------------------ */

uint64_t fake_now;

/* ------------------------------------------------------------------ */
/* Queues                                                              */
/* ------------------------------------------------------------------ */

wq *create_q(const char *tag, const struct wq_options *o,
             const char **name_out)
{
    struct wq_options opt = { 0 };
    const char *name = th_qname(tag);
    wq *q = NULL;
    int rc;

    if (o != NULL)
        opt = *o;
    opt.flags |= WQ_CREATE | WQ_EXCL;
    rc = wq_open(name, &opt, &q);
    if (rc != 0)
        fail_msg("wq_open(%s) = %d (%s)", name, rc, wq_strerror(rc));
    assert_non_null(q);
    if (name_out != NULL)
        *name_out = name;
    return q;
}

wq *open_opts(const char *tag, const struct wq_options *o)
{
    return track(create_q(tag, o, NULL));
}

struct wq_stats stats_of(wq *q)
{
    struct wq_stats s;
    int rc = wq_stats(q, &s);

    assert_int_equal(rc, 0);
    return s;
}

uint64_t queued(wq *q)
{
    return stats_of(q).queued;
}

uint64_t waiting(wq *q)
{
    return stats_of(q).waiting;
}

struct find {
    const char *key;
    size_t len;
    int found;
    struct wq_key_info info;
};

static int find_cb(const struct wq_key_info *i, void *arg)
{
    struct find *f = arg;

    if (i->len == f->len && memcmp(i->key, f->key, f->len) == 0) {
        f->found = 1;
        f->info = *i;
        f->info.key = NULL;
        f->info.result_message = NULL;
        return 1;
    }
    return 0;
}

int dump_find(wq *q, const char *key, struct wq_key_info *out, int *found)
{
    struct find f = { .key = key, .len = strlen(key) };
    int rc = wq_dump(q, find_cb, &f);

    *found = f.found;
    *out = f.info;
    return rc;
}

int key_info(wq *q, const char *key, struct wq_key_info *out)
{
    struct wq_key_info ki;
    int found;
    int rc = dump_find(q, key, &ki, &found);

    assert_true(rc == 0 || rc == 1);
    if (found && out != NULL)
        *out = ki;
    return found;
}

unsigned key_state(wq *q, const char *key)
{
    struct wq_key_info ki = { 0 };

    return key_info(q, key, &ki) ? ki.state : 0;
}

uint64_t ready_in_(wq *q, const char *key, int line)
{
    struct wq_key_info ki = { 0 };

    if (!key_info(q, key, &ki))
        fail_msg("line %d: \"%s\" is not in the dump", line, key);
    if (!(ki.state & WQ_KEY_WAITING))
        fail_msg("line %d: \"%s\" is not waiting (state 0x%x)", line, key,
                 ki.state);
    if (ki.ready_ns < fake_now)
        fail_msg("line %d: \"%s\" ready_ns %" PRIu64 " before now %" PRIu64,
                 line, key, ki.ready_ns, fake_now);
    return ki.ready_ns - fake_now;
}

void expect_get_(wq *q, const char *key, int line)
{
    char buf[FX_KEYBUF];
    int n = wq_get(q, buf, sizeof buf, 0);

    if (n < 0)
        fail_msg("line %d: wq_get = %d (%s), expected \"%s\"", line, n,
                 wq_strerror(n), key);
    if ((size_t)n != strlen(key) || memcmp(buf, key, (size_t)n) != 0)
        fail_msg("line %d: wq_get = \"%.*s\", expected \"%s\"", line, n, buf,
                 key);
}

void expect_get_rc_(wq *q, int expect, int line)
{
    char buf[FX_KEYBUF];
    int n = wq_get(q, buf, sizeof buf, 0);

    if (n != expect)
        fail_msg("line %d: wq_get = %d (%s \"%.*s\"), expected %d (%s)", line,
                 n, n < 0 ? wq_strerror(n) : "got key", n > 0 ? n : 0, buf,
                 expect, wq_strerror(expect));
}

static void report(const char *what, void *arg)
{
    (void)arg;
    print_message("  violation: %s\n", what);
}

void check_clean(wq *q)
{
    assert_int_equal(wq_check_report(q, 0, report, NULL), 0);
}

/* ------------------------------------------------------------------ */
/* Store directories and the guardian main()                           */
/* ------------------------------------------------------------------ */

static char topdir[128];
#define FX_MAX_STORES 64
static char stores[FX_MAX_STORES][192];
static int nstores;
static unsigned max_stores;

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)flag;
    (void)f;
    (void)remove(p);
    return 0;
}

void rm_rf(const char *p)
{
    (void)nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

const char *mkstore(void)
{
    if ((unsigned)nstores == max_stores)
        fail_msg("too many stores");
    char *p = stores[nstores];
    snprintf(p, sizeof stores[0], "%s/s-XXXXXX", topdir);
    if (mkdtemp(p) == NULL)
        fail_msg("mkdtemp(%s): %s", p, strerror(errno));
    nstores++;
    return p;
}

void stores_cleanup(void)
{
    for (int i = 0; i < nstores; i++)
        rm_rf(stores[i]);
    nstores = 0;
}

void fx_test_filters(void)
{
    const char *filter = getenv("WQ_TEST_FILTER"); /* e.g. "test_full*" */
    if (filter != NULL)
        cmocka_set_test_filter(filter);
    const char *skip = getenv("WQ_TEST_SKIP");
    if (skip != NULL)
        cmocka_set_skip_filter(skip);
}

static volatile sig_atomic_t got_signal;
static void on_signal(int sig)
{
    got_signal = sig;
}

static void remove_shm_of(pid_t pid)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "wq.t%ld-", (long)pid);
    DIR *d = opendir("/dev/shm");
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            char p[512];
            snprintf(p, sizeof p, "/dev/shm/%s", e->d_name);
            fprintf(stderr, "removing leftover %s\n", p);
            (void)unlink(p);
        }
    closedir(d);
}

int fx_guard_main(const struct fx_guard *g)
{
    if (g->max_stores > FX_MAX_STORES) {
        fprintf(stderr, "%s: max_stores %u > %d\n", g->prog, g->max_stores,
                FX_MAX_STORES);
        return 1;
    }
    max_stores = g->max_stores;
    snprintf(topdir, sizeof topdir, "/tmp/wq-%s-XXXXXX", g->prog);
    if (mkdtemp(topdir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    if (g->topdir_mode != 0)
        chmod(topdir, (mode_t)g->topdir_mode);
    if (getenv("WQ_TEST_NOFORK") != NULL) { /* debugging: no guardian */
        int rc = g->run_group();
        rm_rf(topdir);
        return rc;
    }
    fflush(stdout);
    pid_t c = fork();
    if (c < 0) {
        perror("fork");
        rm_rf(topdir);
        return 1;
    }
    if (c == 0) {
        setpgid(0, 0);
        _exit(g->run_group());
    }
    setpgid(c, c);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    int st = 0, forwarded = 0;
    uint64_t deadline = th_now_ns() + (uint64_t)g->deadline_s * th_scale() * SEC;
    for (;;) {
        pid_t r = waitpid(c, &st, WNOHANG);
        if (r == c)
            break;
        if (got_signal && !forwarded) {
            kill(c, got_signal); /* the runner cleans up and dies */
            forwarded = 1;
        }
        if (th_now_ns() > deadline) {
            fprintf(stderr, "%s: runner hung, killing it\n", g->prog);
            kill(-c, SIGKILL);
            kill(c, SIGKILL);
            deadline = UINT64_MAX;
        }
        th_sleep_ms(20);
    }
    kill(-c, SIGKILL); /* stragglers of the runner, if any */
    rm_rf(topdir);
    remove_shm_of(c);
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    fprintf(stderr, "%s: runner killed by signal %d\n", g->prog,
            WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    return 1;
}

/* ------------------------------------------------------------------ */
/* TestBasic and TestAddWhileProcessing                                */
/* ------------------------------------------------------------------ */

void fx_atomic_max(atomic_ullong *a, unsigned long long v)
{
    unsigned long long cur = atomic_load(a);
    while (cur < v && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

int fx_wait_count(atomic_int *v, int target, int ms)
{
    uint64_t deadline = th_now_ns() + (uint64_t)ms * th_scale() * 1000000u;
    while (atomic_load(v) < target) {
        if (th_now_ns() >= deadline)
            return -1;
        usleep(500);
    }
    return 0;
}

int fx_basic_consume(struct th_actor *a, fx_parse_fn parse,
                     const char *after_shutdown)
{
    struct fx_basic *b = a->arg;
    unsigned char buf[FX_KEYBUF];

    for (;;) {
        int n = wq_get(a->q, buf, sizeof buf, 5 * TH_S * th_scale());
        if (n == -ESHUTDOWN)
            return 0;
        TH_CHECK(n > 0);
        if ((size_t)n == strlen(after_shutdown) &&
            memcmp(buf, after_shutdown, (size_t)n) == 0) {
            atomic_fetch_add(&b->got_after_shutdown, 1);
            th_failf(__FILE__, __LINE__, "got an item added after shutdown");
            return 1;
        }
        int k = parse(buf, n, B_PRODUCERS);
        TH_CHECK(k >= 0);
        if (atomic_fetch_add(&b->active[k], 1) != 0)
            atomic_fetch_add(&b->violations, 1);
        fx_atomic_max(&b->last_start[k], atomic_fetch_add(&b->seq, 1) + 1);
        atomic_fetch_add(&b->processed[k], 1);
        th_sleep_ms(3);
        atomic_fetch_sub(&b->active[k], 1);
        TH_CHECK_EQ(wq_done(a->q, buf, (size_t)n), 0);
    }
}

void fx_basic_run(enum th_mode mode, int drain, wq *q, const char *name,
                  struct fx_basic *b, th_actor_fn actor,
                  int (*add_after_shutdown)(wq *q))
{
    struct th_team *t = th_team_start(mode, name, q, B_PRODUCERS + B_CONSUMERS,
                                      actor, b);
    int prc = fx_wait_count(&b->producers_done, B_PRODUCERS, 5000);
    int src = drain ? wq_shutdown_drain(q, 5 * TH_S * th_scale()) : wq_shutdown(q);
    int arc = add_after_shutdown(q);
    int failed = th_team_wait(t, 8000);

    TH_ASSERT_BOARD_CLEAN();
    assert_int_equal(failed, 0);
    assert_int_equal(prc, 0);
    assert_int_equal(src, 0);
    assert_int_equal(arc, -ESHUTDOWN);
    assert_int_equal(atomic_load(&b->violations), 0);
    assert_int_equal(atomic_load(&b->got_after_shutdown), 0);
    assert_int_equal(wq_len(q), 0);
}

void fx_basic_check_stats(wq *q, struct fx_basic *b, const char *prefix,
                          struct wq_stats *st)
{
    assert_int_equal(wq_stats(q, st), 0);
    uint64_t total = 0;
    for (int k = 0; k < B_PRODUCERS; k++) {
        int p = atomic_load(&b->processed[k]);
        if (p < 1)
            fail_msg("key %s%d was never processed", prefix, k);
        /* Processed at least once after its last add began. */
        if (atomic_load(&b->last_start[k]) <= atomic_load(&b->last_add[k]))
            fail_msg("key %s%d: last processing start (seq %llu) is not "
                     "after its last add (seq %llu)", prefix, k,
                     (unsigned long long)atomic_load(&b->last_start[k]),
                     (unsigned long long)atomic_load(&b->last_add[k]));
        total += (uint64_t)p;
    }
    /* Every add is counted once, either as an add or as coalesced, and
       every non-coalesced add is handed out exactly once. */
    assert_int_equal(st->adds_total + st->coalesced_total,
                     B_PRODUCERS * B_ADDS);
    assert_int_equal(st->adds_total, total);
    assert_int_equal(st->queued, 0);
    assert_int_equal(st->processing, 0);
    assert_int_equal(st->live, 0);
    assert_int_equal(st->crash_requeues_total, 0);
    assert_int_equal(st->shutting_down, 1);
    assert_int_equal(st->processes, 1);
}

int fx_awp_consume(struct th_actor *a, fx_parse_fn parse,
                   int (*readd)(wq *q, const void *key, size_t len,
                                unsigned *seed),
                   unsigned *seed, const char *prefix)
{
    struct fx_awp *w = a->arg;
    unsigned char buf[FX_KEYBUF];

    for (;;) {
        int n = wq_get(a->q, buf, sizeof buf, 5 * TH_S * th_scale());
        if (n == -ESHUTDOWN)
            return 0;
        TH_CHECK(n > 0);
        int k = parse(buf, n, W_PRODUCERS);
        TH_CHECK(k >= 0);
        if (atomic_fetch_add(&w->active[k], 1) != 0)
            atomic_fetch_add(&w->violations, 1);
        int c = atomic_fetch_add(&w->count[k], 1) + 1;
        if (c == 1) {
            /* Re-add while processing: comes back once after Done, unless
               the queue was shut down meanwhile. */
            int rc = readd(a->q, buf, (size_t)n, seed);
            if (rc == 0) {
                atomic_store(&w->readd_ok[k], 1);
            } else if (rc == -ESHUTDOWN) {
                TH_CHECK(atomic_load(&w->shutdown_started));
                atomic_store(&w->readd_refused[k], 1);
            } else {
                th_failf(__FILE__, __LINE__, "re-add of %s%d returned %d",
                         prefix, k, rc);
                atomic_fetch_sub(&w->active[k], 1);
                return 1;
            }
        } else {
            TH_CHECK_EQ(c, 2);
            TH_CHECK(atomic_load(&w->readd_ok[k]));
        }
        atomic_fetch_sub(&w->active[k], 1);
        TH_CHECK_EQ(wq_done(a->q, buf, (size_t)n), 0);
    }
}

void fx_awp_run(enum th_mode mode, int drain, wq *q, const char *name,
                struct fx_awp *w, th_actor_fn actor, unsigned settle_ms,
                const char *prefix)
{
    struct th_team *t = th_team_start(mode, name, q, W_PRODUCERS + W_CONSUMERS,
                                      actor, w);
    int prc = fx_wait_count(&w->producers_done, W_PRODUCERS, 5000);
    if (settle_ms > 0)
        th_sleep_ms(settle_ms);
    atomic_store(&w->shutdown_started, 1);
    int src = drain ? wq_shutdown_drain(q, 5 * TH_S * th_scale()) : wq_shutdown(q);
    int failed = th_team_wait(t, 8000);

    TH_ASSERT_BOARD_CLEAN();
    assert_int_equal(failed, 0);
    assert_int_equal(prc, 0);
    assert_int_equal(src, 0);
    assert_int_equal(atomic_load(&w->violations), 0);
    for (int k = 0; k < W_PRODUCERS; k++) {
        int ok = atomic_load(&w->readd_ok[k]);
        int refused = atomic_load(&w->readd_refused[k]);
        int c = atomic_load(&w->count[k]);
        if (ok + refused != 1)
            fail_msg("key %s%d: re-add ok=%d refused=%d", prefix, k, ok,
                     refused);
        if (c != 1 + ok)
            fail_msg("key %s%d handed out %d times, expected %d", prefix, k,
                     c, 1 + ok);
    }
    assert_int_equal(wq_len(q), 0);
    struct wq_stats st;
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.live, 0);
    assert_int_equal(st.coalesced_total, 0);
    assert_int_equal(st.crash_requeues_total, 0);
    assert_int_equal(st.processes, 1);
}
