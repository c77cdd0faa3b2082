/*
 * args.c - the options wqctl knows, and the parsing of their values.
 *
 * Design note. One table (`opt_defs`) names every option; each command
 * says which it accepts (struct command.opts) and `parse_args` checks a
 * command line against that before the command runs. The value parsers
 * (opt_*) are here as well, not with their commands, so that the
 * options' syntax and their "bad value" messages are in one place and
 * read alike (--rl-limiters excepted: see create.c).
 */
#include "wqctl.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    [O_SALVAGE]     = { "salvage", false, 0 },
    [O_RAW]         = { "raw", false, 0 },
    [O_ESCAPED]     = { "escaped", false, 0 },
    [O_NUL]         = { "null", false, '0' },
    [O_ALL]         = { "all", false, 0 },
    [O_LISTEN]      = { "listen", true, 0 },
    [O_INTERVAL]    = { "interval", true, 0 },
    [O_ONCE]        = { "once", false, 0 },
    [O_NKEYS]       = { "count", true, 'n' },
    [O_HELP]        = { "help", false, 'h' },
};

/* Option o's long name, without "--", for messages. */
const char *opt_name(enum opt_id o)
{
    return opt_defs[o].name;
}

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
bool opt_u32(const struct args *a, enum opt_id o, int base,
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
bool opt_duration(const struct args *a, enum opt_id o,
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
bool opt_timeout(const struct args *a, int64_t def, int64_t *out)
{
    return opt_duration(a, O_TIMEOUT, true, def, out);
}

/* A delay option (not "forever") into *out; an absent one leaves it. */
bool opt_delay(const struct args *a, enum opt_id o, uint64_t *out)
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
bool opt_qps(const struct args *a, double *out)
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

/* Option --priority: a decimal int, with an optional '-'. */
bool opt_priority(const struct args *a, int *out)
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
 * Parse argv[0..argc) (the words after the command name) for command c.
 * Options may appear anywhere; "--" ends them; "-" is a positional.
 * Returns EXIT_OK, or EXIT_USAGE after printing why. a->pos must have
 * room for argc entries.
 */
int parse_args(const struct command *c, int argc, char **argv,
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
