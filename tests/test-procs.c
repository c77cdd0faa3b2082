/*
 * test-procs.c - liveness is the lease, never the pid.
 *
 * White-box (links libwq-fault.la and looks at the process table through
 * src/shm/shm.h): PID reuse is simulated by rewriting the pid recorded
 * in process slots, which must change nothing:
 *   - a dead holder whose slot now names a live pid (ours) is still
 *     reaped and its key requeued;
 *   - a live holder whose slot names a pid that no longer exists keeps
 *     its key.
 * Also: reaped slots are reused with a new generation, so a key taken by
 * the new occupant is not confused with the old one's.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "t.h"
#include "shm/shm.h"

/* Keys of dead holders come back through the rate limiter (5 ms for a
   first failure): wait up to a second. */
static int get_key(wq *q, const char *want)
{
    char buf[64];
    int n = wq_get(q, buf, sizeof buf, SEC);
    if (n < 0)
        return n;
    return (size_t)n == strlen(want) && memcmp(buf, want, (size_t)n) == 0 ? 0 : -1;
}

static uint32_t slot_of(wq *q, pid_t pid)
{
    for (uint32_t i = 0; i < wq__shm(q)->max_procs; i++)
        if (wq__shm(q)->procs[i].state == WQ_PROC_LIVE && wq__shm(q)->procs[i].pid == pid)
            return i;
    return WQ_NIL;
}

static void dead_holder_with_reused_pid(void **state)
{
    (void)state;
    const char *name = t_qname("pidreuse");
    struct wq_options o = { .capacity = 16, .max_key_len = 16, .flags = WQ_CREATE };
    wq *q;
    assert_int_equal(wq_open(name, &o, &q), 0);
    assert_int_equal(wq_add(q, "k", 1), 0);
    int *sync = t_shared_alloc(4096);
    pid_t c = t_fork(10);
    if (c == 0) {
        wq *cq;
        if (wq_open(name, NULL, &cq) < 0 || get_key(cq, "k") < 0)
            _exit(1);
        sync[0] = 1;
        pause();
        _exit(0);
    }
    while (!sync[0])
        usleep(1000);
    uint32_t s = slot_of(q, c);
    assert_int_not_equal(s, WQ_NIL);
    kill(c, SIGKILL);
    assert_int_equal(t_wait(c, 5000), 128 + SIGKILL);
    /* The dead child's pid now "belongs" to a live process: us. */
    wq__shm(q)->procs[s].pid = getpid();
    assert_int_equal(get_key(q, "k"), 0);   /* reaped anyway */
    assert_int_equal(wq__shm(q)->procs[s].state, WQ_PROC_FREE);
    assert_int_equal(wq_num_requeues(q, "k", 1), 1);   /* through the limiter */
    struct wq_stats st;
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.crash_requeues_total, 1);
    assert_int_equal(wq_done(q, "k", 1), 0);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free(sync, 4096);
}

static void live_holder_with_dead_pid(void **state)
{
    (void)state;
    const char *name = t_qname("pidstale");
    struct wq_options o = { .capacity = 16, .max_key_len = 16, .flags = WQ_CREATE };
    wq *q;
    assert_int_equal(wq_open(name, &o, &q), 0);
    assert_int_equal(wq_add(q, "k", 1), 0);
    int *sync = t_shared_alloc(4096);
    pid_t c = t_fork(10);
    if (c == 0) {
        wq *cq;
        if (wq_open(name, NULL, &cq) < 0 || get_key(cq, "k") < 0)
            _exit(1);
        sync[0] = 1;
        while (!sync[1])
            usleep(1000);
        _exit(wq_done(cq, "k", 1) == 0 ? 0 : 2);
    }
    while (!sync[0])
        usleep(1000);
    uint32_t s = slot_of(q, c);
    assert_int_not_equal(s, WQ_NIL);
    /* A pid that cannot exist: pid-based liveness would call it dead. */
    wq__shm(q)->procs[s].pid = 0x3fffffff;
    assert_int_equal(wq_check(q, WQ_CHECK_REAP), 0);
    assert_int_equal(wq_get(q, (char[64]){0}, 64, 200 * MS), -ETIMEDOUT);
    assert_int_equal(wq__shm(q)->procs[s].state, WQ_PROC_LIVE);
    sync[1] = 1;
    assert_int_equal(t_wait(c, 5000), 0);
    struct wq_stats st;
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.crash_requeues_total, 0);
    assert_int_equal(st.live, 0);
    wq_close(q);
    t_shared_free(sync, 4096);
}

static void reused_slot_new_generation(void **state)
{
    (void)state;
    const char *name = t_qname("slotgen");
    struct wq_options o = { .capacity = 16, .max_key_len = 16, .max_procs = 2,
                            .flags = WQ_CREATE };
    wq *q;
    assert_int_equal(wq_open(name, &o, &q), 0);
    assert_int_equal(wq_add(q, "a", 1), 0);
    assert_int_equal(wq_add(q, "b", 1), 0);
    for (int round = 0; round < 2; round++) {
        /* Only one other slot: each child reuses the previous one's. */
        pid_t c = t_fork(10);
        if (c == 0) {
            wq *cq;
            if (wq_open(name, NULL, &cq) < 0 || get_key(cq, round ? "b" : "a") < 0)
                _exit(1);
            raise(SIGKILL);
        }
        assert_int_equal(t_wait(c, 5000), 128 + SIGKILL);
    }
    /* Round 1's open reaped round 0's slot (a requeued); b is held by the
       dead round-1 child in the same slot with a newer generation. */
    struct wq_stats st;
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.crash_requeues_total, 1);
    assert_int_equal(get_key(q, "a"), 0);
    assert_int_equal(get_key(q, "b"), 0);   /* reaped when the queue ran dry */
    assert_int_equal(wq_stats(q, &st), 0);
    assert_int_equal(st.crash_requeues_total, 2);
    assert_int_equal(wq_done(q, "a", 1), 0);
    assert_int_equal(wq_done(q, "b", 1), 0);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        T_TEST(dead_holder_with_reused_pid),
        T_TEST(live_holder_with_dead_pid),
        T_TEST(reused_slot_new_generation),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("procs", tests);
}
