/*
 * table.c - the open-addressed key index. Data structure only.
 *
 * Entries are fixed-size key slots (layout.h); the index maps a key to
 * its entry. An index slot is one 32-bit word: the entry + 1, and above
 * it a tag of the key's distance from its home slot and a fragment of
 * its hash (layout.h). A probe touches the entry only when the tag is
 * the one this key would have there, and a removal's backward shift
 * reads a moved slot's home from the distance, not from its entry. The
 * word is 4 bytes so that the index costs 8 to 16 bytes per key at its
 * load of 0.25 to 0.5, not the 16 to 32 of an (entry, hash) pair
 * (issue 16: footprint); a shift reads the entry only for distances of
 * 15 or more, which a load of 0.5 makes rare (or always, at capacities
 * from 2^24, whose tags hold no distance), and a growth reads every
 * entry, for each key's whole hash and its home in the larger table.
 * Linear probing
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
 * Size. The table keeps at least 2 * used + 1 slots for the entries ever
 * used (e_fresh), so its load stays at most 0.5 and a probe always ends
 * at an empty slot; a full queue's table has index_max = 2 * capacity + 1
 * slots. It starts at one page and doubles: a new key that would pass
 * the bound first has the table built in the other index area, twice
 * as large, from the entries, which is then published by one store of
 * hdr->index_at, and the old area's pages go back to the system.
 * A holder that dies during the build leaves the old table in use and
 * intact; one that dies after the switch leaves the old pages reserved,
 * which the next locker gives back (lock.c). A growth never shrinks the
 * table; repair builds it afresh at the size for the entries used. Each
 * process reads hdr->index_at at its next lock (region.c).
 *
 * Every entry index read from shared memory is checked against the
 * entries reserved (q->nent); a bad one yields WQ_CORRUPT / -EBADMSG.
 */
#include "shm.h"

static inline uint32_t next_slot(const shmq *q, uint32_t i)
{
    return i + 1 == q->index_slots ? 0 : i + 1;
}

void wq__table_format(shmq *q)
{
    uint32_t bits = 32 - (uint32_t)__builtin_clz(q->capacity | 1);
    uint32_t tag = 32 - bits, dist = tag >= 8 ? 4 : 0, frag = tag - dist;
    q->ibits = bits;
    q->irmask = bits >= 32 ? UINT32_MAX : (1u << bits) - 1;
    q->ifmask = (1u << frag) - 1;   /* frag <= 27 */
    q->ifshift = frag ? bits : 0;
    q->idmax = (1u << dist) - 1;
    q->idshift = dist ? bits + frag : 0;
}

/* The tag's parts: the hash fragment, once per key; with the distance. */
static inline uint32_t frag_of(const shmq *q, uint32_t hash)
{
    return (hash & q->ifmask) << q->ifshift;
}

static inline uint32_t tag_at(const shmq *q, uint32_t frag, uint32_t dist)
{
    return frag | (dist < q->idmax ? dist : q->idmax) << q->idshift;
}

uint32_t wq__table_tag(const shmq *q, uint32_t hash, uint32_t dist)
{
    return tag_at(q, frag_of(q, hash), dist);
}

/* The distance field's bits of a slot word. */
static inline uint32_t dist_mask(const shmq *q)
{
    return q->idmax << q->idshift;
}

/* Put (idx, hash) in the first empty slot from its home: one store. */
static int put(const shmq *q, struct wq_islot *t, uint32_t slots, uint32_t idx, uint32_t hash)
{
    uint32_t i = wq__home_in(slots, hash);
    for (uint32_t n = 0; n < slots; n++, i = i + 1 == slots ? 0 : i + 1) {
        if (t[i].w == 0) {
            WQ_STEP("table.insert");
            t[i].w = tag_at(q, frag_of(q, hash), n) | (idx + 1);
            return 0;
        }
    }
    return -EBADMSG;
}

