/*
 * wqdemo - many processes, one queue, and a witness that does not trust it.
 *
 *     wqdemo [--workers N] [--adds N] [--keys K] [--name NAME] [--work-us U]
 *
 * The parent creates a queue, then forks one producer and one supervisor,
 * each of which attaches to the queue by name, as unrelated processes
 * would:
 *
 *     producer:   for each of --adds events, pick one of --keys keys at
 *                 random and wq_add() it. Most adds coalesce.
 *     supervisor: wq_run_workers(N, reconcile): the library forks N
 *                 worker processes that loop get -> reconcile -> finish
 *                 and replaces any that dies. reconcile() spins for
 *                 --work-us microseconds (default 5), so that events for
 *                 a key keep arriving while it is processed, and returns
 *                 success with the message "seq <S>", S being the add it
 *                 saw (below); wq_finish records it as the key's result.
 *     parent:     when the producer is done, wq_shutdown_drain(); the
 *                 workers leave when wq_get() says -ESHUTDOWN, and
 *                 wq_run_workers returns once they all have.
 *
 * The witness is a MAP_SHARED|MAP_ANONYMOUS mapping made before fork and
 * kept entirely outside libwq. For every key it holds lock-free atomics:
 *
 *     in_flight / max_in_flight   workers inside reconcile() for the key;
 *                                 if libwq ever hands one key to two
 *                                 workers at once, max_in_flight exceeds 1.
 *     last_add_seq                the producer stores the event's global
 *                                 sequence number here right BEFORE wq_add.
 *     last_processed_seq          a worker reads last_add_seq at the START
 *                                 of reconcile() and keeps the maximum.
 *
 * client-go's promise is that an add is never lost: a key added while it
 * is processing is processed again after wq_done. So once everything has
 * stopped, last_processed_seq >= last_add_seq must hold for every key.
 * (If a worker's read races with the producer's store and misses it, the
 * producer's wq_add necessarily came after the worker's wq_get, found the
 * key processing, and marked it dirty: the key is handed out again, and
 * that later read, ordered after the add by the queue's lock, sees it.)
 *
 * Results are checked against the witness too: the last run of a key
 * saw the largest sequence number any run of it saw (runs of one key never
 * overlap, and last_add_seq only grows), so wq_result must report every
 * added key SUCCEEDED with the message "seq <last_processed_seq>".
 *
 * Exit status 0 only if every check passes. The queue is removed at exit,
 * on failure too; Ctrl-C stops the run and cleans up as well.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <wq.h>

#if ATOMIC_INT_LOCK_FREE != 2 || ATOMIC_LLONG_LOCK_FREE != 2
#error "the witness needs lock-free atomics to work across processes"
#endif

#define NS_PER_S         INT64_C(1000000000)
#define KEY_MAX          32          /* "key-4294967295" fits */
#define MAX_WORKERS      1024
#define MAX_KEYS         (1u << 24)
/* Hard limits: a hung library fails the demo instead of hanging it. */
#define PRODUCER_TIMEOUT (300 * NS_PER_S)
#define DRAIN_TIMEOUT    (60 * NS_PER_S)
#define EXIT_TIMEOUT     (60 * NS_PER_S)

/* ------------------------------------------------------------------ */
/* The witness (shared by all processes, outside libwq)                */
/* ------------------------------------------------------------------ */

struct key_witness {
    atomic_int in_flight;     /* workers in reconcile() for this key now */
    atomic_int max_in_flight; /* most ever seen at once: must stay <= 1 */
    _Atomic unsigned long long last_add_seq;       /* producer, before wq_add */
    _Atomic unsigned long long last_processed_seq; /* workers, max seen */
};

struct witness {
    /* written by the producer only */
    _Atomic unsigned long long adds_done;     /* wq_add calls that succeeded */
    _Atomic unsigned long long adds_coalesced; /* ... that returned 1 */
    _Atomic unsigned long long adds_while_processing; /* key was in reconcile() */
    /* written by workers */
    _Atomic unsigned long long bad_keys;      /* keys that are not ours */
    atomic_uint worker_procs;  /* worker processes that ran reconcile():
                                  more than --workers means the pool had
                                  to replace a worker */
    _Atomic unsigned long long *processed;    /* [workers + 1]: one slot per
                                                 worker process, the last
                                                 for replacements */
    struct key_witness *keys;                 /* [nkeys] */
};

