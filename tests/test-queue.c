/*
 * test-queue.c - the core queue against Kubernetes client-go's
 * util/workqueue/queue_test.go, scenario by scenario.
 *
 * Every scenario runs four times: threads sharing one handle, threads with
 * a handle each, forked children that wq_open() the queue, and forked
 * children that use the handle inherited from the parent.
 *
 * Two kinds of scenarios:
 *   - scripts: a list of steps, each executed by one named actor (a thread
 *     or a process that lives for the whole script, so "the process that
 *     got the key" stays alive until its Done). A step is synchronous
 *     (the coordinator waits for its result and checks it) or asynchronous
 *     (it may block; a later WAIT step checks its result, a PENDING step
 *     checks that it is still blocked). This ports the sequential client-go
 *     tests (TestLen, TestReinsert, TestAdd/collapse, TestFind, the drain
 *     tests) with exact expected return values.
 *   - teams: producers and consumers running concurrently (TestBasic,
 *     TestAddWhileProcessing), with witnesses in shared memory.
 *
 * Only the main thread of the test process uses cmocka asserts; actors
 * write to the failure board (t.h). TestGarbageCollection is about
 * Go's garbage collector and has no C counterpart (skipped).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_timedjoin_np, setgroups */
#endif
#include "t.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ================================================================== */
/* Script engine                                                       */
/* ================================================================== */

enum op {
    S_ADD, S_GET, S_DONE, S_LEN, S_SHUTDOWN, S_DRAIN, S_SHUTTING, S_STATE,
    C_WAIT, C_PENDING, C_SLEEP,
};

struct step {
    int actor;          /* -1: the coordinator (C_* ops) */
    enum op op;
    const char *key;    /* ADD/DONE/STATE; GET: expected key when expect>0 */
    int64_t timeout;    /* GET/DRAIN: timeout ns; C_WAIT/C_SLEEP: ms */
    int expect;         /* expected return value (STATE: state bits, 0 absent) */
    int async;          /* do not wait for it; tag names it for C_WAIT */
    int tag;
    int ref;            /* C_WAIT/C_PENDING: tag; STATE: owner actor, -1
                           for none, -2 for any actor of the script */
    int64_t pos;        /* STATE: expected FIFO position or -1 */
    int min_ms;         /* the call must take at least this long */
};

#define KL(k) ((int)(sizeof(k) - 1))
#define ADD(a, k, e)  { .actor = a, .op = S_ADD, .key = k, .expect = e }
#define DONE(a, k, e) { .actor = a, .op = S_DONE, .key = k, .expect = e }
#define GET(a, k, t)  { .actor = a, .op = S_GET, .key = k, .timeout = t, \
                        .expect = KL(k) }
#define GETX(a, t, e) { .actor = a, .op = S_GET, .timeout = t, .expect = e }
#define AGET(a, t, e, tg) { .actor = a, .op = S_GET, .timeout = t, \
                            .expect = e, .async = 1, .tag = tg }
#define AGETK(a, k, t, tg) { .actor = a, .op = S_GET, .key = k, \
                             .timeout = t, .expect = KL(k), .async = 1, \
                             .tag = tg }
#define LEN(a, e)     { .actor = a, .op = S_LEN, .expect = e }
#define SHUTDOWN(a)   { .actor = a, .op = S_SHUTDOWN, .expect = 0 }
#define ASHUTDOWN(a, tg) { .actor = a, .op = S_SHUTDOWN, .expect = 0, \
                           .async = 1, .tag = tg }
#define DRAIN(a, t, e) { .actor = a, .op = S_DRAIN, .timeout = t, .expect = e }
#define DRAINT(a, t, e, ms) { .actor = a, .op = S_DRAIN, .timeout = t, \
                              .expect = e, .min_ms = ms }
#define ADRAIN(a, t, e, tg) { .actor = a, .op = S_DRAIN, .timeout = t, \
                              .expect = e, .async = 1, .tag = tg }
#define SHUTTING(a, e) { .actor = a, .op = S_SHUTTING, .expect = e }
#define STATE(a, k, bits, owner, p) { .actor = a, .op = S_STATE, .key = k, \
                                      .expect = bits, .ref = owner, .pos = p }
