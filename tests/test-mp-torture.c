/*
 * test-mp-torture.c - randomized multi-process SIGKILL torture of libwq.
 *
 * Each round creates a fresh queue and forks P producers and W workers,
 * every one of which wq_open()s the queue itself. The parent is the
 * supervisor and the killer: every 1-20 ms it SIGKILLs a random producer
 * or worker (whatever that process is doing, including holding the region
 * lock mid-mutation) and starts a replacement. Producers wq_add (and
 * wq_add_many) keys drawn from K hot keys, and now and then a "burst": a
 * fresh key added 2-4 times in quick succession and never again, so an
 * add that lands while the key is processing and is then lost cannot be
 * masked by a later add. Workers wq_get -> work (mostly short, sometimes
 * long) -> wq_done (or wq_done_get).
 *
 * Nothing libwq says is trusted for the verdict. An independent witness
 * lives in a MAP_SHARED|MAP_ANONYMOUS mapping made before any fork:
 *   - per key a holder word (pid << 32 | generation), claimed by
 *     compare-and-swap from 0 when a worker starts processing the key and
 *     cleared before wq_done. A claim that finds the word held by a process
 *     the supervisor has not killed, which is still alive and not a
 *     zombie, is an OVERLAP: libwq handed one key to two live processes.
 *     A killed worker leaves its claim set; the supervisor clears the
 *     claims of a pid once waitpid() has reaped it. A worker whose claim
 *     meets a killed (dying or reaped) holder waits for that clearing: libwq
 *     may requeue the key as soon as the holder's lease is dead, which can
 *     be a moment before the supervisor reaps it.
 *   - per key last_add_seq (a global sequence number a producer announces
 *     BEFORE calling wq_add), last_ack_seq (the same number once wq_add
 *     returned >= 0: the add is acknowledged) and last_processed_seq (a
 *     worker reads last_add_seq when it starts processing and stores the
 *     maximum when it ends, before wq_done). At the end every key must
 *     have last_processed_seq >= last_ack_seq, else an acknowledged add was
 *     LOST. Adds cut short by a kill are not acknowledged and may or may
 *     not be processed.
 * Crash requeues go through the rate limiter (the key waits before it
 * comes back), so the queue is created with a short per-key exponential
 * limiter (200 us doubling to 20 ms) and workers wq_forget a key they
 * processed, as a controller does on success.
 *
 * At the end of a round: the killer stops, producers stop and close,
 * workers drain the queue (queued, processing and waiting keys: shutdown
 * drops waiting keys), wq_shutdown_drain(), workers exit, the
 * supervisor pops whatever is still queued (recording it as processed),
 * then checks: no overlap, no lost add, no child error, wq_check() == 0
 * (violations printed with wq_check_report), wq_stats queued, processing
 * and live all 0. The queue is removed even on failure; nothing is left in
 * /dev/shm.
 *
 * Hard limits: every child runs under alarm(); a round that takes longer
 * than max(3 x its duration, duration + 10 s) is a failure (every child is
 * killed); a per-round alarm() ends the program if a call made by the
 * supervisor itself never returns.
 *
 * Usage: test-mp-torture [--seconds S] [--rounds R] [--producers P]
 *                        [--workers W] [--keys K] [--seed N] [--verbose]
 * WQ_TEST_VALGRIND=1 runs a tiny version (1 round of 2 s).
 * Last line: "torture: N passed, 0 failed" (exit 0) or
 *            "torture: 0 passed, 1 failed" (exit 1).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <wq.h>

#define MAX_HOT      4096           /* --keys limit */
#define MAX_BURST    32768          /* burst keys per round */
#define MAX_KEYS     (MAX_HOT + MAX_BURST)
#define MAX_ROLES    256            /* producers + workers */
#define MAX_RECS     65536          /* spawned processes per round */
#define MAX_DIAG     64
#define DIAG_LEN     240
#define KEY_LEN      16
#define KEYBUF       64

enum { ROLE_PRODUCER = 1, ROLE_WORKER = 2 };
enum { PS_NONE = 0, PS_ALIVE = 1, PS_KILLED = 2, PS_DEAD = 3 };

/* ------------------------------------------------------------------ */
/* The witness: shared anonymous memory, written by every process      */
/* ------------------------------------------------------------------ */

struct wkey {
    _Atomic uint64_t holder;             /* pid << 32 | gen, 0 = nobody */
    _Atomic uint64_t last_add_seq;       /* producers, before wq_add */
    _Atomic uint64_t last_ack_seq;       /* producers, after wq_add >= 0 */
    _Atomic uint64_t last_processed_seq; /* workers, before wq_done */
    _Atomic uint64_t processed;          /* times processed */
};

struct wrec {                            /* one spawned process */
    _Atomic int32_t pid;
    _Atomic int32_t state;               /* PS_* */
};

struct witness {
    _Atomic uint64_t seq;                /* global add sequence */
    _Atomic int stop_producers;
    _Atomic int stop_workers;
    _Atomic uint64_t adds_announced, adds_acked, adds_coalesced, adds_many;
    _Atomic uint64_t processed, long_jobs, claim_waits;
    _Atomic uint64_t overlaps, errors;
    _Atomic uint32_t nburst;             /* burst keys handed out */
    _Atomic uint64_t burst_adds;
    _Atomic uint64_t adds_full;          /* -ENOSPC: not acknowledged */
    _Atomic uint32_t ndiag;
    char diag[MAX_DIAG][DIAG_LEN];
    _Atomic uint32_t nrecs;
    struct wrec recs[MAX_RECS];
    struct wkey keys[MAX_KEYS];
};

