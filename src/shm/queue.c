/*
 * queue.c - client-go's Interface and DelayingInterface over the region:
 * the one add path (wq_add, wq_add_after, wq_add_rate_limited,
 * wq_add_opts, wq_add_many), get, done, the fast paths, len, shutdown
 * and drain.
 *
 * Each operation is one critical section (hashes computed and clocks read
 * before locking); the state changes themselves are entry.c's
 * transitions, inside mutate.h's busy bracket.
 *
 * The add path: add_locked() decides, for one key under the lock, between
 * a new entry, a coalesced add, a new or merged wait, and marking an
 * existing key dirty. Every public add goes through add_call() (one key;
 * add_hashed() when its hash is known)
 * or wq__shm_add_many() (a batch), and both end the same way: when the
 * only room is held by removals the store has not written (-WQ_EFLUSH),
 * they flush and try again; a batch makes all the room it needs before
 * adding any key, so it adds all or none; then the store epilogue makes
 * the adds durable or rolls them back (store.c).
 *
 * Waking: whoever makes a key available owes one sleeper a wake (wait.c:
 * issued after the unlock). A getter that takes a key and sees more
 * queued with sleepers waiting passes the wake on, so a wake consumed by
 * a sleeper that then died or lost the race is not lost for long;
 * sleepers also wake every WQ_REAP_INTERVAL_NS to requeue dead holders'
 * keys.
 */
#include <limits.h>
#include <stdlib.h>

#include "shm.h"

/* Lock held: remember where the key of `hash` lives, for add_fast. */
static inline void hint_put(shmq *q, uint32_t idx, uint32_t hash)
{
    if (q->hints)
        wq__hint_put(q, hash, idx);
}

/*
 * The coalesced add, without the lock. A plain add of a key that is
 * already dirty (queued, or processing and added again) changes nothing
 * but a counter. In a controller that is the common add: an object that
 * changes again before its key is handed out. So this add finds the
 * key's entry through the handle's hint (where the handle last found or
 * put it), reads it without the lock, and counts itself in its own
 * process slot. It takes effect at its read of the entry's state:
 *  - The entry held this key at that moment. Its incarnation number
 *    (seq) is the same before the state and after the key bytes, and
 *    entry.c orders its stores for that: a new key's bytes after a new
 *    number and before the state store that publishes them, and a key
 *    given back only after its state has left and a new number is
 *    stored (wq__entry_renew).
 *  - What the caller wrote before wq_add is seen by whoever gets the key
 *    after that moment: both sides have a full fence between their store
 *    and their later loads (get_wait's follows the hand-out).
 * Anything else goes the locked way, which refreshes the hint: no hint
 * or another key's, a state without DIRTY, a queue shut down, a region
 * found damaged (whose repair may drop the entry: the locked add repairs
 * first), a handle this process has not registered (a forked child's
 * copy). Fair mode (a priority may rise) and a store (the add's epilogue
 * flushes) have no hints. 1 coalesced, 0 not.
 */
static int add_fast(shmq *q, const void *key, size_t len, uint32_t hash)
{
    uint64_t hint = wq__hint_get(q, hash);
    uint32_t idx = (uint32_t)hint, slot = wq_load_relaxed(&q->slot);
    if ((uint32_t)(hint >> 32) != hash || idx >= wq_load_relaxed(&q->nent) ||
        slot >= q->max_procs || wq_load_relaxed(&q->forkgen) != wq_load_relaxed(&wq__fork_gen))
        return 0;
    const struct wq_entry *e = wq__entry(q, idx);
    wq_fence_full();
    uint32_t seq = wq_load_acquire(&e->seq);
    uint16_t st = wq_load_acquire(&e->state);
    if (!(st & WQ_ST_DIRTY) || wq_load_relaxed(&e->keylen) != len ||
        wq_load_relaxed(&e->hash) != hash)
        return 0;
    const unsigned char *r = len <= WQ_KEY_INLINE
                                 ? e->k.in
                                 : wq__keys_at(q, wq_load_relaxed(&e->k.block),
                                               (uint32_t)len - WQ_KEY_PRE);
    if (!r || !wq__key_match(e, r, key, len))
        return 0;
    wq_fence_loads();
    if (wq_load_relaxed(&e->seq) != seq || wq_load_relaxed(&q->hdr->shutdown) ||
        wq_load_relaxed(&q->hdr->corrupt))
        return 0;
    __atomic_fetch_add(&q->procs[slot].coalesced, 1, __ATOMIC_RELAXED);
    return 1;
}

/*
 * Lock held: one add. 0 new or marked, 1 coalesced (into a dirty key, a
 * wait, or a new key not stored yet). *wake when a sleeper should look
 * again: a key entered the queue, or the earliest ready time moved.
 */
