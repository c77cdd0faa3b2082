/*
 * wq.h - libwq: a client-go style work queue in POSIX shared memory.
 *
 * This header is the manual. Read it top to bottom once.
 *
 * WHAT IT IS
 *   A named queue lives in one shared-memory object (/dev/shm/wq.<name>).
 *   Any number of *processes* attach to it and share Kubernetes client-go
 *   workqueue semantics:
 *     - a FIFO of keys plus a "dirty" set: a key added again before a worker
 *       picked it up is coalesced (added once, handed out once);
 *     - a "processing" set: a key handed to one worker is never handed to a
 *       second worker until the first calls wq_done(); if it was re-added
 *       meanwhile it goes to the back of the queue at wq_done();
 *     - shutdown, and shutdown with drain.
 *   The region is guarded by one process-shared robust mutex. A process that
 *   dies holding the lock costs nothing: the next locker repairs the region.
 *   A process that dies holding a key (between wq_get and wq_done) loses
 *   nothing either: the key is queued again once that process is certainly
 *   dead, never while it lives (see "Crash guarantees").
 *
 * A MINIMAL CONTROLLER
 *
 *     struct wq_options o = { .capacity = 1 << 16, .flags = WQ_CREATE };
 *     wq *q;
 *     int rc = wq_open("orders", &o, &q);          // create or attach
 *     if (rc < 0) die(wq_strerror(rc));
 *     wq_add(q, "ns/a", 4);                        // producers, any process
 *     size_t cap = (size_t)wq_max_key_len(q);      // this queue's key size
 *     char *key = malloc(cap);                     // (or WQ_MAX_KEY_LEN bytes)
 *     for (;;) {                                   // workers, any process
 *         int n = wq_get(q, key, cap, -1);         // blocks
 *         if (n == -ESHUTDOWN) break;
 *         if (n < 0) die(wq_strerror(n));
 *         reconcile(key, n);
 *         wq_done(q, key, n);
 *     }
 *     free(key);
 *     wq_close(q);
 *
 * CONVENTIONS
 *   - Every function that can fail returns 0 (or a documented non-negative
 *     value) on success and a negative errno on failure, like liburing. errno
 *     is not used. Nothing is ever printed by the library.
 *   - Keys are opaque byte strings of 1 ..= max_key_len bytes. They are
 *     binary safe: NUL bytes are allowed and compared like any other byte.
 *   - Times are uint64_t nanoseconds. Timeouts are int64_t nanoseconds:
 *     -1 waits forever, 0 does not wait (for a key, for a drain to
 *     end), anything below -1 is -EINVAL. Any call may still wait for the
 *     queue's lock while another process's call holds it (see wq_get).
 *   - A handle (wq *) belongs to one process and is thread safe: any thread
 *     of that process may use it concurrently with the others.
 *   - Output parameters are written only on success.
 *
 * ERRORS (what each negative errno means for libwq)
 *   -EINVAL       bad argument: NULL pointer, bad name, bad options, empty
 *                 key, timeout below -1, unknown flag bits, non-zero
 *                 reserved fields.
 *   -ENOTDIR, -ENAMETOOLONG, -EACCES  wq_open: the store_path is not a
 *                 usable directory.
 *   -ENOENT       wq_open: no such queue and WQ_CREATE not given; or the
 *                 store_path cannot be made (its parent is missing) or
 *                 its data.mdb is a dangling symbolic link (never created
 *                 through); wq_done: the key is not processing.
 *   Every failure of wq_open about the store or the region says which
 *   and why in wq_last_error ("store '/srv/q': ...", "queue 'x': ..."),
 *   a bad name the rule it breaks.
 *   -EEXIST       wq_open with WQ_CREATE|WQ_EXCL: the queue exists; or
 *                 wq_open with options that differ from the existing
 *                 queue's (wq_last_error says which one).
 *   -EACCES       the shm object exists but its permissions refuse us.
 *   -EPROTO       the shm object is not a libwq region of this layout
 *                 version: foreign, truncated, or failing validation.
 *   -EBADMSG      the region was valid when attached but a structure in it
 *                 is corrupt (an out-of-range index was found). Nothing was
 *                 changed; the next call that takes the lock rebuilds what
 *                 it can, and wq_check(q, WQ_CHECK_REPAIR) rebuilds it all.
 *                 (The region only: a damaged store is -EUCLEAN.)
 *   -EUCLEAN      the store (store_path) is damaged, or is not a libwq
 *                 store: LMDB reported corruption, a record or the store's
 *                 settings fail validation. Nothing was built from it.
 *   -ENODATA      wq_open with WQ_RESTORE: the store_path holds no store.
 *   -EIO          the store could not be read or written; a Redis server
 *                 answered a command with an error (wq_last_error quotes it).
 *   -EIDRM        a store write of a region that wq_unlink removed while
 *                 this process had it open (see wq_unlink), or whose
 *                 store another queue's region has claimed since (see
 *                 "Persistence"); and for Redis queues, below.
 *   -EBUSY        wq_open: the store_path serves another queue, whose
 *                 region exists (see "Persistence"); wq_remove: the key
 *                 is processing.
 *   Redis queues only (see "Redis"):
 *   -ESTALE       wq_done / wq_finish / wq_finish_get of a key whose lease
 *                 this handle lost: it was requeued and may be another
 *                 holder's. Nothing changed.
 *   -EIDRM        the queue was removed (wq_unlink) under the handle.
 *   -ECONNREFUSED, -ECONNRESET, -EHOSTUNREACH, -ETIMEDOUT  the server is
 *                 unreachable, the connection dropped, or a command took
 *                 more than 10 s; wq_last_error names the server.
 *   -ENOTSUP      a redis:// name in a libwq built without hiredis;
 *                 WQ_DURABLE_FSYNC on a server that does not fsync.
 *   -ENOTRECOVERABLE the region lock was left unrecoverable; the region
 *                 must be removed (wq_unlink) and recreated.
 *   -ENOSPC       the queue holds `capacity` live keys (nothing was added);
 *                 or /dev/shm has no room for a new region, or for the
 *                 pages an add or a result needs (see "Memory"; nothing
 *                 was changed); or the store's disk or LMDB map is full.
 *                 A shared-memory queue says which in wq_last_error.
 *   -EMSGSIZE     a key longer than max_key_len.
 *   -ENOBUFS      wq_get: the buffer is smaller than max_key_len.
 *   -EAGAIN       wq_get with timeout 0: nothing queued. (Only that: libwq
 *                 never passes a system EAGAIN through.)
 *   -ETIMEDOUT    the timeout expired.
 *   -ESHUTDOWN    the queue is shutting down (adds refused; gets find
 *                 nothing left to hand out).
 *   -ECANCELED    wq_shutdown_drain: a wq_shutdown ended the drain early.
 *   -EUSERS       the process table is full (max_procs handles attached),
 *                 or the store's LMDB reader table is (1024 readers).
 *   -EPERM        a handle opened with WQ_OBSERVE was asked to add, get,
 *                 finish, forget or remove keys, or to run workers.
 *   -ENOMEM       out of memory, or no thread could be started for a
 *                 handle's lease.
 *   -EMFILE, -ENFILE from the system (shm_open, LMDB) are passed through.
 *
 *   Every call that takes the region lock (all calls on a handle except
 *   wq_close, wq_name, wq_max_key_len, wq_observing and wq_shutting_down;
 *   wq_len only while delayed keys or published adds wait; wq_add_publish
 *   only when it adds the locked way) may also return:
 *   -ENOTRECOVERABLE; -EBADMSG; and, when it is an add, get or done of
 *   a handle that holds no process slot (the first in a child after
 *   fork(), or after wq_run_workers gave the slot up), which registers
 *   the process again, -EUSERS or -ENOMEM.

 * CRASH GUARANTEES
 *   - A key is never handed to two live processes at once.
 *   - If a process dies while holding the region lock, the next locker
 *     repairs the region (robust mutex, EOWNERDEAD): every key keeps its
 *     state and FIFO position; an operation cut short is either fully
 *     applied or not at all from the point of view of its keys. Repair is
 *     deterministic and bounded: linear passes over the entries, the hash
 *     index, the ring, the process table (and the delay heap, store queue
 *     and fair-mode heaps), so O(capacity), about 60 ms for 1,000,000 live
 *     keys on a small VM; it is skipped entirely when the dead holder was
 *     not in the middle of a mutation.
 *   - A key that a dead process was processing is queued again once that
 *     process is certainly dead (its lease mutex reports EOWNERDEAD), never
 *     before, counted in crash_requeues_total. It goes through the rate
 *     limiter (its failure count rises and it waits the limiter's delay, so
 *     a key that kills every worker backs off), unless it had been re-added
 *     meanwhile or the queue is shutting down: then it is queued at once.
 *     A stopped or slow process is alive; PID reuse cannot fool the check
 *     because liveness is a robust mutex held by a thread of the owning
 *     handle, not a pid.
 *   - With a store, see "Persistence" for what survives the region.
 *
 * PROCESSES, THREADS AND FORK
 *   A handle registers in the region's process table (a slot) and holds
 *   a lease: a robust mutex locked by a small thread that libwq starts
 *   for the handle and that lives as long as the slot. The lease is how
 *   other processes tell that this handle's process is dead. Every 250 ms
 *   that thread also reclaims a dead process's keys and writes what a
 *   store is due when no call does (see "Persistence"); it never waits
 *   for the region lock. wq_open registers the handle. A handle without
 *   a slot (below) has no such thread, and its calls reclaim a dead
 *   holder's keys only when they find the region lock abandoned by it (a
 *   dead holder's key shows as processing until a process with a slot,
 *   or wq_check with WQ_CHECK_REAP, reclaims it); it is not counted in
 *   wq_stats' processes. The last handle attached to close, with a slot
 *   or without one (not an observer), writes what a store lacks.
 *   - A WQ_OBSERVE handle (see wq_open) never registers: it holds
 *     nothing to lease.
 *   - After fork(), a handle inherited by the child transparently
 *     registers the child as a new process (with its own lease) on its
 *     first add, get or done; calls that only look, or act on the queue
 *     as a whole, need no slot and do not register. The child is never
 *     taken for its parent, and keys the parent holds stay the parent's.
 *     A child that exits without wq_close() is a dead process like any
 *     other: keys it held are requeued.
 *   - wq_run_workers gives the caller's slot up while its workers run
 *     (see there); the handle registers again at its next add, get or
 *     done.
 *
 * DIFFERENCES FROM CLIENT-GO
 *   libwq keeps client-go's workqueue semantics except where they would
 *   let one key be in two places at once or need unbounded memory. Every
 *   deliberate difference, with its reason:
 *   - wq_done of a key that is not processing returns -ENOENT and changes
 *     nothing. client-go's Done of such a key, when the key is dirty,
 *     pushes a second copy into the queue, and the key is then handed out
 *     twice. One slot per key is what makes the crash guarantees
 *     checkable, so libwq never holds a key twice.
 *   - A direct add (wq_add) of a key waiting for a delay queues it at once
 *     and drops the delay. client-go queues it and keeps the waiting
 *     entry, which adds the key again when its time comes, so a key added
 *     once directly and once delayed can be reconciled twice.
 *   - A delayed add of a key already dirty (queued, or re-added while
 *     processing) is merged into the pending add (return value 1), as in
 *     controller-runtime's priority queue; client-go keeps a second
 *     "reminder" add that fires later. Two delayed adds of a waiting key
 *     keep the earlier ready time (as client-go).
 *   - Capacity and key length are bounded (wq_options.capacity,
 *     max_key_len): the queue's region is laid out for them once. A full
 *     queue refuses the add (-ENOSPC, nothing changed) instead of growing;
 *     a longer key is -EMSGSIZE. Keys are byte strings, not Go values.
 *     The memory it takes follows the keys, not the capacity ("Memory").
 *   - Failure counts (wq_add_rate_limited, wq_forget) live in the key's
 *     slot: when the queue is full, the count of an idle key is dropped to
 *     make room for a new key (see wq_forget). client-go's map grows.
 *   - Shutdown belongs to the queue, not to one process: the flag lives in
 *     the region, every attached process sees it, and it lasts until
 *     wq_resume (client-go has no resume: its queue object dies with the
 *     process). Stopping one consumer is stopping its pool, not a
 *     shutdown. With a store, waiting keys survive a shutdown (client-go
 *     drops them; so does libwq without a store).
 *   - wq_get and wq_shutdown_drain take a timeout; wq_shutdown_drain also
 *     ends with -ECANCELED when wq_shutdown or wq_resume is called, and
 *     requeues keys of dead workers so that it cannot hang on them.
 *   - A key whose holder died is queued again through the rate limiter
 *     (its failure count rises). client-go has no crashes to survive: its
 *     workers are goroutines of the one process.
 *   - Metrics are counters in the region shared by every process, read
 *     with wq_metrics (no MetricsProvider); the delayed-keys gauge and the
 *     rate-limiter delay histogram are libwq additions.
 *   client-go's queue tests are ported to C in tests/test-queue.c (same
 *   orders, same counts), and client-go's queue_test.go runs unchanged
 *   against libwq through a Go adapter (tests/client-go).
 *
 * MEMORY
 *   A queue's shm object has the size of its whole layout (wq_stats
 *   region_bytes: about 1400 bytes per unit of capacity with the default
 *   max_key_len and result_capacity, 92 MB for a default queue), but it
 *   is a sparse file: it takes memory (pages of /dev/shm, counted against
 *   the tmpfs size limit and the memory cgroup) only for what is used
 *   (wq_stats region_used):
 *     - at creation, the header, the process table (72 bytes per
 *       max_procs), a hash index and a FIFO ring of one page each (a
 *       store adds 4 bytes per unit of capacity, fair mode its tenant
 *       table, up to 512 KiB): 32 KiB for a default queue, whatever its
 *       capacity, which is a bound, not an allocation;
 *     - at the first wq_add_publish, the lanes: 33 KiB;
 *     - then, as keys arrive, one entry per key held at once (52 bytes,
 *       which hold a key of up to 16 bytes; 8 more with a store, 32 more
 *       in fair mode); 4 bytes of delay heap per key waiting or being
 *       processed (a page at least; with a store, per entry); a longer
 *       key keeps its first 12 bytes in its entry and the rest, rounded
 *       up to 8, in the key arena (never max_key_len: a 40-byte key
 *       costs 32 there); per
 *       key being processed, a 16-byte record of who holds it and since
 *       when, in the same arena; and per result kept, a 48-byte slot,
 *       which holds a message of up to 12 bytes, and a longer message's
 *       own bytes rounded up to 8 in the same arena. Each grows under
 *       the lock, a page at a time up to 64 KiB, then to the next
 *       multiple of 64 KiB while a 32nd of what it has is less, then by
 *       a 32nd. Entries
 *       and key bytes freed by done keys are reused before new pages are
 *       taken (a freed key's bytes by the next key of the same length in
 *       8-byte steps), and pages are not given back while the queue
 *       exists: the most keys (and results) held at once set the figure.
 *       When key lengths shift over time, bytes of the old lengths stay
 *       set aside; when the arena reaches its end (virtual room for
 *       capacity keys of max_key_len with their records, the results'
 *       messages, and the gaps between them), the call that meets it
 *       merges the free bytes under the lock, one pass over the entries,
 *       and goes on: a queue with room never refuses a key for this;
 *     - and the hash index and the ring: 4-byte index slots, a power of
 *       two of them and at least twice the entries ever used (8 to 16
 *       bytes per key; a full queue's is 2 x capacity + 1 slots), and a
 *       4-byte ring slot per entry ever used (at most a quarter more:
 *       4 to 5 bytes per key; at most capacity). The index doubles and
 *       the ring grows by a quarter under the lock when a new key needs
 *       it, into a new table, giving the old one's pages back: on the
 *       2-vCPU VM of tools/PERFORMANCE.md the
 *       add that doubles the index takes 3 ms at 131,072 keys, 26 ms at
 *       1M and about 54 ms at 2M (every other add, and every other
 *       process, waits for it meanwhile).
 *     So a default queue holding 50,000 keys of 12 bytes takes 66.5
 *     bytes per key, and of 40 bytes 99.4; holding 10,000, 68.8 and
 *     102.0; holding 1,000, 57.3 and 94.2 (wqbench scale/keys12 and
 *     keys40).
 *   When the system refuses pages (the tmpfs is full or at its size limit:
 *   Docker gives containers 64 MiB by default, `--shm-size` changes it),
 *   the add, get or wq_finish that needed them fails with -ENOSPC and
 *   changes nothing (a get leaves the key at the front); wq_last_error names the queue, the bytes wanted and the bytes
 *   free. No process ever gets a SIGBUS for a page it touches.
 *
 *   Huge pages: a big queue spends much of its time in TLB misses on 4 KiB
 *   pages. Where the kernel has transparent huge pages for shmem, mount a
 *   tmpfs that uses them and point WQ_SHM_DIR at it, in every process of
 *   the queue (wqctl included):
 *     mount -t tmpfs -o huge=always,size=4g,mode=1777 wqhuge /mnt/wq-huge
 *     export WQ_SHM_DIR=/mnt/wq-huge
 *   Memory is then taken in 2 MiB pages (a new queue takes at least one
 *   per section it touches). Measure before relying on it: in a VM whose
 *   paging is paravirtualized, guest huge pages were 20% slower than
 *   4 KiB ones (tools/PERFORMANCE.md). A queue of more than 65,536
 *   entries prefetches the index slots of the keys next in line anyway.
 */
