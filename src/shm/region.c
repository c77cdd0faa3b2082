/*
 * region.c - create, attach, validate, unlink and list the shm objects of
 * shared-memory queues (engine.c opens handles on top of these).
 *
 * Creation is atomic: the region is built in an unnamed tmpfs file
 * (O_TMPFILE in /dev/shm), fully initialised, and only then linked to
 * /dev/shm/wq.<name>. link() fails with EEXIST when someone else won the
 * race, which gives O_EXCL semantics without ever exposing a half-built
 * region. A creator that dies leaves nothing behind.
 *
 * The file is sparse: it has the size of the whole layout (so every
 * process maps it once, whole, and nothing ever moves), but only the
 * fixed sections' pages are reserved at creation, with posix_fallocate.
 * The entries (with their heap and fair slots), the result slots, the
 * key arena and the delay heap are reserved as keys and results arrive,
 * a page at a time up to 64 KiB, then to the next multiple of 64 KiB
 * while a 32nd of what is there is less, then by a 32nd (step_to), under
 * the lock and before anything is written
 * there; layout.h says what is never touched past them. The index and
 * the ring start at a page each and grow (the index doubles, the ring by
 * a quarter; shm.h) into their other area (table.c, ring.c) through
 * wq__region_reserve_area. Reserving is
 * what makes a full /dev/shm an -ENOSPC for the add that needed the room
 * instead of a SIGBUS in whoever touched the page first. A process that
 * dies during a growth leaves at most some reserved pages that the next
 * growth reserves again (a no-op): the counts move only after success.
 *
 * Attaching trusts nothing: magic, version, header size, the geometry
 * recomputed from (capacity, max_key_len, max_procs), the checksum and the
 * object size must all agree, else -EPROTO. The validated geometry is
 * copied into the handle and never re-read.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "shm.h"

#define SHM_DEFAULT_DIR "/dev/shm"
#define SHM_DIR wq__shm_dir()
#define SHM_PREFIX "wq."

/* Where shared-memory queues live: $WQ_SHM_DIR, an absolute path (a
   tmpfs mounted with huge pages, say), else /dev/shm. Read at each use
   (an open, a create, a listing), so a process can change it between. */
const char *wq__shm_dir(void)
{
    const char *d = getenv("WQ_SHM_DIR");
    return d && d[0] ? d : SHM_DEFAULT_DIR;
}

/* A WQ_SHM_DIR that is not an absolute path, or too long for a region's
   path, is refused (with a message) rather than guessed at. */
