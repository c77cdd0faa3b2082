/*
 * wqbench-queue.c - the single-process workloads: cycle, scale, durable.
 *
 * cycle   One process, distinct keys k0..kN-1, one key live at a time:
 *         add, get, done. "memory" uses the three plain calls (three lock
 *         acquisitions per key), "done_get" the wq_done_get fast path (two),
 *         "add_many" adds batches of 64 with wq_add_many and then gets and
 *         dones them one by one (2 + 1/64). Figure: cycles/s.
 * scale   L keys queued (capacity = L, max_key_len = 12), then rotate:
 *         get the front key, done it, add it back. A rotation touches the
 *         front entry, its index slot and the ring tail, so for large L it
 *         shows what cache and TLB misses cost. Figures: cycles/s and
 *         bytes_per_key, the memory the region takes with L keys live
 *         (wq_stats region_used, its pages in /dev/shm) over L, and
 *         added_per_key, the same less what the queue took when new (its
 *         32 KiB are a third of the figure at L = 1e3); the object's size
 *         (region_bytes) is only address space. Variant
 *         "footprint": the /dev/shm bytes a queue made with default
 *         options holds at creation (st_blocks of its shm object) and its
 *         size (region_bytes): issue 16's goal is at most 1 MiB.
 *         Variants "keys40" and "keys12": a queue with default options
 *         holding 50,000 keys of 40 bytes (a controller's
 *         "namespace/name") or 12: the /dev/shm bytes they add per key,
 *         queued, and again once each was handed out and finished with a
 *         16-byte result message; "-1e4" and "-1e3" with fewer keys. Unlike
 *         the L rows' queues, sized to L, these pay what a queue of 65536
 *         pays between growths.
 * durable The cycle loop against a queue with an LMDB store, per
 *         durability level; skipped while wq_open answers -ENOTSUP.
 *         fsync-p2: the fsync cycle in two processes at once (what fsync
 *         groups share); sqlite-full: the SQLite peer (wqbench-peers.c);
 *         one-sync: no queue, one synced 512-byte write per cycle to a
 *         file written once beforehand (O_DSYNC, beside the stores): the
 *         best any design that makes an add durable with one device
 *         flush can do on this disk (LMDB's commit makes two).
 * restore (the recover workload's second half) N keys are put in a store
 *         (WQ_DURABLE_NONE, filled at memory speed, then one wq_snapshot,
 *         timed as snapshot_ns); the region is removed and wq_open with
 *         WQ_CREATE rebuilds it from the store: that wq_open is timed.
 *
 * Loops are separate noinline functions so that callgrind can count just
 * them (--toggle-collect=loop_memory).
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "wqbench.h"

#define NOINLINE __attribute__((noinline))

/* ------------------------------------------------------------------ */
/* cycle                                                               */
/* ------------------------------------------------------------------ */

static NOINLINE void loop_memory(wq *q, uint64_t first, uint64_t n)
{
    char key[WQB_KEY_LEN], buf[WQB_BUF_LEN];
    wqb_key(key, first);
    for (uint64_t i = 0; i < n; i++, wqb_key_next(key)) {
        if (wq_add(q, key, WQB_KEY_LEN) != 0)
            wqb_die("cycle: wq_add did not queue a new key");
        int len = wq_get(q, buf, sizeof buf, 0);
        if (len != WQB_KEY_LEN)
            wqb_die("cycle: wq_get returned %d", len);
        wqb_check(wq_done(q, buf, (size_t)len), "cycle: wq_done");
    }
}

