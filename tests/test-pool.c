/*
 * test-pool.c - wq_run_workers (wq.h, "Worker pool") with real processes.
 *
 * The supervisor always runs in a forked child (it owns its workers; the
 * test process stays producer and observer). Reconcilers run in the
 * worker processes and report to witnesses in MAP_SHARED mappings made
 * before the fork (passed as `arg`), never through libwq itself:
 *   1. two reconciles of one key never overlap: 8 workers, 16 hot keys,
 *      100,000 adds from a producer process; every key is reconciled
 *      after its last add;
 *   2. the long-reconcile scenario of OpenKruise's "Learning Concurrent
 *      Reconciling": a key re-added while it is processing runs again
 *      after its Done, behind the backlog that arrived meanwhile; with
 *      1 worker it waits for the whole backlog, with 4 it does not;
 *   3. the outcome mapping of controller-runtime (success, failure codes,
 *      positive returns, requeue_after);
 *   4. a worker that crashes mid-reconcile is replaced and its key
 *      reconciled again, never twice at once; a crash-looping reconciler
 *      is restarted with a backoff and its key's failure count rises;
 *   5. SIGTERM drains, a second SIGTERM kills at once (-EINTR);
 *   6. the supervisor waits only for its own workers.
 * Every wait has a deadline; every child has an alarm; workers die with
 * their supervisor (PR_SET_PDEATHSIG), which t_teardown SIGKILLs.
 */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "t.h"

/* Poll `cond` every millisecond until it holds or `ms` (scaled) pass. */
#define WAIT_UNTIL(cond, ms)                                                 \
    __extension__({                                                          \
        uint64_t wu_deadline_ = t_now_ns() +                                 \
                                (uint64_t)(ms) * t_scale() * 1000000ull;     \
        bool wu_ok_;                                                         \
        while (!(wu_ok_ = (cond)) && t_now_ns() < wu_deadline_)              \
            t_sleep_ms(1);                                                   \
        wu_ok_;                                                              \
    })

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = { (time_t)(ns / 1000000000u), (long)(ns % 1000000000u) };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static bool key_is(const void *key, size_t len, const char *s)
{
    return len == strlen(s) && memcmp(key, s, len) == 0;
}

