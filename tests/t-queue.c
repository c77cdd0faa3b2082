/*
 * t-queue.c - the queue side of t.h: handles, queue helpers, wq_dump
 * collection, store directories and the guardian main(), and client-go's
 * TestBasic / TestAddWhileProcessing workloads.
 *
 * Only the main thread of the test process uses cmocka asserts; the
 * workload consumers run in actors (threads or forked children) and write
 * to the failure board. Only the public API is called here (libt.la links
 * with libwq.la as well as with libwq-fault.la; see t.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "t.h"

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

wq *t_track(wq *q)
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

void t_close(wq *q)
{
    for (int i = 0; i < MAX_OPEN; i++)
        if (opened[i] == q)
            opened[i] = NULL;
    wq_close(q);
}

void t_close_all(void)
{
    for (int i = 0; i < MAX_OPEN; i++) {
        if (opened[i] != NULL) {
            wq_close(opened[i]);
            opened[i] = NULL;
        }
    }
}

/* ------------------------------------------------------------------ */
/* Fake clock (the functions are inline in t.h)                        */
/* ------------------------------------------------------------------ */

uint64_t t_fake_now;

/* ------------------------------------------------------------------ */
/* Queues                                                              */
/* ------------------------------------------------------------------ */

wq *t_create(const char *tag, const struct wq_options *o,
             const char **name_out)
{
    struct wq_options opt = { 0 };
    const char *name = t_qname(tag);
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

wq *t_open_(const char *name, const struct wq_options *o, int line)
{
    wq *q = NULL;
    int rc = wq_open(name, o, &q);

    if (rc != 0)
        fail_msg("line %d: wq_open(%s) = %d (%s): %s", line, name, rc,
                 wq_strerror(rc), wq_last_error());
    assert_non_null(q);
    return q;
}

int t_add_prio(wq *q, const void *key, size_t len, int prio)
{
    struct wq_add_opts o = { .priority = prio };

    return wq_add_opts(q, key, len, &o);
}

struct wq_stats t_stats(wq *q)
{
    struct wq_stats s;

    memset(&s, 0xa5, sizeof s);
    assert_int_equal(wq_stats(q, &s), 0);
    return s;
}

uint64_t t_queued(wq *q)
{
    return t_stats(q).queued;
}

uint64_t t_waiting(wq *q)
{
    return t_stats(q).waiting;
}

void t_expect_stats_(wq *q, uint64_t live, uint64_t queued,
                     uint64_t processing, uint64_t waiting, const char *ctx,
                     int line)
{
    struct wq_stats s = t_stats(q);

    if (s.live != live || s.queued != queued || s.processing != processing ||
        s.waiting != waiting)
        fail_msg("line %d: %s: live %" PRIu64 " queued %" PRIu64
                 " processing %" PRIu64 " waiting %" PRIu64 ", expected %"
                 PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64, line, ctx,
                 s.live, s.queued, s.processing, s.waiting, live, queued,
                 processing, waiting);
}

struct wq_result t_result(wq *q, const char *key)
{
    struct wq_result r;
    int rc;

    memset(&r, 0xa5, sizeof r);
    rc = wq_result(q, KS(key), &r);
    if (rc != 0)
        fail_msg("wq_result(%s) = %d (%s)", key, rc, wq_strerror(rc));
    return r;
}

int t_get(wq *q, int64_t timeout)
{
    unsigned char buf[WQ_MAX_KEY_LEN];

    return wq_get(q, buf, sizeof buf, timeout);
}

void t_expect_get_(wq *q, const void *key, size_t len, int line)
{
    unsigned char buf[WQ_MAX_KEY_LEN];
    int n = wq_get(q, buf, sizeof buf, 0);

    if (n < 0)
        fail_msg("line %d: wq_get = %d (%s), expected \"%.*s\"", line, n,
                 wq_strerror(n), (int)len, (const char *)key);
    if ((size_t)n != len || memcmp(buf, key, len) != 0)
        fail_msg("line %d: wq_get returned \"%.*s\" (%d bytes), expected "
                 "\"%.*s\" (%zu bytes)", line, n, (const char *)buf, n,
                 (int)len, (const char *)key, len);
}

void t_expect_get_rc_(wq *q, int expect, int line)
{
    char buf[WQ_MAX_KEY_LEN];
    int n = wq_get(q, buf, sizeof buf, 0);

    if (n != expect)
        fail_msg("line %d: wq_get = %d (%s \"%.*s\"), expected %d (%s)", line,
                 n, n < 0 ? wq_strerror(n) : "got key", n > 0 ? n : 0, buf,
                 expect, wq_strerror(expect));
}

static void report_violation(const char *what, void *arg)
{
    fprintf(stderr, "  violation (%s): %s\n", (const char *)arg, what);
}

void t_check_clean(wq *q, const char *ctx)
{
    const char *c = ctx != NULL ? ctx : "wq_check";
    int rc = wq_check_report(q, 0, report_violation, (void *)c);

    if (rc != 0)
        fail_msg("%s: wq_check = %d", c, rc);
}

/* ------------------------------------------------------------------ */
/* wq_dump                                                             */
/* ------------------------------------------------------------------ */

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

int t_key_lookup(wq *q, const char *key, struct wq_key_info *out, int *found)
{
    struct find f = { .key = key, .len = strlen(key) };
    int rc = wq_dump(q, find_cb, &f);

    *found = f.found;
    *out = f.info;
    return rc;
}

int t_key_info(wq *q, const char *key, struct wq_key_info *out)
{
    struct wq_key_info ki;
    int found;
    int rc = t_key_lookup(q, key, &ki, &found);

    assert_true(rc == 0 || rc == 1);
    if (found && out != NULL)
        *out = ki;
    return found;
}

unsigned t_key_state(wq *q, const char *key)
{
    struct wq_key_info ki = { 0 };

    return t_key_info(q, key, &ki) ? ki.state : 0;
}

uint64_t t_ready_in_(wq *q, const char *key, int line)
{
    struct wq_key_info ki = { 0 };

    if (!t_key_info(q, key, &ki))
        fail_msg("line %d: \"%s\" is not in the dump", line, key);
    if (!(ki.state & WQ_KEY_WAITING))
        fail_msg("line %d: \"%s\" is not waiting (state 0x%x)", line, key,
                 ki.state);
    if (ki.ready_ns < t_fake_now)
        fail_msg("line %d: \"%s\" ready_ns %" PRIu64 " before now %" PRIu64,
                 line, key, ki.ready_ns, t_fake_now);
    return ki.ready_ns - t_fake_now;
}

static int collect_cb(const struct wq_key_info *ki, void *arg)
{
    struct t_dump *d = arg;
    struct t_dkey *k;
    size_t l;

    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 64;
        struct t_dkey *nv = realloc(d->v, nc * sizeof *nv);
        if (nv == NULL)
            return -ENOMEM;
        d->v = nv;
        d->cap = nc;
    }
    k = &d->v[d->n++];
    l = ki->len < T_KEYBUF ? ki->len : T_KEYBUF;
    memcpy(k->key, ki->key, l);
    k->key[l] = '\0';
    k->len = ki->len;
    k->state = ki->state;
    k->owner = ki->owner_pid;
    k->position = ki->position;
    k->ready = ki->ready_ns;
    k->failures = ki->failures;
    k->result = ki->result;
    k->code = ki->result_code;
    snprintf(k->message, sizeof k->message, "%s",
             ki->result_message ? ki->result_message : "(null)");
    return 0;
}

