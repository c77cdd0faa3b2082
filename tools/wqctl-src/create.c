/*
 * create.c - a queue's life cycle and its store: create, restore,
 * snapshot, rm.
 *
 * Design note. `create` and `restore` take the same creation options
 * (create_options), turned into a struct wq_options here. Where the
 * library would answer a bad combination with a bare -EINVAL (a limiter
 * parameter without its limiter, --durability without --store, ...),
 * these are usage errors that name the missing option.
 */
#include "wqctl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* create                                                              */
/* ------------------------------------------------------------------ */

/* The limiters by name, for --rl-limiters and for the errors that name
   the limiter an --rl-* parameter needs: why its parser is here and not
   in args.c with the others. */
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
                           opt_name(rl_params[i].opt),
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

const char *durability_name(uint64_t d)
{
    for (size_t i = 0; i < N_DURABILITY; i++)
        if ((uint64_t)durability_names[i].value == d)
            return durability_names[i].name;
    return NULL;
}

/*
 * --store, --durability and --snapshot-interval into o. The library
 * rejects a durability or an interval without a store, and an interval
 * without WQ_DURABLE_NONE or _FSYNC, with -EINVAL; here they are usage
 * errors that say which option is missing.
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
        if (o->durability != WQ_DURABLE_NONE && o->durability != WQ_DURABLE_FSYNC)
            return usage_error(a->cmd, "--snapshot-interval needs "
                               "--durability none or fsync");
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

static int store_error(const char *name, const char *dir, int err);

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

/* --exist-ok, and wq_open could not register: the queue exists with
   every process slot taken (a new queue's table is empty), and its
   options matched (they are compared before registering). An observer
   takes no slot and compares them again (a queue made anew in between):
   0 when they match, -EEXIST naming the one that differs. Anything else:
   the first open again, for its own error. */
static int exists_full(const char *name, const struct wq_options *o, wq **q)
{
    struct wq_options look = *o;
    int rc;

    look.flags = (o->flags & ~(unsigned)(WQ_CREATE | WQ_RESTORE)) | WQ_OBSERVE;
    rc = wq_open(name, &look, q);
    return rc == 0 || rc == -EEXIST ? rc : wq_open(name, o, q);
}

int cmd_create(const struct args *a)
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
    if (rc == -EUSERS && !(o.flags & WQ_EXCL))
        rc = exists_full(name, &o, &q);
    if (rc < 0)
        return store_error(name, o.store_path, rc);
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
    queue_msg(name);
    fputs("queue exists: restore only builds a missing queue; wqctl rm "
          "it first\n", stderr);
    return EXIT_FAIL;
}

/* One line of wq_store_salvage's report. */
static void salvage_line(const char *what, void *arg)
{
    (void)arg;
    fprintf(stderr, "wqctl: salvage: %s\n", what);
}

/* wq_open (or wq_store_salvage) with store DIR failed: fail() names the
   store or the queue, whichever is at fault; a damaged store gets the
   way out that keeps what still verifies. */
static int store_error(const char *name, const char *dir, int err)
{
    struct ectx c = { .queue = name, .store = dir, .detail = true };

    fail(&c, err);
    if (err == -EUCLEAN && dir) {
        fputs("wqctl: 'wqctl restore ", stderr);
        put_text(stderr, name, strlen(name));
        fputs(" --store ", stderr);
        put_text(stderr, dir, strlen(dir));
        fputs(" --salvage' keeps what verifies and moves the damaged store "
              "aside\n", stderr);
    }
    return EXIT_FAIL;
}

/*
 * Explicit restore: build the missing queue NAME from the store in DIR
 * (wq_open with WQ_CREATE|WQ_EXCL|WQ_RESTORE and store_path: the library
 * refuses a directory that holds no store instead of making an empty one;
 * geometry left out is taken from the store). Never into an existing queue: the check by name
 * comes first, so that the store is not even opened then, and WQ_EXCL
 * settles a race with another creator.
 */
int cmd_restore(const struct args *a)
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
    o.flags |= WQ_EXCL | WQ_RESTORE;
    if (wq_list(match_name, (void *)name) > 0)
        return queue_exists_error(name);

    if (a->val[O_SALVAGE]) {
        int kept = wq_store_salvage(o.store_path, &o, salvage_line, NULL);
        if (kept < 0) {
            struct ectx c = { .queue = name, .store = o.store_path,
                              .detail = true };
            return fail(&c, kept);   /* no second salvage advice */
        }
    }
    rc = wq_open(name, &o, &q);
    if (rc == -EEXIST)
        return queue_exists_error(name);
    if (rc < 0)
        return store_error(name, o.store_path, rc);
    if ((rc = queue_stats(q, name, &st)) != EXIT_OK)
        return rc;
    wq_close(q);
    print_restored(&st);
    return EXIT_OK;
}

int cmd_snapshot(const struct args *a)
{
    const char *name = a->pos[0];
    wq *q;
    int rc, n;

    if ((rc = open_queue(name, WQ_OBSERVE, &q)) != EXIT_OK)
        return rc;
    n = wq_snapshot(q);
    wq_close(q);
    if (n == -ENOENT) {
        queue_msg(name);
        fputs("snapshot: the queue has no store (it was created without "
              "--store)\n", stderr);
        return EXIT_FAIL;
    }
    if (n < 0) {
        struct ectx c = { .queue = name, .what = "snapshot", .detail = true };
        return fail(&c, n);
    }
    printf("wrote %d record%s\n", n, n == 1 ? "" : "s");
    return EXIT_OK;
}

/* ------------------------------------------------------------------ */
/* rm                                                                  */
/* ------------------------------------------------------------------ */

int cmd_rm(const struct args *a)
{
    const char *name = a->pos[0];
    int rc = wq_unlink(name);

    return rc < 0 ? queue_error(name, NULL, rc) : EXIT_OK;
}
