/*
 * metrics.c - `wqctl metrics`: the Prometheus text exposition format,
 * version 0.0.4, printed once or served over HTTP (http.c).
 *
 * Design note. A scrape (metrics_scrape) reads every queue afresh: it
 * attaches, takes wq_metrics and wq_stats, and closes, so its numbers
 * are those of the moment, and a queue removed since the last scrape is
 * simply not there (no handle is kept on a region that was unlinked).
 * Without names it lists the machine's queues (wq_list) at each scrape,
 * so new queues appear and removed ones drop out. A queue that cannot be
 * read is passed to a report callback and left out: it never blanks the
 * others. The text goes into memory and is handed back whole, so the
 * text command prints it at once and the HTTP server sends it with its
 * length.
 *
 * Families, in the order of `families`: each has its "# HELP" and
 * "# TYPE" lines once, then the samples of every queue, labelled
 * name="<queue>" (wq_name: a redis:// name without its password).
 * client-go's metrics keep client-go's names and help texts
 * (k8s.io/component-base/metrics/prometheus/workqueue), so dashboards and
 * alerts written for controllers work unchanged. libwq's own families
 * share the workqueue_ prefix: the first ones shipped that way, and
 * renaming them would break the dashboards already built on them.
 * Counters end in _total, durations are in seconds.
 */
#include "wqctl.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum metric_kind { M_COUNTER, M_GAUGE, M_GAUGE_SECONDS, M_HISTOGRAM };

static const char *const metric_types[] = {
    [M_COUNTER] = "counter",
    [M_GAUGE] = "gauge",
    [M_GAUGE_SECONDS] = "gauge",
    [M_HISTOGRAM] = "histogram",
};

/* One queue's numbers, as one scrape read them. */
struct qread {
    char *label;          /* wq_name(), malloc'd */
    struct wq_metrics m;
    struct wq_stats st;
};

static const struct family {
    const char *name;
    enum metric_kind kind; /* M_COUNTER, M_GAUGE: uint64_t; M_GAUGE_SECONDS:
                              double; M_HISTOGRAM: struct wq_histogram */
    size_t off;            /* in struct qread */
    const char *help;
} families[] = {
#define M(name, kind, field, help) { name, kind, offsetof(struct qread, field), help }
    /* client-go's */
    M("workqueue_depth", M_GAUGE, m.depth,
      "Current depth of workqueue"),
    M("workqueue_adds_total", M_COUNTER, m.adds_total,
      "Total number of adds handled by workqueue"),
    M("workqueue_queue_duration_seconds", M_HISTOGRAM, m.queue_duration,
      "How long in seconds an item stays in workqueue before being "
      "requested."),
    M("workqueue_work_duration_seconds", M_HISTOGRAM, m.work_duration,
      "How long in seconds processing an item from workqueue takes."),
    M("workqueue_unfinished_work_seconds", M_GAUGE_SECONDS,
      m.unfinished_work_seconds,
      "How many seconds of work has done that is in progress and hasn't "
      "been observed by work_duration. Large values indicate stuck "
      "threads. One can deduce the number of stuck threads by observing "
      "the rate at which this increases."),
    M("workqueue_longest_running_processor_seconds", M_GAUGE_SECONDS,
      m.longest_running_processor_seconds,
      "How many seconds has the longest running processor for workqueue "
      "been running."),
    M("workqueue_retries_total", M_COUNTER, m.retries_total,
      "Total number of retries handled by workqueue"),
    /* libwq's */
    M("workqueue_coalesced_adds_total", M_COUNTER, m.coalesced_total,
      "Total number of adds merged into a key that was already dirty or "
      "waiting (libwq)"),
    M("workqueue_crash_requeues_total", M_COUNTER, m.crash_requeues_total,
      "Total number of keys queued again because the process holding "
      "them died (libwq)"),
    M("workqueue_waiting", M_GAUGE, m.waiting,
      "Current number of keys waiting for their delay to pass (libwq)"),
    M("workqueue_processing", M_GAUGE, m.processing,
      "Current number of keys handed out and not yet done (libwq)"),
    M("workqueue_rate_limit_delay_seconds", M_HISTOGRAM, m.rate_limit_delay,
      "Delays in seconds the rate limiter chose, for rate-limited adds "
      "and crash requeues (libwq)"),
    M("workqueue_live_keys", M_GAUGE, st.live,
      "Current number of keys using a slot: queued, processing or "
      "waiting (libwq)"),
    M("workqueue_capacity", M_GAUGE, st.capacity,
      "Maximum number of live keys the queue holds (libwq)"),
    M("workqueue_attached_processes", M_GAUGE, st.processes,
      "Current number of live handles attached to the queue, the "
      "scraping wqctl not counted; Redis: holders of an unexpired lease "
      "(libwq)"),
    M("workqueue_shutting_down", M_GAUGE, st.shutting_down,
      "1 from a shutdown of the queue until it is resumed, else 0 (libwq)"),
#undef M
};

