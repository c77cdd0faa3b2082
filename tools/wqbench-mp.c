/*
 * wqbench-mp.c - the multi-process workloads: drain, mpmc, starve.
 *
 * Workers are forked and attach to the queue by name (wq_open without
 * options), as unrelated processes would; the parent's creating handle
 * stays idle. Workers check in at a start barrier in a shared anonymous
 * mapping; the parent stamps t0 (CLOCK_MONOTONIC) and releases them, so
 * fork and attach costs are not timed. Workers write their results into
 * the mapping and _exit(0).
 *
 * drain   N keys queued beforehand; C consumers get + done until wq_get(0)
 *         says -EAGAIN. keys/s = N / (last consumer's end - t0). Variants
 *         "C=<c>-b<n>": wq_get_many / wq_done_many, n keys at a time.
 *         Variants "C=<c>-dg": each done and the next get are one
 *         wq_done_get.
 *         Variants "C=<c>-w250ns", "C=<c>-w1us": each of N/10 keys is
 *         worked on (a busy loop on the clock, outside the library)
 *         between its get and its done, as a reconcile would: whether
 *         consumers that do work scale, where the others measure the
 *         queue alone.
 *         Variants "pool-C=<c>": the same N keys reconciled (an empty
 *         reconcile that counts) by wq_run_workers with c workers and
 *         until_empty; keys/s = N / (the N-th reconcile's start - t0,
 *         taken before wq_run_workers forks).
 * mpmc    P producers add `adds` keys drawn uniformly from K = 1000 hot keys
 *         (flat out, or paced at 50k adds/s: absolute deadlines, waited for
 *         with sched_yield, see wqb_pace_until);
 *         C consumers get + done until
 *         -ESHUTDOWN (the last producer shuts the queue down). adds/s is
 *         measured over the producers' span. Latency is sampled per key,
 *         in the paced variants only: a producer stamps stamp[k] (CAS 0 ->
 *         now) before wq_add, a consumer swaps it back to 0 at wq_get and
 *         records now - stamp: the time from the first add not yet served
 *         to the get that serves it. Flat out, the queue is saturated and
 *         that time is only its depth, while the stamps' clock reads and
 *         a locked operation on a line the consumers write cost the
 *         producer more than its adds (5-6M adds/s with them, 21-24M
 *         without, on the Intel VM): those variants measure the queue
 *         alone, as tools/goqueue does.
 *         processed_per_s: the keys the consumers handled, over the same
 *         span. Read it beside adds/s: consumers that let the producer
 *         run alone make its adds coalesce, and adds/s rise while this
 *         falls (tools/PERFORMANCE.md, "The mpmc rows, measured the way
 *         goqueue runs them").
 *         Variants "-b<n>" and "-dg": consumers as drain's. Variants
 *         "-pub": producers add with wq_add_publish (no lock for a new
 *         key; the consumers apply the adds when they lock).
 * tenants One worker. Tenant "a" adds TENANT_FLOOD keys, then tenant "b"
 *         adds one key: how long b's key waits for the worker, and how
 *         many keys are handed out before it (default vs fair mode).
 * starve  One worker. Key A's processing takes 10 ms; while it runs the
 *         parent re-adds A and then adds 10,000 other keys (whose
 *         processing is empty). At wq_done, A goes behind all of them;
 *         figure: time from A's re-add to A being handed out again
 *         (after_done_ns: from A's wq_done, i.e. the queueing part alone;
 *         ahead: keys handed out in between).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/uio.h>

#include "wqbench.h"

#define GET_TIMEOUT_NS (10ll * 1000 * 1000 * 1000)

/* ------------------------------------------------------------------ */
/* drain                                                               */
/* ------------------------------------------------------------------ */

#define DRAIN_MAX_C 4
#define MAX_BATCH 256

/* A consumer's keys: one at a time (batch 1), wq_get_many's, or one at
   a time with each done made by the next get (WQB_DONE_GET: n is the
   length of the key held, in buf's half `at`). */
struct taker {
    wq *q;
    int batch, n, at;
    struct iovec keys[MAX_BATCH];
    char buf[MAX_BATCH * WQB_BUF_LEN];
};

/* The next key (its length, its bytes in *key), finishing the previous
   batch (or key) first; wq_get's errors. */
