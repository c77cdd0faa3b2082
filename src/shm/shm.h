/*
 * shm.h - the shared-memory engine's handle and the wq__* calls shared
 * between its files (and the store, which persists its regions).
 *
 * Files, top to bottom (arrows point down):
 *   engine.c    the operations table api.c calls
 *   queue.c delay.c limiter.c results.c fair.c metrics.c inspect.c
 *               the operations, composed from what is below
 *   repair.c    rebuild from entries; wq_check shares its passes
 *   procs.c     process table, leases, the one liveness probe, reaping
 *   lanes.c     adds published without the lock: lanes, their room, repair
 *   entry.c     every entry state transition (the one state machine)
 *   mutate.h    the crash protocol: begin/end of a mutation
 *   lock.c wait.c region.c   (lock.c's one call up: every locker applies
 *               the published adds first, queue.c's wq__queue_apply_lanes,
 *               because they are adds and there is one add path)
 *   table.c ring.c heap.c   data structures only; never call up
 *   layout.h    the region format
 */
#ifndef WQ_SHM_H
#define WQ_SHM_H

#include <pthread.h>
#include <stdio.h>
#include <sys/types.h>

#include "internal.h"
#include "engine.h"
#include "layout.h"

/* How often a blocked waiter wakes to look for dead key holders. */
#define WQ_REAP_INTERVAL_NS (100ull * 1000 * 1000)
/* Lock acquisitions between two time checks for the periodic reap. */
#define WQ_REAP_TICKS 1024u

/* Per-handle hints of where keys live, for the coalesced add (queue.c):
   32 KiB, sets of two by hash, the one put last first (wq__hint_*). At
   1,000 hot keys 4 in 5 found their own hint when each hash had one
   slot; an add whose hint another key took goes the locked way, or the
   lane of an add published (lanes.c), whose locker it costs. */
#define WQ_HINTS 4096u

/* Lookups and allocations return an entry index, or one of these. */
#define WQ_CORRUPT  0xfffffffeu   /* an out-of-range index was found */
#define WQ_EVICTING 0xfffffffdu   /* made room that the store must free first */
/* internal: "flush the store, then try again" (never returned to callers) */
#define WQ_EFLUSH EALREADY

struct wq_lease;

/*
 * The per-process handle of a shared-memory queue. Geometry is copied
 * from the header when it is validated at attach and never re-read from
 * shared memory, so a later corruption of the header cannot move our
 * bounds. Fields below `slot` are written under the region lock.
 */
/* The longest WQ_SHM_DIR, and room for a region path under it. */
#define WQ_MAX_SHM_DIR 200
#define WQ_REGION_PATH_MAX (WQ_MAX_SHM_DIR + WQ_MAX_NAME_LEN + 8)

