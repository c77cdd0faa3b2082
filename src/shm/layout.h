/*
 * layout.h - the shared-memory format of a libwq region. No code.
 *
 * One shm object per queue, laid out as
 *
 *   [struct wq_hdr][proc table][key free lists][entries][hash index A]
 *   [hash index B][ring A][ring B][delay heap][result slots][store queue]
 *   [fair: per-entry data, 2 heaps, tenant tags][key arena]
 *
 * Every section starts on a 64-byte boundary. Offsets and sizes are
 * computed by wq__geometry() (region.c) from the queue's settings and
 * stored in the immutable header, which carries a checksum; an attacher
 * recomputes the geometry and refuses any mismatch (-EPROTO). The object
 * is sparse: the sections indexed by entry, the result slots and the key
 * arena take pages only as far as hdr->grown_ent, grown_res and
 * grown_keys say (region.c), and
 * of the two index areas only the one hdr->index_at names holds pages,
 * for as many slots as it says (table.c), and the same for the ring's
 * two areas and hdr->ring_at (ring.c).
 *
 * Source of truth and repair. The entries are the source of truth: each
 * entry's state word says whether it is free, dirty, queued, processing.
 * The hash index, the free list, the counters and the set of ring members
 * can all be rebuilt from the entries; the ring additionally carries the
 * FIFO order, which repair keeps by compacting the ring (dropping members
 * whose entry is not queued, and duplicates) and appending queued entries
 * that are missing. See repair.c.
 *
 * Write discipline. Everything below marked "lock" is written only while
 * holding hdr->lock; the few words read without it say so, and are
 * accessed through atomics.h. How a critical section orders its stores
 * so that a holder killed at any instruction leaves a state repair
 * handles is mutate.h's rule, and entry.c is the only file that moves an
 * entry between states.
 *
 * Byte order and word size are the machine's: a region is shared by the
 * processes of one machine, never moved to another.
 */
#ifndef WQ_LAYOUT_H
#define WQ_LAYOUT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define WQ_MAGIC        0x31515762696c0a57ull /* "W\nlibWQ1" little-endian */
#define WQ_LAYOUT_VER   18u
#define WQ_ALIGN        64u
#define WQ_NIL          0xffffffffu          /* "no entry" */

/* Entry state bits (struct wq_entry.state). 0 = free. */
#define WQ_ST_DIRTY      (1u << 0)  /* added, not yet handed out */
#define WQ_ST_QUEUED     (1u << 1)  /* in the ring; implies DIRTY */
#define WQ_ST_PROCESSING (1u << 2)  /* handed out; its run record valid */
#define WQ_ST_WAITING    (1u << 3)  /* in the delay heap; never with DIRTY */
#define WQ_ST_RETAINED   (1u << 4)  /* alone: idle, kept for a failure count
                                       or a result */
#define WQ_ST_SDIRTY     (1u << 5)  /* store record out of date; in the store
                                       queue (store.c) */
#define WQ_ST_STORING    (1u << 6)  /* with SDIRTY alone: a new key, invisible
                                       until its first store commit; t_b is
                                       its ready time (0: queue at once) */
#define WQ_ST_ALL        (WQ_ST_DIRTY | WQ_ST_QUEUED | WQ_ST_PROCESSING | \
                          WQ_ST_WAITING | WQ_ST_RETAINED | WQ_ST_SDIRTY | \
                          WQ_ST_STORING)
/* Legal states: DIRTY|QUEUED, PROCESSING, PROCESSING|DIRTY,
   PROCESSING|WAITING, WAITING, RETAINED (with failures > 0 or a result);
   with a store, any of these | SDIRTY, STORING|SDIRTY, and SDIRTY alone
   (a key gone from the queue whose store record is still to be removed). */

/* hdr->pend_kind */
#define WQ_PEND_NONE     0u
#define WQ_PEND_ADD      1u  /* adds_total; committed when the entry is live */
#define WQ_PEND_MARK     2u  /* adds_total; committed when the entry is dirty */
#define WQ_PEND_CRASH    3u  /* crash_requeues_total; committed when queued */

/* Process slot states (struct wq_proc.state). */
#define WQ_PROC_FREE     0u
#define WQ_PROC_LIVE     1u   /* lease held by the handle's lease thread */

