/*
 * helpers.c - see helpers.h.
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
#include "helpers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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

#define TH_DEFAULT_WATCHDOG_S 30
#define TH_MAX_KIDS 1024

/* ------------------------------------------------------------------ */
/* State                                                               */
/* ------------------------------------------------------------------ */

struct th_board {
    atomic_int nfail;
    atomic_int claimed;
    char msg[1024];
};

static struct th_board *board;
static pid_t owner_pid;

/* "/dev/shm/wq." + name, prepared for the signal handler. */
static char paths[TH_MAX_NAMES][sizeof("/dev/shm/wq.") + WQ_MAX_NAME_LEN + 1];
static char names[TH_MAX_NAMES][WQ_MAX_NAME_LEN + 1];
static volatile sig_atomic_t nnames;
static unsigned name_counter;

static volatile pid_t kids[TH_MAX_KIDS];
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
        board = th_shared_alloc(sizeof *board);
}

/* ------------------------------------------------------------------ */
/* Names                                                               */
/* ------------------------------------------------------------------ */

void th_shm_path(const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "/dev/shm/wq.%s", name);
}

static void atexit_cleanup(void)
{
    th_kill_children();
    th_unlink_all();
}

const char *th_qname(const char *tag)
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
    if (nnames >= TH_MAX_NAMES) {
        pthread_mutex_unlock(&reg_lock);
        th_fatal("th_qname: too many names");
    }
    int k = nnames;
    snprintf(names[k], sizeof names[k], "t%ld-%s-%u", (long)getpid(), clean,
             ++name_counter);
    th_shm_path(names[k], paths[k], sizeof paths[k]);
    nnames = k + 1;
    pthread_mutex_unlock(&reg_lock);
    return names[k];
}

void th_unlink_all(void)
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

int th_shm_leftovers(char *buf, size_t cap)
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

void th_watchdog(unsigned seconds)
{
    struct sigaction sa;

    ensure_owner();
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    alarm(seconds);
}

void th_fatal(const char *fmt, ...)
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

int th_group_setup(void **state)
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

int th_group_teardown(void **state)
{
    char buf[512];

    (void)state;
    alarm(0);
    th_kill_children();
    th_unlink_all();
    if (th_shm_leftovers(buf, sizeof buf) != 0) {
        fprintf(stderr, "leftovers in /dev/shm: %s\n", buf);
        return -1;
    }
    return 0;
}

int th_setup(void **state)
{
    (void)state;
    ensure_board();
    th_failures_reset();
    th_watchdog(TH_DEFAULT_WATCHDOG_S * th_scale());
    return 0;
}

int th_teardown(void **state)
{
    (void)state;
    alarm(0);
    th_kill_children();
    th_unlink_all();
    return 0;
}

void th_test_no_leftovers(void **state)
{
    char buf[1024];
    int n;

    (void)state;
    n = th_shm_leftovers(buf, sizeof buf);
    if (n != 0)
        fail_msg("%d object(s) left in /dev/shm: %s", n, buf);
}

int th_final_check(void)
{
    char buf[1024];
    char prefix[32];
    DIR *d;
    struct dirent *e;

    th_kill_children();
    th_unlink_all();
    if (th_shm_leftovers(buf, sizeof buf) == 0)
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

/* ------------------------------------------------------------------ */
/* Shared memory and time                                              */
/* ------------------------------------------------------------------ */

void *th_shared_alloc(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        th_fatal("mmap(%zu): %s", size, strerror(errno));
    return p;
}

void th_shared_free(void *p, size_t size)
{
    if (p != NULL)
        munmap(p, size);
}

unsigned th_scale(void)
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

uint64_t th_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void th_sleep_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ------------------------------------------------------------------ */
/* Failure board                                                       */
/* ------------------------------------------------------------------ */

void th_failf(const char *file, int line, const char *fmt, ...)
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

int th_failures(void)
{
    return board == NULL ? 0 : atomic_load(&board->nfail);
}

const char *th_failure_msg(void)
{
    return board == NULL ? "" : board->msg;
}

void th_failures_reset(void)
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

pid_t th_fork(unsigned alarm_s)
{
    pid_t pid;

    ensure_board();
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        th_fatal("fork: %s", strerror(errno));
    if (pid == 0) {
        static const int sigs[] = { SIGSEGV, SIGILL, SIGFPE, SIGBUS,
                                    SIGSYS, SIGABRT, SIGALRM, SIGTERM,
                                    SIGINT, SIGHUP };
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            signal(sigs[i], SIG_DFL);
        nkids = 0;
        alarm(alarm_s * th_scale());
        return 0;
    }
    pthread_mutex_lock(&reg_lock);
    if (nkids < TH_MAX_KIDS) {
        kids[nkids] = pid;
        nkids = nkids + 1;
    }
    pthread_mutex_unlock(&reg_lock);
    return pid;
}

int th_wait(pid_t pid, int timeout_ms)
{
    uint64_t deadline = th_now_ns() +
                        (uint64_t)timeout_ms * th_scale() * 1000000u;
    int st;

    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR) {
            forget_kid(pid);
            return -1;
        }
        if (th_now_ns() >= deadline) {
            fprintf(stderr, "  child %ld did not exit within %d ms: SIGKILL\n",
                    (long)pid, timeout_ms);
            kill(pid, SIGKILL);
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
            forget_kid(pid);
            return -1;
        }
        th_sleep_ms(1);
    }
    forget_kid(pid);
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return -1;
}

