/*
 * journal.c - the journal of a WQ_DURABLE_FSYNC store (format.h says
 * what it holds): the file, its groups, and applying them to LMDB.
 *
 * Why a journal: a synced LMDB commit flushes the disk twice (its pages,
 * then its meta page, which must not reach the disk before them), and an
 * add is one commit. A group written here is one write with O_DSYNC into
 * a file whose blocks were all written once before (so no file metadata
 * changes with it): one flush. LMDB then takes the journal's groups in
 * one synced commit now and then (a checkpoint, store.c), and a restore
 * applies what no checkpoint took before it reads the store (restore.c).
 *
 * Each group starts on a WQ_JOURNAL_BLOCK boundary and no later group
 * writes into its blocks before a checkpoint holds it: a write torn by a
 * power failure damages only the group being written, whose add never
 * returned.
 *
 * Knows LMDB (through lmdb.c's calls) and the format; knows nothing of
 * regions.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "format.h"

#define JSEED 0x6c6962776a726e6cull   /* "libwjrnl" */

static uint64_t rec_bytes(const struct wq_item *it)
{
    return sizeof it->r + it->r.keylen + it->r.msglen;
}

uint64_t wq__journal_bytes(const struct wq_item *items, uint32_t n)
{
    uint64_t b = sizeof(struct wq_jgroup);
    for (uint32_t i = 0; i < n; i++)
        b += rec_bytes(&items[i]);
    return (b + WQ_JOURNAL_BLOCK - 1) / WQ_JOURNAL_BLOCK * WQ_JOURNAL_BLOCK;
}

static uint64_t group_check(const struct wq_jgroup *g, const void *payload)
{
    struct wq_jgroup h = *g;
    h.check = 0;
    return wq__hash64(wq__hash64(JSEED, &h, sizeof h), payload, g->bytes);
}

/* An I/O the file system refuses with O_DIRECT (EINVAL: its alignment
   is not ours) is retried without it, from then on. */
static bool direct_off(int fd)
{
    int err = errno, fl = err == EINVAL ? fcntl(fd, F_GETFL) : -1;
    bool off = fl >= 0 && (fl & O_DIRECT) && fcntl(fd, F_SETFL, fl & ~O_DIRECT) == 0;
    errno = err;
    return off;
}

/* buf block-aligned (the journal's descriptor may have O_DIRECT). */
static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && (errno == EINTR || direct_off(fd)))
            continue;
        if (w < 0)
            return -errno;
        if (w == 0)
            return -EIO;
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

/* Bytes read (short at the end of the file) or -errno; buf block-aligned. */
static ssize_t pread_all(int fd, void *buf, size_t n, uint64_t off)
{
    char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, p + got, n - got, (off_t)(off + got));
        if (r < 0 && (errno == EINTR || direct_off(fd)))
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Lock held: fill the file to WQ_JOURNAL_SIZE with written zeros. A
   write into a block the file has never written (a hole, or fallocate's
   unwritten extents) changes file metadata, which O_DSYNC then flushes
   too. Only past the end: the lock keeps every writer out, so what the
   file holds is groups, never zeros being written. */
static int fill(int fd, const char *dir, mode_t mode)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0)
        return -errno;
    if ((uint64_t)sb.st_size >= WQ_JOURNAL_SIZE)
        return 0;
    /* An empty file is a new one (its maker may have been killed before
       it filled it): whoever fills it sets its mode and syncs its name. */
    bool made = sb.st_size == 0;
    if (made && fchmod(fd, mode & 0666) < 0)   /* not the umask's */
        return -errno;
    size_t chunk = 1u << 20;
    char *z = aligned_alloc(WQ_JOURNAL_BLOCK, chunk);
    if (!z)
        return -ENOMEM;
    memset(z, 0, chunk);
    int rc = 0;
    for (uint64_t off = (uint64_t)sb.st_size; off < WQ_JOURNAL_SIZE && rc == 0;) {
        size_t n = WQ_JOURNAL_SIZE - off < chunk ? (size_t)(WQ_JOURNAL_SIZE - off) : chunk;
        rc = pwrite_all(fd, z, n, off);
        off += n;
    }
    free(z);
    if (rc == 0 && fdatasync(fd) < 0)
        rc = -errno;
    int dfd = rc == 0 && made ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dfd >= 0) {   /* the new file's name, on disk before any group */
        if (fsync(dfd) < 0)
            rc = -errno;
        close(dfd);
    }
    return rc;
}

/* Does the journal's name still lead to the file fd has open? Not once
   somebody removed or replaced it: groups written there would be lost. */