/*
 * The immutable header: written once by the creator before the region is
 * published (linked into /dev/shm), never written again. Covered by
 * `checksum` (FNV-1a 64 over the bytes before it).
 */
struct wq_geom {
    uint64_t magic;
    uint32_t version;
    uint32_t hdr_size;        /* sizeof(struct wq_hdr) */
    uint32_t capacity;        /* entries */
    uint32_t max_key_len;
    uint32_t max_procs;
    uint32_t entry_size;      /* sizeof(struct wq_entry) */
    uint32_t index_max;       /* slots of each index area: 2 * capacity + 1 */
    uint32_t flags;           /* creation flags kept: WQ_NO_METRICS */
    uint64_t hash_seed;       /* random per region: no cross-queue flooding */
    uint64_t off_procs, off_entries, off_index, off_ring, off_heap, off_results;
    uint64_t off_index_b;     /* the second index area, after the first */
    uint64_t off_ring_b;      /* the second ring area, after the first */
    uint32_t result_capacity;
    uint32_t durability;      /* WQ_DURABLE_*; meaningful with a store */
    uint64_t off_sq;          /* store queue: capacity entry indices */
    uint32_t has_store;
    uint32_t snapshot_ms;     /* NONE: snapshot interval; FSYNC: deferred changes' */
    char store_path[1024];    /* absolute path of the LMDB directory */
    /* Fair mode (fair.c); sections are empty without WQ_FAIR. */
    uint64_t off_fx, off_fheap_p, off_fheap_a, off_ftags;
    uint32_t fair_share;      /* one hand-out in fair_share takes the oldest */
    int32_t tenant_sep;       /* -1: no tenants */
    uint32_t ftag_slots;      /* tenant tag counters (power of two) */
    uint32_t key_max;         /* granules of the key arena (keys.c): room
                                 for `capacity` keys of max_key_len (none
                                 when keys fit in their entries) with a
                                 run record each, result_capacity
                                 messages of 255 bytes, and the gaps
                                 between them (region.c) */
    uint64_t total_size;      /* the shm object's size */
    uint32_t mode;            /* creation mode, informative */
    uint32_t reserved0;
    uint64_t created_ns;      /* CLOCK_REALTIME at creation, informative */
    /* Rate limiter, defaults resolved at creation (limiter.c). */
    uint32_t rl_limiters;     /* WQ_RL_* mask, never 0 here */
    uint32_t rl_burst;
    uint64_t rl_base_delay_ns, rl_max_delay_ns;
    double   rl_qps;
    uint64_t rl_fast_delay_ns, rl_slow_delay_ns;
    uint32_t rl_max_fast_attempts;
    uint32_t key_classes;     /* arena free lists: one per block size in
                                 granules, 0 .. the longest key's or
                                 message's, in granules */
    uint64_t off_kfree, off_keys;
    uint64_t off_lanes;       /* published-add lanes (lanes.c); an empty
                                 section in fair queues and queues with a
                                 store, which never publish */
    uint64_t off_sgen;        /* with a store: a uint32 per entry, bumped
                                 by every change of it the store must see
                                 (store.c); reserved with the entries */
    uint64_t checksum;        /* FNV-1a 64 of all bytes above */
};

/*
 * The mutable header. Who writes each field and who reads it without the
 * lock ("lock" alone: written and read only by the holder of `lock`).
 * Words read without the lock are accessed through atomics.h on both
 * sides, and say so below; they are hints or snapshots there: every
 * decision that matters reads them again under the lock.
 *
 * Futex protocol (wait.c): a sleeper reads wake_seq (or idle_seq) under
 * the lock, unlocks and FUTEX_WAITs on that value; whoever makes a key
 * available (or shuts down) bumps the word under the lock with release
 * order and issues FUTEX_WAKE after unlocking. A bump between the
 * sleeper's unlock and its wait makes the wait return at once, so no
 * wake is ever lost.
 */
struct wq_hdr {
    struct wq_geom g;
    char pad0[WQ_ALIGN - (sizeof(struct wq_geom) % WQ_ALIGN)];

