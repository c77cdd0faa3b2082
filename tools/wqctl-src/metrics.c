/*
 * metrics.c - `wqctl metrics`: the Prometheus text exposition format,
 * version 0.0.4.
 *
 * Design note. For each metric family a "# HELP" and a "# TYPE" line,
 * then its samples, each labelled name="<queue>". The names and help
 * texts of the client-go metrics are client-go's
 * (k8s.io/component-base/metrics/prometheus/workqueue), so dashboards
 * and alerts written for controllers work unchanged. Several queues are
 * printed family by family (a family may appear only once). A file of
 * its own: the format shares nothing with the other commands' output
 * but the queue name.
 */
#include "wqctl.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
int cmd_metrics(const struct args *a)
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
