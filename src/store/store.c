/*
 * store.c - the region side of persistence: marks, the store queue,
 * flushing and settling, the add epilogue, wq_snapshot.
 *
 * Ordering rule (why a key is never in one and not the other):
 *   - The region is the truth while it exists; the store follows it.
 *     Every change the store must see marks the entry SDIRTY (and pushes
 *     it on the store queue, a ring in the region) inside the same busy
 *     critical section as the change, before its commit (entry.c). A
 *     flush writes the marked entries' current records to LMDB and only
 *     then, under the region lock, clears the marks of entries that did
 *     not change meanwhile (its count in q->sgen). So after any crash, the region
 *     still lists every entry whose record may be stale, and the next
 *     flush rewrites it (writes are idempotent).
 *   - A new key added with PROCESS or FSYNC durability starts invisible
 *     (STORING): in the index, not in the queue. It becomes a queued (or
 *     waiting) key only after the commit that stored it (entry.c,
 *     wq__entry_stored). A key is never handed out unless it is stored,
 *     and the add returns only after that.
 *   - A key that leaves the queue stays as a zombie (state SDIRTY alone,
 *     still indexed, not live) until the flush that deletes its record;
 *     then the flusher frees the entry. So "gone from the region but still
 *     stored" only ever exists as a pending, listed deletion.
 *   - Lock order: the flush lock, LMDB's write lock, the region lock;
 *     never the reverse. Only the holder of the flush lock pops the store
 *     queue, so the front it read is still there when it commits; a
 *     flusher killed anywhere leaves the queue as it was, and LMDB's own
 *     robust writer mutex releases its transaction.
 *   - Group commit: a caller that needs durability flushes everything
 *     queued so far (with FSYNC, up to its own keys: "Fsync groups").
 *     Callers blocked behind it find their changes already written (often
 *     with nothing left to do), so concurrent adders share commits, or
 *     with FSYNC journal writes ("The journal").
 */
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>

#include "shm/shm.h"
#include "format.h"

#define BATCH_MAX 4096u
#define BATCH_BYTES (4u << 20)
#define SYNC_WAIT_MAX_US 2000u   /* the longest an adder waits for others */
#define DEFER_MAX 1024u          /* FSYNC: deferred changes written at once */

/*
 * Deferred changes (FSYNC). An LMDB commit writes its new pages, then the
 * meta page that points to them. A synced commit flushes the pages before
 * it writes the meta page (O_DSYNC); an unsynced one leaves both to the
 * kernel, which may write the meta page first, and a power failure then
 * leaves a meta page pointing at pages that never reached the disk: a
 * damaged store (LMDB's own warning for MDB_NOSYNC). Unsynced removals
 * between synced adds made an FSYNC store exactly that fragile. So every
 * LMDB commit of an FSYNC store is synced (they are checkpoints now: "The
 * journal"), and every journal write too; so that this does not cost a
 * flush per wq_done, changes that need none (removals, results, failure
 * counts, a waiting key's time) are not written on their own: they stay
 * listed in the store queue, which the region keeps across any process
 * crash, and go with the next journal write that flushes anyway (a new
 * key's), or with the first call that finds the snapshot interval (1 s)
 * passed since the last such write or DEFER_MAX listed, and with
 * wq_snapshot, wq_unlink and the last wq_close (those three write all and
 * checkpoint). A cycle (add, get, done) is then one flush. Lost with the
 * region (power failure, reboot), a deferred removal means a key processed
 * once more, which is what a power failure always meant for a removal.
 */

/* ------------------------------------------------------------------ */
/* Fsync groups                                                        */
/* ------------------------------------------------------------------ */

/*
 * With FSYNC, one fsync serves every new key listed when its commit reads
 * the store queue (flush_round). Two processes adding in turn would still
 * pay one fsync each: the second lists its key while the first one's
 * fsync runs, too late for it, and so on. So an adder about to flush
 * first waits, briefly, for the processes that were in the previous
 * fsync group and have not added since (PostgreSQL's commit_delay, but
 * only for processes known to be coming): then one group carries them
 * all, and whoever comes last flushes it. All of this is a hint
 * (layout.h: sync_*): a wrong guess costs a smaller group, or one wait of
 * at most SYNC_WAIT_MAX_US or twice our recent fsync time.
 *
 * While an adder waits, even a deferred change that is due is not
 * written by another process (wq__store_after): it would take the
 * waiting adder's key into an fsync of its own and break the group up.
 * The waiter reads the store queue after its wait, so it writes such a
 * change.
 */
static inline bool fsync_groups(const shmq *q)
{
    return q->g.has_store && q->g.durability == WQ_DURABLE_FSYNC;
}

static inline uint32_t mono_us(void)
{
    return (uint32_t)(wq__now_mono() / 1000u);
}

/* The longest an adder waits: SYNC_WAIT_MAX_US; in the fault-injection
   build, $WQ_TEST_SYNC_WAIT_US when set (a test under valgrind needs
   seconds to arrive), which is then the wait itself (*fixed). */