static int add_locked(shmq *q, const struct wq_add_req *r, uint32_t hash, uint64_t now,
                      bool *wake)
{
    struct wq_hdr *h = q->hdr;
    if (WQ_UNLIKELY(h->shutdown) && !r->published)
        return -ESHUTDOWN;
    uint32_t idx = wq__table_lookup(q, r->key, r->len, hash);
    if (WQ_UNLIKELY(idx == WQ_CORRUPT))
        return -EBADMSG;
    int rc;
    bool fresh = idx == WQ_NIL;
    if (!fresh)
        hint_put(q, idx, hash);
    /* The common case first: a plain add of a key that is already dirty
       changes nothing but a counter (and, in fair mode, a priority). */
    if (!fresh && !r->delayed &&
        (wq__entry(q, idx)->state & (WQ_ST_DIRTY | WQ_ST_STORING))) {
        struct wq_entry *e = wq__entry(q, idx);
        h->coalesced_total++;
        if (e->state & WQ_ST_DIRTY) {
            if (!q->fair)
                return 1;
            wq__mut_begin(q);
            return wq__mut_end(q, wq__fair_prio(q, idx, r->priority, false)) < 0 ? -EBADMSG : 1;
        }
        /* A new key waiting for its store commit: it becomes ready at once
           (a direct add of a waiting key queues it at once). */
        wq__mut_begin(q);
        if (q->fair)
            q->fx[idx].prio = q->fx[idx].prio > r->priority ? q->fx[idx].prio : r->priority;
        return wq__mut_end(q, wq__entry_delay(q, idx, now));
    }
    /* An idle key kept for its failure count or result comes back live
       without a new entry: room granted to lanes must stay theirs. */
    if (!fresh && h->lane_granted > 0) {
        uint16_t idle = wq__st(wq__entry(q, idx));
        if ((idle == WQ_ST_RETAINED || idle == 0) && !wq__lanes_room(q, 1)) {
            wq__errf("queue '%s': full: it holds %u live keys and %u published adds of its "
                     "capacity of %u", q->pub.name, h->live, h->lane_granted, q->capacity);
            return -ENOSPC;
        }
    }
    /* A key that starts to wait needs a heap slot (delay.c); a processing
       one has its own, and a dirty or waiting one starts no wait. */
    if (r->delayed && (fresh || !(wq__entry(q, idx)->state &
                                  (WQ_ST_PROCESSING | WQ_ST_WAITING | WQ_ST_DIRTY))) &&
        (rc = wq__delay_room(q, 1)) < 0)
        return rc;
    wq__mut_begin(q);
    if (r->delayed)
        WQ_STEP("delay.busy");
    else
        WQ_STEP("add.busy");
    if (fresh && (idx = wq__entry_new(q, r->key, r->len, hash, &rc)) == WQ_NIL)
        return wq__mut_end_unchanged(q, rc);   /* no room; an eviction it made is whole */
    if (fresh)
        hint_put(q, idx, hash);
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = fresh ? 0 : wq__st(e);
    uint64_t delay = r->after_ns;
    if (r->delayed) {
        if (r->rate_limited) {
            if (!fresh)
                wq__store_mark(q, idx);   /* its failure count is about to change */
            /* client-go's When(): the count rises even when merged; with
               an explicit delay too, the smaller one wins. */
            uint64_t d = wq__entry_when(q, idx, now);
            delay = delay && delay < d ? delay : d;
        }
        h->retries_total++;
        WQ_STEP("delay.counted");
    }
    /* Priorities: an idle or processing key was handed out (or never
       was): its add is a new add with its own priority, as
       controller-runtime's. A queued or waiting one keeps the higher. */
    if (q->fair) {
        if (fresh || st == WQ_ST_RETAINED || st == 0 || st == WQ_ST_PROCESSING)
            q->fx[idx].prio = r->priority;
        else if ((rc = wq__fair_prio(q, idx, r->priority, false)) < 0)
            return rc;
    }
    if (st & WQ_ST_DIRTY) {   /* already going to be handed out */
        h->coalesced_total++;
        return wq__mut_end(q, 1);
    }
    bool queued = false;
    if (delay == 0) {   /* an add now (client-go: AddAfter(0) is Add) */
        if (fresh) {
            e->t_b = now;
            rc = wq__entry_commit_new(q, idx, WQ_ST_DIRTY | WQ_ST_QUEUED, &queued);
        } else if (st == WQ_ST_STORING) {
            rc = wq__entry_delay(q, idx, now);   /* merged: ready at once */
        } else {
            rc = wq__entry_mark_dirty(q, idx, now, &queued);
        }
        if (rc < 0)
            return rc;   /* busy stays set: the next locker repairs */
        if (rc == 1)
            h->coalesced_total++;
        *wake = queued;
        return wq__mut_end(q, rc);
    }
    uint64_t ready = now + delay < now ? UINT64_MAX : now + delay;
    uint64_t top = wq__next_ready(q);
    if (fresh) {
        e->t_b = ready;
        rc = wq__entry_commit_new(q, idx, WQ_ST_WAITING, &queued);
    } else {
        rc = wq__entry_delay(q, idx, ready);
    }
    if (rc < 0)
        return rc;
    WQ_STEP("delay.heap");
    if (rc == 1)
        h->coalesced_total++;
    *wake = top == 0 || ready < top;
    return wq__mut_end(q, rc);
}