/* Dead, or a zombie (dead, not yet reaped by its parent). */
static bool pid_dead(pid_t pid)
{
    char path[64], buf[512];
    if (kill(pid, 0) != 0)
        return errno == ESRCH;
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    return p == NULL || (p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

static bool quiet(wq *q)
{
    struct wq_stats st;
    return wq_stats(q, &st) == 0 && st.queued == 0 && st.processing == 0 &&
           st.waiting == 0;
}

/* ------------------------------------------------------------------ */
/* The supervisor child                                                */
/* ------------------------------------------------------------------ */

struct sup_report {
    atomic_int rc;        /* wq_run_workers' return */
    atomic_int returned;  /* 1 once it returned */
    atomic_ullong returned_ns;
    atomic_int restored;  /* mask and dispositions as before */
};

typedef void (*sup_hook)(void *hook_arg, int phase); /* 0 before, 1 after */

/* Handler and the flags a caller sets (glibc adds SA_RESTORER by itself
   when a disposition is installed through sigaction; it means nothing). */
static bool same_disposition(const struct sigaction *a, const struct sigaction *b)
{
    const int user = SA_NOCLDSTOP | SA_NOCLDWAIT | SA_SIGINFO | SA_RESTART |
                     SA_NODEFER | SA_RESETHAND | SA_ONSTACK;
    return a->sa_handler == b->sa_handler &&
           (a->sa_flags & user) == (b->sa_flags & user);
}

static void caller_handler(int sig)
{
    (void)sig;
}

/* Fork a process that opens the queue and runs wq_run_workers. The
   caller has its own SIGINT handler and SIGUSR2 blocked: both must be as
   they were when wq_run_workers returns. */
static pid_t start_supervisor(const char *name, unsigned workers, wq_reconcile_fn fn,
                              void *arg, struct sup_report *rep, unsigned alarm_s,
                              sup_hook hook, void *hook_arg)
{
    pid_t pid = t_fork(alarm_s);
    if (pid != 0)
        return pid;
    static const int sigs[] = { SIGTERM, SIGINT, SIGCHLD, SIGUSR2 };
    enum { NSIGS = sizeof sigs / sizeof sigs[0] };
    struct sigaction before[NSIGS], after[NSIGS];
    sigset_t mask_before, mask_after, usr2;
    struct sigaction own = { .sa_handler = caller_handler, .sa_flags = SA_RESTART };
    wq *sq;
    int rc = wq_open(name, NULL, &sq);
    if (rc != 0) {
        t_failf(__FILE__, __LINE__, "supervisor: wq_open = %d", rc);
        _exit(2);
    }
    if (hook)
        hook(hook_arg, 0);
    sigemptyset(&own.sa_mask);
    sigaction(SIGINT, &own, NULL);
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    sigprocmask(SIG_BLOCK, &usr2, NULL);
    for (int i = 0; i < NSIGS; i++)
        sigaction(sigs[i], NULL, &before[i]);
    sigprocmask(SIG_SETMASK, NULL, &mask_before);
    rc = wq_run_workers(sq, workers, fn, arg);
    atomic_store(&rep->returned_ns, t_now_ns());
    atomic_store(&rep->rc, rc);
    atomic_store(&rep->returned, 1);
    sigprocmask(SIG_SETMASK, NULL, &mask_after);
    bool ok = true;
    for (int i = 0; i < NSIGS; i++) {
        sigaction(sigs[i], NULL, &after[i]);
        bool same = same_disposition(&before[i], &after[i]) &&
                    sigismember(&mask_before, sigs[i]) == sigismember(&mask_after, sigs[i]);
        if (!same)
            t_failf(__FILE__, __LINE__,
                     "supervisor: signal %d: handler %p -> %p, flags %#x -> %#x, "
                     "blocked %d -> %d", sigs[i], (void *)before[i].sa_handler,
                     (void *)after[i].sa_handler, (unsigned)before[i].sa_flags,
                     (unsigned)after[i].sa_flags, sigismember(&mask_before, sigs[i]),
                     sigismember(&mask_after, sigs[i]));
        ok = ok && same;
    }
    atomic_store(&rep->restored, ok ? 1 : -1);
    if (hook)
        hook(hook_arg, 1);
    wq_close(sq);
    _exit(rc == 0 ? 0 : 1);
}

/* Shut the queue down and collect the supervisor: it must return 0. */
static void stop_supervisor(wq *q, pid_t sup, struct sup_report *rep)
{
    assert_int_equal(wq_shutdown(q), 0);
    int st = t_wait(sup, 10000);
    if (st != 0)
        fail_msg("supervisor ended with %d (wq_run_workers = %d, returned %d)",
                 st, atomic_load(&rep->rc), atomic_load(&rep->returned));
    assert_int_equal(atomic_load(&rep->returned), 1);
    assert_int_equal(atomic_load(&rep->rc), 0);
    assert_int_equal(atomic_load(&rep->restored), 1);
}

/* ------------------------------------------------------------------ */
/* 1. Never two reconciles of one key at once                          */
/* ------------------------------------------------------------------ */

#define NHOT 16
#define NADDS 100000

struct hot_key {
    atomic_int inflight;
    atomic_int max_inflight;
    atomic_llong last_add_seq;   /* producer, before wq_add */
    atomic_llong last_seen_seq;  /* reconciler, at its start */
    atomic_long calls;
};

struct hot {
    struct sup_report rep;
    atomic_int bad_key;
    atomic_long adds_new, adds_coalesced;
    struct hot_key keys[NHOT];
};

static int hot_index(const void *key, size_t len)
{
    const char *k = key;
    if (len != 5 || memcmp(k, "hot", 3) != 0 || k[3] < '0' || k[3] > '9' ||
        k[4] < '0' || k[4] > '9')
        return -1;
    int i = (k[3] - '0') * 10 + (k[4] - '0');
    return i < NHOT ? i : -1;
}

static int fn_hot(wq *q, const void *key, size_t len, struct wq_reconcile *out, void *arg)
{
    (void)q;
    struct hot *h = arg;
    int i = hot_index(key, len);
    if (i < 0 || ((const char *)key)[len] != '\0') {
        atomic_fetch_add(&h->bad_key, 1);
        return 0;
    }
    struct hot_key *w = &h->keys[i];
    int now = atomic_fetch_add(&w->inflight, 1) + 1;
    int max = atomic_load(&w->max_inflight);
    while (now > max && !atomic_compare_exchange_weak(&w->max_inflight, &max, now))
        ;
    long long seen = atomic_load(&w->last_add_seq);
    if (seen > atomic_load(&w->last_seen_seq))
        atomic_store(&w->last_seen_seq, seen);
    atomic_fetch_add(&w->calls, 1);
    /* A little work, so an overlap would have a window to show. */
    uint64_t until = t_now_ns() + 20000 + (uint64_t)(seen % 7) * 5000;
    while (t_now_ns() < until)
        ;
    atomic_fetch_sub(&w->inflight, 1);
    snprintf(out->message, sizeof out->message, "seq %lld", seen);
    return 0;
}

static void no_overlap_hot_keys(void **state)
{
    (void)state;
    wq *q = t_create("hot", T_OPTS(.capacity = 64, .max_key_len = 64), NULL);
    const char *name = wq_name(q);
    struct hot *h = t_shared_alloc(sizeof *h);

    /* 100,000 adds and as many reconciles, each a few round trips on
       Redis: three times the time there, for a loaded CI machine (two
       test programs on its two CPUs). */
    unsigned budget_s = (t_redis() ? 75 : 25) * t_scale();
    t_watchdog(budget_s + 30 * t_scale());   /* the default is 30 s */
    pid_t sup = start_supervisor(name, 8, fn_hot, h, &h->rep, budget_s + 15, NULL, NULL);

    pid_t prod = t_fork(budget_s + 5);
    if (prod == 0) {
        wq *pq;
        if (wq_open(name, NULL, &pq) != 0)
            _exit(2);
        uint32_t x = 12345;
        for (long long seq = 1; seq <= NADDS; seq++) {
            x = x * 1103515245u + 12345u;
            int i = (int)((x >> 16) % NHOT);
            char key[8];
            snprintf(key, sizeof key, "hot%02d", i);
            atomic_store(&h->keys[i].last_add_seq, seq);
            int rc = wq_add(pq, key, 5);
            if (rc < 0) {
                t_failf(__FILE__, __LINE__, "producer: wq_add = %d", rc);
                _exit(1);
            }
            atomic_fetch_add(rc == 0 ? &h->adds_new : &h->adds_coalesced, 1);
            if (seq % 64 == 0)
                sleep_ns(20000);   /* let the workers interleave more */
        }
        wq_close(pq);
        _exit(0);
    }
    assert_int_equal(t_wait(prod, (int)budget_s * 1000), 0);
    assert_true(WAIT_UNTIL(quiet(q), 10000));
    stop_supervisor(q, sup, &h->rep);
    T_ASSERT_BOARD_CLEAN();

    assert_int_equal(atomic_load(&h->bad_key), 0);
    assert_int_equal(atomic_load(&h->adds_new) + atomic_load(&h->adds_coalesced), NADDS);
    long total = 0;
    for (int i = 0; i < NHOT; i++) {
        struct hot_key *w = &h->keys[i];
        char key[8];
        snprintf(key, sizeof key, "hot%02d", i);
        if (atomic_load(&w->max_inflight) != 1)
            fail_msg("%s: %d reconciles at once", key, atomic_load(&w->max_inflight));
        assert_int_equal(atomic_load(&w->inflight), 0);
        long long last = atomic_load(&w->last_add_seq);
        assert_true(last > 0);
        if (atomic_load(&w->last_seen_seq) != last)
            fail_msg("%s: last add was #%lld, last reconcile saw #%lld", key, last,
                     atomic_load(&w->last_seen_seq));
        /* Its recorded outcome is that of the reconcile after its last add. */
        struct wq_result r = t_result(q, key);
        char want[32];
        snprintf(want, sizeof want, "seq %lld", last);
        assert_int_equal(r.state, WQ_STATE_SUCCEEDED);
        assert_string_equal(r.message, want);
        assert_int_equal(wq_num_requeues(q, KS(key)), 0);
        total += atomic_load(&w->calls);
    }
    /* Coalescing: never more reconciles than adds that were not merged
       into a key still queued. */
    assert_true(total >= NHOT && total <= atomic_load(&h->adds_new));
    printf("  %d adds (%ld new), %ld reconciles\n", NADDS,
           (long)atomic_load(&h->adds_new), total);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.processing, 0);
    assert_int_equal(st.crash_requeues_total, 0);
    assert_int_equal(st.processes, 1);   /* workers and supervisor closed */
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free(h, sizeof *h);
}

/* ------------------------------------------------------------------ */
/* 2. The long reconcile (OpenKruise, "Learning Concurrent Reconciling") */
/* ------------------------------------------------------------------ */

#define NBACK 200
#define A_NS (200 * 1000000ull)
#define B_NS (5 * 1000000ull)

struct longrun {
    struct sup_report rep;
    atomic_int a_calls;
    atomic_ullong a_start[4], a_end[4];
    atomic_int b_done;
    atomic_int b_calls[NBACK];
    atomic_ullong b_start[NBACK], b_end[NBACK];
    atomic_int bad_key;
    atomic_int backlog_added;   /* A's first run lasts until then + A_NS */
};

static int fn_long(wq *q, const void *key, size_t len, struct wq_reconcile *out, void *arg)
{
    (void)q;
    (void)out;
    struct longrun *L = arg;
    const char *k = key;
    if (key_is(key, len, "A")) {
        int n = atomic_fetch_add(&L->a_calls, 1);
        if (n < 4)
            atomic_store(&L->a_start[n], t_now_ns());
        /* The first run outlasts the adds of the backlog, however slow
           they are (200 round trips to Redis under ASan on a busy CI
           machine took longer than A_NS once). */
        for (int w = 0; n == 0 && !atomic_load(&L->backlog_added) && w < 20000; w++)
            t_sleep_ms(1);
        sleep_ns(A_NS);
        if (n < 4)
            atomic_store(&L->a_end[n], t_now_ns());
        return 0;
    }
    int i = len == 4 && k[0] == 'b' ? atoi(k + 1) : -1;
    if (i < 0 || i >= NBACK) {
        atomic_fetch_add(&L->bad_key, 1);
        return 0;
    }
    atomic_store(&L->b_start[i], t_now_ns());
    sleep_ns(B_NS);
    atomic_store(&L->b_end[i], t_now_ns());
    atomic_fetch_add(&L->b_calls[i], 1);
    atomic_fetch_add(&L->b_done, 1);
    return 0;
}

struct long_times {
    uint64_t readd;        /* A re-added (while processing) */
    uint64_t a1_end;       /* A's first run ended */
    uint64_t a2_start;     /* A's second run started */
    uint64_t last_b_end;   /* the last backlog key finished */
    int b_done_before_a2;  /* backlog keys finished before A's second run */
};

static void long_scenario(unsigned workers, struct long_times *t)
{
    wq *q = t_create("long", T_OPTS(.capacity = 512, .max_key_len = 64), NULL);
    struct longrun *L = t_shared_alloc(sizeof *L);
    pid_t sup = start_supervisor(wq_name(q), workers, fn_long, L, &L->rep, 30, NULL, NULL);

    assert_int_equal(wq_add(q, KS("A")), 0);
    assert_true(WAIT_UNTIL(atomic_load(&L->a_start[0]) != 0, 5000));
    /* A is processing: re-add it, then the backlog arrives. */
    t->readd = t_now_ns();
    assert_int_equal(wq_add(q, KS("A")), 0);
    assert_int_equal(t_result(q, "A").state, WQ_STATE_RUNNING);
    for (int i = 0; i < NBACK; i++) {
        char key[8];
        snprintf(key, sizeof key, "b%03d", i);
        assert_int_equal(wq_add(q, KS(key)), 0);
    }
    atomic_store(&L->backlog_added, 1);
    if (atomic_load(&L->a_end[0]) != 0)
        fail_msg("A's first run ended before the backlog was added: too slow a machine?");

    assert_true(WAIT_UNTIL(atomic_load(&L->a_end[1]) != 0 &&
                           atomic_load(&L->b_done) == NBACK, 15000));
    assert_true(WAIT_UNTIL(quiet(q), 5000));
    t_sleep_ms(50);   /* a third run of A would show now */
    stop_supervisor(q, sup, &L->rep);
    T_ASSERT_BOARD_CLEAN();

    assert_int_equal(atomic_load(&L->bad_key), 0);
    assert_int_equal(atomic_load(&L->a_calls), 2);   /* exactly once more */
    t->a1_end = atomic_load(&L->a_end[0]);
    t->a2_start = atomic_load(&L->a_start[1]);
    t->last_b_end = 0;
    t->b_done_before_a2 = 0;
    for (int i = 0; i < NBACK; i++) {
        assert_int_equal(atomic_load(&L->b_calls[i]), 1);
        uint64_t e = atomic_load(&L->b_end[i]);
        if (e > t->last_b_end)
            t->last_b_end = e;
        t->b_done_before_a2 += e <= t->a2_start;
    }
    assert_true(t->a2_start >= t->a1_end);   /* after its Done */
    struct wq_result r = t_result(q, "A");
    assert_int_equal(r.state, WQ_STATE_SUCCEEDED);
    assert_int_equal(wq_check(q, 0), 0);
    printf("  %u worker(s): A re-run %.0f ms after its re-add; backlog done at "
           "%.0f ms (%d/%d finished before A's re-run)\n", workers,
           (double)(t->a2_start - t->readd) / 1e6,
           (double)(t->last_b_end - t->readd) / 1e6, t->b_done_before_a2, NBACK);
    wq_close(q);
    t_unlink_all();
    t_shared_free(L, sizeof *L);
}

static void long_reconcile_one_worker(void **state)
{
    (void)state;
    struct long_times t;
    long_scenario(1, &t);
    /* The re-added key went to the back: it waited for the whole backlog,
       200 keys of 5 ms each, one after the other. */
    assert_int_equal(t.b_done_before_a2, NBACK);
    assert_true(t.a2_start >= t.last_b_end);
    assert_true(t.a2_start - t.readd >= NBACK * B_NS);
}

static void long_reconcile_four_workers(void **state)
{
    (void)state;
    struct long_times t;
    /* Timing on a loaded machine: up to three attempts for the "before the
       last backlog key finishes" comparison; the rest must hold each time. */
    for (int attempt = 1;; attempt++) {
        long_scenario(4, &t);
        /* Never the full serial wait of a single worker. */
        assert_true(t.a2_start - t.readd < (uint64_t)NBACK * B_NS * t_scale());
        if (t.a2_start < t.last_b_end && t.b_done_before_a2 < NBACK)
            break;
        if (attempt == 3)
            fail_msg("A's second run started after the whole backlog finished "
                     "(%d/%d done) in 3 attempts", t.b_done_before_a2, NBACK);
        printf("  attempt %d: A's re-run came after the backlog; retrying\n", attempt);
    }
}

/* ------------------------------------------------------------------ */
/* 3. Outcome mapping                                                  */
/* ------------------------------------------------------------------ */

#define NREC 16

struct call_rec {
    atomic_ullong start, end;
    atomic_int nreq;       /* wq_num_requeues at the start of the call */
    atomic_int state;      /* wq_result at the start of the call */
    atomic_int code;
    char message[256];
};

struct outkey {
    const char *name;
    atomic_int calls;
    struct call_rec rec[NREC];
};

enum { K_OK, K_NEG, K_C42, K_POS, K_AFTER, K_RECOVER, NOUT };
static const char *const out_names[NOUT] = { "ok", "neg", "c42", "pos", "after", "recover" };

struct outcomes {
    struct sup_report rep;
    atomic_int bad_key;
    struct outkey k[NOUT];
};

static int fn_outcome(wq *q, const void *key, size_t len, struct wq_reconcile *out,
                      void *arg)
{
    struct outcomes *O = arg;
    int id = -1;
    for (int i = 0; i < NOUT; i++)
        if (key_is(key, len, out_names[i]))
            id = i;
    if (id < 0) {
        atomic_fetch_add(&O->bad_key, 1);
        return 0;
    }
    struct outkey *k = &O->k[id];
    int n = atomic_fetch_add(&k->calls, 1);
    struct call_rec *rec = n < NREC ? &k->rec[n] : NULL;
    if (rec) {
        struct wq_result r;
        atomic_store(&rec->start, t_now_ns());
        atomic_store(&rec->nreq, wq_num_requeues(q, key, len));
        if (wq_result(q, key, len, &r) == 0) {
            atomic_store(&rec->state, (int)r.state);
            atomic_store(&rec->code, r.code);
            snprintf(rec->message, sizeof rec->message, "%s", r.message);
        } else {
            atomic_store(&rec->state, -1);
        }
    }
    int rc = 0;
    switch (id) {
    case K_OK:
        snprintf(out->message, sizeof out->message, "fine");
        break;
    case K_NEG:
        snprintf(out->message, sizeof out->message, "neg failed");
        rc = -5;
        break;
    case K_C42:
        out->code = 42;
        snprintf(out->message, sizeof out->message, "c42");
        rc = -1;
        break;
    case K_POS:
        snprintf(out->message, sizeof out->message, "positive");
        rc = 1;
        break;
    case K_AFTER:
        if (n == 0) {   /* a failure first, so that forgetting shows */
            snprintf(out->message, sizeof out->message, "first failure");
            rc = -3;
        } else if (n == 1) {
            out->requeue_after_ns = 50 * MS;
            snprintf(out->message, sizeof out->message, "again");
        } else {
            snprintf(out->message, sizeof out->message, "after done");
        }
        break;
    case K_RECOVER:
        if (n < 2) {
            snprintf(out->message, sizeof out->message, "not yet");
            rc = -7;
        } else {
            snprintf(out->message, sizeof out->message, "recovered");
        }
        break;
    }
    if (rec)
        atomic_store(&rec->end, t_now_ns());
    return rc;
}

static void check_rec(struct outkey *k, int n, int nreq, enum wq_state st, int code,
                      const char *msg)
{
    struct call_rec *r = &k->rec[n];
    if (atomic_load(&r->nreq) != nreq || atomic_load(&r->state) != (int)st ||
        atomic_load(&r->code) != code || strcmp(r->message, msg) != 0)
        fail_msg("%s call #%d saw num_requeues %d, result {state %d, code %d, '%s'}; "
                 "expected %d, {%d, %d, '%s'}", k->name, n, atomic_load(&r->nreq),
                 atomic_load(&r->state), atomic_load(&r->code), r->message, nreq,
                 (int)st, code, msg);
}

static void check_final(wq *q, const char *key, enum wq_state st, int code, const char *msg)
{
    struct wq_result r = t_result(q, key);
    if (r.state != st || r.code != code || strcmp(r.message, msg) != 0)
        fail_msg("%s: final result {state %d, code %d, '%s'}, expected {%d, %d, '%s'}",
                 key, (int)r.state, r.code, r.message, (int)st, code, msg);
}

/* The state a key that failed in each of its `calls` runs is left in
   after stop_supervisor (see outcome_mapping). */
static enum wq_state failed_state(wq *q, const char *key, int calls)
{
    if (!t_redis())
        return WQ_STATE_FAILED;
    int nreq = wq_num_requeues(q, key, strlen(key));
    if (nreq != calls && nreq != calls - 1)
        fail_msg("%s: %d runs, all failed, but %d requeues", key, calls, nreq);
    return nreq == calls ? WQ_STATE_PENDING : WQ_STATE_FAILED;
}

static void outcome_mapping(void **state)
{
    (void)state;
    struct wq_options o = { .capacity = 64, .max_key_len = 64,
                            .rl_base_delay_ns = 1 * MS, .rl_max_delay_ns = 100 * MS,
                            .rl_limiters = WQ_RL_EXPONENTIAL };
    wq *q = t_create("outcome", &o, NULL);
    struct outcomes *O = t_shared_alloc(sizeof *O);
    for (int i = 0; i < NOUT; i++)
        O->k[i].name = out_names[i];   /* static strings: same address in children */

    pid_t sup = start_supervisor(wq_name(q), 2, fn_outcome, O, &O->rep, 30, NULL, NULL);
    for (int i = 0; i < NOUT; i++)
        assert_int_equal(wq_add(q, KS(out_names[i])), 0);

#define CALLS(i) atomic_load(&O->k[i].calls)
    assert_true(WAIT_UNTIL(CALLS(K_OK) >= 1 && CALLS(K_NEG) >= 4 && CALLS(K_C42) >= 2 &&
                           CALLS(K_POS) >= 2 && CALLS(K_AFTER) >= 3 &&
                           CALLS(K_RECOVER) >= 3, 10000));
    /* Let the last runs of the keys that end in success finish. */
    assert_true(WAIT_UNTIL(t_result(q, "after").state == WQ_STATE_SUCCEEDED &&
                           t_result(q, "recover").state == WQ_STATE_SUCCEEDED &&
                           t_result(q, "ok").state == WQ_STATE_SUCCEEDED, 5000));
    /* While they run: "ok" is done and forgotten. */
    check_final(q, "ok", WQ_STATE_SUCCEEDED, 0, "fine");
    assert_int_equal(wq_num_requeues(q, KS("ok")), 0);
    /* The failing keys keep failing, with a rising count. */
    assert_true(wq_num_requeues(q, KS("neg")) >= 3);
    t_sleep_ms(120);   /* a spurious re-run of "after" or "recover" would show */
    stop_supervisor(q, sup, &O->rep);
    T_ASSERT_BOARD_CLEAN();
    assert_int_equal(atomic_load(&O->bad_key), 0);

    /* 0 -> SUCCEEDED with the message, forgotten, not re-run. */
    assert_int_equal(CALLS(K_OK), 1);
    check_rec(&O->k[K_OK], 0, 0, WQ_STATE_RUNNING, 0, "");
    check_final(q, "ok", WQ_STATE_SUCCEEDED, 0, "fine");
    assert_int_equal(wq_num_requeues(q, KS("ok")), 0);

    /* A failed key waits for its retry. Shutdown drops waiting keys of a
       queue without a store (FAILED is what is left), Redis keeps them
       (wq_shutdown in wq.h): PENDING, with the outcome that made it wait.
       Unless the shutdown came as its last run ended, between the
       reconcile and the pool's wq_add_rate_limited, which it refuses:
       then the key has one requeue fewer than runs, and is FAILED. */
#define FAILED(name, i) failed_state(q, name, CALLS(i))

    /* -5 with out->code 0 -> FAILED -5, re-added rate limited: each run
       sees one more failure than the one before. */
    check_rec(&O->k[K_NEG], 0, 0, WQ_STATE_RUNNING, 0, "");
    for (int n = 1; n < CALLS(K_NEG) && n < NREC; n++) {
        check_rec(&O->k[K_NEG], n, n, WQ_STATE_RUNNING, -5, "neg failed");
        assert_true(atomic_load(&O->k[K_NEG].rec[n].start) >=
                    atomic_load(&O->k[K_NEG].rec[n - 1].end));
    }
    check_final(q, "neg", FAILED("neg", K_NEG), -5, "neg failed");
    assert_true(wq_num_requeues(q, KS("neg")) >= CALLS(K_NEG) - 1);

    /* out->code wins over the negative return. */
    check_rec(&O->k[K_C42], 1, 1, WQ_STATE_RUNNING, 42, "c42");
    check_final(q, "c42", FAILED("c42", K_C42), 42, "c42");
    assert_true(wq_num_requeues(q, KS("c42")) >= 1);

    /* A positive return is reserved: FAILED -EINVAL, retried. */
    check_rec(&O->k[K_POS], 1, 1, WQ_STATE_RUNNING, -EINVAL, "positive");
    check_final(q, "pos", FAILED("pos", K_POS), -EINVAL, "positive");
    assert_true(wq_num_requeues(q, KS("pos")) >= 1);

    /* requeue_after: SUCCEEDED, forgotten, reconciled again >= 50 ms after. */
    assert_int_equal(CALLS(K_AFTER), 3);
    check_rec(&O->k[K_AFTER], 1, 1, WQ_STATE_RUNNING, -3, "first failure");
    check_rec(&O->k[K_AFTER], 2, 0, WQ_STATE_RUNNING, 0, "again");
    uint64_t gap = atomic_load(&O->k[K_AFTER].rec[2].start) -
                   atomic_load(&O->k[K_AFTER].rec[1].end);
    if (gap < 50 * (uint64_t)MS)
        fail_msg("requeue_after 50 ms: re-run after %.1f ms", (double)gap / 1e6);
    check_final(q, "after", WQ_STATE_SUCCEEDED, 0, "after done");
    assert_int_equal(wq_num_requeues(q, KS("after")), 0);

    /* Failures, then success: forgotten. */
    assert_int_equal(CALLS(K_RECOVER), 3);
    check_rec(&O->k[K_RECOVER], 1, 1, WQ_STATE_RUNNING, -7, "not yet");
    check_rec(&O->k[K_RECOVER], 2, 2, WQ_STATE_RUNNING, -7, "not yet");
    check_final(q, "recover", WQ_STATE_SUCCEEDED, 0, "recovered");
    assert_int_equal(wq_num_requeues(q, KS("recover")), 0);
#undef FAILED
#undef CALLS

    struct wq_stats st = t_stats(q);
    assert_int_equal(st.processing, 0);
    assert_int_equal(st.crash_requeues_total, 0);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free(O, sizeof *O);
}

/* ------------------------------------------------------------------ */
/* 4. Crashing workers                                                 */
/* ------------------------------------------------------------------ */

#define NCALLS 64

struct crashy {
    struct sup_report rep;
    atomic_int boomed;             /* the first "boom" call kills itself */
    atomic_int crash_pid;
    atomic_int overlap;            /* a key entered while its holder lived */
    atomic_int holder[32];         /* per key: pid inside fn, 0 if none */
    atomic_int calls[32];
    atomic_int ncalls;             /* log of every call */
    atomic_int call_key[NCALLS];
    atomic_int call_pid[NCALLS];
    atomic_ullong call_ns[NCALLS];
    atomic_int call_nreq[NCALLS];
    atomic_int boom_dead_at_rerun; /* 1: crashed holder dead at the re-run */
    atomic_int bad_key;
    unsigned work_ms;
};

/* Keys: "boom", "loop", "k00".."k29". */
static int crash_index(const void *key, size_t len)
{
    const char *k = key;
    if (key_is(key, len, "boom"))
        return 30;
    if (key_is(key, len, "loop"))
        return 31;
    if (len == 3 && k[0] == 'k' && k[1] >= '0' && k[1] <= '2' && k[2] >= '0' && k[2] <= '9')
        return (k[1] - '0') * 10 + (k[2] - '0');
    return -1;
}

static int fn_crashy(wq *q, const void *key, size_t len, struct wq_reconcile *out,
                     void *arg)
{
    struct crashy *C = arg;
    int i = crash_index(key, len);
    if (i < 0) {
        atomic_fetch_add(&C->bad_key, 1);
        return 0;
    }
    pid_t me = getpid();
    int prev = atomic_exchange(&C->holder[i], me);
    if (prev != 0 && !pid_dead(prev))
        atomic_fetch_add(&C->overlap, 1);
    int n = atomic_fetch_add(&C->ncalls, 1);
    if (n < NCALLS) {
        atomic_store(&C->call_key[n], i);
        atomic_store(&C->call_pid[n], me);
        atomic_store(&C->call_ns[n], t_now_ns());
        atomic_store(&C->call_nreq[n], wq_num_requeues(q, key, len));
    }
    atomic_fetch_add(&C->calls[i], 1);
    if (i == 31)
        _exit(3);   /* "loop": crashes every time */
    if (i == 30) {
        if (atomic_exchange(&C->boomed, 1) == 0) {
            atomic_store(&C->crash_pid, me);
            raise(SIGKILL);
        }
        atomic_store(&C->boom_dead_at_rerun, prev == atomic_load(&C->crash_pid) &&
                                             pid_dead(prev) ? 1 : -1);
    }
    if (C->work_ms)
        t_sleep_ms(C->work_ms);
    snprintf(out->message, sizeof out->message, "by %ld", (long)me);
    int expect = me;
    atomic_compare_exchange_strong(&C->holder[i], &expect, 0);
    return 0;
}

static int first_call_of(struct crashy *C, int key, int nth)
{
    int n = atomic_load(&C->ncalls);
    for (int c = 0; c < n && c < NCALLS; c++)
        if (atomic_load(&C->call_key[c]) == key && nth-- == 0)
            return c;
    return -1;
}

static void crash_scenario(unsigned workers, unsigned work_ms, int nkeys)
{
    wq *q = t_create("crash", T_OPTS(.capacity = 64, .max_key_len = 64), NULL);
    struct crashy *C = t_shared_alloc(sizeof *C);
    C->work_ms = work_ms;
    pid_t sup = start_supervisor(wq_name(q), workers, fn_crashy, C, &C->rep, 30, NULL, NULL);

    char key[16];
    for (int i = 0; i < nkeys; i++) {
        snprintf(key, sizeof key, "k%02d", i);
        assert_int_equal(wq_add(q, KS(key)), 0);
        if (i == nkeys / 4)
            assert_int_equal(wq_add(q, KS("boom")), 0);
    }
    assert_true(WAIT_UNTIL(atomic_load(&C->calls[30]) >= 2 && quiet(q), 10000));
    t_sleep_ms(50);
    stop_supervisor(q, sup, &C->rep);
    T_ASSERT_BOARD_CLEAN();

    assert_int_equal(atomic_load(&C->bad_key), 0);
    assert_int_equal(atomic_load(&C->overlap), 0);
    assert_int_equal(atomic_load(&C->calls[30]), 2);   /* crashed once, then done */
    for (int i = 0; i < nkeys; i++)
        assert_int_equal(atomic_load(&C->calls[i]), 1);
    assert_int_equal(atomic_load(&C->boom_dead_at_rerun), 1);
    int c1 = first_call_of(C, 30, 0), c2 = first_call_of(C, 30, 1);
    assert_true(c1 >= 0 && c2 > c1);
    pid_t crashed = atomic_load(&C->crash_pid);
    assert_int_equal(atomic_load(&C->call_pid[c1]), crashed);
    assert_int_not_equal(atomic_load(&C->call_pid[c2]), crashed);
    /* The crash requeue went through the rate limiter. */
    assert_int_equal(atomic_load(&C->call_nreq[c1]), 0);
    assert_int_equal(atomic_load(&C->call_nreq[c2]), 1);
    if (workers == 1) {
        /* Only a replacement could run it again, after the backoff; and
           it ran everything that came after the crash. */
        uint64_t gap = atomic_load(&C->call_ns[c2]) - atomic_load(&C->call_ns[c1]);
        if (gap < 100 * (uint64_t)MS)
            fail_msg("replacement ran %.1f ms after the crash (backoff 100 ms)",
                     (double)gap / 1e6);
        int n = atomic_load(&C->ncalls);
        assert_int_equal(n, nkeys + 2);
        for (int c = c1 + 1; c < n; c++)
            assert_int_equal(atomic_load(&C->call_pid[c]), atomic_load(&C->call_pid[c2]));
        assert_true(n - c1 - 1 > 1);   /* the replacement ran other keys too */
    }
    struct wq_result r = t_result(q, "boom");
    assert_int_equal(r.state, WQ_STATE_SUCCEEDED);
    assert_int_equal(wq_num_requeues(q, KS("boom")), 0);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.crash_requeues_total, 1);
    assert_int_equal(st.processing, 0);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free(C, sizeof *C);
}