#ifndef WQ_H
#define WQ_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define WQ_API __attribute__((visibility("default")))
#else
#define WQ_API
#endif

/* ------------------------------------------------------------------ */
/* Types                                                               */
/* ------------------------------------------------------------------ */

/* An opaque per-process handle. */
typedef struct wq wq;

/* A line of a report (wq_check_report, wq_store_salvage): `what` has no
   trailing newline and is valid only during the call. */
typedef void (*wq_report_fn)(const char *what, void *arg);

/* wq_options.flags */
#define WQ_CREATE (1u << 0) /* create the queue if it does not exist */
#define WQ_EXCL   (1u << 1) /* with WQ_CREATE: fail with -EEXIST if it does */
#define WQ_FAIR   (1u << 2) /* fair mode: see "Priorities and fairness" */
#define WQ_NO_METRICS (1u << 3) /* skip the clock reads behind the duration
                                   histograms and work gauges (faster) */
#define WQ_RESTORE (1u << 4) /* with WQ_CREATE and store_path: the store
                                must already hold a queue (-ENODATA if it
                                does not), so a mistyped path is an error
                                rather than a new, empty store and queue */
#define WQ_OBSERVE (1u << 5) /* open to look, not to work: the handle takes
                                no process slot (so it opens a queue whose
                                table is full, and is not counted in
                                wq_stats.processes); see wq_open */

/* wq_options.durability (see "Persistence"). 0 is "not given": PROCESS
   for a new store, the store's own level on a restore. Any level given is
   honoured, on a restore too. Use the names, never the numbers. */
#define WQ_DURABLE_PROCESS 1 /* committed before the add returns */
#define WQ_DURABLE_FSYNC   2 /* ... and on disk */
#define WQ_DURABLE_NONE    3 /* periodic snapshots */

/* Nanoseconds from other units, as the int64_t timeouts take them (and
   the uint64_t delays): WQ_SEC(5), not 5 * 1000000000, which overflows
   an int. */
#define WQ_USEC(n) ((int64_t)(n) * 1000)        /* microseconds */
#define WQ_MSEC(n) ((int64_t)(n) * 1000000)     /* milliseconds */
#define WQ_SEC(n)  ((int64_t)(n) * 1000000000)  /* seconds */

/* Limits. */
#define WQ_MAX_NAME_LEN    200        /* bytes of a queue name */
#define WQ_MAX_KEY_LEN     4096       /* the largest max_key_len */
#define WQ_MAX_CAPACITY    (1u << 31) /* the largest capacity and result_capacity */
#define WQ_MAX_PROCS       4096       /* the largest max_procs */