/* One key, any kind of add: lock, add, make room and retry, epilogue.
   wq_add_publish's locked way (r->take_lane) has made the lock-free
   tries already, and takes a lane for its next adds. */
static int add_hashed(shmq *q, const struct wq_add_req *r, uint32_t hash)
{
    if (q->hints && !r->delayed && !r->take_lane && add_fast(q, r->key, r->len, hash))
        return 1;
    /* The index slot is a likely cache miss: start it while we lock. */
    wq__table_prefetch(q, hash);
    uint64_t now = r->delayed ? wq__now_mono() : wq__metrics_now(q);
    int rc;
    uint32_t drops;
    for (int tries = 0;; tries++) {
        if ((rc = wq__lock(q)) < 0)
            return rc;
        bool wake = false;
        rc = add_locked(q, r, hash, now, &wake);
        if (rc >= 0 && r->take_lane)
            wq__lanes_take(q);
        drops = q->hdr->storing_drops;
        if (wake)
            wq__wake_getters(q, 1);
        wq__unlock(q);
        if (rc != -WQ_EFLUSH)
            break;
        int room = wq__store_make_room(q, tries);
        if (room < 0)
            return room;
    }
    /* A coalesced add made nothing new: nothing of ours to undo, and the
       key's own adder makes it durable. */
    struct iovec key = { (void *)r->key, r->len };
    return wq__store_finish_add(q, &key, 1, &key, rc == 0 ? 1 : 0, drops, rc);
}

static int add_call(shmq *q, const struct wq_add_req *r)
{
    return add_hashed(q, r, wq__hash(q->seed, r->key, r->len));
}

int wq__shm_add(wq *pub, const struct wq_add_req *r)
{
    return add_call(wq__shm(pub), r);
}

/*
 * Lock held, just acquired (lock.c): apply the adds published to lanes
 * (lanes.c), each lane in its order, each add through add_locked. A
 * holder that dies between an add and the head store that retires it
 * leaves hdr->lmark naming it, with the add and coalesce counts before
 * it: if those moved, the add was made (repair settled a committed one
 * before we got here) and is only retired now, so it counts once.
 * An add that fails (a damaged region, or no room after all) stays in
 * its lane, which stays pending: the locker after the repair, or after
 * room was made, applies it. Nothing published is dropped.
 */
void wq__queue_apply_lanes(shmq *q)
{
    struct wq_hdr *h = q->hdr;
    /* Bits past the last lane are damage (found by the fuzzer, reading
       past the lanes): a hint word, so they are dropped with the rest. */
    uint32_t bits = __atomic_exchange_n(&h->lanes_pending, 0, __ATOMIC_SEQ_CST) &
                    ((1u << WQ_LANES) - 1);
    if (!q->lanes || !h->lanes_grown)
        return;
    uint64_t now = q->metrics ? wq__now_mono() : 0;
    unsigned char key[WQ_LANE_KEY];
    uint32_t max = wq__lanes_key_max(q);
    for (uint32_t l = 0; bits; l++, bits >>= 1) {
        if (!(bits & 1))
            continue;
        struct wq_lane_slot *s;
        uint32_t pos;
        for (;;) {
            if (!(s = wq__lanes_next(q, l, &pos))) {
                if (h->corrupt)
                    break;
                wq_fence_full();   /* head stored, then tail read again */
                if (!(s = wq__lanes_next(q, l, &pos)))
                    break;
            }
            uint32_t len = s->len;
            uint64_t t = s->t_add;
            if (len == 0 || len > max) {
                /* A publication is whole: this is damage. Dropped (it
                   names no key) and flagged; wq_check names it. */
                wq__region_mark_corrupt(q);
                wq__lanes_advance(q, l);
                continue;
            }
            memcpy(key, s->key, len);
            uint32_t hash = wq__hash(q->seed, key, len);
            uint64_t mark = (uint64_t)(l + 1) << 32 | pos;
            uint64_t sum = h->adds_total + h->coalesced_total;
            /* Its room is its own now (entry.c counts the rest as live). */
            if (h->lane_granted > 0)
                h->lane_granted--;
            if (h->lmark != mark || h->lmark_sum == sum) {
                h->lmark_sum = sum;
                wq_step_fence();
                h->lmark = mark;
                struct wq_add_req r = { .key = key, .len = len, .published = true };
                bool wake = false;
                int rc = wq__region_broken(q) ? -EBADMSG
                       : add_locked(q, &r, hash, t && t <= now ? t : now, &wake);
                if (wake)
                    wq__wake_getters(q, 1);
                if (rc < 0) {
                    /* Not made: whoever applies it next must not take
                       the counts that move meanwhile for its own. */
                    h->lmark = 0;
                    h->lane_granted++;   /* still the lane's */
                    break;
                }
                WQ_STEP("lanes.applied");
                /* add_locked left where the key is in our hints: the
                   owner's, when it reuses the slot (lanes.c). */
                uint64_t hint = q->hints ? wq__hint_get(q, hash) : 0;
                wq_store_relaxed(&s->entry, hint ? (uint32_t)hint : WQ_NIL);
            }
            wq__lanes_advance(q, l);
        }
        if (s || h->corrupt || h->busy)   /* stopped early: try again */
            __atomic_fetch_or(&h->lanes_pending, 1u << l, __ATOMIC_SEQ_CST);
        else
            wq__lanes_grant(q, l);
    }
}

