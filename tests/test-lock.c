/*
 * test-lock.c - how a process waits for the region lock (src/shm/lock.c),
 * white-box: links libwq-fault.la and holds the region lock itself
 * through src/shm/shm.h, while a child process calls the library.
 * Witnesses outside the library: the crash points "lock.nap" (a first
 * nap) and "lock.nap.again" (any later one), stopped or recorded there,
 * and /proc/<pid>/task/<tid>/syscall, which names the system call a
 * thread is blocked in.
 *   - a consumer (wq_get) that finds the lock taken with at least 32
 *     keys queued naps, again and again, then blocks in a futex wait and
 *     gets the front key when the lock is released (a consumer whose
 *     handle has timed no work of its caller yet: lock.c times it only
 *     after a wait);
 *   - it reads the length again before each nap: once fewer than 32
 *     keys are queued it naps no more;
 *   - a getter woken from its sleep by an add never naps, however many
 *     keys are queued: they wait for it;
 *   - so does a wq_done, in fair mode too, with exactly 32 keys queued;
 *   - with fewer keys queued it never naps: a nap would delay the key
 *     being added;
 *   - an adder never naps, however many keys are queued, and no
 *     consumer naps behind an adder (nor behind any call but a get or
 *     a done);
 *   - a consumer whose caller works between its calls does not nap: one
 *     that napped at its first wait, then made 8 calls 1 ms apart (the
 *     first two timed), goes straight to the futex wait at its next; and
 *     naps again at the next wait once its handle says the caller
 *     hammers;
 *   - a holder SIGKILLed while a consumer naps costs nothing: the
 *     consumer's next try repairs and gets the front key;
 *   - the nap is no cancellation point: a thread cancelled before its
 *     wq_get naps, gets its key, and is cancelled at its own next
 *     cancellation point afterwards.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "t.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fault-api.h"
#include "shm/shm.h"

#define PLENTY 40   /* above lock.c's BACKOFF_DEPTH (32) */

/* What the parent and its child tell each other. */
struct board {
    atomic_int ready;      /* the child's: its queue is open */
    atomic_int step;       /* the parent's: 1 = the lock is held */
    atomic_int tid;        /* the child's thread that calls the library */
    atomic_int rc;         /* its call's result */
    atomic_int napped;     /* "lock.nap" was reached */
    atomic_int again;      /* ... and "lock.nap.again" */
    atomic_int cancelled;  /* the thread ended cancelled */
    char key[T_KEYBUF];    /* the key it got */
};

/* A queue holding k00 .. k(n-1), in that order. */
static wq *queue_of(const char *tag, int n, const char **name, unsigned flags)
{
    wq *q = t_create(tag, T_OPTS(.flags = flags), name);
    for (int i = 0; i < n; i++) {
        char k[8];
        snprintf(k, sizeof k, "k%02d", i);
        assert_int_equal(wq_add(q, KS(k)), 0);
    }
    return q;
}

static bool seen(const char *point)
{
    const char *names[64];
    int n = wq_fault_seen(names, 64);
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], point) == 0)
            return true;
    return false;
}

/* What the child reports of its naps, at its end. */
static void report_naps(struct board *b)
{
    atomic_store(&b->napped, seen("lock.nap"));
    atomic_store(&b->again, seen("lock.nap.again"));
}

/* The system call thread tid of pid is blocked in, or -1 (running, or
   gone). */
