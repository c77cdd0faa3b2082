/*
 * limiter.c - client-go's rate limiters, shared by all processes:
 * wq_add_rate_limited's delay, wq_forget, wq_num_requeues, and wq_remove
 * (which drops a key with its failure count).
 *
 * Parameters are resolved at creation (options.c) and stored in the
 * immutable header (checksummed), so every process computes the same
 * delays. State:
 *   - per key: entry->failures (one counter serves both per-item limiters:
 *     client-go's exponential and fast-slow limiters each count every
 *     When(), so their counts are always equal);
 *   - shared: the token bucket (hdr->bucket_tokens, bucket_last_ns).
 * All under the region lock.
 *
 * Semantics, as client-go and golang.org/x/time/rate:
 *   exponential  base * 2^failures (failures before this call), capped at
 *                max; any overflow gives max.
 *   fast-slow    fast while failures (after this call) <= max_fast, then slow.
 *   bucket       tokens refill at qps up to burst (starting full); every
 *                call takes one token, even into debt; delay = debt / qps.
 *   max-of       the largest delay of the selected limiters; each of them
 *                is consulted (so the bucket is charged) on every call.
 */
#include "shm.h"

void wq__limiter_init(struct wq_hdr *h)
{
    h->bucket_tokens = h->g.rl_burst;
    h->bucket_last_ns = wq__now_mono();
}

static uint64_t exponential(const struct wq_geom *g, uint32_t failures)
{
    if (failures >= 64 || g->rl_base_delay_ns > (UINT64_MAX >> failures))
        return g->rl_max_delay_ns;
    uint64_t d = g->rl_base_delay_ns << failures;
    return d > g->rl_max_delay_ns ? g->rl_max_delay_ns : d;
}

/* golang.org/x/time/rate Reserve().Delay() for one token. g is the
   handle's validated geometry (rl_qps > 0 and finite), never the shared
   header's copy; the token count is shared memory and may be damaged. */
static uint64_t bucket(struct wq_hdr *h, const struct wq_geom *g, uint64_t now)
{
    uint64_t last = h->bucket_last_ns < now ? h->bucket_last_ns : now;
    uint64_t el = now - last;
    double tokens = h->bucket_tokens + (double)(el / 1000000000ull) * g->rl_qps +
                    (double)(el % 1000000000ull) * g->rl_qps / 1e9;
    if (!(tokens <= g->rl_burst))   /* also a NaN: the bucket restarts full */
        tokens = g->rl_burst;
    tokens -= 1;
    h->bucket_tokens = tokens;
    h->bucket_last_ns = now;
    if (tokens >= 0)
        return 0;
    double ns = -tokens / g->rl_qps * 1e9;
    return ns >= 9.2e18 ? INT64_MAX : (uint64_t)ns;
}

/* Lock held: client-go's When(key). Raises the failure count. */
uint64_t wq__limiter_when(shmq *q, struct wq_entry *e, uint64_t now)
{
    struct wq_hdr *h = q->hdr;
    const struct wq_geom *g = &q->g;
    uint32_t f = e->failures;
    uint64_t d = 0, x;
    /* Only the per-key limiters count failures (client-go's bucket limiter
       has no per-key state: its NumRequeues is 0). */
    if (f < UINT32_MAX && (g->rl_limiters & (WQ_RL_EXPONENTIAL | WQ_RL_FAST_SLOW)))
        e->failures = f + 1;
    if (g->rl_limiters & WQ_RL_EXPONENTIAL)
        d = exponential(g, f);
    if (g->rl_limiters & WQ_RL_FAST_SLOW) {
        x = (uint64_t)f + 1 <= g->rl_max_fast_attempts ? g->rl_fast_delay_ns
                                                        : g->rl_slow_delay_ns;
        d = x > d ? x : d;
    }
    if (g->rl_limiters & WQ_RL_BUCKET) {
        x = bucket(h, g, now);
        d = x > d ? x : d;
    }
    if (q->metrics)
        wq__observe(&h->rldelay, d);   /* the delay histogram (wq_metrics) */
    return d;
}

int wq__shm_forget(wq *pub, const void *key, size_t len)
{
    shmq *q = wq__shm(pub);
    uint32_t idx;
    int rc = wq__lock_lookup(q, key, len, &idx);
    if (rc < 0)
        return rc;
    if (idx != WQ_NIL) {
        wq__mut_begin(q);
        WQ_STEP("forget.busy");
        rc = wq__mut_end(q, wq__entry_forget(q, idx));
    }
    wq__unlock(q);
    if (rc >= 0)
        wq__store_after(q);   /* a removal that fails now is retried later */
    return rc;
}

int wq__shm_remove(wq *pub, const void *key, size_t len)
{
    shmq *q = wq__shm(pub);
    uint32_t idx;
    int rc = wq__lock_lookup(q, key, len, &idx);
    if (rc < 0)
        return rc;
    if (idx == WQ_NIL) {
        rc = -ENOENT;
    } else {
        wq__mut_begin(q);
        WQ_STEP("remove.busy");
        rc = wq__entry_remove(q, idx);
        /* -EBUSY and -ENOENT change nothing: only a corrupt structure
           leaves the mutation for repair. */
        wq__mut_end(q, rc == -EBUSY || rc == -ENOENT ? 0 : rc);
    }
    wq__unlock(q);
    if (rc >= 0)
        wq__store_after(q);   /* the record's removal, now (or later) */
    return rc;
}

int wq__shm_num_requeues(wq *pub, const void *key, size_t len)
{
    shmq *q = wq__shm(pub);
    uint32_t idx;
    int rc = wq__lock_lookup(q, key, len, &idx);
    if (rc < 0)
        return rc;
    if (idx != WQ_NIL) {
        uint32_t f = wq__entry(q, idx)->failures;
        rc = f > INT32_MAX ? INT32_MAX : (int)f;
    }
    wq__unlock(q);
    return rc;
}