/*
 * wq_add_publish: the coalesced add without the lock, else a lane, else
 * the locked add, which also takes a lane for this handle (and grants it
 * room) for the next ones. 1 only when the add is known to coalesce.
 */
int wq__shm_add_publish(wq *pub, const void *key, size_t len)
{
    shmq *q = wq__shm(pub);
    struct wq_add_req r = { .key = key, .len = len };
    if (!q->lanes)
        return add_call(q, &r);   /* fair mode, a store: wq_add */
    uint32_t hash = wq__hash(q->seed, key, len);
    if (q->hints && add_fast(q, key, len, hash))
        return 1;
    if (!wq_load_relaxed(&q->hdr->shutdown) &&
        wq_load_relaxed(&q->forkgen) == wq_load_relaxed(&wq__fork_gen)) {
        uint64_t now = wq__metrics_now(q);
        int rc = wq__lanes_publish(q, key, (uint32_t)len, hash, now);
        if (rc == -ESTALE)   /* a fresh hint for this key */
            rc = add_fast(q, key, len, hash) ? 1
                                              : wq__lanes_publish(q, key, (uint32_t)len, hash, now);
        if (rc >= 0)
            return rc;
    }
    r.take_lane = true;
    return add_hashed(q, &r, hash);
}

/*
 * Locality for queues larger than the caches. The done of a key handed
 * out looks it up in the index: a random slot, at millions of keys a
 * cache miss and a TLB miss, and a prefetch of it stalls for the page
 * walk as a load would. So once per WQ_PREFETCH_BATCH hand-outs the
 * index slots of that many keys at the front are prefetched together,
 * where their walks overlap, and the entries of the batch after, whose
 * hashes the next round reads. Measured on the 2-vCPU VM (wqbench
 * scale): one slot at a time gained 25% at 1e7 keys, batches of 16 47%,
 * of 64 less than 16. pf_ahead is this handle's hint only: keys that
 * other processes take meanwhile just make a prefetch useless.
 */
enum { WQ_PREFETCH_BATCH = 16 };

static void prefetch_front(shmq *q)
{
    if (q->pf_ahead > 0) {
        q->pf_ahead--;
        return;
    }
    uint32_t k = 0;
    for (uint32_t idx; k < WQ_PREFETCH_BATCH && (idx = wq__ring_peek(q, k)) != WQ_NIL; k++)
        wq__table_prefetch(q, wq__entry(q, idx)->hash);
    for (uint32_t j = k, idx; j < 2 * k && (idx = wq__ring_peek(q, j)) != WQ_NIL; j++)
        __builtin_prefetch(wq__entry(q, idx), 0, 3);
    q->pf_ahead = k > 0 ? k - 1 : 0;
}

/* The same for a batch of adds, keys [from, to) of it: the first
   WQ_PREFETCH_BATCH before locking, then each key that many ahead of the
   one being added. Gated on the index's size, not on nent: it runs
   before the lock too. */
static void prefetch_keys(const shmq *q, const uint32_t *hashes, size_t from, size_t to,
                          size_t n)
{
    if ((uint32_t)wq_load_relaxed(&q->index_at) < WQ_PREFETCH_MIN)
        return;
    for (size_t i = from; i < to && i < n; i++)
        wq__table_prefetch(q, hashes[i]);
}