/*
 * Creation options. Zero-initialise, then set what you need: every zero
 * field means "the default" (given next to each field, and written once
 * in the library's options.c). The options build a new queue; an open
 * of a queue that exists (WQ_CREATE without WQ_EXCL, or attach only)
 * reads its settings from the region, and every field given (not zero)
 * must be what the queue has: another capacity, max_key_len, store_path
 * (or a store_path for a queue without a store), durability, mode, fair
 * mode or limiter setting fails with -EEXIST, changes nothing (no store
 * directory is created) and wq_last_error says which option differs, e.g.
 * "queue 'orders' exists with capacity 16, not 32". So a producer that
 * starts before the process creating the queue with a store can never
 * run without persistence unawares. NULL options means "attach only".
 *
 * wq_open refuses with -EINVAL:
 *   flags     unknown bits; WQ_EXCL or WQ_RESTORE without WQ_CREATE;
 *             WQ_RESTORE without store_path.
 *   sizes     capacity or result_capacity above 2^31, max_key_len above
 *             4096, max_procs above 4096; mode bits outside 0777.
 *   store     durability other than the WQ_DURABLE_* values; durability
 *             or snapshot_interval_ms without store_path;
 *             snapshot_interval_ms without WQ_DURABLE_NONE or _FSYNC; an
 *             empty store_path.
 *   limiter   unknown rl_limiters bits; a negative, NaN or infinite
 *             rl_qps; rl_base_delay_ns above rl_max_delay_ns (or above
 *             the default maximum when rl_max_delay_ns is 0);
 *             WQ_RL_FAST_SLOW without all three of its parameters, or
 *             with rl_fast_delay_ns above rl_slow_delay_ns; fast-slow
 *             parameters without WQ_RL_FAST_SLOW.
 *   fair      fair_share or tenant_sep without WQ_FAIR; tenant_sep
 *             outside -1..255.
 *   reserved  any non-zero reserved field.
 *
 * Growth: the struct ends in reserved fields that must be zero. Later
 * versions give them meanings whose zero value is today's behaviour, so
 * a program built against this header keeps working, unchanged and
 * unrebuilt, with a later libwq (the same holds for the reserved tails of
 * wq_add_opts, wq_stats, wq_metrics and wq_result).
 */
struct wq_options {
    uint32_t capacity;      /* max live keys (queued+processing+waiting); 0 -> 65536 */
    uint32_t max_key_len;   /* 0 -> 256; at most 4096 */
    const char *store_path; /* LMDB directory for persistence; NULL -> memory only */
    int durability;         /* 0 (not given) | WQ_DURABLE_PROCESS | _FSYNC | _NONE */
    uint32_t snapshot_interval_ms; /* WQ_DURABLE_NONE, _FSYNC; 0 -> 1000 */
    uint32_t result_capacity;      /* finished results kept; 0 -> capacity */
    mode_t mode;            /* permissions of the shm object and store; 0 -> 0600 */
    unsigned flags;         /* WQ_CREATE | WQ_EXCL | WQ_FAIR ... */
    /* rate limiter used by wq_add_rate_limited; zero -> client-go defaults:
       max(per-item exponential 5ms..1000s, token bucket 10 qps burst 100) */
    uint64_t rl_base_delay_ns, rl_max_delay_ns;
    double   rl_qps;
    uint32_t rl_burst;
    /* libwq extension: size of the process table, i.e. how many handles
       may be attached at once across all processes; 0 -> 256. */
    uint32_t max_procs;
    /* libwq extension: which limiters wq_add_rate_limited combines (the
       delay is the maximum of the selected ones, client-go's
       MaxOfRateLimiter); 0 -> WQ_RL_EXPONENTIAL | WQ_RL_BUCKET, client-go's
       DefaultControllerRateLimiter. */
    unsigned rl_limiters;
    /* WQ_RL_FAST_SLOW (client-go's ItemFastSlowRateLimiter): the first
       rl_max_fast_attempts failures wait rl_fast_delay_ns, later ones
       rl_slow_delay_ns. All three must be set when it is selected. */
    uint64_t rl_fast_delay_ns, rl_slow_delay_ns;
    uint32_t rl_max_fast_attempts;
    /* WQ_FAIR only (see "Priorities and fairness"): one hand-out in
       fair_share goes to the oldest queued key whatever its priority and
       tenant (0 -> 8; 1 -> always the oldest, i.e. plain FIFO by add
       time). tenant_sep: the byte that ends a key's tenant part (0 -> '/');
       -1 turns tenant round-robin off. */
    uint32_t fair_share;
    int tenant_sep;
    /* redis:// queues only (see "Redis"): how long a key stays held by a
       handle that stopped renewing its lease; 0 -> 10 s; 100 ms .. 1 h. */
    uint64_t lease_ns;
    uint64_t reserved[7];   /* must be zero (see "Growth" above) */
};

/* wq_options.rl_limiters */
#define WQ_RL_EXPONENTIAL (1u << 0) /* per key: base * 2^failures, capped at max */
#define WQ_RL_BUCKET      (1u << 1) /* token bucket shared by all keys: qps, burst */
#define WQ_RL_FAST_SLOW   (1u << 2) /* per key: fast delay, then slow delay */
#define WQ_RL_ALL         (WQ_RL_EXPONENTIAL | WQ_RL_BUCKET | WQ_RL_FAST_SLOW) /* every limiter */

/* ------------------------------------------------------------------ */
/* Life cycle                                                          */
/* ------------------------------------------------------------------ */

/*
 * wq_open - attach to queue `name`, creating it with WQ_CREATE.
 *
 * name: [A-Za-z0-9._-]{1,200}; the shm object is /dev/shm/wq.<name>, or
 * $WQ_SHM_DIR/wq.<name> when that environment variable is set (see
 * "Memory"; an absolute path of at most 200 bytes, else -EINVAL). Every
 * process of a queue must see the same directory.
 * A new region is built under no name and published atomically, so a
 * concurrent attacher never sees a half-initialised queue, and two
 * concurrent creators never both win (the loser attaches, or gets -EEXIST
 * with WQ_EXCL).
 *
 * Returns 0 and stores the handle in *out, or
 *   -ENOENT  absent and not creating;
 *   -EEXIST  present with WQ_EXCL, or present with other options (see
 *            struct wq_options; wq_last_error names the option);
 *   -EINVAL  bad name or options;
 *   -EUCLEAN a damaged or foreign store (wq_last_error says what);
 *   -ENODATA WQ_RESTORE and the store_path holds no store;  -EIO;
 *   -EBUSY   the store_path serves another queue (see "Persistence");
 *   -EPROTO  not a libwq region of a compatible version, or it fails
 *            validation (magic, version, geometry, checksum, size);
 *   -EACCES  permissions;  -EUSERS process table full;  -ENOMEM ...
 * Blocks only briefly (takes the region lock to register). Any thread.
 * The handle is freed by wq_close().
 *
 * WQ_OBSERVE (not with WQ_CREATE: -EINVAL) opens an existing queue for an
 * operator or a monitor. Such a handle takes no process slot, so it works
 * when max_procs workers already hold every slot, exactly when someone
 * needs to look. It reads everything (wq_len, wq_stats, wq_metrics,
 * wq_dump, wq_result, wq_num_requeues) and can act on the queue as a
 * whole (wq_check with WQ_CHECK_REPAIR, wq_release_pid, wq_snapshot,
 * wq_shutdown, wq_shutdown_drain, wq_resume). It cannot hold keys or
 * change them: wq_add*, wq_get*, wq_done*, wq_finish, wq_forget,
 * wq_remove and wq_run_workers* return -EPERM, changing nothing. On a
 * redis:// queue (which has no process table) the same calls are refused
 * alike, so a monitor behaves the same on both engines.
 */
WQ_API int wq_open(const char *name, const struct wq_options *opts, wq **out);

/*
 * wq_close - detach this handle; the queue lives on.
 * Keys this handle's process slot still holds (got but not done) are
 * queued again at the back (not counted as a crash). Frees the handle.
 * NULL is a no-op. Must not race with other calls on the same handle.
 */
WQ_API void wq_close(wq *q);

/*
 * wq_unlink - remove the shared region of queue `name`.
 * Processes still attached keep working on their mapping until they close;
 * a later wq_open with WQ_CREATE makes a new, empty queue. (A queue with
 * a store is written first, and from then on the store belongs to
 * whatever queue of that name is made from it: the removed region's
 * store writes, and so its adds of new keys, fail with -EIDRM; with a
 * WQ_DURABLE_FSYNC store at once, with the others once that queue is
 * made.)
 * Returns 0, -EINVAL (bad name), -ENOENT, -EACCES.
 */
WQ_API int wq_unlink(const char *name);

/* ------------------------------------------------------------------ */
/* Queue (client-go Interface)                                         */
/* ------------------------------------------------------------------ */

/*
 * wq_add - mark key dirty; queue it unless it is already queued or
 * processing (a processing key is queued again at its wq_done).
 * Returns 0 when newly queued or newly marked dirty, 1 when coalesced into
 * a key that is already dirty. -ESHUTDOWN after shutdown, -ENOSPC when
 * `capacity` keys are live or the region cannot grow for a new key
 * ("Memory"; nothing changes either way), -EINVAL on an empty key or
 * NULL, -EMSGSIZE when longer than max_key_len; with a store, its errors
 * (see "Persistence"; the add is then undone), and -EBADMSG when a repair
 * of damage in the region dropped the new key while the add waited for
 * its commit (it may not be stored: add it again). Blocks only for the region
 * lock, and with a WQ_DURABLE_PROCESS or WQ_DURABLE_FSYNC store until the
 * key is committed to it (and, FSYNC, on disk). Wakes one blocked wq_get.
 *
 * What the caller wrote to memory shared with the worker before wq_add
 * (the state the key stands for) is seen by the worker after the wq_get
 * that hands the key out next, in any process. An add that coalesces
 * (returns 1) into a key that is queued, or processing and already added
 * again, usually takes no lock at all: on a queue without a store and
 * not WQ_FAIR, a handle remembers where it last found each key and checks
 * that entry without the lock, so a producer re-adding hot keys does not
 * contend with the workers. Such adds count in coalesced_total like any.
 */
WQ_API int wq_add(wq *q, const void *key, size_t len);