typedef struct wq_shm {
    struct wq pub;                 /* engine, max_key_len, fair, name */
    unsigned char *base;
    size_t size;
    struct wq_hdr *hdr;
    struct wq_proc *procs;
    unsigned char *entries;
    struct wq_islot *iarea[2];     /* the two index areas (layout.h) */
    uint32_t *rarea[2];            /* the two ring areas */

    struct wq_geom g;              /* validated copy of the header */
    uint32_t capacity, max_key_len, max_procs, entry_size, index_max;
    uint64_t seed;
    uint32_t *heap;                /* delay heap (layout.h) */
    uint32_t *sq;                  /* store queue (layout.h), NULL without store */
    uint32_t *sgen;                /* store change counts, NULL without store */
    bool restoring;                /* filling a new region nobody sees yet */
    bool fair;                     /* WQ_FAIR: fair.c orders the queue */
    struct wq_fx *fx;
    uint32_t *fheap_p, *fheap_a;
    uint64_t *ftags;
    struct wq_rslot *rslots;       /* result slots (layout.h) */
    uint32_t *kfree;               /* key free lists (keys.c) */
    unsigned char *karena;         /* key arena (keys.c) */
    uint32_t result_capacity;
    bool metrics;                  /* duration metrics on (no WQ_NO_METRICS) */
    int fd;                        /* the shm object, for growing it; -1 if none */
    char path[WQ_REGION_PATH_MAX]; /* where it was opened ("" for a view being
                                      built): whether it is still linked
                                      there (store.c) */
    /* Bounds for indices read from shared memory: entries and result
       slots whose pages are reserved (hdr->grown_*, clamped). Refreshed
       at every lock acquisition and by our own growth; region lock, but
       nent and nkeys are also read (relaxed) by the coalesced add of any
       thread of this process: pages below them are never given back. */
    uint32_t nent, nres, nkeys;
    uint32_t nheap;                /* delay heap slots with pages (grown_heap, or
                                      nent with a store) */
    uint32_t gheap;                /* hdr->grown_heap as last taken */
    /* The index in use (table.c), refreshed like nent when hdr->index_at
       differs from index_seen (the word last accepted; after a refused
       one, its complement, so the next lock looks again). index_at is
       the view's own word, also read without the lock to aim a prefetch
       before locking (atomics.h, relaxed). */
    struct wq_islot *index;
    uint32_t index_slots;          /* 0: no usable index (damaged word) */
    /* The slot word's fields (layout.h), from the capacity (table.c):
       the entry reference's bits and mask; the hash fragment's mask and
       shift; the largest distance the tag holds (0: none, the entry's
       hash tells) and its shift. Shifts are 0 where a field is empty. */
    uint32_t ibits, irmask, ifmask, ifshift, idmax, idshift;
    uint32_t index_cover;          /* entries [0, index_cover) fit in it */
    uint64_t index_at;
    uint64_t index_seen;
    /* The ring in use (ring.c), refreshed the same way. */
    uint32_t *ring;
    uint32_t ring_slots;           /* 0: no usable ring (damaged word) */
    uint64_t ring_seen;
    uint32_t pf_ahead;             /* keys behind the front whose index slots
                                      we prefetched (queue.c); region lock */
    /* Where this handle last found or put each key (queue.c): hash << 32 |
       entry, by hash modulo WQ_HINTS (zero at first, a hint like any
       other). Written under the region lock, read without it (relaxed
       atomics); checked against the entry on every use. NULL if calloc
       failed. */
    uint64_t *hints;
    /* Published adds (lanes.c): the lanes (NULL where adds are never
       published: fair mode, a store), and the one this handle publishes
       to, WQ_NIL when none (written under the region lock, read without
       it by this process's publishing threads, relaxed). lane_busy: a
       thread of this process is publishing (atomic exchange): the lane
       has one writer, and another thread goes the locked way. */
    struct wq_lane *lanes;
    uint32_t lane;
    uint32_t lane_busy;
    uint32_t lane_seen;            /* the lane's head when this handle last
                                      read where its applied keys went */
    uint32_t hints2;               /* two-way hints: a lane was taken
                                      (relaxed atomics: other threads) */

    /* Registration: written under the region lock. */
    uint32_t slot;                 /* our process table slot */
    uint32_t gen;                  /* its generation */
    unsigned forkgen;              /* wq__fork_gen when registered */
    struct wq_lease *lease;        /* lease thread; NULL without a slot (a
                                      forked copy: the parent's, not ours) */

    /* How long this handle's caller works between its calls (lock.c,
       back_off): the gaps still to time (set when a consumer waited
       behind another with plenty queued), when the open one began (0:
       none open), and their average. Relaxed atomics: a hint, and
       threads sharing the handle may mix each other's samples. */
    uint32_t samples;
    uint64_t left_at, work_ns;

    /* Wakes owed once the lock is released (wait.c): region lock. Any
       thread of this process holding the region lock owns them. */
    int wake_get;                  /* wake_seq sleepers to wake */
    bool wake_idle;                /* wake every idle_seq sleeper */
#ifdef WQ_DEBUG
    const void *holder;            /* the thread holding the lock (lock.c) */
#endif

    uint64_t sync_ns;              /* our fsync commits' recent duration
                                      (store.c); relaxed atomics */

    uint64_t *scratch;             /* 3 x capacity bits, check/repair; lock */
    uint32_t *held;                /* max_procs counters, check/repair; lock */
    uint32_t *rscratch;            /* result_capacity slots, repair; lock */
} shmq;

/* The hint of `hash` (hash << 32 | entry), 0 if none. Relaxed loads: the
   coalesced add reads it without the lock. */
static inline uint64_t wq__hint_get(const shmq *q, uint32_t hash)
{
    const uint64_t *set = q->hints + ((hash % WQ_HINTS) & ~1u);
    uint64_t h = wq_load_relaxed(&set[0]);
    if ((uint32_t)(h >> 32) == hash)
        return h;
    h = wq_load_relaxed(&set[1]);
    return (uint32_t)(h >> 32) == hash ? h : 0;
}

/* Where the key of `hash` lives, as far as this handle knows. A handle
   that publishes adds (lanes.c) uses both slots of a set: in its own
   slot if it has one, else first, the other moving down; any other
   handle only the slot of its hash. Measured (tools/PERFORMANCE.md,
   "Adds published to lanes"): a publisher's missed hint costs the
   consumer that applies its add, and two ways raised the keys they
   processed 1.6x; a locked adder's miss costs itself, and two ways made
   its adds fast enough to starve the consumers of the lock's cache line
   (keys processed 0.4-1.5M/s against 1.25-1.4M/s). */
static inline void wq__hint_put(shmq *q, uint32_t hash, uint32_t idx)
{
    uint64_t v = (uint64_t)hash << 32 | idx;
    if (!wq_load_relaxed(&q->hints2))
        return wq_store_relaxed(&q->hints[hash % WQ_HINTS], v);
    uint64_t *set = q->hints + ((hash % WQ_HINTS) & ~1u);
    uint64_t h0 = wq_load_relaxed(&set[0]);
    if ((uint32_t)(h0 >> 32) == hash) {
        wq_store_relaxed(&set[0], v);
    } else if ((uint32_t)(wq_load_relaxed(&set[1]) >> 32) == hash) {
        wq_store_relaxed(&set[1], v);
    } else {
        wq_store_relaxed(&set[1], h0);
        wq_store_relaxed(&set[0], v);
    }
}

