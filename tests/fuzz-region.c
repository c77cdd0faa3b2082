/*
 * fuzz-region.c - libFuzzer harness: libwq must survive a corrupted region.
 *
 * Build (the library sources are compiled in, so they are instrumented;
 * src/fault.c is the fault-injection build's and stays out):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined \
 *         -include config.h -Iinclude -Isrc tests/fuzz-region.c \
 *         $(find src -name '[a-z]*.c' ! -name fault.c) -llmdb -lpthread -lm \
 *         -o fuzz-region
 *   cp -r tests/fuzz-corpus corpus      (libFuzzer adds to it)
 *   ./fuzz-region -timeout=10 -max_total_time=300 corpus
 * The seeds in tests/fuzz-corpus depend on the region layout; rewrite
 * them after a layout change with FUZZ_WRITE_SEEDS=tests/fuzz-corpus
 * ./fuzz-region. Reproduce a saved input: ./fuzz-region <file>.
 *
 * Once per process (LLVMFuzzerInitialize) a real, small region is built
 * with live state and its bytes are kept as the "valid image":
 *   capacity 64, max_key_len 16, max_procs 8;
 *   slot 0: a handle that added keys, got some, finished one (a freed
 *           entry heads the free list) and closed (its key requeued): FREE;
 *   slot 1: a forked child that got 3 keys, re-added one (dirty and
 *           processing) and added a new one, then died without wq_close:
 *           LIVE with a lease the kernel marked owner-died;
 *   slot 2: a handle of this process that got 2 keys and re-added one,
 *           kept open for the life of the fuzzer: a LIVE holder whose keys
 *           must never be requeued;
 *   keys include one with NUL bytes and one of exactly max_key_len bytes.
 *
 * Each input is a patch list applied to a copy of that image (so the
 * fuzzer explores corruptions of a real region: header, geometry and its
 * checksum, process table, entries, index, ring, and the file size):
 *   byte 0         flags: bit 0 recompute the geometry checksum after
 *                  patching (so geometry fields are explored beyond the
 *                  checksum), bit 1 a file size follows, bit 2 the region
 *                  lock is left by a process that died holding it (the
 *                  first locker gets EOWNERDEAD and repairs), bit 3
 *                  wq_shutdown() before the other calls;
 *   [2 bytes LE]   file size (bit 1): the object is truncated/extended to it;
 *   records        off(2, LE, modulo the image size) ctl(1) data:
 *                  n = (ctl & 31) + 1, op = (ctl >> 5) & 3:
 *                  0 write n bytes, 1 xor n bytes, 2 fill n*8 bytes with
 *                  one byte, 3 add a LE u32 (4 data bytes) at off;
 *                  ctl bit 7: a "late" record, applied to the live region
 *                  after wq_open attached it (corruption behind the back
 *                  of an attached handle, e.g. of the header geometry it
 *                  validated), never to mutex bytes.
 * The mutated image is written to /dev/shm/wq.fuzz-<pid> and opened
 * (attach only), then the late records are applied. wq_open must return 0 or a negative errno. If it opened:
 * wq_check_report(q, 0), then wq_add, wq_add_many, wq_get, wq_done,
 * wq_done_get, wq_len, wq_stats, wq_dump (all non-blocking) must return
 * a value or a negative errno without crashing (ASan/UBSan watch every
 * access); then wq_check(q, WQ_CHECK_REPAIR) and wq_check(q, 0), which
 * MUST return 0; then the repaired region must work (no -EBADMSG from
 * add/get/done) and still check clean. A violated MUST is __builtin_trap().
 * Contract oddities that are not crashes (a wq_len above capacity, a key
 * longer than max_key_len handed out, stats out of range, ...) are
 * "soft findings": each kind is printed once per process and its first
 * input saved to $FUZZ_FINDINGS (default /tmp/fuzz-findings) without
 * stopping the run; FUZZ_STRICT=1 makes them traps as well.
 *
 * FUZZ_SKIP_OWN_SLOT=1 keeps late records away from the state and gen
 * words of the harness's own process slot. Corrupting those behind a live
 * handle is a known way to make repair free or orphan a live slot (see
 * the report of this harness); the knob lets a run look for other bugs.
 *
 * Out of scope: the bytes of the region lock (hdr->lock) and of every
 * lease mutex (procs[i].lease) are restored from the valid image after
 * patching. Mutex words belong to glibc and the kernel (robust futex
 * protocol); a corrupted one can make pthread_mutex_lock wait forever,
 * which no user-space check can prevent. Likewise a lease held by a live
 * thread is only kept while its slot is LIVE: a FREE slot whose lease a
 * live thread holds cannot arise (wq_close frees the lease before the
 * slot) and would make the next registration wait forever. Everything
 * else is fuzzed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <wq.h>
#include "layout.h"

#define CAPACITY    64u
#define MAX_KEY_LEN 16u
#define MAX_PROCS   8u

#define FUTEX_OWNER_DIED_BIT 0x40000000u
#define FUTEX_TID_MASK_BITS  0x3fffffffu

static unsigned char *valid;        /* the valid image */
static size_t valid_size;
static struct wq_geom vgeom;        /* its geometry */
static wq *live_holder;             /* slot 2: kept open forever */
static unsigned char unlocked_mutex[sizeof(pthread_mutex_t)];
static unsigned char dead_lock[sizeof(pthread_mutex_t)];   /* owner died */
static char name[64], path[128];
static const uint8_t *cur_data;     /* the input being run, for findings */
static size_t cur_size;
static bool strict, skip_own_slot;
static size_t own_lo, own_hi;       /* late records skip [own_lo, own_hi) */

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz-region setup: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

