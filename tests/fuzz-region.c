/*
 * fuzz-region.c - libFuzzer harness: libwq must survive a corrupted region.
 *
 * Build (the library sources are compiled in, so they are instrumented;
 * src/fault.c is the fault-injection build's and stays out). "make fuzz"
 * does all of this:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined \
 *         -fno-sanitize-recover=undefined -std=gnu11 \
 *         -include config.h -Iinclude -Isrc tests/fuzz-region.c \
 *         $(find src -name '[a-z]*.c' ! -name fault.c) -llmdb -lpthread -lm \
 *         -o fuzz-region
 *   cp -r tests/fuzz-corpus corpus      (libFuzzer adds to it)
 *   ./fuzz-region -timeout=10 -max_total_time=300 corpus
 * The seeds in tests/fuzz-corpus depend on the region layout; rewrite
 * them after a layout change with FUZZ_WRITE_SEEDS=tests/fuzz-corpus
 * ./fuzz-region. Reproduce a saved input: ./fuzz-region <file> (with the
 * FUZZ_MODE the run that found it had, see below).
 *
 * Once per process (LLVMFuzzerInitialize) two real, small regions are
 * built with live state, and their bytes kept as "valid images" (struct
 * image): one default-mode queue and one WQ_FAIR queue, both of
 * capacity 64, max_key_len 40, max_procs 8.
 *
 * The default image:
 *   slot 0: a handle that added keys, got some, finished one (a freed
 *           entry heads the free list) and closed (its key requeued): FREE;
 *   slot 1: a forked child that got 3 keys, re-added one (dirty and
 *           processing) and added a new one, then died without wq_close:
 *           LIVE with a lease the kernel marked owner-died (or that a
 *           liveness probe of the builder's wq_stats then unlocked);
 *   slot 2: a handle of this process that got 2 keys and re-added one,
 *           kept open for the life of the fuzzer: a LIVE holder whose keys
 *           must never be requeued;
 *   keys include one with NUL bytes, one of exactly max_key_len bytes
 *   and one of 20 (long keys: their first 12 bytes in the entry, the
 *   rest in the key arena);
 *   two adds ("pub-1", "pub-2") the live holder published to its lane
 *   and nobody has applied yet;
 *   a key waiting an hour, one idle for its failure count (RETAINED), one
 *   rate limited with 12 failures (waiting); two idle with results, one
 *   whose message lives in the key arena.
 * The fair image (WQ_FAIR, fair_share 8, tenant_sep '/') has the same
 * three slots and kinds of keys, and real fair state besides: keys of five
 * tenants ("ns-a/x0", "ns-b/y1", ...) and of none ("solo", the NUL key),
 * at priorities -2..5, queued keys whose priority a merge raised, keys
 * re-added while processing with a priority of their own (by the dead
 * child and by the live holder), waiting keys with and without a
 * priority, more hand-outs than fair_share (so fair_ticks, the per
 * priority virtual times and the tenant tag table are all in use). Both
 * fair heaps (fheap_p by priority/tag/age, fheap_a by age), the per-entry
 * fair data (struct wq_fx: tag, prio, hp, ha, tenant_len) and fq_count
 * are populated.
 *
 * Each input is a patch list applied to a copy of one image (so the
 * fuzzer explores corruptions of a real region: header, geometry and its
 * checksum, process table, entries, index, ring, heaps, fair sections, and
 * the file size):
 *   byte 0         flags: bit 0 recompute the geometry checksum after
 *                  patching (so geometry fields are explored beyond the
 *                  checksum), bit 1 a file size follows, bit 2 the region
 *                  lock is left by a process that died holding it (the
 *                  first locker gets EOWNERDEAD and repairs), bit 3
 *                  wq_shutdown() before the other calls, bit 4 the fair
 *                  image (else the default one);
 *   [3 bytes LE]   file size (bit 1): the object is truncated/extended to it;
 *   records        off(3, LE, modulo the image size) ctl(1) data:
 *                  n = (ctl & 31) + 1, op = (ctl >> 5) & 3:
 *                  0 write n bytes, 1 xor n bytes, 2 fill n*8 bytes with
 *                  one byte, 3 add a LE u32 (4 data bytes) at off;
 *                  ctl bit 7: a "late" record, applied to the live region
 *                  after wq_open attached it (corruption behind the back
 *                  of an attached handle, e.g. of the header geometry it
 *                  validated), never to mutex bytes.
 * FUZZ_MODE=default or FUZZ_MODE=fair forces bit 4 off or on for every
 * input (a run that spends all its time on one image); unset or "all",
 * bit 4 decides. A saved input reproduces under the FUZZ_MODE it was
 * found with (the finding's message names the image).
 *
 * The mutated image is written to /dev/shm/wq.fuzz-<pid> and opened
 * (attach only), then the late records are applied. wq_open must return
 * 0 or a negative errno. If it opened: wq_check_report(q, 0), then
 * wq_add, wq_add_rate_limited, wq_add_opts (fair: with priorities, a
 * merge that raises a queued key, a short delay), wq_add_many, wq_get,
 * wq_done (also of the keys the dead child and the live holder hold),
 * wq_done_get, wq_len, wq_stats, wq_dump (all non-blocking) must return
 * a value or a negative
 * errno without crashing (ASan/UBSan watch every access); then
 * wq_check(q, WQ_CHECK_REPAIR) and wq_check(q, 0), which MUST return 0;
 * then the repaired region must work (no -EBADMSG from add/get/done) and
 * still check clean. A violated MUST is __builtin_trap().
 * Contract oddities that are not crashes (a wq_len above capacity, a key
 * longer than max_key_len handed out, stats out of range, ...) are
 * "soft findings": each kind is printed once per process and its first
 * input saved to $FUZZ_FINDINGS (default /tmp/fuzz-findings) without
 * stopping the run; FUZZ_STRICT=1 makes them traps as well.
 *
 * Deterministic rounds: FUZZ_ROUNDS=N [FUZZ_MODE=default|fair|all]
 * [FUZZ_SEED=s] ./fuzz-region runs N generated patch lists per mode
 * (a fixed PRNG seeded by FUZZ_SEED, default 1, so a run is repeatable),
 * each in a forked child with a 20 s alarm, and prints per mode: tried,
 * open refused (a clean -errno from wq_open), opened, of those clean at
 * the first check or repaired (violations found, repaired, clean after),
 * how many saw a clean -EBADMSG from an operation, crashes (a signal, a
 * sanitizer report or a violated MUST) and soft findings by kind. The
 * input of every crash is saved to $FUZZ_FINDINGS/round-<mode>-<n>.bin
 * and reproduces with ./fuzz-region <file> (FUZZ_MODE as in the round).
 * Exit status 1 if any round crashed. The generator aims its records at
 * the sections of the region (fair sections, in fair mode, a quarter of
 * the time) with values that probe bounds (capacity - 1, capacity,
 * capacity + 1, -1, ...), and a fifth of them at one word of several
 * entries (or of their fair data) at once.
 *
 * FUZZ_VERBOSE=1 prints where each record lands (section[element]+byte),
 * what wq_open returned and how many violations each check found.
 *
 * Reproducibility: the images are rebuilt by every process, and the
 * library draws each region's hash seed at random, so where keys sit in
 * the hash index differs between processes. An input whose effect
 * depends on the index (its records hit index slots, or hashes) may need
 * a few runs to reproduce, and the rounds' counts may differ by a few
 * between runs; everything else about the images is the same each time.
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
#include <time.h>
#include <unistd.h>

#include <wq.h>
#include "shm/layout.h"

#define CAPACITY    64u
#define MAX_KEY_LEN 40u
#define MAX_PROCS   8u
#define FAIR_SHARE  8u

#define FLAG_CHECKSUM 1u
#define FLAG_SIZE     2u
#define FLAG_DEADLOCK 4u
#define FLAG_SHUTDOWN 8u
#define FLAG_FAIR     16u

#define FUTEX_OWNER_DIED_BIT 0x40000000u
#define FUTEX_TID_MASK_BITS  0x3fffffffu

/* One valid image and what the harness knows about it. */
struct image {
    const char *mode;                 /* "default" or "fair" */
    bool fair;
    unsigned char *bytes;
    size_t size;
    struct wq_geom g;                 /* its geometry */
    wq *live_holder;                  /* slot 2: kept open forever */
    unsigned char unlocked_mutex[sizeof(pthread_mutex_t)];
    unsigned char dead_lock[sizeof(pthread_mutex_t)];   /* owner died */
    /* Keys of the image, found by wq_dump once it is built: */
    char dead_key[MAX_KEY_LEN + 1];   /* held by the dead child */
    char live_key[MAX_KEY_LEN + 1];   /* held by the live holder */
    char queued_key[2][MAX_KEY_LEN + 1];   /* queued */
};
enum { IMG_DEFAULT, IMG_FAIR, NIMAGES };
static struct image images[NIMAGES];
static const struct image *img_of_input;   /* the image of the input being run */

static int force_mode = -1;         /* FUZZ_MODE: -1 bit 4 decides, else IMG_* */
static char name[64], path[128];
static const uint8_t *cur_data;     /* the input being run, for findings */
static size_t cur_size;
static bool strict, skip_own_slot, verbose;
static size_t own_lo, own_hi;       /* late records skip [own_lo, own_hi) */

