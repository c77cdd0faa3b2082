/*
 * keys.c - the key arena: where keys longer than an entry holds, and
 * result messages longer than a result slot holds, live.
 *
 * A key of up to WQ_KEY_INLINE bytes is stored in its entry, a message of
 * up to WQ_MSG_INLINE in its result slot (layout.h). A longer key keeps
 * its first WQ_KEY_PRE bytes in its entry and the rest in a block of
 * whole granules (WQ_KEY_GRAIN bytes) in the arena, a longer message all
 * of itself, so a key costs its own length less 12 rounded up to 8, not
 * max_key_len, and a message its own, not 255 bytes. A block comes from
 * the free list of its size (kfree[n], n granules; LIFO through the
 * block's first word, granule + 1, 0 ending it, so the block freed last,
 * still in cache, is reused first), else from the top of the arena
 * (k_top), whose pages grow (region.c) like the entries'.
 *
 * Blocks are neither split nor merged while keys come and go: a workload
 * whose key lengths shift keeps blocks of the old lengths listed. When
 * the top reaches the end of the arena, the lists are rebuilt from the
 * entries (compact below), which merges neighbouring free granules, and
 * the first listed block at least as large is split. After a rebuild
 * every gap lies before a live block and is shorter than the block asked
 * for (else that gap would serve), so live blocks and gaps take at most
 * the most that can be live (`capacity` keys of max_key_len with a run
 * record each, `result_capacity` messages of 255 bytes) and a gap of one
 * granule less than the longest block beside each of them; the arena is
 * that much virtual room and one longest block more (region.c), so the
 * block asked for is then free at the top. Only an arena clamped to 2^32
 * granules (32 GiB) can be full.
 *
 * Processing keys' run records (layout.h, struct wq_run) live here too,
 * in blocks of WQ_RUN_GRAINS: who holds a key costs memory only while
 * someone does.
 *
 * Crash protocol (mutate.h): the entries and result slots are the truth.
 * An entry that is not free owns the block its key names, a processing
 * entry also the block its run names, a used result slot the block its
 * message names, and nothing else owns them; every other granule below
 * k_top is free. A block taken and not yet
 * named by a committed entry, or given back and not yet listed, is only
 * lost until the next repair, which rebuilds every list from the
 * entries and slots the same way (wq__keys_rebuild). A granule number read from
 * the region is checked against the arena's bounds before it is used;
 * one that fails flags the region for repair.
 */
#include <stdlib.h>

#include "shm.h"

static inline uint32_t *link_at(const shmq *q, uint32_t b)
{
    return (uint32_t *)(q->karena + (uint64_t)b * WQ_KEY_GRAIN);
}

/* The granules handed out: what the header says, within the pages. */
static inline uint32_t top_of(const shmq *q)
{
    uint32_t top = q->hdr->k_top;
    return top < q->nkeys ? top : q->nkeys;
}

static void push(shmq *q, uint32_t b, uint32_t n)
{
    *link_at(q, b) = q->kfree[n];
    WQ_STEP("keys.link");
    q->kfree[n] = b + 1;
}

/* Pop a block of list n: 1, 0 when empty, -EBADMSG when damaged. */
static int pop(shmq *q, uint32_t n, uint32_t *out)
{
    uint32_t top = q->hdr->k_top, head = q->kfree[n];
    if (head == 0)
        return 0;
    uint32_t b = head - 1, next = 0;
    if (WQ_LIKELY(top <= q->nkeys && b < top && top - b >= n))
        next = *link_at(q, b);
    else
        return wq__region_mark_corrupt(q);
    if (WQ_UNLIKELY(next != 0 && (next - 1 >= top || top - (next - 1) < n)))
        return wq__region_mark_corrupt(q);
    q->kfree[n] = next;
    WQ_STEP("keys.pop");
    *out = b;
    return 1;
}

int wq__keys_mark(const shmq *q, uint64_t *map, uint32_t block, uint32_t len)
{
    uint64_t end = (uint64_t)block + WQ_GRAINS(len);
    if (end > top_of(q))
        return -1;
    for (uint32_t i = block; i < (uint32_t)end; i++)
        if (map[i / 64] >> (i % 64) & 1)
            return -1;
    for (uint32_t i = block; i < (uint32_t)end; i++)
        map[i / 64] |= 1ull << (i % 64);
    return 0;
}

void wq__keys_unmark(uint64_t *map, uint32_t block, uint32_t len)
{
    for (uint32_t i = block, end = i + WQ_GRAINS(len); i < end; i++)
        map[i / 64] &= ~(1ull << (i % 64));
}