/*
 * wq_get - pop the front key into buf, mark it processing (owned by this
 * handle's process) and return its length (> 0). The key is not
 * NUL-terminated. Blocks according to timeout_ns:
 *   -EAGAIN     timeout 0 and nothing queued;
 *   -ETIMEDOUT  nothing queued before the timeout;
 *   -ESHUTDOWN  shutting down and nothing queued (keys still processing
 *               may be queued again by their wq_done; a later get then
 *               hands them out);
 *   -ENOBUFS    cap < max_key_len (checked first, nothing is popped);
 *   -EINVAL     NULL buf or timeout below -1;
 *   -ENOSPC     the system refused the page for the record of who holds
 *               the key, or for the delay heap slot a key being processed
 *               keeps for a wait its wq_done or requeue may start
 *               ("Memory"; the key stays at the front; so does -ENOMEM,
 *               the process's own memory).
 * Waiting for a key, it sleeps on a futex, never spins; wakes on add,
 * shutdown, and every 100 ms to requeue keys held by dead processes.
 * Waiting for the queue's lock (another process's call holds it for well
 * under a microsecond) it spins for at most some 20 us, then sleeps. With
 * 32 or more keys queued, wq_get, wq_done and their batches step aside
 * for another caller's get or done instead: after five tries they nap,
 * up to 20 naps of about 0.2 ms (whatever the timeout; wq_done_many up
 * to 20 per 64 keys), before sleeping on the lock, so that the holder
 * drains a long queue from its own cache instead of handing the lock to
 * another CPU key by key (two consumers with no work per key: 0.3x of
 * one before, 0.8-1.0x since; tools/PERFORMANCE.md). Only a caller that
 * hammers the lock steps aside: once it has waited so, its handle times
 * the caller between its next two calls (from the end of one to the
 * start of the next: the caller's own code and a little of the
 * library's), and a caller that works 250 ns or more per call on
 * average spins and sleeps on the lock as above instead of napping
 * (two consumers with 1 us of work per key: 1.35x of one when every
 * such caller napped, 1.48-1.77x since). Threads sharing a handle share
 * that measure. Adds never nap, and no one naps behind an add. On a
 * shared-memory queue none of these waits is a pthread cancellation
 * point.
 */
WQ_API int wq_get(wq *q, void *buf, size_t cap, int64_t timeout_ns);

/*
 * wq_done - processing of key finished. If the key was re-added while it
 * was processing, it is queued at the back now. Any process attached to
 * the queue may call it (as any goroutine may in client-go).
 * Returns 0, -ENOENT if the key is not processing (unlike client-go,
 * which would queue a second copy), -EINVAL, -EMSGSIZE.
 */
WQ_API int wq_done(wq *q, const void *key, size_t len);

/*
 * wq_len - number of queued keys, not counting processing keys or keys
 * whose delay is not over. A delayed key whose time has come counts (it
 * is moved to the queue first, so polling wq_len sees it, as client-go's
 * Len does), and so does an add published with wq_add_publish: it is
 * applied first. Lock free unless delayed keys wait or published adds
 * wait to be applied (an add another process is applying at that very
 * moment may be missed, as any concurrent add may). Returns the count,
 * -EBADMSG if the region's count is out of range (corrupt), or a lock
 * error (see ERRORS).
 */
WQ_API int wq_len(wq *q);

/*
 * wq_shutdown - stop accepting adds and wake every blocked wq_get (they
 * return queued keys first, then -ESHUTDOWN). Also ends a pending
 * wq_shutdown_drain early with -ECANCELED (client-go's forced shutdown).
 * Waiting keys (wq_add_after, rate limited) never fire while shut down:
 * without a store they are dropped (client-go); with a store they stay,
 * waiting, so that the region and the store agree, and fire after a
 * wq_resume. The flag lives in the region: it is seen by every process
 * and stays set until wq_resume. Returns 0. Idempotent.
 *
 * A shutdown is for when an operator means "this queue stops". To stop
 * one consumer (a restart, a rolling deploy), stop its workers instead:
 * wq_run_workers stops its pool on SIGTERM without shutting the queue.
 */
WQ_API int wq_shutdown(wq *q);

/*
 * wq_shutdown_drain - as wq_shutdown, then wait until no key is
 * processing. Keys may still be queued when it returns (client-go).
 * Keys held by dead processes are requeued while waiting, so a crashed
 * worker cannot make it hang. Returns 0, -ETIMEDOUT, -ECANCELED (a
 * wq_shutdown or wq_resume call was made while waiting), -EINVAL.
 */
WQ_API int wq_shutdown_drain(wq *q, int64_t timeout_ns);

/*
 * wq_resume - end a shutdown, for every process attached: adds are
 * accepted again, wq_get hands out keys again, waiting keys fire when
 * due. The queue's keys are all still there (queued, processing, and
 * with a store the waiting ones). A drain still waiting ends with
 * -ECANCELED. Returns 0 (also when the queue was not shut down).
 */
WQ_API int wq_resume(wq *q);

/* wq_shutting_down - true from a wq_shutdown or wq_shutdown_drain until
   a wq_resume. */
WQ_API bool wq_shutting_down(wq *q);

/* ------------------------------------------------------------------ */
/* Fast paths                                                          */
/* ------------------------------------------------------------------ */

/*
 * wq_done_get - wq_done(done_key) then wq_get(), sharing one lock
 * acquisition when a key is queued. If wq_done fails, its error is
 * returned and nothing is popped. Otherwise returns as wq_get, but for
 * wq_get's -ENOSPC and -ENOMEM, which are -EAGAIN here (wq_last_error
 * says why): the done stands.
 */
WQ_API int wq_done_get(wq *q, const void *done_key, size_t done_len,
                       void *buf, size_t cap, int64_t timeout_ns);

/*
 * wq_add_many - add n keys under one lock acquisition. All keys are
 * validated first: an invalid key (-EINVAL, -EMSGSIZE) adds none.
 * Returns how many were coalesced (>= 0), or -ESHUTDOWN, or -ENOSPC when
 * the keys that would need a new slot do not all fit (none added then).
 * With a store, its errors and -EBADMSG as for wq_add; after -EBADMSG
 * the keys that were stored stay, and adding the batch again is safe.
 */
WQ_API int wq_add_many(wq *q, const struct iovec *keys, size_t n);

/*
 * wq_add_publish - wq_add for producers that must not wait for the
 * region lock. The add is written into a lane of the region that this
 * handle owns (one of 8 per queue, taken at the handle's first
 * wq_add_publish, kept until wq_close or the process's death) and the
 * call returns: no lock is taken. Whoever takes the lock next (a get, a
 * done, any call) applies every published add first, in the order each
 * lane got them, exactly as wq_add would have: so every call that locks
 * after wq_add_publish returned sees its add, and one handle's published
 * and locked adds keep their order. A producer killed at any point
 * leaves an add that either was published (and is applied) or never
 * happened; a locker killed while applying one is finished by the next
 * locker without counting it twice. What the caller wrote before the
 * call is seen by whoever gets the key afterwards, as with wq_add.
 *
 * Returns 1 when the key is known to be dirty already: a coalesced add
 * (the key queued, or processing and added again, as far as this handle
 * last saw; or still in this handle's lane). Returns 0 otherwise: a
 * published add may still coalesce when it is applied (counted then in
 * coalesced_total), which is why wq_add, whose 0 promises "newly queued
 * or marked", never publishes. Errors as for wq_add; -ESHUTDOWN and
 * -ENOSPC come only from the locked way. An add published before a
 * concurrent wq_shutdown is still applied (it was made before the
 * shutdown). A lane holds only as many adds as the queue has room for:
 * room granted to lanes counts as live for other adds until it is used
 * or taken back, so a full queue refuses no add early unless the system
 * refuses pages.
 *
 * These take the locked way, as wq_add does: keys longer than 40 bytes,
 * an add when this handle's lane holds 64 not yet applied, queues in
 * fair mode or with a store, a forked child's first add (it registers),
 * a thread of the process while another is publishing to the lane, and
 * handles beyond the eighth that publish. A blocked wq_get is woken by
 * the first add published after it slept. The lanes' 33 KiB of shared
 * memory are reserved at the queue's first wq_add_publish. The Redis
 * engine has no lanes: there wq_add_publish is wq_add.
 */
WQ_API int wq_add_publish(wq *q, const void *key, size_t len);

/*
 * wq_get_many - wq_get for up to n keys at once. Waits as wq_get until
 * one key is queued, then hands out that key and the keys queued behind
 * it, in queue order, under one lock acquisition, until n keys are taken
 * or the next one would not fit in what is left of buf. The keys are
 * packed into buf back to back (not NUL-terminated); keys[i] is set to
 * the i-th (iov_base inside buf, iov_len its length), ready for
 * wq_done_many. size must be at least max_key_len, so one key always
 * fits. Returns r (1 .. n) or an error as wq_get (-ENOBUFS: size is
 * smaller than max_key_len; -EINVAL: n == 0 or a NULL pointer; nothing
 * is handed out then). The Redis engine hands the keys out one call at a
 * time (the first waits), stopping when less than max_key_len is left.
 *
 * Every key handed out is this process's until its wq_done: a worker
 * that takes ten keys makes the last wait for the first nine, which
 * other idle workers would have taken. Batch where the work per key is
 * small next to a lock round trip between processes (draining, copying,
 * forwarding keys); a pool of slow reconciles wants wq_get.
 */
WQ_API int wq_get_many(wq *q, void *buf, size_t size, struct iovec *keys, size_t n,
                       int64_t timeout_ns);

/*
 * wq_done_many - wq_done of n keys, 64 keys per lock acquisition. Every
 * key that is processing is done (a re-added one queued at the back, in
 * the batch's order); a key that is not processing is skipped and left
 * as it is (wq_done's -ENOENT; with the Redis engine also one whose
 * lease this handle lost, -ESTALE). Returns how many keys were done
 * (0 .. n); n - that is how many were skipped. All keys are validated
 * first: -EINVAL (n == 0, NULL, an empty key) or -EMSGSIZE does none.
 * Another error (a lock error, -EBADMSG) stops the batch: the keys
 * before it are done.
 */
WQ_API int wq_done_many(wq *q, const struct iovec *keys, size_t n);

/* ------------------------------------------------------------------ */
/* Delaying and rate limiting (client-go DelayingInterface,            */
/* RateLimitingInterface)                                              */
/* ------------------------------------------------------------------ */

/*
 * Waiting keys live in the region (a binary min-heap ordered by ready
 * time, CLOCK_MONOTONIC, ties in order of their add). There is no daemon:
 * whoever holds the lock moves ready keys to the queue (every wq_get does,
 * before popping), and a blocked wq_get sleeps until the earliest ready
 * time. A waiting key counts as live (it uses a slot) and in wq_len once
 * its time has come.
 *
 * Shutdown drops waiting keys, as client-go does (its waiting loop
 * stops), except with a store: there they stay and fire after wq_resume
 * (see wq_shutdown).
 */

