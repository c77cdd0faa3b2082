/*
 * conn.c - connections to the server, cluster redirects, the script, and
 * the checks every reply passes before the engine reads it.
 *
 * A handle keeps a pool of connections; a call takes one for its whole
 * duration (a wq_get blocked in BLPOP holds its own), so threads never
 * share one. Connections are made lazily and again after a drop, on the
 * next call: a command that finds its connection gone is sent once more on
 * a new one (to the queue's node, else to any node known), under the same
 * request number, so the server's receipt answers a call that already ran
 * instead of running it twice (wq.lua). While no node answers, calls fail
 * at once with the system's error (-ECONNREFUSED, ...) and wq_last_error
 * naming the server.
 *
 * The server side is a function library (wq.lua): loaded with FUNCTION LOAD
 * the first time a node answers that it does not have it, called with
 * FCALL.
 *
 * Redis Cluster: a queue lives in one slot (its hash tag). MOVED points
 * the handle at the slot's new owner for every later call; ASK sends one
 * command to the importing node after ASKING; TRYAGAIN, CLUSTERDOWN,
 * MASTERDOWN and LOADING (a resharding or a failover under way) are
 * retried for up to RETRY_MS. After a failover the old owner refuses
 * connections: the other nodes known (from CLUSTER SLOTS at open and from
 * redirects) are asked instead, and redirect to the new owner.
 *
 * Never trusted: reply types, array lengths, integers' ranges, error
 * numbers (only those wq.lua may send), key lengths (engine.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "redis.h"
#include "redis/lua.h"   /* wq__lua: wq.lua as a C string (generated) */

/* The function library: wq.lua with @NAME@ replaced by a name that
   carries a hash of the text, so two libwq versions on one server never
   run each other's code. Built once per process. */
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static char lib_name[24];
static char *lib_text;
static size_t lib_len;

static void lib_build(void)
{
    snprintf(lib_name, sizeof lib_name, "wq_%016llx",
             (unsigned long long)wq__fnv1a(wq__lua, sizeof wq__lua - 1));
    size_t n = sizeof wq__lua - 1, nl = strlen(lib_name);
    lib_text = malloc(n + 16 * nl + 1);
    if (!lib_text)
        return;
    const char *p = wq__lua;
    char *o = lib_text;
    for (const char *m; (m = strstr(p, "@NAME@")); p = m + 6) {
        memcpy(o, p, (size_t)(m - p));
        o += m - p;
        memcpy(o, lib_name, nl);
        o += nl;
    }
    strcpy(o, p);
    lib_len = strlen(lib_text);
}

#define RETRY_MS 5000          /* cluster transitions: how long a call retries */
#define CONNECT_MS 2000
#define COMMAND_MS 10000       /* a command (not a BLPOP) that takes longer fails */
#define MAX_REDIRECTS 16

/* wq.lua speaks Linux errno numbers. */
_Static_assert(ENOENT == 2 && EAGAIN == 11 && EBUSY == 16 && EEXIST == 17 && EINVAL == 22 &&
               ENOSPC == 28 && EIDRM == 43 && EBADMSG == 74 && ESHUTDOWN == 108 &&
               ESTALE == 116, "wq.lua's errno numbers are Linux's");

static bool script_errno(long long e)
{
    switch (-e) {
    case ENOENT: case EAGAIN: case EBUSY: case EEXIST: case EINVAL: case ENOSPC:
    case EIDRM: case EBADMSG: case ESHUTDOWN: case ESTALE:
        return true;
    }
    return false;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };
    nanosleep(&ts, NULL);
}

