/*
 * store.c - persistence in LMDB: what a queue needs to come back after its
 * shared region is lost. Owns the store queue (hdr->sq), the per-process
 * LMDB environments, record encoding, flushing, restore and wq_snapshot.
 *
 * Ordering rule (why a key is never in one and not the other):
 *   - The region is the truth while it exists; the store follows it.
 *     Every change the store must see marks the entry SDIRTY (and pushes
 *     it on the store queue, a ring in the region) inside the same busy
 *     critical section as the change. A flush writes the marked entries'
 *     current records to LMDB and only then, under the region lock, clears
 *     the marks of entries that did not change meanwhile (entry->sgen).
 *     So after any crash, the region still lists every entry whose record
 *     may be stale, and the next flush rewrites it (writes are idempotent).
 *   - A new key added with PROCESS or FSYNC durability starts invisible
 *     (STORING): in the index, not in the ring. It becomes a queued (or
 *     waiting) key only after the commit that stored it. A key is never
 *     handed out unless it is stored, and wq_add returns only after that.
 *   - A key that leaves the queue stays as a zombie (state SDIRTY alone,
 *     still indexed, not live) until the flush that deletes its record;
 *     then the flusher frees the entry. So "gone from the region but still
 *     stored" only ever exists as a pending, listed deletion.
 *   - Lock order: LMDB's write lock, then the region lock; never the
 *     reverse. Only the holder of LMDB's write transaction pops the store
 *     queue, so the front it read is still there when it commits; a
 *     flusher killed anywhere leaves the queue as it was, and LMDB's own
 *     robust writer mutex releases its transaction.
 *   - Group commit: a caller that needs durability takes the write
 *     transaction and flushes everything queued so far. Callers blocked
 *     behind it find their changes already written (often with nothing
 *     left to do), so concurrent adders share commits and fsyncs.
 *
 * Environments: LMDB forbids opening one environment twice in a process
 * and using one across fork(), so each process keeps a registry of open
 * environments keyed by path and pid; a child opens its own, lazily.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

#define REC_MAGIC 0x31525157u   /* "WQR1" */
#define META_MAGIC "libwq-store-v1"
#define INITIAL_MAP (64ull << 20)
#define BATCH_MAX 4096u
#define BATCH_BYTES (4u << 20)

enum { CLS_PENDING = 1, CLS_WAITING = 2, CLS_IDLE = 3, CLS_DELETE = 4 };

struct rec {
    uint32_t magic;
    uint8_t cls;
    uint8_t has_result;
    uint16_t keylen;
    uint32_t failures;
    int32_t code;
    uint64_t ready_wall_ns;
    uint64_t updated_ns;
    uint64_t order;
    uint16_t msglen;
    uint16_t pad0;
    int32_t prio;             /* WQ_FAIR priority */
};

struct meta {
    char magic[16];
    uint32_t version;
    uint32_t capacity, max_key_len, max_procs, result_capacity;
    uint32_t durability, snapshot_ms, flags;
    uint32_t rl_limiters, rl_burst, rl_max_fast_attempts;
    uint64_t rl_base_delay_ns, rl_max_delay_ns, rl_fast_delay_ns, rl_slow_delay_ns;
    double rl_qps;
    uint64_t next_order;
    uint32_t fair_share;
    int32_t tenant_sep;
};

/* ------------------------------------------------------------------ */
/* Environments                                                        */
/* ------------------------------------------------------------------ */

struct env {
    char path[1024];
    pid_t pid;
    MDB_env *env;
    MDB_dbi recs, meta;
    size_t mapsize;
    bool synced;            /* MDB_NOSYNC cleared (an FSYNC queue) */
    struct env *next;
};

static pthread_mutex_t envs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct env *envs;

static int mdb_err(int rc)
{
    switch (rc) {
    case 0: return 0;
    case MDB_MAP_FULL: return -ENOSPC;
    case MDB_INVALID: case MDB_CORRUPTED: case MDB_PAGE_NOTFOUND:
    case MDB_VERSION_MISMATCH: case MDB_INCOMPATIBLE: case MDB_BAD_TXN:
        return -EBADMSG;
    case MDB_NOTFOUND: return -ENOENT;
    case MDB_READERS_FULL: case MDB_TXN_FULL: case MDB_CURSOR_FULL:
        return -EAGAIN;
    default: return rc > 0 ? -rc : -EIO;
    }
}

static size_t max_map(void)
{
#ifdef WQ_FAULT_INJECTION
    const char *cap = getenv("WQ_TEST_STORE_MAX_MAP");   /* "full disk" tests */
    if (cap)
        return (size_t)strtoull(cap, NULL, 0);
#endif
    return (size_t)1 << 40;
}