static inline shmq *wq__shm(wq *q)
{
    return (shmq *)q;
}

/* Our process slot, or WQ_NIL: a handle copied by fork names its
   parent's slot until the child registers (lock.c). */
static inline uint32_t wq__my_slot(const shmq *q)
{
    return q->forkgen == wq_load_relaxed(&wq__fork_gen) ? q->slot : WQ_NIL;
}

/* Lock held: the handle still holds its own slot. Not when it is a
   fork's copy, parked (wq__shm_park), or its slot was taken from it by
   the repair of a corrupt table. */
static inline bool wq__slot_held(const shmq *q)
{
    uint32_t s = wq__my_slot(q);
    return s < q->max_procs && q->procs[s].state == WQ_PROC_LIVE &&
           q->procs[s].gen == q->gen;
}

/* lock.c */
int wq__lock(shmq *q);        /* registers this process if it holds no slot */
int wq__lock_consumer(shmq *q);   /* wq__lock that backs off (see lock.c) */
/* A get or done (or a batch of them) begins, before any work of its
   own: ends the measure of the caller's work since its last call that
   tells wq__lock_consumer whether to back off (see lock.c). */
void wq__lock_enter(shmq *q);
/* ... and ends, after all its work: the measure's start. */
void wq__lock_leave(shmq *q);
int wq__lock_look(shmq *q);   /* never registers (see lock.c) */
int wq__lock_try(shmq *q);
void wq__unlock(shmq *q);
int wq__mutex_init(pthread_mutex_t *m);
#ifdef WQ_DEBUG
bool wq__lock_held(const shmq *q);
#define WQ_ASSERT_LOCKED(q) WQ_ASSERT((q)->restoring || wq__lock_held(q))
#else
#define WQ_ASSERT_LOCKED(q) ((void)0)
#endif

#include "mutate.h"

/* wait.c: wakes are owed under the lock and issued by wq__unlock. */
void wq__wake_getters(shmq *q, int n);
void wq__wake_drainers(shmq *q);
void wq__wake_all(shmq *q);
void wq__wake_flush(shmq *q, int get, bool idle);
int wq__futex_wait(uint32_t *word, uint32_t val, uint64_t deadline_mono);
void wq__futex_wake(uint32_t *word, int n);
int wq__sleep(shmq *q, uint32_t *word, uint64_t deadline, uint64_t until, bool getter);

/* region.c */
int wq__region_create(const char *path, const struct wq_options *opts);
int wq__region_attach(shmq *q, const char *path);
int wq__region_path(char *buf, size_t cap, const char *name);
const char *wq__shm_dir(void);
int wq__geometry(struct wq_geom *g, const struct wq_conf *c);
int wq__region_validate(const struct wq_geom *g, uint64_t file_size);
void wq__geom_conf(const struct wq_geom *g, struct wq_conf *c);
/* Growth: lock held (or restoring). Make entries [0, need) (with their
   heap and fair slots), or result slots [0, need), usable: 0, or -ENOSPC
   when the system refuses the pages (nothing changed, message set). */
int wq__region_grow_entries(shmq *q, uint32_t need);
int wq__region_grow_results(shmq *q, uint32_t need);
int wq__region_grow_keys(shmq *q, uint32_t need);
int wq__region_grow_heap(shmq *q, uint32_t need);
/* delay.c: room in the delay heap for every waiting and processing key
   and `extra` more keys that start to wait: 0, or -ENOSPC when the
   system refuses the pages (nothing changed, message set), or -EBADMSG
   when the counts are damaged (the region is flagged). Lock held. */
int wq__delay_room(shmq *q, uint32_t extra);
int wq__region_grow_lanes(shmq *q);
/* Reserve slots [0, slots) of area 0 or 1 of the index, or (ring) of
   the ring: 0, or -ENOSPC (message set). Release gives the pages of
   slots from `from` on back. Lock held. */
int wq__region_reserve_area(shmq *q, bool ring, unsigned area, uint32_t slots);
void wq__region_release_area(shmq *q, bool ring, unsigned area, uint32_t from);
void wq__region_bounds_load(shmq *q);
/* Lock held: take the growth counts (another process may have grown the
   region since we last held the lock). Inline: every lock acquisition
   makes this check, and the counts rarely move. */
static inline void wq__region_bounds(shmq *q)
{
    const struct wq_hdr *h = q->hdr;
    if (WQ_UNLIKELY(h->grown_ent != q->nent || h->grown_res != q->nres ||
                    h->grown_keys != q->nkeys || h->grown_heap != q->gheap ||
                    h->index_at != q->index_seen || h->ring_at != q->ring_seen))
        wq__region_bounds_load(q);
}
/* Entries ever used: every live, retained or free-listed one is below. */
static inline uint32_t wq__entries_used(const shmq *q)
{
    uint32_t f = q->hdr->e_fresh;
    return f < q->nent ? f : q->nent;
}

