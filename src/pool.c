/*
 * pool.c - controller-runtime's MaxConcurrentReconciles with processes:
 * wq_run_workers forks workers that loop get -> reconcile -> finish (the
 * finish and the next get in one call, wq_finish_get) and
 * supervises them. It uses nothing but wq.h, and wq__park: while the
 * workers run the supervisor's handle holds no process slot (when it
 * holds no key), so a queue created with max_procs N runs a pool of N.
 * The handle registers again at its next call that holds or changes keys.
 *
 * Supervisor: blocks SIGCHLD, SIGTERM and SIGINT and takes them with
 * sigtimedwait, so there is no signal handler and no race with the
 * caller's own handlers; it reaps only its own workers (waitpid on their
 * pids, never -1), restarts a worker that died abnormally after a
 * per-slot backoff, kills a worker whose reconcile overran its timeout,
 * and returns once its workers have exited: after the queue was shut
 * down, after a first SIGTERM/SIGINT stopped the pool (each worker
 * finishes the key it holds; the queue is not touched, so the next start
 * finds its keys), or once the queue ran empty (until_empty). Keys held
 * by a dead worker are requeued by the library's crash machinery (lease
 * -> reap); the supervisor only asks for that reap at once (wq_check
 * WQ_CHECK_REAP).
 *
 * Worker: the handle inherited through fork registers the child as a new
 * process at its first get (see wq.h, fork). SIGINT and SIGTERM are ignored
 * (a terminal ^C hits the whole process group; the supervisor decides),
 * and PR_SET_PDEATHSIG kills it if the supervisor dies. It waits for keys
 * in slices of STOP_POLL_NS so that a stop request (a word in a page
 * shared with the supervisor) is seen between keys. Outcome mapping as
 * documented in wq.h; re-adds are made while the key is still
 * processing, so dying between the two steps loses nothing.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define MAX_WORKERS 1024
#define BACKOFF_MIN_NS (100ull * 1000 * 1000)
#define BACKOFF_MAX_NS (10ull * 1000 * 1000 * 1000)
#define HEALTHY_NS (10ull * 1000 * 1000 * 1000)
#define STOP_POLL_NS (200ull * 1000 * 1000)
#define EMPTY_CHECK_NS (100ull * 1000 * 1000)

struct worker {
    pid_t pid;              /* 0: not running */
    uint64_t started_ns;
    uint64_t backoff_ns;    /* next restart delay */
    uint64_t restart_at_ns; /* 0: no restart pending */
};

/* Per worker, with timeout_ns only: the CLOCK_MONOTONIC start of the
   reconcile in progress, 0 between. A line each: workers write theirs
   twice per key, and sharing a line would move it between their CPUs
   at every write. */
struct busy {
    _Alignas(64) uint64_t since;
};

/* Pages shared by the supervisor and its workers. */
struct shared {
    int fatal;              /* the first error that makes working impossible */
    int stop;               /* the supervisor asks the workers to leave */
    struct busy busy[MAX_WORKERS];
};

/* Finish as f says, getting nothing, or, when the result cannot be kept
   (no room for it: -ENOSPC, the key still processing), at least the done:
   a worker must never walk away holding its key. */
static void finish(wq *q, const char *key, size_t n, const struct wq_finish_opts *f)
{
    if (f->forget)
        wq_forget(q, key, n);
    if (wq_finish(q, key, n, f->code, f->message) == -ENOSPC)
        wq_done(q, key, n);
}

/* Reconcile one key and requeue it as the outcome says; how to finish it
   in f (a success forgets the key's failures with its finish). */
static void reconcile_one(wq *q, char *key, int n, wq_reconcile_fn fn, void *arg,
                          const struct wq_pool_options *po, struct wq_reconcile *out,
                          struct wq_finish_opts *f)
{
    memset(out, 0, sizeof *out);
    memset(f, 0, sizeof *f);
    key[n] = 0;
    int rc = fn(q, key, (size_t)n, out, arg);
    out->message[sizeof out->message - 1] = 0;
    f->message = out->message;
    if (rc == 0) {
        f->forget = true;
        if (out->requeue_after_ns > 0)
            wq_add_after(q, key, (size_t)n, (uint64_t)out->requeue_after_ns);
        return;
    }
    f->code = rc > 0 ? -EINVAL : out->code ? out->code : rc;
    int tries = wq_num_requeues(q, key, (size_t)n);   /* failures before this one */
    if (po->max_attempts && tries >= 0 && (uint32_t)tries + 1 >= po->max_attempts)
        f->forget = true;   /* given up: no retry, the FAILED result stays */
    else
        wq_add_rate_limited(q, key, (size_t)n);
}