/* ------------------------------------------------------------------ */
/* Findings                                                            */
/* ------------------------------------------------------------------ */

static void violation_line(const char *what, void *arg)
{
    int *n = arg;
    if (*n < 20)
        fprintf(stderr, "    violation: %s\n", what);
    (*n)++;
}

static void count_line(const char *what, void *arg)
{
    (void)what;
    (*(int *)arg)++;
}

/* A hard failure: print, then trap so libFuzzer saves the input. */
static void hard(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void hard(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\n=== fuzz-region FAILURE: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    unlink(path);
    __builtin_trap();
}

#define MAX_KINDS 64
static const char *seen_kinds[MAX_KINDS];
static unsigned nseen_kinds;

/* A soft finding: once per kind, input saved, run goes on. */
static void soft(const char *kind, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void soft(const char *kind, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (strict)
        hard("[%s] %s", kind, msg);
    for (unsigned i = 0; i < nseen_kinds; i++)
        if (strcmp(seen_kinds[i], kind) == 0)
            return;
    if (nseen_kinds < MAX_KINDS)
        seen_kinds[nseen_kinds++] = kind;
    const char *dir = getenv("FUZZ_FINDINGS");
    if (!dir || !*dir)
        dir = "/tmp/fuzz-findings";
    mkdir(dir, 0755);
    char file[512];
    snprintf(file, sizeof file, "%s/%s-%d.bin", dir, kind, (int)getpid());
    FILE *f = fopen(file, "wb");
    if (f) {
        fwrite(cur_data, 1, cur_size, f);
        fclose(f);
    }
    fprintf(stderr, "\n=== fuzz-region soft finding [%s]: %s (input saved to %s)\n", kind,
            msg, f ? file : "<not saved>");
}

static void check_errno(const char *call, long rc)
{
    if (rc < 0 && rc <= -4096)
        hard("%s returned %ld: not a negative errno", call, rc);
}

/* ------------------------------------------------------------------ */
/* The valid image                                                     */
/* ------------------------------------------------------------------ */

static void add_key(wq *q, const void *k, size_t n)
{
    int rc = wq_add(q, k, n);
    if (rc < 0)
        die("wq_add: %s", wq_strerror(rc));
}

static int get_key(wq *q, char *buf)
{
    int n = wq_get(q, buf, 64, 0);
    if (n <= 0)
        die("wq_get: %s", wq_strerror(n));
    return n;
}

static void build_valid_image(void)
{
    char seedname[64], seedpath[128], buf[64];
    snprintf(seedname, sizeof seedname, "fuzzseed-%d", (int)getpid());
    snprintf(seedpath, sizeof seedpath, "/dev/shm/wq.%s", seedname);
    wq_unlink(seedname);

    struct wq_options o = { 0 };
    o.capacity = CAPACITY;
    o.max_key_len = MAX_KEY_LEN;
    o.max_procs = MAX_PROCS;
    o.flags = WQ_CREATE | WQ_EXCL;
    wq *p;
    int rc = wq_open(seedname, &o, &p);   /* slot 0 */
    if (rc < 0)
        die("wq_open(create): %s", wq_strerror(rc));
    for (int i = 0; i < 24; i++) {
        int n = snprintf(buf, sizeof buf, "key-%02d", i);
        add_key(p, buf, (size_t)n);
    }
    add_key(p, "\0bin\0key", 8);
    add_key(p, "0123456789abcdef", 16);   /* exactly max_key_len */
    int n = get_key(p, buf);               /* key-00: done -> freed */
    if (wq_done(p, buf, (size_t)n) != 0)
        die("wq_done");
    get_key(p, buf);                       /* key-01: held until close */

    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {                        /* slot 1: dies holding keys */
        wq *c;
        if (wq_open(seedname, NULL, &c) < 0)
            _exit(1);
        char k[64];
        int m = wq_get(c, k, sizeof k, 0);          /* key-02 */
        if (m <= 0 || wq_get(c, k, sizeof k, 0) <= 0 ||   /* key-03 */
            (m = wq_get(c, k, sizeof k, 0)) <= 0)        /* key-04 */
            _exit(2);
        if (wq_add(c, k, (size_t)m) != 0)               /* dirty + processing */
            _exit(3);
        if (wq_add(c, "child-new", 9) != 0)
            _exit(4);
        _exit(0);                          /* no wq_close: a crash */
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        die("builder child failed (status 0x%x)", st);

    rc = wq_open(seedname, NULL, &live_holder);   /* slot 2: lives on */
    if (rc < 0)
        die("wq_open(live): %s", wq_strerror(rc));
    get_key(live_holder, buf);                    /* key-05 */
    n = get_key(live_holder, buf);                /* key-06 */
    add_key(live_holder, buf, (size_t)n);         /* dirty + processing */
    add_key(p, "late-1", 6);
    /* Delays and failure counts: a key waiting an hour (wq_add_after), one
       kept idle only for its failure count (retained after its wq_done),
       and one rate limited with 12 failures (waiting 5 ms * 2^12). */
    if (wq_add_after(p, "delayed-1", 9, 3600ull * 1000000000ull) < 0 ||
        wq_add_rate_limited(p, "ret-1", 5) < 0)
        die("delayed adds");
    for (int i = 0; i < 12; i++)
        if (wq_add_rate_limited(p, "limited-1", 9) < 0)   /* merged: failures 12 */
            die("wq_add_rate_limited");
    for (int i = 0; i < 200; i++) {   /* both are ready after 5 ms */
        usleep(1000);
        struct wq_stats ws;
        if (wq_stats(p, &ws) == 0 && ws.waiting <= 1)
            break;
    }
    for (int todo = 2; todo > 0;) {   /* hand out the queue until both came */
        n = wq_get(p, buf, sizeof buf, 0);
        if (n <= 0)
            die("ret-1/limited-1 never became ready: %s", wq_strerror(n));
        if ((n == 5 && memcmp(buf, "ret-1", 5) == 0) ||
            (n == 9 && memcmp(buf, "limited-1", 9) == 0)) {
            if (wq_done(p, buf, (size_t)n) != 0)
                die("wq_done(%.*s)", n, buf);
            if (n == 9 && wq_add_rate_limited(p, buf, 9) < 0)
                die("wq_add_rate_limited(limited-1)");
            todo--;
            continue;
        }
        add_key(p, buf, (size_t)n);   /* keep it live: dirty, requeued at close */
    }
    wq_close(p);                                  /* its keys requeued, slot 0 free */

    if (wq_check(live_holder, 0) != 0)
        die("the valid image does not check clean");
    struct wq_stats vs;
    if (wq_stats(live_holder, &vs) != 0 || vs.waiting < 2 || vs.processing < 5 ||
        vs.queued < 10)
        die("the valid image lacks state: queued %llu processing %llu waiting %llu",
            (unsigned long long)vs.queued, (unsigned long long)vs.processing,
            (unsigned long long)vs.waiting);

    int fd = open(seedpath, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0)
        die("open %s", seedpath);
    valid_size = (size_t)sb.st_size;
    valid = malloc(valid_size);
    if (!valid || pread(fd, valid, valid_size, 0) != (ssize_t)valid_size)
        die("read %s", seedpath);
    close(fd);

    /* A process that dies holding the region lock: its bytes (owner-died
       word, set by the kernel) are the template for flag bit 2. */
    pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        int f = open(seedpath, O_RDWR | O_CLOEXEC);
        if (f < 0)
            _exit(1);
        struct wq_hdr *h = mmap(NULL, valid_size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
        if (h == MAP_FAILED || pthread_mutex_lock(&h->lock) != 0)
            _exit(2);
        _exit(0);
    }
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        die("lock-holder child failed (status 0x%x)", st);
    fd = open(seedpath, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || pread(fd, dead_lock, sizeof dead_lock, offsetof(struct wq_hdr, lock)) !=
                      (ssize_t)sizeof dead_lock)
        die("read lock");
    close(fd);
    memcpy(&st, dead_lock, 4);
    if (!((unsigned)st & FUTEX_OWNER_DIED_BIT))
        die("dead lock template is not owner-died (0x%x)", st);
    wq_unlink(seedname);

    memcpy(&vgeom, valid, sizeof vgeom);
    if (vgeom.max_procs != MAX_PROCS || vgeom.total_size != valid_size)
        die("unexpected geometry");
    /* Nobody held the region lock at the snapshot: its bytes are the
       unlocked template used for a live-held lease on a non-LIVE slot. */
    memcpy(unlocked_mutex, valid + offsetof(struct wq_hdr, lock), sizeof unlocked_mutex);
    uint32_t w;
    memcpy(&w, unlocked_mutex, 4);
    if (w != 0)
        die("region lock held at snapshot");
    const struct wq_proc *pr = (const struct wq_proc *)(valid + vgeom.off_procs);
    memcpy(&w, &pr[1].lease, 4);
    if (!(w & FUTEX_OWNER_DIED_BIT))
        die("slot 1 lease not owner-died (0x%x)", w);
    memcpy(&w, &pr[2].lease, 4);
    if (!(w & FUTEX_TID_MASK_BITS) || (w & FUTEX_OWNER_DIED_BIT))
        die("slot 2 lease not held (0x%x)", w);
}

/* ------------------------------------------------------------------ */
/* Seed corpus                                                         */
/* ------------------------------------------------------------------ */

struct seedbuf {
    uint8_t b[64];
    size_t n;
};

static void sb_put(struct seedbuf *s, const void *p, size_t n)
{
    if (s->n + n <= sizeof s->b) {
        memcpy(s->b + s->n, p, n);
        s->n += n;
    }
}

/* One patch record: write (op 0), xor (1), fill (2) or add (3). */
static void sb_rec(struct seedbuf *s, size_t off, int op, size_t n, const void *data,
                   size_t dlen, bool late)
{
    uint8_t r[3] = { (uint8_t)off, (uint8_t)(off >> 8),
                     (uint8_t)((late ? 0x80 : 0) | (op << 5) | ((n - 1) & 31)) };
    sb_put(s, r, 3);
    sb_put(s, data, dlen);
}

static void write_seed(const char *dir, const char *fname, const struct seedbuf *s)
{
    char file[512];
    snprintf(file, sizeof file, "%s/%s", dir, fname);
    FILE *f = fopen(file, "wb");
    if (!f || fwrite(s->b, 1, s->n, f) != s->n)
        die("write %s", file);
    fclose(f);
}

/* FUZZ_WRITE_SEEDS=dir: write the seed corpus for the layout this harness
   was built against (offsets from layout.h and the valid image), then
   exit. tests/fuzz-corpus holds its output; regenerate it when the layout
   changes. */
static void write_seeds(const char *dir)
{
    const size_t busy = offsetof(struct wq_hdr, busy);
    const size_t pos = offsetof(struct wq_hdr, ring_pos);
    const size_t ent = vgeom.off_entries, esz = vgeom.entry_size;
    const size_t prc = vgeom.off_procs, psz = sizeof(struct wq_proc);
    const uint8_t one[4] = { 1, 0, 0, 0 }, zero[4] = { 0 }, wrap[4] = { 0xf5, 0xff, 0xff, 0xff };
    const uint8_t ff[2] = { 0xff, 0xff }, qd[2] = { WQ_ST_QUEUED, 0 }, seven[2] = { 7, 0 };
    const uint8_t x8[8] = { 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a };
    struct seedbuf s;
#define SEED(fname, flags, body)                                                   \
    do {                                                                           \
        memset(&s, 0, sizeof s);                                                   \
        uint8_t f_ = (flags);                                                      \
        sb_put(&s, &f_, 1);                                                        \
        body;                                                                      \
        write_seed(dir, fname, &s);                                                \
    } while (0)
    SEED("clean", 0, (void)0);
    SEED("busy", 0, sb_rec(&s, busy, 0, 4, one, 4, false));
    SEED("ring-count", 0, sb_rec(&s, pos + 4, 3, 1, one, 4, false));
    SEED("len-wrap", 0, sb_rec(&s, pos + 4, 0, 4, wrap, 4, false));
    SEED("hash-seed", 1, sb_rec(&s, offsetof(struct wq_geom, hash_seed), 1, 8, x8, 8, false));
    SEED("entry-state", 0, sb_rec(&s, ent + 3 * esz + offsetof(struct wq_entry, state), 0,
                                  sizeof(((struct wq_entry *)0)->state), ff,
                                  sizeof(((struct wq_entry *)0)->state), false));
    SEED("proc-free", 0, sb_rec(&s, prc + 2 * psz + offsetof(struct wq_proc, state), 0, 4,
                                zero, 4, false));
    SEED("index-zero", 0, sb_rec(&s, vgeom.off_index, 2, 8, zero, 1, false));
    {
        uint8_t sz[2] = { 0x00, 0x10 };   /* 4096 bytes */
        SEED("truncated", 2, sb_put(&s, sz, 2));
    }
    SEED("dead-lock", 4, (void)0);
    SEED("dead-lock-busy", 4,
         (sb_rec(&s, busy, 0, 4, one, 4, false),
          sb_rec(&s, ent + 5 * esz + offsetof(struct wq_entry, state), 0,
                 sizeof(((struct wq_entry *)0)->state), qd,
                 sizeof(((struct wq_entry *)0)->state), false)));
    SEED("shutdown", 8, (void)0);
    SEED("late-geometry", 0,
         sb_rec(&s, offsetof(struct wq_geom, capacity), 3, 1, one, 4, true));
    SEED("late-entry-owner", 0,
         sb_rec(&s, ent + 6 * esz + offsetof(struct wq_entry, owner), 0,
                sizeof(((struct wq_entry *)0)->owner), seven,
                sizeof(((struct wq_entry *)0)->owner), true));
#undef SEED
    fprintf(stderr, "fuzz-region: seeds written to %s\n", dir);
}

/* A crash inside wq_open leaves the mutated object behind (it is
   unlinked right after wq_open returns): remove those of dead fuzzers. */
static void remove_stale(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        int pid;
        char tail;
        if ((sscanf(de->d_name, "wq.fuzz-%d%c", &pid, &tail) == 1 ||
             sscanf(de->d_name, "wq.fuzzseed-%d%c", &pid, &tail) == 1) &&
            pid > 0 && kill(pid, 0) < 0 && errno == ESRCH) {
            char p[300];
            snprintf(p, sizeof p, "/dev/shm/%s", de->d_name);
            unlink(p);
        }
    }
    closedir(d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    remove_stale();
    const char *s = getenv("FUZZ_STRICT");
    strict = s && *s && strcmp(s, "0") != 0;
    s = getenv("FUZZ_SKIP_OWN_SLOT");
    skip_own_slot = s && *s && strcmp(s, "0") != 0;
    snprintf(name, sizeof name, "fuzz-%d", (int)getpid());
    snprintf(path, sizeof path, "/dev/shm/wq.%s", name);
    build_valid_image();
    s = getenv("FUZZ_WRITE_SEEDS");
    if (s && *s) {
        write_seeds(s);
        exit(0);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* One input                                                           */
/* ------------------------------------------------------------------ */

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Is byte `off` of the region part of a mutex (out of scope)? */
static bool in_mutex(size_t off)
{
    size_t l = offsetof(struct wq_hdr, lock);
    if (off >= l && off < l + sizeof(pthread_mutex_t))
        return true;
    if (off < vgeom.off_procs || off >= vgeom.off_procs + (size_t)vgeom.max_procs *
                                                            sizeof(struct wq_proc))
        return false;
    size_t rel = (off - vgeom.off_procs) % sizeof(struct wq_proc);
    return rel >= offsetof(struct wq_proc, lease) &&
           rel < offsetof(struct wq_proc, lease) + sizeof(pthread_mutex_t);
}

static void put(unsigned char *img, size_t size, size_t off, unsigned char v, int op, bool late)
{
    if (off >= size || (late && (in_mutex(off) || (off >= own_lo && off < own_hi))))
        return;
    if (op == 1)
        img[off] ^= v;
    else
        img[off] = v;
}

/* Apply the early (late == false) or late records of the patch list to
   img (size bytes). */
static void apply_records(unsigned char *img, size_t size, const uint8_t *d, size_t n,
                          bool late)
{
    size_t i = 1;
    if (n > 0 && (d[0] & 2))
        i += 2;
    while (i + 3 <= n) {
        size_t off = ((size_t)d[i] | (size_t)d[i + 1] << 8) % valid_size;
        uint8_t ctl = d[i + 2];
        i += 3;
        size_t len = (size_t)(ctl & 31) + 1;
        int op = (ctl >> 5) & 3;
        bool mine = ((ctl & 0x80) != 0) == late;
        switch (op) {
        case 0:
        case 1:
            for (size_t k = 0; k < len && i < n; k++, i++)
                if (mine)
                    put(img, size, (off + k) % valid_size, d[i], op, late);
            break;
        case 2:
            if (i < n) {
                for (size_t k = 0; k < len * 8 && mine; k++)
                    put(img, size, (off + k) % valid_size, d[i], op, late);
                i++;
            }
            break;
        default:
            if (mine && i + 4 <= n && off + 4 <= size) {
                uint32_t v, a;
                memcpy(&v, img + off, 4);
                memcpy(&a, d + i, 4);
                v += a;
                for (int b = 0; b < 4; b++)
                    put(img, size, off + (size_t)b, (unsigned char)(v >> (8 * b)), 0, late);
            }
            i += 4;
            break;
        }
    }
}

static bool has_late(const uint8_t *d, size_t n)
{
    size_t i = (n > 0 && (d[0] & 2)) ? 3 : 1;
    while (i + 3 <= n) {
        uint8_t ctl = d[i + 2];
        if (ctl & 0x80)
            return true;
        i += 3;
        int op = (ctl >> 5) & 3;
        i += op == 3 ? 4 : op == 2 ? 1 : (size_t)(ctl & 31) + 1;
    }
    return false;
}

/* Apply the early records to the image; returns the file size to write. */
static size_t mutate(unsigned char *img, const uint8_t *d, size_t n)
{
    size_t fsize = valid_size;
    uint8_t flags = n > 0 ? d[0] : 0;
    if ((flags & 2) && n >= 3)
        fsize = (size_t)d[1] | (size_t)d[2] << 8;
    apply_records(img, valid_size, d, n, false);
    /* Mutex words are out of scope (see the top of the file). */
    memcpy(img + offsetof(struct wq_hdr, lock),
           (flags & 4) ? dead_lock : valid + offsetof(struct wq_hdr, lock),
           sizeof(pthread_mutex_t));
    struct wq_proc *pr = (struct wq_proc *)(img + vgeom.off_procs);
    const struct wq_proc *vp = (const struct wq_proc *)(valid + vgeom.off_procs);
    for (uint32_t s = 0; s < vgeom.max_procs; s++) {
        uint32_t w;
        memcpy(&w, &vp[s].lease, 4);
        bool live_held = (w & FUTEX_TID_MASK_BITS) && !(w & FUTEX_OWNER_DIED_BIT);
        if (live_held && pr[s].state != WQ_PROC_LIVE)
            memcpy(&pr[s].lease, unlocked_mutex, sizeof pr[s].lease);
        else
            memcpy(&pr[s].lease, &vp[s].lease, sizeof pr[s].lease);
    }
    if (flags & 1) {
        struct wq_geom *g = (struct wq_geom *)img;
        g->checksum = fnv1a(g, offsetof(struct wq_geom, checksum));
    }
    return fsize;
}

static int write_image(const unsigned char *img, size_t fsize)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    size_t w = fsize < valid_size ? fsize : valid_size;
    int rc = 0;
    if (pwrite(fd, img, w, 0) != (ssize_t)w)
        rc = -1;
    if (rc == 0 && fsize != w && ftruncate(fd, (off_t)fsize) < 0)
        rc = -1;
    close(fd);
    return rc;
}

struct dump_ctx {
    unsigned n;
    uint64_t sum;
    bool bad_len;
};

static int dump_cb(const struct wq_key_info *ki, void *arg)
{
    struct dump_ctx *c = arg;
    c->n++;
    if (ki->len == 0 || ki->len > MAX_KEY_LEN)
        c->bad_len = true;
    const unsigned char *k = ki->key;
    size_t len = ki->len <= MAX_KEY_LEN ? ki->len : MAX_KEY_LEN;
    for (size_t i = 0; i < len; i++)   /* ASan: the key bytes must be mapped */
        c->sum += k[i];
    return 0;
}

static bool is_key_errno(int rc)
{
    return rc == -EBADMSG || rc == -ENOSPC || rc == -ESHUTDOWN || rc == -ENOENT ||
           rc == -ENOTRECOVERABLE || rc == -EUSERS || rc == -ENOMEM;
}

/* The calls on a possibly corrupt region: any value or -errno, no crash. */
static void exercise(wq *q)
{
    char buf[64];
    int rc = wq_add(q, "fz-new", 6);
    check_errno("wq_add", rc);
    if (rc > 1 || (rc < 0 && !is_key_errno(rc)))
        soft("add-rc", "wq_add returned %d (%s)", rc, wq_strerror(rc));
    rc = wq_add(q, "key-10", 6);
    check_errno("wq_add", rc);
    struct iovec iov[3] = { { "key-11", 6 }, { "fz-many", 7 }, { "\0bin\0key", 8 } };
    rc = wq_add_many(q, iov, 3);
    check_errno("wq_add_many", rc);
    if (rc > 3)
        soft("add-many-rc", "wq_add_many returned %d for 3 keys", rc);

    int n = wq_get(q, buf, sizeof buf, 0);
    check_errno("wq_get", n);
    if (n > (int)MAX_KEY_LEN)
        soft("get-len", "wq_get returned length %d > max_key_len", n);
    if (n == 0)
        soft("get-zero", "wq_get returned 0");
    if (n > 0 && n <= (int)MAX_KEY_LEN) {
        rc = wq_done(q, buf, (size_t)n);
        check_errno("wq_done", rc);
        if (rc != 0 && rc != -EBADMSG)
            soft("done-after-get", "wq_done of the key just got: %s", wq_strerror(rc));
    }
    /* Keys held by the dead child and by the live holder. */
    rc = wq_done(q, "key-03", 6);
    check_errno("wq_done", rc);
    rc = wq_done(q, "key-05", 6);
    check_errno("wq_done", rc);
    n = wq_get(q, buf, sizeof buf, 0);
    check_errno("wq_get", n);
    if (n > 0 && n <= (int)MAX_KEY_LEN) {
        char buf2[64];
        int m = wq_done_get(q, buf, (size_t)n, buf2, sizeof buf2, 0);
        check_errno("wq_done_get", m);
        if (m > (int)MAX_KEY_LEN)
            soft("get-len", "wq_done_get returned length %d > max_key_len", m);
    }
    int len = wq_len(q);
    if (len < 0 || (unsigned)len > CAPACITY)
        soft("len-range", "wq_len returned %d (capacity %u)", len, CAPACITY);

    struct wq_stats s;
    rc = wq_stats(q, &s);
    check_errno("wq_stats", rc);
    if (rc == 0 && (s.queued > CAPACITY || s.processing > CAPACITY || s.live > CAPACITY ||
                    s.processes > MAX_PROCS || s.capacity != CAPACITY))
        soft("stats-range", "wq_stats: queued %" PRIu64 " processing %" PRIu64
             " live %" PRIu64 " processes %" PRIu64 " (capacity %u)",
             s.queued, s.processing, s.live, s.processes, CAPACITY);

    struct dump_ctx dc = { 0 };
    rc = wq_dump(q, dump_cb, &dc);
    check_errno("wq_dump", rc);
    if (rc > 0)
        hard("wq_dump returned %d although the callback always returned 0", rc);
    if (dc.bad_len)
        soft("dump-len", "wq_dump reported a key length outside 1..max_key_len");
    if (dc.n > 2 * CAPACITY)
        soft("dump-count", "wq_dump visited %u keys (capacity %u)", dc.n, CAPACITY);
    (void)wq_shutting_down(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cur_data = data;
    cur_size = size;
    unsigned char *img = malloc(valid_size);
    if (!img)
        return 0;
    memcpy(img, valid, valid_size);
    size_t fsize = mutate(img, data, size);
    bool free_before[MAX_PROCS];
    const struct wq_proc *ipr = (const struct wq_proc *)(img + vgeom.off_procs);
    for (uint32_t i = 0; i < MAX_PROCS; i++)
        free_before[i] = ipr[i].state == WQ_PROC_FREE;
    if (write_image(img, fsize) < 0) {
        free(img);
        unlink(path);
        return 0;
    }
    free(img);

    wq *q = NULL;
    int rc = wq_open(name, NULL, &q);
    /* The name is not needed once attached (the handle maps the object):
       remove it now, so a crash or timeout below leaves nothing behind. The
       late records reach the object through the open fd below. */
    int lfd = rc == 0 ? open(path, O_RDWR | O_CLOEXEC) : -1;
    unlink(path);
    if (rc > 0 || rc <= -4096)
        hard("wq_open returned %d", rc);
    if (rc < 0) {
        if (rc != -EPROTO && rc != -EBADMSG && rc != -EUSERS && rc != -ENOMEM &&
            rc != -ENOTRECOVERABLE)
            soft("open-rc", "wq_open returned %d (%s)", rc, wq_strerror(rc));
        unlink(path);
        return 0;
    }

    /* Late records: corrupt the region behind the attached handle. */
    own_lo = own_hi = 0;
    if (has_late(data, size) && fsize >= valid_size) {
        int fd = lfd;
        if (fd >= 0) {
            unsigned char *m = mmap(NULL, valid_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m != MAP_FAILED) {
                /* Our slot: FREE in the image, LIVE with our pid now. */
                const struct wq_proc *pr = (const struct wq_proc *)(m + vgeom.off_procs);
                for (uint32_t i = 0; skip_own_slot && i < vgeom.max_procs; i++)
                    if (free_before[i] && pr[i].state == WQ_PROC_LIVE &&
                        pr[i].pid == (int32_t)getpid()) {
                        own_lo = vgeom.off_procs + i * sizeof(struct wq_proc) +
                                 offsetof(struct wq_proc, state);
                        own_hi = vgeom.off_procs + i * sizeof(struct wq_proc) +
                                 offsetof(struct wq_proc, gen) + 4;
                        break;
                    }
                apply_records(m, valid_size, data, size, true);
                munmap(m, valid_size);
            }
        }
    }
    if (lfd >= 0)
        close(lfd);
    if (size > 0 && (data[0] & 8)) {
        rc = wq_shutdown(q);
        check_errno("wq_shutdown", rc);
    }
    int reported = 0;
    int found = wq_check_report(q, 0, count_line, &reported);
    check_errno("wq_check_report", found);
    if (found >= 0 && reported != found)
        soft("report-count", "wq_check_report returned %d but reported %d lines", found,
             reported);

    exercise(q);

    int repaired = wq_check(q, WQ_CHECK_REPAIR);
    check_errno("wq_check(REPAIR)", repaired);
    int lines = 0;
    int after = wq_check_report(q, 0, violation_line, &lines);
    if (after != 0)
        hard("wq_check(q, 0) = %d after wq_check(q, WQ_CHECK_REPAIR) = %d "
             "(first check found %d)", after, repaired, found);

    /* A repaired region must work and stay clean. */
    char buf[64];
    rc = wq_add(q, "post-repair", 11);
    struct wq_stats geo;
    /* A patched header with its checksum redone may validly say a smaller
       max_key_len (same entry size): then the key is simply too long. */
    bool too_long = wq_stats(q, &geo) == 0 && geo.max_key_len < 11;
    if (rc == -EMSGSIZE && too_long)
        rc = -ENOSPC;   /* an expected refusal: skip the checks that need the key */
    if (rc == -EBADMSG || (rc < 0 && rc != -ENOSPC && rc != -ESHUTDOWN))
        hard("wq_add after repair: %d (%s)", rc, wq_strerror(rc));
    int n = wq_get(q, buf, sizeof buf, 0);
    if (n == -EBADMSG || n == 0 || n > (int)MAX_KEY_LEN ||
        (n < 0 && n != -EAGAIN && n != -ESHUTDOWN))
        hard("wq_get after repair: %d (%s)", n, n < 0 ? wq_strerror(n) : "bad length");
    if (n > 0) {
        rc = wq_done(q, buf, (size_t)n);
        if (rc != 0)
            hard("wq_done after repair of the key just got: %d (%s)", rc, wq_strerror(rc));
    }
    struct wq_stats s;
    if (wq_stats(q, &s) == 0 && (s.queued > s.live || s.processing > s.live ||
                                 s.live > CAPACITY))
        hard("stats after repair: queued %" PRIu64 " processing %" PRIu64 " live %" PRIu64,
             s.queued, s.processing, s.live);
    lines = 0;
    after = wq_check_report(q, 0, violation_line, &lines);
    if (after != 0)
        hard("wq_check(q, 0) = %d after operating on the repaired region", after);
    (void)wq_shutdown_drain(q, 0);

    wq_close(q);
    unlink(path);
    return 0;
}
