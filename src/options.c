/*
 * options.c - the defaults and validation rules of wq_options, written
 * once. wq.h's option paragraph describes these rules; the defaults are
 * the WQ_DEF_* numbers in internal.h.
 *
 * Three entry points: wq__options_check (what wq_open refuses with
 * -EINVAL), wq__options_resolve (checked options to a wq_conf with every
 * default filled in, the form engines build queues from), and
 * wq__conf_valid (the same rules applied to settings read back from
 * storage, so a damaged header or store meta record cannot produce a
 * queue that wq_open itself would have refused).
 *
 * Rate limiter semantics, as client-go and golang.org/x/time/rate: the
 * defaults are client-go's DefaultControllerRateLimiter (exponential
 * 5 ms .. 1000 s, token bucket 10 qps burst 100, max of both).
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int limiter_check(const struct wq_options *o)
{
    unsigned lim = o->rl_limiters ? o->rl_limiters : WQ_RL_EXPONENTIAL | WQ_RL_BUCKET;
    if (lim & ~WQ_RL_ALL)
        return -EINVAL;
    if (!(o->rl_qps >= 0) || isinf(o->rl_qps))   /* negative, NaN, inf */
        return -EINVAL;
    uint64_t base = o->rl_base_delay_ns ? o->rl_base_delay_ns : WQ_DEF_RL_BASE_NS;
    uint64_t max = o->rl_max_delay_ns ? o->rl_max_delay_ns : WQ_DEF_RL_MAX_NS;
    if (base > max)   /* also a base above the default max */
        return -EINVAL;
    if (lim & WQ_RL_FAST_SLOW) {
        if (!o->rl_fast_delay_ns || !o->rl_slow_delay_ns || !o->rl_max_fast_attempts ||
            o->rl_fast_delay_ns > o->rl_slow_delay_ns)
            return -EINVAL;
    } else if (o->rl_fast_delay_ns || o->rl_slow_delay_ns || o->rl_max_fast_attempts) {
        return -EINVAL;   /* parameters for a limiter that is not selected */
    }
    return 0;
}

int wq__options_check(const struct wq_options *o)
{
    const unsigned known = WQ_CREATE | WQ_EXCL | WQ_FAIR | WQ_NO_METRICS | WQ_RESTORE |
                           WQ_OBSERVE;
    if (o->flags & ~known)
        return -EINVAL;
    if ((o->flags & WQ_OBSERVE) && (o->flags & WQ_CREATE)) {
        wq__errf("WQ_OBSERVE opens a queue that exists; it cannot be given with WQ_CREATE");
        return -EINVAL;
    }
    if ((o->flags & (WQ_EXCL | WQ_RESTORE)) && !(o->flags & WQ_CREATE))
        return -EINVAL;
    if ((o->flags & WQ_RESTORE) && !o->store_path)
        return -EINVAL;
    if (!WQ_RESERVED_ZERO(o))
        return -EINVAL;
    if (o->lease_ns) {   /* the Redis engine checks its own before this */
        wq__errf("lease_ns is for redis:// queues (a shared-memory queue knows "
                 "when a holder dies)");
        return -EINVAL;
    }
    if (o->mode & ~(mode_t)0777)
        return -EINVAL;
    if (o->capacity > WQ_MAX_CAPACITY || o->max_key_len > WQ_MAX_KEY_LEN ||
        o->max_procs > WQ_MAX_PROCS || o->result_capacity > WQ_MAX_CAPACITY)
        return -EINVAL;
    if (o->durability != 0 && o->durability != WQ_DURABLE_PROCESS &&
        o->durability != WQ_DURABLE_FSYNC && o->durability != WQ_DURABLE_NONE)
        return -EINVAL;
    if (!o->store_path && (o->durability || o->snapshot_interval_ms))
        return -EINVAL;
    if (o->snapshot_interval_ms && o->durability != WQ_DURABLE_NONE &&
        o->durability != WQ_DURABLE_FSYNC)
        return -EINVAL;
    if (o->store_path && !o->store_path[0])
        return -EINVAL;
    if (!(o->flags & WQ_FAIR) && (o->fair_share || o->tenant_sep))
        return -EINVAL;
    if (o->tenant_sep < -1 || o->tenant_sep > 255)
        return -EINVAL;
    return limiter_check(o);
}