/* A truncated data file would make LMDB fault on a page past its end. */
static int check_size(MDB_env *env, const char *path)
{
    MDB_envinfo info;
    MDB_stat st;
    char file[1100];
    struct stat sb;
    if (mdb_env_info(env, &info) || mdb_env_stat(env, &st))
        return -EBADMSG;
    snprintf(file, sizeof file, "%s/data.mdb", path);
    if (stat(file, &sb) < 0)
        return -EIO;
    if ((uint64_t)(info.me_last_pgno + 1) * st.ms_psize > (uint64_t)sb.st_size)
        return -EBADMSG;
    return 0;
}

/* Open (or find) this process's environment for path. create: make the
   directory and the meta database if missing. */
static int env_get(const char *path, mode_t mode, bool create, struct env **out)
{
    pid_t me = getpid();
    pthread_mutex_lock(&envs_mu);
    for (struct env *e = envs; e; e = e->next) {
        if (e->pid == me && strcmp(e->path, path) == 0) {
            pthread_mutex_unlock(&envs_mu);
            *out = e;
            return 0;
        }
    }
    int rc;
    struct env *e = calloc(1, sizeof *e);
    if (!e) {
        rc = -ENOMEM;
        goto fail;
    }
    snprintf(e->path, sizeof e->path, "%s", path);
    e->pid = me;
    e->mapsize = INITIAL_MAP;
    if (e->mapsize > max_map())
        e->mapsize = max_map();
    if (create && mkdir(path, (mode & 0777) | 0700) < 0 && errno != EEXIST) {
        rc = -errno;
        goto fail;
    }
    if ((rc = mdb_err(mdb_env_create(&e->env))) < 0)
        goto fail;
    mdb_env_set_maxdbs(e->env, 4);
    mdb_env_set_maxreaders(e->env, 1024);
    mdb_env_set_mapsize(e->env, e->mapsize);
    /* NOSYNC: commits reach the page cache (PROCESS durability); FSYNC
       callers sync explicitly after their group commit. NOTLS: one handle
       serves every thread of the process. */
    rc = mdb_env_open(e->env, path, MDB_NOSYNC | MDB_NOTLS | MDB_NORDAHEAD, mode & 0777);
    if (rc) {
        rc = rc == ENOENT ? -ENOENT : rc == EACCES ? -EACCES : rc == ENOTDIR ? -ENOTDIR
                                                                             : mdb_err(rc);
        mdb_env_close(e->env);
        goto fail;
    }
    int dead;
    mdb_reader_check(e->env, &dead);   /* slots of dead readers */
    if (create) {   /* the umask must not decide the files' mode */
        char f[1100];
        snprintf(f, sizeof f, "%s/data.mdb", path);
        chmod(f, mode & 0777);
        snprintf(f, sizeof f, "%s/lock.mdb", path);
        chmod(f, mode & 0777);
    }
    MDB_envinfo info;
    if (mdb_env_info(e->env, &info) == 0 && info.me_mapsize > e->mapsize)
        e->mapsize = info.me_mapsize;
    if ((rc = check_size(e->env, path)) < 0)
        goto close;
    MDB_txn *txn;
    if ((rc = mdb_err(mdb_txn_begin(e->env, NULL, 0, &txn))) < 0)
        goto close;
    /* Named databases are keys of the main one: anything else there
       means somebody else's environment. */
    MDB_dbi main_db;
    MDB_cursor *cur;
    MDB_val k, v;
    if ((rc = mdb_dbi_open(txn, NULL, 0, &main_db)) == 0 &&
        (rc = mdb_cursor_open(txn, main_db, &cur)) == 0) {
        for (int r = mdb_cursor_get(cur, &k, &v, MDB_FIRST); r == 0;
             r = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            if (!(k.mv_size == 4 && memcmp(k.mv_data, "meta", 4) == 0) &&
                !(k.mv_size == 7 && memcmp(k.mv_data, "records", 7) == 0)) {
                rc = MDB_INCOMPATIBLE;
                break;
            }
        }
        mdb_cursor_close(cur);
    }
    if (rc) {
        mdb_txn_abort(txn);
        rc = rc == MDB_INCOMPATIBLE ? -EBADMSG : mdb_err(rc);
        goto close;
    }
    unsigned flags = create ? MDB_CREATE : 0;
    rc = mdb_dbi_open(txn, "meta", flags, &e->meta);
    if (rc == 0)
        rc = mdb_dbi_open(txn, "records", flags, &e->recs);
    if (rc == MDB_NOTFOUND) {
        rc = -EBADMSG;   /* an LMDB environment, but not a libwq store */
        mdb_txn_abort(txn);
        goto close;
    }
    if (rc) {
        mdb_txn_abort(txn);
        rc = rc == MDB_INCOMPATIBLE ? -EBADMSG : mdb_err(rc);
        goto close;
    }
    if ((rc = mdb_txn_commit(txn)) != 0) {   /* frees the txn either way */
        rc = mdb_err(rc);
        goto close;
    }
    e->next = envs;
    envs = e;
    pthread_mutex_unlock(&envs_mu);
    *out = e;
    return 0;
close:
    mdb_env_close(e->env);
fail:
    pthread_mutex_unlock(&envs_mu);
    free(e);
    return rc;
}

