/*
 * internal.h - the per-process handle and the wq__* calls shared between
 * src files. Nothing here is installed or exported.
 */
#ifndef WQ_INTERNAL_H
#define WQ_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "wq.h"
#include "layout.h"
#include "fault.h"

#ifdef WQ_DEBUG
#include <assert.h>
#define WQ_ASSERT(x) assert(x)
#else
#define WQ_ASSERT(x) ((void)0)
#endif

#define WQ_LIKELY(x)   __builtin_expect(!!(x), 1)
#define WQ_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Orders the stores of a critical section for a holder killed at any
   instruction: everything before is in memory before anything after. */
#define WQ_STEP(point) do { atomic_signal_fence(memory_order_seq_cst); \
                            WQ_FAULT(point); } while (0)

/* How often a blocked waiter wakes to look for dead key holders. */
#define WQ_REAP_INTERVAL_NS (100ull * 1000 * 1000)
/* Lock acquisitions between two time checks for the periodic reap. */
#define WQ_REAP_TICKS 1024u

struct wq_lease;

/*
 * The per-process handle. Geometry is copied from the header when it is
 * validated at attach and never re-read from shared memory, so a later
 * corruption of the header cannot move our bounds.
 */
struct wq {
    char name[WQ_MAX_NAME_LEN + 1];
    unsigned char *base;
    size_t size;
    struct wq_hdr *hdr;
    struct wq_proc *procs;
    unsigned char *entries;
    struct wq_islot *index;
    uint32_t *ring;

    struct wq_geom g;              /* validated copy of the header */
    uint32_t capacity, max_key_len, max_procs, entry_size, index_slots;
    uint64_t seed;
    uint32_t *heap;                /* delay heap (layout.h) */
    uint32_t *sq;                  /* store queue (layout.h), NULL without store */
    bool restoring;                /* filling a new region from the store */
    bool fair;                     /* WQ_FAIR: fair.c orders the queue */
    struct wq_fx *fx;
    uint32_t *fheap_p, *fheap_a;
    uint64_t *ftags;
    struct wq_rslot *rslots;       /* result slots (layout.h) */
    uint32_t result_capacity;
    bool metrics;                  /* duration metrics on (no WQ_NO_METRICS) */

    /* Registration: written under the region lock. */
    uint32_t slot;                 /* our process table slot */
    uint32_t gen;                  /* its generation */
    _Atomic unsigned forkgen;      /* wq__fork_gen when registered */
    struct wq_lease *lease;        /* lease thread, NULL in a forked child */

    uint64_t *scratch;             /* 2 x capacity bits, check/repair; lock */
    uint32_t *held;                /* max_procs counters, check/repair; lock */
    uint32_t *rscratch;            /* result_capacity slots, repair; lock */
};

/* util.c */
extern _Atomic unsigned wq__fork_gen;
void wq__fork_init(void);
uint32_t wq__hash(uint64_t seed, const void *key, size_t len);
uint64_t wq__fnv1a(const void *p, size_t n);
uint64_t wq__now_mono(void);
uint64_t wq__now_real(void);
int wq__name_ok(const char *name);
int wq__deadline(int64_t timeout_ns, uint64_t *deadline);

/* region.c */
int wq__geometry(struct wq_geom *g, uint32_t capacity, uint32_t max_key_len,
                 uint32_t max_procs, uint32_t result_capacity, bool store, bool fair);
int wq__region_validate(const struct wq_geom *g, uint64_t file_size);

/* lock.c */
int wq__lock(wq *q);
void wq__unlock(wq *q);
int wq__mutex_init(pthread_mutex_t *m);

/* wait.c */
int wq__futex_wait(_Atomic uint32_t *word, uint32_t val, uint64_t deadline_mono);
void wq__futex_wake(_Atomic uint32_t *word, int n);

/* delay.c */
int wq__heap_push(wq *q, uint32_t idx);
int wq__heap_remove(wq *q, uint32_t idx);
void wq__heap_earlier(wq *q, uint32_t idx);
void wq__heap_build(wq *q);
uint32_t wq__promote(wq *q, uint64_t now);
uint64_t wq__next_ready(const wq *q);
void wq__drop_waiting(wq *q);
int wq__delay_entry(wq *q, uint32_t idx, uint64_t ready);

/* store.c */
void wq__store_mark(wq *q, uint32_t idx);
void wq__store_zombie(wq *q, uint32_t idx);
bool wq__store_sync_adds(const wq *q);
int wq__store_flush(wq *q, bool all);
int wq__store_after(wq *q);
void wq__store_rollback(wq *q, const void *key, size_t len);
int wq__store_make_room(wq *q, int tries);
int wq__store_finish_add(wq *q, const void *key, size_t len, int rc);
int wq__store_prepare(const struct wq_options *o, struct wq_options *eff, char *abs,
                      size_t abslen, bool *has_meta);
int wq__store_init_meta(const struct wq_geom *g);
int wq__store_restore(wq *view);
/* internal: "free a zombie or evict first" (never returned to callers) */
#define WQ_EFLUSH EALREADY

/* limiter.c */
uint64_t wq__limiter_when(wq *q, struct wq_entry *e, uint64_t now);
void wq__limiter_init(struct wq_hdr *h);
int wq__limiter_options(const struct wq_options *o, struct wq_geom *g);

