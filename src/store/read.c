/*
 * read.c - reading a store of unknown health without trusting it.
 *
 * LMDB 0.9 verifies nothing on its pages: a zeroed or edited page of
 * data.mdb makes it assert (SIGABRT) or fault (SIGSEGV) inside the
 * process that walks it, or walk less than the store holds. So a store
 * that no region has vouched for yet (wq_open restoring a queue, a
 * salvage) is read in a child process forked for the purpose: the child
 * opens its own environment read-only, walks every database (the main
 * one, which must name only ours; the free-page list, so that the writes
 * that follow will not trip over it; the meta record; every record) and
 * writes what it read, raw, into a memfd. If LMDB kills the child, or it
 * stops making progress, the parent reports a damaged store instead of
 * dying with it. The parent decodes and verifies everything itself
 * (record checksums, the meta's count and checksum sum, keys unique) as
 * the child writes it, and uses the records where they are, in its map of
 * the memfd; it opens the environment only once the store has passed.
 *
 * Salvage: records that fail are dropped and reported; a walk that LMDB
 * cuts short (an error, or a crash of the child) restarts in a new child
 * past the damage, skipping ever larger slices of the key hash space, so
 * records behind a damaged page are still found.
 *
 * Cost (1e6 records, tools/PERFORMANCE.md): one fork, a sequential copy
 * through the memfd, two 64-bit hashes and 8 bytes of memory per record,
 * the checks beside the walk on another CPU.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "format.h"
#include "read.h"

/* Frames the child writes: a type byte, a 32-bit length, the bytes. */
enum { F_META = 'M', F_REC = 'R', F_FAIL = 'X', F_END = 'E', F_FREE = 'F' };

#define STALL_NS (5ull * 1000 * 1000 * 1000)   /* no progress for this long: hung */
#define MAX_RESTARTS 4096
#define MAX_STALLS 3                           /* hung walks in a row: give up */

/* ------------------------------------------------------------------ */
/* The child                                                           */
/* ------------------------------------------------------------------ */

struct out {
    int fd;
    size_t n;
    char buf[1 << 16];
};

static void put_bytes(int fd, const void *p, size_t n)
{
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, (const char *)p + off, n - off);
        if (w <= 0)
            _exit(3);
        off += (size_t)w;
    }
}

static void flush_out(struct out *o)
{
    put_bytes(o->fd, o->buf, o->n);
    o->n = 0;
}

/* One frame of up to three parts. */
static void frame(struct out *o, char type, const void *a, size_t an, const void *b,
                  size_t bn, const void *c, size_t cn)
{
    uint32_t len = (uint32_t)(an + bn + cn);
    const void *part[3] = { a, b, c };
    size_t plen[3] = { an, bn, cn };
    if (o->n + 5 + len > sizeof o->buf)
        flush_out(o);
    o->buf[o->n] = type;
    memcpy(o->buf + o->n + 1, &len, 4);
    o->n += 5;
    for (int i = 0; i < 3; i++) {
        if (o->n + plen[i] > sizeof o->buf) {
            flush_out(o);
            put_bytes(o->fd, part[i], plen[i]);   /* larger than the buffer */
        } else if (plen[i]) {
            memcpy(o->buf + o->n, part[i], plen[i]);
            o->n += plen[i];
        }
    }
}

static void fail(struct out *o, const char *what, int rc)
{
    char msg[256];
    int32_t code = rc;   /* LMDB's code or the system's errno */
    int n = snprintf(msg, sizeof msg, "%s: %s", what, mdb_strerror(rc));
    frame(o, F_FAIL, &code, 4, msg, (size_t)n, NULL, 0);
    flush_out(o);
}

/* While the free-page list of a file shorter than its last page is
   walked, a bus error means a page in use past the end (a truncated
   file): say so, in a frame made beforehand (a handler may only write). */
static char bus_msg[300];
static size_t bus_len;
static int bus_fd = -1;

static void on_bus(int sig)
{
    (void)sig;
    put_bytes(bus_fd, bus_msg, bus_len);
    _exit(2);
}

