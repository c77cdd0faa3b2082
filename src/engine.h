/*
 * engine.h - the seam between the public API (api.c) and an engine.
 *
 * api.c checks every argument once (NULL pointers, key lengths, timeouts,
 * flag bits) and then calls the handle's engine through this table; an
 * engine may assume its arguments are valid. Every handle starts with
 * struct wq, so api.c can read what it needs without knowing the engine.
 *
 * Engines: the shared-memory engine (shm/engine.c), selected for every
 * plain queue name, and the Redis engine (redis/engine.c) for names that
 * start with redis://. What an engine cannot do it answers with -ENOTSUP.
 */
#ifndef WQ_ENGINE_H
#define WQ_ENGINE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "wq.h"

/* One add, whichever public call made it: wq_add, wq_add_after,
   wq_add_rate_limited, wq_add_opts and each key of wq_add_many. */
struct wq_add_req {
    const void *key;
    size_t len;
    int priority;          /* WQ_FAIR queues only (api.c checks) */
    uint64_t after_ns;     /* > 0: ready after this delay */
    bool rate_limited;     /* the limiter's delay (the smaller one wins) */
    bool delayed;          /* a DelayingInterface call: counts in
                              retries_total and merges with a wait even
                              when its delay comes out 0 */
    bool published;        /* shm engine: an add published to a lane
                              (wq_add_publish) being applied; it was
                              made before any shutdown that came after */
    bool take_lane;        /* shm engine: wq_add_publish's locked way; its
                              lock-free tries were made, and the handle
                              takes a lane for its next adds */
};

/* What wq_finish records with its done (record false: plain wq_done). */
struct wq_outcome {
    bool record;
    int code;
    const char *message;
    bool forget;    /* also reset the failure count (wq_finish_get) */
};

struct wq_engine {
    const char *name;
    void (*close)(wq *q);
    int (*add)(wq *q, const struct wq_add_req *r);
    int (*add_many)(wq *q, const struct iovec *keys, size_t n);
    /* wq_add_publish; NULL: the engine's plain add serves */
    int (*add_publish)(wq *q, const void *key, size_t len);
    /* deadline: absolute CLOCK_MONOTONIC ns, 0 = do not block,
       UINT64_MAX = forever; buf holds at least max_key_len bytes. */
    int (*get)(wq *q, void *buf, uint64_t deadline);
    int (*done)(wq *q, const void *key, size_t len, const struct wq_outcome *o);
    /* o: as done's (wq_finish_get), or NULL (wq_done_get). */
    int (*done_get)(wq *q, const void *key, size_t len, const struct wq_outcome *o,
                    void *buf, uint64_t deadline);
    /* Batches (optional: NULL makes api.c loop over get and done). get_many
       hands out 1 .. n keys packed into buf (size >= max_key_len bytes),
       keys[i] pointing at each; done_many returns how many keys it
       finished, skipping those that are not processing. */
    int (*get_many)(wq *q, void *buf, size_t size, struct iovec *keys, size_t n,
                    uint64_t deadline);
    int (*done_many)(wq *q, const struct iovec *keys, size_t n);
    int (*len)(wq *q);
    int (*shutdown)(wq *q);
    int (*resume)(wq *q);
    int (*drain)(wq *q, uint64_t deadline);
    bool (*shutting_down)(wq *q);
    int (*forget)(wq *q, const void *key, size_t len);
    int (*remove)(wq *q, const void *key, size_t len);
    int (*num_requeues)(wq *q, const void *key, size_t len);
    int (*result)(wq *q, const void *key, size_t len, struct wq_result *out);
    int (*stats)(wq *q, struct wq_stats *out);
    int (*metrics)(wq *q, struct wq_metrics *out);
    int (*dump)(wq *q, wq_dump_fn fn, void *arg);
    int (*check)(wq *q, unsigned flags, wq_report_fn report, void *arg);
    int (*snapshot)(wq *q);
    int (*release_pid)(wq *q, pid_t pid);
    /* Optional (an engine without a process table has none): give up
       the handle's process slot until its next call that holds or
       changes keys; -EBUSY while it holds a key or a get of it sleeps. */
    int (*park)(wq *q);
};

/* The head of every handle. Written once by the engine's open. */
struct wq {
    const struct wq_engine *eng;
    uint32_t max_key_len;
    bool fair;
    bool observe;     /* WQ_OBSERVE: api.c refuses the calls that hold or change keys */
    char name[640];   /* a queue name, or a redis:// URL without its password */
};

/* The shared-memory engine (shm/engine.c). Names are plain queue names. */
int wq__shm_open(const char *name, const struct wq_options *o, wq **out);
int wq__shm_unlink(const char *name);
int wq__shm_list(int (*fn)(const char *name, void *arg), void *arg);

/* The Redis engine (redis/engine.c), built with hiredis (WQ_HAVE_REDIS).
   Names are redis:// URLs. */
#define WQ_REDIS_SCHEME "redis://"
int wq__redis_open(const char *name, const struct wq_options *o, wq **out);
int wq__redis_unlink(const char *name);
int wq__redis_list(const char *where, int (*fn)(const char *name, void *arg), void *arg);

#endif