/* results.c */
int wq__result_record(wq *q, uint32_t idx, int code, const char *message);
void wq__result_drop(wq *q, uint32_t idx);
void wq__results_rebuild(wq *q);
bool wq__results_damaged(wq *q);
int wq__results_verify(wq *q, void (*violation)(void *c, const char *what), void *c);
static inline bool wq__has_result(const wq *q, const struct wq_entry *e)
{
    return e->rslot < q->result_capacity;
}

/* metrics.c */
void wq__observe(struct wq_hist *h, uint64_t ns);

/* procs.c */
int wq__procs_register(wq *q);
void wq__procs_unregister(wq *q);
unsigned wq__procs_reap(wq *q);
void wq__procs_maybe_reap(wq *q);
void wq__procs_release_pids(wq *q, const pid_t *pids, unsigned n);
bool wq__lease_held(struct wq_proc *p);
int wq__requeue_owned(wq *q, uint32_t slot, uint32_t gen, bool crash);

/* table.c */
static inline struct wq_entry *wq__entry(const wq *q, uint32_t idx)
{
    return (struct wq_entry *)(q->entries + (size_t)idx * q->entry_size);
}
/* The entry's state without the store bit, and a commit store that keeps
   that bit (it says "in the store queue", whatever the state is). */
static inline uint16_t wq__st(const struct wq_entry *e)
{
    return e->state & (uint16_t)~WQ_ST_SDIRTY;
}
static inline void wq__set_state(struct wq_entry *e, uint16_t st)
{
    e->state = (uint16_t)(st | (e->state & WQ_ST_SDIRTY));
}

static inline uint16_t wq__gen16(uint32_t gen)
{
    return (uint16_t)gen;
}
static inline uint32_t wq__home(const wq *q, uint32_t hash)
{
    return (uint32_t)(((uint64_t)hash * q->index_slots) >> 32);
}
#define WQ_LOOKUP_CORRUPT 0xfffffffeu
#define WQ_EVICTING 0xfffffffdu   /* wq__entry_alloc: made room, flush first */
uint32_t wq__table_lookup(wq *q, const void *key, size_t len, uint32_t hash);
int wq__lock_lookup(wq *q, const void *key, size_t len, uint32_t *idx);
int wq__table_insert(wq *q, uint32_t idx, uint32_t hash);
int wq__table_remove(wq *q, uint32_t idx, uint32_t hash);
uint32_t wq__entry_alloc(wq *q);
void wq__entry_free(wq *q, uint32_t idx);

/* queue.c, delay.c: the adds with a WQ_FAIR priority */
int wq__add_prio(wq *q, const void *key, size_t len, int prio);
int wq__add_delayed_prio(wq *q, const void *key, size_t len, bool limited, uint64_t delay,
                         int prio);

/* fair.c */
void wq__fair_dirty(wq *q, uint32_t idx);
uint32_t wq__fair_tenant_len(const wq *q, const struct wq_entry *e);
int wq__fair_push(wq *q, uint32_t idx);
uint32_t wq__fair_front(wq *q);
void wq__fair_pop(wq *q, uint32_t idx);
void wq__fair_prio(wq *q, uint32_t idx, int prio, bool fresh);
void wq__fair_rebuild(wq *q);
void wq__fair_verify(wq *q, void (*violation)(void *c, const char *what), void *c);
static inline uint32_t wq__queued(const wq *q);

/* ring.c */
int wq__ring_push(wq *q, uint32_t idx);
uint32_t wq__ring_front(wq *q);
void wq__ring_pop(wq *q);
static inline uint32_t wq__ring_count(const wq *q)
{
    return (uint32_t)(atomic_load_explicit(&q->hdr->ring_pos,
                                           memory_order_relaxed) >> 32);
}
/* Queued keys, in either mode (lock held, or as a hint without it). */
static inline uint32_t wq__queued(const wq *q)
{
    return q->fair ? __atomic_load_n(&q->hdr->fq_count, __ATOMIC_RELAXED)
                   : wq__ring_count(q);
}
/* Lock and busy held: put a QUEUED entry where hand-outs find it. */
static inline int wq__enqueue(wq *q, uint32_t idx)
{
    return q->fair ? wq__fair_push(q, idx) : wq__ring_push(q, idx);
}

/* Lock held: announce / retire the counter bump of an operation. */
static inline void wq__pend(wq *q, uint32_t kind, uint32_t idx)
{
    q->hdr->pend_idx = idx;
    q->hdr->pend_kind = kind;
}

/* queue.c */
int wq__activate(wq *q, uint32_t idx, uint64_t now, bool *queued);
int wq__release(wq *q, uint32_t idx);
int wq__release_as(wq *q, uint32_t idx, bool stored);
uint32_t wq__new_entry(wq *q, const void *key, size_t len, uint32_t hash, int *err);
int wq__commit_new(wq *q, uint32_t idx, uint16_t state);
static inline int wq__key_ok(const wq *q, const void *key, size_t len)
{
    if (!key || len == 0)
        return -EINVAL;
    return len > q->max_key_len ? -EMSGSIZE : 0;
}
static inline uint64_t wq__metrics_now(const wq *q)
{
    return q->metrics ? wq__now_mono() : 0;
}
void wq__wake_getters(wq *q, int n);
void wq__wake_drainers(wq *q);

/* repair.c */
int wq__repair(wq *q, bool apply, bool thorough, wq_report_fn report, void *arg);

#endif
