/*
 * wqctl - inspect and drive libwq queues from the shell.
 *
 * Design note. One small function per command, dispatched from the
 * `commands` table; a table-driven argument parser (`parse_args`) checks
 * options and positional counts before a command runs, so every command
 * body starts from validated input. The tool uses nothing but <wq.h>
 * (and the C library: CLOCK_MONOTONIC, the clock of wq_key_info.ready_ns,
 * to show how soon a waiting key is ready; stat(2) and access(2), for
 * `restore` to check that a store is there; and, for `work`, the POSIX
 * and Linux process calls it needs to run commands: see the note there).
 *
 * Two rules shape the code:
 *   - Callbacks that run under the region lock (wq_dump, wq_check_report)
 *     only copy into memory. Printing happens after the lock is released,
 *     so a slow terminal or a full pipe never stalls the queue's other
 *     processes.
 *   - Keys and queue names are bytes, not text. Text output escapes
 *     backslash as \\ and every byte outside printable ASCII as \xNN;
 *     JSON output escapes '"', '\\', control bytes and every byte >= 0x80
 *     as \u00XX, so it is always valid JSON (a byte b maps to U+00bb).
 *
 * Exit status: 0 success, 1 operational failure (or empty / not clean),
 * 2 usage error, 130 `work` stopped by a second signal.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <wq.h>

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

/* Keys read from stdin are handed to wq_add_many in batches of this size. */
#define ADD_BATCH 1024

/* ------------------------------------------------------------------ */
/* Options and commands                                                */
/* ------------------------------------------------------------------ */

enum opt_id {
    O_CAPACITY,
    O_MAX_KEY_LEN,
    O_MAX_PROCS,
    O_MODE,
    O_EXIST_OK,
    O_JSON,
    O_TIMEOUT,
    O_REPAIR,
    O_DRAIN,
    O_AFTER,
    O_RATE_LIMITED,
    O_NO_METRICS,
    O_RL_BASE,
    O_RL_MAX,
    O_RL_QPS,
    O_RL_BURST,
    O_RL_LIMITERS,
    O_RL_FAST,
    O_RL_SLOW,
    O_RL_MAX_FAST,
    O_RESULT_CAPACITY,
    O_JOBS,
    O_REQUEUE_STATUS,
    O_REQUEUE_AFTER,
    O_EXIT_WHEN_EMPTY,
    O_STORE,
    O_DURABILITY,
    O_SNAPSHOT_INTERVAL,
    O_FAIR,
    O_FAIR_SHARE,
    O_TENANT_SEP,
    O_PRIORITY,
    O_HELP,
    O_COUNT
};

_Static_assert(O_COUNT <= 64, "command option masks are 64 bits");

#define OPT(id) (UINT64_C(1) << (id))

struct opt_def {
    const char *name; /* long name, without "--" */
    bool has_arg;     /* takes a value: "--name VALUE" or "--name=VALUE" */
    char short_name;  /* '-x' alias ("-x VALUE" or "-xVALUE"), or 0 */
};

static const struct opt_def opt_defs[O_COUNT] = {
    [O_CAPACITY]    = { "capacity", true, 0 },
    [O_MAX_KEY_LEN] = { "max-key-len", true, 0 },
    [O_MAX_PROCS]   = { "max-procs", true, 0 },
    [O_MODE]        = { "mode", true, 0 },
    [O_EXIST_OK]    = { "exist-ok", false, 0 },
    [O_JSON]        = { "json", false, 0 },
    [O_TIMEOUT]     = { "timeout", true, 0 },
    [O_REPAIR]      = { "repair", false, 0 },
    [O_DRAIN]       = { "drain", false, 0 },
    [O_AFTER]       = { "after", true, 0 },
    [O_RATE_LIMITED] = { "rate-limited", false, 0 },
    [O_NO_METRICS]  = { "no-metrics", false, 0 },
    [O_RL_BASE]     = { "rl-base", true, 0 },
    [O_RL_MAX]      = { "rl-max", true, 0 },
    [O_RL_QPS]      = { "rl-qps", true, 0 },
    [O_RL_BURST]    = { "rl-burst", true, 0 },
    [O_RL_LIMITERS] = { "rl-limiters", true, 0 },
    [O_RL_FAST]     = { "rl-fast", true, 0 },
    [O_RL_SLOW]     = { "rl-slow", true, 0 },
    [O_RL_MAX_FAST] = { "rl-max-fast", true, 0 },
    [O_RESULT_CAPACITY] = { "result-capacity", true, 0 },
    [O_JOBS]        = { "jobs", true, 'j' },
    [O_REQUEUE_STATUS] = { "requeue-status", true, 0 },
    [O_REQUEUE_AFTER] = { "requeue-after", true, 0 },
    [O_EXIT_WHEN_EMPTY] = { "exit-when-empty", false, 0 },
    [O_STORE]       = { "store", true, 0 },
    [O_DURABILITY]  = { "durability", true, 0 },
    [O_SNAPSHOT_INTERVAL] = { "snapshot-interval", true, 0 },
    [O_FAIR]        = { "fair", false, 0 },
    [O_FAIR_SHARE]  = { "fair-share", true, 0 },
    [O_TENANT_SEP]  = { "tenant-sep", true, 0 },
    [O_PRIORITY]    = { "priority", true, 0 },
    [O_HELP]        = { "help", false, 'h' },
};

/* The rate limiter options of `create`. */
#define RL_OPTS (OPT(O_RL_BASE) | OPT(O_RL_MAX) | OPT(O_RL_QPS) |           \
                 OPT(O_RL_BURST) | OPT(O_RL_LIMITERS) | OPT(O_RL_FAST) |    \
                 OPT(O_RL_SLOW) | OPT(O_RL_MAX_FAST))

/* The store and fair mode options of `create` and `restore`. */
#define STORE_OPTS (OPT(O_STORE) | OPT(O_DURABILITY) | OPT(O_SNAPSHOT_INTERVAL))
#define FAIR_OPTS  (OPT(O_FAIR) | OPT(O_FAIR_SHARE) | OPT(O_TENANT_SEP))

/* What `create` and `restore` share: the queue's creation options. */
#define CREATE_OPTS (OPT(O_CAPACITY) | OPT(O_MAX_KEY_LEN) | OPT(O_MAX_PROCS) | \
                     OPT(O_MODE) | OPT(O_NO_METRICS) |                       \
                     OPT(O_RESULT_CAPACITY) | RL_OPTS | STORE_OPTS | FAIR_OPTS)

/* The options of `create` and `restore` after NAME in their synopses. */
#define CREATE_SYNOPSIS                                                     \
    "                    [--result-capacity N] [--mode OCTAL] [--no-metrics]\n" \
    "                    [--rl-limiters LIST] [--rl-base DUR] [--rl-max DUR]\n" \
    "                    [--rl-qps X] [--rl-burst N]\n"                     \
    "                    [--rl-fast DUR] [--rl-slow DUR] [--rl-max-fast N]\n" \
    "                    [--durability process|fsync|none]\n"               \
    "                    [--snapshot-interval DUR]\n"                       \
    "                    [--fair [--fair-share N] [--tenant-sep C|none]]"

struct command;

/* A parsed command line. */
struct args {
    const struct command *cmd;
    char **pos;               /* positional arguments, in order */
    size_t npos;
    const char *val[O_COUNT]; /* option value ("" for flags); NULL if absent */
};

struct command {
    const char *name;
    int (*run)(const struct args *a);
    uint64_t opts;          /* OPT() bits this command accepts */
    size_t min_pos, max_pos;
    size_t cmd_pos;         /* > 0: the positional with this index starts a
                               command line; it and every word after it are
                               positionals, options included (as with env,
                               xargs, timeout) */
    const char *synopsis;   /* what follows "wqctl <name> " */
    const char *summary;
};

static int cmd_create(const struct args *a);
static int cmd_restore(const struct args *a);
static int cmd_snapshot(const struct args *a);
static int cmd_ls(const struct args *a);
static int cmd_stat(const struct args *a);
static int cmd_add(const struct args *a);
static int cmd_forget(const struct args *a);
static int cmd_requeues(const struct args *a);
static int cmd_result(const struct args *a);
static int cmd_get(const struct args *a);
static int cmd_work(const struct args *a);
static int cmd_dump(const struct args *a);
static int cmd_metrics(const struct args *a);
static int cmd_check(const struct args *a);
static int cmd_shutdown(const struct args *a);
static int cmd_rm(const struct args *a);
static int cmd_help(const struct args *a);

static const struct command commands[] = {
    { "create", cmd_create, CREATE_OPTS | OPT(O_EXIST_OK), 1, 1, 0,
      "NAME [--capacity N] [--max-key-len N] [--max-procs N]\n"
      "                    [--exist-ok] [--store DIR]\n"
      CREATE_SYNOPSIS,
      "create a queue" },
    { "restore", cmd_restore, CREATE_OPTS, 1, 1, 0,
      "NAME --store DIR [--capacity N] [--max-key-len N]\n"
      "                    [--max-procs N]\n"
      CREATE_SYNOPSIS,
      "build a missing queue from its store" },
    { "snapshot", cmd_snapshot, 0, 1, 1, 0,
      "NAME",
      "write what the queue's store lacks, now" },
    { "ls", cmd_ls, OPT(O_JSON), 0, 0, 0,
      "[--json]",
      "list the queues on this machine" },
    { "stat", cmd_stat, OPT(O_JSON), 1, 1, 0,
      "NAME [--json]",
      "show a queue's counters" },
    { "add", cmd_add, OPT(O_AFTER) | OPT(O_RATE_LIMITED) | OPT(O_PRIORITY),
      2, SIZE_MAX, 0,
      "NAME [--after DUR | --rate-limited] [--priority N]\n"
      "                 {[--] KEY... | -}",
      "add keys (\"-\": one key per line from stdin)" },
    { "forget", cmd_forget, 0, 2, SIZE_MAX, 0,
      "NAME [--] KEY...",
      "reset the keys' rate limiter failure counts" },
    { "requeues", cmd_requeues, 0, 2, 2, 0,
      "NAME [--] KEY",
      "print a key's rate limiter failure count" },
    { "result", cmd_result, OPT(O_JSON), 2, 2, 0,
      "NAME [--json] [--] KEY",
      "print how a key's last run ended (wq_result)" },
    { "get", cmd_get, OPT(O_TIMEOUT), 1, 1, 0,
      "NAME [--timeout DUR]",
      "take one key, print it and mark it done" },
    { "work", cmd_work,
      OPT(O_JOBS) | OPT(O_TIMEOUT) | OPT(O_REQUEUE_STATUS) |
      OPT(O_REQUEUE_AFTER) | OPT(O_EXIT_WHEN_EMPTY), 2, SIZE_MAX, 1,
      "NAME [-j N] [--timeout DUR] [--requeue-status S]\n"
      "                  [--requeue-after DUR] [--exit-when-empty]\n"
      "                  [--] CMD [ARG...]",
      "run CMD once per key, N at a time ({} in ARG: the key)" },
    { "dump", cmd_dump, OPT(O_JSON), 1, 1, 0,
      "NAME [--json]",
      "list every key with its state" },
    { "metrics", cmd_metrics, 0, 1, SIZE_MAX, 0,
      "NAME...",
      "print metrics in the Prometheus text format" },
    { "check", cmd_check, OPT(O_REPAIR) | OPT(O_JSON), 1, 1, 0,
      "NAME [--repair] [--json]",
      "verify (and repair) a queue's invariants" },
    { "shutdown", cmd_shutdown, OPT(O_DRAIN) | OPT(O_TIMEOUT), 1, 1, 0,
      "NAME [--drain [--timeout DUR]]",
      "shut a queue down, optionally waiting for it to drain" },
    { "rm", cmd_rm, 0, 1, 1, 0,
      "NAME",
      "remove a queue" },
    { "help", cmd_help, 0, 0, 1, 0,
      "[COMMAND]",
      "show help" },
};