static struct witness *W;

/* ------------------------------------------------------------------ */
/* Small helpers                                                       */
/* ------------------------------------------------------------------ */

struct opts {
    double seconds;
    int rounds, producers, workers, keys;
    uint64_t seed;
    bool verbose;
};

static struct opts O = { 8.0, 3, 3, 4, 32, 0, false };

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = { (time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull) };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static void spin_ns(uint64_t ns)
{
    uint64_t end = now_ns() + ns;
    while (now_ns() < end)
        ;
}

static uint64_t rng_state;

static uint64_t rnd(void)
{
    /* xorshift64* */
    uint64_t x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545f4914f6cdd1dull;
}

static uint64_t rnd_below(uint64_t n)
{
    return n ? rnd() % n : 0;
}

static void seed_rng(uint64_t s)
{
    /* splitmix64 so nearby seeds give unrelated streams */
    s += 0x9e3779b97f4a7c15ull;
    s = (s ^ (s >> 30)) * 0xbf58476d1ce4e5b9ull;
    s = (s ^ (s >> 27)) * 0x94d049bb133111ebull;
    s ^= s >> 31;
    rng_state = s ? s : 1;
}

static void amax(_Atomic uint64_t *p, uint64_t v)
{
    uint64_t cur = atomic_load(p);
    while (cur < v && !atomic_compare_exchange_weak(p, &cur, v))
        ;
}

