/*
 * test-mp-store.c - the LMDB store under SIGKILL, with real processes.
 *
 * Chaos rounds (WQ_DURABLE_PROCESS twice, WQ_DURABLE_FSYNC once):
 *   P producer processes add distinct keys, each key once ("p<p>-<i>").
 *   Before each wq_add a producer logs the key as attempted (and moves its
 *   counter past it, so a restarted producer never adds it again); when
 *   wq_add returns 0 it logs it as acknowledged. W worker processes get
 *   keys and wq_done them, logging "done tried" before the call and "done
 *   acknowledged" when it returned 0. The supervisor (this process)
 *   SIGKILLs a random actor every 1-20 ms and restarts it; for the last
 *   40% of the round the workers stay dead, so a backlog of acknowledged,
 *   never processed keys builds up. After ~3 s every actor is SIGKILLed;
 *   the region is checked (dead holders reaped), then removed (wq_unlink)
 *   and rebuilt from the store. Per key,
 *   with R = times it is live in the region before the unlink, S = times
 *   it is live after the restore, A = times it appears at all afterwards:
 *     - never attempted: R == S == A == 0;
 *     - R <= 1, A <= 1 (no duplicates);
 *     - acknowledged and no wq_done ever tried: R == 1 and S == 1 (lost
 *       otherwise);
 *     - wq_done acknowledged: R == 0 and S == 0 (it may remain as an idle
 *       key kept for its failure count: a crash requeue counted one);
 *     - no wq_done tried and R == 1: S == 1 (a key is visible only once
 *       stored);
 *     - anything else (attempted not acknowledged, done cut short): free.
 *
 * Commit kills (fault build): a producer dies exactly before / after
 * LMDB's commit ("store.commit", "store.committed"); another process's
 * next add works at once (LMDB's writer lock recovered) and so does ours;
 * the region checks clean; after unlink + restore the killed key is there
 * once or not at all, every acknowledged key exactly once. The same for
 * a worker killed inside the commit of a wq_done's removal.
 *
 * main() runs the group in a child and removes the store directories and
 * any /dev/shm object of that child whatever happens to it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "t.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define KEYBUF 64

#define P 2
#define W 2
#define MAXPER 60000
#define NKEYS (P * MAXPER)
#define ROUND_MS 3000

/* ------------------------------------------------------------------ */
/* Stores, handles, fixtures                                           */
/* ------------------------------------------------------------------ */

/* Store directories (t_mkstore) and the fixtures: t.h. */

/* The test process's handle, tracked (t_track): the teardown closes it if
   a failed test (cmocka leaves it by longjmp) did not. */
static wq *mainq;

static struct wq_options mp_opts(const char *store, int durability)
{
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.capacity = 1u << 17; /* more than P * MAXPER: never full */
    o.max_key_len = 32;
    o.store_path = store;
    o.durability = durability;
    /* crash requeues come back within 1-8 ms */
    o.rl_limiters = WQ_RL_EXPONENTIAL;
    o.rl_base_delay_ns = 1 * MS;
    o.rl_max_delay_ns = 8 * MS;
    o.flags = WQ_CREATE | WQ_EXCL;
    return o;
}

static int nviolations;

/* The first few violations of a check (reset nviolations before it). */
static void report_first_few(const char *what, void *arg)
{
    if (nviolations++ < 5)
        fprintf(stderr, "  violation (%s): %s\n", (const char *)arg, what);
}

static int check_report(wq *q, unsigned flags, const char *ctx)
{
    nviolations = 0;
    int rc = wq_check_report(q, flags, report_first_few, (void *)ctx);
    if (nviolations > 5)
        fprintf(stderr, "  ... %d violations in all (%s)\n", nviolations, ctx);
    return rc;
}

/* ------------------------------------------------------------------ */
/* The shared log                                                      */
/* ------------------------------------------------------------------ */

struct mlog {
    _Atomic int next[P];             /* next index producer p attempts */
    _Atomic unsigned char attempted[NKEYS];
    _Atomic unsigned char acked[NKEYS];
    _Atomic unsigned char add_refused[NKEYS];
    _Atomic unsigned char done_tried[NKEYS];
    _Atomic unsigned char done_acked[NKEYS];
    _Atomic unsigned processed[NKEYS];
    _Atomic int started[P + W];
};