/* table.c: the key index */
uint32_t wq__table_lookup(shmq *q, const void *key, size_t len, uint32_t hash);
int wq__table_insert(shmq *q, uint32_t idx, uint32_t hash);
int wq__table_remove(shmq *q, uint32_t idx, uint32_t hash);
int wq__lock_lookup(shmq *q, const void *key, size_t len, uint32_t *idx);
/* Make room in the index for entries [0, need): 0, or -ENOSPC when the
   system refuses the pages (nothing changed, message set), or -EBADMSG
   when the index in use is damaged (the region is flagged). Lock held. */
int wq__table_grow(shmq *q, uint32_t need);
/* Set the handle's slot-word fields (ibits .. idshift) from its
   capacity; at attach. */
void wq__table_format(shmq *q);
/* The tag (the word without its entry reference) of a slot holding a key
   of this hash at this distance from its home slot. */
uint32_t wq__table_tag(const shmq *q, uint32_t hash, uint32_t dist);
/* The entry index + 1 a slot word names (0: empty). */
static inline uint32_t wq__islot_ref(const shmq *q, uint32_t w)
{
    return w & q->irmask;
}
/* Repair: build the index afresh from the entries, sized for those
   used; -ENOSPC if its pages are refused. */
int wq__table_rebuild(shmq *q, void (*dup)(void *c, uint32_t idx, uint32_t other, uint16_t st),
                      void *c);

/* Sizes of a table that grows (the index, the ring): from `min` slots
   (one page), each size the last plus its 2^-shift part, rounded down to
   whole pages and at least one, up to `max`, the size of a full queue's,
   which is any; the first that holds `want` slots. */
static inline uint32_t wq__area_size(uint32_t min, uint32_t max, uint64_t want,
                                     unsigned shift)
{
    uint64_t s = min;
    while (s < max && s < want) {
        uint64_t step = (s >> shift) / min * min;
        s += step > min ? step : min;
    }
    return s < max ? (uint32_t)s : max;
}
/* s is one of those sizes, as a size read from the region must be. */
static inline bool wq__area_size_ok(uint32_t min, uint32_t max, uint32_t s, unsigned shift)
{
    return s == max || (s >= min && s < max && wq__area_size(min, max, s, shift) == s);
}
/* The index has at least 2 * used + 1 slots for the entries used, and
   doubles: each growth rebuilds it from every entry (table.c), about
   22 ns per entry at 1e6, so growing by a quarter, as the ring does,
   made filling 1e6 keys 70% slower to save about 2.5 bytes per key. */
#define WQ_INDEX_MIN 1024u
#define WQ_INDEX_SHIFT 0u
static inline uint32_t wq__index_size(uint32_t index_max, uint64_t used)
{
    return wq__area_size(WQ_INDEX_MIN, index_max, 2 * used + 1, WQ_INDEX_SHIFT);
}
/* Lock held: the view of the index in area, with slots slots. */
static inline void wq__index_view(shmq *q, unsigned area, uint32_t slots)
{
    q->index = q->iarea[area];
    q->index_slots = slots;
    q->index_cover = slots == q->index_max ? q->capacity : slots > 0 ? (slots - 1) / 2 : 0;
    wq_store_relaxed(&q->index_at, (uint64_t)area << 32 | slots);
}
static inline uint32_t wq__home_in(uint32_t slots, uint32_t hash)
{
    return (uint32_t)(((uint64_t)hash * slots) >> 32);
}
static inline uint32_t wq__home(const shmq *q, uint32_t hash)
{
    return wq__home_in(q->index_slots, hash);
}
/* Slots from index slot `from` on to slot `to`, around the table's end. */
static inline uint32_t wq__index_dist(const shmq *q, uint32_t from, uint32_t to)
{
    return to >= from ? to - from : to + q->index_slots - from;
}

/* Start loading the index slot a lookup of hash reads first. A hint: it
   never faults, whatever the hash, and may run without the lock (then
   on whichever index the handle last saw). The next line too only when
   the home slot is one of the last two of its line (sixteen 4-byte
   slots to a line, sections 64-byte aligned): a removal's backward shift reads
   on past the slot it removes, and there it crossed into a line nobody
   had loaded (16% of a rotation at 1e7 keys, in table_remove; the next
   line as well, it ran 7-11% faster, tools/PERFORMANCE.md). Always
   prefetching the next line was slower at 1e6 and 1e7 keys when the
   index ran at load 0.8: the extra misses outnumbered the CPU's fill
   buffers. */
static inline void wq__table_prefetch(const shmq *q, uint32_t hash)
{
    enum { PER_LINE = WQ_ALIGN / sizeof(struct wq_islot) };
    uint64_t at = wq_load_relaxed(&q->index_at);
    uint32_t slots = (uint32_t)at, home = wq__home_in(slots, hash);
    uint32_t next_line = (home | (PER_LINE - 1)) + 1;
    const struct wq_islot *t = q->iarea[(at >> 32) & 1];
    __builtin_prefetch(&t[home], 1, 3);
    if (next_line - home <= 2 && next_line < slots)
        __builtin_prefetch(&t[next_line], 1, 3);
}
/* Queues with at least this many entries reserved (or index slots)
   prefetch ahead (queue.c): below it the index and entries stay in the
   caches and a prefetch is only work. */