static uint32_t wait_max_us(bool *fixed)
{
    *fixed = false;
#ifdef WQ_FAULT_INJECTION
    const char *v = getenv("WQ_TEST_SYNC_WAIT_US");
    if (v && *v) {
        *fixed = true;
        return (uint32_t)strtoul(v, NULL, 10);
    }
#endif
    return SYNC_WAIT_MAX_US;
}

/* Is an adder waiting for others now? A deadline that passed (a dead
   waiter's, or one a later waiter left) is cleared by whoever sees it,
   so that it does not seem to come back when the 32-bit clock wraps. */
static bool group_waiting(struct wq_hdr *h)
{
    uint32_t w = wq_load_relaxed(&h->sync_wait);
    if (w == 0)
        return false;   /* the common case: no clock read */
    bool fixed;
    uint32_t max = wait_max_us(&fixed);
    int32_t left = (int32_t)(w - mono_us());
    if (left > 0 && (uint32_t)left <= max)
        return true;
    __atomic_compare_exchange_n(&h->sync_wait, &w, 0u, false, __ATOMIC_RELAXED,
                                __ATOMIC_RELAXED);
    return false;
}

void wq__store_sync_request(shmq *q)
{
    if (!fsync_groups(q) || q->slot >= q->max_procs)
        return;
    struct wq_hdr *h = q->hdr;
    struct wq_proc *p = &q->procs[q->slot];
    if ((int32_t)(p->sync_mark - h->sync_read) > 0)
        return;   /* already counted in the next group */
    uint32_t s = h->sync_seq + 1;
    wq_store_relaxed(&h->sync_seq, s);
    p->sync_mark = s;
}

/* Lock held: the processes in the previous group that have not added
   for the next one, if we have. */
static uint32_t late_adders(shmq *q)
{
    const struct wq_hdr *h = q->hdr;
    uint32_t read = h->sync_read, prev = h->sync_prev, late = 0;
    if (q->slot >= q->max_procs || (int32_t)(q->procs[q->slot].sync_mark - read) <= 0)
        return 0;
    for (uint32_t i = 0; i < q->max_procs; i++) {
        const struct wq_proc *p = &q->procs[i];
        late += i != q->slot && p->state == WQ_PROC_LIVE &&
                (int32_t)(p->sync_mark - prev) > 0 && (int32_t)(p->sync_mark - read) <= 0;
    }
    return late;
}

/* Before an adder flushes: wait for the late adders to list their keys,
   or for a flush to read ours (then the group is being written). */
static void group_wait(shmq *q)
{
    struct wq_hdr *h = q->hdr;
    if (wq__lock_look(q) < 0)
        return;
    uint32_t late = late_adders(q), from = h->sync_seq, until = 0;
    uint32_t mark = late ? q->procs[q->slot].sync_mark : 0;
    bool fixed;
    uint64_t max = wait_max_us(&fixed) * 1000ull, now = wq__now_mono();
    uint64_t sync = wq_load_relaxed(&q->sync_ns), wait = sync ? 2 * sync : max / 2;
    if (fixed || wait > max)
        wait = max;
    if (late > 0) {
        until = (uint32_t)((now + wait) / 1000u) | 1u;   /* 0 means none */
        if (!group_waiting(h) || (int32_t)(until - h->sync_wait) > 0)
            wq_store_relaxed(&h->sync_wait, until);
    }
    wq__unlock(q);
    if (late == 0)
        return;
    for (;;) {
        uint32_t s = wq_load_relaxed(&h->sync_seq);
        if (s - from >= late || (int32_t)(wq_load_relaxed(&h->sync_read) - mark) >= 0 ||
            wq__futex_wait(&h->sync_seq, s, now + wait) == -ETIMEDOUT)
            break;
    }
    if (wq__lock_look(q) < 0)
        return;   /* our deadline passes by itself */
    if (h->sync_wait == until)
        wq_store_relaxed(&h->sync_wait, 0);
    wq__unlock(q);
}

/* Lock not held: an add listed keys for the next group, or a flush read
   a group (with the keys of every waiting adder); wake the waiters. */
static void group_arrive(shmq *q)
{
    if (group_waiting(q->hdr))
        wq__futex_wake(&q->hdr->sync_seq, INT_MAX);
}

/* ------------------------------------------------------------------ */
/* The journal                                                         */
/* ------------------------------------------------------------------ */

/*
 * An FSYNC store writes what a flush reads from the store queue to the
 * journal (journal.c), one group per flush, and settles it as if LMDB
 * had committed it: a group is one flush of the disk, a synced LMDB
 * commit two. LMDB takes the journal's groups in a checkpoint: one
 * synced commit that applies them, in order, and records the last
 * group's number in the meta; then the journal starts over at offset 0.
 * A checkpoint runs when a group would not fit, at the end of every
 * flush of everything listed (wq_snapshot, wq_unlink, the last wq_close
 * with changes listed, the deferred changes' interval), and at that
 * interval while the journal holds groups ("due"): LMDB is at most about
 * an interval behind the journal.
 *
 * Flush lock held throughout, which orders one region's groups
 * (hdr->j_*), and the journal lock (journal.c), which orders them with
 * the replay of a region being made. A process killed anywhere leaves
 * either a group nobody counted (j_tail not moved: the next group is
 * written over it, or a checkpoint applies it, which changes nothing the
 * region does not hold: its records are the region's, still listed) or
 * a checkpoint LMDB holds (j_tail not reset: the next one skips the
 * groups the meta's number covers). Only the region linked at the
 * queue's name writes the journal (linked()).
 */