static struct mlog *lg;
static const char *qname;

static void chaos_key(char *buf, size_t cap, int idx)
{
    snprintf(buf, cap, "p%d-%06d", idx / MAXPER, idx % MAXPER);
}

/* -1 if not one of ours */
static int idx_of(const void *key, size_t len)
{
    char b[KEYBUF];
    if (len < 4 || len >= sizeof b)
        return -1;
    memcpy(b, key, len);
    b[len] = 0;
    int p, i;
    char extra;
    if (sscanf(b, "p%d-%d%c", &p, &i, &extra) != 2 || p < 0 || p >= P || i < 0 ||
        i >= MAXPER)
        return -1;
    char check[KEYBUF];
    chaos_key(check, sizeof check, p * MAXPER + i);
    if (strcmp(check, b) != 0)
        return -1;
    return p * MAXPER + i;
}

static wq *actor_open(void)
{
    wq *q = NULL;
    int rc = wq_open(qname, NULL, &q);
    if (rc != 0) {
        t_failf(__FILE__, __LINE__, "actor wq_open = %d (%s)", rc, wq_strerror(rc));
        _exit(1);
    }
    return q;
}

static void producer(int p)
{
    wq *q = actor_open();
    unsigned seed = (unsigned)getpid();
    char k[KEYBUF];
    atomic_fetch_add(&lg->started[p], 1);
    for (;;) {
        int i = atomic_load(&lg->next[p]);
        if (i >= MAXPER) {
            t_sleep_ms(1);
            continue;
        }
        int idx = p * MAXPER + i;
        /* Move past the key first: a restarted producer never adds it. */
        atomic_store(&lg->next[p], i + 1);
        atomic_store(&lg->attempted[idx], 1);
        chaos_key(k, sizeof k, idx);
        int rc = wq_add(q, KS(k));
        if (rc == 0) {
            atomic_store(&lg->acked[idx], 1);
        } else {
            atomic_store(&lg->add_refused[idx], 1);
            t_failf(__FILE__, __LINE__, "producer %d: wq_add(%s) = %d (%s)", p, k, rc,
                     wq_strerror(rc));
            t_sleep_ms(5);
        }
        if (rand_r(&seed) % 4 == 0)
            usleep(100 + rand_r(&seed) % 200);
    }
}

static void worker(int w)
{
    wq *q = actor_open();
    unsigned seed = (unsigned)getpid();
    char buf[KEYBUF];
    atomic_fetch_add(&lg->started[P + w], 1);
    for (;;) {
        int n = wq_get(q, buf, sizeof buf, 20 * (int64_t)MS);
        if (n == -ETIMEDOUT || n == -EAGAIN)
            continue;
        if (n < 0) {
            t_failf(__FILE__, __LINE__, "worker %d: wq_get = %d (%s)", w, n,
                     wq_strerror(n));
            t_sleep_ms(5);
            continue;
        }
        int idx = idx_of(buf, (size_t)n);
        if (idx < 0) {
            t_failf(__FILE__, __LINE__, "worker %d: got a foreign key %.*s", w, n, buf);
            continue;
        }
        if (!atomic_load(&lg->attempted[idx]))
            t_failf(__FILE__, __LINE__, "worker %d: got %.*s, never attempted", w, n,
                     buf);
        atomic_fetch_add(&lg->processed[idx], 1);
        if (rand_r(&seed) % 8 == 0)
            usleep(rand_r(&seed) % 300); /* "work" */
        atomic_store(&lg->done_tried[idx], 1);
        int rc = wq_done(q, buf, (size_t)n);
        if (rc == 0)
            atomic_store(&lg->done_acked[idx], 1);
        else
            t_failf(__FILE__, __LINE__, "worker %d: wq_done(%.*s) = %d (%s)", w, n, buf,
                     rc, wq_strerror(rc));
    }
}

static pid_t start_actor(int a)
{
    pid_t pid = t_fork(60);
    if (pid == 0) {
        if (a < P)
            producer(a);
        else
            worker(a - P);
        _exit(0);
    }
    return pid;
}

/* ------------------------------------------------------------------ */
/* Checking a round                                                    */
/* ------------------------------------------------------------------ */