/* Record a diagnostic line (any process) and count an error. */
static void diag(bool is_error, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void diag(bool is_error, const char *fmt, ...)
{
    if (is_error)
        atomic_fetch_add(&W->errors, 1);
    uint32_t i = atomic_fetch_add(&W->ndiag, 1);
    if (i >= MAX_DIAG)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(W->diag[i], DIAG_LEN, "[pid %d] ", (int)getpid());
    if (n < 0 || n >= DIAG_LEN)
        n = 0;
    vsnprintf(W->diag[i] + n, DIAG_LEN - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Witness index k: hot keys "key-NNNN" are 0 .. O.keys-1, burst keys
   "b-NNNNNN" follow (burst n is O.keys + n). */
static int key_name(char *buf, int k)
{
    if (k < O.keys)
        return snprintf(buf, KEYBUF, "key-%04d", k);
    return snprintf(buf, KEYBUF, "b-%06d", k - O.keys);
}

static int key_parse(const char *buf, int n)
{
    int first, base;
    if (n == 8 && memcmp(buf, "key-", 4) == 0)
        first = 4, base = 0;
    else if (n == 8 && memcmp(buf, "b-", 2) == 0)
        first = 2, base = O.keys;
    else
        return -1;
    int k = 0;
    for (int i = first; i < 8; i++) {
        if (buf[i] < '0' || buf[i] > '9')
            return -1;
        k = k * 10 + (buf[i] - '0');
    }
    if (base == 0)
        return k < O.keys ? k : -1;
    return k < (int)atomic_load(&W->nburst) && k < MAX_BURST ? base + k : -1;
}

/* Keys in use this round (hot + burst). */
static int nkeys_used(void)
{
    uint32_t b = atomic_load(&W->nburst);
    return O.keys + (int)(b < MAX_BURST ? b : MAX_BURST);
}

/* Process state from /proc/<pid>/stat: 'R', 'S', 'Z', ... or 0 if gone. */
static char proc_state(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    return (p && p[1] == ' ') ? p[2] : '?';
}

static int rec_state(pid_t pid)
{
    uint32_t n = atomic_load(&W->nrecs);
    if (n > MAX_RECS)
        n = MAX_RECS;
    for (uint32_t i = n; i-- > 0;)   /* newest first: pids may be reused */
        if (atomic_load(&W->recs[i].pid) == pid)
            return atomic_load(&W->recs[i].state);
    return PS_NONE;
}

/* ------------------------------------------------------------------ */
/* Children                                                            */
/* ------------------------------------------------------------------ */

static char qname[400];
static unsigned child_alarm;

static wq *child_open(const char *role)
{
    wq *q = NULL;
    int rc = wq_open(qname, NULL, &q);
    if (rc < 0) {
        diag(true, "%s: wq_open(%s): %s", role, qname, wq_strerror(rc));
        _exit(2);
    }
    return q;
}

/* A burst: one fresh key added 2-4 times a few microseconds to 2 ms
   apart or as soon as a worker claimed it, then never again this round. A later add usually lands while
   the key is processing, so it must be queued again at wq_done; with no
   later add to mask it, losing such an add leaves the key unprocessed
   after an acknowledged add (hot keys are re-added so often that a lost
   add is covered by the next one). */
static void burst(wq *q)
{
    uint32_t n = atomic_fetch_add(&W->nburst, 1);
    if (n >= MAX_BURST)
        return;
    int k = O.keys + (int)n;
    char name[KEYBUF];
    int len = key_name(name, k);
    int reps = 2 + (int)rnd_below(3);
    for (int r = 0; r < reps && !atomic_load(&W->stop_producers); r++) {
        uint64_t seq = atomic_fetch_add(&W->seq, 1) + 1;
        amax(&W->keys[k].last_add_seq, seq);
        atomic_fetch_add(&W->adds_announced, 1);
        int rc = wq_add(q, name, (size_t)len);
        if (rc == -ESHUTDOWN)
            return;
        if (rc == -ENOSPC) {   /* nothing added: not acknowledged */
            atomic_fetch_add(&W->adds_full, 1);
            sleep_ns(1000000);
            continue;
        }
        if (rc < 0) {
            diag(true, "producer: wq_add(%s): %s", name, wq_strerror(rc));
            _exit(3);
        }
        amax(&W->keys[k].last_ack_seq, seq);
        atomic_fetch_add(&W->adds_acked, 1);
        atomic_fetch_add(&W->burst_adds, 1);
        uint64_t gap = rnd_below(6);
        if (gap == 0)
            spin_ns(rnd_below(20000));
        else if (gap < 2)
            spin_ns(20000 + rnd_below(200000));
        else if (gap < 3)
            sleep_ns(rnd_below(2000000));
        else {
            /* Aim the next add at the processing window: wait (at most
               3 ms) until a worker has claimed the key. */
            uint64_t until = now_ns() + 3000000;
            while (atomic_load(&W->keys[k].holder) == 0 && now_ns() < until)
                ;
        }
    }
}

static void producer_main(void)
{
    wq *q = child_open("producer");
    const uint64_t hot = rnd_below(60);   /* % of adds with no pause */
    char names[8][KEYBUF];
    struct iovec iov[8];
    while (!atomic_load(&W->stop_producers)) {
        if (rnd_below(24) == 0) {
            burst(q);
            continue;
        }
        int many = rnd_below(8) == 0 ? 2 + (int)rnd_below(6) : 1;
        int ks[8];
        uint64_t seqs[8];
        for (int i = 0; i < many; i++) {
            ks[i] = (int)rnd_below((uint64_t)O.keys);
            iov[i].iov_base = names[i];
            iov[i].iov_len = (size_t)key_name(names[i], ks[i]);
            /* Announce before adding: a worker that starts after our add
               must see at least this number. */
            seqs[i] = atomic_fetch_add(&W->seq, 1) + 1;
            amax(&W->keys[ks[i]].last_add_seq, seqs[i]);
            atomic_fetch_add(&W->adds_announced, 1);
        }
        int rc = many == 1 ? wq_add(q, iov[0].iov_base, iov[0].iov_len)
                           : wq_add_many(q, iov, (size_t)many);
        if (rc == -ESHUTDOWN)
            break;
        if (rc == -ENOSPC) {   /* the queue is full (workers being killed) */
            atomic_fetch_add(&W->adds_full, (uint64_t)many);
            sleep_ns(1000000);
            continue;
        }
        if (rc < 0) {
            diag(true, "producer: wq_add%s(%.*s): %s", many > 1 ? "_many" : "",
                 (int)iov[0].iov_len, names[0], wq_strerror(rc));
            _exit(3);
        }
        for (int i = 0; i < many; i++)
            amax(&W->keys[ks[i]].last_ack_seq, seqs[i]);   /* acknowledged */
        atomic_fetch_add(&W->adds_acked, (uint64_t)many);
        if (many > 1)
            atomic_fetch_add(&W->adds_many, 1);
        if (many == 1 && rc == 1)
            atomic_fetch_add(&W->adds_coalesced, 1);
        /* Mostly hot (more kills land inside the region lock), sometimes
           idle so the queue also runs empty and getters sleep. */
        uint64_t r = rnd_below(100);
        if (r < hot)
            ;
        else if (r < 75)
            spin_ns(rnd_below(30000));
        else if (r < 98)
            sleep_ns(rnd_below(300000));
        else
            sleep_ns(1000000 + rnd_below(4000000));
    }
    wq_close(q);
    _exit(0);
}

/* Claim key k in the witness. Returns our holder word, or 0 if an overlap
   was recorded (then we process without a claim). */
static uint64_t claim(int k, const char *key, int len, uint32_t *gen)
{
    uint64_t me = (uint64_t)(uint32_t)getpid() << 32 | ++*gen;
    uint64_t deadline = now_ns() + 10000000000ull;
    bool waited = false;
    for (;;) {
        uint64_t h = 0;
        if (atomic_compare_exchange_strong(&W->keys[k].holder, &h, me))
            return me;
        pid_t hp = (pid_t)(h >> 32);
        int st = rec_state(hp);
        if (st != PS_KILLED && st != PS_DEAD) {
            char ps = proc_state(hp);
            if (ps != 0 && ps != 'Z' && ps != 'X') {
                atomic_fetch_add(&W->overlaps, 1);
                diag(true, "OVERLAP: got key %.*s while live pid %d (state %c, "
                     "record %d, claim gen %u) still holds it",
                     len, key, (int)hp, ps, st, (unsigned)(h & 0xffffffffu));
                return 0;
            }
            /* Gone without being killed by us: the supervisor reports the
               unexpected death; wait for it to clear the claim. */
        }
        if (!waited) {
            waited = true;
            atomic_fetch_add(&W->claim_waits, 1);
        }
        if (now_ns() > deadline) {
            diag(true, "witness: claim of key %.*s held by dead pid %d (record %d) "
                 "not cleared within 10 s", len, key, (int)hp, st);
            return 0;
        }
        sleep_ns(100000);
    }
}

static void worker_main(void)
{
    wq *q = child_open("worker");
    char key[KEYBUF], prev[KEYBUF];
    int n = 0, prevn = 0;
    uint32_t gen = 0;
    const int64_t tmo = 100 * 1000 * 1000;
    for (;;) {
        if (prevn > 0 && rnd_below(2) == 0) {
            n = wq_done_get(q, prev, (size_t)prevn, key, sizeof key, tmo);
            if (n == -ENOENT || (n < 0 && n != -ETIMEDOUT && n != -ESHUTDOWN &&
                                 n != -EAGAIN)) {
                diag(true, "worker: wq_done_get(%.*s): %s", prevn, prev, wq_strerror(n));
                _exit(3);
            }
            prevn = 0;   /* done happened (done errors are returned first) */
        } else {
            if (prevn > 0) {
                int rc = wq_done(q, prev, (size_t)prevn);
                if (rc != 0) {
                    diag(true, "worker: wq_done(%.*s) = %s: key taken from a live "
                         "holder?", prevn, prev, wq_strerror(rc));
                    _exit(3);
                }
                prevn = 0;
            }
            if (atomic_load(&W->stop_workers))
                break;
            n = wq_get(q, key, sizeof key, tmo);
        }
        if (n == -ETIMEDOUT || n == -EAGAIN) {
            if (atomic_load(&W->stop_workers))
                break;
            continue;
        }
        if (n == -ESHUTDOWN)
            break;
        if (n < 0) {
            diag(true, "worker: wq_get: %s", wq_strerror(n));
            _exit(3);
        }
        int k = key_parse(key, n);
        if (k < 0) {
            diag(true, "worker: wq_get returned a key never added: len %d '%.*s'", n,
                 n > 0 && n < KEYBUF ? n : 0, key);
            _exit(3);
        }
        /* Read before claiming: an add announced after the claim (a burst
           aims at that) is then certainly not counted as seen here. */
        uint64_t seen = atomic_load(&W->keys[k].last_add_seq);
        uint64_t me = claim(k, key, n, &gen);
        uint64_t r = rnd_below(1000);
        if (r < 300)
            ;
        else if (r < 700)
            spin_ns(rnd_below(50000));
        else if (r < 980)
            spin_ns(50000 + rnd_below(450000));
        else {
            atomic_fetch_add(&W->long_jobs, 1);
            sleep_ns(5000000 + rnd_below(25000000));
        }
        amax(&W->keys[k].last_processed_seq, seen);
        atomic_fetch_add(&W->keys[k].processed, 1);
        atomic_fetch_add(&W->processed, 1);
        if (me) {
            uint64_t h = me;
            if (!atomic_compare_exchange_strong(&W->keys[k].holder, &h, 0))
                diag(true, "witness: our claim on %.*s vanished (now %d/%u)", n, key,
                     (int)(h >> 32), (unsigned)(h & 0xffffffffu));
        }
        /* Success, as a controller reports it: reset the failure count
           (a crash requeue raised it), then done. */
        int frc = wq_forget(q, key, (size_t)n);
        if (frc != 0) {
            diag(true, "worker: wq_forget(%.*s): %s", n, key, wq_strerror(frc));
            _exit(3);
        }
        memcpy(prev, key, (size_t)n);
        prevn = n;
    }
    if (prevn > 0) {
        int rc = wq_done(q, prev, (size_t)prevn);
        if (rc != 0)
            diag(true, "worker: final wq_done(%.*s): %s", prevn, prev, wq_strerror(rc));
    }
    wq_close(q);
    _exit(0);
}

/* ------------------------------------------------------------------ */
/* The supervisor                                                      */
/* ------------------------------------------------------------------ */

struct child {
    pid_t pid;     /* 0 = slot empty */
    int role;
    uint32_t rec;
};

static struct child kids[MAX_ROLES];
static int nkids;
static uint64_t spawn_count;

/* Pids of live children for the signal handler (async-signal-safe use). */
static volatile sig_atomic_t emergency_pids[MAX_ROLES];
static char shm_path_buf[420];   /* "/dev/shm/wq." and qname */

static void emergency(int sig)
{
    (void)sig;
    for (int i = 0; i < MAX_ROLES; i++)
        if (emergency_pids[i] > 0)
            kill((pid_t)emergency_pids[i], SIGKILL);
    if (shm_path_buf[0])
        unlink(shm_path_buf);
    /* The diagnostics children wrote (plain bytes in shared memory). */
    uint32_t nd = atomic_load(&W->ndiag);
    for (uint32_t i = 0; i < nd && i < MAX_DIAG; i++) {
        ssize_t w = write(2, W->diag[i], strnlen(W->diag[i], DIAG_LEN));
        w = write(2, "\n", 1);
        (void)w;
    }
    static const char msg[] = "torture: round timed out (a libwq call in the supervisor "
                              "blocked?), every child killed\n"
                              "torture: 0 passed, 1 failed\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

static pid_t spawn(int slot, int role, uint64_t round_seed)
{
    uint32_t rec = atomic_fetch_add(&W->nrecs, 1);
    if (rec >= MAX_RECS) {
        diag(true, "supervisor: more than %d processes in one round", MAX_RECS);
        return -1;
    }
    uint64_t cs = round_seed ^ (++spawn_count * 0x9e3779b97f4a7c15ull);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        diag(true, "supervisor: fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        signal(SIGALRM, SIG_DFL);
        alarm(child_alarm);
        /* The record is the parent's alone: a store here could land after
           the parent marked us KILLED (SIGKILL is not instantaneous on
           another CPU) and hide the kill. */
        seed_rng(cs);
        if (role == ROLE_PRODUCER)
            producer_main();
        else
            worker_main();
        _exit(0);
    }
    atomic_store(&W->recs[rec].pid, (int32_t)pid);
    atomic_store(&W->recs[rec].state, PS_ALIVE);
    kids[slot].pid = pid;
    kids[slot].role = role;
    kids[slot].rec = rec;
    emergency_pids[slot] = pid;
    return pid;
}

struct round_stats {
    uint64_t kills_p, kills_w, restarts, cleared_claims, unexpected;
};

/* A child was reaped: mark it dead and clear its witness claims. */
static void reaped(int slot, int status, struct round_stats *rs, bool stopping)
{
    struct child *c = &kids[slot];
    int32_t st = atomic_load(&W->recs[c->rec].state);
    bool killed = st == PS_KILLED;
    atomic_store(&W->recs[c->rec].state, PS_DEAD);
    int used = nkeys_used();
    for (int k = 0; k < used; k++) {
        uint64_t h = atomic_load(&W->keys[k].holder);
        if (h && (pid_t)(h >> 32) == c->pid &&
            atomic_compare_exchange_strong(&W->keys[k].holder, &h, 0))
            rs->cleared_claims++;
    }
    bool ok = killed ? (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) ||
                           (WIFEXITED(status) && WEXITSTATUS(status) == 0)
                     : WIFEXITED(status) && WEXITSTATUS(status) == 0 && stopping;
    if (!ok) {
        rs->unexpected++;
        if (WIFSIGNALED(status))
            diag(true, "supervisor: %s pid %d died of signal %d (%s)",
                 c->role == ROLE_PRODUCER ? "producer" : "worker", (int)c->pid,
                 WTERMSIG(status), killed ? "after our kill" : "not killed by us");
        else
            diag(true, "supervisor: %s pid %d exited with %d%s",
                 c->role == ROLE_PRODUCER ? "producer" : "worker", (int)c->pid,
                 WEXITSTATUS(status), stopping ? "" : " before the round ended");
    }
    emergency_pids[slot] = 0;
    c->pid = 0;
}

static int slot_of(pid_t pid)
{
    for (int i = 0; i < nkids; i++)
        if (kids[i].pid == pid)
            return i;
    return -1;
}

/* Reap what has ended; restart it when `restart`. Returns reaped count. */
static int reap_some(bool block_ms, struct round_stats *rs, bool restart, bool stopping,
                     uint64_t round_seed)
{
    int n = 0;
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0)
            break;
        int s = slot_of(pid);
        if (s < 0)
            continue;
        int role = kids[s].role;
        reaped(s, status, rs, stopping);
        n++;
        if (restart && spawn(s, role, round_seed) > 0)
            rs->restarts++;
    }
    if (block_ms && n == 0)
        sleep_ns(1000000);
    return n;
}

static void kill_all_children(void)
{
    for (int i = 0; i < nkids; i++)
        if (kids[i].pid > 0) {
            atomic_store(&W->recs[kids[i].rec].state, PS_KILLED);
            kill(kids[i].pid, SIGKILL);
        }
    for (int i = 0; i < nkids; i++)
        if (kids[i].pid > 0) {
            int status;
            waitpid(kids[i].pid, &status, 0);
            emergency_pids[i] = 0;
            kids[i].pid = 0;
        }
}

static int live_children(int role)
{
    int n = 0;
    for (int i = 0; i < nkids; i++)
        if (kids[i].pid > 0 && (role == 0 || kids[i].role == role))
            n++;
    return n;
}

/* Wait until no child of `role` is left, reaping; false on deadline. */
static bool wait_role(int role, uint64_t deadline, struct round_stats *rs, uint64_t seed)
{
    while (live_children(role) > 0) {
        if (now_ns() > deadline)
            return false;
        reap_some(true, rs, false, true, seed);
    }
    return true;
}

static void report_line(const char *what, void *arg)
{
    (void)arg;
    fprintf(stderr, "    check: %s\n", what);
}

static int dump_line(const struct wq_key_info *ki, void *arg)
{
    int *n = arg;
    if ((*n)++ >= 200)
        return 1;
    fprintf(stderr, "    key %-12.*s state%s%s%s owner %d pos %s%" PRIu64 "\n",
            (int)ki->len, (const char *)ki->key,
            (ki->state & WQ_KEY_DIRTY) ? " dirty" : "",
            (ki->state & WQ_KEY_QUEUED) ? " queued" : "",
            (ki->state & WQ_KEY_PROCESSING) ? " processing" : "", (int)ki->owner_pid,
            ki->position == UINT64_MAX ? "-" : "",
            ki->position == UINT64_MAX ? 0 : ki->position);
    return 0;
}

struct totals {
    uint64_t rounds, kills_p, kills_w, announced, acked, processed, crash_requeues,
        repairs, overlaps, lost, claim_waits, restarts;
};

static struct totals T;

/* One round. Returns 0 when every check passed. */
static int run_round(int r, uint64_t round_seed)
{
    struct round_stats rs = { 0 };
    int fail = 0;
    uint64_t t0 = now_ns();
    uint64_t dur = (uint64_t)(O.seconds * 1e9);
    uint64_t limit = 3 * dur > dur + 10000000000ull ? 3 * dur : dur + 10000000000ull;
    uint64_t hard_deadline = t0 + limit;
    /* Last resort if a call of the supervisor itself never returns. */
    alarm((unsigned)(limit / 1000000000ull) + 15);

    memset(W, 0, sizeof *W);
    /* WQ_TEST_PREFIX (tests/with-redis.sh): the same torture on Redis. */
    const char *prefix = getenv("WQ_TEST_PREFIX");
    if (!prefix)
        prefix = "";
    snprintf(qname, sizeof qname, "%storture-%d-%d", prefix, (int)getpid(), r);
    if (!*prefix)
        snprintf(shm_path_buf, sizeof shm_path_buf, "/dev/shm/wq.%s", qname);
    seed_rng(round_seed);

    struct wq_options o = { 0 };
    o.capacity = (uint32_t)(O.keys * 2 < 64 ? 64 : O.keys * 2) + 1024;   /* + bursts */
    o.max_key_len = KEY_LEN;
    /* Few spare slots: registration must reap dead processes' slots. */
    if (!*prefix)   /* Redis has no process table */
        o.max_procs = (uint32_t)(O.producers + O.workers + 4);
    o.flags = WQ_CREATE | WQ_EXCL;
    /* Crash requeues go through the rate limiter: keep its delays short
       (per key 200 us doubling to 20 ms, no shared token bucket) so the
       keys of killed workers come back within the round. */
    o.rl_limiters = WQ_RL_EXPONENTIAL;
    o.rl_base_delay_ns = 200000;
    o.rl_max_delay_ns = 20000000;
    wq *q = NULL;
    int rc = wq_open(qname, &o, &q);
    if (rc < 0) {
        fprintf(stderr, "round %d: wq_open(%s, CREATE|EXCL): %s\n", r, qname,
                wq_strerror(rc));
        shm_path_buf[0] = 0;
        return 1;
    }

    nkids = O.producers + O.workers;
    memset(kids, 0, sizeof kids);
    for (int i = 0; i < nkids; i++)
        if (spawn(i, i < O.producers ? ROLE_PRODUCER : ROLE_WORKER, round_seed) < 0)
            fail = 1;

    /* Phase 1: kill and restart at random, 1-20 ms apart. */
    uint64_t end = t0 + dur;
    while (!fail && now_ns() < end) {
        sleep_ns(1000000 + rnd_below(19000000));
        reap_some(false, &rs, true, false, round_seed);
        int victim = (int)rnd_below((uint64_t)nkids);
        if (kids[victim].pid > 0) {
            atomic_store(&W->recs[kids[victim].rec].state, PS_KILLED);
            kill(kids[victim].pid, SIGKILL);
            if (kids[victim].role == ROLE_PRODUCER)
                rs.kills_p++;
            else
                rs.kills_w++;
        }
        if (now_ns() > hard_deadline)
            break;
    }
    /* Let the last victims die and be replaced so workers are at strength. */
    uint64_t settle = now_ns() + 200000000ull;
    while (now_ns() < settle)
        reap_some(true, &rs, true, false, round_seed);

    /* Phase 2: producers stop and close. */
    atomic_store(&W->stop_producers, 1);
    if (!wait_role(ROLE_PRODUCER, hard_deadline, &rs, round_seed)) {
        fprintf(stderr, "round %d: producers did not stop in time\n", r);
        fail = 1;
    }
    /* Phase 3: workers drain what is queued (no kills any more). */
    struct wq_stats s;
    while (!fail) {
        rc = wq_stats(q, &s);
        if (rc < 0) {
            fprintf(stderr, "round %d: wq_stats: %s\n", r, wq_strerror(rc));
            fail = 1;
            break;
        }
        /* Waiting keys too: shutdown drops them (client-go), and a killed
           worker's key waits for the limiter's delay before coming back. */
        if (s.queued == 0 && s.processing == 0 && s.waiting == 0)
            break;
        if (now_ns() > hard_deadline) {
            fprintf(stderr, "round %d: queue did not drain in time: queued %" PRIu64
                    " processing %" PRIu64 " waiting %" PRIu64 "\n", r, s.queued,
                    s.processing, s.waiting);
            fail = 1;
            break;
        }
        reap_some(true, &rs, false, true, round_seed);
    }
    /* Phase 4: shutdown with drain, workers leave on -ESHUTDOWN. */
    int64_t left = (int64_t)(hard_deadline - now_ns());
    if (left < 100000000)
        left = 100000000;
    rc = wq_shutdown_drain(q, left);
    if (rc != 0) {
        fprintf(stderr, "round %d: wq_shutdown_drain: %s\n", r, wq_strerror(rc));
        fail = 1;
    }
    atomic_store(&W->stop_workers, 1);
    if (!wait_role(ROLE_WORKER, hard_deadline, &rs, round_seed)) {
        fprintf(stderr, "round %d: workers did not stop in time\n", r);
        fail = 1;
    }
    if (now_ns() > hard_deadline) {
        fprintf(stderr, "round %d: exceeded its hard limit of %.1f s\n", r,
                (double)limit / 1e9);
        fail = 1;
    }
    kill_all_children();   /* only stragglers after a failure */

    /* Phase 5: the supervisor pops whatever is still queued. */
    char key[KEYBUF];
    uint64_t drained = 0;
    for (;;) {
        int n = wq_get(q, key, sizeof key, 0);
        if (n == -ESHUTDOWN || n == -EAGAIN)
            break;
        if (n < 0) {
            fprintf(stderr, "round %d: final wq_get: %s\n", r, wq_strerror(n));
            fail = 1;
            break;
        }
        int k = key_parse(key, n);
        if (k < 0) {
            fprintf(stderr, "round %d: final wq_get: unknown key '%.*s'\n", r, n, key);
            fail = 1;
            break;
        }
        amax(&W->keys[k].last_processed_seq, atomic_load(&W->keys[k].last_add_seq));
        atomic_fetch_add(&W->keys[k].processed, 1);
        drained++;
        (void)wq_forget(q, key, (size_t)n);
        if ((rc = wq_done(q, key, (size_t)n)) != 0) {
            fprintf(stderr, "round %d: final wq_done: %s\n", r, wq_strerror(rc));
            fail = 1;
            break;
        }
        if (drained > 100000) {
            fprintf(stderr, "round %d: final drain does not end\n", r);
            fail = 1;
            break;
        }
    }

    /* Verdict. */
    uint64_t lost = 0;
    int used = nkeys_used();
    for (int k = 0; k < used; k++) {
        uint64_t ack = atomic_load(&W->keys[k].last_ack_seq);
        uint64_t done = atomic_load(&W->keys[k].last_processed_seq);
        if (ack > done) {
            if (lost < 20)
            {
                char kn[KEYBUF];
                key_name(kn, k);
                fprintf(stderr, "round %d: LOST: %s acknowledged add #%" PRIu64
                        " never processed after it (last processed #%" PRIu64
                        ", announced #%" PRIu64 ", processed %" PRIu64 " times)\n", r, kn,
                        ack, done, (uint64_t)atomic_load(&W->keys[k].last_add_seq),
                        (uint64_t)atomic_load(&W->keys[k].processed));
            }
            lost++;
        }
        if (atomic_load(&W->keys[k].holder) != 0) {
            uint64_t h = atomic_load(&W->keys[k].holder);
            fprintf(stderr, "round %d: witness: key #%d still claimed by %d/%u\n", r, k,
                    (int)(h >> 32), (unsigned)(h & 0xffffffffu));
            fail = 1;
        }
    }
    int viol = wq_check_report(q, 0, report_line, NULL);
    if (viol != 0) {
        fprintf(stderr, "round %d: wq_check: %d%s\n", r, viol,
                viol < 0 ? " (error)" : " violation(s), listed above");
        fail = 1;
    }
    rc = wq_stats(q, &s);
    if (rc < 0) {
        fprintf(stderr, "round %d: wq_stats: %s\n", r, wq_strerror(rc));
        fail = 1;
        memset(&s, 0, sizeof s);
    } else if (s.queued || s.processing || s.waiting || s.live) {
        fprintf(stderr, "round %d: stats after drain: queued %" PRIu64 " processing %"
                PRIu64 " waiting %" PRIu64 " live %" PRIu64 " (all must be 0)\n", r,
                s.queued, s.processing, s.waiting, s.live);
        fail = 1;
    }
    uint64_t overlaps = atomic_load(&W->overlaps);
    uint64_t errors = atomic_load(&W->errors);
    if (overlaps || lost || errors)
        fail = 1;
    uint32_t nd = atomic_load(&W->ndiag);
    for (uint32_t i = 0; i < nd && i < MAX_DIAG; i++)
        fprintf(stderr, "round %d: %s\n", r, W->diag[i]);
    if (nd > MAX_DIAG)
        fprintf(stderr, "round %d: ... %u more diagnostics\n", r, nd - MAX_DIAG);
    if (fail) {
        fprintf(stderr, "round %d: queue %s (seed %" PRIu64 ") dump:\n", r, qname, O.seed);
        int cnt = 0;
        rc = wq_dump(q, dump_line, &cnt);
        if (rc < 0)
            fprintf(stderr, "    wq_dump: %s\n", wq_strerror(rc));
    }

    double secs = (double)(now_ns() - t0) / 1e9;
    printf("round %d/%d: %.1fs kills %" PRIu64 " (producers %" PRIu64 ", workers %" PRIu64
           ") adds announced %" PRIu64 " acked %" PRIu64 " (coalesced %" PRIu64
           ", batches %" PRIu64 ", burst keys %u adds %" PRIu64 ", refused full %" PRIu64
           ") processed %" PRIu64 " (final drain %" PRIu64
           ", long %" PRIu64 ") crash_requeues %" PRIu64 " repairs %" PRIu64
           " claim_waits %" PRIu64 " failing %" PRIu64 " overlaps %" PRIu64 " lost %" PRIu64
           " errors %" PRIu64 " check %d -> %s\n",
           r, O.rounds, secs, rs.kills_p + rs.kills_w, rs.kills_p, rs.kills_w,
           (uint64_t)atomic_load(&W->adds_announced), (uint64_t)atomic_load(&W->adds_acked),
           (uint64_t)atomic_load(&W->adds_coalesced), (uint64_t)atomic_load(&W->adds_many),
           (unsigned)atomic_load(&W->nburst), (uint64_t)atomic_load(&W->burst_adds),
           (uint64_t)atomic_load(&W->adds_full),
           (uint64_t)atomic_load(&W->processed) + drained, drained,
           (uint64_t)atomic_load(&W->long_jobs), s.crash_requeues_total, s.repairs_total,
           (uint64_t)atomic_load(&W->claim_waits), s.failing, overlaps, lost, errors, viol,
           fail ? "FAIL" : "ok");
    fflush(stdout);

    T.rounds++;
    T.kills_p += rs.kills_p;
    T.kills_w += rs.kills_w;
    T.restarts += rs.restarts;
    T.announced += atomic_load(&W->adds_announced);
    T.acked += atomic_load(&W->adds_acked);
    T.processed += atomic_load(&W->processed) + drained;
    T.crash_requeues += s.crash_requeues_total;
    T.repairs += s.repairs_total;
    T.overlaps += overlaps;
    T.lost += lost;
    T.claim_waits += atomic_load(&W->claim_waits);

    wq_close(q);
    rc = wq_unlink(qname);
    if (rc < 0 && rc != -ENOENT) {
        fprintf(stderr, "round %d: wq_unlink: %s\n", r, wq_strerror(rc));
        fail = 1;
    }
    if (access(shm_path_buf, F_OK) == 0) {
        fprintf(stderr, "round %d: %s left behind\n", r, shm_path_buf);
        unlink(shm_path_buf);
        fail = 1;
    }
    shm_path_buf[0] = 0;
    alarm(0);
    return fail;
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--seconds S] [--rounds R] [--producers P] [--workers W]\n"
            "          [--keys K] [--seed N] [--verbose]\n", argv0);
    exit(2);
}