static inline bool journaled(const shmq *q)
{
    return fsync_groups(q);
}

/* The journal's end, where the region says it is: -EBADMSG if that
   cannot be (the next checkpoint walks what verifies). */
static int j_tail(const struct wq_hdr *h, uint64_t *tail)
{
    *tail = wq_load_relaxed(&h->j_tail);
    return *tail > WQ_JOURNAL_SIZE || *tail % WQ_JOURNAL_BLOCK ? -EBADMSG : 0;
}

/* Is our region the one linked at the queue's name? One that wq_unlink
   removed while we had it open is not: a later wq_open makes a new
   region on the same store, whose replay took our groups, and which
   writes the journal from its start. So only the linked region writes
   the journal (under its lock, which that replay takes too), and an
   unlinked one's store writes fail with -EIDRM. The path is the one the
   handle was opened at (WQ_SHM_DIR may change since); a path we cannot
   look at (EACCES, say) tells nothing, and the write goes on. */
static int linked(shmq *q)
{
    struct stat mine, there;
    if (q->fd < 0 || !q->path[0] || fstat(q->fd, &mine) < 0)
        return 0;   /* cannot tell */
    if (stat(q->path, &there) == 0 ? there.st_dev == mine.st_dev && there.st_ino == mine.st_ino
                                   : errno != ENOENT)
        return 0;
    wq__errf("queue '%s': its region was removed (wq_unlink) while this process had it "
             "open; the store %s belongs to the queue of that name now, and this region "
             "no longer writes to it", q->pub.name, q->g.store_path);
    return -EIDRM;
}

/* Does the store still serve our region? Not once another region was
   made from it (store/owner.c): a queue of another name or WQ_SHM_DIR,
   or of another container's /dev/shm, which could not see ours. Checked
   under the journal lock or LMDB's writer lock, which the new region's
   maker takes after its claim and its read: a write checked before the
   claim is one it replays, or reads (again, restore.c moved()). */
static int owned(shmq *q, struct wq_env *e, bool lmdb)
{
    char who[1024];
    uint64_t claim = wq_load_relaxed(&q->hdr->claim);
    if ((lmdb ? wq__owner_check_lmdb(e, claim, who, sizeof who)
              : wq__owner_check(e, claim, who, sizeof who)) == 0)
        return 0;
    /* Our own path: removed and made again (wq_unlink), unless ours is
       still there (then another container made one at the same path). */
    if (strcmp(who, q->path) == 0 && linked(q) < 0)
        return -EIDRM;
    wq__errf("queue '%s': store %s was claimed by the queue whose region is %s (made from "
             "it where this queue's region could not be seen); a store serves one queue, "
             "and this region no longer writes to it", q->pub.name, q->g.store_path, who);
    return -EIDRM;
}

/* The journal, locked, for our region (-EIDRM: see linked(), owned()). */
static int j_lock(shmq *q, struct wq_env *e, int *fd)
{
    if ((*fd = wq__journal_acquire(e, (mode_t)q->g.mode)) < 0) {
        wq__errf("queue '%s': store %s: its journal: %s", q->pub.name, q->g.store_path,
                 *fd == -EUCLEAN ? "not a regular file" : strerror(-*fd));
        return *fd;
    }
    int rc = linked(q);
    if (rc == 0)
        rc = owned(q, e, false);
    if (rc < 0)
        wq__journal_unlock(e, *fd);
    return rc;
}

/* Flush lock and journal lock held: LMDB takes the journal's groups (see
   above). Returns the groups applied, or -errno with wq_last_error set. */
static int checkpoint(shmq *q, struct wq_env *e, int fd)
{
    struct wq_hdr *h = q->hdr;
    uint64_t tail, lsn = h->j_lsn;
    if (j_tail(h, &tail) < 0)
        tail = 0;   /* unknown: apply what verifies */
    char why[256];
    int rc = wq__journal_commit(e, fd, tail, h->j_id, lsn, true, "store.checkpoint", why,
                                sizeof why);
    if (rc < 0) {
        wq__errf("queue '%s': store %s: checkpoint of its journal: %s", q->pub.name,
                 q->g.store_path, why[0] ? why : wq_strerror(rc));
        return rc;
    }
    WQ_FAULT("store.checkpointed");
    /* Everything the file we wrote holds is in LMDB now: if the journal's
       name leads elsewhere (removed or replaced meanwhile), the next
       group goes to the file there. (Looked at here only: a stat of the
       file between two synchronous writes makes the second one wait for
       more than it writes.) */
    (void)wq__journal_replaced(e, fd);
    wq_store_relaxed(&h->j_tail, 0);
    return rc;
}

