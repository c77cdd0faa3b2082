/*
 * work.c - `wqctl work`: the supervisor, its monitor, and the workers
 * that run a command once per key.
 *
 * Design note. `wqctl work` is a crash-safe, deduplicating `xargs -P`.
 * Three kinds of process take part:
 *
 *   wqctl, the supervisor  wq_run_workers(): forks -j workers, restarts a
 *                          worker that dies, turns the first SIGINT or
 *                          SIGTERM into a drain and the second into a
 *                          stop.
 *   the monitor            (when stderr is a terminal, or with
 *                          --exit-when-empty) polls wq_stats every 50 ms:
 *                          draws the progress line, and shuts the queue
 *                          down once one snapshot shows nothing queued,
 *                          processing or waiting. A key is processing from
 *                          its get until its finish, and the library's
 *                          re-add of a failed or requeued key happens
 *                          before that finish, so no snapshot between two
 *                          runs of a key can look empty.
 *   the workers            the library's get -> work_reconcile -> finish
 *                          loop; work_reconcile forks and execs CMD and
 *                          maps its exit status to an outcome.
 *
 * A task runs in its own process group: a timeout kills the whole group
 * (a shell's children too), and a terminal's ^C, which reaches the whole
 * foreground group, does not kill tasks half way: the supervisor turns
 * it into a drain instead. A task dies with its worker (PR_SET_PDEATHSIG),
 * so the key of a worker that crashed is never run twice at once.
 *
 * Workers have libwq's lease thread, so between fork and exec a task
 * calls only async-signal-safe functions; its argv and environment are
 * made before the fork.
 *
 * The counters of the progress line live in a MAP_SHARED|MAP_ANONYMOUS
 * page mapped before any fork, so every process sees the same page.
 */
#include "wqctl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WORK_MAX_JOBS      1024u   /* wq_run_workers' limit */
#define WORK_GRACE_NS      1000000000u /* timeout: SIGTERM, then SIGKILL */
#define WORK_TICK_NS       50000000u   /* monitor period */
#define WORK_DRAW_NS       250000000u  /* progress refresh */
#define WORK_RATE_SAMPLES  8           /* rate over the last ~2 s */
#define WORK_LINE_MAX      4096        /* stderr is echoed in pieces <= this */
#define WORK_MSG_MAX       255         /* wq_result.message holds 255 bytes */
#define WORK_CODE_TIMEOUT  124         /* timeout(1)'s status */
#define WORK_CODE_NOEXEC   126         /* the command could not be run */
#define WORK_CODE_NOTFOUND 127         /* the command was not found */
#define WORK_EXIT_STOPPED  130         /* stopped by a second signal */
#define WORK_GROUPS        4096        /* task groups tracked for a stop */

#if ATOMIC_INT_LOCK_FREE != 2 || ATOMIC_LLONG_LOCK_FREE != 2
#error "the work counters need lock-free atomics to work across processes"
#endif

/* Shared by wqctl, the monitor and the workers (written as noted). */
struct work_shared {
    _Atomic unsigned long long succeeded; /* workers: exit status 0 */
    _Atomic unsigned long long failed;    /* workers: failed or timed out */
    _Atomic unsigned long long requeued;  /* workers: the requeue status */
    atomic_int stop;                      /* wqctl -> monitor: exit */
    /* The process group of each running task, so that wqctl can kill
       what is left of the tasks when a second signal stops the run (the
       library SIGKILLs the workers; a task dies with its worker, but not
       the task's own children). A worker process takes slot
       next_group++ % WORK_GROUPS on its first task, stores the group
       before the task may run (the task waits for nothing: the store
       follows fork at once, and the group is killed only once the
       workers are dead) and clears it once the task is reaped. */
    atomic_uint next_group;
    atomic_int group[WORK_GROUPS];
};

/* Signals whose disposition a task gets back (wqctl's at start). */
static const int work_signals[] = { SIGINT, SIGTERM, SIGPIPE };
#define N_WORK_SIGNALS (sizeof work_signals / sizeof work_signals[0])