#define ABSENT(a, k)  STATE(a, k, 0, -1, -1)
#define WAIT(tg, ms)  { .actor = -1, .op = C_WAIT, .ref = tg, .timeout = ms }
#define PENDING(tg)   { .actor = -1, .op = C_PENDING, .ref = tg }
#define SLEEP(ms)     { .actor = -1, .op = C_SLEEP, .timeout = ms }

#define QUEUED_DIRTY (WQ_KEY_QUEUED | WQ_KEY_DIRTY)

#define MAX_STEPS 64
#define MAX_ACTORS 8

struct sctx {
    const struct step *steps;
    int nsteps;
    atomic_int cur;
    atomic_int stop;
    atomic_int taken[MAX_STEPS];
    atomic_int fin[MAX_STEPS];
    int res[MAX_STEPS];
    uint64_t t0[MAX_STEPS], t1[MAX_STEPS];
    unsigned char got[MAX_STEPS][T_KEYBUF];
    int state[MAX_STEPS];
    pid_t owner[MAX_STEPS];
    uint64_t pos[MAX_STEPS];
    pid_t pid[MAX_ACTORS];
};

struct find_arg {
    const char *key;
    size_t len;
    int found;
    unsigned state;
    pid_t owner;
    uint64_t pos;
};

static int find_cb(const struct wq_key_info *info, void *arg)
{
    struct find_arg *f = arg;
    if (info->len == f->len && memcmp(info->key, f->key, f->len) == 0) {
        f->found++;
        f->state = info->state;
        f->owner = info->owner_pid;
        f->pos = info->position;
    }
    return 0;
}

static void exec_step(struct sctx *c, wq *q, int i)
{
    const struct step *s = &c->steps[i];
    size_t kl = s->key ? strlen(s->key) : 0;
    int r = 0;

    /* Deadlines stretch on slow machines (valgrind); a timeout that is
       expected to expire, or whose duration is checked, does not. */
    int64_t timeout = s->timeout;
    if (timeout > 0 && s->min_ms == 0 && s->expect != -ETIMEDOUT)
        timeout *= t_scale();

    c->t0[i] = t_now_ns();
    switch (s->op) {
    case S_ADD:
        r = wq_add(q, s->key, kl);
        break;
    case S_DONE:
        r = wq_done(q, s->key, kl);
        break;
    case S_GET: {
        unsigned char buf[T_KEYBUF];
        r = wq_get(q, buf, sizeof buf, timeout);
        if (r > 0 && r <= T_KEYBUF)
            memcpy(c->got[i], buf, (size_t)r);
        break;
    }
    case S_LEN:
        r = wq_len(q);
        break;
    case S_SHUTDOWN:
        r = wq_shutdown(q);
        break;
    case S_DRAIN:
        r = wq_shutdown_drain(q, timeout);
        break;
    case S_SHUTTING:
        r = wq_shutting_down(q) ? 1 : 0;
        break;
    case S_STATE: {
        struct find_arg f = { .key = s->key, .len = kl };
        int d = wq_dump(q, find_cb, &f);
        if (d != 0) {
            r = -10000 + d; /* reported as a dump failure */
            break;
        }
        if (f.found > 1) {
            r = -20000 - f.found; /* a key listed twice */
            break;
        }
        r = f.found ? (int)f.state : 0;
        c->owner[i] = f.owner;
        c->pos[i] = f.pos;
        break;
    }
    default:
        r = -99999;
    }
    c->res[i] = r;
    c->t1[i] = t_now_ns();
}

static int script_actor(struct t_actor *a)
{
    struct sctx *c = a->arg;

    c->pid[a->id] = getpid();
    for (;;) {
        if (atomic_load(&c->stop))
            return 0;
        int i = atomic_load(&c->cur);
        if (i >= 0 && i < c->nsteps && c->steps[i].actor == a->id &&
            atomic_load(&c->taken[i]) == 0) {
            atomic_store(&c->taken[i], 1);
            exec_step(c, a->q, i);
            atomic_store(&c->fin[i], 1);
            continue;
        }
        usleep(100);
    }
}