static NOINLINE void loop_done_get(wq *q, uint64_t first, uint64_t n)
{
    char key[WQB_KEY_LEN], buf[2][WQB_BUF_LEN];
    int cur = 0, len;
    wqb_key(key, first);
    wqb_check(wq_add(q, key, WQB_KEY_LEN), "cycle: wq_add");
    if ((len = wq_get(q, buf[cur], WQB_BUF_LEN, 0)) != WQB_KEY_LEN)
        wqb_die("cycle: wq_get returned %d", len);
    for (uint64_t i = 1; i < n; i++) {
        wqb_key_next(key);
        wqb_check(wq_add(q, key, WQB_KEY_LEN), "cycle: wq_add");
        len = wq_done_get(q, buf[cur], WQB_KEY_LEN, buf[!cur], WQB_BUF_LEN, 0);
        if (len != WQB_KEY_LEN)
            wqb_die("cycle: wq_done_get returned %d", len);
        cur = !cur;
    }
    wqb_check(wq_done(q, buf[cur], WQB_KEY_LEN), "cycle: wq_done");
}

static NOINLINE void loop_add_many(wq *q, uint64_t first, uint64_t n)
{
    char keys[64][WQB_KEY_LEN], key[WQB_KEY_LEN], buf[WQB_BUF_LEN];
    struct iovec iov[64];
    wqb_key(key, first);
    for (uint64_t i = 0; i < n;) {
        size_t b = 0;
        for (; b < 64 && i < n; b++, i++, wqb_key_next(key)) {
            memcpy(keys[b], key, WQB_KEY_LEN);
            iov[b] = (struct iovec){ keys[b], WQB_KEY_LEN };
        }
        if (wq_add_many(q, iov, b) != 0)
            wqb_die("cycle: wq_add_many coalesced distinct keys");
        for (size_t j = 0; j < b; j++) {
            int len = wq_get(q, buf, sizeof buf, 0);
            if (len != WQB_KEY_LEN)
                wqb_die("cycle: wq_get returned %d", len);
            wqb_check(wq_done(q, buf, (size_t)len), "cycle: wq_done");
        }
    }
}

typedef void (*loop_fn)(wq *q, uint64_t first, uint64_t n);

/* One variant; its median, or NaN if it was not run. */
static double cycle_variant(const struct wqb_cfg *c, const char *variant, loop_fn fn,
                            unsigned flags, uint64_t n, const char *ref_name, double ref)
{
    wq *q;
    char name[WQB_NAME_LEN], why[128];
    struct wqb_result r;
    struct wq_options o = { .capacity = 1024, .flags = flags };
    if (!wqb_want(c, variant))
        return NAN;
    int rc = wqb_open_new("cycle", &o, &q, name);
    if (rc < 0 && wqb_prefixed()) {   /* another engine, or none yet */
        wqb_skip_open(c, "cycle", variant, rc);
        return NAN;
    }
    if (rc < 0 && flags) {   /* a mode this build does not have */
        snprintf(why, sizeof why, "wq_open with flags 0x%x says %s", flags, wq_strerror(rc));
        wqb_skip(c, "cycle", variant, why);
        return NAN;
    }
    wqb_check(rc, "cycle: wq_open");
    wqb_result_init(&r, "cycle", variant, "cycles/s");
    fn(q, 0, n < 1000 ? n : 1000);   /* warm up: fault in, settle caches */
    for (int rep = 0; rep < wqb_reps(c); rep++) {
        uint64_t t0 = wqb_now();
        fn(q, (uint64_t)rep * n, n);   /* new keys each rep, as k0..kN-1 */
        uint64_t t1 = wqb_now();
        wqb_result_add(&r, (double)n * 1e9 / (double)(t1 - t0));
    }
    struct wq_stats st;
    rc = wq_stats(q, &st);
    if (rc != -ENOTSUP) {   /* an engine may not count */
        wqb_check(rc, "wq_stats");
        if (st.live != 0)
            wqb_die("cycle: %llu keys left live", (unsigned long long)st.live);
    }
    double median = wqb_median(r.v, r.reps);
    wqb_result_extra(&r, "n", (double)n, WQB_X_INT);
    wqb_result_extra(&r, "ns_per_cycle", 1e9 / median,
                     wqb_prefixed() ? WQB_X_NS : WQB_X_NUM);   /* us on a server */
    if (ref_name && ref > 0)
        wqb_result_extra(&r, ref_name, median / ref, WQB_X_NUM);
    wqb_emit(c, &r);
    wqb_queue_destroy(q, name);
    return median;
}

