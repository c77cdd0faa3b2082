/*
 * wqctl - inspect and drive libwq queues from the shell.
 *
 * Design note. One small function per command, dispatched from the
 * `commands` table; a table-driven argument parser (`parse_args`) checks
 * options and positional counts before a command runs, so every command
 * body starts from validated input. The tool uses nothing but <wq.h>.
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
 * 2 usage error.
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
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>

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
    O_HELP,
    O_COUNT
};

#define OPT(id) (1u << (id))

struct opt_def {
    const char *name; /* long name, without "--" */
    bool has_arg;     /* takes a value: "--name VALUE" or "--name=VALUE" */
};

static const struct opt_def opt_defs[O_COUNT] = {
    [O_CAPACITY]    = { "capacity", true },
    [O_MAX_KEY_LEN] = { "max-key-len", true },
    [O_MAX_PROCS]   = { "max-procs", true },
    [O_MODE]        = { "mode", true },
    [O_EXIST_OK]    = { "exist-ok", false },
    [O_JSON]        = { "json", false },
    [O_TIMEOUT]     = { "timeout", true },
    [O_REPAIR]      = { "repair", false },
    [O_DRAIN]       = { "drain", false },
    [O_HELP]        = { "help", false },
};

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
    unsigned opts;          /* OPT() bits this command accepts */
    size_t min_pos, max_pos;
    const char *synopsis;   /* what follows "wqctl <name> " */
    const char *summary;
};

static int cmd_create(const struct args *a);
static int cmd_ls(const struct args *a);
static int cmd_stat(const struct args *a);
static int cmd_add(const struct args *a);
static int cmd_get(const struct args *a);
static int cmd_dump(const struct args *a);
static int cmd_check(const struct args *a);
static int cmd_shutdown(const struct args *a);
static int cmd_rm(const struct args *a);
static int cmd_help(const struct args *a);