int t_dump_collect(wq *q, struct t_dump *d)
{
    return wq_dump(q, collect_cb, d);
}

struct t_dump t_dump_all(wq *q)
{
    struct t_dump d = { NULL, 0, 0 };
    int rc = t_dump_collect(q, &d);

    if (rc != 0) {
        t_dump_free(&d);
        fail_msg("wq_dump = %d", rc);
    }
    return d;
}

static int same_key(const struct t_dkey *e, const char *key)
{
    size_t l = strlen(key);

    return e->len == l && l <= T_KEYBUF && memcmp(e->key, key, l) == 0;
}

const struct t_dkey *t_dump_find(const struct t_dump *d, const char *key)
{
    for (size_t i = 0; i < d->n; i++)
        if (same_key(&d->v[i], key))
            return &d->v[i];
    return NULL;
}

int t_dump_count(const struct t_dump *d, const char *key)
{
    int n = 0;

    for (size_t i = 0; i < d->n; i++)
        n += same_key(&d->v[i], key);
    return n;
}

void t_dump_free(struct t_dump *d)
{
    free(d->v);
    d->v = NULL;
    d->n = d->cap = 0;
}

/* ------------------------------------------------------------------ */
/* Store directories and the guardian main()                           */
/* ------------------------------------------------------------------ */

static char topdir[128];
#define MAX_STORES 64
static char stores[MAX_STORES][192];
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