struct demo {
    unsigned workers;
    unsigned long long adds;
    uint32_t nkeys;
    int64_t work_ns;   /* simulated work per key */
    char name[WQ_MAX_NAME_LEN + 1];
    struct witness *w;
    size_t w_bytes;
};

static struct witness *witness_map(unsigned workers, uint32_t nkeys,
                                   size_t *bytes)
{
    size_t head = sizeof(struct witness);
    size_t counts = (workers + 1) * sizeof(unsigned long long);
    size_t keys = nkeys * sizeof(struct key_witness);
    struct witness *w;
    char *p;

    *bytes = head + counts + keys;
    p = mmap(NULL, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
             -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    /* Anonymous memory is zero, which is every atomic's initial value. */
    w = (struct witness *)p;
    w->processed = (_Atomic unsigned long long *)(p + head);
    w->keys = (struct key_witness *)(p + head + counts);
    return w;
}

static void atomic_max_int(atomic_int *a, int v)
{
    int cur = atomic_load(a);

    while (cur < v && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

static void atomic_max_ull(_Atomic unsigned long long *a, unsigned long long v)
{
    unsigned long long cur = atomic_load(a);

    while (cur < v && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

static int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

static int key_format(char *buf, uint32_t k)
{
    return snprintf(buf, KEY_MAX, "key-%" PRIu32, k);
}

/* The index of a key made by key_format, or -1 if it is not one. */
static long key_index(const char *key, int len, uint32_t nkeys)
{
    char tmp[KEY_MAX];
    char *end;
    unsigned long k;

    if (len <= 4 || len >= KEY_MAX || memcmp(key, "key-", 4) != 0)
        return -1;
    memcpy(tmp, key, (size_t)len);
    tmp[len] = '\0';
    errno = 0;
    k = strtoul(tmp + 4, &end, 10);
    if (errno || *end || k >= nkeys)
        return -1;
    return (long)k;
}

/* splitmix64: a fixed seed makes every run add the same key sequence. */
static uint64_t next_random(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));

    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Attach to the demo queue by name, as an unrelated process would. */
static wq *attach(const struct demo *d, const char *who)
{
    wq *q;
    int rc = wq_open(d->name, NULL, &q);

    if (rc < 0) {
        fprintf(stderr, "wqdemo: %s: open '%s': %s\n", who, d->name,
                wq_strerror(rc));
        return NULL;
    }
    return q;
}

/* ------------------------------------------------------------------ */
/* Producer                                                            */
/* ------------------------------------------------------------------ */

static int run_producer(const struct demo *d)
{
    struct witness *w = d->w;
    uint64_t rng = 42;
    wq *q = attach(d, "producer");

    if (!q)
        return 1;
    for (unsigned long long seq = 1; seq <= d->adds; seq++) {
        uint32_t k = (uint32_t)(next_random(&rng) % d->nkeys);
        struct key_witness *kw = &w->keys[k];
        char key[KEY_MAX];
        int len = key_format(key, k);
        int rc;

        if (atomic_load(&kw->in_flight) > 0)
            atomic_fetch_add(&w->adds_while_processing, 1);
        atomic_store(&kw->last_add_seq, seq); /* BEFORE the add */
        rc = wq_add(q, key, (size_t)len);
        if (rc < 0) {
            fprintf(stderr, "wqdemo: producer: wq_add(%s): %s\n", key,
                    wq_strerror(rc));
            wq_close(q);
            return 1;
        }
        atomic_fetch_add(&w->adds_done, 1);
        if (rc == 1)
            atomic_fetch_add(&w->adds_coalesced, 1);
    }
    wq_close(q);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Workers                                                             */
/* ------------------------------------------------------------------ */

/* This worker process's slot in processed[], taken on its first key. The
   variable is per process: each worker is forked from the supervisor,
   which never runs reconcile() itself, so every worker starts at -1. */
static long worker_slot = -1;

/*
 * The "work", run by wq_run_workers in a worker process: record what we
 * see in the witness, spin a little, report success with the sequence
 * number seen.
 */
static int reconcile(wq *q, const void *key, size_t len,
                     struct wq_reconcile *out, void *arg)
{
    const struct demo *d = arg;
    struct witness *w = d->w;
    long k = key_index(key, (int)len, d->nkeys);
    struct key_witness *kw;
    unsigned long long seen;
    int64_t until;

    (void)q;
    if (worker_slot < 0) {
        worker_slot = (long)atomic_fetch_add(&w->worker_procs, 1);
        if (worker_slot > (long)d->workers)
            worker_slot = d->workers;   /* replacements share the last */
    }
    if (k < 0) {
        atomic_fetch_add(&w->bad_keys, 1);
        snprintf(out->message, sizeof out->message, "not a demo key");
        return -EINVAL;
    }
    kw = &w->keys[k];
    atomic_max_int(&kw->max_in_flight, atomic_fetch_add(&kw->in_flight, 1) + 1);
    seen = atomic_load(&kw->last_add_seq);
    atomic_max_ull(&kw->last_processed_seq, seen);

    until = now_ns() + d->work_ns;
    while (now_ns() < until)
        ;

    atomic_fetch_sub(&kw->in_flight, 1); /* before wq_finish hands it on */
    atomic_fetch_add(&w->processed[worker_slot], 1);
    snprintf(out->message, sizeof out->message, "seq %llu", seen);
    return 0;
}

/* The supervisor process: the worker pool, until the queue shuts down. */
static int run_supervisor(const struct demo *d)
{
    wq *q = attach(d, "supervisor");
    int rc;

    if (!q)
        return 1;
    rc = wq_run_workers(q, d->workers, reconcile, (void *)d);
    wq_close(q);
    if (rc < 0) {
        fprintf(stderr, "wqdemo: wq_run_workers: %s\n", wq_strerror(rc));
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Process management                                                  */
/* ------------------------------------------------------------------ */

struct child {
    pid_t pid;
    bool reaped;
    int status;
};

/*
 * Fork a child that runs fn(d, id) and exits with its result. The child
 * dies with the parent (PR_SET_PDEATHSIG), so it can never outlive a
 * killed demo, and takes Ctrl-C with the default action.
 */
static pid_t spawn(const struct demo *d, unsigned id,
                   int (*fn)(const struct demo *, unsigned))
{
    pid_t parent = getpid();
    pid_t pid;

    fflush(NULL);
    pid = fork();
    if (pid != 0)
        return pid;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
        _exit(1);
    _exit(fn(d, id));
}

static int producer_main(const struct demo *d, unsigned id)
{
    (void)id;
    return run_producer(d);
}

static int supervisor_main(const struct demo *d, unsigned id)
{
    (void)id;
    return run_supervisor(d);
}

/*
 * Reap children until all have exited or the deadline passes, then
 * SIGKILL the rest. Returns true when every child exited in time.
 */
static bool reap(struct child *c, size_t n, int64_t deadline)
{
    bool in_time = true;

    for (;;) {
        size_t left = 0;

        for (size_t i = 0; i < n; i++) {
            if (c[i].reaped || c[i].pid <= 0)
                continue;
            if (waitpid(c[i].pid, &c[i].status, WNOHANG) == c[i].pid)
                c[i].reaped = true;
            else
                left++;
        }
        if (left == 0)
            return in_time;
        if (interrupted || now_ns() >= deadline)
            break;
        nanosleep(&(struct timespec){ .tv_nsec = 2000000 }, NULL);
    }
    for (size_t i = 0; i < n; i++) {
        if (c[i].reaped || c[i].pid <= 0)
            continue;
        kill(c[i].pid, SIGKILL);
        waitpid(c[i].pid, &c[i].status, 0);
        c[i].reaped = true;
        in_time = false;
    }
    return false;
}

static bool exited_ok(const struct child *c)
{
    return c->reaped && WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0;
}

/* ------------------------------------------------------------------ */
/* Options                                                             */
/* ------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
        "Usage: wqdemo [--workers N] [--adds N] [--keys K] [--name NAME]\n"
        "              [--work-us U]\n"
        "  --workers N  worker processes (default 4, at most %d)\n"
        "  --adds N     events the producer adds (default 100000)\n"
        "  --keys K     distinct keys the events are drawn from (default 1000)\n"
        "  --name NAME  queue name (default demo-<pid>); must not exist\n"
        "  --work-us U  microseconds each reconcile spins (default 5)\n",
        MAX_WORKERS);
}

static bool parse_num(const char *opt, const char *s, unsigned long long min,
                      unsigned long long max, unsigned long long *out)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = (s[0] >= '0' && s[0] <= '9') ? strtoull(s, &end, 10) : 0;
    if (s[0] < '0' || s[0] > '9' || errno || *end || v < min || v > max) {
        fprintf(stderr, "wqdemo: bad value '%s' for --%s (%llu..%llu)\n", s,
                opt, min, max);
        return false;
    }
    *out = v;
    return true;
}

/* Returns -1 to go on, else the exit status. */
static int parse_options(int argc, char **argv, struct demo *d)
{
    static const struct option longopts[] = {
        { "workers", required_argument, NULL, 'w' },
        { "adds", required_argument, NULL, 'a' },
        { "keys", required_argument, NULL, 'k' },
        { "name", required_argument, NULL, 'n' },
        { "work-us", required_argument, NULL, 'u' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    unsigned long long v;
    int c;

    d->workers = 4;
    d->adds = 100000;
    d->nkeys = 1000;
    d->work_ns = 5000;
    snprintf(d->name, sizeof d->name, "demo-%ld", (long)getpid());

    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'w':
            if (!parse_num("workers", optarg, 1, MAX_WORKERS, &v))
                return 2;
            d->workers = (unsigned)v;
            break;
        case 'a':
            if (!parse_num("adds", optarg, 1, ULLONG_MAX, &v))
                return 2;
            d->adds = v;
            break;
        case 'k':
            if (!parse_num("keys", optarg, 1, MAX_KEYS, &v))
                return 2;
            d->nkeys = (uint32_t)v;
            break;
        case 'u':
            if (!parse_num("work-us", optarg, 0, 10000000, &v))
                return 2;
            d->work_ns = (int64_t)v * 1000;
            break;
        case 'n':
            if (strlen(optarg) > WQ_MAX_NAME_LEN) {
                fprintf(stderr, "wqdemo: --name is too long\n");
                return 2;
            }
            snprintf(d->name, sizeof d->name, "%s", optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "wqdemo: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    return -1;
}

/* ------------------------------------------------------------------ */
/* The report                                                          */
/* ------------------------------------------------------------------ */

static int failures;

static void check(bool ok, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void check(bool ok, const char *fmt, ...)
{
    va_list ap;

    printf("  %s  ", ok ? "PASS" : "FAIL");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    if (!ok)
        failures++;
}

/* Keys added after their last processing started; prints a few. */
static unsigned long long late_keys(const struct demo *d, uint32_t *with_adds)
{
    unsigned long long late = 0;

    *with_adds = 0;
    for (uint32_t k = 0; k < d->nkeys; k++) {
        struct key_witness *kw = &d->w->keys[k];
        unsigned long long added = atomic_load(&kw->last_add_seq);
        unsigned long long seen = atomic_load(&kw->last_processed_seq);

        if (added == 0)
            continue;
        (*with_adds)++;
        if (seen >= added)
            continue;
        if (late++ < 5)
            printf("        key-%" PRIu32 ": last add #%llu, last processing "
                   "saw #%llu\n", k, added, seen);
    }
    return late;
}

static int max_concurrency(const struct demo *d)
{
    int max = 0;

    for (uint32_t k = 0; k < d->nkeys; k++) {
        int m = atomic_load(&d->w->keys[k].max_in_flight);
        if (m > max)
            max = m;
    }
    return max;
}

/*
 * Results against the witness: every key that was added must be
 * SUCCEEDED, code 0, with the message its last run gave, "seq <S>" where
 * S is the largest sequence number any run of it saw. Returns how many
 * are wrong and prints a few.
 */
static unsigned long long check_results(wq *q, const struct demo *d)
{
    unsigned long long wrong = 0;

    for (uint32_t k = 0; k < d->nkeys; k++) {
        struct key_witness *kw = &d->w->keys[k];
        unsigned long long seen = atomic_load(&kw->last_processed_seq);
        struct wq_result r;
        char key[KEY_MAX], want[64];
        int len = key_format(key, k), rc;

        if (atomic_load(&kw->last_add_seq) == 0)
            continue;
        snprintf(want, sizeof want, "seq %llu", seen);
        rc = wq_result(q, key, (size_t)len, &r);
        if (rc == 0 && r.state == WQ_STATE_SUCCEEDED && r.code == 0 &&
            r.updated_ns != 0 && strcmp(r.message, want) == 0)
            continue;
        if (wrong++ < 5)
            printf("        %s: %s, want SUCCEEDED \"%s\", got state %d "
                   "code %d \"%s\"\n", key, rc < 0 ? wq_strerror(rc) : "ok",
                   want, rc < 0 ? -1 : (int)r.state, rc < 0 ? 0 : r.code,
                   rc < 0 ? "" : r.message);
    }
    return wrong;
}

/* The key added last (the producer's last event), or -1 if none was. */
static long latest_key(const struct demo *d)
{
    unsigned long long best = 0;
    long key = -1;

    for (uint32_t k = 0; k < d->nkeys; k++) {
        unsigned long long s = atomic_load(&d->w->keys[k].last_add_seq);

        if (s > best) {
            best = s;
            key = (long)k;
        }
    }
    return key;
}

static void print_result(long k, const struct wq_result *r)
{
    static const char *const states[] = {
        [WQ_STATE_NONE] = "none", [WQ_STATE_PENDING] = "pending",
        [WQ_STATE_RUNNING] = "running", [WQ_STATE_SUCCEEDED] = "succeeded",
        [WQ_STATE_FAILED] = "failed",
    };
    time_t sec = (time_t)(r->updated_ns / 1000000000u);
    char when[64] = "-";
    struct tm tm;

    if (r->updated_ns && gmtime_r(&sec, &tm))
        snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                 tm.tm_min, tm.tm_sec,
                 (unsigned)(r->updated_ns % 1000000000u / 1000000u));
    printf("  last key added         key-%ld; its wq_result():\n", k);
    printf("    state %s, code %d, updated %s, message \"%s\"\n",
           (unsigned)r->state < sizeof states / sizeof states[0]
               ? states[r->state] : "?",
           r->code, when, r->message);
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    struct demo d;
    struct wq_options o = { 0 };
    struct wq_stats st = { 0 };
    struct child kids[2] = { { 0 } }; /* [0] producer, [1] supervisor */
    struct witness *w;
    bool procs_ok = true, stats_ok = false;
    int rc, drain_rc = 0;
    int64_t t0, t_produced, t_end;
    unsigned long long processed = 0, bad_results = 0;
    unsigned worker_procs;
    uint32_t with_adds;
    long shown;
    struct wq_result shown_result;
    int shown_rc = -ENOENT;
    wq *q;

    if ((rc = parse_options(argc, argv, &d)) >= 0)
        return rc;

    d.w = w = witness_map(d.workers, d.nkeys, &d.w_bytes);
    if (!w) {
        fprintf(stderr, "wqdemo: out of memory\n");
        return 1;
    }

    /* The queue: room for every key, a process slot for everyone. */
    o.capacity = d.nkeys;
    o.max_key_len = KEY_MAX;
    o.max_procs = d.workers + 16 < WQ_MAX_PROCS ? d.workers + 16 : WQ_MAX_PROCS;
    o.flags = WQ_CREATE | WQ_EXCL;
    rc = wq_open(d.name, &o, &q);
    if (rc < 0) {
        fprintf(stderr, "wqdemo: create '%s': %s\n", d.name, wq_strerror(rc));
        return 1;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    printf("wqdemo: queue '%s': 1 producer, %u workers (wq_run_workers), "
           "%llu adds over %" PRIu32 " keys\n", d.name, d.workers, d.adds,
           d.nkeys);
    t0 = now_ns();

    /* The pool first, so its workers wait when the first key arrives. */
    procs_ok = (kids[1].pid = spawn(&d, 0, supervisor_main)) > 0;
    if (procs_ok)
        procs_ok = (kids[0].pid = spawn(&d, 0, producer_main)) > 0;
    if (!procs_ok)
        perror("wqdemo: fork");

    /* Producer done (or failed): drain, then the pool winds down. */
    procs_ok = reap(kids, 1, t0 + PRODUCER_TIMEOUT) && procs_ok &&
               exited_ok(&kids[0]);
    t_produced = now_ns();
    if (procs_ok && !interrupted)
        drain_rc = wq_shutdown_drain(q, DRAIN_TIMEOUT);
    else
        wq_shutdown(q); /* release the workers whatever happened */
    if (!reap(kids + 1, 1, now_ns() + EXIT_TIMEOUT) || !exited_ok(&kids[1]))
        procs_ok = false;
    t_end = now_ns();

    stats_ok = wq_stats(q, &st) == 0;
    bad_results = check_results(q, &d);
    shown = latest_key(&d);
    if (shown >= 0) {
        char key[KEY_MAX];
        int len = key_format(key, (uint32_t)shown);

        shown_rc = wq_result(q, key, (size_t)len, &shown_result);
    }
    wq_close(q);
    rc = wq_unlink(d.name);
    if (rc < 0)
        fprintf(stderr, "wqdemo: unlink '%s': %s\n", d.name, wq_strerror(rc));

    /* What happened. */
    worker_procs = atomic_load(&w->worker_procs);
    for (unsigned i = 0; i <= d.workers; i++)
        processed += atomic_load(&w->processed[i]);
    printf("\n  adds                   %llu (%.0f/s)\n", atomic_load(&w->adds_done),
           atomic_load(&w->adds_done) * 1e9 / (double)(t_produced - t0 + 1));
    printf("  coalesced              %" PRIu64 " (wq_stats coalesced_total)\n",
           st.coalesced_total);
    printf("  adds while processing  %llu (key was in reconcile() at its add)\n",
           atomic_load(&w->adds_while_processing));
    printf("  keys processed         %llu in %.3f s\n", processed,
           (double)(t_end - t0) / 1e9);
    for (unsigned i = 0; i < d.workers && i < worker_procs; i++)
        printf("    worker %-3u           %llu\n", i,
               atomic_load(&w->processed[i]));
    if (worker_procs > d.workers)
        printf("    replacements         %llu\n",
               atomic_load(&w->processed[d.workers]));
    printf("  results kept           %" PRIu64 " of %" PRIu64 "\n", st.results,
           st.result_capacity);
    if (shown >= 0 && shown_rc == 0)
        print_result(shown, &shown_result);
    else if (shown >= 0)
        printf("  wq_result(key-%ld)     %s\n", shown, wq_strerror(shown_rc));

    /* What must be true. */
    printf("\nchecks:\n");
    check(interrupted == 0, "not interrupted");
    check(procs_ok, "producer and worker pool exited cleanly in time");
    check(worker_procs <= d.workers, "no worker died and was replaced "
          "(%u worker processes for %u slots)", worker_procs, d.workers);
    check(drain_rc == 0, "wq_shutdown_drain returned %s",
          drain_rc == 0 ? "0" : wq_strerror(drain_rc));
    check(atomic_load(&w->bad_keys) == 0, "no foreign keys handed out (%llu)",
          atomic_load(&w->bad_keys));
    {
        unsigned long long late = late_keys(&d, &with_adds);
        check(late == 0, "every key processed after its last add "
              "(%llu of %" PRIu32 " keys late)", late, with_adds);
    }
    {
        int max = max_concurrency(&d);
        check(max <= 1, "no key held by two workers at once "
              "(max concurrency per key %d)", max);
    }
    check(stats_ok && st.adds_total + st.coalesced_total == d.adds &&
          st.coalesced_total == atomic_load(&w->adds_coalesced),
          "every add counted once: adds_total %" PRIu64 " + coalesced_total "
          "%" PRIu64 " = %llu", st.adds_total, st.coalesced_total, d.adds);
    check(stats_ok && processed == st.adds_total,
          "every non-coalesced add processed exactly once (%llu processed, "
          "adds_total %" PRIu64 ")", processed, st.adds_total);
    check(stats_ok && st.live == 0 && st.processing == 0,
          "queue empty at the end (live %" PRIu64 ", processing %" PRIu64 ")",
          st.live, st.processing);
    check(bad_results == 0 && stats_ok && st.results == with_adds,
          "every added key's result is its last run's (%llu wrong, %" PRIu64
          " results for %" PRIu32 " keys)", bad_results, st.results,
          with_adds);

    printf("\n%s: %d check%s failed\n", failures ? "FAIL" : "PASS", failures,
           failures == 1 ? "" : "s");
    munmap(w, d.w_bytes);
    return failures ? 1 : 0;
}