int main(int argc, char **argv)
{
    bool seeded = false;
    const char *vg = getenv("WQ_TEST_VALGRIND");
    if (vg && *vg && strcmp(vg, "0") != 0) {
        O.rounds = 1;
        O.seconds = 2.0;
        O.producers = 2;
        O.workers = 2;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--verbose")) {
            O.verbose = true;
            continue;
        }
        if (i + 1 >= argc)
            usage(argv[0]);
        const char *v = argv[++i];
        char *endp;
        if (!strcmp(a, "--seconds")) {
            O.seconds = strtod(v, &endp);
            if (*endp || !(O.seconds > 0) || O.seconds > 3600)
                usage(argv[0]);
            continue;
        }
        long n = strtol(v, &endp, 0);
        if (*endp)
            usage(argv[0]);
        if (!strcmp(a, "--rounds") && n > 0)
            O.rounds = (int)n;
        else if (!strcmp(a, "--producers") && n > 0 && n < MAX_ROLES / 2)
            O.producers = (int)n;
        else if (!strcmp(a, "--workers") && n > 0 && n < MAX_ROLES / 2)
            O.workers = (int)n;
        else if (!strcmp(a, "--keys") && n > 0 && n <= MAX_HOT)
            O.keys = (int)n;
        else if (!strcmp(a, "--seed")) {
            O.seed = strtoull(v, NULL, 0);
            seeded = true;
        } else
            usage(argv[0]);
    }
    if (!seeded)
        O.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20) ^ now_ns();
    setvbuf(stdout, NULL, _IOLBF, 0);
    child_alarm = (unsigned)(O.seconds * 3) + 20;

    W = mmap(NULL, sizeof *W, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (W == MAP_FAILED) {
        perror("mmap witness");
        printf("torture: 0 passed, 1 failed\n");
        return 1;
    }
    struct sigaction sa = { 0 };
    sa.sa_handler = emergency;
    sigaction(SIGALRM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    printf("torture: %d round(s) of %.1f s, %d producers, %d workers, %d keys, seed %" PRIu64
           "\n", O.rounds, O.seconds, O.producers, O.workers, O.keys, O.seed);
    int failed = 0;
    for (int r = 1; r <= O.rounds && !failed; r++)
        failed = run_round(r, O.seed + (uint64_t)r * 0x100000001b3ull);

    printf("torture totals: rounds %" PRIu64 " kills %" PRIu64 " (producers %" PRIu64
           ", workers %" PRIu64 ") adds announced %" PRIu64 " acked %" PRIu64
           " processed %" PRIu64 " crash_requeues %" PRIu64 " repairs %" PRIu64
           " claim_waits %" PRIu64 " overlaps %" PRIu64 " lost %" PRIu64 "\n",
           T.rounds, T.kills_p + T.kills_w, T.kills_p, T.kills_w, T.announced, T.acked,
           T.processed, T.crash_requeues, T.repairs, T.claim_waits, T.overlaps, T.lost);
    munmap(W, sizeof *W);
    if (failed) {
        printf("torture: seed %" PRIu64 "\n", O.seed);
        printf("torture: 0 passed, 1 failed\n");
        return 1;
    }
    printf("torture: %d passed, 0 failed\n", O.rounds);
    return 0;
}
