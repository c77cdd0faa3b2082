/*
 * atomics.h - the one way libwq touches shared words concurrently.
 *
 * Shared-memory fields are plain integers (layout.h); every access that
 * may race with another process goes through one of these helpers, which
 * name their memory order at the call site (liburing's barrier.h does the
 * same). Plain reads and writes are only for fields whose every reader
 * and writer holds the region lock. There is no second style: no
 * _Atomic-qualified fields, no stdatomic calls on shared memory.
 *
 * What pairs with what is written next to each field in layout.h.
 */
#ifndef WQ_ATOMICS_H
#define WQ_ATOMICS_H

/* A word read without the lock, as a hint or a snapshot: whole, unordered. */
#define wq_load_relaxed(p)      __atomic_load_n((p), __ATOMIC_RELAXED)
/* A word written under the lock that others read without it. */
#define wq_store_relaxed(p, v)  __atomic_store_n((p), (v), __ATOMIC_RELAXED)
/* An entry's state (entry.c): what the holder wrote before it is
   visible before it, to the coalesced add that reads it without the lock. */
#define wq_store_release(p, v)  __atomic_store_n((p), (v), __ATOMIC_RELEASE)
/* Futex sequence words: the bump publishes what the locker changed. */
#define wq_load_acquire(p)      __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define wq_bump_release(p)      ((void)__atomic_fetch_add((p), 1, __ATOMIC_RELEASE))

/* A counter updated only under the lock and read without it: a load and a
   store, not a locked read-modify-write (the lock already orders the
   writers; the atomics only keep lock-free readers from seeing a torn
   value). */
#define wq_add_relaxed(p, n)    wq_store_relaxed((p), wq_load_relaxed(p) + (n))
#define wq_sub_relaxed(p, n)    wq_store_relaxed((p), wq_load_relaxed(p) - (n))

/* The lock-free coalesced add (queue.c) and the hand-out it races with:
   a full fence between each side's store and its later loads (the
   caller's own state, written before wq_add, against the entry's state
   read after it; the hand-out's state against what its caller reads
   next), and the store and load orders of an entry's incarnation number
   (entry.c, wq__entry_renew). */
#define wq_fence_full()         __atomic_thread_fence(__ATOMIC_SEQ_CST)
/* The same, right after the region lock's release. Releasing a futex
   lock must learn atomically whether anyone waits, so the unlock is a
   read-modify-write, and on x86 every such (locked) instruction is a
   full barrier already: there only the compiler must not move loads
   above it. A fence costs 5% of a one-process cycle on the 2-vCPU VM. */
#if defined(__x86_64__) || defined(__i386__)
#define wq_fence_after_unlock() __atomic_signal_fence(__ATOMIC_SEQ_CST)
#else
#define wq_fence_after_unlock() wq_fence_full()
#endif
#define wq_fence_stores()       __atomic_thread_fence(__ATOMIC_RELEASE)
#define wq_fence_loads()        __atomic_thread_fence(__ATOMIC_ACQUIRE)

/* Orders the stores of a critical section for a holder killed at any
   instruction (a compiler barrier: the dying holder's own stores are all
   in its memory, what matters is their program order). */
#define wq_step_fence()         __atomic_signal_fence(__ATOMIC_SEQ_CST)

#endif