    /* Read-mostly, on a line of its own: written under the lock on rare
       events, read without it on hot paths, where a read of the lock's
       line would pull that line away from whoever locks next. */
    uint32_t shutdown;                    /* lock to write; read without it by
                                             wq_shutting_down (relaxed: a hint)
                                             and the coalesced add (queue.c) */
    uint32_t corrupt;                     /* lock to write; set by whoever finds
                                             a structure inconsistent; the next
                                             locker repairs (like busy); read
                                             without it by the coalesced add,
                                             which then leaves the add to that
                                             locker */
    uint32_t storing_drops;               /* lock (repair.c, store.c): entries
                                             a repair dropped while their new
                                             key awaited its store commit
                                             (STORING). Rarely written: a line
                                             of read-mostly fields suits it.
                                             Zero in regions of earlier builds
                                             of this layout, which never count */
    char pad_rm[WQ_ALIGN - 3 * sizeof(uint32_t)];

    /* Lanes with adds to apply (lanes.c): bit l for lane l. Set without
       the lock by a producer whose publication found its lane applied up
       to it (atomic or), taken by the locker that applies them (atomic
       exchange); read without the lock by a getter about to sleep. On a
       line of its own: producers write it about once per application. */
    uint32_t lanes_pending;
    char pad_lp[WQ_ALIGN - sizeof(uint32_t)];

    pthread_mutex_t lock;                 /* robust, process-shared */
    uint32_t busy;                        /* lock; 1 while a mutation runs
                                             (mutate.h) */
    uint32_t free_head;                   /* lock; free-entry list, WQ_NIL = empty */
    uint32_t live;                        /* lock; queued+processing+waiting */
    uint32_t processing;                  /* lock */
    uint32_t waiters;                     /* lock; sleepers on wake_seq, the sum
                                             of the per-slot counts, so a dead
                                             sleeper's count goes with its slot;
                                             stored atomically: publishers
                                             (lanes.c) read it unlocked */
    uint32_t drainers;                    /* lock; sleepers on idle_seq */
    uint32_t shutdown_calls;              /* lock; bumped by wq_shutdown */
    /* lock: the counter an in-flight mutation will bump once its commit
       store is done (WQ_PEND_*), and its entry (mutate.h, rule 3). */
    uint32_t pend_kind;
    uint32_t pend_idx;
    uint32_t reap_tick;                   /* lock; ops since the last reap */
    /* lock to write, by each locker right after it acquires; read without
       it (relaxed) by a consumer that finds the lock taken: 1 if the
       holder takes or finishes keys (wq__lock_consumer), 0 for any other
       call. A hint: a consumer naps only behind another consumer
       (lock.c). Nothing checks or repairs it. On ring_pos's line, not
       the mutex's (which it fills up to `drainers`). */
    uint32_t holder_consumer;
    /* lock to write; read without it by wq_len and monitoring (relaxed).
       Front index (low 32 bits) and count (high 32 bits) in one word so a
       pop or push commits with a single store. */
    uint64_t ring_pos;
    char pad1[WQ_ALIGN];

    uint32_t wake_seq;                    /* futex; lock to bump (release);
                                             sleepers load it under the lock */
    uint32_t idle_seq;                    /* futex; as wake_seq, for drainers */
    uint32_t zombies;                     /* lock; entries whose store record is
                                             still to be removed (SDIRTY alone) */
    uint32_t failing;                     /* lock; RETAINED entries with a
                                             failure count (the rest of
                                             `retained` keep only a result) */
    uint64_t last_reap_ns;                /* lock; CLOCK_MONOTONIC */
    /* Counters: lock; read under the lock by wq_stats and wq_metrics. */
    uint64_t adds_total;
    uint64_t coalesced_total;
    uint64_t retries_total;
    uint64_t crash_requeues_total;
    uint64_t repairs_total;