/* What every process of a run needs; set up before any fork. */
struct work_conf {
    char **cmd;                /* CMD ARG... (positionals of `work`) */
    size_t ncmd;
    int64_t timeout_ns;        /* per task; < 0: none */
    const char *timeout_str;   /* as the user wrote it */
    int requeue_status;
    int64_t requeue_after_ns;
    const char *requeue_after_str;
    bool exit_when_empty;
    bool progress;             /* stderr is a terminal */
    bool sig_ignored[N_WORK_SIGNALS];
    struct work_shared *sh;
};

/* ---- a task's stderr: echoed, and its last non-blank line kept ---- */

struct errcap {
    bool clear_line;           /* erase the progress line before echoing */
    bool cont;                 /* the current line was partly echoed */
    size_t n;                  /* bytes in line[] */
    size_t cur_n;              /* bytes in cur[] */
    char line[WORK_LINE_MAX];  /* current line, not yet echoed */
    char cur[WORK_MSG_MAX + 1]; /* the current line's first bytes (one
                                   more than kept, to cut at a UTF-8
                                   boundary) */
    char last[WORK_MSG_MAX + 1]; /* the last non-blank line, "" if none */
};

static void write_all(int fd, const char *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;   /* stderr gone: the output is lost, not the task */
        p += n;
        len -= (size_t)n;
    }
}

/* Echo line[] (and a newline) to wqctl's stderr in one write where the
   system allows, so that lines of concurrent tasks do not mix. */
static void errcap_echo(struct errcap *e, bool newline)
{
    static const char clear[] = "\r\033[K";
    char buf[sizeof clear + WORK_LINE_MAX + 1];
    size_t n = 0;

    if (e->clear_line && !e->cont) {
        memcpy(buf, clear, sizeof clear - 1);
        n = sizeof clear - 1;
    }
    memcpy(buf + n, e->line, e->n);
    n += e->n;
    if (newline)
        buf[n++] = '\n';
    write_all(STDERR_FILENO, buf, n);
}

static void errcap_end_line(struct errcap *e)
{
    size_t n = e->cur_n;

    errcap_echo(e, true);
    e->n = 0;
    e->cont = false;
    if (n > WORK_MSG_MAX) {
        /* Cut to WORK_MSG_MAX bytes, not inside a UTF-8 sequence. */
        n = WORK_MSG_MAX;
        if (((unsigned char)e->cur[n] & 0xc0) == 0x80) {
            while (n > 0 && ((unsigned char)e->cur[n - 1] & 0xc0) == 0x80)
                n--;
            if (n > 0 && (unsigned char)e->cur[n - 1] >= 0xc0)
                n--;
        }
    }
    while (n > 0 && (e->cur[n - 1] == ' ' || e->cur[n - 1] == '\t' ||
                     e->cur[n - 1] == '\r'))
        n--;
    if (n > 0) {
        memcpy(e->last, e->cur, n);
        e->last[n] = '\0';
    }
    e->cur_n = 0;
}

static void errcap_feed(struct errcap *e, const char *p, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (p[i] == '\n') {
            errcap_end_line(e);
            continue;
        }
        if (e->n == sizeof e->line) {
            errcap_echo(e, false);
            e->n = 0;
            e->cont = true;
        }
        e->line[e->n++] = p[i];
        if (e->cur_n < sizeof e->cur)
            e->cur[e->cur_n++] = p[i];
    }
}

/* End of the stream: a last line without its newline still counts. */
static void errcap_close(struct errcap *e)
{
    if (e->n > 0 || e->cont || e->cur_n > 0)
        errcap_end_line(e);
}

/* ---- running one task ---- */

/*
 * One word of CMD with its placeholders filled in: "{}" by the key as it
 * is, "{q}" by the key quoted for sh (in '...', each ' as '\''), so that
 * `sh -c 'echo {q}'` sees one word whatever the key holds. (For shell
 * code, "$WQ_KEY" needs no quoting at all.) With out NULL, only the
 * length is computed.
 */
