/*
 * engine.c - the Redis engine's operations (engine.h's table), its
 * handles, leases and fork.
 *
 * A handle is a lease holder: at open (and in a forked child, at its first
 * call) it registers a random holder id under a lease that a thread of the
 * handle renews every lease/4 (at least every second). Every key handed
 * out records its holder and a new epoch; the handle remembers the epochs
 * of the keys it holds and wq_done sends the epoch back, so a done from a
 * holder whose lease ran out (its keys were requeued, perhaps handed to
 * someone else) fails with -ESTALE and changes nothing. A holder whose
 * lease expired loses its keys (wq.lua's reap: crash requeues through the
 * rate limiter). The lease thread also notices, once a second while keys
 * are processing, holders whose connection is gone (CLIENT LIST, same
 * server only), which a SIGKILL causes at once, and expires them without
 * waiting for their lease.
 *
 * Waiting: a wq_get that finds nothing blocks in BLPOP on the queue's
 * doorbell list, for no longer than its deadline, the next ready time of a
 * delayed key, or a second; whoever queues a key rings the bell (wq.lua).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "redis.h"

#define DEF_LEASE_MS 10000u
#define MAX_WAIT_MS 1000u      /* a blocked wq_get looks again at least this often */
#define DUMP_PAGE 500

/* wq.lua's entry record: '<BBIddddi' */
#define REC_LEN 42
#define ST_DIRTY 1
#define ST_QUEUED 2
#define ST_PROC 4
#define ST_WAIT 8
#define ST_IDLE 16

static const struct wq_engine redis_engine;

static inline rq *self(wq *pub)
{
    return (rq *)pub;
}

/* ------------------------------------------------------------------ */
/* Held keys: key -> epoch                                             */
/* ------------------------------------------------------------------ */

static struct rq_held **bucket(rq *q, const void *key, size_t len)
{
    return &q->held[wq__fnv1a(key, len) & (RQ_HELD_BUCKETS - 1)];
}

static struct rq_held **held_find(rq *q, const void *key, size_t len)
{
    struct rq_held **p = bucket(q, key, len);
    while (*p && ((*p)->len != len || memcmp((*p)->key, key, len) != 0))
        p = &(*p)->next;
    return p;
}

static void held_put(rq *q, const void *key, size_t len, uint64_t epoch)
{
    pthread_mutex_lock(&q->mu);
    struct rq_held **p = held_find(q, key, len);
    if (*p) {
        (*p)->epoch = epoch;
    } else {
        struct rq_held *h = malloc(sizeof *h + len);
        if (h) {   /* without it, a done is sent without its epoch: still a done */
            h->next = NULL;
            h->epoch = epoch;
            h->len = len;
            memcpy(h->key, key, len);
            *p = h;
            q->nheld++;
        }
    }
    pthread_mutex_unlock(&q->mu);
}

/* The epoch this handle holds key under, or 0 (it does not). */
static uint64_t held_epoch(rq *q, const void *key, size_t len)
{
    pthread_mutex_lock(&q->mu);
    struct rq_held *h = *held_find(q, key, len);
    uint64_t e = h ? h->epoch : 0;
    pthread_mutex_unlock(&q->mu);
    return e;
}

static void held_drop(rq *q, const void *key, size_t len, uint64_t epoch)
{
    pthread_mutex_lock(&q->mu);
    struct rq_held **p = held_find(q, key, len);
    if (*p && (epoch == 0 || (*p)->epoch == epoch)) {
        struct rq_held *h = *p;
        *p = h->next;
        free(h);
        q->nheld--;
    }
    pthread_mutex_unlock(&q->mu);
}

static void held_clear(rq *q)
{
    for (unsigned i = 0; i < RQ_HELD_BUCKETS; i++) {
        while (q->held[i]) {
            struct rq_held *h = q->held[i];
            q->held[i] = h->next;
            free(h);
        }
    }
    q->nheld = 0;
}

/* ------------------------------------------------------------------ */
/* Settings: packed as wq.lua's CFG '<IIIiIIIdIddIIIdd'                */
/* ------------------------------------------------------------------ */

#define CFG_LEN 84

static unsigned char *put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        *p++ = (unsigned char)(v >> (8 * i));
    return p;
}

static unsigned char *putd(unsigned char *p, double d)
{
    uint64_t v;
    memcpy(&v, &d, 8);
    for (int i = 0; i < 8; i++)
        *p++ = (unsigned char)(v >> (8 * i));
    return p;
}

static const unsigned char *get32(const unsigned char *p, uint32_t *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++)
        *v |= (uint32_t)p[i] << (8 * i);
    return p + 4;
}

static const unsigned char *getd(const unsigned char *p, double *d)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    memcpy(d, &v, 8);
    return p + 8;
}

static void cfg_pack(const struct wq_conf *c, uint32_t lease_ms, unsigned char out[CFG_LEN])
{
    unsigned char *p = out;
    p = put32(p, c->capacity);
    p = put32(p, c->max_key_len);
    p = put32(p, c->flags);
    p = put32(p, (uint32_t)c->tenant_sep);
    p = put32(p, c->fair_share);
    p = put32(p, c->result_capacity);
    p = put32(p, c->rl_limiters);
    p = putd(p, c->rl_qps);
    p = put32(p, c->rl_burst);
    p = putd(p, (double)c->rl_base_delay_ns / 1000);
    p = putd(p, (double)c->rl_max_delay_ns / 1000);
    p = put32(p, c->rl_max_fast_attempts);
    p = put32(p, c->durability);
    p = put32(p, lease_ms);
    p = putd(p, (double)c->rl_fast_delay_ns / 1000);
    putd(p, (double)c->rl_slow_delay_ns / 1000);
}

static uint64_t us_to_ns(double us)
{
    return us <= 0 || us != us ? 0 : us >= 1.8e16 ? UINT64_MAX : (uint64_t)(us * 1000 + 0.5);
}

/* A queue's settings as read from the server: checked like any options
   (a foreign or damaged hash must not become a handle). */
