/*
 * api.c - the public entry points of wq.h: every argument is checked
 * here, once, and the call goes to the handle's engine (engine.h).
 *
 * What every call may assume after this file: the handle and pointers
 * are not NULL, keys are 1..max_key_len bytes, buffers hold max_key_len
 * bytes, timeouts are turned into absolute CLOCK_MONOTONIC deadlines,
 * flags have no unknown bits, and a priority is only given to a WQ_FAIR
 * queue. Queue names select the engine: a plain name is a shared-memory
 * queue.
 *
 * wq_strerror is here too: libwq's wording of every errno its calls
 * return (wq.h's ERRORS table).
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "engine.h"
#include "store/store.h"

/* The public structs' sizes are ABI (wq.h, "Growth"): they change only
   by taking reserved space. Checked for LP64 builds. */
#if defined(__LP64__)
_Static_assert(sizeof(struct wq_options) == 176, "wq_options is ABI");
_Static_assert(sizeof(struct wq_add_opts) == 56, "wq_add_opts is ABI");
_Static_assert(sizeof(struct wq_result) == 304, "wq_result is ABI");
_Static_assert(sizeof(struct wq_stats) == 320, "wq_stats is ABI");
_Static_assert(sizeof(struct wq_metrics) == 408, "wq_metrics is ABI");
#endif

static inline int key_ok(const wq *q, const void *key, size_t len)
{
    if (WQ_UNLIKELY(!key || len == 0))
        return -EINVAL;
    return WQ_UNLIKELY(len > q->max_key_len) ? -EMSGSIZE : 0;
}