static const char *op_name(enum op op)
{
    static const char *n[] = { "ADD", "GET", "DONE", "LEN", "SHUTDOWN",
                               "DRAIN", "SHUTTING_DOWN", "STATE", "WAIT",
                               "PENDING", "SLEEP" };
    return n[op];
}

/* Checks the result of step i; writes a message and returns -1 if wrong. */
static int check_step(struct sctx *c, int i, char *err, size_t cap)
{
    const struct step *s = &c->steps[i];
    int r = c->res[i];
    const char *k = s->key ? s->key : "";

    if (r != s->expect) {
        snprintf(err, cap, "step %d: actor %d %s(\"%s\") returned %d (%s), "
                 "expected %d (%s)", i, s->actor, op_name(s->op), k, r,
                 r < 0 ? wq_strerror(r) : "ok", s->expect,
                 s->expect < 0 ? wq_strerror(s->expect) : "ok");
        return -1;
    }
    if (s->op == S_GET && r > 0 && s->key != NULL &&
        ((size_t)r != strlen(s->key) || memcmp(c->got[i], s->key, (size_t)r))) {
        snprintf(err, cap, "step %d: actor %d GET returned \"%.*s\", "
                 "expected \"%s\"", i, s->actor, r, (const char *)c->got[i],
                 s->key);
        return -1;
    }
    if (s->op == S_STATE && r != 0) {
        pid_t want = s->ref >= 0 ? c->pid[s->ref] : 0;
        uint64_t wpos = s->pos >= 0 ? (uint64_t)s->pos : UINT64_MAX;
        if (s->ref == -2) { /* any actor of the script */
            want = -1;
            for (int a = 0; a < MAX_ACTORS; a++)
                if (c->pid[a] != 0 && c->pid[a] == c->owner[i])
                    want = c->owner[i];
        }
        if (c->owner[i] != want) {
            snprintf(err, cap, "step %d: key \"%s\" owner_pid %ld, expected "
                     "%ld", i, k, (long)c->owner[i], (long)want);
            return -1;
        }
        if (c->pos[i] != wpos) {
            snprintf(err, cap, "step %d: key \"%s\" position %" PRIu64
                     ", expected %" PRIu64, i, k, c->pos[i], wpos);
            return -1;
        }
    }
    if (s->min_ms > 0 &&
        c->t1[i] - c->t0[i] < (uint64_t)s->min_ms * 1000000u) {
        snprintf(err, cap, "step %d: %s returned after %.1f ms, expected at "
                 "least %d ms", i, op_name(s->op),
                 (double)(c->t1[i] - c->t0[i]) / 1e6, s->min_ms);
        return -1;
    }
    return 0;
}

static int wait_flag(atomic_int *f, int64_t ms)
{
    uint64_t deadline = t_now_ns() + (uint64_t)ms * t_scale() * 1000000u;
    while (atomic_load(f) == 0) {
        if (t_now_ns() >= deadline)
            return -1;
        usleep(100);
    }
    return 0;
}

static int find_tag(const struct step *steps, int n, int tag)
{
    for (int j = 0; j < n; j++)
        if (steps[j].async && steps[j].tag == tag)
            return j;
    return -1;
}

