/*
 * inspect.c - looking at a queue: ls, stat, dump, result, check.
 *
 * Design note. Each command reads what it needs (wq_stats, wq_dump,
 * wq_result, wq_check_report) into memory first and prints after, in
 * text or, with --json, as one JSON object. wq_dump and
 * wq_check_report call back under the region lock: their callbacks here
 * only copy, so that a slow reader of our output never stalls the
 * queue's other processes.
 */
#include "wqctl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

/*
 * Remaining time until a CLOCK_MONOTONIC instant, as "in 1.234s"
 * (rounded up to the millisecond, so it never reads 0 before it is
 * due) or "now" once it has passed.
 */
static const char *format_ready_in(char *buf, size_t cap, uint64_t ready_ns,
                                   uint64_t now_ns)
{
    uint64_t ns, ms;

    if (ready_ns <= now_ns)
        return "now";
    ns = ready_ns - now_ns;
    ms = ns / 1000000 + (ns % 1000000 != 0);
    snprintf(buf, cap, "in %" PRIu64 ".%03" PRIu64 "s", ms / 1000, ms % 1000);
    return buf;
}

/* ------------------------------------------------------------------ */
/* stat                                                                */
/* ------------------------------------------------------------------ */

enum stat_kind {
    S_NUM,        /* a counter */
    S_BOOL,       /* 0 or 1: no/yes, false/true */
    S_NEXT_READY  /* next_ready_ns relative to now_ns; "-"/null if none */
};

static const struct {
    const char *name;   /* text output */
    const char *json;   /* JSON member */
    size_t off;
    enum stat_kind kind;
} stat_fields[] = {
#define F(f) { #f, #f, offsetof(struct wq_stats, f), S_NUM }
    F(queued), F(processing), F(waiting), F(failing),
    { "next_ready", "next_ready_in_ns", offsetof(struct wq_stats, next_ready_ns),
      S_NEXT_READY },
    F(live), F(capacity), F(results), F(result_capacity),
    F(processes), F(adds_total), F(coalesced_total), F(retries_total),
    F(crash_requeues_total), F(repairs_total), F(max_key_len),
    F(max_procs), F(region_bytes), F(region_used),
#undef F
    { "shutting_down", "shutting_down", offsetof(struct wq_stats, shutting_down),
      S_BOOL },
};

#define N_STAT_FIELDS (sizeof stat_fields / sizeof stat_fields[0])

static uint64_t stat_value(const struct wq_stats *st, size_t i)
{
    uint64_t v;

    memcpy(&v, (const char *)st + stat_fields[i].off, sizeof v);
    return v;
}

/* ---- fair mode: the queued keys by priority and by tenant ---- */

#define STAT_TOP_TENANTS 10   /* tenants `stat` lists; the rest are counted */

/* One queued key of a fair queue: its priority and a copy of its tenant
   (the key's first tenant_len bytes; NULL when it has none). */
struct fair_key {
    int priority;
    char *tenant;
    size_t tenant_len;
};

/* Queued keys of one priority, or of one tenant. */
struct fair_group {
    int priority;
    const char *tenant;
    size_t tenant_len;
    uint64_t n;
};

struct fair_view {
    struct fair_key *keys;      /* as wq_dump handed them out */
    size_t nkeys, cap;
    struct fair_group *prio;    /* highest priority first */
    size_t nprio;
    struct fair_group *tenant;  /* deepest tenant first */
    size_t ntenant;
};

/* wq_dump callback (under the lock: copies only). The queued keys come
   first, so the walk stops at the first other key. */
static int collect_fair(const struct wq_key_info *ki, void *arg)
{
    struct fair_view *v = arg;
    struct fair_key *k;

    if (!(ki->state & WQ_KEY_QUEUED))
        return 1;
    if (grow((void **)&v->keys, v->nkeys, &v->cap, sizeof *v->keys, 64) < 0)
        return -ENOMEM;
    k = &v->keys[v->nkeys];
    k->priority = ki->priority;
    k->tenant_len = ki->tenant_len <= ki->len ? ki->tenant_len : 0;
    k->tenant = NULL;
    if (k->tenant_len) {
        k->tenant = malloc(k->tenant_len);
        if (!k->tenant)
            return -ENOMEM;
        memcpy(k->tenant, ki->key, k->tenant_len);
    }
    v->nkeys++;
    return 0;
}