static long blocked_in(pid_t pid, int tid)
{
    char path[64], buf[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/syscall", (int)pid, tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == EACCES || errno == EPERM ? -2 : -1;
    long nr = -1;
    if (fgets(buf, sizeof buf, f) && buf[0] >= '0' && buf[0] <= '9')
        nr = strtol(buf, NULL, 10);
    fclose(f);
    return nr;
}

/* Wait until the child's thread is blocked in a futex wait. */
static void wait_futex(pid_t pid, struct board *b, const char *who)
{
    int tid = atomic_load(&b->tid);
    uint64_t deadline = t_now_ns() + 10 * SEC * t_scale();
    long nr;
    while ((nr = blocked_in(pid, tid)) != SYS_futex && t_now_ns() < deadline)
        t_sleep_ms(1);
    if (nr != SYS_futex)
        fail_msg("%s: in system call %ld after 10 s, never in a futex wait", who, nr);
}

/* ... and check it stays there (the mutex): it does not nap or spin any
   more. */
static void expect_blocked(pid_t pid, struct board *b, const char *who)
{
    int tid = atomic_load(&b->tid);
    wait_futex(pid, b, who);
    for (int i = 0; i < 4; i++) {
        long nr = blocked_in(pid, tid);
        if (nr != SYS_futex)
            fail_msg("%s: blocked in system call %ld, not in the futex wait (%d)", who, nr,
                     (int)SYS_futex);
        t_sleep_ms(5);
    }
}

/* The child stopped at its first nap while we hold the lock: let it go
   on, and expect it in the futex wait after its naps, as any locker. */
static void nap_then_block(pid_t pid, struct board *b, const char *who)
{
    t_wait_stopped(pid, "the consumer", "lock.nap");
    assert_int_equal(kill(pid, SIGCONT), 0);
    expect_blocked(pid, b, who);
}

/* Before the lock is taken: skip the test if this system hides the
   child's system call from us (Yama ptrace_scope 2, some sandboxes): the
   witness is missing, not the behaviour. */
static void need_witness(pid_t pid, struct board *b)
{
    if (blocked_in(pid, atomic_load(&b->tid)) == -2) {
        kill(pid, SIGKILL);
        t_wait(pid, 10000);
        skip();
    }
}

/* The child's side: open the queue, record the crash points reached
   (and stop at the first nap if asked), wait until the parent holds the
   lock, then make its one call: get (and done), add "new", or done of
   the key it got before (DONE). */
enum op { GET, ADD, DONE };

static void child(const char *name, struct board *b, enum op op, bool stop)
{
    wq *q;
    if (wq_open(name, NULL, &q) != 0)
        _exit(10);
    int held = 0;   /* DONE: the key it finishes, got before the lock */
    if (op == DONE && (held = wq_get(q, b->key, sizeof b->key, 0)) <= 0)
        _exit(14);
    /* That get waited only if an idle reaper held the lock; then the
       wait for the parent would be timed as the caller's work, and the
       done would not nap. Not what these tests are about. */
    wq_store_relaxed(&wq__shm(q)->samples, 0);
    wq_store_relaxed(&wq__shm(q)->left_at, 0);
    atomic_store(&b->tid, (int)gettid());
    wq_fault_record(true);
    if (stop && wq_fault_arm("lock.nap", 1, WQ_FAULT_STOP) != 0)
        _exit(11);
    atomic_store(&b->ready, 1);
    if (t_wait_count(&b->step, 1, 10000) != 0)
        _exit(12);
    int rc = op == ADD    ? wq_add(q, KS("new"))
             : op == DONE ? wq_done(q, b->key, (size_t)held)
                          : wq_get(q, b->key, sizeof b->key, 0);
    atomic_store(&b->rc, rc);
    if (op == GET && rc > 0 && wq_done(q, b->key, (size_t)rc) != 0)
        _exit(13);
    report_naps(b);
    wq_close(q);
    _exit(0);
}

/* Fork the child, hold the lock once its queue is open: as a get or a
   done would (consumer), or as any other call would. */
static pid_t start_as(wq *q, const char *name, struct board *b, enum op op, bool stop,
                      bool consumer)
{
    pid_t pid = t_fork(60);
    if (pid == 0)
        child(name, b, op, stop);
    assert_int_equal(t_wait_count(&b->ready, 1, 10000), 0);
    need_witness(pid, b);
    shmq *s = wq__shm(q);
    assert_int_equal(consumer ? wq__lock_consumer(s) : wq__lock(s), 0);
    atomic_store(&b->step, 1);
    return pid;
}

/* The holder is a consumer: the only holder a consumer naps behind. */
static pid_t start(wq *q, const char *name, struct board *b, enum op op, bool stop)
{
    return start_as(q, name, b, op, stop, true);
}

/* We release the lock; the child's get ends with k00, having napped or
   not (again: a later nap too, or -1 to leave it unchecked), and `left`
   keys stay queued. Frees the board, closes the queue. */
static void release_expect_k00(wq *q, pid_t pid, struct board *b, int napped, int again,
                               int left)
{
    wq__unlock(wq__shm(q));
    assert_int_equal(t_wait(pid, 10000), 0);
    assert_int_equal(b->rc, 3);
    assert_string_equal(b->key, "k00");
    assert_int_equal(b->napped, napped);
    if (again >= 0)
        assert_int_equal(b->again, again);
    assert_int_equal(wq_len(q), left);
    t_shared_free(b, sizeof *b);
    t_close(q);
}

static void test_consumer_naps_then_blocks(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(queue_of("naps", PLENTY, &name, 0));
    struct board *b = t_shared_alloc(sizeof *b);
    pid_t pid = start(q, name, b, GET, true);
    nap_then_block(pid, b, "a consumer with 40 keys queued");
    release_expect_k00(q, pid, b, 1, 1, PLENTY - 1);
}

/* The length is a hint read without the lock before each nap: while the
   consumer is stopped at its first nap we, the holder, make the hint say
   31 (restored before the unlock, so nothing else ever sees it). */
static void test_length_read_before_each_nap(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(queue_of("reread", PLENTY, &name, 0));
    struct wq_hdr *h = wq__shm(q)->hdr;
    struct board *b = t_shared_alloc(sizeof *b);
    pid_t pid = start(q, name, b, GET, true);
    t_wait_stopped(pid, "the consumer", "lock.nap");
    uint64_t pos = wq_load_relaxed(&h->ring_pos);
    assert_int_equal(pos >> 32, PLENTY);
    wq_store_relaxed(&h->ring_pos, (pos & 0xffffffffu) | (31ull << 32));
    assert_int_equal(kill(pid, SIGCONT), 0);
    expect_blocked(pid, b, "a consumer that saw 31 keys queued after a nap");
    wq_store_relaxed(&h->ring_pos, pos);
    release_expect_k00(q, pid, b, 1, 0, PLENTY - 1);
}

/* A getter asleep on an empty queue is woken by an add of 40 keys and
   stopped before it locks again; we take the lock first. It must not
   nap behind us: the keys are there for it. */
static void test_woken_getter_never_naps(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(queue_of("woken", 0, &name, 0));
    struct board *b = t_shared_alloc(sizeof *b);
    pid_t pid = t_fork(60);
    if (pid == 0) {
        wq *c;
        if (wq_open(name, NULL, &c) != 0)
            _exit(10);
        atomic_store(&b->tid, (int)gettid());
        wq_fault_record(true);
        if (wq_fault_arm("wait.woken", 1, WQ_FAULT_STOP) != 0)
            _exit(11);
        atomic_store(&b->ready, 1);
        int rc = wq_get(c, b->key, sizeof b->key, 30 * SEC);
        atomic_store(&b->rc, rc);
        if (rc > 0 && wq_done(c, b->key, (size_t)rc) != 0)
            _exit(13);
        report_naps(b);
        wq_close(c);
        _exit(0);
    }
    assert_int_equal(t_wait_count(&b->ready, 1, 10000), 0);
    need_witness(pid, b);
    /* Asleep. It also wakes every 100 ms to look for dead holders: if
       that wake stops it at "wait.woken" before our add, it still comes
       back from its sleep to 40 keys and a taken lock. */
    wait_futex(pid, b, "a getter on an empty queue");
    struct iovec keys[PLENTY];
    char buf[PLENTY][8];
    for (int i = 0; i < PLENTY; i++) {
        snprintf(buf[i], sizeof buf[i], "k%02d", i);
        keys[i] = (struct iovec){ buf[i], 3 };
    }
    assert_int_equal(wq_add_many(q, keys, PLENTY), 0);   /* none coalesced */
    t_wait_stopped(pid, "the getter", "wait.woken");
    assert_int_equal(wq__lock_consumer(wq__shm(q)), 0);
    assert_int_equal(kill(pid, SIGCONT), 0);
    expect_blocked(pid, b, "a woken getter with 40 keys queued");
    release_expect_k00(q, pid, b, 0, -1, PLENTY - 1);
}

/* A done naps as a get does; fair mode's length is its own count. */
static void test_done_naps_fair(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(queue_of("donefair", 33, &name, WQ_FAIR));
    struct board *b = t_shared_alloc(sizeof *b);
    pid_t pid = start(q, name, b, DONE, true);   /* it holds k00: 32 queued */
    nap_then_block(pid, b, "a done with 32 keys queued");
    wq__unlock(wq__shm(q));
    assert_int_equal(t_wait(pid, 10000), 0);
    assert_int_equal(b->rc, 0);
    assert_string_equal(b->key, "k00");
    assert_int_equal(b->napped, 1);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.queued, 32);
    assert_int_equal(st.processing, 0);
    t_shared_free(b, sizeof *b);
    t_close(q);
}