double wqb_cycle_variant(const struct wqb_cfg *c, const char *variant, enum wqb_loop loop,
                         unsigned flags, uint64_t n, const char *ref_name, double ref)
{
    static const loop_fn fns[] = {
        [WQB_LOOP_MEMORY] = loop_memory,
        [WQB_LOOP_DONE_GET] = loop_done_get,
        [WQB_LOOP_ADD_MANY] = loop_add_many,
    };
    return cycle_variant(c, variant, fns[loop], flags, n, ref_name, ref);
}

#ifndef WQ_NO_METRICS
#define WQ_NO_METRICS 0   /* a library without metrics: same as "memory" */
#endif

void wqb_run_cycle(const struct wqb_cfg *c)
{
    uint64_t n = wqb_size(c, 200000, 1000000);
    cycle_variant(c, "memory", loop_memory, 0, n, NULL, 0);
    cycle_variant(c, "done_get", loop_done_get, 0, n, NULL, 0);
    cycle_variant(c, "add_many", loop_add_many, 0, n, NULL, 0);
    cycle_variant(c, "no_metrics", loop_memory, WQ_NO_METRICS, n, NULL, 0);
    cycle_variant(c, "fair", loop_memory, WQ_FAIR, n, NULL, 0);
}

/* ------------------------------------------------------------------ */
/* scale                                                               */
/* ------------------------------------------------------------------ */

static NOINLINE void loop_rotate(wq *q, uint64_t n)
{
    char buf[WQB_BUF_LEN];
    for (uint64_t i = 0; i < n; i++) {
        int len = wq_get(q, buf, sizeof buf, 0);
        if (len != WQB_KEY_LEN)
            wqb_die("scale: wq_get returned %d", len);
        wqb_check(wq_done(q, buf, (size_t)len), "scale: wq_done");
        if (wq_add(q, buf, (size_t)len) != 0)
            wqb_die("scale: re-add did not queue the key");
    }
}

static void scale_one(const struct wqb_cfg *c, uint64_t live, uint64_t rotations)
{
    wq *q;
    char name[WQB_NAME_LEN], variant[32];
    struct wqb_result r;
    struct wq_stats st;
    snprintf(variant, sizeof variant, "L=1e%d", (int)(0.5 + log10((double)live)));
    if (!wqb_want(c, variant))
        return;
    wqb_queue_create("scale", (uint32_t)live, &q, name);
    wqb_check(wq_stats(q, &st), "wq_stats");
    uint64_t base = st.region_used;
    uint64_t t0 = wqb_now();
    wqb_fill(q, 0, live);
    uint64_t fill_ns = wqb_now() - t0;
    wqb_result_init(&r, "scale", variant, "cycles/s");
    loop_rotate(q, rotations < 1000 ? rotations : 1000);   /* warm up */
    for (int rep = 0; rep < wqb_reps(c); rep++) {
        t0 = wqb_now();
        loop_rotate(q, rotations);
        uint64_t t1 = wqb_now();
        wqb_result_add(&r, (double)rotations * 1e9 / (double)(t1 - t0));
    }
    wqb_check(wq_stats(q, &st), "wq_stats");   /* with what handing keys out took */
    wqb_result_extra(&r, "live", (double)live, WQB_X_INT);
    wqb_result_extra(&r, "rotations", (double)rotations, WQB_X_INT);
    wqb_result_extra(&r, "bytes_per_key", (double)st.region_used / (double)live, WQB_X_NUM);
    wqb_result_extra(&r, "added_per_key", (double)(st.region_used - base) / (double)live,
                     WQB_X_NUM);
    wqb_result_extra(&r, "region_used", (double)st.region_used, WQB_X_INT);
    wqb_result_extra(&r, "region_bytes", (double)st.region_bytes, WQB_X_INT);
    wqb_result_extra(&r, "fill_ns_per_key", (double)fill_ns / (double)live, WQB_X_NUM);
    wqb_emit(c, &r);
    wqb_queue_destroy(q, name);
}