static int cmp_bytes(const void *x, size_t xn, const void *y, size_t yn)
{
    size_t n = xn < yn ? xn : yn;
    int c = n ? memcmp(x, y, n) : 0;   /* x or y may be NULL when empty */

    return c ? c : (xn > yn) - (xn < yn);
}

static int cmp_key_priority(const void *x, const void *y)
{
    const struct fair_key *a = x, *b = y;

    return (a->priority < b->priority) - (a->priority > b->priority);
}

static int cmp_key_tenant(const void *x, const void *y)
{
    const struct fair_key *a = x, *b = y;

    return cmp_bytes(a->tenant, a->tenant_len, b->tenant, b->tenant_len);
}

/* Deepest first; ties by tenant, so the output is stable. */
static int cmp_group_depth(const void *x, const void *y)
{
    const struct fair_group *a = x, *b = y;

    if (a->n != b->n)
        return a->n < b->n ? 1 : -1;
    return cmp_bytes(a->tenant, a->tenant_len, b->tenant, b->tenant_len);
}

/* Group the collected keys: by priority, and by tenant (keys without a
   tenant, as with --tenant-sep none, are in no tenant group). */
static int fair_view_build(struct fair_view *v)
{
    size_t n = v->nkeys;

    v->prio = calloc(n ? n : 1, sizeof *v->prio);
    v->tenant = calloc(n ? n : 1, sizeof *v->tenant);
    if (!v->prio || !v->tenant)
        return -ENOMEM;
    if (n == 0)
        return 0;
    qsort(v->keys, n, sizeof *v->keys, cmp_key_priority);
    for (size_t i = 0; i < n; i++) {
        if (v->nprio == 0 ||
            v->prio[v->nprio - 1].priority != v->keys[i].priority)
            v->prio[v->nprio++].priority = v->keys[i].priority;
        v->prio[v->nprio - 1].n++;
    }
    qsort(v->keys, n, sizeof *v->keys, cmp_key_tenant);
    for (size_t i = 0; i < n; i++) {
        const struct fair_key *k = &v->keys[i];
        struct fair_group *g = v->ntenant ? &v->tenant[v->ntenant - 1] : NULL;

        if (k->tenant_len == 0)
            continue;
        if (!g || cmp_bytes(g->tenant, g->tenant_len, k->tenant,
                            k->tenant_len) != 0) {
            g = &v->tenant[v->ntenant++];
            g->tenant = k->tenant;
            g->tenant_len = k->tenant_len;
        }
        g->n++;
    }
    qsort(v->tenant, v->ntenant, sizeof *v->tenant, cmp_group_depth);
    return 0;
}

static void fair_view_free(struct fair_view *v)
{
    for (size_t i = 0; i < v->nkeys; i++)
        free(v->keys[i].tenant);
    free(v->keys);
    free(v->prio);
    free(v->tenant);
}

/* ---- printing ---- */