static int take(struct taker *t, const char **key, int64_t timeout)
{
    if (t->batch == WQB_DONE_GET) {
        /* The key held and the next one in the two halves of buf. */
        char *held = t->buf + t->at * WQB_BUF_LEN, *next = t->buf + (1 - t->at) * WQB_BUF_LEN;
        int len = t->n > 0 ? wq_done_get(t->q, held, (size_t)t->n, next, WQB_BUF_LEN, timeout)
                           : wq_get(t->q, next, WQB_BUF_LEN, timeout);
        t->n = len > 0 ? len : 0;   /* an error of the get half: the done was made */
        t->at = 1 - t->at;
        *key = next;
        return len;
    }
    if (t->batch <= 1) {
        int len = wq_get(t->q, t->buf, WQB_BUF_LEN, timeout);
        *key = t->buf;
        return len;
    }
    if (t->at == t->n) {
        if (t->n > 0) {
            int rc = wq_done_many(t->q, t->keys, (size_t)t->n);
            if (rc != t->n)
                wqb_die("wq_done_many: %d of %d keys: %s", rc, t->n,
                        rc < 0 ? wq_strerror(rc) : "some were not processing");
        }
        t->at = t->n = 0;
        int rc = wq_get_many(t->q, t->buf, sizeof t->buf, t->keys, (size_t)t->batch, timeout);
        if (rc <= 0)
            return rc;
        t->n = rc;
    }
    struct iovec *k = &t->keys[t->at++];
    *key = k->iov_base;
    return (int)k->iov_len;
}

/* The key `take` returned is finished (batches and WQB_DONE_GET: by the
   next take). */
static void finish(struct taker *t, const char *key, int len, const char *what)
{
    if (t->batch == 1)
        wqb_check(wq_done(t->q, key, (size_t)len), what);
}

struct drain_shared {
    struct wqb_gate gate;
    uint64_t end[DRAIN_MAX_C];
    uint64_t got[DRAIN_MAX_C];
};

/* A reconcile's work: `ns` of the CPU, touching nothing shared. */
static void work(uint64_t ns)
{
    if (!ns)
        return;
    uint64_t until = wqb_now() + ns;
    while (wqb_now() < until)
        ;
}

static void drain_worker(const char *name, struct drain_shared *sh, int id, int batch,
                         uint64_t work_ns)
{
    static struct taker t;
    t.q = wqb_attach(name);
    t.batch = batch;
    uint64_t got = 0;
    const char *key;
    int len;
    wqb_gate_arrive(&sh->gate);
    while ((len = take(&t, &key, 0)) > 0) {
        work(work_ns);
        finish(&t, key, len, "drain: wq_done");
        got++;
    }
    if (len != -EAGAIN)
        wqb_die("drain: wq_get: %s", wq_strerror(len));
    sh->end[id] = wqb_now();
    sh->got[id] = got;
    wq_close(t.q);
    _exit(0);
}

/* One repetition: fill, release C consumers, keys/s. */
static double drain_rep(wq *q, const char *name, int consumers, int batch, uint64_t work_ns,
                        uint64_t n)
{
    struct drain_shared *sh = wqb_shared_alloc(sizeof *sh);
    pid_t pid[DRAIN_MAX_C];
    wqb_fill(q, 0, n);
    for (int i = 0; i < consumers; i++)
        if ((pid[i] = wqb_fork()) == 0)
            drain_worker(name, sh, i, batch, work_ns);
    uint64_t t0 = wqb_gate_release(&sh->gate, (uint32_t)consumers);
    uint64_t end = t0, got = 0;
    for (int i = 0; i < consumers; i++) {
        wqb_wait_child(pid[i]);
        end = sh->end[i] > end ? sh->end[i] : end;
        got += sh->got[i];
    }
    wqb_shared_free(sh, sizeof *sh);
    if (got != n)
        wqb_die("drain: consumers got %llu keys of %llu", (unsigned long long)got,
                (unsigned long long)n);
    return (double)n * 1e9 / (double)(end - t0);
}

