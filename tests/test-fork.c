/*
 * test-fork.c - handles across fork, crash and close: a child that exits
 * or is killed holding a key (the key comes back, counted as a crash
 * requeue; the parent's keys stay the parent's), a stopped holder that is
 * still alive, wq_close giving keys back (not a crash; own and inherited
 * handles), a child that exits holding nothing, a child that looks
 * without a process slot, and wq_release_pid of a live and a dead child.
 *
 * The test process and forked children that report through exit codes
 * and a shared mapping.
 */
#include "t.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Fork, crash and close                                               */
/* ------------------------------------------------------------------ */

/* A child using the inherited handle gets a key and _exits without Done:
   the parent sees it requeued, counted as a crash requeue. The key the
   parent holds stays the parent's. */
static void fork_child_exits_holding(void **state)
{
    (void)state;
    wq *q = t_create("fork-exit", T_OPTS(.capacity = 16), NULL);
    int *shared = t_shared_alloc(4096);
    pid_t parent = getpid();

    assert_int_equal(wq_add(q, KS("p")), 0);
    T_EXPECT_GET(q, "p");
    assert_int_equal(wq_add(q, KS("k")), 0);

    pid_t pid = t_fork(10);
    if (pid == 0) {
        unsigned char buf[256];
        struct t_dump d = { 0 };
        /* The child is not taken for its parent. */
        if (t_dump_collect(q, &d) != 0) _exit(10);
        const struct t_dkey *ep = t_dump_find(&d, "p");
        if (ep == NULL || ep->owner != parent ||
            ep->state != WQ_KEY_PROCESSING) _exit(11);
        int n = wq_get(q, buf, sizeof buf, 0);
        if (n != 1 || buf[0] != 'k') _exit(12);
        t_dump_free(&d);
        if (t_dump_collect(q, &d) != 0) _exit(13);
        const struct t_dkey *ek = t_dump_find(&d, "k");
        if (ek == NULL || ek->owner != getpid()) _exit(14);
        shared[0] = 1;
        _exit(0); /* no wq_done, no wq_close */
    }
    assert_int_equal(t_wait(pid, 5000), 0);
    assert_int_equal(shared[0], 1);

    uint64_t t0 = t_now_ns();
    unsigned char buf[256];
    int n = wq_get(q, buf, sizeof buf, 2 * SEC * t_scale());
    uint64_t el = t_now_ns() - t0;
    if (n != 1 || buf[0] != 'k')
        fail_msg("dead child's key not requeued: wq_get = %d (%s) after "
                 "%.0f ms", n, n < 0 ? wq_strerror(n) : "?", (double)el / 1e6);
    if (el > 1500 * 1000000ull * t_scale())
        fail_msg("requeue took %.0f ms", (double)el / 1e6);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.crash_requeues_total, 1);
    assert_int_equal(st.processing, 2);

    struct t_dump d = t_dump_all(q);
    const struct t_dkey *ep = t_dump_find(&d, "p"), *ek = t_dump_find(&d, "k");
    assert_true(ep != NULL && ek != NULL);
    assert_int_equal(ep->owner, getpid());
    assert_int_equal(ek->owner, getpid());
    t_dump_free(&d);
    assert_int_equal(wq_done(q, KS("p")), 0);
    assert_int_equal(wq_done(q, KS("k")), 0);
    assert_int_equal(t_get(q, 0), -EAGAIN);
    assert_int_equal(t_stats(q).crash_requeues_total, 1);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free(shared, 4096);
}

/* A child that holds a key is alive while stopped (the key is not
   requeued), and once SIGKILLed the key comes back. */
