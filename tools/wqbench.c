/*
 * wqbench - throughput and latency of libwq, with baselines.
 *
 *     wqbench [--quick | --full] [--workload NAME[,NAME]]... [--json | --table]
 *             [--variant NAME[,NAME]] [--n N] [--reps R]
 *             [--engine redis [--pin split|same|none]
 *              | --prefix redis://[[USER]:PASS@]HOST[:PORT]/]
 *
 * METHODOLOGY
 *   Every workload runs on its own fresh queue, named
 *   wqbench.<pid>.<seq>.<workload> so that concurrent runs never meet, and
 *   removed afterwards (also on failure and on SIGINT/SIGTERM): nothing is
 *   left in /dev/shm, nor store directories in /tmp. Keys are 12 bytes ('k' + 11 digits, formatted
 *   without printf) and queues are created with max_key_len = 12.
 *
 *   Time is CLOCK_MONOTONIC around the measured loop only. Setup (creating
 *   and filling queues, forking and attaching workers) is not timed:
 *   multi-process workloads fork workers that wq_open the queue by name
 *   and then wait at a barrier in a shared anonymous mapping; the parent
 *   stamps t0 and releases them all at once.
 *
 *   Each variant is repeated (5 times, 3 with --quick; mpmc always 3) after
 *   a short warm-up, and reported as the median with min, max and spread
 *   = (max - min) / median. Extra fields of repeated measurements (p50,
 *   p99, ...) are medians over the repetitions as well. The load average
 *   is printed with the results (and a warning when it exceeds half the
 *   CPUs): on a small VM shared with other jobs, the scheduler, not the
 *   queue, decides multi-process figures and tail latencies.
 *
 *   Workloads (see the file that implements each for details):
 *     floor-mutex  cost floor of the locking alone     wqbench-floor.c
 *     cycle        add/get/done, one process           wqbench-queue.c
 *     floor-mq     kernel IPC floor (POSIX mq)         wqbench-floor.c
 *     drain        C consumers empty a full queue      wqbench-mp.c
 *     mpmc         P producers, C consumers, hot keys  wqbench-mp.c
 *     scale        rotation cost vs live keys          wqbench-queue.c
 *     starve       a re-added slow key's wait          wqbench-mp.c
 *     recover      repair time after a crash           wqbench-recover.c
 *                  and restore from the LMDB store     wqbench-queue.c
 *     durable      the cycle with an LMDB store        wqbench-queue.c
 *                  and its SQLite peer                 wqbench-peers.c
 *
 *   recover needs crash points, which only the test-only fault-injection
 *   build of the library has. wqbench itself links the release library
 *   (both are developer tools, run from the build tree, never installed),
 *   so it runs recover by executing the helper wqbench-recover (same
 *   output format) found next to it, or at $WQBENCH_RECOVER; without it,
 *   the repair variants print a skip line. Restore from the store needs
 *   no crash points and runs here.
 *
 * REDIS
 *   --engine redis runs cycle, add_many, drain, mpmc and durable on redis://
 *   queues instead (and nothing else), against a redis-server wqbench
 *   starts and stops, with a hand-written three-script Lua queue as the
 *   baseline; --prefix redis://HOST:PORT/ uses a server of the caller's.
 *   --pin says where the server and the clients run (split: one CPU for
 *   the server, the others for wqbench and its workers). Every workload
 *   has a watchdog (300 s, --full 1800 s, $WQBENCH_WATCHDOG seconds).
 *   wqbench-redis.c says how; it is built only with hiredis, and without
 *   it --engine redis says so and exits 2. The default run never starts a
 *   server.
 *
 * Output: one JSON line per variant (default), or a table with --table.
 * A skipped variant prints {"workload":...,"variant":...,"skipped":"why"}.
 * Exit status 0, or 1 if a workload failed, 2 on bad usage.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "wqbench.h"

typedef void (*workload_fn)(const struct wqb_cfg *c);

static void run_recover(const struct wqb_cfg *c);

static const struct {
    const char *name;
    workload_fn fn;
} workloads[] = {
    { "floor-mutex", wqb_run_floor_mutex },
    { "cycle", wqb_run_cycle },
    { "floor-mq", wqb_run_floor_mq },
    { "drain", wqb_run_drain },
    { "mpmc", wqb_run_mpmc },
    { "scale", wqb_run_scale },
    { "starve", wqb_run_starve },
    { "tenants", wqb_run_tenants },
    { "recover", run_recover },
    { "durable", wqb_run_durable },
};
#define NWORKLOADS (sizeof workloads / sizeof workloads[0])

#ifdef WQ_HAVE_REDIS
static const struct {
    const char *name;
    workload_fn fn;
} redis_workloads[] = {
    { "cycle", wqb_redis_cycle },
    { "add_many", wqb_redis_add_many },
    { "drain", wqb_redis_drain },
    { "mpmc", wqb_redis_mpmc },
    { "durable", wqb_redis_durable },
};
#define NREDIS (sizeof redis_workloads / sizeof redis_workloads[0])
#endif

static bool failed;

/* ------------------------------------------------------------------ */
/* recover: run the fault-injection helper                             */
/* ------------------------------------------------------------------ */