/*
 * wq_add_after - add key once delay_ns has passed. A key already waiting
 * keeps the earlier of its two ready times. A key already dirty (queued,
 * or re-added while processing) is not delayed again: the add is merged.
 * A key processing and not dirty waits, and is marked dirty when ready.
 * delay_ns == 0 is wq_add (and returns as wq_add does).
 * Counts in retries_total (client-go). Returns 0 when a new wait started,
 * 1 when merged into a key already dirty or waiting, or as wq_add's
 * errors (-ESHUTDOWN, -ENOSPC, -EINVAL, -EMSGSIZE); -ENOSPC also when a
 * key that is neither processing nor dirty starts to wait and the system
 * refuses a page for the delay heap ("Memory"; nothing changed). A key
 * being processed was given its slot by its get: its wait never fails.
 */
WQ_API int wq_add_after(wq *q, const void *key, size_t len, uint64_t delay_ns);

/*
 * wq_add_rate_limited - wq_add_after with the rate limiter's delay for
 * this key: its failure count rises by one (client-go's When()). The
 * delay is the maximum of the limiters chosen at creation
 * (wq_options.rl_limiters), by default max(exponential 5 ms * 2^failures
 * capped at 1000 s, token bucket 10 qps burst 100). Returns as
 * wq_add_after.
 */
WQ_API int wq_add_rate_limited(wq *q, const void *key, size_t len);

/*
 * wq_forget - reset the key's failure count (client-go's Forget: call it
 * when the key reconciled successfully). Does not remove the key from the
 * queue, and keeps its result (wq_finish then wq_forget, client-go's
 * idiom, keeps the outcome). Returns 0 (also for an unknown key),
 * -EINVAL, -EMSGSIZE.
 *
 * Where failure counts live: in the key's slot. A key whose count is not
 * zero keeps its slot after wq_done (stats: `failing`) until wq_forget.
 * Such idle slots never make an add fail: when every slot is used and a
 * new key needs one, the failure count of an idle key is dropped to make
 * room (clock-hand order, roughly the oldest first). So `capacity` still
 * bounds exactly the queued+processing+waiting keys, as documented, and
 * failure counts are kept as long as there is room for them.
 */
WQ_API int wq_forget(wq *q, const void *key, size_t len);

/* wq_num_requeues - the key's failure count (>= 0), -EINVAL, -EMSGSIZE. */
WQ_API int wq_num_requeues(wq *q, const void *key, size_t len);

/*
 * wq_remove - take a key out of the queue for good, with its failure
 * count and result: a key queued, waiting for a delay, or idle (kept for
 * a count or a result). An operator's way to get rid of a poison key.
 * With a store its record is removed too (as for wq_done). Returns 0;
 * -EBUSY while the key is processing (nothing changes: let its holder
 * finish, or kill it); -ENOENT when the queue does not hold the key;
 * -EINVAL, -EMSGSIZE. A queued key leaves the FIFO in O(queued keys).
 */
WQ_API int wq_remove(wq *q, const void *key, size_t len);

/* ------------------------------------------------------------------ */
/* Priorities and fairness (controller-runtime's priority queue, and   */
/* beyond; queues created with WQ_FAIR)                                */
/* ------------------------------------------------------------------ */

/*
 * Fair mode changes only the order in which queued keys are handed out;
 * dedup, one worker per key, delays, rate limiting, shutdown, crash
 * safety and the store work as in the default mode.
 *   1. A key re-added while it is processing is handed out, after its
 *      wq_done, in the order of the moment it was re-added: ahead of keys
 *      added later (the default mode puts it at the back, as client-go).
 *   2. Higher priority first (wq_add_opts; default 0).
 *   3. Among keys of one priority, tenants take turns: the part of the key
 *      before the first tenant_sep ('/': "namespace/name") is its tenant
 *      (wq_key_info.tenant_len bytes, the separator not included),
 *      and each tenant's keys get start tags of start-time fair queueing,
 *      so a tenant that adds 100,000 keys does not delay another tenant's
 *      single key behind them. Within a tenant, add order. Tenants are
 *      hashed onto a fixed table of counters (4 per slot of capacity, at
 *      most 65536): two tenants that share a counter take turns together.
 *      A key without the separator is a tenant of its own (the whole key).
 *   4. No starvation: one hand-out in fair_share (wq_options, default 8)
 *      goes to the oldest queued key, whatever its priority and tenant. So
 *      a key with r keys queued before it is handed out within
 *      fair_share * (r + 1) hand-outs even under an endless flood of higher
 *      priority keys.
 * All of it is O(log n) per operation (two binary heaps in the region:
 * by (priority, tag, add order) and by add order, plus a tenant table).
 */
struct wq_add_opts {
    int priority;          /* higher first; != 0 needs WQ_FAIR (-EINVAL) */
    uint64_t after_ns;     /* > 0: as wq_add_after */
    bool rate_limited;     /* as wq_add_rate_limited; with after_ns, the
                              smaller delay wins (controller-runtime) */
    uint64_t reserved[4];  /* must be zero (-EINVAL): room to grow */
};

/*
 * wq_add_opts - add with options. Merging like controller-runtime: a key
 * already queued (or re-added, or waiting) keeps the higher of its two
 * priorities and the earlier ready time. A key that is processing and not
 * yet re-added was handed out: its re-add is a new add with its own
 * priority. Returns 0 when newly queued, marked or waiting, 1 when
 * merged into a key already dirty or waiting, or wq_add's errors; NULL
 * opts is wq_add.
 */
WQ_API int wq_add_opts(wq *q, const void *key, size_t len, const struct wq_add_opts *o);

/* ------------------------------------------------------------------ */
/* Results (long-running tasks, as in Sveltos' deployer)               */
/* ------------------------------------------------------------------ */

enum wq_state {
    WQ_STATE_NONE,      /* nothing known about the key */
    WQ_STATE_PENDING,   /* queued, or waiting for a delay */
    WQ_STATE_RUNNING,   /* processing (even if re-added meanwhile) */
    WQ_STATE_SUCCEEDED, /* last wq_finish had code 0 */
    WQ_STATE_FAILED     /* last wq_finish had code != 0 */
};

struct wq_result {
    enum wq_state state;
    int code;              /* the code given to wq_finish (0 if none yet) */
    uint64_t updated_ns;   /* CLOCK_REALTIME of that wq_finish (0 if none) */
    char message[256];     /* its message, NUL-terminated, possibly cut */
    uint64_t reserved[4];  /* zeroed by the library: room to grow */
};

/*
 * wq_finish - wq_done that also records an outcome: code 0 is success
 * (SUCCEEDED), anything else FAILED; message may be NULL (recorded as "")
 * and is cut to 255 bytes. Both happen under one lock acquisition: other
 * processes never see the key done without its outcome. Returns as
 * wq_done (-ENOENT if the key is not processing: nothing is recorded).
 *
 * Where results live: in a table of `result_capacity` slots in the region
 * (wq_options; 0 -> capacity) of 48 bytes each, a message longer than 12
 * bytes taking its own length beside them ("Memory"), whose pages are
 * taken as results arrive:
 * when the system refuses them, wq_finish is -ENOSPC and the key stays
 * processing (finish it again, or wq_done it). A result is kept while its key is idle,
 * until wq_remove, until result_capacity newer results push it out (least
 * recently updated first), or until its key's slot is needed for a new
 * live key (as failure counts, see wq_forget). Re-adding the key makes it
 * PENDING, then RUNNING; the next wq_finish replaces the result.
 */
WQ_API int wq_finish(wq *q, const void *key, size_t len, int code, const char *message);

/*
 * wq_result - the key's state: RUNNING while processing (even if also
 * dirty), PENDING while queued or waiting, else the last recorded outcome,
 * else NONE. code, updated_ns and message are those of the last outcome
 * still kept (so a RUNNING key shows how its previous run ended), or zero
 * and "". Returns 0, -EINVAL, -EMSGSIZE.
 */
WQ_API int wq_result(wq *q, const void *key, size_t len, struct wq_result *out);

/* How wq_finish_get finishes a key. */
struct wq_finish_opts {
    int code;              /* as wq_finish's: 0 SUCCEEDED, else FAILED */
    const char *message;   /* as wq_finish's (NULL: "") */
    bool forget;           /* also reset the key's failure count, as
                              wq_forget (client-go's Forget after a
                              success), in the same step */
    uint64_t reserved[4];  /* must be zero (-EINVAL): room to grow */
};

/*
 * wq_finish_get - a worker's turn in one call: finish done_key as
 * wq_finish does with f's code and message (an outcome is always
 * recorded; and wq_forget it if f->forget), then wq_get(buf, cap,
 * timeout_ns), sharing one lock acquisition (one server round trip on
 * redis://) when a key is queued. NULL f is a plain wq_done, as
 * wq_done_get. buf must not overlap done_key.
 *
 * Errors that change nothing (nothing recorded, forgotten or popped):
 * -EINVAL (bad arguments, a reserved word not zero), -ENOBUFS (cap below
 * max_key_len), -EPERM (an observer), -ENOENT (done_key is not
 * processing), -ESTALE (redis://: this handle lost done_key's lease),
 * -ENOSPC (no room for the result: done_key is still processing; finish
 * it again, or wq_done it). Otherwise done_key is finished and the call
 * returns as wq_get: the next key's length, or -EAGAIN (also when the
 * get found no memory for its record, with wq_last_error saying so: the
 * finish stands), -ETIMEDOUT,
 * -ESHUTDOWN, or -EBADMSG (a damaged region; from the finish, done_key
 * is still processing, from the get it was finished: wq_result tells). On redis://, a command that takes more than
 * 10 s is -ETIMEDOUT too (see the error list), and then the finish may or
 * may not have happened.
 * wq_run_workers uses it between reconciles.
 */
WQ_API int wq_finish_get(wq *q, const void *done_key, size_t done_len,
                         const struct wq_finish_opts *f, void *buf, size_t cap,
                         int64_t timeout_ns);

/* ------------------------------------------------------------------ */
/* Worker pool (controller-runtime's MaxConcurrentReconciles)          */
/* ------------------------------------------------------------------ */

struct wq_reconcile {
    int64_t requeue_after_ns; /* > 0: forget, record success, re-add after it */
    int code;                 /* failure code to record (0: use the return) */
    char message[256];        /* recorded with the outcome */
};

/*
 * A reconciler, called in a worker process for one key. The key is
 * NUL-terminated (not counted in len); *out is zeroed before the call.
 * Return 0 for success, a negative value for failure; positive values are
 * reserved (recorded as FAILED with -EINVAL).
 */
typedef int (*wq_reconcile_fn)(wq *q, const void *key, size_t len,
                               struct wq_reconcile *out, void *arg);

