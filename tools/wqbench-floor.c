/*
 * wqbench-floor.c - the baselines: what the cycle workload would cost with
 * nothing but a lock, and what moving a key between processes costs
 * through the kernel.
 *
 * floor-mutex  The cycle loop (add, get, done: three lock acquisitions per
 *              key) on a plain in-process array ring under one mutex, no
 *              dedup, no index: "private" uses a default pthread mutex,
 *              "robust-pshared" the kind libwq's region lock is (robust,
 *              process-shared), in ordinary memory. Figure: cycles/s.
 * floor-mq     The same keys sent from one process to another through a
 *              POSIX message queue (mq_send / mq_receive, 10 messages deep):
 *              the kernel IPC floor of a cross-process handoff. Figure:
 *              keys/s. Skipped when mq_open fails (no mqueue support).
 */
#include <errno.h>
#include <fcntl.h>
#include <mqueue.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "wqbench.h"

#define NOINLINE __attribute__((noinline))
#define RING_SLOTS 1024u

/* ------------------------------------------------------------------ */
/* floor-mutex                                                         */
/* ------------------------------------------------------------------ */

struct floor_ring {
    pthread_mutex_t mu;
    uint32_t head, count, processing;
    char slot[RING_SLOTS][WQB_KEY_LEN];
};

static int ring_add(struct floor_ring *r, const char *key)
{
    pthread_mutex_lock(&r->mu);
    if (r->count == RING_SLOTS) {
        pthread_mutex_unlock(&r->mu);
        return -ENOSPC;
    }
    memcpy(r->slot[(r->head + r->count) % RING_SLOTS], key, WQB_KEY_LEN);
    r->count++;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static int ring_get(struct floor_ring *r, char *buf)
{
    pthread_mutex_lock(&r->mu);
    if (r->count == 0) {
        pthread_mutex_unlock(&r->mu);
        return -EAGAIN;
    }
    memcpy(buf, r->slot[r->head], WQB_KEY_LEN);
    r->head = (r->head + 1) % RING_SLOTS;
    r->count--;
    r->processing++;
    pthread_mutex_unlock(&r->mu);
    return WQB_KEY_LEN;
}

static void ring_done(struct floor_ring *r)
{
    pthread_mutex_lock(&r->mu);
    r->processing--;
    pthread_mutex_unlock(&r->mu);
}

static NOINLINE void loop_floor(struct floor_ring *r, uint64_t first, uint64_t n)
{
    char key[WQB_KEY_LEN], buf[WQB_BUF_LEN];
    wqb_key(key, first);
    for (uint64_t i = 0; i < n; i++, wqb_key_next(key)) {
        if (ring_add(r, key) < 0 || ring_get(r, buf) != WQB_KEY_LEN)
            wqb_die("floor-mutex: ring misbehaved");
        ring_done(r);
    }
}

static void ring_init(struct floor_ring *r, bool robust)
{
    pthread_mutexattr_t a;
    memset(r, 0, sizeof *r);
    pthread_mutexattr_init(&a);
    if (robust) {
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    }
    pthread_mutex_init(&r->mu, &a);
    pthread_mutexattr_destroy(&a);
}

static void floor_mutex_variant(const struct wqb_cfg *c, const char *variant, bool robust,
                                uint64_t n)
{
    static struct floor_ring ring;
    struct wqb_result r;
    if (!wqb_want(c, variant))
        return;
    ring_init(&ring, robust);
    wqb_result_init(&r, "floor-mutex", variant, "cycles/s");
    loop_floor(&ring, 0, n < 1000 ? n : 1000);
    for (int rep = 0; rep < wqb_reps(c); rep++) {
        uint64_t t0 = wqb_now();
        loop_floor(&ring, (uint64_t)rep * n, n);
        wqb_result_add(&r, (double)n * 1e9 / (double)(wqb_now() - t0));
    }
    pthread_mutex_destroy(&ring.mu);
    wqb_result_extra(&r, "n", (double)n, WQB_X_INT);
    wqb_result_extra(&r, "ns_per_cycle", 1e9 / wqb_median(r.v, r.reps), WQB_X_NUM);
    wqb_emit(c, &r);
}

void wqb_run_floor_mutex(const struct wqb_cfg *c)
{
    uint64_t n = wqb_size(c, 200000, 1000000);
    floor_mutex_variant(c, "private", false, n);
    floor_mutex_variant(c, "robust-pshared", true, n);
}

/* ------------------------------------------------------------------ */
/* floor-mq                                                            */
/* ------------------------------------------------------------------ */

static void mq_sender(const char *mqname, struct wqb_gate *g, uint64_t n)
{
    mqd_t m = mq_open(mqname, O_WRONLY);
    char key[WQB_KEY_LEN];
    if (m == (mqd_t)-1)
        wqb_die("mq_open (sender): %s", strerror(errno));
    wqb_gate_arrive(g);
    wqb_key(key, 0);
    for (uint64_t i = 0; i < n; i++, wqb_key_next(key)) {
        if (mq_send(m, key, WQB_KEY_LEN, 0) < 0)
            wqb_die("mq_send: %s", strerror(errno));
    }
    mq_close(m);
    _exit(0);
}

/* One repetition: the parent receives n keys from a forked sender. */
static double mq_rep(const char *mqname, mqd_t m, uint64_t n)
{
    struct wqb_gate *g = wqb_shared_alloc(sizeof *g);
    char buf[WQB_BUF_LEN];
    pid_t pid = wqb_fork();
    if (pid == 0)
        mq_sender(mqname, g, n);
    uint64_t t0 = wqb_gate_release(g, 1);
    for (uint64_t i = 0; i < n; i++) {
        ssize_t len = mq_receive(m, buf, sizeof buf, NULL);
        if (len != WQB_KEY_LEN || wqb_key_index(buf) != i)
            wqb_die("mq_receive: %s", len < 0 ? strerror(errno) : "wrong key");
    }
    uint64_t t1 = wqb_now();
    wqb_wait_child(pid);
    wqb_shared_free(g, sizeof *g);
    return (double)n * 1e9 / (double)(t1 - t0);
}

void wqb_run_floor_mq(const struct wqb_cfg *c)
{
    char mqname[64], reg[80], why[128];
    struct mq_attr attr = { .mq_maxmsg = 10, .mq_msgsize = WQB_BUF_LEN };
    uint64_t n = wqb_size(c, 100000, 500000);
    struct wqb_result r;
    if (!wqb_want(c, "mq_send"))
        return;
    snprintf(mqname, sizeof mqname, "/wqbench.%d.mq", (int)getpid());
    snprintf(reg, sizeof reg, "mq:%s", mqname);
    wqb_register_path(reg);
    mqd_t m = mq_open(mqname, O_RDONLY | O_CREAT | O_EXCL, 0600, &attr);
    if (m == (mqd_t)-1) {
        snprintf(why, sizeof why, "mq_open: %s", strerror(errno));
        wqb_unregister_path(reg);
        wqb_skip(c, "floor-mq", "mq_send", why);
        return;
    }
    wqb_result_init(&r, "floor-mq", "mq_send", "keys/s");
    for (int rep = 0; rep < wqb_reps(c); rep++)
        wqb_result_add(&r, mq_rep(mqname, m, n));
    mq_close(m);
    wqb_unregister_path(reg);
    wqb_result_extra(&r, "n", (double)n, WQB_X_INT);
    wqb_result_extra(&r, "depth", 10, WQB_X_INT);
    wqb_emit(c, &r);
}
