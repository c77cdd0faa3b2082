/*
 * out.c - how wqctl writes: escaping, error messages, growable arrays.
 *
 * Design note. Keys and queue names are bytes, not text, so nothing is
 * printed raw: text output goes through put_text, JSON through put_json
 * (see the rules in main.c). Every message about a queue starts with
 * queue_msg, so that the name is escaped alike in all of them. Errors
 * print to stderr and return the exit status, so a command can end with
 * `return queue_error(...)`.
 */
#include "wqctl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Escaping                                                            */
/* ------------------------------------------------------------------ */

/* Text: printable ASCII as is, backslash as \\, anything else as \xNN. */
void put_text(FILE *f, const void *p, size_t len)
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
size_t text_width(const void *p, size_t len)
{
    const unsigned char *s = p;
    size_t w = 0;

    for (size_t i = 0; i < len; i++)
        w += s[i] == '\\' ? 2 : (s[i] >= 0x20 && s[i] < 0x7f) ? 1 : 4;
    return w;
}

/* A JSON string literal; bytes outside printable ASCII become \u00XX. */
void put_json(FILE *f, const void *p, size_t len)
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

void put_json_str(FILE *f, const char *s)
{
    put_json(f, s, strlen(s));
}

/*
 * Keys on stdout. A script wants the key's bytes as they are (what
 * `key=$(wqctl get q)` hands back to wqctl must be the key), a person at
 * a terminal wants to see a tab or an escape sequence rather than have it
 * act: so raw when stdout is not a terminal and escaped (put_text) on
 * one, as redis-cli does; --raw and --escaped force either. -0 ends each
 * record with a NUL instead of a newline, for keys that hold newlines
 * (and implies --raw unless --escaped is given).
 */
static bool keys_raw;
static int keys_end = '\n';

int set_key_output(const struct args *a)
{
    if (a->val[O_RAW] && a->val[O_ESCAPED])
        return usage_error(a->cmd, "--raw and --escaped exclude each other");
    if (a->val[O_JSON] && (a->val[O_RAW] || a->val[O_ESCAPED] || a->val[O_NUL]))
        return usage_error(a->cmd, "--%s is for text output, not --json",
                           a->val[O_RAW] ? "raw" : a->val[O_ESCAPED] ?
                           "escaped" : "null (-0)");
    keys_end = a->val[O_NUL] ? '\0' : '\n';
    if (a->val[O_RAW] || a->val[O_ESCAPED])
        keys_raw = a->val[O_RAW] != NULL;
    else
        keys_raw = a->val[O_NUL] || !isatty(STDOUT_FILENO);
    return EXIT_OK;
}

void put_key(FILE *f, const void *p, size_t len)
{
    if (keys_raw)
        fwrite(p, 1, len, f);
    else
        put_text(f, p, len);
}

size_t key_width(const void *p, size_t len)
{
    return keys_raw ? len : text_width(p, len);
}

int key_end(void)
{
    return keys_end;
}

/* ------------------------------------------------------------------ */
/* Errors                                                              */
/* ------------------------------------------------------------------ */

/* A usage error in command c (or at top level when c is NULL): exit 2. */
int usage_error(const struct command *c, const char *fmt, ...)
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

/* Start a message about queue NAME on stderr: "wqctl: queue 'NAME': ". */
void queue_msg(const char *name)
{
    fputs("wqctl: queue '", stderr);
    put_text(stderr, name, strlen(name));
    fputs("': ", stderr);
}

static bool is_redis(const char *name)
{
    return name && strncmp(name, "redis://", 8) == 0;
}

/*
 * What err means for the object the failed call was about, when the
 * library said no more (wq_last_error ""). wq_strerror's wording covers
 * every use of an errno ("no such queue, or key not processing"); here
 * the context picks the one use that applies, and advice is given only
 * where it applies (check --repair for a region that exists, not for one
 * a create never built).
 */
