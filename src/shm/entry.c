/*
 * entry.c - the entry state machine: every change of an entry's state is
 * a named function here, and nowhere else.
 *
 * States (layout.h, struct wq_entry.state):
 *
 *   free ──new──▶ QUEUED (DIRTY|QUEUED) ──hand_out──▶ PROCESSING
 *     │             ▲   ▲                              │   │
 *     │    mark_dirty   stored                  done   │   │ mark_dirty
 *     │             │   │                              ▼   ▼
 *     ├──new──▶ WAITING ◀──delay── RETAINED   PROCESSING|DIRTY
 *     │                              ▲                 (|WAITING while
 *     └──new──▶ STORING              └──done (failures or a result)
 *                                       a delayed add waits for its time)
 *
 * and with a store, SDIRTY (the store record is stale; the entry is in
 * the store queue) on top of any state, STORING (a new key invisible
 * until the store has it) and a zombie (SDIRTY alone: gone from the
 * queue, its store record still to be removed).
 *
 * Each transition does, in this order and under one busy bracket that
 * its caller opened (mutate.h): the store mark (before the commit it
 * describes, so a change the store has not seen is always listed), the
 * fair-mode tag, the one state store that commits, then what follows the
 * state: index, ring or heap, counters (live, processing, retained, failing,
 * zombies, held, the metrics sum, adds_total through the pending record).
 * Errors: a transition fails (-EBADMSG, busy stays set) only before its
 * commit, and then nothing of it happened. After its commit it always
 * succeeds: the operation took effect, so its caller must hear so (a key
 * handed out is the caller's; an add that committed is an add). A
 * structure found corrupt after the commit is flagged (broken(): the
 * next locker rebuilds everything from the entries) and the transition
 * finishes its bookkeeping; callers that apply many transitions under one
 * lock stop at such a flag (wq__region_broken).
 *
 * The WQ_STEP names are the crash points the crash test sweeps; each
 * lies either before its operation's commit (".busy", ".alloc", ".key",
 * ".owner", "heap.remove", "result.fill", "fair.tag") or after it.
 *
 * Also here: the free-entry list (a LIFO through entry->link: the most
 * recently freed entry, still in cache, is reused first) and eviction of
 * idle entries when it is empty; the delay heap's count; the queue's
 * container (the ring, or fair mode's heaps).
 */
#include "shm.h"

/* After a commit: a follow-up structure was found corrupt. The operation
   stands; the region is rebuilt by the next locker (lock.c). */
static void broken(shmq *q, int rc)
{
    if (WQ_UNLIKELY(rc < 0))
        q->hdr->corrupt = 1;
}

/* A release store: what the transition wrote before (a new key's bytes
   above all) is visible before the state that publishes it, to the
   lock-free coalesced add (queue.c) as to the lock holders. */
static inline void set_state(struct wq_entry *e, uint16_t st)
{
    wq_store_release(&e->state, (uint16_t)(st | (e->state & WQ_ST_SDIRTY)));   /* keeps the store bit */
}

/*
 * Lock and busy held: e's key is about to be written (a new key) or
 * given back (a free entry). The entry's seq takes a new number first.
 * This is what lets queue.c's coalesced add read an entry without the
 * lock: a reader that finds the same seq before and after reading the
 * key read the key of one incarnation. A state that leaves the key
 * (0, or a zombie's) is stored before this, and the key bytes after.
 */
void wq__entry_renew(shmq *q, struct wq_entry *e)
{
    wq_fence_stores();
    wq_store_relaxed(&e->seq, q->hdr->seq_next++);
    wq_fence_stores();
}

/* ------------------------------------------------------------------ */
/* Where entries wait: the queue's container, the delay heap            */
/* ------------------------------------------------------------------ */

static inline int enqueue(shmq *q, uint32_t idx)
{
    return q->fair ? wq__fair_push(q, idx) : wq__ring_push(q, idx);
}

static int delay_push(shmq *q, uint32_t idx)
{
    uint32_t n = q->hdr->heap_count;
    int rc = wq__heap_insert(q, WQ_HEAP_DELAY, n, idx);
    if (rc < 0)
        return rc;
    WQ_STEP("heap.push");
    wq_store_relaxed(&q->hdr->heap_count, n + 1);
    return 0;
}

