/*
 * test-journal.c - the journal of a WQ_DURABLE_FSYNC store: what a queue
 * that went down without closing (every process SIGKILLed, then its
 * region removed, as a reboot removes /dev/shm) gets back from it.
 *
 *   - replay: the adds, removals, results and failure counts since the
 *     last checkpoint are in no LMDB commit (LMDB's transaction count is
 *     unchanged) and all come back, in add order; LMDB holds them after;
 *   - a torn last group (the write a power failure cut) is not applied,
 *     and the restore succeeds with the groups before it;
 *   - a damaged group with a verified later one: the open fails with
 *     -EUCLEAN, names the store and the offset, and changes nothing;
 *     wq_store_salvage keeps the records and the groups before the damage;
 *   - a store older than its journal (LMDB back at an earlier commit):
 *     the open fails with -EUCLEAN rather than restore the newest groups
 *     alone;
 *   - a process SIGKILLed at each journal point (its number taken, its
 *     group written, a checkpoint before and after its commit): the next
 *     add in another process works, wq_check is clean, and after the
 *     queue goes down every acknowledged key comes back exactly once;
 *   - a journal that fills: a checkpoint makes room, and nothing is lost;
 *     a writer killed after its group, past the tail, then a checkpoint:
 *     the next group's number is above every number taken;
 *   - wq_unlink while a process has the queue open, and a new queue made
 *     from the store: the removed region's adds fail with -EIDRM, and
 *     only the new region writes the journal;
 *   - a store serves one queue (FSYNC and PROCESS): a second queue on it
 *     (another name, another WQ_SHM_DIR) is refused with -EBUSY while the
 *     first one's region exists; one made where that region cannot be
 *     seen (a mount namespace with its own tmpfs) takes the store over,
 *     and the old region's adds fail with -EIDRM; an add the old region
 *     commits while the new one is made is in the new one; a maker that
 *     fails after its claim puts the old claim back; a store reached by
 *     a second path (bind mount) is one store, a copied store another;
 *     an owner file truncated under a live queue changes nothing; four
 *     creators racing for one new queue all work; wq_unlink then a new
 *     queue of that name: the removed region's adds fail (PROCESS too);
 *   - a group the live queue wrote that no longer verifies: its
 *     checkpoint fails with -EBADMSG and moves nothing; an open killed in
 *     its replay's commit replays at the next open;
 *   - a version 2 meta record restores, and is version 3 after;
 *   - a writer that forked dies holding the journal lock: its child does
 *     not keep the lock, the next add works;
 *   - with adds alone, the lease thread checkpoints within an interval;
 *   - the journal's file removed under a live queue: nothing is lost;
 *   - another store's journal put in place of this one's: none of its
 *     groups is applied (the journal id).
 *
 * Every queue operation runs in a child, so that no clean wq_close (which
 * writes what is listed) hides what a crash leaves. The witnesses are
 * outside the library: LMDB read by a child of its own, the journal's
 * file read here, the region's file removed here.
 *
 * Linked against libwq-fault.la (WQ_FAULT_KILL at the journal's points).
 */
#include "t.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lmdb.h>

#include "shm/shm.h"
#include "store/format.h"

#define JMAGIC 0x314a5157u   /* "WQJ1": a group header */
#define JSIZE  (4u << 20)

/* LMDB as a child with an environment of its own sees it: the last
   transaction id and the records in "records". */
struct peek {
    uint64_t txnid;
    uint64_t records;
};

static struct peek peek(const char *dir)
{
    struct peek *out = t_shared_alloc(sizeof *out);
    pid_t c = t_fork(20);
    if (c == 0) {
        MDB_env *env;
        MDB_envinfo info;
        MDB_txn *txn;
        MDB_dbi dbi;
        MDB_stat st;
        if (mdb_env_create(&env) != 0 || mdb_env_set_maxdbs(env, 4) != 0 ||
            mdb_env_open(env, dir, MDB_RDONLY | MDB_NOLOCK, 0600) != 0 ||
            mdb_env_info(env, &info) != 0 || mdb_txn_begin(env, NULL, MDB_RDONLY, &txn) != 0 ||
            mdb_dbi_open(txn, "records", 0, &dbi) != 0 || mdb_stat(txn, dbi, &st) != 0)
            _exit(1);
        out->txnid = info.me_last_txnid;
        out->records = st.ms_entries;
        _exit(0);
    }
    assert_int_equal(t_wait(c, 10000), 0);
    struct peek v = *out;
    t_shared_free(out, sizeof *out);
    return v;
}

/* The journal file, read here: the offsets of its group headers (found
   by their magic at 4 KiB boundaries) and their numbers. */
struct jgroups {
    unsigned n;
    uint64_t off[64], lsn[64];
    uint64_t max_lsn;
};

static struct jgroups jgroups(const char *dir)
{
    struct jgroups g;
    memset(&g, 0, sizeof g);
    char f[300];
    snprintf(f, sizeof f, "%s/journal", dir);
    int fd = open(f, O_RDONLY);
    assert_true(fd >= 0);
    static unsigned char buf[JSIZE];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    assert_int_equal(n, JSIZE);
    for (ssize_t off = 0; off + 40 <= n; off += 4096) {
        uint32_t magic;
        uint64_t lsn;
        memcpy(&magic, buf + off, 4);
        memcpy(&lsn, buf + off + 16, 8);
        if (magic != JMAGIC)
            continue;
        if (g.n < 64) {
            g.off[g.n] = (uint64_t)off;
            g.lsn[g.n] = lsn;
            g.n++;
        }
        if (lsn > g.max_lsn)
            g.max_lsn = lsn;
    }
    return g;
}

/* Copy a file (made or truncated, mode 0600). */
static void copy_file(const char *from, const char *to)
{
    static char buf[1 << 16];
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(in >= 0 && out >= 0);
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        assert_int_equal(write(out, buf, (size_t)n), n);
    assert_int_equal(n, 0);
    close(in);
    close(out);
}