/* Flush lock held: LMDB takes the journal's groups, if there are any. */
static int checkpoint_locked(shmq *q, struct wq_env *e)
{
    uint64_t tail;
    if (j_tail(q->hdr, &tail) == 0 && tail == 0)
        return 0;
    int fd, rc = j_lock(q, e, &fd);
    if (rc < 0)
        return rc;
    rc = checkpoint(q, e, fd);
    wq__journal_unlock(e, fd);
    return rc;
}

/* Flush lock held: write the items as the journal's next group, on disk
   when this returns (a checkpoint first if they do not fit). */
static int journal_write(shmq *q, struct wq_env *e, const struct wq_item *items, uint32_t n)
{
    struct wq_hdr *h = q->hdr;
    uint64_t tail, need = wq__journal_bytes(items, n);
    int fd, rc;
    if (h->j_id == 0 || h->j_lsn == UINT64_MAX) {
        wq__errf("queue '%s': its region's journal %s is damaged: reopen the queue from its "
                 "store", q->pub.name, h->j_id ? "count" : "id");
        return -EBADMSG;
    }
    if ((rc = j_lock(q, e, &fd)) < 0)
        return rc;
    if (j_tail(h, &tail) < 0 || need > WQ_JOURNAL_SIZE - tail) {
        if ((rc = checkpoint(q, e, fd)) < 0)
            goto out;
        tail = 0;
        if (e->jstale) {   /* the checkpoint found another file at the name */
            wq__journal_unlock(e, fd);
            if ((rc = j_lock(q, e, &fd)) < 0)
                return rc;
        }
    }
    uint64_t lsn = h->j_lsn + 1;
    wq_store_relaxed(&h->j_lsn, lsn);   /* taken before the write: never reused */
    WQ_FAULT("store.journal");
    if ((rc = wq__journal_write(fd, h->j_id, lsn, tail, items, n)) < 0) {
        wq__errf("queue '%s': store %s: writing its journal: %s", q->pub.name,
                 q->g.store_path, strerror(-rc));
        goto out;
    }
    WQ_FAULT("store.journaled");
    wq_store_relaxed(&h->j_tail, tail + need);
out:
    wq__journal_unlock(e, fd);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Marking                                                             */
/* ------------------------------------------------------------------ */

/* Lock and busy held; the entry is SDIRTY: append it to the store queue. */
static void sq_push(shmq *q, uint32_t idx)
{
    struct wq_hdr *h = q->hdr;
    if (h->sq_count >= q->capacity || h->sq_head >= q->capacity) {
        h->corrupt = 1;   /* the next locker rebuilds the queue from SDIRTY bits */
        return;
    }
    uint32_t tail = h->sq_head + h->sq_count;
    if (tail >= q->capacity)
        tail -= q->capacity;
    q->sq[tail] = idx;
    WQ_STEP("store.push");
    wq_store_relaxed(&h->sq_count, h->sq_count + 1);
}

void wq__store_mark(shmq *q, uint32_t idx)
{
    if (!q->g.has_store)
        return;
    WQ_ASSERT_MUTATING(q);
    struct wq_entry *e = wq__entry(q, idx);
    q->sgen[idx]++;
    if (e->state & WQ_ST_SDIRTY)
        return;   /* already queued: the flush will read the new state */
    e->state |= WQ_ST_SDIRTY;
    WQ_STEP("store.mark");
    sq_push(q, idx);
}

/* Lock held: copy the record the store should have for entry idx. */
static void snapshot_entry(shmq *q, uint32_t idx, struct wq_item *it, unsigned char *kbuf,
                           char *mbuf, uint64_t mono, uint64_t real)
{
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = wq__st(e);
    memset(&it->r, 0, sizeof it->r);
    it->idx = idx;
    it->sgen = q->sgen[idx];
    it->r.magic = WQ_REC_MAGIC;
    it->r.keylen = e->keylen;
    it->r.failures = e->failures;
    it->r.prio = q->fair ? q->fx[idx].prio : 0;
    wq__key_copy(e, wq__key_rest(q, e), kbuf);   /* sound: the caller checked */
    it->key = kbuf;
    it->msg = mbuf;
    mbuf[0] = 0;
    if (st == 0) {
        it->r.cls = WQ_CLS_DELETE;
        return;
    }
    bool waiting = (st & WQ_ST_WAITING) || ((st & WQ_ST_STORING) && e->t_b > mono);
    if (st & (WQ_ST_PROCESSING | WQ_ST_DIRTY | WQ_ST_QUEUED))
        it->r.cls = WQ_CLS_PENDING;   /* processing comes back queued */
    else if (waiting)
        it->r.cls = WQ_CLS_WAITING;
    else if (st & WQ_ST_STORING)
        it->r.cls = WQ_CLS_PENDING;
    else
        it->r.cls = WQ_CLS_IDLE;
    if (it->r.cls == WQ_CLS_WAITING)
        it->r.ready_wall_ns = real + (e->t_b > mono ? e->t_b - mono : 0);
    if (wq__has_result(q, e)) {
        const struct wq_rslot *r = &q->rslots[e->rslot];
        it->r.has_result = 1;
        it->r.code = r->code;
        it->r.updated_ns = r->updated_ns;
        it->r.msglen = (uint16_t)wq__result_message(q, r, mbuf);
    }
}

/*
 * Lock held: the items are committed. Pop them from the store queue and
 * settle each entry that did not change meanwhile: its mark is cleared
 * and entry.c makes a new key visible or frees a written deletion. An
 * entry that changed is marked again for the next flush.
 */
static int settle(shmq *q, struct wq_item *items, uint32_t n, uint64_t now, bool *queued)
{
    struct wq_hdr *h = q->hdr;
    wq__mut_begin(q);
    WQ_STEP("store.settle");
    h->sq_head = (h->sq_head + n) % q->capacity;   /* pop what we wrote */
    wq_store_relaxed(&h->sq_count, h->sq_count - n);
    for (uint32_t i = 0; i < n && !wq__region_broken(q); i++) {
        uint32_t idx = items[i].idx;
        struct wq_entry *e = wq__entry(q, idx);
        if (!(e->state & WQ_ST_SDIRTY))
            continue;
        e->state &= (uint16_t)~WQ_ST_SDIRTY;
        if (q->sgen[idx] != items[i].sgen) {
            wq__store_mark(q, idx);   /* changed meanwhile: again */
            continue;
        }
        WQ_STEP("store.clean");
        wq__entry_stored(q, idx, now, queued);   /* committed: never fails after */
    }
    return wq__mut_end(q, 0);
}

/* Lock held: the state of key's entry in the index, and its index in
   *idx (0 and WQ_NIL when the key has none). */
static uint16_t state_of(shmq *q, const struct iovec *key, uint32_t *idx)
{
    uint32_t hash = wq__hash(q->seed, key->iov_base, key->iov_len);
    *idx = wq__table_lookup(q, key->iov_base, key->iov_len, hash);
    if (*idx >= q->nent) {
        *idx = WQ_NIL;
        return 0;
    }
    return wq__st(wq__entry(q, *idx));
}

/* Lock held: the entry of a key of ours still waiting for its store
   commit (STORING), or WQ_NIL. */
static uint32_t storing(shmq *q, const struct iovec *key)
{
    uint32_t idx;
    return state_of(q, key, &idx) == WQ_ST_STORING ? idx : WQ_NIL;
}

/* Lock held: is a key of the call still waiting for its commit (ours,
   or another process's that we coalesced into)? */
static bool storing_any(shmq *q, const struct iovec *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (storing(q, &keys[i]) != WQ_NIL)
            return true;
    return false;
}

/* storing_any, locking; true when the lock cannot be had: the flush then
   finds out. */
static bool any_storing(shmq *q, const struct iovec *keys, size_t n)
{
    if (wq__lock_look(q) < 0)
        return true;
    bool any = storing_any(q, keys, n);
    wq__unlock(q);
    return any;
}

/*
 * One flush: read the front of the store queue, write it in one LMDB
 * transaction (FSYNC: one journal group), settle it. An FSYNC adder passes every key of its call
 * (mine, coalesced ones included: one may be another process's new key,
 * which must be stored before our add returns): once none of them is
 * STORING it writes no other adder's key, since that one's adder flushes
 * it (in the next group, with the keys of those it waits for), and stops
 * there. Returns 1 when it wrote something or must look again, 0 when
 * nothing was left, or -errno: -EBADMSG when the store queue is damaged
 * (flagged: the next lock rebuilds it).
 */
/* The region lock for a flush. A background one (stop: not NULL, see
   wq__store_idle) never blocks on it: the lease thread runs it, and its
   handle's thread holds the region lock while it stops that thread
   (procs.c). Before its commit it tries once (-EBUSY: nothing done);
   after (retry), it tries until it has it or *stop is set: settling
   late is fine, giving up leaves committed records listed, which the
   next flush writes again (as after a flusher killed there), and meanwhile
   a key whose add then failed could come back from the store. */
static int region_lock(shmq *q, const int *stop, bool retry)
{
    if (!stop)
        return wq__lock_look(q);   /* a flush needs no slot */
    for (;;) {
        int rc = wq__lock_try(q);
        if (rc != -EBUSY || !retry || __atomic_load_n(stop, __ATOMIC_ACQUIRE))
            return rc;
        struct timespec ts = { 0, 200 * 1000 };
        nanosleep(&ts, NULL);
    }
}

static int flush_round(shmq *q, struct wq_env *e, int *written, const struct iovec *mine,
                       size_t nmine, const int *stop)
{
    struct wq_hdr *h = q->hdr;
    MDB_txn *txn = NULL;
    bool jrnl = journaled(q);
    int rc = jrnl ? 0 : wq__lmdb_txn(e, 0, &txn);
    if (rc < 0)
        return rc;
    struct wq_item *items = NULL;
    unsigned char *buf = NULL;
    uint32_t n = 0, epoch;
    if ((rc = region_lock(q, stop, false)) < 0)
        goto abort;
    epoch = h->sq_epoch;
    uint32_t count = h->sq_count < BATCH_MAX ? h->sq_count : BATCH_MAX;
    if (h->sq_head >= q->capacity || h->sq_count > q->capacity) {
        h->corrupt = 1;   /* the next locker rebuilds the store queue from the SDIRTY bits */
        wq__unlock(q);
        rc = -EBADMSG;
        goto abort;
    }
    if (count == 0) {
        wq__unlock(q);
        rc = 0;
        goto abort;
    }
    /* Our keys are stored: others' adds are theirs. */
    bool done = mine != NULL && !storing_any(q, mine, nmine);
    if (done && fsync_groups(q)) {
        /* Nothing of ours left to store: what is listed waits for a
           commit that syncs anyway ("Deferred changes"). */
        wq__unlock(q);
        rc = 0;
        goto abort;
    }
    size_t per = (size_t)q->max_key_len + 256;
    if (count > BATCH_BYTES / per)
        count = (uint32_t)(BATCH_BYTES / per) ? (uint32_t)(BATCH_BYTES / per) : 1;
    /* A group is at most a quarter of the journal, so it always fits
       after a checkpoint. */
    size_t jper = sizeof(struct wq_rec) + (size_t)q->max_key_len + WQ_MSG_MAX;
    if (jrnl && count > (WQ_JOURNAL_SIZE / 4 - sizeof(struct wq_jgroup)) / jper)
        count = (uint32_t)((WQ_JOURNAL_SIZE / 4 - sizeof(struct wq_jgroup)) / jper);
    items = malloc(count * sizeof *items);
    buf = malloc(count * per);
    if (!items || !buf) {
        wq__unlock(q);
        rc = -ENOMEM;
        goto abort;
    }
    uint64_t mono = wq__now_mono(), real = wq__now_real();
    bool adds = false;   /* a new key waits for this commit to be visible */
    bool broke = false;
    for (uint32_t i = 0, p = h->sq_head; i < count; i++, p = p + 1 == q->capacity ? 0 : p + 1) {
        uint32_t idx = q->sq[p];
        if (idx >= q->nent || !wq__key_ok(q, wq__entry(q, idx))) {
            h->corrupt = 1;   /* the next locker rebuilds the store queue,
                                 or frees the damaged key */
            broke = true;
            break;
        }
        bool add = (wq__entry(q, idx)->state & WQ_ST_STORING) != 0;
        if (add && done)
            break;
        adds |= add;
        snapshot_entry(q, idx, &items[n], buf + (size_t)n * per,
                       (char *)buf + (size_t)n * per + q->max_key_len, mono, real);
        n++;
    }
    if (n == 0) {   /* only another adder's keys are left, or damage */
        wq__unlock(q);
        rc = broke ? -EBADMSG : 0;
        goto abort;
    }
    bool sync = adds && q->g.durability == WQ_DURABLE_FSYNC;
    if (sync) {   /* a new fsync group: later adds are in the next one */
        uint32_t seq = h->sync_seq + 1;   /* and it ends the waits (group_wait) */
        wq_store_relaxed(&h->sync_seq, seq);
        h->sync_prev = h->sync_read;
        wq_store_relaxed(&h->sync_read, seq);
    }
    wq__unlock(q);
    if (sync)
        group_arrive(q);

    uint64_t t0 = sync ? wq__now_mono() : 0;
    if (jrnl) {
        if ((rc = journal_write(q, e, items, n)) < 0)
            goto out;
        goto written;
    }
    struct wq_meta m;
    if ((rc = owned(q, e, true)) < 0 || (rc = wq__lmdb_meta_get(txn, e, &m)) < 0)
        goto abort;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        rc = wq__lmdb_put(txn, e, &items[i], &m);
        WQ_STEP("store.put");
    }
    if (rc == 0)
        rc = wq__lmdb_meta_put(txn, e, &m);
    /* Unsynced (PROCESS, NONE): an FSYNC store never gets here, it writes
       the journal. */
    if (rc < 0)
        goto abort;
    /* The commit releases LMDB's writer lock; the next flusher must still
       not read the store queue's front before we popped it: the flush
       lock (held by our caller) keeps it out until then. The region lock
       is free meanwhile, so other processes keep marking: the next flush
       takes them all at once (group commit). */
    WQ_FAULT("store.commit");
    if ((rc = wq__lmdb_err(mdb_txn_commit(txn))) < 0) {
        txn = NULL;
        goto out;
    }
    WQ_FAULT("store.committed");
written:
    if (sync) {   /* how long a group wait may last (group_wait) */
        uint64_t d = wq__now_mono() - t0, old = wq_load_relaxed(&q->sync_ns);
        wq_store_relaxed(&q->sync_ns, old ? (old * 7 + d) / 8 : d);
    }
    txn = NULL;
    if ((rc = region_lock(q, stop, true)) < 0)
        goto out;
    bool queued = false;
    /* A settle that finds the region corrupt leaves it for the next
       locker to repair (mutate.h): the records are written all the same,
       so this flush succeeded. */
    bool redo = h->sq_epoch != epoch;   /* a repair reordered the queue */
    if (!redo)
        (void)settle(q, items, n, wq__now_mono(), &queued);
    else
        n = 0;
    if (queued)
        wq__wake_getters(q, (int)n);
    wq__unlock(q);
    *written += (int)n;
    rc = n > 0 || redo ? 1 : 0;
    goto out;
abort:
    if (txn)
        mdb_txn_abort(txn);
out:
    free(items);
    free(buf);
    return rc;
}