static bool current(const struct wq_env *e, int fd)
{
    char f[sizeof e->path + 16];
    struct stat a, b;
    snprintf(f, sizeof f, "%s/%s", e->path, WQ_JOURNAL_FILE);
    return fstat(fd, &a) == 0 && stat(f, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* e->jmu held: open (or make) the journal. */
static int open_journal(const struct wq_env *e, mode_t mode)
{
    char f[sizeof e->path + 16];
    snprintf(f, sizeof f, "%s/%s", e->path, WQ_JOURNAL_FILE);
    /* O_NONBLOCK: a FIFO of that name must not hang us (it is refused
       below); on a regular file it changes nothing. */
    int flags = O_RDWR | O_DSYNC | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
    int fd = open(f, flags);
    if (fd < 0 && errno == ENOENT) {
        fd = open(f, flags | O_CREAT | O_EXCL, mode & 0666);
        if (fd < 0 && errno == EEXIST)   /* another creator was first */
            fd = open(f, flags);
    }
    if (fd < 0)
        return -errno;
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) < 0)
        rc = -errno;
    else if (!S_ISREG(sb.st_mode))
        rc = -EUCLEAN;
    if (rc < 0) {
        close(fd);
        return rc;
    }
    /* O_DIRECT where the file system has it: a synchronous write then
       goes to the disk without the page cache's copy and write-back
       (measured on ext4: 8.1k writes/s against 7.6k). Groups are whole
       blocks at block offsets, from block-aligned buffers. */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(fd, F_SETFL, fl | O_DIRECT);
    return fd;
}

static int ofd_lock(int fd, short type)
{
    struct flock l = { .l_type = type, .l_whence = SEEK_SET };
    while (fcntl(fd, F_OFD_SETLKW, &l) < 0) {
        if (errno != EINTR)
            return -errno;
    }
    return 0;
}

int wq__journal_lock(struct wq_env *e, int fd, bool shared)
{
    pthread_mutex_lock(&e->jmu);
    int rc = ofd_lock(fd, shared ? F_RDLCK : F_WRLCK);
    if (rc < 0)
        pthread_mutex_unlock(&e->jmu);
    return rc;
}

void wq__journal_unlock(struct wq_env *e, int fd)
{
    (void)ofd_lock(fd, F_UNLCK);
    pthread_mutex_unlock(&e->jmu);
}

int wq__journal_acquire(struct wq_env *e, mode_t mode)
{
    pthread_mutex_lock(&e->jmu);
    int fd = e->jfd - 1, rc = 0;
    bool opened = false;
    if (fd >= 0 && e->jstale) {
        close(fd);
        e->jfd = 0;
        fd = -1;
    }
    e->jstale = false;
    if (fd < 0) {
        if ((fd = open_journal(e, mode)) < 0) {
            pthread_mutex_unlock(&e->jmu);
            return fd;
        }
        e->jfd = fd + 1;
        opened = true;
    }
    if ((rc = ofd_lock(fd, F_WRLCK)) < 0) {
        pthread_mutex_unlock(&e->jmu);
        return rc;
    }
    /* Filled once, when opened: a stat of the file between two of its
       synchronous writes makes the second wait much longer (measured:
       8k writes/s without, 5.4k with). */
    if (opened && (rc = fill(fd, e->path, mode)) < 0) {
        wq__journal_unlock(e, fd);
        return rc;
    }
    return fd;
}

bool wq__journal_replaced(struct wq_env *e, int fd)
{
    if (!current(e, fd))
        e->jstale = true;
    return e->jstale;
}

int wq__journal_write(int fd, uint64_t id, uint64_t lsn, uint64_t off,
                      const struct wq_item *items, uint32_t n)
{
    uint64_t total = wq__journal_bytes(items, n);
    if (n == 0 || off % WQ_JOURNAL_BLOCK || off > WQ_JOURNAL_SIZE ||
        total > WQ_JOURNAL_SIZE - off)
        return -EFBIG;   /* the caller checkpoints first: never happens */
    char *buf = aligned_alloc(WQ_JOURNAL_BLOCK, total);   /* total: whole blocks */
    if (!buf)
        return -ENOMEM;
    memset(buf, 0, total);
    struct wq_jgroup g = { .magic = WQ_JGROUP_MAGIC, .nrec = n, .id = id, .lsn = lsn };
    char *p = buf + sizeof g;
    for (uint32_t i = 0; i < n; i++) {
        struct wq_rec r = items[i].r;
        r.magic = WQ_REC_MAGIC;
        r.check = 0;
        memcpy(p, &r, sizeof r);
        memcpy(p + sizeof r, items[i].key, r.keylen);
        memcpy(p + sizeof r + r.keylen, items[i].msg, r.msglen);
        p += rec_bytes(&items[i]);
    }
    g.bytes = (uint64_t)(p - buf) - sizeof g;
    g.check = group_check(&g, buf + sizeof g);
    memcpy(buf, &g, sizeof g);
    int rc = pwrite_all(fd, buf, total, off);
    free(buf);
    return rc;
}