struct counts {
    unsigned char *live; /* queued / processing / waiting / dirty */
    unsigned char *all;
    long foreign;
};

static int count_cb(const struct wq_key_info *ki, void *arg)
{
    struct counts *c = arg;
    int idx = idx_of(ki->key, ki->len);
    if (idx < 0) {
        c->foreign++;
        return 0;
    }
    if (c->all[idx] < 255)
        c->all[idx]++;
    if ((ki->state & (WQ_KEY_QUEUED | WQ_KEY_PROCESSING | WQ_KEY_WAITING |
                      WQ_KEY_DIRTY)) &&
        c->live[idx] < 255)
        c->live[idx]++;
    return 0;
}

static struct counts count_keys(wq *q)
{
    struct counts c = { calloc(NKEYS, 1), calloc(NKEYS, 1), 0 };
    if (c.live == NULL || c.all == NULL)
        fail_msg("calloc");
    int rc = wq_dump(q, count_cb, &c);
    if (rc != 0)
        fail_msg("wq_dump = %d", rc);
    return c;
}

struct totals {
    long rounds, kills, attempted, acked, processed, done_acked, restored, lost,
        duplicates, ghosts, resurrected, unstored_visible, never_attempted;
};
static struct totals tot;

static int chaos_round(int durability, unsigned seed)
{
    char ctx[64];
    snprintf(ctx, sizeof ctx, "round %ld (%s)", tot.rounds + 1, t_durability_name(durability));
    memset(lg, 0, sizeof *lg);
    const char *store = t_mkstore();
    qname = t_qname("chaos");
    struct wq_options o = mp_opts(store, durability);
    int rc = wq_open(qname, &o, &mainq);
    if (rc != 0)
        fail_msg("%s: wq_open = %d (%s)", ctx, rc, wq_strerror(rc));
    t_track(mainq);

    pid_t pids[P + W];
    for (int a = 0; a < P + W; a++)
        pids[a] = start_actor(a);
    /* Let everybody start once before the killing begins. */
    uint64_t t0 = t_now_ns();
    for (int a = 0; a < P + W; a++)
        while (atomic_load(&lg->started[a]) == 0 && t_now_ns() - t0 < 5 * SEC)
            t_sleep_ms(1);

    long kills = 0;
    uint64_t start = t_now_ns();
    uint64_t end = start + (uint64_t)ROUND_MS * MS;
    /* For the last 40% of the round the workers stay dead, so a backlog of
       acknowledged, never processed keys is there to be restored. */
    uint64_t workers_end = start + (uint64_t)ROUND_MS * 6 / 10 * MS;
    int workers_alive = 1;
    while (t_now_ns() < end) {
        /* Kills come as often as actors do their work: under valgrind
           (t_scale 10) an actor restarted every few ms did hardly any. */
        t_sleep_ms((1 + rand_r(&seed) % 20) * t_scale());
        if (workers_alive && t_now_ns() >= workers_end) {
            for (int w = P; w < P + W; w++) {
                kill(pids[w], SIGKILL);
                (void)t_wait(pids[w], 5000);
                pids[w] = -1;
                kills++;
            }
            workers_alive = 0;
        }
        int a = (int)(rand_r(&seed) % (workers_alive ? P + W : P));
        kill(pids[a], SIGKILL);
        int st = t_wait(pids[a], 5000);
        if (st != 128 + SIGKILL)
            t_failf(__FILE__, __LINE__, "%s: actor %d ended with status %d before "
                     "its SIGKILL", ctx, a, st);
        kills++;
        pids[a] = start_actor(a);
        if (t_failures() > 20)
            break;
    }
    for (int a = 0; a < P + W; a++)
        if (pids[a] > 0)
            kill(pids[a], SIGKILL);
    for (int a = 0; a < P + W; a++)
        if (pids[a] > 0)
            (void)t_wait(pids[a], 5000);
    T_ASSERT_BOARD_CLEAN();

    /* The region first: dead holders reaped, structure clean. */
    int found_region = check_report(mainq, WQ_CHECK_REAP, ctx);
    if (found_region != 0)
        fprintf(stderr, "  %s: wq_check = %d after the round (the key checks go on)\n",
                ctx, found_region);
    struct counts r = count_keys(mainq);
    t_close(mainq);
    rc = wq_unlink(qname);
    if (rc != 0)
        fail_msg("%s: wq_unlink = %d", ctx, rc);

    uint64_t tr = t_now_ns();
    rc = wq_open(qname, &o, &mainq); /* WQ_EXCL: a new region, restored */
    if (rc != 0)
        fail_msg("%s: reopen after unlink = %d (%s)", ctx, rc, wq_strerror(rc));
    t_track(mainq);
    double restore_ms = (double)(t_now_ns() - tr) / 1e6;
    int found_restored = check_report(mainq, 0, ctx);
    struct counts s = count_keys(mainq);

    long attempted = 0, acked = 0, processed = 0, done_acked = 0, restored = 0;
    long lost = 0, dups = 0, ghosts = 0, resurrected = 0, unstored = 0, never = 0;
    int first_bad = -1;
    char why[160] = "";
    for (int i = 0; i < NKEYS; i++) {
        int at = atomic_load(&lg->attempted[i]), ak = atomic_load(&lg->acked[i]);
        int dt = atomic_load(&lg->done_tried[i]), da = atomic_load(&lg->done_acked[i]);
        int R = r.live[i], S = s.live[i], A = s.all[i];
        attempted += at;
        acked += ak;
        processed += atomic_load(&lg->processed[i]) != 0;
        done_acked += da;
        restored += S;
        char k[KEYBUF];
        chaos_key(k, sizeof k, i);
#define BAD(counter, ...)                                                    \
        do {                                                                 \
            counter++;                                                       \
            if (first_bad < 0) {                                             \
                first_bad = i;                                               \
                snprintf(why, sizeof why, __VA_ARGS__);                      \
            }                                                                \
        } while (0)
        if (!at && (R || A || r.all[i])) {
            BAD(never, "%s never attempted, in the region %d, restored %d", k, r.all[i], A);
            continue;
        }
        if (R > 1 || A > 1 || r.all[i] > 1)
            BAD(dups, "%s: %d times in the region, %d after restore", k, r.all[i], A);
        if (ak && !dt && (R != 1 || S != 1))
            BAD(lost, "%s acknowledged, never done: live %d in the region, %d restored",
                k, R, S);
        if (da && (R || S))
            BAD(resurrected, "%s done (acknowledged) but live: %d in the region, %d "
                "restored", k, R, S);
        if (!dt && R == 1 && S != 1)
            BAD(unstored, "%s visible in the region (never done) but not in the store "
                "(restored %d, acknowledged %d)", k, S, ak);
        if (at && !ak && R == 0 && S == 1)
            ghosts++;
#undef BAD
    }
    free(r.live);
    free(r.all);
    free(s.live);
    free(s.all);
    struct wq_stats st;
    assert_int_equal(wq_stats(mainq, &st), 0);
    printf("  %s: %ld kills, %ld attempted, %ld acknowledged, %ld processed, %ld done, "
           "%ld restored (live %" PRIu64 ", idle %" PRIu64 ") in %.1f ms; lost %ld, "
           "duplicates %ld, done-but-back %ld, visible-unstored %ld, never-attempted %ld, "
           "stored-not-visible %ld\n",
           ctx, kills, attempted, acked, processed, done_acked, restored, st.live,
           st.failing, restore_ms, lost, dups, resurrected, unstored, never, ghosts);
    fflush(stdout);
    if (r.foreign || s.foreign)
        fail_msg("%s: foreign keys: %ld in the region, %ld restored", ctx, r.foreign,
                 s.foreign);
    if ((uint64_t)restored != st.live)
        fail_msg("%s: %ld live keys counted, stats.live %" PRIu64, ctx, restored, st.live);
    tot.rounds++;
    tot.kills += kills;
    tot.attempted += attempted;
    tot.acked += acked;
    tot.processed += processed;
    tot.done_acked += done_acked;
    tot.restored += restored;
    tot.lost += lost;
    tot.duplicates += dups;
    tot.ghosts += ghosts;
    tot.resurrected += resurrected;
    tot.unstored_visible += unstored;
    tot.never_attempted += never;
    if (lost || dups || resurrected || unstored || never)
        fail_msg("%s: first problem: %s%s", ctx, why,
                 found_region ? " (and wq_check failed after the round)" : "");
    if (found_region != 0 || found_restored != 0)
        fail_msg("%s: wq_check = %d after the round, %d after the restore", ctx,
                 found_region, found_restored);
    if (restored < 50)
        fail_msg("%s: only %ld keys live at the end: the restore was hardly tested", ctx,
                 restored);
    if (acked < 100 || done_acked < 100)
        fail_msg("%s: too little traffic (%ld acknowledged, %ld done)", ctx, acked,
                 done_acked);
    t_close(mainq);
    return 0;
}