/* The helper's path: $WQBENCH_RECOVER, or beside / above our binary
   (libtool keeps the real binary in tools/.libs/). */
static int find_helper(char *out, size_t cap)
{
    const char *env = getenv("WQBENCH_RECOVER");
    char self[PATH_MAX];
    if (env && *env) {
        snprintf(out, cap, "%s", env);
        return access(out, X_OK);
    }
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return -1;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (!slash)
        return -1;
    *slash = 0;
    static const char *const rel[] = { "/wqbench-recover", "/../wqbench-recover" };
    for (size_t i = 0; i < 2; i++) {
        snprintf(out, cap, "%s%s", self, rel[i]);
        if (access(out, X_OK) == 0)
            return 0;
    }
    return -1;
}

static void exec_helper(const char *path, const struct wqb_cfg *c)
{
    char n[32], reps[32], variants[1024] = "--variant=";
    const char *argv[16];
    int a = 0;
    argv[a++] = path;
    argv[a++] = c->table ? "--table" : "--json";
    argv[a++] = "--no-header";
    if (c->mode != WQB_DEFAULT)
        argv[a++] = c->mode == WQB_QUICK ? "--quick" : "--full";
    if (c->n) {
        snprintf(n, sizeof n, "--n=%llu", (unsigned long long)c->n);
        argv[a++] = n;
    }
    if (c->reps) {
        snprintf(reps, sizeof reps, "--reps=%d", c->reps);
        argv[a++] = reps;
    }
    for (int i = 0; i < c->nvariants; i++) {
        strncat(variants, c->variants[i], sizeof variants - strlen(variants) - 2);
        strcat(variants, ",");
    }
    if (c->nvariants)
        argv[a++] = variants;
    argv[a] = NULL;
    execv(path, (char *const *)argv);
    fprintf(stderr, "wqbench: exec %s: %s\n", path, strerror(errno));
    _exit(127);
}

/* The repair variants, measured by the helper in a child process. */
static void run_repair_helper(const struct wqb_cfg *c)
{
    char path[PATH_MAX + 32], why[PATH_MAX + 64];
    if (find_helper(path, sizeof path) != 0) {
        wqb_skip(c, "recover", "repair",
                 "fault-injection build not available: wqbench-recover is built in "
                 "the build tree only (or set WQBENCH_RECOVER)");
        return;
    }
    pid_t pid = wqb_fork();
    if (pid == 0)
        exec_helper(path, c);
    int st;
    wqb_wait_status(pid, &st);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        snprintf(why, sizeof why, "%s failed (wait status 0x%x)", path, st);
        wqb_skip(c, "recover", "error", why);
        failed = true;
    }
}

/* Repair through the helper, then restore here: it needs no crash
   points. */
static void run_recover(const struct wqb_cfg *c)
{
    if (wqb_want(c, "repair") || wqb_want(c, "repair-r1"))
        run_repair_helper(c);
    wqb_run_restore(c);
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

static void cpu_model(char *out, size_t cap)
{
    char line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");
    snprintf(out, cap, "unknown");
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            snprintf(out, cap, "%s", colon + 2);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    }
    if (f)
        fclose(f);
}

static double load_average(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

/* Numbers taken on a busy machine are mostly the scheduler's: say so. */
static void warn_if_busy(void)
{
    double l = load_average();
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus > 0 && l > 0.5 * (double)cpus)
        fprintf(stderr, "wqbench: warning: load average %.2f on %ld CPUs at start; "
                        "results will be noisy\n", l, cpus);
}