/* Rounds mode: soft findings counted across the forked children. */
#define MAX_KINDS 64
struct shared_kinds {
    unsigned n;
    struct {
        char kind[32];
        unsigned count;
    } k[MAX_KINDS];
};
static struct shared_kinds *shared;
/* What the input did, for the rounds' counts (the child's exit code). */
enum { OUT_OPENED = 1, OUT_FOUND = 2, OUT_EBADMSG = 4, OUT_BASE = 100 };
static unsigned outcome;

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

static const char *mode_name(void)
{
    return img_of_input ? img_of_input->mode : "?";
}

/* A hard failure: print, then trap so libFuzzer saves the input. */
static void hard(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void hard(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\n=== fuzz-region FAILURE (%s image): ", mode_name());
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    unlink(path);
    __builtin_trap();
}

static const char *seen_kinds[MAX_KINDS];
static unsigned nseen_kinds;

static void save_input(const char *file)
{
    FILE *f = fopen(file, "wb");
    if (f) {
        fwrite(cur_data, 1, cur_size, f);
        fclose(f);
    }
}

static const char *findings_dir(void)
{
    const char *dir = getenv("FUZZ_FINDINGS");
    if (!dir || !*dir)
        dir = "/tmp/fuzz-findings";
    mkdir(dir, 0755);
    return dir;
}

/* Rounds mode: count the kind across children; true the first time. */
static bool shared_first(const char *kind)
{
    for (unsigned i = 0; i < shared->n; i++)
        if (strcmp(shared->k[i].kind, kind) == 0)
            return shared->k[i].count++ == 0;
    if (shared->n < MAX_KINDS) {
        snprintf(shared->k[shared->n].kind, sizeof shared->k[0].kind, "%s", kind);
        shared->k[shared->n++].count = 1;
    }
    return true;
}

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
    if (shared && !shared_first(kind))
        return;
    char file[512];
    snprintf(file, sizeof file, "%s/%s-%s-%d.bin", findings_dir(), kind, mode_name(),
             (int)getpid());
    save_input(file);
    fprintf(stderr, "\n=== fuzz-region soft finding [%s] (%s image): %s (input saved to %s)\n",
            kind, mode_name(), msg, file);
}

static void check_errno(const char *call, long rc)
{
    if (rc < 0 && rc <= -4096)
        hard("%s returned %ld: not a negative errno", call, rc);
    if (rc == -EBADMSG)
        outcome |= OUT_EBADMSG;
}

/* ------------------------------------------------------------------ */
/* The valid images                                                    */
/* ------------------------------------------------------------------ */

static void add_prio(wq *q, const void *k, size_t n, int prio)
{
    struct wq_add_opts o = { .priority = prio };
    int rc = wq_add_opts(q, k, n, &o);
    if (rc < 0)
        die("wq_add_opts(%.*s, %d): %s", (int)n, (const char *)k, prio, wq_strerror(rc));
}

static void add_key(wq *q, const void *k, size_t n)
{
    add_prio(q, k, n, 0);
}

static void add_str(wq *q, const char *k, int prio)
{
    add_prio(q, k, strlen(k), prio);
}

static int get_key(wq *q, char *buf)
{
    int n = wq_get(q, buf, 64, 0);
    if (n <= 0)
        die("wq_get: %s", wq_strerror(n));
    return n;
}

/* The forked child of slot 1: gets 3 keys, re-adds the third (dirty and
   processing; fair: with a priority of its own), adds a new key, and dies
   without wq_close. */
static void dying_child(const char *seedname, const char *newkey, int prio)
{
    wq *c;
    if (wq_open(seedname, NULL, &c) < 0)
        _exit(1);
    char k[64];
    int m = wq_get(c, k, sizeof k, 0);
    if (m <= 0 || wq_get(c, k, sizeof k, 0) <= 0 || (m = wq_get(c, k, sizeof k, 0)) <= 0)
        _exit(2);
    struct wq_add_opts o = { .priority = prio };
    if (wq_add_opts(c, k, (size_t)m, &o) != 0)   /* dirty + processing */
        _exit(3);
    o.priority = prio > 0 ? prio - 2 : 0;
    if (wq_add_opts(c, newkey, strlen(newkey), &o) != 0)
        _exit(4);
    _exit(0);   /* no wq_close: a crash */
}

/* Delays and failure counts: a key waiting an hour, one kept idle only
   for its failure count (retained after its wq_done), and one rate
   limited with 12 failures (waiting 5 ms * 2^12). Hands out what is
   queued until the two rate-limited keys came back; every other key it
   got is re-added (processing and dirty: requeued when p closes). */
static void delays(wq *p, const char *delayed, const char *ret, const char *limited)
{
    char buf[64];
    size_t rl = strlen(ret), ll = strlen(limited);
    if (wq_add_after(p, delayed, strlen(delayed), 3600ull * 1000000000ull) < 0 ||
        wq_add_rate_limited(p, ret, rl) < 0)
        die("delayed adds");
    for (int i = 0; i < 12; i++)
        if (wq_add_rate_limited(p, limited, ll) < 0)   /* merged: failures 12 */
            die("wq_add_rate_limited");
    for (int i = 0; i < 200; i++) {   /* both are ready after 5 ms */
        usleep(1000);
        struct wq_stats ws;
        if (wq_stats(p, &ws) == 0 && ws.waiting <= 1)
            break;
    }
    for (int todo = 2; todo > 0;) {   /* hand out the queue until both came */
        int n = wq_get(p, buf, sizeof buf, 0);
        if (n <= 0)
            die("%s/%s never became ready: %s", ret, limited, wq_strerror(n));
        if (((size_t)n == rl && memcmp(buf, ret, rl) == 0) ||
            ((size_t)n == ll && memcmp(buf, limited, ll) == 0)) {
            if (wq_done(p, buf, (size_t)n) != 0)
                die("wq_done(%.*s)", n, buf);
            if ((size_t)n == ll && memcmp(buf, limited, ll) == 0 &&
                wq_add_rate_limited(p, buf, (size_t)n) < 0)
                die("wq_add_rate_limited(%s)", limited);
            todo--;
            continue;
        }
        add_key(p, buf, (size_t)n);   /* keep it live: dirty, requeued at close */
    }
}

static void populate_default(wq *p, const char *seedname, struct image *im)
{
    char buf[64];
    for (int i = 0; i < 24; i++) {
        int n = snprintf(buf, sizeof buf, "key-%02d", i);
        add_key(p, buf, (size_t)n);
    }
    add_key(p, "\0bin\0key", 8);
    add_key(p, "0123456789abcdef0123456789abcdefghijklmn", 40);   /* exactly max_key_len */
    add_key(p, "a-key-of-twenty-byte", 20);
    int n = get_key(p, buf);               /* key-00: done -> freed */
    if (wq_done(p, buf, (size_t)n) != 0)
        die("wq_done");
    get_key(p, buf);                       /* key-01: held until close */

    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0)                          /* slot 1: dies holding keys */
        dying_child(seedname, "child-new", 0);
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        die("builder child failed (status 0x%x)", st);

    int rc = wq_open(seedname, NULL, &im->live_holder);   /* slot 2: lives on */
    if (rc < 0)
        die("wq_open(live): %s", wq_strerror(rc));
    get_key(im->live_holder, buf);                    /* key-05 */
    n = get_key(im->live_holder, buf);                /* key-06 */
    add_key(im->live_holder, buf, (size_t)n);         /* dirty + processing */
    add_key(p, "late-1", 6);
    /* Results: key-07 failed with a message in the key arena, key-08
       succeeded with one in its slot; both idle (RETAINED). */
    n = get_key(p, buf);
    if (wq_finish(p, buf, (size_t)n, 2, "failed: a message long enough for the arena") != 0)
        die("wq_finish(%.*s)", n, buf);
    n = get_key(p, buf);
    if (wq_finish(p, buf, (size_t)n, 0, "ok") != 0)
        die("wq_finish(%.*s)", n, buf);
    delays(p, "delayed-1", "ret-1", "limited-1");
}