static void fork_child_stopped_then_killed(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("fork-kill", T_OPTS(.capacity = 16), &name);
    volatile int *shared = t_shared_alloc(4096);

    assert_int_equal(wq_add(q, KS("k")), 0);
    pid_t pid = t_fork(10);
    if (pid == 0) {
        wq *q2 = NULL;
        unsigned char buf[256];
        if (wq_open(name, NULL, &q2) != 0) _exit(10);
        if (wq_get(q2, buf, sizeof buf, 0) != 1) _exit(11);
        shared[0] = 1;
        for (;;)
            pause();
    }
    uint64_t deadline = t_now_ns() + 5 * 1000000000ull * t_scale();
    while (shared[0] == 0 && t_now_ns() < deadline)
        t_sleep_ms(1);
    assert_int_equal(shared[0], 1);

    assert_int_equal(kill(pid, SIGSTOP), 0);
    int st;
    assert_int_equal(waitpid(pid, &st, WUNTRACED), pid);
    assert_true(WIFSTOPPED(st));
    assert_int_equal(t_get(q, 300 * MS), -ETIMEDOUT);
    assert_int_equal(wq_check(q, WQ_CHECK_REAP), 0);
    assert_int_equal(t_get(q, 0), -EAGAIN);
    struct t_dump d = t_dump_all(q);
    assert_int_equal(d.n, 1);
    assert_int_equal(d.v[0].state, WQ_KEY_PROCESSING);
    assert_int_equal(d.v[0].owner, pid);
    t_dump_free(&d);
    assert_int_equal(t_stats(q).crash_requeues_total, 0);

    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(t_wait(pid, 5000), 128 + SIGKILL);

    uint64_t t0 = t_now_ns();
    unsigned char buf[256];
    int n = wq_get(q, buf, sizeof buf, 2 * SEC * t_scale());
    uint64_t el = t_now_ns() - t0;
    if (n != 1 || buf[0] != 'k')
        fail_msg("killed child's key not requeued: wq_get = %d after %.0f ms",
                 n, (double)el / 1e6);
    if (el > 1500 * 1000000ull * t_scale())
        fail_msg("requeue took %.0f ms", (double)el / 1e6);
    assert_int_equal(t_stats(q).crash_requeues_total, 1);
    assert_int_equal(wq_done(q, KS("k")), 0);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free((void *)shared, 4096);
}

/* A process SIGKILLed holding a batch from wq_get_many: every key of the
   batch comes back once, the key it did not take stays where it was, and
   nothing is handed out twice. */
static void killed_holding_batch(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("fork-batch", T_OPTS(.capacity = 16, .max_key_len = 64), &name);
    volatile int *shared = t_shared_alloc(4096);

    struct iovec add[] = { { "a", 1 }, { "b", 1 }, { "c", 1 }, { "d", 1 } };
    assert_int_equal(wq_add_many(q, add, 4), 0);
    pid_t pid = t_fork(10);
    if (pid == 0) {
        wq *q2 = NULL;
        char buf[256];
        struct iovec v[3];
        if (wq_open(name, NULL, &q2) != 0) _exit(10);
        if (wq_get_many(q2, buf, sizeof buf, v, 3, 0) != 3) _exit(11);
        shared[0] = 1;
        for (;;)
            pause();
    }
    uint64_t deadline = t_now_ns() + 5 * SEC * t_scale();
    while (shared[0] == 0 && t_now_ns() < deadline)
        t_sleep_ms(1);
    assert_int_equal(shared[0], 1);
    T_EXPECT_STATS(q, 4, 1, 3, 0, "child holds three");
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(t_wait(pid, 5000), 128 + SIGKILL);

    /* d first (it never left the queue), then the three dead ones. */
    T_EXPECT_GET(q, "d");
    char buf[256];
    struct iovec v[8];
    int seen[4] = { 0 }, got = 0;
    deadline = t_now_ns() + 3 * SEC * t_scale();
    while (got < 3 && t_now_ns() < deadline) {
        int n = wq_get_many(q, buf, sizeof buf, v, 8, 200 * MS);
        if (n == -ETIMEDOUT)
            continue;
        assert_true(n > 0);
        for (int i = 0; i < n; i++) {
            assert_int_equal(v[i].iov_len, 1);
            int k = ((char *)v[i].iov_base)[0] - 'a';
            assert_true(k >= 0 && k < 3);
            seen[k]++;
        }
        got += n;
        assert_int_equal(wq_done_many(q, v, (size_t)n), n);
    }
    assert_int_equal(got, 3);
    assert_int_equal(seen[0] * 100 + seen[1] * 10 + seen[2], 111);
    assert_int_equal(t_stats(q).crash_requeues_total, 3);
    assert_int_equal(wq_done(q, KS("d")), 0);
    T_EXPECT_STATS(q, 0, 0, 0, 0, "end");
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
    t_shared_free((void *)shared, 4096);
}