/* MDB_MAP_RESIZED from another process's growth: adopt its size. */
static int txn_begin(struct env *e, unsigned flags, MDB_txn **txn)
{
    int rc = mdb_txn_begin(e->env, NULL, flags, txn);
    if (rc == MDB_MAP_RESIZED) {
        mdb_env_set_mapsize(e->env, 0);
        rc = mdb_txn_begin(e->env, NULL, flags, txn);
    }
    return mdb_err(rc);
}

static int grow(struct env *e)
{
    MDB_envinfo info;
    if (mdb_env_info(e->env, &info) == 0 && info.me_mapsize > e->mapsize)
        e->mapsize = info.me_mapsize;
    if (e->mapsize >= max_map())
        return -ENOSPC;
    size_t want = e->mapsize * 2 > max_map() ? max_map() : e->mapsize * 2;
    if (mdb_env_set_mapsize(e->env, want))
        return -ENOSPC;
    e->mapsize = want;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Records                                                             */
/* ------------------------------------------------------------------ */

/* The store's own key hash: fixed, since regions (and their seeds) come
   and go while the store stays. */
static uint64_t store_hash(const void *key, size_t len)
{
    uint64_t h = wq__fnv1a(key, len);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static void lkey(unsigned char out[10], uint64_t h, uint16_t n)
{
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)(h >> (56 - 8 * i));
    out[8] = (unsigned char)(n >> 8);
    out[9] = (unsigned char)n;
}

/* Decode and check a record value; key and message point into it. */
static int decode(const MDB_val *v, struct rec *r, const unsigned char **key,
                  const char **msg)
{
    if (v->mv_size < sizeof *r)
        return -EBADMSG;
    memcpy(r, v->mv_data, sizeof *r);
    if (r->magic != REC_MAGIC || r->keylen == 0 || r->keylen > WQ_MAX_KEY_LEN ||
        r->msglen > 255 || r->cls < CLS_PENDING || r->cls > CLS_IDLE ||
        v->mv_size != sizeof *r + r->keylen + r->msglen)
        return -EBADMSG;
    *key = (const unsigned char *)v->mv_data + sizeof *r;
    *msg = (const char *)*key + r->keylen;
    return 0;
}

/* Find the LMDB key holding `key`; *n = its collision index, or the next
   free one when absent (returns 0 found, -ENOENT absent). */
static int find(MDB_txn *txn, struct env *e, const void *key, size_t len, uint64_t h,
                uint16_t *n, struct rec *old)
{
    unsigned char kb[10];
    MDB_cursor *c;
    MDB_val k, v;
    int rc = mdb_cursor_open(txn, e->recs, &c);
    if (rc)
        return mdb_err(rc);
    lkey(kb, h, 0);
    k.mv_data = kb;
    k.mv_size = sizeof kb;
    uint16_t next = 0;
    rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
    while (rc == 0 && k.mv_size == 10 && memcmp(k.mv_data, kb, 8) == 0) {
        const unsigned char *kp = k.mv_data;
        uint16_t idx = (uint16_t)(kp[8] << 8 | kp[9]);
        const unsigned char *rk;
        const char *msg;
        struct rec r;
        if (decode(&v, &r, &rk, &msg) == 0 && r.keylen == len && memcmp(rk, key, len) == 0) {
            *n = idx;
            if (old)
                *old = r;
            mdb_cursor_close(c);
            return 0;
        }
        next = idx + 1;
        rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
    }
    mdb_cursor_close(c);
    if (rc && rc != MDB_NOTFOUND)
        return mdb_err(rc);
    *n = next;
    return -ENOENT;
}

/* One record to write, copied out of the region under the lock. */
struct item {
    uint32_t idx, sgen;
    struct rec r;
    const unsigned char *key;   /* into the batch buffer */
    const char *msg;
};

static int put_item(MDB_txn *txn, struct env *e, struct item *it, uint64_t *next_order)
{
    uint64_t h = store_hash(it->key, it->r.keylen);
    uint16_t n = 0;
    struct rec old = { 0 };
    unsigned char kb[10];
    int rc = find(txn, e, it->key, it->r.keylen, h, &n, &old);
    if (rc < 0 && rc != -ENOENT)
        return rc;
    lkey(kb, h, n);
    MDB_val k = { sizeof kb, kb }, v;
    if (it->r.cls == CLS_DELETE) {
        if (rc == -ENOENT)
            return 0;
        return mdb_err(mdb_del(txn, e->recs, &k, NULL));
    }
    it->r.order = rc == 0 ? old.order : (*next_order)++;
    v.mv_size = sizeof it->r + it->r.keylen + it->r.msglen;
    rc = mdb_put(txn, e->recs, &k, &v, MDB_RESERVE);
    if (rc)
        return mdb_err(rc);
    memcpy(v.mv_data, &it->r, sizeof it->r);
    memcpy((char *)v.mv_data + sizeof it->r, it->key, it->r.keylen);
    memcpy((char *)v.mv_data + sizeof it->r + it->r.keylen, it->msg, it->r.msglen);
    return 0;
}

static void meta_from_geom(struct meta *m, const struct wq_geom *g)
{
    memset(m, 0, sizeof *m);
    memcpy(m->magic, META_MAGIC, sizeof META_MAGIC);
    m->version = 1;
    m->capacity = g->capacity;
    m->max_key_len = g->max_key_len;
    m->max_procs = g->max_procs;
    m->result_capacity = g->result_capacity;
    m->durability = g->durability;
    m->snapshot_ms = g->snapshot_ms;
    m->flags = g->flags;
    m->rl_limiters = g->rl_limiters;
    m->rl_burst = g->rl_burst;
    m->rl_max_fast_attempts = g->rl_max_fast_attempts;
    m->rl_base_delay_ns = g->rl_base_delay_ns;
    m->rl_max_delay_ns = g->rl_max_delay_ns;
    m->rl_fast_delay_ns = g->rl_fast_delay_ns;
    m->rl_slow_delay_ns = g->rl_slow_delay_ns;
    m->rl_qps = g->rl_qps;
    m->fair_share = g->fair_share;
    m->tenant_sep = g->tenant_sep;
}

static int meta_get(MDB_txn *txn, struct env *e, struct meta *m)
{
    MDB_val k = { 4, "meta" }, v;
    int rc = mdb_get(txn, e->meta, &k, &v);
    if (rc)
        return mdb_err(rc);
    if (v.mv_size != sizeof *m)
        return -EBADMSG;
    memcpy(m, v.mv_data, sizeof *m);
    if (memcmp(m->magic, META_MAGIC, sizeof META_MAGIC) != 0 || m->version != 1 ||
        m->capacity == 0 || m->capacity > WQ_MAX_CAPACITY || m->max_key_len == 0 ||
        m->max_key_len > WQ_MAX_KEY_LEN)
        return -EBADMSG;
    return 0;
}

static int meta_put(MDB_txn *txn, struct env *e, const struct meta *m)
{
    MDB_val k = { 4, "meta" }, v = { sizeof *m, (void *)m };
    return mdb_err(mdb_put(txn, e->meta, &k, &v, 0));
}

/* ------------------------------------------------------------------ */
/* Marking (region side)                                               */
/* ------------------------------------------------------------------ */

static inline bool sync_mode(const wq *q)
{
    return q->g.has_store && q->g.durability != WQ_DURABLE_NONE;
}

bool wq__store_sync_adds(const wq *q)
{
    return sync_mode(q);
}

/* Lock and busy held; the entry is SDIRTY: append it to the store queue. */
static void sq_push(wq *q, uint32_t idx)
{
    struct wq_hdr *h = q->hdr;
    if (h->sq_count >= q->capacity || h->sq_head >= q->capacity)
        return;   /* corrupt: repair rebuilds the queue from SDIRTY bits */
    uint32_t tail = h->sq_head + h->sq_count;
    if (tail >= q->capacity)
        tail -= q->capacity;
    q->sq[tail] = idx;
    WQ_STEP("store.push");
    h->sq_count++;
}

/* Lock and busy held: the entry's store record is out of date. */
void wq__store_mark(wq *q, uint32_t idx)
{
    if (!q->g.has_store)
        return;
    struct wq_entry *e = wq__entry(q, idx);
    e->sgen++;
    if (e->state & WQ_ST_SDIRTY)
        return;   /* already queued: the flush will read the new state */
    e->state |= WQ_ST_SDIRTY;
    WQ_STEP("store.mark");
    sq_push(q, idx);
}

/* Lock and busy held: the key left the queue; one store makes the entry a
   zombie (SDIRTY alone) whose record the next flush removes. */
void wq__store_zombie(wq *q, uint32_t idx)
{
    struct wq_entry *e = wq__entry(q, idx);
    bool queued = e->state & WQ_ST_SDIRTY;
    e->sgen++;
    e->state = WQ_ST_SDIRTY;   /* commit */
    WQ_STEP("store.zombie");
    if (!queued)
        sq_push(q, idx);
}

/* Lock held: copy the record the store should have for entry idx. */
static void snapshot_entry(wq *q, uint32_t idx, struct item *it, unsigned char *kbuf,
                           char *mbuf, uint64_t mono, uint64_t real)
{
    struct wq_entry *e = wq__entry(q, idx);
    uint16_t st = e->state & (uint16_t)~WQ_ST_SDIRTY;
    memset(&it->r, 0, sizeof it->r);
    it->idx = idx;
    it->sgen = e->sgen;
    it->r.magic = REC_MAGIC;
    it->r.keylen = e->keylen;
    it->r.failures = e->failures;
    it->r.prio = q->fair ? q->fx[idx].prio : 0;
    memcpy(kbuf, e->key, e->keylen);
    it->key = kbuf;
    it->msg = mbuf;
    mbuf[0] = 0;
    if (st == 0) {
        it->r.cls = CLS_DELETE;
        return;
    }
    bool waiting = (st & WQ_ST_WAITING) || ((st & WQ_ST_STORING) && e->t_b > mono);
    if (st & (WQ_ST_PROCESSING | WQ_ST_DIRTY | WQ_ST_QUEUED))
        it->r.cls = CLS_PENDING;   /* processing comes back queued */
    else if (waiting)
        it->r.cls = CLS_WAITING;
    else if (st & WQ_ST_STORING)
        it->r.cls = CLS_PENDING;
    else
        it->r.cls = CLS_IDLE;
    if (it->r.cls == CLS_WAITING)
        it->r.ready_wall_ns = real + (e->t_b > mono ? e->t_b - mono : 0);
    if (wq__has_result(q, e)) {
        const struct wq_rslot *r = &q->rslots[e->rslot];
        it->r.has_result = 1;
        it->r.code = r->code;
        it->r.updated_ns = r->updated_ns;
        size_t n = strnlen(r->message, sizeof r->message - 1);
        memcpy(mbuf, r->message, n);
        it->r.msglen = (uint16_t)n;
    }
}

/* Lock held: after the commit of the items, settle their entries. */
static void settle(wq *q, struct item *items, uint32_t n, uint64_t now, bool *queued)
{
    struct wq_hdr *h = q->hdr;
    h->busy = 1;
    WQ_STEP("store.settle");
    h->sq_head = (h->sq_head + n) % q->capacity;   /* pop what we wrote */
    h->sq_count -= n;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t idx = items[i].idx;
        struct wq_entry *e = wq__entry(q, idx);
        if (!(e->state & WQ_ST_SDIRTY))
            continue;
        e->state &= (uint16_t)~WQ_ST_SDIRTY;
        if (e->sgen != items[i].sgen) {
            wq__store_mark(q, idx);   /* changed meanwhile: again */
            continue;
        }
        WQ_STEP("store.clean");
        if (e->state == WQ_ST_STORING) {   /* stored: now it may be seen */
            uint64_t ready = e->t_b;
            if (ready > now) {
                e->state = WQ_ST_WAITING;
                WQ_STEP("store.visible");
                wq__heap_push(q, idx);
            } else {
                e->t_b = now;
                wq__fair_dirty(q, idx);
                e->state = WQ_ST_DIRTY | WQ_ST_QUEUED;
                WQ_STEP("store.visible");
                wq__enqueue(q, idx);
                *queued = true;
            }
        } else if (e->state == 0) {   /* a deletion, now written */
            wq__table_remove(q, idx, e->hash);
            WQ_STEP("store.unindex");
            wq__entry_free(q, idx);
        }
    }
    h->busy = 0;
}