/*
 * Write everything marked so far (and, with `all`, keep going until the
 * store queue is empty). Grows the map when it is full. Returns the number
 * of records written or a negative errno. Never called with the region
 * lock held.
 */
static int flush(shmq *q, bool all, const struct iovec *mine, size_t nmine, const int *stop)
{
    if (!q->g.has_store)
        return 0;
    struct wq_env *e;
    int rc, written = 0;
    /* Order: flush lock, LMDB's writer lock, region lock. A background
       flush takes the flush lock first, and only then LMDB's writer lock:
       every other holder of that lock then finishes without the region
       lock. It writes only through an environment this process has open
       (opening one takes LMDB's writer lock, held by whoever pleases). */
    int lr;
    if (stop) {
        lr = pthread_mutex_trylock(&q->hdr->flush_lock);
    } else {
        if ((rc = wq__lmdb_env(q->g.store_path, (mode_t)q->g.mode, false, &e)) < 0)
            return rc;
        lr = pthread_mutex_lock(&q->hdr->flush_lock);
    }
    if (lr == EOWNERDEAD)   /* a flusher died: nothing to repair here */
        pthread_mutex_consistent(&q->hdr->flush_lock);
    else if (lr != 0)
        return -lr;   /* EBUSY: a background flush leaves it to that flusher */
    if (stop && (rc = wq__lmdb_env_cached(q->g.store_path, &e)) < 0) {
        pthread_mutex_unlock(&q->hdr->flush_lock);
        return -EBUSY;   /* this process has not written: one that has will */
    }
    bool repaired = false;
    for (int rounds = 0; rounds < 1000000; rounds++) {
        rc = flush_round(q, e, &written, mine, nmine, stop);
        if (rc == -ENOSPC && !journaled(q)) {   /* a checkpoint grows the map itself */
            if ((rc = wq__lmdb_grow(e)) < 0)
                break;
            continue;
        }
        if (rc == -EBADMSG && !repaired) {
            repaired = true;   /* the store queue was damaged: the next */
            continue;          /* round's lock rebuilds it, then we go on */
        }
        if (rc <= 0)
            break;   /* an error, or nothing was left */
        if (!all && wq_load_relaxed(&q->hdr->sq_count) == 0)
            break;
    }
    if (rc >= 0 && all && journaled(q)) {
        int c = checkpoint_locked(q, e);
        rc = c < 0 ? c : rc;
    }
    pthread_mutex_unlock(&q->hdr->flush_lock);
    return rc < 0 ? rc : written;
}