/* A new queue for n keys, or NULL when the engine has none (skipped). */
static wq *drain_open(const struct wqb_cfg *c, const char *variant, uint64_t n,
                      char name[WQB_NAME_LEN])
{
    wq *q;
    struct wq_options o = { .capacity = (uint32_t)n };
    int rc = wqb_open_new("drain", &o, &q, name);
    if (rc < 0 && wqb_prefixed()) {
        wqb_skip_open(c, "drain", variant, rc);
        return NULL;
    }
    if (rc < 0)
        wqb_die("wq_open %s (capacity %u): %s", name, o.capacity, wq_strerror(rc));
    return q;
}

void wqb_drain_variant(const struct wqb_cfg *c, const char *variant, int consumers,
                       int batch, uint64_t work_ns, uint64_t n)
{
    wq *q;
    char name[WQB_NAME_LEN];
    struct wqb_result r;
    if (!wqb_want(c, variant))
        return;
    if (consumers < 1 || consumers > DRAIN_MAX_C)
        wqb_die("drain: %d consumers (1 .. %d)", consumers, DRAIN_MAX_C);
    if ((batch < 1 && batch != WQB_DONE_GET) || batch > MAX_BATCH)
        wqb_die("drain: batch %d (1 .. %d, or WQB_DONE_GET)", batch, MAX_BATCH);
    if (!(q = drain_open(c, variant, n, name)))
        return;
    wqb_result_init(&r, "drain", variant, "keys/s");
    for (int rep = 0; rep < wqb_reps(c); rep++)
        wqb_result_add(&r, drain_rep(q, name, consumers, batch, work_ns, n));
    wqb_result_extra(&r, "n", (double)n, WQB_X_INT);
    wqb_emit(c, &r);
    wqb_queue_destroy(q, name);
}

struct pool_shared {
    _Atomic uint64_t seen;
    uint64_t n, end;
};

static int pool_count(wq *q, const void *key, size_t len, struct wq_reconcile *out, void *arg)
{
    (void)q, (void)key, (void)len, (void)out;
    struct pool_shared *sh = arg;
    if (atomic_fetch_add(&sh->seen, 1) + 1 == sh->n)
        sh->end = wqb_now();
    return 0;
}

void wqb_pool_variant(const struct wqb_cfg *c, const char *variant, int workers, uint64_t n)
{
    wq *q;
    char name[WQB_NAME_LEN];
    struct wqb_result r;
    if (!wqb_want(c, variant) || !(q = drain_open(c, variant, n, name)))
        return;
    wqb_result_init(&r, "drain", variant, "keys/s");
    struct pool_shared *sh = wqb_shared_alloc(sizeof *sh);
    for (int rep = 0; rep < wqb_reps(c); rep++) {
        wqb_fill(q, 0, n);
        atomic_store(&sh->seen, 0);
        sh->n = n;
        sh->end = 0;
        struct wq_pool_options po = { .until_empty = true, .name = "wqbench" };
        uint64_t t0 = wqb_now();
        wqb_check(wq_run_workers_opts(q, (unsigned)workers, pool_count, sh, &po),
                  "drain: wq_run_workers");
        if (atomic_load(&sh->seen) != n || !sh->end)
            wqb_die("drain: the pool reconciled %llu keys of %llu",
                    (unsigned long long)atomic_load(&sh->seen), (unsigned long long)n);
        wqb_result_add(&r, (double)n * 1e9 / (double)(sh->end - t0));
    }
    wqb_shared_free(sh, sizeof *sh);
    wqb_result_extra(&r, "n", (double)n, WQB_X_INT);
    wqb_emit(c, &r);
    wqb_queue_destroy(q, name);
}

