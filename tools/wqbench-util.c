/*
 * wqbench-util.c - everything in wqbench that is not a workload.
 *
 * Output. A result holds one figure per repetition; it is printed as one
 * JSON line (median, min, max, spread = (max - min) / median, reps, then
 * the workload's extra fields) or as one fixed-width table row. Rows are
 * fixed width, not aligned after the fact, so the fault-injection helper
 * (a separate process writing to the same stdout) prints rows that line
 * up with ours.
 *
 * Cleanup. Queue names, an mq name and store directories in use are kept
 * in small static tables; normal teardown, wqb_die() and the SIGINT /
 * SIGTERM / SIGHUP handler all stop the children still registered
 * (SIGTERM, so that the recover helper removes its own queue) and remove
 * what is registered, so nothing is left in /dev/shm or /tmp. The handler
 * sticks to plain system calls (kill, waitpid, unlink, getdents64;
 * wq_unlink only formats a path and unlinks it). A redis-server that
 * wqbench started is stopped after the queues are removed and before its
 * directory is; a handler leaves redis:// queues alone (removing one
 * talks to the server), the server and its memory go with them. The
 * watchdog (SIGALRM) cleans up the same way when a variant takes too long.
 *
 * Children. wqb_fork() children get the default signal dispositions, get
 * SIGTERM when their parent dies (PR_SET_PDEATHSIG) and end with _exit(),
 * so they never run the parent's cleanup.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <sched.h>
#include <mqueue.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wqbench.h"

#define MAX_QUEUES 8
#define MAX_PIDS   16
#define MAX_PATHS  4

static pid_t main_pid;
static unsigned name_seq;
static char qnames[MAX_QUEUES][WQB_NAME_LEN];
static volatile sig_atomic_t qused[MAX_QUEUES];
static pid_t pids[MAX_PIDS];
static char paths[MAX_PATHS][128];      /* "mq:/name" or a store directory */
static volatile sig_atomic_t pused[MAX_PATHS];
static volatile pid_t server_pid;       /* a redis-server we started */
static volatile sig_atomic_t in_signal; /* cleanup from a handler */
static char qprefix[160];               /* --prefix / the engine's address */
static bool any_failed;
static char watch_what[64];

/* ------------------------------------------------------------------ */
/* Configuration                                                       */
/* ------------------------------------------------------------------ */

int wqb_reps(const struct wqb_cfg *c)
{
    if (c->reps > 0)
        return c->reps;
    return c->mode == WQB_QUICK ? 3 : 5;
}

/* Whether --variant selects this variant (all when not given). */
bool wqb_want(const struct wqb_cfg *c, const char *variant)
{
    for (int i = 0; i < c->nvariants; i++)
        if (strcmp(c->variants[i], variant) == 0)
            return true;
    return c->nvariants == 0;
}

/* A workload's size: --n if given, else the quick or default size. */
uint64_t wqb_size(const struct wqb_cfg *c, uint64_t quick, uint64_t dflt)
{
    if (c->n > 0)
        return c->n;
    return c->mode == WQB_QUICK ? quick : dflt;
}

void wqb_usage(FILE *f)
{
    fprintf(f,
        "usage: wqbench [--quick | --full] [--workload NAME[,NAME...]]... [--json | --table]\n"
        "               [--variant NAME[,NAME...]] [--n N] [--reps R]\n"
        "               [--engine shm | --engine redis [--pin split|same|none]\n"
        "                | --prefix redis://[[USER]:PASS@]HOST[:PORT]/]\n"
        "  workloads: floor-mutex cycle floor-mq drain mpmc scale starve recover durable\n"
        "             (default: all, in that order)\n"
        "             with --engine redis: cycle add_many drain mpmc\n"
        "  --quick    small sizes, whole run under 30 s (CI)\n"
        "  --full     also scale L = 1e7\n"
        "  --json     one JSON line per variant (default)\n"
        "  --table    a human-readable table\n"
        "  --variant  only these variants (e.g. memory, C=2, L=1e6, paced50k-p1c1)\n"
        "  --n N      override the main size of each selected workload\n"
        "  --reps R   repetitions per variant (default 5, --quick 3)\n"
        "  --engine redis  the redis:// engine against a redis-server that wqbench\n"
        "             starts (loopback, free port) and stops; with a three-script Lua\n"
        "             queue as baseline\n"
        "  --pin split  the server on one CPU, wqbench and its workers on the others\n"
        "             (default); same: all on one CPU; none: no pinning\n"
        "  --prefix redis://HOST:PORT/  the same against a server of yours (not\n"
        "             pinned; keys named wqbench.<pid>.* and lua3:{...}, removed)\n");
}