/* Flip one byte of the journal at off. */
static void flip(const char *dir, uint64_t off)
{
    char f[300];
    snprintf(f, sizeof f, "%s/journal", dir);
    int fd = open(f, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0x5a;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

/* The queue goes down: its processes are gone (SIGKILLed by the caller),
   and its region is removed, as a reboot removes /dev/shm. */
static void go_down(const char *name)
{
    char path[300];
    t_shm_path(name, path, sizeof path);
    assert_int_equal(unlink(path), 0);
}

/* A child that opens the queue, runs fn, tells the parent (stage 1) and
   waits to be killed: it never closes. */
struct board {
    atomic_int stage;
    int rc;
};

static pid_t run_killed(const char *name, struct board *b, int (*fn)(wq *q, void *arg),
                        void *arg)
{
    atomic_store(&b->stage, 0);
    pid_t c = t_fork(60);
    if (c == 0) {
        wq *q = NULL;
        T_CHECK_EQ(wq_open(name, NULL, &q), 0);
        b->rc = fn(q, arg);
        atomic_store(&b->stage, 1);
        for (;;)
            pause();
    }
    assert_int_equal(t_wait_count(&b->stage, 1, 20000), 0);
    assert_int_equal(kill(c, SIGKILL), 0);
    assert_int_equal(t_wait(c, 10000), 128 + SIGKILL);
    return c;
}

static struct wq_options jopts(const char *store)
{
    struct wq_options o = t_store_opts(store, WQ_DURABLE_FSYNC);
    o.snapshot_interval_ms = 3600000;   /* no checkpoint by time */
    return o;
}

/* A test's queue: a new store, the queue created on it (FSYNC, no
   checkpoint by time) and closed, and a board for its children. */
static struct board *jq_begin(const char *tag, const char **store, const char **name,
                              struct wq_options *o)
{
    *store = t_mkstore();
    *name = t_qname(tag);
    *o = jopts(*store);
    t_close(t_track(T_OPEN(*name, o)));
    return t_shared_alloc(sizeof(struct board));
}

/* Open (restore) and expect exactly `keys` queued, in this order; the
   queue stays open for the caller. */
static wq *expect_restored(const char *name, const struct wq_options *o,
                           const char *const *keys, size_t n)
{
    wq *q = t_track(T_OPEN(name, o));
    assert_int_equal(wq_check(q, 0), 0);
    assert_int_equal(t_queued(q), n);
    for (size_t i = 0; i < n; i++)
        T_EXPECT_GET(q, keys[i]);
    return q;
}

/* ------------------------------------------------------------------ */
/* Replay                                                              */
/* ------------------------------------------------------------------ */

/* a, b, c, d added; a done (its removal deferred, then in d's group);
   b finished with a result (deferred) and added again: five groups. */
static int replay_work(wq *q, void *arg)
{
    (void)arg;
    char buf[T_KEYBUF];
    T_CHECK_EQ(wq_add(q, KS("a")), 0);
    T_CHECK_EQ(wq_add(q, KS("b")), 0);
    T_CHECK_EQ(wq_add(q, KS("c")), 0);
    T_CHECK_EQ(wq_get(q, buf, sizeof buf, 0), 1);
    T_CHECK_EQ(memcmp(buf, "a", 1), 0);
    T_CHECK_EQ(wq_done(q, KS("a")), 0);
    T_CHECK_EQ(wq_add(q, KS("d")), 0);
    T_CHECK_EQ(wq_get(q, buf, sizeof buf, 0), 1);
    T_CHECK_EQ(memcmp(buf, "b", 1), 0);
    T_CHECK_EQ(wq_finish(q, KS("b"), 7, "seven"), 0);
    T_CHECK_EQ(wq_add(q, KS("b")), 0);   /* queued again, result kept */
    return 0;
}

static void test_replay(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("jreplay");
    struct wq_options o = jopts(store);
    wq *q = t_track(T_OPEN(name, &o));
    t_close(q);
    struct peek p0 = peek(store);
    assert_int_equal(p0.records, 0);
    struct board *b = t_shared_alloc(sizeof *b);
    run_killed(name, b, replay_work, NULL);
    assert_int_equal(b->rc, 0);
    /* None of it is in LMDB: every change went to the journal. */
    struct peek p1 = peek(store);
    assert_int_equal(p1.txnid, p0.txnid);
    assert_int_equal(p1.records, 0);
    struct jgroups g = jgroups(store);
    assert_int_equal(g.max_lsn, 5);
    go_down(name);
    /* In first-add order, as every restore (b was requeued after d). */
    const char *keys[] = { "b", "c", "d" };
    q = expect_restored(name, &o, keys, 3);
    struct wq_result r = t_result(q, "b");
    assert_int_equal(r.code, 7);
    assert_string_equal(r.message, "seven");
    /* LMDB now holds them: the replay's commit, and the open's meta. */
    struct peek p2 = peek(store);
    assert_int_equal(p2.records, 3);
    assert_true(p2.txnid > p1.txnid);
    t_close(q);
    /* A second restore applies nothing again. */
    go_down(name);
    q = expect_restored(name, &o, keys, 3);
    assert_int_equal(peek(store).records, 3);
    t_close(q);
    t_shared_free(b, sizeof *b);
}

static int add_three(wq *q, void *arg)
{
    const char *const *k = arg;
    for (int i = 0; i < 3; i++)
        T_CHECK_EQ(wq_add(q, k[i], strlen(k[i])), 0);
    return 0;
}

/* The group being written when the power failed is torn: it does not
   verify, nothing follows it, and the restore takes the groups before. */
static void test_torn_last(void **state)
{
    (void)state;
    const char *store, *name;
    struct wq_options o;
    struct board *b = jq_begin("jtorn", &store, &name, &o);
    const char *k[] = { "t1", "t2", "t3" };
    run_killed(name, b, add_three, (void *)k);
    struct jgroups g = jgroups(store);
    assert_int_equal(g.n, 3);
    assert_int_equal(g.off[2], 8192);   /* one 4 KiB block each */
    flip(store, g.off[2] + 40 + 8);     /* inside t3's record */
    go_down(name);
    const char *keys[] = { "t1", "t2" };
    t_close(expect_restored(name, &o, keys, 2));
    t_shared_free(b, sizeof *b);
}

struct lines {
    int n;
    char s[16][512];
};

static void add_line(const char *what, void *arg)
{
    struct lines *l = arg;
    if (l->n < 16)
        snprintf(l->s[l->n++], sizeof l->s[0], "%s", what);
}

/* A group that does not verify with a verified later one is damage, not
   a torn write: the open fails and says where; salvage keeps what the
   store and the journal before the damage hold. */
static void test_damaged_middle(void **state)
{
    (void)state;
    const char *store, *name;
    struct wq_options o;
    struct board *b = jq_begin("jdamage", &store, &name, &o);
    const char *k[] = { "m1", "m2", "m3" };
    run_killed(name, b, add_three, (void *)k);
    struct jgroups g = jgroups(store);
    assert_int_equal(g.n, 3);
    flip(store, g.off[1] + 40 + 8);
    go_down(name);
    wq *q = NULL;
    assert_int_equal(wq_open(name, &o, &q), -EUCLEAN);
    char want[512];
    snprintf(want, sizeof want, "replaying its journal: its journal's group at offset 4096 "
             "does not verify, but a later one at offset 8192 does: the journal is damaged");
    if (!strstr(wq_last_error(), want) || !strstr(wq_last_error(), store))
        fail_msg("wq_last_error: '%s'", wq_last_error());
    char path[300];
    t_shm_path(name, path, sizeof path);
    assert_int_equal(access(path, F_OK), -1);   /* no region was made */
    assert_int_equal(peek(store).records, 0);   /* the store is as it was */
    assert_int_equal(wq_open(name, &o, &q), -EUCLEAN);   /* and stays refused */
    /* Salvage: LMDB's records (none), and the journal up to the damage:
       m1's group; m2's is damaged, and m3's follows it. */
    struct lines l = { .n = 0 };
    assert_int_equal(wq_store_salvage(store, NULL, add_line, &l), 0);
    bool applied = false, lost = false;
    for (int i = 0; i < l.n; i++) {
        printf("  salvage: %s\n", l.s[i]);
        applied |= strcmp(l.s[i], "applied 1 journal group no checkpoint had taken") == 0;
        lost |= strstr(l.s[i], "offset 4096 does not verify") &&
                strstr(l.s[i], "the writes from there on are lost");
    }
    assert_true(applied && lost);
    const char *keys[] = { "m1" };
    t_close(expect_restored(name, &o, keys, 1));
    t_shared_free(b, sizeof *b);
}

static int snapshot_add(wq *q, void *arg)
{
    T_CHECK_EQ(wq_snapshot(q), 0);   /* nothing listed: a checkpoint only */
    T_CHECK_EQ(wq_add(q, arg, strlen(arg)), 0);
    return 0;
}

struct open_board {
    int rc;
    char err[512];
};

/* A store older than its journal (LMDB back at a commit before the last
   checkpoint: here its data file from then put back, as a damaged newest
   meta page makes LMDB fall back to the one before): the groups the
   checkpoint took are behind the new ones and cannot be reached. The
   open fails and says so; it does not restore the new groups alone. The
   open runs in a child: this process's LMDB environment has the
   replaced file mapped. */
static void test_store_older(void **state)
{
    (void)state;
    const char *store, *name;
    struct wq_options o;
    struct board *b = jq_begin("jolder", &store, &name, &o);
    const char *k[] = { "o1", "o2", "o3" };
    run_killed(name, b, add_three, (void *)k);
    char data[300], old[300];
    snprintf(data, sizeof data, "%s/data.mdb", store);
    snprintf(old, sizeof old, "%s/data.mdb.old", store);
    copy_file(data, old);
    run_killed(name, b, snapshot_add, "n1");   /* checkpoint: o1-o3 in LMDB; n1 at 0 */
    struct jgroups g = jgroups(store);
    assert_int_equal(g.off[0], 0);
    assert_int_equal(g.lsn[0], 4);
    go_down(name);
    assert_int_equal(rename(old, data), 0);
    char lock[300];   /* its readers' table still names the newer commit */
    snprintf(lock, sizeof lock, "%s/lock.mdb", store);
    assert_int_equal(unlink(lock), 0);
    struct open_board *ob = t_shared_alloc(sizeof *ob);
    pid_t c = t_fork(60);
    if (c == 0) {
        wq *q = NULL;
        ob->rc = wq_open(name, &o, &q);
        snprintf(ob->err, sizeof ob->err, "%s", wq_last_error());
        _exit(0);
    }
    assert_int_equal(t_wait(c, 20000), 0);
    assert_int_equal(ob->rc, -EUCLEAN);
    if (!strstr(ob->err, "its journal's group at offset 4096 (number 2) is newer than the "
                         "store's last checkpoint (0), but the groups before it do not lead "
                         "to it: the store or its journal is damaged"))
        fail_msg("wq_last_error: '%s'", ob->err);
    t_shared_free(ob, sizeof *ob);
    t_shared_free(b, sizeof *b);
}

/* ------------------------------------------------------------------ */
/* Kills at the journal's points                                       */
/* ------------------------------------------------------------------ */

struct kill_arg {
    const char *point;
};

/* k1 k2 k3 added; for a checkpoint point, k1 done (listed) and then
   wq_snapshot (a group, then the checkpoint); for a journal point, the
   add of "victim". Killed at the point. */
static int kill_work(wq *q, void *arg)
{
    const struct kill_arg *a = arg;
    char buf[T_KEYBUF];
    T_CHECK_EQ(wq_add(q, KS("k1")), 0);
    T_CHECK_EQ(wq_add(q, KS("k2")), 0);
    T_CHECK_EQ(wq_add(q, KS("k3")), 0);
    bool ckpt = strstr(a->point, "checkpoint") != NULL;
    if (ckpt) {
        T_CHECK_EQ(wq_get(q, buf, sizeof buf, 0), 2);
        T_CHECK_EQ(wq_done(q, KS("k1")), 0);
    }
    T_CHECK_EQ(wq_fault_arm(a->point, 1, WQ_FAULT_KILL), 0);
    if (ckpt)
        wq_snapshot(q);
    else
        wq_add(q, KS("victim"));
    return 1;   /* not reached: killed at the point */
}

static int after_work(wq *q, void *arg)
{
    (void)arg;
    T_CHECK_EQ(wq_add(q, KS("after")), 0);
    T_CHECK_EQ(wq_check(q, WQ_CHECK_REAP), 0);
    return 0;
}

static void kill_at(const char *point)
{
    const char *store, *name;
    struct wq_options o;
    struct board *b = jq_begin("jkill", &store, &name, &o);
    struct kill_arg a = { point };
    pid_t c = t_fork(60);
    if (c == 0) {
        wq *q = NULL;
        _exit(wq_open(name, NULL, &q) == 0 ? kill_work(q, &a) : 2);
    }
    int st = t_wait(c, 20000);
    if (st != 128 + SIGKILL)
        fail_msg("%s: the child ended with %d, expected to die at the point", point, st);
    /* Another process: its add works at once (the flush lock is
       recovered), and the region checks clean. */
    run_killed(name, b, after_work, NULL);
    assert_int_equal(b->rc, 0);
    go_down(name);
    bool ckpt = strstr(point, "checkpoint") != NULL;
    /* Acknowledged keys exactly once, in add order; the victim's add
       never returned, but its key was listed, so the next group wrote
       it: it is back too. */
    const char *with_victim[] = { "k1", "k2", "k3", "victim", "after" };
    const char *with_k1_done[] = { "k2", "k3", "after" };
    wq *q = ckpt ? expect_restored(name, &o, with_k1_done, 3)
                 : expect_restored(name, &o, with_victim, 5);
    printf("  %s: restored %s\n", point, ckpt ? "k2 k3 after" : "k1 k2 k3 victim after");
    t_close(q);
    t_shared_free(b, sizeof *b);
}

static void test_kill_points(void **state)
{
    (void)state;
    kill_at("store.journal");
    kill_at("store.journaled");
    kill_at("store.checkpoint");
    kill_at("store.checkpointed");
}

/* ------------------------------------------------------------------ */
/* A full journal; a foreign journal                                   */
/* ------------------------------------------------------------------ */

enum { FULL_KEYS = 3000 };

static void full_key(char *k, int i)
{
    memset(k, 'x', 1000);
    snprintf(k, 16, "f%05d", i);
    k[6] = 'x';
}

/* 3000 adds of 1000-byte keys: a group (a 4 KiB block) each, 12 MiB in
   all, three times what the journal holds: checkpoints happen on the way
   (LMDB's transaction count), and every key comes back in order. */
static int full_work(wq *q, void *arg)
{
    (void)arg;
    char k[1000];
    for (int i = 0; i < FULL_KEYS; i++) {
        full_key(k, i);
        T_CHECK_EQ(wq_add(q, k, sizeof k), 0);
    }
    return 0;
}

static void test_full_journal(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("jfull");
    struct wq_options o = jopts(store);
    o.capacity = 4096;
    o.max_key_len = 1000;
    t_close(t_track(T_OPEN(name, &o)));
    struct peek p0 = peek(store);
    struct board *b = t_shared_alloc(sizeof *b);
    run_killed(name, b, full_work, NULL);
    assert_int_equal(b->rc, 0);
    struct peek p1 = peek(store);
    printf("  LMDB commits during 3000 adds: %llu; records in LMDB: %llu\n",
           (unsigned long long)(p1.txnid - p0.txnid), (unsigned long long)p1.records);
    assert_true(p1.txnid - p0.txnid >= 2);
    assert_true(p1.records > 0 && p1.records < FULL_KEYS);
    go_down(name);
    wq *q = t_track(T_OPEN(name, &o));
    assert_int_equal(t_queued(q), FULL_KEYS);
    char k[1000];
    for (int i = 0; i < FULL_KEYS; i++) {
        full_key(k, i);
        T_EXPECT_GETN(q, k, sizeof k);
    }
    assert_int_equal(peek(store).records, FULL_KEYS);
    t_close(q);
    t_shared_free(b, sizeof *b);
}

static int add_one(wq *q, void *arg)
{
    T_CHECK_EQ(wq_add(q, arg, strlen(arg)), 0);
    return 0;
}

/* Store B's journal replaced by store A's (both groups in the same
   place, both verify): B's restore applies none of A's groups. */
static void test_foreign_journal(void **state)
{
    (void)state;
    const char *sa = t_mkstore(), *sb = t_mkstore();
    const char *na = t_qname("jforeigna"), *nb = t_qname("jforeignb");
    struct wq_options oa = jopts(sa), ob = jopts(sb);
    t_close(t_track(T_OPEN(na, &oa)));
    t_close(t_track(T_OPEN(nb, &ob)));
    struct board *b = t_shared_alloc(sizeof *b);
    run_killed(na, b, add_one, "from-a");
    run_killed(nb, b, add_one, "from-b");
    go_down(na);
    go_down(nb);
    char fa[300], fb[300];
    snprintf(fa, sizeof fa, "%s/journal", sa);
    snprintf(fb, sizeof fb, "%s/journal", sb);
    copy_file(fa, fb);
    assert_int_equal(jgroups(sb).n, 1);
    wq *q = t_track(T_OPEN(nb, &ob));
    assert_int_equal(wq_len(q), 0);   /* from-b's group is gone; from-a's is not ours */
    struct wq_key_info ki;
    assert_int_equal(t_key_info(q, "from-a", &ki), 0);
    t_close(q);
    const char *ka[] = { "from-a" };
    t_close(expect_restored(na, &oa, ka, 1));
    t_shared_free(b, sizeof *b);
}

/* ------------------------------------------------------------------ */
/* A dead writer's group, then a checkpoint                            */
/* ------------------------------------------------------------------ */

enum { DEAD_FILL = WQ_JOURNAL_SIZE / WQ_JOURNAL_BLOCK - 1 };

static int fill_then_die(wq *q, void *arg)
{
    (void)arg;
    char k[16];
    for (int i = 0; i < DEAD_FILL; i++) {
        snprintf(k, sizeof k, "d%04d", i);
        T_CHECK_EQ(wq_add(q, KS(k)), 0);
    }
    T_CHECK_EQ(wq_fault_arm("store.journaled", 1, WQ_FAULT_KILL), 0);
    wq_add(q, KS("victim"));
    return 1;   /* not reached */
}

static char big[WQ_MAX_KEY_LEN];

static int add_big(wq *q, void *arg)
{
    (void)arg;
    T_CHECK_EQ(wq_add(q, big, sizeof big), 0);
    return 0;
}

/* The journal one block short of full; the next add's writer is killed
   once its group is written, before the tail moves: that group lies past
   the tail, with a number taken. The next add (two blocks: a key of
   max_key_len bytes) does not fit: its checkpoint applies what the queue
   wrote and the dead group, and its own group goes to offset 0 with the
   next number. A replay must apply that group: had the dead writer's
   number been taken again, the checkpoint's count would cover it. */
static void test_dead_group_checkpoint(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("jdead");
    struct wq_options o = jopts(store);
    o.capacity = 2048;
    o.max_key_len = WQ_MAX_KEY_LEN;
    t_close(t_track(T_OPEN(name, &o)));
    memset(big, 'B', sizeof big);
    pid_t c = t_fork(120);
    if (c == 0) {
        wq *q = NULL;
        _exit(wq_open(name, NULL, &q) == 0 ? fill_then_die(q, NULL) : 2);
    }
    assert_int_equal(t_wait(c, 60000), 128 + SIGKILL);
    struct jgroups g = jgroups(store);
    assert_int_equal(g.max_lsn, DEAD_FILL + 1);   /* the victim's group, written */
    struct peek p0 = peek(store);
    struct board *b = t_shared_alloc(sizeof *b);
    run_killed(name, b, add_big, NULL);
    assert_int_equal(b->rc, 0);
    assert_int_equal(peek(store).txnid - p0.txnid, 1);   /* the checkpoint */
    g = jgroups(store);
    assert_int_equal(g.off[0], 0);
    assert_int_equal(g.lsn[0], DEAD_FILL + 2);
    go_down(name);
    wq *q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_check(q, 0), 0);
    assert_int_equal(t_queued(q), DEAD_FILL + 2);
    char k[16];
    for (int i = 0; i < DEAD_FILL; i++) {
        snprintf(k, sizeof k, "d%04d", i);
        T_EXPECT_GET(q, k);
    }
    T_EXPECT_GET(q, "victim");
    T_EXPECT_GETN(q, big, sizeof big);
    t_close(q);
    t_shared_free(b, sizeof *b);
}

/* ------------------------------------------------------------------ */
/* A region removed while a process has it open                        */
/* ------------------------------------------------------------------ */

struct orphan_board {
    atomic_int stage;
    int rc;
    int late_found;   /* "late" in the region after its add */
    char err[512];
};

/* The old region's process: adds o1..o3 (stage 1); at stage 2 adds
   "late" (its rc, wq_last_error and whether the region holds it after),
   stage 3; then waits to be killed. */
static int orphan_main(const char *name, struct orphan_board *ob)
{
    wq *q = NULL;
    T_CHECK_EQ(wq_open(name, NULL, &q), 0);
    const char *k[] = { "o1", "o2", "o3" };
    for (int i = 0; i < 3; i++)
        T_CHECK_EQ(wq_add(q, KS(k[i])), 0);
    atomic_store(&ob->stage, 1);
    T_CHECK_EQ(t_wait_count(&ob->stage, 2, 20000), 0);
    ob->rc = wq_add(q, KS("late"));
    snprintf(ob->err, sizeof ob->err, "%s", wq_last_error());
    struct wq_key_info ki;
    ob->late_found = t_key_info(q, "late", &ki);
    atomic_store(&ob->stage, 3);
    for (;;)
        pause();
}

/* Start orphan_main in a child and wait for its o1..o3. */
static pid_t orphan_start(const char *name, struct orphan_board *ob)
{
    pid_t c = t_fork(60);
    if (c == 0)
        _exit(orphan_main(name, ob));
    assert_int_equal(t_wait_count(&ob->stage, 1, 20000), 0);
    return c;
}

/* Its "late" add, then its end (SIGKILL). */
static void orphan_finish(pid_t c, struct orphan_board *ob)
{
    atomic_store(&ob->stage, 2);
    assert_int_equal(t_wait_count(&ob->stage, 3, 20000), 0);
    assert_int_equal(kill(c, SIGKILL), 0);
    assert_int_equal(t_wait(c, 10000), 128 + SIGKILL);
}

static const int durabilities[] = { WQ_DURABLE_FSYNC, WQ_DURABLE_PROCESS };

static struct wq_options dopts(const char *store, int durability)
{
    return durability == WQ_DURABLE_FSYNC ? jopts(store) : t_store_opts(store, durability);
}

/* wq_unlink while a process has the queue open, then a new queue of that
   name made from the store: only the linked region writes the journal.
   The removed region's add of a new key fails with -EIDRM and changes
   nothing; the new region's adds work; after both go down, exactly the
   old region's keys from before the unlink and the new region's come
   back (the new region's groups went to offset 0, over the old ones). */
static void test_unlinked_region(void **state)
{
    (void)state;
    for (size_t i = 0; i < 2; i++) {
        const char *store = t_mkstore(), *name = t_qname(i ? "jorphanp" : "jorphan");
        struct wq_options o = dopts(store, durabilities[i]);
        t_close(t_track(T_OPEN(name, &o)));
        struct orphan_board *ob = t_shared_alloc(sizeof *ob);
        pid_t c = orphan_start(name, ob);
        assert_int_equal(wq_unlink(name), 0);   /* writes the store first */
        t_close(t_track(T_OPEN(name, &o)));     /* a new region, from the store */
        struct board *b = t_shared_alloc(sizeof *b);
        const char *k[] = { "n1", "n2", "n3" };
        run_killed(name, b, add_three, (void *)k);
        orphan_finish(c, ob);
        char want[800];
        snprintf(want, sizeof want, "queue '%s': its region was removed (wq_unlink) while "
                 "this process had it open; the store %s belongs to the queue of that name "
                 "now, and this region no longer writes to it", name, store);
        if (ob->rc != -EIDRM || strcmp(ob->err, want) != 0)
            fail_msg("%s: late add: %d, '%s'", t_durability_name(durabilities[i]), ob->rc,
                     ob->err);
        assert_int_equal(ob->late_found, 0);   /* the add was undone */
        go_down(name);
        const char *keys[] = { "o1", "o2", "o3", "n1", "n2", "n3" };
        t_close(expect_restored(name, &o, keys, 6));
        t_shared_free(b, sizeof *b);
        t_shared_free(ob, sizeof *ob);
    }
}

/* ------------------------------------------------------------------ */
/* A store serves one queue                                            */
/* ------------------------------------------------------------------ */

/* A second queue on a store whose queue exists: another name, or the
   same name in another WQ_SHM_DIR. Its wq_open fails with -EBUSY and
   says which region has the store; no region of it is left; the first
   queue's adds go on, and all of them come back. */
static void test_second_queue(void **state)
{
    (void)state;
    for (size_t i = 0; i < 2; i++) {
        const char *store = t_mkstore(), *name = t_qname(i ? "jsecp" : "jsecf"),
                   *other = t_qname(i ? "jsecp2" : "jsecf2");
        struct wq_options o = dopts(store, durabilities[i]);
        t_close(t_track(T_OPEN(name, &o)));
        struct orphan_board *ob = t_shared_alloc(sizeof *ob);
        pid_t c = orphan_start(name, ob);
        char region[300], want[1400], err[1400];
        t_shm_path(name, region, sizeof region);
        snprintf(want, sizeof want, "store '%s': it serves the queue whose region is %s; a "
                 "store serves one queue: give this queue a store_path of its own, or remove "
                 "that queue first (wq_unlink)", store, region);
        wq *q = NULL;
        assert_int_equal(wq_open(other, &o, &q), -EBUSY);
        if (strcmp(wq_last_error(), want) != 0)
            fail_msg("%s: wq_last_error: '%s'", t_durability_name(durabilities[i]),
                     wq_last_error());
        T_EXPECT_NO_SHM(other, "a queue refused its store");
        const char *dir = t_mkstore();
        setenv("WQ_SHM_DIR", dir, 1);
        int rc = wq_open(name, &o, &q);
        snprintf(err, sizeof err, "%s", wq_last_error());
        unsetenv("WQ_SHM_DIR");
        assert_int_equal(rc, -EBUSY);
        if (strcmp(err, want) != 0)
            fail_msg("another WQ_SHM_DIR: wq_last_error: '%s'", err);
        char there[400];
        snprintf(there, sizeof there, "%s/wq.%s", dir, name);
        assert_int_equal(access(there, F_OK), -1);
        orphan_finish(c, ob);
        assert_int_equal(ob->rc, 0);
        assert_int_equal(ob->late_found, 1);
        go_down(name);
        const char *keys[] = { "o1", "o2", "o3", "late" };
        t_close(expect_restored(name, &o, keys, 4));
        t_shared_free(ob, sizeof *ob);
    }
}

/* In a child: a mount namespace of its own (another container's view),
   where src is mounted at target as mount(2) would. false: no right to
   (not root). (The type and source of the propagation change are
   ignored; given, for valgrind.) */
static bool own_mount(const char *src, const char *target, const char *type,
                      unsigned long flags, const char *data)
{
    return unshare(CLONE_NEWNS) == 0 &&
           mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == 0 &&
           mount(src, target, type, flags, data) == 0;
}

/* The old region made in shm and used by orphan_main (o1..o3), then a
   maker running fn in a child, then the old region's "late" add and its
   end. Returns the maker's exit code (77: no right to unshare). */
static int hidden_takeover(const char *shm, const char *name, const struct wq_options *o,
                           struct orphan_board *ob,
                           int (*fn)(const char *, const struct wq_options *, const char *))
{
    setenv("WQ_SHM_DIR", shm, 1);
    wq *q = NULL;
    int rc = wq_open(name, o, &q);
    if (rc == 0)
        wq_close(q);
    pid_t c = rc == 0 ? orphan_start(name, ob) : -1;
    pid_t n = rc == 0 ? t_fork(60) : -1;
    if (n == 0)
        _exit(fn(name, o, shm));
    unsetenv("WQ_SHM_DIR");
    assert_int_equal(rc, 0);
    int st = t_wait(n, 20000);
    orphan_finish(c, ob);
    return st;
}

/* In a mount namespace of its own, with a new tmpfs at shm: the queue
   made there from the store, n1..n3 added, and no close (as if killed).
   77: no right to unshare. */
static int unseen_main(const char *name, const struct wq_options *o, const char *shm)
{
    if (!own_mount("tmpfs", shm, "tmpfs", 0, "mode=0700"))
        return 77;
    wq *q = NULL;
    T_CHECK_EQ(wq_open(name, o, &q), 0);
    const char *k[] = { "n1", "n2", "n3" };
    for (int j = 0; j < 3; j++)
        T_CHECK_EQ(wq_add(q, KS(k[j])), 0);
    return 0;
}

/* A queue made from the store where the region that has it cannot be
   seen: another container, with its own tmpfs at WQ_SHM_DIR (a mount
   namespace here). The new region claims the store and gets the old
   one's keys; the old region's next add fails with -EIDRM and changes
   nothing; both regions' keys come back exactly once. Needs the right
   to unshare the mount namespace (root): skipped without it. */
static void test_unseen_queue(void **state)
{
    (void)state;
    for (size_t i = 0; i < 2; i++) {
        const char *shm = t_mkstore(), *store = t_mkstore(),
                   *name = t_qname(i ? "junseenp" : "junseenf");
        struct wq_options o = dopts(store, durabilities[i]);
        struct orphan_board *ob = t_shared_alloc(sizeof *ob);
        int st = hidden_takeover(shm, name, &o, ob, unseen_main);
        if (st == 77)
            skip();
        assert_int_equal(st, 0);
        char want[1400];
        snprintf(want, sizeof want, "queue '%s': store %s was claimed by the queue whose "
                 "region is %s/wq.%s (made from it where this queue's region could not be "
                 "seen); a store serves one queue, and this region no longer writes to it",
                 name, store, shm, name);
        if (ob->rc != -EIDRM || strcmp(ob->err, want) != 0)
            fail_msg("%s: late add: %d, '%s'", t_durability_name(durabilities[i]), ob->rc,
                     ob->err);
        assert_int_equal(ob->late_found, 0);   /* the add was undone */
        char old[400];
        snprintf(old, sizeof old, "%s/wq.%s", shm, name);
        assert_int_equal(unlink(old), 0);   /* down: a reboot */
        const char *keys[] = { "o1", "o2", "o3", "n1", "n2", "n3" };
        t_close(expect_restored(name, &o, keys, 6));
        t_shared_free(ob, sizeof *ob);
    }
}

/* In a mount namespace of its own, the store bound at alias too: a
   queue of another name on the alias. Its wq_open's result; 77: no
   right to unshare. */
static int alias_main(const char *other, const char *store, const char *alias,
                      struct wq_options o)
{
    if (!own_mount(store, alias, "none", MS_BIND, NULL))
        return 77;
    o.store_path = alias;
    wq *q = NULL;
    int rc = wq_open(other, &o, &q);
    return rc == -EBUSY && strstr(wq_last_error(), "a store serves one queue") ? 0 : 1;
}

/* The old owner, for test_takeover_commit: k0 added, then k1's commit
   stopped (SIGSTOP at store.commit, LMDB's writer lock held) until the
   test continues it; then "late" at stage 2. */
struct takeover_board {
    atomic_int stage;
    int k1, late;
    int got;              /* keys the new region's maker got */
    char keys[4][8];
};

static int takeover_old(const char *name, struct takeover_board *tb)
{
    wq *q = NULL;
    T_CHECK_EQ(wq_open(name, NULL, &q), 0);
    T_CHECK_EQ(wq_add(q, KS("k0")), 0);
    T_CHECK_EQ(wq_fault_arm("store.commit", 1, WQ_FAULT_STOP), 0);
    tb->k1 = wq_add(q, KS("k1"));
    atomic_store(&tb->stage, 1);
    T_CHECK_EQ(t_wait_count(&tb->stage, 2, 20000), 0);
    tb->late = wq_add(q, KS("late"));
    atomic_store(&tb->stage, 3);
    for (;;)
        pause();
}

/* The new region's maker, where the old region cannot be seen: every
   key it gets. */
static int takeover_new(const char *name, const struct wq_options *o, const char *shm,
                        struct takeover_board *tb)
{
    if (!own_mount("tmpfs", shm, "tmpfs", 0, "mode=0700"))
        return 77;
    wq *q = NULL;
    T_CHECK_EQ(wq_open(name, o, &q), 0);
    char k[64];
    int n;
    while (tb->got < 4 && (n = wq_get(q, k, sizeof k, 0)) > 0)
        snprintf(tb->keys[tb->got++], sizeof tb->keys[0], "%.*s", n, k);
    return 0;
}

/* A takeover while the old owner commits an add (PROCESS): the new
   maker claims and reads the store while k1's commit waits; the commit
   then completes and the add is acknowledged. The new region must hold
   k1 (its maker takes LMDB's writer lock after its read and reads again
   if the store moved), and the old region's next add fails. */
static void test_takeover_commit(void **state)
{
    (void)state;
    const char *shm = t_mkstore(), *store = t_mkstore(), *name = t_qname("jtakeover");
    struct wq_options o = dopts(store, WQ_DURABLE_PROCESS);
    struct takeover_board *tb = t_shared_alloc(sizeof *tb);
    setenv("WQ_SHM_DIR", shm, 1);
    wq *q = NULL;
    int rc = wq_open(name, &o, &q);
    if (rc == 0)
        wq_close(q);
    pid_t a = rc == 0 ? t_fork(60) : -1;
    if (a == 0)
        _exit(takeover_old(name, tb));
    unsetenv("WQ_SHM_DIR");
    assert_int_equal(rc, 0);
    t_wait_stopped(a, "the old owner", "store.commit");
    setenv("WQ_SHM_DIR", shm, 1);
    pid_t b = t_fork(60);
    if (b == 0)
        _exit(takeover_new(name, &o, shm, tb));
    unsetenv("WQ_SHM_DIR");
    usleep(300000);   /* b claims and reads, then waits for the writer lock */
    assert_int_equal(kill(a, SIGCONT), 0);
    int st = t_wait(b, 20000);
    if (st == 77) {
        kill(a, SIGKILL);
        t_wait(a, 10000);
        skip();
    }
    assert_int_equal(st, 0);
    assert_int_equal(t_wait_count(&tb->stage, 1, 20000), 0);
    assert_int_equal(tb->k1, 0);
    assert_int_equal(tb->got, 2);
    assert_string_equal(tb->keys[0], "k0");
    assert_string_equal(tb->keys[1], "k1");
    atomic_store(&tb->stage, 2);
    assert_int_equal(t_wait_count(&tb->stage, 3, 20000), 0);
    assert_int_equal(tb->late, -EIDRM);
    assert_int_equal(kill(a, SIGKILL), 0);
    assert_int_equal(t_wait(a, 10000), 128 + SIGKILL);
    char old[400];
    snprintf(old, sizeof old, "%s/wq.%s", shm, name);
    assert_int_equal(unlink(old), 0);
    t_shared_free(tb, sizeof *tb);
}

/* A maker, where the old region cannot be seen, whose region does not
   fit its /dev/shm (a 16 KiB tmpfs): 0 if its wq_open failed, 77: no
   right to unshare. */
static int failed_maker(const char *name, const struct wq_options *o, const char *shm)
{
    if (!own_mount("tmpfs", shm, "tmpfs", 0, "mode=0700,size=16k"))
        return 77;
    wq *q = NULL;
    return wq_open(name, o, &q) < 0 ? 0 : 1;
}

/* A maker that claims the store and then fails (its region does not
   fit) puts the old record back: the old region's adds go on, and all
   of its keys come back. */
static void test_failed_maker(void **state)
{
    (void)state;
    const char *shm = t_mkstore(), *store = t_mkstore(), *name = t_qname("jfailmk");
    struct wq_options o = jopts(store);
    struct orphan_board *ob = t_shared_alloc(sizeof *ob);
    int st = hidden_takeover(shm, name, &o, ob, failed_maker);
    if (st == 77)
        skip();
    assert_int_equal(st, 0);
    if (ob->rc != 0)
        fail_msg("late add: %d, '%s'", ob->rc, ob->err);
    assert_int_equal(ob->late_found, 1);
    char old[400];
    snprintf(old, sizeof old, "%s/wq.%s", shm, name);
    assert_int_equal(unlink(old), 0);
    const char *keys[] = { "o1", "o2", "o3", "late" };
    t_close(expect_restored(name, &o, keys, 4));
    t_shared_free(ob, sizeof *ob);
}

/* One store directory reached by two paths (a bind mount, a volume
   mounted elsewhere in another container) is one store: a second queue
   through the other path is refused too. */
static void test_store_alias(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *alias = t_mkstore(), *name = t_qname("jalias"),
               *other = t_qname("jalias2");
    struct wq_options o = jopts(store);
    t_close(t_track(T_OPEN(name, &o)));
    pid_t c = t_fork(60);
    if (c == 0)
        _exit(alias_main(other, store, alias, o));
    int st = t_wait(c, 20000);
    if (st == 77)
        skip();
    assert_int_equal(st, 0);
    T_EXPECT_NO_SHM(other, "a queue refused its store through another path");
}

/* The owner file truncated (or replaced by a shorter one) under a live
   queue: its writes go on (no SIGBUS: the file is read, not mapped). */
static void test_owner_truncated(void **state)
{
    (void)state;
    for (size_t i = 0; i < 2; i++) {
        const char *store = t_mkstore(), *name = t_qname(i ? "jtruncp" : "jtruncf");
        struct wq_options o = dopts(store, durabilities[i]);
        wq *q = t_track(T_OPEN(name, &o));
        assert_int_equal(wq_add(q, KS("t1")), 0);
        char f[400];
        snprintf(f, sizeof f, "%s/owner", store);
        assert_int_equal(truncate(f, 0), 0);
        assert_int_equal(wq_add(q, KS("t2")), 0);
        T_EXPECT_GET(q, "t1");
        T_EXPECT_DONE(q, "t1");
        assert_true(wq_snapshot(q) >= 0);
        T_EXPECT_GET(q, "t2");
        t_close(q);
    }
}

/* A copy of a store directory (cp -r) is another store: a queue of
   another name is made from it while the original's queue exists, and
   both write their own. */
static void test_store_copy(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *copy = t_mkstore(), *name = t_qname("jcopy"),
               *other = t_qname("jcopy2");
    struct wq_options o = jopts(store), oc = jopts(copy);
    wq *q = t_track(T_OPEN(name, &o));
    o.flags = WQ_CREATE;   /* then attach */
    assert_int_equal(wq_add(q, KS("c1")), 0);
    assert_int_equal(wq_add(q, KS("c2")), 0);
    t_close(q);   /* checkpointed, and its region stays */
    const char *files[] = { "data.mdb", "journal", "owner", WQ_STORE_MARKER };
    for (size_t i = 0; i < 4; i++) {
        char from[400], to[400];
        snprintf(from, sizeof from, "%s/%s", store, files[i]);
        snprintf(to, sizeof to, "%s/%s", copy, files[i]);
        copy_file(from, to);
    }
    wq *c = t_track(T_OPEN(other, &oc));
    assert_int_equal(wq_add(c, KS("x1")), 0);
    q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_add(q, KS("c3")), 0);
    T_EXPECT_GET(c, "c1");
    T_EXPECT_GET(c, "c2");
    T_EXPECT_GET(c, "x1");
    T_EXPECT_GET_RC(c, -EAGAIN);
    T_EXPECT_GET(q, "c1");
    T_EXPECT_GET(q, "c2");
    T_EXPECT_GET(q, "c3");
    t_close(c);
    t_close(q);
}

