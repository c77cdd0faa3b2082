/*
 * keys.c - putting keys in and taking them out: add, get, forget,
 * requeues, and shutdown, which stops both.
 *
 * Design note. Keys are checked against the queue's max_key_len before
 * any is sent, so that an error names the argument or input line at
 * fault; `add` sends keys in batches (wq_add_many) unless a delay, rate
 * limiting or a priority makes it a key at a time.
 */
#include "wqctl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>

/* ------------------------------------------------------------------ */
/* add                                                                 */
/* ------------------------------------------------------------------ */

/* Keys read from stdin are handed to wq_add_many in batches of this size. */
#define ADD_BATCH 1024

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
    queue_msg(name);
    fputs("priorities need a fair queue (wqctl create --fair)\n", stderr);
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

int cmd_add(const struct args *a)
{
    struct add_state s = { .name = a->pos[0], .mode = ADD_NOW };
    bool from_stdin = a->npos == 2 && strcmp(a->pos[1], "-") == 0;
    struct wq_stats st;
    int rc;

    if ((rc = add_options(a, &s)) != EXIT_OK)
        return rc;
    if ((rc = open_queue_stats(s.name, 0, &s.q, &st)) != EXIT_OK)
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

int cmd_forget(const struct args *a)
{
    const char *name = a->pos[0];
    uint64_t max_key_len;
    wq *q;
    int rc;

    if ((rc = open_queue_keys(name, 0, &q, &max_key_len)) != EXIT_OK)
        return rc;
    rc = check_keys(max_key_len, a->pos + 1, a->npos - 1);
    for (size_t i = 1; rc == EXIT_OK && i < a->npos; i++) {
        int err = wq_forget(q, a->pos[i], strlen(a->pos[i]));
        struct ectx c = { .queue = name, .what = "forget", .key = a->pos[i],
                          .key_len = strlen(a->pos[i]) };

        if (err < 0)
            rc = fail(&c, err);
    }
    wq_close(q);
    return rc;
}

int cmd_requeues(const struct args *a)
{
    const char *name = a->pos[0];
    const char *key = a->pos[1];
    uint64_t max_key_len;
    wq *q;
    int rc, n;

    if ((rc = open_queue_keys(name, WQ_OBSERVE, &q, &max_key_len)) != EXIT_OK)
        return rc;
    if ((rc = check_keys(max_key_len, a->pos + 1, 1)) == EXIT_OK) {
        struct ectx c = { .queue = name, .what = "requeues", .key = key,
                          .key_len = strlen(key) };

        n = wq_num_requeues(q, key, strlen(key));
        if (n < 0)
            rc = fail(&c, n);
        else
            printf("%d\n", n);
    }
    wq_close(q);
    return rc;
}

/* ------------------------------------------------------------------ */
/* get                                                                 */
/* ------------------------------------------------------------------ */

/* Keys per wq_get_many of `get --count`: one buffer of this many longest
   keys, whatever the count. */
#define GET_BATCH 1024

int cmd_get(const struct args *a)
{
    const char *name = a->pos[0];
    uint64_t max_key_len;
    uint32_t count = 1, got = 0;
    int64_t timeout;
    char *buf;
    struct iovec *keys;
    wq *q;
    int rc, n = 0;

    if (!opt_timeout(a, 0, &timeout))
        return EXIT_USAGE;
    if (!opt_u32(a, O_NKEYS, 10, UINT32_MAX, &count))
        return EXIT_USAGE;
    if (count == 0)
        return usage_error(a->cmd, "bad value '0' for --count (at least 1)");
    if ((rc = set_key_output(a)) != EXIT_OK)
        return rc;
    if ((rc = open_queue_keys(name, 0, &q, &max_key_len)) != EXIT_OK)
        return rc;
    size_t per = count < GET_BATCH ? count : GET_BATCH;
    size_t size = per * (max_key_len ? max_key_len : 1);
    buf = malloc(size);
    keys = malloc(per * sizeof *keys);
    if (!buf || !keys) {
        free(buf);
        free(keys);
        wq_close(q);
        return out_of_memory();
    }

    /* Done before the caller's work runs: at most once (the man page says
       so; `work` is the at-least-once way). The first batch waits up to
       the timeout; the rest take what is queued then. */
    rc = EXIT_OK;
    while (got < count) {
        size_t want = count - got < per ? count - got : per;
        n = wq_get_many(q, buf, size, keys, want, got ? 0 : timeout);
        if (n <= 0)
            break;
        for (int i = 0; i < n; i++) {
            put_key(stdout, keys[i].iov_base, keys[i].iov_len);
            putchar(key_end());
        }
        got += (uint32_t)n;
        int d = wq_done_many(q, keys, (size_t)n);
        if (d < 0) {
            struct ectx c = { .queue = name, .what = "done" };
            rc = fail(&c, d);
            break;
        }
        if (d < n) {   /* only a lost lease (Redis) takes a key from us */
            fprintf(stderr, "wqctl: queue '%s': %d of the %d keys handed out were no longer "
                    "this process's at done (their lease was lost; they are handed out "
                    "again)\n", name, n - d, n);
            rc = EXIT_FAIL;
            break;
        }
    }
    if (rc == EXIT_OK && got == 0) {
        if (n == -EAGAIN || n == -ETIMEDOUT)
            rc = EXIT_FAIL; /* empty: print nothing */
        else
            rc = queue_error(name, "get", n);
    } else if (rc == EXIT_OK && n < 0 && n != -EAGAIN && n != -ETIMEDOUT &&
               n != -ESHUTDOWN) {
        rc = queue_error(name, "get", n);
    }
    free(keys);
    free(buf);
    wq_close(q);
    return rc;
}

/* ------------------------------------------------------------------ */
/* shutdown                                                            */
/* ------------------------------------------------------------------ */

int cmd_shutdown(const struct args *a)
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
    if ((rc = open_queue(name, WQ_OBSERVE, &q)) != EXIT_OK)
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

int cmd_resume(const struct args *a)
{
    const char *name = a->pos[0];
    wq *q;
    int rc;

    if ((rc = open_queue(name, WQ_OBSERVE, &q)) != EXIT_OK)
        return rc;
    rc = wq_resume(q);
    wq_close(q);
    if (rc < 0)
        return queue_error(name, "resume", rc);
    return EXIT_OK;
}
