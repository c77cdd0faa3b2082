/*
 * table.c - the open-addressed key index and the entry allocator.
 *
 * Entries are fixed-size key slots (layout.h); the index maps a key to
 * its entry. Index slots hold (entry + 1, hash32): probing compares the
 * 32-bit hash first and touches the entry only on a match. Linear probing
 * from home = hash * slots >> 32 (no modulo, any table size); deletion
 * shifts later members of the cluster back into the hole (backward-shift
 * deletion), so there are no tombstones and the table does not degrade
 * however many keys come and go. The table has more slots than entries,
 * so a probe always ends at an empty slot; loops are still bounded by the
 * slot count so a corrupt index cannot hang us.
 *
 * Free entries form a LIFO list through entry->link: the most recently
 * freed entry, still in cache, is reused first. When it is empty while
 * fewer than capacity keys are live, an idle entry kept only for its
 * failure count (RETAINED) is evicted instead (see wq_forget in wq.h). The list is a cache of
 * the entry states (state == 0 means free) and is rebuilt by repair.
 *
 * Every entry index read from shared memory is checked against the
 * handle's private capacity; a bad one yields WQ_LOOKUP_CORRUPT/-EBADMSG.
 */
#include <errno.h>

#include "internal.h"

static inline uint32_t next_slot(const wq *q, uint32_t i)
{
    return i + 1 == q->index_slots ? 0 : i + 1;
}

uint32_t wq__table_lookup(wq *q, const void *key, size_t len, uint32_t hash)
{
    uint32_t i = wq__home(q, hash);
    for (uint32_t n = 0; n < q->index_slots; n++, i = next_slot(q, i)) {
        struct wq_islot s = q->index[i];
        if (s.ref == 0)
            return WQ_NIL;
        if (s.hash != hash)
            continue;
        uint32_t idx = s.ref - 1;
        if (WQ_UNLIKELY(idx >= q->capacity))
            return WQ_LOOKUP_CORRUPT;
        struct wq_entry *e = wq__entry(q, idx);
        if (e->keylen == len && memcmp(e->key, key, len) == 0)
            return idx;
    }
    return WQ_LOOKUP_CORRUPT;
}

/*
 * The prologue of the calls that look one key up: check the key, hash
 * it, take the lock, find it. Returns 0 with the lock held and *idx the
 * entry or WQ_NIL; or a negative errno without the lock.
 */
int wq__lock_lookup(wq *q, const void *key, size_t len, uint32_t *idx)
{
    if (!q)
        return -EINVAL;
    int rc = wq__key_ok(q, key, len);
    if (rc < 0)
        return rc;
    uint32_t hash = wq__hash(q->seed, key, len);
    if ((rc = wq__lock(q)) < 0)
        return rc;
    *idx = wq__table_lookup(q, key, len, hash);
    if (*idx == WQ_LOOKUP_CORRUPT) {
        wq__unlock(q);
        return -EBADMSG;
    }
    return 0;
}

int wq__table_insert(wq *q, uint32_t idx, uint32_t hash)
{
    uint32_t i = wq__home(q, hash);
    for (uint32_t n = 0; n < q->index_slots; n++, i = next_slot(q, i)) {
        if (q->index[i].ref == 0) {
            q->index[i].hash = hash;
            WQ_STEP("table.insert.hash");
            q->index[i].ref = idx + 1;   /* publishes the slot */
            return 0;
        }
    }
    return -EBADMSG;
}

int wq__table_remove(wq *q, uint32_t idx, uint32_t hash)
{
    uint32_t i = wq__home(q, hash), n;
    for (n = 0; n < q->index_slots; n++, i = next_slot(q, i)) {
        uint32_t ref = q->index[i].ref;
        if (ref == 0)
            return -EBADMSG;    /* live entry missing from the index */
        if (ref == idx + 1)
            break;
    }
    if (n == q->index_slots)
        return -EBADMSG;
    /* Backward shift: move each later cluster member whose home is at or
       before the hole (cyclically) into the hole. */
    uint32_t hole = i, j = next_slot(q, i);
    for (n = 0; n < q->index_slots; n++, j = next_slot(q, j)) {
        struct wq_islot s = q->index[j];
        if (s.ref == 0)
            break;
        uint32_t home = wq__home(q, s.hash);
        uint32_t dist_home = j >= home ? j - home : j + q->index_slots - home;
        uint32_t dist_hole = j >= hole ? j - hole : j + q->index_slots - hole;
        if (dist_home >= dist_hole) {
            q->index[hole] = s;
            WQ_STEP("table.remove.shift");
            hole = j;
        }
    }
    q->index[hole].ref = 0;
    return 0;
}

/* Lock held, busy set. No free entry while live < capacity means some
   entries are RETAINED (idle, kept for a failure count): drop the first
   one the clock hand finds. The hand persists, so over time eviction
   goes round the table, roughly oldest first. */
static uint32_t evict_retained(wq *q)
{
    struct wq_hdr *h = q->hdr;
    if (h->failing == 0)
        return WQ_NIL;
    uint32_t i = h->evict_hand < q->capacity ? h->evict_hand : 0;
    for (uint32_t n = 0; n < q->capacity; n++, i = i + 1 == q->capacity ? 0 : i + 1) {
        struct wq_entry *e = wq__entry(q, i);
        if (wq__st(e) != WQ_ST_RETAINED)
            continue;
        h->evict_hand = i + 1;
        if (q->g.has_store) {
            /* Its record must leave the store first: a zombie now, freed
               by the flush the caller runs before trying again. */
            wq__release(q, i);
            return WQ_EVICTING;
        }
        wq__result_drop(q, i);
        e->state = 0;   /* commit: its failure count is gone */
        WQ_STEP("evict.state");
        if (wq__table_remove(q, i, e->hash) < 0)
            return WQ_LOOKUP_CORRUPT;
        WQ_STEP("evict.index");
        h->failing--;
        h->evict_hand = i + 1;
        return i;
    }
    return WQ_LOOKUP_CORRUPT;   /* failing > 0 but none found */
}

uint32_t wq__entry_alloc(wq *q)
{
    uint32_t idx = q->hdr->free_head;
    if (idx == WQ_NIL)
        return evict_retained(q);
    if (WQ_UNLIKELY(idx >= q->capacity))
        return WQ_LOOKUP_CORRUPT;
    struct wq_entry *e = wq__entry(q, idx);
    if (WQ_UNLIKELY(e->state != 0))
        return WQ_LOOKUP_CORRUPT;
    q->hdr->free_head = e->link;
    return idx;
}

void wq__entry_free(wq *q, uint32_t idx)
{
    struct wq_entry *e = wq__entry(q, idx);
    e->link = q->hdr->free_head;
    WQ_STEP("table.free.link");
    q->hdr->free_head = idx;
}