/* How many granules from i on, within i's word, are as live as i. */
static uint32_t run_at(const uint64_t *map, uint32_t i, bool *live)
{
    uint64_t w = map[i / 64] >> (i % 64);
    uint32_t rem = 64 - i % 64;
    *live = w & 1;
    uint64_t x = *live ? ~w : w;   /* its trailing zeros are the run */
    uint32_t run = x ? (uint32_t)__builtin_ctzll(x) : rem;
    return run < rem ? run : rem;
}

uint64_t *wq__keys_map(const shmq *q)
{
    return calloc((size_t)top_of(q) / 64 + 1, sizeof(uint64_t));
}

/*
 * Lock and busy held: the lists and the top afresh from a map of the
 * live blocks: the top ends at the last live block, and every run of
 * free granules below it is listed in blocks of at most the longest
 * key's size.
 */
void wq__keys_rebuild(shmq *q, const uint64_t *map)
{
    if (q->g.key_classes == 0)
        return;
    uint32_t top = top_of(q), maxn = q->g.key_classes - 1, end = 0;
    memset(q->kfree, 0, (size_t)q->g.key_classes * sizeof *q->kfree);
    for (uint32_t w = (uint32_t)(((uint64_t)top + 63) / 64); w-- > 0;) {
        uint64_t bits = map[w];
        if (w == top / 64)
            bits &= (1ull << (top % 64)) - 1;
        if (bits) {
            end = w * 64 + 64 - (uint32_t)__builtin_clzll(bits);
            break;
        }
    }
    for (uint32_t i = 0; i < end;) {
        bool live;
        uint32_t run = run_at(map, i, &live);
        if (run > end - i)
            run = end - i;
        for (uint32_t left = live ? 0 : run, b = i; left > 0;) {
            uint32_t n = left < maxn ? left : maxn;
            push(q, b, n);
            b += n;
            left -= n;
        }
        i += run;
    }
    q->hdr->k_top = end;
}

/* Check only: every listed block lies below the top, in the list of its
   size, apart from every live block and every other listed one; the
   live and listed granules make up the whole of [0, k_top). */
void wq__keys_verify(const shmq *q, uint64_t *map, void (*bad)(void *c, const char *what),
                     void *c)
{
    char msg[160];
    uint32_t top = q->hdr->k_top;
    if (top > q->nkeys) {
        snprintf(msg, sizeof msg, "key arena: top %u past its %u granules", top, q->nkeys);
        bad(c, msg);
        return;
    }
    for (uint32_t n = 1; n < q->g.key_classes; n++) {
        uint32_t steps = 0;
        for (uint32_t ref = q->kfree[n]; ref != 0; ref = *link_at(q, ref - 1)) {
            uint32_t b = ref - 1;
            if (b >= top || top - b < n || ++steps > top) {
                snprintf(msg, sizeof msg, "key arena: list %u: block %u of %u granules "
                         "past the top %u%s", n, b, n, top, steps > top ? " (a cycle)" : "");
                bad(c, msg);
                break;
            }
            uint32_t i;
            for (i = b; i < b + n && !(map[i / 64] >> (i % 64) & 1); i++)
                map[i / 64] |= 1ull << (i % 64);
            if (i < b + n) {
                snprintf(msg, sizeof msg, "key arena: list %u: block %u overlaps a key "
                         "or another free block", n, b);
                bad(c, msg);
                break;
            }
        }
    }
    uint64_t seen = 0;
    for (uint32_t w = 0; w < top / 64; w++)
        seen += (uint64_t)__builtin_popcountll(map[w]);
    if (top % 64)
        seen += (uint64_t)__builtin_popcountll(map[top / 64] & ((1ull << (top % 64)) - 1));
    if (seen != top) {
        snprintf(msg, sizeof msg, "key arena: %llu of %u granules neither a key nor free",
                 (unsigned long long)(top - seen), top);
        bad(c, msg);
    }
}

/* Lock and busy held, the top at the end of the arena: list its free
   granules merged (see the design note). -EBADMSG when a block is not
   sound (flagged: repair drops it), -ENOMEM. */
static int compact(shmq *q)
{
    uint64_t *map = wq__keys_map(q);
    if (!map)
        return -ENOMEM;
    int rc = 0;
    /* Every entry with a long key, free or not: a free entry has none
       (keylen 0), except a new key's between taking its block and its
       commit (restore records its result in between). And every
       processing entry's run record. */
    for (uint32_t idx = 0, used = wq__entries_used(q); idx < used && rc == 0; idx++) {
        const struct wq_entry *e = wq__entry(q, idx);
        if (e->keylen > WQ_KEY_INLINE &&
            (!wq__key_ok(q, e) ||
             wq__keys_mark(q, map, e->k.block, wq__key_tail(e->keylen)) < 0))
            rc = wq__region_mark_corrupt(q);
        else if ((e->state & WQ_ST_PROCESSING) &&
                 (!wq__entry_run(q, e, idx) ||
                  wq__keys_mark(q, map, e->run, sizeof(struct wq_run)) < 0))
            rc = wq__region_mark_corrupt(q);
    }
    if (rc == 0 && wq__results_mark(q, map, false, NULL, NULL) > 0)
        rc = wq__region_mark_corrupt(q);
    if (rc == 0)
        wq__keys_rebuild(q, map);
    free(map);
    return rc;
}