static void populate_fair(wq *p, const char *seedname, struct image *im)
{
    char buf[64];
    /* Delays first, while the queue is empty (its hand-outs take only the
       two rate-limited keys). */
    delays(p, "ns-a/delayed", "ns-r/ret", "ns-r/limited");
    /* Tenants a..e and keys of no tenant, priorities -1..5. */
    for (int i = 0; i < 8; i++) {
        snprintf(buf, sizeof buf, "ns-a/x%d", i);
        add_str(p, buf, 0);
    }
    for (int i = 0; i < 4; i++) {
        snprintf(buf, sizeof buf, "ns-b/y%d", i);
        add_str(p, buf, 1);
        snprintf(buf, sizeof buf, "ns-c/z%d", i);
        add_str(p, buf, -1);
    }
    add_str(p, "ns-d/w0", 5);
    add_str(p, "solo", 0);                       /* no separator: its own tenant */
    add_prio(p, "\0bin/\0key", 9, 1);            /* NUL bytes, tenant "\0bin" */
    add_str(p, "ns-e/0123456789abcdef0123456789abcdefghi", 2);  /* exactly max_key_len */
    add_str(p, "ns-e/a-key-of-20-byt", 1);
    for (int i = 0; i < 3; i++) {                /* a tenant with a backlog */
        snprintf(buf, sizeof buf, "ns-b/q%d", i);
        add_str(p, buf, 1);
    }
    /* Merges: a queued key keeps the higher priority (raised in heap P). */
    add_str(p, "ns-c/z2", 3);
    add_str(p, "ns-d/w0", 1);
    add_str(p, "ns-a/x6", 2);

    int n = get_key(p, buf);                     /* done -> freed */
    if (wq_done(p, buf, (size_t)n) != 0)
        die("wq_done");
    n = get_key(p, buf);                         /* held until close; re-added */
    add_prio(p, buf, (size_t)n, 4);

    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0)                                /* slot 1: dies holding keys */
        dying_child(seedname, "ns-f/child", 4);
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        die("builder child failed (status 0x%x)", st);

    int rc = wq_open(seedname, NULL, &im->live_holder);   /* slot 2: lives on */
    if (rc < 0)
        die("wq_open(live): %s", wq_strerror(rc));
    get_key(im->live_holder, buf);
    n = get_key(im->live_holder, buf);
    add_prio(im->live_holder, buf, (size_t)n, -2);   /* dirty + processing */
    add_str(p, "ns-a/late", 0);
    /* A waiting key with a priority: it keeps it when it fires. */
    struct wq_add_opts o = { .priority = 3, .after_ns = 3600ull * 1000000000ull };
    if (wq_add_opts(p, "ns-b/later", 10, &o) < 0)
        die("wq_add_opts(after)");
    /* More hand-outs than fair_share: the oldest key's share was taken. */
    struct wq_stats ws;
    if (wq_stats(p, &ws) != 0 || ws.queued < 12)
        die("fair image: too few queued (%llu)", (unsigned long long)ws.queued);
    for (unsigned i = 0; i < FAIR_SHARE + 2; i++) {
        n = get_key(p, buf);
        if (i % 3 == 0)
            add_prio(p, buf, (size_t)n, (int)i % 4);   /* re-added, requeued at close */
        else if (wq_done(p, buf, (size_t)n) != 0)
            die("wq_done");
    }
    add_str(p, "ns-e/new", -1);
    add_str(p, "ns-c/z9", 2);
}

struct find_ctx {
    struct image *im;
    pid_t child;
    int nqueued;
};

static void copy_key(char *dst, const struct wq_key_info *ki)
{
    size_t n = ki->len <= MAX_KEY_LEN ? ki->len : MAX_KEY_LEN;
    memcpy(dst, ki->key, n);
    dst[n] = 0;
}

static int find_cb(const struct wq_key_info *ki, void *arg)
{
    struct find_ctx *c = arg;
    if (memchr(ki->key, 0, ki->len))
        return 0;   /* the harness passes keys as C strings */
    if ((ki->state & WQ_KEY_PROCESSING) && ki->owner_pid == c->child && !c->im->dead_key[0])
        copy_key(c->im->dead_key, ki);
    else if ((ki->state & WQ_KEY_PROCESSING) && ki->owner_pid == getpid() &&
             !c->im->live_key[0])
        copy_key(c->im->live_key, ki);
    else if ((ki->state & WQ_KEY_QUEUED) && c->nqueued < 2 && ki->position >= 3)
        copy_key(c->im->queued_key[c->nqueued++], ki);
    return 0;
}

static void build_image(struct image *im, bool fair)
{
    char seedname[64], seedpath[128];
    snprintf(seedname, sizeof seedname, "fuzzseed-%d", (int)getpid());
    snprintf(seedpath, sizeof seedpath, "/dev/shm/wq.%s", seedname);
    wq_unlink(seedname);
    im->fair = fair;
    im->mode = fair ? "fair" : "default";

    struct wq_options o = { 0 };
    o.capacity = CAPACITY;
    o.max_key_len = MAX_KEY_LEN;
    o.max_procs = MAX_PROCS;
    o.flags = WQ_CREATE | WQ_EXCL | (fair ? WQ_FAIR : 0);
    wq *p;
    int rc = wq_open(seedname, &o, &p);   /* slot 0 */
    if (rc < 0)
        die("wq_open(create): %s", wq_strerror(rc));
    if (fair)
        populate_fair(p, seedname, im);
    else
        populate_default(p, seedname, im);
    wq_close(p);                          /* its keys requeued, slot 0 free */

    wq *lh = im->live_holder;
    if (wq_check(lh, 0) != 0)
        die("the %s image does not check clean", im->mode);
    struct wq_stats vs;
    if (wq_stats(lh, &vs) != 0 || vs.waiting < 2 || vs.processing < 5 || vs.queued < 10 ||
        vs.failing < 1 || vs.fair != fair)
        die("the %s image lacks state: queued %llu processing %llu waiting %llu", im->mode,
            (unsigned long long)vs.queued, (unsigned long long)vs.processing,
            (unsigned long long)vs.waiting);
    /* Default image: two adds published to the live holder's lane
       (lanes.c) and not applied: nothing locks before the bytes are
       read. */
    if (!fair && (wq_add_publish(lh, "pub-1", 5) != 0 || wq_add_publish(lh, "pub-2", 5) != 0))
        die("wq_add_publish");

    int fd = open(seedpath, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0)
        die("open %s", seedpath);
    im->size = (size_t)sb.st_size;
    im->bytes = malloc(im->size);
    if (!im->bytes || pread(fd, im->bytes, im->size, 0) != (ssize_t)im->size)
        die("read %s", seedpath);
    close(fd);

    /* The keys the calls on a mutated image aim at (before the lock
       holder below dies: the next locker reaps the dead child). */
    const struct wq_geom *vg = (const struct wq_geom *)im->bytes;
    struct find_ctx fc = { .im = im,
                           .child = ((const struct wq_proc *)(im->bytes + vg->off_procs))[1].pid };
    if (wq_dump(lh, find_cb, &fc) != 0 || !im->dead_key[0] || !im->live_key[0] ||
        fc.nqueued < 2)
        die("the %s image lacks held or queued keys", im->mode);

    /* A process that dies holding the region lock: its bytes (owner-died
       word, set by the kernel) are the template for flag bit 2. */
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        int f = open(seedpath, O_RDWR | O_CLOEXEC);
        if (f < 0)
            _exit(1);
        struct wq_hdr *h = mmap(NULL, im->size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
        if (h == MAP_FAILED || pthread_mutex_lock(&h->lock) != 0)
            _exit(2);
        _exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        die("lock-holder child failed (status 0x%x)", st);
    fd = open(seedpath, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || pread(fd, im->dead_lock, sizeof im->dead_lock,
                        offsetof(struct wq_hdr, lock)) != (ssize_t)sizeof im->dead_lock)
        die("read lock");
    close(fd);
    uint32_t w;
    memcpy(&w, im->dead_lock, 4);
    if (!(w & FUTEX_OWNER_DIED_BIT))
        die("dead lock template is not owner-died (0x%x)", w);
    wq_unlink(seedname);

    memcpy(&im->g, im->bytes, sizeof im->g);
    if (im->g.max_procs != MAX_PROCS || im->g.total_size != im->size || im->size > 0xffffff ||
        !!(im->g.flags & WQ_FAIR) != fair || (fair && im->g.fair_share != FAIR_SHARE))
        die("unexpected geometry (size %zu, total %llu)", (size_t)im->size, (unsigned long long)im->g.total_size);
    /* Nobody held the region lock at the snapshot: its bytes are the
       unlocked template used for a live-held lease on a non-LIVE slot. */
    memcpy(im->unlocked_mutex, im->bytes + offsetof(struct wq_hdr, lock),
           sizeof im->unlocked_mutex);
    memcpy(&w, im->unlocked_mutex, 4);
    if (w != 0)
        die("region lock held at snapshot");
    const struct wq_proc *pr = (const struct wq_proc *)(im->bytes + im->g.off_procs);
    /* Owner-died, or unlocked by a liveness probe that found it so (the
       builder's wq_stats counts live handles): either way a LIVE slot
       whose holder is gone. */
    memcpy(&w, &pr[1].lease, 4);
    if (pr[1].state != WQ_PROC_LIVE || (!(w & FUTEX_OWNER_DIED_BIT) && w != 0))
        die("slot 1 is not a dead holder's (state %u, lease 0x%x)", pr[1].state, w);
    memcpy(&w, &pr[2].lease, 4);
    if (!(w & FUTEX_TID_MASK_BITS) || (w & FUTEX_OWNER_DIED_BIT))
        die("slot 2 lease not held (0x%x)", w);

    if (fair) {
        const struct wq_hdr *h = (const struct wq_hdr *)im->bytes;
        if (h->fq_count < 10 || h->fair_ticks <= FAIR_SHARE ||
            (h->ring_pos >> 32) != 0)
            die("the fair image lacks fair state: fq_count %u fair_ticks %u", h->fq_count,
                h->fair_ticks);
    }
}

/* ------------------------------------------------------------------ */
/* Seed corpus                                                         */
/* ------------------------------------------------------------------ */

struct seedbuf {
    uint8_t b[2048];
    size_t n;
};

static void sb_put(struct seedbuf *s, const void *p, size_t n)
{
    if (s->n + n > sizeof s->b)
        die("seed too long");
    memcpy(s->b + s->n, p, n);
    s->n += n;
}

/* One patch record: write (op 0), xor (1), fill (2) or add (3). */
static void sb_rec(struct seedbuf *s, size_t off, int op, size_t n, const void *data,
                   size_t dlen, bool late)
{
    if (off > 0xffffff)
        die("seed offset %zu beyond 24 bits", off);
    uint8_t r[4] = { (uint8_t)off, (uint8_t)(off >> 8), (uint8_t)(off >> 16),
                     (uint8_t)((late ? 0x80 : 0) | (op << 5) | ((n - 1) & 31)) };
    sb_put(s, r, 4);
    sb_put(s, data, dlen);
}

/* Write a LE u32 at off. */
static void sb_u32(struct seedbuf *s, size_t off, uint32_t v, bool late)
{
    uint8_t b[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24) };
    sb_rec(s, off, 0, 4, b, 4, late);
}