void th_kill_children(void)
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

/* ------------------------------------------------------------------ */
/* Teams                                                               */
/* ------------------------------------------------------------------ */

struct th_team {
    enum th_mode mode;
    int n;
    th_actor_fn fn;
    struct th_actor *actors;
    pthread_t *threads;
    int *started;
    int *rc;
    pid_t *pids;
    unsigned alarm_s;
};

struct thread_start {
    struct th_team *t;
    int i;
};

const char *th_mode_name(enum th_mode m)
{
    switch (m) {
    case TH_THREADS_SHARED: return "threads/shared-handle";
    case TH_THREADS_OWN:    return "threads/own-handle";
    case TH_PROCS_OPEN:     return "processes/own-open";
    case TH_PROCS_INHERIT:  return "processes/inherited-handle";
    default:                return "?";
    }
}

static int run_actor(struct th_team *t, int i)
{
    struct th_actor *a = &t->actors[i];
    int own = t->mode == TH_THREADS_OWN || t->mode == TH_PROCS_OPEN;
    int rc;

    if (own) {
        wq *q = NULL;
        int orc = wq_open(a->qname, NULL, &q);
        if (orc != 0) {
            th_failf(__FILE__, __LINE__, "actor %d: wq_open(%s) = %d (%s)",
                     i, a->qname, orc, wq_strerror(orc));
            return 1;
        }
        a->q = q;
    }
    rc = t->fn(a);
    if (own || t->mode == TH_PROCS_INHERIT)
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

struct th_team *th_team_start(enum th_mode mode, const char *qname, wq *mainq,
                              int n, th_actor_fn fn, void *arg)
{
    struct th_team *t = calloc(1, sizeof *t);

    if (t == NULL)
        th_fatal("calloc");
    t->mode = mode;
    t->n = n;
    t->fn = fn;
    t->actors = calloc((size_t)n, sizeof *t->actors);
    t->threads = calloc((size_t)n, sizeof *t->threads);
    t->started = calloc((size_t)n, sizeof *t->started);
    t->rc = calloc((size_t)n, sizeof *t->rc);
    t->pids = calloc((size_t)n, sizeof *t->pids);
    t->alarm_s = 25 * th_scale();
    if (!t->actors || !t->threads || !t->started || !t->rc || !t->pids)
        th_fatal("calloc");
    for (int i = 0; i < n; i++) {
        struct th_actor *a = &t->actors[i];
        a->id = i;
        a->n = n;
        a->mode = mode;
        a->q = (mode == TH_THREADS_SHARED || mode == TH_PROCS_INHERIT) ? mainq
                                                                       : NULL;
        a->qname = qname;
        a->arg = arg;
    }
    for (int i = 0; i < n; i++) {
        if (TH_MODE_IS_PROC(mode)) {
            pid_t pid = th_fork(t->alarm_s);
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
                th_fatal("malloc");
            s->t = t;
            s->i = i;
            e = pthread_create(&t->threads[i], NULL, thread_main, s);
            if (e != 0)
                th_fatal("pthread_create: %s", strerror(e));
            t->started[i] = 1;
        }
    }
    return t;
}

int th_team_wait(struct th_team *t, int timeout_ms)
{
    uint64_t deadline = th_now_ns() +
                        (uint64_t)timeout_ms * th_scale() * 1000000u;
    int failed = 0;

    for (int i = 0; i < t->n; i++) {
        if (!t->started[i])
            continue;
        int64_t left_ms = (int64_t)(deadline - th_now_ns()) / 1000000;
        if ((int64_t)(deadline - th_now_ns()) < 0)
            left_ms = 0;
        if (TH_MODE_IS_PROC(t->mode)) {
            /* th_wait scales its timeout; left_ms is already scaled. */
            int rc = th_wait(t->pids[i], (int)(left_ms / th_scale()) + 1);
            if (rc != 0) {
                th_failf(__FILE__, __LINE__,
                         "%s actor %d (pid %ld): %s %d",
                         th_mode_name(t->mode), i, (long)t->pids[i],
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
                th_fatal("%s actor %d did not finish within %d ms (%s)",
                         th_mode_name(t->mode), i, timeout_ms, strerror(e));
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
