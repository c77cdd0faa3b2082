/*
 * t.c - the process scaffolding of t.h: names and cleanup, the watchdog,
 * the cmocka fixtures, shared memory and time, the failure board,
 * processes and teams. (t-queue.c: handles, queue helpers, stores and
 * workloads.)
 *
 * Design notes:
 *   - Everything that cleans up (names, children) belongs to the process
 *     that registered it: `owner_pid` is checked, so a forked child that
 *     reaches exit() or the watchdog by accident removes nothing.
 *   - The watchdog runs in a signal handler: it only uses kill(), unlink()
 *     and write() on data prepared beforehand (the registered paths).
 *   - The failure board lives in a MAP_SHARED mapping created by the group
 *     setup, before any fork, so children and threads write to the same
 *     one.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_timedjoin_np, setgroups */
#endif
#include "t.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define T_DEFAULT_WATCHDOG_S 30
#define T_MAX_KIDS 1024

/* ------------------------------------------------------------------ */
/* State                                                               */
/* ------------------------------------------------------------------ */

struct board {
    atomic_int nfail;
    atomic_int claimed;
    char msg[1024];
};

static struct board *board;
static pid_t owner_pid;

/* "/dev/shm/wq." + name, prepared for the signal handler. */
static char paths[T_MAX_NAMES][sizeof("/dev/shm/wq.") + WQ_MAX_NAME_LEN + 1];
static char names[T_MAX_NAMES][WQ_MAX_NAME_LEN + 1];
static volatile sig_atomic_t nnames;
static unsigned name_counter;

static volatile pid_t kids[T_MAX_KIDS];
static volatile sig_atomic_t nkids;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;

static void ensure_owner(void)
{
    if (owner_pid == 0)
        owner_pid = getpid();
}

static void ensure_board(void)
{
    ensure_owner();
    if (board == NULL)
        board = t_shared_alloc(sizeof *board);
}

/* ------------------------------------------------------------------ */
/* Names                                                               */
/* ------------------------------------------------------------------ */

void t_shm_path(const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "/dev/shm/wq.%s", name);
}

int t_shm_exists(const char *name)
{
    char p[512];

    t_shm_path(name, p, sizeof p);
    return access(p, F_OK) == 0;
}

void t_expect_no_shm_(const char *name, const char *ctx, int line)
{
    char p[512];
    DIR *d;
    struct dirent *e;

    t_shm_path(name, p, sizeof p);
    if (access(p, F_OK) == 0)
        fail_msg("line %d: %s: %s exists after a failed wq_open", line, ctx, p);
    d = opendir("/dev/shm");
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, name) != NULL) {
            closedir(d);
            fail_msg("line %d: %s: /dev/shm/%s left behind", line, ctx,
                     e->d_name);
        }
    closedir(d);
}

static void atexit_cleanup(void)
{
    t_kill_children();
    t_unlink_all();
}

