/*
 * internal.h - what every libwq source file shares: assertions, branch
 * hints, the small pure helpers of util.c and the option rules of
 * options.c. Nothing here is installed or exported. Engine internals
 * live in their own headers (shm/shm.h, store/store.h).
 */
#ifndef WQ_INTERNAL_H
#define WQ_INTERNAL_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "wq.h"
#include "atomics.h"
#include "fault.h"

/* Internal invariants: checked in debug and test builds (--enable-debug),
   compiled out otherwise. */
#ifdef WQ_DEBUG
#include <assert.h>
#define WQ_ASSERT(x) assert(x)
#else
#define WQ_ASSERT(x) ((void)0)
#endif

#define WQ_LIKELY(x)   __builtin_expect(!!(x), 1)
#define WQ_UNLIKELY(x) __builtin_expect(!!(x), 0)
/* For a helper of a hot path that more than one caller shares, where a
   call would cost more than the body. */
#define WQ_INLINE static inline __attribute__((always_inline))

/* The public structs end in reserved words a caller must leave zero, so
   that a later libwq can give them a meaning (wq.h, "Growth"). */
#define WQ_RESERVED_ZERO(s) wq__zero_words((s)->reserved, \
                                           sizeof (s)->reserved / sizeof (s)->reserved[0])
static inline bool wq__zero_words(const uint64_t *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (w[i])
            return false;
    return true;
}

/* api.c: the pool's supervisor gives its handle's process slot up while
   its workers run (engine.h, park): 0, or -EBUSY when the handle holds a
   key and keeps its slot. */
int wq__park(wq *q);

/* util.c */
extern unsigned wq__fork_gen;   /* bumped in every forked child (atomics.h) */
void wq__fork_init(void);
uint32_t wq__hash(uint64_t seed, const void *key, size_t len);
uint64_t wq__fnv1a(const void *p, size_t n);
uint64_t wq__hash64(uint64_t seed, const void *key, size_t len);
uint64_t wq__now_mono(void);
/* The machine's CLOCK_MONOTONIC in ns, never the test clock: for timing
   real work and real waits (wq__now_mono is the queue's clock). */
uint64_t wq__clock_mono(void);
uint64_t wq__now_real(void);
int wq__name_ok(const char *name);
int wq__name_check(const char *name);   /* 0, or -EINVAL and wq_last_error */
int wq__deadline(int64_t timeout_ns, uint64_t *deadline);
/* Map the pages of [p, p + len) in one call (advice MADV_POPULATE_READ
   or _WRITE) for a caller about to touch them all. */
void wq__mem_populate(const void *p, size_t len, int advice);
/* wq_last_error's text: set on an error path that knows more than the
   errno (naming the object and the cause); cleared by the calls wq.h
   lists there. */
void wq__errf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void wq__err_clear(void);

/*
 * options.c: wq_options with every default resolved, the one place the
 * defaults and the validation rules live (wq.h points here). Engines
 * build their queue from a wq_conf and compare an existing queue's
 * settings against one.
 */
struct wq_conf {
    uint32_t capacity, max_key_len, max_procs, result_capacity;
    uint32_t flags;           /* the queue's own flags: WQ_FAIR, WQ_NO_METRICS */
    uint32_t mode;            /* permission bits */
    bool has_store;
    uint32_t durability;      /* WQ_DURABLE_*, with a store */
    uint32_t snapshot_ms;     /* WQ_DURABLE_NONE, _FSYNC (store.c) */
    uint32_t fair_share;      /* WQ_FAIR */
    int32_t tenant_sep;       /* WQ_FAIR; -1: no tenants */
    uint32_t rl_limiters, rl_burst, rl_max_fast_attempts;
    uint64_t rl_base_delay_ns, rl_max_delay_ns, rl_fast_delay_ns, rl_slow_delay_ns;
    double rl_qps;
};
#define WQ_DEF_CAPACITY     65536u
#define WQ_DEF_KEY_LEN      256u
#define WQ_DEF_PROCS        256u
#define WQ_DEF_SNAPSHOT_MS  1000u
#define WQ_DEF_FAIR_SHARE   8u
#define WQ_DEF_TENANT_SEP   '/'
#define WQ_DEF_RL_BASE_NS   (5ull * 1000 * 1000)            /* 5 ms */
#define WQ_DEF_RL_MAX_NS    (1000ull * 1000 * 1000 * 1000)  /* 1000 s */
#define WQ_DEF_RL_QPS       10.0
#define WQ_DEF_RL_BURST     100u
/* -EINVAL for options wq.h forbids; 0 otherwise. */
int wq__options_check(const struct wq_options *o);
/* Checked options to a conf with every default filled in. */
int wq__options_resolve(const struct wq_options *o, struct wq_conf *c);
/* A conf read back from storage (a region header, a store's meta record)
   obeys the same rules: -EINVAL when it does not. */
int wq__conf_valid(const struct wq_conf *c);
/* WQ_CREATE of an existing queue: -EEXIST, why set, when an option given
   differs from the queue's conf (store_path: the queue's store, or NULL). */
int wq__options_match(const struct wq_options *o, const struct wq_conf *c,
                      const char *store_path, char *why, size_t wn);

#endif