static int racer_main(const char *name, const struct wq_options *o, atomic_int *go, int i)
{
    T_CHECK_EQ(t_wait_count(go, 1, 20000), 0);
    wq *q = NULL;
    T_CHECK_EQ(wq_open(name, o, &q), 0);
    for (int j = 0; j < 10; j++) {
        char k[16];
        snprintf(k, sizeof k, "r%d-%d", i, j);
        T_CHECK_EQ(wq_add(q, KS(k)), 0);
    }
    wq_close(q);
    return 0;
}

/* Four processes make one new FSYNC queue at once: the losers of the
   creation race attach to the winner's region (none of them claims the
   store over it), and every add of every process succeeds. */
static void test_creators_race(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("jrace");
    struct wq_options o = jopts(store);
    o.flags = WQ_CREATE;   /* the losers attach */
    atomic_int *go = t_shared_alloc(sizeof *go);
    pid_t c[4];
    for (int i = 0; i < 4; i++) {
        if ((c[i] = t_fork(60)) == 0)
            _exit(racer_main(name, &o, go, i));
    }
    atomic_store(go, 1);
    for (int i = 0; i < 4; i++)
        assert_int_equal(t_wait(c[i], 30000), 0);
    go_down(name);
    wq *q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_check(q, 0), 0);
    assert_int_equal(t_queued(q), 40);
    t_close(q);
    t_shared_free(go, sizeof *go);
}