static void print_stats_text(const char *name, const struct wq_stats *st,
                             const struct fair_view *fv)
{
    const char *dur = durability_name(st->durability);
    char buf[32];

    printf("%-21s ", "name");
    put_text(stdout, name, strlen(name));
    putchar('\n');
    for (size_t i = 0; i < N_STAT_FIELDS; i++) {
        uint64_t v = stat_value(st, i);

        printf("%-21s ", stat_fields[i].name);
        switch (stat_fields[i].kind) {
        case S_NUM:
            printf("%" PRIu64 "\n", v);
            break;
        case S_BOOL:
            printf("%s\n", v ? "yes" : "no");
            break;
        case S_NEXT_READY:
            printf("%s\n", v ? format_ready_in(buf, sizeof buf, v, st->now_ns)
                             : "-");
            break;
        }
    }
    printf("%-21s %s\n", "mode", st->fair ? "fair" : "default");
    printf("%-21s %s\n", "store", st->has_store ? "yes" : "no");
    if (!st->has_store)
        printf("%-21s -\n%-21s -\n", "durability", "store_unsynced");
    else if (dur)
        printf("%-21s %s\n%-21s %" PRIu64 "\n", "durability", dur,
               "store_unsynced", st->store_unsynced);
    else
        printf("%-21s %" PRIu64 "\n%-21s %" PRIu64 "\n", "durability",
               st->durability, "store_unsynced", st->store_unsynced);
    if (!fv)
        return;
    printf("queued_by_priority\n");
    for (size_t i = 0; i < fv->nprio; i++)
        printf("  %-19d %" PRIu64 "\n", fv->prio[i].priority, fv->prio[i].n);
    printf("queued_by_tenant\n");
    for (size_t i = 0; i < fv->ntenant && i < STAT_TOP_TENANTS; i++) {
        const struct fair_group *g = &fv->tenant[i];
        size_t w = key_width(g->tenant, g->tenant_len);

        fputs("  ", stdout);
        put_key(stdout, g->tenant, g->tenant_len);
        printf("%*s %" PRIu64 "\n", w < 19 ? (int)(19 - w) : 0, "", g->n);
    }
    if (fv->ntenant > STAT_TOP_TENANTS)
        printf("  (%zu more)\n", fv->ntenant - STAT_TOP_TENANTS);
}

static void print_stats_json(const char *name, const struct wq_stats *st,
                             const struct fair_view *fv)
{
    const char *dur = durability_name(st->durability);

    printf("{\"name\":");
    put_json_str(stdout, name);
    for (size_t i = 0; i < N_STAT_FIELDS; i++) {
        uint64_t v = stat_value(st, i);

        printf(",\"%s\":", stat_fields[i].json);
        switch (stat_fields[i].kind) {
        case S_NUM:
            printf("%" PRIu64, v);
            break;
        case S_BOOL:
            printf("%s", v ? "true" : "false");
            break;
        case S_NEXT_READY:
            if (v == 0)
                printf("null");
            else
                printf("%" PRIu64, v > st->now_ns ? v - st->now_ns : 0);
            break;
        }
    }
    printf(",\"fair\":%s,\"store\":", st->fair ? "true" : "false");
    if (!st->has_store)
        printf("null");
    else if (dur)
        printf("{\"durability\":\"%s\",\"unsynced\":%" PRIu64 "}", dur,
               st->store_unsynced);
    else
        printf("{\"durability\":%" PRIu64 ",\"unsynced\":%" PRIu64 "}",
               st->durability, st->store_unsynced);
    if (!fv) {
        printf(",\"priorities\":null,\"tenants\":null,\"tenants_more\":null}\n");
        return;
    }
    printf(",\"priorities\":{");
    for (size_t i = 0; i < fv->nprio; i++)
        printf("%s\"%d\":%" PRIu64, i ? "," : "", fv->prio[i].priority,
               fv->prio[i].n);
    printf("},\"tenants\":{");
    for (size_t i = 0; i < fv->ntenant && i < STAT_TOP_TENANTS; i++) {
        if (i)
            putchar(',');
        put_json(stdout, fv->tenant[i].tenant, fv->tenant[i].tenant_len);
        printf(":%" PRIu64, fv->tenant[i].n);
    }
    printf("},\"tenants_more\":%zu}\n", fv->ntenant > STAT_TOP_TENANTS ?
           fv->ntenant - STAT_TOP_TENANTS : 0);
}

/*
 * The counters, and on a fair queue the queued keys by priority and by
 * tenant, computed here from wq_dump (the library keeps no such counts):
 * a second look, so under load the two can differ by a few keys.
 */