uint32_t wq__table_lookup(shmq *q, const void *key, size_t len, uint32_t hash)
{
    WQ_ASSERT_LOCKED(q);
    uint32_t i = wq__home(q, hash), rm = q->irmask, frag = frag_of(q, hash);
    for (uint32_t n = 0; n < q->index_slots; n++, i = next_slot(q, i)) {
        uint32_t w = q->index[i].w;
        if (w == 0)
            return WQ_NIL;
        if ((w & ~rm) != tag_at(q, frag, n))
            continue;
        uint32_t idx = (w & rm) - 1;
        if (WQ_UNLIKELY(idx >= q->nent))
            break;
        struct wq_entry *e = wq__entry(q, idx);
        const unsigned char *r = wq__key_rest(q, e);
        if (WQ_UNLIKELY(!r))
            break;
        /* Not e->hash: a damaged one must not hide its key from the
           done that will find the damage (the key's bytes decide). */
        if (e->keylen == len && wq__key_match(e, r, key, len))
            return idx;
    }
    wq__region_mark_corrupt(q);   /* a slot past the entries or naming a damaged
                                     key, or no empty slot */
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
    if ((rc = wq__lock_look(q)) < 0)   /* none of its callers needs a slot */
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
    return put(q, q->index, q->index_slots, idx, hash);
}

/* Publish the table of `slots` slots in area as the one in use. */
static void switch_to(shmq *q, unsigned area, uint32_t slots)
{
    uint64_t at = (uint64_t)area << 32 | slots;
    q->hdr->index_at = at;   /* commit */
    wq__index_view(q, area, slots);
    q->index_seen = at;
}

int wq__table_grow(shmq *q, uint32_t need)
{
    WQ_ASSERT_LOCKED(q);
    if (need <= q->index_cover)
        return 0;
    if (WQ_UNLIKELY(q->index_slots == 0)) {
        wq__region_mark_corrupt(q);   /* a damaged word: repair builds one */
        return -EBADMSG;
    }
    unsigned from = q->index == q->iarea[1], to = !from;
    uint32_t slots = wq__index_size(q->index_max, need);
    /* Pages the system gives are zero: empty the area first (a no-op
       unless a death or a failed release left an earlier table's pages
       there) instead of clearing them again (21 of 44 ms of a doubling
       to 4M slots on the 2-vCPU VM). */
    wq__region_release_area(q, false, to, 0);
    int rc = wq__region_reserve_area(q, false, to, slots);
    if (rc < 0)
        return rc;
    /* The larger table's homes need each key's whole hash, which only
       the entries hold: read them in order (every entry with a state is
       a member, above; a growth runs before an entry is taken), aiming
       at their new slots ahead. Reading the old table instead sent each
       key to a random entry: filling 1e5 keys took 12% longer. Each
       hash is checked against its key first: the old table found a key
       by its own copy of the hash, so a damaged one was met by the
       key's next removal; placed by a damaged hash, the key would be
       lost to lookups with nothing flagged. */
    enum { AHEAD = 16 };
    struct wq_islot *t = q->iarea[to];
    unsigned char kb[WQ_MAX_KEY_LEN];
    uint32_t used = wq__entries_used(q);
    for (uint32_t idx = 0; idx < used; idx++) {
        if (idx == used / 2)
            WQ_STEP("table.grow.copy");
        if (idx + AHEAD < used)
            __builtin_prefetch(&t[wq__home_in(slots, wq__entry(q, idx + AHEAD)->hash)], 1);
        const struct wq_entry *e = wq__entry(q, idx);
        if (e->state == 0)
            continue;
        const unsigned char *k = wq__key(q, e, kb);
        if (WQ_UNLIKELY(!k || wq__hash(q->seed, k, e->keylen) != e->hash)) {
            wq__region_mark_corrupt(q);   /* the old table stays; repair mends it */
            return -EBADMSG;
        }
        if (put(q, t, slots, idx, e->hash) < 0)
            return -EBADMSG;   /* cannot be: the new table is larger */
    }
    switch_to(q, to, slots);
    WQ_STEP("table.grow.switch");
    wq__region_release_area(q, false, from, 0);
    return 0;
}

