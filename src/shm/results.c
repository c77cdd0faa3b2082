/*
 * results.c - outcomes of finished keys, as Sveltos' deployer keeps them:
 * wq_finish, wq_result.
 *
 * A fixed table of result_capacity slots in the region. A slot belongs to
 * one entry (slot->owner = entry + 1, entry->rslot = slot; both must
 * agree). An entry keeps its result while it is re-added and processed
 * again (so wq_result can show how the previous run ended), and while it
 * is idle (state RETAINED). Used slots form a doubly linked list in update
 * order: a full table evicts its head, the least recently updated result.
 *
 * Free slots: the free list, then the never-used slots from r_fresh on
 * (a new region writes nothing here). Repair and check look at slots
 * below r_fresh only.
 *
 * Crash safety: a new result commits with the slot's owner store; the
 * entry's back pointer and the list follow and are rebuilt by repair
 * (wq__results_rebuild: a slot is kept when its owner entry is in use and
 * points back at it or nowhere yet; the list is re-sorted by update
 * sequence, O(r log r) for r results). An update in
 * place may leave a torn message if its writer dies mid-copy; the
 * structure stays sound.
 *
 * Messages: up to WQ_MSG_INLINE bytes in the slot, longer ones in a block
 * of the key arena (keys.c) that the slot owns while its owner is set. A
 * replaced message's block is given back after the new one is in place;
 * a slot freed gives its block back. Repair marks the blocks of the slots
 * it keeps (wq__results_mark), and the arena is rebuilt from those and
 * the keys'; a message whose block is not sound is emptied.
 */
#include <stdlib.h>

#include "shm.h"

static inline struct wq_rslot *slot(const shmq *q, uint32_t s)
{
    return &q->rslots[s];
}

static void unlink_slot(shmq *q, uint32_t s)
{
    struct wq_hdr *h = q->hdr;
    struct wq_rslot *r = slot(q, s);
    if (r->prev < q->nres)
        slot(q, r->prev)->next = r->next;
    else
        h->r_head = r->next;
    if (r->next < q->nres)
        slot(q, r->next)->prev = r->prev;
    else
        h->r_tail = r->prev;
}

static void append_slot(shmq *q, uint32_t s)
{
    struct wq_hdr *h = q->hdr;
    struct wq_rslot *r = slot(q, s);
    r->prev = h->r_tail;
    r->next = WQ_NIL;
    if (h->r_tail < q->nres)
        slot(q, h->r_tail)->next = s;
    else
        h->r_head = s;
    h->r_tail = s;
}

/* The message's bytes (msglen of them), or NULL when damaged. */
static const char *msg_at(const shmq *q, const struct wq_rslot *r)
{
    if (r->msglen <= WQ_MSG_INLINE)
        return r->m.in;
    if (r->msglen > WQ_MSG_MAX)
        return NULL;
    return (const char *)wq__keys_at(q, r->m.block, r->msglen);
}

/* Lock held: copy slot r's message with its NUL into buf (256 bytes);
   its length (0 for a damaged one). */
uint32_t wq__result_message(const shmq *q, const struct wq_rslot *r, char *buf)
{
    const char *m = msg_at(q, r);
    uint32_t n = m ? r->msglen : 0;
    memcpy(buf, m ? m : "", n);
    buf[n] = 0;
    return n;
}

/* Lock and busy held: the entry loses its result (if it has one). */
void wq__result_drop(shmq *q, uint32_t idx)
{
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    uint32_t s = e->rslot;
    if (s >= q->nres)
        return;
    h->r_busy = 1;
    e->rslot = WQ_NIL;
    WQ_STEP("result.detach");
    slot(q, s)->owner = 0;   /* commit: the result is gone */
    WQ_STEP("result.free");
    struct wq_rslot *r = slot(q, s);
    if (r->msglen > WQ_MSG_INLINE)
        wq__keys_give(q, r->m.block, r->msglen);   /* checks the block */
    r->msglen = 0;
    WQ_STEP("result.msgfree");
    unlink_slot(q, s);
    slot(q, s)->next = h->r_free;
    h->r_free = s;
    h->r_count--;
    WQ_STEP("result.freed");
    h->r_busy = 0;
}

/* Write an outcome into slot r; `own`: r is the entry's already, and a
   long message it has is given back once the new one is in. 0, or the
   arena's error (nothing changed). */