static unsigned base_seed(void)
{
    const char *e = getenv("WQ_TEST_SEED");
    unsigned s = e ? (unsigned)strtoul(e, NULL, 0) : (unsigned)(t_now_ns() ^ getpid());
    printf("  seed %u (WQ_TEST_SEED to replay the kill schedule)\n", s);
    return s;
}

static void test_chaos(void **state)
{
    (void)state;
    t_watchdog(60 * t_scale());
    lg = t_shared_alloc(sizeof *lg);
    unsigned seed = base_seed();
    chaos_round(WQ_DURABLE_PROCESS, seed);
    chaos_round(WQ_DURABLE_PROCESS, seed + 1);
    /* Under valgrind an fsync round carries too little traffic in its
       time to test anything (the minimum-traffic check would fail); the
       memory checking is done by the two rounds above, and the fsync path
       by the commit-kill tests below. */
    if (!getenv("WQ_TEST_VALGRIND"))
        chaos_round(WQ_DURABLE_FSYNC, seed + 2);
    printf("totals: rounds %ld, kills %ld, acknowledged %ld, done %ld, restored %ld, "
           "lost=%ld, duplicates=%ld, done-but-back=%ld\n",
           tot.rounds, tot.kills, tot.acked, tot.done_acked, tot.restored, tot.lost,
           tot.duplicates, tot.resurrected);
    t_shared_free(lg, sizeof *lg);
    lg = NULL;
}