static int coordinate(struct sctx *c, char *err, size_t cap)
{
    const struct step *steps = c->steps;

    for (int i = 0; i < c->nsteps; i++) {
        const struct step *s = &steps[i];
        if (s->actor < 0) {
            int j = s->op == C_SLEEP ? 0 : find_tag(steps, c->nsteps, s->ref);
            if (j < 0) {
                snprintf(err, cap, "script bug: step %d: no tag %d", i, s->ref);
                return -1;
            }
            switch (s->op) {
            case C_SLEEP:
                t_sleep_ms((unsigned)s->timeout);
                break;
            case C_PENDING:
                if (atomic_load(&c->fin[j])) {
                    snprintf(err, cap, "step %d: async step %d (actor %d %s) "
                             "returned %d (%s) too early", i, j, steps[j].actor,
                             op_name(steps[j].op), c->res[j],
                             wq_strerror(c->res[j]));
                    return -1;
                }
                break;
            case C_WAIT:
                if (wait_flag(&c->fin[j], s->timeout ? s->timeout : 5000)) {
                    snprintf(err, cap, "step %d: async step %d (actor %d %s) "
                             "still blocked after %" PRId64 " ms", i, j,
                             steps[j].actor, op_name(steps[j].op),
                             s->timeout ? s->timeout : 5000);
                    return -1;
                }
                if (check_step(c, j, err, cap))
                    return -1;
                break;
            default:
                snprintf(err, cap, "script bug at step %d", i);
                return -1;
            }
            continue;
        }
        atomic_store(&c->cur, i);
        if (wait_flag(&c->taken[i], 5000)) {
            snprintf(err, cap, "step %d: actor %d never picked it up", i,
                     s->actor);
            return -1;
        }
        if (s->async)
            continue;
        int64_t limit = 5000;
        if ((s->op == S_GET || s->op == S_DRAIN) && s->timeout > 0)
            limit += s->timeout / 1000000;
        if (wait_flag(&c->fin[i], limit)) {
            snprintf(err, cap, "step %d: actor %d %s(\"%s\") still blocked "
                     "after %" PRId64 " ms", i, s->actor, op_name(s->op),
                     s->key ? s->key : "", limit);
            return -1;
        }
        if (check_step(c, i, err, cap))
            return -1;
    }
    /* Every asynchronous step must have been waited for by the script. */
    for (int i = 0; i < c->nsteps; i++) {
        if (steps[i].async && !atomic_load(&c->fin[i])) {
            snprintf(err, cap, "async step %d (actor %d %s) never returned", i,
                     steps[i].actor, op_name(steps[i].op));
            return -1;
        }
    }
    return 0;
}

static void run_script(enum t_mode mode, const char *tag,
                       const struct step *steps, int n)
{
    const char *name;
    wq *q = t_create(tag, T_OPTS(.capacity = 1024), &name);
    struct sctx *c = t_shared_alloc(sizeof *c);
    char err[512] = "";
    int nactors = 0;

    assert_true(n <= MAX_STEPS);
    for (int i = 0; i < n; i++)
        if (steps[i].actor + 1 > nactors)
            nactors = steps[i].actor + 1;
    assert_true(nactors <= MAX_ACTORS);

    c->steps = steps;
    c->nsteps = n;
    atomic_store(&c->cur, -1);

    struct t_team *t = t_team_start(mode, name, q, nactors, script_actor, c);
    int rc = coordinate(c, err, sizeof err);
    atomic_store(&c->stop, 1);
    int failed = t_team_wait(t, 10000);
    struct wq_stats st;
    int src = wq_stats(q, &st);
    int crc = wq_check(q, 0);

    wq_close(q);
    t_shared_free(c, sizeof *c);
    if (rc != 0)
        fail_msg("[%s] %s", t_mode_name(mode), err);
    T_ASSERT_BOARD_CLEAN();
    assert_int_equal(failed, 0);
    assert_int_equal(src, 0);
    /* Every actor closed its handle (or shared ours): one slot left. */
    assert_int_equal(st.processes, 1);
    assert_int_equal(st.crash_requeues_total, 0);
    assert_int_equal(crc, 0);
}

/* ================================================================== */
/* Scripts                                                             */
/* ================================================================== */

/* client-go TestLen. */
static const struct step s_len[] = {
    ADD(0, "foo", 0),
    LEN(1, 1),
    ADD(2, "bar", 0),
    LEN(3, 2),
    ADD(4, "foo", 1), /* should not increase the queue length */
    LEN(5, 2),
};

/* client-go TestReinsert. Done is called by another actor than the getter
   (any process may call wq_done). */