/* Table mode: where and when, then the column header. */
static void table_preamble(const struct wqb_cfg *c)
{
    char cpu[128], date[64];
    struct utsname u;
    time_t now = time(NULL);
    cpu_model(cpu, sizeof cpu);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
    uname(&u);
    printf("# wqbench (libwq %s), %s, %s %s, nproc %ld, %s, load %.2f, mode %s%s\n",
           PACKAGE_VERSION, date, u.sysname, u.release, sysconf(_SC_NPROCESSORS_ONLN), cpu,
           load_average(),
           c->mode == WQB_QUICK ? "quick" : c->mode == WQB_FULL ? "full" : "default",
           c->redis ? ", engine redis" : "");
#ifdef WQ_HAVE_REDIS
    if (c->redis)
        wqb_redis_describe(c);
#endif
    wqb_table_header();
}

/* Mark the selected workloads; "all" and "floor" are shorthands. */
static int select_workloads(const char **names, int n, bool *on)
{
    for (size_t w = 0; w < NWORKLOADS; w++)
        on[w] = n == 0;
    for (int i = 0; i < n; i++) {
        bool found = false;
        for (size_t w = 0; w < NWORKLOADS; w++)
            if (strcmp(names[i], workloads[w].name) == 0 || strcmp(names[i], "all") == 0 ||
                (strcmp(names[i], "floor") == 0 && strncmp(workloads[w].name, "floor", 5) == 0))
                on[w] = found = true;
        if (!found) {
            fprintf(stderr, "wqbench: unknown workload '%s'\n", names[i]);
            return -1;
        }
    }
    return 0;
}

#ifdef WQ_HAVE_REDIS
/* --engine redis: the redis workloads only, "all" for all of them. */
static int run_redis(const struct wqb_cfg *c, const char **names, int n)
{
    bool on[NREDIS];
    for (size_t w = 0; w < NREDIS; w++)
        on[w] = n == 0;
    for (int i = 0; i < n; i++) {
        bool found = false;
        for (size_t w = 0; w < NREDIS; w++)
            if (strcmp(names[i], redis_workloads[w].name) == 0 || strcmp(names[i], "all") == 0)
                on[w] = found = true;
        if (!found) {
            fprintf(stderr, "wqbench: workload '%s' does not run with --engine redis "
                            "(cycle add_many drain mpmc durable)\n", names[i]);
            return 2;
        }
    }
    /* a workload's reps take seconds: minutes mean a wedge */
    const char *env = getenv("WQBENCH_WATCHDOG");
    unsigned limit = c->mode == WQB_FULL ? 1800 : 300;
    if (env && atoi(env) > 0)
        limit = (unsigned)atoi(env);
    if (wqb_redis_start(c) < 0)
        return 1;
    if (c->table && !c->no_header)
        table_preamble(c);
    else if (!c->table)
        wqb_redis_describe(c);
    for (size_t w = 0; w < NREDIS; w++)
        if (on[w]) {
            wqb_watchdog(limit, redis_workloads[w].name);
            redis_workloads[w].fn(c);
            wqb_watchdog(0, NULL);
        }
    wqb_redis_stop();
    return wqb_failed() ? 1 : 0;
}
#endif

int main(int argc, char **argv)
{
    struct wqb_cfg c;
    const char *names[WQB_MAX_NAMES];
    bool on[NWORKLOADS];
    int nnames;
    if (wqb_parse_args(argc, argv, &c, names, &nnames) < 0 ||
        (!c.redis && select_workloads(names, nnames, on) < 0)) {
        wqb_usage(stderr);
        return 2;
    }
    if (c.redis) {
#ifdef WQ_HAVE_REDIS
        wqb_init();
        warn_if_busy();
        return run_redis(&c, names, nnames);
#else
        fprintf(stderr, "wqbench: --engine redis: this wqbench was built without hiredis "
                        "(configure found no hiredis >= 0.14, or --without-redis); "
                        "install libhiredis-dev and re-run configure\n");
        return 2;
#endif
    }
    wqb_init();
    warn_if_busy();
    if (c.table && !c.no_header)
        table_preamble(&c);
    for (size_t w = 0; w < NWORKLOADS; w++)
        if (on[w])
            workloads[w].fn(&c);
    return failed || wqb_failed() ? 1 : 0;
}