#define WQ_PREFETCH_MIN (1u << 16)

/* ring.c: the FIFO */
/* Make room in the ring for entries [0, need): as wq__table_grow. */
int wq__ring_grow(shmq *q, uint32_t need);
int wq__ring_resize(shmq *q, bool *emptied);
/* The ring has a slot per entry used, and grows by a quarter: a growth
   is a copy of its members, so between growths it is at most a quarter
   larger than it needs (doubling: up to twice, 6.5 bytes per key at
   1e4 instead of 4.1). */
#define WQ_RING_MIN 1024u
#define WQ_RING_SHIFT 2u
static inline uint32_t wq__ring_size(uint32_t capacity, uint64_t used)
{
    return wq__area_size(WQ_RING_MIN, capacity, used, WQ_RING_SHIFT);
}
/* The ring a queue with `used` entries needs; fair mode orders its
   queue in heaps (fair.c) and keeps its ring empty, at its first size. */
static inline uint32_t wq__ring_need(const shmq *q, uint64_t used)
{
    return wq__ring_size(q->capacity, q->fair ? 0 : used);
}
/* Lock held: the view of the ring in area, with slots slots. */
static inline void wq__ring_view(shmq *q, unsigned area, uint32_t slots)
{
    q->ring = q->rarea[area];
    q->ring_slots = slots;
}
int wq__ring_push(shmq *q, uint32_t idx);
int wq__ring_remove(shmq *q, uint32_t idx);
uint32_t wq__ring_front(shmq *q);
void wq__ring_pop(shmq *q);
static inline uint32_t wq__ring_count(const shmq *q)
{
    return (uint32_t)(wq_load_relaxed(&q->hdr->ring_pos) >> 32);
}
/* The entry index k places behind the front, WQ_NIL if the ring is
   shorter, its word is out of range or the slot holds no valid index
   (wq__ring_front tells those apart for k = 0; prefetching just stops). */
static inline uint32_t wq__ring_peek(const shmq *q, uint32_t k)
{
    uint64_t pos = wq_load_relaxed(&q->hdr->ring_pos);
    uint32_t head = (uint32_t)pos, count = (uint32_t)(pos >> 32);
    if (k >= count || head >= q->ring_slots || count > q->ring_slots)
        return WQ_NIL;
    uint32_t at = head + k;
    if (at >= q->ring_slots)
        at -= q->ring_slots;
    uint32_t idx = q->ring[at];
    return idx < q->nent ? idx : WQ_NIL;
}

/* heap.c: heaps of entry indices; n = members before the call */
enum { WQ_HEAP_DELAY, WQ_HEAP_PRIO, WQ_HEAP_AGE };
int wq__heap_insert(shmq *q, int kind, uint32_t n, uint32_t idx);
int wq__heap_delete(shmq *q, int kind, uint32_t n, uint32_t idx);
int wq__heap_raise(shmq *q, int kind, uint32_t n, uint32_t idx);
int wq__heap_build(shmq *q, int kind, uint32_t n);
/* The slots of heap k that have pages (heap.c's bounds rule): the delay
   heap's own (region.c, grown_heap), the fair heaps' one per entry. */
static inline uint32_t wq__heap_room(const shmq *q, int kind)
{
    return kind == WQ_HEAP_DELAY ? q->nheap : q->nent;
}
/* The top member of heap kind of n members: WQ_NIL when empty,
   WQ_CORRUPT when n or the index found is out of range. */
static inline uint32_t wq__heap_top(const shmq *q, int kind, uint32_t n)
{
    if (n == 0)
        return WQ_NIL;
    if (WQ_UNLIKELY(n > wq__heap_room(q, kind)))
        return WQ_CORRUPT;
    uint32_t idx = (kind == WQ_HEAP_DELAY ? q->heap
                    : kind == WQ_HEAP_PRIO ? q->fheap_p : q->fheap_a)[0];
    return WQ_LIKELY(idx < q->nent) ? idx : WQ_CORRUPT;
}
void wq__heap_verify(shmq *q, int kind, uint32_t n, uint64_t *seen,
                     bool (*member)(const shmq *q, uint32_t idx),
                     void (*bad)(void *c, const char *what), void *c);

/* entry.c: the state machine (see its design note) */
static inline struct wq_entry *wq__entry(const shmq *q, uint32_t idx)
{
    return (struct wq_entry *)(q->entries + (size_t)idx * q->entry_size);
}
/* The entry's state without the store bit. */
static inline uint16_t wq__st(const struct wq_entry *e)
{
    return e->state & (uint16_t)~WQ_ST_SDIRTY;
}
static inline bool wq__has_result(const shmq *q, const struct wq_entry *e)
{
    return e->rslot < q->nres;
}
static inline uint16_t wq__gen16(uint32_t gen)
{
    return (uint16_t)gen;
}
uint32_t wq__entry_new(shmq *q, const void *key, size_t len, uint32_t hash, int *err);
/* Lock and busy held: a new incarnation number (entry->seq) before e's
   key is written or given back (the lock-free coalesced add's check). */