static void crashed_worker_replaced(void **state)
{
    (void)state;
    crash_scenario(1, 0, 8);
}

static void crashed_key_never_twice(void **state)
{
    (void)state;
    crash_scenario(3, 10, 24);
}

static void crash_loop_backs_off(void **state)
{
    (void)state;
    struct wq_options o = { .capacity = 16, .max_key_len = 64,
                            .rl_base_delay_ns = 1 * MS, .rl_max_delay_ns = 50 * MS };
    wq *q = t_create("loop", &o, NULL);
    struct crashy *C = t_shared_alloc(sizeof *C);
    pid_t sup = start_supervisor(wq_name(q), 1, fn_crashy, C, &C->rep, 30, NULL, NULL);

    assert_int_equal(wq_add(q, KS("loop")), 0);
    assert_true(WAIT_UNTIL(atomic_load(&C->calls[31]) >= 1, 5000));
    uint64_t first = atomic_load(&C->call_ns[0]);
    uint64_t until = first + 1500 * (uint64_t)MS, now = t_now_ns();
    if (until > now)
        sleep_ns(until - now);
    int seen = atomic_load(&C->calls[31]);
    /* Restarts at +100, +300, +700, +1500 ms: at most 5 calls in 1.5 s. */
    printf("  %d calls in 1.5 s\n", seen);
    assert_true(seen <= 5);
    /* And it is restarted (slow machines: give it time). */
    assert_true(WAIT_UNTIL(atomic_load(&C->calls[31]) >= 3, 3000));
    stop_supervisor(q, sup, &C->rep);
    T_ASSERT_BOARD_CLEAN();
    int calls = atomic_load(&C->calls[31]);
    assert_true(calls <= (seen > 3 ? seen : 3) + 1);
    uint64_t backoff = 100 * (uint64_t)MS;
    for (int c = 0; c < calls && c < NCALLS; c++) {
        assert_int_equal(atomic_load(&C->call_key[c]), 31);
        /* Each crash was a failure: the count rose every time. */
        assert_int_equal(atomic_load(&C->call_nreq[c]), c);
        if (c > 0) {
            uint64_t gap = atomic_load(&C->call_ns[c]) - atomic_load(&C->call_ns[c - 1]);
            if (gap < backoff)
                fail_msg("restart %d after %.1f ms, backoff is %.0f ms", c,
                         (double)gap / 1e6, (double)backoff / 1e6);
            backoff *= 2;
        }
        if (c > 0)
            assert_int_not_equal(atomic_load(&C->call_pid[c]),
                                 atomic_load(&C->call_pid[c - 1]));
    }
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.crash_requeues_total, (uint64_t)calls);
    assert_int_equal(wq_num_requeues(q, KS("loop")), calls);
    assert_int_equal(st.processing, 0);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free(C, sizeof *C);
}