static int keys_ok(const wq *q, const struct iovec *keys, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int rc = key_ok(q, keys[i].iov_base, keys[i].iov_len);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Life cycle                                                          */
/* ------------------------------------------------------------------ */

static bool redis_name(const char *name)
{
    return name && strncmp(name, WQ_REDIS_SCHEME, sizeof WQ_REDIS_SCHEME - 1) == 0;
}

#ifndef WQ_HAVE_REDIS
static int no_redis(const char *name)
{
    wq__errf("'%s': this libwq was built without the Redis engine (hiredis)", name);
    return -ENOTSUP;
}
#define wq__redis_open(name, o, out) no_redis(name)
#define wq__redis_unlink(name) no_redis(name)
#define wq__redis_list(where, fn, arg) no_redis(where)
#endif

int wq_open(const char *name, const struct wq_options *opts, wq **out)
{
    wq__err_clear();
    /* Each engine sets the handle's observe (WQ_OBSERVE) as it opens. */
    if (out && redis_name(name))
        return wq__redis_open(name, opts, out);   /* checks its own options */
    if (!out)
        return -EINVAL;
    int rc = wq__name_check(name);
    if (rc < 0)
        return rc;
    if (opts && (rc = wq__options_check(opts)) < 0)
        return rc;
    return wq__shm_open(name, opts, out);
}

/* A WQ_OBSERVE handle holds no process slot: the calls that hold or
   change keys are refused, whatever the engine. */
static int observer(const wq *q, const char *what)
{
    wq__errf("queue '%s': opened with WQ_OBSERVE, which takes no process slot: it "
             "cannot %s", q->name, what);
    return -EPERM;
}
#define WORKING(q, what) \
    do { \
        if (WQ_UNLIKELY((q)->observe)) \
            return observer(q, what); \
    } while (0)

void wq_close(wq *q)
{
    if (q)
        q->eng->close(q);
}

int wq_unlink(const char *name)
{
    wq__err_clear();
    if (redis_name(name))
        return wq__redis_unlink(name);
    int rc = wq__name_check(name);
    if (rc < 0)
        return rc;
    return wq__shm_unlink(name);
}

int wq_list(int (*fn)(const char *name, void *arg), void *arg)
{
    if (!fn)
        return -EINVAL;
    return wq__shm_list(fn, arg);
}

int wq_list_at(const char *where, int (*fn)(const char *name, void *arg), void *arg)
{
    wq__err_clear();
    if (!fn)
        return -EINVAL;
    if (!where)
        return wq__shm_list(fn, arg);
    if (redis_name(where))
        return wq__redis_list(where, fn, arg);
    wq__errf("'%s': not a place queues live (NULL, or redis://host[:port])", where);
    return -EINVAL;
}

const char *wq_name(wq *q)
{
    return q ? q->name : NULL;
}

int wq_max_key_len(wq *q)
{
    return q ? (int)q->max_key_len : -EINVAL;
}

bool wq_observing(wq *q)
{
    return q && q->observe;
}

int wq__park(wq *q)
{
    return q->eng->park ? q->eng->park(q) : 0;
}

/* ------------------------------------------------------------------ */
/* Adds: one request, one engine call                                  */
/* ------------------------------------------------------------------ */

/* wq_add and wq_add_publish: a plain add, published if asked and the
   engine publishes. */
static inline int add_plain(wq *q, const void *key, size_t len, bool publish)
{
    if (WQ_UNLIKELY(!q))
        return -EINVAL;
    int rc = key_ok(q, key, len);
    if (WQ_UNLIKELY(rc < 0))
        return rc;
    WORKING(q, "add keys");
    if (publish && q->eng->add_publish)
        return q->eng->add_publish(q, key, len);
    struct wq_add_req r = { .key = key, .len = len };
    return q->eng->add(q, &r);
}

int wq_add(wq *q, const void *key, size_t len)
{
    return add_plain(q, key, len, false);
}

int wq_add_publish(wq *q, const void *key, size_t len)
{
    return add_plain(q, key, len, true);
}

int wq_add_after(wq *q, const void *key, size_t len, uint64_t delay_ns)
{
    if (!q)
        return -EINVAL;
    int rc = key_ok(q, key, len);
    if (rc < 0)
        return rc;
    WORKING(q, "add keys");
    struct wq_add_req r = { .key = key, .len = len, .after_ns = delay_ns, .delayed = true };
    return q->eng->add(q, &r);
}

int wq_add_rate_limited(wq *q, const void *key, size_t len)
{
    if (!q)
        return -EINVAL;
    int rc = key_ok(q, key, len);
    if (rc < 0)
        return rc;
    WORKING(q, "add keys");
    struct wq_add_req r = { .key = key, .len = len, .rate_limited = true, .delayed = true };
    return q->eng->add(q, &r);
}

int wq_add_opts(wq *q, const void *key, size_t len, const struct wq_add_opts *o)
{
    if (!o)
        return wq_add(q, key, len);
    if (!q)
        return -EINVAL;
    if (o->priority != 0 && !q->fair)
        return -EINVAL;   /* the default mode stays client-go's */
    if (!WQ_RESERVED_ZERO(o))
        return -EINVAL;
    int rc = key_ok(q, key, len);
    if (rc < 0)
        return rc;
    WORKING(q, "add keys");
    struct wq_add_req r = { .key = key, .len = len, .priority = o->priority,
                            .after_ns = o->after_ns, .rate_limited = o->rate_limited,
                            .delayed = o->after_ns || o->rate_limited };
    return q->eng->add(q, &r);
}

int wq_add_many(wq *q, const struct iovec *keys, size_t n)
{
    if (!q || (!keys && n > 0) || n > INT32_MAX)
        return -EINVAL;
    int rc = keys_ok(q, keys, n);
    if (rc < 0)
        return rc;
    WORKING(q, "add keys");
    return q->eng->add_many(q, keys, n);
}

/* ------------------------------------------------------------------ */
/* Get and done                                                        */
/* ------------------------------------------------------------------ */

static int get_args(wq *q, void *buf, size_t cap, int64_t timeout_ns, uint64_t *deadline)
{
    if (WQ_UNLIKELY(!q || !buf))
        return -EINVAL;
    if (WQ_UNLIKELY(cap < q->max_key_len))
        return -ENOBUFS;
    return wq__deadline(timeout_ns, deadline);
}

int wq_get(wq *q, void *buf, size_t cap, int64_t timeout_ns)
{
    uint64_t deadline;
    int rc = get_args(q, buf, cap, timeout_ns, &deadline);
    if (WQ_UNLIKELY(rc < 0))
        return rc;
    WORKING(q, "get keys");
    return q->eng->get(q, buf, deadline);
}

int wq_done(wq *q, const void *key, size_t len)
{
    if (WQ_UNLIKELY(!q))
        return -EINVAL;
    int rc = key_ok(q, key, len);
    if (WQ_UNLIKELY(rc < 0))
        return rc;
    WORKING(q, "hand keys back");
    return q->eng->done(q, key, len, NULL);
}

int wq_finish(wq *q, const void *key, size_t len, int code, const char *message)
{
    if (!q)
        return -EINVAL;
    int rc = key_ok(q, key, len);
    if (rc < 0)
        return rc;
    WORKING(q, "hand keys back");
    struct wq_outcome o = { true, code, message, false };
    return q->eng->done(q, key, len, &o);
}

static int done_get(wq *q, const void *done_key, size_t done_len,
                    const struct wq_outcome *o, void *buf, size_t cap, int64_t timeout_ns)
{
    uint64_t deadline;
    int rc = get_args(q, buf, cap, timeout_ns, &deadline);
    if (WQ_UNLIKELY(rc < 0) || WQ_UNLIKELY((rc = key_ok(q, done_key, done_len)) < 0))
        return rc;
    WORKING(q, "hand keys back");
    return q->eng->done_get(q, done_key, done_len, o, buf, deadline);
}

int wq_done_get(wq *q, const void *done_key, size_t done_len, void *buf, size_t cap,
                int64_t timeout_ns)
{
    return done_get(q, done_key, done_len, NULL, buf, cap, timeout_ns);
}

int wq_finish_get(wq *q, const void *done_key, size_t done_len,
                  const struct wq_finish_opts *f, void *buf, size_t cap, int64_t timeout_ns)
{
    if (!f)
        return done_get(q, done_key, done_len, NULL, buf, cap, timeout_ns);
    if (!WQ_RESERVED_ZERO(f))
        return -EINVAL;
    struct wq_outcome o = { true, f->code, f->message, f->forget };
    return done_get(q, done_key, done_len, &o, buf, cap, timeout_ns);
}

int wq_get_many(wq *q, void *buf, size_t size, struct iovec *keys, size_t n,
                int64_t timeout_ns)
{
    uint64_t deadline;
    if (!keys || n == 0 || n > INT32_MAX)
        return -EINVAL;
    int rc = get_args(q, buf, size, timeout_ns, &deadline);
    if (rc < 0)
        return rc;
    WORKING(q, "get keys");
    if (q->eng->get_many)
        return q->eng->get_many(q, buf, size, keys, n, deadline);
    /* One get at a time: the first waits, the rest take what is queued
       while a longest key still fits. */
    size_t got = 0, used = 0;
    for (; got < n && size - used >= q->max_key_len; got++) {
        rc = q->eng->get(q, (char *)buf + used, got == 0 ? deadline : 0);
        if (rc <= 0)
            break;
        keys[got] = (struct iovec){ (char *)buf + used, (size_t)rc };
        used += (size_t)rc;
    }
    return got > 0 ? (int)got : rc;
}

int wq_done_many(wq *q, const struct iovec *keys, size_t n)
{
    if (!q || !keys || n == 0 || n > INT32_MAX)
        return -EINVAL;
    int rc = keys_ok(q, keys, n);
    if (rc < 0)
        return rc;
    WORKING(q, "hand keys back");
    if (q->eng->done_many)
        return q->eng->done_many(q, keys, n);
    int done = 0;
    for (size_t i = 0; i < n; i++) {
        rc = q->eng->done(q, keys[i].iov_base, keys[i].iov_len, NULL);
        if (rc == 0)
            done++;
        else if (rc != -ENOENT && rc != -ESTALE)
            return rc;
    }
    return done;
}

int wq_len(wq *q)
{
    return q ? q->eng->len(q) : -EINVAL;
}

/* ------------------------------------------------------------------ */
/* Shutdown                                                            */
/* ------------------------------------------------------------------ */

int wq_shutdown(wq *q)
{
    return q ? q->eng->shutdown(q) : -EINVAL;
}

int wq_shutdown_drain(wq *q, int64_t timeout_ns)
{
    uint64_t deadline;
    if (!q)
        return -EINVAL;
    int rc = wq__deadline(timeout_ns, &deadline);
    return rc < 0 ? rc : q->eng->drain(q, deadline);
}

int wq_resume(wq *q)
{
    return q ? q->eng->resume(q) : -EINVAL;
}

bool wq_shutting_down(wq *q)
{
    return q && q->eng->shutting_down(q);
}

/* ------------------------------------------------------------------ */
/* Keys                                                                */
/* ------------------------------------------------------------------ */

int wq_forget(wq *q, const void *key, size_t len)
{
    if (!q)
        return -EINVAL;
    int rc = key_ok(q, key, len);
    if (rc < 0)
        return rc;
    WORKING(q, "forget keys");
    return q->eng->forget(q, key, len);
}

int wq_remove(wq *q, const void *key, size_t len)
{
    if (!q)
        return -EINVAL;
    int rc = key_ok(q, key, len);
    if (rc < 0)
        return rc;
    WORKING(q, "remove keys");
    return q->eng->remove(q, key, len);
}

int wq_num_requeues(wq *q, const void *key, size_t len)
{
    if (!q)
        return -EINVAL;
    int rc = key_ok(q, key, len);
    return rc < 0 ? rc : q->eng->num_requeues(q, key, len);
}

int wq_result(wq *q, const void *key, size_t len, struct wq_result *out)
{
    if (!q || !out)
        return -EINVAL;
    int rc = key_ok(q, key, len);
    return rc < 0 ? rc : q->eng->result(q, key, len, out);
}

int wq_release_pid(wq *q, pid_t pid)
{
    if (!q || pid <= 0)
        return -EINVAL;
    return q->eng->release_pid(q, pid);
}

/* ------------------------------------------------------------------ */
/* Inspection                                                          */
/* ------------------------------------------------------------------ */

int wq_stats(wq *q, struct wq_stats *out)
{
    return q && out ? q->eng->stats(q, out) : -EINVAL;
}

int wq_metrics(wq *q, struct wq_metrics *out)
{
    return q && out ? q->eng->metrics(q, out) : -EINVAL;
}

int wq_dump(wq *q, wq_dump_fn fn, void *arg)
{
    return q && fn ? q->eng->dump(q, fn, arg) : -EINVAL;
}

int wq_check_report(wq *q, unsigned flags, wq_report_fn report, void *arg)
{
    if (!q || (flags & ~(WQ_CHECK_REPAIR | WQ_CHECK_REAP)))
        return -EINVAL;
    return q->eng->check(q, flags, report, arg);
}

int wq_check(wq *q, unsigned flags)
{
    return wq_check_report(q, flags, NULL, NULL);
}

int wq_store_salvage(const char *store_path, const struct wq_options *opts,
                     wq_report_fn report, void *arg)
{
    wq__err_clear();
    if (!store_path || !store_path[0] || (opts && wq__options_check(opts) < 0))
        return -EINVAL;
    return wq__store_salvage(store_path, opts, report, arg);
}

int wq_snapshot(wq *q)
{
    wq__err_clear();
    return q ? q->eng->snapshot(q) : -EINVAL;
}

/* ------------------------------------------------------------------ */
/* Errors                                                              */
/* ------------------------------------------------------------------ */

const char *wq_strerror(int err)
{
    if (err < 0)
        err = -err;
    switch (err) {
    case 0: return "success";
    case EINVAL: return "invalid argument";
    case ENOTSUP: return "not supported by this queue or this version of libwq";
    case ENOENT: return "no such queue, or key not processing";
    case EEXIST: return "queue already exists";
    case EACCES: return "permission denied";
    case EPROTO: return "not a libwq region (or Redis queue) of a compatible version, "
                        "or a reply that makes no sense";
    case EBADMSG: return "corrupt region (wqctl check --repair rebuilds it)";
    case EUCLEAN: return "damaged or foreign store";
    case ENOTRECOVERABLE: return "region lock is unrecoverable; remove and recreate the queue";
    case ENOSPC: return "queue is full (capacity live keys), or no room in /dev/shm or the store";
    case EMSGSIZE: return "key longer than max_key_len";
    case ENOBUFS: return "buffer smaller than max_key_len";
    case EAGAIN: return "nothing queued";
    case ETIMEDOUT: return "timed out";
    case ESHUTDOWN: return "queue is shutting down";
    case ECANCELED: return "drain cancelled by shutdown or resume";
    case ESTALE: return "the key's lease was lost: another holder may have it (Redis)";
    case EIDRM: return "the queue was removed (Redis)";
    case ECONNREFUSED: return "the Redis server refused the connection";
    case ECONNRESET: return "the connection to the Redis server was lost";
    case EHOSTUNREACH: return "the Redis server cannot be reached";
    case EUSERS: return "process table full (max_procs handles), or the store's reader table";
    case EPERM: return "not allowed on a handle opened with WQ_OBSERVE (it holds no keys)";
    case ENOMEM: return "out of memory (or out of threads)";
    case EIO: return "the store could not be read or written, or the Redis server refused";
    default: return strerror(err);
    }
}