static size_t fill_word(const char *w, const char *key, size_t klen, char *out)
{
    size_t k = 0;

    for (const char *p = w; *p;) {
        if (p[0] == '{' && p[1] == '}') {
            if (out)
                memcpy(out + k, key, klen);
            k += klen;
            p += 2;
        } else if (p[0] == '{' && p[1] == 'q' && p[2] == '}') {
            if (out)
                out[k] = '\'';
            k++;
            for (size_t i = 0; i < klen; i++) {
                if (key[i] == '\'') {
                    if (out)
                        memcpy(out + k, "'\\''", 4);
                    k += 4;
                } else {
                    if (out)
                        out[k] = key[i];
                    k++;
                }
            }
            if (out)
                out[k] = '\'';
            k++;
            p += 3;
        } else {
            if (out)
                out[k] = *p;
            k++;
            p++;
        }
    }
    if (out)
        out[k] = '\0';
    return k;
}

/* CMD's words with the placeholders filled in; NULL-terminated. */
static char **work_argv(const struct work_conf *c, const char *key)
{
    size_t klen = strlen(key);
    char **argv = calloc(c->ncmd + 1, sizeof *argv);

    if (!argv)
        return NULL;
    for (size_t i = 0; i < c->ncmd; i++) {
        char *s = malloc(fill_word(c->cmd[i], key, klen, NULL) + 1);

        if (!s) {
            while (i > 0)
                free(argv[--i]);
            free(argv);
            return NULL;
        }
        fill_word(c->cmd[i], key, klen, s);
        argv[i] = s;
    }
    return argv;
}

static void free_argv(char **argv)
{
    for (size_t i = 0; argv[i]; i++)
        free(argv[i]);
    free(argv);
}

/* In the task, after fork: report why exec failed (async-signal-safe). */
static void task_die(const char *what, int err)
{
    static const char prefix[] = "wqctl: work: ";
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 32)
    const char *why = strerrordesc_np(err);   /* no locale: safe here */
#else
    const char *why = strerror(err);
#endif

    write_all(STDERR_FILENO, prefix, sizeof prefix - 1);
    write_all(STDERR_FILENO, what, strlen(what));
    write_all(STDERR_FILENO, ": ", 2);
    if (!why)
        why = "unknown error";
    write_all(STDERR_FILENO, why, strlen(why));
    write_all(STDERR_FILENO, "\n", 1);
    _exit(err == ENOENT ? WORK_CODE_NOTFOUND : WORK_CODE_NOEXEC);
}

/*
 * Fork the task: its own process group, dead with its worker, wqctl's
 * original dispositions of SIGINT, SIGTERM and SIGPIPE, stdin from
 * /dev/null, stderr into errfd. Returns its pid or -errno.
 */
static pid_t task_spawn(const struct work_conf *c, char **argv, int errfd)
{
    pid_t worker = getpid();
    pid_t pid = fork();
    int fd;

    if (pid < 0)
        return -errno;
    if (pid > 0) {
        setpgid(pid, pid);   /* also here: no window without the group */
        return pid;
    }
    setpgid(0, 0);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != worker)
        _exit(WORK_CODE_NOEXEC);   /* the worker is gone already */
    for (size_t i = 0; i < N_WORK_SIGNALS; i++) {
        struct sigaction sa;

        memset(&sa, 0, sizeof sa);
        sa.sa_handler = c->sig_ignored[i] ? SIG_IGN : SIG_DFL;
        sigaction(work_signals[i], &sa, NULL);
    }
    fd = open("/dev/null", O_RDONLY);
    if (fd < 0 || (fd != STDIN_FILENO && dup2(fd, STDIN_FILENO) < 0))
        task_die("/dev/null", errno);
    if (fd != STDIN_FILENO)
        close(fd);
    if (errfd == STDERR_FILENO)
        fcntl(errfd, F_SETFD, 0);   /* it was made close-on-exec */
    else if (dup2(errfd, STDERR_FILENO) < 0)
        _exit(WORK_CODE_NOEXEC);
    execvp(argv[0], argv);
    task_die(argv[0], errno);
    return -1;   /* not reached */
}