/* Split a comma list into names[] (max entries); -1 if too many. */
static int add_names(char *list, const char **names, int *nnames, int max)
{
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t;
         t = strtok_r(NULL, ",", &save)) {
        if (*nnames >= max)
            return -1;
        names[(*nnames)++] = t;
    }
    return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || v == 0)
        return -1;
    *out = v;
    return 0;
}

/* Parse the options shared by wqbench and wqbench-recover. 0 or -1. */
int wqb_parse_args(int argc, char **argv, struct wqb_cfg *c, const char **names,
                   int *nnames)
{
    static const struct option opts[] = {
        { "quick", no_argument, NULL, 'q' },     { "full", no_argument, NULL, 'f' },
        { "workload", required_argument, NULL, 'w' },
        { "json", no_argument, NULL, 'j' },      { "table", no_argument, NULL, 't' },
        { "n", required_argument, NULL, 'n' },   { "reps", required_argument, NULL, 'r' },
        { "no-header", no_argument, NULL, 'H' }, { "help", no_argument, NULL, 'h' },
        { "variant", required_argument, NULL, 'v' },
        { "engine", required_argument, NULL, 'e' },
        { "prefix", required_argument, NULL, 'p' },
        { "pin", required_argument, NULL, 'P' },
        { NULL, 0, NULL, 0 },
    };
    const char *engine = NULL;
    uint64_t v;
    int o;
    *c = (struct wqb_cfg){ .mode = WQB_DEFAULT };
    *nnames = 0;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'q': c->mode = WQB_QUICK; break;
        case 'f': c->mode = WQB_FULL; break;
        case 'j': c->table = false; break;
        case 't': c->table = true; break;
        case 'H': c->no_header = true; break;
        case 'e':
            if (strcmp(optarg, "redis") != 0 && strcmp(optarg, "shm") != 0) {
                fprintf(stderr, "wqbench: --engine: shm or redis, not '%s'\n", optarg);
                return -1;
            }
            engine = optarg;
            break;
        case 'p':
            if (strncmp(optarg, "redis://", 8) != 0 || !strchr(optarg + 8, '/')) {
                fprintf(stderr, "wqbench: --prefix: redis://[[USER]:PASS@]HOST[:PORT]/, "
                                "not '%s'\n", optarg);
                return -1;
            }
            c->prefix = optarg;
            break;
        case 'P':
            if (strcmp(optarg, "split") != 0 && strcmp(optarg, "same") != 0 &&
                strcmp(optarg, "none") != 0) {
                fprintf(stderr, "wqbench: --pin: split, same or none, not '%s'\n", optarg);
                return -1;
            }
            c->pin = optarg;
            break;
        case 'w':
            if (add_names(optarg, names, nnames, WQB_MAX_NAMES) < 0)
                return -1;
            break;
        case 'v':
            if (add_names(optarg, c->variants, &c->nvariants, 32) < 0)
                return -1;
            break;
        case 'n':
            if (parse_u64(optarg, &c->n) < 0 || c->n > (1ull << 31))
                return -1;
            break;
        case 'r':
            if (parse_u64(optarg, &v) < 0 || v > WQB_MAX_REPS)
                return -1;
            c->reps = (int)v;
            break;
        case 'h':
            wqb_usage(stdout);
            exit(0);
        default:
            return -1;
        }
    }
    if (engine && strcmp(engine, "shm") == 0 && c->prefix) {
        fprintf(stderr, "wqbench: --prefix names a redis server: not with --engine shm\n");
        return -1;
    }
    c->redis = c->prefix || (engine && strcmp(engine, "redis") == 0);
    if (c->pin && (!c->redis || c->prefix)) {
        fprintf(stderr, "wqbench: --pin: only with --engine redis (a server wqbench starts)\n");
        return -1;
    }
    return optind == argc ? 0 : -1;
}

