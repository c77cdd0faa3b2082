/*
 * salvage.c - wq_store_salvage: rescue what can still be read from a
 * damaged store, for an operator (wqctl restore --salvage).
 *
 * Nothing is overwritten: the damaged directory is renamed aside (its
 * name gets ".damaged-<UTC time>") and a new store is written in its
 * place with every record that verifies, in first-add order, with a
 * fresh meta record (count and checksum sum) and marker. The reader
 * (read.c, salvage mode) drops records that fail their checksum, walks
 * past pages LMDB cannot read, and reports each loss; records the meta
 * says exist but no walk reached are reported as missing. No region is
 * touched: the queue is restored from the new store afterwards.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "format.h"
#include "read.h"
#include "store.h"

static void say(wq_report_fn report, void *arg, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(wq_report_fn report, void *arg, const char *fmt, ...)
{
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (report)
        report(line, arg);
}

static int by_key(const void *a, const void *b)
{
    struct wq_rec x, y;
    const unsigned char *xk, *yk;
    wq__srec_open(*(const struct wq_srec *)a, &x, &xk, NULL, NULL);
    wq__srec_open(*(const struct wq_srec *)b, &y, &yk, NULL, NULL);
    size_t n = x.keylen < y.keylen ? x.keylen : y.keylen;
    int c = memcmp(xk, yk, n);
    if (c || x.keylen != y.keylen)
        return c ? c : x.keylen < y.keylen ? -1 : 1;
    return x.order < y.order ? -1 : x.order > y.order;
}

static int by_order(const void *a, const void *b)
{
    uint64_t x = wq__srec_order(*(const struct wq_srec *)a);
    uint64_t y = wq__srec_order(*(const struct wq_srec *)b);
    return x < y ? -1 : x > y;
}

/* The meta for the new store: the old one's settings when it was read,
   else the caller's options (defaults where 0). */
static int settings(const struct wq_store_img *img, const struct wq_options *opts,
                    struct wq_meta *m, wq_report_fn report, void *arg)
{
    memset(m, 0, sizeof *m);
    memcpy(m->magic, WQ_META_MAGIC, sizeof WQ_META_MAGIC);
    if (img->has_meta) {
        *m = img->meta;
        m->pad0 = 0;
        return 0;
    }
    struct wq_options o;
    struct wq_conf c;
    memset(&o, 0, sizeof o);
    if (opts)
        o = *opts;
    o.flags &= WQ_FAIR | WQ_NO_METRICS;
    o.store_path = "x";   /* the rules of a queue with a store */
    int rc = wq__options_resolve(&o, &c);
    if (rc < 0)
        return rc;
    say(report, arg, "the meta record is %s: the queue's settings come from the options "
        "given (defaults where 0)", img->bad_meta ? "damaged" : "missing");
    m->capacity = c.capacity;
    m->max_key_len = c.max_key_len;
    m->max_procs = c.max_procs;
    m->result_capacity = c.result_capacity;
    m->durability = c.durability;
    m->snapshot_ms = c.snapshot_ms;
    m->flags = c.flags;
    m->rl_limiters = c.rl_limiters;
    m->rl_burst = c.rl_burst;
    m->rl_max_fast_attempts = c.rl_max_fast_attempts;
    m->rl_base_delay_ns = c.rl_base_delay_ns;
    m->rl_max_delay_ns = c.rl_max_delay_ns;
    m->rl_fast_delay_ns = c.rl_fast_delay_ns;
    m->rl_slow_delay_ns = c.rl_slow_delay_ns;
    m->rl_qps = c.rl_qps;
    m->fair_share = c.fair_share;
    m->tenant_sep = c.tenant_sep;
    return 0;
}

/* The old store's journal (in aside, with the id and checkpoint its meta
   gave) applied to txn as far as its groups verify; what is lost past a
   damaged one is reported. Without an id (the meta was damaged), the
   first group's is taken, and every group from the start applied: the
   walk from offset 0 holds the newest groups, applied in order, and a
   group the store already held changes nothing. The new store starts a
   journal of its own. */