/* Exact number of distinct keys in the batch that have no entry yet. */
static int count_new(shmq *q, const struct iovec *keys, const uint32_t *hashes, size_t n,
                     size_t *out)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    uint32_t *seen = calloc(cap, sizeof *seen);   /* batch index + 1 */
    if (!seen)
        return -ENOMEM;
    size_t fresh = 0;
    for (size_t i = 0; i < n; i++) {
        prefetch_keys(q, hashes, i + WQ_PREFETCH_BATCH, i + WQ_PREFETCH_BATCH + 1, n);
        uint32_t idx = wq__table_lookup(q, keys[i].iov_base, keys[i].iov_len, hashes[i]);
        if (idx == WQ_CORRUPT) {
            free(seen);
            return -EBADMSG;
        }
        if (idx != WQ_NIL)
            continue;
        size_t s = hashes[i] & (cap - 1);
        for (;; s = (s + 1) & (cap - 1)) {
            if (seen[s] == 0) {
                seen[s] = (uint32_t)i + 1;
                fresh++;
                break;
            }
            const struct iovec *o = &keys[seen[s] - 1];
            if (hashes[seen[s] - 1] == hashes[i] && o->iov_len == keys[i].iov_len &&
                memcmp(o->iov_base, keys[i].iov_base, o->iov_len) == 0)
                break;
        }
    }
    free(seen);
    *out = fresh;
    return 0;
}

/*
 * Lock held: room for the batch's new keys, or none of it is added.
 * -ENOSPC when they exceed capacity; -WQ_EFLUSH (after turning idle keys
 * into zombies if needed) when the room is held by removals the store
 * must write first: the caller flushes and tries again.
 */
static int batch_room(shmq *q, const struct iovec *keys, const uint32_t *hashes, size_t n)
{
    struct wq_hdr *h = q->hdr;
    (void)wq__lanes_room(q, n);   /* lanes' unused room back if short */
    uint64_t held_live = (uint64_t)h->live + h->lane_granted;
    size_t room = held_live < q->capacity ? q->capacity - (size_t)held_live : 0;
    size_t free_now = wq__entry_free_count(q);
    /* Pages for the entries the free list cannot give are reserved first,
       so the batch never stops half way for want of them: for n (cheap,
       at most n too many), or, if that is refused, for its new keys. */
    uint64_t held = (uint64_t)h->live + h->zombies + h->retained;
    size_t listed = h->e_fresh > held ? h->e_fresh - (uint32_t)held : 0;
    size_t fresh = n;
    int grown = 0;
    /* And room in the key arena for every long key (at most the batch's
       coalesced ones too many), for the same reason. */
    uint64_t kneed = 0;
    for (size_t i = 0; i < n; i++)
        kneed += WQ_GRAINS(wq__key_tail((uint32_t)keys[i].iov_len));
    if (kneed > 0 && (grown = wq__keys_room(q, 0, kneed)) < 0)
        return grown;
    if (n > listed) {
        uint64_t want = (uint64_t)h->e_fresh + (n - listed);
        grown = wq__entry_room(q, want < q->capacity ? (uint32_t)want : q->capacity);
    }
    if (n <= free_now && grown == 0)
        return 0;   /* fits whatever the keys are */
    int rc = count_new(q, keys, hashes, n, &fresh);
    if (rc < 0)
        return rc;
    if (grown < 0 && fresh > listed) {
        uint64_t want = (uint64_t)h->e_fresh + (fresh - listed);
        rc = wq__entry_room(q, want < q->capacity ? (uint32_t)want : q->capacity);
        if (rc < 0)
            return rc;
    }
    if (n <= free_now)
        return 0;
    if (fresh > room) {
        wq__errf("queue '%s': full: it holds %u live keys of its capacity %u, the batch "
                 "has %zu new", q->pub.name, h->live, q->capacity, fresh);
        return -ENOSPC;
    }
    if (fresh <= free_now || !q->g.has_store)
        return 0;   /* without a store, idle keys are evicted in place */
    wq__mut_begin(q);
    rc = wq__mut_end(q, wq__entry_evict_room(q, (uint32_t)fresh));
    return rc < 0 ? rc : -WQ_EFLUSH;
}

