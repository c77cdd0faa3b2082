/*
 * lanes.c - published adds: adds that do not wait for the region lock.
 *
 * A producer process whose adds meet consumers on the lock pays a
 * hand-over of the lock for every new key (tools/PERFORMANCE.md, "Adds
 * published to lanes"). wq_add_publish instead writes the key into a
 * lane its handle owns (layout.h, struct wq_lane) and returns; whoever
 * takes the lock next applies every lane's adds, in the order each lane
 * got them, through queue.c's one add path, before doing anything else
 * (lock.c). So every call that takes the lock sees every add published
 * before it, and a lane's adds keep their order with the same handle's
 * locked adds (those apply the lanes first too).
 *
 * One writer per lane: a handle takes a lane under the lock and keeps it
 * until its slot is given up (close, park, death and reap); threads of
 * its process take turns through lane_busy, and a forked child's copy
 * of the handle never publishes (it has not registered). The writer
 * fills slot `tail`, then publishes it with a compare-and-swap of the
 * lane's tl word: an add whose swap happened is in the lane and will be
 * applied, one that died before it left bytes nobody reads. Nothing
 * needs finishing or undoing after a producer's death.
 *
 * Room: a lane may hold adds only up to its limit, which lockers grant
 * (grant below) out of the room the queue has left, so an add already
 * published never meets a full queue when it is applied: hdr->lane_granted
 * (every lane's limit - head) is counted as live by other adds (entry.c)
 * and the entries, index and ring slots and arena granules those adds
 * may need have their pages beforehand. A full queue takes the unused
 * part of the grants back (wq__lanes_revoke) before it refuses an add.
 *
 * Waking: a getter about to sleep has applied the lanes; a publication
 * after that finds its lane applied up to it, sets the lane's bit in
 * hdr->lanes_pending and then reads hdr->waiters, while the getter
 * counts itself in waiters and then reads lanes_pending (wait.c): one
 * of the two sees the other, so the producer wakes the getter or the
 * getter does not sleep.
 */
#include "shm.h"

WQ_INLINE uint32_t tl_tail(uint64_t w)
{
    return (uint32_t)w;
}

WQ_INLINE uint32_t tl_limit(uint64_t w)
{
    return (uint32_t)(w >> 32);
}

WQ_INLINE uint64_t tl_make(uint32_t tail, uint32_t limit)
{
    return (uint64_t)limit << 32 | tail;
}

WQ_INLINE bool tl_sound(uint64_t w, uint32_t head)
{
    return tl_tail(w) - head <= WQ_LANE_SLOTS && tl_limit(w) - tl_tail(w) <= WQ_LANE_SLOTS &&
           tl_limit(w) - head <= WQ_LANE_SLOTS;
}

uint32_t wq__lanes_key_max(const shmq *q)
{
    return q->max_key_len < WQ_LANE_KEY ? q->max_key_len : WQ_LANE_KEY;
}

/* Arena granules one published add may need. */
static uint32_t grains_each(const shmq *q)
{
    uint32_t len = wq__lanes_key_max(q);
    return (uint32_t)WQ_GRAINS(wq__key_tail(len));
}

uint64_t wq__lanes_grains(const shmq *q)
{
    return q->lanes ? (uint64_t)q->hdr->lane_granted * grains_each(q) : 0;
}

/* ------------------------------------------------------------------ */
/* The producer                                                        */
/* ------------------------------------------------------------------ */