/* Read what the task wrote to stderr (the pipe is non-blocking):
   1 when something was read (or a signal interrupted), 0 when nothing is
   there now, -1 at end of file (or on an error). */
static int task_read(int fd, struct errcap *e)
{
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);

    if (n > 0) {
        errcap_feed(e, buf, (size_t)n);
        return 1;
    }
    if (n < 0 && errno == EINTR)
        return 1;
    return n < 0 && errno == EAGAIN ? 0 : -1;
}

/*
 * Wait for the task, echoing and capturing its stderr, and enforce the
 * timeout: SIGTERM to its process group, SIGKILL one second later. The
 * task's exit is watched through a pidfd where the kernel has them (else
 * by polling every 50 ms), not through the pipe: a child of the task may
 * keep the pipe open after the task itself is gone. Reaps the task and
 * stores its wait status.
 */
static void task_wait(const struct work_conf *c, pid_t pid, int fd,
                      struct errcap *e, int *status, bool *timed_out)
{
    uint64_t term_at = UINT64_MAX, kill_at = UINT64_MAX;
    bool eof = false;
    int pidfd = -1;

#ifdef SYS_pidfd_open
    pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
#endif
    *timed_out = false;
    if (c->timeout_ns > 0)
        term_at = now_mono() + (uint64_t)c->timeout_ns;
    for (;;) {
        struct pollfd pfd[2];
        nfds_t n = 0;
        siginfo_t si;
        uint64_t now, until;
        int ms;

        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
            si.si_pid == pid)
            break;   /* exited; reaped below */
        now = now_mono();
        if (now >= term_at) {
            *timed_out = true;
            kill(-pid, SIGTERM);
            kill(pid, SIGTERM);
            term_at = UINT64_MAX;
            kill_at = now + WORK_GRACE_NS;
        }
        if (now >= kill_at) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            kill_at = UINT64_MAX;
        }
        until = term_at < kill_at ? term_at : kill_at;
        if (until == UINT64_MAX)
            ms = -1;
        else if (until - now > 3600ull * 1000000000)
            ms = 3600 * 1000;   /* an hour at most: ms fits an int */
        else
            ms = (int)((until - now + 999999) / 1000000);
        if (pidfd < 0 && (ms < 0 || ms > (int)(WORK_TICK_NS / 1000000)))
            ms = (int)(WORK_TICK_NS / 1000000);
        if (!eof)
            pfd[n++] = (struct pollfd){ .fd = fd, .events = POLLIN };
        if (pidfd >= 0)
            pfd[n++] = (struct pollfd){ .fd = pidfd, .events = POLLIN };
        if (poll(pfd, n, ms) > 0 && !eof && pfd[0].revents)
            eof = task_read(fd, e) < 0;
    }
    /* What is left in the pipe (at most a pipe's capacity, as the task
       could not exit with more unread); a bounded amount in any case,
       should a child of the task go on writing. */
    for (int i = 0; !eof && i < 64; i++) {
        int r = task_read(fd, e);

        if (r < 0)
            eof = true;
        else if (r == 0)
            break;
    }
    if (*timed_out)
        kill(-pid, SIGKILL);   /* what is left of its group; the zombie
                                  still holds the group id */
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
    if (pidfd >= 0)
        close(pidfd);
    errcap_close(e);
}

/* A failure that happened before the command ran. */
static int work_fail(struct wq_reconcile *out, struct work_shared *sh,
                     const char *what, int err)
{
    out->code = WORK_CODE_NOEXEC;
    if (err)
        snprintf(out->message, sizeof out->message, "wqctl: work: %s: %s",
                 what, strerror(err));
    else
        snprintf(out->message, sizeof out->message, "wqctl: work: %s", what);
    atomic_fetch_add(&sh->failed, 1);
    return -1;
}

/* This worker process's slot in sh->group; taken on first use. */
static atomic_int *work_group_slot(struct work_shared *sh)
{
    static atomic_int *slot;   /* per worker: set after the fork */

    if (!slot)
        slot = &sh->group[atomic_fetch_add(&sh->next_group, 1) % WORK_GROUPS];
    return slot;
}