/* What a default queue holds in /dev/shm when nothing is in it yet. */
static void footprint(const struct wqb_cfg *c)
{
    wq *q;
    char name[WQB_NAME_LEN], path[WQB_NAME_LEN + 16];
    struct wqb_result r;
    struct wq_stats st;
    struct stat sb;
    struct wq_options o = { .max_key_len = 256 };   /* wq.h's default (0 -> 256);
                                                       wqb_open_new's 0 means 12 */
    if (!wqb_want(c, "footprint"))
        return;
    wqb_check(wqb_open_new("footprint", &o, &q, name), "wq_open (default options)");
    wqb_check(wq_stats(q, &st), "wq_stats");
    snprintf(path, sizeof path, "/dev/shm/wq.%s", name);
    if (stat(path, &sb) < 0)
        wqb_die("footprint: stat %s: %s", path, strerror(errno));
    wqb_result_init(&r, "scale", "footprint", "bytes");
    wqb_result_add(&r, (double)sb.st_blocks * 512.0);
    wqb_result_extra(&r, "region_bytes", (double)st.region_bytes, WQB_X_INT);
    wqb_result_extra(&r, "capacity", (double)st.capacity, WQB_X_INT);
    wqb_result_extra(&r, "max_key_len", (double)wq_max_key_len(q), WQB_X_INT);
    wqb_result_extra(&r, "result_capacity", (double)st.result_capacity, WQB_X_INT);
    wqb_emit(c, &r);
    wqb_queue_destroy(q, name);
}

/* Default options (capacity 65536, max_key_len 256), n live keys of len
   bytes: the /dev/shm bytes they take per key, queued, and again once
   each was handed out and finished with a 16-byte result message. The
   `scale` L rows size the queue to L, which hides what a queue pays
   between growths of its index and ring; these rows do not. */
static void footprint_keys(const struct wqb_cfg *c, const char *variant, int len, int n)
{
    wq *q;
    char name[WQB_NAME_LEN], k[64], buf[256];
    struct wqb_result r;
    struct wq_stats st;
    struct wq_options o = { .max_key_len = 256 };
    if (!wqb_want(c, variant))
        return;
    wqb_result_init(&r, "scale", variant, "bytes/key");
    for (int rep = 0; rep < wqb_reps(c); rep++) {
        wqb_check(wqb_open_new(variant, &o, &q, name), "wq_open (default options)");
        wqb_check(wq_stats(q, &st), "wq_stats");
        uint64_t base = st.region_used;
        for (int i = 0; i < n; i++) {
            /* a controller's "namespace/name", or a short numbered key */
            if (len == 40)
                snprintf(k, sizeof k, "namespace-%02d/object-%020d", i % 100, i);
            else
                snprintf(k, sizeof k, "k%0*d", len - 1, i);
            wqb_check(wq_add(q, k, (size_t)len), "footprint: wq_add");
        }
        wqb_check(wq_stats(q, &st), "wq_stats");
        wqb_result_add(&r, (double)(st.region_used - base) / n);
        for (int i = 0; i < n; i++) {
            int got = wq_get(q, buf, sizeof buf, 0);
            if (got != len)
                wqb_die("%s: wq_get returned %d", variant, got);
            wqb_check(wq_finish(q, buf, (size_t)got, 0, "reconciled fine."), "wq_finish");
        }
        wqb_check(wq_stats(q, &st), "wq_stats");
        if (rep == 0)
            wqb_result_extra(&r, "with_result", (double)(st.region_used - base) / n,
                             WQB_X_NUM);
        wqb_queue_destroy(q, name);
    }
    wqb_result_extra(&r, "live", n, WQB_X_INT);
    wqb_emit(c, &r);
}