static int flush_round(wq *q, struct env *e, bool sync, int *written)
{
    struct wq_hdr *h = q->hdr;
    MDB_txn *txn;
    int rc = txn_begin(e, 0, &txn);
    if (rc < 0)
        return rc;
    (void)sync;
    /* From here we are the only flusher in any process. */
    struct item *items = NULL;
    unsigned char *buf = NULL;
    uint32_t n = 0, epoch;
    if ((rc = wq__lock(q)) < 0)
        goto abort;
    epoch = h->sq_epoch;
    uint32_t count = h->sq_count < BATCH_MAX ? h->sq_count : BATCH_MAX;
    if (count == 0 || h->sq_head >= q->capacity || h->sq_count > q->capacity) {
        wq__unlock(q);
        rc = 0;
        goto abort;
    }
    size_t per = (size_t)q->max_key_len + 256;
    if (count > BATCH_BYTES / per)
        count = (uint32_t)(BATCH_BYTES / per) ? (uint32_t)(BATCH_BYTES / per) : 1;
    items = malloc(count * sizeof *items);
    buf = malloc(count * per);
    if (!items || !buf) {
        wq__unlock(q);
        rc = -ENOMEM;
        goto abort;
    }
    uint64_t mono = wq__now_mono(), real = wq__now_real();
    for (uint32_t i = 0, p = h->sq_head; i < count; i++, p = p + 1 == q->capacity ? 0 : p + 1) {
        uint32_t idx = q->sq[p];
        if (idx >= q->capacity)
            break;   /* corrupt: left to repair */
        snapshot_entry(q, idx, &items[n], buf + (size_t)n * per,
                       (char *)buf + (size_t)n * per + q->max_key_len, mono, real);
        n++;
    }
    wq__unlock(q);

    struct meta m;
    if ((rc = meta_get(txn, e, &m)) < 0)
        goto abort;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        rc = put_item(txn, e, &items[i], &m.next_order);
        WQ_STEP("store.put");
    }
    if (rc == 0)
        rc = meta_put(txn, e, &m);
    if (rc < 0)
        goto abort;
    /* The commit releases LMDB's writer lock; the next flusher must still
       not read the store queue's front before we popped it: the flush
       lock (held by our caller) keeps it out until then. The region lock
       is free meanwhile, so other processes keep marking: the next flush
       takes them all at once (group commit). */
    WQ_FAULT("store.commit");
    if ((rc = mdb_err(mdb_txn_commit(txn))) < 0) {
        txn = NULL;
        goto out;
    }
    WQ_FAULT("store.committed");
    txn = NULL;
    if ((rc = wq__lock(q)) < 0)
        goto out;
    bool queued = false;
    if (h->sq_epoch == epoch)   /* a repair reordered the queue: redo */
        settle(q, items, n, wq__now_mono(), &queued);
    else
        n = 0;
    if (queued)
        wq__wake_getters(q, (int)n);
    wq__unlock(q);
    *written += (int)n;
    rc = n > 0 ? 1 : 0;
    goto out;