static int cfg_unpack(const unsigned char *s, size_t n, struct wq_conf *c, uint32_t *lease_ms)
{
    if (n != CFG_LEN)
        return -EPROTO;
    memset(c, 0, sizeof *c);
    uint32_t tsep;
    double base, max, fast, slow;
    const unsigned char *p = s;
    p = get32(p, &c->capacity);
    p = get32(p, &c->max_key_len);
    p = get32(p, &c->flags);
    p = get32(p, &tsep);
    p = get32(p, &c->fair_share);
    p = get32(p, &c->result_capacity);
    p = get32(p, &c->rl_limiters);
    p = getd(p, &c->rl_qps);
    p = get32(p, &c->rl_burst);
    p = getd(p, &base);
    p = getd(p, &max);
    p = get32(p, &c->rl_max_fast_attempts);
    p = get32(p, &c->durability);
    p = get32(p, lease_ms);
    p = getd(p, &fast);
    getd(p, &slow);
    c->tenant_sep = (int32_t)tsep;
    c->rl_base_delay_ns = us_to_ns(base);
    c->rl_max_delay_ns = us_to_ns(max);
    c->rl_fast_delay_ns = us_to_ns(fast);
    c->rl_slow_delay_ns = us_to_ns(slow);
    c->max_procs = WQ_DEF_PROCS;
    c->has_store = true;   /* the server keeps it: durability is meaningful */
    c->snapshot_ms = WQ_DEF_SNAPSHOT_MS;
    c->mode = 0600;
    if (*lease_ms < 100 || *lease_ms > 3600000 || wq__conf_valid(c) < 0)
        return -EPROTO;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Calls                                                               */
/* ------------------------------------------------------------------ */

static int child(rq *q);

/* The lease thread sleeps on CLOCK_MONOTONIC deadlines. */
static void cv_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

/* Every call starts here: a forked child becomes its own holder first. */
static int enter(rq *q)
{
    wq__err_clear();   /* wq_last_error speaks of this call only */
    if (WQ_UNLIKELY(q->fork_gen != wq_load_relaxed(&wq__fork_gen)))
        return child(q);
    return 0;
}

/* One eval on a pooled connection. */
static int call(rq *q, const char *op, bool receipt, int nargs, const char *const *args,
                const size_t *lens, struct rq_reply *out)
{
    int rc = enter(q);
    if (rc < 0)
        return rc;
    struct rq_conn *c;
    if ((rc = wq__rq_conn_get(q, &c)) < 0)
        return rc;
    rc = wq__rq_eval(q, c, op, receipt, nargs, args, lens, out);
    wq__rq_conn_put(q, c);
    return rc;
}

/* An op whose whole answer is its status. */
static int call_rc(rq *q, const char *op, bool receipt, int nargs, const char *const *args,
                   const size_t *lens)
{
    struct rq_reply r;
    int rc = call(q, op, receipt, nargs, args, lens, &r);
    if (rc < 0)
        return rc;
    rc = r.rc > INT32_MAX ? INT32_MAX : (int)r.rc;
    wq__rq_reply_free(&r);
    return rc;
}

static int call_key(rq *q, const char *op, bool receipt, const void *key, size_t len)
{
    const char *a[] = { key };
    size_t l[] = { len };
    return call_rc(q, op, receipt, 1, a, l);
}

/* ------------------------------------------------------------------ */
/* Leases                                                              */
/* ------------------------------------------------------------------ */

/* "host pid name client-id@run-id": who holds keys, for wq_dump,
   wq_release_pid and the connection check. */
static void make_info(rq *q, long long cid, const char *run_id)
{
    char host[256] = "?", comm[32] = "?";
    gethostname(host, sizeof host - 1);
    host[strcspn(host, " \n")] = 0;
    FILE *f = fopen("/proc/self/comm", "r");
    if (f) {
        if (fgets(comm, sizeof comm, f))
            comm[strcspn(comm, " \n")] = 0;
        fclose(f);
    }
    snprintf(q->info, sizeof q->info, "%s %d %s %lld@%s", host, (int)getpid(), comm, cid,
             run_id && run_id[0] ? run_id : "-");
}

/* The lease connection's client id and its server's run id. */
static void lease_identity(rq *q)
{
    long long cid = 0;
    char run_id[48] = "";
    const char *a1[] = { "CLIENT", "ID" };
    redisReply *r;
    if (wq__rq_cmd(q, &q->lc, 2, a1, NULL, &r) == 0) {
        if (r->type == REDIS_REPLY_INTEGER)
            cid = r->integer;
        freeReplyObject(r);
    }
    const char *a2[] = { "INFO", "server" };
    size_t l2[] = { 4, 6 };
    if (wq__rq_cmd(q, &q->lc, 2, a2, l2, &r) == 0) {
        const char *p = r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS
                            ? strstr(r->str, "run_id:") : NULL;
        if (p) {
            p += 7;
            size_t n = strspn(p, "0123456789abcdef");
            if (n == 40)
                memcpy(run_id, p, 40);
        }
        freeReplyObject(r);
    }
    make_info(q, cid, run_id);
}

static int lease_call(rq *q, const char *op, struct rq_reply *out)
{
    const char *a[] = { q->info };
    return wq__rq_eval(q, &q->lc, op, false, 1, a, NULL, out);
}

/* Holders on our server whose connection is gone lose their keys now
   (c: the lease thread's connection, or a pooled one for wq_check). */
static void check_connections(rq *q, struct rq_conn *c)
{
    const char *my_run = strchr(q->info, '@');
    if (!my_run || strcmp(my_run, "@-") == 0)
        return;
    char key[WQ_MAX_NAME_LEN + 16];
    snprintf(key, sizeof key, "%s:h", q->prefix);
    const char *a[] = { "HGETALL", key };
    redisReply *r;
    if (wq__rq_cmd(q, c, 2, a, NULL, &r) < 0)
        return;
    if (r->type != REDIS_REPLY_ARRAY || r->elements % 2 || r->elements > 2 * 4096) {
        freeReplyObject(r);
        return;
    }
    size_t n = r->elements / 2;
    const char **ids = calloc(n + 2, sizeof *ids);
    const char **who = calloc(n + 5, sizeof *who);
    char (*idbuf)[24] = calloc(n + 1, sizeof *idbuf);
    size_t k = 0;
    for (size_t i = 0; ids && who && idbuf && i < n; i++) {
        redisReply *h = r->element[2 * i], *v = r->element[2 * i + 1];
        if (h->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING ||
            strcmp(h->str, q->holder) == 0)
            continue;
        const char *at = strrchr(v->str, '@'), *sp = at ? at : NULL;
        while (sp && sp > v->str && sp[-1] != ' ')
            sp--;
        if (!at || !sp || strcmp(at, my_run) != 0)
            continue;   /* another server (or none known): cannot tell */
        long long cid = strtoll(sp, NULL, 10);
        if (cid <= 0)
            continue;
        snprintf(idbuf[k], sizeof idbuf[k], "%lld", cid);
        ids[k] = idbuf[k];
        who[k] = h->str;
        k++;
    }
    if (k > 0) {
        const char **argv = calloc(k + 3, sizeof *argv);
        redisReply *l = NULL;
        if (argv) {
            argv[0] = "CLIENT";
            argv[1] = "LIST";
            argv[2] = "ID";
            memcpy(argv + 3, ids, k * sizeof *argv);
        }
        if (argv && wq__rq_cmd(q, c, (int)k + 3, argv, NULL, &l) == 0 &&
            l->type == REDIS_REPLY_STRING) {
            const char *gone[64];
            int ng = 0;
            for (size_t i = 0; i < k && ng < 64; i++) {
                char pat[32];
                snprintf(pat, sizeof pat, "id=%s ", ids[i]);
                bool alive = strncmp(l->str, pat, strlen(pat)) == 0;
                snprintf(pat, sizeof pat, "\nid=%s ", ids[i]);
                alive |= strstr(l->str, pat) != NULL;
                if (!alive)
                    gone[ng++] = who[i];
            }
            if (ng > 0) {
                struct rq_reply x;
                if (wq__rq_eval(q, c, "expire", false, ng, gone, NULL, &x) == 0)
                    wq__rq_reply_free(&x);
            }
        }
        if (l)
            freeReplyObject(l);
        free(argv);
    }
    free(ids);
    free(who);
    free(idbuf);
    freeReplyObject(r);
}

/* What the lease threads would find within a second, now: holders whose
   connection the server has closed lose their keys (wq_check REAP,
   wq_dump). */
static int reap_now(rq *q)
{
    struct rq_conn *c;
    int rc = wq__rq_conn_get(q, &c);
    if (rc < 0)
        return rc;
    check_connections(q, c);
    wq__rq_conn_put(q, c);
    return 0;
}

/*
 * Fork. A fork while a lease thread is in the middle of a renewal would
 * copy half-done work into the child: hiredis's buffers, and, in a
 * process whose allocator is not fork-safe (a sanitizer's), a lock the
 * child can never take. The prepare handler waits until every lease
 * thread is between renewals; the child, where no lease thread exists,
 * starts with an empty list (its first call starts its own, child()).
 */
static pthread_mutex_t lt_all_mu = PTHREAD_MUTEX_INITIALIZER;
static rq *lt_all;
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;

static void lt_prepare(void)
{
    pthread_mutex_lock(&lt_all_mu);
    for (rq *q = lt_all; q; q = q->lt_next)
        pthread_mutex_lock(&q->lt_busy);
}

static void lt_parent(void)
{
    for (rq *q = lt_all; q; q = q->lt_next)
        pthread_mutex_unlock(&q->lt_busy);
    pthread_mutex_unlock(&lt_all_mu);
}

static void lt_child(void)
{
    for (rq *q = lt_all; q; q = q->lt_next)
        pthread_mutex_init(&q->lt_busy, NULL);
    lt_all = NULL;
    pthread_mutex_init(&lt_all_mu, NULL);
}

static void lt_atfork(void)
{
    pthread_atfork(lt_prepare, lt_parent, lt_child);
}

static void *lease_main(void *arg)
{
    rq *q = arg;
    uint64_t tick = q->lease_ms / 4 < 1000 ? q->lease_ms / 4 : 1000;
    redisContext *known = q->lc.c;
    pthread_mutex_lock(&q->mu);
    q->lt_started = true;   /* lease_start waits for this (see there) */
    pthread_cond_broadcast(&q->lt_cv);
    while (!q->lt_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t at = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + tick * 1000000;
        ts.tv_sec = (time_t)(at / 1000000000ull);
        ts.tv_nsec = (long)(at % 1000000000ull);
        pthread_cond_timedwait(&q->lt_cv, &q->mu, &ts);
        if (q->lt_stop)
            break;
        pthread_mutex_unlock(&q->mu);
        pthread_mutex_lock(&q->lt_busy);
        /* A new connection has a new client id: say so with the renewal,
           or the connection check of others would take us for gone. */
        if (!q->lc.c || q->lc.c != known) {
            const char *a[] = { "PING" };
            redisReply *r;
            if (!q->lc.c && wq__rq_cmd(q, &q->lc, 1, a, NULL, &r) == 0)
                freeReplyObject(r);
            if (q->lc.c)
                lease_identity(q);
            known = q->lc.c;
        }
        struct rq_reply r;
        long long lost = 0, proc = 0;
        if (lease_call(q, "renew", &r) == 0) {
            wq__rq_int(&r, 1, &lost);
            wq__rq_int(&r, 2, &proc);
            wq__rq_reply_free(&r);
        }
        /* A lost lease (lost != 0): our keys were requeued. Their epochs
           stay in the held map: the done that carries one is what the
           server fences (-ESTALE); a done without one would be taken for
           another process's and accepted. */
        (void)lost;
        if (proc > 0)
            check_connections(q, &q->lc);
        pthread_mutex_unlock(&q->lt_busy);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static void new_holder(rq *q)
{
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b) {
        uint64_t x = wq__now_real() ^ ((uint64_t)getpid() << 32) ^ wq__now_mono();
        for (int i = 0; i < 16; i++)
            b[i] = (unsigned char)(wq__hash64(x, &i, sizeof i) >> 8);
    }
    for (int i = 0; i < 16; i++)
        snprintf(q->holder + 2 * i, 3, "%02x", b[i]);
}

/* Register this process's holder and start its lease thread. */
static int lease_start(rq *q)
{
    new_holder(q);
    const char *a[] = { "PING" };
    redisReply *pr;
    int rc = wq__rq_cmd(q, &q->lc, 1, a, NULL, &pr);
    if (rc < 0)
        return rc;
    freeReplyObject(pr);
    lease_identity(q);
    if (q->pub.observe)
        return 0;   /* WQ_OBSERVE: holds no keys, so is no holder: not counted */
    struct rq_reply r;
    if ((rc = lease_call(q, "reg", &r)) < 0)
        return rc;
    wq__rq_reply_free(&r);
    q->lt_stop = false;
    q->lt_started = false;
    /* The thread takes no signals: a process that blocks SIGTERM in its
       threads to wait for it (wq_run_workers, sigwait users) would
       otherwise be killed by its default action on our thread. */
    pthread_once(&lt_once, lt_atfork);
    pthread_mutex_init(&q->lt_busy, NULL);
    sigset_t all, old;
    sigfillset(&all);
    pthread_mutex_lock(&lt_all_mu);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&q->lt, NULL, lease_main, q);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0) {
        q->lt_next = lt_all;
        lt_all = q;
    }
    pthread_mutex_unlock(&lt_all_mu);
    if (rc != 0)
        return -ENOMEM;
    /* Wait until the thread runs our code: a thread still starting may
       hold locks of the C runtime (a sanitizer's allocator takes some),
       which a fork right after wq_open would copy, taken, into the child. */
    pthread_mutex_lock(&q->mu);
    while (!q->lt_started)
        pthread_cond_wait(&q->lt_cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
    q->lt_on = true;
    return 0;
}

static void lease_stop(rq *q)
{
    if (!q->lt_on)
        return;
    pthread_mutex_lock(&q->mu);
    q->lt_stop = true;
    pthread_cond_signal(&q->lt_cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->lt, NULL);
    q->lt_on = false;
    pthread_mutex_lock(&lt_all_mu);
    for (rq **p = &lt_all; *p; p = &(*p)->lt_next)
        if (*p == q) {
            *p = q->lt_next;
            break;
        }
    pthread_mutex_unlock(&lt_all_mu);
    pthread_mutex_destroy(&q->lt_busy);
}

static void drop_conns(rq *q)
{
    for (unsigned i = 0; i < q->nidle; i++) {
        wq__rq_conn_close(q->idle[i]);
        free(q->idle[i]);
    }
    q->nidle = 0;
    wq__rq_conn_close(&q->lc);
}

/* First call in a forked child: the parent's connections, lease thread
   and held keys are the parent's. The child closes its copies of the
   sockets (the parent's stay open), and registers as a holder of its own. */
static int child(rq *q)
{
    pthread_mutex_init(&q->mu, NULL);
    cv_init(&q->lt_cv);
    q->lt_on = false;
    drop_conns(q);
    held_clear(q);
    q->next_slot = 0;
    q->fork_gen = wq_load_relaxed(&wq__fork_gen);
    return lease_start(q);
}

/* ------------------------------------------------------------------ */
/* Open, close                                                         */
/* ------------------------------------------------------------------ */

/* Nodes of a cluster, for finding the queue again after a failover. */
static void learn_nodes(rq *q)
{
    const char *a[] = { "CLUSTER", "SLOTS" };
    redisReply *r;
    if (wq__rq_cmd(q, &q->lc, 2, a, NULL, &r) < 0)
        return;
    if (r->type == REDIS_REPLY_ARRAY) {
        q->nodes.cluster = true;
        for (size_t i = 0; i < r->elements && i < 1024; i++) {
            redisReply *s = r->element[i];
            if (s->type != REDIS_REPLY_ARRAY)
                continue;
            for (size_t j = 2; j < s->elements; j++) {
                redisReply *n = s->element[j];
                if (n->type != REDIS_REPLY_ARRAY || n->elements < 2 ||
                    n->element[0]->type != REDIS_REPLY_STRING ||
                    n->element[1]->type != REDIS_REPLY_INTEGER ||
                    n->element[0]->len == 0 || n->element[0]->len > RQ_HOST_MAX ||
                    n->element[1]->integer <= 0 || n->element[1]->integer > 65535)
                    continue;
                struct rq_addr ad;
                memcpy(ad.host, n->element[0]->str, n->element[0]->len + 1);
                ad.port = (int)n->element[1]->integer;
                bool known = false;
                for (unsigned k = 0; k < q->nodes.nseen; k++)
                    known |= strcmp(q->nodes.seen[k].host, ad.host) == 0 &&
                             q->nodes.seen[k].port == ad.port;
                if (!known && q->nodes.nseen < RQ_NODES_MAX)
                    q->nodes.seen[q->nodes.nseen++] = ad;
            }
        }
    }
    freeReplyObject(r);
}

/* WQ_DURABLE_FSYNC needs a server that fsyncs every write before it
   answers: appendonly yes, appendfsync always. Checked when CONFIG is
   allowed; a server that refuses CONFIG (ACL, renamed) is believed. */
static int check_fsync(rq *q)
{
    static const char *const want[][2] = { { "appendonly", "yes" }, { "appendfsync", "always" } };
    for (int i = 0; i < 2; i++) {
        const char *a[] = { "CONFIG", "GET", want[i][0] };
        redisReply *r;
        int rc = wq__rq_cmd(q, &q->lc, 3, a, NULL, &r);
        if (rc < 0)
            return rc;
        bool ok = true;
        if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
            r->element[1]->type == REDIS_REPLY_STRING)
            ok = strcmp(r->element[1]->str, want[i][1]) == 0;
        if (!ok)
            wq__errf("queue '%s': WQ_DURABLE_FSYNC needs the server %s:%d to have %s %s, "
                     "not %s", q->url.queue, q->lc.at.host, q->lc.at.port, want[i][0],
                     want[i][1], r->element[1]->str);
        freeReplyObject(r);
        if (!ok)
            return -ENOTSUP;
    }
    return 0;
}