static const struct command commands[] = {
    { "create", cmd_create,
      OPT(O_CAPACITY) | OPT(O_MAX_KEY_LEN) | OPT(O_MAX_PROCS) | OPT(O_MODE) |
      OPT(O_EXIST_OK), 1, 1,
      "NAME [--capacity N] [--max-key-len N] [--max-procs N] [--mode OCTAL] [--exist-ok]",
      "create a queue" },
    { "ls", cmd_ls, OPT(O_JSON), 0, 0,
      "[--json]",
      "list the queues on this machine" },
    { "stat", cmd_stat, OPT(O_JSON), 1, 1,
      "NAME [--json]",
      "show a queue's counters" },
    { "add", cmd_add, 0, 2, SIZE_MAX,
      "NAME [--] KEY... | NAME -",
      "add keys (\"-\": one key per line from stdin)" },
    { "get", cmd_get, OPT(O_TIMEOUT), 1, 1,
      "NAME [--timeout DUR]",
      "take one key, print it and mark it done" },
    { "dump", cmd_dump, OPT(O_JSON), 1, 1,
      "NAME [--json]",
      "list every live key with its state" },
    { "check", cmd_check, OPT(O_REPAIR) | OPT(O_JSON), 1, 1,
      "NAME [--repair] [--json]",
      "verify (and repair) a queue's invariants" },
    { "shutdown", cmd_shutdown, OPT(O_DRAIN) | OPT(O_TIMEOUT), 1, 1,
      "NAME [--drain [--timeout DUR]]",
      "shut a queue down, optionally waiting for it to drain" },
    { "rm", cmd_rm, 0, 1, 1,
      "NAME",
      "remove a queue" },
    { "help", cmd_help, 0, 0, 1,
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
               " m, h;\nno unit means seconds) or \"forever\".\n"
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

/* Option --timeout as nanoseconds; def when absent. */
static bool opt_timeout(const struct args *a, int64_t def, int64_t *out)
{
    const char *s = a->val[O_TIMEOUT];

    *out = def;
    if (s && !parse_duration(s, out)) {
        usage_error(a->cmd, "bad duration '%s' for --timeout "
                    "(e.g. 0, 100ms, 2s, 1m, forever)", s);
        return false;
    }
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
            a->pos[a->npos++] = w;
            continue;
        }
        if (strcmp(w, "--") == 0) {
            options_done = true;
            continue;
        }
        if (strcmp(w, "-h") == 0) {
            a->val[O_HELP] = "";
            continue;
        }
        if (w[1] != '-')
            return usage_error(c, "unknown option '%s'", w);

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

/* A growable array of byte strings (names, report lines). */
struct strv {
    char **v;
    size_t n, cap;
};

static int strv_push(struct strv *sv, const char *s)
{
    char *dup;

    if (sv->n == sv->cap) {
        size_t cap = sv->cap ? 2 * sv->cap : 16;
        char **v = realloc(sv->v, cap * sizeof *v);

        if (!v)
            return -ENOMEM;
        sv->v = v;
        sv->cap = cap;
    }
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

static int cmd_create(const struct args *a)
{
    const char *name = a->pos[0];
    struct wq_options o = { 0 };
    uint32_t mode = 0;
    wq *q;
    int rc;

    if (!opt_u32(a, O_CAPACITY, 10, WQ_MAX_CAPACITY, &o.capacity) ||
        !opt_u32(a, O_MAX_KEY_LEN, 10, WQ_MAX_KEY_LEN, &o.max_key_len) ||
        !opt_u32(a, O_MAX_PROCS, 10, WQ_MAX_PROCS, &o.max_procs) ||
        !opt_u32(a, O_MODE, 8, 0777, &mode))
        return EXIT_USAGE;
    o.mode = (mode_t)mode;
    o.flags = WQ_CREATE | (a->val[O_EXIST_OK] ? 0 : WQ_EXCL);

    rc = wq_open(name, &o, &q);
    if (rc < 0)
        return queue_error(name, NULL, rc);
    wq_close(q);
    return EXIT_OK;
}

/* ------------------------------------------------------------------ */
/* stat                                                                */
/* ------------------------------------------------------------------ */

static const struct {
    const char *name;
    size_t off;
    bool is_bool;
} stat_fields[] = {
#define F(f) { #f, offsetof(struct wq_stats, f), false }
    F(queued), F(processing), F(waiting), F(live), F(capacity),
    F(processes), F(adds_total), F(coalesced_total), F(retries_total),
    F(crash_requeues_total), F(repairs_total), F(max_key_len),
    F(max_procs), F(region_bytes),
#undef F
    { "shutting_down", offsetof(struct wq_stats, shutting_down), true },
};

static uint64_t stat_value(const struct wq_stats *st, size_t i)
{
    uint64_t v;

    memcpy(&v, (const char *)st + stat_fields[i].off, sizeof v);
    return v;
}

static void print_stats_text(const char *name, const struct wq_stats *st)
{
    printf("%-21s ", "name");
    put_text(stdout, name, strlen(name));
    putchar('\n');
    for (size_t i = 0; i < sizeof stat_fields / sizeof stat_fields[0]; i++) {
        uint64_t v = stat_value(st, i);

        if (stat_fields[i].is_bool)
            printf("%-21s %s\n", stat_fields[i].name, v ? "yes" : "no");
        else
            printf("%-21s %" PRIu64 "\n", stat_fields[i].name, v);
    }
}

static void print_stats_json(const char *name, const struct wq_stats *st)
{
    printf("{\"name\":");
    put_json_str(stdout, name);
    for (size_t i = 0; i < sizeof stat_fields / sizeof stat_fields[0]; i++) {
        uint64_t v = stat_value(st, i);

        printf(",\"%s\":", stat_fields[i].name);
        if (stat_fields[i].is_bool)
            printf("%s", v ? "true" : "false");
        else
            printf("%" PRIu64, v);
    }
    printf("}\n");
}

static int cmd_stat(const struct args *a)
{
    const char *name = a->pos[0];
    struct wq_stats st;
    wq *q;
    int rc;

    if ((rc = open_queue(name, &q)) != EXIT_OK)
        return rc;
    if ((rc = queue_stats(q, name, &st)) != EXIT_OK)
        return rc;
    wq_close(q);
    if (a->val[O_JSON])
        print_stats_json(name, &st);
    else
        print_stats_text(name, &st);
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

/* Running totals of an `add`. */
struct add_state {
    wq *q;
    const char *name;
    uint64_t max_key_len;
    uint64_t added, coalesced;
};

/* Add one batch with wq_add_many; EXIT_OK or EXIT_FAIL (reported). */
static int add_batch(struct add_state *s, const struct iovec *keys, size_t n)
{
    int rc;

    if (n == 0)
        return EXIT_OK;
    rc = wq_add_many(s->q, keys, n);
    if (rc < 0)
        return queue_error(s->name, "add", rc);
    s->coalesced += (uint64_t)rc;
    s->added += n - (size_t)rc;
    return EXIT_OK;
}

/* Check a key's length before sending it, to say which key is wrong. */
static int check_key(const struct add_state *s, size_t len, const char *where,
                     uint64_t index)
{
    if (len == 0) {
        fprintf(stderr, "wqctl: %s %" PRIu64 ": empty key\n", where, index);
        return EXIT_FAIL;
    }
    if (len > s->max_key_len) {
        fprintf(stderr, "wqctl: %s %" PRIu64 ": key of %zu bytes is longer "
                "than max_key_len (%" PRIu64 ")\n", where, index, len,
                s->max_key_len);
        return EXIT_FAIL;
    }
    return EXIT_OK;
}

/* Keys from the command line: all validated first, so none or all go in. */
static int add_from_args(struct add_state *s, char **keys, size_t n)
{
    struct iovec iov[ADD_BATCH];
    size_t k = 0;
    int rc;

    for (size_t i = 0; i < n; i++)
        if ((rc = check_key(s, strlen(keys[i]), "key", i + 1)) != EXIT_OK)
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
        if ((rc = check_key(s, (size_t)len, "line", lineno)) != EXIT_OK) {
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

static int cmd_add(const struct args *a)
{
    struct add_state s = { .name = a->pos[0] };
    struct wq_stats st;
    bool from_stdin = a->npos == 2 && strcmp(a->pos[1], "-") == 0;
    int rc;

    if ((rc = open_queue(s.name, &s.q)) != EXIT_OK)
        return rc;
    if ((rc = queue_stats(s.q, s.name, &st)) != EXIT_OK)
        return rc;
    s.max_key_len = st.max_key_len;

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
/* get                                                                 */
/* ------------------------------------------------------------------ */

static int cmd_get(const struct args *a)
{
    const char *name = a->pos[0];
    struct wq_stats st;
    int64_t timeout;
    char *buf;
    wq *q;
    int rc, n;

    if (!opt_timeout(a, 0, &timeout))
        return EXIT_USAGE;
    if ((rc = open_queue(name, &q)) != EXIT_OK)
        return rc;
    if ((rc = queue_stats(q, name, &st)) != EXIT_OK)
        return rc;
    buf = malloc(st.max_key_len ? st.max_key_len : 1);
    if (!buf) {
        wq_close(q);
        return out_of_memory();
    }

    n = wq_get(q, buf, st.max_key_len, timeout);
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
};

struct dump_list {
    struct dump_rec *v;
    size_t n, cap;
};

static int collect_key(const struct wq_key_info *ki, void *arg)
{
    struct dump_list *l = arg;
    struct dump_rec *r;

    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        struct dump_rec *v = realloc(l->v, cap * sizeof *v);

        if (!v)
            return -ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    r = &l->v[l->n];
    r->key = malloc(ki->len ? ki->len : 1);
    if (!r->key)
        return -ENOMEM;
    memcpy(r->key, ki->key, ki->len);
    r->len = ki->len;
    r->state = ki->state;
    r->owner = ki->owner_pid;
    r->position = ki->position;
    l->n++;
    return 0;
}

static const struct {
    unsigned bit;
    const char *name;
} state_names[] = {
    { WQ_KEY_QUEUED, "queued" },
    { WQ_KEY_PROCESSING, "processing" },
    { WQ_KEY_DIRTY, "dirty" },
};

#define N_STATES (sizeof state_names / sizeof state_names[0])

static void dump_print_text(const struct dump_list *l)
{
    printf("%-10s %-18s %-8s %s\n", "POSITION", "STATE", "OWNER", "KEY");
    for (size_t i = 0; i < l->n; i++) {
        const struct dump_rec *r = &l->v[i];
        char state[64] = "";

        for (size_t b = 0; b < N_STATES; b++) {
            if (!(r->state & state_names[b].bit))
                continue;
            if (state[0])
                strcat(state, ",");
            strcat(state, state_names[b].name);
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
        put_text(stdout, r->key, r->len);
        putchar('\n');
    }
}

static void dump_print_json(const char *name, const struct dump_list *l)
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
            printf("%s\"%s\"", first ? "" : ",", state_names[b].name);
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
        putchar('}');
    }
    printf("]}\n");
}

static int cmd_dump(const struct args *a)
{
    const char *name = a->pos[0];
    struct dump_list l = { 0 };
    wq *q;
    int rc;

    if ((rc = open_queue(name, &q)) != EXIT_OK)
        return rc;
    rc = wq_dump(q, collect_key, &l);
    wq_close(q);
    if (rc < 0) {
        rc = rc == -ENOMEM ? out_of_memory() : queue_error(name, "dump", rc);
    } else {
        if (a->val[O_JSON])
            dump_print_json(name, &l);
        else
            dump_print_text(&l);
        rc = EXIT_OK;
    }
    for (size_t i = 0; i < l.n; i++)
        free(l.v[i].key);
    free(l.v);
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