static const struct step s_reinsert[] = {
    ADD(0, "foo", 0),
    GET(1, "foo", 0),
    ADD(2, "foo", 0),   /* re-added while processing: newly marked dirty */
    LEN(3, 0),          /* not queued while processing */
    STATE(3, "foo", WQ_KEY_PROCESSING | WQ_KEY_DIRTY, 1, -1),
    DONE(4, "foo", 0),
    LEN(5, 1),          /* back on the queue */
    STATE(5, "foo", QUEUED_DIRTY, -1, 0),
    GET(5, "foo", 0),
    DONE(0, "foo", 0),
    LEN(1, 0),
    ABSENT(2, "foo"),
    GETX(2, 0, -EAGAIN),
};

/* client-go TestAdd (the "collapse" case: repeated adds coalesce). */
static const struct step s_collapse[] = {
    ADD(0, "foo", 0),          /* added */
    ADD(1, "foo", 1),          /* an existing item: coalesced */
    ADD(2, "foo", 1),
    LEN(3, 1),
    /* ShutDownWithDrain in the background. It races with the Get below
       (as in client-go): if it runs first, foo is queued, not processing,
       and it may return at once, so it is only checked at the end. */
    ADRAIN(4, 5 * SEC, 0, 1),
    GET(5, "foo", 2 * SEC),   /* queued keys are still handed out */
    GETX(5, 3 * SEC, -ESHUTDOWN),
    ADD(0, "bar", -ESHUTDOWN), /* add in shutdown mode: refused */
    ADD(1, "foo", -ESHUTDOWN),
    SHUTTING(2, 1),
    ABSENT(3, "bar"),
    STATE(3, "foo", WQ_KEY_PROCESSING, 5, -1), /* not marked dirty */
    DONE(3, "foo", 0),         /* Done from another actor than the getter */
    WAIT(1, 2000),
    LEN(0, 0),
    ABSENT(0, "foo"),
    GETX(1, 0, -ESHUTDOWN),
};

/* client-go TestFind, through wq_dump. */
static const struct step s_find[] = {
    ABSENT(0, "foo"),
    SHUTTING(0, 0),
    ADD(1, "foo", 0),
    STATE(2, "foo", QUEUED_DIRTY, -1, 0),
    GET(3, "foo", 0),
    STATE(4, "foo", WQ_KEY_PROCESSING, 3, -1),
    ADD(0, "foo", 0),
    STATE(4, "foo", WQ_KEY_PROCESSING | WQ_KEY_DIRTY, 3, -1),
    ADD(1, "bar", 0),
    STATE(2, "bar", QUEUED_DIRTY, -1, 0),
    DONE(3, "foo", 0),
    STATE(4, "foo", QUEUED_DIRTY, -1, 1),
    GET(0, "bar", 0),
    GET(1, "foo", 0),
    DONE(0, "bar", 0),
    DONE(1, "foo", 0),
    ABSENT(2, "foo"),
    ABSENT(2, "bar"),
    SHUTTING(0, 0),
};

/* The same in fair mode (run-fair.sh): foo was re-added before bar was
   added, so after its Done it is handed out first (wq.h, fair mode 1). */
static const struct step s_find_fair[] = {
    ABSENT(0, "foo"),
    SHUTTING(0, 0),
    ADD(1, "foo", 0),
    STATE(2, "foo", QUEUED_DIRTY, -1, 0),
    GET(3, "foo", 0),
    STATE(4, "foo", WQ_KEY_PROCESSING, 3, -1),
    ADD(0, "foo", 0),
    STATE(4, "foo", WQ_KEY_PROCESSING | WQ_KEY_DIRTY, 3, -1),
    ADD(1, "bar", 0),
    STATE(2, "bar", QUEUED_DIRTY, -1, 0),
    DONE(3, "foo", 0),
    STATE(4, "foo", QUEUED_DIRTY, -1, 0),
    STATE(4, "bar", QUEUED_DIRTY, -1, 1),
    GET(0, "foo", 0),
    GET(1, "bar", 0),
    DONE(0, "foo", 0),
    DONE(1, "bar", 0),
    ABSENT(2, "foo"),
    ABSENT(2, "bar"),
    SHUTTING(0, 0),
};