abort:
    if (txn)
        mdb_txn_abort(txn);
out:
    free(items);
    free(buf);
    return rc;
}

static int env_of(wq *q, struct env **e)
{
    return env_get(q->g.store_path, (mode_t)q->g.mode, false, e);
}

/*
 * Write everything marked so far (and, with `all`, keep going until the
 * store queue is empty). Grows the map when it is full. Returns the number
 * of records written or a negative errno. Never called with the region
 * lock held.
 */
int wq__store_flush(wq *q, bool all)
{
    if (!q->g.has_store)
        return 0;
    struct env *e;
    int rc = env_of(q, &e);
    if (rc < 0)
        return rc;
    bool sync = q->g.durability == WQ_DURABLE_FSYNC;
    /* FSYNC: let LMDB sync inside the commit, i.e. while it still holds
       its writer lock. Callers blocked on that lock then find their
       records committed AND on disk: one fsync serves the whole group.
       (A sync after the commit would let the next writer commit
       meanwhile and need its own fsync.) */
    if (sync && !e->synced) {
        mdb_env_set_flags(e->env, MDB_NOSYNC, 0);
        e->synced = true;
    }
    int written = 0;
    /* Order: flush lock, LMDB's writer lock, region lock. */
    int lr = pthread_mutex_lock(&q->hdr->flush_lock);
    if (lr == EOWNERDEAD)   /* a flusher died: nothing to repair here */
        pthread_mutex_consistent(&q->hdr->flush_lock);
    else if (lr != 0)
        return -lr;
    for (int rounds = 0; rounds < 1000000; rounds++) {
        rc = flush_round(q, e, sync, &written);
        if (rc == -ENOSPC) {
            if ((rc = grow(e)) < 0)
                break;
            continue;
        }
        if (rc < 0)
            break;
        if (rc == 0)
            break;   /* nothing was left */
        if (!all && __atomic_load_n(&q->hdr->sq_count, __ATOMIC_RELAXED) == 0)
            break;
    }
    pthread_mutex_unlock(&q->hdr->flush_lock);
    return rc < 0 ? rc : written;
}

