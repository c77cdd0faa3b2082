/*
 * restore.c - a queue's store at wq_open: preparing it (the options a
 * restore takes from it), writing its meta record, and building a new
 * region from its records before anyone can see the region.
 *
 * A region is only ever restored into while it is unpublished (region.c
 * builds it unnamed and links it into /dev/shm afterwards), so nobody
 * else can be restoring into it and no key ever comes back twice.
 * Everything read from the store is checked before it is used: the meta
 * record's settings obey wq_open's own option rules (options.c), and a
 * record that does not decode, does not fit the queue, or repeats a key
 * fails the restore with -EUCLEAN.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm/shm.h"
#include "format.h"

static void meta_from_geom(struct wq_meta *m, const struct wq_geom *g)
{
    memset(m, 0, sizeof *m);
    memcpy(m->magic, WQ_META_MAGIC, sizeof WQ_META_MAGIC);
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

/* What the options leave 0 comes from the meta record: restoring with
   only a path gives back the same queue. */
static void options_from_meta(struct wq_options *eff, const struct wq_meta *m)
{
    if (!eff->capacity)
        eff->capacity = m->capacity;
    if (!eff->max_key_len)
        eff->max_key_len = m->max_key_len;
    if (!eff->max_procs)
        eff->max_procs = m->max_procs;
    if (!eff->result_capacity)
        eff->result_capacity = m->result_capacity;
    if (!eff->durability)
        eff->durability = (int)m->durability;
    if (!eff->snapshot_interval_ms && eff->durability == WQ_DURABLE_NONE)
        eff->snapshot_interval_ms = m->snapshot_ms;
    if (!(eff->flags & WQ_FAIR) && (m->flags & WQ_FAIR)) {
        eff->flags |= WQ_FAIR;
        eff->fair_share = m->fair_share;
        eff->tenant_sep = m->tenant_sep;
    }
    eff->flags |= m->flags & WQ_NO_METRICS;
    if (!eff->rl_limiters && !eff->rl_base_delay_ns && !eff->rl_max_delay_ns &&
        eff->rl_qps == 0 && !eff->rl_burst) {
        eff->rl_limiters = m->rl_limiters;
        eff->rl_base_delay_ns = m->rl_base_delay_ns;
        eff->rl_max_delay_ns = m->rl_max_delay_ns;
        eff->rl_qps = m->rl_qps;
        eff->rl_burst = m->rl_burst;
        eff->rl_fast_delay_ns = m->rl_fast_delay_ns;
        eff->rl_slow_delay_ns = m->rl_slow_delay_ns;
        eff->rl_max_fast_attempts = m->rl_max_fast_attempts;
    }
}

int wq__store_prepare(const struct wq_options *o, struct wq_options *eff, char *abs,
                      size_t abslen, bool *has_meta)
{
    mode_t mode = o->mode ? o->mode : 0600;
    bool restore = o->flags & WQ_RESTORE;
    if (strlen(o->store_path) >= abslen - 1)
        return -ENAMETOOLONG;
    if (!restore && mkdir(o->store_path, (mode & 0777) | 0700) < 0 && errno != EEXIST)
        return -errno;
    if (!realpath(o->store_path, abs))
        return restore && errno == ENOENT ? -ENODATA : -errno;
    struct stat sb;
    if (stat(abs, &sb) < 0)
        return -errno;
    if (!S_ISDIR(sb.st_mode))
        return -ENOTDIR;
    if (restore) {   /* never make a store out of a mistyped path */
        char data[PATH_MAX + 16];
        snprintf(data, sizeof data, "%s/data.mdb", abs);
        if (access(data, F_OK) < 0)
            return errno == ENOENT ? -ENODATA : -errno;
    }
    struct wq_env *e;
    int rc = wq__lmdb_env(abs, mode, true, &e);
    if (rc < 0)
        return rc;
    MDB_txn *txn;
    if ((rc = wq__lmdb_txn(e, MDB_RDONLY, &txn)) < 0)
        return rc;
    struct wq_meta m;
    rc = wq__lmdb_meta_get(txn, e, &m);
    MDB_stat st;
    bool records = mdb_stat(txn, e->recs, &st) == 0 && st.ms_entries > 0;
    mdb_txn_abort(txn);
    if (eff != o)
        *eff = *o;
    *has_meta = rc == 0;
    if (rc == -ENOENT && records)
        return -EUCLEAN;   /* records without meta: not ours */
    if (rc == -ENOENT)
        return restore ? -ENODATA : 0;
    if (rc < 0)
        return rc;
    options_from_meta(eff, &m);
    /* The stored settings obey the options' rules, or the store is not
       one we wrote: refuse it before a region is built from it. */
    return wq__options_check(eff) < 0 ? -EUCLEAN : 0;
}