/* Children forked by another thread while wq_open holds its claim of
   the store (owner.c): each would keep a copy of the claim's lock (an
   OFD lock lives as long as any descriptor of its file), so the next
   creator of the store would wait for the children to end. The opener
   reads 20,000 records meanwhile, so the claim is held for a while; the
   children pause until killed. */
enum { FORKERS_MAX = 512 };
struct fork_board {
    atomic_int stage;
    atomic_int stop;
    int rc, forked, opened;
    pid_t kids[FORKERS_MAX];
};

static void *fork_loop(void *arg)
{
    struct fork_board *fb = arg;
    while (!atomic_load(&fb->stop) && fb->forked < FORKERS_MAX) {
        pid_t p = fork();
        if (p == 0) {
            alarm(120);   /* gone even if nobody kills it */
            for (;;)
                pause();
        }
        if (p > 0)
            fb->kids[fb->forked++] = p;
        usleep(100);
    }
    return NULL;
}

static int claim_forker(const char *name, const struct wq_options *o, struct fork_board *fb)
{
    pthread_t t;
    T_CHECK_EQ(pthread_create(&t, NULL, fork_loop, fb), 0);
    wq *q = NULL;
    fb->rc = wq_open(name, o, &q);
    atomic_store(&fb->stop, 1);
    T_CHECK_EQ(pthread_join(t, NULL), 0);
    if (fb->rc == 0) {
        wq_close(q);
        T_CHECK_EQ(wq_unlink(name), 0);   /* the next open makes a region, and claims */
    }
    atomic_store(&fb->stage, 1);
    T_CHECK_EQ(t_wait_count(&fb->stage, 2, 60000), 0);
    for (int i = 0; i < fb->forked; i++)
        kill(fb->kids[i], SIGKILL);
    for (int i = 0; i < fb->forked; i++)
        waitpid(fb->kids[i], NULL, 0);
    return 0;
}