    /* Delays (delay.c): lock. heap[0..heap_count) are the WAITING
       entries, a binary min-heap on (entry->t_b, entry->seq); each such
       entry's link is its heap position. heap_count is also read without
       the lock by wq_len (relaxed: "anything waiting?"). */
    uint32_t heap_count;
    uint32_t seq_next;                    /* lock; next entry->seq */
    uint32_t retained;                    /* lock; RETAINED entries */
    uint32_t evict_hand;                  /* lock; clock hand for eviction */
    /* Token bucket (limiter.c): lock. */
    double bucket_tokens;
    uint64_t bucket_last_ns;
    /* Metrics (metrics.c): sum_start is the sum of t_start over processing
       entries (unfinished work = processing * now - sum_start); lock. The
       histograms too: lock (wq_metrics reads them under it). */
    uint64_t sum_start;
    struct wq_hist {
        uint64_t bucket[11];              /* non-cumulative; [10] is +Inf */
        uint64_t count;
        uint64_t sum_ns;
    } qdur, wdur, rldelay;                /* rldelay: the rate limiter's delays */
    /* Results (results.c): lock. Used slots form a list in update order
       (least recently updated at the head, evicted first); free slots a
       list through next, and slots r_fresh.. were never used (zero, on no
       list): a new region does not write its result table. */
    uint32_t r_free, r_head, r_tail, r_count;
    uint64_t r_seq;                       /* next result update sequence */
    uint32_t r_busy;                      /* lock; 1 while the table changes:
                                             repair rebuilds it only then */
    uint32_t sq_epoch;                    /* lock; bumped by repair (store.c) */
    /* Store queue (store.c): lock. sq[] is a ring of the SDIRTY entries in
       the order they became out of date. Only the process holding the flush
       lock pops from it, so its front is stable while that process writes
       what it read there. sq_count is also read without the lock (relaxed)
       as "anything to write?" before taking LMDB's locks. */
    uint32_t sq_head, sq_count;
    /* WQ_DURABLE_NONE: when the next periodic snapshot is due. Read and
       written without the lock (relaxed): two processes that both see it
       due both flush, which is harmless (a flush writes what is listed). */
    uint64_t next_snapshot_ns;
    /* Fair mode (fair.c): lock. fq_count keys are queued, each in both
       heaps (also read without the lock by wq_len, relaxed); vtime is the
       start tag of the last key handed out by priority; ticks counts
       hand-outs for the oldest-key share. */
    uint32_t fq_count;
    uint32_t fair_ticks;
    uint64_t fair_vtime;
    uint32_t wake_pending;                /* lock; wakes issued to getters that
                                             have not locked again yet (wait.c);
                                             0 in regions of earlier builds */
    uint64_t restored;                    /* written once, before publication:
                                             keys restored from the store */
    uint32_t r_fresh;                     /* lock; see r_free above */
    /* Entries ever used (lock): index e_fresh and above are free, zero
       and on no list; a new key takes one only when the free list is
       empty. */
    uint32_t e_fresh;
    /* Growth (region.c; lock). The region is a sparse file: only the
       pages of the fixed sections (header, process table, store queue,
       tenant tags) and of the first index and ring (index_at, ring_at
       below) are reserved at creation. Entries, with
       the fair sections (and with a store the delay heap), which have at
       most one slot per entry, are reserved for grown_ent of them, the
       delay heap otherwise for grown_heap, and result slots for
       grown_res; each grows in steps, under the lock, before anything is
       written there. Nothing at or past these counts is ever read or
       written: on tmpfs even a read would allocate the page, and on a
       full one kill the reader with SIGBUS. */
    uint32_t grown_ent;
    uint32_t grown_res;
    /* The hash index in use (table.c; lock): its slot count (low 32
       bits) and area (bit 32: 0 at off_index, 1 at off_index_b), in one
       word so that a growth switches to the new table with one store.
       Only that area holds pages, for those slots (pages of an earlier
       table that a death left are given back by the next locker). */
    uint64_t index_at;
    /* The ring in use (ring.c; lock): its slot count and area, the same
       way. ring_pos's front is below the count of slots. */
    uint64_t ring_at;
    /* Fsync groups (store.c): hints, never needed for correctness (a
       wrong one costs a smaller group or a short wait). Lock to write;
       sync_seq (a futex), sync_read and sync_wait are also read without
       it (relaxed). 0 in regions of earlier builds. */
    uint32_t sync_seq;                    /* bumped by each process's first
                                             add since the last group read,
                                             and by each group read */
    uint32_t sync_read;                   /* sync_seq when the last fsync
                                             group was read */
    uint32_t sync_prev;                   /* ... and the group before it */
    uint32_t sync_wait;                   /* an adder waits for the others
                                             until then (us of
                                             CLOCK_MONOTONIC, low 32 bits);
                                             0: none */
    /* The key arena (keys.c; lock): granules [0, k_top) have been handed
       out, each a live entry's key block, a processing entry's run
       record, a result's message or on a free list; grown_keys of them
       have pages (region.c). */
    uint32_t k_top;
    uint32_t grown_keys;
    /* The delay heap's slots with pages (region.c; lock). With a store
       they are the entries' (grown_ent; this stays 0). Without, they
       grow on demand: enough for every waiting key and every key being
       processed (which may start to wait without asking for room) and,
       before a get or an add that starts a wait, one more
       (wq__delay_room). A queue that never delays a key holds one
       page of them, not 4 bytes per key. */
    uint32_t grown_heap;
    /* Store flushers (store.c): one at a time, from reading the store
       queue's front to popping it; robust, holds no state of its own. */
    pthread_mutex_t flush_lock;
    /* The journal of an FSYNC store (store.c, journal.c): flush lock.
       j_id is the store's journal id (written once, before publication);
       j_lsn the last group number taken, taken before its group is
       written (so a writer killed while writing leaves a number nobody
       takes again); j_tail where the next group goes: groups below it
       were written whole, since the last checkpoint. */
    uint64_t j_id;
    uint64_t j_lsn;
    uint64_t j_tail;
    /* Its claim of the store (store/owner.c): random, never 0, written
       once, before publication; 0 for a region without a store. */
    uint64_t claim;
    /* Published adds (lanes.c; lock). lanes_grown: the lanes' pages are
       reserved (nothing reads or writes them before). lane_granted: the
       adds the lanes may hold, applied or not: the sum of each lane's
       limit - head. live + lane_granted <= capacity, and the entries
       (and arena granules) they may need have pages, so an add already
       published never meets a full queue (entry.c, keys.c). lmark and
       lmark_sum: the lane slot being applied ((lane + 1) << 32 | its
       position) and adds_total + coalesced_total before it, so that the
       locker after a holder that died applying it knows whether that add
       was made and counted (queue.c). */
    uint32_t lanes_grown;
    uint32_t lane_granted;
    uint64_t lmark;
    uint64_t lmark_sum;
    /* lock: with pend_kind (mutate.h), the counters it names as they were
       when it was armed: adds_total (ADD, MARK) or crash_requeues_total
       (CRASH), and retries_total. A counter that moved was bumped by the
       holder that died, which did not live to disarm the record; repair
       does not bump it again. */
    uint64_t pend_count;
    uint64_t pend_count2;
};