static void rq_free(rq *q)
{
    drop_conns(q);
    held_clear(q);
    free(q->idle);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->lt_cv);
    free(q);
}

/* Options a Redis queue cannot honour are refused, never ignored. */
static int options_for_redis(const char *queue, const struct wq_options *o)
{
    const char *what = o->store_path ? "store_path (the server keeps the queue)"
                     : o->mode ? "mode (access is the server's ACL)"
                     : o->max_procs ? "max_procs (holders are not counted in a table)"
                     : o->snapshot_interval_ms ? "snapshot_interval_ms (the server's "
                                                 "persistence decides)"
                     : NULL;
    if (what) {
        wq__errf("queue '%s': %s has no meaning for a redis:// queue", queue, what);
        return -EINVAL;
    }
    if (o->lease_ns && (o->lease_ns < 100000000ull || o->lease_ns > 3600000000000ull)) {
        wq__errf("queue '%s': lease_ns must be 100 ms to 1 hour", queue);
        return -EINVAL;
    }
    /* Everything else as for any queue; durability needs no store here. */
    struct wq_options c = *o;
    c.durability = 0;
    c.lease_ns = 0;
    int rc = wq__options_check(&c);
    if (rc == 0 && o->durability != 0 && o->durability != WQ_DURABLE_PROCESS &&
        o->durability != WQ_DURABLE_FSYNC && o->durability != WQ_DURABLE_NONE)
        rc = -EINVAL;
    return rc;
}