/* wq_close requeues the keys the handle holds, at the back, and that is
   not a crash. Same for a child's own handle and an inherited one. */
static void close_requeues(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_create("close", T_OPTS(.capacity = 16), &name);
    wq *q2 = NULL;

    assert_int_equal(wq_add(q, KS("k")), 0);
    assert_int_equal(wq_add(q, KS("a")), 0);
    assert_int_equal(wq_open(name, NULL, &q2), 0);
    T_EXPECT_GET(q2, "k");
    wq_close(q2);
    assert_int_equal(wq_len(q), 2);
    T_EXPECT_GET(q, "a");
    T_EXPECT_GET(q, "k");
    assert_int_equal(wq_done(q, KS("a")), 0);
    assert_int_equal(wq_done(q, KS("k")), 0);
    assert_int_equal(t_stats(q).crash_requeues_total, 0);
    assert_int_equal(t_stats(q).processes, 1);

    /* A child with its own handle. */
    assert_int_equal(wq_add(q, KS("m")), 0);
    pid_t pid = t_fork(10);
    if (pid == 0) {
        unsigned char buf[256];
        wq *q3 = NULL;
        if (wq_open(name, NULL, &q3) != 0) _exit(10);
        if (wq_get(q3, buf, sizeof buf, 0) != 1) _exit(11);
        wq_close(q3);
        _exit(0);
    }
    assert_int_equal(t_wait(pid, 5000), 0);
    T_EXPECT_GET(q, "m"); /* at once: close requeued it synchronously */
    assert_int_equal(wq_done(q, KS("m")), 0);

    /* A child with the inherited handle; the parent holds "p" meanwhile. */
    assert_int_equal(wq_add(q, KS("p")), 0);
    T_EXPECT_GET(q, "p");
    assert_int_equal(wq_add(q, KS("n")), 0);
    pid = t_fork(10);
    if (pid == 0) {
        unsigned char buf[256];
        if (wq_get(q, buf, sizeof buf, 0) != 1 || buf[0] != 'n') _exit(11);
        wq_close(q);
        _exit(0);
    }
    assert_int_equal(t_wait(pid, 5000), 0);
    T_EXPECT_GET(q, "n");
    struct t_dump d = t_dump_all(q);
    const struct t_dkey *ep = t_dump_find(&d, "p");
    assert_true(ep != NULL);
    assert_int_equal(ep->state, WQ_KEY_PROCESSING);
    assert_int_equal(ep->owner, getpid());
    t_dump_free(&d);
    assert_int_equal(wq_done(q, KS("n")), 0);
    assert_int_equal(wq_done(q, KS("p")), 0);

    struct wq_stats st = t_stats(q);
    assert_int_equal(st.crash_requeues_total, 0);
    assert_int_equal(st.processes, 1);
    assert_int_equal(st.live, 0);
    assert_int_equal(wq_check(q, 0), 0);
    wq_close(q);
}

/* A child that exits holding nothing costs nothing: its slot is reaped,
   no key moves, nothing is counted. */
static void fork_child_exits_idle(void **state)
{
    (void)state;
    wq *q = t_create("fork-idle", T_OPTS(.capacity = 16), NULL);

    assert_int_equal(wq_add(q, KS("a")), 0);
    pid_t pid = t_fork(10);
    if (pid == 0) {
        if (wq_len(q) != 1) _exit(10);
        if (wq_add(q, "b", 1) != 0) _exit(11);
        _exit(0);
    }
    assert_int_equal(t_wait(pid, 5000), 0);
    assert_int_equal(wq_check(q, WQ_CHECK_REAP), 0);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.queued, 2);
    assert_int_equal(st.crash_requeues_total, 0);
    assert_int_equal(st.processes, 1);
    T_EXPECT_GET(q, "a");
    T_EXPECT_GET(q, "b");
    assert_int_equal(wq_done(q, KS("a")), 0);
    assert_int_equal(wq_done(q, KS("b")), 0);
    wq_close(q);
}