static struct timeval tv_ms(uint64_t ms)
{
    struct timeval tv = { (time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000 };
    return tv;
}

/* A connection error as an errno, with the server named. */
static int conn_err(const struct rq_addr *a, const redisContext *c, int sys)
{
    int e;
    switch (c ? c->err : 0) {
    case REDIS_ERR_EOF:
        e = ECONNRESET;
        break;
    case REDIS_ERR_IO:
        e = sys == ETIMEDOUT || sys == EAGAIN || sys == EWOULDBLOCK ? ETIMEDOUT
          : sys == ECONNREFUSED || sys == EHOSTUNREACH || sys == ENETUNREACH ||
            sys == ECONNRESET || sys == EPIPE ? sys
          : ECONNREFUSED;
        break;
    default:   /* REDIS_ERR_OTHER: name resolution, mostly */
        e = EHOSTUNREACH;
    }
    wq__errf("redis %s:%d: %s", a->host, a->port,
             c && c->errstr[0] ? c->errstr : "cannot connect");
    return -e;
}

int wq__rq_connect_addr(const struct rq_url *u, const struct rq_addr *a, redisContext **out)
{
    redisContext *c = redisConnectWithTimeout(a->host, a->port, tv_ms(CONNECT_MS));
    if (!c)
        return -ENOMEM;
    if (c->err) {
        int rc = conn_err(a, c, errno);
        redisFree(c);
        return rc;
    }
    redisEnableKeepAlive(c);
    redisSetTimeout(c, tv_ms(COMMAND_MS));
    if (u->pass[0]) {
        redisReply *r = u->user[0] ? redisCommand(c, "AUTH %s %s", u->user, u->pass)
                                   : redisCommand(c, "AUTH %s", u->pass);
        int rc = 0;
        if (!r) {
            rc = conn_err(a, c, errno);
        } else if (r->type == REDIS_REPLY_ERROR) {
            wq__errf("redis %s:%d: AUTH refused: %s", a->host, a->port, r->str);
            rc = -EACCES;
        }
        if (r)
            freeReplyObject(r);
        if (rc < 0) {
            redisFree(c);
            return rc;
        }
    }
    *out = c;
    return 0;
}

void wq__rq_conn_close(struct rq_conn *c)
{
    if (c->c)
        redisFree(c->c);
    c->c = NULL;
    c->cid = 0;
}

/* Connect c to the queue's node, else to any node known. */
static int reconnect(rq *q, struct rq_conn *c)
{
    struct rq_addr try[RQ_NODES_MAX + 1];
    unsigned n = 0;
    pthread_mutex_lock(&q->mu);
    try[n++] = q->nodes.node;
    for (unsigned i = 0; i < q->nodes.nseen; i++)
        if (strcmp(q->nodes.seen[i].host, q->nodes.node.host) != 0 ||
            q->nodes.seen[i].port != q->nodes.node.port)
            try[n++] = q->nodes.seen[i];
    pthread_mutex_unlock(&q->mu);
    int first = 0;
    char why[512] = "";
    for (unsigned i = 0; i < n; i++) {
        int rc = wq__rq_connect_addr(&q->url, &try[i], &c->c);
        if (rc == 0) {
            c->at = try[i];
            return 0;
        }
        if (i == 0) {
            first = rc;
            snprintf(why, sizeof why, "%s", wq_last_error());
        }
        if (rc == -EACCES)
            return rc;
    }
    wq__errf("%s", why);   /* the queue's own node is the one to name */
    return first;
}

static void remember(rq *q, const struct rq_addr *a, bool owner)
{
    pthread_mutex_lock(&q->mu);
    if (owner)
        q->nodes.node = *a;
    bool known = false;
    for (unsigned i = 0; i < q->nodes.nseen; i++)
        known |= strcmp(q->nodes.seen[i].host, a->host) == 0 && q->nodes.seen[i].port == a->port;
    if (!known && q->nodes.nseen < RQ_NODES_MAX)
        q->nodes.seen[q->nodes.nseen++] = *a;
    pthread_mutex_unlock(&q->mu);
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ...": the address part. */
static bool redirect_addr(const char *msg, struct rq_addr *a)
{
    const char *sp = strchr(msg, ' ');
    sp = sp ? strchr(sp + 1, ' ') : NULL;
    if (!sp)
        return false;
    const char *colon = strrchr(sp + 1, ':');
    if (!colon || colon == sp + 1 || (size_t)(colon - sp - 1) > RQ_HOST_MAX)
        return false;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port <= 0 || port > 65535)
        return false;
    memcpy(a->host, sp + 1, (size_t)(colon - sp - 1));
    a->host[colon - sp - 1] = 0;
    a->port = (int)port;
    return true;
}

static bool starts(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

/* One command to the node an ASK named: ASKING, then the command. */
static int ask(rq *q, const struct rq_addr *a, int argc, const char *const *argv,
               const size_t *lens, redisReply **out)
{
    redisContext *c;
    int rc = wq__rq_connect_addr(&q->url, a, &c);
    if (rc < 0)
        return rc;
    redisAppendCommand(c, "ASKING");
    redisAppendCommandArgv(c, argc, (const char **)argv, lens);
    redisReply *r1 = NULL, *r2 = NULL;
    struct rq_nopipe np;
    wq__rq_nopipe_begin(&np);
    bool ok = redisGetReply(c, (void **)&r1) == REDIS_OK && redisGetReply(c, (void **)&r2) == REDIS_OK;
    wq__rq_nopipe_end(&np, !ok);
    if (!ok) {
        rc = conn_err(a, c, errno);
    } else {
        *out = r2;
        r2 = NULL;
    }
    if (r1)
        freeReplyObject(r1);
    if (r2)
        freeReplyObject(r2);
    redisFree(c);
    return rc;
}

/* mark: a request number argument whose first byte becomes 'r' when the
   command is sent again (wq.lua then answers from its receipt). */
static int cmd(rq *q, struct rq_conn *c, int argc, const char *const *argv, const size_t *lens,
               redisReply **out, char *mark)
{
    uint64_t give_up = 0;
    int redirects = 0, resends = 0;
    for (;;) {
        int rc;
        if (!c->c && (rc = reconnect(q, c)) < 0) {
            /* In a cluster, a failover makes the owner unreachable until
               a replica takes over: keep trying for a while. */
            uint64_t now = wq__now_mono();
            if (!q->nodes.cluster || rc == -EACCES)
                return rc;
            if (!give_up)
                give_up = now + (uint64_t)RETRY_MS * 1000000;
            if (now >= give_up)
                return rc;
            sleep_ms(100);
            continue;
        }
        struct rq_nopipe np;
        wq__rq_nopipe_begin(&np);
        redisReply *r = redisCommandArgv(c->c, argc, (const char **)argv, lens);
        wq__rq_nopipe_end(&np, !r);
        if (!r) {
            rc = conn_err(&c->at, c->c, errno);
            wq__rq_conn_close(c);
            /* Dropped: once more on a new connection (the receipt makes a
               mutating call safe to resend), unless it timed out: then
               the server is alive and slow, and waiting again would only
               double the wait. */
            if (rc != -ETIMEDOUT && resends++ < 1) {
                if (mark && mark[0])
                    mark[0] = 'r';
                continue;
            }
            return rc;
        }
        if (r->type == REDIS_REPLY_ERROR && r->str) {
            struct rq_addr a;
            bool moved = starts(r->str, "MOVED "), asked = starts(r->str, "ASK ");
            if ((moved || asked) && redirect_addr(r->str, &a)) {
                if (redirects++ < MAX_REDIRECTS) {
                    freeReplyObject(r);
                    if (asked)
                        return ask(q, &a, argc, argv, lens, out);
                    remember(q, &a, true);
                    wq__rq_conn_close(c);
                    continue;
                }
                redirects = 0;   /* pointed at an owner that does not answer: */
            }                    /* a failover under way, retried below */
            if (moved || starts(r->str, "TRYAGAIN") || starts(r->str, "CLUSTERDOWN") ||
                starts(r->str, "MASTERDOWN") || starts(r->str, "LOADING")) {
                uint64_t now = wq__now_mono();
                if (!give_up)
                    give_up = now + (uint64_t)RETRY_MS * 1000000;
                if (now < give_up) {
                    freeReplyObject(r);
                    sleep_ms(50);
                    wq__rq_conn_close(c);   /* the slot's owner may change */
                    continue;
                }
            }
        }
        *out = r;
        return 0;
    }
}

int wq__rq_cmd(rq *q, struct rq_conn *c, int argc, const char *const *argv,
               const size_t *lens, redisReply **out)
{
    return cmd(q, c, argc, argv, lens, out, NULL);
}

/* hiredis 0.14 writes with write(2): a server that closed the connection
   raises SIGPIPE, whose default action would kill the program. */
void wq__rq_nopipe_begin(struct rq_nopipe *s)
{
    sigset_t p, pend;
    sigemptyset(&p);
    sigaddset(&p, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &p, &s->old);
    s->pending = sigpending(&pend) == 0 && sigismember(&pend, SIGPIPE);
}

void wq__rq_nopipe_end(struct rq_nopipe *s, bool failed)
{
    if (failed && !s->pending) {
        sigset_t p;
        struct timespec zero = { 0, 0 };
        sigemptyset(&p);
        sigaddset(&p, SIGPIPE);
        while (sigtimedwait(&p, NULL, &zero) > 0)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &s->old, NULL);
}

void wq__rq_timeout(struct rq_conn *c, uint64_t ms)
{
    if (c->c)
        redisSetTimeout(c->c, tv_ms(ms));
}

/* A server error reply as an errno, with the server's words. */
static int server_err(const struct rq_conn *c, const char *op, const char *msg)
{
    wq__errf("redis %s:%d: %s: %s", c->at.host, c->at.port, op, msg);
    if (starts(msg, "OOM"))
        return -ENOSPC;
    if (starts(msg, "NOPERM") || starts(msg, "NOAUTH") || starts(msg, "WRONGPASS"))
        return -EACCES;
    if (starts(msg, "READONLY"))
        return -EROFS;
    if (starts(msg, "BUSY"))
        return -EBUSY;
    return -EIO;
}

/* FUNCTION LOAD of the library on c's node. */
static int load_library(rq *q, struct rq_conn *c)
{
    if (!lib_text)
        return -ENOMEM;
    const char *argv[] = { "FUNCTION", "LOAD", lib_text };
    size_t lens[] = { 8, 4, lib_len };
    redisReply *r;
    int rc = wq__rq_cmd(q, c, 3, argv, lens, &r);
    if (rc < 0)
        return rc;
    /* Another client may have loaded it first: the same text, fine. */
    if (r->type == REDIS_REPLY_ERROR && !strstr(r->str, "already exists"))
        rc = server_err(c, "FUNCTION LOAD", r->str);
    freeReplyObject(r);
    return rc;
}

void wq__rq_reply_free(struct rq_reply *r)
{
    if (r->r)
        freeReplyObject(r->r);
    r->r = NULL;
}

int wq__rq_eval(rq *q, struct rq_conn *c, const char *op, bool receipt, int nargs,
                const char *const *args, const size_t *lens, struct rq_reply *out)
{
    char slot[16], req[24];
    pthread_once(&lib_once, lib_build);
    if (!lib_text)
        return -ENOMEM;
    snprintf(slot, sizeof slot, "%u", c->slot);
    req[0] = 0;
    if (receipt)
        snprintf(req, sizeof req, "n%llu", (unsigned long long)++c->reqid);
    int argc = 8 + nargs;
    const char *fixed[8] = { "FCALL", lib_name, "1", q->prefix, op, q->holder, slot, req };
    const char *small[32];
    size_t smalllen[32];
    const char **argv = argc <= 32 ? small : malloc((size_t)argc * sizeof *argv);
    size_t *alen = argc <= 32 ? smalllen : malloc((size_t)argc * sizeof *alen);
    if (!argv || !alen) {
        if (argv != small)
            free(argv);
        if (alen != smalllen)
            free(alen);
        return -ENOMEM;
    }
    for (int i = 0; i < 8; i++) {
        argv[i] = fixed[i];
        alen[i] = strlen(fixed[i]);
    }
    for (int i = 0; i < nargs; i++) {
        argv[8 + i] = args[i];
        alen[8 + i] = lens ? lens[i] : strlen(args[i]);
    }
    redisReply *r = NULL;
    int rc = cmd(q, c, argc, argv, alen, &r, req);
    if (rc == 0 && r->type == REDIS_REPLY_ERROR && r->str &&
        strstr(r->str, "Function not found")) {
        /* A node without the library (new, restarted without it, a
           replica that took over before it had it): load, call again. */
        freeReplyObject(r);
        r = NULL;
        rc = load_library(q, c);
        if (rc == 0)
            rc = cmd(q, c, argc, argv, alen, &r, req);
    }
    if (argv != small)
        free(argv);
    if (alen != smalllen)
        free(alen);
    if (rc < 0)
        return rc;
    out->r = r;
    if (r->type == REDIS_REPLY_ERROR) {
        rc = server_err(c, op, r->str ? r->str : "error");
    } else if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 || !r->element[0] ||
               r->element[0]->type != REDIS_REPLY_INTEGER) {
        wq__errf("redis %s:%d: %s: unexpected reply", c->at.host, c->at.port, op);
        rc = -EPROTO;
    } else {
        out->rc = r->element[0]->integer;
        if (out->rc < 0 && !script_errno(out->rc)) {
            wq__errf("redis %s:%d: %s: unexpected error number %lld", c->at.host, c->at.port,
                     op, out->rc);
            rc = -EPROTO;
        }
    }
    if (rc < 0)
        wq__rq_reply_free(out);
    return rc;
}

int wq__rq_int(const struct rq_reply *r, size_t i, long long *v)
{
    if (i >= r->r->elements || !r->r->element[i] ||
        r->r->element[i]->type != REDIS_REPLY_INTEGER)
        return -EPROTO;
    *v = r->r->element[i]->integer;
    return 0;
}

int wq__rq_str(const struct rq_reply *r, size_t i, const char **s, size_t *len)
{
    if (i >= r->r->elements || !r->r->element[i] ||
        r->r->element[i]->type != REDIS_REPLY_STRING)
        return -EPROTO;
    *s = r->r->element[i]->str;
    *len = r->r->element[i]->len;
    return 0;
}

int wq__rq_conn_get(rq *q, struct rq_conn **out)
{
    pthread_mutex_lock(&q->mu);
    if (q->nidle > 0) {
        *out = q->idle[--q->nidle];
        pthread_mutex_unlock(&q->mu);
        return 0;
    }
    unsigned slot = ++q->next_slot;
    pthread_mutex_unlock(&q->mu);
    struct rq_conn *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->slot = slot;
    *out = c;
    return 0;
}

void wq__rq_conn_put(rq *q, struct rq_conn *c)
{
    pthread_mutex_lock(&q->mu);
    if (q->nidle == q->idle_cap) {
        unsigned cap = q->idle_cap ? q->idle_cap * 2 : 4;
        struct rq_conn **n = realloc(q->idle, cap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&q->mu);
            wq__rq_conn_close(c);
            free(c);
            return;
        }
        q->idle = n;
        q->idle_cap = cap;
    }
    q->idle[q->nidle++] = c;
    pthread_mutex_unlock(&q->mu);
}