/*
 * wq_run_workers - fork `workers` processes that loop get -> fn -> finish
 * (each finish and the next get are one wq_finish_get), and supervise
 * them until they have exited: after the queue was shut down, after a
 * SIGTERM or SIGINT stopped the pool, or (until_empty) once the queue ran
 * empty. Outcomes map like controller-runtime's:
 *   fn returns 0, requeue_after_ns == 0: wq_forget + SUCCEEDED(message);
 *   fn returns 0, requeue_after_ns > 0: wq_forget, re-added after that
 *     delay, SUCCEEDED recorded;
 *   fn returns < 0: FAILED(out->code, or the return value) and the key is
 *     re-added rate limited (its failure count rises); after max_attempts
 *     failed attempts (wq_pool_options) it is given up instead: forgotten,
 *     not re-added, its FAILED result kept.
 * The re-add is made while the key is still processing, so a worker that
 * dies between the two steps loses nothing.
 * Supervision: a worker that dies (signal, or exit status other than 0)
 * is replaced after a restart backoff (100 ms doubling to 10 s per worker
 * slot, reset once a worker has lived 10 s), so a crash-looping reconciler
 * does not spin; the key it held is requeued by the crash machinery, never
 * processed twice at once. A reconcile that overruns timeout_ns gets its
 * worker SIGKILLed: the attempt counts as failed (the key comes back as a
 * crash requeue, its failure count raised) and wq_pool_options.timeouts
 * counts it. The supervisor waits only for its own workers (waitpid on
 * their pids), never for other children of the caller.
 * Signals: while it runs, SIGTERM and SIGINT are handled by the
 * supervisor. The first stops this pool, not the queue: each worker
 * finishes the key it holds and exits; queued keys stay queued for the
 * next start, and other processes attached to the queue are untouched
 * (so a `systemctl restart` or a rolling deploy loses nothing). A second
 * one SIGKILLs the workers and returns at once (-EINTR); the keys they
 * held go back to the queue like on a close (no failure counted): the
 * stop was chosen. Workers ignore SIGINT and SIGTERM (a terminal ^C
 * reaches the whole process group) and die with the supervisor
 * (PR_SET_PDEATHSIG). The caller's signal mask and dispositions are
 * restored on return. To stop every consumer of the queue, shut the
 * queue down (wq_shutdown, wqctl shutdown) instead.
 * A worker that cannot work at all (wq_get fails with -EUSERS, -ENOMEM,
 * -EBADMSG, -ENOTRECOVERABLE) stops the pool with that error instead of
 * being restarted forever. One whose get finds /dev/shm full (-ENOSPC:
 * nothing was handed out) pauses 50 ms and tries again. A WQ_OBSERVE handle gets -EPERM at once, and
 * nothing is forked.
 * Process slots: while the workers run, the calling handle gives its own
 * slot up (unless it holds a key, or another of its threads waits in a
 * get), so a queue created with max_procs N runs a pool of N workers.
 * The supervisor only looks (wq_stats, wq_check) meanwhile. The handle
 * registers again at its next add, get or done, which fails with -EUSERS
 * if the table is full then.
 * Workers are named "<name>-w<N>" (prctl PR_SET_NAME: ps -e, top and
 * pgrep tell them from the supervisor); a worker sees a stop request
 * within 200 ms of finishing its key.
 * Call it from a process whose other threads block SIGINT and SIGTERM
 * (the supervisor blocks them in its own thread only). Workers ignore
 * SIGINT and SIGTERM; a reconciler that execs a command should restore
 * them there (ignored dispositions survive exec).
 * Returns 0 when the queue was shut down, the pool was stopped by a
 * signal, or it ran empty, and every worker exited; -EINTR after a second
 * signal; -EINVAL (workers == 0 or > 1024, NULL fn, a negative timeout,
 * non-zero reserved fields); a worker's fatal error as above; or an error
 * from fork.
 */
WQ_API int wq_run_workers(wq *q, unsigned workers, wq_reconcile_fn fn, void *arg);

/* Options of wq_run_workers_opts. Zero-initialise; every zero field is
   wq_run_workers' behaviour. */
struct wq_pool_options {
    uint32_t max_attempts;  /* give a key up after this many failed attempts
                               (0: never, as controller-runtime) */
    int64_t timeout_ns;     /* kill a reconcile running longer (0: never) */
    bool until_empty;       /* return once nothing is queued, processing or
                               waiting (a batch job) */
    /* Called in each worker right after fork, before its first key, with
       the worker's number (0 .. workers-1) and wq_run_workers' arg:
       reseed random numbers, reopen connections. */
    void (*after_fork)(wq *q, unsigned worker, void *arg);
    const char *name;       /* worker name prefix (at most 8 bytes used;
                               NULL: "wq") */
    /* Out, set on return: */
    uint64_t timeouts;      /* reconciles killed for overrunning timeout_ns */
    bool stopped_by_signal; /* a SIGTERM or SIGINT stopped the pool */
    uint64_t reserved[4];   /* must be zero (-EINVAL): room to grow */
};

/* wq_run_workers with options (NULL: wq_run_workers). */
WQ_API int wq_run_workers_opts(wq *q, unsigned workers, wq_reconcile_fn fn, void *arg,
                               struct wq_pool_options *opts);

/* ------------------------------------------------------------------ */
/* Persistence (LMDB store)                                            */
/* ------------------------------------------------------------------ */

/*
 * With wq_options.store_path, the queue keeps what it needs to come back
 * after the shared region is lost (reboot, wq_unlink) in an LMDB
 * environment in that directory (created 0600, or `mode`): every live key
 * (queued and processing keys come back queued; a key that was processing
 * when the world stopped is processed again, once), waiting keys with
 * their remaining delay (a wall-clock ready time is stored), failure
 * counts and results. Keys done and clean are removed from it.
 *
 * The store is a property of the queue: its path and durability are kept
 * in the region, so every process attached writes to the same store (each
 * opens its own LMDB environment, lazily, and again after fork).
 *
 * A store serves one queue. The region made from a store claims it (in a
 * file "owner" beside LMDB's) before it reads it, and creators of one
 * store take turns. wq_open that would make a second queue on a store
 * whose queue's region exists (another name, or the same name in another
 * WQ_SHM_DIR, or the store reached through another path) fails with
 * -EBUSY, names that region in wq_last_error, and makes nothing. Where
 * that region cannot be seen (another container, with a /dev/shm of its
 * own, on a shared store directory) the new queue takes the store over,
 * with every key it holds (an add the old region acknowledged meanwhile
 * included), and the old region's store writes, and so its adds of new
 * keys, fail with -EIDRM from then on. A copy of a store directory
 * (cp -r) is another store. Keep the file "owner" with the store.
 *
 * Durability of wq_add / wq_add_after / wq_add_rate_limited (of a key the
 * store did not have yet):
 *   WQ_DURABLE_PROCESS  when the call returns the key is committed to LMDB
 *                       (without fsync): killing every process and
 *                       removing the region loses nothing. A power
 *                       failure may lose the last commits, or leave the
 *                       store damaged (LMDB's pages reach the disk in any
 *                       order without fsync): a restore then fails with
 *                       -EUCLEAN, and wq_store_salvage keeps every record
 *                       that verifies.
 *   WQ_DURABLE_FSYNC    ... and on disk: survives power loss too. The
 *                       add writes its key to the store's journal (a
 *                       file "journal" of 4 MiB beside LMDB's, made when
 *                       the queue is created) with one synchronous write:
 *                       one disk flush, where a synced LMDB commit takes
 *                       two. LMDB takes the journal's contents in a
 *                       checkpoint, one synced commit, when the journal
 *                       is full, whenever the deferred changes below
 *                       are written as a whole, and every
 *                       snapshot_interval_ms while the journal holds
 *                       writes;
 *                       every LMDB commit of such a store is synced, so
 *                       a power failure never damages it. When the queue
 *                       is restored (its region gone: a reboot, every
 *                       process killed), wq_open first applies what the
 *                       journal holds beyond the last checkpoint. A
 *                       journal write cut by a power failure is that of
 *                       an add that never returned: it is ignored. The
 *                       journal must stay with the store (copy the whole
 *                       directory); one removed while the queue is open
 *                       is found at the next checkpoint, which takes
 *                       what was written to it, and a new one is made
 *                       (a power failure before that checkpoint loses
 *                       the adds written since the removal). Concurrent
 *                       adders, in any process,
 *                       share journal writes (group commit through the
 *                       store's flush lock). Changes that need no flush
 *                       wait for a write that carries a new key (see
 *                       removals below): a cycle costs one flush, at its
 *                       add. Processes that keep
 *                       adding are gathered: a new key's add first waits
 *                       for the processes that were in the previous write
 *                       and have not added since (at most twice this
 *                       process's recent write time, and 2 ms), so their
 *                       next keys share one flush (two processes adding
 *                       in turn: 1.7-2.2x the adds/s of one, not 1x). A
 *                       lone adder never waits. An add that coalesces
 *                       into another process's new key returns once
 *                       that key is stored.
 *   WQ_DURABLE_NONE     memory speed; the region is written to the store
 *                       every snapshot_interval_ms (by whichever process
 *                       holds the lock when it is due, or else by a
 *                       background thread, below)
 *                       and by wq_snapshot.
 * Until a new key is in the store (PROCESS, FSYNC) it is invisible: no
 * wq_get hands it out, so a key is never processed without being stored.
 * Removals (wq_done of a clean key, wq_forget) and the other changes that
 * need no fsync (results, failure counts, a waiting key's time):
 *   PROCESS  written before the call returns.
 *   FSYNC    deferred, so that they cost no flush of their own: they stay
 *            listed in the region (wq_stats.store_unsynced) and are
 *            written by the next journal write of a new key (any
 *            process's), by
 *            the first call that finds snapshot_interval_ms (default 1 s)
 *            passed since such a write or 1024 of them listed, and by
 *            wq_snapshot, wq_unlink and the last handle's wq_close. A
 *            process crash loses none (the region keeps them); lost with
 *            the region (power failure, a reboot without that last
 *            close), a removal only means the key is processed once
 *            more, as a removal lost to a power failure always did. A
 *            failure to write them leaves them listed, to
 *            be retried; wq_snapshot returns it, wq_get, wq_done,
 *            wq_done_get, wq_finish_get, wq_stats and another key's add
 *            do not.
 * On a queue nobody calls, what is due (the above, a NONE snapshot, and
 * the changes of a process killed before it wrote them, such as the new
 * key of an adder killed before its commit, which until then nobody can
 * get) is written within about 250 ms by a background thread of any
 * process that has the queue open with a process slot and has written to
 * its store before (the thread that also reclaims a dead process's keys,
 * see PROCESSES).
 * It never waits for a lock: when a call holds one, that call, or the
 * next tick, writes.
 *
 * Restore: wq_open with WQ_CREATE on a missing region and a store that
 * holds keys builds the new region from the store before anyone can see
 * it; geometry fields left 0 in the options are taken from the store. An
 * existing region is never restored into (no key is ever restored twice).
 * Keys come back in the order they were first added.
 *
 * Errors: a store that is not a libwq store, or whose files are damaged,
 * gives -EUCLEAN (see "Damage" below) or -EIO; a store that cannot be
 * written (read-only, disk full, files another uid may not write) gives
 * -EACCES, -EIO or -ENOSPC from the call that needed it, which then
 * changes nothing; unless another process, one that can write the store,
 * committed the change first (a group commit, the background thread):
 * then the call succeeded. Either way a key is queued only if stored.
 * The LMDB map grows as needed.
 */