static void worker_main(wq *q, struct shared *sh, unsigned id, wq_reconcile_fn fn,
                        void *arg, const struct wq_pool_options *po, const sigset_t *orig)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    char comm[16];   /* ps -e, top, pgrep: the worker, not its supervisor */
    snprintf(comm, sizeof comm, "%.8s-w%u", po->name ? po->name : "wq", id);
    prctl(PR_SET_NAME, comm);
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGCHLD, SIG_DFL);
    sigprocmask(SIG_SETMASK, orig, NULL);
    if (po->after_fork)
        po->after_fork(q, id, arg);
    int max = wq_max_key_len(q);
    /* Two buffers: the key just reconciled is finished while the next one
       is read into the other (wq_finish_get). */
    char *key[2] = { max > 0 ? malloc((size_t)max + 1) : NULL,
                     max > 0 ? malloc((size_t)max + 1) : NULL };
    if (!key[0] || !key[1])
        _exit(1);
    int cur = 0, n = -ETIMEDOUT;
    struct wq_reconcile out;
    struct wq_finish_opts f;
    /* A key wq_finish_get took is reconciled even when a stop came
       meanwhile: a worker finishes the key it holds. */
    while (n >= 0 || !__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) {
        if (n == -ETIMEDOUT)
            n = wq_get(q, key[cur], (size_t)max + 1, (int64_t)STOP_POLL_NS);
        if (n == -ETIMEDOUT)
            continue;
        if (n == -ESHUTDOWN)
            break;
        if (n == -ENOSPC) {
            /* No page for the record of a key held (wq.h, wq_get): the
               key stays queued and nothing is ours; a full /dev/shm may
               drain, so try again after a pause, as after a timeout. */
            struct timespec ts = { 0, (long)(STOP_POLL_NS / 4) };
            nanosleep(&ts, NULL);
            n = -ETIMEDOUT;
            continue;
        }
        if (n < 0) {
            int none = 0;
            if (n == -EUSERS || n == -ENOMEM || n == -EBADMSG || n == -ENOTRECOVERABLE)
                __atomic_compare_exchange_n(&sh->fatal, &none, n, false, __ATOMIC_SEQ_CST,
                                            __ATOMIC_SEQ_CST);
            _exit(1);   /* the supervisor restarts us, or gives up */
        }
        /* Stamped only when someone watches it: a clock reading and two
           stores per key cost the pool 9-11% (tools/PERFORMANCE.md,
           "Consumers that work on their keys"). */
        if (po->timeout_ns)
            __atomic_store_n(&sh->busy[id].since, wq__clock_mono(), __ATOMIC_RELEASE);
        reconcile_one(q, key[cur], n, fn, arg, po, &out, &f);
        if (po->timeout_ns)
            __atomic_store_n(&sh->busy[id].since, 0, __ATOMIC_RELEASE);
        if (__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) {
            finish(q, key[cur], (size_t)n, &f);   /* and take no other */
            break;
        }
        /* The finish and the next get under one lock (one round trip on
           Redis). A finish that failed changed nothing: -ENOSPC left the
           key ours, so forget it and at least done it; -ENOENT or -ESTALE,
           it is not ours any more; -EAGAIN, finished but no key (no
           memory for one). Then a plain get. */
        int next = wq_finish_get(q, key[cur], (size_t)n, &f, key[!cur], (size_t)max + 1,
                                 (int64_t)STOP_POLL_NS);
        if (next == -ENOSPC)
            finish(q, key[cur], (size_t)n, &f);
        if (next == -ENOSPC || next == -ENOENT || next == -ESTALE || next == -EAGAIN) {
            n = -ETIMEDOUT;
        } else {
            cur = !cur;
            n = next;
        }
    }
    free(key[0]);
    free(key[1]);
    wq_close(q);
    _exit(0);
}

static int spawn(wq *q, struct shared *sh, struct worker *ws, unsigned id,
                 wq_reconcile_fn fn, void *arg, const struct wq_pool_options *po,
                 const sigset_t *orig)
{
    struct worker *w = &ws[id];
    __atomic_store_n(&sh->busy[id].since, 0, __ATOMIC_RELEASE);
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0)
        worker_main(q, sh, id, fn, arg, po, orig);
    w->pid = pid;
    w->started_ns = wq__clock_mono();
    w->restart_at_ns = 0;
    return 0;
}

/* A worker ended: schedule its replacement unless it left cleanly. */
static void ended(wq *q, struct worker *w, int status)
{
    uint64_t now = wq__clock_mono();
    bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    w->pid = 0;
    if (clean)
        return;   /* it saw the shutdown, or the stop */
    wq_check(q, WQ_CHECK_REAP);   /* requeue its key now */
    if (now - w->started_ns >= HEALTHY_NS)
        w->backoff_ns = BACKOFF_MIN_NS;
    w->restart_at_ns = now + w->backoff_ns;
    w->backoff_ns = w->backoff_ns * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : w->backoff_ns * 2;
}

/* Nothing left for a batch to do: no key queued, processing or waiting. */
static bool empty(wq *q)
{
    struct wq_stats st;
    return wq_stats(q, &st) == 0 && st.queued == 0 && st.processing == 0 && st.waiting == 0;
}