#define N_FAMILIES (sizeof families / sizeof families[0])

/* The le label of each wq_histogram bucket, as client_golang prints
   client-go's ExponentialBuckets(10e-9, 10, 10), then +Inf. */
static const char *const bucket_le[WQ_HIST_BUCKETS + 1] = {
    "1e-08", "1e-07", "1e-06", "1e-05", "0.0001", "0.001", "0.01", "0.1",
    "1", "10", "+Inf",
};

/*
 * Escape s as the exposition format wants it: backslash and newline
 * always, the double quote in label values only (a HELP text keeps it).
 * libwq's names never hold any of them ([A-Za-z0-9._-], and a Redis
 * host), but the format must not depend on that staying true.
 */
static void put_escaped(FILE *f, const char *s, bool label)
{
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\\\", f);
        else if (*s == '\n')
            fputs("\\n", f);
        else if (*s == '"' && label)
            fputs("\\\"", f);
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

/* "NAME[SUFFIX]{name="QUEUE"[,le="LE"]} " */
static void put_series(FILE *f, const char *metric, const char *suffix,
                       const char *queue, const char *le)
{
    fprintf(f, "%s%s{name=\"", metric, suffix);
    put_escaped(f, queue, true);
    if (le)
        fprintf(f, "\",le=\"%s", le);
    fputs("\"} ", f);
}

static void put_samples(FILE *f, const struct family *fam,
                        const struct qread *r)
{
    const char *p = (const char *)r + fam->off;
    struct wq_histogram h;
    uint64_t u;
    double d;

    /* memcpy: off comes from a table, and the fields differ in type. */
    switch (fam->kind) {
    case M_COUNTER:
    case M_GAUGE:
        memcpy(&u, p, sizeof u);
        put_series(f, fam->name, "", r->label, NULL);
        fprintf(f, "%" PRIu64 "\n", u);
        break;
    case M_GAUGE_SECONDS:
        memcpy(&d, p, sizeof d);
        put_series(f, fam->name, "", r->label, NULL);
        put_float(f, d);
        fputc('\n', f);
        break;
    case M_HISTOGRAM:
        memcpy(&h, p, sizeof h);
        for (int b = 0; b <= WQ_HIST_BUCKETS; b++) {
            put_series(f, fam->name, "_bucket", r->label, bucket_le[b]);
            fprintf(f, "%" PRIu64 "\n", h.bucket[b]);
        }
        put_series(f, fam->name, "_sum", r->label, NULL);
        put_float(f, h.sum_seconds);
        fputc('\n', f);
        put_series(f, fam->name, "_count", r->label, NULL);
        fprintf(f, "%" PRIu64 "\n", h.count);
        break;
    }
}

/* Family by family, each queue's samples in turn. Nothing at all
   without a queue: a family with no sample says nothing true. */
static void put_exposition(FILE *f, const struct qread *r, size_t n)
{
    if (n == 0)
        return;
    for (size_t i = 0; i < N_FAMILIES; i++) {
        fprintf(f, "# HELP %s ", families[i].name);
        put_escaped(f, families[i].help, false);
        fprintf(f, "\n# TYPE %s %s\n", families[i].name,
                metric_types[families[i].kind]);
        for (size_t k = 0; k < n; k++)
            put_samples(f, &families[i], &r[k]);
    }
}

/*
 * "[WHAT: ]<cause>": wq_last_error when libwq gave one (it names the
 * object and the cause), else wq_strerror's wording; but "no such
 * queue" for wq_open's -ENOENT (what == NULL), the error a scrape meets
 * most, whose wq_strerror wording is about keys as much as queues.
 */
static void why(char *buf, size_t size, const char *what, int err)
{
    const char *more = wq_last_error();
    const char *cause = wq_strerror(err);

    if (more[0])
        cause = more;
    else if (!what && err == -ENOENT)
        cause = "no such queue";
    snprintf(buf, size, "%s%s%s", what ? what : "", what ? ": " : "", cause);
}

/*
 * Read one queue into *r: 0, or a negative errno with its message in
 * msg. The handle is closed before returning.
 */
static int read_queue(const char *name, struct qread *r, char *msg,
                      size_t size)
{
    const char *what = NULL;
    wq *q;
    int err;

    memset(r, 0, sizeof *r);
    /* An observer takes no process slot: a scrape works when workers
       hold every slot, and is not counted among the attached processes
       (so parallel scrapes need no serialising either). */
    if ((err = observe_queue(name, &q)) < 0) {
        why(msg, size, NULL, err);
        return err;
    }
    if ((err = wq_metrics(q, &r->m)) < 0)
        what = "metrics";
    else if ((err = wq_stats(q, &r->st)) < 0)
        what = "stats";
    else if (!(r->label = strdup(wq_name(q))))
        err = -ENOMEM;
    if (err < 0)
        why(msg, size, what, err);
    wq_close(q);
    return err;
}

static int collect_name(const char *name, void *arg)
{
    return strv_push(arg, name) < 0 ? -ENOMEM : 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int metrics_scrape(char **names, size_t n, scrape_report_fn report,
                   void *arg, char **text, size_t *len)
{
    struct strv all = { 0 };
    struct qread *r = NULL;
    size_t nread = 0;
    bool listed = !names;
    char msg[512];
    FILE *f;
    int err = 0;

    *text = NULL;
    *len = 0;
    if (listed) {
        if ((err = wq_list(collect_name, &all)) < 0)
            goto out;
        /* Sorted, so that scrapes list the queues in a stable order. */
        if (all.n)   /* qsort(NULL, 0, ...) is undefined */
            qsort(all.v, all.n, sizeof *all.v, by_name);
        names = all.v;
        n = all.n;
    }
    if (n && !(r = calloc(n, sizeof *r))) {
        err = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        int e = read_queue(names[i], &r[nread], msg, sizeof msg);

        if (e == 0)
            nread++;
        /* A listed queue removed before it was read is simply gone. */
        if (report && !(e == -ENOENT && listed) &&
            report(names[i], e, e == 0 ? "" : msg, arg) != 0) {
            err = -ECANCELED;
            goto out;
        }
    }
    if (!(f = open_memstream(text, len))) {
        err = -ENOMEM;
        goto out;
    }
    put_exposition(f, r, nread);
    if (ferror(f))
        err = -ENOMEM;
    if (fclose(f) != 0)
        err = -ENOMEM;
    if (err < 0) {
        free(*text);
        *text = NULL;
        *len = 0;
    }
out:
    for (size_t i = 0; i < nread; i++)
        free(r[i].label);
    free(r);
    strv_free(&all);
    return err;
}

/* The text command's report: the usual message; the exit status 1. */
static int report_stderr(const char *name, int err, const char *msg,
                         void *arg)
{
    if (err < 0) {
        queue_msg(name);
        fprintf(stderr, "%s\n", msg);
        *(int *)arg = EXIT_FAIL;
    }
    return 0;
}

int cmd_metrics(const struct args *a)
{
    int rc = EXIT_OK;
    char *text;
    size_t len;
    int err;

    for (size_t i = 0; i < a->npos; i++)
        for (size_t k = 0; k < i; k++)
            if (strcmp(a->pos[i], a->pos[k]) == 0)
                return usage_error(a->cmd, "queue '%s' given twice",
                                   a->pos[i]);
    if (a->val[O_ALL] && a->npos)
        return usage_error(a->cmd, "--all and queue names exclude each "
                           "other");
    if (a->val[O_LISTEN])
        return metrics_listen(a->val[O_LISTEN], a->npos ? a->pos : NULL,
                              a->npos, a->cmd);
    if (!a->val[O_ALL] && a->npos == 0)
        return usage_error(a->cmd, "missing argument (queue names, or "
                           "--all)");
    err = metrics_scrape(a->val[O_ALL] ? NULL : a->pos, a->npos,
                         report_stderr, &rc, &text, &len);
    if (err == -ENOMEM)
        return out_of_memory();
    if (err < 0) {
        fprintf(stderr, "wqctl: metrics: cannot list the queues: %s\n",
                wq_strerror(err));
        return EXIT_FAIL;
    }
    fwrite(text, 1, len, stdout);
    free(text);
    return rc;
}