int wq__store_flush(shmq *q, bool all)
{
    return flush(q, all, NULL, 0, NULL);
}

/* Is what the store queue lists due to be written now? "Deferred
   changes" and the durability levels say when. *interval: the write is
   a periodic one (NONE, FSYNC), whose writer sets the next time. */
static bool due(shmq *q, bool *interval)
{
    struct wq_hdr *h = q->hdr;
    uint32_t listed = wq_load_relaxed(&h->sq_count);
    *interval = q->g.durability != WQ_DURABLE_PROCESS;
    if (listed == 0) {
        /* FSYNC: a journal that no checkpoint took is due at the interval
           too, so that LMDB stays that current with adds alone. */
        uint64_t tail;
        return journaled(q) && j_tail(h, &tail) == 0 && tail > 0 && !group_waiting(h) &&
               wq__now_mono() >= wq_load_relaxed(&h->next_snapshot_ns);
    }
    if (fsync_groups(q) && group_waiting(h))
        return false;   /* the waiting adder writes it (see "Fsync groups") */
    /* PROCESS: at once. NONE: a snapshot every interval. FSYNC: deferred
       changes, written by the next new key's commit, or once the
       interval passed or DEFER_MAX are listed. */
    return !*interval || wq__now_mono() >= wq_load_relaxed(&h->next_snapshot_ns) ||
           (fsync_groups(q) && listed >= DEFER_MAX);
}