void wqb_run_scale(const struct wqb_cfg *c)
{
    footprint(c);
    footprint_keys(c, "keys40", 40, 50000);
    footprint_keys(c, "keys40-1e4", 40, 10000);
    footprint_keys(c, "keys40-1e3", 40, 1000);
    footprint_keys(c, "keys12", 12, 50000);
    footprint_keys(c, "keys12-1e4", 12, 10000);
    footprint_keys(c, "keys12-1e3", 12, 1000);
    uint64_t rotations = wqb_size(c, 200000, 1000000);
    uint64_t top = c->mode == WQB_FULL ? 10000000 : 1000000;
    for (uint64_t live = 1000; live <= top; live *= 10)
        scale_one(c, live, rotations);
}

/* ------------------------------------------------------------------ */
/* durable                                                             */
/* ------------------------------------------------------------------ */

static const struct {
    const char *variant;
    int durability;
    uint64_t quick, dflt;   /* fsync commits are slow: fewer keys */
} durable_variants[] = {
    { "process", WQ_DURABLE_PROCESS, 20000, 100000 },
    { "fsync", WQ_DURABLE_FSYNC, 500, 2000 },
    { "none", WQ_DURABLE_NONE, 20000, 100000 },
};

/* Open a store-backed queue in a fresh directory; rc < 0 means skip. */
static int durable_open(int durability, char dir[WQB_DIR_LEN], char name[WQB_NAME_LEN], wq **q)
{
    int rc = wqb_temp_dir("store", dir);
    if (rc < 0)
        return rc;
    struct wq_options o = { .capacity = 1024, .store_path = dir,
                            .durability = durability };
    rc = wqb_open_new("durable", &o, q, name);
    if (rc < 0)
        wqb_unregister_path(dir);
    return rc;
}

static void durable_variant(const struct wqb_cfg *c, int i)
{
    char dir[WQB_DIR_LEN], name[WQB_NAME_LEN], why[160];
    wq *q;
    if (!wqb_want(c, durable_variants[i].variant))
        return;
    int rc = durable_open(durable_variants[i].durability, dir, name, &q);
    if (rc < 0) {
        snprintf(why, sizeof why, "LMDB store not built: wq_open with store_path says %s",
                 wq_strerror(rc));
        wqb_skip(c, "durable", durable_variants[i].variant, why);
        return;
    }
    uint64_t n = wqb_size(c, durable_variants[i].quick, durable_variants[i].dflt);
    struct wqb_result r;
    wqb_result_init(&r, "durable", durable_variants[i].variant, "cycles/s");
    for (int rep = 0; rep < wqb_reps(c); rep++) {
        uint64_t t0 = wqb_now();
        loop_memory(q, (uint64_t)rep * n, n);
        wqb_result_add(&r, (double)n * 1e9 / (double)(wqb_now() - t0));
    }
    wqb_result_extra(&r, "n", (double)n, WQB_X_INT);
    wqb_emit(c, &r);
    wqb_queue_destroy(q, name);
    wqb_unregister_path(dir);
}

/* fsync-p2: the fsync cycle in two processes at once, n/2 cycles each
   (keys of their own, any key taken back): what group commit shares.
   Compare with fsync (one process): the goal is 1.7x. */
struct dur2_shared {
    struct wqb_gate gate;
    uint64_t end[2];
};