int wq__options_resolve(const struct wq_options *o, struct wq_conf *c)
{
    int rc = wq__options_check(o);
    if (rc < 0)
        return rc;
    memset(c, 0, sizeof *c);
    c->capacity = o->capacity ? o->capacity : WQ_DEF_CAPACITY;
    c->max_key_len = o->max_key_len ? o->max_key_len : WQ_DEF_KEY_LEN;
    c->max_procs = o->max_procs ? o->max_procs : WQ_DEF_PROCS;
    c->result_capacity = o->result_capacity ? o->result_capacity : c->capacity;
    c->flags = o->flags & (WQ_FAIR | WQ_NO_METRICS);
    c->mode = o->mode ? (uint32_t)o->mode : 0600;
    c->has_store = o->store_path != NULL;
    if (c->has_store) {
        c->durability = o->durability ? (uint32_t)o->durability : WQ_DURABLE_PROCESS;
        c->snapshot_ms = o->snapshot_interval_ms ? o->snapshot_interval_ms
                                                 : WQ_DEF_SNAPSHOT_MS;
    }
    if (c->flags & WQ_FAIR) {
        c->fair_share = o->fair_share ? o->fair_share : WQ_DEF_FAIR_SHARE;
        c->tenant_sep = o->tenant_sep ? o->tenant_sep : WQ_DEF_TENANT_SEP;
    }
    c->rl_limiters = o->rl_limiters ? o->rl_limiters : WQ_RL_EXPONENTIAL | WQ_RL_BUCKET;
    c->rl_base_delay_ns = o->rl_base_delay_ns ? o->rl_base_delay_ns : WQ_DEF_RL_BASE_NS;
    c->rl_max_delay_ns = o->rl_max_delay_ns ? o->rl_max_delay_ns : WQ_DEF_RL_MAX_NS;
    c->rl_qps = o->rl_qps > 0 ? o->rl_qps : WQ_DEF_RL_QPS;
    c->rl_burst = o->rl_burst ? o->rl_burst : WQ_DEF_RL_BURST;
    c->rl_fast_delay_ns = o->rl_fast_delay_ns;
    c->rl_slow_delay_ns = o->rl_slow_delay_ns;
    c->rl_max_fast_attempts = o->rl_max_fast_attempts;
    return 0;
}

int wq__conf_valid(const struct wq_conf *c)
{
    if (c->capacity == 0 || c->capacity > WQ_MAX_CAPACITY || c->max_key_len == 0 ||
        c->max_key_len > WQ_MAX_KEY_LEN || c->max_procs == 0 || c->max_procs > WQ_MAX_PROCS ||
        c->result_capacity == 0 || c->result_capacity > WQ_MAX_CAPACITY ||
        (c->flags & ~(WQ_FAIR | WQ_NO_METRICS)) || (c->mode & ~0777u))
        return -EINVAL;
    if (c->has_store && c->durability != WQ_DURABLE_PROCESS &&
        c->durability != WQ_DURABLE_FSYNC && c->durability != WQ_DURABLE_NONE)
        return -EINVAL;
    if (c->has_store && c->snapshot_ms == 0)
        return -EINVAL;
    if ((c->flags & WQ_FAIR) &&
        (c->fair_share == 0 || c->tenant_sep < -1 || c->tenant_sep > 255))
        return -EINVAL;
    if (c->rl_limiters == 0 || (c->rl_limiters & ~WQ_RL_ALL) || c->rl_burst == 0 ||
        !(c->rl_qps > 0) || isinf(c->rl_qps) || c->rl_base_delay_ns > c->rl_max_delay_ns)
        return -EINVAL;
    if ((c->rl_limiters & WQ_RL_FAST_SLOW) &&
        (!c->rl_fast_delay_ns || !c->rl_slow_delay_ns || !c->rl_max_fast_attempts ||
         c->rl_fast_delay_ns > c->rl_slow_delay_ns))
        return -EINVAL;
    return 0;
}

/*
 * An open with WQ_CREATE of a queue that exists: every option given (not
 * zero) must be what the queue has, or the open fails (-EEXIST) and says
 * which differs; nothing is changed. has_store_path: the queue's store
 * directory (absolute), NULL without a store.
 */