static void test_fork_during_claim(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("jforkc");
    struct wq_options o = jopts(store);
    o.capacity = 32768;
    wq *q = t_track(T_OPEN(name, &o));
    static char keys[1000][16];
    struct iovec batch[1000];
    for (int b = 0; b < 20; b++) {
        for (int i = 0; i < 1000; i++) {
            int n = snprintf(keys[i], sizeof keys[i], "key-%05d", b * 1000 + i);
            batch[i] = (struct iovec){ keys[i], (size_t)n };
        }
        assert_int_equal(wq_add_many(q, batch, 1000), 0);
    }
    t_close(q);
    go_down(name);
    struct fork_board *fb = t_shared_alloc(sizeof *fb);
    pid_t p = t_fork(120);
    if (p == 0)
        _exit(claim_forker(name, &o, fb));
    assert_int_equal(t_wait_count(&fb->stage, 1, 60000), 0);
    assert_int_equal(fb->rc, 0);
    assert_true(fb->forked > 0);
    /* The next creator claims at once: 5 s is the bound, it takes ms. */
    pid_t c = t_fork(5);
    if (c == 0) {
        wq *n = NULL;
        if (wq_open(name, &o, &n) != 0)
            _exit(1);
        _exit(wq_len(n) == 20000 ? 0 : 2);
    }
    int st = t_wait(c, 30000);
    atomic_store(&fb->stage, 2);
    assert_int_equal(t_wait(p, 30000), 0);
    assert_int_equal(st, 0);   /* 128 + SIGALRM (142): it waited for the children */
    go_down(name);
    t_shared_free(fb, sizeof *fb);
}