void wq__entry_renew(shmq *q, struct wq_entry *e);
/* Pages for entries [0, need) and their index and ring slots: 0, or -ENOSPC
   (nothing changed but pages reserved, message set), or -EBADMSG (a
   damaged index or ring; the region is flagged). Lock held. */
int wq__entry_room(shmq *q, uint32_t need);
int wq__entry_commit_new(shmq *q, uint32_t idx, uint16_t state, bool *queued);
int wq__entry_restore_idle(shmq *q, uint32_t idx);
int wq__entry_restore_queued(shmq *q, uint32_t idx);
int wq__entry_restore_enter(shmq *q, uint32_t idx);
int wq__entry_mark_dirty(shmq *q, uint32_t idx, uint64_t now, bool *queued);
int wq__entry_hand_out(shmq *q, uint32_t idx, uint64_t now);
int wq__entry_done(shmq *q, uint32_t idx, uint64_t now, const struct wq_outcome *o,
                   bool *queued);
int wq__entry_delay(shmq *q, uint32_t idx, uint64_t ready);
int wq__entry_requeue(shmq *q, uint32_t idx, bool crash, uint64_t now, bool *queued);
int wq__entry_drop_wait(shmq *q, uint32_t idx);
int wq__entry_release(shmq *q, uint32_t idx, bool stored);
int wq__entry_forget(shmq *q, uint32_t idx);
int wq__entry_remove(shmq *q, uint32_t idx);
uint64_t wq__entry_when(shmq *q, uint32_t idx, uint64_t now);
int wq__entry_stored(shmq *q, uint32_t idx, uint64_t now, bool *queued);
void wq__entry_unstore(shmq *q, uint32_t idx);
int wq__entry_evict_room(shmq *q, uint32_t want);
uint32_t wq__entry_free_count(const shmq *q);
/* A transition found a structure corrupt after its commit (entry.c): the
   next locker rebuilds; loops of transitions stop until then. */
static inline bool wq__region_broken(const shmq *q)
{
    return WQ_UNLIKELY(q->hdr->corrupt != 0);
}
/* Lock held: the caller found a structure inconsistent. The next locker
   repairs (lock.c); this call fails with -EBADMSG. */
static inline int wq__region_mark_corrupt(shmq *q)
{
    q->hdr->corrupt = 1;
    return -EBADMSG;
}
/* One pause of a spin loop: lets the sibling hyperthread run and saves
   power while polling a word another CPU will write. */
static inline void wq__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* Queued keys, in either mode (lock held, or as a hint without it). */
static inline uint32_t wq__queued(const shmq *q)
{
    return q->fair ? wq_load_relaxed(&q->hdr->fq_count) : wq__ring_count(q);
}

/* delay.c */
uint32_t wq__promote(shmq *q, uint64_t now);
uint64_t wq__next_ready(const shmq *q);
void wq__drop_waiting(shmq *q);

/* limiter.c */
uint64_t wq__limiter_when(shmq *q, struct wq_entry *e, uint64_t now);
void wq__limiter_init(struct wq_hdr *h);

/* keys.c: the key arena, for keys, result messages and run records */
/* The len bytes of the arena block at granule `block`, or NULL when they
   lie past its reserved pages (region data is never trusted). Also
   called without the lock by the coalesced add (queue.c): nkeys is read
   relaxed. */
static inline const unsigned char *wq__keys_at(const shmq *q, uint32_t block, uint32_t len)
{
    uint64_t end = (uint64_t)block + WQ_GRAINS(len);
    return WQ_LIKELY(end <= wq_load_relaxed(&q->nkeys))
               ? q->karena + (uint64_t)block * WQ_KEY_GRAIN : NULL;
}
/* The bytes of a key of len that its arena block holds: a key of up to
   WQ_KEY_INLINE bytes has none (it is all in its entry), a longer one
   all but the first WQ_KEY_PRE, which its entry holds (layout.h). */
static inline uint32_t wq__key_tail(uint32_t len)
{
    return len > WQ_KEY_INLINE ? len - WQ_KEY_PRE : 0;
}
/* A long key's tail in the arena, a short key's bytes in its entry;
   NULL when its length or its block is damaged. */
static inline const unsigned char *wq__key_rest(const shmq *q, const struct wq_entry *e)
{
    uint32_t len = e->keylen;
    if (WQ_LIKELY(len - 1u < WQ_KEY_INLINE))
        return len <= q->max_key_len ? e->k.in : NULL;
    if (WQ_UNLIKELY(len == 0 || len > q->max_key_len))
        return NULL;
    return wq__keys_at(q, e->k.block, len - WQ_KEY_PRE);
}
/* e's key is sound: a legal length, and a long key's tail in the
   granules with pages. */
static inline bool wq__key_ok(const shmq *q, const struct wq_entry *e)
{
    return wq__key_rest(q, e) != NULL;
}
/* A key of len bytes whose rest (wq__key_rest, or the coalesced add's
   own read of it) is r: is it this key? */