static void bus_arm(struct out *o)
{
    char msg[256];
    int32_t code = MDB_CORRUPTED;
    int n = snprintf(msg, sizeof msg, "data.mdb is shorter than the environment says: %s",
                     mdb_strerror(MDB_CORRUPTED));
    uint32_t len = 4 + (uint32_t)n;
    bus_msg[0] = F_FAIL;
    memcpy(bus_msg + 1, &len, 4);
    memcpy(bus_msg + 5, &code, 4);
    memcpy(bus_msg + 9, msg, (size_t)n);
    bus_len = 9 + (size_t)n;
    bus_fd = o->fd;
    flush_out(o);   /* the frame follows whatever was sent */
    signal(SIGBUS, on_bus);
}

/*
 * Walk the store at dir into fd. from: the record key to start at (NULL:
 * the first; then also the main database, the free list and the meta).
 * Exits 0 after an END frame; an error ends in a FAIL frame (exit 2).
 */
static void child_walk(const char *dir, int fd, const unsigned char *from)
{
    struct out *o = malloc(sizeof *o);
    if (!o)
        _exit(4);
    o->fd = fd;
    o->n = 0;
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi main_db, meta, recs;
    MDB_cursor *c;
    MDB_val k, v;
    int rc;
    /* The map is as long as the file: a damaged meta page must not choose
       it. LMDB still grows it to what the meta's last page needs, and a
       map it cannot make (ENOMEM) then means that page number is garbage. */
    char file[4200];
    struct stat sb;
    snprintf(file, sizeof file, "%s/data.mdb", dir);
    size_t map = stat(file, &sb) == 0 && sb.st_size > 0 ? (size_t)sb.st_size : 0;
    if ((rc = mdb_env_create(&env)) || (rc = mdb_env_set_maxdbs(env, 4)) ||
        (rc = mdb_env_set_maxreaders(env, 1024)) || (map && (rc = mdb_env_set_mapsize(env, map))) ||
        (rc = mdb_env_open(env, dir, MDB_RDONLY | MDB_NOTLS | MDB_NORDAHEAD, 0600))) {
        if (rc == ENOMEM || rc == EINVAL)
            fail(o, "opening the environment: its meta page asks for a map larger than "
                    "data.mdb (a damaged last-page number)", MDB_CORRUPTED);
        else
            fail(o, "opening the environment", rc);
        _exit(2);
    }
    MDB_envinfo info;   /* the snapshot's own, not a later commit's */
    if ((rc = wq__lmdb_snapshot(env, &txn, &info))) {
        fail(o, "reading", rc);
        _exit(2);
    }
    uint64_t have, beyond;
    if (wq__lmdb_beyond(env, &info, dir, &have, &beyond) != 0) {
        fail(o, "data.mdb: its size", MDB_CORRUPTED);
        _exit(2);
    }
    if (beyond > 0 && !from)
        bus_arm(o);   /* until the free-page list says the pages are free */
    if (!from) {
        /* Named databases are keys of the main one: anything else there
           means somebody else's environment. */
        if ((rc = mdb_dbi_open(txn, NULL, 0, &main_db)) || (rc = mdb_cursor_open(txn, main_db, &c))) {
            fail(o, "the main database", rc);
            _exit(2);
        }
        while ((rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) == 0) {
            if (!(k.mv_size == 4 && memcmp(k.mv_data, "meta", 4) == 0) &&
                !(k.mv_size == 7 && memcmp(k.mv_data, "records", 7) == 0)) {
                fail(o, "the main database names a database that is not libwq's",
                     MDB_INCOMPATIBLE);
                _exit(2);
            }
        }
        if (rc != MDB_NOTFOUND) {
            fail(o, "the main database", rc);
            _exit(2);
        }
        mdb_cursor_close(c);
        /* The free-page list: later writes walk it, so it must be sound. */
        uint64_t pages = 0;
        if ((rc = mdb_cursor_open(txn, 0, &c))) {
            fail(o, "the free-page list", rc);
            _exit(2);
        }
        /* Each entry is an ID list: a count, then that many page numbers,
           descending, of pages past the two meta pages and within the
           file. LMDB reuses them without a look: one bad number there and
           a later commit writes past the map (SIGBUS). */
        while ((rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) == 0) {
            const size_t *ids = v.mv_data;
            size_t n = v.mv_size >= sizeof *ids ? ids[0] : 0;
            bool ok = v.mv_size >= sizeof *ids && v.mv_size % sizeof *ids == 0 &&
                      n == v.mv_size / sizeof *ids - 1;
            for (size_t i = 1; ok && i <= n; i++)
                ok = ids[i] >= 2 && ids[i] <= info.me_last_pgno &&
                     (i == 1 || ids[i] < ids[i - 1]);
            if (!ok) {
                fail(o, "the free-page list: an entry names pages the file does not have",
                     MDB_CORRUPTED);
                _exit(2);
            }
            pages++;
        }
        if (rc != MDB_NOTFOUND) {
            fail(o, "the free-page list", rc);
            _exit(2);
        }
        mdb_cursor_close(c);
        /* Every page past the file's end must be free: a page in use
           there means a truncated data.mdb. (A walk that resumes, from !=
           NULL, follows one that checked this.) */
        if (beyond > 0) {
            bool sound = false;
            rc = wq__lmdb_tail(txn, &info, dir, &sound);
            if (rc || !sound) {
                fail(o, "data.mdb is shorter than the environment says", MDB_CORRUPTED);
                _exit(2);
            }
            signal(SIGBUS, SIG_DFL);
        }
        frame(o, F_FREE, &pages, sizeof pages, NULL, 0, NULL, 0);
    }
    rc = mdb_dbi_open(txn, "meta", 0, &meta);
    if (rc == 0) {
        if (!from) {
            MDB_val mk = { 4, "meta" };
            if ((rc = mdb_get(txn, meta, &mk, &v)) == 0)
                frame(o, F_META, v.mv_data, v.mv_size, NULL, 0, NULL, 0);
            else if (rc != MDB_NOTFOUND) {
                fail(o, "the meta record", rc);
                _exit(2);
            }
        }
    } else if (rc != MDB_NOTFOUND) {
        fail(o, "the meta database", rc);
        _exit(2);
    }
    rc = mdb_dbi_open(txn, "records", 0, &recs);
    if (rc == MDB_NOTFOUND) {
        frame(o, F_END, NULL, 0, NULL, 0, NULL, 0);
        flush_out(o);
        _exit(0);
    }
    if (rc || (rc = mdb_cursor_open(txn, recs, &c))) {
        fail(o, "the records database", rc);
        _exit(2);
    }
    if (from) {
        k.mv_data = (void *)from;
        k.mv_size = 10;
        rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
    } else {
        rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
    }
    for (; rc == 0; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        WQ_FAULT("store.read.record");   /* a test's hung walk */
        uint32_t kl = (uint32_t)k.mv_size;   /* [key length][key][value] */
        frame(o, F_REC, &kl, 4, k.mv_data, k.mv_size, v.mv_data, v.mv_size);
    }
    if (rc != MDB_NOTFOUND) {
        fail(o, "the records database", rc);
        _exit(2);
    }
    frame(o, F_END, NULL, 0, NULL, 0, NULL, 0);
    flush_out(o);
    _exit(0);
}