int wq__lanes_publish(shmq *q, const void *key, uint32_t len, uint32_t hash, uint64_t now)
{
    uint32_t l = wq_load_relaxed(&q->lane);
    if (l >= WQ_LANES || len > WQ_LANE_KEY ||
        __atomic_exchange_n(&q->lane_busy, 1, __ATOMIC_ACQUIRE))
        return -EAGAIN;
    struct wq_lane *ln = &q->lanes[l];
    int rc = -EAGAIN;
    /* Still ours: a lane is taken from a handle only with its slot. */
    if (wq_load_relaxed(&ln->owner) != wq_load_relaxed(&q->slot) + 1 ||
        wq_load_relaxed(&ln->owner_gen) != wq_load_relaxed(&q->gen))
        goto out;
    /* Acquire: the slot below the limit was applied (read) before the
       locker that raised the limit past it swapped the word. */
    uint64_t w = __atomic_load_n(&ln->tl, __ATOMIC_ACQUIRE);
    uint32_t t = tl_tail(w);
    /* What the caller wrote before this add is seen by whoever gets the
       key: ordered before the head we read (as add_fast's fence). */
    wq_fence_full();
    uint32_t head = __atomic_load_n(&ln->head, __ATOMIC_ACQUIRE);
    if (t - head >= WQ_LANE_SLOTS)
        goto out;   /* full, or a damaged word: the lock's way */
    /* Where lockers found or put the keys applied since we last looked:
       hints for the coalesced add, as if this handle had made those adds
       locked (add_fast checks a hint against the entry anyway). */
    bool again = false;
    for (uint32_t p = q->lane_seen; p != head && head - p <= WQ_LANE_SLOTS; p++) {
        const struct wq_lane_slot *a = &ln->s[p % WQ_LANE_SLOTS];
        uint32_t e = wq_load_relaxed(&a->entry);
        if (e != WQ_NIL && q->hints) {
            wq__hint_put(q, a->hash, e);
            again |= a->hash == hash;
        }
    }
    q->lane_seen = head;
    if (again) {   /* this very key, applied: the coalesced add may do */
        rc = -ESTALE;
        goto out;
    }
    /* The key is in our lane, not applied yet: it is dirty as far as
       anyone who locks can tell (they apply it first), so this add
       coalesces, counted as the lock-free one is. */
    for (uint32_t p = head; p != t; p++) {
        const struct wq_lane_slot *a = &ln->s[p % WQ_LANE_SLOTS];
        if (a->hash == hash && a->len == len && memcmp(a->key, key, len) == 0 &&
            q->slot < q->max_procs) {
            __atomic_fetch_add(&q->procs[q->slot].coalesced, 1, __ATOMIC_RELAXED);
            rc = 1;
            goto out;
        }
    }
    if (tl_limit(w) - t - 1 >= WQ_LANE_SLOTS)
        goto out;   /* no room granted: the lock's way */
    struct wq_lane_slot *s = &ln->s[t % WQ_LANE_SLOTS];
    s->len = (uint16_t)len;
    s->hash = hash;
    s->entry = WQ_NIL;
    s->t_add = now;
    memcpy(s->key, key, len);
    WQ_FAULT("lanes.written");
    while (!__atomic_compare_exchange_n(&ln->tl, &w, tl_make(t + 1, tl_limit(w)), false,
                                        __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
        /* A locker moved the limit: publish if it still covers t. */
        if (tl_tail(w) != t || tl_limit(w) - t - 1 >= WQ_LANE_SLOTS)
            goto out;
    }
    rc = 0;
    WQ_FAULT("lanes.published");
    /* Applied up to us: no locker is on its way to this add (one that is
       applying this lane reads tl again after its last head store). */
    if (__atomic_load_n(&ln->head, __ATOMIC_SEQ_CST) == t) {
        struct wq_hdr *h = q->hdr;
        __atomic_fetch_or(&h->lanes_pending, 1u << l, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&h->waiters, __ATOMIC_SEQ_CST) > 0) {
            wq_bump_release(&h->wake_seq);
            wq__futex_wake(&h->wake_seq, 1);
        }
    }
out:
    __atomic_store_n(&q->lane_busy, 0, __ATOMIC_RELEASE);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Lockers                                                             */
/* ------------------------------------------------------------------ */

/* Lock held: pages for g granted adds beyond the entries used and the
   arena's top. */
static int reserve(shmq *q, uint64_t g)
{
    const struct wq_hdr *h = q->hdr;
    uint64_t need = (uint64_t)h->e_fresh + g;
    int rc = wq__entry_room(q, need < q->capacity ? (uint32_t)need : q->capacity);
    if (rc == 0 && grains_each(q) > 0) {
        uint64_t k = (uint64_t)h->k_top + g * grains_each(q);
        rc = wq__region_grow_keys(q, k < q->g.key_max ? (uint32_t)k : q->g.key_max);
    }
    return rc;
}

void wq__lanes_grant(shmq *q, uint32_t l)
{
    WQ_ASSERT_LOCKED(q);
    struct wq_hdr *h = q->hdr;
    struct wq_lane *ln = &q->lanes[l];
    uint64_t w = __atomic_load_n(&ln->tl, __ATOMIC_ACQUIRE);
    uint32_t head = ln->head;
    if (ln->owner == 0 || !tl_sound(w, head) || h->shutdown)
        return;
    uint32_t more = head + WQ_LANE_SLOTS - tl_limit(w);
    uint64_t used = (uint64_t)h->live + h->lane_granted;
    if (used >= q->capacity || more == 0)
        return;
    if (more > q->capacity - used)
        more = (uint32_t)(q->capacity - used);
    if (reserve(q, (uint64_t)h->lane_granted + more) < 0)
        return;   /* short of pages: this lane's adds take the lock */
    while (!__atomic_compare_exchange_n(&ln->tl, &w, tl_make(tl_tail(w), tl_limit(w) + more),
                                        false, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE))
        ;   /* the owner published meanwhile */
    h->lane_granted += more;
}

/* Lock held: lane l's grant down to what it holds. */
static void revoke(shmq *q, uint32_t l)
{
    struct wq_lane *ln = &q->lanes[l];
    uint64_t w = __atomic_load_n(&ln->tl, __ATOMIC_ACQUIRE);
    for (;;) {
        if (!tl_sound(w, ln->head) || tl_limit(w) == tl_tail(w))
            return;
        if (__atomic_compare_exchange_n(&ln->tl, &w, tl_make(tl_tail(w), tl_tail(w)), false,
                                        __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE))
            break;
    }
    uint32_t back = tl_limit(w) - tl_tail(w);
    q->hdr->lane_granted -= back < q->hdr->lane_granted ? back : q->hdr->lane_granted;
}

void wq__lanes_revoke(shmq *q)
{
    WQ_ASSERT_LOCKED(q);
    if (!q->lanes || !q->hdr->lanes_grown)
        return;
    for (uint32_t l = 0; l < WQ_LANES; l++)
        revoke(q, l);
}

bool wq__lanes_room(shmq *q, uint64_t n)
{
    WQ_ASSERT_LOCKED(q);
    const struct wq_hdr *h = q->hdr;
    if ((uint64_t)h->live + h->lane_granted + n <= q->capacity)
        return true;
    if (h->lane_granted > 0)
        wq__lanes_revoke(q);
    return (uint64_t)h->live + h->lane_granted + n <= q->capacity;
}

/* Lock held: lane l has no owner from now on. What it published stays to
   be applied; a new owner takes it once it is empty (wq__lanes_take). A
   publisher killed between its publication and announcing it left no
   bit: the next locker applies the lane. */
static void disown(shmq *q, uint32_t l)
{
    struct wq_lane *ln = &q->lanes[l];
    revoke(q, l);
    ln->owner = 0;
    ln->owner_gen = 0;
    if (tl_tail(__atomic_load_n(&ln->tl, __ATOMIC_ACQUIRE)) != ln->head)
        __atomic_fetch_or(&q->hdr->lanes_pending, 1u << l, __ATOMIC_SEQ_CST);
}

int wq__lanes_take(shmq *q)
{
    WQ_ASSERT_LOCKED(q);
    struct wq_hdr *h = q->hdr;
    if (!q->lanes || q->slot >= q->max_procs || h->shutdown)
        return -EAGAIN;
    if (q->lane < WQ_LANES && q->lanes[q->lane].owner == q->slot + 1 &&
        q->lanes[q->lane].owner_gen == q->gen) {
        wq__lanes_grant(q, q->lane);   /* taken back by a full queue, say */
        return 0;
    }
    if (!h->lanes_grown) {
        if (wq__region_grow_lanes(q) < 0)
            return -EAGAIN;
        h->lanes_grown = 1;
    }
    for (uint32_t l = 0; l < WQ_LANES; l++) {
        struct wq_lane *ln = &q->lanes[l];
        uint64_t w = __atomic_load_n(&ln->tl, __ATOMIC_ACQUIRE);
        if (ln->owner != 0 || tl_tail(w) != ln->head || tl_limit(w) != ln->head)
            continue;
        ln->owner_gen = q->gen;
        ln->owner = q->slot + 1;
        q->lane_seen = ln->head;
        wq_store_relaxed(&q->hints2, 1);   /* shm.h, wq__hint_put */
        wq_store_relaxed(&q->lane, l);
        wq__lanes_grant(q, l);
        return 0;
    }
    return -EAGAIN;   /* every lane taken: this handle's adds take the lock */
}

void wq__lanes_free_slot(shmq *q, uint32_t slot)
{
    WQ_ASSERT_LOCKED(q);
    if (!q->lanes || !q->hdr->lanes_grown)
        return;
    for (uint32_t l = 0; l < WQ_LANES; l++)
        if (q->lanes[l].owner == slot + 1)
            disown(q, l);
}

struct wq_lane_slot *wq__lanes_next(shmq *q, uint32_t l, uint32_t *pos)
{
    WQ_ASSERT_LOCKED(q);
    struct wq_lane *ln = &q->lanes[l];
    uint32_t head = ln->head;
    uint64_t w = __atomic_load_n(&ln->tl, __ATOMIC_SEQ_CST);
    if (tl_tail(w) == head)
        return NULL;
    if (!tl_sound(w, head)) {
        wq__region_mark_corrupt(q);
        return NULL;
    }
    *pos = head;
    return &ln->s[head % WQ_LANE_SLOTS];
}

void wq__lanes_advance(shmq *q, uint32_t l)
{
    struct wq_lane *ln = &q->lanes[l];
    /* Seq_cst: the producer that reads this head after its publication
       is the one that announces it (wq__lanes_publish). */
    __atomic_store_n(&ln->head, ln->head + 1, __ATOMIC_SEQ_CST);
}

static void say(void (*violation)(void *c, const char *what), void *c, const char *what)
{
    if (violation)
        violation(c, what);
}

/*
 * Lock held, after a holder died or in a repair: every lane's words
 * checked (a damaged lane loses what it held, and says so), owners that
 * are no live slot's freed, the grant total recounted, and every lane
 * that holds adds marked for the next application.
 */
void wq__lanes_verify(shmq *q, bool apply, void (*violation)(void *c, const char *what),
                      void *c)
{
    struct wq_hdr *h = q->hdr;
    if (!q->lanes || !h->lanes_grown)
        return;
    uint64_t granted = 0;
    uint32_t pending = 0;
    char what[160];
    for (uint32_t l = 0; l < WQ_LANES; l++) {
        struct wq_lane *ln = &q->lanes[l];
        uint64_t w = __atomic_load_n(&ln->tl, __ATOMIC_ACQUIRE);
        uint32_t head = ln->head;
        if (!tl_sound(w, head)) {
            snprintf(what, sizeof what,
                     "lane %u: head %u, tail %u, limit %u out of order; its adds are lost", l,
                     head, tl_tail(w), tl_limit(w));
            say(violation, c, what);
            if (apply) {
                /* Stop the owner first: its next swap fails. */
                __atomic_store_n(&ln->tl, tl_make(head, head), __ATOMIC_SEQ_CST);
                w = tl_make(head, head);
            }
        }
        uint32_t o = ln->owner;
        if (o != 0 && (o > q->max_procs || q->procs[o - 1].state != WQ_PROC_LIVE ||
                       q->procs[o - 1].gen != ln->owner_gen)) {
            snprintf(what, sizeof what, "lane %u: its owner %u/%u holds no live slot", l, o - 1,
                     ln->owner_gen);
            say(violation, c, what);
            if (apply) {
                disown(q, l);
                w = __atomic_load_n(&ln->tl, __ATOMIC_ACQUIRE);
            }
        }
        if (tl_sound(w, head)) {
            granted += tl_limit(w) - head;
            if (tl_tail(w) != head)
                pending |= 1u << l;
            /* Published slots are whole; applying drops a damaged one. */
            uint32_t max = wq__lanes_key_max(q);
            for (uint32_t p = head; p != tl_tail(w); p++) {
                uint32_t len = ln->s[p % WQ_LANE_SLOTS].len;
                if (len == 0 || len > max) {
                    snprintf(what, sizeof what, "lane %u: its add at %u has a key of %u bytes; "
                             "it is dropped", l, p, len);
                    say(violation, c, what);
                }
            }
        }
    }
    if (granted != h->lane_granted && !apply) {
        snprintf(what, sizeof what, "lanes: %u adds granted, the lanes hold %llu",
                 h->lane_granted, (unsigned long long)granted);
        say(violation, c, what);
    }
    if (apply) {
        h->lane_granted = (uint32_t)granted;
        __atomic_fetch_or(&h->lanes_pending, pending, __ATOMIC_SEQ_CST);
    }
}