/* ------------------------------------------------------------------ */
/* Results                                                             */
/* ------------------------------------------------------------------ */

void wqb_result_init(struct wqb_result *r, const char *workload, const char *variant,
                     const char *unit)
{
    memset(r, 0, sizeof *r);
    r->workload = workload;
    snprintf(r->variant, sizeof r->variant, "%s", variant);
    r->unit = unit;
}

void wqb_result_add(struct wqb_result *r, double v)
{
    if (r->reps < WQB_MAX_REPS)
        r->v[r->reps++] = v;
}

void wqb_result_extra(struct wqb_result *r, const char *name, double v, enum wqb_kind k)
{
    if (r->nx < WQB_MAX_EXTRA)
        r->x[r->nx++] = (struct wqb_extra){ name, v, k };
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double wqb_median(const double *v, int n)
{
    double s[WQB_MAX_REPS];
    if (n <= 0)
        return NAN;
    if (n > WQB_MAX_REPS)
        n = WQB_MAX_REPS;
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static void min_max(const double *v, int n, double *lo, double *hi)
{
    *lo = n > 0 ? v[0] : NAN;
    *hi = *lo;
    for (int i = 1; i < n; i++) {
        if (v[i] < *lo)
            *lo = v[i];
        if (v[i] > *hi)
            *hi = v[i];
    }
}

/* A JSON number: integers and rates >= 1000 without exponent or
   fraction, NaN as null. */
static void json_num(char *out, size_t cap, double v)
{
    if (!isfinite(v))
        snprintf(out, cap, "null");
    else if ((v == floor(v) || fabs(v) >= 1e3) && fabs(v) < 1e15)
        snprintf(out, cap, "%.0f", v);
    else
        snprintf(out, cap, "%.6g", v);
}

/* 3.21M, 850k, 12.3 for rates and counts. */
static void human_num(char *out, size_t cap, double v)
{
    if (!isfinite(v))
        snprintf(out, cap, "-");
    else if (fabs(v) >= 1e9)
        snprintf(out, cap, "%.3gG", v / 1e9);
    else if (fabs(v) >= 1e6)
        snprintf(out, cap, "%.3gM", v / 1e6);
    else if (fabs(v) >= 1e4)
        snprintf(out, cap, "%.3gk", v / 1e3);
    else
        snprintf(out, cap, "%.4g", v);
}

/* 850ns, 12.3us, 45.6ms, 1.23s. */
static void human_ns(char *out, size_t cap, double v)
{
    if (!isfinite(v))
        snprintf(out, cap, "-");
    else if (v >= 1e9)
        snprintf(out, cap, "%.3gs", v / 1e9);
    else if (v >= 1e6)
        snprintf(out, cap, "%.3gms", v / 1e6);
    else if (v >= 1e3)
        snprintf(out, cap, "%.3gus", v / 1e3);
    else
        snprintf(out, cap, "%.3gns", v);
}

static void human(char *out, size_t cap, double v, bool ns)
{
    if (ns)
        human_ns(out, cap, v);
    else
        human_num(out, cap, v);
}

static void emit_json(const struct wqb_result *r)
{
    double lo, hi, med = wqb_median(r->v, r->reps);
    char a[32], b[32], m[32], s[32];
    min_max(r->v, r->reps, &lo, &hi);
    json_num(m, sizeof m, med);
    json_num(a, sizeof a, lo);
    json_num(b, sizeof b, hi);
    json_num(s, sizeof s, med != 0 ? (hi - lo) / med : NAN);
    printf("{\"workload\":\"%s\",\"variant\":\"%s\",\"unit\":\"%s\",\"median\":%s,"
           "\"min\":%s,\"max\":%s,\"spread\":%s,\"reps\":%d",
           r->workload, r->variant, r->unit, m, a, b, s, r->reps);
    for (int i = 0; i < r->nx; i++) {
        json_num(m, sizeof m, r->x[i].v);
        printf(",\"%s\":%s", r->x[i].name, m);
    }
    printf("}\n");
}

static void extra_text(char *out, size_t cap, const struct wqb_extra *x)
{
    char v[32];
    switch (x->kind) {
    case WQB_X_NS:
        human_ns(v, sizeof v, x->v);
        break;
    case WQB_X_FRAC:
        snprintf(v, sizeof v, "%.3f", x->v);
        break;
    case WQB_X_INT:
        snprintf(v, sizeof v, "%.0f", x->v);
        break;
    default:
        snprintf(v, sizeof v, "%.4g", x->v);
        break;
    }
    snprintf(out, cap, " %s=%s", x->name, v);
}

void wqb_table_header(void)
{
    printf("%-11s %-14s %-9s %9s %9s %9s %7s %4s  %s\n", "workload", "variant", "unit",
           "median", "min", "max", "spread", "reps", "details");
}

static void emit_table(const struct wqb_result *r)
{
    double lo, hi, med = wqb_median(r->v, r->reps);
    bool ns = strcmp(r->unit, "ns") == 0;
    char a[32], b[32], m[32], d[512] = "", x[96];
    min_max(r->v, r->reps, &lo, &hi);
    human(m, sizeof m, med, ns);
    human(a, sizeof a, lo, ns);
    human(b, sizeof b, hi, ns);
    for (int i = 0; i < r->nx; i++) {
        extra_text(x, sizeof x, &r->x[i]);
        strncat(d, x, sizeof d - strlen(d) - 1);
    }
    printf("%-11s %-14s %-9s %9s %9s %9s %6.1f%% %4d %s\n", r->workload, r->variant,
           r->unit, m, a, b, med != 0 ? 100 * (hi - lo) / med : 0.0, r->reps, d);
}

void wqb_emit(const struct wqb_cfg *c, const struct wqb_result *r)
{
    if (c->table)
        emit_table(r);
    else
        emit_json(r);
    fflush(stdout);
}

void wqb_skip(const struct wqb_cfg *c, const char *workload, const char *variant,
              const char *reason)
{
    if (c->table) {
        printf("%-11s %-14s skipped: %s\n", workload, variant, reason);
    } else {
        printf("{\"workload\":\"%s\",\"variant\":\"%s\",\"skipped\":\"", workload, variant);
        for (const char *p = reason; *p; p++)   /* reasons are ASCII prose */
            printf(*p == '"' || *p == '\\' ? "\\%c" : "%c", *p);
        printf("\"}\n");
    }
    fflush(stdout);
}

/* ------------------------------------------------------------------ */
/* Time, keys, errors                                                  */
/* ------------------------------------------------------------------ */

uint64_t wqb_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * Wait until CLOCK_MONOTONIC time t without sleeping in the kernel, but
 * yielding the CPU. Pacing adds every 20 us rules out sleeping: an
 * absolute clock_nanosleep costs about 30 us here even when its deadline
 * has passed (arming the timer exits the VM). A plain busy wait would hold
 * the CPU the woken consumer is often placed on (wake-affine) for a whole
 * time slice, so the latency measured would be the scheduler's slice;
 * sched_yield() (under 1 us) hands the CPU over at once instead.
 */
void wqb_pace_until(uint64_t t)
{
    while (wqb_now() < t)
        sched_yield();
}

void wqb_sleep_ns(uint64_t ns)
{
    struct timespec ts = { (time_t)(ns / 1000000000u), (long)(ns % 1000000000u) };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* 'k' and 11 zero-padded digits: fixed length, cheap (no printf). */
void wqb_key(char out[WQB_KEY_LEN], uint64_t i)
{
    out[0] = 'k';
    for (int p = WQB_KEY_LEN - 1; p >= 1; p--) {
        out[p] = (char)('0' + i % 10);
        i /= 10;
    }
}

/* The key after k: decimal increment in place, O(1) amortised, so that
   loops do not time 11 divisions per key. */
void wqb_key_next(char k[WQB_KEY_LEN])
{
    for (int p = WQB_KEY_LEN - 1; p >= 1 && ++k[p] > '9'; p--)
        k[p] = '0';
}

uint64_t wqb_key_index(const char *key)
{
    uint64_t v = 0;
    for (int p = 1; p < WQB_KEY_LEN; p++)
        v = v * 10 + (uint64_t)(key[p] - '0');
    return v;
}

static void cleanup(void);

void wqb_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "wqbench[%d]: ", (int)getpid());
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (getpid() != main_pid)
        _exit(1);   /* a worker: the parent cleans up */
    cleanup();
    exit(1);
}

void wqb_check(int rc, const char *what)
{
    if (rc < 0)
        wqb_die("%s: %s", what, wq_strerror(rc));
}

/* Whether a variant failed while the run went on (wqb_skip_open): exit
   status 1 at the end. */
bool wqb_failed(void)
{
    return any_failed;
}

static void say(const char *s)   /* async-signal-safe */
{
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

static void on_alarm(int sig)
{
    (void)sig;
    in_signal = 1;
    say("wqbench: watchdog: ");
    say(watch_what);
    say(" took longer than allowed; stopping\n");
    cleanup();
    _exit(1);
}

/*
 * Arm (seconds > 0) or disarm the watchdog: if the run is still in `what`
 * after `seconds`, the parent stops its children and any server it
 * started, removes what it registered and exits 1, so that a wedged
 * server or engine cannot hang the benchmark. Children are not covered
 * (alarms do not cross fork) and need not be: they die with the parent.
 */
void wqb_watchdog(unsigned seconds, const char *what)
{
    static bool installed;
    if (!installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGALRM, &sa, NULL);
        installed = true;
    }
    snprintf(watch_what, sizeof watch_what, "%s", what ? what : "");
    alarm(seconds);
}

/* ------------------------------------------------------------------ */
/* Cleanup registry (async-signal-safe removal)                        */
/* ------------------------------------------------------------------ */

/* Remove the plain files of a directory, then the directory itself. */
/* Empty directory fd, and its subdirectories down to `depth` levels (a
   redis-server's appendonlydir), with async-signal-safe calls only. */
static void empty_dir(int fd, int depth)
{
    char buf[4096];
    long n;
    while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
        for (long off = 0; off < n;) {
            struct dirent64 *de = (struct dirent64 *)(void *)(buf + off);
            off += de->d_reclen;
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            if (unlinkat(fd, de->d_name, 0) == 0 || errno != EISDIR || depth == 0)
                continue;
            int sub = openat(fd, de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (sub >= 0) {
                empty_dir(sub, depth - 1);
                close(sub);
            }
            unlinkat(fd, de->d_name, AT_REMOVEDIR);
        }
    }
}

static void remove_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return;
    empty_dir(fd, 2);
    close(fd);
    rmdir(dir);
}