/* ------------------------------------------------------------------ */
/* The parent                                                          */
/* ------------------------------------------------------------------ */

/* STALL_NS; in the fault-injection build, $WQ_TEST_STALL_MS when set to
   a positive number of milliseconds under an hour (the hung-walk tests;
   0, which would call every walk hung at once, garbage and longer times
   are ignored). */
static uint64_t stall_ns(void)
{
#ifdef WQ_FAULT_INJECTION
    const char *v = getenv("WQ_TEST_STALL_MS");
    char *end;
    unsigned long long ms = v ? strtoull(v, &end, 10) : 0;
    if (v && *v && !*end && ms > 0 && ms < 3600000ull)
        return ms * 1000000ull;
#endif
    return STALL_NS;
}

/* What the parent has read of the children's output so far. */
struct feed {
    struct wq_store_img *img;
    size_t pos;                    /* the next frame */
    size_t mapped;                 /* bytes of the file in img->map */
    size_t seen;                   /* the file's size at the last look */
    int end;                       /* this walk's F_END or F_FAIL, once read */
    unsigned char last[10];        /* the key of the last record read */
    bool have_last;
    bool stalled;                  /* the child made no progress: killed */
    char *why;
    size_t wn;
};
static int feed(struct feed *f, int fd, off_t *size, bool final);