/*
 * One process table slot per attached handle. The lease is locked by the
 * handle's lease thread for the handle's whole life: trylock answering
 * EOWNERDEAD (or success on a LIVE slot) means the holder is gone; EBUSY
 * means it lives, however slow or stopped.
 *   state, pid, gen, held, waiting: lock.
 *   gen is bumped each time the slot is (re)claimed, and recorded in each
 *   entry a handle of this slot gets, so a reused slot never inherits keys.
 */
struct wq_proc {
    pthread_mutex_t lease;
    uint32_t state;
    int32_t pid;
    uint32_t gen;
    uint32_t held;            /* entries processing with this slot as owner */
    uint32_t waiting;         /* this slot's sleepers counted in hdr->waiters */
    uint32_t sync_mark;       /* hdr->sync_seq of this slot's last add that
                                 needed an fsync (store.c); a hint */
    uint64_t since_ns;        /* CLOCK_REALTIME of registration, informative */
    /* Adds coalesced without the lock (queue.c) by the holders this slot
       has had: written by the holder alone (relaxed atomics), read under
       the lock by wq_stats and wq_metrics, which add every slot's to
       hdr->coalesced_total. Never reset while the region lives, so a
       slot given up, repaired or reused loses nothing of it. */
    uint64_t coalesced;
};