#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Messages                                                            */
/* ------------------------------------------------------------------ */

static void put_text(FILE *f, const void *p, size_t len);

static void print_usage(FILE *f)
{
    fprintf(f, "Usage: wqctl COMMAND [ARGS...]\n"
               "       wqctl --help | --version\n\nCommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nDUR is a duration: 0, 100ms, 2s, 1m, ... (units ns, us, ms, s,"
               " m, h;\nno unit means seconds), or \"forever\" for a timeout.\n"
               "Run 'wqctl help COMMAND' for a command's arguments.\n");
}

static void print_command_usage(FILE *f, const struct command *c)
{
    fprintf(f, "Usage: wqctl %s %s\n  %s\n", c->name, c->synopsis, c->summary);
}

/* A usage error in command c (or at top level when c is NULL): exit 2. */
static int usage_error(const struct command *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int usage_error(const struct command *c, const char *fmt, ...)
{
    va_list ap;

    fputs("wqctl: ", stderr);
    if (c)
        fprintf(stderr, "%s: ", c->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (c)
        fprintf(stderr, "\nUsage: wqctl %s %s\n", c->name, c->synopsis);
    else
        fputs("\nTry 'wqctl --help'.\n", stderr);
    return EXIT_USAGE;
}

/* "wqctl: queue 'NAME': [WHAT: ]<wq_strerror text>"; returns EXIT_FAIL. */
static int queue_error(const char *name, const char *what, int err)
{
    fputs("wqctl: queue '", stderr);
    put_text(stderr, name, strlen(name));
    fputs("': ", stderr);
    if (what)
        fprintf(stderr, "%s: ", what);
    fprintf(stderr, "%s\n", wq_strerror(err));
    return EXIT_FAIL;
}

static int out_of_memory(void)
{
    fputs("wqctl: out of memory\n", stderr);
    return EXIT_FAIL;
}

/* ------------------------------------------------------------------ */
/* Escaping                                                            */
/* ------------------------------------------------------------------ */

/* Text: printable ASCII as is, backslash as \\, anything else as \xNN. */
static void put_text(FILE *f, const void *p, size_t len)
{
    const unsigned char *s = p;

    for (size_t i = 0; i < len; i++) {
        if (s[i] == '\\')
            fputs("\\\\", f);
        else if (s[i] >= 0x20 && s[i] < 0x7f)
            fputc(s[i], f);
        else
            fprintf(f, "\\x%02x", s[i]);
    }
}

/* The width put_text would print. */
static size_t text_width(const void *p, size_t len)
{
    const unsigned char *s = p;
    size_t w = 0;

    for (size_t i = 0; i < len; i++)
        w += s[i] == '\\' ? 2 : (s[i] >= 0x20 && s[i] < 0x7f) ? 1 : 4;
    return w;
}

/* A JSON string literal; bytes outside printable ASCII become \u00XX. */
static void put_json(FILE *f, const void *p, size_t len)
{
    const unsigned char *s = p;

    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '"' || s[i] == '\\')
            fprintf(f, "\\%c", s[i]);
        else if (s[i] >= 0x20 && s[i] < 0x7f)
            fputc(s[i], f);
        else
            fprintf(f, "\\u%04x", s[i]);
    }
    fputc('"', f);
}

static void put_json_str(FILE *f, const char *s)
{
    put_json(f, s, strlen(s));
}

/* ------------------------------------------------------------------ */
/* Number and duration parsing                                         */
/* ------------------------------------------------------------------ */

/*
 * Strict unsigned parse: digits only (no sign, no blanks), the whole
 * string, no overflow, at most max. Returns false on any violation.
 */
static bool parse_u64(const char *s, int base, uint64_t max, uint64_t *out)
{
    char *end;
    unsigned long long v;

    if (s[0] < '0' || s[0] > '9')
        return false;
    errno = 0;
    v = strtoull(s, &end, base);
    if (errno != 0 || *end != '\0' || v > max)
        return false;
    *out = v;
    return true;
}

/*
 * A duration in nanoseconds: "forever" (-1), or an integer with an
 * optional unit ns, us, ms, s, m, h (no unit: seconds).
 */
static bool parse_duration(const char *s, int64_t *out)
{
    static const struct { const char *unit; uint64_t ns; } units[] = {
        { "ns", 1 }, { "us", 1000 }, { "ms", 1000000 },
        { "s", 1000000000 }, { "", 1000000000 },
        { "m", 60ull * 1000000000 }, { "h", 3600ull * 1000000000 },
    };
    char digits[32];
    size_t n = strspn(s, "0123456789");
    uint64_t v;

    if (strcmp(s, "forever") == 0) {
        *out = -1;
        return true;
    }
    if (n == 0 || n >= sizeof digits)
        return false;
    memcpy(digits, s, n);
    digits[n] = '\0';
    if (!parse_u64(digits, 10, INT64_MAX, &v))
        return false;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(s + n, units[i].unit) != 0)
            continue;
        if (v > (uint64_t)INT64_MAX / units[i].ns)
            return false;
        *out = (int64_t)(v * units[i].ns);
        return true;
    }
    return false;
}