/* ------------------------------------------------------------------ */
/* Killed inside LMDB's commit                                         */
/* ------------------------------------------------------------------ */

struct fshared {
    int rc;
    int reached;
    uint64_t t_add;
    char points[1024];
};

struct one_key {
    const char *k;
    int all, live;
};

static int one_key_cb(const struct wq_key_info *ki, void *arg)
{
    struct one_key *c = arg;
    if (ki->len == strlen(c->k) && memcmp(ki->key, c->k, ki->len) == 0) {
        c->all++;
        if (ki->state & (WQ_KEY_QUEUED | WQ_KEY_PROCESSING | WQ_KEY_WAITING))
            c->live++;
    }
    return 0;
}

/* How many times k is in the queue (*live: as a live key). */
static int count_key(wq *q, const char *k, int *live)
{
    struct one_key c = { k, 0, 0 };
    assert_int_equal(wq_dump(q, one_key_cb, &c), 0);
    if (live)
        *live = c.live;
    return c.all;
}

/* Which store.* points one wq_add and one wq_done reach. */
static void test_record_points(void **state)
{
    (void)state;
    struct fshared *sh = t_shared_alloc(sizeof *sh);
    const char *store = t_mkstore();
    qname = t_qname("points");
    struct wq_options o = mp_opts(store, WQ_DURABLE_PROCESS);
    mainq = t_track(T_OPEN(qname, &o));
    pid_t c = t_fork(20);
    if (c == 0) {
        wq *q = actor_open();
        char buf[KEYBUF];
        wq_fault_record(true);
        int rc = wq_add(q, KS("probe"));
        int n = wq_get(q, buf, sizeof buf, 0);
        int rd = n > 0 ? wq_done(q, buf, (size_t)n) : n;
        wq_fault_record(false);
        const char *names[256];
        int m = wq_fault_seen(names, 256);
        size_t used = 0;
        for (int i = 0; i < m; i++)
            if (strncmp(names[i], "store.", 6) == 0 && used < sizeof sh->points - 64)
                used += (size_t)snprintf(sh->points + used, sizeof sh->points - used,
                                         "%s ", names[i]);
        wq_close(q);
        _exit(rc == 0 && rd == 0 ? 0 : 1);
    }
    assert_int_equal(t_wait(c, 15000), 0);
    printf("  store points reached by add+get+done: %s\n", sh->points);
    int has_commit = strstr(sh->points, "store.commit ") != NULL;
    int has_committed = strstr(sh->points, "store.committed ") != NULL;
    t_close(mainq);
    t_shared_free(sh, sizeof *sh);
    if (!has_commit || !has_committed)
        fail_msg("crash points store.commit / store.committed not reached by wq_add");
}

