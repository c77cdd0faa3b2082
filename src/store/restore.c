/*
 * restore.c - a queue's store at wq_open: preparing it (the options a
 * restore takes from it), writing its meta record, and building a new
 * region from its records before anyone can see the region.
 *
 * A region is only ever restored into while it is unpublished (region.c
 * builds it unnamed and links it into /dev/shm afterwards), so nobody
 * else can be restoring into it and no key ever comes back twice.
 * Everything read from the store is checked before it is used (read.c
 * reads it in a child process, so that LMDB tripping over a damaged page
 * kills only that child): every record's checksum, the number of records
 * and the sum of their checksums against the meta record, the meta's
 * settings against wq_open's own option rules (options.c), keys fitting
 * the queue and unique. Anything else fails the restore with -EUCLEAN
 * and a description naming the store (wq_last_error): a restore brings
 * back every stored record exactly, or nothing.
 *
 * An FSYNC store's journal (journal.c) may hold groups no checkpoint
 * took: the queue went down (a power failure, or its region removed)
 * before one did. They are applied to LMDB first, in one synced commit,
 * and the store is read again: so the restore, and whatever reads the
 * store after it, sees every add the journal holds.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shm/shm.h"
#include "format.h"
#include "read.h"

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
    if (!eff->snapshot_interval_ms &&
        (eff->durability == WQ_DURABLE_NONE || eff->durability == WQ_DURABLE_FSYNC))
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

int wq__store_options(struct wq_options *eff, const struct wq_meta *m)
{
    options_from_meta(eff, m);
    /* The stored settings obey the options' rules, or the store is not
       one we wrote: refuse it before a region is built from it. */
    return wq__options_check(eff) < 0 ? -EUCLEAN : 0;
}

int wq__store_err(int rc, const char *dir, const char *fmt, ...)
{
    char what[3584];   /* wq_last_error holds 4096 bytes with "store '<dir>': " */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    wq__errf("store '%s': %s", dir, what);
    return rc;
}

/* dir/file: 0 when it is there (its size in *size), -ENOENT when it is
   not, else why it cannot be looked at (-EACCES: a directory we may not
   search). A dangling symbolic link is -ENOENT with its target in
   link (else link is ""): LMDB would create that target, somewhere
   nobody meant, so the callers refuse it by name. */
static int look(const char *dir, const char *file, off_t *size, char *link, size_t linkcap)
{
    char p[PATH_MAX + 32];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, file);
    link[0] = 0;
    if (stat(p, &sb) < 0) {
        int err = errno;
        ssize_t n;
        if (err == ENOENT && (n = readlink(p, link, linkcap - 1)) >= 0)
            link[n] = 0;
        return -err;
    }
    if (size)
        *size = sb.st_size;
    return 0;
}

/*
 * What the read store holds must be what its meta says it holds: every
 * record verified (read.c), their number and checksum sum equal to the
 * meta's, no key twice (restore_one), the settings valid.
 */
static int verify(const char *dir, struct wq_store_img *img)
{
    if (img->bad_meta)
        return wq__store_err(-EUCLEAN, dir, "its meta record is damaged (%s)", img->meta_why);
    if (img->bad)
        return wq__store_err(-EUCLEAN, dir, "%zu damaged record%s (%s)", img->bad,
                             img->bad == 1 ? "" : "s", img->first_bad);
    if (!img->has_meta)
        return img->n ? wq__store_err(-EUCLEAN, dir, "records without a meta record: "
                                      "not a libwq store") : 0;
    if (img->meta.version < 2)
        return 0;   /* version 1: no counts to check (rewritten on restore) */
    if (img->v1)
        return wq__store_err(-EUCLEAN, dir, "a version 1 record in a version 2 store");
    if (img->n != img->meta.records)
        return wq__store_err(-EUCLEAN, dir, "holds %zu records, its meta record says %llu "
                             "(records lost or added)", img->n,
                             (unsigned long long)img->meta.records);
    if (img->sum != img->meta.sum)
        return wq__store_err(-EUCLEAN, dir, "its records do not add up to its meta record's "
                             "checksum (a record was altered or replaced)");
    return 0;
}