/* ------------------------------------------------------------------ */
/* Damage a live queue meets; a replay killed                          */
/* ------------------------------------------------------------------ */

struct snap_board {
    int rc;
    uint64_t tail;
    char err[512];
};

/* A group the queue wrote no longer verifies: the checkpoint fails and
   says where, the journal stays as it was (j_tail), and once the queue
   is down the open fails the same way. */
static void test_checkpoint_damage(void **state)
{
    (void)state;
    const char *store, *name;
    struct wq_options o;
    struct board *b = jq_begin("jckdmg", &store, &name, &o);
    const char *k[] = { "c1", "c2", "c3" };
    run_killed(name, b, add_three, (void *)k);
    flip(store, 40 + 8);   /* inside c1's record */
    struct snap_board *sb = t_shared_alloc(sizeof *sb);
    pid_t c = t_fork(60);
    if (c == 0) {
        wq *q = NULL;
        if (wq_open(name, NULL, &q) < 0)
            _exit(2);
        sb->rc = wq_snapshot(q);
        snprintf(sb->err, sizeof sb->err, "%s", wq_last_error());
        sb->tail = wq__shm(q)->hdr->j_tail;
        _exit(0);   /* no close: it would try again */
    }
    assert_int_equal(t_wait(c, 20000), 0);
    assert_int_equal(sb->rc, -EBADMSG);
    char want[600];
    snprintf(want, sizeof want, "queue '%s': store %s: checkpoint of its journal: its "
             "journal's group at offset 0 does not verify, though the queue wrote groups up "
             "to offset 12288", name, store);
    if (!strstr(sb->err, want))
        fail_msg("wq_last_error: '%s'", sb->err);
    assert_int_equal(sb->tail, 3 * WQ_JOURNAL_BLOCK);
    go_down(name);
    wq *q = NULL;
    assert_int_equal(wq_open(name, &o, &q), -EUCLEAN);
    if (!strstr(wq_last_error(), "its journal's group at offset 0 does not verify, but a "
                                 "later one at offset 4096 does"))
        fail_msg("wq_last_error: '%s'", wq_last_error());
    t_shared_free(sb, sizeof *sb);
    t_shared_free(b, sizeof *b);
}