static void remove_path(const char *p)
{
    if (strncmp(p, "mq:", 3) == 0)
        mq_unlink(p + 3);
    else
        remove_dir(p);
}

/* A queue on a server (a redis:// name): removing it talks to the server,
   which a signal handler must not do; the server we started goes anyway. */
static bool remote(const char *name)
{
    return strstr(name, "://") != NULL;
}

static void cleanup(void)
{
    for (int i = 0; i < MAX_PIDS; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGTERM);
            waitpid(pids[i], NULL, 0);
            pids[i] = 0;
        }
    for (int i = 0; i < MAX_QUEUES; i++)
        if (qused[i]) {
            if (!in_signal || !remote(qnames[i]))
                wq_unlink(qnames[i]);
            qused[i] = 0;
        }
    wqb_stop_server();
    for (int i = 0; i < MAX_PATHS; i++)
        if (pused[i]) {
            remove_path(paths[i]);
            pused[i] = 0;
        }
}

static void on_signal(int sig)
{
    in_signal = 1;
    if (getpid() == main_pid)
        cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_exit_cleanup(void)
{
    if (getpid() == main_pid)
        cleanup();
}

void wqb_init(void)
{
    main_pid = getpid();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    atexit(on_exit_cleanup);
}

static void name_register(const char *name)
{
    for (int i = 0; i < MAX_QUEUES; i++)
        if (!qused[i]) {
            snprintf(qnames[i], sizeof qnames[i], "%s", name);
            qused[i] = 1;
            return;
        }
    wqb_die("too many queues at once");
}

static void name_unregister(const char *name)
{
    for (int i = 0; i < MAX_QUEUES; i++)
        if (qused[i] && strcmp(qnames[i], name) == 0)
            qused[i] = 0;
}

void wqb_register_path(const char *path)
{
    for (int i = 0; i < MAX_PATHS; i++)
        if (!pused[i]) {
            snprintf(paths[i], sizeof paths[i], "%s", path);
            pused[i] = 1;
            return;
        }
    wqb_die("too many paths at once");
}

int wqb_temp_dir(const char *tag, char dir[WQB_DIR_LEN])
{
    snprintf(dir, WQB_DIR_LEN, "/tmp/wqbench-%s.%d.XXXXXX", tag, (int)getpid());
    if (!mkdtemp(dir))
        return -errno;
    wqb_register_path(dir);
    return 0;
}

/* Remove a registered path now and forget it. */
void wqb_unregister_path(const char *path)
{
    for (int i = 0; i < MAX_PATHS; i++)
        if (pused[i] && strcmp(paths[i], path) == 0) {
            remove_path(paths[i]);
            pused[i] = 0;
        }
}

/* The redis-server wqbench started: stopped after the queues are removed
   and before the paths (its directory) are. One at a time. */
void wqb_register_server(pid_t pid)
{
    server_pid = pid;
}

/*
 * Stop the registered server: SIGTERM, 5 s for it to go (it saves
 * nothing: --save ''), then SIGKILL. Async-signal-safe (kill, waitpid,
 * nanosleep). Returns its wait status, or -1 if there was none.
 */
int wqb_stop_server(void)
{
    pid_t pid = server_pid;
    int st = -1;
    if (pid <= 0)
        return -1;
    kill(pid, SIGTERM);
    kill(pid, SIGCONT);   /* a stopped server handles it now */
    for (int i = 0; i < 500; i++) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid || (r < 0 && errno != EINTR)) {
            server_pid = 0;
            return st;
        }
        struct timespec ts = { 0, 10 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    server_pid = 0;
    return st;
}

/* ------------------------------------------------------------------ */
/* Queues                                                              */
/* ------------------------------------------------------------------ */

/* Every queue name starts with prefix from now on ("" for none): a
   redis:// address selects the Redis engine. */
void wqb_set_prefix(const char *prefix)
{
    if (strlen(prefix) >= sizeof qprefix)
        wqb_die("queue name prefix too long: %s", prefix);
    snprintf(qprefix, sizeof qprefix, "%s", prefix);
}

bool wqb_prefixed(void)
{
    return qprefix[0] != 0;
}

/*
 * The row of a variant whose queue could not be opened on a prefixed
 * (redis://) engine: "libwq redis: wq_open: why". A library without the
 * engine (-ENOTSUP, or -EINVAL: the name is not accepted) is a skip; any
 * other error also fails the run.
 */
void wqb_skip_open(const struct wqb_cfg *c, const char *workload, const char *variant,
                   int rc)
{
    char why[512];
    const char *more = wq_last_error();
    size_t scheme = strcspn(qprefix, ":");
    snprintf(why, sizeof why, "libwq %.*s: wq_open: %s%s%s%s", (int)scheme, qprefix,
             wq_strerror(rc), more && *more ? " (" : "", more && *more ? more : "",
             more && *more ? ")" : "");
    if (rc == -EINVAL && strlen(why) + 64 < sizeof why)   /* the name, most likely */
        strcat(why, " (a libwq without this engine rejects the name)");
    wqb_skip(c, workload, variant, why);
    if (rc != -ENOTSUP && rc != -EINVAL)
        any_failed = true;
}

/*
 * A fresh queue named wqbench.<pid>.<seq>.<tag>, created with o (WQ_CREATE
 * and WQ_EXCL added; max_key_len defaults to WQB_KEY_LEN). Returns
 * wq_open's result; the name is registered for cleanup before the object
 * can exist.
 */
int wqb_open_new(const char *tag, struct wq_options *o, wq **out, char name[WQB_NAME_LEN])
{
    snprintf(name, WQB_NAME_LEN, "%swqbench.%d.%u.%s", qprefix, (int)main_pid, name_seq++,
             tag);
    if (o->max_key_len == 0)
        o->max_key_len = WQB_KEY_LEN;
    o->flags |= WQ_CREATE | WQ_EXCL;
    name_register(name);
    int rc = wq_open(name, o, out);
    if (rc < 0)
        name_unregister(name);
    return rc;
}

void wqb_queue_create(const char *tag, uint32_t capacity, wq **out, char name[WQB_NAME_LEN])
{
    struct wq_options o = { .capacity = capacity };
    int rc = wqb_open_new(tag, &o, out, name);
    if (rc < 0)
        wqb_die("wq_open %s (capacity %u): %s", name, capacity, wq_strerror(rc));
}

void wqb_queue_destroy(wq *q, const char *name)
{
    wq_close(q);
    wq_unlink(name);
    name_unregister(name);
}

wq *wqb_attach(const char *name)
{
    wq *q;
    int rc = wq_open(name, NULL, &q);
    if (rc < 0)
        wqb_die("attach %s: %s", name, wq_strerror(rc));
    return q;
}

/* Add keys first .. first+n-1 in batches of 64 (setup, untimed). */
void wqb_fill(wq *q, uint64_t first, uint64_t n)
{
    char keys[64][WQB_KEY_LEN], key[WQB_KEY_LEN];
    struct iovec iov[64];
    wqb_key(key, first);
    for (uint64_t i = 0; i < n;) {
        size_t b = 0;
        for (; b < 64 && i < n; b++, i++, wqb_key_next(key)) {
            memcpy(keys[b], key, WQB_KEY_LEN);
            iov[b] = (struct iovec){ keys[b], WQB_KEY_LEN };
        }
        wqb_check(wq_add_many(q, iov, b), "wq_add_many (fill)");
    }
}

/* ------------------------------------------------------------------ */
/* Processes and the start barrier                                     */
/* ------------------------------------------------------------------ */

void *wqb_shared_alloc(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        wqb_die("mmap %zu bytes: %s", size, strerror(errno));
    return p;
}

void wqb_shared_free(void *p, size_t size)
{
    munmap(p, size);
}

static void pid_register(pid_t pid)
{
    for (int i = 0; i < MAX_PIDS; i++)
        if (pids[i] == 0) {
            pids[i] = pid;
            return;
        }
    kill(pid, SIGKILL);
    wqb_die("too many children at once");
}

/* fork(); the child resets signals, dies with us, owns no registrations. */
pid_t wqb_fork(void)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        wqb_die("fork: %s", strerror(errno));
    if (pid > 0) {
        pid_register(pid);
        return pid;
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != main_pid)
        _exit(1);
    for (int i = 0; i < MAX_PIDS; i++)
        pids[i] = 0;
    return 0;
}