/* A producer dies at `point` inside its wq_add of "victim". */
static void commit_kill(const char *point, int durability)
{
    char ctx[96];
    snprintf(ctx, sizeof ctx, "%s/%s", point, t_durability_name(durability));
    struct fshared *sh = t_shared_alloc(sizeof *sh);
    const char *store = t_mkstore();
    qname = t_qname("commit");
    struct wq_options o = mp_opts(store, durability);
    mainq = t_track(T_OPEN(qname, &o));
    char k[16];
    for (int i = 0; i < 10; i++) {
        snprintf(k, sizeof k, "b%d", i);
        assert_int_equal(wq_add(mainq, KS(k)), 0);
    }

    sh->rc = 1;
    pid_t v = t_fork(20);
    if (v == 0) {
        wq *q = actor_open();
        wq_fault_arm(point, 1, WQ_FAULT_KILL);
        sh->rc = wq_add(q, KS("victim"));
        _exit(3);
    }
    int st = t_wait(v, 15000);
    if (st != 128 + SIGKILL)
        fail_msg("%s: the producer ended with %d (wq_add = %d), expected to die at the "
                 "point", ctx, st, sh->rc);

    /* Another process adds at once: LMDB's writer lock is recovered. */
    pid_t c = t_fork(20);
    if (c == 0) {
        wq *q = actor_open();
        alarm(10);
        uint64_t t = t_now_ns();
        sh->rc = wq_add(q, KS("after-child"));
        sh->t_add = t_now_ns() - t;
        wq_close(q);
        _exit(0);
    }
    st = t_wait(c, 15000);
    if (st != 0 || sh->rc != 0)
        fail_msg("%s: the next add in another process: status %d, wq_add = %d (%s)", ctx,
                 st, sh->rc, wq_strerror(sh->rc));
    if (sh->t_add > 2 * SEC)
        fail_msg("%s: the next add took %.1f ms", ctx, (double)sh->t_add / 1e6);
    uint64_t t = t_now_ns();
    assert_int_equal(wq_add(mainq, KS("after-main")), 0);
    double ms_main = (double)(t_now_ns() - t) / 1e6;

    int found = check_report(mainq, WQ_CHECK_REAP, ctx);
    if (found != 0)
        fail_msg("%s: wq_check = %d", ctx, found);
    int vlive, vall = count_key(mainq, "victim", &vlive);
    if (vall > 1)
        fail_msg("%s: victim %d times in the region", ctx, vall);
    t_close(mainq);
    assert_int_equal(wq_unlink(qname), 0);
    mainq = t_track(T_OPEN(qname, &o));
    found = check_report(mainq, 0, ctx);
    if (found != 0)
        fail_msg("%s: wq_check = %d after the restore", ctx, found);
    int rlive, rall = count_key(mainq, "victim", &rlive);
    printf("  %s: next add in another process %.2f ms, here %.2f ms; victim: region %d, "
           "restored %d\n", ctx, (double)sh->t_add / 1e6, ms_main, vlive, rall);
    if (rall > 1)
        fail_msg("%s: victim restored %d times", ctx, rall);
    if (vlive == 1 && rall != 1)
        fail_msg("%s: victim was visible in the region but is not in the store", ctx);
    const char *must[12] = { "after-child", "after-main" };
    static char bk[10][8];
    for (int i = 0; i < 10; i++) {
        snprintf(bk[i], sizeof bk[i], "b%d", i);
        must[2 + i] = bk[i];
    }
    for (int i = 0; i < 12; i++) {
        int l, a = count_key(mainq, must[i], &l);
        if (a != 1 || l != 1)
            fail_msg("%s: acknowledged %s restored %d times (%d live)", ctx, must[i], a, l);
    }
    struct wq_stats s;
    assert_int_equal(wq_stats(mainq, &s), 0);
    assert_int_equal(s.live, 12 + (uint64_t)rall);
    t_close(mainq);
    t_shared_free(sh, sizeof *sh);
}