int wq__options_match(const struct wq_options *o, const struct wq_conf *c,
                      const char *store_path, char *why, size_t wn)
{
#define DIFF(...) do { snprintf(why, wn, __VA_ARGS__); return -EEXIST; } while (0)
    if (o->capacity && o->capacity != c->capacity)
        DIFF("capacity %u, not %u", c->capacity, o->capacity);
    if (o->max_key_len && o->max_key_len != c->max_key_len)
        DIFF("max_key_len %u, not %u", c->max_key_len, o->max_key_len);
    if (o->max_procs && o->max_procs != c->max_procs)
        DIFF("max_procs %u, not %u", c->max_procs, o->max_procs);
    if (o->result_capacity && o->result_capacity != c->result_capacity)
        DIFF("result_capacity %u, not %u", c->result_capacity, o->result_capacity);
    if (o->mode && (uint32_t)o->mode != c->mode)
        DIFF("mode %04o, not %04o", c->mode, (unsigned)o->mode);
    if (o->store_path) {
        char abs[4096];
        if (!c->has_store)
            DIFF("no store, not the store %s", o->store_path);
        if (!realpath(o->store_path, abs))   /* e.g. removed since: say so */
            DIFF("the store %s, and %s cannot be reached now (%s)", store_path,
                 o->store_path, strerror(errno));
        if (strcmp(abs, store_path) != 0)
            DIFF("the store %s, not %s", store_path, o->store_path);
    }
    if (o->durability && (!c->has_store || (uint32_t)o->durability != c->durability))
        DIFF("durability %s, not %s",
             !c->has_store ? "none (no store)" : c->durability == WQ_DURABLE_PROCESS ? "process"
                 : c->durability == WQ_DURABLE_FSYNC ? "fsync" : "none (snapshots)",
             o->durability == WQ_DURABLE_PROCESS ? "process"
                 : o->durability == WQ_DURABLE_FSYNC ? "fsync" : "none (snapshots)");
    if (o->snapshot_interval_ms && o->snapshot_interval_ms != c->snapshot_ms)
        DIFF("snapshot_interval_ms %u, not %u", c->snapshot_ms, o->snapshot_interval_ms);
    if ((o->flags & WQ_FAIR) && !(c->flags & WQ_FAIR))
        DIFF("the default mode, not WQ_FAIR");
    if ((o->flags & WQ_NO_METRICS) && !(c->flags & WQ_NO_METRICS))
        DIFF("metrics on, not WQ_NO_METRICS");
    if (o->fair_share && o->fair_share != c->fair_share)
        DIFF("fair_share %u, not %u", c->fair_share, o->fair_share);
    if (o->tenant_sep && o->tenant_sep != c->tenant_sep)
        DIFF("tenant_sep %d, not %d", c->tenant_sep, o->tenant_sep);
    if (o->rl_limiters && o->rl_limiters != c->rl_limiters)
        DIFF("rl_limiters 0x%x, not 0x%x", c->rl_limiters, o->rl_limiters);
    if (o->rl_base_delay_ns && o->rl_base_delay_ns != c->rl_base_delay_ns)
        DIFF("rl_base_delay_ns %llu, not %llu", (unsigned long long)c->rl_base_delay_ns,
             (unsigned long long)o->rl_base_delay_ns);
    if (o->rl_max_delay_ns && o->rl_max_delay_ns != c->rl_max_delay_ns)
        DIFF("rl_max_delay_ns %llu, not %llu", (unsigned long long)c->rl_max_delay_ns,
             (unsigned long long)o->rl_max_delay_ns);
    if (o->rl_qps > 0 && o->rl_qps != c->rl_qps)
        DIFF("rl_qps %g, not %g", c->rl_qps, o->rl_qps);
    if (o->rl_burst && o->rl_burst != c->rl_burst)
        DIFF("rl_burst %u, not %u", c->rl_burst, o->rl_burst);
    if (o->rl_fast_delay_ns && o->rl_fast_delay_ns != c->rl_fast_delay_ns)
        DIFF("rl_fast_delay_ns %llu, not %llu", (unsigned long long)c->rl_fast_delay_ns,
             (unsigned long long)o->rl_fast_delay_ns);
    if (o->rl_slow_delay_ns && o->rl_slow_delay_ns != c->rl_slow_delay_ns)
        DIFF("rl_slow_delay_ns %llu, not %llu", (unsigned long long)c->rl_slow_delay_ns,
             (unsigned long long)o->rl_slow_delay_ns);
    if (o->rl_max_fast_attempts && o->rl_max_fast_attempts != c->rl_max_fast_attempts)
        DIFF("rl_max_fast_attempts %u, not %u", c->rl_max_fast_attempts,
             o->rl_max_fast_attempts);
#undef DIFF
    return 0;
}