/* Reap a child and return its raw status, whatever it is. */
void wqb_wait_status(pid_t pid, int *status)
{
    while (waitpid(pid, status, 0) < 0)
        if (errno != EINTR)
            wqb_die("waitpid: %s", strerror(errno));
    for (int i = 0; i < MAX_PIDS; i++)
        if (pids[i] == pid)
            pids[i] = 0;
}

/* Reap a worker that must have exited with status 0. */
void wqb_wait_child(pid_t pid)
{
    int st;
    wqb_wait_status(pid, &st);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        wqb_die("worker %d failed (status 0x%x)", (int)pid, st);
}

static long futex(_Atomic uint32_t *w, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)w, op, val, ts, NULL, 0);
}

/* Worker: check in, then sleep until released. */
void wqb_gate_arrive(struct wqb_gate *g)
{
    atomic_fetch_add_explicit(&g->ready, 1, memory_order_acq_rel);
    struct timespec ts = { 0, 100 * 1000 * 1000 };
    while (atomic_load_explicit(&g->go, memory_order_acquire) == 0)
        futex(&g->go, FUTEX_WAIT, 0, &ts);
}

/* Parent: wait for n workers (10 s at most), stamp t0, release them. */
uint64_t wqb_gate_release(struct wqb_gate *g, uint32_t n)
{
    uint64_t limit = wqb_now() + 10ull * 1000000000u;
    while (atomic_load_explicit(&g->ready, memory_order_acquire) < n) {
        if (wqb_now() > limit)
            wqb_die("workers did not reach the start barrier");
        wqb_sleep_ns(100 * 1000);
    }
    g->t0 = wqb_now();
    atomic_store_explicit(&g->go, 1, memory_order_release);
    futex(&g->go, FUTEX_WAKE, INT_MAX, NULL);
    return g->t0;
}