/* The reconciler: runs in a worker process, once per key. */
static int work_reconcile(wq *q, const void *key, size_t len,
                          struct wq_reconcile *out, void *arg)
{
    const struct work_conf *c = arg;
    struct work_shared *sh = c->sh;
    struct errcap *e;
    char **argv;
    int fds[2], status = 0;
    bool timed_out;
    pid_t pid;

    (void)q;
    if (memchr(key, '\0', len))
        return work_fail(out, sh, "the key holds a NUL byte and cannot be "
                         "passed to a command", 0);
    e = calloc(1, sizeof *e);
    argv = work_argv(c, key);
    if (!e || !argv) {
        free(e);
        if (argv)
            free_argv(argv);
        return work_fail(out, sh, "out of memory", 0);
    }
    e->clear_line = c->progress;
    if (setenv("WQ_KEY", key, 1) < 0 || pipe2(fds, O_CLOEXEC) < 0) {
        int err = errno;

        free(e);
        free_argv(argv);
        return work_fail(out, sh, "setting up the task", err);
    }
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    pid = task_spawn(c, argv, fds[1]);
    close(fds[1]);
    free_argv(argv);
    if (pid < 0) {
        close(fds[0]);
        free(e);
        return work_fail(out, sh, "fork", (int)-pid);
    }
    atomic_store(work_group_slot(sh), pid);
    task_wait(c, pid, fds[0], e, &status, &timed_out);
    atomic_store(work_group_slot(sh), 0);
    close(fds[0]);

    if (timed_out) {
        out->code = WORK_CODE_TIMEOUT;
        snprintf(out->message, sizeof out->message, "timed out after %s",
                 c->timeout_str);
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        snprintf(out->message, sizeof out->message, "%s",
                 e->last[0] ? e->last : "ok");
    } else if (WIFEXITED(status) &&
               WEXITSTATUS(status) == c->requeue_status) {
        out->requeue_after_ns = c->requeue_after_ns;
        if (e->last[0])
            snprintf(out->message, sizeof out->message, "%s", e->last);
        else
            snprintf(out->message, sizeof out->message, "requeue after %s",
                     c->requeue_after_str);
    } else if (WIFEXITED(status)) {
        out->code = WEXITSTATUS(status);
        if (e->last[0])
            snprintf(out->message, sizeof out->message, "%s", e->last);
        else
            snprintf(out->message, sizeof out->message, "exit status %d",
                     out->code);
    } else {
        int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;

        out->code = 128 + sig;
        if (e->last[0])
            snprintf(out->message, sizeof out->message, "%s", e->last);
        else
            snprintf(out->message, sizeof out->message,
                     "killed by signal %d (%s)", sig, strsignal(sig));
    }
    free(e);
    if (out->code == 0 && out->requeue_after_ns > 0) {
        atomic_fetch_add(&sh->requeued, 1);
        return 0;
    }
    if (out->code == 0) {
        atomic_fetch_add(&sh->succeeded, 1);
        return 0;
    }
    atomic_fetch_add(&sh->failed, 1);
    return -1;
}

/* ---- the monitor: progress line, --exit-when-empty ---- */

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000u),
                           .tv_nsec = (long)(ns % 1000000000u) };

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static unsigned long long work_completed(struct work_shared *sh)
{
    return atomic_load(&sh->succeeded) + atomic_load(&sh->failed) +
           atomic_load(&sh->requeued);
}

static void work_draw(const struct work_conf *c, const struct wq_stats *st,
                      double rate)
{
    char buf[256];
    int n = snprintf(buf, sizeof buf, "\r\033[Kdone %llu  failed %llu  "
                     "requeued %llu  queued %" PRIu64 "  running %" PRIu64
                     "  waiting %" PRIu64 "  %.1f keys/s",
                     atomic_load(&c->sh->succeeded),
                     atomic_load(&c->sh->failed),
                     atomic_load(&c->sh->requeued), st->queued,
                     st->processing, st->waiting, rate);

    if (n > 0)
        write_all(STDERR_FILENO, buf, (size_t)n < sizeof buf ? (size_t)n
                                                              : sizeof buf - 1);
}