static void test_few_keys_no_nap(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(queue_of("few", 31, &name, 0));
    struct board *b = t_shared_alloc(sizeof *b);
    pid_t pid = start(q, name, b, GET, false);
    expect_blocked(pid, b, "a consumer with 31 keys queued");
    release_expect_k00(q, pid, b, 0, -1, 30);
}

static void test_adder_never_naps(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(queue_of("adder", PLENTY, &name, 0));
    struct board *b = t_shared_alloc(sizeof *b);
    pid_t pid = start(q, name, b, ADD, false);
    expect_blocked(pid, b, "an adder with 40 keys queued");
    wq__unlock(wq__shm(q));
    assert_int_equal(t_wait(pid, 10000), 0);
    assert_int_equal(b->rc, 0);   /* added */
    assert_int_equal(b->napped, 0);
    assert_int_equal(wq_len(q), PLENTY + 1);
    t_shared_free(b, sizeof *b);
    t_close(q);
}

/* Behind an add (any call but a get or a done) a consumer never naps:
   that holder is gone after one key, and consumers that napped behind a
   producer handed it the queue. */
static void test_no_nap_behind_adder(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(queue_of("behind", PLENTY, &name, 0));
    /* The last holder a consumer: the adder's lock must clear that. */
    assert_int_equal(wq__lock_consumer(wq__shm(q)), 0);
    wq__unlock(wq__shm(q));
    struct board *b = t_shared_alloc(sizeof *b);
    pid_t pid = start_as(q, name, b, GET, false, false);
    expect_blocked(pid, b, "a consumer behind an adder, 40 keys queued");
    release_expect_k00(q, pid, b, 0, -1, PLENTY - 1);
}