/*
 * Run one walk in a child; append its output to fd, which the parent
 * reads as it grows (feed): the walk and the checks run side by side.
 * Returns 0 when the child ended normally (its frames say how the walk
 * went), -EUCLEAN with why set when it was killed by a signal or hung, or
 * -errno when reading its output failed.
 */
static int run_child(const char *dir, int fd, const unsigned char *from, struct feed *f)
{
    char *why = f->why;
    size_t wn = f->wn;
    pid_t pid = fork();
    if (pid < 0) {
        int err = errno;
        snprintf(why, wn, "cannot start its reader: %s", strerror(err));
        return -err;
    }
    if (pid == 0) {
        /* LMDB's assertions print before they abort: the library never
           prints, so neither does its reader. */
        int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (null >= 0)
            dup2(null, STDERR_FILENO);
        /* Damage kills the child, never runs the application's handlers
           (inherited) in a copy of it. */
        signal(SIGPIPE, SIG_DFL);
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        signal(SIGABRT, SIG_DFL);
        signal(SIGFPE, SIG_DFL);
        signal(SIGILL, SIG_DFL);
        child_walk(dir, fd, from);
    }
    off_t size, last = -1;
    uint64_t since = wq__clock_mono(), stall = stall_ns();
    int st, rc;
    for (unsigned spin = 0;; spin++) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            break;
        if (w < 0 && errno == ECHILD) {
            st = 0;   /* SIGCHLD ignored: reaped by the system; the frames tell */
            break;
        }
        if (w < 0 && errno != EINTR) {
            snprintf(why, wn, "waiting for the reader: %s", strerror(errno));
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -EIO;
        }
        uint64_t polled = wq__clock_mono();
        if ((rc = feed(f, fd, &size, false)) < 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            snprintf(why, wn, "reading its reader's output: %s", strerror(-rc));
            return rc;
        }
        if (size != last) {
            last = size;
            since = wq__clock_mono();
            spin = 0;
        } else if (wq__clock_mono() - since > stall) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            f->stalled = true;
            snprintf(why, wn, "walking it made no progress for %llu ms (a cycle of pages?)",
                     (unsigned long long)(stall / 1000000ull));
            return -EUCLEAN;
        }
        /* The wait: some of the caller's work (at least 100 us between
           two looks at the size, which feed relies on), else a sleep. */
        uint64_t until = polled + (spin < 100 ? 100000 : 2000000);
        if (f->img->in_wait && f->img->in_wait(f->img->in_wait_arg, f->img))
            until = polled + 100000;
        /* To a time, not for one: a signal must not shorten the wait. */
        struct timespec ts = { (time_t)(until / 1000000000u), (long)(until % 1000000000u) };
        while (wq__clock_mono() < until &&
               clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
    }
    if ((rc = feed(f, fd, &size, true)) < 0) {   /* what it wrote last */
        snprintf(why, wn, "reading its reader's output: %s", strerror(-rc));
        return rc;
    }
    if (WIFSIGNALED(st)) {
        snprintf(why, wn, "LMDB died reading it (signal %d: %s)", WTERMSIG(st),
                 strsignal(WTERMSIG(st)));
        return -EUCLEAN;
    }
    return 0;
}