int cmd_stat(const struct args *a)
{
    const char *name = a->pos[0];
    struct fair_view fv = { 0 };
    struct wq_stats st;
    wq *q;
    int rc, err = 0;

    if ((rc = set_key_output(a)) != EXIT_OK)
        return rc;
    if ((rc = open_queue(name, WQ_OBSERVE, &q)) != EXIT_OK)
        return rc;
    if ((rc = queue_stats(q, name, &st)) != EXIT_OK)
        return rc;
    if (st.fair)
        err = wq_dump(q, collect_fair, &fv);
    wq_close(q);
    if (err >= 0 && st.fair)
        err = fair_view_build(&fv);
    if (err < 0) {
        fair_view_free(&fv);
        return err == -ENOMEM ? out_of_memory()
                              : queue_error(name, "dump", err);
    }
    if (a->val[O_JSON])
        print_stats_json(name, &st, st.fair ? &fv : NULL);
    else
        print_stats_text(name, &st, st.fair ? &fv : NULL);
    fair_view_free(&fv);
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

    r->err = observe_queue(r->name, &q);   /* a full table too */
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
        struct ectx c = { .queue = r->name };

        if (r->err < 0)
            printf(" error: %s\n", err_cause(&c, r->err));
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
            struct ectx c = { .queue = r->name };

            printf(",\"error\":");
            put_json_str(stdout, err_cause(&c, r->err));
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

int cmd_ls(const struct args *a)
{
    struct strv names = { 0 };
    struct ls_row *rows;
    int rc;

    const char *where = a->npos > 0 ? a->pos[0] : NULL;
    rc = wq_list_at(where, collect_name, &names);
    if (rc < 0) {
        strv_free(&names);
        fprintf(stderr, "wqctl: cannot list queues%s%s: %s%s%s\n", where ? " on " : "",
                where ? where : "", wq_strerror(rc), wq_last_error()[0] ? ": " : "",
                wq_last_error());
        return rc == -EINVAL ? EXIT_USAGE : EXIT_FAIL;
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
/* dump                                                                */
/* ------------------------------------------------------------------ */

/* A copy of one wq_key_info, taken under the lock and printed after. */
struct dump_rec {
    char *key;
    size_t len;
    unsigned state;
    pid_t owner;
    uint64_t position;
    uint64_t ready_ns;
    uint32_t failures;
    int priority;       /* fair queues: its priority */
    uint32_t seq;       /* its add order (wraps) */
    size_t tenant_len;  /* fair queues: key[0..tenant_len) is its tenant */
    enum wq_state result;
    int result_code;
    char *result_message;
};

struct dump_list {
    struct dump_rec *v;
    size_t n, cap;
};

static int collect_key(const struct wq_key_info *ki, void *arg)
{
    struct dump_list *l = arg;
    struct dump_rec *r;

    /* No state at all: not a key the queue holds, but the library's
       bookkeeping for its store (a removal not yet written, a new key
       not yet stored); wq_dump shows them, we do not. */
    if (ki->state == 0)
        return 0;

    if (grow((void **)&l->v, l->n, &l->cap, sizeof *l->v, 64) < 0)
        return -ENOMEM;
    r = &l->v[l->n];
    r->key = malloc(ki->len ? ki->len : 1);
    if (!r->key)
        return -ENOMEM;
    r->result_message = strdup(ki->result_message ? ki->result_message : "");
    if (!r->result_message) {
        free(r->key);
        return -ENOMEM;
    }
    memcpy(r->key, ki->key, ki->len);
    r->len = ki->len;
    r->state = ki->state;
    r->owner = ki->owner_pid;
    r->position = ki->position;
    r->ready_ns = ki->ready_ns;
    r->failures = ki->failures;
    r->priority = ki->priority;
    r->seq = ki->seq;
    r->tenant_len = ki->tenant_len <= ki->len ? ki->tenant_len : 0;
    r->result = ki->result;
    r->result_code = ki->result_code;
    l->n++;
    return 0;
}

/* wq_result states by name, as `result` and `dump` print them. */
static const char *const result_state_names[] = {
    [WQ_STATE_NONE] = "none",
    [WQ_STATE_PENDING] = "pending",
    [WQ_STATE_RUNNING] = "running",
    [WQ_STATE_SUCCEEDED] = "succeeded",
    [WQ_STATE_FAILED] = "failed",
};

static const char *result_state_name(enum wq_state s)
{
    if ((unsigned)s < sizeof result_state_names / sizeof result_state_names[0])
        return result_state_names[s];
    return "unknown";
}

static const struct {
    unsigned bit;
    const char *name;
} state_names[] = {
    { WQ_KEY_QUEUED, "queued" },
    { WQ_KEY_PROCESSING, "processing" },
    { WQ_KEY_WAITING, "waiting" },
    { WQ_KEY_DIRTY, "dirty" },
    { WQ_KEY_FAILING, "failing" },
};

#define N_STATES (sizeof state_names / sizeof state_names[0])

/* WQ_KEY_FAILING marks an idle key kept for a failure count or for a
   result: "failing" for the first, "idle" when only a result keeps it. */
static const char *state_bit_name(const struct dump_rec *r, size_t b)
{
    if (state_names[b].bit == WQ_KEY_FAILING && r->failures == 0)
        return "idle";
    return state_names[b].name;
}

/* The width of the TENANT column of a fair queue's dump. */
static size_t tenant_width(const struct dump_list *l)
{
    size_t w = 6;

    for (size_t i = 0; i < l->n; i++) {
        size_t tw = key_width(l->v[i].key, l->v[i].tenant_len);

        if (tw > w)
            w = tw;
    }
    return w;
}

/* A fair queue's columns: priority, add order, tenant ("-" if none). */
static void dump_fair_columns(const struct dump_rec *r, size_t tw)
{
    printf("%-8d %-10" PRIu32 " ", r->priority, r->seq);
    if (r->tenant_len) {
        put_key(stdout, r->key, r->tenant_len);
        printf("%*s ", (int)(tw - key_width(r->key, r->tenant_len)), "");
    } else {
        printf("%-*s ", (int)tw, "-");
    }
}

static void dump_print_text(const struct dump_list *l, uint64_t now, bool fair)
{
    size_t tw = fair ? tenant_width(l) : 0;

    printf("%-10s %-18s %-8s %-12s %-8s %-9s %-5s ", "POSITION", "STATE",
           "OWNER", "READY", "FAILURES", "RESULT", "CODE");
    if (fair)
        printf("%-8s %-10s %-*s ", "PRIORITY", "SEQ", (int)tw, "TENANT");
    printf("KEY%c", key_end());
    for (size_t i = 0; i < l->n; i++) {
        const struct dump_rec *r = &l->v[i];
        char state[64] = "", ready[32], code[16] = "-";

        for (size_t b = 0; b < N_STATES; b++) {
            if (!(r->state & state_names[b].bit))
                continue;
            if (state[0])
                strcat(state, ",");
            strcat(state, state_bit_name(r, b));
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
        printf("%-12s %-8" PRIu32 " ", (r->state & WQ_KEY_WAITING) ?
               format_ready_in(ready, sizeof ready, r->ready_ns, now) : "-",
               r->failures);
        /* The code of the last outcome: shown once there is one (a
           pending or running key shows how its previous run ended). */
        if (r->result == WQ_STATE_SUCCEEDED || r->result == WQ_STATE_FAILED ||
            r->result_code != 0 || r->result_message[0] != '\0')
            snprintf(code, sizeof code, "%d", r->result_code);
        printf("%-9s %-5s ", result_state_name(r->result), code);
        if (fair)
            dump_fair_columns(r, tw);
        put_key(stdout, r->key, r->len);
        putchar(key_end());
    }
}

static void dump_print_json(const char *name, const struct dump_list *l,
                            uint64_t now, bool fair)
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
            printf("%s\"%s\"", first ? "" : ",", state_bit_name(r, b));
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
        printf(",\"ready_in_ns\":");
        if (r->state & WQ_KEY_WAITING)
            printf("%" PRIu64, r->ready_ns > now ? r->ready_ns - now : 0);
        else
            printf("null");
        printf(",\"failures\":%" PRIu32 ",\"result\":\"%s\",\"result_code\":%d"
               ",\"result_message\":", r->failures, result_state_name(r->result),
               r->result_code);
        put_json_str(stdout, r->result_message);
        if (fair) {
            printf(",\"priority\":%d,\"tenant\":", r->priority);
            if (r->tenant_len)
                put_json(stdout, r->key, r->tenant_len);
            else
                printf("null");
            printf(",\"seq\":%" PRIu32, r->seq);
        }
        putchar('}');
    }
    printf("]}\n");
}

int cmd_dump(const struct args *a)
{
    const char *name = a->pos[0];
    struct dump_list l = { 0 };
    struct wq_stats st;
    uint64_t now;
    wq *q;
    int rc;

    if ((rc = set_key_output(a)) != EXIT_OK)
        return rc;
    if ((rc = open_queue_stats(name, WQ_OBSERVE, &q, &st)) != EXIT_OK)
        return rc;
    rc = wq_dump(q, collect_key, &l);
    now = now_mono();
    wq_close(q);
    if (rc < 0) {
        rc = rc == -ENOMEM ? out_of_memory() : queue_error(name, "dump", rc);
    } else {
        if (a->val[O_JSON])
            dump_print_json(name, &l, now, st.fair != 0);
        else
            dump_print_text(&l, now, st.fair != 0);
        rc = EXIT_OK;
    }
    for (size_t i = 0; i < l.n; i++) {
        free(l.v[i].key);
        free(l.v[i].result_message);
    }
    free(l.v);
    return rc;
}

/* ------------------------------------------------------------------ */
/* result                                                              */
/* ------------------------------------------------------------------ */

/* A CLOCK_REALTIME time in ns as ISO 8601 UTC with milliseconds. */
static void format_utc(char *buf, size_t cap, uint64_t ns)
{
    time_t sec = (time_t)(ns / 1000000000u);
    struct tm tm;

    if (!gmtime_r(&sec, &tm)) {
        snprintf(buf, cap, "?");
        return;
    }
    snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ",
             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
             tm.tm_min, tm.tm_sec, (unsigned)(ns % 1000000000u / 1000000u));
}

int cmd_result(const struct args *a)
{
    const char *name = a->pos[0];
    const char *key = a->pos[1];
    struct wq_result r;
    uint64_t max_key_len;
    char when[64] = "-";
    wq *q;
    int rc, err;

    if ((rc = set_key_output(a)) != EXIT_OK)
        return rc;
    if ((rc = open_queue_keys(name, WQ_OBSERVE, &q, &max_key_len)) != EXIT_OK)
        return rc;
    if ((rc = check_keys(max_key_len, a->pos + 1, 1)) != EXIT_OK) {
        wq_close(q);
        return rc;
    }
    err = wq_result(q, key, strlen(key), &r);
    wq_close(q);
    if (err < 0) {
        struct ectx c = { .queue = name, .what = "result", .key = key,
                          .key_len = strlen(key) };
        return fail(&c, err);
    }
    r.message[sizeof r.message - 1] = '\0';
    if (r.updated_ns)
        format_utc(when, sizeof when, r.updated_ns);

    if (a->val[O_JSON]) {
        printf("{\"name\":");
        put_json_str(stdout, name);
        printf(",\"key\":");
        put_json_str(stdout, key);
        printf(",\"state\":\"%s\",\"code\":%d,\"updated\":",
               result_state_name(r.state), r.code);
        if (r.updated_ns)
            printf("\"%s\"", when);
        else
            printf("null");
        printf(",\"updated_ns\":%" PRIu64 ",\"message\":", r.updated_ns);
        put_json_str(stdout, r.message);
        printf("}\n");
    } else {
        printf("%-8s ", "key");
        put_key(stdout, key, strlen(key));
        printf("\n%-8s %s\n%-8s %d\n%-8s %s\n%-8s ", "state",
               result_state_name(r.state), "code", r.code, "updated", when,
               "message");
        put_text(stdout, r.message, strlen(r.message));
        putchar('\n');
    }
    return EXIT_OK;
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

int cmd_check(const struct args *a)
{
    const char *name = a->pos[0];
    bool repair = a->val[O_REPAIR] != NULL;
    struct check_reports rep = { { 0 }, false };
    wq *q;
    int rc;

    if ((rc = open_queue(name, WQ_OBSERVE, &q)) != EXIT_OK)
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