static int salvage_journal(MDB_txn *txn, struct wq_env *e, const char *aside,
                           const struct wq_meta *old, struct wq_meta *m, wq_report_fn report,
                           void *arg)
{
    char f[PATH_MAX + 80], why[256];
    snprintf(f, sizeof f, "%s/%s", aside, WQ_JOURNAL_FILE);
    int rc = 0, fd = open(f, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat sb = { .st_mode = 0 };
    uint64_t groups = 0;
    struct wq_jgroup g;
    m->journal_id = old->journal_id;
    m->journal_lsn = old->journal_lsn;
    if (fd >= 0 && fstat(fd, &sb) < 0) {
        say(report, arg, "its journal cannot be read: %s", strerror(errno));
    } else if (fd >= 0 && !S_ISREG(sb.st_mode)) {
        say(report, arg, "its journal is not a regular file: not read");
    } else if (fd >= 0 && m->journal_id == 0 && pread(fd, &g, sizeof g, 0) == sizeof g &&
               g.magic == WQ_JGROUP_MAGIC) {
        say(report, arg, "the meta record names no journal: its journal is read with the id "
            "of its first write");
        m->journal_id = g.id;
        m->journal_lsn = 0;
    }
    if (fd >= 0 && S_ISREG(sb.st_mode) && m->journal_id != 0) {
        rc = wq__journal_apply(txn, e, fd, 0, m, &groups, why, sizeof why);
        if (rc == -EUCLEAN) {
            say(report, arg, "%s: the writes from there on are lost (of a write that does not "
                "decode, the records before the damage are kept)", why);
            rc = 0;
        }
        if (groups > 0)
            say(report, arg, "applied %llu journal group%s no checkpoint had taken",
                (unsigned long long)groups, groups == 1 ? "" : "s");
    }
    if (fd >= 0)
        close(fd);
    m->journal_id = 0;
    m->journal_lsn = 0;
    return rc;
}

/* Write the kept records, what the old journal adds (in aside), and the
   meta into the new store at dir. */
static int write_store(const char *dir, mode_t mode, struct wq_store_img *img,
                       struct wq_meta *m, const char *aside, wq_report_fn report, void *arg)
{
    const struct wq_meta old = *m;
    struct wq_env *e;
    wq__lmdb_env_close(dir);   /* this process may hold the old one open */
    int rc = wq__lmdb_env(dir, mode, true, &e);
    if (rc < 0)
        return rc;
    for (;;) {
        MDB_txn *txn;
        if ((rc = wq__lmdb_txn(e, 0, &txn)) < 0)
            return rc;
        m->records = 0;
        m->sum = 0;
        uint64_t next = 0;
        for (size_t i = 0; i < img->n && rc == 0; i++) {
            uint64_t order = wq__srec_order(img->recs[i]);
            if ((rc = wq__srec_put(txn, e, img->recs[i], m)) == 0 && order >= next)
                next = order + 1;
        }
        if (m->next_order < next)
            m->next_order = next;
        if (rc == 0)
            rc = salvage_journal(txn, e, aside, &old, m, report, arg);
        if (rc == 0)
            rc = wq__lmdb_meta_put(txn, e, m);
        /* Synced (pages before the meta page that points to them): the
           marker written next vouches for this store after a power
           failure too. */
        if (rc == 0) {
            mdb_env_set_flags(e->env, MDB_NOSYNC, 0);
            rc = wq__lmdb_err(mdb_txn_commit(txn));
            mdb_env_set_flags(e->env, MDB_NOSYNC, 1);
        } else {
            mdb_txn_abort(txn);
        }
        if (rc == -ENOSPC && wq__lmdb_grow(e) == 0)
            continue;
        return rc;
    }
}

int wq__store_salvage(const char *path, const struct wq_options *opts, wq_report_fn report,
                      void *arg)
{
    char dir[PATH_MAX], aside[PATH_MAX + 64], why[256];
    struct stat sb, db;
    if (!realpath(path, dir)) {
        int err = errno;
        wq__errf("store '%s': %s", path, err == ENOENT ? "no such directory: nothing to salvage"
                                                       : strerror(err));
        return err == ENOENT ? -ENODATA : -err;
    }
    if (stat(dir, &sb) < 0) {
        int err = errno;
        wq__errf("store '%s': %s", dir, strerror(err));
        return -err;
    }
    if (!S_ISDIR(sb.st_mode)) {
        wq__errf("store '%s': not a directory", dir);
        return -ENOTDIR;
    }
    char data[PATH_MAX + 16];
    snprintf(data, sizeof data, "%s/data.mdb", dir);
    int err = stat(data, &db) < 0 ? errno : 0;
    if (err && err != ENOENT) {
        wq__errf("store '%s': cannot look at data.mdb: %s", dir, strerror(err));
        return -err;
    }
    if (err == ENOENT || db.st_size == 0) {
        wq__errf("store '%s': data.mdb is %s: nothing to salvage", dir,
                 err == ENOENT ? "missing" : "empty");
        return -ENODATA;
    }
    struct wq_store_img img;
    memset(&img, 0, sizeof img);
    img.salvage = true;
    img.report = report;
    img.report_arg = arg;
    int rc = wq__store_read(dir, &img, why, sizeof why);
    if (rc < 0)
        goto out;
    /* One record per key: a sound store never has two; keep the oldest. */
    if (img.n > 0)   /* qsort(NULL, 0, ...) is undefined */
        qsort(img.recs, img.n, sizeof *img.recs, by_key);
    size_t w = 0, dups = 0;
    for (size_t i = 0; i < img.n; i++) {
        struct wq_rec a, b;
        const unsigned char *ak = NULL, *bk;
        if (w > 0)
            wq__srec_open(img.recs[w - 1], &a, &ak, NULL, NULL);
        wq__srec_open(img.recs[i], &b, &bk, NULL, NULL);
        if (w > 0 && a.keylen == b.keylen && memcmp(ak, bk, b.keylen) == 0) {
            dups++;
            continue;
        }
        img.recs[w++] = img.recs[i];
    }
    img.n = w;
    if (dups)
        say(report, arg, "dropped %zu second record%s of a key", dups, dups == 1 ? "" : "s");
    if (img.n > 0)
        qsort(img.recs, img.n, sizeof *img.recs, by_order);
    struct wq_meta m;
    if ((rc = settings(&img, opts, &m, report, arg)) < 0)
        goto out;
    uint64_t missing = img.has_meta && img.meta.version >= 2 &&
                       img.meta.records > img.n + img.bad + dups
                           ? img.meta.records - img.n - img.bad - dups : 0;
    /* Keep the damaged store: a name that says when, never one in use. */
    char stamp[32];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    snprintf(aside, sizeof aside, "%s.damaged-%s", dir, stamp);
    for (int i = 1; access(aside, F_OK) == 0 && i < 1000; i++)
        snprintf(aside, sizeof aside, "%s.damaged-%s-%d", dir, stamp, i);
    if (rename(dir, aside) < 0) {
        rc = -errno;
        wq__errf("store '%s': cannot move it aside to %s: %s", dir, aside, strerror(errno));
        goto out;
    }
    if (mkdir(dir, sb.st_mode & 0777) < 0 || chmod(dir, sb.st_mode & 0777) < 0) {
        rc = -errno;
        wq__errf("store '%s': cannot make the new store (the damaged one is at %s): %s", dir,
                 aside, strerror(errno));
        goto out;
    }
    mode_t mode = db.st_mode & 0666;
    if ((rc = write_store(dir, mode, &img, &m, aside, report, arg)) < 0) {
        wq__errf("store '%s': writing the salvaged records failed: %s (the damaged store is "
                 "at %s)", dir, wq_strerror(rc), aside);
        goto out;
    }
    say(report, arg, "kept %zu record%s; dropped %zu damaged, %llu missing%s; the damaged "
        "store is kept at %s", img.n, img.n == 1 ? "" : "s", img.bad,
        (unsigned long long)missing,
        img.cut ? " (LMDB could not walk all of it)" : "", aside);
    rc = wq__store_write_marker(dir, mode);
    if (rc == 0)
        rc = img.n > INT32_MAX ? INT32_MAX : (int)img.n;
out:
    if (rc < 0 && !wq_last_error()[0])
        wq__errf("store '%s': %s", dir, why[0] ? why : wq_strerror(rc));
    wq__store_img_free(&img);
    return rc;
}