/* ------------------------------------------------------------------ */
/* 5. Signals                                                          */
/* ------------------------------------------------------------------ */

#define NSIG_KEYS 20

struct sigrun {
    struct sup_report rep;
    uint64_t work_ns;
    atomic_int started, done;
    atomic_int starts[NSIG_KEYS], ends[NSIG_KEYS];
    atomic_int pid[NSIG_KEYS];
    atomic_int bad_key;
};

static int fn_sig(wq *q, const void *key, size_t len, struct wq_reconcile *out, void *arg)
{
    (void)q;
    (void)out;
    struct sigrun *S = arg;
    const char *k = key;
    int i = len == 3 && k[0] == 's' ? atoi(k + 1) : -1;
    if (i < 0 || i >= NSIG_KEYS) {
        atomic_fetch_add(&S->bad_key, 1);
        return 0;
    }
    atomic_store(&S->pid[i], getpid());
    atomic_fetch_add(&S->starts[i], 1);
    atomic_fetch_add(&S->started, 1);
    sleep_ns(S->work_ns);
    atomic_fetch_add(&S->ends[i], 1);
    atomic_fetch_add(&S->done, 1);
    return 0;
}

/* Has pid taken sig off its pending set (consumed it)? /proc/PID/status
   lists pending signals per thread (SigPnd) and per process (ShdPnd). */