static bool dir_ok(void)
{
    const char *d = wq__shm_dir();
    if (d[0] == '/' && strlen(d) <= WQ_MAX_SHM_DIR)
        return true;
    wq__errf("WQ_SHM_DIR '%.64s%s': %s", d, strlen(d) > 64 ? "..." : "",
             d[0] != '/' ? "not an absolute path" : "longer than 200 bytes");
    return false;
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* The region's layout for a conf (options.c checked it). */
int wq__geometry(struct wq_geom *g, const struct wq_conf *c)
{
    if (wq__conf_valid(c) < 0)
        return -EINVAL;
    uint32_t capacity = c->capacity, max_key_len = c->max_key_len;
    uint32_t max_procs = c->max_procs, result_capacity = c->result_capacity;
    bool store = c->has_store, fair = c->flags & WQ_FAIR;
    memset(g, 0, sizeof *g);
    g->magic = WQ_MAGIC;
    g->version = WQ_LAYOUT_VER;
    g->hdr_size = sizeof(struct wq_hdr);
    g->capacity = capacity;
    g->max_key_len = max_key_len;
    g->max_procs = max_procs;
    g->entry_size = sizeof(struct wq_entry);
    /* Keys longer than an entry holds, result messages longer than a
       slot holds and processing keys' run records go to the arena
       (keys.c). Its virtual room: the most that can be live (`capacity`
       of the longest keys with a run record each, `result_capacity` of
       the longest messages), a gap shorter than the longest block beside
       each live block, and one more longest block (keys.c says why). Its
       block addresses are 32-bit granule numbers. */
    uint32_t kg = (uint32_t)WQ_GRAINS(wq__key_tail(max_key_len));
    uint32_t mg = WQ_GRAINS(WQ_MSG_MAX);
    uint32_t cg = kg > mg ? kg : mg;
    cg = cg > WQ_RUN_GRAINS ? cg : WQ_RUN_GRAINS;
    uint64_t live = (uint64_t)capacity * (kg + WQ_RUN_GRAINS) + (uint64_t)result_capacity * mg;
    uint64_t blocks = (kg ? 2ull : 1ull) * capacity + result_capacity;
    uint64_t kmax = live + blocks * (cg - 1) + cg;
    g->key_max = kmax < UINT32_MAX ? (uint32_t)kmax : UINT32_MAX - 1;
    g->key_classes = cg + 1;
    /* Load factor at most 0.5 when full keeps linear probing short (at
       0.8 a queue of 1e7 keys rotated 27% slower); +1 so a full table
       always has an empty slot to end probes. Two areas of that size,
       virtual only: the index grows into the other one (table.c). */
    uint64_t slots = 2 * (uint64_t)capacity + 1;
    if (slots > UINT32_MAX)
        slots = UINT32_MAX;
    g->index_max = (uint32_t)slots;
    uint64_t off = align_up(sizeof(struct wq_hdr), WQ_ALIGN);
    g->off_procs = off;
    off = align_up(off + (uint64_t)max_procs * sizeof(struct wq_proc), WQ_ALIGN);
    g->off_kfree = off;
    off = align_up(off + (uint64_t)g->key_classes * sizeof(uint32_t), WQ_ALIGN);
    g->off_entries = off;
    off = align_up(off + (uint64_t)capacity * g->entry_size, WQ_ALIGN);
    /* Page-aligned areas: a growth gives the old one's pages back. */
    g->off_index = align_up(off, 4096);
    off = align_up(g->off_index + (uint64_t)g->index_max * sizeof(struct wq_islot), 4096);
    g->off_index_b = off;
    off = align_up(off + (uint64_t)g->index_max * sizeof(struct wq_islot), 4096);
    /* The ring too grows with the entries used (ring.c), in two areas. */
    g->off_ring = off;
    off = align_up(off + (uint64_t)capacity * sizeof(uint32_t), 4096);
    g->off_ring_b = off;
    off = align_up(off + (uint64_t)capacity * sizeof(uint32_t), WQ_ALIGN);
    g->off_heap = off;
    off = align_up(off + (uint64_t)capacity * sizeof(uint32_t), WQ_ALIGN);
    g->off_results = off;
    g->result_capacity = result_capacity;
    off = align_up(off + (uint64_t)result_capacity * sizeof(struct wq_rslot), WQ_ALIGN);
    g->off_sq = off;
    /* The store queue and change counts exist only for queues with a store. */
    off = align_up(off + (store ? (uint64_t)capacity * sizeof(uint32_t) : 0), WQ_ALIGN);
    g->off_sgen = off;
    off = align_up(off + (store ? (uint64_t)capacity * sizeof(uint32_t) : 0), WQ_ALIGN);
    g->has_store = store;
    /* Fair-mode sections only for WQ_FAIR queues. */
    uint64_t fcap = fair ? capacity : 0;
    uint32_t tags = 0;
    if (fair) {
        tags = 1;
        /* Small enough to stay in cache (512 KiB at most): one lookup per
           add must not cost a miss. */
        while (tags < 4ull * capacity && tags < (1u << 16))
            tags <<= 1;
    }
    g->ftag_slots = tags;
    g->flags = c->flags;
    g->mode = c->mode;
    g->durability = c->durability;
    g->snapshot_ms = c->snapshot_ms;
    g->fair_share = c->fair_share;
    g->tenant_sep = c->tenant_sep;
    g->rl_limiters = c->rl_limiters;
    g->rl_burst = c->rl_burst;
    g->rl_base_delay_ns = c->rl_base_delay_ns;
    g->rl_max_delay_ns = c->rl_max_delay_ns;
    g->rl_qps = c->rl_qps;
    g->rl_fast_delay_ns = c->rl_fast_delay_ns;
    g->rl_slow_delay_ns = c->rl_slow_delay_ns;
    g->rl_max_fast_attempts = c->rl_max_fast_attempts;
    g->off_fx = off;
    off = align_up(off + fcap * sizeof(struct wq_fx), WQ_ALIGN);
    g->off_fheap_p = off;
    off = align_up(off + fcap * sizeof(uint32_t), WQ_ALIGN);
    g->off_fheap_a = off;
    off = align_up(off + fcap * sizeof(uint32_t), WQ_ALIGN);
    g->off_ftags = off;
    off = align_up(off + (uint64_t)tags * sizeof(uint64_t), WQ_ALIGN);
    /* Lanes only where adds may be published (lanes.c). Reserved at the
       first lane taken, not at creation: a queue nobody publishes to
       does not pay for them. */
    g->off_lanes = off;
    off = align_up(off + (fair || store ? 0 : WQ_LANES * sizeof(struct wq_lane)), WQ_ALIGN);
    g->off_keys = off;
    off = align_up(off + (uint64_t)g->key_max * WQ_KEY_GRAIN, 4096);
    g->total_size = off;
    return 0;
}

/* A header's settings as a conf (to validate, or to compare with). */
void wq__geom_conf(const struct wq_geom *g, struct wq_conf *c)
{
    memset(c, 0, sizeof *c);
    c->capacity = g->capacity;
    c->max_key_len = g->max_key_len;
    c->max_procs = g->max_procs;
    c->result_capacity = g->result_capacity;
    c->flags = g->flags;
    c->mode = g->mode;
    c->has_store = g->has_store != 0;
    c->durability = g->durability;
    c->snapshot_ms = g->snapshot_ms;
    c->fair_share = g->fair_share;
    c->tenant_sep = g->tenant_sep;
    c->rl_limiters = g->rl_limiters;
    c->rl_burst = g->rl_burst;
    c->rl_base_delay_ns = g->rl_base_delay_ns;
    c->rl_max_delay_ns = g->rl_max_delay_ns;
    c->rl_qps = g->rl_qps;
    c->rl_fast_delay_ns = g->rl_fast_delay_ns;
    c->rl_slow_delay_ns = g->rl_slow_delay_ns;
    c->rl_max_fast_attempts = g->rl_max_fast_attempts;
}

/* Everything an attacher uses must be what the creator would have
   written for these settings: recompute and compare. */
int wq__region_validate(const struct wq_geom *g, uint64_t file_size)
{
    struct wq_geom want;
    struct wq_conf c;
    if (g->magic != WQ_MAGIC || g->version != WQ_LAYOUT_VER ||
        g->hdr_size != sizeof(struct wq_hdr))
        return -EPROTO;
    if (g->checksum != wq__fnv1a(g, offsetof(struct wq_geom, checksum)))
        return -EPROTO;
    if (g->has_store > 1 || g->store_path[sizeof g->store_path - 1] != 0 ||
        (g->has_store && g->store_path[0] != '/'))
        return -EPROTO;
    wq__geom_conf(g, &c);
    if (wq__geometry(&want, &c) < 0)
        return -EPROTO;
    if (g->entry_size != want.entry_size || g->index_max != want.index_max ||
        g->off_procs != want.off_procs || g->off_entries != want.off_entries ||
        g->off_index != want.off_index || g->off_index_b != want.off_index_b ||
        g->off_ring != want.off_ring || g->off_ring_b != want.off_ring_b ||
        g->off_heap != want.off_heap || g->off_results != want.off_results ||
        g->off_sq != want.off_sq || g->off_sgen != want.off_sgen || g->off_fx != want.off_fx ||
        g->off_fheap_p != want.off_fheap_p || g->off_fheap_a != want.off_fheap_a ||
        g->off_ftags != want.off_ftags || g->ftag_slots != want.ftag_slots ||
        g->off_kfree != want.off_kfree || g->off_keys != want.off_keys ||
        g->off_lanes != want.off_lanes ||
        g->key_max != want.key_max || g->key_classes != want.key_classes ||
        g->total_size != want.total_size || g->total_size != file_size)
        return -EPROTO;
    return 0;
}

/* A new region's times: when it was made, and its first reap, snapshot
   and tokens counted from then. Again when a region built early (while
   its store was read) is filled: its life starts there. */
static void stamp_region(struct wq_hdr *h)
{
    h->g.created_ns = wq__now_real();
    h->last_reap_ns = wq__now_mono();
    h->next_snapshot_ns = h->last_reap_ns + (uint64_t)h->g.snapshot_ms * 1000000ull;
    wq__limiter_init(h);
    h->g.checksum = wq__fnv1a(&h->g, offsetof(struct wq_geom, checksum));
}

/* A fresh (zero-filled) region's initial state; -errno if a lock cannot
   be made robust and process-shared (nothing is published then). */
static int init_region(unsigned char *base, const struct wq_geom *g)
{
    struct wq_hdr *h = (struct wq_hdr *)base;
    h->g = *g;
    int rc = wq__mutex_init(&h->lock);
    if (rc == 0)
        rc = wq__mutex_init(&h->flush_lock);
    struct wq_proc *procs = (struct wq_proc *)(base + g->off_procs);
    for (uint32_t i = 0; i < g->max_procs && rc == 0; i++)
        rc = wq__mutex_init(&procs[i].lease);
    if (rc < 0)
        return rc;
    /* Entries and results are neither written nor reserved: a new key
       takes entry e_fresh and sets every field it uses. */
    h->r_free = WQ_NIL;
    h->r_fresh = 0;
    h->r_head = h->r_tail = WQ_NIL;
    h->free_head = WQ_NIL;
    h->e_fresh = 0;
    h->index_at = wq__index_size(g->index_max, 0);   /* area 0 */
    h->ring_at = wq__ring_size(g->capacity, 0);
    stamp_region(h);
    return 0;
}

static int create_tmp(mode_t mode, char *tmpname, size_t cap)
{
    int fd = open(SHM_DIR, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    tmpname[0] = 0;
    if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
        /* No O_TMPFILE: a named temporary, removed once linked. */
        for (int i = 0; i < 100 && fd < 0; i++) {
            unsigned r;
            if (getrandom(&r, sizeof r, 0) != sizeof r)
                r = (unsigned)i;
            snprintf(tmpname, cap, "%s/.wq-tmp.%d.%08x", SHM_DIR, (int)getpid(), r);
            fd = open(tmpname, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
            if (fd < 0 && errno != EEXIST)
                break;
        }
    }
    if (fd < 0)
        return -errno;
    /* umask must not decide the mode: the caller asked for exactly this. */
    if (fchmod(fd, mode) < 0) {
        int e = -errno;
        close(fd);
        if (tmpname[0])
            unlink(tmpname);
        return e;
    }
    return fd;
}

static int publish(int fd, const char *tmpname, const char *path)
{
    char proc[64];
    int rc;
    if (tmpname[0]) {
        rc = link(tmpname, path);
        int e = errno;
        unlink(tmpname);
        return rc < 0 ? -e : 0;
    }
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    rc = linkat(AT_FDCWD, proc, AT_FDCWD, path, AT_SYMLINK_FOLLOW);
    if (rc < 0 && errno == ENOENT)   /* no /proc: needs CAP_DAC_READ_SEARCH */
        rc = linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH);
    return rc < 0 ? -errno : 0;
}

/* Reserve the pages of [off, off + len) of the shm object: 0, -ENOSPC
   when tmpfs (or its size limit) refuses, -errno otherwise. */
static int reserve(int fd, uint64_t off, uint64_t len)
{
    if (len == 0)
        return 0;
    int rc;
    do   /* tmpfs gives up on a signal (older kernels on any) */
        rc = posix_fallocate(fd, (off_t)off, (off_t)len);
    while (rc == EINTR);
    return rc == 0 ? 0 : (rc == EFBIG || rc == ENOSPC || rc == ENOMEM) ? -ENOSPC : -rc;
}

/* Bytes of the first index and ring, which a new region starts with. */
static uint64_t index_bytes(const struct wq_geom *g)
{
    return (uint64_t)wq__index_size(g->index_max, 0) * sizeof(struct wq_islot);
}

static uint64_t ring_bytes(const struct wq_geom *g)
{
    return (uint64_t)wq__ring_size(g->capacity, 0) * sizeof(uint32_t);
}

static uint64_t ftag_bytes(const struct wq_geom *g)
{
    return (uint64_t)g->ftag_slots * sizeof(uint64_t);
}

/* The sections reserved at creation: the header, the process table, the
   key free lists, the store queue and the tenant table, and the first
   index and ring. */
static int reserve_fixed(int fd, const struct wq_geom *g)
{
    int rc = reserve(fd, 0, g->off_entries);   /* header, procs, key lists */
    if (rc == 0)
        rc = reserve(fd, g->off_index, index_bytes(g));
    if (rc == 0)
        rc = reserve(fd, g->off_ring, ring_bytes(g));
    if (rc == 0 && g->has_store)
        rc = reserve(fd, g->off_sq, (uint64_t)g->capacity * sizeof(uint32_t));
    if (rc == 0 && g->ftag_slots)
        rc = reserve(fd, g->off_ftags, ftag_bytes(g));
    return rc;
}

/* Bytes the fixed sections take: what a new queue costs. */
static uint64_t fixed_bytes(const struct wq_geom *g)
{
    return g->off_entries + index_bytes(g) + ring_bytes(g) +
           (g->has_store ? (uint64_t)g->capacity * sizeof(uint32_t) : 0) +
           ftag_bytes(g);
}

/* One growth step, at most to the section's capacity: below 64 KiB, a
   page at a time (to the end of a page of the section's own array, of
   `own` bytes from `off`: that page is reserved whole anyway); then to
   the next multiple of 64 KiB (the grid a first step of 64 KiB made)
   while a 32nd of what there is is less; then by a 32nd. The delay heap
   (`pages`) always ends at a page's end. What is reserved ahead is paid
   for by every key (an eighth was 4 bytes per 40-byte key at 50,000; a
   first step of 64 KiB was 13.5 bytes per 40-byte key of a queue of a
   thousand, and 60 per key of a queue of short keys that needs only a
   few run records in its arena); a growth is one fallocate of pages that
   are needed anyway, so more, smaller ones cost little (filling 1e6 keys
   took 3-5 ns more per key, of 90, with steps of a 32nd instead of an
   eighth). */
static uint32_t step_to(uint32_t have, uint32_t need, uint32_t cap, uint64_t unit,
                        uint64_t off, uint64_t own, bool pages)
{
    uint64_t min_step = (64u * 1024 + unit - 1) / unit;
    uint64_t to = have < min_step ? (uint64_t)have + 1
                : have / 32 > min_step ? (uint64_t)have + have / 32
                : (have / min_step + 1) * min_step;   /* whole steps from 0 */
    if (to < need)
        to = need;
    if (pages || have < min_step)
        to = (align_up(off + to * own, 4096) - off) / own;
    return to > cap ? cap : (uint32_t)to;
}

static int grow_fail(shmq *q, int rc, const char *what, uint32_t to, uint64_t bytes)
{
    struct statvfs vfs;
    if (rc == -ENOSPC && q->fd >= 0 && fstatvfs(q->fd, &vfs) == 0)
        wq__errf("queue '%s': no room in %s to grow its region to %u %s "
                 "(%llu bytes more, %llu free)", q->pub.name, SHM_DIR, to, what,
                 (unsigned long long)bytes,
                 (unsigned long long)vfs.f_bavail * vfs.f_frsize);
    else
        wq__errf("queue '%s': cannot grow its region in %s to %u %s: %s",
                 q->pub.name, SHM_DIR, to, what, strerror(-rc));
    return rc;
}

/* reserve(), in q's region; a restore then writes every page it reserves
   at once, so they are mapped too. */
static int reserve_in(const shmq *q, uint64_t off, uint64_t len)
{
    int rc = reserve(q->fd, off, len);
    if (rc == 0 && q->restoring)
        wq__mem_populate(q->base + off, (size_t)len, MADV_POPULATE_WRITE);
    return rc;
}

/* Reserve entries [from, to) with their fair slots (and with a store
   their heap slots and change counts); the bytes per entry in *unit. */
static int reserve_entries(const shmq *q, uint32_t from, uint32_t to, uint64_t *unit)
{
    const struct wq_geom *g = &q->g;
    struct { uint64_t off, size; } part[6] = {
        { g->off_entries, g->entry_size },
        { g->off_heap, g->has_store ? sizeof(uint32_t) : 0 },   /* else on demand */
        { g->off_sgen, g->has_store ? sizeof(uint32_t) : 0 },
        { g->off_fx, q->fair ? sizeof(struct wq_fx) : 0 },
        { g->off_fheap_p, q->fair ? sizeof(uint32_t) : 0 },
        { g->off_fheap_a, q->fair ? sizeof(uint32_t) : 0 },
    };
    int rc = 0;
    *unit = 0;
    for (int i = 0; i < 6; i++) {
        *unit += part[i].size;
        if (rc == 0 && to > from)
            rc = reserve_in(q, part[i].off + from * part[i].size, (to - from) * part[i].size);
    }
    return rc;
}

static int reserve_results(const shmq *q, uint32_t from, uint32_t to)
{
    uint64_t unit = sizeof(struct wq_rslot);
    return to > from ? reserve_in(q, q->g.off_results + from * unit, (to - from) * unit) : 0;
}

static int reserve_keys(const shmq *q, uint32_t from, uint32_t to)
{
    return to > from ? reserve_in(q, q->g.off_keys + (uint64_t)from * WQ_KEY_GRAIN,
                                  (uint64_t)(to - from) * WQ_KEY_GRAIN) : 0;
}

static int reserve_heap(const shmq *q, uint32_t from, uint32_t to)
{
    uint64_t unit = sizeof(uint32_t);
    return to > from ? reserve_in(q, q->g.off_heap + from * unit, (to - from) * unit) : 0;
}

/* The delay heap's slots with pages: with a store, the entries'. */
static void heap_view(shmq *q, uint32_t grown)
{
    q->gheap = grown;
    q->nheap = q->g.has_store ? q->nent : grown;
}

enum sect { S_ENT, S_RES, S_KEY, S_HEAP };

/* One growth step of the entries, the result slots or the key arena. */
static int grow(shmq *q, enum sect s, uint32_t need)
{
    WQ_ASSERT_LOCKED(q);
    static const char *const what[] = { "entries", "result slots", "key arena granules",
                                        "delay heap slots" };
    static const char *const point[] = { "region.grow.entries", "region.grow.results",
                                         "region.grow.keys", "region.grow.heap" };
    uint32_t have = s == S_ENT ? q->nent : s == S_RES ? q->nres : s == S_KEY ? q->nkeys
                  : q->nheap;
    uint32_t cap = s == S_ENT || s == S_HEAP ? q->capacity
                 : s == S_RES ? q->result_capacity : q->g.key_max;
    if (need <= have)
        return 0;
    if (need > cap)
        return -ENOSPC;
    uint64_t unit = s == S_RES ? sizeof(struct wq_rslot) : s == S_HEAP ? sizeof(uint32_t)
                  : WQ_KEY_GRAIN;
    if (s == S_ENT)
        reserve_entries(q, 0, 0, &unit);   /* the unit only */
    uint64_t off = s == S_RES ? q->g.off_results : s == S_KEY ? q->g.off_keys
                 : s == S_HEAP ? q->g.off_heap : q->g.off_entries;
    uint64_t own = s == S_ENT ? q->g.entry_size : unit;   /* the entry array alone */
    uint32_t to = step_to(have, need, cap, unit, off, own, s == S_HEAP);
    int rc = WQ_FAIL("region.grow") || (s == S_HEAP && WQ_FAIL("region.grow.heap")) ? -ENOSPC
           : s == S_RES ? reserve_results(q, have, to)
           : s == S_KEY ? reserve_keys(q, have, to)
           : s == S_HEAP ? reserve_heap(q, have, to) : reserve_entries(q, have, to, &unit);
    if (rc < 0)
        return grow_fail(q, rc, what[s], to, (to - have) * unit);
    WQ_STEP(point[s]);
    if (s == S_RES)
        q->hdr->grown_res = q->nres = to;
    else if (s == S_KEY)
        q->hdr->grown_keys = q->nkeys = to;
    else if (s == S_HEAP)
        heap_view(q, q->hdr->grown_heap = to);
    else {
        q->hdr->grown_ent = q->nent = to;
        heap_view(q, q->gheap);   /* with a store, the heap's too */
    }
    return 0;
}

/* Where area `area` of the index (ring false) or the ring starts, its
   slot size and its slots. */
static uint64_t area_off(const shmq *q, bool ring, unsigned area, uint64_t *unit,
                         uint64_t *slots)
{
    *unit = ring ? sizeof(uint32_t) : sizeof(struct wq_islot);
    *slots = ring ? q->capacity : q->index_max;
    return ring ? (area ? q->g.off_ring_b : q->g.off_ring)
                : (area ? q->g.off_index_b : q->g.off_index);
}

int wq__region_reserve_area(shmq *q, bool ring, unsigned area, uint32_t slots)
{
    WQ_ASSERT_LOCKED(q);
    uint64_t unit, max, off = area_off(q, ring, area, &unit, &max);
    uint64_t bytes = (uint64_t)slots * unit;
    int rc = WQ_FAIL(ring ? "region.ring" : "region.index") ? -ENOSPC
           : reserve(q->fd, off, bytes);
    if (rc < 0)
        return grow_fail(q, rc, ring ? "ring slots" : "index slots", slots, bytes);
    /* the caller writes there now */
    wq__mem_populate(q->base + off, (size_t)bytes, MADV_POPULATE_WRITE);
    return 0;
}

/* Give the pages of an area's slots from `from` on back (whole pages
   only: the areas are page-aligned, and a page holding a slot below
   `from` is kept). Only an optimisation: a failure (or a death before
   it) leaves pages that the next growth into the area reuses, and the
   next locker or repair releases them too. */
void wq__region_release_area(shmq *q, bool ring, unsigned area, uint32_t from)
{
    uint64_t unit, max, off = area_off(q, ring, area, &unit, &max);
    uint64_t lo = align_up((uint64_t)from * unit, 4096), hi = max * unit;
    if (q->fd >= 0 && hi > lo)
        (void)fallocate(q->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        (off_t)(off + lo), (off_t)(hi - lo));
}

/* The lanes' pages (lanes.c), before the first lane is taken. */
int wq__region_grow_lanes(shmq *q)
{
    WQ_ASSERT_LOCKED(q);
    uint64_t bytes = WQ_LANES * sizeof(struct wq_lane);
    int rc = WQ_FAIL("region.lanes") ? -ENOSPC : reserve_in(q, q->g.off_lanes, bytes);
    return rc < 0 ? grow_fail(q, rc, "lanes", WQ_LANES, bytes) : 0;
}

int wq__region_grow_entries(shmq *q, uint32_t need)
{
    return grow(q, S_ENT, need);
}

int wq__region_grow_results(shmq *q, uint32_t need)
{
    return grow(q, S_RES, need);
}

int wq__region_grow_keys(shmq *q, uint32_t need)
{
    return grow(q, S_KEY, need);
}

int wq__region_grow_heap(shmq *q, uint32_t need)
{
    return q->g.has_store ? (need <= q->nent ? 0 : -ENOSPC) : grow(q, S_HEAP, need);
}

/* The slots of the index (ring false) or ring that the header's word
   `at` names, or 0 if it is damaged: no legal size, too small for the
   entries used (tables only grow before an entry is taken), or pages
   the system will not reserve (so it was never grown to). Reserving
   again is a no-op for pages that are; it runs at a handle's first lock
   and once per growth in each other process. */
static uint32_t area_load(shmq *q, bool ring, uint64_t at)
{
    uint64_t unit, max;
    uint32_t slots = (uint32_t)at, min = ring ? WQ_RING_MIN : WQ_INDEX_MIN;
    unsigned shift = ring ? WQ_RING_SHIFT : WQ_INDEX_SHIFT;
    uint64_t used = wq__entries_used(q), off = area_off(q, ring, (at >> 32) & 1, &unit, &max);
    uint32_t want = ring ? wq__ring_need(q, used) : wq__index_size(q->index_max, used);
    if (WQ_UNLIKELY((at >> 32) > 1 || !wq__area_size_ok(min, (uint32_t)max, slots, shift) ||
                    slots < want || reserve(q->fd, off, (uint64_t)slots * unit) < 0)) {
        q->hdr->corrupt = 1;   /* repair builds one afresh */
        return 0;
    }
    return slots;
}

/* Use the index and ring the header names; a damaged word leaves a view
   with no slots, so every call fails without reading there until repair,
   and is looked at again at the next lock (the complement is "seen"). */
static void areas_load(shmq *q)
{
    uint64_t at = q->hdr->index_at;
    if (at != q->index_seen) {
        uint32_t slots = area_load(q, false, at);
        wq__index_view(q, slots ? (unsigned)(at >> 32) : 0, slots);
        q->index_seen = slots ? at : ~at;
    }
    at = q->hdr->ring_at;
    if (at != q->ring_seen) {
        uint32_t slots = area_load(q, true, at);
        wq__ring_view(q, slots ? (unsigned)(at >> 32) : 0, slots);
        q->ring_seen = slots ? at : ~at;
    }
}

/* wq__region_bounds' slow path: the counts moved, or are corrupt
   (beyond the capacities, or fresh counts past the reserved ones):
   clamped here, so nothing past the reserved part is touched, and
   flagged for repair. */
void wq__region_bounds_load(shmq *q)
{
    struct wq_hdr *h = q->hdr;
    uint32_t ge = h->grown_ent, gr = h->grown_res, gk = h->grown_keys, gh = h->grown_heap;
    /* With a store the heap is the entries' and grown_heap stays 0. */
    uint32_t hcap = q->g.has_store ? 0 : q->capacity;
    if (WQ_UNLIKELY(gh > hcap || (!q->g.has_store && h->heap_count > gh))) {
        /* The heap is a cache of the waiting entries: repair rebuilds it
           within what is reserved here, asking for more if it must. */
        h->corrupt = 1;
        gh = gh > hcap ? (q->gheap <= hcap ? q->gheap : 0)
           : reserve_heap(q, 0, gh) == 0 ? gh : q->gheap;
    }
    if (WQ_UNLIKELY(ge > q->capacity || gr > q->result_capacity || gk > q->g.key_max ||
                    h->e_fresh > ge || h->r_fresh > gr || h->k_top > gk)) {
        /* Which count is wrong is unknown: reserve (again: a no-op for
           pages that are) what either says, within the capacities. If
           the system refuses, keep what the fresh count says, which the
           growth that raised it reserved first (unless the count is the
           damaged one). Repair takes these. */
        h->corrupt = 1;
        uint32_t fe = h->e_fresh < q->capacity ? h->e_fresh : q->capacity;
        uint32_t fr = h->r_fresh < q->result_capacity ? h->r_fresh : q->result_capacity;
        uint32_t fk = h->k_top < q->g.key_max ? h->k_top : q->g.key_max;
        uint32_t we = ge > fe ? (ge < q->capacity ? ge : q->capacity) : fe;
        uint32_t wr = gr > fr ? (gr < q->result_capacity ? gr : q->result_capacity) : fr;
        uint32_t wk = gk > fk ? (gk < q->g.key_max ? gk : q->g.key_max) : fk;
        uint64_t unit;
        /* Refused: the fresh count, if its pages are there (reserving
           them again is a no-op), else what this handle knew was. */
        ge = reserve_entries(q, 0, we, &unit) == 0 ? we
           : reserve_entries(q, 0, fe, &unit) == 0 ? fe : q->nent;
        gr = reserve_results(q, 0, wr) == 0 ? wr : reserve_results(q, 0, fr) == 0 ? fr : q->nres;
        gk = reserve_keys(q, 0, wk) == 0 ? wk : reserve_keys(q, 0, fk) == 0 ? fk : q->nkeys;
    }
    q->nent = ge;
    q->nres = gr;
    q->nkeys = gk;
    heap_view(q, gh);
    areas_load(q);
}

/* Point the handle at a mapped, validated region. */
static void map_view(shmq *q, unsigned char *base, size_t size, const struct wq_geom *g, int fd)
{
    q->fd = fd;
    q->base = base;
    q->size = size;
    q->hdr = (struct wq_hdr *)base;
    q->procs = (struct wq_proc *)(base + g->off_procs);
    q->entries = base + g->off_entries;
    q->iarea[0] = (struct wq_islot *)(base + g->off_index);
    q->iarea[1] = (struct wq_islot *)(base + g->off_index_b);
    q->rarea[0] = (uint32_t *)(base + g->off_ring);
    q->rarea[1] = (uint32_t *)(base + g->off_ring_b);
    wq__ring_view(q, 0, 0);
    q->ring_seen = ~((const struct wq_hdr *)base)->ring_at;
    q->heap = (uint32_t *)(base + g->off_heap);
    q->rslots = (struct wq_rslot *)(base + g->off_results);
    q->sq = g->has_store ? (uint32_t *)(base + g->off_sq) : NULL;
    q->sgen = g->has_store ? (uint32_t *)(base + g->off_sgen) : NULL;
    q->fair = g->flags & WQ_FAIR;
    q->fx = (struct wq_fx *)(base + g->off_fx);
    q->fheap_p = (uint32_t *)(base + g->off_fheap_p);
    q->fheap_a = (uint32_t *)(base + g->off_fheap_a);
    q->ftags = (uint64_t *)(base + g->off_ftags);
    q->kfree = (uint32_t *)(base + g->off_kfree);
    q->karena = base + g->off_keys;
    q->lanes = g->flags & WQ_FAIR || g->has_store ? NULL : (struct wq_lane *)(base + g->off_lanes);
    q->lane = WQ_NIL;
    q->result_capacity = g->result_capacity;
    q->metrics = !(g->flags & WQ_NO_METRICS);
    q->g = *g;
    q->capacity = g->capacity;
    q->max_key_len = g->max_key_len;
    q->max_procs = g->max_procs;
    q->entry_size = g->entry_size;
    q->index_max = g->index_max;
    wq__table_format(q);
    /* No index until the first lock takes the header's (areas_load). */
    wq__index_view(q, 0, 0);
    q->index_seen = ~((const struct wq_hdr *)base)->index_at;
    q->seed = g->hash_seed;
    q->pub.max_key_len = g->max_key_len;
    q->pub.fair = q->fair;
}

/* The queue's name in its region's path, for wq_last_error. */
static const char *qname(const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t n = strlen(SHM_PREFIX);
    return strncmp(base, SHM_PREFIX, n) == 0 ? base + n : path;
}

/* A region being built: an unnamed file in SHM_DIR, mapped whole. */
struct build {
    int fd;
    char tmpname[WQ_REGION_PATH_MAX + 32];
    unsigned char *base;
    struct wq_geom g;
};

static void build_close(struct build *b)
{
    if (b->base)
        munmap(b->base, b->g.total_size);
    if (b->tmpname[0])
        unlink(b->tmpname);
    if (b->fd >= 0)
        close(b->fd);
    b->base = NULL;
    b->tmpname[0] = 0;
    b->fd = -1;
}

/* Make, size, reserve, map and initialise a region of geometry g for
   queue `path`; quiet: leave wq_last_error alone (a try that the caller
   repeats, loudly, if it fails). */
static int build_open(struct build *b, const char *path, const struct wq_geom *g, mode_t mode,
                      bool quiet)
{
    b->g = *g;
    if (getrandom(&b->g.hash_seed, sizeof b->g.hash_seed, 0) != sizeof b->g.hash_seed)
        b->g.hash_seed = wq__now_real() ^ ((uint64_t)getpid() << 32);
#ifdef WQ_FAULT_INJECTION
    /* Crash tests count how often a point is reached; index layout, and
       so the number of backward shifts, depends on the seed. */
    const char *fixed = getenv("WQ_FAULT_HASH_SEED");
    if (fixed)
        b->g.hash_seed = strtoull(fixed, NULL, 0);
#endif
    b->base = NULL;
    int rc = b->fd = create_tmp(mode, b->tmpname, sizeof b->tmpname);
    if (rc < 0) {
        if (!quiet)
            wq__errf("queue '%s': cannot make its region in %s: %s", qname(path), SHM_DIR,
                     rc == -ENOSPC ? "no room left (no free inode)" : strerror(-rc));
        return rc;
    }
    if (ftruncate(b->fd, (off_t)g->total_size) < 0) {
        rc = errno == EFBIG || errno == EINVAL ? -ENOSPC : -errno;
        if (!quiet)
            wq__errf("queue '%s': cannot size its region in %s (%llu bytes): %s",
                     qname(path), SHM_DIR, (unsigned long long)g->total_size, strerror(errno));
        goto fail;
    }
    rc = reserve_fixed(b->fd, g);
    if (rc != 0) {
        /* Not "queue is full": the queue does not exist yet. */
        struct statvfs vfs;
        bool full = rc == -ENOSPC && !quiet && fstatvfs(b->fd, &vfs) == 0;
        if (full)
            wq__errf("queue '%s': no room in %s for its region: it needs %llu "
                     "bytes, %llu are free", qname(path), SHM_DIR,
                     (unsigned long long)fixed_bytes(g),
                     (unsigned long long)vfs.f_bavail * vfs.f_frsize);
        else if (!quiet)
            wq__errf("queue '%s': cannot reserve its region in %s (%llu bytes): %s",
                     qname(path), SHM_DIR, (unsigned long long)fixed_bytes(g),
                     strerror(-rc));
        goto fail;
    }
    void *base = mmap(NULL, g->total_size, PROT_READ | PROT_WRITE, MAP_SHARED, b->fd, 0);
    if (base == MAP_FAILED) {
        rc = -errno;
        goto fail;
    }
    b->base = base;
    if ((rc = init_region(b->base, &b->g)) == 0)
        return 0;
fail:
    build_close(b);
    return rc;
}

/* A view of a region being built, for the restore to fill (restoring:
   nobody else can be restoring into it, and no key comes back twice). */
static void build_view(struct build *b, shmq *view, const char *path)
{
    memset(view, 0, sizeof *view);
    map_view(view, b->base, b->g.total_size, &((struct wq_hdr *)b->base)->g, b->fd);
    wq__region_bounds_load(view);   /* the first index */
    snprintf(view->pub.name, sizeof view->pub.name, "%s", qname(path));
    view->restoring = true;
}

/* The geometry of a queue with options eff (and the store at abs). */
static int geom_of(struct wq_options *eff, const char *abs, struct wq_geom *g, mode_t *mode)
{
    struct wq_conf c;
    struct wq_geom out;
    int rc = wq__options_resolve(eff, &c);
    if (rc == 0)
        rc = wq__geometry(&out, &c);
    if (rc < 0)
        return rc;
    if (c.has_store)
        memcpy(out.store_path, abs, sizeof out.store_path);
    *g = out;
    *mode = (mode_t)c.mode;
    return 0;
}

/*
 * A restore's region, built early. Restoring 1e6 keys writes some 90 MB
 * of new pages, and in a VM the first write to each page costs several
 * microseconds even once mapped (the host maps it then): 0.15-0.2 s on
 * this project's 2-vCPU VM, a third of the restore. The store is read by
 * a child process meanwhile, and the parent, checking what it reads,
 * often waits for it. So once the meta record has arrived, the parent
 * builds the region the store's settings ask for, unlinked, with room for
 * the keys the meta counts (reserved and mapped in one call, as the
 * restore's own first step does), and writes each of those pages in the
 * reader's waits (read.h, `in_wait`). If the store then passes and its
 * settings give the same geometry, the restore fills that region;
 * otherwise it is thrown away, never seen by anyone, and the region is
 * built as before. A store refused meanwhile costs at most a region the
 * size its data file can account for (see early_build). Nothing here is
 * reported: a failure only means the region is built later, where its
 * failures are reported.
 */
struct early {
    const char *path;
    const struct wq_options *opts;   /* before the store's settings */
    const char *abs;
    struct build b;
    struct wq_geom g;                /* as computed: no seed, no time */
    shmq view;
    bool tried, ok;
    unsigned nareas, part;           /* touching areas[part] */
    uint64_t at;                     /* its next byte to touch */
    struct span { unsigned char *p; uint64_t len; } areas[7];
};

static bool early_build(struct early *e, const struct wq_store_img *img)
{
    struct wq_options eff = *e->opts;
    struct stat sb;
    char data[sizeof e->g.store_path + 16];
    mode_t mode;
    snprintf(data, sizeof data, "%s/data.mdb", e->abs);
    if (img->meta.version < 2 || img->meta.records == 0 ||
        stat(data, &sb) < 0 || wq__store_options(&eff, &img->meta) < 0 ||
        geom_of(&eff, e->abs, &e->g, &mode) < 0)
        return false;
    /* The meta's count and settings are not verified yet: what they ask
       for must be what the store's own size can account for (a record
       takes 77 bytes of data.mdb at least, a key 80-112 of the region,
       index included), so a store that lies costs at most about twice
       its size before it is refused. */
    uint32_t n = img->meta.records < e->g.capacity ? (uint32_t)img->meta.records
                                                   : e->g.capacity;
    uint64_t per_key = e->g.entry_size + 3 * sizeof(uint32_t) + 4 * sizeof(struct wq_islot) +
                       ((e->g.flags & WQ_FAIR) ? sizeof(struct wq_fx) + 2 * sizeof(uint32_t) : 0);
    if (fixed_bytes(&e->g) + (uint64_t)n * per_key > 2 * (uint64_t)sb.st_size + (4u << 20) ||
        build_open(&e->b, e->path, &e->g, mode, true) < 0)
        return false;
    build_view(&e->b, &e->view, e->path);
    shmq *q = &e->view;
    if (wq__entry_room(q, n) < 0) {
        build_close(&e->b);
        return false;
    }
    struct span *a = e->areas;
    *a++ = (struct span){ q->entries, (uint64_t)n * q->entry_size };
    *a++ = (struct span){ (unsigned char *)q->index,
                          (uint64_t)q->index_slots * sizeof *q->index };
    *a++ = (struct span){ (unsigned char *)q->heap, (uint64_t)n * sizeof *q->heap };
    if (q->sgen)
        *a++ = (struct span){ (unsigned char *)q->sgen, (uint64_t)n * sizeof *q->sgen };
    if (q->fair) {
        *a++ = (struct span){ (unsigned char *)q->fx, (uint64_t)n * sizeof *q->fx };
        *a++ = (struct span){ (unsigned char *)q->fheap_p, (uint64_t)n * sizeof *q->fheap_p };
        *a++ = (struct span){ (unsigned char *)q->fheap_a, (uint64_t)n * sizeof *q->fheap_a };
    } else {
        *a++ = (struct span){ (unsigned char *)q->ring,
                              (uint64_t)q->ring_slots * sizeof *q->ring };
    }
    e->nareas = (unsigned)(a - e->areas);
    return true;
}

static void early_try(struct early *e, const struct wq_store_img *img)
{
    /* Quiet: whatever the calls below report is said again, if it
       matters, when the region is built as before. */
    char said[512];
    snprintf(said, sizeof said, "%s", wq_last_error());
    e->tried = true;
    e->ok = early_build(e, img);
    if (strcmp(said, wq_last_error()) != 0) {
        wq__err_clear();
        if (said[0])
            wq__errf("%s", said);
    }
}

static bool early_wait(void *arg, const struct wq_store_img *img)
{
    struct early *e = arg;
    if (!e->tried) {
        if (!img->has_meta)
            return false;
        early_try(e, img);
        return true;
    }
    /* Page writes for about the 100 us the reader would sleep (it checks
       what the child wrote meanwhile first). A write, not a read: a read
       maps the page read-only, and the restore's write faults again. An
       atomic or of 0 writes without changing a byte. */
    uint64_t until = wq__clock_mono() + 100000;
    unsigned pages = 0;
    while (e->ok && e->part < e->nareas) {
        if (e->at >= e->areas[e->part].len) {
            e->part++;
            e->at = 0;
            continue;
        }
        __atomic_fetch_or(e->areas[e->part].p + e->at, 0, __ATOMIC_RELAXED);
        e->at += 4096;
        if (++pages % 8 == 0 && wq__clock_mono() >= until)
            break;
    }
    return pages > 0;
}

/* Is the region at path the one that made this claim of its store
   (store/owner.c)? 1 yes, 0 no (gone, not a region of ours), -errno when
   it cannot be looked at. */
static int claim_live(const char *path, uint64_t claim)
{
    /* Looked at before it is opened for reading: a record anyone who
       may write the store may write must not make us open a FIFO or a
       device. An O_PATH descriptor opens nothing; the file it names is
       then opened through /proc (or, without /proc, by path again, with
       the same check after). */
    struct stat ps, st;
    int pfd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (pfd < 0)
        return errno == ENOENT || errno == ELOOP ? 0 : -errno;
    if (fstat(pfd, &ps) < 0) {
        int err = errno;
        close(pfd);
        return -err;
    }
    if (!S_ISREG(ps.st_mode)) {
        close(pfd);
        return 0;   /* a symbolic link, a directory, a device: no region */
    }
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", pfd);
    int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
    int fd = open(proc, flags);
    if (fd < 0 && errno == ENOENT)
        fd = open(path, flags | O_NOFOLLOW);
    int err = errno;
    close(pfd);
    if (fd < 0)
        return err == ENOENT || err == ELOOP ? 0 : -err;
    struct wq_hdr h;
    int rc = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_ino == ps.st_ino &&
             st.st_dev == ps.st_dev &&
             pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.g.magic == WQ_MAGIC &&
             h.g.version == WQ_LAYOUT_VER && h.claim == claim;
    close(fd);
    return rc;
}

/* Build a new region from the options (and its store) and link it at
   path: -EEXIST if one appeared meanwhile, -EBUSY if the store serves
   another queue's region. */
int wq__region_create(const char *path, const struct wq_options *opts)
{
    struct wq_geom g;
    char abs[sizeof g.store_path] = { 0 };
    struct wq_options eff = *opts;
    struct wq_store_img img;
    struct build b = { .fd = -1 };
    struct early e = { .path = path, .abs = abs, .b = { .fd = -1 } };
    mode_t mode;
    int rc;
    memset(&img, 0, sizeof img);
#ifdef WQ_FAULT_INJECTION
    /* Test builds: run whole suites in fair mode with the default mode's
       order wherever the two agree (no priorities, tenants or age share). */
    if (getenv("WQ_TEST_FAIR") && !(eff.flags & WQ_FAIR)) {
        eff.flags |= WQ_FAIR;
        eff.fair_share = 1u << 30;
        eff.tenant_sep = -1;
    }
#endif
    struct wq_options asked = eff;
    e.opts = &asked;
    img.in_wait = early_wait;
    img.in_wait_arg = &e;
    img.region = path;
    img.live = claim_live;
    while (opts->store_path && img.claim == 0)
        if (getrandom(&img.claim, sizeof img.claim, 0) != sizeof img.claim)
            img.claim = wq__now_real() ^ ((uint64_t)getpid() << 32);
    if (opts->store_path &&
        (rc = wq__store_prepare(&eff, &eff, abs, sizeof abs, &img)) < 0)
        goto out;
    if ((rc = geom_of(&eff, abs, &g, &mode)) < 0)
        goto out;
    shmq view;
    memset(&view, 0, sizeof view);
    if (e.ok && memcmp(&e.g, &g, sizeof g) == 0) {
        b = e.b;   /* what the store's settings ask for, built while it was read */
        e.b = (struct build){ .fd = -1 };
        view = e.view;
        stamp_region(view.hdr);
        view.g = view.hdr->g;
    } else {
        build_close(&e.b);
        if ((rc = build_open(&b, path, &g, mode, false)) < 0)
            goto out;
        if (g.has_store)
            build_view(&b, &view, path);
    }
    if (g.has_store) {
        rc = img.has_meta ? wq__store_restore(&view, &img) : 0;
        if (rc > 0)
            view.hdr->restored = (uint64_t)rc;
        uint64_t journal[2] = { 0, 0 };
        if (rc >= 0)   /* the meta current, a version 1 store rewritten */
            rc = wq__store_init_meta(&view.g, &img, journal);
        view.hdr->j_id = journal[0];
        view.hdr->j_lsn = journal[1];
        view.hdr->claim = img.claim;
    }
    munmap(b.base, b.g.total_size);
    b.base = NULL;
    if (rc >= 0) {   /* the claim's lock is held till here (img) */
        rc = publish(b.fd, b.tmpname, path);
        b.tmpname[0] = 0;
        img.published = rc >= 0;
    }
out:
    build_close(&b);
    build_close(&e.b);
    wq__store_img_free(&img);
    return rc;
}

/* wq_last_error for a region that fails validation: what is wrong with
   it, as far as its header can be trusted to tell. */
static void bad_region(const char *path, const struct wq_geom *g, uint64_t size)
{
    if (g->magic != WQ_MAGIC)
        wq__errf("queue '%s': %s is not a libwq region (no libwq magic)", qname(path), path);
    else if (g->version != WQ_LAYOUT_VER)
        wq__errf("queue '%s': %s is a region of layout version %u; this libwq reads version %u",
                 qname(path), path, (unsigned)g->version, (unsigned)WQ_LAYOUT_VER);
    else if (g->hdr_size == sizeof(struct wq_hdr) &&
             g->checksum == wq__fnv1a(g, offsetof(struct wq_geom, checksum)) &&
             g->total_size != size)
        wq__errf("queue '%s': %s is truncated or damaged: %llu bytes, its header says %llu",
                 qname(path), path, (unsigned long long)size,
                 (unsigned long long)g->total_size);
    else
        wq__errf("queue '%s': %s is damaged: its header fails validation", qname(path), path);
}

/* Map and validate the region at path into q. */
int wq__region_attach(shmq *q, const char *path)
{
    struct stat st;
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ELOOP)
            return -errno;
        wq__errf("queue '%s': %s is a symbolic link, not a libwq region", qname(path), path);
        return -EPROTO;
    }
    int rc = -EPROTO;
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto out;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < sizeof(struct wq_hdr)) {
        wq__errf("queue '%s': %s is not a libwq region (%s)", qname(path), path,
                 S_ISREG(st.st_mode) ? "shorter than a region's header" : "not a file");
        goto out;
    }
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = -errno;
        goto out;
    }
    struct wq_geom g;
    memcpy(&g, base, sizeof g);   /* one snapshot: validate what we use */
    rc = wq__region_validate(&g, (uint64_t)st.st_size);
    if (rc < 0) {
        munmap(base, (size_t)st.st_size);
        bad_region(path, &g, (uint64_t)st.st_size);
        goto out;
    }
    map_view(q, base, (size_t)st.st_size, &g, fd);
    snprintf(q->path, sizeof q->path, "%s", path);
    return 0;   /* the handle keeps fd: growth reserves through it */
out:
    close(fd);
    return rc;
}

int wq__region_path(char *buf, size_t cap, const char *name)
{
    if (!dir_ok())
        return -EINVAL;
    int n = snprintf(buf, cap, "%s/" SHM_PREFIX "%s", SHM_DIR, name);
    return (n < 0 || (size_t)n >= cap) ? -EINVAL : 0;
}

int wq__shm_list(int (*fn)(const char *name, void *arg), void *arg)
{
    if (!dir_ok())
        return -EINVAL;
    DIR *d = opendir(SHM_DIR);
    if (!d)
        return -errno;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if (strncmp(n, SHM_PREFIX, strlen(SHM_PREFIX)) != 0)
            continue;
        n += strlen(SHM_PREFIX);
        if (!wq__name_ok(n))
            continue;
        if ((rc = fn(n, arg)) != 0)
            break;
    }
    closedir(d);
    return rc;
}