/* client-go TestQueueDrainageUsingShutDownWithDrain. */
static const struct step s_drain[] = {
    ADD(0, "foo", 0),
    ADD(0, "bar", 0),
    GET(1, "foo", 0),
    GET(2, "bar", 0),
    ADRAIN(3, 5 * SEC, 0, 1),
    GETX(4, 3 * SEC, -ESHUTDOWN), /* Get until shutting down */
    SHUTTING(5, 1),
    SLEEP(50),
    PENDING(1),                    /* waits for foo and bar */
    DONE(1, "foo", 0),
    SLEEP(50),
    PENDING(1),                    /* still waits for bar */
    DONE(2, "bar", 0),
    WAIT(1, 2000),
    LEN(5, 0),
    GETX(5, 0, -ESHUTDOWN),
    ADD(0, "baz", -ESHUTDOWN),
};

/* client-go TestNoQueueDrainageUsingShutDown. */
static const struct step s_nodrain[] = {
    ADD(0, "foo", 0),
    ADD(0, "bar", 0),
    GET(1, "foo", 0),
    GET(2, "bar", 0),
    ASHUTDOWN(3, 1),
    WAIT(1, 1000),                 /* returns without any Done */
    SHUTTING(4, 1),
    GETX(4, SEC, -ESHUTDOWN),
    ADD(5, "baz", -ESHUTDOWN),
    STATE(5, "foo", WQ_KEY_PROCESSING, 1, -1),
    STATE(5, "bar", WQ_KEY_PROCESSING, 2, -1),
    DONE(1, "foo", 0),
    DONE(2, "bar", 0),
    LEN(0, 0),
    ABSENT(0, "foo"),
};

/* client-go TestForceQueueShutdownUsingShutDown: a ShutDown during a
   ShutDownWithDrain ends the drain (-ECANCELED) without any Done. */
static const struct step s_force[] = {
    ADD(0, "foo", 0),
    ADD(0, "bar", 0),
    GET(1, "foo", 0),
    GET(2, "bar", 0),
    ADRAIN(3, 5 * SEC, -ECANCELED, 1),
    GETX(4, 3 * SEC, -ESHUTDOWN),
    SLEEP(50),
    PENDING(1),
    SHUTDOWN(5),
    WAIT(1, 2000),                 /* well before the drain's 5 s timeout */
    STATE(0, "foo", WQ_KEY_PROCESSING, 1, -1),
    STATE(0, "bar", WQ_KEY_PROCESSING, 2, -1),
    DONE(1, "foo", 0),
    DONE(2, "bar", 0),
    LEN(0, 0),
};

/* client-go TestQueueDrainageUsingShutDownWithDrainWithDirtyItem. */
static const struct step s_dirty[] = {
    ADD(0, "foo", 0),
    GET(1, "foo", 0),
    ADD(2, "foo", 0),              /* dirty while processing */
    ADRAIN(3, 5 * SEC, 0, 1),
    GETX(4, 3 * SEC, -ESHUTDOWN), /* nothing queued yet */
    SLEEP(50),
    PENDING(1),
    DONE(1, "foo", 0),             /* puts foo back on the queue */
    STATE(5, "foo", QUEUED_DIRTY, -1, 0),
    GET(4, "foo", 2 * SEC),       /* not done: foo is handed out again */
    DONE(4, "foo", 0),
    GETX(5, 2 * SEC, -ESHUTDOWN), /* now we are really done */
    WAIT(1, 3000),
    LEN(0, 0),
    ABSENT(0, "foo"),
};

/* libwq: wq_shutdown releases every blocked wq_get (timeout -1). */
static const struct step s_release[] = {
    AGET(0, -1, -ESHUTDOWN, 1),
    AGET(1, -1, -ESHUTDOWN, 2),
    AGET(2, -1, -ESHUTDOWN, 3),
    SLEEP(100),
    PENDING(1),
    PENDING(2),
    PENDING(3),
    SHUTDOWN(3),
    WAIT(1, 1000),
    WAIT(2, 1000),
    WAIT(3, 1000),
    ADD(4, "foo", -ESHUTDOWN),
    GETX(4, -1, -ESHUTDOWN),       /* does not block after shutdown */
};