/* An open killed in its replay's commit: the next open replays again. */
static void test_replay_killed(void **state)
{
    (void)state;
    const char *store, *name;
    struct wq_options o;
    struct board *b = jq_begin("jrkill", &store, &name, &o);
    const char *k[] = { "r1", "r2", "r3" };
    run_killed(name, b, add_three, (void *)k);
    go_down(name);
    pid_t c = t_fork(60);
    if (c == 0) {
        wq *q = NULL;
        wq_fault_arm("store.replay", 1, WQ_FAULT_KILL);
        wq_open(name, &o, &q);
        _exit(2);
    }
    assert_int_equal(t_wait(c, 20000), 128 + SIGKILL);
    assert_int_equal(peek(store).records, 0);   /* the commit never happened */
    t_close(expect_restored(name, &o, k, 3));
    t_shared_free(b, sizeof *b);
}

/* ------------------------------------------------------------------ */
/* A version 2 store                                                   */
/* ------------------------------------------------------------------ */

/* Rewrite the store's meta record as version 2 wrote it (144 bytes: no
   journal fields; its check over those bytes), in a child with its own
   environment; bad: with a wrong check. */
static void meta_as_v2(const char *dir, bool bad)
{
    pid_t c = t_fork(20);
    if (c == 0) {
        MDB_env *env;
        MDB_txn *txn;
        MDB_dbi dbi;
        MDB_val k = { 4, "meta" }, v;
        unsigned char b[160];
        if (mdb_env_create(&env) != 0 || mdb_env_set_maxdbs(env, 4) != 0 ||
            mdb_env_open(env, dir, 0, 0600) != 0 || mdb_txn_begin(env, NULL, 0, &txn) != 0 ||
            mdb_dbi_open(txn, "meta", 0, &dbi) != 0 || mdb_get(txn, dbi, &k, &v) != 0 ||
            v.mv_size != 160)
            _exit(1);
        memcpy(b, v.mv_data, 160);
        uint32_t two = 2;
        memcpy(b + 16, &two, 4);
        memset(b + 136, 0, 8);
        uint64_t check = wq__hash64(WQ_CHECK_SEED, b, 144) ^ (bad ? 1 : 0);
        memcpy(b + 136, &check, 8);
        MDB_val nv = { 144, b };
        if (mdb_put(txn, dbi, &k, &nv, 0) != 0 || mdb_txn_commit(txn) != 0)
            _exit(1);
        mdb_env_close(env);
        _exit(0);
    }
    assert_int_equal(t_wait(c, 10000), 0);
}