static void note(struct wq_store_img *img, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void note(struct wq_store_img *img, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (img->report)
        img->report(line, img->report_arg);
}

/* "key 'k'" with the key's bytes escaped (cut at 40), or "an unreadable
   key" when the record is too damaged to say. */
static void describe(char *out, size_t cap, const unsigned char *key, size_t len)
{
    if (!key || len == 0) {
        snprintf(out, cap, "an unreadable key");
        return;
    }
    size_t n = snprintf(out, cap, "key '");
    for (size_t i = 0; i < len && i < 40 && n + 6 < cap; i++) {
        unsigned char c = key[i];
        n += (size_t)(c >= 0x20 && c < 0x7f && c != '\\' && c != '\''
                          ? snprintf(out + n, cap - n, "%c", c)
                          : snprintf(out + n, cap - n, "\\x%02x", c));
    }
    snprintf(out + n, cap - n, "%s'", len > 40 ? "..." : "");
}

/* Decode the complete frames of fd's content from *pos to end (*pos:
   past the last one): records appended to img->recs. Returns F_END,
   F_FAIL (with why), 0 (no complete frame left: not written yet, or cut
   short when the child died) or -ENOMEM, and the key of the last record
   read in *last. */
static int parse(struct wq_store_img *img, const unsigned char *p, size_t *pos, size_t end,
                 char *why, size_t wn, unsigned char last[10], bool *have_last)
{
    size_t off = *pos;
    int rc = 0;
    for (; off + 5 <= end; *pos = off) {
        /* Ahead of the walk: the prefetchers stop at each page's end. */
        __builtin_prefetch(p + off + 1024);
        char type = (char)p[off];
        uint32_t len;
        memcpy(&len, p + off + 1, 4);
        if (len > end - off - 5)
            break;   /* a frame not all written (yet) */
        const unsigned char *d = p + off + 5;
        off += 5 + len;
        switch (type) {
        case F_FREE:
            break;
        case F_META:
            if (wq__meta_decode(d, len, &img->meta, &img->meta_why) == 0) {
                img->has_meta = true;
            } else {
                img->bad_meta = true;
                snprintf(why, wn, "its meta record: %s", img->meta_why);
            }
            break;
        case F_REC: {
            uint32_t kl;
            if (len < 4)
                return 0;   /* malformed: the rest of this child's output is lost */
            memcpy(&kl, d, 4);
            if (kl > len - 4)
                return 0;
            MDB_val k = { kl, (void *)(d + 4) }, v = { len - 4 - kl, (void *)(d + 4 + kl) };
            if (img->n == img->cap) {
                size_t nc = img->cap ? img->cap * 2 : 1024;
                struct wq_srec *nr = realloc(img->recs, nc * sizeof *nr);
                if (!nr)
                    return -ENOMEM;   /* the system's trouble, not the store's */
                wq__mem_populate(nr + img->cap, (nc - img->cap) * sizeof *nr, MADV_POPULATE_WRITE);
                img->recs = nr;
                img->cap = nc;
            }
            const char *rwhy;
            if (kl == 10) {
                memcpy(last, d + 4, 10);
                *have_last = true;
            }
            const unsigned char *key = NULL;
            const char *msg;
            struct wq_rec r;
            bool v1;
            if (wq__rec_decode(&k, &v, &r, &key, &msg, &v1, &rwhy) < 0) {
                char name[80];
                img->bad++;
                describe(name, sizeof name, key, key ? r.keylen : 0);
                if (!img->first_bad[0])
                    snprintf(img->first_bad, sizeof img->first_bad, "the record of %s: %s",
                             name, rwhy);
                if (img->salvage)
                    note(img, "dropped the record of %s: %s", name, rwhy);
                break;
            }
            if (img->n == 0 || r.order < img->order_lo)
                img->order_lo = r.order;
            if (img->n == 0 || r.order > img->order_hi)
                img->order_hi = r.order;
            img->idle += r.cls == WQ_CLS_IDLE;
            img->with_result += r.has_result;
            img->recs[img->n++].raw = v.mv_data;
            img->v1 |= v1;
            if (!v1)
                img->sum += r.check;
            break;
        }
        case F_FAIL:
            if (len < 4)
                return 0;
            memcpy(&img->fail_code, d, 4);
            snprintf(why, wn, "%.*s", (int)len - 4, (const char *)d + 4);
            rc = F_FAIL;
            break;
        case F_END:
            rc = F_END;
            break;
        default:
            return 0;
        }
        if (rc) {
            *pos = off;
            return rc;
        }
    }
    return 0;
}

/* k += 2^bits as a big-endian number (bits 0: the very next key).
   False past the end of the key space. */
static bool advance(unsigned char k[10], unsigned bits)
{
    unsigned byte = 9 - bits / 8;
    unsigned carry = 1u << (bits % 8);
    for (int i = (int)byte; i >= 0 && carry; i--) {
        unsigned v = k[i] + carry;
        k[i] = (unsigned char)v;
        carry = v >> 8;
    }
    return carry == 0;
}

/* img->map covers fd's content up to size bytes, mapped in (the child
   appends to it while the parent reads). It grows by doubling, as one
   mapping that may move: the records read so far point into it. */
static int grow_map(struct wq_store_img *img, int fd, size_t *mapped, size_t size)
{
    if (size > img->map_len) {
        if (size > SIZE_MAX / 2)
            return -EFBIG;
        size_t len = img->map_len ? img->map_len : 1u << 20;
        while (len < size)
            len *= 2;
        uintptr_t old = (uintptr_t)img->map;
        unsigned char *m = img->map
            ? mremap(img->map, img->map_len, len, MREMAP_MAYMOVE)
            : mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED)
            return -errno;
        if (old && (uintptr_t)m != old)
            for (size_t i = 0; i < img->n; i++)
                img->recs[i].raw = m + ((uintptr_t)img->recs[i].raw - old);
        img->map = m;
        img->map_len = len;
    }
    if (size > *mapped) {   /* nothing past size: the file ends there for now */
        wq__mem_populate(img->map + *mapped, size - *mapped, MADV_POPULATE_READ);
        *mapped = size;
    }
    return 0;
}