static int fill(shmq *q, struct wq_rslot *r, int code, const char *message, bool own)
{
    uint32_t len = message ? (uint32_t)strnlen(message, WQ_MSG_MAX) : 0, b = 0;
    uint32_t oldlen = own ? r->msglen : 0, oldb = r->m.block;
    if (len > WQ_MSG_INLINE) {
        int rc = wq__keys_take(q, len, &b);
        if (rc < 0)
            return rc;
        memcpy(q->karena + (uint64_t)b * WQ_KEY_GRAIN, message, len);
    }
    r->code = code;
    r->updated_ns = wq__now_real();
    r->seq = q->hdr->r_seq++;
    /* Empty while the message changes: a holder killed in between leaves
       an empty message, never the new bytes read with the old length. */
    r->msglen = 0;
    WQ_STEP("result.msg");
    if (len > WQ_MSG_INLINE)
        r->m.block = b;
    else
        memcpy(r->m.in, message ? message : "", len);
    WQ_STEP("result.msgset");
    r->msglen = len;
    if (oldlen > WQ_MSG_INLINE)
        wq__keys_give(q, oldb, oldlen);
    return 0;
}

/*
 * Lock held, before the mutation that records a result for idx: make
 * sure a slot can be had without growing the region inside it. 0, or
 * -ENOSPC when the region cannot grow (nothing changed).
 */
int wq__result_room(shmq *q, uint32_t idx, const char *message)
{
    const struct wq_hdr *h = q->hdr;
    uint32_t len = message ? (uint32_t)strnlen(message, WQ_MSG_MAX) : 0;
    if (len > WQ_MSG_INLINE) {   /* the message's block: listed, or room */
        int rc = wq__keys_room(q, len, WQ_GRAINS(len));
        if (rc < 0)
            return rc;
    }
    if (wq__entry(q, idx)->rslot < q->nres || h->r_free < q->nres ||
        h->r_fresh >= q->result_capacity)
        return 0;   /* its own slot, a free one, or the oldest to evict */
    return wq__region_grow_results(q, h->r_fresh + 1);
}

/* Lock and busy held; idx is live. Record (or replace) its result. */
int wq__result_record(shmq *q, uint32_t idx, int code, const char *message)
{
    struct wq_hdr *h = q->hdr;
    struct wq_entry *e = wq__entry(q, idx);
    uint32_t s = e->rslot;
    if (s < q->nres) {   /* replace in place, move to the tail */
        h->r_busy = 1;
        int rc = fill(q, slot(q, s), code, message, true);
        if (rc < 0)
            return rc;   /* r_busy stays: repair looks at the table */
        WQ_STEP("result.update");
        unlink_slot(q, s);
        append_slot(q, s);
        h->r_busy = 0;
        return 0;
    }
    if (h->r_free >= q->nres && h->r_fresh >= q->result_capacity) {
        /* full: evict the oldest */
        uint32_t old = h->r_head;
        if (old >= q->nres || slot(q, old)->owner == 0 ||
            slot(q, old)->owner > q->nent)
            return -EBADMSG;
        uint32_t victim = slot(q, old)->owner - 1;
        wq__result_drop(q, victim);
        struct wq_entry *v = wq__entry(q, victim);
        if (wq__st(v) == WQ_ST_RETAINED && v->failures == 0) {
            int rc = wq__entry_release(q, victim, true);   /* kept for nothing now */
            if (rc < 0)
                return rc;
        }
    }
    h->r_busy = 1;
    s = h->r_free;
    if (s < q->nres) {
        h->r_free = slot(q, s)->next;
    } else if (h->r_fresh < q->nres) {   /* wq__result_room grew it */
        s = h->r_fresh++;   /* lost if we die before the owner store: repair
                               finds it free (owner 0) below r_fresh */
    } else {
        h->r_busy = 0;
        return h->r_fresh < q->result_capacity ? -ENOSPC : -EBADMSG;
    }
    struct wq_rslot *r = slot(q, s);
    int rc = fill(q, r, code, message, false);
    if (rc < 0)
        return rc;   /* the slot is free still (owner 0); r_busy stays */
    WQ_STEP("result.fill");
    r->owner = idx + 1;   /* commit */
    WQ_STEP("result.owner");
    e->rslot = s;
    append_slot(q, s);
    h->r_count++;
    WQ_STEP("result.linked");
    h->r_busy = 0;
    return 0;
}