/* Is there a verified group of this journal at off of the image? Its
   header in *g, and the offset of the block after it in *next. */
static bool group_at(const char *img, uint64_t len, uint64_t id, uint64_t off,
                     struct wq_jgroup *g, uint64_t *next)
{
    if (off > len || len - off < sizeof *g)
        return false;
    memcpy(g, img + off, sizeof *g);
    if (g->magic != WQ_JGROUP_MAGIC || g->id != id || g->nrec == 0 ||
        g->bytes > len - off - sizeof *g || group_check(g, img + off + sizeof *g) != g->check)
        return false;
    uint64_t end = off + sizeof *g + g->bytes;
    *next = (end + WQ_JOURNAL_BLOCK - 1) / WQ_JOURNAL_BLOCK * WQ_JOURNAL_BLOCK;
    return true;
}

/* Apply one verified group's records. A record that does not decode is
   damage the check cannot have let through, unless the writer was
   wrong: -EUCLEAN all the same. */
static int apply_group(MDB_txn *txn, struct wq_env *e, const char *gp, struct wq_meta *m)
{
    struct wq_jgroup g;
    memcpy(&g, gp, sizeof g);
    const char *p = gp + sizeof g, *end = p + g.bytes;
    for (uint32_t i = 0; i < g.nrec; i++) {
        struct wq_item it;
        memset(&it, 0, sizeof it);
        if ((size_t)(end - p) < sizeof it.r)
            return -EUCLEAN;
        memcpy(&it.r, p, sizeof it.r);
        size_t len = sizeof it.r + it.r.keylen + it.r.msglen;
        if (it.r.magic != WQ_REC_MAGIC || it.r.keylen == 0 || it.r.keylen > m->max_key_len ||
            it.r.msglen > 255 || it.r.cls < WQ_CLS_PENDING || it.r.cls > WQ_CLS_DELETE ||
            it.r.has_result > 1 || it.r.pad0 != 0 || (size_t)(end - p) < len)
            return -EUCLEAN;
        it.key = (const unsigned char *)p + sizeof it.r;
        it.msg = p + sizeof it.r + it.r.keylen;
        int rc = wq__lmdb_put(txn, e, &it, m);
        if (rc < 0)
            return rc;
        p += len;
    }
    return p == end ? 0 : -EUCLEAN;
}