/* A block of n granules: 0, -ENOSPC (message set), -EBADMSG, -ENOMEM. */
static int take(shmq *q, uint32_t n, uint32_t *out)
{
    struct wq_hdr *h = q->hdr;
    int rc = pop(q, n, out);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    uint32_t top = h->k_top;
    if (WQ_UNLIKELY(top > q->nkeys))
        return wq__region_mark_corrupt(q);
    if (q->g.key_max - top < n) {
        if ((rc = compact(q)) < 0)
            return rc;
        for (uint32_t m = n; m < q->g.key_classes; m++) {
            if ((rc = pop(q, m, out)) < 0)
                return rc;
            if (rc == 1) {
                if (m > n)
                    push(q, *out + n, m - n);
                return 0;
            }
        }
        top = h->k_top;
        if (q->g.key_max - top < n) {
            wq__errf("queue '%s': its key arena is full: %llu bytes of keys", q->pub.name,
                     (unsigned long long)top * WQ_KEY_GRAIN);
            return -ENOSPC;
        }
    }
    /* With the granules adds published to lanes may need (lanes.c). */
    uint64_t need = (uint64_t)top + n + wq__lanes_grains(q);
    if ((rc = wq__region_grow_keys(q, need < q->g.key_max ? (uint32_t)need : q->g.key_max)) < 0)
        return rc;
    h->k_top = top + n;
    WQ_STEP("keys.bump");
    *out = top;
    return 0;
}

int wq__keys_room(shmq *q, uint32_t len, uint64_t need)
{
    struct wq_hdr *h = q->hdr;
    uint32_t n = WQ_GRAINS(len);
    if (len > 0 && n < q->g.key_classes && q->kfree[n] != 0)
        return 0;   /* one block, listed */
    if (h->k_top > q->nkeys)
        return wq__region_mark_corrupt(q);
    if (q->g.key_max - h->k_top < need) {
        /* Merge the free granules now, in a mutation of its own, so the
           one that takes the blocks does not have to. */
        wq__mut_begin(q);
        int rc = wq__mut_end_unchanged(q, compact(q));   /* done, or -ENOMEM */
        if (rc < 0)
            return rc;
        if (q->g.key_max - h->k_top < need)
            return 0;   /* the lists and splits must serve, as in take */
    }
    return wq__region_grow_keys(q, (uint32_t)(h->k_top + need));
}

int wq__keys_take(shmq *q, uint32_t len, uint32_t *block)
{
    WQ_ASSERT_MUTATING(q);
    return take(q, WQ_GRAINS(len), block);
}

void wq__keys_give(shmq *q, uint32_t block, uint32_t len)
{
    WQ_ASSERT_MUTATING(q);
    uint32_t n = WQ_GRAINS(len);
    if (WQ_LIKELY(n < q->g.key_classes && wq__keys_at(q, block, len) &&
                  block + n <= q->hdr->k_top))
        push(q, block, n);
    else
        wq__region_mark_corrupt(q);
}

int wq__keys_put(shmq *q, struct wq_entry *e, const void *key, uint32_t len)
{
    WQ_ASSERT_MUTATING(q);
    if (len <= WQ_KEY_INLINE) {
        memcpy(e->k.in, key, len);
        e->keylen = (uint16_t)len;
        return 0;
    }
    uint32_t b, tail = wq__key_tail(len);
    int rc = take(q, WQ_GRAINS(tail), &b);
    if (rc < 0)
        return rc;
    memcpy(q->karena + (uint64_t)b * WQ_KEY_GRAIN, (const unsigned char *)key + WQ_KEY_PRE,
           tail);
    memcpy(e->k.pre, key, WQ_KEY_PRE);
    e->k.block = b;
    e->keylen = (uint16_t)len;
    return 0;
}

void wq__keys_drop(shmq *q, struct wq_entry *e)
{
    if (e->keylen > WQ_KEY_INLINE)
        wq__keys_give(q, e->k.block, wq__key_tail(e->keylen));   /* checks the block */
    e->keylen = 0;
}