static void monitor_main(wq *q, const struct work_conf *c, pid_t parent)
{
    struct { uint64_t t; unsigned long long n; } s[WORK_RATE_SAMPLES];
    size_t ns = 0;
    uint64_t next_draw = now_mono();
    struct sigaction ign;

    /* ^C reaches the whole group: the supervisor decides, and we keep
       drawing while it drains. wqctl stops us through sh->stop. */
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGINT, &ign, NULL);
    sigaction(SIGTERM, &ign, NULL);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
        _exit(0);
    while (!atomic_load(&c->sh->stop)) {
        struct wq_stats st;
        uint64_t now = now_mono();

        if (wq_stats(q, &st) == 0) {
            if (c->progress && now >= next_draw) {
                double rate = 0;

                if (ns == WORK_RATE_SAMPLES) {
                    memmove(s, s + 1, (ns - 1) * sizeof s[0]);
                    ns--;
                }
                s[ns].t = now;
                s[ns++].n = work_completed(c->sh);
                if (ns > 1 && s[ns - 1].t > s[0].t)
                    rate = (double)(s[ns - 1].n - s[0].n) * 1e9 /
                           (double)(s[ns - 1].t - s[0].t);
                work_draw(c, &st, rate);
                next_draw = now + WORK_DRAW_NS;
            }
        }
        sleep_ns(WORK_TICK_NS);
    }
    wq_close(q);
    _exit(0);
}