int wq__redis_open(const char *name, const struct wq_options *o, wq **out)
{
    struct wq_options none = { 0 };
    if (!o)
        o = &none;
    rq *q = calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    pthread_mutex_init(&q->mu, NULL);
    cv_init(&q->lt_cv);
    int rc = wq__redis_url(name, false, &q->url);
    if (rc == 0)
        rc = options_for_redis(q->url.queue, o);
    if (rc < 0) {
        rq_free(q);
        return rc;
    }
    wq__fork_init();
    q->fork_gen = wq_load_relaxed(&wq__fork_gen);
    q->pub.observe = (o->flags & WQ_OBSERVE) != 0;   /* lease_start reads it */
    q->prefix_len = (size_t)snprintf(q->prefix, sizeof q->prefix, "wq:{%s}", q->url.queue);
    q->nodes.node = q->url.addr;
    q->nodes.seen[q->nodes.nseen++] = q->url.addr;
    q->lc.slot = 0;
    struct wq_conf want;
    struct wq_options ro = *o;
    ro.durability = 0;
    ro.lease_ns = 0;
    if ((rc = wq__options_resolve(&ro, &want)) < 0) {
        rq_free(q);
        return rc;
    }
    want.has_store = true;
    want.durability = o->durability ? (uint32_t)o->durability : WQ_DURABLE_PROCESS;
    want.mode = 0600;
    uint32_t lease_ms = o->lease_ns ? (uint32_t)(o->lease_ns / 1000000) : DEF_LEASE_MS;
    learn_nodes(q);
    if (q->lc.c == NULL) {   /* CLUSTER SLOTS could not even connect */
        const char *a[] = { "PING" };
        redisReply *r;
        if ((rc = wq__rq_cmd(q, &q->lc, 1, a, NULL, &r)) < 0) {
            rq_free(q);
            return rc;
        }
        freeReplyObject(r);
    }
    /* Before anything is created: a queue asked to be FSYNC on a server
       that does not fsync must not come into being. */
    if (want.durability == WQ_DURABLE_FSYNC && o->durability && (rc = check_fsync(q)) < 0) {
        rq_free(q);
        return rc;
    }
    unsigned char packed[CFG_LEN];
    cfg_pack(&want, lease_ms, packed);
    const char *args[] = { (o->flags & WQ_CREATE) ? "1" : "0", (o->flags & WQ_EXCL) ? "1" : "0",
                           (const char *)packed };
    size_t lens[] = { 1, 1, CFG_LEN };
    struct rq_reply r;
    if ((rc = wq__rq_eval(q, &q->lc, "open", false, 3, args, lens, &r)) < 0) {
        rq_free(q);
        return rc;
    }
    const char *s;
    size_t n;
    long long created = 0;
    rc = (int)r.rc;
    if (rc == 0 && (wq__rq_str(&r, 1, &s, &n) < 0 || wq__rq_int(&r, 2, &created) < 0))
        rc = -EPROTO;
    if (rc == 0 && cfg_unpack((const unsigned char *)s, n, &q->conf, &q->lease_ms) < 0) {
        wq__errf("queue '%s' on %s:%d: its settings are not a libwq queue's (foreign or "
                 "damaged key %s:m)", q->url.queue, q->lc.at.host, q->lc.at.port, q->prefix);
        rc = -EPROTO;
    }
    wq__rq_reply_free(&r);
    if (rc == -EEXIST)
        wq__errf("queue '%s' exists on %s:%d", q->url.queue, q->lc.at.host, q->lc.at.port);
    if (rc == -ENOENT)
        wq__errf("queue '%s' does not exist on %s:%d", q->url.queue, q->lc.at.host,
                 q->lc.at.port);
    if (rc == 0 && !created) {
        char why[256];
        struct wq_options cmp = *o;
        cmp.lease_ns = 0;
        if (wq__options_match(&cmp, &q->conf, NULL, why, sizeof why) < 0) {
            wq__errf("queue '%s' exists with %s", q->url.queue, why);
            rc = -EEXIST;
        } else if (o->lease_ns && lease_ms != q->lease_ms) {
            wq__errf("queue '%s' exists with lease_ns %llu, not %llu", q->url.queue,
                     (unsigned long long)q->lease_ms * 1000000,
                     (unsigned long long)o->lease_ns);
            rc = -EEXIST;
        }
    }
    if (rc == 0 && !created && !o->durability && q->conf.durability == WQ_DURABLE_FSYNC)
        rc = check_fsync(q);   /* attaching: the queue's own level */
    q->durability = q->conf.durability;
    if (rc == 0)
        rc = lease_start(q);
    if (rc < 0) {
        lease_stop(q);
        rq_free(q);
        return rc;
    }
    q->pub.eng = &redis_engine;
    q->pub.max_key_len = q->conf.max_key_len;
    q->pub.fair = (q->conf.flags & WQ_FAIR) != 0;
    /* wq_name: the name without its password. */
    if (q->url.user[0])
        snprintf(q->pub.name, sizeof q->pub.name, "redis://%s@%s:%d/%s", q->url.user,
                 q->url.addr.host, q->url.addr.port, q->url.queue);
    else
        snprintf(q->pub.name, sizeof q->pub.name, "redis://%s:%d/%s", q->url.addr.host,
                 q->url.addr.port, q->url.queue);
    *out = &q->pub;
    return 0;
}

static void rq_close(wq *pub)
{
    rq *q = self(pub);
    if (q->fork_gen == wq_load_relaxed(&wq__fork_gen) && !q->pub.observe) {
        lease_stop(q);
        /* Keys this handle still holds go back at once (as wq_close in
           shared memory); the holder leaves. */
        struct rq_reply r;
        if (wq__rq_eval(q, &q->lc, "close", false, 0, NULL, NULL, &r) == 0)
            wq__rq_reply_free(&r);
    }
    /* A child that never used the handle closes only its copies: the
       registration is its parent's. */
    rq_free(q);
}

/* ------------------------------------------------------------------ */
/* Adds                                                                */
/* ------------------------------------------------------------------ */

static uint64_t ns_to_us_up(uint64_t ns)
{
    return ns / 1000 + (ns % 1000 != 0);
}

static int rq_add(wq *pub, const struct wq_add_req *rq_)
{
    rq *q = self(pub);
    char prio[16], after[24];
    snprintf(prio, sizeof prio, "%d", rq_->priority);
    snprintf(after, sizeof after, "%llu", (unsigned long long)ns_to_us_up(rq_->after_ns));
    const char *a[] = { "1", rq_->key, prio, after, rq_->rate_limited ? "1" : "0",
                        rq_->delayed ? "1" : "0" };
    size_t l[] = { 1, rq_->len, strlen(prio), strlen(after), 1, 1 };
    struct rq_reply r;
    int rc = call(q, "add", true, 6, a, l, &r);
    if (rc < 0)
        return rc;
    long long v = 0;
    rc = (int)r.rc;
    if (rc == 0)
        rc = wq__rq_int(&r, 1, &v) < 0 || v < 0 || v > 1 ? -EPROTO : (int)v;
    wq__rq_reply_free(&r);
    return rc;
}