int wq__shm_add_many(wq *pub, const struct iovec *keys, size_t n)
{
    shmq *q = wq__shm(pub);
    uint32_t stack_h[64], *hashes = stack_h;
    struct iovec stack_m[64], *mine = stack_m;   /* the keys this batch added */
    size_t nmine = 0;
    uint32_t drops = 0;
    int rc;
    if (n == 0)
        return 0;
    if (n > 64 && (!(hashes = malloc(n * sizeof *hashes)) ||
                   !(mine = malloc(n * sizeof *mine)))) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        hashes[i] = wq__hash(q->seed, keys[i].iov_base, keys[i].iov_len);
    prefetch_keys(q, hashes, 0, WQ_PREFETCH_BATCH, n);
    uint64_t now = wq__metrics_now(q);
    for (int tries = 0;; tries++) {
        if ((rc = wq__lock(q)) < 0)
            goto out;
        if (q->hdr->shutdown) {
            rc = -ESHUTDOWN;
        } else if ((rc = batch_room(q, keys, hashes, n)) == 0) {
            int coalesced = 0, queued_n = 0;
            nmine = 0;
            for (size_t i = 0; i < n && rc >= 0; i++) {
                struct wq_add_req r = { .key = keys[i].iov_base, .len = keys[i].iov_len };
                bool queued = false;
                prefetch_keys(q, hashes, i + WQ_PREFETCH_BATCH, i + WQ_PREFETCH_BATCH + 1, n);
                rc = wq__region_broken(q) ? -EBADMSG : add_locked(q, &r, hashes[i], now, &queued);
                coalesced += rc > 0;
                queued_n += queued;
                if (rc == 0)
                    mine[nmine++] = keys[i];
            }
            if (rc >= 0)
                rc = coalesced;
            wq__wake_getters(q, queued_n);
        }
        drops = q->hdr->storing_drops;
        wq__unlock(q);
        if (rc != -WQ_EFLUSH)
            break;
        int room = wq__store_make_room(q, tries);
        if (room < 0) {
            rc = room;
            goto out;
        }
    }
    rc = wq__store_finish_add(q, keys, n, mine, nmine, drops, rc);
out:
    if (hashes != stack_h)
        free(hashes);
    if (mine != stack_m)
        free(mine);
    return rc;
}

/* Lock held. Pop the front into buf: its length, or -EAGAIN if empty,
   -ENOBUFS (nothing popped) if it is longer than cap bytes.
   Ready waiting keys are queued first. `now` is a clock reading the
   caller already made (before locking, to keep it out of the critical
   section), or 0. */
static int get_locked(shmq *q, void *buf, size_t cap, uint64_t now)
{
    struct wq_hdr *h = q->hdr;
    if (now == 0 && (q->metrics || h->heap_count > 0))
        now = wq__now_mono();
    if (h->heap_count > 0)
        wq__promote(q, now);
    uint32_t idx = q->fair ? wq__fair_front(q) : wq__ring_front(q);
    if (idx == WQ_NIL)
        return -EAGAIN;
    if (WQ_UNLIKELY(idx == WQ_CORRUPT))
        return wq__region_mark_corrupt(q);
    struct wq_entry *e = wq__entry(q, idx);
    uint32_t len = e->keylen;
    const unsigned char *r = wq__key_rest(q, e);
    if (WQ_UNLIKELY(!(e->state & WQ_ST_QUEUED) || !r))
        return wq__region_mark_corrupt(q);
    if (len > cap)
        return -ENOBUFS;
    wq__key_copy(e, r, buf);
    if (!q->fair && q->nent >= WQ_PREFETCH_MIN)
        prefetch_front(q);
    wq__mut_begin(q);
    WQ_STEP("get.busy");
    /* It fails only before its commit: no room for its run record. */
    int rc = wq__mut_end_unchanged(q, wq__entry_hand_out(q, idx, now));
    return rc < 0 ? rc : (int)len;
}

/* Lock held; done of a key: -ENOENT unless it is processing. */
static int done_locked(shmq *q, const void *key, size_t len, uint32_t hash, uint64_t now,
                       const struct wq_outcome *o, bool *queued)
{
    uint32_t idx = wq__table_lookup(q, key, len, hash);
    if (idx == WQ_NIL)
        return -ENOENT;
    if (WQ_UNLIKELY(idx == WQ_CORRUPT))
        return -EBADMSG;
    if (!(wq__st(wq__entry(q, idx)) & WQ_ST_PROCESSING))
        return -ENOENT;
    int rc;
    if (o && o->record && (rc = wq__result_room(q, idx, o->message)) < 0)
        return rc;   /* still processing: the caller may try again */
    wq__mut_begin(q);
    WQ_STEP("done.busy");
    return wq__mut_end(q, wq__entry_done(q, idx, now, o, queued));
}

/*
 * Lock held on entry, released on return: hand out up to n keys (at least
 * one) or sleep until one is queued. The keys are packed into buf (size
 * bytes, at least max_key_len) and keys[i] set to each; one that would
 * not fit in what is left stays queued. Returns how many, or an error as
 * wq_get.
 */