/*
 * A key slot: 52 bytes. All fields: lock to write; state, seq, keylen,
 * hash and k are also read without it by the coalesced add (queue.c), so
 * state and seq are stored through atomics.h.
 *   state     a single 16-bit store moves it between states (WQ_ST_*).
 *   keylen    1..max_key_len while live; 0 in a free entry.
 *   hash      32-bit key hash (the index slot keeps a few of its bits).
 *   link      free-list next while free; heap position while WAITING
 *             (a free entry is never waiting).
 *   run       PROCESSING only: the first granule of its run record (struct
 *             wq_run) in the key arena, which the entry owns from the
 *             commit of its hand-out to the commit of its done or requeue.
 *             Who holds a key and since when is kept there, not here: it
 *             matters for the few keys being processed, and 12 bytes in
 *             every entry were 15% of a short key's footprint.
 *   failures  rate limiter failure count; survives wq_done (RETAINED).
 *   seq       add order (wraps; compared as a signed difference): ties of
 *             ready time in the heap go in add order. Also the entry's
 *             incarnation: it takes a new number before the key is
 *             written or given back (entry.c, wq__entry_renew), so the
 *             coalesced add can read a key without the lock (queue.c).
 *             state and seq are written under the lock and read without
 *             it by that add only (atomics.h).
 *   t_b       DIRTY: time of the add (queue duration); WAITING: ready time.
 *             DIRTY and WAITING never coexist, so one field serves both.
 *   rslot     the key's result slot (results.c), whose `owner` points
 *             back at this entry; both directions must agree.
 *   k         the key: in the entry up to WQ_KEY_INLINE bytes; a longer
 *             one's first WQ_KEY_PRE bytes, and the first granule of the
 *             block in the key arena (keys.c) that holds the rest, which
 *             the entry owns from its add until it is free again. The
 *             entry's 16 bytes all serve: a 40-byte key takes 28 of the
 *             arena (4 granules), not 40 (5).
 * An entry is not a whole cache line: 16 of them take 13 lines. What a
 * lookup reads (state, keylen, hash, seq, k: 28 bytes) comes first, so it
 * lies in one line for 10 of every 16 entries. The struct is 4-byte
 * aligned (t_b lies on a 4-byte boundary in every other entry): 8-byte
 * alignment would pad it to 56, 4 bytes per key. The store's change
 * count is not here but in a section of its own (wq_geom.off_sgen),
 * since only queues with a store have one.
 */
#define WQ_KEY_INLINE 16u
#define WQ_KEY_PRE    12u
#define WQ_KEY_GRAIN  8u
/* Granules of the key arena (keys.c) that len bytes take. */
#define WQ_GRAINS(len) (((uint64_t)(len) + WQ_KEY_GRAIN - 1) / WQ_KEY_GRAIN)
struct wq_entry {
    uint16_t state;
    uint16_t keylen;
    uint32_t hash;
    uint32_t seq;
    union {
        unsigned char in[WQ_KEY_INLINE];
        struct {
            unsigned char pre[WQ_KEY_PRE];
            uint32_t block;
        };
    } k;
    uint32_t link;
    uint32_t run;
    uint32_t failures;
    uint32_t rslot;           /* its result slot, WQ_NIL if none */
    uint64_t t_b;
} __attribute__((packed, aligned(4)));

/*
 * A processing key's run record: a block of WQ_RUN_GRAINS granules in the
 * key arena (keys.c), named by its entry's `run`. lock.
 *   entry     the entry it belongs to: both directions must agree.
 *   owner     proc slot of the handle that got it.
 *   owner_gen low 16 bits of that slot's gen at the time.
 *   t_start   CLOCK_MONOTONIC of the get (work duration).
 */
struct wq_run {
    uint64_t t_start;
    uint32_t entry;
    uint16_t owner;
    uint16_t owner_gen;
};
#define WQ_RUN_GRAINS ((uint32_t)(sizeof(struct wq_run) / WQ_KEY_GRAIN))
_Static_assert(sizeof(struct wq_run) % WQ_KEY_GRAIN == 0, "a run record is whole granules");

/*
 * A hash index slot: one 32-bit word, 0 when empty. Its low `ibits` bits
 * hold the entry index + 1, where rbits is the fewest bits that hold
 * `capacity` (17 for the default 65536); the bits above are a tag that
 * spares probes the entry's line: the distance from the key's home slot
 * in the top 4 bits (15: that far or farther, the entry's hash tells;
 * no distance bits when fewer than 8 bits are left) and the low bits of
 * the key's hash below it (a 2^31 capacity leaves no tag at all).
 * Linear probing from slot (hash * slots) >> 32, backward-shift
 * deletion: no tombstones, so the table never degrades. The table has
 * at least twice as many slots as entries ever used (table.c).
 */
struct wq_islot {
    uint32_t w;
};

_Static_assert(sizeof(struct wq_entry) == 52, "an entry is 52 bytes");
_Static_assert(WQ_KEY_PRE + sizeof(uint32_t) == WQ_KEY_INLINE,
               "a long key's prefix and block fill k");

/*
 * Fair-mode data of an entry (fair.c), indexed like the entries. lock.
 *   tag   start tag (start-time fair queueing within its tenant), given
 *         when the key becomes dirty: for a key re-added while processing
 *         that is the moment of the re-add, which is what orders it.
 *   hp/ha its positions in the priority heap and the age heap (QUEUED).
 */