/* libwq: a blocked wq_get is woken by an add from another actor; two
   blocked getters are both served by two adds (which one gets which key is
   not specified, so only lengths are checked there). */
static const struct step s_wake[] = {
    AGETK(0, "foo", 5 * SEC, 1),
    SLEEP(100),
    PENDING(1),
    ADD(1, "foo", 0),
    WAIT(1, 1000),
    DONE(0, "foo", 0),
    AGETK(2, "bar", 5 * SEC, 2),
    SLEEP(50),
    PENDING(2),
    ADD(3, "bar", 0),
    WAIT(2, 1000),
    DONE(1, "bar", 0),             /* any actor may call Done */
    AGET(4, 5 * SEC, 3, 3),
    AGET(5, 5 * SEC, 3, 4),
    SLEEP(100),
    PENDING(3),
    PENDING(4),
    ADD(0, "baz", 0),
    ADD(1, "qux", 0),
    WAIT(3, 1000),
    WAIT(4, 1000),
    LEN(2, 0),
    STATE(2, "baz", WQ_KEY_PROCESSING, -2, -1),
    DONE(2, "baz", 0),
    DONE(3, "qux", 0),
    LEN(2, 0),
    ABSENT(2, "baz"),
    ABSENT(2, "qux"),
};

/* libwq: wq_shutdown_drain honours its timeout, still shuts down. */
static const struct step s_drain_timeout[] = {
    ADD(0, "foo", 0),
    GET(1, "foo", 0),
    DRAINT(2, 100 * MS, -ETIMEDOUT, 100),
    SHUTTING(3, 1),
    ADD(3, "bar", -ESHUTDOWN),
    STATE(3, "foo", WQ_KEY_PROCESSING, 1, -1),
    DONE(1, "foo", 0),
    DRAIN(2, SEC, 0),             /* nothing processing: at once */
    DRAIN(0, 0, 0),
    GETX(3, 0, -ESHUTDOWN),
};

#define SCRIPT(fn, steps)                                                    \
    static void fn##_ts(void **s) { (void)s; run_script(T_THREADS_SHARED, #fn "-ts", steps, (int)(sizeof steps / sizeof steps[0])); }  \
    static void fn##_to(void **s) { (void)s; run_script(T_THREADS_OWN, #fn "-to", steps, (int)(sizeof steps / sizeof steps[0])); }     \
    static void fn##_po(void **s) { (void)s; run_script(T_PROCS_OPEN, #fn "-po", steps, (int)(sizeof steps / sizeof steps[0])); }      \
    static void fn##_pi(void **s) { (void)s; run_script(T_PROCS_INHERIT, #fn "-pi", steps, (int)(sizeof steps / sizeof steps[0])); }

SCRIPT(len, s_len)
SCRIPT(reinsert, s_reinsert)
SCRIPT(collapse, s_collapse)
#define SCRIPT_MODES(fn, steps, fair_steps)                                  \
    static void fn##_run(enum t_mode m, const char *tag) {                   \
        if (getenv("WQ_TEST_FAIR"))                                          \
            run_script(m, tag, fair_steps, (int)(sizeof fair_steps / sizeof fair_steps[0])); \
        else                                                                 \
            run_script(m, tag, steps, (int)(sizeof steps / sizeof steps[0])); \
    }                                                                        \
    static void fn##_ts(void **s) { (void)s; fn##_run(T_THREADS_SHARED, #fn "-ts"); }  \
    static void fn##_to(void **s) { (void)s; fn##_run(T_THREADS_OWN, #fn "-to"); }     \
    static void fn##_po(void **s) { (void)s; fn##_run(T_PROCS_OPEN, #fn "-po"); }      \
    static void fn##_pi(void **s) { (void)s; fn##_run(T_PROCS_INHERIT, #fn "-pi"); }

SCRIPT_MODES(find, s_find, s_find_fair)
SCRIPT(drain, s_drain)
SCRIPT(nodrain, s_nodrain)
SCRIPT(force, s_force)
SCRIPT(dirty, s_dirty)
SCRIPT(release, s_release)
SCRIPT(wake, s_wake)
SCRIPT(drain_timeout, s_drain_timeout)