static int get_wait(shmq *q, char *buf, size_t size, struct iovec *keys, size_t n,
                    uint64_t deadline, uint64_t now)
{
    struct wq_hdr *h = q->hdr;
    for (;; now = 0) {
        int got = get_locked(q, buf, size, now);
        if (got > 0) {
            size_t i = 0, used = 0;
            do {
                keys[i++] = (struct iovec){ buf + used, (size_t)got };
                used += (size_t)got;
            } while (i < n && (got = get_locked(q, buf + used, size - used, now)) > 0);
            /* A corrupt front after some keys were handed out: they are
               the caller's; the next locker repairs. */
            if (wq__queued(q) > 0)
                wq__wake_getters(q, 1);   /* pass it on */
            wq__unlock(q);
            wq_fence_after_unlock();   /* the hand-out before the caller's reads: add_fast */
            return (int)i;
        }
        if (got == -EAGAIN && h->shutdown)
            got = -ESHUTDOWN;
        else if (got == -EAGAIN && wq__procs_reap(q) > 0)
            continue;   /* a dead holder's key may be first in line now */
        if (got != -EAGAIN || deadline == 0) {
            wq__unlock(q);
            return got;
        }
        now = wq__now_mono();
        if (now >= deadline) {
            wq__unlock(q);
            return -ETIMEDOUT;
        }
        uint64_t until = now + WQ_REAP_INTERVAL_NS;
        uint64_t ready = wq__next_ready(q);   /* sleep no longer than a delay */
        if (ready && ready < until)
            until = ready > now ? ready : now + 1;
        int rc = wq__sleep(q, &h->wake_seq, deadline, until, true);
        if (rc < 0)
            return rc;
    }
}

/* The length of get_wait's one key, or its error. */
static int one_key(int rc, const struct iovec *k)
{
    return rc > 0 ? (int)k->iov_len : rc;
}

int wq__shm_get_many(wq *pub, void *buf, size_t size, struct iovec *keys, size_t n,
                     uint64_t deadline)
{
    shmq *q = wq__shm(pub);
    wq__lock_enter(q);
    uint64_t now = wq__metrics_now(q);
    int rc = wq__lock_consumer(q);
    if (rc < 0)
        return rc;
    wq__procs_maybe_reap(q);
    rc = get_wait(q, buf, size, keys, n, deadline, now);
    if (WQ_UNLIKELY(q->g.has_store))
        wq__store_after(q);   /* crash requeues, periodic snapshots */
    wq__lock_leave(q);
    return rc;
}

int wq__shm_get(wq *pub, void *buf, uint64_t deadline)
{
    struct iovec k;
    return one_key(wq__shm_get_many(pub, buf, pub->max_key_len, &k, 1, deadline), &k);
}

int wq__shm_done(wq *pub, const void *key, size_t len, const struct wq_outcome *o)
{
    shmq *q = wq__shm(pub);
    wq__lock_enter(q);
    uint32_t hash = wq__hash(q->seed, key, len);
    wq__table_prefetch(q, hash);   /* likely a miss: overlap it with locking */
    uint64_t now = wq__metrics_now(q);
    int rc = wq__lock_consumer(q);
    if (rc < 0)
        return rc;
    bool queued = false;
    rc = done_locked(q, key, len, hash, now, o, &queued);
    if (queued)
        wq__wake_getters(q, 1);
    wq__unlock(q);
    /* The done is applied; a removal the store cannot take now stays
       listed and is written by a later flush (wq.h, Persistence). */
    if (rc >= 0 && WQ_UNLIKELY(q->g.has_store))
        wq__store_after(q);
    wq__lock_leave(q);
    return rc;
}

/* Keys per lock acquisition of wq__shm_done_many: bounds both the hashes
   kept on the stack and how long other processes wait for the lock. */
#define DONE_CHUNK 64

int wq__shm_done_many(wq *pub, const struct iovec *keys, size_t n)
{
    shmq *q = wq__shm(pub);
    uint32_t hashes[DONE_CHUNK];
    int done = 0, rc = 0;
    wq__lock_enter(q);
    for (size_t at = 0; at < n && rc >= 0; at += DONE_CHUNK) {
        size_t m = n - at < DONE_CHUNK ? n - at : DONE_CHUNK;
        for (size_t i = 0; i < m; i++)
            hashes[i] = wq__hash(q->seed, keys[at + i].iov_base, keys[at + i].iov_len);
        uint64_t now = wq__metrics_now(q);
        if ((rc = wq__lock_consumer(q)) < 0)
            break;
        int queued_n = 0;
        for (size_t i = 0; i < m; i++) {
            bool queued = false;
            rc = done_locked(q, keys[at + i].iov_base, keys[at + i].iov_len, hashes[i], now,
                             NULL, &queued);
            if (rc == -ENOENT)
                continue;   /* not processing: skipped, as wq_done leaves it */
            if (rc < 0)
                break;
            done++;
            queued_n += queued;
        }
        wq__wake_getters(q, queued_n);
        wq__unlock(q);
        if (WQ_UNLIKELY(q->g.has_store))
            wq__store_after(q);
        if (rc == -ENOENT)
            rc = 0;
    }
    wq__lock_leave(q);
    return rc < 0 ? rc : done;
}