void t_rm_rf(const char *p)
{
    (void)nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

const char *t_mkstore(void)
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

void t_stores_cleanup(void)
{
    for (int i = 0; i < nstores; i++)
        t_rm_rf(stores[i]);
    nstores = 0;
}

int t_store_teardown(void **state)
{
    int rc = t_teardown(state); /* kills children first */

    t_stores_cleanup();
    unsetenv("WQ_TEST_STORE_MAX_MAP");
    umask(022);
    return rc;
}

struct wq_options t_store_opts(const char *store, int durability)
{
    struct wq_options o;

    memset(&o, 0, sizeof o);
    o.capacity = 64;
    o.max_key_len = 32;
    o.store_path = store;
    o.durability = durability;
    if (durability == WQ_DURABLE_NONE)
        o.snapshot_interval_ms = 60000; /* only wq_snapshot writes */
    /* wq_add_rate_limited of a fresh key waits exactly 2 h */
    o.rl_limiters = WQ_RL_EXPONENTIAL;
    o.rl_base_delay_ns = 2 * HOUR;
    o.rl_max_delay_ns = 100 * HOUR;
    o.flags = WQ_CREATE | WQ_EXCL;
    return o;
}

const char *t_durability_name(int d)
{
    return d == WQ_DURABLE_PROCESS ? "PROCESS" : d == WQ_DURABLE_FSYNC ? "FSYNC"
         : d == WQ_DURABLE_NONE ? "NONE" : "?";
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

/* T_RUN_GROUP with the group of g (cmocka_run_group_tests_name needs an
   array; _cmocka_run_group_tests is what it expands to). */
static int run_group(const struct t_guard *g)
{
    t_test_filters();
    return t_exit_status(_cmocka_run_group_tests(g->prog, g->tests, g->ntests,
                                                 t_group_setup,
                                                 t_group_teardown));
}

int t_guard_main(const struct t_guard *g)
{
    if (g->max_stores > MAX_STORES) {
        fprintf(stderr, "%s: max_stores %u > %d\n", g->prog, g->max_stores,
                MAX_STORES);
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
        int rc = run_group(g);
        t_rm_rf(topdir);
        return rc;
    }
    fflush(stdout);
    pid_t c = fork();
    if (c < 0) {
        perror("fork");
        t_rm_rf(topdir);
        return 1;
    }
    if (c == 0) {
        setpgid(0, 0);
        _exit(run_group(g));
    }
    setpgid(c, c);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    int st = 0, forwarded = 0;
    uint64_t deadline = t_now_ns() + (uint64_t)g->deadline_s * t_scale() * SEC;
    for (;;) {
        pid_t r = waitpid(c, &st, WNOHANG);
        if (r == c)
            break;
        if (got_signal && !forwarded) {
            kill(c, got_signal); /* the runner cleans up and dies */
            forwarded = 1;
        }
        if (t_now_ns() > deadline) {
            fprintf(stderr, "%s: runner hung, killing it\n", g->prog);
            kill(-c, SIGKILL);
            kill(c, SIGKILL);
            deadline = UINT64_MAX;
        }
        t_sleep_ms(20);
    }
    kill(-c, SIGKILL); /* stragglers of the runner, if any */
    t_rm_rf(topdir);
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

static int shut_down(wq *q, int drain)
{
    return drain ? wq_shutdown_drain(q, 5 * SEC * t_scale()) : wq_shutdown(q);
}

/* The checks both runs make once the team is back. */
static void assert_team_done(int failed, int producers_rc, int shutdown_rc)
{
    T_ASSERT_BOARD_CLEAN();
    assert_int_equal(failed, 0);
    assert_int_equal(producers_rc, 0);
    assert_int_equal(shutdown_rc, 0);
}

/* A consumer's wq_get (5 s, scaled): the key's length, 0 once the queue
   is shut down, -1 (recorded on the board) for anything else. */
static int next_key(struct t_actor *a, unsigned char *buf, size_t cap)
{
    int n = wq_get(a->q, buf, cap, 5 * SEC * t_scale());

    if (n == -ESHUTDOWN)
        return 0;
    if (n <= 0) {
        t_failf(__FILE__, __LINE__, "check failed: n > 0 (wq_get = %d)", n);
        return -1;
    }
    return n;
}

int t_basic_produce(struct t_actor *a, const char *key, size_t len,
                    int (*add)(wq *q, const char *key, size_t len, int j,
                               unsigned *seed),
                    unsigned *seed)
{
    struct t_basic *b = a->arg;

    for (int j = 0; j < T_BASIC_ADDS; j++) {
        t_atomic_max(&b->last_add[a->id], atomic_fetch_add(&b->seq, 1) + 1);
        int rc = add(a->q, key, len, j, seed);
        T_CHECK(rc == 0 || rc == 1);
        t_sleep_ms(1);
    }
    atomic_fetch_add(&b->producers_done, 1);
    return 0;
}

int t_basic_consume(struct t_actor *a, t_parse_fn parse,
                    const char *after_shutdown)
{
    struct t_basic *b = a->arg;
    unsigned char buf[T_KEYBUF];

    for (;;) {
        int n = next_key(a, buf, sizeof buf);
        if (n <= 0)
            return n < 0;
        if ((size_t)n == strlen(after_shutdown) &&
            memcmp(buf, after_shutdown, (size_t)n) == 0) {
            atomic_fetch_add(&b->got_after_shutdown, 1);
            t_failf(__FILE__, __LINE__, "got an item added after shutdown");
            return 1;
        }
        int k = parse(buf, n, T_BASIC_PRODUCERS);
        T_CHECK(k >= 0);
        if (atomic_fetch_add(&b->active[k], 1) != 0)
            atomic_fetch_add(&b->violations, 1);
        t_atomic_max(&b->last_start[k], atomic_fetch_add(&b->seq, 1) + 1);
        atomic_fetch_add(&b->processed[k], 1);
        t_sleep_ms(3);
        atomic_fetch_sub(&b->active[k], 1);
        T_CHECK_EQ(wq_done(a->q, buf, (size_t)n), 0);
    }
}

void t_basic_run(enum t_mode mode, int drain, wq *q, const char *name,
                 struct t_basic *b, t_actor_fn actor,
                 int (*add_after_shutdown)(wq *q))
{
    struct t_team *t = t_team_start(mode, name, q,
                                    T_BASIC_PRODUCERS + T_BASIC_CONSUMERS,
                                    actor, b);
    int prc = t_wait_count(&b->producers_done, T_BASIC_PRODUCERS, 5000);
    int src = shut_down(q, drain);
    int arc = add_after_shutdown(q);
    int failed = t_team_wait(t, 8000);

    assert_team_done(failed, prc, src);
    assert_int_equal(arc, -ESHUTDOWN);
    assert_int_equal(atomic_load(&b->violations), 0);
    assert_int_equal(atomic_load(&b->got_after_shutdown), 0);
    assert_int_equal(wq_len(q), 0);
}

void t_basic_check_stats(wq *q, struct t_basic *b, const char *prefix,
                         struct wq_stats *st)
{
    int rc = wq_stats(q, st);
    if (rc != 0)
        fail_msg("wq_stats = %d (%s): %s", rc, wq_strerror(rc), wq_last_error());
    uint64_t total = 0;
    for (int k = 0; k < T_BASIC_PRODUCERS; k++) {
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
                     T_BASIC_PRODUCERS * T_BASIC_ADDS);
    assert_int_equal(st->adds_total, total);
    assert_int_equal(st->queued, 0);
    assert_int_equal(st->processing, 0);
    assert_int_equal(st->live, 0);
    assert_int_equal(st->crash_requeues_total, 0);
    assert_int_equal(st->shutting_down, 1);
    assert_int_equal(st->processes, 1);
}

int t_awp_consume(struct t_actor *a, t_parse_fn parse,
                  int (*readd)(wq *q, const void *key, size_t len,
                               unsigned *seed),
                  unsigned *seed, const char *prefix)
{
    struct t_awp *w = a->arg;
    unsigned char buf[T_KEYBUF];

    for (;;) {
        int n = next_key(a, buf, sizeof buf);
        if (n <= 0)
            return n < 0;
        int k = parse(buf, n, T_AWP_PRODUCERS);
        T_CHECK(k >= 0);
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
                T_CHECK(atomic_load(&w->shutdown_started));
                atomic_store(&w->readd_refused[k], 1);
            } else {
                t_failf(__FILE__, __LINE__, "re-add of %s%d returned %d",
                        prefix, k, rc);
                atomic_fetch_sub(&w->active[k], 1);
                return 1;
            }
        } else {
            T_CHECK_EQ(c, 2);
            T_CHECK(atomic_load(&w->readd_ok[k]));
        }
        atomic_fetch_sub(&w->active[k], 1);
        T_CHECK_EQ(wq_done(a->q, buf, (size_t)n), 0);
    }
}

void t_awp_run(enum t_mode mode, int drain, wq *q, const char *name,
               struct t_awp *w, t_actor_fn actor, unsigned settle_ms,
               const char *prefix)
{
    struct t_team *t = t_team_start(mode, name, q,
                                    T_AWP_PRODUCERS + T_AWP_CONSUMERS,
                                    actor, w);
    int prc = t_wait_count(&w->producers_done, T_AWP_PRODUCERS, 5000);
    if (settle_ms > 0)
        t_sleep_ms(settle_ms);
    atomic_store(&w->shutdown_started, 1);
    int src = shut_down(q, drain);
    int failed = t_team_wait(t, 8000);

    assert_team_done(failed, prc, src);
    assert_int_equal(atomic_load(&w->violations), 0);
    for (int k = 0; k < T_AWP_PRODUCERS; k++) {
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