const char *err_cause(const struct ectx *c, int err)
{
    bool shm = !is_redis(c->queue);

    switch (err < 0 ? -err : err) {
    case ENOENT:
        return c->key ? "key is not processing" : "no such queue";
    case EEXIST:
        return "queue exists";
    case EACCES:
        return "permission denied";
    case ENOTDIR:
        return "not a directory";
    case ENAMETOOLONG:
        return "path too long";
    case ENODATA:
        return "holds no store (nothing to restore)";
    case EUCLEAN:
        return "damaged or foreign store";
    case EPROTO:
        return shm ? "not a libwq region of this version (foreign, truncated or "
                     "damaged)" : wq_strerror(err);
    case EBADMSG:
        /* Only an existing queue can be repaired (and `check` is the
           repair). */
        if (!c->what || strcmp(c->what, "check") == 0)
            return "corrupt region";
        return "corrupt region (wqctl check --repair rebuilds it)";
    case ENOSPC:
        if (!c->what)
            return shm ? "no room in /dev/shm for its region" : wq_strerror(err);
        if (strcmp(c->what, "add") == 0)
            return "queue is full (it holds capacity live keys)";
        if (strcmp(c->what, "snapshot") == 0)
            return "no room in the store (disk or LMDB map full)";
        return wq_strerror(err);
    case EUSERS:
        return shm ? "process table full (max_procs handles attached)"
                   : wq_strerror(err);
    case EINVAL:
        return "invalid argument";
    default:
        return wq_strerror(err);
    }
}

/* The object an errno without a library description is about: the store
   for the errors only a store gives, else the queue. */
static bool about_store(const struct ectx *c, int err)
{
    return c->store && (err == -ENOTDIR || err == -ENAMETOOLONG ||
                        err == -ENODATA || err == -EUCLEAN);
}

/*
 * Report a failed call: "wqctl: OBJECT: CAUSE", where OBJECT is the
 * thing at fault (queue 'NAME', store 'DIR', key 'KEY' of a queue) and
 * CAUSE what is wrong with it. The library's description
 * (wq_last_error), where the call sets one, names both itself and is
 * printed as it is ("store '/x': not a directory"). Returns EXIT_FAIL.
 */
int fail(const struct ectx *c, int err)
{
    const char *more = c->detail || is_redis(c->queue) ? wq_last_error() : "";
    /* A shared-memory queue says which room it lacks: its capacity, or
       pages in /dev/shm for its region to grow. */
    if (err == -ENOSPC && !more[0] && strncmp(wq_last_error(), "queue '", 7) == 0)
        more = wq_last_error();

    fputs("wqctl: ", stderr);
    if (more[0] && (strncmp(more, "queue '", 7) == 0 ||
                    strncmp(more, "store '", 7) == 0)) {
        put_text(stderr, more, strlen(more));
    } else {
        if (about_store(c, err)) {
            fputs("store '", stderr);
            put_text(stderr, c->store, strlen(c->store));
            fputs("': ", stderr);
        } else {
            fputs("queue '", stderr);
            put_text(stderr, c->queue, strlen(c->queue));
            fputs("': ", stderr);
            if (c->key) {
                fputs("key '", stderr);
                put_text(stderr, c->key, c->key_len);
                fputs("': ", stderr);
            }
        }
        if (c->what)
            fprintf(stderr, "%s: ", c->what);
        fputs(err_cause(c, err), stderr);
        if (more[0]) {   /* a Redis server's words */
            fputs(" (", stderr);
            put_text(stderr, more, strlen(more));
            fputc(')', stderr);
        }
    }
    if (err == -EPROTO && !is_redis(c->queue) && c->queue) {
        fputs(" (wqctl rm ", stderr);
        put_text(stderr, c->queue, strlen(c->queue));
        fputs(" removes it)", stderr);
    }
    fputc('\n', stderr);
    return EXIT_FAIL;
}

/* fail() for queue NAME: WHAT is the operation after opening it, NULL
   for wq_open itself (whose description wq_last_error holds). */
int queue_error(const char *name, const char *what, int err)
{
    struct ectx c = { .queue = name, .what = what, .detail = what == NULL };

    return fail(&c, err);
}

int out_of_memory(void)
{
    fputs("wqctl: out of memory\n", stderr);
    return EXIT_FAIL;
}

/* Report a failed write to stdout (a full disk, a closed pipe). */
int finish_stdout(int rc)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "wqctl: write error: %s\n", strerror(errno));
        return rc == EXIT_OK ? EXIT_FAIL : rc;
    }
    return rc;
}

/* ------------------------------------------------------------------ */
/* Growable arrays                                                     */
/* ------------------------------------------------------------------ */

/* Make room for one more element in a growable array (*arr, n used of
   *cap): doubles it, starting at `first`. 0 or -ENOMEM. */
int grow(void **arr, size_t n, size_t *cap, size_t elem, size_t first)
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

int strv_push(struct strv *sv, const char *s)
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

void strv_free(struct strv *sv)
{
    for (size_t i = 0; i < sv->n; i++)
        free(sv->v[i]);
    free(sv->v);
}