int wq__shm_done_get(wq *pub, const void *key, size_t len, const struct wq_outcome *o,
                     void *buf, uint64_t deadline)
{
    shmq *q = wq__shm(pub);
    wq__lock_enter(q);
    uint32_t hash = wq__hash(q->seed, key, len);
    uint64_t now = wq__metrics_now(q);   /* one reading serves both halves */
    int rc = wq__lock_consumer(q);
    if (rc < 0)
        return rc;
    bool queued = false;
    rc = done_locked(q, key, len, hash, now, o, &queued);
    if (rc < 0) {
        wq__unlock(q);
        return rc;
    }
    /* A key we just requeued may be handed straight back to us; any
       sleeper is woken by get_wait's pass-on if more remain. */
    wq__procs_maybe_reap(q);
    struct iovec k;
    rc = one_key(get_wait(q, buf, q->max_key_len, &k, 1, deadline, now), &k);
    /* The done is applied. A get that then finds no room for its run
       record (entry.c: at once it takes the block the done gave back,
       but after a sleep another may have taken it) must not answer
       -ENOSPC or -ENOMEM, which say the done was not (wq.h): it is "no
       key", and wq_last_error says why. */
    if (rc == -ENOSPC || rc == -ENOMEM)
        rc = -EAGAIN;
    /* The done's removal: one the store cannot take now stays listed and
       is written by a later flush, as after wq_done. Not returned: the
       done is applied, and a key may have been handed out into buf. */
    if (WQ_UNLIKELY(q->g.has_store))
        wq__store_after(q);
    wq__lock_leave(q);
    return rc;
}

/* Queued keys. Lock-free unless a key waits: then the ready ones are
   moved to the queue first, so a key whose delay is over counts (client-
   go's delaying queue tests poll Len that way). */
int wq__shm_len(wq *pub)
{
    shmq *q = wq__shm(pub);
    struct wq_hdr *h = q->hdr;
    bool waiting = wq_load_relaxed(&h->heap_count) > 0 && !wq_load_relaxed(&h->shutdown);
    /* Published adds count once applied: the lock applies them. */
    if (waiting || wq_load_relaxed(&h->lanes_pending) != 0) {
        uint64_t now = wq__now_mono();
        int rc = wq__lock_look(q);
        if (rc < 0)
            return rc;
        if (waiting)
            wq__promote(q, now);
        wq__unlock(q);
    }
    uint32_t n = wq__queued(q);
    return n <= q->capacity ? (int)n : -EBADMSG;
}

/* Lock held: the shutdown flag and its consequences: every sleeper looks
   again; waiting keys are dropped (client-go's waiting loop stops), but
   with a store they stay, waiting and not fired while shut down, so the
   region agrees with the store that keeps them (wq.h). */
static void shut(shmq *q)
{
    wq_store_relaxed(&q->hdr->shutdown, 1);
    wq__lanes_revoke(q);   /* later publications take the lock: -ESHUTDOWN */
    if (!q->g.has_store)
        wq__drop_waiting(q);
    wq__wake_all(q);
}

int wq__shm_resume(wq *pub)
{
    shmq *q = wq__shm(pub);
    int rc = wq__lock_look(q);
    if (rc < 0)
        return rc;
    wq_store_relaxed(&q->hdr->shutdown, 0);
    q->hdr->shutdown_calls++;   /* a drain still waiting ends (-ECANCELED) */
    wq__wake_all(q);            /* waits that came due fire at the next get */
    wq__unlock(q);
    return 0;
}

int wq__shm_shutdown(wq *pub)
{
    shmq *q = wq__shm(pub);
    int rc = wq__lock_look(q);
    if (rc < 0)
        return rc;
    q->hdr->shutdown_calls++;
    shut(q);
    wq__unlock(q);
    return 0;
}

int wq__shm_drain(wq *pub, uint64_t deadline)
{
    shmq *q = wq__shm(pub);
    int rc = wq__lock_look(q);
    if (rc < 0)
        return rc;
    struct wq_hdr *h = q->hdr;
    shut(q);
    uint32_t calls = h->shutdown_calls;
    for (;;) {
        if (h->processing == 0) {
            rc = 0;
            break;
        }
        if (h->shutdown_calls != calls) {
            rc = -ECANCELED;
            break;
        }
        if (wq__procs_reap(q) > 0)
            continue;
        uint64_t now = wq__now_mono();
        if (now >= deadline) {
            rc = -ETIMEDOUT;
            break;
        }
        if ((rc = wq__sleep(q, &h->idle_seq, deadline, now + WQ_REAP_INTERVAL_NS,
                            false)) < 0)
            return rc;
    }
    wq__unlock(q);
    return rc;
}

bool wq__shm_shutting_down(wq *pub)
{
    return wq_load_relaxed(&wq__shm(pub)->hdr->shutdown) != 0;
}
