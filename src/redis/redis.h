/*
 * redis.h - the Redis engine's handle and its connection layer.
 *
 * A queue named redis://[[user]:password@]host[:port]/NAME lives on a
 * Redis server (or a Redis Cluster) as the keys "wq:{NAME}:*" (wq.lua
 * lists them). Every operation is one call of wq.lua's function (conn.c:
 * FCALL; FUNCTION LOAD where missing), so the state machine lives on the
 * server, in one
 * file, and is atomic there; this side checks every reply before it
 * trusts it, keeps the epochs of the keys its process holds (the fencing
 * token that wq_done sends back), and renews the handle's lease from a
 * thread (engine.c).
 *
 * Files: url.c (names), conn.c (connections, redirects, scripts,
 * replies), engine.c (the wq_engine operations, leases, fork).
 */
#ifndef WQ_REDIS_H
#define WQ_REDIS_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

#include "internal.h"
#include "engine.h"

#define RQ_HOST_MAX 255
#define RQ_NODES_MAX 32

struct rq_addr {
    char host[RQ_HOST_MAX + 1];
    int port;
};

/* A parsed queue name. */
struct rq_url {
    char user[128];
    char pass[256];
    struct rq_addr addr;
    char queue[WQ_MAX_NAME_LEN + 1];   /* "" for a server address alone */
};

/* url.c: true when name selects the Redis engine. */
bool wq__redis_name(const char *name);
/* Parse "redis://[[user]:password@]host[:port][/NAME]"; a queue name is
   required unless queue_optional. -EINVAL (wq_last_error says why). */
int wq__redis_url(const char *name, bool queue_optional, struct rq_url *u);

/* One connection, used by one call at a time. */
struct rq_conn {
    redisContext *c;
    struct rq_addr at;       /* the node it is connected to */
    unsigned slot;           /* receipts are per holder:slot */
    uint64_t reqid;          /* the last request number sent on it */
    long long cid;           /* its CLIENT ID, 0 until asked (timed waits) */
};

/* The known nodes: the queue's slot owner first. */
struct rq_nodes {
    struct rq_addr node;     /* who serves the queue (MOVED updates it) */
    struct rq_addr seen[RQ_NODES_MAX];
    unsigned nseen;
    bool cluster;
};

/* A key this process holds, with the epoch it was handed out with. */
struct rq_held {
    struct rq_held *next;
    uint64_t epoch;
    size_t len;
    unsigned char key[];
};
#define RQ_HELD_BUCKETS 1024

typedef struct rq {
    struct wq pub;                 /* must come first (engine.h) */
    struct rq_url url;
    char prefix[WQ_MAX_NAME_LEN + 8];   /* "wq:{NAME}" */
    size_t prefix_len;
    struct wq_conf conf;
    uint32_t lease_ms;
    uint32_t durability;           /* WQ_DURABLE_* as resolved at open */

    pthread_mutex_t mu;            /* everything below */
    struct rq_nodes nodes;
    struct rq_conn **idle;         /* connections not in use */
    unsigned nidle, idle_cap;
    unsigned next_slot;
    char holder[33];               /* this process's lease id */
    char info[512];                /* "host pid name client-id@run-id" */
    unsigned fork_gen;
    struct rq_held *held[RQ_HELD_BUCKETS];
    uint64_t nheld;

    /* The lease thread (engine.c). */
    pthread_t lt;
    bool lt_on, lt_stop, lt_started;
    pthread_cond_t lt_cv;
    pthread_mutex_t lt_busy;       /* held while it renews (fork waits) */
    struct rq *lt_next;            /* the handles with a lease thread */
    struct rq_conn lc;             /* its own connection */
} rq;

/* conn.c */
struct rq_reply {
    redisReply *r;                 /* an array, element 0 an integer */
    long long rc;                  /* element 0: >= 0, or a negative errno */
};
int wq__rq_conn_get(rq *q, struct rq_conn **out);
void wq__rq_conn_put(rq *q, struct rq_conn *c);
void wq__rq_conn_close(struct rq_conn *c);
/* Call wq.lua's op on c. receipt: a mutating op whose reply, if lost to a
   dropped connection, is asked for again under the same request number.
   args may hold binary strings (lens). 0 with *out filled, or a negative
   errno (wq_last_error says what happened). */
int wq__rq_eval(rq *q, struct rq_conn *c, const char *op, bool receipt, int nargs,
                const char *const *args, const size_t *lens, struct rq_reply *out);
/* Any other command (BLPOP, CLIENT, INFO), with the same redirects. */
int wq__rq_cmd(rq *q, struct rq_conn *c, int argc, const char *const *argv,
               const size_t *lens, redisReply **out);
void wq__rq_reply_free(struct rq_reply *r);
/* Checked reads of element i of an eval reply. */
int wq__rq_int(const struct rq_reply *r, size_t i, long long *v);
int wq__rq_str(const struct rq_reply *r, size_t i, const char **s, size_t *len);
/* A command timeout for the next command on c (BLPOP: its own wait). */
void wq__rq_timeout(struct rq_conn *c, uint64_t ms);
/* Around a hiredis call that writes: SIGPIPE blocked in this thread, and
   the one a write to a closed connection raised (failed: the call
   failed) consumed before the mask is restored. */
struct rq_nopipe {
    sigset_t old;
    bool pending;   /* one was pending before: not ours to consume */
};
void wq__rq_nopipe_begin(struct rq_nopipe *s);
void wq__rq_nopipe_end(struct rq_nopipe *s, bool failed);
/* The first node that answers, for queue-less calls (wq_list_at). */
int wq__rq_connect_addr(const struct rq_url *u, const struct rq_addr *a, redisContext **out);

#endif