int wq__journal_apply(MDB_txn *txn, struct wq_env *e, int fd, uint64_t upto,
                      struct wq_meta *m, uint64_t *groups, char *why, size_t wn)
{
    uint64_t id = m->journal_id, ckpt = m->journal_lsn, off = 0, last = 0, next = 0;
    *groups = 0;
    why[0] = 0;
    /* In one read (from the disk: the writes bypass the page cache where
       the file system allows O_DIRECT): a checkpoint what the queue wrote
       and one group more (one a writer killed before it moved the tail
       may have left there, which is at most a quarter of the file); a
       replay the whole file, as it must look past the end of the groups
       for damage. */
    uint64_t want = WQ_JOURNAL_SIZE;
    if (upto > 0 && upto < WQ_JOURNAL_SIZE - WQ_JOURNAL_SIZE / 4)
        want = (upto + WQ_JOURNAL_BLOCK - 1) / WQ_JOURNAL_BLOCK * WQ_JOURNAL_BLOCK +
               WQ_JOURNAL_SIZE / 4;
    char *img = aligned_alloc(WQ_JOURNAL_BLOCK, want);   /* want: whole blocks */
    if (!img)
        return -ENOMEM;
    ssize_t got = pread_all(fd, img, want, 0);
    if (got < 0) {
        snprintf(why, wn, "reading its journal: %s", strerror((int)-got));
        free(img);
        return (int)got;
    }
    uint64_t len = (uint64_t)got;
    int rc = 0;
    if (id == 0) {
        /* No journal id in the meta: no group can be this store's. A
           file that holds any is another store's, or the meta record is
           damaged into one that names none (a version 1 or 2 record). */
        for (uint64_t at = 0; at + sizeof(uint32_t) <= len; at += WQ_JOURNAL_BLOCK) {
            uint32_t magic;
            memcpy(&magic, img + at, sizeof magic);
            if (magic == WQ_JGROUP_MAGIC) {
                snprintf(why, wn, "its journal holds a write at offset %llu, but its meta "
                         "record names no journal (damaged, or from a library without "
                         "journals)", (unsigned long long)at);
                rc = -EUCLEAN;
                break;
            }
        }
        free(img);
        return rc;
    }
    for (;;) {
        struct wq_jgroup g;
        bool ok = group_at(img, len, id, off, &g, &next), ok_at_off = ok;
        if (ok && off > 0 && g.lsn <= last)
            ok = false;   /* an older group: the newest ones end here */
        if (!ok) {
            if (off < upto) {
                snprintf(why, wn, "its journal's group at offset %llu does not verify, "
                         "though the queue wrote groups up to offset %llu",
                         (unsigned long long)off, (unsigned long long)upto);
                rc = -EBADMSG;
                break;
            }
            if (upto > 0)
                break;
            /* A replay: the groups end here. A group that was being
               written when the system went down does not verify, and the
               groups behind it are older than the store's checkpoint. A
               verified group newer than that checkpoint from here on is
               one the walk cannot reach: a damaged group before it, or a
               store older than its journal (LMDB back at an earlier
               commit): either way acknowledged writes would be lost. */
            uint64_t n2;
            for (uint64_t at = off; at < len; at += WQ_JOURNAL_BLOCK) {
                struct wq_jgroup h;
                if (group_at(img, len, id, at, &h, &n2) && h.lsn > ckpt) {
                    if (!ok_at_off)
                        snprintf(why, wn, "its journal's group at offset %llu does not "
                                 "verify, but a later one at offset %llu does: the journal "
                                 "is damaged", (unsigned long long)off,
                                 (unsigned long long)at);
                    else
                        snprintf(why, wn, "its journal's group at offset %llu (number %llu) "
                                 "is newer than the store's last checkpoint (%llu), but the "
                                 "groups before it do not lead to it: the store or its "
                                 "journal is damaged", (unsigned long long)at,
                                 (unsigned long long)h.lsn, (unsigned long long)ckpt);
                    rc = -EUCLEAN;
                    break;
                }
            }
            break;
        }
        last = g.lsn;
        if (g.lsn > m->journal_lsn) {
            if ((rc = apply_group(txn, e, img + off, m)) < 0) {
                if (rc == -EUCLEAN)
                    snprintf(why, wn, "its journal's group at offset %llu holds a record "
                             "that does not decode", (unsigned long long)off);
                break;
            }
            m->journal_lsn = g.lsn;
            ++*groups;
        }
        off = next;
    }
    free(img);
    return rc;
}

int wq__journal_commit(struct wq_env *e, int fd, uint64_t upto, uint64_t id, uint64_t floor,
                       bool always, const char *point, char *why, size_t wn)
{
    uint64_t groups = 0;
    int rc;
    why[0] = 0;
    for (;;) {
        MDB_txn *txn;
        struct wq_meta m;
        if ((rc = wq__lmdb_txn(e, 0, &txn)) < 0)
            return rc;
        if ((rc = wq__lmdb_meta_get(txn, e, &m)) < 0) {
            snprintf(why, wn, "its meta record: %s", wq_strerror(rc));
        } else if (id && m.journal_id != id) {
            snprintf(why, wn, "its journal id is not the one the queue writes "
                     "(the store was replaced while the queue was open)");
            rc = -EUCLEAN;
        } else if (id && floor < m.journal_lsn) {
            /* The queue's count is behind the store's: groups it writes
               would look old to every later checkpoint and replay. */
            snprintf(why, wn, "the queue's journal count (%llu) is behind the store's "
                     "(%llu): the region is damaged", (unsigned long long)floor,
                     (unsigned long long)m.journal_lsn);
            rc = -EBADMSG;
        }
        if (rc == 0)
            rc = wq__journal_apply(txn, e, fd, upto, &m, &groups, why, wn);
        if (rc == 0 && !always && groups == 0) {
            mdb_txn_abort(txn);   /* nothing to record */
            return 0;
        }
        if (rc == 0) {
            if (m.journal_lsn < floor)
                m.journal_lsn = floor;   /* numbers taken by writers killed before their write */
            rc = wq__lmdb_meta_put(txn, e, &m);
        }
        if (rc < 0) {
            mdb_txn_abort(txn);
        } else {
            /* Synced whatever the durability: the journal's adds were. */
            mdb_env_set_flags(e->env, MDB_NOSYNC, 0);
            WQ_FAULT(point);
            rc = wq__lmdb_err(mdb_txn_commit(txn));
        }
        if (rc == -ENOSPC && wq__lmdb_grow(e) == 0)
            continue;
        return rc < 0 ? rc : (int)(groups > INT_MAX ? INT_MAX : groups);
    }
}