/* The child of test_worker_does_not_nap. A first get behind the
   parent's lock (step 1) naps: its handle has timed nothing yet. Then 8
   dones of a key it does not hold (-ENOENT, a consumer's call all the
   same), 1 ms apart, as a worker's reconciles would be: the wait made
   lock.c time the next two gaps. A second get behind the lock (step 3),
   stopped at its first nap if it makes one, must make none. Then the
   handle is told its caller hammers (work_ns 1, nothing left to time),
   and a third get behind the lock (step 5) naps again. */
static void worker_child(const char *name, struct board *b)
{
    wq *q;
    if (wq_open(name, NULL, &q) != 0)
        _exit(10);
    shmq *s = wq__shm(q);
    atomic_store(&b->tid, (int)gettid());
    wq_fault_record(true);
    atomic_store(&b->ready, 1);
    if (t_wait_count(&b->step, 1, 10000) != 0)
        _exit(12);
    int rc = wq_get(q, b->key, sizeof b->key, 0);
    if (rc != 3 || !seen("lock.nap"))
        _exit(13);
    for (int i = 0; i < 8; i++) {
        t_sleep_ms(1);
        if (wq_done(q, KS("absent")) != -ENOENT)
            _exit(14);
    }
    if (wq_load_relaxed(&s->samples) != 0 || wq_load_relaxed(&s->work_ns) == 0)
        _exit(15);   /* both gaps timed */
    if (wq_fault_arm("lock.nap", 1, WQ_FAULT_STOP) != 0)
        _exit(11);
    atomic_store(&b->ready, 2);
    if (t_wait_count(&b->step, 3, 10000) != 0)
        _exit(12);
    if (wq_get(q, b->key, sizeof b->key, 0) != 3 || strcmp(b->key, "k01") != 0)
        _exit(16);
    wq_store_relaxed(&s->samples, 0);
    wq_store_relaxed(&s->left_at, 0);
    wq_store_relaxed(&s->work_ns, 1);
    atomic_store(&b->ready, 3);
    if (t_wait_count(&b->step, 5, 10000) != 0)
        _exit(12);
    atomic_store(&b->rc, wq_get(q, b->key, sizeof b->key, 0));
    wq_close(q);
    _exit(0);
}