static int delay_remove(shmq *q, uint32_t idx)
{
    uint32_t n = q->hdr->heap_count;
    int rc = wq__heap_delete(q, WQ_HEAP_DELAY, n, idx);
    if (rc < 0)
        return rc;
    wq_store_relaxed(&q->hdr->heap_count, n - 1);
    WQ_STEP("heap.remove");
    return 0;
}

static inline bool sync_adds(const shmq *q)
{
    return q->g.has_store && q->g.durability != WQ_DURABLE_NONE && !q->restoring;
}

/* An entry becomes RETAINED (idle, kept for a failure count or a result),
   or stops being one: the counters follow (wq_stats' failing counts only
   the ones with a failure count). */
static void retain(shmq *q, const struct wq_entry *e)
{
    q->hdr->retained++;
    if (e->failures)
        q->hdr->failing++;
}

static void unretain(shmq *q, const struct wq_entry *e)
{
    q->hdr->retained--;
    if (e->failures)
        q->hdr->failing--;
}

static void held_dec(shmq *q, const struct wq_run *r)
{
    if (r->owner < q->max_procs) {
        struct wq_proc *p = &q->procs[r->owner];
        if (wq__gen16(p->gen) == r->owner_gen && p->held > 0)
            p->held--;
    }
}

/* After the commit that ends PROCESSING: the run record's block goes
   back. A holder killed before this leaves it named by no processing
   entry, free again at the next repair (keys.c). */
static void run_end(shmq *q, struct wq_entry *e)
{
    wq__keys_give(q, e->run, sizeof(struct wq_run));   /* checks the block */
    e->run = WQ_NIL;
}

/* ------------------------------------------------------------------ */
/* The free list and eviction                                          */
/* ------------------------------------------------------------------ */

static void free_push(shmq *q, uint32_t idx)
{
    struct wq_entry *e = wq__entry(q, idx);
    wq__entry_renew(q, e);
    wq__keys_drop(q, e);
    e->link = q->hdr->free_head;
    WQ_STEP("table.free.link");
    q->hdr->free_head = idx;
}

/* No free entry while live < capacity means some entries are RETAINED
   (idle, kept for a failure count or a result) or zombies: drop the
   first retained one the clock hand finds. The hand persists, so over
   time eviction goes round the table, roughly oldest first. */
static uint32_t evict_retained(shmq *q)
{
    struct wq_hdr *h = q->hdr;
    if (h->retained == 0)
        return WQ_NIL;
    uint32_t used = wq__entries_used(q);
    uint32_t i = h->evict_hand < used ? h->evict_hand : 0;
    for (uint32_t n = 0; n < used; n++, i = i + 1 == used ? 0 : i + 1) {
        struct wq_entry *e = wq__entry(q, i);
        if (wq__st(e) != WQ_ST_RETAINED)
            continue;
        h->evict_hand = i + 1;
        if (q->g.has_store) {
            /* Its record must leave the store first: a zombie now, freed
               by the flush the caller runs before trying again. */
            int rc = wq__entry_release(q, i, true);
            return rc < 0 ? WQ_CORRUPT : WQ_EVICTING;
        }
        wq__result_drop(q, i);
        wq_store_release(&e->state, 0);   /* commit: its failure count is gone */
        WQ_STEP("evict.state");
        if (wq__table_remove(q, i, e->hash) < 0)
            return WQ_CORRUPT;
        WQ_STEP("evict.index");
        wq__entry_renew(q, e);
        wq__keys_drop(q, e);
        unretain(q, e);
        return i;
    }
    return WQ_CORRUPT;   /* retained > 0 but none found */
}

int wq__entry_room(shmq *q, uint32_t need)
{
    int rc = wq__region_grow_entries(q, need);
    if (rc == 0)
        rc = wq__table_grow(q, need);
    return rc < 0 || q->fair ? rc : wq__ring_grow(q, need);
}

/* A free entry: from the free list, else one never used (growing the
   region for it), else, when every entry has been used, an evicted idle
   one. *grow is the growth's error when the region could not grow. */