/* A worker dies at `point` inside the wq_done of its key. */
static void done_kill(const char *point)
{
    char ctx[96];
    snprintf(ctx, sizeof ctx, "done %s", point);
    struct fshared *sh = t_shared_alloc(sizeof *sh);
    const char *store = t_mkstore();
    qname = t_qname("donekill");
    struct wq_options o = mp_opts(store, WQ_DURABLE_PROCESS);
    mainq = t_track(T_OPEN(qname, &o));
    assert_int_equal(wq_add(mainq, KS("d0")), 0);
    assert_int_equal(wq_add(mainq, KS("d1")), 0);
    sh->rc = 1;
    pid_t v = t_fork(20);
    if (v == 0) {
        wq *q = actor_open();
        char buf[KEYBUF];
        int n = wq_get(q, buf, sizeof buf, 0);
        sh->reached = n;
        wq_fault_arm(point, 1, WQ_FAULT_KILL);
        sh->rc = wq_done(q, buf, n > 0 ? (size_t)n : 0);
        _exit(3);
    }
    int st = t_wait(v, 15000);
    assert_int_equal(sh->reached, 2);
    if (st != 128 + SIGKILL) {
        printf("  %s: the worker ended with %d (wq_done = %d): the point is not on the "
               "removal path (informational)\n", ctx, st, sh->rc);
        t_close(mainq);
        t_shared_free(sh, sizeof *sh);
        return;
    }
    pid_t c = t_fork(20);
    if (c == 0) {
        wq *q = actor_open();
        alarm(10);
        sh->rc = wq_add(q, KS("after-child"));
        wq_close(q);
        _exit(0);
    }
    st = t_wait(c, 15000);
    if (st != 0 || sh->rc != 0)
        fail_msg("%s: the next add in another process: status %d, wq_add = %d", ctx, st,
                 sh->rc);
    assert_int_equal(wq_check(mainq, WQ_CHECK_REAP), 0);
    int l0, a0 = count_key(mainq, "d0", &l0);
    t_close(mainq);
    assert_int_equal(wq_unlink(qname), 0);
    mainq = t_track(T_OPEN(qname, &o));
    int rl0, ra0 = count_key(mainq, "d0", &rl0);
    int l1, a1 = count_key(mainq, "d1", &l1);
    int la, aa = count_key(mainq, "after-child", &la);
    printf("  %s: d0 (done cut short) region %d/%d live, restored %d/%d live\n", ctx, l0,
           a0, rl0, ra0);
    if (a0 > 1 || ra0 > 1)
        fail_msg("%s: d0 duplicated", ctx);
    if (a1 != 1 || l1 != 1 || aa != 1 || la != 1)
        fail_msg("%s: acknowledged keys restored d1 %d/%d after-child %d/%d", ctx, a1,
                 l1, aa, la);
    assert_int_equal(wq_check(mainq, 0), 0);
    t_close(mainq);
    t_shared_free(sh, sizeof *sh);
}

static void test_commit_kills(void **state)
{
    (void)state;
    t_watchdog(60 * t_scale());
    commit_kill("store.commit", WQ_DURABLE_PROCESS);
    commit_kill("store.committed", WQ_DURABLE_PROCESS);
    commit_kill("store.journal", WQ_DURABLE_FSYNC);
    commit_kill("store.journaled", WQ_DURABLE_FSYNC);
    done_kill("store.commit");
    done_kill("store.committed");
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

int main(void)
{
    static const struct CMUnitTest tests[] = {
        T_STORE_TEST(test_record_points),
        T_STORE_TEST(test_commit_kills),
        T_STORE_TEST(test_chaos),
        T_NO_LEFTOVERS,
    };
    static const struct t_guard g = {
        .prog = "test-mp-store",
        .max_stores = 32,
        .deadline_s = 150,
        T_GUARD_TESTS(tests),
    };
    return t_guard_main(&g);
}