/* A forked child's handle takes a process slot at its first add, get or
   done, not before: with the one slot its parent's, the child still
   looks (stats, metrics, dump, check), and only its add is refused. */
static int count_key(const struct wq_key_info *info, void *arg)
{
    (void)info;
    ++*(int *)arg;
    return 0;
}

static void fork_child_looks_without_slot(void **state)
{
    (void)state;
    T_SHM_ONLY("the process table");
    wq *q = t_create("fork-look", T_OPTS(.capacity = 16, .max_procs = 1), NULL);

    assert_int_equal(wq_add(q, KS("a")), 0);
    pid_t pid = t_fork(10);
    if (pid == 0) {
        struct wq_stats st;
        struct wq_metrics m;
        int n = 0;
        if (wq_len(q) != 1) _exit(10);
        if (wq_stats(q, &st) != 0) _exit(11);
        if (st.processes != 1 || st.queued != 1) _exit(12);
        if (wq_metrics(q, &m) != 0) _exit(13);
        if (wq_dump(q, count_key, &n) != 0 || n != 1) _exit(14);
        if (wq_check(q, WQ_CHECK_REAP) != 0) _exit(15);
        if (wq_num_requeues(q, KS("a")) != 0) _exit(16);
        if (wq_add(q, KS("b")) != -EUSERS) _exit(17);   /* an add needs a slot */
        _exit(0);
    }
    assert_int_equal(t_wait(pid, 5000), 0);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.queued, 1);
    assert_int_equal(st.processes, 1);
    assert_int_equal(st.crash_requeues_total, 0);
    T_EXPECT_GET(q, "a");
    assert_int_equal(wq_done(q, KS("a")), 0);
    wq_close(q);
}

/* wq_release_pid touches only a process that is gone: while the child
   lives (here blocked in pause()) its key stays its own; once it was killed
   and waited for, the key goes back at once, not counted as a crash. */
static void release_pid_only_dead(void **state)
{
    (void)state;
    wq *q = t_create("fork-release", T_OPTS(.capacity = 16), NULL);
    atomic_int *got = t_shared_alloc(sizeof *got);

    assert_int_equal(wq_add(q, KS("k")), 0);
    pid_t pid = t_fork(30);
    if (pid == 0) {
        unsigned char buf[256];
        atomic_store(got, wq_get(q, buf, sizeof buf, 0));
        for (;;)
            pause();   /* killed here, holding k */
    }
    for (int i = 0; i < 5000 && atomic_load(got) == 0; i++)
        t_sleep_ms(1);
    assert_int_equal(atomic_load(got), 1);
    assert_int_equal(wq_release_pid(q, pid), 0);   /* alive: left alone */
    T_EXPECT_STATS(q, 1, 0, 1, 0, "after releasing a live pid");
    kill(pid, SIGKILL);
    assert_int_equal(t_wait(pid, 10000), 128 + SIGKILL);
    assert_int_equal(wq_release_pid(q, pid), 1);
    T_EXPECT_STATS(q, 1, 1, 0, 0, "after releasing the killed pid");
    assert_int_equal(wq_release_pid(q, pid), 0);   /* nothing left */
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.crash_requeues_total, 0);
    assert_int_equal(wq_num_requeues(q, KS("k")), 0);
    T_EXPECT_GET(q, "k");
    T_EXPECT_DONE(q, "k");
    t_shared_free(got, sizeof *got);
    wq_close(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        T_TEST(fork_child_exits_holding),
        T_TEST(fork_child_stopped_then_killed),
        T_TEST(killed_holding_batch),
        T_TEST(close_requeues),
        T_TEST(fork_child_exits_idle),
        T_TEST(fork_child_looks_without_slot),
        T_TEST(release_pid_only_dead),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("fork", tests);
}