static uint32_t alloc(shmq *q, int *grow)
{
    struct wq_hdr *h = q->hdr;
    uint32_t idx = h->free_head;
    *grow = 0;
    if (idx == WQ_NIL) {
        uint32_t f = h->e_fresh;
        if (f >= q->capacity)
            return evict_retained(q);   /* full: idle keys make room */
        /* Short of pages is not full: nothing idle is dropped for it.
           Adds published to lanes keep the pages they may need
           (lanes.c): an add of ours never takes theirs. */
        uint64_t need = (uint64_t)f + 1 + h->lane_granted;
        if ((*grow = wq__entry_room(q, need < q->capacity ? (uint32_t)need : q->capacity)) < 0)
            return WQ_NIL;
        /* Lost if we die before the commit: repair finds it free (state
           0) below e_fresh and lists it. */
        h->e_fresh = f + 1;
        WQ_STEP("add.fresh");
        return f;
    }
    if (WQ_UNLIKELY(idx >= wq__entries_used(q)))
        return WQ_CORRUPT;
    struct wq_entry *e = wq__entry(q, idx);
    if (WQ_UNLIKELY(e->state != 0))
        return WQ_CORRUPT;
    q->hdr->free_head = e->link;
    return idx;
}

/* Entries a new key can take without flushing the store first. */
uint32_t wq__entry_free_count(const shmq *q)
{
    const struct wq_hdr *h = q->hdr;
    uint64_t used = (uint64_t)h->live + h->zombies + (q->g.has_store ? h->retained : 0) +
                    h->lane_granted;
    return used >= q->capacity ? 0 : q->capacity - (uint32_t)used;
}

/*
 * Lock and busy held, with a store: make `want` entries free for new keys
 * by turning idle (RETAINED) entries into zombies, which the caller's
 * flush then frees. Returns how many zombies exist now (>= 0), or
 * -EBADMSG.
 */
int wq__entry_evict_room(shmq *q, uint32_t want)
{
    WQ_ASSERT_MUTATING(q);
    while (wq__entry_free_count(q) + q->hdr->zombies < want && q->hdr->retained > 0) {
        uint32_t r = evict_retained(q);
        if (r == WQ_CORRUPT)
            return -EBADMSG;
    }
    return (int)q->hdr->zombies;
}

/* ------------------------------------------------------------------ */
/* New keys                                                            */
/* ------------------------------------------------------------------ */

/*
 * Lock and busy held. Take a free entry for a new key and write the key;
 * its state stays 0 (free) until wq__entry_commit_new. WQ_NIL with *err =
 * -ENOSPC when `capacity` keys are live or the key arena cannot take the
 * key, -EBADMSG on a corrupt free list,
 * and -WQ_EFLUSH when the only room is held by removals the store has not
 * written yet (the caller flushes and retries).
 */
uint32_t wq__entry_new(shmq *q, const void *key, size_t len, uint32_t hash, int *err)
{
    WQ_ASSERT_MUTATING(q);
    if (!wq__lanes_room(q, 1)) {   /* room granted to lanes counts as live */
        wq__errf("queue '%s': full: it holds its capacity of %u live keys", q->pub.name,
                 q->capacity);
        *err = -ENOSPC;
        return WQ_NIL;
    }
    int grow;
    uint32_t idx = alloc(q, &grow);
    if (idx == WQ_NIL || idx == WQ_CORRUPT || idx == WQ_EVICTING) {
        /* A region that cannot grow is full unless the store can free
           removed keys' entries. */
        bool flush = idx == WQ_EVICTING ||
                     (q->g.has_store && (grow == 0 || q->hdr->zombies > 0));
        *err = idx == WQ_CORRUPT ? -EBADMSG : flush ? -WQ_EFLUSH : grow < 0 ? grow : -ENOSPC;
        return WQ_NIL;
    }
    WQ_STEP("add.alloc");
    struct wq_entry *e = wq__entry(q, idx);
    e->hash = hash;
    e->failures = 0;
    e->rslot = WQ_NIL;
    wq__entry_renew(q, e);   /* also the add order */
    int rc = wq__keys_put(q, e, key, (uint32_t)len);
    if (rc < 0) {   /* no room for the key: the entry goes back, unused */
        free_push(q, idx);
        *err = rc;
        return WQ_NIL;
    }
    if (q->fair)
        q->fx[idx].prio = 0;
    WQ_STEP("add.key");
    return idx;
}

/*
 * Lock and busy held. Make a new entry live as QUEUED (DIRTY|QUEUED) or
 * WAITING; the caller set t_b (add time, or ready time). With PROCESS or
 * FSYNC durability (and not while restoring) it starts STORING instead:
 * invisible until stored (store.c). *queued when it entered the queue.
 */