static void dur2_child(const char *name, struct dur2_shared *sh, int id, uint64_t n)
{
    wq *q = wqb_attach(name);
    char k[WQB_KEY_LEN], buf[WQB_BUF_LEN];
    wqb_key(k, (uint64_t)id * 1000000000ull);
    wqb_gate_arrive(&sh->gate);
    for (uint64_t i = 0; i < n; i++, wqb_key_next(k)) {
        wqb_check(wq_add(q, k, WQB_KEY_LEN), "durable fsync-p2: wq_add");
        /* The other process may have taken ours: any key will do, and
           one always comes (as many adds as gets in all). */
        int len = wq_get(q, buf, sizeof buf, WQ_SEC(10));
        if (len < 0)
            wqb_die("durable fsync-p2: wq_get: %s", wq_strerror(len));
        wqb_check(wq_done(q, buf, (size_t)len), "durable fsync-p2: wq_done");
    }
    sh->end[id] = wqb_now();
    wq_close(q);
    _exit(0);
}

static void durable_two(const struct wqb_cfg *c)
{
    char dir[WQB_DIR_LEN], name[WQB_NAME_LEN];
    wq *q;
    if (!wqb_want(c, "fsync-p2"))
        return;
    if (durable_open(WQ_DURABLE_FSYNC, dir, name, &q) < 0) {
        wqb_skip(c, "durable", "fsync-p2", "LMDB store not built");
        return;
    }
    uint64_t n = wqb_size(c, 500, 2000);
    struct wqb_result r;
    wqb_result_init(&r, "durable", "fsync-p2", "cycles/s");
    for (int rep = 0; rep < wqb_reps(c); rep++) {
        struct dur2_shared *sh = wqb_shared_alloc(sizeof *sh);
        pid_t pid[2];
        for (int i = 0; i < 2; i++)
            if ((pid[i] = wqb_fork()) == 0)
                dur2_child(name, sh, i, n / 2);
        uint64_t t0 = wqb_gate_release(&sh->gate, 2), end = t0;
        for (int i = 0; i < 2; i++) {
            wqb_wait_child(pid[i]);
            end = sh->end[i] > end ? sh->end[i] : end;
        }
        wqb_shared_free(sh, sizeof *sh);
        wqb_result_add(&r, (double)(n / 2 * 2) * 1e9 / (double)(end - t0));
    }
    wqb_result_extra(&r, "n", (double)n, WQB_X_INT);
    wqb_emit(c, &r);
    wqb_queue_destroy(q, name);
    wqb_unregister_path(dir);
}

/* The one-sync floor (see the top of this file). */
static void durable_one_sync(const struct wqb_cfg *c)
{
    enum { SLOTS = 256, SLOT = 4096, REC = 512 };
    if (!wqb_want(c, "one-sync"))
        return;
    char dir[WQB_DIR_LEN], path[96], rec[REC];
    int rc = wqb_temp_dir("sync", dir);
    if (rc < 0)
        wqb_die("durable one-sync: mkdtemp: %s", strerror(-rc));
    snprintf(path, sizeof path, "%s/journal", dir);
    /* Written (not just allocated) and synced first: a synced write into
       an unwritten extent also commits the file system's journal. */
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        wqb_die("durable one-sync: %s: %s", path, strerror(errno));
    memset(rec, 0, sizeof rec);
    for (off_t o = 0; o < (off_t)SLOTS * SLOT; o += REC)
        if (pwrite(fd, rec, REC, o) != REC)
            wqb_die("durable one-sync: %s: write: %s", path, strerror(errno));
    if (fsync(fd) != 0)
        wqb_die("durable one-sync: %s: fsync: %s", path, strerror(errno));
    close(fd);
    if ((fd = open(path, O_RDWR | O_DSYNC)) < 0)
        wqb_die("durable one-sync: %s: %s", path, strerror(errno));
    uint64_t n = wqb_size(c, 500, 2000);
    struct wqb_result r;
    wqb_result_init(&r, "durable", "one-sync", "cycles/s");
    for (int rep = 0; rep < wqb_reps(c); rep++) {
        uint64_t t0 = wqb_now();
        for (uint64_t i = 0; i < n; i++) {
            memcpy(rec, &i, sizeof i);
            if (pwrite(fd, rec, REC, (off_t)(i % SLOTS) * SLOT) != REC)
                wqb_die("durable one-sync: %s: write: %s", path, strerror(errno));
        }
        wqb_result_add(&r, (double)n * 1e9 / (double)(wqb_now() - t0));
    }
    wqb_result_extra(&r, "n", (double)n, WQB_X_INT);
    wqb_emit(c, &r);
    close(fd);
    wqb_unregister_path(dir);
}