/* ================================================================== */
/* TestBasic                                                           */
/* ================================================================== */

/* The witnesses, the consumers and the checks: t.h. Keys "k<id>". */
#define AFTER_SHUTDOWN "added after shutdown!"

static int parse_key(const unsigned char *buf, int n, int max)
{
    char tmp[32];
    if (n < 2 || n > 30 || buf[0] != 'k')
        return -1;
    memcpy(tmp, buf + 1, (size_t)n - 1);
    tmp[n - 1] = '\0';
    int v = atoi(tmp);
    return v >= 0 && v < max ? v : -1;
}

/* A producer's add: a plain wq_add. */
static int basic_add(wq *q, const char *key, size_t len, int j,
                     unsigned *seed)
{
    (void)j;
    (void)seed;
    return wq_add(q, key, len);
}

static int basic_actor(struct t_actor *a)
{
    char key[32];

    if (a->id < T_BASIC_PRODUCERS) {
        int kl = snprintf(key, sizeof key, "k%d", a->id);
        return t_basic_produce(a, key, (size_t)kl, basic_add, NULL);
    }
    return t_basic_consume(a, parse_key, AFTER_SHUTDOWN);
}

static int add_after_shutdown(wq *q)
{
    return wq_add(q, AFTER_SHUTDOWN, strlen(AFTER_SHUTDOWN));
}

static void run_basic(enum t_mode mode, int drain)
{
    const char *name;
    wq *q = t_create(drain ? "basic-drain" : "basic-shutdown",
                     T_OPTS(.capacity = 4096), &name);
    struct t_basic *b = t_shared_alloc(sizeof *b);
    struct wq_stats st;

    t_basic_run(mode, drain, q, name, b, basic_actor, add_after_shutdown);
    assert_true(wq_shutting_down(q));
    t_basic_check_stats(q, b, "k", &st);
    assert_int_equal(wq_check(q, 0), 0);

    wq_close(q);
    t_shared_free(b, sizeof *b);
}

/* ================================================================== */
/* TestAddWhileProcessing                                              */
/* ================================================================== */

/* The re-add while processing: a plain wq_add. */
static int readd(wq *q, const void *key, size_t len, unsigned *seed)
{
    (void)seed;
    return wq_add(q, key, len);
}

static int awp_actor(struct t_actor *a)
{
    struct t_awp *w = a->arg;
    char key[32];

    if (a->id < T_AWP_PRODUCERS) {
        int kl = snprintf(key, sizeof key, "k%d", a->id);
        T_CHECK_EQ(wq_add(a->q, key, (size_t)kl), 0);
        atomic_fetch_add(&w->producers_done, 1);
        return 0;
    }
    return t_awp_consume(a, parse_key, readd, NULL, "k");
}

static void run_awp(enum t_mode mode, int drain)
{
    const char *name;
    wq *q = t_create(drain ? "awp-drain" : "awp-shutdown",
                     T_OPTS(.capacity = 4096), &name);
    struct t_awp *w = t_shared_alloc(sizeof *w);

    t_awp_run(mode, drain, q, name, w, awp_actor, 0, "k");
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free(w, sizeof *w);
}

T_TEAM_CASES(basic, run_basic)
T_TEAM_CASES(add_while_processing, run_awp)

static void garbage_collection(void **state)
{
    (void)state;
    skip(); /* TestGarbageCollection checks Go's GC; nothing to port. */
}

#define T4(fn) T_TEST(fn##_ts), T_TEST(fn##_to), T_TEST(fn##_po), \
               T_TEST(fn##_pi)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T_TEAM_TESTS(basic),
        T_TEAM_TESTS(add_while_processing),
        T4(len),
        T4(reinsert),
        T4(collapse),
        T4(find),
        T4(drain),
        T4(nodrain),
        T4(force),
        T4(dirty),
        T4(release),
        T4(wake),
        T4(drain_timeout),
        T_TEST(garbage_collection),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("queue", tests);
}