static void test_worker_does_not_nap(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(queue_of("worker", PLENTY, &name, 0));
    shmq *s = wq__shm(q);
    struct board *b = t_shared_alloc(sizeof *b);
    pid_t pid = t_fork(60);
    if (pid == 0)
        worker_child(name, b);
    assert_int_equal(t_wait_count(&b->ready, 1, 10000), 0);
    need_witness(pid, b);
    assert_int_equal(wq__lock_consumer(s), 0);
    atomic_store(&b->step, 1);
    expect_blocked(pid, b, "a consumer at its first wait, after its naps");
    wq__unlock(s);
    assert_int_equal(t_wait_count(&b->ready, 2, 10000), 0);
    assert_int_equal(wq__lock_consumer(s), 0);
    atomic_store(&b->step, 3);
    expect_blocked(pid, b, "a consumer that called every 1 ms, at its next wait");
    wq__unlock(s);
    assert_int_equal(t_wait_count(&b->ready, 3, 10000), 0);
    assert_int_equal(wq__lock_consumer(s), 0);
    atomic_store(&b->step, 5);
    nap_then_block(pid, b, "a consumer whose handle says it hammers");
    wq__unlock(s);
    assert_int_equal(t_wait(pid, 10000), 0);
    assert_int_equal(b->rc, 3);
    assert_string_equal(b->key, "k02");
    assert_int_equal(wq_len(q), PLENTY);   /* k00, k01 and k02 given back at its close */
    t_shared_free(b, sizeof *b);
    t_close(q);
}

static void test_holder_dies_during_naps(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(queue_of("dies", PLENTY, &name, 0));
    uint64_t repairs = t_stats(q).repairs_total;
    struct board *hb = t_shared_alloc(sizeof *hb), *b = t_shared_alloc(sizeof *b);
    pid_t pid = t_fork(60);
    if (pid == 0)
        child(name, b, GET, true);
    assert_int_equal(t_wait_count(&b->ready, 1, 10000), 0);   /* opened */
    pid_t holder = t_fork(60);
    if (holder == 0) {
        wq *h;
        if (wq_open(name, NULL, &h) != 0 || wq__lock_consumer(wq__shm(h)) != 0)
            _exit(10);
        atomic_store(&hb->ready, 1);
        for (;;)
            pause();
    }
    assert_int_equal(t_wait_count(&hb->ready, 1, 10000), 0);
    atomic_store(&b->step, 1);
    /* napping while the holder lives */
    t_wait_stopped(pid, "the consumer", "lock.nap");
    assert_int_equal(kill(holder, SIGKILL), 0);
    assert_int_equal(t_wait(holder, 10000), 128 + SIGKILL);
    assert_int_equal(kill(pid, SIGCONT), 0);
    assert_int_equal(t_wait(pid, 10000), 0);
    assert_int_equal(b->rc, 3);
    assert_string_equal(b->key, "k00");
    assert_int_equal(b->napped, 1);
    struct wq_stats st = t_stats(q);
    assert_int_equal(st.repairs_total, repairs + 1);
    assert_int_equal(st.queued, PLENTY - 1);
    assert_int_equal(st.processing, 0);
    t_shared_free(hb, sizeof *hb);
    t_shared_free(b, sizeof *b);
    t_close(q);
}