static size_t meta_size(const char *dir)
{
    size_t *out = t_shared_alloc(sizeof *out);
    pid_t c = t_fork(20);
    if (c == 0) {
        MDB_env *env;
        MDB_txn *txn;
        MDB_dbi dbi;
        MDB_val k = { 4, "meta" }, v;
        if (mdb_env_create(&env) != 0 || mdb_env_set_maxdbs(env, 4) != 0 ||
            mdb_env_open(env, dir, MDB_RDONLY, 0600) != 0 ||
            mdb_txn_begin(env, NULL, MDB_RDONLY, &txn) != 0 ||
            mdb_dbi_open(txn, "meta", 0, &dbi) != 0 || mdb_get(txn, dbi, &k, &v) != 0)
            _exit(1);
        *out = v.mv_size;
        _exit(0);
    }
    assert_int_equal(t_wait(c, 10000), 0);
    size_t n = *out;
    t_shared_free(out, sizeof *out);
    return n;
}

/* A store whose meta record version 2 wrote restores (and its meta is
   version 3 after); one whose version 2 check fails is refused. */
static void test_store_v2(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("jv2");
    struct wq_options o = jopts(store);
    wq *q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_add(q, KS("v")), 0);
    assert_int_equal(wq_snapshot(q), 0);   /* a checkpoint: LMDB holds v */
    t_close(q);
    go_down(name);
    char jf[300];   /* a version 2 store has no journal */
    snprintf(jf, sizeof jf, "%s/journal", store);
    assert_int_equal(unlink(jf), 0);
    meta_as_v2(store, false);
    assert_int_equal(meta_size(store), 144);
    const char *keys[] = { "v" };
    t_close(expect_restored(name, &o, keys, 1));
    assert_int_equal(meta_size(store), 160);
    go_down(name);
    assert_int_equal(unlink(jf), 0);
    meta_as_v2(store, true);
    assert_int_equal(wq_open(name, &o, &q), -EUCLEAN);
    if (!strstr(wq_last_error(), "meta record checksum mismatch"))
        fail_msg("wq_last_error: '%s'", wq_last_error());
}

/* ------------------------------------------------------------------ */
/* A fork, the lease thread's checkpoints, a journal removed           */
/* ------------------------------------------------------------------ */

/* A writer that forked (a pool's parent, say) dies holding the journal
   lock: its child must not keep the lock alive, or every writer of the
   queue waits for that child forever. */
static void test_fork_holder_dies(void **state)
{
    (void)state;
    const char *store, *name;
    struct wq_options o;
    struct board *b = jq_begin("jfork", &store, &name, &o);
    pid_t *grandchild = t_shared_alloc(sizeof *grandchild);
    pid_t c = t_fork(60);
    if (c == 0) {
        wq *q = NULL;
        if (wq_open(name, NULL, &q) < 0 || wq_add(q, KS("f1")) != 0)
            _exit(2);
        pid_t g = fork();   /* sleeps on, with whatever it inherited */
        if (g == 0) {
            for (;;)
                pause();
        }
        *grandchild = g;
        wq_fault_arm("store.journal", 1, WQ_FAULT_KILL);
        wq_add(q, KS("f2"));
        _exit(3);
    }
    assert_int_equal(t_wait(c, 20000), 128 + SIGKILL);
    assert_true(*grandchild > 0);
    run_killed(name, b, add_one, "after");   /* its add must not wait */
    assert_int_equal(b->rc, 0);
    kill(*grandchild, SIGKILL);
    go_down(name);
    /* f2's add never returned, but it was listed: the next group took it. */
    const char *keys[] = { "f1", "f2", "after" };
    t_close(expect_restored(name, &o, keys, 3));
    t_shared_free(grandchild, sizeof *grandchild);
    t_shared_free(b, sizeof *b);
}

static int add_three_wait(wq *q, void *arg)
{
    add_three(q, arg);
    /* Open, idle: the lease thread checkpoints once the interval passed. */
    t_sleep_ms(1500 * t_scale());
    return 0;
}

/* With adds alone, LMDB takes the journal within about an interval
   (300 ms here), from the lease thread of a process that merely has the
   queue open. */
static void test_interval_checkpoint(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("jivl");
    struct wq_options o = t_store_opts(store, WQ_DURABLE_FSYNC);
    o.snapshot_interval_ms = 300;
    t_close(t_track(T_OPEN(name, &o)));
    struct board *b = t_shared_alloc(sizeof *b);
    const char *k[] = { "i1", "i2", "i3" };
    run_killed(name, b, add_three_wait, (void *)k);
    assert_int_equal(peek(store).records, 3);
    go_down(name);
    t_close(expect_restored(name, &o, k, 3));
    t_shared_free(b, sizeof *b);
}

struct replaced_board {
    atomic_int stage;
    int rc[3];
};

/* The journal's file removed under a live queue: the groups written to
   the removed file go to LMDB at the next checkpoint, and the groups
   after it to a new file at the name. */
static void test_journal_removed(void **state)
{
    (void)state;
    const char *store = t_mkstore(), *name = t_qname("jrm");
    struct wq_options o = jopts(store);
    t_close(t_track(T_OPEN(name, &o)));
    struct replaced_board *rb = t_shared_alloc(sizeof *rb);
    char jf[300];
    snprintf(jf, sizeof jf, "%s/journal", store);
    pid_t c = t_fork(60);
    if (c == 0) {
        wq *q = NULL;
        if (wq_open(name, NULL, &q) < 0)
            _exit(2);
        rb->rc[0] = wq_add(q, KS("a1"));
        atomic_store(&rb->stage, 1);
        if (t_wait_count(&rb->stage, 2, 20000) != 0)
            _exit(2);
        rb->rc[1] = wq_add(q, KS("a2"));   /* into the removed file */
        rb->rc[2] = wq_snapshot(q);        /* a1, a2 to LMDB */
        wq_add(q, KS("a3"));               /* into a new file */
        atomic_store(&rb->stage, 3);
        for (;;)
            pause();
    }
    assert_int_equal(t_wait_count(&rb->stage, 1, 20000), 0);
    assert_int_equal(unlink(jf), 0);
    atomic_store(&rb->stage, 2);
    assert_int_equal(t_wait_count(&rb->stage, 3, 20000), 0);
    assert_int_equal(kill(c, SIGKILL), 0);
    assert_int_equal(t_wait(c, 10000), 128 + SIGKILL);
    assert_int_equal(rb->rc[0], 0);
    assert_int_equal(rb->rc[1], 0);
    assert_int_equal(rb->rc[2], 0);
    assert_int_equal(peek(store).records, 2);
    struct jgroups g = jgroups(store);   /* the new file: a3's group alone */
    assert_int_equal(g.n, 1);
    assert_int_equal(g.off[0], 0);
    go_down(name);
    const char *keys[] = { "a1", "a2", "a3" };
    t_close(expect_restored(name, &o, keys, 3));
    t_shared_free(rb, sizeof *rb);
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        T_STORE_TEST(test_replay),
        T_STORE_TEST(test_torn_last),
        T_STORE_TEST(test_damaged_middle),
        T_STORE_TEST(test_store_older),
        T_STORE_TEST(test_kill_points),
        T_STORE_TEST(test_full_journal),
        T_STORE_TEST(test_foreign_journal),
        T_STORE_TEST(test_dead_group_checkpoint),
        T_STORE_TEST(test_unlinked_region),
        T_STORE_TEST(test_second_queue),
        T_STORE_TEST(test_unseen_queue),
        T_STORE_TEST(test_takeover_commit),
        T_STORE_TEST(test_fork_during_claim),
        T_STORE_TEST(test_failed_maker),
        T_STORE_TEST(test_store_alias),
        T_STORE_TEST(test_owner_truncated),
        T_STORE_TEST(test_store_copy),
        T_STORE_TEST(test_creators_race),
        T_STORE_TEST(test_checkpoint_damage),
        T_STORE_TEST(test_replay_killed),
        T_STORE_TEST(test_store_v2),
        T_STORE_TEST(test_fork_holder_dies),
        T_STORE_TEST(test_interval_checkpoint),
        T_STORE_TEST(test_journal_removed),
        T_NO_LEFTOVERS,
    };
    static const struct t_guard g = {
        .prog = "test-journal",
        .max_stores = 32,
        .deadline_s = 300,
        T_GUARD_TESTS(tests),
    };
    return t_guard_main(&g);
}
