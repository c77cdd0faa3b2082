/*
 * repair.c - rebuild the region from its entries, and the invariant
 * checker that shares the same passes (wq_check).
 *
 * The entries' state words are the source of truth (layout.h). Repair is
 * deterministic and bounded, O(capacity + index slots + max_procs):
 *   1. header: the immutable geometry must equal the handle's validated
 *      copy; a damaged one is rewritten from that copy.
 *   2. process table: a slot is FREE or LIVE, nothing else.
 *   3. entries: each state is normalised (norm_state): unknown bits
 *      cleared; QUEUED implies DIRTY; PROCESSING excludes QUEUED; a
 *      processing entry whose run record is not sound (inside the arena,
 *      naming it back) or names an owner slot that is not LIVE with the
 *      same generation is queued again (a crash requeue); a DIRTY entry
 *      that is not processing is QUEUED; a bad key length, a key block
 *      outside the arena, or one sharing bytes with a run record or an
 *      earlier entry's key frees the entry. Run records are marked
 *      first (mark_runs).
 *   4. index: cleared and every live entry inserted again (software
 *      prefetch keeps the random inserts overlapping). Two live entries
 *      with the same key keep the first.
 *   5. ring: sized for the entries used (ring.c; one whose size word is
 *      damaged is replaced by an empty one: its order is lost), then
 *      compacted in place, keeping FIFO order: a member stays if its
 *      entry is queued and was not seen before; queued entries missing
 *      from it are appended in entry order.
 *   6. free list, delay heap (with pages for every waiting key and every
 *      processing one, delay.c; a waiting key the heap has no pages for
 *      is made ready), counters and per-slot held counts recomputed.
 *   7. the key arena's free lists rebuilt from the live entries' blocks,
 *      processing entries' run records and result messages (keys.c),
 *      neighbouring free granules merged.
 * The dead-holder path (lock.c) runs it only when hdr->busy says the
 * holder died mid-mutation, and skips re-hashing keys; wq_check runs it
 * "thoroughly" (hashes verified) and without writing unless asked.
 */
#include <stdarg.h>
#include <stdlib.h>

#include "shm.h"

/* How far behind the next add order a dirty key's order may be. */
#define WQ_SEQ_WINDOW (1u << 30)

struct ctx {
    shmq *q;
    bool apply, thorough;
    wq_report_fn report;
    void *arg;
    int found;
    uint64_t *in_ring;   /* bitmap: entry seen in the ring */
    uint64_t *in_index;  /* bitmap: entry reached through the index */
    uint64_t *in_sq;     /* bitmap: entry listed in the store queue */
    uint64_t *kmap;      /* bitmap: key arena granules of live keys */
};