int wq__store_init_meta(const struct wq_geom *g)
{
    struct wq_env *e;
    int rc = wq__lmdb_env(g->store_path, (mode_t)g->mode, false, &e);
    if (rc < 0)
        return rc;
    for (;;) {
        MDB_txn *txn;
        if ((rc = wq__lmdb_txn(e, 0, &txn)) < 0)
            return rc;
        struct wq_meta m;
        uint64_t next = 0;
        if (wq__lmdb_meta_get(txn, e, &m) == 0)
            next = m.next_order;
        meta_from_geom(&m, g);
        m.next_order = next;
        rc = wq__lmdb_meta_put(txn, e, &m);
        if (rc == 0)
            rc = wq__lmdb_err(mdb_txn_commit(txn));
        else
            mdb_txn_abort(txn);
        if (rc == -ENOSPC && wq__lmdb_grow(e) == 0)
            continue;
        return rc;
    }
}

struct loaded {
    struct wq_rec r;
    unsigned char *key;
    char *msg;
};

static int by_order(const void *a, const void *b)
{
    const struct loaded *x = a, *y = b;
    return x->r.order < y->r.order ? -1 : x->r.order > y->r.order;
}

/* One decoded record into the (unpublished) region. */
static int restore_one(shmq *view, const struct loaded *l, uint64_t mono, uint64_t real)
{
    if (l->r.cls == WQ_CLS_IDLE && !l->r.failures && !l->r.has_result)
        return 0;   /* nothing to keep (never written so; takes no entry) */
    uint32_t hash = wq__hash(view->seed, l->key, l->r.keylen);
    if (wq__table_lookup(view, l->key, l->r.keylen, hash) != WQ_NIL)
        return -EUCLEAN;   /* the same key twice */
    int rc = 0;
    uint32_t idx = wq__entry_new(view, l->key, l->r.keylen, hash, &rc);
    if (idx == WQ_NIL)
        return rc;
    struct wq_entry *en = wq__entry(view, idx);
    en->failures = l->r.failures;
    if (view->fair)
        view->fx[idx].prio = l->r.prio;
    uint16_t state;
    if (l->r.cls == WQ_CLS_PENDING) {
        en->t_b = mono;
        state = WQ_ST_DIRTY | WQ_ST_QUEUED;
    } else if (l->r.cls == WQ_CLS_WAITING && l->r.ready_wall_ns > real) {
        en->t_b = mono + (l->r.ready_wall_ns - real);
        state = WQ_ST_WAITING;
    } else if (l->r.cls == WQ_CLS_WAITING) {
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
            return rc;
        view->rslots[en->rslot].updated_ns = l->r.updated_ns;
    }
    if (state == WQ_ST_RETAINED)
        return wq__entry_restore_idle(view, idx);
    bool queued;
    return wq__entry_commit_new(view, idx, state, &queued);
}

int wq__store_restore(shmq *view)
{
    struct wq_env *e;
    int rc = wq__lmdb_env(view->g.store_path, (mode_t)view->g.mode, false, &e);
    if (rc < 0)
        return rc;
    MDB_txn *txn;
    if ((rc = wq__lmdb_txn(e, MDB_RDONLY, &txn)) < 0)
        return rc;
    MDB_stat st;
    struct loaded *all = NULL;
    MDB_cursor *c = NULL;
    size_t n = 0;
    if ((rc = wq__lmdb_err(mdb_stat(txn, e->recs, &st))) < 0)
        goto out;
    if (st.ms_entries == 0)
        goto out;
    if (st.ms_entries > view->capacity) {
        rc = -ENOSPC;
        goto out;
    }
    all = calloc(st.ms_entries, sizeof *all);
    if (!all || (rc = wq__lmdb_err(mdb_cursor_open(txn, e->recs, &c))) < 0) {
        rc = rc < 0 ? rc : -ENOMEM;
        goto out;
    }
    MDB_val k, v;
    for (int r = mdb_cursor_get(c, &k, &v, MDB_FIRST); r == 0;
         r = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        const unsigned char *key;
        const char *msg;
        if (n >= st.ms_entries || (rc = wq__lmdb_decode(&v, &all[n].r, &key, &msg)) < 0) {
            rc = rc < 0 ? rc : -EUCLEAN;
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
    wq__mut_begin(view);
    for (size_t i = 0; i < n && rc >= 0; i++)
        rc = restore_one(view, &all[i], mono, real);
    if (rc < 0)
        goto out;
    wq__mut_end(view, 0);
    rc = (int)n;
out:
    if (c)
        mdb_cursor_close(c);
    mdb_txn_abort(txn);
    free(all);
    return rc;
}