/*
 * Damage. LMDB checks nothing on its pages, so libwq checks for it: every
 * record carries a checksum, and the meta record the number of records
 * and the sum of their checksums, kept in the same transaction as every
 * change; a marker file (libwq-store) says the directory holds a queue.
 * A store no region has vouched for yet is read in a child process, so
 * LMDB tripping over a damaged page kills that child, not the caller, and
 * verified before any region built from it can be seen. (While the child
 * reads, the caller already builds that region, unlinked, from the meta
 * record's settings and count: its room in /dev/shm is taken then, at
 * most twice the size of the store's data file plus 4 MiB, and given
 * back at once if the store fails.) A restore therefore
 * brings back every stored record exactly, or fails with -EUCLEAN and
 * names the store and the damage (wq_last_error): a record that fails
 * its checksum, records lost or added, a meta record that is damaged or
 * holds settings wq_open would refuse, a data.mdb that is missing or
 * empty where the marker says a queue was. A store damaged while a
 * region uses it is not re-checked (only at restore). The journal of an
 * FSYNC store is checked likewise: each write carries a checksum, a
 * number that rises and the store's journal id (so another store's
 * journal is never applied); a write that does not verify and is
 * followed by none that does is one a power failure cut, and is ignored;
 * one followed by a later write that verifies is damage: -EUCLEAN, with
 * the journal's offset named. A checkpoint that meets damage where the
 * queue wrote fails the same way.
 */

/*
 * wq_store_salvage - rescue a damaged store, for an operator: the store
 * directory is renamed aside to "<store_path>.damaged-<UTC time>" (kept,
 * never overwritten) and a new store is written at store_path with every
 * record that verifies, in first-add order. Records that fail their
 * checksum are dropped, pages LMDB cannot read are walked around (in
 * child processes: a damaged page loses its records and some near it,
 * as the walk resumes past it in steps of at most 1/256 of the stored
 * keys' hash space; a walk that makes no progress for 5 s, as in a cycle
 * of pages, is killed and resumed likewise, and three such walks in a row
 * end the salvage), and report (may be NULL) gets one line per loss and
 * a summary naming the kept and dropped counts and where the damaged
 * store went. An FSYNC store's journal is applied to the new store as far
 * as it verifies (the report says how many writes, and names the first
 * that does not verify when later ones are lost). The queue's settings
 * come from the old meta record when it is readable, else from opts
 * (NULL or zero fields: defaults). No region
 * is touched: restore the queue afterwards with wq_open(WQ_CREATE |
 * WQ_RESTORE). Returns the number of records kept (>= 0), -ENODATA when
 * there is no data.mdb to salvage, -EINVAL, or the system's error
 * (starting a reader, renaming, writing); wq_last_error says more.
 */
WQ_API int wq_store_salvage(const char *store_path, const struct wq_options *opts,
                            wq_report_fn report, void *arg);

/*
 * wq_snapshot - write every change the store does not have yet, now
 * (with WQ_DURABLE_FSYNC, on disk: removals included, and then a
 * checkpoint, so LMDB alone holds everything).
 * Returns the number of records written or removed (>= 0), or -EIO,
 * -ENOSPC; -ENOENT when the queue has no store; -EBADMSG when the
 * region's list of changes was damaged and its repair failed (a repair
 * that works is counted in repairs_total and the snapshot goes on).
 */
WQ_API int wq_snapshot(wq *q);

/* ------------------------------------------------------------------ */
/* Redis (redis:// queues: one queue for many machines)                */
/* ------------------------------------------------------------------ */

/*
 * A queue name "redis://[[user]:password@]host[:port]/NAME" (port 6379 by
 * default; user and password may be percent-encoded; an IPv6 host in
 * brackets) opens NAME on that Redis server (or Valkey): the same program
 * then runs with workers on many machines. Every other name is shared
 * memory. wq_unlink and wq_list_at take such names too.
 *
 * Same meaning: every call of this header, with the semantics above
 * (coalescing, one holder per key, re-adds to the back at wq_done,
 * delays with the earliest time winning, the rate limiters with their
 * defaults shared by all clients, failure counts, results, fair mode,
 * shutdown, drain, resume, metrics). Each call is one atomic call of a
 * function on the server (a Redis function library that libwq loads once
 * per server with FUNCTION LOAD; wq_add_many: one call for the whole
 * batch, all or none); times are the server's clock, so every client
 * agrees on delays. The server needs Redis 7.0 or later (or Valkey).
 *
 * What changes, and why:
 *   - Holding a key is a lease. There is no lock a dead process leaves
 *     behind, and a distributed queue cannot tell a dead worker from a
 *     stalled one, so each handle renews a lease of lease_ns (wq_options;
 *     default 10 s) from a thread, and every hand-out carries a new epoch.
 *     A handle that stops renewing (dead, stopped, partitioned) loses its
 *     keys when its lease runs out; a handle whose connection the server
 *     has closed (a SIGKILL closes it at once) loses them within about a
 *     second, found by the other handles (CLIENT LIST, on the queue's
 *     server). Lost keys are requeued through the rate limiter and counted
 *     in crash_requeues_total, exactly as a crash in shared memory. Its
 *     later wq_done / wq_finish for such a key fail with -ESTALE and change
 *     nothing (fencing). The guarantee becomes: a key is never handed to
 *     two holders of unexpired leases. A worker whose reconcile may take
 *     longer than the lease while its process is stopped (not merely
 *     busy: a busy process renews) must expect -ESTALE.
 *   - wq_done from a handle that did not get the key (another process, as
 *     shared memory allows) carries no epoch and is accepted.
 *   - Connections: each call uses one of the handle's connections (made
 *     lazily; a blocked wq_get holds its own). A call whose connection
 *     dropped is sent once more on a new one; the server keeps the last
 *     reply of every connection, so the resent call is answered, never run
 *     twice. While the server is unreachable, calls fail at once with the
 *     connection's error (wq_last_error names the server) and work again
 *     when it is back. Nothing the server acknowledged is lost by the
 *     client. AUTH uses the name's user and password.
 *   - Durability is the server's: WQ_DURABLE_PROCESS (default) means the
 *     primary acknowledged it (in memory; what survives a server restart
 *     is what its own persistence, RDB or AOF, kept); WQ_DURABLE_FSYNC
 *     needs a server with appendonly yes and appendfsync always (checked
 *     at wq_open with CONFIG GET where allowed; -ENOTSUP otherwise), so an
 *     acknowledged add survives a server crash; WQ_DURABLE_NONE asks
 *     nothing. Replication is asynchronous (Redis 7.0 has no WAITAOF): a
 *     failover can lose the writes of its last moments; wq_snapshot waits
 *     (up to 5 s) until every connected replica has everything the primary
 *     had acknowledged when it was called, and returns how many replicas
 *     did (0 without replicas; -ETIMEDOUT if some did not).
 *   - Shutdown keeps waiting keys (they fire after wq_resume), as with a
 *     store: the queue outlives every process.
 *   - Options with no meaning here are refused with -EINVAL, never
 *     ignored: store_path, mode (access is the server's ACL), max_procs,
 *     snapshot_interval_ms. lease_ns is for Redis queues only.
 *   - wq_stats: processes counts holders with unexpired leases;
 *     region_bytes, region_used, repairs_total, max_procs, has_store,
 *     store_unsynced and restored are 0. wq_dump reads the queue in pages of 500 keys (not one snapshot:
 *     a key that moves during the walk may be missed or seen twice);
 *     owner_pid is the holder's pid on its own machine. wq_check verifies
 *     the server-side structures against the key records, and with
 *     WQ_CHECK_REPAIR rebuilds them from the records. wq_release_pid gives
 *     back the keys of holders on this machine with that pid.
 *   - wq_name is the name without its password.
 *   - Redis Cluster: all keys of a queue share the hash tag {NAME}, so a
 *     queue lives in one slot (many queues spread over the cluster). MOVED
 *     and ASK are followed; during a failover or a slot migration a call
 *     retries for up to 5 s, asking the other nodes it knows, before it
 *     fails.
 *   - After fork, a child's first call registers it as a new holder with
 *     its own connections and lease; keys the parent holds stay the
 *     parent's.
 */

/* ------------------------------------------------------------------ */
/* Metrics (client-go's workqueue metrics, shared by all processes)    */
/* ------------------------------------------------------------------ */

/* client-go's histogram buckets for both durations: 10 ns .. 10 s,
   upper bounds in seconds: 1e-8, 1e-7, ..., 1e+1 (then +Inf). */
#define WQ_HIST_BUCKETS 10   /* finite buckets (plus +Inf) */

struct wq_histogram {
    uint64_t count;                       /* observations */
    double sum_seconds;                   /* their sum */
    uint64_t bucket[WQ_HIST_BUCKETS + 1]; /* cumulative counts, le=1e-8 ...
                                             le=10, then +Inf (== count) */
};