static void next_due(shmq *q)
{
    uint64_t next = wq__now_mono() + (uint64_t)q->g.snapshot_ms * 1000000ull;
    wq_store_relaxed(&q->hdr->next_snapshot_ns, next);
}

int wq__store_after(shmq *q)
{
    bool interval;
    if (!q->g.has_store || !due(q, &interval))
        return 0;
    if (interval)
        next_due(q);   /* before the write: other processes' calls skip it */
    int rc = wq__store_flush(q, interval);
    return rc < 0 ? rc : 0;
}

void wq__store_idle(shmq *q, const int *stop)
{
    bool interval;
    if (!q->g.has_store || !due(q, &interval))
        return;
    /* A busy flusher or region: nothing written, due again at the next
       tick (the time is not moved). */
    if (flush(q, true, NULL, 0, stop) != -EBUSY && interval)
        next_due(q);
}

/* ------------------------------------------------------------------ */
/* The add epilogue                                                    */
/* ------------------------------------------------------------------ */

int wq__store_make_room(shmq *q, int tries)
{
    int f = wq__store_flush(q, true);
    if (f < 0)
        return f;
    return tries >= 2 ? -ENOSPC : 0;
}

/*
 * Undo the adds of keys the store could not take: those still STORING
 * (never visible) become zombies, so no later flush, by any process, can
 * make them visible. Keys that are no longer STORING were stored, by
 * another process's flush (a group commit that took our marks along):
 * their adds succeeded. Returns how many adds were undone.
 */
