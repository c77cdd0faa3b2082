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

/* "wqctl: queue 'NAME': [WHAT: ]<wq_strerror text>"; returns EXIT_FAIL. */
int queue_error(const char *name, const char *what, int err)
{
    queue_msg(name);
    if (what)
        fprintf(stderr, "%s: ", what);
    /* wq_last_error: the object and the cause, when libwq knows more. */
    const char *more = wq_last_error();
    if (more[0])
        fprintf(stderr, "%s (%s)\n", wq_strerror(err), more);
    else
        fprintf(stderr, "%s\n", wq_strerror(err));
    return EXIT_FAIL;
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
