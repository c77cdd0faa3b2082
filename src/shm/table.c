/*
 * table.c - the open-addressed key index. Data structure only.
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
 * The index is a cache of the entries (every entry with a state is in it
 * once) and is rebuilt by repair. The free-entry list lives in entry.c.
 *
 * Every entry index read from shared memory is checked against the
 * entries reserved (q->nent); a bad one yields WQ_CORRUPT / -EBADMSG.
 */
#include "shm.h"

static inline uint32_t next_slot(const shmq *q, uint32_t i)
{
    return i + 1 == q->index_slots ? 0 : i + 1;
}

uint32_t wq__table_lookup(shmq *q, const void *key, size_t len, uint32_t hash)
{
    WQ_ASSERT_LOCKED(q);
    uint32_t i = wq__home(q, hash);
    for (uint32_t n = 0; n < q->index_slots; n++, i = next_slot(q, i)) {
        struct wq_islot s = q->index[i];
        if (s.ref == 0)
            return WQ_NIL;
        if (s.hash != hash)
            continue;
        uint32_t idx = s.ref - 1;
        if (WQ_UNLIKELY(idx >= q->nent))
            break;
        struct wq_entry *e = wq__entry(q, idx);
        if (e->keylen == len && memcmp(e->key, key, len) == 0)
            return idx;
    }
    wq__region_mark_corrupt(q);   /* a slot past the entries, or no empty slot */
    return WQ_CORRUPT;
}

/*
 * The prologue of the calls that look one key up (api.c checked the
 * key): hash it, take the lock, find it. Returns 0 with the lock held and *idx the
 * entry or WQ_NIL; or a negative errno without the lock.
 */
int wq__lock_lookup(shmq *q, const void *key, size_t len, uint32_t *idx)
{
    uint32_t hash = wq__hash(q->seed, key, len);
    int rc;
    if ((rc = wq__lock(q)) < 0)
        return rc;
    *idx = wq__table_lookup(q, key, len, hash);
    if (*idx == WQ_CORRUPT) {
        wq__unlock(q);
        return -EBADMSG;
    }
    return 0;
}

int wq__table_insert(shmq *q, uint32_t idx, uint32_t hash)
{
    WQ_ASSERT_MUTATING(q);
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

int wq__table_remove(shmq *q, uint32_t idx, uint32_t hash)
{
    WQ_ASSERT_MUTATING(q);
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