int wq__entry_commit_new(shmq *q, uint32_t idx, uint16_t state, bool *queued)
{
    WQ_ASSERT_MUTATING(q);
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    bool storing = sync_adds(q);
    bool queue = (state & WQ_ST_QUEUED) && !storing;
    if (state & WQ_ST_QUEUED)
        wq__mut_pend(q, WQ_PEND_ADD, idx);
    if (storing && (state & WQ_ST_QUEUED))
        e->t_b = 0;   /* "ready at once" when it becomes visible */
    if (!q->restoring)
        wq__store_mark(q, idx);
    if (queue)
        wq__fair_dirty(q, idx);
    set_state(e, storing ? WQ_ST_STORING : state);   /* commit */
    WQ_STEP("add.state");
    if (storing)
        wq__store_sync_request(q);
    broken(q, wq__table_insert(q, idx, e->hash));
    WQ_STEP("add.index");
    if (queue)
        broken(q, enqueue(q, idx));
    else if (state == WQ_ST_WAITING && !storing)
        broken(q, delay_push(q, idx));
    WQ_STEP("add.ring");
    h->live++;
    if (state & WQ_ST_QUEUED) {
        h->adds_total++;
        WQ_STEP("add.counted");   /* counted, the record still armed */
        wq__mut_settled(q);
    }
    WQ_STEP("add.counters");
    *queued = queue;
    return 0;
}

/*
 * Restore only, in two steps: the restore visits the store's records in
 * the store's order (one pass through memory instead of a random walk)
 * and puts the keys in the queue afterwards, in first-add order. Nobody
 * can see the region meanwhile. A new entry becomes live as QUEUED,
 * indexed and counted, but not in the queue yet ...
 */
int wq__entry_restore_queued(shmq *q, uint32_t idx)
{
    WQ_ASSERT(q->restoring);
    struct wq_entry *e = wq__entry(q, idx);
    wq_store_release(&e->state, WQ_ST_DIRTY | WQ_ST_QUEUED);
    int rc = wq__table_insert(q, idx, e->hash);
    if (rc == 0) {
        q->hdr->live++;
        q->hdr->adds_total++;
    }
    return rc;
}

/* ... and enters the queue (fair mode: with its add order and tag given
   now, as an add would). */
int wq__entry_restore_enter(shmq *q, uint32_t idx)
{
    WQ_ASSERT(q->restoring);
    wq__fair_dirty(q, idx);
    return enqueue(q, idx);
}

/* Restore only: a new entry that is idle, kept for its failure count or
   its result (the caller recorded them). */
