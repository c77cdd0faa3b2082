/*
 * wqctl - inspect and drive libwq queues from the shell.
 *
 * Design note. main.c owns the command table, dispatch and the help
 * texts; the commands live in files by group (create.c, inspect.c,
 * metrics.c with its HTTP server http.c, keys.c, work.c), their shared
 * pieces in args.c, out.c and queue.c (wqctl.h says what crosses
 * files). One small function per command, dispatched from the
 * `commands` table; a table-driven argument parser (`parse_args`)
 * checks options and positional counts before a command runs, so every
 * command body starts from validated input. The
 * tool uses nothing but <wq.h> (and the C library: CLOCK_MONOTONIC, the
 * clock of wq_key_info.ready_ns, to show how soon a waiting key is
 * ready; stat(2), for `restore` to tell a missing store directory from
 * one that holds no store; and, for `work`, the POSIX and Linux process calls it needs to
 * run commands: see the note in work.c; libmicrohttpd and sockets for
 * `metrics --listen`: see http.c).
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
#include "wqctl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

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

/* How the commands that print keys print them (out.c: set_key_output). */
#define KEY_OPTS (OPT(O_RAW) | OPT(O_ESCAPED))

/* The options of `create` and `restore` after NAME in their synopses. */
#define CREATE_SYNOPSIS                                                     \
    "                    [--result-capacity N] [--mode OCTAL] [--no-metrics]\n" \
    "                    [--rl-limiters LIST] [--rl-base DUR] [--rl-max DUR]\n" \
    "                    [--rl-qps X] [--rl-burst N]\n"                     \
    "                    [--rl-fast DUR] [--rl-slow DUR] [--rl-max-fast N]\n" \
    "                    [--durability process|fsync|none]\n"               \
    "                    [--snapshot-interval DUR]\n"                       \
    "                    [--fair [--fair-share N] [--tenant-sep C|none]]"

static int cmd_help(const struct args *a);

static const struct command commands[] = {
    { "create", cmd_create, CREATE_OPTS | OPT(O_EXIST_OK), 1, 1, 0,
      "NAME [--capacity N] [--max-key-len N] [--max-procs N]\n"
      "                    [--exist-ok] [--store DIR]\n"
      CREATE_SYNOPSIS,
      "create a queue" },
    { "restore", cmd_restore, CREATE_OPTS | OPT(O_SALVAGE), 1, 1, 0,
      "NAME --store DIR [--salvage] [--capacity N] [--max-key-len N]\n"
      "                    [--max-procs N]\n"
      CREATE_SYNOPSIS,
      "build a missing queue from its store" },
    { "snapshot", cmd_snapshot, 0, 1, 1, 0,
      "NAME",
      "write what the queue's store lacks, now" },
    { "ls", cmd_ls, OPT(O_JSON), 0, 1, 0,
      "[redis://HOST[:PORT]] [--json]",
      "list the queues on this machine, or on a Redis server" },
    { "stat", cmd_stat, OPT(O_JSON) | KEY_OPTS, 1, 1, 0,
      "NAME [--json | --raw | --escaped]",
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
    { "result", cmd_result, OPT(O_JSON) | KEY_OPTS, 2, 2, 0,
      "NAME [--json | --raw | --escaped] [--] KEY",
      "print how a key's last run ended (wq_result)" },
    { "get", cmd_get, OPT(O_TIMEOUT) | OPT(O_NKEYS) | KEY_OPTS | OPT(O_NUL), 1, 1, 0,
      "NAME [--timeout DUR] [-n N] [--raw | --escaped] [-0]",
      "take one key (or up to N), print it and mark it done (at most once)" },
    { "work", cmd_work,
      OPT(O_JOBS) | OPT(O_TIMEOUT) | OPT(O_REQUEUE_STATUS) |
      OPT(O_REQUEUE_AFTER) | OPT(O_EXIT_WHEN_EMPTY), 2, SIZE_MAX, 1,
      "NAME [-j N] [--timeout DUR] [--requeue-status S]\n"
      "                  [--requeue-after DUR] [--exit-when-empty]\n"
      "                  [--] CMD [ARG...]",
      "run CMD once per key, N at a time ({}: the key, {q}: quoted)" },
    { "dump", cmd_dump, OPT(O_JSON) | KEY_OPTS | OPT(O_NUL), 1, 1, 0,
      "NAME [--json | [--raw | --escaped] [-0]]",
      "list every key with its state" },
    { "metrics", cmd_metrics, OPT(O_ALL) | OPT(O_LISTEN), 0, SIZE_MAX, 0,
      "{NAME... | --all}\n"
      "       wqctl metrics --listen HOST:PORT [NAME... | --all]",
      "print or serve (--listen) metrics for Prometheus" },
    { "top", cmd_top, OPT(O_INTERVAL) | OPT(O_ONCE), 0, SIZE_MAX, 0,
      "[NAME...] [--interval DUR] [--once]",
      "a live view of the queues (q quits); --once prints one frame" },
    { "check", cmd_check, OPT(O_REPAIR) | OPT(O_JSON), 1, 1, 0,
      "NAME [--repair] [--json]",
      "verify (and repair) a queue's invariants" },
    { "shutdown", cmd_shutdown, OPT(O_DRAIN) | OPT(O_TIMEOUT), 1, 1, 0,
      "NAME [--drain [--timeout DUR]]",
      "shut a queue down, optionally waiting for it to drain" },
    { "resume", cmd_resume, 0, 1, 1, 0,
      "NAME",
      "end a shutdown: adds and gets work again, no key lost" },
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