static bool signal_consumed(pid_t pid, int sig)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    bool pending = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long long mask;
        if ((sscanf(line, "SigPnd: %llx", &mask) == 1 || sscanf(line, "ShdPnd: %llx", &mask) == 1) &&
            (mask >> (sig - 1) & 1))
            pending = true;
    }
    fclose(f);
    return !pending;
}

/* The first SIGTERM stops this pool, not the queue: each worker finishes
   the key it holds and exits, the supervisor returns 0; the keys not
   started stay queued, the queue is not shut down and accepts adds, and
   nothing counts as a crash. (It used to shut the queue down for every
   process attached, for good.) */
static void sigterm_stops_pool(void **state)
{
    (void)state;
    wq *q = t_create("term", T_OPTS(.capacity = 64, .max_key_len = 64), NULL);
    struct sigrun *S = t_shared_alloc(sizeof *S);
    S->work_ns = 20 * MS;
    char key[8];
    for (int i = 0; i < NSIG_KEYS; i++) {
        snprintf(key, sizeof key, "s%02d", i);
        assert_int_equal(wq_add(q, KS(key)), 0);
    }
    pid_t sup = start_supervisor(wq_name(q), 2, fn_sig, S, &S->rep, 30, NULL, NULL);
    assert_true(WAIT_UNTIL(atomic_load(&S->done) >= 3, 5000));
    assert_int_equal(kill(sup, SIGTERM), 0);
    int st = t_wait(sup, 10000);
    assert_int_equal(atomic_load(&S->rep.returned), 1);
    assert_int_equal(atomic_load(&S->rep.rc), 0);
    assert_int_equal(st, 0);
    assert_int_equal(atomic_load(&S->rep.restored), 1);
    T_ASSERT_BOARD_CLEAN();
    assert_int_equal(atomic_load(&S->bad_key), 0);

    /* Every key that started finished once; the rest were never started
       and wait, queued, for the next consumer. */
    int finished = 0;
    for (int i = 0; i < NSIG_KEYS; i++) {
        snprintf(key, sizeof key, "s%02d", i);
        assert_int_equal(atomic_load(&S->starts[i]), atomic_load(&S->ends[i]));
        assert_true(atomic_load(&S->ends[i]) <= 1);
        enum wq_state want = atomic_load(&S->ends[i]) ? WQ_STATE_SUCCEEDED : WQ_STATE_PENDING;
        assert_int_equal(t_result(q, key).state, want);
        finished += atomic_load(&S->ends[i]);
    }
    assert_true(finished >= 3 && finished < NSIG_KEYS);
    assert_false(wq_shutting_down(q));
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.processing, 0);
    assert_int_equal(s.queued, (uint64_t)(NSIG_KEYS - finished));
    assert_int_equal(s.shutting_down, 0);
    assert_int_equal(s.crash_requeues_total, 0);
    assert_int_equal(s.processes, 1);
    assert_int_equal(wq_add(q, KS("late")), 0);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free(S, sizeof *S);
}