static inline bool wq__key_match(const struct wq_entry *e, const unsigned char *r,
                                 const void *key, size_t len)
{
    if (len <= WQ_KEY_INLINE)
        return memcmp(r, key, len) == 0;
    return memcmp(e->k.pre, key, WQ_KEY_PRE) == 0 &&
           memcmp(r, (const unsigned char *)key + WQ_KEY_PRE, len - WQ_KEY_PRE) == 0;
}
/* e holds this key (false too when e's key is damaged). */
static inline bool wq__key_eq(const shmq *q, const struct wq_entry *e, const void *key,
                              size_t len)
{
    const unsigned char *r = wq__key_rest(q, e);
    return e->keylen == len && r && wq__key_match(e, r, key, len);
}
/* Copy e's key (keylen bytes), whose rest is r, into buf. */
static inline void wq__key_copy(const struct wq_entry *e, const unsigned char *r,
                                unsigned char *buf)
{
    uint32_t len = e->keylen;
    if (len <= WQ_KEY_INLINE) {
        memcpy(buf, r, len);
        return;
    }
    memcpy(buf, e->k.pre, WQ_KEY_PRE);
    memcpy(buf + WQ_KEY_PRE, r, len - WQ_KEY_PRE);
}
/* The bytes of e's key (keylen of them) in one piece: in its entry for
   a short key, else copied into buf (room for max_key_len bytes); NULL
   when its length or its block is damaged. */
static inline const unsigned char *wq__key(const shmq *q, const struct wq_entry *e,
                                           unsigned char *buf)
{
    const unsigned char *r = wq__key_rest(q, e);
    if (!r || e->keylen <= WQ_KEY_INLINE)
        return r;
    wq__key_copy(e, r, buf);
    return buf;
}
/* The run record at granule b of the arena (unchecked: the caller took
   the block, or checked it). */
static inline struct wq_run *wq__run_at(const shmq *q, uint32_t b)
{
    return (struct wq_run *)(q->karena + (uint64_t)b * WQ_KEY_GRAIN);
}
/* Lock held: the run record of entry idx, PROCESSING (layout.h), or NULL
   when its block lies past the granules handed out or names another
   entry (region data is never trusted). */
static inline struct wq_run *wq__entry_run(const shmq *q, const struct wq_entry *e,
                                           uint32_t idx)
{
    uint32_t top = q->hdr->k_top;
    if (top > q->nkeys)
        top = q->nkeys;
    if (WQ_UNLIKELY(e->run >= top || top - e->run < WQ_RUN_GRAINS))
        return NULL;
    struct wq_run *r = wq__run_at(q, e->run);
    return WQ_LIKELY(r->entry == idx) ? r : NULL;
}
/* Lock held: the process slot whose handle holds a run record's key (the
   slot LIVE, with the generation it had at the hand-out), or NULL. */
static inline struct wq_proc *wq__run_holder(const shmq *q, const struct wq_run *r)
{
    if (r->owner >= q->max_procs)
        return NULL;
    struct wq_proc *p = &q->procs[r->owner];
    return p->state == WQ_PROC_LIVE && wq__gen16(p->gen) == r->owner_gen ? p : NULL;
}
/* Lock and busy held: a block for len bytes (0, -ENOSPC with the message
   set, -EBADMSG with the region flagged, -ENOMEM), and one given back
   (a block that is not sound flags the region instead). */
int wq__keys_take(shmq *q, uint32_t len, uint32_t *block);
/* Lock held, outside a mutation: make room so that the next mutation can
   take a block for len bytes (listed, or from the top) or `need`
   granules from the top without growing or merging: 0, -ENOSPC with the
   message set (pages refused), -ENOMEM, -EBADMSG. */
int wq__keys_room(shmq *q, uint32_t len, uint64_t need);
void wq__keys_give(shmq *q, uint32_t block, uint32_t len);
/* Lock and busy held: store a new entry's key (in the entry or a block of
   the arena) and its length: 0, -ENOSPC (message set), -EBADMSG (the
   region is flagged), -ENOMEM. Drop gives the block back as the entry
   becomes free, and zeroes keylen: a free entry owns no block. */
int wq__keys_put(shmq *q, struct wq_entry *e, const void *key, uint32_t len);
void wq__keys_drop(shmq *q, struct wq_entry *e);
/* Check and repair: a bitmap of the arena's granules (calloc'ed; NULL if
   out of memory); mark the block of len bytes at `block` in it (-1, and
   nothing marked: it passes the top or some granule is marked already)
   or unmark it; rebuild the free lists and top from it (lock and busy
   held); verify the lists against it (check only). */
uint64_t *wq__keys_map(const shmq *q);
int wq__keys_mark(const shmq *q, uint64_t *map, uint32_t block, uint32_t len);
void wq__keys_unmark(uint64_t *map, uint32_t block, uint32_t len);
void wq__keys_rebuild(shmq *q, const uint64_t *map);
void wq__keys_verify(const shmq *q, uint64_t *map, void (*bad)(void *c, const char *what),
                     void *c);

/* results.c */
/* Mark the message blocks of the used result slots in an arena map: the
   number of slots whose block is not sound (outside the arena, or
   sharing bytes). With apply, such a message is emptied; with bad, each
   is reported. */