/* test_nap_no_cancellation_point's thread: cancelled before it starts
   (deferred), it gets a key through naps, then reaches a cancellation
   point of its own. */
struct canceller {
    wq *q;
    struct board *b;
    atomic_int go;
};

static void *getter(void *arg)
{
    struct canceller *c = arg;
    atomic_store(&c->b->tid, (int)gettid());
    /* No cancellation point before the get: spin, never sleep. */
    while (!atomic_load(&c->go) || atomic_load(&c->b->step) != 1)
        ;
    atomic_store(&c->b->rc, wq_get(c->q, c->b->key, sizeof c->b->key, 0));
    pthread_testcancel();
    return NULL;
}

static void test_nap_no_cancellation_point(void **state)
{
    (void)state;
    const char *name;
    wq *q = t_track(queue_of("cancel", PLENTY, &name, 0));
    struct board *b = t_shared_alloc(sizeof *b);
    pid_t pid = t_fork(60);
    if (pid == 0) {
        static struct canceller c;
        pthread_t t;
        if (wq_open(name, NULL, &c.q) != 0)
            _exit(10);
        c.b = b;
        wq_fault_record(true);
        if (wq_fault_arm("lock.nap", 1, WQ_FAULT_STOP) != 0)
            _exit(11);
        if (pthread_create(&t, NULL, getter, &c) != 0)
            _exit(12);
        if (pthread_cancel(t) != 0)
            _exit(13);
        atomic_store(&c.go, 1);
        while (!atomic_load(&b->tid))
            ;
        atomic_store(&b->ready, 1);
        void *ret;
        if (pthread_join(t, &ret) != 0)
            _exit(14);
        atomic_store(&b->cancelled, ret == PTHREAD_CANCELED);
        report_naps(b);
        wq_close(c.q);
        _exit(0);
    }
    assert_int_equal(t_wait_count(&b->ready, 1, 10000), 0);
    need_witness(pid, b);
    assert_int_equal(wq__lock_consumer(wq__shm(q)), 0);
    atomic_store(&b->step, 1);
    /* in its first nap, with a cancellation pending */
    nap_then_block(pid, b, "a cancelled consumer");
    wq__unlock(wq__shm(q));
    assert_int_equal(t_wait(pid, 10000), 0);
    assert_int_equal(b->rc, 3);
    assert_string_equal(b->key, "k00");
    assert_int_equal(b->napped, 1);
    assert_int_equal(b->cancelled, 1);
    t_shared_free(b, sizeof *b);
    t_close(q);
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        T_TEST(test_consumer_naps_then_blocks),
        T_TEST(test_length_read_before_each_nap),
        T_TEST(test_woken_getter_never_naps),
        T_TEST(test_done_naps_fair),
        T_TEST(test_few_keys_no_nap),
        T_TEST(test_adder_never_naps),
        T_TEST(test_no_nap_behind_adder),
        T_TEST(test_worker_does_not_nap),
        T_TEST(test_holder_dies_during_naps),
        T_TEST(test_nap_no_cancellation_point),
        T_NO_LEFTOVERS,
    };
    static const struct t_guard g = {
        .prog = "test-lock",
        .deadline_s = 120,
        T_GUARD_TESTS(tests),
    };
    return t_guard_main(&g);
}