const char *t_qname(const char *tag)
{
    static int atexit_done;
    char clean[96];
    size_t j = 0;

    ensure_board();
    for (size_t i = 0; tag[i] != '\0' && j < sizeof clean - 1; i++) {
        char c = tag[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
            (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')
            clean[j++] = c;
    }
    clean[j] = '\0';

    pthread_mutex_lock(&reg_lock);
    if (!atexit_done) {
        atexit(atexit_cleanup);
        atexit_done = 1;
    }
    if (nnames >= T_MAX_NAMES) {
        pthread_mutex_unlock(&reg_lock);
        t_fatal("t_qname: too many names");
    }
    int k = nnames;
    snprintf(names[k], sizeof names[k], "t%ld-%s-%u", (long)getpid(), clean,
             ++name_counter);
    t_shm_path(names[k], paths[k], sizeof paths[k]);
    nnames = k + 1;
    pthread_mutex_unlock(&reg_lock);
    return names[k];
}

void t_unlink_all(void)
{
    if (owner_pid == 0 || getpid() != owner_pid)
        return;
    pthread_mutex_lock(&reg_lock);
    for (int i = 0; i < nnames; i++) {
        int rc = wq_unlink(names[i]);
        if (rc != 0 && rc != -ENOENT)
            (void)unlink(paths[i]);
        /* Whatever the library did, the object must be gone. */
        if (access(paths[i], F_OK) == 0)
            (void)unlink(paths[i]);
    }
    nnames = 0;
    pthread_mutex_unlock(&reg_lock);
}

int t_shm_leftovers(char *buf, size_t cap)
{
    char prefix[32];
    int n = 0;
    size_t used = 0;
    DIR *d;
    struct dirent *e;

    ensure_owner();
    snprintf(prefix, sizeof prefix, "t%ld-", (long)owner_pid);
    if (buf != NULL && cap > 0)
        buf[0] = '\0';
    d = opendir("/dev/shm");
    if (d == NULL)
        return 0;
    while ((e = readdir(d)) != NULL) {
        if (strstr(e->d_name, prefix) == NULL)
            continue;
        n++;
        if (buf != NULL && used + strlen(e->d_name) + 2 < cap) {
            used += (size_t)snprintf(buf + used, cap - used, "%s%s",
                                     used ? "," : "", e->d_name);
        }
    }
    closedir(d);
    return n;
}

/* ------------------------------------------------------------------ */
/* Watchdog and fatal exit                                             */
/* ------------------------------------------------------------------ */

static void write_str(const char *s)
{
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

static void emergency_cleanup(void)
{
    /* Async-signal-safe: kill, waitpid, unlink only. */
    if (getpid() != owner_pid)
        return;
    for (int i = 0; i < nkids; i++)
        if (kids[i] > 0)
            kill(kids[i], SIGKILL);
    for (int i = 0; i < nkids; i++)
        if (kids[i] > 0)
            (void)waitpid(kids[i], NULL, 0);
    nkids = 0;
    for (int i = 0; i < nnames; i++)
        (void)unlink(paths[i]);
}

static void on_alarm(int sig)
{
    (void)sig;
    write_str("\n*** watchdog: test took too long, killing children, "
              "removing queues, exiting 124\n");
    emergency_cleanup();
    _exit(124);
}

void t_watchdog(unsigned seconds)
{
    struct sigaction sa;

    ensure_owner();
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    alarm(seconds);
}

void t_fatal(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "\n*** fatal: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    if (board != NULL && atomic_load(&board->nfail) > 0)
        fprintf(stderr, "*** first recorded failure: %s\n", board->msg);
    fflush(stderr);
    emergency_cleanup();
    _exit(1);
}

/* ------------------------------------------------------------------ */
/* Fixtures                                                            */
/* ------------------------------------------------------------------ */

static void on_term(int sig)
{
    write_str("\n*** terminated by a signal: killing children, removing "
              "queues\n");
    emergency_cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

int t_group_setup(void **state)
{
    static const int sigs[] = { SIGTERM, SIGINT, SIGHUP };
    struct sigaction sa;

    (void)state;
    ensure_board();
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, NULL);
    return board == NULL ? -1 : 0;
}

int t_group_teardown(void **state)
{
    char buf[512];

    (void)state;
    alarm(0);
    t_kill_children();
    t_unlink_all();
    if (t_shm_leftovers(buf, sizeof buf) != 0) {
        fprintf(stderr, "leftovers in /dev/shm: %s\n", buf);
        return -1;
    }
    return 0;
}

int t_setup(void **state)
{
    (void)state;
    ensure_board();
    t_failures_reset();
    t_watchdog(T_DEFAULT_WATCHDOG_S * t_scale());
    return 0;
}

int t_teardown(void **state)
{
    (void)state;
    alarm(0);
    t_kill_children();
    t_close_all();
    t_unlink_all();
    return 0;
}

void t_test_no_leftovers(void **state)
{
    char buf[1024];
    int n;

    (void)state;
    n = t_shm_leftovers(buf, sizeof buf);
    if (n != 0)
        fail_msg("%d object(s) left in /dev/shm: %s", n, buf);
}

int t_final_check(void)
{
    char buf[1024];
    char prefix[32];
    DIR *d;
    struct dirent *e;

    t_kill_children();
    t_unlink_all();
    if (t_shm_leftovers(buf, sizeof buf) == 0)
        return 0;
    fprintf(stderr, "FAIL: objects left in /dev/shm: %s (removing them)\n",
            buf);
    snprintf(prefix, sizeof prefix, "t%ld-", (long)owner_pid);
    d = opendir("/dev/shm");
    if (d != NULL) {
        while ((e = readdir(d)) != NULL) {
            if (strstr(e->d_name, prefix) != NULL) {
                char p[512];
                snprintf(p, sizeof p, "/dev/shm/%s", e->d_name);
                (void)unlink(p);
            }
        }
        closedir(d);
    }
    return 1;
}

void t_test_filters(void)
{
    const char *filter = getenv("WQ_TEST_FILTER"); /* e.g. "test_full*" */
    const char *skip = getenv("WQ_TEST_SKIP");

    if (filter != NULL)
        cmocka_set_test_filter(filter);
    if (skip != NULL)
        cmocka_set_skip_filter(skip);
}

int t_exit_status(int failed)
{
    int left;

    t_stores_cleanup();
    left = t_final_check();
    return failed != 0 || left != 0 ? 1 : 0;
}

/* ------------------------------------------------------------------ */
/* Shared memory and time                                              */
/* ------------------------------------------------------------------ */

void *t_shared_alloc(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        t_fatal("mmap(%zu): %s", size, strerror(errno));
    return p;
}

void t_shared_free(void *p, size_t size)
{
    if (p != NULL)
        munmap(p, size);
}

unsigned t_scale(void)
{
    static unsigned scale;
    if (scale == 0) {
        const char *e = getenv("WQ_TEST_TIMEOUT_SCALE");
        const char *pre = getenv("LD_PRELOAD");
        unsigned v = 1;
        if (e != NULL && atoi(e) >= 1 && atoi(e) <= 100)
            v = (unsigned)atoi(e);
        else if (pre != NULL && strstr(pre, "vgpreload") != NULL)
            v = 10;
        scale = v;
    }
    return scale;
}

uint64_t t_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void t_sleep_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

void t_atomic_max(atomic_ullong *a, unsigned long long v)
{
    unsigned long long cur = atomic_load(a);
    while (cur < v && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

int t_wait_count(atomic_int *v, int target, int ms)
{
    uint64_t deadline = t_now_ns() + (uint64_t)ms * t_scale() * 1000000u;
    while (atomic_load(v) < target) {
        if (t_now_ns() >= deadline)
            return -1;
        usleep(500);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Failure board                                                       */
/* ------------------------------------------------------------------ */

void t_failf(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    char msg[768];

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* Always visible on stderr, with who said it. */
    fprintf(stderr, "  [pid %ld] %s:%d: %s\n", (long)getpid(), file, line,
            msg);
    if (board == NULL)
        return;
    if (atomic_fetch_add(&board->nfail, 1) == 0 &&
        atomic_exchange(&board->claimed, 1) == 0) {
        snprintf(board->msg, sizeof board->msg, "[pid %ld] %s:%d: %s",
                 (long)getpid(), file, line, msg);
    }
}

int t_failures(void)
{
    return board == NULL ? 0 : atomic_load(&board->nfail);
}

const char *t_failure_msg(void)
{
    return board == NULL ? "" : board->msg;
}

void t_failures_reset(void)
{
    if (board == NULL)
        return;
    atomic_store(&board->nfail, 0);
    atomic_store(&board->claimed, 0);
    board->msg[0] = '\0';
}

/* ------------------------------------------------------------------ */
/* Processes                                                           */
/* ------------------------------------------------------------------ */

static void forget_kid(pid_t pid)
{
    pthread_mutex_lock(&reg_lock);
    for (int i = 0; i < nkids; i++) {
        if (kids[i] == pid) {
            kids[i] = kids[nkids - 1];
            nkids = nkids - 1;
            break;
        }
    }
    pthread_mutex_unlock(&reg_lock);
}

pid_t t_fork(unsigned alarm_s)
{
    pid_t pid;

    ensure_board();
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        t_fatal("fork: %s", strerror(errno));
    if (pid == 0) {
        static const int sigs[] = { SIGSEGV, SIGILL, SIGFPE, SIGBUS,
                                    SIGSYS, SIGABRT, SIGALRM, SIGTERM,
                                    SIGINT, SIGHUP };
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            signal(sigs[i], SIG_DFL);
        nkids = 0;
        alarm(alarm_s * t_scale());
        return 0;
    }
    pthread_mutex_lock(&reg_lock);
    if (nkids < T_MAX_KIDS) {
        kids[nkids] = pid;
        nkids = nkids + 1;
    }
    pthread_mutex_unlock(&reg_lock);
    return pid;
}

int t_wait(pid_t pid, int timeout_ms)
{
    uint64_t deadline = t_now_ns() +
                        (uint64_t)timeout_ms * t_scale() * 1000000u;
    int st;

    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR) {
            forget_kid(pid);
            return -1;
        }
        if (t_now_ns() >= deadline) {
            fprintf(stderr, "  child %ld did not exit within %d ms: SIGKILL\n",
                    (long)pid, timeout_ms);
            kill(pid, SIGKILL);
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
            forget_kid(pid);
            return -1;
        }
        t_sleep_ms(1);
    }
    forget_kid(pid);
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return -1;
}

void t_kill_children(void)
{
    if (owner_pid == 0 || getpid() != owner_pid)
        return;
    pthread_mutex_lock(&reg_lock);
    for (int i = 0; i < nkids; i++)
        if (kids[i] > 0)
            kill(kids[i], SIGKILL);
    for (int i = 0; i < nkids; i++)
        if (kids[i] > 0)
            while (waitpid(kids[i], NULL, 0) < 0 && errno == EINTR)
                ;
    nkids = 0;
    pthread_mutex_unlock(&reg_lock);
}

int t_drop_to(uid_t uid)
{
    if (setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0 ||
        getuid() != uid || geteuid() != uid)
        return -1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Teams                                                               */
/* ------------------------------------------------------------------ */

struct t_team {
    enum t_mode mode;
    int n;
    t_actor_fn fn;
    struct t_actor *actors;
    pthread_t *threads;
    int *started;
    int *rc;
    pid_t *pids;
    unsigned alarm_s;
};

struct thread_start {
    struct t_team *t;
    int i;
};

const char *t_mode_name(enum t_mode m)
{
    switch (m) {
    case T_THREADS_SHARED: return "threads/shared-handle";
    case T_THREADS_OWN:    return "threads/own-handle";
    case T_PROCS_OPEN:     return "processes/own-open";
    case T_PROCS_INHERIT:  return "processes/inherited-handle";
    default:                return "?";
    }
}

static int run_actor(struct t_team *t, int i)
{
    struct t_actor *a = &t->actors[i];
    int own = t->mode == T_THREADS_OWN || t->mode == T_PROCS_OPEN;
    int rc;

    if (own) {
        wq *q = NULL;
        int orc = wq_open(a->qname, NULL, &q);
        if (orc != 0) {
            t_failf(__FILE__, __LINE__, "actor %d: wq_open(%s) = %d (%s)",
                     i, a->qname, orc, wq_strerror(orc));
            return 1;
        }
        a->q = q;
    }
    rc = t->fn(a);
    if (own || t->mode == T_PROCS_INHERIT)
        wq_close(a->q);
    return rc;
}

static void *thread_main(void *p)
{
    struct thread_start *s = p;
    s->t->rc[s->i] = run_actor(s->t, s->i);
    free(s);
    return NULL;
}

struct t_team *t_team_start(enum t_mode mode, const char *qname, wq *mainq,
                              int n, t_actor_fn fn, void *arg)
{
    struct t_team *t = calloc(1, sizeof *t);

    if (t == NULL)
        t_fatal("calloc");
    t->mode = mode;
    t->n = n;
    t->fn = fn;
    t->actors = calloc((size_t)n, sizeof *t->actors);
    t->threads = calloc((size_t)n, sizeof *t->threads);
    t->started = calloc((size_t)n, sizeof *t->started);
    t->rc = calloc((size_t)n, sizeof *t->rc);
    t->pids = calloc((size_t)n, sizeof *t->pids);
    t->alarm_s = 25 * t_scale();
    if (!t->actors || !t->threads || !t->started || !t->rc || !t->pids)
        t_fatal("calloc");
    for (int i = 0; i < n; i++) {
        struct t_actor *a = &t->actors[i];
        a->id = i;
        a->n = n;
        a->mode = mode;
        a->q = (mode == T_THREADS_SHARED || mode == T_PROCS_INHERIT) ? mainq
                                                                       : NULL;
        a->qname = qname;
        a->arg = arg;
    }
    for (int i = 0; i < n; i++) {
        if (T_MODE_IS_PROC(mode)) {
            pid_t pid = t_fork(t->alarm_s);
            if (pid == 0) {
                int rc = run_actor(t, i);
                _exit(rc == 0 ? 0 : 1);
            }
            t->pids[i] = pid;
            t->started[i] = 1;
        } else {
            struct thread_start *s = malloc(sizeof *s);
            int e;
            if (s == NULL)
                t_fatal("malloc");
            s->t = t;
            s->i = i;
            e = pthread_create(&t->threads[i], NULL, thread_main, s);
            if (e != 0)
                t_fatal("pthread_create: %s", strerror(e));
            t->started[i] = 1;
        }
    }
    return t;
}

int t_team_wait(struct t_team *t, int timeout_ms)
{
    uint64_t deadline = t_now_ns() +
                        (uint64_t)timeout_ms * t_scale() * 1000000u;
    int failed = 0;

    for (int i = 0; i < t->n; i++) {
        if (!t->started[i])
            continue;
        int64_t left_ms = (int64_t)(deadline - t_now_ns()) / 1000000;
        if ((int64_t)(deadline - t_now_ns()) < 0)
            left_ms = 0;
        if (T_MODE_IS_PROC(t->mode)) {
            /* t_wait scales its timeout; left_ms is already scaled. */
            int rc = t_wait(t->pids[i], (int)(left_ms / t_scale()) + 1);
            if (rc != 0) {
                t_failf(__FILE__, __LINE__,
                         "%s actor %d (pid %ld): %s %d",
                         t_mode_name(t->mode), i, (long)t->pids[i],
                         rc < 0 ? "timed out, killed," :
                         rc > 128 ? "killed by signal" : "exit code",
                         rc > 128 ? rc - 128 : rc);
                failed++;
            }
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += left_ms / 1000;
            ts.tv_nsec += (left_ms % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            int e = pthread_timedjoin_np(t->threads[i], NULL, &ts);
            if (e != 0)
                t_fatal("%s actor %d did not finish within %d ms (%s)",
                         t_mode_name(t->mode), i, timeout_ms, strerror(e));
            if (t->rc[i] != 0)
                failed++;
        }
    }
    free(t->actors);
    free(t->threads);
    free(t->started);
    free(t->rc);
    free(t->pids);
    free(t);
    return failed;
}