void wqb_run_durable(const struct wqb_cfg *c)
{
    for (size_t i = 0; i < sizeof durable_variants / sizeof durable_variants[0]; i++)
        durable_variant(c, (int)i);
    durable_two(c);
    wqb_peer_sqlite(c);
    durable_one_sync(c);
}

/* ------------------------------------------------------------------ */
/* restore                                                             */
/* ------------------------------------------------------------------ */

/* A store holding keys 0..n-1 and no region; the time of the snapshot. */
static double restore_prepare(const char *dir, uint64_t n, char name[WQB_NAME_LEN])
{
    wq *q;
    struct wq_options o = { .capacity = (uint32_t)n, .store_path = dir,
                            .durability = WQ_DURABLE_NONE,
                            .snapshot_interval_ms = 3600 * 1000 };
    wqb_check(wqb_open_new("restore", &o, &q, name), "restore: wq_open");
    wqb_fill(q, 0, n);
    uint64_t t0 = wqb_now();
    int rc = wq_snapshot(q);
    double ns = (double)(wqb_now() - t0);
    if (rc < 0)
        wqb_die("restore: wq_snapshot: %s", wq_strerror(rc));
    wq_close(q);
    wqb_check(wq_unlink(name), "restore: wq_unlink");
    return ns;
}

/* Rebuild the region from the store once; remove it again. */
static double restore_once(const char *dir, const char *name, uint64_t n)
{
    wq *q;
    struct wq_stats st;
    struct wq_options o = { .store_path = dir, .flags = WQ_CREATE | WQ_EXCL };
    uint64_t t0 = wqb_now();
    int rc = wq_open(name, &o, &q);
    double ns = (double)(wqb_now() - t0);
    wqb_check(rc, "restore: wq_open from the store");
    wqb_check(wq_stats(q, &st), "wq_stats");
    if (st.live != n)
        wqb_die("restore: %llu keys restored of %llu", (unsigned long long)st.live,
                (unsigned long long)n);
    wq_close(q);
    wqb_check(wq_unlink(name), "restore: wq_unlink");
    return ns;
}

void wqb_run_restore(const struct wqb_cfg *c)
{
    char dir[WQB_DIR_LEN], name[WQB_NAME_LEN], why[160];
    wq *probe;
    if (!wqb_want(c, "restore"))
        return;
    int rc = durable_open(WQ_DURABLE_NONE, dir, name, &probe);
    if (rc < 0) {
        snprintf(why, sizeof why, "LMDB store not built: wq_open with store_path says %s",
                 wq_strerror(rc));
        wqb_skip(c, "recover", "restore", why);
        return;
    }
    wqb_queue_destroy(probe, name);
    wqb_unregister_path(dir);
    uint64_t n = wqb_size(c, 100000, 1000000);
    if ((rc = wqb_temp_dir("store", dir)) < 0)
        wqb_die("mkdtemp: %s", strerror(-rc));
    struct wqb_result r;
    wqb_result_init(&r, "recover", "restore", "ns");
    double snap_ns = restore_prepare(dir, n, name);
    for (int rep = 0; rep < wqb_reps(c); rep++)
        wqb_result_add(&r, restore_once(dir, name, n));
    wqb_result_extra(&r, "live", (double)n, WQB_X_INT);
    wqb_result_extra(&r, "snapshot_ns", snap_ns, WQB_X_NS);
    wqb_emit(c, &r);
    wqb_unregister_path(dir);
}