/* After an operation that marked entries: make them durable if the
   queue's durability asks for it. */
int wq__store_after(wq *q)
{
    if (!q->g.has_store)
        return 0;
    struct wq_hdr *h = q->hdr;
    if (q->g.durability == WQ_DURABLE_NONE) {
        uint64_t due = __atomic_load_n(&h->next_snapshot_ns, __ATOMIC_RELAXED);
        if (__atomic_load_n(&h->sq_count, __ATOMIC_RELAXED) == 0 || wq__now_mono() < due)
            return 0;
        __atomic_store_n(&h->next_snapshot_ns,
                         wq__now_mono() + (uint64_t)q->g.snapshot_ms * 1000000ull,
                         __ATOMIC_RELAXED);
        int rc = wq__store_flush(q, true);
        return rc < 0 ? rc : 0;
    }
    if (__atomic_load_n(&h->sq_count, __ATOMIC_RELAXED) == 0)
        return 0;
    int rc = wq__store_flush(q, false);
    return rc < 0 ? rc : 0;
}

/*
 * An add whose key could not be stored (store full, unwritable) changes
 * nothing: a key still STORING (never visible) becomes a zombie, freed by
 * the next flush that succeeds. Keys that were stored before are left.
 */
void wq__store_rollback(wq *q, const void *key, size_t len)
{
    uint32_t hash = wq__hash(q->seed, key, len);
    if (!q->g.has_store || wq__lock(q) < 0)
        return;
    uint32_t idx = wq__table_lookup(q, key, len, hash);
    if (idx < q->capacity && wq__st(wq__entry(q, idx)) == WQ_ST_STORING) {
        struct wq_entry *e = wq__entry(q, idx);
        q->hdr->busy = 1;
        if (e->t_b == 0 && q->hdr->adds_total > 0)
            q->hdr->adds_total--;   /* it was counted as an add */
        wq__store_zombie(q, idx);
        atomic_fetch_sub_explicit(&q->hdr->live, 1, memory_order_relaxed);
        q->hdr->busy = 0;
    }
    wq__unlock(q);
}