static size_t rollback(shmq *q, const struct iovec *keys, size_t n)
{
    size_t undone = 0;
    if (wq__lock_look(q) < 0)
        return n;   /* cannot tell: report the failure */
    wq__mut_begin(q);
    for (size_t i = 0; i < n; i++) {
        uint32_t idx = storing(q, &keys[i]);
        if (idx != WQ_NIL) {
            wq__entry_unstore(q, idx);
            undone++;
        }
    }
    wq__mut_end(q, 0);
    wq__unlock(q);
    return undone;
}

/*
 * Did a repair drop a key of the call while it waited for its commit? A
 * thorough repair drops an entry whose key is unsound, STORING or not,
 * and the later look ("not STORING") cannot tell that from a key stored
 * and since done. Such drops are counted (storing_drops, repair.c); when
 * one happened since our add, a key of the call (ours, or another
 * adder's we coalesced into) that is not live in the index (gone, or
 * only a zombie or an idle entry of an earlier add) may never have been
 * stored: the add must not claim it, so it fails (adding again is safe:
 * a stored key coalesces). Read under the lock, as repair writes it.
 */
static bool lost(shmq *q, const struct iovec *keys, size_t n, uint32_t drops)
{
    if (wq__lock_look(q) < 0)
        return false;   /* the flush's verdict stands */
    bool gone = false;
    if (q->hdr->storing_drops != drops) {
        uint32_t idx;
        for (size_t i = 0; i < n && !gone; i++)
            gone = !(state_of(q, &keys[i], &idx) & (WQ_ST_DIRTY | WQ_ST_QUEUED |
                                                    WQ_ST_PROCESSING | WQ_ST_WAITING |
                                                    WQ_ST_STORING));
    }
    wq__unlock(q);
    if (gone)
        wq__errf("queue '%s': the region was repaired while this add waited for its store "
                 "commit, and a key it added is gone: it may not be stored; add it again",
                 q->pub.name);
    return gone;
}

int wq__store_finish_add(shmq *q, const struct iovec *all, size_t nall,
                         const struct iovec *keys, size_t n, uint32_t drops, int rc)
{
    if (rc < 0 || !q->g.has_store)
        return rc;
    /* Between the adds (STORING: invisible) and our commit: another
       process's flush may commit them first (test-store-errors). */
    WQ_FAULT("store.add.marked");
    int st = 0;
    if (fsync_groups(q)) {
        group_arrive(q);
        if (n > 0)
            group_wait(q);
        /* A coalesced add into stored keys has nothing to wait for: with
           deferred changes listed, the flush would only take the flush
           lock and a write transaction to find that out. */
        if (wq_load_relaxed(&q->hdr->sq_count) != 0 && (n > 0 || any_storing(q, all, nall)))
            st = flush(q, false, all, nall, NULL);
        /* Our keys are stored (or failed): deferred changes that are
           due are written now, and their failure is not this add's. */
        st = st < 0 ? st : 0;
        if (st == 0)
            (void)wq__store_after(q);
    } else {
        st = wq__store_after(q);
    }
    if (st < 0 && n > 0 && rollback(q, keys, n) > 0)
        return st;   /* not stored: not added, now or later */
    if (q->g.durability != WQ_DURABLE_NONE && lost(q, all, nall, drops))
        return st < 0 ? st : -EBADMSG;
    return rc;       /* stored, by us or by a flush of another process */
}

int wq__shm_snapshot(wq *pub)
{
    shmq *q = wq__shm(pub);
    if (!q->g.has_store)
        return -ENOENT;
    /* FSYNC: the deferred changes in a journal write, then a checkpoint. */
    return wq__store_flush(q, true);
}