/* wq__store_mkdir failed: say why, and for a missing parent, which. */
static int mkdir_err(int rc, const char *dir)
{
    char parent[PATH_MAX];
    struct stat sb;
    snprintf(parent, sizeof parent, "%s", dir);
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/')
        parent[--n] = 0;
    char *slash = strrchr(parent, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else
        slash[slash == parent] = 0;   /* "/x" -> "/" */
    if (rc == -ENOENT && stat(parent, &sb) < 0 && errno == ENOENT)
        return wq__store_err(rc, dir, "cannot make the directory: its parent '%s' does not exist",
                             parent);
    return wq__store_err(rc, dir, "cannot make the directory: %s", strerror(-rc));
}

/*
 * Apply the journal's groups that the store does not hold yet (see the
 * top). Runs only while no region of the queue exists, in wq_open: two
 * openers that both replay apply the same groups, which changes nothing
 * the second time (a group is applied whole, in one commit, and sets the
 * lsn that covers it). 1: the store changed, 0: nothing to apply, or
 * -errno with the store named: -EUCLEAN for a damaged journal, which
 * wq_store_salvage then reads as far as it verifies.
 */
static int replay(const char *abs, mode_t mode)
{
    char f[PATH_MAX + 16], why[256] = "";
    snprintf(f, sizeof f, "%s/%s", abs, WQ_JOURNAL_FILE);
    /* O_NONBLOCK: a FIFO of that name must not hang the open. */
    int fd = open(f, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT ? 0 : wq__store_err(-errno, abs, "cannot open its journal: %s",
                                                   strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return wq__store_err(-EUCLEAN, abs, "its journal is not a regular file");
    }
    struct wq_env *e;
    int rc = wq__lmdb_env(abs, mode, false, &e);
    /* Shared: no writer (a region of the queue made meanwhile, by another
       opener) is between its number and its group while we read. */
    if (rc == 0 && (rc = wq__journal_lock(e, fd, true)) < 0) {
        close(fd);
        return wq__store_err(rc, abs, "cannot lock its journal: %s", strerror(-rc));
    }
    bool locked = rc == 0;
    if (locked)
        e->rfd = fd + 1;   /* a fork meanwhile closes the child's copy (lmdb.c) */
    if (rc == 0)
        rc = wq__journal_commit(e, fd, 0, 0, 0, false, "store.replay", why, sizeof why);
    if (locked) {
        e->rfd = 0;
        wq__journal_unlock(e, fd);
    }
    close(fd);
    if (rc < 0)
        return wq__store_err(rc, abs, "replaying its journal: %s", why[0] ? why : strerror(-rc));
    return rc > 0;
}

/* The store's LMDB environment, made if need be: failures named. */
static int env_open(const char *abs, mode_t mode)
{
    struct wq_env *e;
    int rc = wq__lmdb_env(abs, mode, true, &e);
    if (rc < 0)
        wq__store_err(rc, abs, "opening the environment: %s",
                      rc == -EUCLEAN ? "not an LMDB environment" : strerror(-rc));
    return rc;
}

/* Claimed and read: a writer of the old owner that passed its owner
   check before the claim may have committed after our read (a read is
   a snapshot, which LMDB's writer lock does not hold up), its add
   acknowledged. Once we hold that lock every such writer is done and
   later ones are refused: 1 if the meta moved since the read (read
   again), 0, or -errno. */
static int moved(const char *abs, mode_t mode, const struct wq_store_img *img)
{
    struct wq_env *e;
    MDB_txn *txn;
    struct wq_meta m;
    /* Writers may skip their check for a while after one (format.h). */
    for (uint64_t now; (now = wq__now_mono()) - img->claimed_ns < WQ_OWNER_SETTLE_NS;) {
        uint64_t left = WQ_OWNER_SETTLE_NS - (now - img->claimed_ns);
        struct timespec ts = { 0, (long)left };
        nanosleep(&ts, NULL);
    }
    int rc = wq__lmdb_env(abs, mode, false, &e);
    if (rc == 0)
        rc = wq__lmdb_txn(e, 0, &txn);
    if (rc < 0)
        return wq__store_err(rc, abs, "cannot begin a write: %s", wq_strerror(rc));
    rc = wq__lmdb_meta_get(txn, e, &m);
    mdb_txn_abort(txn);
    if (rc < 0)
        return wq__store_err(rc, abs, "its meta record: %s", wq_strerror(rc));
    return m.records != img->meta.records || m.sum != img->meta.sum ||
           m.next_order != img->meta.next_order || m.journal_lsn != img->meta.journal_lsn;
}

/* wq_open's claim of the store (owner.c), kept in img until publication;
   nothing to claim for other callers. */
static int claim(const char *abs, mode_t mode, struct wq_store_img *img)
{
    if (!img->claim)
        return 0;
    int rc = wq__owner_claim(abs, mode, img->region, img->claim, img->live, &img->owner);
    img->claimed_ns = wq__now_mono();
    return rc;
}

int wq__store_prepare(const struct wq_options *o, struct wq_options *eff, char *abs,
                      size_t abslen, struct wq_store_img *img)
{
    int rc;
    mode_t mode = o->mode ? o->mode : 0600;
    bool restore = o->flags & WQ_RESTORE;
    if (eff != o)
        *eff = *o;
    if (strlen(o->store_path) >= abslen - 1)
        return wq__store_err(-ENAMETOOLONG, o->store_path, "path too long (at most %zu bytes)",
                             abslen - 2);
    if (!restore && (rc = wq__store_mkdir(o->store_path, mode)) < 0)
        return mkdir_err(rc, o->store_path);
    if (!realpath(o->store_path, abs)) {
        rc = -errno;
        if (restore && rc == -ENOENT)   /* never make a store of a mistyped path */
            return wq__store_err(-ENODATA, o->store_path, "no such directory: nothing to restore");
        return wq__store_err(rc, o->store_path, "%s", strerror(-rc));
    }
    struct stat sb;
    if (stat(abs, &sb) < 0)
        return wq__store_err(-errno, abs, "%s", strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return wq__store_err(-ENOTDIR, abs, "not a directory");
    off_t size = 0;
    char link[PATH_MAX];
    int mrc = look(abs, WQ_STORE_MARKER, NULL, link, sizeof link);
    int drc = look(abs, "data.mdb", &size, link, sizeof link);
    if (mrc == -EACCES || drc == -EACCES)
        return wq__store_err(-EACCES, abs, "permission denied (the directory cannot be searched)");
    if (mrc < 0 && mrc != -ENOENT)
        return wq__store_err(mrc, abs, "cannot look at %s: %s", WQ_STORE_MARKER, strerror(-mrc));
    if (drc < 0 && drc != -ENOENT)
        return wq__store_err(drc, abs, "cannot look at data.mdb: %s", strerror(-drc));
    bool marker = mrc == 0, data = drc == 0;
    if (link[0] && marker)
        return wq__store_err(-EUCLEAN, abs, "it held a queue (%s is there) but data.mdb is a "
                             "symbolic link to '%s', which does not exist", WQ_STORE_MARKER, link);
    if (link[0])
        return wq__store_err(restore ? -ENODATA : -ENOENT, abs, "data.mdb is a symbolic link to "
                             "'%s', which does not exist", link);
    if (marker && (!data || size == 0))
        return wq__store_err(-EUCLEAN, abs, "it held a queue (%s is there) but data.mdb is %s",
                             WQ_STORE_MARKER, data ? "empty" : "missing");
    if ((!data || size == 0) && restore)   /* never make a store out of a mistyped path */
        return wq__store_err(-ENODATA, abs, "holds no store (no data.mdb): nothing to restore");
    /* Ours before we read (or make) it: what an old owner writes later
       is refused. */
    if ((rc = claim(abs, mode, img)) < 0)
        return rc;
    if (!data || size == 0)
        return env_open(abs, mode);   /* a new store */
    /* A store nothing has vouched for yet: read it without trusting it. */
    char why[256];
    rc = wq__store_read(abs, img, why, sizeof why);
    if (rc < 0)
        return wq__store_err(rc, abs, "%s", why);
    if ((rc = verify(abs, img)) < 0)
        return rc;
    if (!img->has_meta) {
        if (marker)
            return wq__store_err(-EUCLEAN, abs, "it held a queue (%s is there) but data.mdb "
                                 "holds none", WQ_STORE_MARKER);
        if (restore)
            return wq__store_err(-ENODATA, abs, "holds no store (data.mdb holds no queue): "
                                 "nothing to restore");
    } else if (wq__store_options(eff, &img->meta) < 0) {
        return wq__store_err(-EUCLEAN, abs, "its meta record holds settings wq_open "
                             "would refuse");
    }
    if ((rc = env_open(abs, mode)) < 0)   /* sound: now this process may open it */
        return rc;
    if (!img->has_meta || (rc = replay(abs, mode)) < 0)
        return rc;
    if (rc == 0 && (!img->claim || (rc = moved(abs, mode, img)) <= 0))
        return rc;
    /* The store changed: read it again, as untrusted as the first time. */
    wq__store_img_clear_read(img);
    if ((rc = wq__store_read(abs, img, why, sizeof why)) < 0)
        return wq__store_err(rc, abs, "%s", why);
    return verify(abs, img);
}
/* A store written by version 1 (no checksums, no counts): rewrite every
   record as version 2, in its first-add order, in the caller's txn. */
static int upgrade(MDB_txn *txn, struct wq_env *e, const struct wq_store_img *img,
                   struct wq_meta *m)
{
    int rc = wq__lmdb_err(mdb_drop(txn, e->recs, 0));
    m->records = 0;
    m->sum = 0;
    for (size_t i = 0; i < img->n && rc == 0; i++)
        rc = wq__srec_put(txn, e, img->recs[i], m);
    return rc;
}

/* The marker that says "this directory holds a queue's store" (format.h). */
int wq__store_write_marker(const char *dir, mode_t mode)
{
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/%s", dir, WQ_STORE_MARKER);
    int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, mode & 0666);
    if (fd < 0)
        return -errno;
    static const char text[] = "libwq store: data.mdb holds a queue; do not remove one "
                               "without the other\n";
    int rc = 0;
    if (fchmod(fd, mode & 0666) < 0 || write(fd, text, sizeof text - 1) != sizeof text - 1 ||
        fsync(fd) < 0)
        rc = -errno;
    close(fd);
    if (rc == 0 && (fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
        fsync(fd);   /* the marker's name is durable too */
        close(fd);
    }
    return rc;
}

int wq__store_init_meta(const struct wq_geom *g, const struct wq_store_img *img,
                        uint64_t journal[2])
{
    struct wq_env *e;
    int rc = wq__lmdb_env(g->store_path, (mode_t)g->mode, false, &e);
    if (rc < 0)
        return rc;
    for (;;) {
        MDB_txn *txn;
        if ((rc = wq__lmdb_txn(e, 0, &txn)) < 0)
            return rc;
        struct wq_meta m, old;
        meta_from_geom(&m, g);
        /* What the store holds is kept by its writers, in their txns: take
           it from the meta as it is now, not as it was read. */
        if (wq__lmdb_meta_get(txn, e, &old) == 0) {
            m.next_order = old.next_order;
            m.records = old.records;
            m.sum = old.sum;
            m.journal_id = old.journal_id;
            m.journal_lsn = old.journal_lsn;
        }
        rc = 0;
        /* The journal's groups carry the id, so that no other store's
           journal is ever applied to this one. */
        while (m.journal_id == 0)
            if (getrandom(&m.journal_id, sizeof m.journal_id, 0) != sizeof m.journal_id)
                m.journal_id = wq__now_real() ^ ((uint64_t)getpid() << 32);
        if (img && (img->v1 || (img->has_meta && img->meta.version < 2)))
            rc = upgrade(txn, e, img, &m);
        if (rc == 0)
            rc = wq__lmdb_meta_put(txn, e, &m);
        /* An FSYNC store's commits are all synced (store.c, "Deferred
           changes"); the flag is set under LMDB's writer lock, as there. */
        if (rc == 0)
            mdb_env_set_flags(e->env, MDB_NOSYNC, g->durability != WQ_DURABLE_FSYNC);
        if (rc == 0)
            rc = wq__lmdb_err(mdb_txn_commit(txn));
        else
            mdb_txn_abort(txn);
        if (rc == -ENOSPC && wq__lmdb_grow(e) == 0)
            continue;
        if (rc < 0)
            return rc;
        /* The journal, made now rather than by the first add: filling
           it takes a few ms. */
        if (g->durability == WQ_DURABLE_FSYNC) {
            /* Twice when this process had a journal open that is no
               longer the one at the name. */
            for (int i = 0; i < 2; i++) {
                if ((rc = wq__journal_acquire(e, (mode_t)g->mode)) < 0)
                    return wq__store_err(rc, g->store_path, "cannot make its journal: %s",
                                         rc == -EUCLEAN ? "not a regular file" : strerror(-rc));
                bool again = wq__journal_replaced(e, rc);
                wq__journal_unlock(e, rc);
                if (!again)
                    break;
            }
        }
        journal[0] = m.journal_id;
        journal[1] = m.journal_lsn;
        return wq__store_write_marker(g->store_path, (mode_t)g->mode);
    }
}

/* Restore order: first-add order. Sorted as small (order, index) pairs
   (a record's or an entry's index): moving the 100-byte records
   themselves would cost more than the rest of the restore. Ties (two
   records with one order, which a sound store never has) go by index. */
struct rank {
    uint64_t order;
    uint32_t idx;
};

static int by_order(const void *a, const void *b)
{
    const struct rank *x = a, *y = b;
    if (x->order != y->order)
        return x->order < y->order ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* A record decoded, with its key's hash: the restore loop decodes each
   one once, SLOT records before restoring it. */
struct dec {
    struct wq_rec r;
    const unsigned char *key;
    const char *msg;
    uint32_t hash;
};

static void decode(const shmq *view, struct wq_srec s, struct dec *d)
{
    wq__srec_open(s, &d->r, &d->key, &d->msg, NULL);
    d->hash = wq__hash(view->seed, d->key, d->r.keylen);
}

/* How the records are visited. In first-add order, each key goes where
   it belongs at once. In the store's order (wq__store_restore says
   when), a new entry's seq is base + its add order - lo, and a queued
   key is only noted, in slot[order - lo] (entry + 1), to enter the queue
   afterwards in that order. The slots are written, never read while
   noting (a read would wait for a random miss, the one this order
   avoids): fewer filled slots than notes means two records had one add
   order. */
struct visit {
    uint64_t mono, real;
    uint32_t *slot;   /* NULL: first-add order */
    uint64_t lo;
    uint32_t base;
    size_t noted;
};

/* One verified record into the (unpublished) region. */
static int restore_one(shmq *view, const struct dec *d, struct visit *v)
{
    const struct wq_rec *r = &d->r;
    if (r->cls == WQ_CLS_IDLE && !r->failures && !r->has_result)
        return 0;   /* nothing to keep (never written so; takes no entry) */
    if (r->keylen > view->max_key_len)
        return wq__store_err(-EUCLEAN, view->g.store_path, "holds a key of %u bytes, longer "
                             "than the queue's max_key_len %u", r->keylen, view->max_key_len);
    if (r->msglen > 255)   /* verified when read; m below holds no more */
        return wq__store_err(-EUCLEAN, view->g.store_path, "holds a message of %u bytes",
                             r->msglen);
    if (wq__table_lookup(view, d->key, r->keylen, d->hash) != WQ_NIL)
        return wq__store_err(-EUCLEAN, view->g.store_path, "holds one key twice");
    int rc = 0;
    uint32_t idx = wq__entry_new(view, d->key, r->keylen, d->hash, &rc);
    if (rc == -WQ_EFLUSH)   /* every entry taken, some by idle keys */
        rc = -ENOSPC;
    if (idx == WQ_NIL)   /* full, or no room in /dev/shm (said by region.c) */
        return rc == -ENOSPC && view->hdr->e_fresh >= view->capacity
                   ? wq__store_err(rc, view->g.store_path, "holds more keys than the queue's "
                                   "capacity %u", view->capacity)
                   : rc;
    struct wq_entry *en = wq__entry(view, idx);
    if (v->slot)
        wq_store_relaxed(&en->seq, v->base + (uint32_t)(r->order - v->lo));
    en->failures = r->failures;
    if (view->fair)
        view->fx[idx].prio = r->prio;
    uint16_t state;
    if (r->cls == WQ_CLS_PENDING) {
        en->t_b = v->mono;
        state = WQ_ST_DIRTY | WQ_ST_QUEUED;
    } else if (r->cls == WQ_CLS_WAITING && r->ready_wall_ns > v->real) {
        en->t_b = v->mono + (r->ready_wall_ns - v->real);
        state = WQ_ST_WAITING;
    } else if (r->cls == WQ_CLS_WAITING) {
        en->t_b = v->mono;   /* its delay ran out while we were away */
        state = WQ_ST_DIRTY | WQ_ST_QUEUED;
    } else {
        state = WQ_ST_RETAINED;
    }
    if (r->has_result) {
        char m[256];
        memcpy(m, d->msg, r->msglen);
        m[r->msglen] = 0;
        if ((rc = wq__result_room(view, idx, m)) < 0 ||
            (rc = wq__result_record(view, idx, r->code, m)) < 0)
            return rc;
        view->rslots[en->rslot].updated_ns = r->updated_ns;
    }
    if (state == WQ_ST_RETAINED)
        return wq__entry_restore_idle(view, idx);
    if (v->slot && state != WQ_ST_WAITING) {
        v->slot[r->order - v->lo] = idx + 1;
        v->noted++;
        return wq__entry_restore_queued(view, idx);
    }
    bool queued;
    return wq__entry_commit_new(view, idx, state, &queued);
}

/* Restore the n records of recs, in that order. Each record visited
   misses twice, at random (in first-add order; in the store's order only
   its index slot): its bytes and its key's index slot. So the bytes are
   fetched AHEAD records ahead, and the slot (from the key's hash; the
   record is decoded then and kept until used) SLOT ahead. */
static int visit(shmq *view, const struct wq_srec *recs, size_t n, struct visit *v)
{
    enum { AHEAD = 16, SLOT = 8 };
    struct dec ring[SLOT];
    int rc = 0;
    for (size_t i = 0; i < n && i < SLOT; i++)
        decode(view, recs[i], &ring[i]);
    for (size_t i = 0; i < n && rc >= 0; i++) {
        if (i + AHEAD < n) {
            __builtin_prefetch(recs[i + AHEAD].raw);
            __builtin_prefetch(recs[i + AHEAD].raw + 64);
        }
        /* New keys take entries in turn: the one SLOT ahead, for writing. */
        if (view->hdr->e_fresh + SLOT < view->nent)
            __builtin_prefetch(wq__entry(view, view->hdr->e_fresh + SLOT), 1);
        struct dec d = ring[i % SLOT];
        if (i + SLOT < n) {
            decode(view, recs[i + SLOT], &ring[i % SLOT]);
            wq__table_prefetch(view, ring[i % SLOT].hash);
            if (v->slot)
                __builtin_prefetch(&v->slot[ring[i % SLOT].r.order - v->lo], 1);
        }
        rc = restore_one(view, &d, v);
    }
    return rc;
}

/* The queued keys of a visit in the store's order enter the queue, in
   first-add order: from the slots, or (two records had one add order,
   which a sound store never has) sorted by seq, then entry. */
static int enter_queued(shmq *view, struct visit *v, uint64_t span)
{
    int rc = 0;
    size_t filled = 0;
    for (uint64_t o = 0; o < span; o++)
        filled += v->slot[o] != 0;
    if (filled == v->noted) {
        for (uint64_t o = 0; o < span && rc >= 0; o++)
            if (v->slot[o])
                rc = wq__entry_restore_enter(view, v->slot[o] - 1);
        return rc;
    }
    uint32_t fresh = view->hdr->e_fresh;
    struct rank *rank = malloc((fresh ? fresh : 1) * sizeof *rank);
    if (!rank)
        return -ENOMEM;
    size_t k = 0;
    for (uint32_t idx = 0; idx < fresh; idx++) {
        const struct wq_entry *e = wq__entry(view, idx);
        if (e->state == (WQ_ST_DIRTY | WQ_ST_QUEUED))
            rank[k++] = (struct rank){ e->seq - v->base, idx };
    }
    qsort(rank, k, sizeof *rank, by_order);
    for (size_t i = 0; i < k && rc >= 0; i++)
        rc = wq__entry_restore_enter(view, rank[i].idx);
    free(rank);
    return rc;
}

/*
 * The records in first-add order, in a new array. Orders are handed out
 * by a counter, so they are nearly dense: when their range is small, each
 * record goes straight to its slot (O(n)); otherwise they are sorted.
 */
static struct wq_srec *in_order(const struct wq_store_img *img)
{
    size_t n = img->n;
    struct wq_srec *seq = malloc((n ? n : 1) * sizeof *seq);
    if (!seq)
        return NULL;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t o = wq__srec_order(img->recs[i]);
        lo = o < lo ? o : lo;
        hi = o > hi ? o : hi;
    }
    struct wq_srec *slot = NULL;
    if (n > 0 && hi - lo < 4 * (uint64_t)n + 1024)
        slot = calloc((size_t)(hi - lo + 1), sizeof *slot);
    if (slot) {
        bool dup = false;
        for (size_t i = 0; i < n; i++) {
            struct wq_srec *s = &slot[wq__srec_order(img->recs[i]) - lo];
            dup |= s->raw != NULL;
            *s = img->recs[i];
        }
        size_t k = 0;
        for (uint64_t o = 0; o <= hi - lo && !dup; o++)
            if (slot[o].raw)
                seq[k++] = slot[o];
        free(slot);
        if (!dup)
            return seq;   /* else (two records, one order) sort them all */
    }
    struct rank *rank = malloc((n ? n : 1) * sizeof *rank);
    if (!rank) {
        free(seq);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        rank[i].order = wq__srec_order(img->recs[i]);
        rank[i].idx = (uint32_t)i;
    }
    qsort(rank, n, sizeof *rank, by_order);
    for (size_t i = 0; i < n; i++)
        seq[i] = img->recs[rank[i].idx];
    free(rank);
    return seq;
}

/*
 * Build the region from the records. Keys come back in first-add order
 * (entries' seqs, the queue, the delay heap's ties), and so do the
 * entries of idle keys (the clock hand that drops their failure counts
 * for room starts at the oldest) and results (listed in the order they
 * are recorded). The records lie in the store's order (LMDB files them
 * by key hash), so visiting them in first-add order is a random walk
 * through the reader's map, a miss per record; visiting them where they
 * lie is one pass. That is done when it changes nothing of the above:
 * no idle key and no result, and dense add orders (each seq is then
 * base + order - lo, within the window seqs compare in). Otherwise, or
 * without memory for the slots, they are first put in first-add order
 * (in_order).
 */
int wq__store_restore(shmq *view, struct wq_store_img *img)
{
    size_t n = img->n;
    uint64_t width = n ? img->order_hi - img->order_lo : 0;   /* span - 1: cannot wrap */
    struct visit v = { .mono = wq__now_mono(), .real = wq__now_real(),
                       .lo = img->order_lo, .base = view->hdr->seq_next };
    bool where_they_lie = n > 0 && img->idle == 0 && img->with_result == 0 &&
                          width < 4 * (uint64_t)n + 1024 && width < (1u << 29);
    uint64_t span = width + 1;
    struct wq_srec *seq = NULL;
    if (where_they_lie && (v.slot = calloc((size_t)span, sizeof *v.slot)) != NULL)
        /* Each page mapped at once, not at its first random write. */
        wq__mem_populate(v.slot, (size_t)span * sizeof *v.slot, MADV_POPULATE_WRITE);
    else if (!(seq = in_order(img)))
        return -ENOMEM;
    /* Room for every key at once: the index is then built at its final
       size, not copied at each doubling. */
    int rc = wq__entry_room(view, n < view->capacity ? (uint32_t)n : view->capacity);
    if (rc == 0) {
        wq__mut_begin(view);
        rc = visit(view, seq ? seq : img->recs, n, &v);
        if (rc >= 0 && v.slot) {
            view->hdr->seq_next = v.base + (uint32_t)span;
            rc = enter_queued(view, &v, span);
        }
    }
    free(seq);
    free(v.slot);
    if (rc < 0)
        return rc;
    wq__mut_end(view, 0);
    return (int)n;
}
