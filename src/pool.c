/*
 * pool.c - controller-runtime's MaxConcurrentReconciles with processes:
 * wq_run_workers forks workers that loop get -> reconcile -> finish and
 * supervises them.
 *
 * Supervisor: blocks SIGCHLD, SIGTERM and SIGINT and takes them with
 * sigtimedwait, so there is no signal handler and no race with the
 * caller's own handlers; it reaps only its own workers (waitpid on their
 * pids, never -1), restarts a worker that died abnormally after a
 * per-slot backoff, and returns once the queue is shut down and every
 * worker has exited. Keys held by a dead worker are requeued by the
 * library's crash machinery (lease -> reap); the supervisor only asks for
 * that reap at once (wq_check WQ_CHECK_REAP) instead of waiting for a
 * getter to notice.
 *
 * Worker: the handle inherited through fork registers the child as a new
 * process on first use (see wq.h, fork). SIGINT and SIGTERM are ignored
 * (a terminal ^C hits the whole process group; the supervisor decides),
 * and PR_SET_PDEATHSIG kills it if the supervisor dies. Outcome mapping
 * as documented in wq.h; re-adds are made while the key is still
 * processing, so dying between the two steps loses nothing.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wq.h"

#define MAX_WORKERS 1024
#define BACKOFF_MIN_NS (100ull * 1000 * 1000)
#define BACKOFF_MAX_NS (10ull * 1000 * 1000 * 1000)
#define HEALTHY_NS (10ull * 1000 * 1000 * 1000)

static uint64_t now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct worker {
    pid_t pid;              /* 0: not running */
    uint64_t started_ns;
    uint64_t backoff_ns;    /* next restart delay */
    uint64_t restart_at_ns; /* 0: no restart pending */
};

static void reconcile_one(wq *q, char *key, int n, wq_reconcile_fn fn, void *arg)
{
    struct wq_reconcile out;
    memset(&out, 0, sizeof out);
    key[n] = 0;
    int rc = fn(q, key, (size_t)n, &out, arg);
    out.message[sizeof out.message - 1] = 0;
    if (rc == 0 && out.requeue_after_ns <= 0) {
        wq_forget(q, key, (size_t)n);
        wq_finish(q, key, (size_t)n, 0, out.message);
    } else if (rc == 0) {
        wq_forget(q, key, (size_t)n);
        wq_add_after(q, key, (size_t)n, (uint64_t)out.requeue_after_ns);
        wq_finish(q, key, (size_t)n, 0, out.message);
    } else {
        int code = rc > 0 ? -EINVAL : out.code ? out.code : rc;
        wq_add_rate_limited(q, key, (size_t)n);
        wq_finish(q, key, (size_t)n, code, out.message);
    }
}

/* A page shared with the workers: the first error that makes working
   impossible (e.g. the process table is full), so the supervisor stops
   instead of restarting workers that cannot work. */
static int *fatal_err;

static void worker_main(wq *q, wq_reconcile_fn fn, void *arg, const sigset_t *orig)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGCHLD, SIG_DFL);
    sigprocmask(SIG_SETMASK, orig, NULL);
    size_t cap = (size_t)wq_max_key_len(q) + 1;
    char *key = malloc(cap);
    if (!key)
        _exit(1);
    for (;;) {
        int n = wq_get(q, key, cap, -1);
        if (n == -ESHUTDOWN)
            break;
        if (n < 0) {
            int none = 0;
            if (n == -EUSERS || n == -ENOMEM || n == -EBADMSG || n == -ENOTRECOVERABLE)
                __atomic_compare_exchange_n(fatal_err, &none, n, false, __ATOMIC_SEQ_CST,
                                            __ATOMIC_SEQ_CST);
            _exit(1);   /* the supervisor restarts us, or gives up */
        }
        reconcile_one(q, key, n, fn, arg);
    }
    free(key);
    wq_close(q);
    _exit(0);
}

static int spawn(wq *q, struct worker *w, wq_reconcile_fn fn, void *arg,
                 const sigset_t *orig)
{
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0)
        worker_main(q, fn, arg, orig);
    w->pid = pid;
    w->started_ns = now_mono();
    w->restart_at_ns = 0;
    return 0;
}

/* A worker ended: schedule its replacement unless it left cleanly. */
static void ended(wq *q, struct worker *w, int status)
{
    uint64_t now = now_mono();
    bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    w->pid = 0;
    if (clean)
        return;   /* it saw the shutdown */
    wq_check(q, WQ_CHECK_REAP);   /* requeue its key now */
    if (now - w->started_ns >= HEALTHY_NS)
        w->backoff_ns = BACKOFF_MIN_NS;
    w->restart_at_ns = now + w->backoff_ns;
    w->backoff_ns = w->backoff_ns * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : w->backoff_ns * 2;
}

int wq_run_workers(wq *q, unsigned workers, wq_reconcile_fn fn, void *arg)
{
    if (!q || !fn || workers == 0 || workers > MAX_WORKERS)
        return -EINVAL;
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

    int rc = 0, signals = 0;
    fatal_err = mmap(NULL, sizeof *fatal_err, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (fatal_err == MAP_FAILED) {
        fatal_err = NULL;
        rc = -ENOMEM;
        goto out;
    }
    for (unsigned i = 0; i < workers; i++) {
        ws[i].backoff_ns = BACKOFF_MIN_NS;
        if ((rc = spawn(q, &ws[i], fn, arg, &orig)) < 0)
            goto stop;
    }
    for (;;) {
        unsigned running = 0;
        uint64_t now = now_mono(), next = now + 100 * 1000 * 1000;
        bool down = wq_shutting_down(q);
        for (unsigned i = 0; i < workers; i++) {
            struct worker *w = &ws[i];
            int status;
            if (w->pid > 0 && waitpid(w->pid, &status, WNOHANG) == w->pid)
                ended(q, w, status);
            if (w->pid == 0 && w->restart_at_ns && !down) {
                if (w->restart_at_ns <= now) {
                    if ((rc = spawn(q, w, fn, arg, &orig)) < 0)
                        goto stop;
                } else if (w->restart_at_ns < next) {
                    next = w->restart_at_ns;
                }
            }
            running += w->pid > 0;
        }
        if (running == 0 && down)
            break;
        if (*fatal_err) {   /* workers cannot work: report, do not spin */
            rc = *fatal_err;
            goto stop;
        }
        struct timespec ts = { .tv_sec = (time_t)((next - now) / 1000000000ull),
                               .tv_nsec = (long)((next - now) % 1000000000ull) };
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig == SIGTERM || sig == SIGINT) {
            if (++signals == 1) {
                wq_shutdown(q);   /* drain: workers finish what is queued */
            } else {
                rc = -EINTR;
                goto stop;
            }
        }
    }
    goto out;
stop:
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
    if (fatal_err)
        munmap((void *)fatal_err, sizeof *fatal_err);
    fatal_err = NULL;
    free(ws);
    return rc;
}