/* A stop that comes while a worker waits in wq_finish_get for its next
   key: the key it is then handed is reconciled and finished, not taken
   and put back at the end of the queue (a worker finishes the key it
   holds; the queue's order stays). */
struct stopwait {
    struct sup_report rep;
    atomic_int calls_a, calls_b, other;
};

static int fn_stopwait(wq *q, const void *key, size_t len, struct wq_reconcile *out, void *arg)
{
    struct stopwait *S = arg;
    (void)out;
    if (len == 1 && memcmp(key, "A", 1) == 0) {
        /* B is ready while the worker waits for its next key. */
        int rc = wq_add_after(q, "B", 1, 150 * MS);
        if (rc != 0)
            t_failf(__FILE__, __LINE__, "worker: wq_add_after(B) = %d", rc);
        atomic_fetch_add(&S->calls_a, 1);
    } else if (len == 1 && memcmp(key, "B", 1) == 0) {
        atomic_fetch_add(&S->calls_b, 1);
    } else {
        atomic_fetch_add(&S->other, 1);
    }
    return 0;
}

static void sigterm_while_waiting(void **state)
{
    (void)state;
    wq *q = t_create("termwait", T_OPTS(.capacity = 16, .max_key_len = 16), NULL);
    struct stopwait *S = t_shared_alloc(sizeof *S);
    assert_int_equal(wq_add(q, KS("A")), 0);
    pid_t sup = start_supervisor(wq_name(q), 1, fn_stopwait, S, &S->rep, 30, NULL, NULL);
    /* A's outcome is recorded by the wq_finish_get that then waits for B:
       the stop comes during that wait (or, on a slow machine, after B was
       handed out, which passes without testing much). */
    assert_true(WAIT_UNTIL(t_result(q, "A").state == WQ_STATE_SUCCEEDED, 5000));
    assert_int_equal(kill(sup, SIGTERM), 0);
    assert_int_equal(t_wait(sup, 10000), 0);
    assert_int_equal(atomic_load(&S->rep.returned), 1);
    assert_int_equal(atomic_load(&S->rep.rc), 0);
    assert_int_equal(atomic_load(&S->calls_a), 1);
    assert_int_equal(atomic_load(&S->calls_b), 1);
    assert_int_equal(atomic_load(&S->other), 0);
    assert_int_equal(t_result(q, "A").state, WQ_STATE_SUCCEEDED);
    assert_int_equal(t_result(q, "B").state, WQ_STATE_SUCCEEDED);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.live, 0);
    assert_int_equal(s.crash_requeues_total, 0);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free(S, sizeof *S);
}

struct owners {
    pid_t pid[8];
    int n;
};

static int collect_owners(const struct wq_key_info *info, void *arg)
{
    struct owners *o = arg;
    if ((info->state & WQ_KEY_PROCESSING) && o->n < 8)
        o->pid[o->n++] = info->owner_pid;
    return 0;
}

static void second_sigterm_kills(void **state)
{
    (void)state;
    wq *q = t_create("term2", T_OPTS(.capacity = 64, .max_key_len = 64), NULL);
    struct sigrun *S = t_shared_alloc(sizeof *S);
    S->work_ns = 2 * SEC;
    char key[8];
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "s%02d", i);
        assert_int_equal(wq_add(q, KS(key)), 0);
    }
    pid_t sup = start_supervisor(wq_name(q), 2, fn_sig, S, &S->rep, 30, NULL, NULL);
    assert_true(WAIT_UNTIL(atomic_load(&S->started) == 2, 5000));

    struct owners own = { .n = 0 };
    assert_int_equal(wq_dump(q, collect_owners, &own), 0);
    assert_int_equal(own.n, 2);
    assert_int_not_equal(own.pid[0], own.pid[1]);
    for (int k = 0; k < 2; k++) {
        assert_true(own.pid[k] != sup && own.pid[k] != getpid());
        assert_int_equal(kill(own.pid[k], 0), 0);
        assert_true(own.pid[k] == atomic_load(&S->pid[0]) ||
                    own.pid[k] == atomic_load(&S->pid[1]));
    }

    /* First SIGTERM: the pool stops after the keys in hand (wait until
       the supervisor took it, or the two signals could merge into one
       pending SIGTERM); the queue is not shut down. */
    assert_int_equal(kill(sup, SIGTERM), 0);
    assert_true(WAIT_UNTIL(signal_consumed(sup, SIGTERM), 2000));
    t_sleep_ms(20);
    assert_int_equal(atomic_load(&S->rep.returned), 0);   /* workers finishing */
    assert_false(wq_shutting_down(q));
    uint64_t t0 = t_now_ns();
    assert_int_equal(kill(sup, SIGTERM), 0);
    int st = t_wait(sup, 5000);
    uint64_t took = t_now_ns() - t0;
    assert_int_equal(atomic_load(&S->rep.returned), 1);
    assert_int_equal(atomic_load(&S->rep.rc), -EINTR);
    assert_int_equal(st, 1);
    assert_int_equal(atomic_load(&S->rep.restored), 1);
    if (took >= 1000 * (uint64_t)MS * t_scale())
        fail_msg("second SIGTERM: wq_run_workers returned after %.0f ms", (double)took / 1e6);
    T_ASSERT_BOARD_CLEAN();

    /* The workers are gone (reaped by the supervisor). */
    for (int k = 0; k < 2; k++) {
        errno = 0;
        assert_int_equal(kill(own.pid[k], 0), -1);
        assert_int_equal(errno, ESRCH);
    }
    /* Nothing finished; the two killed keys went back to the queue as on
       a close: a stop the operator chose is not counted as the keys'
       failure (wq.h, wq_run_workers). */
    assert_int_equal(atomic_load(&S->done), 0);
    assert_int_equal(atomic_load(&S->started), 2);
    struct wq_stats s = t_stats(q);
    assert_int_equal(s.processing, 0);
    assert_int_equal(s.crash_requeues_total, 0);
    assert_int_equal(s.queued, 4);
    assert_int_equal(s.shutting_down, 0);
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "s%02d", i);
        struct wq_result r = t_result(q, key);
        if (r.state != WQ_STATE_PENDING)
            fail_msg("%s: state %d after the kill, expected PENDING", key, (int)r.state);
        assert_int_equal(wq_num_requeues(q, KS(key)), 0);
    }
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free(S, sizeof *S);
}

/* ------------------------------------------------------------------ */
/* 6. Only its own workers                                             */
/* ------------------------------------------------------------------ */

struct strangers {
    struct sup_report rep;
    atomic_int sleeper, quick;  /* the unrelated children's pids */
    atomic_ullong forked_ns;
    atomic_int sleeper_alive_after;   /* waitpid WNOHANG == 0 after return */
    atomic_int quick_reaped_by_us;    /* waitpid == quick, exit 5 */
    atomic_int sleeper_reaped_by_us;  /* after SIGKILL: waitpid == sleeper */
    atomic_int done;
};

static void strangers_hook(void *arg, int phase)
{
    struct strangers *X = arg;
    if (phase == 0) {
        atomic_store(&X->forked_ns, t_now_ns());
        pid_t s = fork();
        if (s == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);   /* if the test fails early */
            sleep_ns(3 * SEC * t_scale());
            _exit(7);
        }
        pid_t k = fork();
        if (k == 0)
            _exit(5);
        atomic_store(&X->sleeper, s);
        atomic_store(&X->quick, k);
        t_sleep_ms(20);   /* the quick one is a zombie before the pool starts */
        return;
    }
    pid_t s = atomic_load(&X->sleeper), k = atomic_load(&X->quick);
    int st = 0;
    atomic_store(&X->sleeper_alive_after, waitpid(s, &st, WNOHANG) == 0 ? 1 : -1);
    atomic_store(&X->quick_reaped_by_us,
                 waitpid(k, &st, WNOHANG) == k && WIFEXITED(st) && WEXITSTATUS(st) == 5
                     ? 1 : -1);
    kill(s, SIGKILL);
    atomic_store(&X->sleeper_reaped_by_us,
                 waitpid(s, &st, 0) == s && WIFSIGNALED(st) ? 1 : -1);
}