/* Option o as a uint32 in [0, max]; an absent option leaves *out as is. */
static bool opt_u32(const struct args *a, enum opt_id o, int base,
                    uint64_t max, uint32_t *out)
{
    uint64_t v;

    if (!a->val[o])
        return true;
    if (!parse_u64(a->val[o], base, max, &v)) {
        if (base == 8)
            usage_error(a->cmd, "bad value '%s' for --%s (octal, at most "
                        "0%" PRIo64 ")", a->val[o], opt_defs[o].name, max);
        else
            usage_error(a->cmd, "bad value '%s' for --%s (a number, at most "
                        "%" PRIu64 ")", a->val[o], opt_defs[o].name, max);
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

/*
 * Option o as a duration in nanoseconds; def when absent. "forever" (-1)
 * is accepted only for timeouts (allow_forever).
 */
static bool opt_duration(const struct args *a, enum opt_id o,
                         bool allow_forever, int64_t def, int64_t *out)
{
    const char *s = a->val[o];

    *out = def;
    if (s && (!parse_duration(s, out) || (*out < 0 && !allow_forever))) {
        usage_error(a->cmd, "bad duration '%s' for --%s (e.g. 0, 100ms, 2s, "
                    "1m%s)", s, opt_defs[o].name,
                    allow_forever ? ", forever" : "");
        return false;
    }
    return true;
}

/* Option --timeout as nanoseconds; def when absent. */
static bool opt_timeout(const struct args *a, int64_t def, int64_t *out)
{
    return opt_duration(a, O_TIMEOUT, true, def, out);
}

/* A delay option (not "forever") into *out; an absent one leaves it. */
static bool opt_delay(const struct args *a, enum opt_id o, uint64_t *out)
{
    int64_t v;

    if (!opt_duration(a, o, false, 0, &v))
        return false;
    if (a->val[o])
        *out = (uint64_t)v;
    return true;
}

/*
 * Option --rl-qps: a finite decimal number >= 0 (0: the default), as
 * "10", "0.5", ".5" or "2e3"; no sign, hex, "inf" or "nan". An absent
 * option leaves *out as is. wqctl never calls setlocale(), so the
 * decimal point is always '.'.
 */
static bool opt_qps(const struct args *a, double *out)
{
    const char *s = a->val[O_RL_QPS];
    char *end = NULL;
    double v = 0;
    bool ok;

    if (!s)
        return true;
    ok = ((s[0] >= '0' && s[0] <= '9') || s[0] == '.') &&
         s[strspn(s, "0123456789.eE+-")] == '\0';
    if (ok) {
        errno = 0;
        v = strtod(s, &end);
        ok = end != s && *end == '\0' && errno != ERANGE && isfinite(v);
    }
    if (!ok) {
        usage_error(a->cmd, "bad value '%s' for --rl-qps (a number >= 0, "
                    "e.g. 10, 0.5)", s);
        return false;
    }
    *out = v;
    return true;
}

static const struct {
    const char *name;
    unsigned bit;
} limiter_names[] = {
    { "exponential", WQ_RL_EXPONENTIAL },
    { "bucket", WQ_RL_BUCKET },
    { "fast-slow", WQ_RL_FAST_SLOW },
};

#define N_LIMITERS (sizeof limiter_names / sizeof limiter_names[0])

/* Option --rl-limiters: a comma-separated list of limiter names. */
static bool opt_limiters(const struct args *a, unsigned *out)
{
    const char *s = a->val[O_RL_LIMITERS];
    unsigned bits = 0;

    if (!s)
        return true;
    for (const char *p = s;; p++) {
        size_t n = strcspn(p, ","), i;

        for (i = 0; i < N_LIMITERS; i++)
            if (strlen(limiter_names[i].name) == n &&
                strncmp(limiter_names[i].name, p, n) == 0)
                break;
        if (i == N_LIMITERS) {
            usage_error(a->cmd, "bad limiter '%.*s' in --rl-limiters "
                        "(a list of exponential, bucket, fast-slow)",
                        (int)n, p);
            return false;
        }
        bits |= limiter_names[i].bit;
        p += n;
        if (*p == '\0')
            break;
    }
    *out = bits;
    return true;
}

/* ------------------------------------------------------------------ */
/* Argument parsing                                                    */
/* ------------------------------------------------------------------ */

/*
 * Parse argv[0..argc) (the words after the command name) for command c.
 * Options may appear anywhere; "--" ends them; "-" is a positional.
 * Returns EXIT_OK, or EXIT_USAGE after printing why. a->pos must have
 * room for argc entries.
 */
static int parse_args(const struct command *c, int argc, char **argv,
                      struct args *a)
{
    bool options_done = false;

    a->cmd = c;
    a->npos = 0;
    for (int i = 0; i < O_COUNT; i++)
        a->val[i] = NULL;

    for (int i = 0; i < argc; i++) {
        char *w = argv[i];
        const char *name, *eq;
        size_t name_len;
        int o;

        if (options_done || w[0] != '-' || w[1] == '\0') {
            if (c->cmd_pos && a->npos == c->cmd_pos)
                options_done = true;   /* a command line starts here */
            a->pos[a->npos++] = w;
            continue;
        }
        if (strcmp(w, "--") == 0) {
            options_done = true;
            continue;
        }
        if (w[1] != '-') {   /* a short option: -x, -x VALUE, -xVALUE */
            for (o = 0; o < O_COUNT; o++)
                if ((c->opts & OPT(o) || o == O_HELP) &&
                    opt_defs[o].short_name == w[1])
                    break;
            if (o == O_COUNT || (!opt_defs[o].has_arg && w[2] != '\0'))
                return usage_error(c, "unknown option '%s'", w);
            if (!opt_defs[o].has_arg)
                a->val[o] = "";
            else if (w[2] != '\0')
                a->val[o] = w + 2;
            else if (i + 1 < argc)
                a->val[o] = argv[++i];
            else
                return usage_error(c, "option '-%c' needs a value", w[1]);
            continue;
        }

        name = w + 2;
        eq = strchr(name, '=');
        name_len = eq ? (size_t)(eq - name) : strlen(name);
        for (o = 0; o < O_COUNT; o++)
            if ((c->opts & OPT(o) || o == O_HELP) &&
                strlen(opt_defs[o].name) == name_len &&
                strncmp(opt_defs[o].name, name, name_len) == 0)
                break;
        if (o == O_COUNT)
            return usage_error(c, "unknown option '%.*s'",
                               (int)(name_len + 2), w);
        if (!opt_defs[o].has_arg) {
            if (eq)
                return usage_error(c, "option '--%s' takes no value",
                                   opt_defs[o].name);
            a->val[o] = "";
        } else if (eq) {
            a->val[o] = eq + 1;
        } else if (i + 1 < argc) {
            a->val[o] = argv[++i];
        } else {
            return usage_error(c, "option '--%s' needs a value",
                               opt_defs[o].name);
        }
    }

    if (a->val[O_HELP])
        return EXIT_OK;
    if (a->npos < c->min_pos)
        return usage_error(c, "missing argument");
    if (a->npos > c->max_pos)
        return usage_error(c, "too many arguments");
    return EXIT_OK;
}

/* ------------------------------------------------------------------ */
/* Shared helpers                                                      */
/* ------------------------------------------------------------------ */

/* Attach to an existing queue; on failure print why and return EXIT_FAIL. */
static int open_queue(const char *name, wq **q)
{
    int rc = wq_open(name, NULL, q);

    return rc < 0 ? queue_error(name, NULL, rc) : EXIT_OK;
}

/* wq_stats; on failure print why, close q and return EXIT_FAIL. */
static int queue_stats(wq *q, const char *name, struct wq_stats *st)
{
    int rc = wq_stats(q, st);

    if (rc < 0) {
        wq_close(q);
        return queue_error(name, "stats", rc);
    }
    return EXIT_OK;
}

/* Attach and read the stats; on failure print why and return EXIT_FAIL. */
static int open_queue_stats(const char *name, wq **q, struct wq_stats *st)
{
    int rc;

    if ((rc = open_queue(name, q)) != EXIT_OK)
        return rc;
    return queue_stats(*q, name, st);
}

/* Attach and read max_key_len; on failure print why and return EXIT_FAIL. */
static int open_queue_keys(const char *name, wq **q, uint64_t *max_key_len)
{
    struct wq_stats st;
    int rc;

    if ((rc = open_queue_stats(name, q, &st)) != EXIT_OK)
        return rc;
    *max_key_len = st.max_key_len;
    return EXIT_OK;
}

/*
 * Check a key's length before sending it, to say which key is wrong
 * ("key 2: empty key", "line 7: key of ... bytes is longer ...").
 */
static int check_key(uint64_t max_key_len, size_t len, const char *where,
                     uint64_t index)
{
    if (len == 0) {
        fprintf(stderr, "wqctl: %s %" PRIu64 ": empty key\n", where, index);
        return EXIT_FAIL;
    }
    if (len > max_key_len) {
        fprintf(stderr, "wqctl: %s %" PRIu64 ": key of %zu bytes is longer "
                "than max_key_len (%" PRIu64 ")\n", where, index, len,
                max_key_len);
        return EXIT_FAIL;
    }
    return EXIT_OK;
}

/* Check every key given as an argument (numbered from 1). */
static int check_keys(uint64_t max_key_len, char **keys, size_t n)
{
    int rc;

    for (size_t i = 0; i < n; i++)
        if ((rc = check_key(max_key_len, strlen(keys[i]), "key", i + 1)) !=
            EXIT_OK)
            return rc;
    return EXIT_OK;
}

/*
 * Remaining time until a CLOCK_MONOTONIC instant, as "in 1.234s"
 * (rounded up to the millisecond, so it never reads 0 before it is
 * due) or "now" once it has passed.
 */
static const char *format_ready_in(char *buf, size_t cap, uint64_t ready_ns,
                                   uint64_t now_ns)
{
    uint64_t ns, ms;

    if (ready_ns <= now_ns)
        return "now";
    ns = ready_ns - now_ns;
    ms = ns / 1000000 + (ns % 1000000 != 0);
    snprintf(buf, cap, "in %" PRIu64 ".%03" PRIu64 "s", ms / 1000, ms % 1000);
    return buf;
}

/* A growable array of byte strings (names, report lines). */
struct strv {
    char **v;
    size_t n, cap;
};

/* Make room for one more element in a growable array (*arr, n used of
   *cap): doubles it, starting at `first`. 0 or -ENOMEM. */
static int grow(void **arr, size_t n, size_t *cap, size_t elem, size_t first)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? 2 * *cap : first;
    void *v = realloc(*arr, c * elem);

    if (!v)
        return -ENOMEM;
    *arr = v;
    *cap = c;
    return 0;
}

static int strv_push(struct strv *sv, const char *s)
{
    char *dup;

    if (grow((void **)&sv->v, sv->n, &sv->cap, sizeof *sv->v, 16) < 0)
        return -ENOMEM;
    dup = strdup(s);
    if (!dup)
        return -ENOMEM;
    sv->v[sv->n++] = dup;
    return 0;
}

static void strv_free(struct strv *sv)
{
    for (size_t i = 0; i < sv->n; i++)
        free(sv->v[i]);
    free(sv->v);
}

/* ------------------------------------------------------------------ */
/* create                                                              */
/* ------------------------------------------------------------------ */

/* Which limiter each --rl-* parameter configures. */
static const struct {
    enum opt_id opt;
    unsigned limiter;
} rl_params[] = {
    { O_RL_BASE, WQ_RL_EXPONENTIAL }, { O_RL_MAX, WQ_RL_EXPONENTIAL },
    { O_RL_QPS, WQ_RL_BUCKET },       { O_RL_BURST, WQ_RL_BUCKET },
    { O_RL_FAST, WQ_RL_FAST_SLOW },   { O_RL_SLOW, WQ_RL_FAST_SLOW },
    { O_RL_MAX_FAST, WQ_RL_FAST_SLOW },
};

/*
 * The --rl-* options of `create` into o. Zero values mean the library's
 * defaults. A parameter of a limiter that is not selected is an error
 * rather than silently ignored, and so is fast-slow without its three
 * parameters.
 */
static int create_limiter(const struct args *a, struct wq_options *o)
{
    unsigned lim = WQ_RL_EXPONENTIAL | WQ_RL_BUCKET; /* the library's default */

    if (!opt_limiters(a, &o->rl_limiters) ||
        !opt_delay(a, O_RL_BASE, &o->rl_base_delay_ns) ||
        !opt_delay(a, O_RL_MAX, &o->rl_max_delay_ns) ||
        !opt_qps(a, &o->rl_qps) ||
        !opt_u32(a, O_RL_BURST, 10, UINT32_MAX, &o->rl_burst) ||
        !opt_delay(a, O_RL_FAST, &o->rl_fast_delay_ns) ||
        !opt_delay(a, O_RL_SLOW, &o->rl_slow_delay_ns) ||
        !opt_u32(a, O_RL_MAX_FAST, 10, UINT32_MAX, &o->rl_max_fast_attempts))
        return EXIT_USAGE;
    if (o->rl_limiters)
        lim = o->rl_limiters;
    for (size_t i = 0; i < sizeof rl_params / sizeof rl_params[0]; i++) {
        size_t l;

        if (!a->val[rl_params[i].opt] || (lim & rl_params[i].limiter))
            continue;
        for (l = 0; limiter_names[l].bit != rl_params[i].limiter; l++)
            ;
        return usage_error(a->cmd, "--%s needs %s in --rl-limiters",
                           opt_defs[rl_params[i].opt].name,
                           limiter_names[l].name);
    }
    if ((lim & WQ_RL_FAST_SLOW) &&
        (!o->rl_fast_delay_ns || !o->rl_slow_delay_ns ||
         !o->rl_max_fast_attempts))
        return usage_error(a->cmd, "the fast-slow limiter needs --rl-fast, "
                           "--rl-slow and --rl-max-fast, all above 0");
    if (o->rl_fast_delay_ns > o->rl_slow_delay_ns)
        return usage_error(a->cmd, "--rl-fast is longer than --rl-slow");
    if (o->rl_max_delay_ns && o->rl_base_delay_ns > o->rl_max_delay_ns)
        return usage_error(a->cmd, "--rl-base is longer than --rl-max");
    return EXIT_OK;
}

/* wq_options.durability by name, as --durability takes it and `stat`
   prints it. */
static const struct {
    const char *name;
    int value;
} durability_names[] = {
    { "process", WQ_DURABLE_PROCESS },
    { "fsync", WQ_DURABLE_FSYNC },
    { "none", WQ_DURABLE_NONE },
};

#define N_DURABILITY (sizeof durability_names / sizeof durability_names[0])

static const char *durability_name(uint64_t d)
{
    for (size_t i = 0; i < N_DURABILITY; i++)
        if ((uint64_t)durability_names[i].value == d)
            return durability_names[i].name;
    return NULL;
}

/*
 * --store, --durability and --snapshot-interval into o. The library
 * rejects a durability or an interval without a store, and an interval
 * without WQ_DURABLE_NONE, with -EINVAL; here they are usage errors that
 * say which option is missing.
 */
static int create_store(const struct args *a, struct wq_options *o)
{
    const char *d = a->val[O_DURABILITY];
    int64_t iv;
    size_t i;

    if (!a->val[O_STORE]) {
        if (d || a->val[O_SNAPSHOT_INTERVAL])
            return usage_error(a->cmd, "--%s needs --store",
                               d ? "durability" : "snapshot-interval");
        return EXIT_OK;
    }
    if (a->val[O_STORE][0] == '\0')
        return usage_error(a->cmd, "--store needs a directory");
    o->store_path = a->val[O_STORE];
    if (d) {
        for (i = 0; i < N_DURABILITY; i++)
            if (strcmp(d, durability_names[i].name) == 0)
                break;
        if (i == N_DURABILITY)
            return usage_error(a->cmd, "bad value '%s' for --durability "
                               "(process, fsync or none)", d);
        o->durability = durability_names[i].value;
    }
    if (a->val[O_SNAPSHOT_INTERVAL]) {
        if (o->durability != WQ_DURABLE_NONE)
            return usage_error(a->cmd, "--snapshot-interval needs "
                               "--durability none");
        if (!opt_duration(a, O_SNAPSHOT_INTERVAL, false, 0, &iv))
            return EXIT_USAGE;
        if (iv % 1000000 != 0 || iv / 1000000 > UINT32_MAX)
            return usage_error(a->cmd, "bad value '%s' for "
                               "--snapshot-interval (whole milliseconds, at "
                               "most %" PRIu32 "ms)",
                               a->val[O_SNAPSHOT_INTERVAL], UINT32_MAX);
        o->snapshot_interval_ms = (uint32_t)(iv / 1000000);
    }
    return EXIT_OK;
}

/* --fair, --fair-share and --tenant-sep into o (the latter two need
   --fair: the library says -EINVAL, we say which). */
static int create_fair(const struct args *a, struct wq_options *o)
{
    const char *sep = a->val[O_TENANT_SEP];

    if (!a->val[O_FAIR]) {
        if (a->val[O_FAIR_SHARE] || sep)
            return usage_error(a->cmd, "--%s needs --fair",
                               sep ? "tenant-sep" : "fair-share");
        return EXIT_OK;
    }
    o->flags |= WQ_FAIR;
    if (!opt_u32(a, O_FAIR_SHARE, 10, UINT32_MAX, &o->fair_share))
        return EXIT_USAGE;
    if (!sep)
        return EXIT_OK;
    if (strcmp(sep, "none") == 0)
        o->tenant_sep = -1;
    else if (strlen(sep) == 1)
        o->tenant_sep = (unsigned char)sep[0];
    else
        return usage_error(a->cmd, "bad value '%s' for --tenant-sep (one "
                           "character, or none)", sep);
    return EXIT_OK;
}

/* The options `create` and `restore` share, into o (flags: WQ_CREATE and
   the mode bits; the caller adds WQ_EXCL). */
static int create_options(const struct args *a, struct wq_options *o)
{
    uint32_t mode = 0;
    int rc;

    if (!opt_u32(a, O_CAPACITY, 10, WQ_MAX_CAPACITY, &o->capacity) ||
        !opt_u32(a, O_MAX_KEY_LEN, 10, WQ_MAX_KEY_LEN, &o->max_key_len) ||
        !opt_u32(a, O_MAX_PROCS, 10, WQ_MAX_PROCS, &o->max_procs) ||
        !opt_u32(a, O_RESULT_CAPACITY, 10, WQ_MAX_CAPACITY,
                 &o->result_capacity) ||
        !opt_u32(a, O_MODE, 8, 0777, &mode))
        return EXIT_USAGE;
    if ((rc = create_limiter(a, o)) != EXIT_OK ||
        (rc = create_store(a, o)) != EXIT_OK ||
        (rc = create_fair(a, o)) != EXIT_OK)
        return rc;
    o->mode = (mode_t)mode;
    o->flags |= WQ_CREATE | (a->val[O_NO_METRICS] ? WQ_NO_METRICS : 0);
    return EXIT_OK;
}

/* wq_list callback: is this the queue named arg? */
static int match_name(const char *name, void *arg)
{
    return strcmp(name, arg) == 0;
}

/* "restored N keys (Q queued, W waiting, F failing)": what a new queue
   took from its store (keys that were processing come back queued). */
static void print_restored(const struct wq_stats *st)
{
    uint64_t n = st->queued + st->waiting + st->failing;

    printf("restored %" PRIu64 " key%s (%" PRIu64 " queued, %" PRIu64
           " waiting, %" PRIu64 " failing)\n", n, n == 1 ? "" : "s",
           st->queued, st->waiting, st->failing);
}

static int cmd_create(const struct args *a)
{
    const char *name = a->pos[0];
    struct wq_options o = { 0 };
    struct wq_stats st;
    wq *q;
    int rc;

    if ((rc = create_options(a, &o)) != EXIT_OK)
        return rc;
    if (!a->val[O_EXIST_OK])
        o.flags |= WQ_EXCL;
    /* wq_open would read the whole store into a region it then cannot
       publish, and rewrite the store's options: fail before that. */
    if (o.store_path && (o.flags & WQ_EXCL) &&
        wq_list(match_name, (void *)name) > 0)
        return queue_error(name, NULL, -EEXIST);

    rc = wq_open(name, &o, &q);
    if (rc < 0)
        return queue_error(name, NULL, rc);
    /* A new queue over a store that holds keys is built from them (the
       library restores whenever it creates a region): say so. With --exist-ok the
       queue may have been there already, and nothing was restored. */
    if (o.store_path && (o.flags & WQ_EXCL)) {
        if ((rc = queue_stats(q, name, &st)) != EXIT_OK)
            return rc;
        if (st.queued + st.waiting + st.failing > 0)
            print_restored(&st);
    }
    wq_close(q);
    return EXIT_OK;
}

/* ------------------------------------------------------------------ */
/* restore, snapshot                                                   */
/* ------------------------------------------------------------------ */

static int queue_exists_error(const char *name)
{
    fputs("wqctl: queue '", stderr);
    put_text(stderr, name, strlen(name));
    fputs("': queue exists: restore only builds a missing queue; wqctl rm "
          "it first\n", stderr);
    return EXIT_FAIL;
}

/*
 * DIR must hold a store already: wq_open would make a new, empty one
 * (and an empty queue) out of a mistyped path. An LMDB environment is a
 * directory with a data.mdb.
 */
static int check_store_dir(const char *dir)
{
    struct stat sb;
    char *data;
    int rc = EXIT_OK, err = 0;

    if (stat(dir, &sb) < 0)
        err = errno;
    else if (!S_ISDIR(sb.st_mode))
        err = ENOTDIR;
    if (err) {
        fprintf(stderr, "wqctl: restore: store '%s': %s\n", dir,
                strerror(err));
        return EXIT_FAIL;
    }
    if (asprintf(&data, "%s/data.mdb", dir) < 0)
        return out_of_memory();
    if (access(data, F_OK) < 0) {
        fprintf(stderr, "wqctl: restore: '%s' holds no store (no data.mdb)"
                "\n", dir);
        rc = EXIT_FAIL;
    }
    free(data);
    return rc;
}

/*
 * Explicit restore: build the missing queue NAME from the store in DIR
 * (wq_open with WQ_CREATE|WQ_EXCL and store_path; geometry left out is
 * taken from the store). Never into an existing queue: the check by name
 * comes first, so that the store is not even opened then, and WQ_EXCL
 * settles a race with another creator.
 */
static int cmd_restore(const struct args *a)
{
    const char *name = a->pos[0];
    struct wq_options o = { 0 };
    struct wq_stats st;
    wq *q;
    int rc;

    if (!a->val[O_STORE])
        return usage_error(a->cmd, "--store is required");
    if ((rc = create_options(a, &o)) != EXIT_OK)
        return rc;
    o.flags |= WQ_EXCL;
    if (wq_list(match_name, (void *)name) > 0)
        return queue_exists_error(name);
    if ((rc = check_store_dir(o.store_path)) != EXIT_OK)
        return rc;

    rc = wq_open(name, &o, &q);
    if (rc == -EEXIST)
        return queue_exists_error(name);
    if (rc < 0)
        return queue_error(name, "restore", rc);
    if ((rc = queue_stats(q, name, &st)) != EXIT_OK)
        return rc;
    wq_close(q);
    print_restored(&st);
    return EXIT_OK;
}

static int cmd_snapshot(const struct args *a)
{
    const char *name = a->pos[0];
    wq *q;
    int rc, n;

    if ((rc = open_queue(name, &q)) != EXIT_OK)
        return rc;
    n = wq_snapshot(q);
    wq_close(q);
    if (n == -ENOENT) {
        fputs("wqctl: queue '", stderr);
        put_text(stderr, name, strlen(name));
        fputs("': no store to write to (wqctl create --store DIR)\n",
              stderr);
        return EXIT_FAIL;
    }
    if (n < 0)
        return queue_error(name, "snapshot", n);
    printf("wrote %d record%s\n", n, n == 1 ? "" : "s");
    return EXIT_OK;
}

/* ------------------------------------------------------------------ */
/* stat                                                                */
/* ------------------------------------------------------------------ */

enum stat_kind {
    S_NUM,        /* a counter */
    S_BOOL,       /* 0 or 1: no/yes, false/true */
    S_NEXT_READY  /* next_ready_ns relative to now_ns; "-"/null if none */
};

static const struct {
    const char *name;   /* text output */
    const char *json;   /* JSON member */
    size_t off;
    enum stat_kind kind;
} stat_fields[] = {
#define F(f) { #f, #f, offsetof(struct wq_stats, f), S_NUM }
    F(queued), F(processing), F(waiting), F(failing),
    { "next_ready", "next_ready_in_ns", offsetof(struct wq_stats, next_ready_ns),
      S_NEXT_READY },
    F(live), F(capacity), F(results), F(result_capacity),
    F(processes), F(adds_total), F(coalesced_total), F(retries_total),
    F(crash_requeues_total), F(repairs_total), F(max_key_len),
    F(max_procs), F(region_bytes),
#undef F
    { "shutting_down", "shutting_down", offsetof(struct wq_stats, shutting_down),
      S_BOOL },
};

#define N_STAT_FIELDS (sizeof stat_fields / sizeof stat_fields[0])

static uint64_t stat_value(const struct wq_stats *st, size_t i)
{
    uint64_t v;

    memcpy(&v, (const char *)st + stat_fields[i].off, sizeof v);
    return v;
}

/* ---- fair mode: the queued keys by priority and by tenant ---- */

#define STAT_TOP_TENANTS 10   /* tenants `stat` lists; the rest are counted */

/* One queued key of a fair queue: its priority and a copy of its tenant
   (the key's first tenant_len bytes; NULL when it has none). */
struct fair_key {
    int priority;
    char *tenant;
    size_t tenant_len;
};

/* Queued keys of one priority, or of one tenant. */
struct fair_group {
    int priority;
    const char *tenant;
    size_t tenant_len;
    uint64_t n;
};

struct fair_view {
    struct fair_key *keys;      /* as wq_dump handed them out */
    size_t nkeys, cap;
    struct fair_group *prio;    /* highest priority first */
    size_t nprio;
    struct fair_group *tenant;  /* deepest tenant first */
    size_t ntenant;
};

/* wq_dump callback (under the lock: copies only). The queued keys come
   first, so the walk stops at the first other key. */
static int collect_fair(const struct wq_key_info *ki, void *arg)
{
    struct fair_view *v = arg;
    struct fair_key *k;

    if (!(ki->state & WQ_KEY_QUEUED))
        return 1;
    if (grow((void **)&v->keys, v->nkeys, &v->cap, sizeof *v->keys, 64) < 0)
        return -ENOMEM;
    k = &v->keys[v->nkeys];
    k->priority = ki->priority;
    k->tenant_len = ki->tenant_len <= ki->len ? ki->tenant_len : 0;
    k->tenant = NULL;
    if (k->tenant_len) {
        k->tenant = malloc(k->tenant_len);
        if (!k->tenant)
            return -ENOMEM;
        memcpy(k->tenant, ki->key, k->tenant_len);
    }
    v->nkeys++;
    return 0;
}

static int cmp_bytes(const void *x, size_t xn, const void *y, size_t yn)
{
    size_t n = xn < yn ? xn : yn;
    int c = n ? memcmp(x, y, n) : 0;   /* x or y may be NULL when empty */

    return c ? c : (xn > yn) - (xn < yn);
}

static int cmp_key_priority(const void *x, const void *y)
{
    const struct fair_key *a = x, *b = y;

    return (a->priority < b->priority) - (a->priority > b->priority);
}

static int cmp_key_tenant(const void *x, const void *y)
{
    const struct fair_key *a = x, *b = y;

    return cmp_bytes(a->tenant, a->tenant_len, b->tenant, b->tenant_len);
}

/* Deepest first; ties by tenant, so the output is stable. */
static int cmp_group_depth(const void *x, const void *y)
{
    const struct fair_group *a = x, *b = y;

    if (a->n != b->n)
        return a->n < b->n ? 1 : -1;
    return cmp_bytes(a->tenant, a->tenant_len, b->tenant, b->tenant_len);
}

/* Group the collected keys: by priority, and by tenant (keys without a
   tenant, as with --tenant-sep none, are in no tenant group). */
static int fair_view_build(struct fair_view *v)
{
    size_t n = v->nkeys;

    v->prio = calloc(n ? n : 1, sizeof *v->prio);
    v->tenant = calloc(n ? n : 1, sizeof *v->tenant);
    if (!v->prio || !v->tenant)
        return -ENOMEM;
    if (n == 0)
        return 0;
    qsort(v->keys, n, sizeof *v->keys, cmp_key_priority);
    for (size_t i = 0; i < n; i++) {
        if (v->nprio == 0 ||
            v->prio[v->nprio - 1].priority != v->keys[i].priority)
            v->prio[v->nprio++].priority = v->keys[i].priority;
        v->prio[v->nprio - 1].n++;
    }
    qsort(v->keys, n, sizeof *v->keys, cmp_key_tenant);
    for (size_t i = 0; i < n; i++) {
        const struct fair_key *k = &v->keys[i];
        struct fair_group *g = v->ntenant ? &v->tenant[v->ntenant - 1] : NULL;

        if (k->tenant_len == 0)
            continue;
        if (!g || cmp_bytes(g->tenant, g->tenant_len, k->tenant,
                            k->tenant_len) != 0) {
            g = &v->tenant[v->ntenant++];
            g->tenant = k->tenant;
            g->tenant_len = k->tenant_len;
        }
        g->n++;
    }
    qsort(v->tenant, v->ntenant, sizeof *v->tenant, cmp_group_depth);
    return 0;
}

static void fair_view_free(struct fair_view *v)
{
    for (size_t i = 0; i < v->nkeys; i++)
        free(v->keys[i].tenant);
    free(v->keys);
    free(v->prio);
    free(v->tenant);
}

/* ---- printing ---- */

static void print_stats_text(const char *name, const struct wq_stats *st,
                             const struct fair_view *fv)
{
    const char *dur = durability_name(st->durability);
    char buf[32];

    printf("%-21s ", "name");
    put_text(stdout, name, strlen(name));
    putchar('\n');
    for (size_t i = 0; i < N_STAT_FIELDS; i++) {
        uint64_t v = stat_value(st, i);

        printf("%-21s ", stat_fields[i].name);
        switch (stat_fields[i].kind) {
        case S_NUM:
            printf("%" PRIu64 "\n", v);
            break;
        case S_BOOL:
            printf("%s\n", v ? "yes" : "no");
            break;
        case S_NEXT_READY:
            printf("%s\n", v ? format_ready_in(buf, sizeof buf, v, st->now_ns)
                             : "-");
            break;
        }
    }
    printf("%-21s %s\n", "mode", st->fair ? "fair" : "default");
    printf("%-21s %s\n", "store", st->has_store ? "yes" : "no");
    if (!st->has_store)
        printf("%-21s -\n%-21s -\n", "durability", "store_unsynced");
    else if (dur)
        printf("%-21s %s\n%-21s %" PRIu64 "\n", "durability", dur,
               "store_unsynced", st->store_unsynced);
    else
        printf("%-21s %" PRIu64 "\n%-21s %" PRIu64 "\n", "durability",
               st->durability, "store_unsynced", st->store_unsynced);
    if (!fv)
        return;
    printf("queued_by_priority\n");
    for (size_t i = 0; i < fv->nprio; i++)
        printf("  %-19d %" PRIu64 "\n", fv->prio[i].priority, fv->prio[i].n);
    printf("queued_by_tenant\n");
    for (size_t i = 0; i < fv->ntenant && i < STAT_TOP_TENANTS; i++) {
        const struct fair_group *g = &fv->tenant[i];
        size_t w = text_width(g->tenant, g->tenant_len);

        fputs("  ", stdout);
        put_text(stdout, g->tenant, g->tenant_len);
        printf("%*s %" PRIu64 "\n", w < 19 ? (int)(19 - w) : 0, "", g->n);
    }
    if (fv->ntenant > STAT_TOP_TENANTS)
        printf("  (%zu more)\n", fv->ntenant - STAT_TOP_TENANTS);
}

static void print_stats_json(const char *name, const struct wq_stats *st,
                             const struct fair_view *fv)
{
    const char *dur = durability_name(st->durability);

    printf("{\"name\":");
    put_json_str(stdout, name);
    for (size_t i = 0; i < N_STAT_FIELDS; i++) {
        uint64_t v = stat_value(st, i);

        printf(",\"%s\":", stat_fields[i].json);
        switch (stat_fields[i].kind) {
        case S_NUM:
            printf("%" PRIu64, v);
            break;
        case S_BOOL:
            printf("%s", v ? "true" : "false");
            break;
        case S_NEXT_READY:
            if (v == 0)
                printf("null");
            else
                printf("%" PRIu64, v > st->now_ns ? v - st->now_ns : 0);
            break;
        }
    }
    printf(",\"fair\":%s,\"store\":", st->fair ? "true" : "false");
    if (!st->has_store)
        printf("null");
    else if (dur)
        printf("{\"durability\":\"%s\",\"unsynced\":%" PRIu64 "}", dur,
               st->store_unsynced);
    else
        printf("{\"durability\":%" PRIu64 ",\"unsynced\":%" PRIu64 "}",
               st->durability, st->store_unsynced);
    if (!fv) {
        printf(",\"priorities\":null,\"tenants\":null,\"tenants_more\":null}\n");
        return;
    }
    printf(",\"priorities\":{");
    for (size_t i = 0; i < fv->nprio; i++)
        printf("%s\"%d\":%" PRIu64, i ? "," : "", fv->prio[i].priority,
               fv->prio[i].n);
    printf("},\"tenants\":{");
    for (size_t i = 0; i < fv->ntenant && i < STAT_TOP_TENANTS; i++) {
        if (i)
            putchar(',');
        put_json(stdout, fv->tenant[i].tenant, fv->tenant[i].tenant_len);
        printf(":%" PRIu64, fv->tenant[i].n);
    }
    printf("},\"tenants_more\":%zu}\n", fv->ntenant > STAT_TOP_TENANTS ?
           fv->ntenant - STAT_TOP_TENANTS : 0);
}

/*
 * The counters, and on a fair queue the queued keys by priority and by
 * tenant, computed here from wq_dump (the library keeps no such counts):
 * a second look, so under load the two can differ by a few keys.
 */
static int cmd_stat(const struct args *a)
{
    const char *name = a->pos[0];
    struct fair_view fv = { 0 };
    struct wq_stats st;
    wq *q;
    int rc, err = 0;

    if ((rc = open_queue(name, &q)) != EXIT_OK)
        return rc;
    if ((rc = queue_stats(q, name, &st)) != EXIT_OK)
        return rc;
    if (st.fair)
        err = wq_dump(q, collect_fair, &fv);
    wq_close(q);
    if (err >= 0 && st.fair)
        err = fair_view_build(&fv);
    if (err < 0) {
        fair_view_free(&fv);
        return err == -ENOMEM ? out_of_memory()
                              : queue_error(name, "dump", err);
    }
    if (a->val[O_JSON])
        print_stats_json(name, &st, st.fair ? &fv : NULL);
    else
        print_stats_text(name, &st, st.fair ? &fv : NULL);
    fair_view_free(&fv);
    return EXIT_OK;
}

/* ------------------------------------------------------------------ */
/* ls                                                                  */
/* ------------------------------------------------------------------ */

static int collect_name(const char *name, void *arg)
{
    return strv_push(arg, name);
}

static int cmp_str(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

/* One row of `ls`: the stats of a queue, or why it could not be read. */
struct ls_row {
    const char *name;
    int err;            /* 0, or the negative errno of open/stats */
    struct wq_stats st;
};

static void ls_read(struct ls_row *r)
{
    wq *q;

    r->err = wq_open(r->name, NULL, &q);
    if (r->err < 0)
        return;
    r->err = wq_stats(q, &r->st);
    wq_close(q);
}

static void ls_print_text(const struct ls_row *rows, size_t n)
{
    size_t w = 4;

    for (size_t i = 0; i < n; i++) {
        size_t tw = text_width(rows[i].name, strlen(rows[i].name));
        if (tw > w)
            w = tw;
    }
    printf("%-*s %10s %10s %10s %10s %9s\n", (int)w, "NAME", "QUEUED",
           "PROCESSING", "LIVE", "CAPACITY", "PROCESSES");
    for (size_t i = 0; i < n; i++) {
        const struct ls_row *r = &rows[i];
        size_t tw = text_width(r->name, strlen(r->name));

        put_text(stdout, r->name, strlen(r->name));
        printf("%*s", (int)(w - tw), "");
        if (r->err < 0)
            printf(" error: %s\n", wq_strerror(r->err));
        else
            printf(" %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %10" PRIu64
                   " %9" PRIu64 "\n", r->st.queued, r->st.processing,
                   r->st.live, r->st.capacity, r->st.processes);
    }
}

static void ls_print_json(const struct ls_row *rows, size_t n)
{
    printf("{\"queues\":[");
    for (size_t i = 0; i < n; i++) {
        const struct ls_row *r = &rows[i];

        printf("%s{\"name\":", i ? "," : "");
        put_json_str(stdout, r->name);
        if (r->err < 0) {
            printf(",\"error\":");
            put_json_str(stdout, wq_strerror(r->err));
        } else {
            printf(",\"queued\":%" PRIu64 ",\"processing\":%" PRIu64
                   ",\"live\":%" PRIu64 ",\"capacity\":%" PRIu64
                   ",\"processes\":%" PRIu64, r->st.queued, r->st.processing,
                   r->st.live, r->st.capacity, r->st.processes);
        }
        putchar('}');
    }
    printf("]}\n");
}

static int cmd_ls(const struct args *a)
{
    struct strv names = { 0 };
    struct ls_row *rows;
    int rc;

    rc = wq_list(collect_name, &names);
    if (rc < 0) {
        strv_free(&names);
        fprintf(stderr, "wqctl: cannot list queues: %s\n", wq_strerror(rc));
        return EXIT_FAIL;
    }
    if (names.n > 0)
        qsort(names.v, names.n, sizeof *names.v, cmp_str);

    rows = calloc(names.n ? names.n : 1, sizeof *rows);
    if (!rows) {
        strv_free(&names);
        return out_of_memory();
    }
    for (size_t i = 0; i < names.n; i++) {
        rows[i].name = names.v[i];
        ls_read(&rows[i]);
    }
    if (a->val[O_JSON])
        ls_print_json(rows, names.n);
    else
        ls_print_text(rows, names.n);
    free(rows);
    strv_free(&names);
    return EXIT_OK;
}

/* ------------------------------------------------------------------ */
/* add                                                                 */
/* ------------------------------------------------------------------ */

enum add_mode {
    ADD_NOW,          /* wq_add_many, a batch at a time */
    ADD_AFTER,        /* wq_add_after(delay_ns), a key at a time */
    ADD_RATE_LIMITED, /* wq_add_rate_limited, a key at a time */
    ADD_OPTS          /* --priority: wq_add_opts(opts), a key at a time */
};

/* Running totals of an `add`. */
struct add_state {
    wq *q;
    const char *name;
    uint64_t max_key_len;
    enum add_mode mode;
    uint64_t delay_ns;
    struct wq_add_opts opts;  /* ADD_OPTS: priority, and --after or
                                 --rate-limited */
    uint64_t added, coalesced;
};

/* Priorities on a queue made without --fair: wq_add_opts says -EINVAL. */
static int not_fair_error(const char *name)
{
    fputs("wqctl: queue '", stderr);
    put_text(stderr, name, strlen(name));
    fputs("': priorities need a fair queue (wqctl create --fair)\n", stderr);
    return EXIT_FAIL;
}

/*
 * Add one batch: with wq_add_many (all or none), or key by key with the
 * delaying calls (the keys before a failure stay added and are counted).
 * Returns EXIT_OK or EXIT_FAIL (reported).
 */
static int add_batch(struct add_state *s, const struct iovec *keys, size_t n)
{
    int rc;

    if (n == 0)
        return EXIT_OK;
    if (s->mode == ADD_NOW) {
        rc = wq_add_many(s->q, keys, n);
        if (rc < 0)
            return queue_error(s->name, "add", rc);
        s->coalesced += (uint64_t)rc;
        s->added += n - (size_t)rc;
        return EXIT_OK;
    }
    for (size_t i = 0; i < n; i++) {
        if (s->mode == ADD_AFTER)
            rc = wq_add_after(s->q, keys[i].iov_base, keys[i].iov_len,
                              s->delay_ns);
        else if (s->mode == ADD_RATE_LIMITED)
            rc = wq_add_rate_limited(s->q, keys[i].iov_base, keys[i].iov_len);
        else
            rc = wq_add_opts(s->q, keys[i].iov_base, keys[i].iov_len,
                             &s->opts);
        if (rc == -EINVAL && s->mode == ADD_OPTS && s->opts.priority != 0)
            return not_fair_error(s->name);   /* the keys were checked */
        if (rc < 0)
            return queue_error(s->name, "add", rc);
        if (rc > 0)
            s->coalesced++;   /* merged into a dirty or waiting key */
        else
            s->added++;
    }
    return EXIT_OK;
}

/* Keys from the command line: all validated first, so an invalid key
   adds none. */
static int add_from_args(struct add_state *s, char **keys, size_t n)
{
    struct iovec iov[ADD_BATCH];
    size_t k = 0;
    int rc;

    if ((rc = check_keys(s->max_key_len, keys, n)) != EXIT_OK)
        return rc;
    for (size_t i = 0; i < n; i++) {
        iov[k].iov_base = keys[i];
        iov[k].iov_len = strlen(keys[i]);
        if (++k == ADD_BATCH) {
            if ((rc = add_batch(s, iov, k)) != EXIT_OK)
                return rc;
            k = 0;
        }
    }
    return add_batch(s, iov, k);
}

/*
 * Keys from stdin, one per line without its newline; empty lines are
 * skipped. Lines may hold any byte but '\n' (NUL included). Batches are
 * added as they fill, so a bad line stops the run after earlier batches.
 */
static int add_from_stdin(struct add_state *s)
{
    struct iovec iov[ADD_BATCH];
    size_t k = 0;
    uint64_t lineno = 0;
    int rc = EXIT_OK;

    for (;;) {
        char *line = NULL;
        size_t cap = 0;
        ssize_t len = getline(&line, &cap, stdin);

        if (len < 0) {
            free(line);
            break;
        }
        lineno++;
        if (len > 0 && line[len - 1] == '\n')
            line[--len] = '\0';
        if (len == 0) {
            free(line);
            continue;
        }
        if ((rc = check_key(s->max_key_len, (size_t)len, "line", lineno)) !=
            EXIT_OK) {
            free(line);
            break;
        }
        iov[k].iov_base = line;
        iov[k].iov_len = (size_t)len;
        if (++k == ADD_BATCH) {
            rc = add_batch(s, iov, k);
            while (k > 0)
                free(iov[--k].iov_base);
            if (rc != EXIT_OK)
                break;
        }
    }
    if (rc == EXIT_OK && ferror(stdin)) {
        fprintf(stderr, "wqctl: reading stdin: %s\n", strerror(errno));
        rc = EXIT_FAIL;
    }
    if (rc == EXIT_OK)
        rc = add_batch(s, iov, k);
    while (k > 0)
        free(iov[--k].iov_base);
    return rc;
}

/* Option --priority: a decimal int, with an optional '-'. */
static bool opt_priority(const struct args *a, int *out)
{
    const char *s = a->val[O_PRIORITY];
    bool neg = s && s[0] == '-';
    uint64_t v;

    if (!s)
        return true;
    if (!parse_u64(s + neg, 10, neg ? (uint64_t)INT_MAX + 1 : INT_MAX, &v)) {
        usage_error(a->cmd, "bad value '%s' for --priority (a whole number "
                    "from %d to %d)", s, INT_MIN, INT_MAX);
        return false;
    }
    *out = neg ? (int)(-(int64_t)v) : (int)v;
    return true;
}

/*
 * --after / --rate-limited / --priority into s->mode, s->delay_ns and
 * s->opts. Without --priority the calls of client-go's interfaces are
 * used; with it, wq_add_opts carries the delay or the rate limiting too.
 */
static int add_options(const struct args *a, struct add_state *s)
{
    int64_t delay;

    if (a->val[O_AFTER] && a->val[O_RATE_LIMITED])
        return usage_error(a->cmd, "--after and --rate-limited exclude "
                           "each other");
    if (!opt_duration(a, O_AFTER, false, 0, &delay) ||
        !opt_priority(a, &s->opts.priority))
        return EXIT_USAGE;
    if (a->val[O_PRIORITY]) {
        s->mode = ADD_OPTS;
        s->opts.after_ns = a->val[O_AFTER] ? (uint64_t)delay : 0;
        s->opts.rate_limited = a->val[O_RATE_LIMITED] != NULL;
    } else if (a->val[O_AFTER]) {
        s->mode = ADD_AFTER;
        s->delay_ns = (uint64_t)delay;
    } else if (a->val[O_RATE_LIMITED]) {
        s->mode = ADD_RATE_LIMITED;
    }
    return EXIT_OK;
}

static int cmd_add(const struct args *a)
{
    struct add_state s = { .name = a->pos[0], .mode = ADD_NOW };
    bool from_stdin = a->npos == 2 && strcmp(a->pos[1], "-") == 0;
    struct wq_stats st;
    int rc;

    if ((rc = add_options(a, &s)) != EXIT_OK)
        return rc;
    if ((rc = open_queue_stats(s.name, &s.q, &st)) != EXIT_OK)
        return rc;
    s.max_key_len = st.max_key_len;
    if (s.opts.priority != 0 && !st.fair) {
        wq_close(s.q);
        return not_fair_error(s.name);   /* before any key is added */
    }

    if (from_stdin)
        rc = add_from_stdin(&s);
    else
        rc = add_from_args(&s, a->pos + 1, a->npos - 1);
    wq_close(s.q);

    if (rc == EXIT_OK || s.added + s.coalesced > 0)
        printf("added %" PRIu64 ", coalesced %" PRIu64 "\n", s.added,
               s.coalesced);
    return rc;
}

/* ------------------------------------------------------------------ */
/* forget, requeues                                                    */
/* ------------------------------------------------------------------ */

static int cmd_forget(const struct args *a)
{
    const char *name = a->pos[0];
    uint64_t max_key_len;
    wq *q;
    int rc;

    if ((rc = open_queue_keys(name, &q, &max_key_len)) != EXIT_OK)
        return rc;
    rc = check_keys(max_key_len, a->pos + 1, a->npos - 1);
    for (size_t i = 1; rc == EXIT_OK && i < a->npos; i++) {
        int err = wq_forget(q, a->pos[i], strlen(a->pos[i]));

        if (err < 0)
            rc = queue_error(name, "forget", err);
    }
    wq_close(q);
    return rc;
}

static int cmd_requeues(const struct args *a)
{
    const char *name = a->pos[0];
    const char *key = a->pos[1];
    uint64_t max_key_len;
    wq *q;
    int rc, n;

    if ((rc = open_queue_keys(name, &q, &max_key_len)) != EXIT_OK)
        return rc;
    if ((rc = check_keys(max_key_len, a->pos + 1, 1)) == EXIT_OK) {
        n = wq_num_requeues(q, key, strlen(key));
        if (n < 0)
            rc = queue_error(name, "requeues", n);
        else
            printf("%d\n", n);
    }
    wq_close(q);
    return rc;
}

/* ------------------------------------------------------------------ */
/* get                                                                 */
/* ------------------------------------------------------------------ */

static int cmd_get(const struct args *a)
{
    const char *name = a->pos[0];
    uint64_t max_key_len;
    int64_t timeout;
    char *buf;
    wq *q;
    int rc, n;

    if (!opt_timeout(a, 0, &timeout))
        return EXIT_USAGE;
    if ((rc = open_queue_keys(name, &q, &max_key_len)) != EXIT_OK)
        return rc;
    buf = malloc(max_key_len ? max_key_len : 1);
    if (!buf) {
        wq_close(q);
        return out_of_memory();
    }

    n = wq_get(q, buf, max_key_len, timeout);
    if (n > 0) {
        put_text(stdout, buf, (size_t)n);
        putchar('\n');
        rc = wq_done(q, buf, (size_t)n);
        rc = rc < 0 ? queue_error(name, "done", rc) : EXIT_OK;
    } else if (n == -EAGAIN || n == -ETIMEDOUT) {
        rc = EXIT_FAIL; /* empty: print nothing */
    } else {
        rc = queue_error(name, "get", n);
    }
    free(buf);
    wq_close(q);
    return rc;
}

/* ------------------------------------------------------------------ */
/* dump                                                                */
/* ------------------------------------------------------------------ */

/* A copy of one wq_key_info, taken under the lock and printed after. */
struct dump_rec {
    char *key;
    size_t len;
    unsigned state;
    pid_t owner;
    uint64_t position;
    uint64_t ready_ns;
    uint32_t failures;
    int priority;       /* fair queues: its priority */
    uint32_t seq;       /* its add order (wraps) */
    size_t tenant_len;  /* fair queues: key[0..tenant_len) is its tenant */
    enum wq_state result;
    int result_code;
    char *result_message;
};

struct dump_list {
    struct dump_rec *v;
    size_t n, cap;
};

static int collect_key(const struct wq_key_info *ki, void *arg)
{
    struct dump_list *l = arg;
    struct dump_rec *r;

    /* No state at all: not a key the queue holds, but the library's
       bookkeeping for its store (a removal not yet written, a new key
       not yet stored); wq_dump shows them, we do not. */
    if (ki->state == 0)
        return 0;

    if (grow((void **)&l->v, l->n, &l->cap, sizeof *l->v, 64) < 0)
        return -ENOMEM;
    r = &l->v[l->n];
    r->key = malloc(ki->len ? ki->len : 1);
    if (!r->key)
        return -ENOMEM;
    r->result_message = strdup(ki->result_message ? ki->result_message : "");
    if (!r->result_message) {
        free(r->key);
        return -ENOMEM;
    }
    memcpy(r->key, ki->key, ki->len);
    r->len = ki->len;
    r->state = ki->state;
    r->owner = ki->owner_pid;
    r->position = ki->position;
    r->ready_ns = ki->ready_ns;
    r->failures = ki->failures;
    r->priority = ki->priority;
    r->seq = ki->seq;
    r->tenant_len = ki->tenant_len <= ki->len ? ki->tenant_len : 0;
    r->result = ki->result;
    r->result_code = ki->result_code;
    l->n++;
    return 0;
}

/* wq_result states by name, as `result` and `dump` print them. */
static const char *const result_state_names[] = {
    [WQ_STATE_NONE] = "none",
    [WQ_STATE_PENDING] = "pending",
    [WQ_STATE_RUNNING] = "running",
    [WQ_STATE_SUCCEEDED] = "succeeded",
    [WQ_STATE_FAILED] = "failed",
};

static const char *result_state_name(enum wq_state s)
{
    if ((unsigned)s < sizeof result_state_names / sizeof result_state_names[0])
        return result_state_names[s];
    return "unknown";
}

static const struct {
    unsigned bit;
    const char *name;
} state_names[] = {
    { WQ_KEY_QUEUED, "queued" },
    { WQ_KEY_PROCESSING, "processing" },
    { WQ_KEY_WAITING, "waiting" },
    { WQ_KEY_DIRTY, "dirty" },
    { WQ_KEY_FAILING, "failing" },
};

#define N_STATES (sizeof state_names / sizeof state_names[0])

/* WQ_KEY_FAILING marks an idle key kept for a failure count or for a
   result: "failing" for the first, "idle" when only a result keeps it. */
static const char *state_bit_name(const struct dump_rec *r, size_t b)
{
    if (state_names[b].bit == WQ_KEY_FAILING && r->failures == 0)
        return "idle";
    return state_names[b].name;
}

/* CLOCK_MONOTONIC now, the clock of wq_key_info.ready_ns. */
static uint64_t now_mono(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The width of the TENANT column of a fair queue's dump. */
static size_t tenant_width(const struct dump_list *l)
{
    size_t w = 6;

    for (size_t i = 0; i < l->n; i++) {
        size_t tw = text_width(l->v[i].key, l->v[i].tenant_len);

        if (tw > w)
            w = tw;
    }
    return w;
}

/* A fair queue's columns: priority, add order, tenant ("-" if none). */
static void dump_fair_columns(const struct dump_rec *r, size_t tw)
{
    printf("%-8d %-10" PRIu32 " ", r->priority, r->seq);
    if (r->tenant_len) {
        put_text(stdout, r->key, r->tenant_len);
        printf("%*s ", (int)(tw - text_width(r->key, r->tenant_len)), "");
    } else {
        printf("%-*s ", (int)tw, "-");
    }
}

static void dump_print_text(const struct dump_list *l, uint64_t now, bool fair)
{
    size_t tw = fair ? tenant_width(l) : 0;

    printf("%-10s %-18s %-8s %-12s %-8s %-9s %-5s ", "POSITION", "STATE",
           "OWNER", "READY", "FAILURES", "RESULT", "CODE");
    if (fair)
        printf("%-8s %-10s %-*s ", "PRIORITY", "SEQ", (int)tw, "TENANT");
    printf("KEY\n");
    for (size_t i = 0; i < l->n; i++) {
        const struct dump_rec *r = &l->v[i];
        char state[64] = "", ready[32], code[16] = "-";

        for (size_t b = 0; b < N_STATES; b++) {
            if (!(r->state & state_names[b].bit))
                continue;
            if (state[0])
                strcat(state, ",");
            strcat(state, state_bit_name(r, b));
        }
        if (r->position == UINT64_MAX)
            printf("%-10s ", "-");
        else
            printf("%-10" PRIu64 " ", r->position);
        printf("%-18s ", state[0] ? state : "-");
        if (r->owner > 0)
            printf("%-8ld ", (long)r->owner);
        else
            printf("%-8s ", "-");
        printf("%-12s %-8" PRIu32 " ", (r->state & WQ_KEY_WAITING) ?
               format_ready_in(ready, sizeof ready, r->ready_ns, now) : "-",
               r->failures);
        /* The code of the last outcome: shown once there is one (a
           pending or running key shows how its previous run ended). */
        if (r->result == WQ_STATE_SUCCEEDED || r->result == WQ_STATE_FAILED ||
            r->result_code != 0 || r->result_message[0] != '\0')
            snprintf(code, sizeof code, "%d", r->result_code);
        printf("%-9s %-5s ", result_state_name(r->result), code);
        if (fair)
            dump_fair_columns(r, tw);
        put_text(stdout, r->key, r->len);
        putchar('\n');
    }
}

static void dump_print_json(const char *name, const struct dump_list *l,
                            uint64_t now, bool fair)
{
    printf("{\"name\":");
    put_json_str(stdout, name);
    printf(",\"keys\":[");
    for (size_t i = 0; i < l->n; i++) {
        const struct dump_rec *r = &l->v[i];
        bool first = true;

        printf("%s{\"key\":", i ? "," : "");
        put_json(stdout, r->key, r->len);
        printf(",\"state\":[");
        for (size_t b = 0; b < N_STATES; b++) {
            if (!(r->state & state_names[b].bit))
                continue;
            printf("%s\"%s\"", first ? "" : ",", state_bit_name(r, b));
            first = false;
        }
        printf("],\"position\":");
        if (r->position == UINT64_MAX)
            printf("null");
        else
            printf("%" PRIu64, r->position);
        printf(",\"owner_pid\":");
        if (r->owner > 0)
            printf("%ld", (long)r->owner);
        else
            printf("null");
        printf(",\"ready_in_ns\":");
        if (r->state & WQ_KEY_WAITING)
            printf("%" PRIu64, r->ready_ns > now ? r->ready_ns - now : 0);
        else
            printf("null");
        printf(",\"failures\":%" PRIu32 ",\"result\":\"%s\",\"result_code\":%d"
               ",\"result_message\":", r->failures, result_state_name(r->result),
               r->result_code);
        put_json_str(stdout, r->result_message);
        if (fair) {
            printf(",\"priority\":%d,\"tenant\":", r->priority);
            if (r->tenant_len)
                put_json(stdout, r->key, r->tenant_len);
            else
                printf("null");
            printf(",\"seq\":%" PRIu32, r->seq);
        }
        putchar('}');
    }
    printf("]}\n");
}

static int cmd_dump(const struct args *a)
{
    const char *name = a->pos[0];
    struct dump_list l = { 0 };
    struct wq_stats st;
    uint64_t now;
    wq *q;
    int rc;

    if ((rc = open_queue_stats(name, &q, &st)) != EXIT_OK)
        return rc;
    rc = wq_dump(q, collect_key, &l);
    now = now_mono();
    wq_close(q);
    if (rc < 0) {
        rc = rc == -ENOMEM ? out_of_memory() : queue_error(name, "dump", rc);
    } else {
        if (a->val[O_JSON])
            dump_print_json(name, &l, now, st.fair != 0);
        else
            dump_print_text(&l, now, st.fair != 0);
        rc = EXIT_OK;
    }
    for (size_t i = 0; i < l.n; i++) {
        free(l.v[i].key);
        free(l.v[i].result_message);
    }
    free(l.v);
    return rc;
}

/* ------------------------------------------------------------------ */
/* result                                                              */
/* ------------------------------------------------------------------ */

/* A CLOCK_REALTIME time in ns as ISO 8601 UTC with milliseconds. */
static void format_utc(char *buf, size_t cap, uint64_t ns)
{
    time_t sec = (time_t)(ns / 1000000000u);
    struct tm tm;

    if (!gmtime_r(&sec, &tm)) {
        snprintf(buf, cap, "?");
        return;
    }
    snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, (unsigned)(ns % 1000000000u / 1000000u));
}

static int cmd_result(const struct args *a)
{
    const char *name = a->pos[0];
    const char *key = a->pos[1];
    struct wq_result r;
    uint64_t max_key_len;
    char when[64] = "-";
    wq *q;
    int rc, err;

    if ((rc = open_queue_keys(name, &q, &max_key_len)) != EXIT_OK)
        return rc;
    if ((rc = check_keys(max_key_len, a->pos + 1, 1)) != EXIT_OK) {
        wq_close(q);
        return rc;
    }
    err = wq_result(q, key, strlen(key), &r);
    wq_close(q);
    if (err < 0)
        return queue_error(name, "result", err);
    r.message[sizeof r.message - 1] = '\0';
    if (r.updated_ns)
        format_utc(when, sizeof when, r.updated_ns);

    if (a->val[O_JSON]) {
        printf("{\"name\":");
        put_json_str(stdout, name);
        printf(",\"key\":");
        put_json_str(stdout, key);
        printf(",\"state\":\"%s\",\"code\":%d,\"updated\":",
               result_state_name(r.state), r.code);
        if (r.updated_ns)
            printf("\"%s\"", when);
        else
            printf("null");
        printf(",\"updated_ns\":%" PRIu64 ",\"message\":", r.updated_ns);
        put_json_str(stdout, r.message);
        printf("}\n");
    } else {
        printf("%-8s ", "key");
        put_text(stdout, key, strlen(key));
        printf("\n%-8s %s\n%-8s %d\n%-8s %s\n%-8s ", "state",
               result_state_name(r.state), "code", r.code, "updated", when,
               "message");
        put_text(stdout, r.message, strlen(r.message));
        putchar('\n');
    }
    return EXIT_OK;
}

/* ------------------------------------------------------------------ */
/* work                                                                */
/* ------------------------------------------------------------------ */

/*
 * `wqctl work` is a crash-safe, deduplicating `xargs -P`. Three kinds of
 * process take part:
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
    atomic_int emptied;                   /* monitor: it shut the queue down */
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

/* CMD's words with every "{}" replaced by the key; NULL-terminated. */
static char **work_argv(const struct work_conf *c, const char *key)
{
    size_t klen = strlen(key);
    char **argv = calloc(c->ncmd + 1, sizeof *argv);

    if (!argv)
        return NULL;
    for (size_t i = 0; i < c->ncmd; i++) {
        const char *w = c->cmd[i], *p;
        size_t len = strlen(w), hits = 0, k = 0;
        char *s;

        for (p = strstr(w, "{}"); p; p = strstr(p + 2, "{}"))
            hits++;
        s = malloc(len + hits * klen + 1 - hits * 2);
        if (!s) {
            while (i > 0)
                free(argv[--i]);
            free(argv);
            return NULL;
        }
        for (p = w; *p;) {
            if (p[0] == '{' && p[1] == '}') {
                memcpy(s + k, key, klen);
                k += klen;
                p += 2;
            } else {
                s[k++] = *p++;
            }
        }
        s[k] = '\0';
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
            if (c->exit_when_empty && !st.shutting_down &&
                st.queued + st.processing + st.waiting == 0) {
                wq_shutdown(q);
                atomic_store(&c->sh->emptied, 1);
            }
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

static int cmd_work(const struct args *a)
{
    const char *name = a->pos[0];
    struct work_conf c;
    struct work_shared *sh;
    struct sigaction old_pipe, ign;
    struct wq_stats st;
    uint32_t jobs, need;
    uint64_t t0;
    pid_t monitor = -1;
    wq *q;
    int rc, err;

    memset(&c, 0, sizeof c);
    if ((rc = work_options(a, &c, &jobs)) != EXIT_OK)
        return rc;
    c.progress = isatty(STDERR_FILENO) == 1;
    if ((rc = open_queue(name, &q)) != EXIT_OK)
        return rc;
    if ((rc = queue_stats(q, name, &st)) != EXIT_OK)
        return rc;
    /* Each worker, and the monitor, takes a process-table slot. */
    need = jobs + (c.progress || c.exit_when_empty);
    if (st.processes > st.max_procs || st.max_procs - st.processes < need) {
        fprintf(stderr, "wqctl: queue '");
        put_text(stderr, name, strlen(name));
        fprintf(stderr, "': -j %" PRIu32 " needs %" PRIu32 " free process "
                "slots, %" PRIu64 " of %" PRIu64 " are free (see create "
                "--max-procs)\n", jobs, need,
                st.max_procs > st.processes ? st.max_procs - st.processes : 0,
                st.max_procs);
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
    if (c.progress || c.exit_when_empty) {
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
    err = wq_run_workers(q, jobs, work_reconcile, &c);
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

/* ------------------------------------------------------------------ */
/* metrics                                                             */
/* ------------------------------------------------------------------ */

/*
 * The Prometheus text exposition format, version 0.0.4: for each metric
 * family a "# HELP" and a "# TYPE" line, then its samples, each labelled
 * name="<queue>". The names and help texts of the client-go metrics are
 * client-go's (k8s.io/component-base/metrics/prometheus/workqueue), so
 * dashboards and alerts written for controllers work unchanged. Several
 * queues are printed family by family (a family may appear only once).
 */

enum metric_kind { M_COUNTER, M_GAUGE, M_GAUGE_SECONDS, M_HISTOGRAM };

static const char *const metric_types[] = {
    [M_COUNTER] = "counter",
    [M_GAUGE] = "gauge",
    [M_GAUGE_SECONDS] = "gauge",
    [M_HISTOGRAM] = "histogram",
};

static const struct {
    const char *name;      /* after "workqueue_" */
    enum metric_kind kind; /* M_COUNTER, M_GAUGE: uint64_t; M_GAUGE_SECONDS:
                              double; M_HISTOGRAM: struct wq_histogram */
    size_t off;            /* in struct wq_metrics */
    const char *help;
} metric_defs[] = {
#define M(name, kind, field, help) { name, kind, offsetof(struct wq_metrics, field), help }
    M("depth", M_GAUGE, depth,
      "Current depth of workqueue"),
    M("adds_total", M_COUNTER, adds_total,
      "Total number of adds handled by workqueue"),
    M("queue_duration_seconds", M_HISTOGRAM, queue_duration,
      "How long in seconds an item stays in workqueue before being "
      "requested."),
    M("work_duration_seconds", M_HISTOGRAM, work_duration,
      "How long in seconds processing an item from workqueue takes."),
    M("unfinished_work_seconds", M_GAUGE_SECONDS, unfinished_work_seconds,
      "How many seconds of work has done that is in progress and hasn't "
      "been observed by work_duration. Large values indicate stuck "
      "threads. One can deduce the number of stuck threads by observing "
      "the rate at which this increases."),
    M("longest_running_processor_seconds", M_GAUGE_SECONDS,
      longest_running_processor_seconds,
      "How many seconds has the longest running processor for workqueue "
      "been running."),
    M("retries_total", M_COUNTER, retries_total,
      "Total number of retries handled by workqueue"),
    M("coalesced_adds_total", M_COUNTER, coalesced_total,
      "Total number of adds merged into a key that was already dirty or "
      "waiting (libwq)"),
    M("crash_requeues_total", M_COUNTER, crash_requeues_total,
      "Total number of keys queued again because the process holding "
      "them died (libwq)"),
    M("waiting", M_GAUGE, waiting,
      "Current number of keys waiting for their delay to pass (libwq)"),
    M("processing", M_GAUGE, processing,
      "Current number of keys handed out and not yet done (libwq)"),
#undef M
};

#define N_METRICS (sizeof metric_defs / sizeof metric_defs[0])

/* The le label of each wq_histogram bucket, as client_golang prints
   client-go's ExponentialBuckets(10e-9, 10, 10), then +Inf. */
static const char *const bucket_le[WQ_HIST_BUCKETS + 1] = {
    "1e-08", "1e-07", "1e-06", "1e-05", "0.0001", "0.001", "0.01", "0.1",
    "1", "10", "+Inf",
};

/* A label value: backslash, double quote and newline escaped. */
static void put_label_value(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\\\", f);
        else if (*s == '"')
            fputs("\\\"", f);
        else if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

/*
 * A sample value: the shortest %g that reads back as the same double,
 * or +Inf, -Inf, NaN. (wqctl never calls setlocale(): '.' it is.)
 */
static void put_float(FILE *f, double v)
{
    char buf[40];

    if (isnan(v)) {
        fputs("NaN", f);
        return;
    }
    if (isinf(v)) {
        fputs(v > 0 ? "+Inf" : "-Inf", f);
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    fputs(buf, f);
}

/* "workqueue_NAME[SUFFIX]{name="QUEUE"[,le="LE"]} " */
static void put_series(const char *metric, const char *suffix,
                       const char *queue, const char *le)
{
    printf("workqueue_%s%s{name=\"", metric, suffix);
    put_label_value(stdout, queue);
    if (le)
        printf("\",le=\"%s", le);
    printf("\"} ");
}

static void put_sample(size_t i, const char *queue, const struct wq_metrics *m)
{
    const char *p = (const char *)m + metric_defs[i].off;
    const char *metric = metric_defs[i].name;
    struct wq_histogram h;
    uint64_t u;
    double d;

    switch (metric_defs[i].kind) {
    case M_COUNTER:
    case M_GAUGE:
        memcpy(&u, p, sizeof u);
        put_series(metric, "", queue, NULL);
        printf("%" PRIu64 "\n", u);
        break;
    case M_GAUGE_SECONDS:
        memcpy(&d, p, sizeof d);
        put_series(metric, "", queue, NULL);
        put_float(stdout, d);
        putchar('\n');
        break;
    case M_HISTOGRAM:
        memcpy(&h, p, sizeof h);
        for (int b = 0; b <= WQ_HIST_BUCKETS; b++) {
            put_series(metric, "_bucket", queue, bucket_le[b]);
            printf("%" PRIu64 "\n", h.bucket[b]);
        }
        put_series(metric, "_sum", queue, NULL);
        put_float(stdout, h.sum_seconds);
        putchar('\n');
        put_series(metric, "_count", queue, NULL);
        printf("%" PRIu64 "\n", h.count);
        break;
    }
}

static void print_metrics(char **names, const struct wq_metrics *m, size_t n)
{
    for (size_t i = 0; i < N_METRICS; i++) {
        /* HELP text escapes backslash and newline; ours have neither. */
        printf("# HELP workqueue_%s %s\n", metric_defs[i].name,
               metric_defs[i].help);
        printf("# TYPE workqueue_%s %s\n", metric_defs[i].name,
               metric_types[metric_defs[i].kind]);
        for (size_t k = 0; k < n; k++)
            put_sample(i, names[k], &m[k]);
    }
}

/* Read every queue's metrics first: all or nothing is printed. */
static int cmd_metrics(const struct args *a)
{
    struct wq_metrics *m;
    int rc = EXIT_OK;

    for (size_t i = 0; i < a->npos; i++)
        for (size_t k = 0; k < i; k++)
            if (strcmp(a->pos[i], a->pos[k]) == 0)
                return usage_error(a->cmd, "queue '%s' given twice",
                                   a->pos[i]);
    m = calloc(a->npos, sizeof *m);
    if (!m)
        return out_of_memory();
    for (size_t i = 0; rc == EXIT_OK && i < a->npos; i++) {
        wq *q;
        int err;

        if ((rc = open_queue(a->pos[i], &q)) != EXIT_OK)
            break;
        err = wq_metrics(q, &m[i]);
        wq_close(q);
        if (err < 0)
            rc = queue_error(a->pos[i], "metrics", err);
    }
    if (rc == EXIT_OK)
        print_metrics(a->pos, m, a->npos);
    free(m);
    return rc;
}

/* ------------------------------------------------------------------ */
/* check                                                               */
/* ------------------------------------------------------------------ */

/* Violation reports, copied (the callback may run under the lock). */
struct check_reports {
    struct strv lines;
    bool oom;
};

static void collect_report(const char *what, void *arg)
{
    struct check_reports *r = arg;

    if (strv_push(&r->lines, what) < 0)
        r->oom = true;
}

static int cmd_check(const struct args *a)
{
    const char *name = a->pos[0];
    bool repair = a->val[O_REPAIR] != NULL;
    struct check_reports rep = { { 0 }, false };
    wq *q;
    int rc;

    if ((rc = open_queue(name, &q)) != EXIT_OK)
        return rc;
    rc = wq_check_report(q, repair ? WQ_CHECK_REPAIR : 0, collect_report, &rep);
    wq_close(q);
    if (rc < 0) {
        strv_free(&rep.lines);
        return queue_error(name, "check", rc);
    }

    if (a->val[O_JSON]) {
        printf("{\"name\":");
        put_json_str(stdout, name);
        printf(",\"violations\":%d,\"repaired\":%s,\"reports\":[", rc,
               repair && rc > 0 ? "true" : "false");
        for (size_t i = 0; i < rep.lines.n; i++) {
            if (i)
                putchar(',');
            put_json_str(stdout, rep.lines.v[i]);
        }
        printf("]}\n");
    } else {
        for (size_t i = 0; i < rep.lines.n; i++) {
            fputs("violation: ", stdout);
            put_text(stdout, rep.lines.v[i], strlen(rep.lines.v[i]));
            putchar('\n');
        }
        fputs("queue '", stdout);
        put_text(stdout, name, strlen(name));
        if (rc == 0)
            printf("': clean\n");
        else
            printf("': %d violation%s%s\n", rc, rc == 1 ? "" : "s",
                   repair ? ", repaired" : "");
    }
    if (rep.oom)
        fputs("wqctl: out of memory: some violation reports were lost\n",
              stderr);
    strv_free(&rep.lines);
    return rc == 0 ? EXIT_OK : EXIT_FAIL;
}

/* ------------------------------------------------------------------ */
/* shutdown, rm                                                        */
/* ------------------------------------------------------------------ */

static int cmd_shutdown(const struct args *a)
{
    const char *name = a->pos[0];
    bool drain = a->val[O_DRAIN] != NULL;
    int64_t timeout;
    wq *q;
    int rc;

    if (a->val[O_TIMEOUT] && !drain)
        return usage_error(a->cmd, "--timeout needs --drain");
    if (!opt_timeout(a, -1, &timeout))
        return EXIT_USAGE;
    if ((rc = open_queue(name, &q)) != EXIT_OK)
        return rc;
    if (drain)
        rc = wq_shutdown_drain(q, timeout);
    else
        rc = wq_shutdown(q);
    wq_close(q);
    if (rc < 0)
        return queue_error(name, drain ? "drain" : "shutdown", rc);
    return EXIT_OK;
}

static int cmd_rm(const struct args *a)
{
    const char *name = a->pos[0];
    int rc = wq_unlink(name);

    return rc < 0 ? queue_error(name, NULL, rc) : EXIT_OK;
}

/* ------------------------------------------------------------------ */
/* help, main                                                          */
/* ------------------------------------------------------------------ */

static int cmd_help(const struct args *a)
{
    const struct command *c;

    if (a->npos == 0) {
        print_usage(stdout);
        return EXIT_OK;
    }
    c = find_command(a->pos[0]);
    if (!c)
        return usage_error(NULL, "unknown command '%s'", a->pos[0]);
    print_command_usage(stdout, c);
    return EXIT_OK;
}

/* Report a failed write to stdout (a full disk, a closed pipe). */
static int finish_stdout(int rc)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "wqctl: write error: %s\n", strerror(errno));
        return rc == EXIT_OK ? EXIT_FAIL : rc;
    }
    return rc;
}

int main(int argc, char **argv)
{
    const struct command *c;
    struct args a;
    int rc;

    /* One write per message line, so that messages of concurrent wqctl
       processes sharing a terminal do not interleave mid-line. */
    setvbuf(stderr, NULL, _IOLBF, 0);

    if (argc < 2) {
        print_usage(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        print_usage(stdout);
        return finish_stdout(EXIT_OK);
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("wqctl (libwq) %s\n", PACKAGE_VERSION);
        return finish_stdout(EXIT_OK);
    }
    c = find_command(argv[1]);
    if (!c) {
        if (argv[1][0] == '-')
            return usage_error(NULL, "unknown option '%s'", argv[1]);
        return usage_error(NULL, "unknown command '%s'", argv[1]);
    }

    a.pos = calloc((size_t)argc, sizeof *a.pos);
    if (!a.pos)
        return out_of_memory();
    rc = parse_args(c, argc - 2, argv + 2, &a);
    if (rc == EXIT_OK && a.val[O_HELP])
        print_command_usage(stdout, c);
    else if (rc == EXIT_OK)
        rc = c->run(&a);
    free(a.pos);
    return finish_stdout(rc);
}