int wq__results_mark(shmq *q, uint64_t *map, bool apply,
                     void (*bad)(void *c, const char *what), void *c);
int wq__result_room(shmq *q, uint32_t idx, const char *message);
uint32_t wq__result_message(const shmq *q, const struct wq_rslot *r, char *buf);
int wq__result_record(shmq *q, uint32_t idx, int code, const char *message);
void wq__result_drop(shmq *q, uint32_t idx);
void wq__results_rebuild(shmq *q);
bool wq__result_kept(const shmq *q, uint32_t idx);
bool wq__results_damaged(shmq *q);
int wq__results_verify(shmq *q, void (*violation)(void *c, const char *what), void *c);
void wq__result_read(const shmq *q, const struct wq_entry *e, struct wq_result *out);

/* metrics.c */
void wq__observe(struct wq_hist *h, uint64_t ns);
static inline uint64_t wq__metrics_now(const shmq *q)
{
    return q->metrics ? wq__now_mono() : 0;
}

/* fair.c */
void wq__fair_dirty(shmq *q, uint32_t idx);
uint32_t wq__fair_tenant_len(const shmq *q, const struct wq_entry *e);
int wq__fair_push(shmq *q, uint32_t idx);
uint32_t wq__fair_front(shmq *q);
int wq__fair_pop(shmq *q, uint32_t idx);
int wq__fair_remove(shmq *q, uint32_t idx);
int wq__fair_prio(shmq *q, uint32_t idx, int prio, bool fresh);
int wq__fair_rebuild(shmq *q);
void wq__fair_verify(shmq *q, void (*violation)(void *c, const char *what), void *c);

/* lanes.c: adds published without the lock (wq_add_publish) */
int wq__lanes_publish(shmq *q, const void *key, uint32_t len, uint32_t hash, uint64_t now);
int wq__lanes_take(shmq *q);
void wq__lanes_grant(shmq *q, uint32_t l);
/* Lock held: each lane's room down to what it holds. */
void wq__lanes_revoke(shmq *q);
/* Lock held: whether n more live keys fit, counting the room granted to
   lanes as live; unused grants come back first when they do not. */
bool wq__lanes_room(shmq *q, uint64_t n);
/* The longest key a lane takes for this queue. */
uint32_t wq__lanes_key_max(const shmq *q);
void wq__lanes_free_slot(shmq *q, uint32_t slot);
uint64_t wq__lanes_grains(const shmq *q);
struct wq_lane_slot *wq__lanes_next(shmq *q, uint32_t l, uint32_t *pos);
void wq__lanes_advance(shmq *q, uint32_t l);
void wq__lanes_verify(shmq *q, bool apply, void (*violation)(void *c, const char *what),
                      void *c);

/* procs.c */
int wq__procs_register(shmq *q);
bool wq__procs_unregister(shmq *q);
unsigned wq__procs_reap(shmq *q);
uint64_t wq__procs_coalesced(const shmq *q);
void wq__procs_maybe_reap(shmq *q);
int wq__procs_release_pid(shmq *q, pid_t pid);
bool wq__lease_alive(struct wq_proc *p);

/* repair.c */
int wq__repair(shmq *q, bool apply, bool thorough, wq_report_fn report, void *arg);

/* queue.c, inspect.c, ...: the engine's operations (engine.c lists them) */
int wq__shm_add(wq *q, const struct wq_add_req *r);
int wq__shm_add_many(wq *q, const struct iovec *keys, size_t n);
int wq__shm_add_publish(wq *q, const void *key, size_t len);
void wq__queue_apply_lanes(shmq *q);
int wq__shm_get(wq *q, void *buf, uint64_t deadline);
int wq__shm_get_many(wq *q, void *buf, size_t size, struct iovec *keys, size_t n,
                     uint64_t deadline);
int wq__shm_done_many(wq *q, const struct iovec *keys, size_t n);
int wq__shm_done(wq *q, const void *key, size_t len, const struct wq_outcome *o);
int wq__shm_done_get(wq *q, const void *key, size_t len, const struct wq_outcome *o,
                     void *buf, uint64_t deadline);
int wq__shm_len(wq *q);
int wq__shm_shutdown(wq *q);
int wq__shm_resume(wq *q);
int wq__shm_drain(wq *q, uint64_t deadline);
bool wq__shm_shutting_down(wq *q);
int wq__shm_forget(wq *q, const void *key, size_t len);
int wq__shm_remove(wq *q, const void *key, size_t len);
int wq__shm_num_requeues(wq *q, const void *key, size_t len);
int wq__shm_result(wq *q, const void *key, size_t len, struct wq_result *out);
int wq__shm_stats(wq *q, struct wq_stats *out);
int wq__shm_metrics(wq *q, struct wq_metrics *out);
int wq__shm_dump(wq *q, wq_dump_fn fn, void *arg);
int wq__shm_check(wq *q, unsigned flags, wq_report_fn report, void *arg);
int wq__shm_release_pid(wq *q, pid_t pid);
void wq__shm_close(wq *q);
int wq__shm_park(wq *q);

#include "../store/store.h"
#include "../store/read.h"

#endif