static int rq_add_many(wq *pub, const struct iovec *keys, size_t n)
{
    rq *q = self(pub);
    if (n == 0)
        return 0;
    if (n > (INT32_MAX - 16) / 5)
        return -E2BIG;
    char count[24];
    snprintf(count, sizeof count, "%zu", n);
    const char **a = malloc((5 * n + 1) * sizeof *a);
    size_t *l = malloc((5 * n + 1) * sizeof *l);
    if (!a || !l) {
        free(a);
        free(l);
        return -ENOMEM;
    }
    a[0] = count;
    l[0] = strlen(count);
    for (size_t i = 0; i < n; i++) {
        const char **x = a + 1 + 5 * i;
        size_t *y = l + 1 + 5 * i;
        x[0] = keys[i].iov_base;
        y[0] = keys[i].iov_len;
        x[1] = x[2] = x[3] = x[4] = "0";
        y[1] = y[2] = y[3] = y[4] = 1;
    }
    struct rq_reply r;
    int rc = call(q, "add", true, (int)(5 * n + 1), a, l, &r);
    free(a);
    free(l);
    if (rc < 0)
        return rc;
    rc = (int)r.rc;
    if (rc == 0) {
        if (r.r->elements != n + 1) {
            rc = -EPROTO;
        } else {
            for (size_t i = 0; i < n && rc >= 0; i++) {
                long long v;
                if (wq__rq_int(&r, i + 1, &v) < 0 || v < 0 || v > 1)
                    rc = -EPROTO;
                else
                    rc += (int)v;
            }
        }
    }
    wq__rq_reply_free(&r);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Get, done                                                           */
/* ------------------------------------------------------------------ */

/* A get reply (wq.lua get1) on its way to the caller: the key is now
   ours under its epoch. *wait_us: how long until a delayed key is ready
   (-EAGAIN), 0 if none. */
static int got(rq *q, struct rq_reply *r, void *buf, uint64_t *wait_us)
{
    int rc = (int)r->rc;
    *wait_us = 0;
    if (rc == -EAGAIN) {
        long long next, now;
        if (wq__rq_int(r, 1, &next) < 0 || wq__rq_int(r, 2, &now) < 0)
            return -EPROTO;
        if (next > 0)
            *wait_us = next > now ? (uint64_t)(next - now) : 1;
        return rc;
    }
    if (rc < 0)
        return rc;
    const char *key;
    size_t len;
    long long epoch;
    if (wq__rq_str(r, 1, &key, &len) < 0 || wq__rq_int(r, 2, &epoch) < 0 || len == 0 ||
        len > q->pub.max_key_len || epoch <= 0)
        return -EPROTO;
    memcpy(buf, key, len);
    held_put(q, key, len, (uint64_t)epoch);
    return (int)len;
}

/*
 * A BLPOP that ends on time. The server checks blocked clients' timeouts
 * between event-loop turns, which are 1000/hz ms apart (100 ms by
 * default) when nothing happens: a delayed key would fire up to 100 ms
 * late. So the client keeps the time: it sends BLPOP with a longer
 * timeout, polls the socket until its own deadline, and then ends the
 * wait with CLIENT UNBLOCK ... TIMEOUT from another connection (the
 * reply is then the timeout's nil). Returns 0 (woken or timed out),
 * 1 when c is not connected (the caller's plain BLPOP reconnects), or an
 * error from c (which is then closed).
 */
static int timed_wait(rq *q, struct rq_conn *c, const char *key, uint64_t ms)
{
    if (!c->c)
        return 1;
    redisReply *r;
    int rc;
    if (!c->cid) {
        const char *id[] = { "CLIENT", "ID" };
        if ((rc = wq__rq_cmd(q, c, 2, id, NULL, &r)) < 0)
            return rc;
        c->cid = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
        freeReplyObject(r);
        if (!c->c)
            return 1;
    }
    if (c->cid <= 0)
        return 1;   /* no CLIENT ID (a proxy?): the server's timeout */
    char t[32];
    snprintf(t, sizeof t, "%.3f", (double)(ms + 1000) / 1000);
    const char *a[] = { "BLPOP", key, t };
    int done = 0;
    if (redisAppendCommandArgv(c->c, 3, a, NULL) != REDIS_OK)
        goto io;
    struct rq_nopipe np;
    wq__rq_nopipe_begin(&np);
    while (!done && redisBufferWrite(c->c, &done) == REDIS_OK)
        ;
    wq__rq_nopipe_end(&np, !done);
    if (!done)
        goto io;
    struct pollfd pfd = { .fd = c->c->fd, .events = POLLIN };
    int n;
    do
        n = poll(&pfd, 1, (int)ms);
    while (n < 0 && errno == EINTR);
    if (n == 0) {
        struct rq_conn *o;
        if (wq__rq_conn_get(q, &o) == 0) {
            char id[24];
            snprintf(id, sizeof id, "%lld", c->cid);
            const char *u[] = { "CLIENT", "UNBLOCK", id, "TIMEOUT" };
            if (wq__rq_cmd(q, o, 4, u, NULL, &r) == 0)
                freeReplyObject(r);
            wq__rq_conn_put(q, o);
        }
    }
    wq__rq_timeout(c, ms + 11000);   /* the server's own timeout, at worst */
    void *rep = NULL;
    rc = redisGetReply(c->c, &rep);
    wq__rq_timeout(c, 10000);
    if (rc != REDIS_OK || !rep)
        goto io;
    r = rep;
    if (r->type == REDIS_REPLY_ERROR) {
        /* MOVED and the like: the caller's next get call follows it. */
        wq__errf("redis %s:%d: BLPOP: %s", c->at.host, c->at.port, r->str);
        freeReplyObject(r);
        wq__rq_conn_close(c);
        return 0;
    }
    freeReplyObject(r);
    return 0;
io:
    wq__errf("redis %s:%d: BLPOP: %s", c->at.host, c->at.port,
             c->c->errstr[0] ? c->c->errstr : "connection lost");
    wq__rq_conn_close(c);
    return 0;   /* the next get call reconnects (or says why it cannot) */
}

/* Sleep on the doorbell until something may have changed. */
static int ring_wait(rq *q, struct rq_conn *c, const char *bell, uint64_t deadline,
                     uint64_t wait_us)
{
    uint64_t now = wq__now_mono();
    if (deadline != UINT64_MAX && now >= deadline)
        return -ETIMEDOUT;
    uint64_t ms = MAX_WAIT_MS;
    if (wait_us && wait_us / 1000 + 1 < ms)
        ms = wait_us / 1000 + 1;
    if (deadline != UINT64_MAX && (deadline - now) / 1000000 + 1 < ms)
        ms = (deadline - now) / 1000000 + 1;
    char key[WQ_MAX_NAME_LEN + 16], t[32];
    snprintf(key, sizeof key, "%s:%s", q->prefix, bell);
    if (wait_us || deadline != UINT64_MAX) {
        int prc = timed_wait(q, c, key, ms);
        if (prc != 1)
            return prc;
    }
    snprintf(t, sizeof t, "%.3f", (double)ms / 1000);
    const char *a[] = { "BLPOP", key, t };
    wq__rq_timeout(c, ms + 10000);
    redisReply *r;
    int rc = wq__rq_cmd(q, c, 3, a, NULL, &r);
    wq__rq_timeout(c, 10000);
    if (rc < 0)
        return rc;
    if (r->type == REDIS_REPLY_ERROR) {
        wq__errf("redis %s:%d: BLPOP: %s", c->at.host, c->at.port, r->str);
        rc = -EIO;
    }
    freeReplyObject(r);
    return rc;
}

static int get_loop(rq *q, struct rq_conn *c, void *buf, uint64_t deadline,
                    struct rq_reply *first)
{
    for (;;) {
        struct rq_reply r;
        int rc;
        if (first) {
            r = *first;
            first = NULL;
        } else if ((rc = wq__rq_eval(q, c, "get", true, 0, NULL, NULL, &r)) < 0) {
            return rc;
        }
        uint64_t wait_us;
        rc = got(q, &r, buf, &wait_us);
        wq__rq_reply_free(&r);
        if (rc != -EAGAIN)
            return rc;
        if (deadline == 0)
            return -EAGAIN;
        if ((rc = ring_wait(q, c, "b", deadline, wait_us)) < 0)
            return rc;
    }
}

static int rq_get(wq *pub, void *buf, uint64_t deadline)
{
    rq *q = self(pub);
    int rc = enter(q);
    if (rc < 0)
        return rc;
    struct rq_conn *c;
    if ((rc = wq__rq_conn_get(q, &c)) < 0)
        return rc;
    rc = get_loop(q, c, buf, deadline, NULL);
    wq__rq_conn_put(q, c);
    return rc;
}

/* done's arguments: key epoch record code message get */
static int done_args(rq *q, const void *key, size_t len, const struct wq_outcome *o,
                     bool then_get, char epoch[24], char code[16], const char *a[6],
                     size_t l[6])
{
    uint64_t e = held_epoch(q, key, len);
    epoch[0] = 0;
    if (e)
        snprintf(epoch, 24, "%llu", (unsigned long long)e);
    snprintf(code, 16, "%d", o && o->record ? o->code : 0);
    const char *msg = o && o->record && o->message ? o->message : "";
    size_t ml = strnlen(msg, 255);
    a[0] = key;
    l[0] = len;
    a[1] = epoch;
    l[1] = strlen(epoch);
    a[2] = !o || !o->record ? "0" : o->forget ? "2" : "1";   /* 2: and forget */
    l[2] = 1;
    a[3] = code;
    l[3] = strlen(code);
    a[4] = msg;
    l[4] = ml;
    a[5] = then_get ? "1" : "0";
    l[5] = 1;
    return 0;
}

static int rq_done(wq *pub, const void *key, size_t len, const struct wq_outcome *o)
{
    rq *q = self(pub);
    char epoch[24], code[16];
    const char *a[6];
    size_t l[6];
    int rc = enter(q);
    if (rc < 0)
        return rc;
    done_args(q, key, len, o, false, epoch, code, a, l);
    rc = call_rc(q, "done", true, 6, a, l);
    if (rc == 0 || rc == -ESTALE)
        held_drop(q, key, len, 0);
    return rc;
}

static int rq_done_get(wq *pub, const void *key, size_t len, const struct wq_outcome *o,
                       void *buf, uint64_t deadline)
{
    rq *q = self(pub);
    char epoch[24], code[16];
    const char *a[6];
    size_t l[6];
    int rc = enter(q);
    if (rc < 0)
        return rc;
    done_args(q, key, len, o, true, epoch, code, a, l);
    struct rq_conn *c;
    if ((rc = wq__rq_conn_get(q, &c)) < 0)
        return rc;
    struct rq_reply r;
    rc = wq__rq_eval(q, c, "done", true, 6, a, l, &r);
    if (rc == 0) {
        /* A failed done answers with its status alone; a done that
           worked answers with the get's reply. */
        bool done_failed = r.rc < 0 && r.r->elements == 1 && r.rc != -ESHUTDOWN;
        if (!done_failed || r.rc == -ESTALE)
            held_drop(q, key, len, 0);
        if (done_failed) {
            rc = (int)r.rc;
            wq__rq_reply_free(&r);
        } else {
            rc = get_loop(q, c, buf, deadline, &r);
        }
    }
    wq__rq_conn_put(q, c);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Len, shutdown, drain                                                */
/* ------------------------------------------------------------------ */

static int rq_len(wq *pub)
{
    return call_rc(self(pub), "len", false, 0, NULL, NULL);
}

static int rq_shutdown(wq *pub)
{
    return call_rc(self(pub), "shutdown", false, 0, NULL, NULL);
}

static int rq_resume(wq *pub)
{
    return call_rc(self(pub), "resume", false, 0, NULL, NULL);
}

static int rq_drain(wq *pub, uint64_t deadline)
{
    rq *q = self(pub);
    struct rq_reply r;
    long long gen, g, sd, n;
    int rc = call(q, "shutdown", false, 0, NULL, NULL, &r);
    if (rc < 0)
        return rc;
    rc = wq__rq_int(&r, 1, &gen);
    wq__rq_reply_free(&r);
    if (rc < 0)
        return rc;
    struct rq_conn *c;
    if ((rc = wq__rq_conn_get(q, &c)) < 0)
        return rc;
    for (;;) {
        if ((rc = wq__rq_eval(q, c, "drain", false, 0, NULL, NULL, &r)) < 0)
            break;
        n = r.rc;
        rc = wq__rq_int(&r, 1, &g) < 0 || wq__rq_int(&r, 2, &sd) < 0 ? -EPROTO : 0;
        wq__rq_reply_free(&r);
        if (rc < 0)
            break;
        if (g != gen) {
            rc = -ECANCELED;
            break;
        }
        if (n == 0)
            break;
        if ((rc = ring_wait(q, c, "db", deadline, 0)) < 0)
            break;
    }
    wq__rq_conn_put(q, c);
    return rc;
}

static bool rq_shutting_down(wq *pub)
{
    rq *q = self(pub);
    if (enter(q) < 0)
        return false;
    struct rq_conn *c;
    if (wq__rq_conn_get(q, &c) < 0)
        return false;
    char key[WQ_MAX_NAME_LEN + 16];
    snprintf(key, sizeof key, "%s:m", q->prefix);
    const char *a[] = { "HGET", key, "sd" };
    redisReply *r;
    bool sd = false;
    if (wq__rq_cmd(q, c, 3, a, NULL, &r) == 0) {
        sd = r->type == REDIS_REPLY_STRING && strcmp(r->str, "1") == 0;
        freeReplyObject(r);
    }
    wq__rq_conn_put(q, c);
    return sd;
}

/* ------------------------------------------------------------------ */
/* Limiter, keys, results                                              */
/* ------------------------------------------------------------------ */

static int rq_forget(wq *pub, const void *key, size_t len)
{
    return call_key(self(pub), "forget", false, key, len);
}

static int rq_remove(wq *pub, const void *key, size_t len)
{
    return call_key(self(pub), "remove", true, key, len);
}

static int rq_num_requeues(wq *pub, const void *key, size_t len)
{
    return call_key(self(pub), "nreq", false, key, len);
}

/* A result blob: '<id' code, wall time (µs), then the message. */
static void result_of(const char *s, size_t n, int *code, uint64_t *ns, const char **msg,
                      size_t *ml)
{
    *code = 0;
    *ns = 0;
    *msg = "";
    *ml = 0;
    if (n < 12)
        return;
    uint32_t c;
    double us;
    getd((const unsigned char *)get32((const unsigned char *)s, &c), &us);
    *code = (int32_t)c;
    *ns = us_to_ns(us);
    *msg = s + 12;
    *ml = n - 12 > 255 ? 255 : n - 12;
}

static int rq_result(wq *pub, const void *key, size_t len, struct wq_result *out)
{
    rq *q = self(pub);
    const char *a[] = { key };
    size_t l[] = { len };
    struct rq_reply r;
    int rc = call(q, "result", false, 1, a, l, &r);
    if (rc < 0)
        return rc;
    long long state, code, wall;
    const char *msg;
    size_t ml;
    if (wq__rq_int(&r, 1, &state) < 0 || wq__rq_int(&r, 2, &code) < 0 ||
        wq__rq_int(&r, 3, &wall) < 0 || wq__rq_str(&r, 4, &msg, &ml) < 0 || state < 0 ||
        state > WQ_STATE_FAILED || code < INT32_MIN || code > INT32_MAX) {
        wq__rq_reply_free(&r);
        return -EPROTO;
    }
    memset(out, 0, sizeof *out);
    out->state = (enum wq_state)state;
    out->code = (int)code;
    out->updated_ns = wall > 0 ? (uint64_t)wall * 1000 : 0;
    if (ml > sizeof out->message - 1)
        ml = sizeof out->message - 1;
    memcpy(out->message, msg, ml);
    out->message[ml] = 0;
    wq__rq_reply_free(&r);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Stats, metrics                                                      */
/* ------------------------------------------------------------------ */

enum { C_QUEUED = 1, C_PROC, C_WAIT, C_LIVE, C_HOLDERS, C_ADDS, C_COAL, C_RETR, C_CRASH,
       C_SD, C_FAIL, C_RESULTS, C_IDLE, C_DIRTY, C_RUNNING, C_NOW, C_COUNTS_END };

static int counts(const struct rq_reply *r, long long v[C_COUNTS_END])
{
    for (int i = 1; i < C_COUNTS_END; i++) {
        if (wq__rq_int(r, (size_t)i, &v[i]) < 0) {
            wq__errf("the server's counters: field %d is not an integer", i);
            return -EPROTO;
        }
        if (v[i] < 0) {
            wq__errf("the server's counters: field %d is %lld (below zero)", i, v[i]);
            return -EPROTO;
        }
    }
    return 0;
}

/* A server time (µs) as CLOCK_MONOTONIC ns, through the reply's "now". */
static uint64_t mono_of(long long t_us, long long now_us, uint64_t mono_now)
{
    if (t_us <= 0)
        return 0;
    long long d = t_us - now_us;
    if (d >= 0)
        return mono_now + (uint64_t)d * 1000;
    return (uint64_t)(-d) * 1000 > mono_now ? 1 : mono_now - (uint64_t)(-d) * 1000;
}

static int rq_stats(wq *pub, struct wq_stats *out)
{
    rq *q = self(pub);
    struct rq_reply r;
    int rc = call(q, "stats", false, 0, NULL, NULL, &r);
    if (rc < 0)
        return rc;
    uint64_t mono = wq__now_mono();
    long long v[C_COUNTS_END], next;
    if (counts(&r, v) < 0 || wq__rq_int(&r, C_COUNTS_END, &next) < 0) {
        if (!*wq_last_error())
            wq__errf("the server's stats reply: no next ready time (%zu fields, last type %d)",
                     r.r->elements, r.r->element[r.r->elements - 1]->type);
        wq__rq_reply_free(&r);
        return -EPROTO;
    }
    wq__rq_reply_free(&r);
    struct wq_stats s = { 0 };
    s.queued = (uint64_t)v[C_QUEUED];
    s.processing = (uint64_t)v[C_PROC];
    s.waiting = (uint64_t)v[C_WAIT];
    s.live = (uint64_t)v[C_LIVE];
    s.capacity = q->conf.capacity;
    s.processes = (uint64_t)v[C_HOLDERS];
    s.adds_total = (uint64_t)v[C_ADDS];
    s.coalesced_total = (uint64_t)v[C_COAL];
    s.retries_total = (uint64_t)v[C_RETR];
    s.crash_requeues_total = (uint64_t)v[C_CRASH];
    s.max_key_len = q->conf.max_key_len;
    s.shutting_down = v[C_SD] != 0;
    s.failing = (uint64_t)v[C_FAIL];
    s.results = (uint64_t)v[C_RESULTS];
    s.result_capacity = q->conf.result_capacity;
    s.durability = q->durability;
    s.fair = (q->conf.flags & WQ_FAIR) != 0;
    s.now_ns = mono;
    s.next_ready_ns = mono_of(next, v[C_NOW], mono);
    s.idle_results = v[C_IDLE] > v[C_FAIL] ? (uint64_t)(v[C_IDLE] - v[C_FAIL]) : 0;
    *out = s;
    return 0;
}

static int hist(const struct rq_reply *r, size_t *i, struct wq_histogram *h)
{
    redisReply *a = r->r->element[r->r->elements - 1];
    uint64_t acc = 0;
    for (int b = 0; b <= WQ_HIST_BUCKETS; b++) {
        redisReply *x = a->element[(*i)++];
        if (x->type != REDIS_REPLY_INTEGER || x->integer < 0)
            return -EPROTO;
        acc += (uint64_t)x->integer;
        h->bucket[b] = acc;
    }
    h->count = acc;
    redisReply *s = a->element[(*i)++];   /* the sum, in microseconds */
    if (s->type != REDIS_REPLY_INTEGER || s->integer < 0)
        return -EPROTO;
    h->sum_seconds = (double)s->integer / 1e6;
    return 0;
}

static int rq_metrics(wq *pub, struct wq_metrics *out)
{
    rq *q = self(pub);
    struct rq_reply r;
    int rc = call(q, "metrics", false, 0, NULL, NULL, &r);
    if (rc < 0)
        return rc;
    long long v[C_COUNTS_END], oldest;
    struct wq_metrics m = { 0 };
    size_t i = 0;
    rc = counts(&r, v) < 0 || wq__rq_int(&r, C_COUNTS_END, &oldest) < 0 ||
         r.r->elements != C_COUNTS_END + 2 ? -EPROTO : 0;
    redisReply *last = rc == 0 ? r.r->element[r.r->elements - 1] : NULL;
    if (rc == 0 && (!last || last->type != REDIS_REPLY_ARRAY ||
                    last->elements != 3 * (WQ_HIST_BUCKETS + 2)))
        rc = -EPROTO;
    if (rc == 0)
        rc = hist(&r, &i, &m.queue_duration);
    if (rc == 0)
        rc = hist(&r, &i, &m.work_duration);
    if (rc == 0)
        rc = hist(&r, &i, &m.rate_limit_delay);
    wq__rq_reply_free(&r);
    if (rc < 0)
        return rc;
    m.depth = (uint64_t)v[C_DIRTY];
    m.adds_total = (uint64_t)v[C_ADDS];
    m.retries_total = (uint64_t)v[C_RETR];
    m.coalesced_total = (uint64_t)v[C_COAL];
    m.crash_requeues_total = (uint64_t)v[C_CRASH];
    m.waiting = (uint64_t)v[C_WAIT];
    m.processing = (uint64_t)v[C_PROC];
    if (!(q->conf.flags & WQ_NO_METRICS) && m.processing > 0) {
        m.unfinished_work_seconds = (double)v[C_RUNNING] / 1e6;
        m.longest_running_processor_seconds =
            oldest < v[C_NOW] ? (double)(v[C_NOW] - oldest) / 1e6 : 0;
    }
    *out = m;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Dump, check                                                         */
/* ------------------------------------------------------------------ */

struct rec {
    uint8_t st, res;
    uint32_t fail;
    double tb, ts, seq, tag;
    int32_t prio;
};

static int rec_decode(const char *s, size_t n, struct rec *e)
{
    if (n != REC_LEN)
        return -EPROTO;
    const unsigned char *p = (const unsigned char *)s;
    e->st = p[0];
    e->res = p[1];
    p = get32(p + 2, &e->fail);
    p = getd(p, &e->tb);
    p = getd(p, &e->ts);
    p = getd(p, &e->seq);
    p = getd(p, &e->tag);
    uint32_t pr;
    get32(p, &pr);
    e->prio = (int32_t)pr;
    return 0;
}

static size_t tenant_len(const rq *q, const char *key, size_t len)
{
    if (!(q->conf.flags & WQ_FAIR) || q->conf.tenant_sep < 0)
        return 0;
    const char *p = memchr(key, q->conf.tenant_sep, len);
    return p ? (size_t)(p - key) : len;
}

static int dump_page(rq *q, const struct rq_reply *r, uint64_t *pos, wq_dump_fn fn, void *arg)
{
    size_t n = r->r->elements;
    long long now_us;
    if (n < 4 || (n - 4) % 5 || wq__rq_int(r, 3, &now_us) < 0)
        return -EPROTO;
    uint64_t mono = wq__now_mono();
    for (size_t i = 4; i < n; i += 5) {
        const char *key, *rec, *info, *res;
        size_t kl, rl, il, resl;
        long long ready;
        struct rec e;
        if (wq__rq_str(r, i, &key, &kl) < 0 || wq__rq_str(r, i + 1, &rec, &rl) < 0 ||
            wq__rq_str(r, i + 2, &info, &il) < 0 || wq__rq_str(r, i + 3, &res, &resl) < 0 ||
            wq__rq_int(r, i + 4, &ready) < 0 || kl == 0 || kl > q->pub.max_key_len)
            return -EPROTO;
        if (rl == 0)
            continue;   /* gone between the page's two reads */
        if (rec_decode(rec, rl, &e) < 0)
            return -EPROTO;
        struct wq_key_info ki = { 0 };
        ki.key = key;
        ki.len = kl;
        ki.state = (e.st & ST_DIRTY ? WQ_KEY_DIRTY : 0) | (e.st & ST_QUEUED ? WQ_KEY_QUEUED : 0) |
                   (e.st & ST_PROC ? WQ_KEY_PROCESSING : 0) | (e.st & ST_WAIT ? WQ_KEY_WAITING : 0) |
                   (e.st & ST_IDLE ? WQ_KEY_FAILING : 0);
        ki.position = e.st & ST_QUEUED ? (*pos)++ : UINT64_MAX;
        ki.failures = e.fail;
        ki.priority = e.prio;
        ki.seq = (uint32_t)(uint64_t)e.seq;
        ki.tenant_len = tenant_len(q, key, kl);
        int code;
        uint64_t wall;
        const char *msg;
        size_t ml;
        char msgbuf[256];
        result_of(res, resl, &code, &wall, &msg, &ml);
        memcpy(msgbuf, msg, ml);
        msgbuf[ml] = 0;
        ki.result = e.st & ST_PROC ? WQ_STATE_RUNNING
                  : !(e.st & ST_IDLE) ? WQ_STATE_PENDING
                  : resl >= 12 ? (code == 0 ? WQ_STATE_SUCCEEDED : WQ_STATE_FAILED)
                  : WQ_STATE_NONE;
        ki.result_code = code;
        ki.result_message = msgbuf;
        if (e.st & ST_PROC && il > 0) {
            /* info: "host pid name cid@run\nalive" */
            const char *sp = memchr(info, ' ', il);
            ki.owner_pid = sp ? (pid_t)strtol(sp + 1, NULL, 10) : 0;
            ki.holder_alive = info[il - 1] == '1';
        }
        /* The server's clock, shown on ours through its "now". */
        if (e.st & ST_PROC && e.ts > 0)
            ki.started_ns = mono_of((long long)e.ts, now_us, mono);
        if (e.st & ST_WAIT)
            ki.ready_ns = mono_of(ready, now_us, mono);
        int rc = fn(&ki, arg);
        if (rc)
            return rc;
    }
    return 0;
}

static int rq_dump(wq *pub, wq_dump_fn fn, void *arg)
{
    rq *q = self(pub);
    /* holder_alive must not show a holder whose connection is gone. */
    int rc0 = enter(q);
    if (rc0 == 0)
        rc0 = reap_now(q);
    if (rc0 < 0)
        return rc0;
    char phase[4] = "0", cur[32] = "0", cnt[16];
    snprintf(cnt, sizeof cnt, "%d", DUMP_PAGE);
    uint64_t pos = 0;
    for (;;) {
        const char *a[] = { phase, cur, cnt };
        struct rq_reply r;
        int rc = call(q, "dump", false, 3, a, NULL, &r);
        if (rc < 0)
            return rc;
        long long next_phase;
        const char *nc;
        size_t ncl;
        if (wq__rq_int(&r, 1, &next_phase) < 0 || wq__rq_str(&r, 2, &nc, &ncl) < 0 ||
            ncl >= sizeof cur || next_phase < 0 || next_phase > 2) {
            wq__rq_reply_free(&r);
            return -EPROTO;
        }
        rc = dump_page(q, &r, &pos, fn, arg);
        snprintf(phase, sizeof phase, "%lld", next_phase);
        memcpy(cur, nc, ncl);
        cur[ncl] = 0;
        wq__rq_reply_free(&r);
        if (rc)
            return rc;
        if (next_phase == 2)
            return 0;
    }
}

static int rq_check(wq *pub, unsigned flags, wq_report_fn report, void *arg)
{
    rq *q = self(pub);
    const char *a[] = { flags & WQ_CHECK_REPAIR ? "1" : "0" };
    struct rq_reply r;
    int rc = enter(q);
    if (rc < 0)
        return rc;
    if (flags & (WQ_CHECK_REAP | WQ_CHECK_REPAIR) && (rc = reap_now(q)) < 0)
        return rc;
    rc = call(q, "check", false, 1, a, NULL, &r);
    if (rc < 0)
        return rc;
    long long n = r.rc;
    if ((size_t)n + 1 != r.r->elements) {
        wq__rq_reply_free(&r);
        return -EPROTO;
    }
    for (size_t i = 1; report && i < r.r->elements; i++) {
        const char *s;
        size_t l;
        if (wq__rq_str(&r, i, &s, &l) == 0)
            report(s, arg);
    }
    wq__rq_reply_free(&r);
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

/* wq_snapshot: what the primary acknowledged so far, acknowledged by its
   replicas too (WAIT for every connected replica, 5 s at most). */
static int rq_snapshot(wq *pub)
{
    rq *q = self(pub);
    int rc = enter(q);
    if (rc < 0)
        return rc;
    struct rq_conn *c;
    if ((rc = wq__rq_conn_get(q, &c)) < 0)
        return rc;
    const char *a[] = { "INFO", "replication" };
    redisReply *r;
    long replicas = 0;
    if ((rc = wq__rq_cmd(q, c, 2, a, NULL, &r)) == 0) {
        const char *p = r->type == REDIS_REPLY_STRING ? strstr(r->str, "connected_slaves:") : NULL;
        if (p)
            replicas = strtol(p + 17, NULL, 10);
        freeReplyObject(r);
    }
    if (rc == 0 && replicas > 0) {
        /* WAIT covers this connection's writes, and the replication stream
           is ordered: one write here covers everything acknowledged before. */
        char key[WQ_MAX_NAME_LEN + 16];
        snprintf(key, sizeof key, "%s:m", q->prefix);
        const char *h[] = { "HINCRBY", key, "snapshots", "1" };
        if ((rc = wq__rq_cmd(q, c, 4, h, NULL, &r)) == 0)
            freeReplyObject(r);
    }
    if (rc == 0 && replicas > 0) {
        char n[24];
        snprintf(n, sizeof n, "%ld", replicas);
        const char *w[] = { "WAIT", n, "5000" };
        if ((rc = wq__rq_cmd(q, c, 3, w, NULL, &r)) == 0) {
            rc = r->type == REDIS_REPLY_INTEGER ? (int)r->integer : -EPROTO;
            freeReplyObject(r);
            if (rc >= 0 && rc < replicas) {
                wq__errf("queue '%s': %d of %ld replicas acknowledged within 5 s",
                         q->url.queue, rc, replicas);
                rc = -ETIMEDOUT;
            }
        }
    }
    wq__rq_conn_put(q, c);
    return rc;
}

static int rq_release_pid(wq *pub, pid_t pid)
{
    /* As the shared-memory engine, whose lease tells: only a process
       certainly gone is touched. A holder names its host and pid, and a
       pid of this host that no process has is gone (a pid reused since
       is taken as alive: nothing is released). */
    if (kill(pid, 0) == 0 || errno != ESRCH)
        return 0;
    rq *q = self(pub);
    char host[256] = "?", p[16];
    gethostname(host, sizeof host - 1);
    host[strcspn(host, " \n")] = 0;
    snprintf(p, sizeof p, "%d", (int)pid);
    const char *a[] = { host, p };
    return call_rc(q, "release", false, 2, a, NULL);
}

/* ------------------------------------------------------------------ */
/* Names: unlink, list                                                 */
/* ------------------------------------------------------------------ */

/* A handle for calls that need no queue and no holder. */
static int bare(const char *name, bool queue_optional, rq **out)
{
    rq *q = calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    pthread_mutex_init(&q->mu, NULL);
    cv_init(&q->lt_cv);
    int rc = wq__redis_url(name, queue_optional, &q->url);
    if (rc < 0) {
        rq_free(q);
        return rc;
    }
    snprintf(q->prefix, sizeof q->prefix, "wq:{%s}", q->url.queue);
    q->nodes.node = q->url.addr;
    q->nodes.seen[q->nodes.nseen++] = q->url.addr;
    *out = q;
    return 0;
}

int wq__redis_unlink(const char *name)
{
    rq *q;
    int rc = bare(name, false, &q);
    if (rc < 0)
        return rc;
    learn_nodes(q);
    struct rq_reply r;
    if ((rc = wq__rq_eval(q, &q->lc, "unlink", false, 0, NULL, NULL, &r)) == 0) {
        rc = (int)r.rc;
        wq__rq_reply_free(&r);
    }
    rq_free(q);
    return rc;
}

/* Every queue on one node: SCAN for the settings hashes "wq:{NAME}:m". */
static int list_node(const struct rq_url *u, const struct rq_addr *a,
                     int (*fn)(const char *name, void *arg), void *arg)
{
    redisContext *c;
    int rc = wq__rq_connect_addr(u, a, &c);
    if (rc < 0)
        return rc;
    char cursor[32] = "0";
    do {
        struct rq_nopipe np;
        wq__rq_nopipe_begin(&np);
        redisReply *r = redisCommand(c, "SCAN %s MATCH wq:{*}:m COUNT 1000", cursor);
        wq__rq_nopipe_end(&np, !r);
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING ||
            r->element[1]->type != REDIS_REPLY_ARRAY || r->element[0]->len >= sizeof cursor) {
            if (r && r->type == REDIS_REPLY_ERROR)
                wq__errf("redis %s:%d: SCAN: %s", a->host, a->port, r->str);
            rc = r ? -EPROTO : -ECONNRESET;
            if (r)
                freeReplyObject(r);
            break;
        }
        memcpy(cursor, r->element[0]->str, r->element[0]->len + 1);
        for (size_t i = 0; rc == 0 && i < r->element[1]->elements; i++) {
            redisReply *k = r->element[1]->element[i];
            if (k->type != REDIS_REPLY_STRING || k->len < 7)
                continue;
            char qn[WQ_MAX_NAME_LEN + 1];
            size_t n = k->len - 6;   /* "wq:{" ... "}:m" */
            if (n > WQ_MAX_NAME_LEN || strcmp(k->str + k->len - 3, "}:m") != 0)
                continue;
            memcpy(qn, k->str + 4, n - 1);
            qn[n - 1] = 0;
            if (!wq__name_ok(qn))
                continue;
            char full[RQ_HOST_MAX + WQ_MAX_NAME_LEN + 32];
            snprintf(full, sizeof full, "redis://%s:%d/%s", u->addr.host, u->addr.port, qn);
            rc = fn(full, arg);
        }
        freeReplyObject(r);
    } while (rc == 0 && strcmp(cursor, "0") != 0);
    redisFree(c);
    return rc;
}

int wq__redis_list(const char *where, int (*fn)(const char *name, void *arg), void *arg)
{
    rq *q;
    int rc = bare(where, true, &q);
    if (rc < 0)
        return rc;
    learn_nodes(q);
    if (!q->lc.c && !q->nodes.cluster) {
        rq_free(q);
        return list_node(&q->url, &q->url.addr, fn, arg);
    }
    /* A cluster: every master (replicas hold the same keys). */
    const char *a[] = { "CLUSTER", "SLOTS" };
    redisReply *r;
    struct rq_addr masters[RQ_NODES_MAX];
    unsigned nm = 0;
    if (q->nodes.cluster && wq__rq_cmd(q, &q->lc, 2, a, NULL, &r) == 0) {
        for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements && nm < RQ_NODES_MAX;
             i++) {
            redisReply *s = r->element[i];
            if (s->type != REDIS_REPLY_ARRAY || s->elements < 3 ||
                s->element[2]->type != REDIS_REPLY_ARRAY || s->element[2]->elements < 2 ||
                s->element[2]->element[0]->type != REDIS_REPLY_STRING ||
                s->element[2]->element[1]->type != REDIS_REPLY_INTEGER ||
                s->element[2]->element[0]->len > RQ_HOST_MAX)
                continue;
            struct rq_addr m;
            memcpy(m.host, s->element[2]->element[0]->str, s->element[2]->element[0]->len + 1);
            m.port = (int)s->element[2]->element[1]->integer;
            bool dup = false;
            for (unsigned k = 0; k < nm; k++)
                dup |= strcmp(masters[k].host, m.host) == 0 && masters[k].port == m.port;
            if (!dup)
                masters[nm++] = m;
        }
        freeReplyObject(r);
    } else {
        masters[nm++] = q->url.addr;
    }
    for (unsigned i = 0; rc == 0 && i < nm; i++)
        rc = list_node(&q->url, &masters[i], fn, arg);
    rq_free(q);
    return rc;
}

static const struct wq_engine redis_engine = {
    .name = "redis",
    .close = rq_close,
    .add = rq_add,
    .add_many = rq_add_many,
    .get = rq_get,
    .done = rq_done,
    .done_get = rq_done_get,
    .len = rq_len,
    .shutdown = rq_shutdown,
    .resume = rq_resume,
    .drain = rq_drain,
    .shutting_down = rq_shutting_down,
    .forget = rq_forget,
    .remove = rq_remove,
    .num_requeues = rq_num_requeues,
    .result = rq_result,
    .stats = rq_stats,
    .metrics = rq_metrics,
    .dump = rq_dump,
    .check = rq_check,
    .snapshot = rq_snapshot,
    .release_pid = rq_release_pid,
};