int wq_run_workers_opts(wq *q, unsigned workers, wq_reconcile_fn fn, void *arg,
                        struct wq_pool_options *po)
{
    static const struct wq_pool_options none;
    if (!q || !fn || workers == 0 || workers > MAX_WORKERS || (po && po->timeout_ns < 0))
        return -EINVAL;
    if (po && !WQ_RESERVED_ZERO(po))
        return -EINVAL;
    if (wq_observing(q))
        return -EPERM;   /* its workers could get nothing: fork none */
    int rc = wq__park(q);
    if (rc < 0 && rc != -EBUSY)
        return rc;   /* the queue is unusable: its workers would fail too */
    const struct wq_pool_options *o = po ? po : &none;
    struct worker *ws = calloc(workers, sizeof *ws);
    if (!ws)
        return -ENOMEM;
    sigset_t set, orig;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, &orig);
    /* SIGCHLD must not be ignored, or children would not stay waitable. */
    struct sigaction dfl = { .sa_handler = SIG_DFL }, old_chld;
    sigaction(SIGCHLD, &dfl, &old_chld);

    int signals = 0;
    rc = 0;
    uint64_t timeouts = 0, next_empty_check = 0;
    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        sh = NULL;
        rc = -ENOMEM;
        goto out;
    }
    for (unsigned i = 0; i < workers; i++) {
        ws[i].backoff_ns = BACKOFF_MIN_NS;
        if ((rc = spawn(q, sh, ws, i, fn, arg, o, &orig)) < 0)
            goto kill;
    }
    for (;;) {
        unsigned running = 0;
        uint64_t now = wq__clock_mono(), next = now + 100 * 1000 * 1000;
        bool stopping = wq_shutting_down(q) || __atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE);
        for (unsigned i = 0; i < workers; i++) {
            struct worker *w = &ws[i];
            int status;
            if (w->pid > 0 && waitpid(w->pid, &status, WNOHANG) == w->pid)
                ended(q, w, status);
            uint64_t busy = __atomic_load_n(&sh->busy[i].since, __ATOMIC_ACQUIRE);
            if (w->pid > 0 && o->timeout_ns && busy && now - busy > (uint64_t)o->timeout_ns) {
                /* Overran: killed; its key comes back as a crash (its
                   failure count rises), like controller-runtime's
                   ReconciliationTimeout counting a failed attempt. */
                kill(w->pid, SIGKILL);
                __atomic_store_n(&sh->busy[i].since, 0, __ATOMIC_RELEASE);
                timeouts++;
            }
            if (w->pid == 0 && w->restart_at_ns && !stopping) {
                if (w->restart_at_ns <= now) {
                    if ((rc = spawn(q, sh, ws, i, fn, arg, o, &orig)) < 0)
                        goto kill;
                } else if (w->restart_at_ns < next) {
                    next = w->restart_at_ns;
                }
            }
            if (w->pid > 0 && o->timeout_ns && busy) {
                uint64_t due = busy + (uint64_t)o->timeout_ns;
                if (due > now && due < next)
                    next = due;
            }
            running += w->pid > 0;
        }
        if (running == 0 && stopping)
            break;
        if (sh->fatal) {   /* workers cannot work: report, do not spin */
            rc = sh->fatal;
            goto kill;
        }
        if (o->until_empty && now >= next_empty_check && !stopping) {
            next_empty_check = now + EMPTY_CHECK_NS;
            if (empty(q))
                __atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
        }
        if (next > now + EMPTY_CHECK_NS && o->until_empty)
            next = now + EMPTY_CHECK_NS;
        struct timespec ts = { .tv_sec = (time_t)((next - now) / 1000000000ull),
                               .tv_nsec = (long)((next - now) % 1000000000ull) };
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig == SIGTERM || sig == SIGINT) {
            if (++signals == 1) {
                /* Stop this pool, not the queue: each worker finishes the
                   key it holds and leaves; queued keys wait for the next
                   start, other processes attached are untouched. */
                __atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
            } else {
                rc = -EINTR;
                goto kill;
            }
        }
    }
    goto out;
kill:
    for (unsigned i = 0; i < workers; i++)
        if (ws[i].pid > 0)
            kill(ws[i].pid, SIGKILL);
    /* A stop we chose is not the keys' fault: they go back to the queue
       as on a close, without a failure. */
    for (unsigned i = 0; i < workers; i++)
        if (ws[i].pid > 0) {
            waitpid(ws[i].pid, NULL, 0);
            wq_release_pid(q, ws[i].pid);
        }
    wq_check(q, WQ_CHECK_REAP);
out:
    sigaction(SIGCHLD, &old_chld, NULL);
    /* Consume the stop signals we acted on; a pending SIGCHLD stays
       pending for the caller's own children. */
    sigset_t stop_set;
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGTERM);
    sigaddset(&stop_set, SIGINT);
    struct timespec zero = { 0, 0 };
    while (sigtimedwait(&stop_set, NULL, &zero) > 0)
        ;
    pthread_sigmask(SIG_SETMASK, &orig, NULL);
    if (sh)
        munmap(sh, sizeof *sh);
    if (po) {
        po->timeouts = timeouts;
        po->stopped_by_signal = signals > 0;
    }
    free(ws);
    return rc;
}

int wq_run_workers(wq *q, unsigned workers, wq_reconcile_fn fn, void *arg)
{
    return wq_run_workers_opts(q, workers, fn, arg, NULL);
}