static int cmp_seq(const void *a, const void *b, void *arg)
{
    const shmq *q = arg;
    uint64_t x = q->rslots[*(const uint32_t *)a].seq, y = q->rslots[*(const uint32_t *)b].seq;
    return x < y ? -1 : x > y;
}

/*
 * Repair, after the entries were normalised: keep the slots whose owner
 * entry is live (or retained) and points back; free the rest; rebuild the
 * update-order list (sorted on seq) and the free list. Entries pointing at
 * a slot that is not theirs lose the pointer.
 */
/* Slots ever used: r_fresh, or all of them if the header says more. */
static uint32_t used_part(const shmq *q)
{
    uint32_t f = q->hdr->r_fresh;
    return f <= q->nres ? f : q->nres;
}

/* Repair: entry idx has a result that wq__results_rebuild keeps (the
   test it applies to an entry that points at its slot). */
bool wq__result_kept(const shmq *q, uint32_t idx)
{
    uint32_t s = wq__entry(q, idx)->rslot;
    return s < used_part(q) && slot(q, s)->owner == idx + 1;
}

void wq__results_rebuild(shmq *q)
{
    struct wq_hdr *h = q->hdr;
    uint32_t n = 0, fresh = used_part(q);
    h->r_fresh = fresh;
    for (uint32_t i = 0, used = wq__entries_used(q); i < used; i++) {
        struct wq_entry *e = wq__entry(q, i);
        if (e->rslot != WQ_NIL && (wq__st(e) == 0 || e->rslot >= fresh ||
                                   slot(q, e->rslot)->owner != i + 1))
            e->rslot = WQ_NIL;
    }
    /* Allocated on first need: repairs of the results table are rare, and
       result_capacity * 4 bytes per handle is not worth holding for them.
       Without it the list keeps slot order instead of update order. */
    if (!q->rscratch)
        q->rscratch = calloc(q->result_capacity, sizeof *q->rscratch);
    h->r_free = WQ_NIL;
    for (uint32_t s = fresh; s-- > 0;) {
        struct wq_rslot *r = slot(q, s);
        uint32_t o = r->owner;
        struct wq_entry *e = o != 0 && o <= wq__entries_used(q) ? wq__entry(q, o - 1) : NULL;
        /* The owner store commits a result: adopt it if the entry's back
           pointer was not written yet. */
        if (e && wq__st(e) != 0 && (e->rslot == s || e->rslot == WQ_NIL)) {
            e->rslot = s;
            if (q->rscratch)
                q->rscratch[n] = s;
            n++;
            continue;
        }
        r->owner = 0;
        r->msglen = 0;   /* its block is the arena's again (keys.c) */
        r->next = h->r_free;
        h->r_free = s;
    }
    h->r_head = h->r_tail = WQ_NIL;
    if (q->rscratch) {
        qsort_r(q->rscratch, n, sizeof *q->rscratch, cmp_seq, q);
        for (uint32_t k = 0; k < n; k++)
            append_slot(q, q->rscratch[k]);
    } else {
        for (uint32_t s = 0; s < fresh; s++)
            if (slot(q, s)->owner != 0)
                append_slot(q, s);
    }
    h->r_count = n;
    if (n > 0 && slot(q, h->r_tail)->seq >= h->r_seq)
        h->r_seq = slot(q, h->r_tail)->seq + 1;
    h->r_busy = 0;
}

/* Repair: does the table need wq__results_rebuild? Only when a change to
   it was cut short, or an entry holding a result was freed or lost its
   back pointer: O(entries with results) otherwise, not O(result_capacity). */
bool wq__results_damaged(shmq *q)
{
    if (q->hdr->r_busy || q->hdr->r_fresh > q->nres)
        return true;
    for (uint32_t i = 0, used = wq__entries_used(q); i < used; i++) {
        const struct wq_entry *e = wq__entry(q, i);
        if (e->rslot == WQ_NIL)
            continue;
        if (wq__st(e) == 0 || e->rslot >= q->hdr->r_fresh ||
            slot(q, e->rslot)->owner != i + 1)
            return true;
    }
    return false;
}