/* An add met -WQ_EFLUSH: the only room is held by removals the store has
   not seen; write them (freeing their entries). 0: try again. */
int wq__store_make_room(wq *q, int tries)
{
    int f = wq__store_flush(q, true);
    if (f < 0)
        return f;
    return tries >= 2 ? -ENOSPC : 0;
}

/* An add is done with the region (rc): make it as durable as the queue
   says before returning, or undo it if the store cannot take it. */
int wq__store_finish_add(wq *q, const void *key, size_t len, int rc)
{
    int st = rc >= 0 ? wq__store_after(q) : 0;
    if (st < 0)
        wq__store_rollback(q, key, len);   /* not stored: not added */
    return st < 0 ? st : rc;
}

int wq_snapshot(wq *q)
{
    if (!q)
        return -EINVAL;
    if (!q->g.has_store)
        return -ENOENT;
    return wq__store_flush(q, true);
}

/* ------------------------------------------------------------------ */
/* Creation and restore                                                */
/* ------------------------------------------------------------------ */

/*
 * wq_open with a store_path, before the region is built: resolve the
 * path, open the environment (creating it), and take geometry the options
 * leave at 0 from the store's meta record. *has_meta says whether the
 * store existed.
 */
int wq__store_prepare(const struct wq_options *o, struct wq_options *eff, char *abs,
                      size_t abslen, bool *has_meta)
{
    mode_t mode = o->mode ? o->mode : 0600;
    if (strlen(o->store_path) >= abslen - 1)
        return -ENAMETOOLONG;
    if (mkdir(o->store_path, (mode & 0777) | 0700) < 0 && errno != EEXIST)
        return -errno;
    if (!realpath(o->store_path, abs))
        return -errno;
    struct stat sb;
    if (stat(abs, &sb) < 0)
        return -errno;
    if (!S_ISDIR(sb.st_mode))
        return -ENOTDIR;
    struct env *e;
    int rc = env_get(abs, mode, true, &e);
    if (rc < 0)
        return rc;
    MDB_txn *txn;
    if ((rc = txn_begin(e, MDB_RDONLY, &txn)) < 0)
        return rc;
    struct meta m;
    rc = meta_get(txn, e, &m);
    MDB_stat st;
    bool records = mdb_stat(txn, e->recs, &st) == 0 && st.ms_entries > 0;
    mdb_txn_abort(txn);
    if (eff != o)
        *eff = *o;
    *has_meta = rc == 0;
    if (rc == -ENOENT && records)
        return -EBADMSG;   /* records without meta: not ours */
    if (rc == -ENOENT)
        return 0;
    if (rc < 0)
        return rc;
    if (!eff->capacity)
        eff->capacity = m.capacity;
    if (!eff->max_key_len)
        eff->max_key_len = m.max_key_len;
    if (!eff->max_procs)
        eff->max_procs = m.max_procs;
    if (!eff->result_capacity)
        eff->result_capacity = m.result_capacity;
    /* The rest of the stored settings too, where the options are 0:
       restoring with only a path gives back the same queue. */
    if (!eff->durability)
        eff->durability = (int)m.durability;
    if (!eff->snapshot_interval_ms && eff->durability == WQ_DURABLE_NONE)
        eff->snapshot_interval_ms = m.snapshot_ms;
    if (!(eff->flags & WQ_FAIR) && (m.flags & WQ_FAIR)) {
        eff->flags |= WQ_FAIR;
        eff->fair_share = m.fair_share;
        eff->tenant_sep = m.tenant_sep;
    }
    eff->flags |= m.flags & WQ_NO_METRICS;
    if (!eff->rl_limiters && !eff->rl_base_delay_ns && !eff->rl_max_delay_ns &&
        eff->rl_qps == 0 && !eff->rl_burst) {
        eff->rl_limiters = m.rl_limiters;
        eff->rl_base_delay_ns = m.rl_base_delay_ns;
        eff->rl_max_delay_ns = m.rl_max_delay_ns;
        eff->rl_qps = m.rl_qps;
        eff->rl_burst = m.rl_burst;
        eff->rl_fast_delay_ns = m.rl_fast_delay_ns;
        eff->rl_slow_delay_ns = m.rl_slow_delay_ns;
        eff->rl_max_fast_attempts = m.rl_max_fast_attempts;
    }
    return 0;
}

/* New store: write its meta record (geometry and options). */
int wq__store_init_meta(const struct wq_geom *g)
{
    struct env *e;
    int rc = env_get(g->store_path, (mode_t)g->mode, false, &e);
    if (rc < 0)
        return rc;
    for (;;) {
        MDB_txn *txn;
        if ((rc = txn_begin(e, 0, &txn)) < 0)
            return rc;
        struct meta m;
        uint64_t next = 0;
        if (meta_get(txn, e, &m) == 0)
            next = m.next_order;
        meta_from_geom(&m, g);
        m.next_order = next;
        rc = meta_put(txn, e, &m);
        if (rc == 0)
            rc = mdb_err(mdb_txn_commit(txn));
        else
            mdb_txn_abort(txn);
        if (rc == -ENOSPC && grow(e) == 0)
            continue;
        return rc;
    }
}