static int fn_count(wq *q, const void *key, size_t len, struct wq_reconcile *out, void *arg)
{
    (void)q;
    (void)key;
    (void)len;
    (void)out;
    struct strangers *X = arg;
    t_sleep_ms(5);
    atomic_fetch_add(&X->done, 1);
    return 0;
}

static void waits_only_for_own_workers(void **state)
{
    (void)state;
    wq *q = t_create("strangers", T_OPTS(.capacity = 16, .max_key_len = 64), NULL);
    struct strangers *X = t_shared_alloc(sizeof *X);
    pid_t sup = start_supervisor(wq_name(q), 2, fn_count, X, &X->rep, 30,
                                 strangers_hook, X);
    char key[8];
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof key, "x%d", i);
        assert_int_equal(wq_add(q, KS(key)), 0);
    }
    assert_true(WAIT_UNTIL(atomic_load(&X->done) == 5 && quiet(q), 5000));
    stop_supervisor(q, sup, &X->rep);
    T_ASSERT_BOARD_CLEAN();

    uint64_t ret_after = atomic_load(&X->rep.returned_ns) - atomic_load(&X->forked_ns);
    printf("  wq_run_workers returned %.0f ms after the unrelated children were forked\n",
           (double)ret_after / 1e6);
    /* It did not wait for the sleeper (3 s). */
    assert_true(ret_after < 3 * (uint64_t)SEC * t_scale());
    assert_int_equal(atomic_load(&X->sleeper_alive_after), 1);
    assert_int_equal(atomic_load(&X->quick_reaped_by_us), 1);
    assert_int_equal(atomic_load(&X->sleeper_reaped_by_us), 1);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free(X, sizeof *X);
}

/* ------------------------------------------------------------------ */
/* 7. Restarts, batches, giving up, timeouts, hooks                    */
/* ------------------------------------------------------------------ */

#define R_KEYS 40

/* The witness of the restart test: per key, the sequence number of its
   last add (announced before wq_add) and the highest one a reconcile saw
   start (read when it starts); a global counter orders them. */
struct restarts {
    atomic_ullong seq;
    atomic_ullong last_add[R_KEYS], seen[R_KEYS];
    atomic_int stop_producer, bad;
    struct sup_report rep;
};

static int fn_restart(wq *q, const void *key, size_t len, struct wq_reconcile *out, void *arg)
{
    (void)q;
    (void)out;
    (void)len;
    struct restarts *R = arg;
    int i = atoi((const char *)key + 1);
    if (i < 0 || i >= R_KEYS) {
        atomic_fetch_add(&R->bad, 1);
        return 0;
    }
    unsigned long long now = atomic_fetch_add(&R->seq, 1);
    unsigned long long prev = atomic_load(&R->seen[i]);
    while (prev < now && !atomic_compare_exchange_weak(&R->seen[i], &prev, now))
        ;
    sleep_ns(2 * MS);
    return 0;
}

/* A pool restarted three times (SIGTERM, as systemctl restart sends)
   while a producer keeps adding: the queue is never shut down, nothing is
   lost, and every key is processed after its last add. */
static void restarts_lose_nothing(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("restarts", T_OPTS(.capacity = 128, .max_key_len = 16), &name);
    struct restarts *R = t_shared_alloc(sizeof *R);
    atomic_store(&R->seq, 1);
    pid_t prod = t_fork(60);
    if (prod == 0) {
        wq *pq;
        if (wq_open(name, NULL, &pq) < 0)
            _exit(1);
        unsigned x = 1;
        while (!atomic_load(&R->stop_producer)) {
            x = x * 1103515245u + 12345u;
            int i = (int)((x >> 16) % R_KEYS);
            char k[8];
            int n = snprintf(k, sizeof k, "r%d", i);
            atomic_store(&R->last_add[i], atomic_fetch_add(&R->seq, 1));
            if (wq_add(pq, k, (size_t)n) < 0)
                _exit(2);
            usleep(500);
        }
        wq_close(pq);
        _exit(0);
    }
    for (int round = 0; round < 4; round++) {
        memset(&R->rep, 0, sizeof R->rep);
        pid_t sup = start_supervisor(name, 2, fn_restart, R, &R->rep, 30, NULL, NULL);
        t_sleep_ms(150);
        if (round < 3) {   /* a restart: SIGTERM, the next one starts */
            assert_int_equal(kill(sup, SIGTERM), 0);
            assert_int_equal(t_wait(sup, 10000), 0);
            assert_int_equal(atomic_load(&R->rep.rc), 0);
            assert_false(wq_shutting_down(q));
            continue;
        }
        /* The last one: the producer stops, the pool finishes the rest. */
        atomic_store(&R->stop_producer, 1);
        assert_int_equal(t_wait(prod, 10000), 0);
        struct wq_stats st;
        for (int i = 0; i < 2000; i++) {
            st = t_stats(q);
            if (st.queued == 0 && st.processing == 0)
                break;
            t_sleep_ms(5);
        }
        assert_int_equal(st.queued, 0);
        assert_int_equal(st.processing, 0);
        stop_supervisor(q, sup, &R->rep);
    }
    assert_int_equal(atomic_load(&R->bad), 0);
    for (int i = 0; i < R_KEYS; i++) {
        unsigned long long a = atomic_load(&R->last_add[i]), s = atomic_load(&R->seen[i]);
        if (a && s < a)
            fail_msg("key r%d: last added at %llu, last processing started at %llu", i, a, s);
    }
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.crash_requeues_total, 0);
    t_check_clean(q, "after three restarts");
    wq_close(q);
    t_shared_free(R, sizeof *R);
}

struct opts_run {
    atomic_int calls[8];
    atomic_int forks;               /* after_fork calls */
    atomic_int names_ok;
    struct sup_report rep;
    struct wq_pool_options po;
    int rc;
    atomic_int returned;
};

static int fn_opts(wq *q, const void *key, size_t len, struct wq_reconcile *out, void *arg)
{
    (void)q;
    (void)len;
    struct opts_run *O = arg;
    const char *k = key;
    int i = k[1] - '0';
    if (i >= 0 && i < 8)
        atomic_fetch_add(&O->calls[i], 1);
    if (k[0] == 'f') {   /* always fails */
        snprintf(out->message, sizeof out->message, "attempt %d", atomic_load(&O->calls[i]));
        return -EIO;
    }
    if (k[0] == 's')     /* overruns any timeout */
        sleep_ns(5 * SEC);
    return 0;
}

static void after_fork_hook(wq *q, unsigned worker, void *arg)
{
    (void)q;
    struct opts_run *O = arg;
    atomic_fetch_add(&O->forks, 1);
    char comm[32] = "";
    prctl(PR_GET_NAME, comm);
    char want[32];
    snprintf(want, sizeof want, "batch-w%u", worker);
    if (strcmp(comm, want) == 0)
        atomic_fetch_add(&O->names_ok, 1);
}

/* Run wq_run_workers_opts in a child; its return code and options back. */
static pid_t start_opts(const char *name, unsigned workers, struct opts_run *O)
{
    pid_t pid = t_fork(60);
    if (pid != 0)
        return pid;
    wq *sq;
    if (wq_open(name, NULL, &sq) != 0)
        _exit(2);
    O->rc = wq_run_workers_opts(sq, workers, fn_opts, O, &O->po);
    atomic_store(&O->returned, 1);
    wq_close(sq);
    _exit(0);
}

/* A batch job: until_empty returns once nothing is queued, processing or
   waiting; a key that keeps failing is given up after max_attempts with
   its FAILED result kept; every worker ran after_fork with its number
   and is named for ps. */
static void batch_until_empty_gives_up(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("batch", T_OPTS(.capacity = 32, .max_key_len = 16,
                                     .rl_base_delay_ns = 1 * MS), &name);
    struct opts_run *O = t_shared_alloc(sizeof *O);
    O->po.until_empty = true;
    O->po.max_attempts = 3;
    O->po.after_fork = after_fork_hook;
    O->po.name = "batch";
    assert_int_equal(wq_add(q, KS("o1")), 0);
    assert_int_equal(wq_add(q, KS("o2")), 0);
    assert_int_equal(wq_add(q, KS("f3")), 0);
    pid_t sup = start_opts(name, 2, O);
    assert_int_equal(t_wait(sup, 20000), 0);
    assert_int_equal(atomic_load(&O->returned), 1);
    assert_int_equal(O->rc, 0);
    assert_int_equal(atomic_load(&O->calls[1]), 1);
    assert_int_equal(atomic_load(&O->calls[2]), 1);
    assert_int_equal(atomic_load(&O->calls[3]), 3);   /* given up after 3 */
    assert_int_equal(atomic_load(&O->forks), 2);
    assert_int_equal(atomic_load(&O->names_ok), 2);
    struct wq_result r = t_result(q, "f3");
    assert_int_equal(r.state, WQ_STATE_FAILED);
    assert_int_equal(r.code, -EIO);
    assert_string_equal(r.message, "attempt 3");
    assert_int_equal(wq_num_requeues(q, KS("f3")), 0);   /* forgotten */
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.queued + st.processing + st.waiting, 0);
    assert_int_equal(st.shutting_down, 0);   /* a batch ends; the queue does not */
    t_check_clean(q, "batch");
    wq_close(q);
    t_shared_free(O, sizeof *O);
}