/* Check only: ownership both ways, the list, the free list, the count. */
int wq__results_verify(shmq *q, void (*violation)(void *c, const char *what), void *c)
{
    struct wq_hdr *h = q->hdr;
    char what[128];
    int found = 0;
#define BAD(...) do { snprintf(what, sizeof what, __VA_ARGS__); violation(c, what); \
                      found++; } while (0)
    uint32_t used = 0, fresh = used_part(q);
    if (h->r_fresh > q->nres)
        BAD("results: %u slots used so far, %u reserved", h->r_fresh, q->nres);
    for (uint32_t s = 0; s < fresh; s++) {
        uint32_t o = slot(q, s)->owner;
        if (o == 0)
            continue;
        used++;
        if (o > wq__entries_used(q) || wq__entry(q, o - 1)->rslot != s ||
            wq__st(wq__entry(q, o - 1)) == 0)
            BAD("result slot %u: owner entry %u does not point back", s, o - 1);
    }
    for (uint32_t i = 0, n = wq__entries_used(q); i < n; i++) {
        uint32_t s = wq__entry(q, i)->rslot;
        if (s != WQ_NIL && (s >= fresh || slot(q, s)->owner != i + 1))
            BAD("entry %u: result slot %u is not its own", i, s);
    }
    if (used != h->r_count)
        BAD("results: %u used slots, counter says %u", used, h->r_count);
    uint32_t n = 0, prev = WQ_NIL;
    uint64_t seq = 0;
    for (uint32_t s = h->r_head; s != WQ_NIL; prev = s, s = slot(q, s)->next) {
        if (s >= fresh || n++ > q->result_capacity) {
            BAD("results list: bad link %u", s);
            break;
        }
        struct wq_rslot *r = slot(q, s);
        if (r->owner == 0 || r->prev != prev || (n > 1 && r->seq < seq))
            BAD("results list: slot %u out of place", s);
        seq = r->seq;
    }
    if (n != used || h->r_tail != prev)
        BAD("results list: %u slots listed, %u used", n, used);
    n = 0;
    for (uint32_t s = h->r_free; s != WQ_NIL; s = slot(q, s)->next) {
        if (s >= fresh || n++ > q->result_capacity || slot(q, s)->owner != 0) {
            BAD("results free list: bad slot %u", s);
            break;
        }
    }
    if (n != fresh - used)
        BAD("results free list: %u slots, expected %u", n, fresh - used);
#undef BAD
    return found;
}

int wq__results_mark(shmq *q, uint64_t *map, bool apply,
                     void (*bad)(void *c, const char *what), void *c)
{
    char what[160];
    int found = 0;
    for (uint32_t s = 0, fresh = used_part(q); s < fresh; s++) {
        struct wq_rslot *r = slot(q, s);
        if (r->owner == 0 || r->msglen <= WQ_MSG_INLINE)
            continue;
        if (r->msglen <= WQ_MSG_MAX && msg_at(q, r) &&
            wq__keys_mark(q, map, r->m.block, r->msglen) == 0)
            continue;
        found++;
        if (bad) {
            snprintf(what, sizeof what, "result slot %u: message of %u bytes at granule %u "
                     "outside the key arena or sharing bytes, emptied", s, r->msglen,
                     r->m.block);
            bad(c, what);
        }
        if (apply)
            r->msglen = 0;
    }
    return found;
}

/* Lock held: what wq_result and wq_dump report for an entry. */
void wq__result_read(const shmq *q, const struct wq_entry *e, struct wq_result *out)
{
    memset(out, 0, sizeof *out);
    out->state = WQ_STATE_NONE;
    if (wq__has_result(q, e)) {
        const struct wq_rslot *r = slot(q, e->rslot);
        out->state = r->code == 0 ? WQ_STATE_SUCCEEDED : WQ_STATE_FAILED;
        out->code = r->code;
        out->updated_ns = r->updated_ns;
        wq__result_message(q, r, out->message);
    }
    if (e->state & WQ_ST_PROCESSING)
        out->state = WQ_STATE_RUNNING;
    else if (e->state & (WQ_ST_QUEUED | WQ_ST_DIRTY | WQ_ST_WAITING | WQ_ST_STORING))
        out->state = WQ_STATE_PENDING;
}

int wq__shm_result(wq *pub, const void *key, size_t len, struct wq_result *out)
{
    shmq *q = wq__shm(pub);
    uint32_t idx;
    int rc = wq__lock_lookup(q, key, len, &idx);
    if (rc < 0)
        return rc;
    struct wq_result res;
    memset(&res, 0, sizeof res);
    res.state = WQ_STATE_NONE;
    if (idx != WQ_NIL)
        wq__result_read(q, wq__entry(q, idx), &res);
    wq__unlock(q);
    *out = res;
    return 0;
}