int wq__entry_restore_idle(shmq *q, uint32_t idx)
{
    WQ_ASSERT(q->restoring);
    struct wq_entry *e = wq__entry(q, idx);
    wq_store_release(&e->state, WQ_ST_RETAINED);
    int rc = wq__table_insert(q, idx, e->hash);
    if (rc == 0)
        retain(q, e);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Adds of keys that have an entry                                     */
/* ------------------------------------------------------------------ */

/*
 * Lock and busy held. The add of a key that has an entry and is not
 * dirty: waiting (leaves the heap), processing (marked dirty, queued at
 * its wq_done), retained, or a zombie awaiting its store removal (both
 * queued, or STORING with a store that adds synchronously). *queued when
 * it entered the queue.
 */
int wq__entry_mark_dirty(shmq *q, uint32_t idx, uint64_t now, bool *queued)
{
    WQ_ASSERT_MUTATING(q);
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = wq__st(e);
    int rc;
    if (st != WQ_ST_PROCESSING)   /* the store's class changes */
        wq__store_mark(q, idx);
    if ((st & WQ_ST_WAITING) && (rc = delay_remove(q, idx)) < 0)
        return rc;
    wq__mut_pend(q, WQ_PEND_MARK, idx);
    WQ_STEP("mark.busy");
    /* client-go's waiting loop adds a key at its ready time: queue
       duration counts from then, however late we noticed it. The time is
       written after the commit: before it, t_b is still the ready time
       that a repair would go by. */
    if ((st & WQ_ST_WAITING) && e->t_b < now)
        now = e->t_b;
    wq__fair_dirty(q, idx);   /* fair mode: its place is this moment */
    if (st & WQ_ST_PROCESSING) {
        set_state(e, WQ_ST_PROCESSING | WQ_ST_DIRTY);   /* commit */
        WQ_STEP("add.mark");
        e->t_b = now;
    } else if ((st == 0 || st == WQ_ST_RETAINED) && sync_adds(q)) {
        /* A zombie (its removal may already be written) or an idle key
           (stored as idle): like a new key, it stays invisible until the
           store has it as pending, so nothing is handed out unstored. */
        e->t_b = 0;
        set_state(e, WQ_ST_STORING);   /* commit */
        WQ_STEP("add.mark");
        wq__store_sync_request(q);
        if (st == WQ_ST_RETAINED)
            unretain(q, e);
        else
            h->zombies--;
        h->live++;
    } else {
        if (!q->fair)
            wq_store_relaxed(&e->seq, h->seq_next++);
        set_state(e, WQ_ST_DIRTY | WQ_ST_QUEUED);   /* commit */
        WQ_STEP("add.mark");
        e->t_b = now;
        broken(q, enqueue(q, idx));
        WQ_STEP("mark.ring");
        if (st == WQ_ST_RETAINED)
            unretain(q, e);
        else if (st == 0)
            h->zombies--;
        if (st == WQ_ST_RETAINED || st == 0)
            h->live++;
        *queued = true;
    }
    h->adds_total++;
    WQ_STEP("mark.counted");
    wq__mut_settled(q);
    WQ_STEP("mark.counters");
    return 0;
}

/*
 * Lock and busy held. Make a live entry that is not dirty wait until
 * `ready` (keeping an earlier ready time it already has). Returns 1 when
 * merged into an existing wait (or into a new key not stored yet), 0
 * when a new wait started.
 */
int wq__entry_delay(shmq *q, uint32_t idx, uint64_t ready)
{
    WQ_ASSERT_MUTATING(q);
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = wq__st(e);
    if (st == WQ_ST_STORING) {   /* not visible yet: keep the earlier time */
        if (e->t_b != 0 && ready < e->t_b) {
            wq__store_mark(q, idx);
            e->t_b = ready;
        }
        return 1;
    }
    if (st & WQ_ST_WAITING) {
        if (ready < e->t_b) {
            wq__store_mark(q, idx);
            e->t_b = ready;
            WQ_STEP("wait.earlier");
            broken(q, wq__heap_raise(q, WQ_HEAP_DELAY, h->heap_count, idx));
        }
        return 1;
    }
    wq__store_mark(q, idx);
    e->t_b = ready;
    wq_store_relaxed(&e->seq, h->seq_next++);
    WQ_STEP("wait.ready");
    bool idle = st == WQ_ST_RETAINED || st == 0;   /* idle, or a zombie */
    if (idle) {
        set_state(e, sync_adds(q) ? WQ_ST_STORING : WQ_ST_WAITING);   /* commit */
        WQ_STEP("wait.state");
        if (st == WQ_ST_RETAINED)
            unretain(q, e);
        else
            h->zombies--;
        h->live++;
        if (sync_adds(q)) {
            wq__store_sync_request(q);
            return 0;   /* invisible until stored again, as a new key */
        }
    } else {
        set_state(e, st | WQ_ST_WAITING);   /* commit: processing */
        WQ_STEP("wait.state");
    }
    broken(q, delay_push(q, idx));
    return 0;
}

/* ------------------------------------------------------------------ */
/* Hand-out and done                                                    */
/* ------------------------------------------------------------------ */

/* Lock and busy held; idx is the queue's front (checked QUEUED). */
int wq__entry_hand_out(shmq *q, uint32_t idx, uint64_t now)
{
    WQ_ASSERT_MUTATING(q);
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    /* Room first, the only steps that can fail: a delay heap slot for
       the wait its done may start (delay.c), then its run record. A
       holder killed before the commit leaves a block that no processing
       entry names, free again at the next repair (keys.c), and heap pages
       the next get uses. */
    uint32_t b;
    int rc = wq__delay_room(q, 1);
    if (rc == 0)
        rc = wq__keys_take(q, sizeof(struct wq_run), &b);
    if (rc < 0)
        return rc;
    struct wq_run *r = wq__run_at(q, b);
    r->t_start = now;
    r->entry = idx;
    r->owner = (uint16_t)q->slot;
    r->owner_gen = wq__gen16(q->gen);
    e->run = b;
    WQ_STEP("get.owner");
    set_state(e, WQ_ST_PROCESSING);   /* commit */
    WQ_STEP("get.state");
    if (q->fair)
        broken(q, wq__fair_pop(q, idx));
    else
        wq__ring_pop(q);
    WQ_STEP("get.ring");
    h->processing++;
    q->procs[q->slot].held++;
    if (q->metrics) {
        wq__observe(&h->qdur, now > e->t_b ? now - e->t_b : 0);
        h->sum_start += now;
    }
    WQ_STEP("get.counters");
    return 0;
}

/*
 * Lock and busy held; idx is PROCESSING. The holder is done (wq_done, or
 * wq_finish with an outcome to record, wq_finish_get's also with its
 * failure count to forget): a key re-added meanwhile goes to
 * the back of the queue, a waiting one keeps waiting, one with a failure
 * count or a result stays idle (RETAINED), any other leaves the queue.
 */
int wq__entry_done(shmq *q, uint32_t idx, uint64_t now, const struct wq_outcome *o,
                   bool *queued)
{
    WQ_ASSERT_MUTATING(q);
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = wq__st(e);
    int rc = 0;
    struct wq_run *r = wq__entry_run(q, e, idx);
    if (WQ_UNLIKELY(!r))
        return wq__region_mark_corrupt(q);   /* repair requeues it */
    /* The outcome first: a holder killed before the state commit leaves
       the key processing (requeued as a crash) with its outcome kept. */
    if (o && o->record) {
        wq__store_mark(q, idx);
        if ((rc = wq__result_record(q, idx, o->code, o->message)) < 0)
            return rc;
    }
    /* Then the forget (wq_finish_get), after everything that can fail:
       a processing key's count alone, which the state below then sees. */
    if (o && o->forget && (rc = wq__entry_forget(q, idx)) < 0)
        return rc;
    if (st & WQ_ST_DIRTY) {
        if (!q->fair)
            wq_store_relaxed(&e->seq, h->seq_next++);   /* client-go: the back of the queue */
        set_state(e, WQ_ST_DIRTY | WQ_ST_QUEUED);   /* commit */
        WQ_STEP("done.state");
        broken(q, enqueue(q, idx));
        WQ_STEP("done.ring");
        *queued = true;
    } else if (st & WQ_ST_WAITING) {
        wq__store_mark(q, idx);
        set_state(e, WQ_ST_WAITING);   /* commit: still waiting for its delay */
        WQ_STEP("done.state");
    } else if (e->failures > 0 || wq__has_result(q, e)) {
        wq__store_mark(q, idx);
        set_state(e, WQ_ST_RETAINED);   /* commit: idle, keeps its count or result */
        WQ_STEP("done.state");
        retain(q, e);
        h->live--;
    } else {
        wq__entry_release(q, idx, true);   /* commits; never fails after */
    }
    if (q->metrics) {
        wq__observe(&h->wdur, now - r->t_start);
        h->sum_start -= r->t_start;
    }
    held_dec(q, r);
    run_end(q, e);
    h->processing--;
    WQ_STEP("done.counters");
    if (h->processing == 0)
        wq__wake_drainers(q);
    return 0;
}

/*
 * Lock and busy held. A key held by a process that is gone goes back. On
 * close (crash false) it goes to the back of the queue at once. After a
 * crash it goes through the rate limiter, as the API promises: its
 * failure count rises, so a key that kills every worker backs off; it
 * waits for the limiter's delay (keeping an earlier wait it had), unless
 * it was re-added meanwhile (an acknowledged add is pending) or the queue
 * is shutting down (nothing fires then): those are queued at once.
 */
int wq__entry_requeue(shmq *q, uint32_t idx, bool crash, uint64_t now, bool *queued)
{
    WQ_ASSERT_MUTATING(q);
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = wq__st(e);
    int rc;
    struct wq_run *r = wq__entry_run(q, e, idx);
    if (WQ_UNLIKELY(!r))
        return wq__region_mark_corrupt(q);   /* repair requeues it */
    if (crash)
        wq__mut_pend(q, WQ_PEND_CRASH, idx);
    WQ_STEP("requeue.busy");
    uint64_t delay = crash ? wq__limiter_when(q, e, now) : 0;
    if ((st & WQ_ST_DIRTY) || h->shutdown)
        delay = 0;
    if (crash)
        wq__store_mark(q, idx);   /* its failure count rose */
    if (delay > 0) {
        uint64_t ready = now + delay < now ? UINT64_MAX : now + delay;
        bool waiting = st & WQ_ST_WAITING;
        if (!waiting) {
            e->t_b = ready;
            wq_store_relaxed(&e->seq, h->seq_next++);
        } else if (ready < e->t_b) {
            e->t_b = ready;
        }
        set_state(e, WQ_ST_WAITING);   /* commit */
        WQ_STEP("requeue.state");
        broken(q, waiting ? wq__heap_raise(q, WQ_HEAP_DELAY, h->heap_count, idx)
                          : delay_push(q, idx));
    } else {
        if ((st & WQ_ST_WAITING) && (rc = delay_remove(q, idx)) < 0)
            return rc;
        e->t_b = now;
        wq_store_relaxed(&e->seq, h->seq_next++);
        if (!(st & WQ_ST_DIRTY))
            wq__fair_dirty(q, idx);   /* a re-added key keeps its place */
        set_state(e, WQ_ST_DIRTY | WQ_ST_QUEUED);   /* commit */
        WQ_STEP("requeue.state");
        broken(q, enqueue(q, idx));
        *queued = true;
    }
    WQ_STEP("requeue.ring");
    h->processing--;
    if (q->metrics)
        h->sum_start -= r->t_start;
    held_dec(q, r);
    run_end(q, e);
    if (crash) {
        h->crash_requeues_total++;
        WQ_STEP("requeue.counted");
        h->retries_total++;
    }
    wq__mut_settled(q);
    WQ_STEP("requeue.counters");
    if (h->processing == 0)
        wq__wake_drainers(q);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Leaving the queue                                                   */
/* ------------------------------------------------------------------ */

/*
 * Lock and busy held: a waiting key is dropped at shutdown (client-go's
 * waiting loop stops, so it never fires). A key also processing stays
 * processing; one with a failure count or a result stays idle; any other
 * leaves the queue, keeping its store record (wq.h).
 */
int wq__entry_drop_wait(shmq *q, uint32_t idx)
{
    WQ_ASSERT_MUTATING(q);
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = wq__st(e);
    int rc = delay_remove(q, idx);
    if (rc < 0)
        return rc;
    if (st & WQ_ST_PROCESSING) {
        set_state(e, WQ_ST_PROCESSING);   /* commit */
        WQ_STEP("drop.state");
    } else if (e->failures > 0 || wq__has_result(q, e)) {
        set_state(e, WQ_ST_RETAINED);   /* commit: idle, keeps count/result */
        WQ_STEP("drop.state");
        retain(q, e);
        h->live--;
    } else {
        WQ_STEP("drop.heap");
        return wq__entry_release(q, idx, false);
    }
    return 0;
}

/*
 * Lock and busy held: the entry leaves the queue for good, with its
 * result. With a store (and `stored`) it stays as a zombie until the
 * store has removed its record (wq__entry_stored frees it then); at
 * shutdown, dropped waiting keys keep their records (`stored` false) and
 * are freed at once.
 */
int wq__entry_release(shmq *q, uint32_t idx, bool stored)
{
    WQ_ASSERT_MUTATING(q);
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = wq__st(e);
    wq__result_drop(q, idx);
    if (st == WQ_ST_RETAINED)
        unretain(q, e);
    else if (st != 0)
        h->live--;
    if (q->g.has_store && stored) {
        e->failures = 0;
        wq__store_mark(q, idx);   /* listed before the commit, as every mark */
        wq_store_release(&e->state, WQ_ST_SDIRTY);  /* commit: a zombie */
        WQ_STEP("release.state");
        if (st != 0)
            h->zombies++;
        return 0;
    }
    wq_store_release(&e->state, 0);   /* commit: forgotten */
    WQ_STEP("release.state");
    int rc = wq__table_remove(q, idx, e->hash);
    if (rc < 0) {
        broken(q, rc);   /* still indexed: not reusable until rebuilt */
        return 0;
    }
    WQ_STEP("release.index");
    free_push(q, idx);
    WQ_STEP("release.free");
    return 0;
}

/* Lock and busy held: client-go's Forget: the failure count goes; the
   result stays (a reconciler that records its outcome and then forgets,
   client-go's idiom, keeps it). An idle entry kept for nothing more
   leaves the queue. */
int wq__entry_forget(shmq *q, uint32_t idx)
{
    WQ_ASSERT_MUTATING(q);
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = wq__st(e);
    if (e->failures == 0 || st == 0)
        return 0;   /* nothing to forget (a zombie's count is gone already) */
    wq__store_mark(q, idx);
    if (st == WQ_ST_RETAINED)
        q->hdr->failing--;
    e->failures = 0;   /* commit */
    WQ_STEP("forget.reset");
    if (st == WQ_ST_RETAINED && !wq__has_result(q, e))
        return wq__entry_release(q, idx, true);
    return 0;
}

/*
 * Lock and busy held: wq_remove. A key queued, waiting, not stored yet,
 * or idle leaves the queue with its failure count and result; -EBUSY
 * while it is processing, -ENOENT for a zombie (already gone). A queued
 * key leaves the FIFO (O(queued): an operator's call, not a hot path) or
 * fair mode's heaps before the commit, so a holder killed in between
 * leaves a queued entry that is simply missing from its container, which
 * repair puts back.
 */
int wq__entry_remove(shmq *q, uint32_t idx)
{
    WQ_ASSERT_MUTATING(q);
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = wq__st(e);
    int rc = 0;
    if (st & WQ_ST_PROCESSING)
        return -EBUSY;
    if (st == 0)
        return -ENOENT;
    if (st & WQ_ST_WAITING)
        rc = delay_remove(q, idx);
    else if (st & WQ_ST_QUEUED)
        rc = q->fair ? wq__fair_remove(q, idx) : wq__ring_remove(q, idx);
    if (rc < 0)
        return rc;
    WQ_STEP("remove.container");
    return wq__entry_release(q, idx, true);
}

/* Lock and busy held: client-go's When() for idx, with the counters of an
   idle entry whose failure count starts now. */
uint64_t wq__entry_when(shmq *q, uint32_t idx, uint64_t now)
{
    struct wq_entry *e = wq__entry(q, idx);
    bool counted = wq__st(e) == WQ_ST_RETAINED && e->failures > 0;
    uint64_t d = wq__limiter_when(q, e, now);
    if (wq__st(e) == WQ_ST_RETAINED && !counted && e->failures > 0)
        q->hdr->failing++;
    return d;
}

/* ------------------------------------------------------------------ */
/* The store's side (store.c calls these)                              */
/* ------------------------------------------------------------------ */

/*
 * Lock and busy held: the store committed the entry's current record (its
 * SDIRTY bit was just cleared: that is the commit). A new key becomes visible: queued, or
 * waiting when its ready time is still ahead; a zombie's removal is
 * written, so it is freed.
 */
int wq__entry_stored(shmq *q, uint32_t idx, uint64_t now, bool *queued)
{
    WQ_ASSERT_MUTATING(q);
    struct wq_entry *e = wq__entry(q, idx);
    if (e->state == WQ_ST_STORING) {
        if (e->t_b > now) {
            wq_store_release(&e->state, WQ_ST_WAITING);   /* commit */
            WQ_STEP("store.visible");
            broken(q, delay_push(q, idx));
        } else {
            e->t_b = now;
            wq__fair_dirty(q, idx);
            wq_store_release(&e->state, WQ_ST_DIRTY | WQ_ST_QUEUED);   /* commit */
            WQ_STEP("store.visible");
            broken(q, enqueue(q, idx));
            *queued = true;
        }
    } else if (e->state == 0) {   /* a deletion, now written: free */
        q->hdr->zombies--;
        int rc = wq__table_remove(q, idx, e->hash);
        if (rc < 0) {
            broken(q, rc);   /* still indexed: not reusable until rebuilt */
            return 0;
        }
        WQ_STEP("store.unindex");
        free_push(q, idx);
    }
    return 0;
}

/*
 * Lock and busy held: an add whose key could not be stored changes
 * nothing: a key still STORING (never visible) becomes a zombie, freed by
 * the next flush that succeeds; it no longer counts as an add.
 */
void wq__entry_unstore(shmq *q, uint32_t idx)
{
    WQ_ASSERT_MUTATING(q);
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    if (e->t_b == 0 && h->adds_total > 0)
        h->adds_total--;   /* it was counted as an add */
    wq__store_mark(q, idx);
    wq_store_release(&e->state, WQ_ST_SDIRTY);   /* commit: a zombie */
    WQ_STEP("store.zombie");
    h->live--;
    h->zombies++;
}