struct wq_fx {
    uint64_t tag;
    int32_t prio;
    uint32_t hp, ha;
    uint32_t tenant_len;
};
_Static_assert(sizeof(struct wq_fx) == 24, "fair data is 24 bytes");

/*
 * Published adds (lanes.c). A lane is a ring of WQ_LANE_SLOTS adds that
 * one handle (its owner) writes without the region lock and any locker
 * applies in order. tl holds the tail (low 32 bits: adds published) and
 * the limit (high 32 bits: adds the lane may hold, granted by lockers):
 * the owner writes slot `tail` and publishes it with a compare-and-swap
 * of tail + 1 (release; it may not pass the limit); a locker lowers or
 * raises the limit with a compare-and-swap too. head: the next slot to
 * apply, lock to write, read without it by the owner (acquire).
 * owner/owner_gen: lock to write, read without it by the owner (proc
 * slot + 1 and that slot's gen; 0: free). Positions are free-running
 * 32-bit counters: head <= tail <= limit <= head + WQ_LANE_SLOTS, in
 * wrapping arithmetic. A slot: written by the owner before it publishes
 * it, but for `entry`, which the locker that applied it writes:
 *   len, key  the key, up to WQ_LANE_KEY bytes;
 *   hash      the key's hash as the owner computed it (the locker
 *             computes its own; the owner reads it back, below);
 *   t_add     CLOCK_MONOTONIC of the add (0 without metrics);
 *   entry     where the key was found or put, WQ_NIL if nowhere: read by
 *             the owner when it writes the slot again, as a hint for its
 *             coalesced adds (queue.c, add_fast), which check it anyway.
 */
#define WQ_LANES      8u
#define WQ_LANE_SLOTS 64u
#define WQ_LANE_KEY   40u
struct wq_lane_slot {
    uint16_t len;
    uint16_t pad16;
    uint32_t hash;
    uint32_t entry;
    uint32_t pad32;
    uint64_t t_add;
    unsigned char key[WQ_LANE_KEY];
};
struct wq_lane {
    uint64_t tl;
    uint32_t owner;
    uint32_t owner_gen;
    char pad_a[WQ_ALIGN - 16];
    uint32_t head;
    char pad_b[WQ_ALIGN - 4];
    struct wq_lane_slot s[WQ_LANE_SLOTS];
};
_Static_assert(sizeof(struct wq_lane_slot) == 64, "a lane slot is one line");
_Static_assert(sizeof(struct wq_lane) == (2 + WQ_LANE_SLOTS) * WQ_ALIGN, "lane lines");
_Static_assert(WQ_LANES < 32, "lanes_pending has a bit per lane (and a mask of them)");

/*
 * A result slot (results.c). All fields: lock.
 *   owner     entry index + 1 of the key it belongs to, 0 when free; the
 *             store that sets it commits a new result.
 *   prev/next the update-order list (used) or the free list (next only).
 *   seq       update sequence: repair rebuilds the list by sorting on it.
 *   msglen/m  the message (0..255 bytes, no NUL): in the slot up to
 *             WQ_MSG_INLINE bytes, else a block of the key arena (keys.c)
 *             that the slot owns while its owner is set.
 */
#define WQ_MSG_INLINE 12u
#define WQ_MSG_MAX    255u
struct wq_rslot {
    uint32_t owner;
    int32_t code;
    uint32_t prev, next;
    uint64_t seq;
    uint64_t updated_ns;      /* CLOCK_REALTIME of the wq_finish */
    uint32_t msglen;
    union {
        char in[WQ_MSG_INLINE];
        uint32_t block;
    } m;
};
_Static_assert(sizeof(struct wq_rslot) == 48, "result slot is 48 bytes");
_Static_assert(sizeof(struct wq_islot) == 4, "index slot is 4 bytes");
_Static_assert(offsetof(struct wq_hdr, lock) % WQ_ALIGN == 0, "lock on its own line");
_Static_assert(offsetof(struct wq_hdr, wake_seq) % 4 == 0, "futex word aligned");
_Static_assert(sizeof(struct wq_geom) % 8 == 0, "geometry 8-aligned");
_Static_assert(offsetof(struct wq_geom, checksum) + 8 == sizeof(struct wq_geom),
               "checksum is the last geometry field");

#endif