/* A reconcile that overruns timeout_ns: its worker is killed, the
   attempt counts as failed (the key comes back as a crash, its failure
   count raised) and the pool counts the timeout. */
static void reconcile_timeout(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("timeout", T_OPTS(.capacity = 32, .max_key_len = 16,
                                       .rl_base_delay_ns = 1 * SEC), &name);
    struct opts_run *O = t_shared_alloc(sizeof *O);
    O->po.timeout_ns = (int64_t)(200 * MS);
    O->po.max_attempts = 1;
    assert_int_equal(wq_add(q, KS("s1")), 0);
    pid_t sup = start_opts(name, 1, O);
    assert_true(WAIT_UNTIL(t_stats(q).crash_requeues_total == 1, 5000));
    assert_int_equal(wq_num_requeues(q, KS("s1")), 1);   /* counted as a failure */
    assert_int_equal(t_key_state(q, "s1"), WQ_KEY_WAITING);   /* through the limiter */
    assert_int_equal(kill(sup, SIGTERM), 0);
    assert_int_equal(t_wait(sup, 10000), 0);
    assert_int_equal(O->rc, 0);
    assert_int_equal(O->po.timeouts, 1);
    assert_true(O->po.stopped_by_signal);
    t_check_clean(q, "timeout");
    wq_close(q);
    t_shared_free(O, sizeof *O);
}

/* ------------------------------------------------------------------ */
/* 8. The process table                                                */
/* ------------------------------------------------------------------ */

struct slots_run {
    atomic_int calls, most, bad;
    atomic_int rc_pool, procs_after, rc_add, procs_add;
    atomic_int got, rc_held, processing_held, rc_done, procs_held_after;
};

static int fn_slots(wq *q, const void *key, size_t len, struct wq_reconcile *out, void *arg)
{
    (void)key;
    (void)len;
    (void)out;
    struct slots_run *S = arg;
    struct wq_stats st;
    if (wq_stats(q, &st) != 0) {
        atomic_fetch_add(&S->bad, 1);
    } else {
        int seen = (int)st.processes, most = atomic_load(&S->most);
        while (seen > most && !atomic_compare_exchange_weak(&S->most, &most, seen))
            ;
    }
    t_sleep_ms(10);
    atomic_fetch_add(&S->calls, 1);
    return 0;
}

/* A queue created with max_procs 2 runs a pool of 2: the supervisor's
   handle gives its slot up while the workers run (its looks need none)
   and takes one again at its next add. A supervisor that holds a key
   keeps its slot: the second worker finds the table full, the pool stops
   with -EUSERS, and the held key is still the supervisor's. */
static void pool_fills_process_table(void **state)
{
    (void)state;
    T_SHM_ONLY("the process table");
    const char *name;
    wq *q = t_create("slots", T_OPTS(.capacity = 32, .max_key_len = 16, .max_procs = 2),
                     &name);
    char key[8];
    for (int i = 0; i < 8; i++) {
        snprintf(key, sizeof key, "k%d", i);
        assert_int_equal(wq_add(q, KS(key)), 0);
    }
    wq_close(q);   /* this process holds no slot from here on */
    struct slots_run *S = t_shared_alloc(sizeof *S);
    pid_t sup = t_fork(60);
    if (sup == 0) {
        wq *sq;
        if (wq_open(name, NULL, &sq) != 0)
            _exit(2);
        struct wq_pool_options po = { .until_empty = true };
        struct wq_stats st;
        atomic_store(&S->rc_pool, wq_run_workers_opts(sq, 2, fn_slots, S, &po));
        atomic_store(&S->procs_after, wq_stats(sq, &st) == 0 ? (int)st.processes : -1);
        atomic_store(&S->rc_add, wq_add(sq, KS("again")));
        atomic_store(&S->procs_add, wq_stats(sq, &st) == 0 ? (int)st.processes : -1);
        char buf[16];
        atomic_store(&S->got, wq_get(sq, buf, sizeof buf, 0));
        atomic_store(&S->rc_held, wq_run_workers_opts(sq, 2, fn_slots, S, &po));
        atomic_store(&S->processing_held, wq_stats(sq, &st) == 0 ? (int)st.processing : -1);
        atomic_store(&S->rc_done, wq_done(sq, KS("again")));
        atomic_store(&S->procs_held_after, wq_stats(sq, &st) == 0 ? (int)st.processes : -1);
        wq_close(sq);
        _exit(0);
    }
    assert_int_equal(t_wait(sup, 30000), 0);
    assert_int_equal(atomic_load(&S->rc_pool), 0);
    assert_int_equal(atomic_load(&S->calls), 8);   /* each key once */
    assert_int_equal(atomic_load(&S->most), 2);    /* the workers, not the supervisor */
    assert_int_equal(atomic_load(&S->bad), 0);
    assert_int_equal(atomic_load(&S->procs_after), 0);   /* still given up */
    assert_int_equal(atomic_load(&S->rc_add), 0);
    assert_int_equal(atomic_load(&S->procs_add), 1);     /* registered again */
    assert_int_equal(atomic_load(&S->got), 5);           /* "again" */
    assert_int_equal(atomic_load(&S->rc_held), -EUSERS);
    assert_int_equal(atomic_load(&S->calls), 8);         /* nothing else to do */
    assert_int_equal(atomic_load(&S->processing_held), 1);
    assert_int_equal(atomic_load(&S->rc_done), 0);
    assert_int_equal(atomic_load(&S->procs_held_after), 1);
    wq *oq = T_OPEN(name, T_OPTS(.flags = WQ_OBSERVE));
    struct wq_stats st = t_stats(oq);
    assert_int_equal(st.processes, 0);
    assert_int_equal(st.queued + st.processing + st.waiting, 0);
    assert_int_equal(st.adds_total, 9);
    assert_int_equal(st.crash_requeues_total, 0);
    t_check_clean(oq, "slots");
    wq_close(oq);
    t_shared_free(S, sizeof *S);
}

/* Arguments wq_run_workers refuses before it forks anything: -EINVAL,
   and the queue is left as it was (its key still queued, no process
   slot taken by a worker). */
static void pool_bad_args(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("badargs", T_OPTS(.capacity = 16), &name);
    assert_int_equal(wq_add(q, KS("k")), 0);
    struct wq_pool_options po = { .until_empty = true };
    assert_int_equal(wq_run_workers(NULL, 1, fn_hot, NULL), -EINVAL);
    assert_int_equal(wq_run_workers(q, 1, NULL, NULL), -EINVAL);
    assert_int_equal(wq_run_workers(q, 0, fn_hot, NULL), -EINVAL);
    assert_int_equal(wq_run_workers(q, 1025, fn_hot, NULL), -EINVAL);
    po.timeout_ns = -1;
    assert_int_equal(wq_run_workers_opts(q, 1, fn_hot, NULL, &po), -EINVAL);
    po.timeout_ns = 0;
    po.reserved[3] = 1;
    assert_int_equal(wq_run_workers_opts(q, 1, fn_hot, NULL, &po), -EINVAL);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.queued, 1);
    assert_int_equal(st.processing, 0);
    assert_int_equal(st.processes, 1);   /* ours, not parked */
    t_check_clean(q, "pool_bad_args");
    t_close(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        T_TEST(no_overlap_hot_keys),
        T_TEST(long_reconcile_one_worker),
        T_TEST(long_reconcile_four_workers),
        T_TEST(outcome_mapping),
        T_TEST(crashed_worker_replaced),
        T_TEST(crashed_key_never_twice),
        T_TEST(crash_loop_backs_off),
        T_TEST(sigterm_stops_pool),
        T_TEST(sigterm_while_waiting),
        T_TEST(second_sigterm_kills),
        T_TEST(waits_only_for_own_workers),
        T_TEST(restarts_lose_nothing),
        T_TEST(batch_until_empty_gives_up),
        T_TEST(reconcile_timeout),
        T_TEST(pool_fills_process_table),
        T_TEST(pool_bad_args),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("pool", tests);
}