/* Fill [off, end of the image) with byte v: fill records (n * 8 bytes),
   then single-byte writes for the rest (offsets wrap, so none may pass
   the end). */
static void fill_to_end(struct seedbuf *s, const struct image *im, size_t off, uint8_t v)
{
    while (off < im->size) {
        size_t rem = im->size - off, n = rem / 8 < 32 ? rem / 8 : 32;
        if (n == 0) {
            uint8_t b[8];
            memset(b, v, sizeof b);
            sb_rec(s, off, 0, rem, b, rem, false);
            break;
        }
        sb_rec(s, off, 2, n, &v, 1, false);
        off += n * 8;
    }
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

#define SEED(fname, flags, body)                                                   \
    do {                                                                           \
        memset(&s, 0, sizeof s);                                                   \
        uint8_t f_ = (uint8_t)(flags);                                             \
        sb_put(&s, &f_, 1);                                                        \
        body;                                                                      \
        write_seed(dir, fname, &s);                                                \
    } while (0)
#define ESZ(field) sizeof(((struct wq_entry *)0)->field)

/* The seeds of both images that mean the same thing (prefix "" for the
   default image, "fair-" and flag bit 4 for the fair one). */
static void common_seeds(const char *dir, const struct image *im)
{
    const size_t busy = offsetof(struct wq_hdr, busy);
    const size_t pos = offsetof(struct wq_hdr, ring_pos);
    const size_t ent = im->g.off_entries, esz = im->g.entry_size;
    const size_t prc = im->g.off_procs, psz = sizeof(struct wq_proc);
    const uint8_t one[4] = { 1, 0, 0, 0 }, zero[4] = { 0 }, wrap[4] = { 0xf5, 0xff, 0xff, 0xff };
    const uint8_t ff[2] = { 0xff, 0xff }, qd[2] = { WQ_ST_QUEUED, 0 }, seven[4] = { 7, 0, 0, 0 };
    const uint8_t x8[8] = { 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a, 0x5a };
    const uint8_t fb = im->fair ? FLAG_FAIR : 0;
    const char *px = im->fair ? "fair-" : "";
    char fname[64];
    struct seedbuf s;
#define NAME(n) (snprintf(fname, sizeof fname, "%s%s", px, n), fname)
    SEED(NAME("clean"), fb, (void)0);
    SEED(NAME("busy"), fb, sb_rec(&s, busy, 0, 4, one, 4, false));
    SEED(NAME("ring-count"), fb, sb_rec(&s, pos + 4, 3, 1, one, 4, false));
    SEED(NAME("len-wrap"), fb, sb_rec(&s, pos + 4, 0, 4, wrap, 4, false));
    SEED(NAME("hash-seed"), fb | FLAG_CHECKSUM,
         sb_rec(&s, offsetof(struct wq_geom, hash_seed), 1, 8, x8, 8, false));
    SEED(NAME("entry-state"), fb,
         sb_rec(&s, ent + 3 * esz + offsetof(struct wq_entry, state), 0, ESZ(state), ff,
                ESZ(state), false));
    SEED(NAME("proc-free"), fb,
         sb_rec(&s, prc + 2 * psz + offsetof(struct wq_proc, state), 0, 4, zero, 4, false));
    SEED(NAME("index-zero"), fb, sb_rec(&s, im->g.off_index, 2, 8, zero, 1, false));
    /* The word naming the index in use: another area, and a size. */
    SEED(NAME("index-area"), fb,
         sb_rec(&s, offsetof(struct wq_hdr, index_at) + 4, 0, 4, one, 4, false));
    SEED(NAME("index-size"), fb,
         sb_rec(&s, offsetof(struct wq_hdr, index_at), 0, 4, wrap, 4, false));
    SEED(NAME("ring-area"), fb,
         sb_rec(&s, offsetof(struct wq_hdr, ring_at) + 4, 0, 4, one, 4, false));
    SEED(NAME("ring-size"), fb,
         sb_rec(&s, offsetof(struct wq_hdr, ring_at), 0, 4, wrap, 4, false));
    {
        uint8_t sz[3] = { 0x00, 0x10, 0x00 };   /* 4096 bytes */
        SEED(NAME("truncated"), fb | FLAG_SIZE, sb_put(&s, sz, 3));
    }
    SEED(NAME("dead-lock"), fb | FLAG_DEADLOCK, (void)0);
    SEED(NAME("dead-lock-busy"), fb | FLAG_DEADLOCK,
         (sb_rec(&s, busy, 0, 4, one, 4, false),
          sb_rec(&s, ent + 5 * esz + offsetof(struct wq_entry, state), 0, ESZ(state), qd,
                 ESZ(state), false)));
    SEED(NAME("shutdown"), fb | FLAG_SHUTDOWN, (void)0);
    SEED(NAME("late-geometry"), fb,
         sb_rec(&s, offsetof(struct wq_geom, capacity), 3, 1, one, 4, true));
    SEED(NAME("late-entry-run"), fb,
         sb_rec(&s, ent + 6 * esz + offsetof(struct wq_entry, run), 0, ESZ(run), seven,
                ESZ(run), true));
    if (!im->fair) {   /* the key arena: its block 0 is live (a run record) */
        const size_t r0 = im->g.off_results, kf = im->g.off_kfree;
        SEED("msg-block-far", 0, sb_u32(&s, r0 + offsetof(struct wq_rslot, m), 0xfffffff0u, false));
        SEED("msg-len-max", 0, sb_u32(&s, r0 + offsetof(struct wq_rslot, msglen), 0xffffu, false));
        SEED("msg-len-late", 0, sb_u32(&s, r0 + offsetof(struct wq_rslot, msglen), 200, true));
        SEED("kfree-head-far", 0, sb_u32(&s, kf + 4 * 6, 0x7fffffffu, false));
        SEED("kfree-head-live", 0, sb_u32(&s, kf + 4 * 6, 1, false));
        SEED("key-top-zero", FLAG_DEADLOCK,
             (sb_u32(&s, offsetof(struct wq_hdr, k_top), 0, false),
              sb_rec(&s, busy, 0, 4, one, 4, false)));
        SEED("key-top-far", 0, sb_u32(&s, offsetof(struct wq_hdr, k_top), 0xfffffff0u, false));
        /* Lane 0: the live holder's, holding pub-1 and pub-2 unapplied. */
        const size_t l0 = im->g.off_lanes;
        SEED("lane-tail-far", 0, sb_u32(&s, l0 + offsetof(struct wq_lane, tl), 0x7ffffff0u, false));
        SEED("lane-head-past", 0, sb_u32(&s, l0 + offsetof(struct wq_lane, head), 9, false));
        SEED("lane-len-max", 0, sb_u32(&s, l0 + offsetof(struct wq_lane, s), 0xffffu, false));
        SEED("lane-owner-far", 0, sb_u32(&s, l0 + offsetof(struct wq_lane, owner), 200, false));
        SEED("lane-pending-all", 0,
             sb_u32(&s, offsetof(struct wq_hdr, lanes_pending), 0xffffffffu, false));
        SEED("lane-tail-late", 0, sb_u32(&s, l0 + offsetof(struct wq_lane, tl), 5, true));
    }
#undef NAME
}

/* Index (in the image) of the entry holding key k, or die. */
static uint32_t entry_of(const struct image *im, const char *k)
{
    size_t n = strlen(k);
    for (uint32_t i = 0; i < im->g.capacity; i++) {
        const struct wq_entry *e =
            (const struct wq_entry *)(im->bytes + im->g.off_entries + (size_t)i * im->g.entry_size);
        /* a long key's first 12 bytes are in its entry, the rest in the
           arena (layout.h) */
        const unsigned char *rest =
            n <= WQ_KEY_INLINE ? e->k.in
                               : im->bytes + im->g.off_keys + (uint64_t)e->k.block * WQ_KEY_GRAIN;
        if (e->state && e->keylen == n &&
            (n <= WQ_KEY_INLINE ? memcmp(rest, k, n) == 0
                                : memcmp(e->k.pre, k, WQ_KEY_PRE) == 0 &&
                                      (uint64_t)(rest - im->bytes) + n - WQ_KEY_PRE <= im->size &&
                                      memcmp(rest, k + WQ_KEY_PRE, n - WQ_KEY_PRE) == 0))
            return i;
    }
    die("no entry for %s", k);
}

/* Targeted seeds of the fair image: the fair heaps' bounds, positions,
   count, ticks and tags. */
static void fair_seeds(const char *dir, const struct image *im)
{
    const struct wq_hdr *h = (const struct wq_hdr *)im->bytes;
    const size_t fx = im->g.off_fx, fxs = sizeof(struct wq_fx);
    const size_t hp = im->g.off_fheap_p, ha = im->g.off_fheap_a, tags = im->g.off_ftags;
    const size_t fqc = offsetof(struct wq_hdr, fq_count);
    const size_t ticks = offsetof(struct wq_hdr, fair_ticks);
    const size_t ent = im->g.off_entries, esz = im->g.entry_size;
    const uint32_t n = h->fq_count, cap = im->g.capacity;
    const uint32_t *heap_p = (const uint32_t *)(im->bytes + hp);
    const uint32_t top = heap_p[0], last = heap_p[n - 1], mid = heap_p[n / 2];
    const uint32_t dead = entry_of(im, im->dead_key);
    const uint8_t fb = FLAG_FAIR;
    const uint8_t ff8[8] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
    const uint8_t ffff[2] = { 0xff, 0xff }, big[4] = { 0x00, 0x00, 0x01, 0x00 };
    const uint8_t two[4] = { 2, 0, 0, 0 }, one[4] = { 1, 0, 0, 0 };
    struct seedbuf s;
    /* A heap entry index of exactly capacity: the first index past the
       entries, the classic off-by-one. In P at the top, the middle and
       the last member; in A likewise. */
    SEED("fair-heap-p-top-cap", fb, sb_u32(&s, hp, cap, false));
    SEED("fair-heap-p-mid-cap", fb, sb_u32(&s, hp + 4 * (n / 2), cap, false));
    SEED("fair-heap-p-last-cap", fb, sb_u32(&s, hp + 4 * (n - 1), cap, false));
    SEED("fair-heap-a-top-cap", fb, sb_u32(&s, ha, cap, false));
    SEED("fair-heap-a-last-cap", fb, sb_u32(&s, ha + 4 * (n - 1), cap, false));
    /* One past the members: n counts one member more than the array holds. */
    SEED("fair-heap-p-past-n", fb, (sb_u32(&s, hp + 4 * n, cap, false),
                                    sb_u32(&s, fqc, n + 1, false)));
    /* Far out of range, and all ones. */
    SEED("fair-heap-p-far", fb, sb_u32(&s, hp + 4, 0x7fffffffu, false));
    SEED("fair-heap-a-far", fb, sb_u32(&s, ha + 4 * (n / 2), 0xfffffffeu, false));
    SEED("fair-heaps-fill", fb, (sb_rec(&s, hp, 2, 8, ffff, 1, false),
                                 sb_rec(&s, ha, 2, 8, ffff, 1, false)));
    /* fq_count: above capacity, at capacity (a push must refuse: the
       next slot is past the heap array), far out, and zero. */
    SEED("fair-fq-count-cap", fb, sb_u32(&s, fqc, cap, false));
    SEED("fair-fq-count-over", fb, sb_u32(&s, fqc, cap + 1, false));
    SEED("fair-fq-count-far", fb, sb_u32(&s, fqc, 0xffffffffu, false));
    SEED("fair-fq-count-zero", fb, sb_u32(&s, fqc, 0, false));
    SEED("fair-fq-count-late", fb, sb_u32(&s, fqc, cap + 7, true));
    /* Heap positions (fx.hp, fx.ha) that point elsewhere: another member's
       position, one past the members, capacity, all ones. */
    SEED("fair-hp-other", fb,
         sb_u32(&s, fx + top * fxs + offsetof(struct wq_fx, hp), n - 1, false));
    SEED("fair-hp-past", fb,
         sb_u32(&s, fx + mid * fxs + offsetof(struct wq_fx, hp), n, false));
    SEED("fair-ha-cap", fb,
         sb_u32(&s, fx + last * fxs + offsetof(struct wq_fx, ha), cap, false));
    SEED("fair-ha-far", fb,
         sb_u32(&s, fx + top * fxs + offsetof(struct wq_fx, ha), 0xffffffffu, false));
    SEED("fair-hp-swap", fb,
         (sb_u32(&s, fx + top * fxs + offsetof(struct wq_fx, hp), 1, false),
          sb_u32(&s, fx + heap_p[1] * fxs + offsetof(struct wq_fx, hp), 0, false)));
    SEED("fair-hp-late", fb,
         sb_u32(&s, fx + top * fxs + offsetof(struct wq_fx, hp), cap, true));
    /* Two members that are the same entry. */
    SEED("fair-heap-p-dup", fb, sb_u32(&s, hp + 4, top, false));
    /* Order: priorities at the extremes, tags wrapped. */
    SEED("fair-prio-max", fb,
         sb_u32(&s, fx + last * fxs + offsetof(struct wq_fx, prio), 0x7fffffffu, false));
    SEED("fair-prio-min", fb,
         sb_u32(&s, fx + top * fxs + offsetof(struct wq_fx, prio), 0x80000000u, false));
    SEED("fair-tag-max", fb,
         sb_rec(&s, fx + mid * fxs + offsetof(struct wq_fx, tag), 0, 8, ff8, 8, false));
    SEED("fair-tenant-len", fb,
         sb_u32(&s, fx + top * fxs + offsetof(struct wq_fx, tenant_len), 0xffffffffu, false));
    /* The oldest-key share: the next hand-out takes A's top (ticks + 1 a
       multiple of fair_share), ticks about to wrap, fair_share itself
       (geometry, checksum redone): 1 (valid: always the oldest), 0 and
       a huge one. */
    SEED("fair-ticks-share", fb, sb_u32(&s, ticks, FAIR_SHARE - 1, false));
    SEED("fair-ticks-wrap", fb, sb_u32(&s, ticks, 0xffffffffu, false));
    SEED("fair-ticks-share-bad-a", fb,
         (sb_u32(&s, ticks, FAIR_SHARE - 1, false), sb_u32(&s, ha, cap, false)));
    SEED("fair-share-one", fb | FLAG_CHECKSUM,
         sb_u32(&s, offsetof(struct wq_geom, fair_share), 1, false));
    SEED("fair-share-zero", fb | FLAG_CHECKSUM,
         sb_u32(&s, offsetof(struct wq_geom, fair_share), 0, false));
    SEED("fair-share-huge", fb | FLAG_CHECKSUM,
         sb_u32(&s, offsetof(struct wq_geom, fair_share), 0xffffffffu, false));
    SEED("fair-share-late", fb, sb_u32(&s, offsetof(struct wq_geom, fair_share), 0, true));
    SEED("fair-tenant-sep-none", fb | FLAG_CHECKSUM,
         sb_u32(&s, offsetof(struct wq_geom, tenant_sep), 0xffffffffu, false));
    SEED("fair-tenant-sep-bad", fb | FLAG_CHECKSUM,
         sb_u32(&s, offsetof(struct wq_geom, tenant_sep), 256, false));
    SEED("fair-ftag-slots", fb | FLAG_CHECKSUM,
         sb_u32(&s, offsetof(struct wq_geom, ftag_slots), 1u << 20, false));
    /* The tenant tag table and the virtual times in it: all ones (the
       next tag wraps to 0). */
    SEED("fair-tags-max", fb, sb_rec(&s, tags, 2, 32, ff8, 1, false));
    SEED("fair-vtime", fb, sb_rec(&s, offsetof(struct wq_hdr, fair_vtime), 0, 8, ff8, 8, false));
    /* The ring in fair mode (unused there): a count and members. */
    SEED("fair-ring-count", fb,
         (sb_u32(&s, offsetof(struct wq_hdr, ring_pos) + 4, 3, false),
          sb_rec(&s, im->g.off_ring, 2, 1, two, 1, false)));
    /* A QUEUED entry missing from the heaps, and a member that is not
       queued (processing: the dead child's key). */
    SEED("fair-member-not-queued", fb, sb_u32(&s, hp + 4 * (n - 1), dead, false));
    SEED("fair-queued-missing", fb, sb_u32(&s, fqc, n - 1, false));
    /* The dead child's key: a key length beyond max_key_len when its
       requeue gives it a new tag (tenant_len from the key), and a bad
       owner. */
    SEED("fair-dead-keylen", fb,
         sb_rec(&s, ent + dead * esz + offsetof(struct wq_entry, keylen), 0, ESZ(keylen), big,
                ESZ(keylen), false));
    SEED("fair-dead-keylen-max", fb,
         sb_rec(&s, ent + dead * esz + offsetof(struct wq_entry, keylen), 0, ESZ(keylen), ffff,
                ESZ(keylen), false));
    /* The same with a separator found nowhere after the key (tenant_sep
       is geometry: checksum redone), while the first locker (wq_open's
       registration) finds the lock owner dead and reaps the dead child,
       at shutdown (so its keys are queued at once, with new tags). */
    SEED("fair-dead-keylen-sep", fb | FLAG_CHECKSUM | FLAG_DEADLOCK,
         (sb_rec(&s, ent + dead * esz + offsetof(struct wq_entry, keylen), 0, ESZ(keylen), ffff,
                 ESZ(keylen), false),
          sb_u32(&s, offsetof(struct wq_geom, tenant_sep), 0xfe, false),
          sb_u32(&s, offsetof(struct wq_hdr, shutdown), 1, false)));
    /* And with no such byte anywhere after the key: every byte from the
       key to the end of the region filled (the scan then leaves the
       mapping unless bounded by max_key_len). */
    SEED("fair-dead-keylen-overread", fb | FLAG_CHECKSUM | FLAG_DEADLOCK,
         (sb_rec(&s, ent + dead * esz + offsetof(struct wq_entry, keylen), 0, ESZ(keylen), ffff,
                 ESZ(keylen), false),
          sb_u32(&s, offsetof(struct wq_geom, tenant_sep), 0xfe, false),
          sb_u32(&s, offsetof(struct wq_hdr, shutdown), 1, false), fill_to_end(&s, im,
          ent + dead * esz + offsetof(struct wq_entry, k), 'A')));
    SEED("fair-dead-lock-heaps", fb | FLAG_DEADLOCK,
         (sb_rec(&s, offsetof(struct wq_hdr, busy), 0, 4, one, 4, false),
          sb_u32(&s, hp, cap, false), sb_u32(&s, fqc, cap + 1, false)));
}

/* FUZZ_WRITE_SEEDS=dir: write the seed corpus for the layout this harness
   was built against (offsets from layout.h and the valid images), then
   exit. tests/fuzz-corpus holds its output; regenerate it when the layout
   changes. */
static void write_seeds(const char *dir)
{
    common_seeds(dir, &images[IMG_DEFAULT]);
    common_seeds(dir, &images[IMG_FAIR]);
    fair_seeds(dir, &images[IMG_FAIR]);
    fprintf(stderr, "fuzz-region: seeds written to %s\n", dir);
}
#undef SEED
#undef ESZ

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

/* Byte 0, with FUZZ_MODE applied. */
static uint8_t input_flags(const uint8_t *d, size_t n)
{
    uint8_t f = n > 0 ? d[0] : 0;
    if (force_mode == IMG_DEFAULT)
        f &= (uint8_t)~FLAG_FAIR;
    else if (force_mode == IMG_FAIR)
        f |= FLAG_FAIR;
    return f;
}

/* Is byte `off` of the region part of a mutex (out of scope)? */
static bool in_mutex(const struct image *im, size_t off)
{
    size_t l = offsetof(struct wq_hdr, lock);
    if (off >= l && off < l + sizeof(pthread_mutex_t))
        return true;
    if (off < im->g.off_procs ||
        off >= im->g.off_procs + (size_t)im->g.max_procs * sizeof(struct wq_proc))
        return false;
    size_t rel = (off - im->g.off_procs) % sizeof(struct wq_proc);
    return rel >= offsetof(struct wq_proc, lease) &&
           rel < offsetof(struct wq_proc, lease) + sizeof(pthread_mutex_t);
}

static void put(const struct image *im, unsigned char *img, size_t size, size_t off,
                unsigned char v, int op, bool late)
{
    if (off >= size || (late && (in_mutex(im, off) || (off >= own_lo && off < own_hi))))
        return;
    if (op == 1)
        img[off] ^= v;
    else
        img[off] = v;
}

/* FUZZ_VERBOSE: where a record lands, for reading a finding's input. */
static void describe(const struct image *im, size_t off, int op, size_t len, bool late)
{
    const struct wq_geom *g = &im->g;
    const struct {
        const char *name;
        size_t lo, esz, n;
    } sec[] = {
        { "hdr", 0, 1, sizeof(struct wq_hdr) },
        { "geom", 0, 1, sizeof(struct wq_geom) },
        { "procs", g->off_procs, sizeof(struct wq_proc), g->max_procs },
        { "entries", g->off_entries, g->entry_size, g->capacity },
        { "index", g->off_index, sizeof(struct wq_islot), g->index_max },
        { "index_b", g->off_index_b, sizeof(struct wq_islot), g->index_max },
        { "ring", g->off_ring, 4, g->capacity },
        { "ring_b", g->off_ring_b, 4, g->capacity },
        { "heap", g->off_heap, 4, g->capacity },
        { "results", g->off_results, sizeof(struct wq_rslot), g->result_capacity },
        { "fx", g->off_fx, sizeof(struct wq_fx), im->fair ? g->capacity : 0 },
        { "fheap_p", g->off_fheap_p, 4, im->fair ? g->capacity : 0 },
        { "fheap_a", g->off_fheap_a, 4, im->fair ? g->capacity : 0 },
        { "ftags", g->off_ftags, 8, g->ftag_slots },
        { "kfree", g->off_kfree, 4, g->key_classes },
        { "keys", g->off_keys, WQ_KEY_GRAIN, g->key_max },
        { "lanes", g->off_lanes, sizeof(struct wq_lane),
          (uint32_t)((g->off_keys - g->off_lanes) / sizeof(struct wq_lane)) },
    };
    static const char *const ops[] = { "write", "xor", "fill", "add" };
    size_t span = op == 2 ? len * 8 : op == 3 ? 4 : len;
    for (size_t i = sizeof sec / sizeof sec[0]; i-- > 0;) {
        if (off >= sec[i].lo && off < sec[i].lo + sec[i].esz * sec[i].n) {
            size_t rel = off - sec[i].lo;
            fprintf(stderr, "  %s%s %zu bytes at %zu: %s[%zu]+%zu\n", late ? "late " : "",
                    ops[op], span, off, sec[i].name, rel / sec[i].esz, rel % sec[i].esz);
            return;
        }
    }
    fprintf(stderr, "  %s%s %zu bytes at %zu: padding\n", late ? "late " : "", ops[op], span,
            off);
}

/* Apply the early (late == false) or late records of the patch list to
   img (size bytes), a copy or a mapping of image im. */
static void apply_records(const struct image *im, unsigned char *img, size_t size,
                          const uint8_t *d, size_t n, bool late)
{
    const size_t vs = im->size;
    size_t i = 1;
    if (n > 0 && (d[0] & FLAG_SIZE))
        i += 3;
    while (i + 4 <= n) {
        size_t off = ((size_t)d[i] | (size_t)d[i + 1] << 8 | (size_t)d[i + 2] << 16) % vs;
        uint8_t ctl = d[i + 3];
        i += 4;
        size_t len = (size_t)(ctl & 31) + 1;
        int op = (ctl >> 5) & 3;
        bool mine = ((ctl & 0x80) != 0) == late;
        if (mine && verbose)
            describe(im, off, op, len, late);
        switch (op) {
        case 0:
        case 1:
            for (size_t k = 0; k < len && i < n; k++, i++)
                if (mine)
                    put(im, img, size, (off + k) % vs, d[i], op, late);
            break;
        case 2:
            if (i < n) {
                for (size_t k = 0; k < len * 8 && mine; k++)
                    put(im, img, size, (off + k) % vs, d[i], op, late);
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
                    put(im, img, size, off + (size_t)b, (unsigned char)(v >> (8 * b)), 0, late);
            }
            i += 4;
            break;
        }
    }
}

static bool has_late(const uint8_t *d, size_t n)
{
    size_t i = (n > 0 && (d[0] & FLAG_SIZE)) ? 4 : 1;
    while (i + 4 <= n) {
        uint8_t ctl = d[i + 3];
        if (ctl & 0x80)
            return true;
        i += 4;
        int op = (ctl >> 5) & 3;
        i += op == 3 ? 4 : op == 2 ? 1 : (size_t)(ctl & 31) + 1;
    }
    return false;
}

/* Apply the early records to the image; returns the file size to write. */
static size_t mutate(const struct image *im, unsigned char *img, const uint8_t *d, size_t n)
{
    size_t fsize = im->size;
    uint8_t flags = input_flags(d, n);
    if ((flags & FLAG_SIZE) && n >= 4)
        fsize = (size_t)d[1] | (size_t)d[2] << 8 | (size_t)d[3] << 16;
    apply_records(im, img, im->size, d, n, false);
    /* Mutex words are out of scope (see the top of the file). */
    memcpy(img + offsetof(struct wq_hdr, lock),
           (flags & FLAG_DEADLOCK) ? im->dead_lock : im->bytes + offsetof(struct wq_hdr, lock),
           sizeof(pthread_mutex_t));
    struct wq_proc *pr = (struct wq_proc *)(img + im->g.off_procs);
    const struct wq_proc *vp = (const struct wq_proc *)(im->bytes + im->g.off_procs);
    for (uint32_t s = 0; s < im->g.max_procs; s++) {
        uint32_t w;
        memcpy(&w, &vp[s].lease, 4);
        bool live_held = (w & FUTEX_TID_MASK_BITS) && !(w & FUTEX_OWNER_DIED_BIT);
        if (live_held && pr[s].state != WQ_PROC_LIVE)
            memcpy(&pr[s].lease, im->unlocked_mutex, sizeof pr[s].lease);
        else
            memcpy(&pr[s].lease, &vp[s].lease, sizeof pr[s].lease);
    }
    if (flags & FLAG_CHECKSUM) {
        struct wq_geom *g = (struct wq_geom *)img;
        g->checksum = fnv1a(g, offsetof(struct wq_geom, checksum));
    }
    return fsize;
}

static int write_image(const struct image *im, const unsigned char *img, size_t fsize)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    size_t w = fsize < im->size ? fsize : im->size;
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
    bool bad_len, bad_tenant;
};