struct wq_metrics {
    uint64_t depth;                 /* client-go depth: adds not yet handed
                                       out (queued, plus keys re-added while
                                       processing) */
    uint64_t adds_total;            /* client-go adds_total */
    struct wq_histogram queue_duration; /* add -> get (seconds) */
    struct wq_histogram work_duration;  /* get -> done (seconds) */
    double unfinished_work_seconds; /* sum over processing keys of their age */
    double longest_running_processor_seconds; /* age of the oldest */
    uint64_t retries_total;         /* client-go retries_total */
    uint64_t coalesced_total;       /* libwq: adds merged into a dirty key */
    uint64_t crash_requeues_total;  /* libwq: keys requeued after a crash */
    uint64_t waiting;               /* libwq: keys waiting for a delay (the
                                       delayed keys gauge) */
    uint64_t processing;            /* libwq: keys being processed */
    struct wq_histogram rate_limit_delay; /* libwq: every delay the rate
                                       limiter chose (wq_add_rate_limited,
                                       crash requeues), seconds */
    uint64_t reserved[3];           /* zeroed by the library: room to grow */
};

/*
 * wq_metrics - the metrics, as a consistent snapshot taken under the
 * lock. Counters and histograms are kept in the region (histograms with
 * atomics) and read in O(1); the two work gauges need a pass over the
 * entries, O(capacity), so this call is meant for scrapes (every few
 * seconds), not for hot loops. With WQ_NO_METRICS the histograms and the
 * work gauges stay 0. Returns 0 or -EINVAL.
 */
WQ_API int wq_metrics(wq *q, struct wq_metrics *out);

/* ------------------------------------------------------------------ */
/* Inspection                                                          */
/* ------------------------------------------------------------------ */

struct wq_stats {
    uint64_t queued;        /* keys in the FIFO */
    uint64_t processing;    /* keys handed out and not done */
    uint64_t waiting;       /* keys added with a delay, not yet ready */
    uint64_t live;          /* keys using a slot: queued+processing+waiting */
    uint64_t capacity;      /* max live keys */
    uint64_t processes;     /* handles with a process slot whose process
                               lives (a dead one's slot is not counted,
                               even before it is reaped; see PROCESSES) */
    uint64_t adds_total;    /* adds that were not coalesced */
    uint64_t coalesced_total; /* adds merged into an already dirty key */
    uint64_t retries_total; /* delayed / rate limited adds (client-go) */
    uint64_t crash_requeues_total; /* keys requeued because their holder died */
    uint64_t max_key_len;
    uint64_t max_procs;     /* 0: no process table (Redis) */
    uint64_t region_bytes;  /* size of the shared-memory object: the address
                               space every process maps (a sparse file) */
    uint64_t repairs_total; /* times the region was repaired: after a dead lock
                               holder, a mutation left half done, or damage
                               a call found (-EBADMSG) */
    uint64_t shutting_down; /* 1 from a shutdown until wq_resume */
    uint64_t failing;       /* idle keys kept because their failure count
                               is not zero (keys kept only for a result are
                               idle_results) */
    uint64_t results;       /* results kept (wq_finish) */
    uint64_t result_capacity;
    uint64_t durability;    /* WQ_DURABLE_*, when store_unsynced is meaningful */
    uint64_t has_store;     /* 1 when the queue has a store */
    uint64_t store_unsynced;/* keys whose store record is not up to date
                               (FSYNC: deferred removals included) */
    uint64_t fair;          /* 1 for a WQ_FAIR queue */
    uint64_t next_ready_ns; /* CLOCK_MONOTONIC time the first waiting key is
                               ready; 0 when none waits */
    uint64_t now_ns;        /* CLOCK_MONOTONIC time of this snapshot */
    uint64_t idle_results;  /* idle keys kept only for their result */
    uint64_t restored;      /* keys restored from the store when the region
                               was built (0 without a restore) */
    uint64_t region_used;   /* bytes of /dev/shm (memory) it takes now: the
                               fixed sections, the index and ring, and the
                               pages reserved for the most keys and results
                               it has held */
    uint64_t reserved[13];  /* zeroed by the library: room to grow */
};

/*
 * wq_stats - a consistent snapshot of the counters (taken under the lock).
 * Returns 0 or -EINVAL.
 */
WQ_API int wq_stats(wq *q, struct wq_stats *out);

/* States reported by wq_dump (a bit mask; DIRTY can combine with
   QUEUED or PROCESSING). */
#define WQ_KEY_DIRTY      (1u << 0) /* added and not yet handed out */
#define WQ_KEY_QUEUED     (1u << 1) /* in the FIFO */
#define WQ_KEY_PROCESSING (1u << 2) /* handed out, wq_done not called */
#define WQ_KEY_WAITING    (1u << 3) /* added with a delay, not yet ready */
#define WQ_KEY_FAILING    (1u << 4) /* idle, kept for a failure count or result */
#define WQ_KEY_STORING    (1u << 5) /* added, not in the store yet: no wq_get
                                       sees it until its commit (store) */

struct wq_key_info {
    const void *key;        /* valid only during the callback */
    size_t len;
    unsigned state;         /* WQ_KEY_* bits */
    pid_t owner_pid;        /* holder's pid while processing, else 0 */
    uint64_t position;      /* 0-based FIFO position while queued, else UINT64_MAX */
    uint64_t ready_ns;      /* WAITING: CLOCK_MONOTONIC ready time, else 0 */
    uint32_t failures;      /* rate limiter failure count (wq_num_requeues) */
    int priority;           /* WQ_FAIR: its priority (0 otherwise) */
    uint32_t seq;           /* add order (wraps): the age fairness uses */
    size_t tenant_len;      /* WQ_FAIR: bytes of key that name its tenant */
    enum wq_state result;   /* as wq_result reports it */
    int result_code;
    const char *result_message; /* valid only during the callback; "" if none */
    uint64_t started_ns;    /* processing: CLOCK_MONOTONIC of its wq_get
                               (0 with WQ_NO_METRICS) */
    bool holder_alive;      /* processing: its holder lives (a dead holder's
                               key is requeued within a second) */
    /* The library allocates this struct and may append fields in later
       versions: read it through the pointer, never allocate one. */
};

/*
 * wq_dump - call fn once per key the queue holds (live keys, and idle
 * keys kept for a failure count or a result): queued keys first in the
 * order they will be handed out (FIFO; in fair mode by priority, tenant
 * turn and add order, leaving out the oldest-key share), then the others.
 * Keys whose delay is over are queued first. Runs under the region lock:
 * fn must not call libwq on the same queue, nor wait for another process
 * that does (a forked child's wq_close takes the lock too), and should be
 * quick. If fn returns non-zero, the walk stops and that value is
 * returned. Returns 0 when all keys were visited.
 */
typedef int (*wq_dump_fn)(const struct wq_key_info *info, void *arg);
WQ_API int wq_dump(wq *q, wq_dump_fn fn, void *arg);

/*
 * wq_list - call fn with the name of every libwq queue present on this
 * machine: every /dev/shm/wq.<name> object whose <name> is a valid queue
 * name. The objects are not opened or validated.
 * Stops and returns fn's value when it is non-zero. Returns 0, or a
 * negative errno if /dev/shm cannot be read.
 */
WQ_API int wq_list(int (*fn)(const char *name, void *arg), void *arg);

/*
 * wq_list_at - wq_list for a place: NULL is this machine's shared memory
 * (wq_list); "redis://[[user]:password@]host[:port]" is every queue on
 * that Redis server, or on every master of its cluster, each given to fn
 * as a full name "redis://host:port/NAME" (without the password) that
 * wq_open accepts. Returns 0, fn's non-zero value, -EINVAL, -ENOTSUP
 * (built without hiredis), or the connection's error (wq_last_error).
 */
WQ_API int wq_list_at(const char *where, int (*fn)(const char *name, void *arg), void *arg);

/* wq_check flags */
#define WQ_CHECK_REPAIR (1u << 0) /* also repair what was found */
#define WQ_CHECK_REAP   (1u << 1) /* requeue keys of dead processes (implied by REPAIR) */

/*
 * wq_check - verify every structural invariant of the region: header
 * checksum, every live entry reachable through the hash index exactly
 * once, no index slot pointing at a free entry, ring contents equal to the
 * queued entries exactly once, states legal, owners valid, counters
 * matching. Returns 0 when clean, else the number of violations found
 * (> 0), or a negative errno. With WQ_CHECK_REPAIR the violations are
 * repaired (the return value still counts them) and keys held by dead
 * processes are requeued. A key held by a dead process is the normal crash
 * case, not a violation. If report is not NULL it is called once per
 * violation with a one-line description (no trailing newline). It holds
 * the region lock for its whole pass: about 100 ms at a million keys on
 * the 2-vCPU VM of tools/PERFORMANCE.md, while every add, get and done of
 * every process waits.
 */
WQ_API int wq_check_report(wq *q, unsigned flags, wq_report_fn report, void *arg);
WQ_API int wq_check(wq *q, unsigned flags);

/* wq_name - the queue's name as given to wq_open (owned by the handle). */
WQ_API const char *wq_name(wq *q);

/* wq_max_key_len - the queue's max_key_len: the size wq_get's buffer
   needs. -EINVAL for NULL. */
WQ_API int wq_max_key_len(wq *q);

/* wq_observing - whether q was opened with WQ_OBSERVE (false for NULL). */
WQ_API bool wq_observing(wq *q);

/*
 * wq_release_pid - for a supervisor that killed one of its own workers on
 * purpose: give the keys that process held back to the queue at once, at
 * the back and without counting a failure (as wq_close would have), and
 * free its process slot. Only a process that is certainly dead is touched
 * (its lease says so); a live one is left alone. On a redis:// queue a
 * holder names its host and pid: the holders of this host name with that
 * pid are released when no process of this machine has the pid (so a
 * holder of the same host name in another pid namespace is not told
 * apart). Returns the number of keys given back (>= 0), -EINVAL. Keys of
 * processes that died on their own are requeued as crashes by the
 * library without this call.
 */
WQ_API int wq_release_pid(wq *q, pid_t pid);

/* wq_strerror - libwq's wording for a negative (or positive) errno. */
WQ_API const char *wq_strerror(int err);

/*
 * wq_last_error - what went wrong, in more words than an errno: after
 * wq_open, wq_unlink, wq_list_at, wq_snapshot or wq_store_salvage
 * returned a negative errno, and after any call on a redis:// queue that
 * failed (naming the server and what it said),
 * a one-line description naming the object and the cause when the
 * library knows one (e.g. "store /var/lib/q: 3 damaged records (record
 * 17: record checksum mismatch)"), else "". Per thread; valid until the
 * next of those calls in this thread. Never NULL.
 */
WQ_API const char *wq_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* WQ_H */