void wqb_run_drain(const struct wqb_cfg *c)
{
    uint64_t n = wqb_size(c, 200000, 1000000);
    for (int consumers = 1; consumers <= DRAIN_MAX_C; consumers *= 2) {
        char variant[16];
        snprintf(variant, sizeof variant, "C=%d", consumers);
        wqb_drain_variant(c, variant, consumers, 1, 0, n);
    }
    /* Batches of 32, and one wq_done_get per key, for one and two. */
    static const struct { const char *suffix; int batch; } kinds[] = {
        { "b32", 32 }, { "dg", WQB_DONE_GET } };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int consumers = 1; consumers <= 2; consumers++) {
            char variant[16];
            snprintf(variant, sizeof variant, "C=%d-%s", consumers, kinds[k].suffix);
            wqb_drain_variant(c, variant, consumers, kinds[k].batch, 0, n);
        }
    /* Consumers that work on each key, one and two of them, on either
       side of lock.c's HAMMER_NS: a tenth of the keys, so that a
       repetition stays near the others' length. */
    static const struct { const char *suffix; uint64_t ns; } works[] = {
        { "w250ns", 250 }, { "w1us", 1000 } };
    for (size_t w = 0; w < sizeof works / sizeof works[0]; w++)
        for (int consumers = 1; consumers <= 2; consumers++) {
            char variant[16];
            snprintf(variant, sizeof variant, "C=%d-%s", consumers, works[w].suffix);
            wqb_drain_variant(c, variant, consumers, 1, works[w].ns, n / 10);
        }
    wqb_pool_variant(c, "pool-C=1", 1, n);
    wqb_pool_variant(c, "pool-C=2", 2, n);
}

/* ------------------------------------------------------------------ */
/* mpmc                                                                */
/* ------------------------------------------------------------------ */

#define HOT_KEYS 1000
#define MPMC_MAX 2

struct mpmc_shared {
    struct wqb_gate gate;
    _Atomic uint32_t producers_left;
    _Atomic uint64_t prod_end;
    uint64_t coalesced[MPMC_MAX];
    uint64_t processed[MPMC_MAX];
    uint64_t nsamples[MPMC_MAX];
    _Atomic uint64_t stamp[HOT_KEYS];   /* oldest unserved add, 0 = none */
    uint32_t samples[];                 /* [consumer][adds] latencies, ns (paced) */
};

struct mpmc_rep {
    double adds_per_s, p50, p99, processed, coalesced;
    double processed_per_s;   /* over the producers' span, as adds/s */
};