/* Tell the monitor to stop and reap it (SIGKILL after a second). */
static void monitor_stop(pid_t pid, struct work_shared *sh)
{
    uint64_t deadline = now_mono() + 1000000000u;

    atomic_store(&sh->stop, 1);
    for (;;) {
        pid_t r = waitpid(pid, NULL, WNOHANG);

        if (r == pid || (r < 0 && errno != EINTR))
            return;
        if (now_mono() >= deadline)
            break;
        sleep_ns(5000000);
    }
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

/* ---- the command ---- */

static int work_options(const struct args *a, struct work_conf *c,
                        uint32_t *jobs)
{
    uint32_t status = 75;   /* EX_TEMPFAIL */

    *jobs = 1;
    if (!opt_u32(a, O_JOBS, 10, WORK_MAX_JOBS, jobs) ||
        !opt_u32(a, O_REQUEUE_STATUS, 10, 255, &status) ||
        !opt_timeout(a, -1, &c->timeout_ns) ||
        !opt_duration(a, O_REQUEUE_AFTER, false, 1000000000, &c->requeue_after_ns))
        return EXIT_USAGE;
    if (*jobs == 0)
        return usage_error(a->cmd, "-j needs at least 1 job");
    if (status == 0)
        return usage_error(a->cmd, "--requeue-status 0 is success; use 1..255");
    if (a->val[O_TIMEOUT] && c->timeout_ns == 0)
        return usage_error(a->cmd, "--timeout must be above 0 (or forever)");
    if (c->requeue_after_ns == 0)
        return usage_error(a->cmd, "--requeue-after must be above 0");
    if (a->pos[1][0] == '\0')
        return usage_error(a->cmd, "empty command");
    c->requeue_status = (int)status;
    c->timeout_str = a->val[O_TIMEOUT] ? a->val[O_TIMEOUT] : "forever";
    c->requeue_after_str = a->val[O_REQUEUE_AFTER] ? a->val[O_REQUEUE_AFTER]
                                                   : "1s";
    c->exit_when_empty = a->val[O_EXIT_WHEN_EMPTY] != NULL;
    c->cmd = a->pos + 1;
    c->ncmd = a->npos - 1;
    return EXIT_OK;
}

int cmd_work(const struct args *a)
{
    const char *name = a->pos[0];
    struct work_conf c;
    struct work_shared *sh;
    struct sigaction old_pipe, ign;
    struct wq_stats st;
    uint32_t jobs;
    uint64_t free_slots;
    uint64_t t0;
    pid_t monitor = -1;
    wq *q;
    int rc, err;

    memset(&c, 0, sizeof c);
    if ((rc = work_options(a, &c, &jobs)) != EXIT_OK)
        return rc;
    c.progress = isatty(STDERR_FILENO) == 1;
    if ((rc = open_queue(name, 0, &q)) != EXIT_OK)
        return rc;
    if ((rc = queue_stats(q, name, &st)) != EXIT_OK)
        return rc;
    /* Each worker takes a process-table slot; ours is given up while they
       run (wq_run_workers), and the monitor only looks, so it takes none
       (a queue without a table, max_procs 0 as on Redis, has no limit). */
    free_slots = st.max_procs + 1 > st.processes ? st.max_procs + 1 - st.processes : 0;
    if (st.max_procs > 0 && free_slots < jobs) {
        queue_msg(name);
        fprintf(stderr, "-j %" PRIu32 " needs %" PRIu32 " free process "
                "slots, %" PRIu64 " of %" PRIu64 " are free (see create "
                "--max-procs)\n", jobs, jobs, free_slots, st.max_procs);
        wq_close(q);
        return EXIT_FAIL;
    }
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        fprintf(stderr, "wqctl: mmap: %s\n", strerror(errno));
        wq_close(q);
        return EXIT_FAIL;
    }
    c.sh = sh;   /* anonymous memory is zero: every counter starts at 0 */

    /* Tasks get back wqctl's own dispositions; wqctl and its workers
       ignore SIGPIPE, so that a closed stderr cannot kill a worker. */
    for (size_t i = 0; i < N_WORK_SIGNALS; i++) {
        struct sigaction sa;

        c.sig_ignored[i] = sigaction(work_signals[i], NULL, &sa) == 0 &&
                           sa.sa_handler == SIG_IGN;
    }
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &old_pipe);
    if (setenv("WQ_QUEUE", name, 1) < 0) {
        rc = out_of_memory();
        goto out;
    }

    fflush(NULL);   /* nothing buffered is copied into the children */
    t0 = now_mono();
    if (c.progress) {
        pid_t parent = getpid();

        monitor = fork();
        if (monitor < 0) {
            fprintf(stderr, "wqctl: fork: %s\n", strerror(errno));
            rc = EXIT_FAIL;
            goto out;
        }
        if (monitor == 0)
            monitor_main(q, &c, parent);
    }
    /* The pool: stopped by a first signal (tasks finish, queued keys
       wait for the next work), or once the queue is empty. */
    struct wq_pool_options po = { .until_empty = c.exit_when_empty, .name = "wqctl" };
    err = wq_run_workers_opts(q, jobs, work_reconcile, &c, &po);
    if (err == -EINTR) {
        /* Stopped: the workers are dead and their tasks with them; kill
           what the tasks left in their process groups. */
        for (size_t i = 0; i < WORK_GROUPS; i++) {
            int g = atomic_exchange(&sh->group[i], 0);

            if (g > 0)
                kill(-g, SIGKILL);
        }
    }
    if (monitor > 0)
        monitor_stop(monitor, sh);
    if (c.progress) {
        double secs = (double)(now_mono() - t0) / 1e9;

        fprintf(stderr, "\r\033[Kwqctl: work: done %llu, failed %llu, "
                "requeued %llu in %.1f s (%.1f keys/s)%s\n",
                atomic_load(&sh->succeeded), atomic_load(&sh->failed),
                atomic_load(&sh->requeued), secs,
                secs > 0 ? (double)work_completed(sh) / secs : 0.0,
                err == -EINTR ? ", stopped" : "");
    }
    if (err == 0)
        rc = EXIT_OK;
    else if (err == -EINTR)
        rc = WORK_EXIT_STOPPED;
    else
        rc = queue_error(name, "work", err);
out:
    sigaction(SIGPIPE, &old_pipe, NULL);
    wq_close(q);
    munmap(sh, sizeof *sh);
    return rc;
}
