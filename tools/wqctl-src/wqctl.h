/*
 * wqctl.h - what the files of wqctl share (main.c has the map of them).
 *
 * Design note. Only what crosses a file boundary is declared here; all
 * else stays static in its file. Like the rest of wqctl, this header
 * uses nothing of libwq's but the public <wq.h>.
 */
#ifndef WQCTL_H
#define WQCTL_H

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <wq.h>

/* Exit statuses (`work` has one more: see main.c). */
enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

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
    O_SALVAGE,
    O_RAW,
    O_ESCAPED,
    O_NUL,
    O_ALL,
    O_LISTEN,
    O_INTERVAL,
    O_ONCE,
    O_NKEYS,
    O_HELP,
    O_COUNT
};

_Static_assert(O_COUNT <= 64, "command option masks are 64 bits");

#define OPT(id) (UINT64_C(1) << (id))

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

/* ---- args.c ---- */

int parse_args(const struct command *c, int argc, char **argv,
               struct args *a);
const char *opt_name(enum opt_id o);

/* The option value parsers: true, or false after printing a usage error.
   An absent option leaves *out as is, or sets def where there is one. */
bool opt_u32(const struct args *a, enum opt_id o, int base, uint64_t max,
             uint32_t *out);
bool opt_duration(const struct args *a, enum opt_id o, bool allow_forever,
                  int64_t def, int64_t *out);
bool opt_timeout(const struct args *a, int64_t def, int64_t *out);
bool opt_delay(const struct args *a, enum opt_id o, uint64_t *out);
bool opt_qps(const struct args *a, double *out);
bool opt_priority(const struct args *a, int *out);

/* ---- out.c ---- */

void put_text(FILE *f, const void *p, size_t len);
size_t text_width(const void *p, size_t len);
void put_json(FILE *f, const void *p, size_t len);
void put_json_str(FILE *f, const char *s);

/* Keys on stdout: raw bytes or escaped as put_text (set_key_output). */
int set_key_output(const struct args *a);
void put_key(FILE *f, const void *p, size_t len);
size_t key_width(const void *p, size_t len);
int key_end(void);   /* what ends a record that holds a key: '\n' or NUL */

int usage_error(const struct command *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void queue_msg(const char *name);

/* What a failed libwq call was about, for fail()'s message. */
struct ectx {
    const char *queue;   /* the queue's name */
    const char *store;   /* the --store DIR the call used, or NULL */
    const char *what;    /* the operation on an open queue ("add"), or
                            NULL for opening (or creating) it */
    const void *key;     /* the key the call was about, or NULL */
    size_t key_len;
    bool detail;         /* the call sets wq_last_error (wq_open,
                            wq_unlink, wq_snapshot, wq_store_salvage) */
};
const char *err_cause(const struct ectx *c, int err);
int fail(const struct ectx *c, int err);
int queue_error(const char *name, const char *what, int err);
int out_of_memory(void);
int finish_stdout(int rc);

/* A growable array of byte strings (names, report lines). */
struct strv {
    char **v;
    size_t n, cap;
};

int grow(void **arr, size_t n, size_t *cap, size_t elem, size_t first);
int strv_push(struct strv *sv, const char *s);
void strv_free(struct strv *sv);

/* ---- queue.c ---- */

int open_queue(const char *name, unsigned flags, wq **q);
int observe_queue(const char *name, wq **q);
int queue_stats(wq *q, const char *name, struct wq_stats *st);
int open_queue_stats(const char *name, unsigned flags, wq **q, struct wq_stats *st);
int open_queue_keys(const char *name, unsigned flags, wq **q, uint64_t *max_key_len);
int check_key(uint64_t max_key_len, size_t len, const char *where,
              uint64_t index);
int check_keys(uint64_t max_key_len, char **keys, size_t n);
uint64_t now_mono(void);

/* ---- the commands ---- */

/* create.c */
int cmd_create(const struct args *a);
int cmd_restore(const struct args *a);
int cmd_snapshot(const struct args *a);
int cmd_rm(const struct args *a);
const char *durability_name(uint64_t d);

/* inspect.c */
int cmd_ls(const struct args *a);
int cmd_stat(const struct args *a);
int cmd_dump(const struct args *a);
int cmd_result(const struct args *a);
int cmd_check(const struct args *a);

/* metrics.c: the exposition, for the text command and the HTTP server */
int cmd_metrics(const struct args *a);

/* top.c */
int cmd_top(const struct args *a);

/* How metrics_scrape tells of each queue: err 0 and msg "" once read;
   else the negative errno and why, in words (the queue is left out).
   Non-zero stops the scrape. */
typedef int (*scrape_report_fn)(const char *name, int err, const char *msg,
                                void *arg);

/*
 * One scrape of names[0..n), or, when names is NULL, of every queue on
 * this machine (wq_list, at this call; sorted by name; a queue removed
 * between the listing and its reading is left out without a report).
 * Each queue is passed to report, when not NULL. Thread safe. Returns 0
 * with the exposition in *text (*len bytes, malloc'd, not
 * NUL-terminated; empty when no queue was read), or a negative errno:
 * -ENOMEM, wq_list's error, or -ECANCELED (report said stop).
 */
int metrics_scrape(char **names, size_t n, scrape_report_fn report,
                   void *arg, char **text, size_t *len);

/* http.c: metrics --listen. names NULL: every queue, at each scrape.
   Returns when SIGINT or SIGTERM comes (EXIT_OK), or the exit status of
   a usage error or a failure to listen, already reported. */
int metrics_listen(const char *listen, char **names, size_t n,
                   const struct command *c);

/* keys.c */
int cmd_add(const struct args *a);
int cmd_get(const struct args *a);
int cmd_forget(const struct args *a);
int cmd_requeues(const struct args *a);
int cmd_shutdown(const struct args *a);
int cmd_resume(const struct args *a);

/* work.c */
int cmd_work(const struct args *a);

#endif /* WQCTL_H */