/*
 * Read what the child has written: its size so far in *size. While it
 * runs (final false), only up to the size seen at the previous call: the
 * kernel sets a file's size after copying the bytes in, with no barrier
 * between them that a weakly ordered CPU must honour, so bytes just below
 * a new size may not be visible yet. A poll later (100 us at least) they
 * are; once the child is reaped (final), everything it wrote is.
 */
static int feed(struct feed *f, int fd, off_t *size, bool final)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0)
        return -errno;
    *size = sb.st_size;
    if ((uint64_t)sb.st_size > SIZE_MAX)
        return -EFBIG;
    size_t upto = final ? (size_t)sb.st_size : f->seen;
    f->seen = (size_t)sb.st_size;
    if (f->end || upto <= f->pos)
        return 0;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    int rc = grow_map(f->img, fd, &f->mapped, upto);
    if (rc == 0)
        rc = parse(f->img, f->img->map, &f->pos, upto, f->why, f->wn, f->last, &f->have_last);
    if (rc < 0)
        return rc;
    f->end = rc;
    return 0;
}

int wq__store_read(const char *dir, struct wq_store_img *img, char *why, size_t wn)
{
    why[0] = 0;
    /* Never shrunk while read: a read past its end would be a SIGBUS. */
    int fd = memfd_create("wq-store-read", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        snprintf(why, wn, "cannot make its reader's buffer: %s", strerror(err));
        return -err;
    }
    unsigned char from[10] = { 0 };
    bool have_from = false, done = false;
    unsigned bits = 0, stalls = 0;
    struct feed f = { .img = img, .why = why, .wn = wn };
    int rc = 0;
    for (unsigned attempt = 0; attempt <= MAX_RESTARTS && !done; attempt++) {
        size_t before = img->n + img->bad;
        f.have_last = false;
        f.end = 0;
        rc = run_child(dir, fd, have_from ? from : NULL, &f);
        int end = f.end;
        /* What this child left unread (a frame it died writing, or one
           malformed) is skipped: the next child appends after it. */
        struct stat sb;
        if (fstat(fd, &sb) == 0 && (size_t)sb.st_size > f.pos)
            f.pos = (size_t)sb.st_size;
        if (rc < 0 && rc != -EUCLEAN) {   /* the system's error, not the store's */
            close(fd);
            return rc;
        }
        if (end == F_END && rc == 0) {
            done = true;
            break;
        }
        if (rc == 0)   /* the walk reported an error: LMDB's, or the system's */
            rc = end == F_FAIL && img->fail_code ? wq__lmdb_err(img->fail_code) : -EUCLEAN;
        if (!why[0])
            snprintf(why, wn, "the reader stopped before the end");
        if (!img->salvage)
            break;
        /* Salvage: go on past the damage in a new child, from just after
           the last record read, or (no progress) ever further on. */
        img->cut++;
        note(img, "walk cut short: %s", why);
        /* Progress is a record past where this child started: a damaged
           tree may lead a walk back, and re-reading the same records
           would go round in circles. */
        bool ahead = img->n + img->bad > before && f.have_last &&
                     (!have_from || memcmp(f.last, from, 10) >= 0);
        stalls = ahead ? 0 : stalls + f.stalled;
        if (stalls >= MAX_STALLS)
            break;   /* hung walks cost STALL_NS each */
        f.stalled = false;
        if (ahead) {
            memcpy(from, f.last, 10);
            bits = 0;
        } else if (!have_from) {
            memset(from, 0, sizeof from);   /* the start, skipping the checks */
            bits = 0;
            have_from = true;
            why[0] = 0;
            continue;
        } else {
            /* Ever larger skips, up to 1/256 of the key space; then
               that step again until the walk is past the damage (a
               leaf of a big store spans more than 1/256 of it: stopping
               there lost every record behind it). */
            bits = bits == 0 ? 16 : bits < 72 ? bits + 8 : 72;
        }
        have_from = true;
        if (!advance(from, bits))
            break;   /* past the end of the key space */
        why[0] = 0;
    }
    if (!done && !img->salvage) {
        close(fd);
        return rc < 0 ? rc : -EUCLEAN;
    }
    img->complete = done;
    /* The children are gone: what was checked stays as it was. */
    (void)fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_WRITE);
    close(fd);
    return 0;
}