static int dump_cb(const struct wq_key_info *ki, void *arg)
{
    struct dump_ctx *c = arg;
    c->n++;
    if (ki->len == 0 || ki->len > MAX_KEY_LEN)
        c->bad_len = true;
    if (ki->tenant_len > ki->len)
        c->bad_tenant = true;
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

static int add_s(wq *q, const char *k)
{
    return wq_add(q, k, strlen(k));
}

/* The calls on a possibly corrupt region: any value or -errno, no crash. */
static void exercise(wq *q, const struct image *im)
{
    char buf[64];
    int rc = add_s(q, im->fair ? "ns-z/fz-new" : "fz-new");
    check_errno("wq_add", rc);
    if (rc > 1 || (rc < 0 && !is_key_errno(rc)))
        soft("add-rc", "wq_add returned %d (%s)", rc, wq_strerror(rc));
    rc = add_s(q, im->queued_key[0]);
    check_errno("wq_add", rc);
    if (im->fair) {
        /* A new key with a priority, a merge that raises a queued key
           (heap P moves it up through its recorded position), and a
           short delay (it fires at the next get: promote, new tag). */
        struct wq_add_opts o = { .priority = 6 };
        rc = wq_add_opts(q, "ns-a/fz-prio", 12, &o);
        check_errno("wq_add_opts", rc);
        if (rc > 1 || (rc < 0 && !is_key_errno(rc)))
            soft("add-opts-rc", "wq_add_opts returned %d (%s)", rc, wq_strerror(rc));
        o.priority = 9;
        rc = wq_add_opts(q, im->queued_key[1], strlen(im->queued_key[1]), &o);
        check_errno("wq_add_opts(raise)", rc);
        if (rc > 1 || (rc < 0 && !is_key_errno(rc)))
            soft("add-opts-rc", "wq_add_opts (raise) returned %d (%s)", rc, wq_strerror(rc));
        o.priority = -3;
        o.after_ns = 1;
        rc = wq_add_opts(q, "ns-c/fz-soon", 12, &o);
        check_errno("wq_add_opts(after)", rc);
        if (rc > 1 || (rc < 0 && !is_key_errno(rc)))
            soft("add-opts-rc", "wq_add_opts (after) returned %d (%s)", rc, wq_strerror(rc));
    }
    char qk[MAX_KEY_LEN + 1], bin_default[] = "\0bin\0key", bin_fair[] = "\0bin/\0key";
    memcpy(qk, im->queued_key[1], sizeof qk);
    /* The rate limiter reads shared state (failure counts, the bucket). */
    rc = wq_add_rate_limited(q, im->fair ? "ns-r/fz-rl" : "fz-rl", im->fair ? 10 : 5);
    check_errno("wq_add_rate_limited", rc);
    if (rc > 1 || (rc < 0 && !is_key_errno(rc)))
        soft("add-rc", "wq_add_rate_limited returned %d (%s)", rc, wq_strerror(rc));
    struct iovec iov[3] = { { qk, strlen(qk) },
                            { "fz-many", 7 },
                            { im->fair ? bin_fair : bin_default, im->fair ? 9 : 8 } };
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
    rc = add_s(q, im->dead_key);   /* fair: a re-add gives it a new tag */
    check_errno("wq_add", rc);
    rc = wq_done(q, im->dead_key, strlen(im->dead_key));
    check_errno("wq_done", rc);
    rc = wq_done(q, im->live_key, strlen(im->live_key));
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
    /* A batch: every key handed out lies inside the buffer, with a length
       in 1..max_key_len, and done_many finishes at most that many. */
    char mbuf[4 * MAX_KEY_LEN];
    struct iovec mk[4];
    n = wq_get_many(q, mbuf, sizeof mbuf, mk, 4, 0);
    check_errno("wq_get_many", n);
    if (n > 4 || n == 0)
        soft("get-many-rc", "wq_get_many returned %d for at most 4 keys", n);
    if (n > 0 && n <= 4) {
        size_t used = 0;
        for (int i = 0; i < n; i++) {
            if (mk[i].iov_base != mbuf + used || mk[i].iov_len == 0 ||
                mk[i].iov_len > MAX_KEY_LEN || used + mk[i].iov_len > sizeof mbuf)
                hard("wq_get_many: key %d at offset %td, length %zu, outside the buffer", i,
                     (char *)mk[i].iov_base - mbuf, mk[i].iov_len);
            used += mk[i].iov_len;
        }
        rc = wq_done_many(q, mk, (size_t)n);
        check_errno("wq_done_many", rc);
        if (rc > n)
            soft("done-many-rc", "wq_done_many returned %d for %d keys", rc, n);
    }
    int len = wq_len(q);
    check_errno("wq_len", len);
    if (len < 0 ? len != -EBADMSG : (unsigned)len > CAPACITY)
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
    if (dc.bad_tenant)
        soft("dump-tenant", "wq_dump reported a tenant longer than its key");
    if (dc.n > 2 * CAPACITY)
        soft("dump-count", "wq_dump visited %u keys (capacity %u)", dc.n, CAPACITY);
    (void)wq_shutting_down(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cur_data = data;
    cur_size = size;
    outcome = 0;
    const uint8_t flags = input_flags(data, size);
    const struct image *im = &images[(flags & FLAG_FAIR) ? IMG_FAIR : IMG_DEFAULT];
    img_of_input = im;
    unsigned char *img = malloc(im->size);
    if (!img)
        return 0;
    memcpy(img, im->bytes, im->size);
    size_t fsize = mutate(im, img, data, size);
    bool free_before[MAX_PROCS];
    const struct wq_proc *ipr = (const struct wq_proc *)(img + im->g.off_procs);
    for (uint32_t i = 0; i < MAX_PROCS; i++)
        free_before[i] = ipr[i].state == WQ_PROC_FREE;
    if (write_image(im, img, fsize) < 0) {
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
    if (verbose)
        fprintf(stderr, "  %s image: wq_open %d (%s)\n", im->mode, rc, rc < 0 ? wq_strerror(rc) : "ok");
    if (rc > 0 || rc <= -4096)
        hard("wq_open returned %d", rc);
    if (rc < 0) {
        if (rc != -EPROTO && rc != -EBADMSG && rc != -EUSERS && rc != -ENOMEM &&
            rc != -ENOTRECOVERABLE)
            soft("open-rc", "wq_open returned %d (%s)", rc, wq_strerror(rc));
        unlink(path);
        return 0;
    }
    outcome |= OUT_OPENED;

    /* Late records: corrupt the region behind the attached handle. */
    own_lo = own_hi = 0;
    if (has_late(data, size) && fsize >= im->size) {
        int fd = lfd;
        if (fd >= 0) {
            unsigned char *m = mmap(NULL, im->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (m != MAP_FAILED) {
                /* Our slot: FREE in the image, LIVE with our pid now. */
                const struct wq_proc *pr = (const struct wq_proc *)(m + im->g.off_procs);
                for (uint32_t i = 0; skip_own_slot && i < im->g.max_procs; i++)
                    if (free_before[i] && pr[i].state == WQ_PROC_LIVE &&
                        pr[i].pid == (int32_t)getpid()) {
                        own_lo = im->g.off_procs + i * sizeof(struct wq_proc) +
                                 offsetof(struct wq_proc, state);
                        own_hi = im->g.off_procs + i * sizeof(struct wq_proc) +
                                 offsetof(struct wq_proc, gen) + 4;
                        break;
                    }
                apply_records(im, m, im->size, data, size, true);
                munmap(m, im->size);
            }
        }
    }
    if (lfd >= 0)
        close(lfd);
    if (flags & FLAG_SHUTDOWN) {
        rc = wq_shutdown(q);
        check_errno("wq_shutdown", rc);
    }
    int reported = 0;
    int found = wq_check_report(q, 0, count_line, &reported);
    check_errno("wq_check_report", found);
    if (found != 0)
        outcome |= OUT_FOUND;
    if (verbose)
        fprintf(stderr, "  first check: %d violations\n", found);
    if (found >= 0 && reported != found)
        soft("report-count", "wq_check_report returned %d but reported %d lines", found,
             reported);

    exercise(q, im);

    int repaired = wq_check(q, WQ_CHECK_REPAIR);
    check_errno("wq_check(REPAIR)", repaired);
    if (repaired != 0)
        outcome |= OUT_FOUND;
    if (verbose)
        fprintf(stderr, "  wq_check(REPAIR): %d violations\n", repaired);
    int lines = 0;
    int after = wq_check_report(q, 0, violation_line, &lines);
    if (after != 0)
        hard("wq_check(q, 0) = %d after wq_check(q, WQ_CHECK_REPAIR) = %d "
             "(first check found %d)", after, repaired, found);

    /* A repaired region must work and stay clean. */
    char buf[64];
    struct wq_add_opts ao = { .priority = im->fair ? 1 : 0 };
    rc = wq_add_opts(q, "post-repair", 11, &ao);
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
    int qlen = wq_len(q);
    if (qlen < 0 || (unsigned)qlen > CAPACITY)
        hard("wq_len after repair: %d", qlen);
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

/* ------------------------------------------------------------------ */
/* Deterministic rounds (FUZZ_ROUNDS)                                  */
/* ------------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rnd(void)   /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t below(uint32_t n)
{
    return (uint32_t)(rnd() % n);
}

/* A value that probes bounds. */
static uint32_t probe_value(void)
{
    static const uint32_t v[] = { 0, 1, 2, CAPACITY - 1, CAPACITY, CAPACITY + 1, 2 * CAPACITY,
                                  0x7fffffffu, 0x80000000u, 0xfffffffeu, 0xffffffffu, 0xffffu };
    return below(4) == 0 ? (uint32_t)rnd() : v[below(sizeof v / sizeof v[0])];
}

struct span {
    size_t lo, len;
};

/* A random patch list for image im into buf (at most cap bytes). */
static size_t gen_input(const struct image *im, uint8_t *buf, size_t cap)
{
    const struct wq_geom *g = &im->g;
    const size_t hdr_lo = offsetof(struct wq_hdr, busy);
    /* Sections, by weight below: geometry, mutable header, procs,
       entries, index, ring + delay heap, results, fair sections, the key
       arena's free lists and its first blocks. */
    const struct span sec[] = {
        { 0, sizeof(struct wq_geom) },
        { hdr_lo, sizeof(struct wq_hdr) - hdr_lo },
        { g->off_procs, (size_t)g->max_procs * sizeof(struct wq_proc) },
        { g->off_entries, (size_t)g->capacity * g->entry_size },
        { g->off_index, (size_t)g->index_max * sizeof(struct wq_islot) },
        { g->off_ring, g->off_results - g->off_ring },
        { g->off_results, (size_t)g->result_capacity * sizeof(struct wq_rslot) },
        { g->off_fx, g->off_ftags + (size_t)g->ftag_slots * 8 - g->off_fx },
        { offsetof(struct wq_hdr, fq_count), 16 },   /* fq_count, ticks, vtime */
        { g->off_kfree, (size_t)g->key_classes * 4 },
        { g->off_keys, 512 },   /* the blocks the image's messages took */
        { g->off_lanes, (size_t)(g->off_keys - g->off_lanes) },   /* empty when fair */
    };
    static const unsigned weight_default[] = { 4, 24, 10, 32, 8, 16, 6, 0, 0, 3, 4, 6 };
    static const unsigned weight_fair[] = { 4, 14, 8, 24, 5, 8, 4, 25, 8, 1, 1, 0 };
    const unsigned *w = im->fair ? weight_fair : weight_default;
    unsigned total = 0;
    for (size_t i = 0; i < sizeof sec / sizeof sec[0]; i++)
        total += w[i];

    size_t n = 0;
    uint8_t flags = im->fair ? FLAG_FAIR : 0;
    if (below(2))
        flags |= FLAG_CHECKSUM;
    if (below(40) == 0)
        flags |= FLAG_SIZE;
    if (below(6) == 0)
        flags |= FLAG_DEADLOCK;
    if (below(10) == 0)
        flags |= FLAG_SHUTDOWN;
    buf[n++] = flags;
    if (flags & FLAG_SIZE) {
        uint32_t sz = below(2) ? (uint32_t)im->size + below(9) * 64 - 256
                               : below((uint32_t)im->size * 2);
        buf[n++] = (uint8_t)sz;
        buf[n++] = (uint8_t)(sz >> 8);
        buf[n++] = (uint8_t)(sz >> 16);
    }
    unsigned nrec = 1 + below(below(4) == 0 ? 12 : 4);
    for (unsigned r = 0; r < nrec; r++) {
        if (below(5) == 0) {
            /* One word of several entries (or of their fair data) at
               once: inconsistencies between entries, e.g. add orders
               far apart, two entries naming one heap position. */
            bool fx = im->fair && below(2);
            size_t base = fx ? g->off_fx : g->off_entries;
            size_t esz = fx ? sizeof(struct wq_fx) : g->entry_size;
            size_t field = (size_t)below((uint32_t)esz) & ~(size_t)3;
            bool late = below(5) == 0;
            for (unsigned k = 2 + below(3); k > 0 && n + 8 <= cap; k--) {
                size_t off = base + below(g->capacity) * esz + field;
                uint32_t v = below(2) ? (uint32_t)rnd() : probe_value();
                buf[n++] = (uint8_t)off;
                buf[n++] = (uint8_t)(off >> 8);
                buf[n++] = (uint8_t)(off >> 16);
                buf[n++] = (uint8_t)((late ? 0x80 : 0) | 3);   /* write 4 bytes */
                for (int b = 0; b < 4; b++)
                    buf[n++] = (uint8_t)(v >> (8 * b));
            }
            continue;
        }
        unsigned pick = below(total), s = 0;
        while (pick >= w[s]) {
            pick -= w[s];
            s++;
        }
        size_t off = sec[s].lo + below((uint32_t)sec[s].len);
        if (below(2))
            off &= ~(size_t)3;
        int op = (int)below(4);
        size_t len = op == 3 ? 1 : 1 + below(op == 2 ? 4 : 8);
        bool late = below(5) == 0;
        size_t need = 4 + (op == 3 ? 4 : op == 2 ? 1 : len);
        if (n + need > cap)
            break;
        buf[n++] = (uint8_t)off;
        buf[n++] = (uint8_t)(off >> 8);
        buf[n++] = (uint8_t)(off >> 16);
        buf[n++] = (uint8_t)((late ? 0x80 : 0) | (op << 5) | ((len - 1) & 31));
        if (op == 2) {
            static const uint8_t fills[] = { 0, 0xff, 0x40, 0x41, 0x3f, 0x7f, 0x80 };
            buf[n++] = below(2) ? fills[below(sizeof fills)] : (uint8_t)rnd();
        } else if (op == 3) {
            uint32_t a = below(2) ? (uint32_t)(int32_t)((int)below(5) - 2) : probe_value();
            for (int b = 0; b < 4; b++)
                buf[n++] = (uint8_t)(a >> (8 * b));
        } else {
            uint32_t v = probe_value();
            for (size_t k = 0; k < len; k++)
                buf[n++] = below(3) ? (uint8_t)(v >> (8 * (k % 4))) : (uint8_t)rnd();
        }
    }
    return n;
}

struct counts {
    unsigned tried, refused, opened, clean, repaired, ebadmsg, crashed;
};

static void set_name(void)
{
    snprintf(name, sizeof name, "fuzz-%d", (int)getpid());
    snprintf(path, sizeof path, "/dev/shm/wq.%s", name);
}

static bool run_mode(int mode, unsigned rounds, uint64_t seed, struct counts *c)
{
    const struct image *im = &images[mode];
    uint8_t buf[256];
    for (unsigned r = 0; r < rounds; r++) {
        rng_state = seed * 0x100000001b3ull + (uint64_t)mode * 0x9e3779b97f4a7c15ull + r;
        rnd();
        size_t n = gen_input(im, buf, sizeof buf);
        c->tried++;
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) {
            set_name();
            alarm(20);
            force_mode = mode;
            LLVMFuzzerTestOneInput(buf, n);
            _exit(OUT_BASE + (int)outcome);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid)
            die("waitpid");
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (code < OUT_BASE || code > OUT_BASE + 7) {
            c->crashed++;
            char file[512];
            snprintf(file, sizeof file, "%s/round-%s-%u.bin", findings_dir(), im->mode, r);
            cur_data = buf;
            cur_size = n;
            save_input(file);
            if (WIFSIGNALED(st))
                fprintf(stderr, "=== round %s %u: signal %d, input saved to %s\n", im->mode,
                        r, WTERMSIG(st), file);
            else
                fprintf(stderr, "=== round %s %u: exit %d, input saved to %s\n", im->mode, r,
                        code, file);
            char stale[160];
            snprintf(stale, sizeof stale, "/dev/shm/wq.fuzz-%d", (int)pid);
            unlink(stale);
            continue;
        }
        unsigned o = (unsigned)(code - OUT_BASE);
        if (!(o & OUT_OPENED)) {
            c->refused++;
            continue;
        }
        c->opened++;
        if (o & OUT_FOUND)
            c->repaired++;
        else
            c->clean++;
        if (o & OUT_EBADMSG)
            c->ebadmsg++;
    }
    return c->crashed == 0;
}

static void rounds_main(unsigned rounds)
{
    const char *s = getenv("FUZZ_SEED");
    uint64_t seed = s && *s ? strtoull(s, NULL, 0) : 1;
    shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                  -1, 0);
    if (shared == MAP_FAILED)
        die("mmap");
    char report[NIMAGES][2048];
    memset(report, 0, sizeof report);
    bool ok = true;
    for (int m = 0; m < NIMAGES; m++) {
        if (force_mode >= 0 && force_mode != m)
            continue;
        memset(shared, 0, sizeof *shared);   /* soft findings per mode */
        struct counts c = { 0 };
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        ok &= run_mode(m, rounds, seed, &c);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        int k = snprintf(report[m], sizeof report[m],
                         "  %s (seed %" PRIu64 ", %.1f s): tried %u, open refused (clean -errno) %u, "
                         "opened %u (clean at first check %u, violations found and repaired "
                         "clean %u; an operation returned -EBADMSG in %u), crash %u\n"
                         "    soft findings (kind: rounds):",
                         images[m].mode, seed, secs, c.tried, c.refused, c.opened, c.clean,
                         c.repaired, c.ebadmsg, c.crashed);
        if (shared->n == 0)
            k += snprintf(report[m] + k, sizeof report[m] - (size_t)k, " none");
        for (unsigned i = 0; i < shared->n && (size_t)k < sizeof report[m]; i++)
            k += snprintf(report[m] + k, sizeof report[m] - (size_t)k, " %s: %u",
                          shared->k[i].kind, shared->k[i].count);
    }
    fprintf(stderr, "\nfuzz-region rounds:\n");
    for (int m = 0; m < NIMAGES; m++)
        if (report[m][0])
            fprintf(stderr, "%s\n", report[m]);
    exit(ok ? 0 : 1);
}

/* ------------------------------------------------------------------ */
/* Start-up                                                            */
/* ------------------------------------------------------------------ */

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
    s = getenv("FUZZ_VERBOSE");
    verbose = s && *s && strcmp(s, "0") != 0;
    s = getenv("FUZZ_MODE");
    if (s && strcmp(s, "default") == 0)
        force_mode = IMG_DEFAULT;
    else if (s && strcmp(s, "fair") == 0)
        force_mode = IMG_FAIR;
    else if (s && *s && strcmp(s, "all") != 0)
        die("FUZZ_MODE=%s: default, fair or all", s);
    set_name();
    build_image(&images[IMG_DEFAULT], false);
    build_image(&images[IMG_FAIR], true);
    s = getenv("FUZZ_WRITE_SEEDS");
    if (s && *s) {
        write_seeds(s);
        exit(0);
    }
    s = getenv("FUZZ_ROUNDS");
    if (s && *s)
        rounds_main((unsigned)strtoul(s, NULL, 0));
    return 0;
}