static void violation(struct ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void violation(struct ctx *c, const char *fmt, ...)
{
    c->found++;
    if (!c->report)
        return;
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    c->report(buf, c->arg);
}

static void report_cb(void *c, const char *what)
{
    violation(c, "%s", what);
}

static inline bool bit_get(const uint64_t *b, uint32_t i)
{
    return b[i >> 6] >> (i & 63) & 1;
}

static inline void bit_set(uint64_t *b, uint32_t i)
{
    b[i >> 6] |= 1ull << (i & 63);
}

/* A processing entry's run record is sound and names a live holder. */
static bool owner_valid(const shmq *q, const struct wq_entry *e, uint32_t idx)
{
    const struct wq_run *r = wq__entry_run(q, e, idx);
    return r && wq__run_holder(q, r);
}

/* The legal state an entry should have (layout.h lists them). Pure: used
   by check and repair alike. */
static uint16_t norm_queue_state(const shmq *q, uint32_t idx, uint16_t st);

/* Its length is legal and its bytes lie in the granules handed out. */
static bool key_sound(const shmq *q, const struct wq_entry *e)
{
    return wq__key_ok(q, e) && (e->keylen <= WQ_KEY_INLINE ||
                                e->k.block + WQ_GRAINS(wq__key_tail(e->keylen)) <=
                                    q->hdr->k_top);
}

static uint16_t norm_state(const shmq *q, uint32_t idx)
{
    const struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = e->state & WQ_ST_ALL;
    if (st == 0 || !key_sound(q, e))
        return 0;
    if (!q->g.has_store) {   /* store bits mean nothing without a store */
        if (st & WQ_ST_STORING)
            st = WQ_ST_DIRTY | WQ_ST_QUEUED;
        st &= (uint16_t)~WQ_ST_SDIRTY;
        return norm_queue_state(q, idx, st);
    }
    if (st & WQ_ST_STORING)   /* a new key awaiting its store commit */
        return WQ_ST_STORING | WQ_ST_SDIRTY;
    uint16_t sd = st & WQ_ST_SDIRTY;
    uint16_t n = norm_queue_state(q, idx, st & (uint16_t)~WQ_ST_SDIRTY);
    return n | sd;   /* SDIRTY alone: a zombie, its removal pending */
}

static uint16_t norm_queue_state(const shmq *q, uint32_t idx, uint16_t st)
{
    const struct wq_entry *e = wq__entry(q, idx);
    if (st == 0)
        return 0;
    if (st & WQ_ST_RETAINED) {
        st &= (uint16_t)~WQ_ST_RETAINED;
        bool result = wq__result_kept(q, idx);
        if (st == 0)
            return e->failures || result ? WQ_ST_RETAINED : 0;
    }
    if (st & WQ_ST_PROCESSING) {
        if (!owner_valid(q, e, idx))
            return WQ_ST_DIRTY | WQ_ST_QUEUED;   /* holder unknown: requeue */
        st &= (uint16_t)~WQ_ST_QUEUED;
        if (st & WQ_ST_DIRTY)
            st &= (uint16_t)~WQ_ST_WAITING;   /* an add supersedes a wait */
        return st;
    }
    if (st & (WQ_ST_DIRTY | WQ_ST_QUEUED))
        return WQ_ST_DIRTY | WQ_ST_QUEUED;
    return WQ_ST_WAITING;
}

/* Apply, before anything changes states: count the operation that the
   dead holder committed but did not count. */
static void settle_pending(shmq *q)
{
    struct wq_hdr *h = q->hdr;
    uint32_t kind = h->pend_kind, idx = h->pend_idx;
    if (kind != WQ_PEND_NONE && idx < wq__entries_used(q)) {
        uint32_t st = wq__entry(q, idx)->state;
        bool adds = h->adds_total == h->pend_count;   /* not bumped yet */
        if (kind == WQ_PEND_ADD && st != 0 && adds)
            h->adds_total++;
        else if (kind == WQ_PEND_MARK && (st & WQ_ST_DIRTY) && adds)
            h->adds_total++;
        else if (kind == WQ_PEND_CRASH && !(st & WQ_ST_PROCESSING) &&
                 (st & (WQ_ST_QUEUED | WQ_ST_WAITING))) {
            if (h->crash_requeues_total == h->pend_count)
                h->crash_requeues_total++;
            if (h->retries_total == h->pend_count2)
                h->retries_total++;
        }
    }
    wq__mut_settled(q);
}

static void check_header(struct ctx *c)
{
    shmq *q = c->q;
    if (memcmp(&q->hdr->g, &q->g, sizeof q->g) != 0) {
        violation(c, "header: immutable geometry changed since attach");
        if (c->apply)
            q->hdr->g = q->g;
    }
    /* Growth counts: wq__region_bounds clamped the handle's bounds to
       what the capacities allow; the header follows them. */
    struct wq_hdr *h = q->hdr;
    if (h->grown_ent != q->nent || h->grown_res != q->nres || h->e_fresh > q->nent ||
        h->r_fresh > q->nres) {
        violation(c, "header: %u entries used of %u reserved (capacity %u), %u result "
                  "slots of %u (of %u)", h->e_fresh, h->grown_ent, q->capacity, h->r_fresh,
                  h->grown_res, q->result_capacity);
        if (c->apply) {
            h->grown_ent = q->nent;
            h->grown_res = q->nres;
            h->e_fresh = h->e_fresh < q->nent ? h->e_fresh : q->nent;
        }
    }
    if (h->grown_heap != q->gheap) {
        violation(c, "header: %u delay heap slots reserved, %u usable", h->grown_heap, q->gheap);
        if (c->apply)
            h->grown_heap = q->gheap;
    }
    if (h->grown_keys != q->nkeys || h->k_top > q->nkeys) {
        violation(c, "header: key arena top %u of %u granules reserved (of %u)", h->k_top,
                  h->grown_keys, q->g.key_max);
        if (c->apply) {
            h->grown_keys = q->nkeys;
            h->k_top = h->k_top < q->nkeys ? h->k_top : q->nkeys;
        }
    }
}

static void check_procs(struct ctx *c)
{
    shmq *q = c->q;
    for (uint32_t i = 0; i < q->max_procs; i++) {
        struct wq_proc *p = &q->procs[i];
        if (p->state != WQ_PROC_FREE && p->state != WQ_PROC_LIVE) {
            violation(c, "proc %u: illegal state %u", i, p->state);
            /* A held lease means a live handle: keep it, whatever the
               state word says. */
            if (c->apply)
                p->state = wq__lease_alive(p) ? WQ_PROC_LIVE : WQ_PROC_FREE;
        }
        q->held[i] = 0;
    }
}

/* Pass over the entries: normalise states. */
/* Apply: an entry in state st is dropped. A new key awaiting its store
   commit is counted for its adder, which would otherwise take "no longer
   STORING" for "stored" (store.c, lost(), which reads the count under
   the lock, as we write it). */
static void dropped(struct ctx *c, uint16_t st)
{
    if (c->apply && (st & WQ_ST_STORING))
        c->q->hdr->storing_drops++;
}

/* A processing entry whose holder is unknown: say why. */
static void bad_run(struct ctx *c, uint32_t idx)
{
    const shmq *q = c->q;
    const struct wq_entry *e = wq__entry(q, idx);
    const struct wq_run *r = wq__entry_run(q, e, idx);
    if (!r)
        violation(c, "entry %u: processing, but its run record at granule %u is outside "
                  "the key arena's %u granules or names another entry", idx, e->run,
                  q->hdr->k_top);
    else
        violation(c, "entry %u: processing with invalid owner %u/%u", idx, r->owner,
                  r->owner_gen);
}

/* The run records of the keys that stay processing, before any key's
   block is marked: a record names its entry and a live holder, which a
   damaged key pointer cannot fake, so where a record and a key overlap
   the key is dropped (check_entries) and the holder keeps its key. Of
   two records that overlap, the later entry's key is requeued. */
static void mark_runs(struct ctx *c)
{
    shmq *q = c->q;
    for (uint32_t idx = 0, used = wq__entries_used(q); idx < used; idx++) {
        struct wq_entry *e = wq__entry(q, idx);
        if (!(e->state & WQ_ST_PROCESSING) || !(norm_state(q, idx) & WQ_ST_PROCESSING) ||
            wq__keys_mark(q, c->kmap, e->run, sizeof(struct wq_run)) == 0)
            continue;
        violation(c, "entry %u: its run record at granule %u shares bytes with another; "
                  "requeued", idx, e->run);
        if (c->apply) {
            q->hdr->crash_requeues_total++;
            wq_store_release(&e->state, (uint16_t)((e->state & WQ_ST_SDIRTY) | WQ_ST_DIRTY |
                                                   WQ_ST_QUEUED));
        }
    }
}

static void check_entries(struct ctx *c)
{
    shmq *q = c->q;
    mark_runs(c);
    for (uint32_t idx = 0, used = wq__entries_used(q); idx < used; idx++) {
        struct wq_entry *e = wq__entry(q, idx);
        uint16_t st = e->state, want = norm_state(q, idx);
        if (st == want)
            goto hash;
        if (st & ~WQ_ST_ALL)
            violation(c, "entry %u: unknown state bits 0x%x", idx, st);
        else if (want == 0 && (e->keylen == 0 || e->keylen > q->max_key_len))
            violation(c, "entry %u: bad key length %u", idx, e->keylen);
        else if (want == 0 && !key_sound(q, e))
            violation(c, "entry %u: key block %u of %u bytes outside the key arena's %u "
                      "granules", idx, e->k.block, wq__key_tail(e->keylen), q->hdr->k_top);
        else if (want == 0)
            violation(c, "entry %u: idle with neither failures nor a result", idx);
        else if ((st & WQ_ST_PROCESSING) && !(want & WQ_ST_PROCESSING))
            bad_run(c, idx);
        else
            violation(c, "entry %u: illegal state 0x%x", idx, st);
        if (!c->apply) {   /* its block is its own still: mark it */
            if (want && e->keylen > WQ_KEY_INLINE)
                (void)wq__keys_mark(q, c->kmap, e->k.block, wq__key_tail(e->keylen));
            continue;
        }
        if ((st & WQ_ST_PROCESSING) && want == (WQ_ST_DIRTY | WQ_ST_QUEUED))
            q->hdr->crash_requeues_total++;
        if (want == 0)
            dropped(c, st);
        wq_store_release(&e->state, want);
    hash:
        if (want && e->keylen > WQ_KEY_INLINE &&
            wq__keys_mark(q, c->kmap, e->k.block, wq__key_tail(e->keylen)) < 0) {
            violation(c, "entry %u: key block %u shares bytes with another block, "
                      "dropped", idx, e->k.block);
            if (c->apply) {
                if (want & WQ_ST_PROCESSING)   /* marked by mark_runs */
                    wq__keys_unmark(c->kmap, e->run, sizeof(struct wq_run));
                dropped(c, want);
                wq_store_release(&e->state, want = 0);
            }
            continue;
        }
        if (c->thorough && want) {
            unsigned char kb[WQ_MAX_KEY_LEN];
            uint32_t h = wq__hash(q->seed, wq__key(q, e, kb), e->keylen);
            if (h != e->hash) {
                violation(c, "entry %u: stored hash differs from its key's", idx);
                if (c->apply)
                    e->hash = h;
            }
        }
        /* Add order is compared as a signed difference of seqs (heap.c),
           a total order only while the seqs compared span less than 2^31:
           a dirty key's seq outside the 2^30 below seq_next is damaged,
           and its place is taken as of now. */
        uint32_t age = q->hdr->seq_next - e->seq;
        if (q->fair && (want & WQ_ST_DIRTY) && age > WQ_SEQ_WINDOW) {
            violation(c, "entry %u: add order %u outside the window below %u", idx, e->seq,
                      q->hdr->seq_next);
            if (c->apply)
                wq_store_relaxed(&e->seq, q->hdr->seq_next++);
        }
    }
}

static void dup_key(void *cv, uint32_t idx, uint32_t other, uint16_t st)
{
    struct ctx *c = cv;
    violation(c, "entry %u: same key as entry %u, dropped", idx, other);
    struct wq_entry *e = wq__entry(c->q, idx);
    dropped(c, st);
    wq__entry_renew(c->q, e);   /* its state is 0 now; its blocks go back */
    if (e->keylen > WQ_KEY_INLINE)
        wq__keys_unmark(c->kmap, e->k.block, wq__key_tail(e->keylen));
    if (st & WQ_ST_PROCESSING)   /* marked by mark_runs, as it stayed processing */
        wq__keys_unmark(c->kmap, e->run, sizeof(struct wq_run));
}

#define VERIFY_AHEAD 16   /* index slots: whose entry verify_index fetches ahead */

/* Check only: every index slot names a live entry with its hash, is
   reachable from its home slot, and every live entry is found once. */
static void verify_index(struct ctx *c)
{
    shmq *q = c->q;
    uint32_t n = q->index_slots, start = n;
    uint32_t want = wq__index_size(q->index_max, wq__entries_used(q));
    if (n == 0) {
        violation(c, "index: its size word 0x%llx is damaged",
                  (unsigned long long)q->hdr->index_at);
        return;
    }
    if (n < want)
        violation(c, "index: %u slots for %u entries used, %u needed", n,
                  wq__entries_used(q), want);
    for (uint32_t i = 0; i < n; i++)
        if (q->index[i].w == 0) {
            start = i;
            break;
        }
    if (start == n) {
        violation(c, "index: no empty slot");
        return;
    }
    uint32_t run = 0;   /* occupied slots since the last empty one */
    for (uint32_t k = 1; k <= n; k++) {
        uint32_t i = (uint32_t)(((uint64_t)start + k) % n);
        uint32_t w = q->index[i].w;
        /* The slots go in index order, their entries in none: fetch the
           entry of a slot VERIFY_AHEAD on while this one waits for its
           own (a miss per key was 86% of wq_check's scan at 1e6 keys). */
        uint32_t wa = q->index[(uint32_t)(((uint64_t)i + VERIFY_AHEAD) % n)].w;
        uint32_t ia = wq__islot_ref(q, wa) - 1;   /* wa 0 (empty): UINT32_MAX */
        if (ia < wq__entries_used(q))
            __builtin_prefetch(wq__entry(q, ia));
        if (w == 0) {
            run = 0;
            continue;
        }
        run++;
        uint32_t idx = wq__islot_ref(q, w) - 1;
        if (idx >= wq__entries_used(q)) {
            violation(c, "index slot %u: entry %u out of range", i, idx);
            continue;
        }
        const struct wq_entry *e = wq__entry(q, idx);
        uint32_t home = wq__home(q, e->hash);
        uint32_t dist = wq__index_dist(q, home, i);
        if (norm_state(q, idx) == 0)
            violation(c, "index slot %u: entry %u is free", i, idx);
        else if ((w & ~q->irmask) != wq__table_tag(q, e->hash, dist))
            violation(c, "index slot %u: its tag does not match entry %u's hash", i, idx);
        if (dist >= run)
            violation(c, "index slot %u: unreachable from its home slot %u", i, home);
        if (bit_get(c->in_index, idx))
            violation(c, "index slot %u: entry %u indexed twice", i, idx);
        bit_set(c->in_index, idx);
    }
    for (uint32_t idx = 0, used = wq__entries_used(q); idx < used; idx++) {
        if (norm_state(q, idx) != 0 && !bit_get(c->in_index, idx))
            violation(c, "entry %u: live but not in the index", idx);
    }
}

/* Compact the ring in FIFO order (apply) or verify it. Returns kept. */
static uint32_t check_ring(struct ctx *c)
{
    shmq *q = c->q;
    if (q->fair && (wq_load_relaxed(&q->hdr->ring_pos) >> 32)) {
        violation(c, "ring: not empty in fair mode");
        if (c->apply)
            wq_store_relaxed(&q->hdr->ring_pos, 0);
        return 0;
    }
    enum { AHEAD = 8 };
    uint32_t n = q->ring_slots;   /* apply: resized already (wq__repair) */
    if (!c->apply && n < wq__ring_need(q, wq__entries_used(q))) {
        if (n == 0)
            violation(c, "ring: its size word 0x%llx is damaged",
                      (unsigned long long)q->hdr->ring_at);
        else
            violation(c, "ring: %u slots for %u entries used, %u needed", n,
                      wq__entries_used(q), wq__ring_need(q, wq__entries_used(q)));
        return 0;
    }
    uint64_t pos = wq_load_relaxed(&q->hdr->ring_pos);
    uint32_t head = (uint32_t)pos, count = (uint32_t)(pos >> 32);
    if (head >= n || count > n) {
        violation(c, "ring: head %u count %u out of range", head, count);
        head = 0;
        count = 0;
    }
    uint32_t kept = 0, r = head, w = head;
    for (uint32_t k = 0; k < count; k++) {
        if (k + AHEAD < count) {
            uint32_t a = r + AHEAD < n ? r + AHEAD : r + AHEAD - n;
            if (q->ring[a] < wq__entries_used(q))
                __builtin_prefetch(wq__entry(q, q->ring[a]));
        }
        uint32_t idx = q->ring[r];
        r = r + 1 == n ? 0 : r + 1;
        if (idx >= wq__entries_used(q)) {
            violation(c, "ring position %u: entry %u out of range", k, idx);
            continue;
        }
        if (!(norm_state(q, idx) & WQ_ST_QUEUED)) {
            violation(c, "ring position %u: entry %u is not queued", k, idx);
            continue;
        }
        if (bit_get(c->in_ring, idx)) {
            violation(c, "ring position %u: entry %u is in the ring twice", k, idx);
            continue;
        }
        bit_set(c->in_ring, idx);
        if (c->apply) {
            q->ring[w] = idx;
            w = w + 1 == n ? 0 : w + 1;
        }
        kept++;
    }
    if (c->apply)
        wq_store_relaxed(&q->hdr->ring_pos, (uint64_t)kept << 32 | (n ? head : 0));
    return kept;
}

static bool waiting_member(const shmq *q, uint32_t idx)
{
    return norm_state(q, idx) & WQ_ST_WAITING;
}

/* Check only: the delay heap lists waiting entries once each, their
   positions match, and the heap order holds. Marks members in in_ring
   (ring members are queued, heap members waiting: the sets are disjoint). */
static void verify_heap(struct ctx *c)
{
    wq__heap_verify(c->q, WQ_HEAP_DELAY, c->q->hdr->heap_count, c->in_ring, waiting_member,
                    report_cb, c);
}

/* Check only: the store queue lists SDIRTY entries, each once. */
static void verify_sq(struct ctx *c)
{
    shmq *q = c->q;
    struct wq_hdr *h = q->hdr;
    if (!q->g.has_store)
        return;
    if (h->sq_head >= q->capacity || h->sq_count > q->capacity) {
        violation(c, "store queue: head %u count %u out of range", h->sq_head, h->sq_count);
        return;
    }
    for (uint32_t k = 0, p = h->sq_head; k < h->sq_count;
         k++, p = p + 1 == q->capacity ? 0 : p + 1) {
        uint32_t idx = q->sq[p];
        if (idx >= wq__entries_used(q)) {
            violation(c, "store queue position %u: entry %u out of range", k, idx);
            continue;
        }
        if (!(norm_state(q, idx) & WQ_ST_SDIRTY))
            violation(c, "store queue position %u: entry %u is not stale", k, idx);
        if (bit_get(c->in_sq, idx))
            violation(c, "store queue position %u: entry %u listed twice", k, idx);
        bit_set(c->in_sq, idx);
    }
}

/* Last pass: queued entries missing from the ring, free list, counters. */
static void finish(struct ctx *c, uint32_t queued)
{
    shmq *q = c->q;
    struct wq_hdr *h = q->hdr;
    uint32_t live = 0, processing = 0, retained = 0, failing = 0, waiting = 0, sdirty = 0;
    uint32_t held_only = 0;   /* processing and not waiting */
    uint32_t zombies = 0;
    uint32_t free_first = WQ_NIL, free_last = WQ_NIL;
    uint64_t sum_start = 0;
    if (c->apply) {
        wq_store_relaxed(&h->heap_count, 0);
        h->sq_head = 0;
        h->sq_count = 0;
        h->sq_epoch++;   /* a flusher mid-write must not settle by position */
    }
    uint32_t used = wq__entries_used(q);
    for (uint32_t idx = 0; idx < used; idx++) {
        struct wq_entry *e = wq__entry(q, idx);
        uint16_t st = norm_state(q, idx);
        if (st == 0) {
            if (c->apply) {
                bool owned = e->state != 0 || e->keylen != 0;
                wq_store_release(&e->state, 0);
                if (owned)
                    wq__entry_renew(q, e);
                e->keylen = 0;   /* owns no block */
                if (free_last == WQ_NIL)
                    free_first = idx;
                else
                    wq__entry(q, free_last)->link = idx;
                free_last = idx;
            }
            continue;
        }
        if (st & WQ_ST_SDIRTY) {
            sdirty++;
            if (c->apply)
                q->sq[h->sq_count++] = idx;   /* queue restarted at 0 */
            else if (!bit_get(c->in_sq, idx))
                violation(c, "entry %u: store record stale but not queued for it", idx);
        }
        st &= (uint16_t)~WQ_ST_SDIRTY;
        if (st == 0) {
            zombies++;   /* its store record is still to be removed */
            continue;
        }
        if (st == WQ_ST_RETAINED) {
            retained++;
            failing += e->failures > 0;
            continue;
        }
        live++;
        if (st & WQ_ST_PROCESSING) {
            processing++;
            held_only += !(st & WQ_ST_WAITING);
            const struct wq_run *r = wq__entry_run(q, e, idx);   /* sound: see norm_state */
            sum_start += r->t_start;
            q->held[r->owner]++;
        }
        /* Room for a wait (delay.c), in the steps a growth takes. Only a
           damaged region can lack it; refused, the key is ready now
           rather than the repair stuck until /dev/shm has room. */
        if ((st & WQ_ST_WAITING) && c->apply && h->heap_count >= q->nheap &&
            wq__region_grow_heap(q, h->heap_count + 1) < 0) {
            violation(c, "entry %u: waiting, but the delay heap may not grow: ready now", idx);
            st = (st & WQ_ST_PROCESSING) ? WQ_ST_PROCESSING | WQ_ST_DIRTY
                                         : WQ_ST_DIRTY | WQ_ST_QUEUED;
            e->t_b = wq__now_mono();
            wq_store_release(&e->state, (uint16_t)(st | (e->state & WQ_ST_SDIRTY)));
        }
        if (st & WQ_ST_WAITING) {
            waiting++;
            if (c->apply)
            {
                q->heap[h->heap_count] = idx;
                wq_store_relaxed(&h->heap_count, h->heap_count + 1);
            }
            else if (!bit_get(c->in_ring, idx))
                violation(c, "entry %u: waiting but not in the heap", idx);
        }
        if ((st & WQ_ST_QUEUED) && !q->fair && !bit_get(c->in_ring, idx)) {
            violation(c, "entry %u: queued but not in the ring", idx);
            if (c->apply && wq__ring_push(q, idx) == 0)
                queued++;
        }
    }
    if (c->apply) {
        if (free_last != WQ_NIL)
            wq__entry(q, free_last)->link = WQ_NIL;
        h->free_head = free_first;
        wq__heap_build(q, WQ_HEAP_DELAY, h->heap_count);   /* members listed above */
        /* and the slots a wait of each processing key may need: refused,
           the next get asks again (and a wait that finds none flags the
           region, whose repair makes its key ready now, above) */
        if (waiting + held_only > q->nheap)
            (void)wq__region_grow_heap(q, waiting + held_only);
    } else {
        uint32_t n = 0, i = h->free_head;
        while (i != WQ_NIL && n <= used) {
            if (i >= used) {
                violation(c, "free list: entry %u out of range", i);
                break;
            }
            if (wq__entry(q, i)->state != 0) {
                violation(c, "free list: entry %u is live", i);
                break;
            }
            n++;
            i = wq__entry(q, i)->link;
        }
        if (n != used - live - retained - zombies)
            violation(c, "free list: %u entries, expected %u", n,
                      used - live - retained - zombies);
        if (h->heap_count != waiting)
            violation(c, "heap: %u members, %u entries waiting", h->heap_count, waiting);
        if (waiting + held_only > q->nheap)
            violation(c, "heap: room for %u keys, %u waiting or processing", q->nheap,
                      waiting + held_only);
    }
    if (h->retained != retained)
        violation(c, "counter retained %u, expected %u", h->retained, retained);
    if (h->failing != failing)
        violation(c, "counter failing %u, expected %u", h->failing, failing);
    if (q->g.has_store && h->zombies != zombies)
        violation(c, "counter zombies %u, expected %u", h->zombies, zombies);
    if (!c->apply && q->g.has_store && h->sq_count != sdirty)
        violation(c, "store queue: %u listed, %u entries stale", h->sq_count, sdirty);
    if (q->metrics && h->sum_start != sum_start)
        violation(c, "metrics: start-time sum differs from the processing entries");
    if (h->live != live)
        violation(c, "counter live %u, expected %u", h->live, live);
    if (h->processing != processing)
        violation(c, "counter processing %u, expected %u", h->processing, processing);
    uint32_t waiters = 0;
    for (uint32_t i = 0; i < q->max_procs; i++) {
        struct wq_proc *p = &q->procs[i];
        if (p->state == WQ_PROC_LIVE && p->held != q->held[i]) {
            violation(c, "proc %u: counted %u keys held, it holds %u", i, p->held,
                      q->held[i]);
            if (c->apply)
                p->held = q->held[i];
        }
        if (p->state == WQ_PROC_LIVE)
            waiters += p->waiting;
    }
    if (c->apply) {
        h->live = live;
        h->processing = processing;
        wq_store_relaxed(&h->waiters, waiters);
        h->wake_pending = 0;   /* a hint: zero only costs wakes */
        h->retained = retained;
        h->failing = failing;
        h->zombies = zombies;
        h->sum_start = sum_start;
    }
    (void)queued;
}

int wq__repair(shmq *q, bool apply, bool thorough, wq_report_fn report, void *arg)
{
    struct ctx c = { .q = q, .apply = apply, .thorough = thorough, .report = report,
                     .arg = arg };
    size_t words = (q->capacity + 63) / 64;
    if (apply && !thorough && !q->hdr->busy && !q->hdr->corrupt)
        return 0;   /* the dead holder was not mutating: nothing to rebuild */
    if (apply)
        q->hdr->busy = 1;   /* a repairer that dies is repaired after, too */
    c.in_ring = q->scratch;
    c.in_index = q->scratch + words;
    c.in_sq = q->scratch + 2 * words;
    memset(q->scratch, 0, 3 * words * sizeof *q->scratch);

    if (apply && !thorough)
        settle_pending(q);
    check_header(&c);
    if (!(c.kmap = wq__keys_map(q)))
        return -ENOMEM;
    check_procs(&c);
    check_entries(&c);
    if (apply) {
        bool emptied;
        int rc = wq__table_rebuild(q, dup_key, &c);
        if (rc == 0)
            rc = wq__ring_resize(q, &emptied);
        if (rc < 0) {
            free(c.kmap);
            return rc;
        }
        if (emptied)
            violation(&c, "ring: its size word was damaged%s",
                      q->fair ? "" : "; queued keys kept, their order lost");
    } else {
        verify_index(&c);
    }
    uint32_t queued = check_ring(&c);
    if (!apply) {
        verify_heap(&c);
        verify_sq(&c);
    }
    finish(&c, queued);
    if (apply) {
        int rc = wq__fair_rebuild(q);
        if (rc < 0) {
            free(c.kmap);
            return rc;
        }
    } else {
        wq__fair_verify(q, report_cb, &c);
    }
    wq__lanes_verify(q, apply, report_cb, &c);
    if (!apply)
        wq__results_verify(q, report_cb, &c);
    else if (thorough || wq__results_damaged(q))
        wq__results_rebuild(q);
    /* The arena last: what it holds is decided above. */
    wq__results_mark(q, c.kmap, apply, report_cb, &c);
    if (apply)
        wq__keys_rebuild(q, c.kmap);
    else
        wq__keys_verify(q, c.kmap, report_cb, &c);
    free(c.kmap);
    if (apply) {
        WQ_STEP("repair.done");
        q->hdr->busy = 0;
        q->hdr->corrupt = 0;
        wq__wake_all(q);   /* every sleeper re-evaluates the repaired state */
    }
    return c.found;
}

int wq__shm_check(wq *pub, unsigned flags, wq_report_fn report, void *arg)
{
    shmq *q = wq__shm(pub);
    int rc = wq__lock_look(q);
    if (rc < 0)
        return rc;
    int found = wq__repair(q, false, true, report, arg);
    if (found > 0 && (flags & WQ_CHECK_REPAIR))
        wq__repair(q, true, true, NULL, NULL);
    if (flags & (WQ_CHECK_REPAIR | WQ_CHECK_REAP))
        wq__procs_reap(q);
    wq__unlock(q);
    /* What the repair and the reap changed (crash requeues' failure
       counts) is written now: the caller may be an observer, whose close
       writes nothing, and the queue's workers may all be dead. */
    if (q->g.has_store && (flags & (WQ_CHECK_REPAIR | WQ_CHECK_REAP)))
        wq__store_after(q);
    return found;
}