void wq__store_img_free(struct wq_store_img *img)
{
    if (img->map)
        munmap(img->map, img->map_len);
    free(img->recs);
    wq__owner_release(img->owner, img->published);
    memset(img, 0, sizeof *img);
}

void wq__store_img_clear_read(struct wq_store_img *img)
{
    if (img->map)
        munmap(img->map, img->map_len);
    free(img->recs);
    size_t from = offsetof(struct wq_store_img, has_meta);
    memset((char *)img + from, 0, sizeof *img - from);
}

int wq__srec_put(MDB_txn *txn, struct wq_env *e, struct wq_srec s, struct wq_meta *m)
{
    struct wq_rec r;
    const unsigned char *key, *lk;
    const char *msg;
    wq__srec_open(s, &r, &key, &msg, &lk);
    r.magic = WQ_REC_MAGIC;
    r.check = wq__rec_check(lk, &r, key, msg);
    MDB_val k = { 10, (void *)lk }, v;
    v.mv_size = sizeof r + r.keylen + r.msglen;
    int rc = wq__lmdb_err(mdb_put(txn, e->recs, &k, &v, MDB_RESERVE));
    if (rc < 0)
        return rc;
    memcpy(v.mv_data, &r, sizeof r);
    memcpy((char *)v.mv_data + sizeof r, key, r.keylen);
    memcpy((char *)v.mv_data + sizeof r + r.keylen, msg, r.msglen);
    m->records++;
    m->sum += r.check;
    return 0;
}