int wq__table_rebuild(shmq *q, void (*dup)(void *c, uint32_t idx, uint32_t other, uint16_t st),
                      void *c)
{
    WQ_ASSERT_LOCKED(q);
    enum { AHEAD = 16 };
    uint32_t used = wq__entries_used(q);
    uint32_t slots = wq__index_size(q->index_max, used);
    unsigned area = q->index_slots > 0 && q->index == q->iarea[1];
    /* In place: the entries are the source, whatever the table held. */
    int rc = wq__region_reserve_area(q, false, area, slots);
    if (rc < 0)
        return rc;
    wq__index_view(q, area, slots);
    memset(q->index, 0, (size_t)slots * sizeof *q->index);
    unsigned char kb[WQ_MAX_KEY_LEN];
    for (uint32_t idx = 0; idx < used; idx++) {
        if (idx + AHEAD < used) {
            const struct wq_entry *f = wq__entry(q, idx + AHEAD);
            __builtin_prefetch(&q->index[wq__home(q, f->hash)], 1);
        }
        struct wq_entry *e = wq__entry(q, idx);
        if (e->state == 0)
            continue;
        const unsigned char *k = wq__key(q, e, kb);
        uint32_t other = k ? wq__table_lookup(q, k, e->keylen, e->hash) : WQ_CORRUPT;
        if (other != WQ_NIL) {
            uint16_t st = e->state;
            wq_store_release(&e->state, 0);
            dup(c, idx, other, st);
            continue;
        }
        if ((rc = put(q, q->index, slots, idx, e->hash)) < 0)
            return rc;
    }
    switch_to(q, area, slots);
    wq__region_release_area(q, false, area, slots);   /* it may have been larger */
    wq__region_release_area(q, false, !area, 0);
    return 0;
}

/* The distance of the key in slot j (word w) from its home slot: from
   the tag, or from its entry's hash when the tag holds none or only
   "15 or more". WQ_CORRUPT for a word naming no entry, or an entry
   whose hash puts it nearer than its tag says (a damaged hash, which a
   shift would otherwise move in front of its home unnoticed). */
static uint32_t dist_of(shmq *q, uint32_t j, uint32_t w)
{
    uint32_t idx = (w & q->irmask) - 1;
    if (WQ_UNLIKELY(idx >= q->nent))
        return WQ_CORRUPT;
    uint32_t d = (w >> q->idshift) & q->idmax;
    if (d < q->idmax)
        return d;
    uint32_t home = wq__home(q, wq__entry(q, idx)->hash);
    d = wq__index_dist(q, home, j);
    return d < q->idmax ? WQ_CORRUPT : d;
}

int wq__table_remove(shmq *q, uint32_t idx, uint32_t hash)
{
    WQ_ASSERT_MUTATING(q);
    uint32_t i = wq__home(q, hash), n, rm = q->irmask;
    for (n = 0; n < q->index_slots; n++, i = next_slot(q, i)) {
        uint32_t w = q->index[i].w;
        if (w == 0)
            return -EBADMSG;    /* live entry missing from the index */
        if ((w & rm) == idx + 1)
            break;
    }
    if (n == q->index_slots)
        return -EBADMSG;
    /* Backward shift: move each later cluster member whose home is at or
       before the hole (cyclically) into the hole, a distance shorter by
       as many slots as it moves. */
    uint32_t hole = i, j = next_slot(q, i), dm = dist_mask(q);
    for (n = 0; n < q->index_slots; n++, j = next_slot(q, j)) {
        uint32_t w = q->index[j].w;
        if (w == 0)
            break;
        uint32_t dist_home = dist_of(q, j, w);
        if (WQ_UNLIKELY(dist_home == WQ_CORRUPT)) {
            wq__region_mark_corrupt(q);
            return -EBADMSG;
        }
        uint32_t dist_hole = wq__index_dist(q, hole, j);
        if (dist_home >= dist_hole) {
            uint32_t d = dist_home - dist_hole;
            q->index[hole].w = (w & ~dm) | tag_at(q, 0, d);
            WQ_STEP("table.remove.shift");
            hole = j;
        }
    }
    q->index[hole].w = 0;
    return 0;
}