struct loaded {
    struct rec r;
    unsigned char *key;
    char *msg;
};

static int by_order(const void *a, const void *b)
{
    const struct loaded *x = a, *y = b;
    return x->r.order < y->r.order ? -1 : x->r.order > y->r.order;
}

/*
 * Fill a region that nobody else can see yet (`view` maps it; no lock is
 * needed) from the store, in first-add order. Fails with -ENOSPC when the
 * store holds more keys than the region has room for, -EBADMSG on a
 * damaged record.
 */
int wq__store_restore(wq *view)
{
    struct env *e;
    int rc = env_get(view->g.store_path, (mode_t)view->g.mode, false, &e);
    if (rc < 0)
        return rc;
    MDB_txn *txn;
    if ((rc = txn_begin(e, MDB_RDONLY, &txn)) < 0)
        return rc;
    MDB_stat st;
    struct loaded *all = NULL;
    MDB_cursor *c = NULL;
    size_t n = 0;
    if ((rc = mdb_err(mdb_stat(txn, e->recs, &st))) < 0)
        goto out;
    if (st.ms_entries == 0)
        goto out;
    if (st.ms_entries > view->capacity) {
        rc = -ENOSPC;
        goto out;
    }
    all = calloc(st.ms_entries, sizeof *all);
    if (!all || (rc = mdb_err(mdb_cursor_open(txn, e->recs, &c))) < 0) {
        rc = rc < 0 ? rc : -ENOMEM;
        goto out;
    }
    MDB_val k, v;
    for (int r = mdb_cursor_get(c, &k, &v, MDB_FIRST); r == 0;
         r = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        const unsigned char *key;
        const char *msg;
        if (n >= st.ms_entries || (rc = decode(&v, &all[n].r, &key, &msg)) < 0) {
            rc = rc < 0 ? rc : -EBADMSG;
            goto out;
        }
        if (all[n].r.keylen > view->max_key_len) {
            rc = -EMSGSIZE;
            goto out;
        }
        all[n].key = (unsigned char *)key;   /* valid while txn lives */
        all[n].msg = (char *)msg;
        n++;
    }
    qsort(all, n, sizeof *all, by_order);
    uint64_t mono = wq__now_mono(), real = wq__now_real();
    for (size_t i = 0; i < n; i++) {
        struct loaded *l = &all[i];
        uint32_t hash = wq__hash(view->seed, l->key, l->r.keylen);
        if (wq__table_lookup(view, l->key, l->r.keylen, hash) != WQ_NIL) {
            rc = -EBADMSG;   /* the same key twice */
            goto out;
        }
        int err = 0;
        uint32_t idx = wq__new_entry(view, l->key, l->r.keylen, hash, &err);
        if (idx == WQ_NIL) {
            rc = err;
            goto out;
        }
        struct wq_entry *en = wq__entry(view, idx);
        en->failures = l->r.failures;
        if (view->fair)
            view->fx[idx].prio = l->r.prio;
        uint16_t state;
        if (l->r.cls == CLS_PENDING) {
            en->t_b = mono;
            state = WQ_ST_DIRTY | WQ_ST_QUEUED;
        } else if (l->r.cls == CLS_WAITING && l->r.ready_wall_ns > real) {
            en->t_b = mono + (l->r.ready_wall_ns - real);
            state = WQ_ST_WAITING;
        } else if (l->r.cls == CLS_WAITING) {
            en->t_b = mono;   /* its delay ran out while we were away */
            state = WQ_ST_DIRTY | WQ_ST_QUEUED;
        } else {
            state = WQ_ST_RETAINED;
        }
        if (l->r.has_result) {
            char msg[256];
            memcpy(msg, l->msg, l->r.msglen);
            msg[l->r.msglen] = 0;
            if ((rc = wq__result_record(view, idx, l->r.code, msg)) < 0)
                goto out;
            view->rslots[en->rslot].updated_ns = l->r.updated_ns;
        }
        if (state == WQ_ST_RETAINED) {
            if (!l->r.failures && !l->r.has_result)
                continue;   /* nothing to keep (should not be stored) */
            en->state = state;
            if ((rc = wq__table_insert(view, idx, hash)) < 0)
                goto out;
            view->hdr->failing++;
            continue;
        }
        if ((rc = wq__commit_new(view, idx, state)) < 0 ||
            (state == WQ_ST_WAITING && (rc = wq__heap_push(view, idx)) < 0))
            goto out;
    }
    rc = (int)n;
    view->hdr->busy = 0;
out:
    if (c)
        mdb_cursor_close(c);
    mdb_txn_abort(txn);
    free(all);
    return rc;
}