static size_t mpmc_size(const struct wqb_mpmc *p)
{
    /* samples: the paced variants' only */
    return sizeof(struct mpmc_shared) + (p->pace_ns ? MPMC_MAX * p->adds * sizeof(uint32_t) : 0);
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void atomic_max(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load(a);
    while (cur < v && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

static void mpmc_producer(const char *name, const struct wqb_mpmc *p,
                          struct mpmc_shared *sh, int id)
{
    wq *q = wqb_attach(name);
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(id + 1), coalesced = 0;
    uint64_t mine = p->adds / (uint64_t)p->producers;
    static char keys[HOT_KEYS][WQB_KEY_LEN];   /* formatted once */
    for (uint64_t k = 0; k < HOT_KEYS; k++)
        wqb_key(keys[k], k);
    if (id == 0)
        mine += p->adds % (uint64_t)p->producers;
    wqb_gate_arrive(&sh->gate);
    uint64_t t0 = sh->gate.t0;
    for (uint64_t i = 0; i < mine; i++) {
        uint64_t k = (xorshift(&rng) >> 32) % HOT_KEYS, none = 0;
        if (p->pace_ns) {
            wqb_pace_until(t0 + i * p->pace_ns * (uint64_t)p->producers);
            atomic_compare_exchange_strong(&sh->stamp[k], &none, wqb_now());
        }
        int rc = p->publish ? wq_add_publish(q, keys[k], WQB_KEY_LEN)
                            : wq_add(q, keys[k], WQB_KEY_LEN);
        wqb_check(rc, "mpmc: wq_add");
        coalesced += rc == 1;
    }
    atomic_max(&sh->prod_end, wqb_now());
    sh->coalesced[id] = coalesced;
    if (atomic_fetch_sub(&sh->producers_left, 1) == 1)
        wqb_check(wq_shutdown(q), "mpmc: wq_shutdown");
    wq_close(q);
    _exit(0);
}

static void mpmc_consumer(const char *name, const struct wqb_mpmc *p,
                          struct mpmc_shared *sh, int id)
{
    static struct taker t;
    t.q = wqb_attach(name);
    t.batch = p->batch;
    uint32_t *samples = p->pace_ns ? sh->samples + (size_t)id * p->adds : NULL;
    uint64_t processed = 0, ns = 0;
    const char *key;
    int len;
    wqb_gate_arrive(&sh->gate);
    while ((len = take(&t, &key, GET_TIMEOUT_NS)) > 0) {
        if (p->pace_ns) {
            uint64_t now = wqb_now();
            uint64_t s = atomic_exchange(&sh->stamp[wqb_key_index(key) % HOT_KEYS], 0);
            if (s != 0 && ns < p->adds)
                samples[ns++] = now > s ? (uint32_t)(now - s < UINT32_MAX ? now - s : UINT32_MAX)
                                        : 0;
        }
        processed++;
        finish(&t, key, len, "mpmc: wq_done");
    }
    if (len != -ESHUTDOWN)
        wqb_die("mpmc: wq_get: %s", wq_strerror(len));
    sh->processed[id] = processed;
    sh->nsamples[id] = ns;
    wq_close(t.q);
    _exit(0);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Percentiles over all consumers' samples (sorted in place). */
static void mpmc_latency(const struct wqb_mpmc *p, struct mpmc_shared *sh,
                         struct mpmc_rep *out)
{
    uint64_t n = 0;
    out->p50 = out->p99 = 0;
    if (!p->pace_ns)
        return;   /* no samples taken, none allocated */
    for (int i = 0; i < p->consumers; i++) {   /* compact into consumer 0's area */
        memmove(sh->samples + n, sh->samples + (size_t)i * p->adds,
                sh->nsamples[i] * sizeof(uint32_t));
        n += sh->nsamples[i];
    }
    qsort(sh->samples, n, sizeof(uint32_t), cmp_u32);
    out->p50 = n ? sh->samples[n / 2] : 0;
    out->p99 = n ? sh->samples[n * 99 / 100] : 0;
}

/* One repetition; wq_open's error if the queue could not be made. */
static int mpmc_rep(const struct wqb_mpmc *p, struct mpmc_rep *out)
{
    wq *q;
    char name[WQB_NAME_LEN];
    pid_t pid[2 * MPMC_MAX];
    int np = 0;
    struct wq_options o = { .capacity = 1024 };
    int rc = wqb_open_new("mpmc", &o, &q, name);
    if (rc < 0)
        return rc;
    size_t size = mpmc_size(p);
    struct mpmc_shared *sh = wqb_shared_alloc(size);
    sh->producers_left = (uint32_t)p->producers;
    for (int i = 0; i < p->consumers; i++)
        if ((pid[np++] = wqb_fork()) == 0)
            mpmc_consumer(name, p, sh, i);
    for (int i = 0; i < p->producers; i++)
        if ((pid[np++] = wqb_fork()) == 0)
            mpmc_producer(name, p, sh, i);
    uint64_t t0 = wqb_gate_release(&sh->gate, (uint32_t)np);
    for (int i = 0; i < np; i++)
        wqb_wait_child(pid[i]);
    out->adds_per_s = (double)p->adds * 1e9 / (double)(sh->prod_end - t0);
    out->processed = out->coalesced = 0;
    for (int i = 0; i < MPMC_MAX; i++) {
        out->processed += (double)sh->processed[i];
        out->coalesced += (double)sh->coalesced[i];
    }
    out->coalesced /= (double)p->adds;
    out->processed_per_s = out->processed * 1e9 / (double)(sh->prod_end - t0);
    mpmc_latency(p, sh, out);
    wqb_shared_free(sh, size);
    wqb_queue_destroy(q, name);
    return 0;
}

void wqb_mpmc_variant(const struct wqb_cfg *c, const struct wqb_mpmc *p)
{
    struct wqb_result r;
    double p50[WQB_MAX_REPS], p99[WQB_MAX_REPS], proc[WQB_MAX_REPS], coal[WQB_MAX_REPS];
    double proc_s[WQB_MAX_REPS];
    int reps = wqb_reps(c) < 3 ? wqb_reps(c) : 3;   /* costly: 3 are enough */
    if (!wqb_want(c, p->variant))
        return;
    if (p->producers < 1 || p->producers > MPMC_MAX || p->consumers < 1 ||
        p->consumers > MPMC_MAX)
        wqb_die("mpmc: 1 .. %d producers and consumers", MPMC_MAX);
    wqb_result_init(&r, "mpmc", p->variant, "adds/s");
    for (int i = 0; i < reps; i++) {
        struct mpmc_rep one;
        int rc = mpmc_rep(p, &one);
        if (rc < 0 && i == 0 && wqb_prefixed()) {
            wqb_skip_open(c, "mpmc", p->variant, rc);
            return;
        }
        if (rc < 0)
            wqb_die("mpmc: wq_open: %s", wq_strerror(rc));
        wqb_result_add(&r, one.adds_per_s);
        p50[i] = one.p50;
        p99[i] = one.p99;
        proc[i] = one.processed;
        coal[i] = one.coalesced;
        proc_s[i] = one.processed_per_s;
    }
    wqb_result_extra(&r, "adds", (double)p->adds, WQB_X_INT);
    wqb_result_extra(&r, "processed", wqb_median(proc, reps), WQB_X_INT);
    wqb_result_extra(&r, "processed_per_s", wqb_median(proc_s, reps), WQB_X_INT);
    wqb_result_extra(&r, "coalesced", wqb_median(coal, reps), WQB_X_FRAC);
    if (p->pace_ns) {
        wqb_result_extra(&r, "p50_ns", wqb_median(p50, reps), WQB_X_NS);
        wqb_result_extra(&r, "p99_ns", wqb_median(p99, reps), WQB_X_NS);
    }
    wqb_emit(c, &r);
}

void wqb_run_mpmc(const struct wqb_cfg *c)
{
    uint64_t adds = wqb_size(c, 200000, 1000000);
    uint64_t paced = c->mode == WQB_QUICK ? 12500 : 50000;   /* 0.25 s or 1 s */
    const struct wqb_mpmc v[] = {
        { "p1c1", 1, 1, adds, 0, 1, false },
        { "p1c2", 1, 2, adds, 0, 1, false },
        { "p2c1", 2, 1, adds, 0, 1, false },
        { "p2c2", 2, 2, adds, 0, 1, false },
        { "paced50k-p1c1", 1, 1, paced, 20000, 1, false },
        { "p1c1-b32", 1, 1, adds, 0, 32, false },
        { "p1c2-b32", 1, 2, adds, 0, 32, false },
        { "paced50k-p1c1-b32", 1, 1, paced, 20000, 32, false },
        { "p1c1-dg", 1, 1, adds, 0, WQB_DONE_GET, false },
        { "p1c2-dg", 1, 2, adds, 0, WQB_DONE_GET, false },
        { "p1c1-pub", 1, 1, adds, 0, 1, true },
        { "p1c2-pub", 1, 2, adds, 0, 1, true },
        { "p2c1-pub", 2, 1, adds, 0, 1, true },
        { "p2c2-pub", 2, 2, adds, 0, 1, true },
        { "paced50k-p1c1-pub", 1, 1, paced, 20000, 1, true },
        { "p1c1-dg-pub", 1, 1, adds, 0, WQB_DONE_GET, true },
        { "p1c2-dg-pub", 1, 2, adds, 0, WQB_DONE_GET, true },
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        wqb_mpmc_variant(c, &v[i]);
}

/* ------------------------------------------------------------------ */
/* starve                                                              */
/* ------------------------------------------------------------------ */

#define STARVE_OTHERS 10000
#define STARVE_WORK_NS (10ull * 1000 * 1000)
#define STARVE_A 90000000000ull   /* key index of A, apart from k0.. */

struct starve_shared {
    _Atomic uint32_t a_started;
    _Atomic uint64_t handed;      /* keys handed to the worker so far */
    _Atomic uint64_t a2_handed;   /* `handed` when A came back */
    _Atomic uint64_t a2_time;
    _Atomic uint64_t a1_done;     /* when A's first run called wq_done */
};

static void starve_worker(const char *name, struct starve_shared *sh)
{
    wq *q = wqb_attach(name);
    char buf[WQB_BUF_LEN];
    int len;
    while ((len = wq_get(q, buf, sizeof buf, GET_TIMEOUT_NS)) > 0) {
        uint64_t n = atomic_fetch_add(&sh->handed, 1) + 1;
        if (wqb_key_index(buf) == STARVE_A) {
            if (!atomic_load(&sh->a_started)) {
                atomic_store(&sh->a_started, 1);
                wqb_sleep_ns(STARVE_WORK_NS);   /* A's slow reconcile */
                wqb_check(wq_done(q, buf, (size_t)len), "starve: wq_done");
                atomic_store(&sh->a1_done, wqb_now());
                continue;
            } else {
                atomic_store(&sh->a2_handed, n);
                atomic_store(&sh->a2_time, wqb_now());
            }
        }
        wqb_check(wq_done(q, buf, (size_t)len), "starve: wq_done");
    }
    if (len != -ESHUTDOWN)
        wqb_die("starve: wq_get: %s", wq_strerror(len));
    wq_close(q);
    _exit(0);
}

/* Poll a shared word until non-zero (20 s at most). */
static uint64_t await_nonzero(_Atomic uint64_t *w, _Atomic uint32_t *w32)
{
    uint64_t limit = wqb_now() + 20ull * 1000000000u;
    for (;;) {
        uint64_t v = w ? atomic_load(w) : atomic_load(w32);
        if (v)
            return v;
        if (wqb_now() > limit)
            wqb_die("starve: the worker made no progress");
        wqb_sleep_ns(20 * 1000);
    }
}

struct starve_rep {
    double wait, ahead, add_ns, after_done;
};

/* One repetition: A's wait from re-add to get, and the details. */
static void starve_once(wq *q, const char *name, struct starve_rep *out)
{
    struct starve_shared *sh = wqb_shared_alloc(sizeof *sh);
    char key[WQB_KEY_LEN];
    pid_t pid = wqb_fork();
    if (pid == 0)
        starve_worker(name, sh);
    wqb_key(key, STARVE_A);
    wqb_check(wq_add(q, key, WQB_KEY_LEN), "starve: wq_add A");
    await_nonzero(NULL, &sh->a_started);
    uint64_t t_readd = wqb_now();
    if (wq_add(q, key, WQB_KEY_LEN) != 0)
        wqb_die("starve: re-adding A while processing did not mark it dirty");
    wqb_fill(q, 0, STARVE_OTHERS);
    out->add_ns = (double)(wqb_now() - t_readd);
    uint64_t t_a2 = await_nonzero(&sh->a2_time, NULL);
    out->ahead = (double)(atomic_load(&sh->a2_handed) - 2);   /* minus A's two gets */
    out->after_done = (double)(t_a2 - atomic_load(&sh->a1_done));
    out->wait = (double)(t_a2 - t_readd);
    wqb_check(wq_shutdown(q), "starve: wq_shutdown");
    wqb_wait_child(pid);
    wqb_shared_free(sh, sizeof *sh);
}

static void starve_variant(const struct wqb_cfg *c, const char *variant, unsigned flags)
{
    struct wqb_result r;
    double ahead[WQB_MAX_REPS], add_ns[WQB_MAX_REPS], after[WQB_MAX_REPS];
    int reps = wqb_reps(c);
    if (!wqb_want(c, variant))
        return;
    wqb_result_init(&r, "starve", variant, "ns");
    for (int i = 0; i < reps; i++) {
        wq *q;
        char name[WQB_NAME_LEN], why[128];
        struct wq_options o = { .capacity = 2 * STARVE_OTHERS, .flags = flags };
        int rc = wqb_open_new("starve", &o, &q, name);
        if (rc < 0 && i == 0 && flags) {
            snprintf(why, sizeof why, "wq_open with WQ_FAIR says %s", wq_strerror(rc));
            wqb_skip(c, "starve", variant, why);
            return;
        }
        wqb_check(rc, "starve: wq_open");
        struct starve_rep one;
        starve_once(q, name, &one);
        wqb_result_add(&r, one.wait);
        ahead[i] = one.ahead;
        add_ns[i] = one.add_ns;
        after[i] = one.after_done;
        wqb_queue_destroy(q, name);
    }
    wqb_result_extra(&r, "others", STARVE_OTHERS, WQB_X_INT);
    wqb_result_extra(&r, "work_ns", (double)STARVE_WORK_NS, WQB_X_NS);
    wqb_result_extra(&r, "ahead", wqb_median(ahead, reps), WQB_X_INT);
    wqb_result_extra(&r, "after_done_ns", wqb_median(after, reps), WQB_X_NS);
    wqb_result_extra(&r, "add_others_ns", wqb_median(add_ns, reps), WQB_X_NS);
    wqb_emit(c, &r);
}

/* ------------------------------------------------------------------ */
/* tenants                                                             */
/* ------------------------------------------------------------------ */

#define TENANT_FLOOD 100000
#define TENANT_BATCH 256

struct tenant_shared {
    _Atomic uint64_t handed;
    _Atomic uint64_t b_handed;   /* `handed` when b's key came out */
    _Atomic uint64_t b_time;
};

static void tenant_worker(const char *name, struct tenant_shared *sh)
{
    wq *q = wqb_attach(name);
    char buf[WQB_BUF_LEN];
    int len;
    while ((len = wq_get(q, buf, sizeof buf, GET_TIMEOUT_NS)) > 0) {
        uint64_t n = atomic_fetch_add(&sh->handed, 1) + 1;
        if (len == 3 && memcmp(buf, "b/x", 3) == 0) {
            atomic_store(&sh->b_handed, n);
            atomic_store(&sh->b_time, wqb_now());
        }
        wqb_check(wq_done(q, buf, (size_t)len), "tenants: wq_done");
    }
    if (len != -ESHUTDOWN)
        wqb_die("tenants: wq_get: %s", wq_strerror(len));
    wq_close(q);
    _exit(0);
}

static void tenants_variant(const struct wqb_cfg *c, const char *variant, unsigned flags)
{
    struct wqb_result r;
    double ahead[WQB_MAX_REPS];
    int reps = wqb_reps(c);
    if (!wqb_want(c, variant))
        return;
    wqb_result_init(&r, "tenants", variant, "ns");
    for (int i = 0; i < reps; i++) {
        wq *q;
        char name[WQB_NAME_LEN];
        struct wq_options o = { .capacity = TENANT_FLOOD + 16, .max_key_len = 16,
                                .flags = flags };
        wqb_check(wqb_open_new("tenants", &o, &q, name), "tenants: wq_open");
        struct tenant_shared *sh = wqb_shared_alloc(sizeof *sh);
        char keys[TENANT_BATCH][16];
        struct iovec iov[TENANT_BATCH];
        for (int k = 0; k < TENANT_FLOOD; k += TENANT_BATCH) {   /* the flood */
            int m = TENANT_FLOOD - k < TENANT_BATCH ? TENANT_FLOOD - k : TENANT_BATCH;
            for (int j = 0; j < m; j++) {
                iov[j].iov_base = keys[j];
                iov[j].iov_len = (size_t)snprintf(keys[j], sizeof keys[j], "a/%d", k + j);
            }
            if (wq_add_many(q, iov, (size_t)m) < 0)
                wqb_die("tenants: wq_add_many");
        }
        pid_t pid = wqb_fork();
        if (pid == 0)
            tenant_worker(name, sh);
        while (atomic_load(&sh->handed) < 100)   /* the worker is busy */
            wqb_sleep_ns(20 * 1000);
        uint64_t t_add = wqb_now();
        wqb_check(wq_add(q, "b/x", 3), "tenants: wq_add b/x");
        uint64_t before = atomic_load(&sh->handed);
        uint64_t limit = wqb_now() + 60ull * 1000000000u;
        while (!atomic_load(&sh->b_time)) {
            if (wqb_now() > limit)
                wqb_die("tenants: the quiet tenant's key never came out");
            wqb_sleep_ns(20 * 1000);
        }
        wqb_result_add(&r, (double)(atomic_load(&sh->b_time) - t_add));
        ahead[i] = (double)(atomic_load(&sh->b_handed) - before - 1);
        wqb_check(wq_shutdown(q), "tenants: wq_shutdown");
        wqb_wait_child(pid);
        wqb_shared_free(sh, sizeof *sh);
        wqb_queue_destroy(q, name);
    }
    wqb_result_extra(&r, "flood", TENANT_FLOOD, WQB_X_INT);
    wqb_result_extra(&r, "ahead", wqb_median(ahead, reps), WQB_X_INT);
    wqb_emit(c, &r);
}

void wqb_run_tenants(const struct wqb_cfg *c)
{
    tenants_variant(c, "default", 0);
    tenants_variant(c, "fair", WQ_FAIR);
}

void wqb_run_starve(const struct wqb_cfg *c)
{
    starve_variant(c, "default", 0);
    starve_variant(c, "fair", WQ_FAIR);
}
