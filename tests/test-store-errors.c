/*
 * test-store-errors.c - LMDB stores that cannot be used, and the store
 * options. Single process unless stated.
 *
 *   - damaged, foreign and unusable stores fail cleanly (-EUCLEAN, -EIO,
 *     -ENOTDIR, ...) without a crash and without creating the region
 *     (each wq_open runs in a child, so a crash there is seen as one);
 *   - read-only stores (as nobody): wq_open fails cleanly, or opens and
 *     the first write fails and changes nothing, unless a process that
 *     can write the store commits it first (then it succeeded);
 *   - option checks and the permissions of the store files.
 *
 * Store directories live under one mkdtemp directory in /tmp. main()
 * runs the cmocka group in a child and removes that directory (and any
 * /dev/shm object of the child) whatever happened to the child, so a
 * crash or a watchdog exit leaves nothing behind (t_guard_main).
 */
#include "t.h"

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* Damaged, foreign and unusable stores                                */
/* ------------------------------------------------------------------ */

struct child_result {
    int rc;
    int add_rc;
    int len_before, len_after;
};

/* wq_open in a child (a crash there must not take the runner down).
   Returns the child's status as t_wait does; *res holds wq_open's rc. */
static int open_in_child(const char *name, const struct wq_options *o,
                         struct child_result *res, uid_t uid)
{
    res->rc = 1;
    res->add_rc = 1;
    pid_t c = t_fork(20);
    if (c == 0) {
        if (uid != 0 && t_drop_to(uid) != 0)
            _exit(90);
        wq *q = NULL;
        int rc = wq_open(name, o, &q);
        res->rc = rc;
        if (rc == 0) {
            /* Opened (a readable store): a write must then fail cleanly. */
            res->len_before = wq_len(q);
            res->add_rc = wq_add(q, KS("new-key"));
            res->len_after = wq_len(q);
            wq_close(q);
            wq_unlink(name);
        }
        _exit(0);
    }
    return t_wait(c, 15000);
}

struct lines {
    char text[16][256];
    int n;
};
static void keep_line(const char *what, void *arg)
{
    struct lines *l = arg;
    if (l->n < 16)
        snprintf(l->text[l->n++], sizeof l->text[0], "%s", what);
}

static bool has_line(const struct lines *l, const char *part)
{
    for (int i = 0; i < l->n; i++)
        if (strstr(l->text[i], part))
            return true;
    return false;
}

static void populate(const char *name, const char *store, int nkeys)
{
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.store_path = store;
    o.max_key_len = 32;
    o.flags = WQ_CREATE | WQ_EXCL;
    wq *q = t_track(T_OPEN(name, &o));
    for (int i = 0; i < nkeys; i++) {
        char k[16];
        snprintf(k, sizeof k, "p%d", i);
        assert_int_equal(wq_add(q, KS(k)), 0);
    }
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
}

static off_t file_size(const char *p)
{
    struct stat st;
    if (stat(p, &st) != 0)
        fail_msg("stat(%s): %s", p, strerror(errno));
    return st.st_size;
}

static void fill_random(const char *path, off_t from, off_t to)
{
    int fd = open(path, O_WRONLY);
    if (fd < 0)
        fail_msg("open(%s): %s", path, strerror(errno));
    unsigned char buf[4096];
    unsigned x = 12345;
    for (off_t off = from; off < to; off += (off_t)sizeof buf) {
        for (size_t i = 0; i < sizeof buf; i++) {
            x = x * 1103515245u + 12345u;
            buf[i] = (unsigned char)(x >> 16);
        }
        size_t n = (size_t)(to - off) < sizeof buf ? (size_t)(to - off) : sizeof buf;
        if (pwrite(fd, buf, n, off) != (ssize_t)n)
            fail_msg("pwrite(%s): %s", path, strerror(errno));
    }
    close(fd);
}

/* Expect a clean failure with one of the given errnos (0-terminated). */
static void expect_open_fails_(const char *name, const struct wq_options *o,
                               const char *ctx, const int *allowed, int line)
{
    struct child_result *res = t_shared_alloc(sizeof *res);
    int st = open_in_child(name, o, res, 0);
    if (st != 0)
        fail_msg("line %d: %s: wq_open crashed the process (status %d%s)", line, ctx,
                 st, st > 128 ? ", killed by a signal" : "");
    int ok = 0;
    for (const int *a = allowed; *a; a++)
        ok |= res->rc == *a;
    if (!ok)
        fail_msg("line %d: %s: wq_open = %d (%s)", line, ctx, res->rc,
                 res->rc <= 0 ? wq_strerror(res->rc) : "");
    printf("  %s: wq_open = %s\n", ctx, wq_strerror(res->rc));
    t_shared_free(res, sizeof *res);
    t_expect_no_shm_(name, ctx, line);
}
#define expect_open_fails(n, o, c, ...)                                      \
    do {                                                                     \
        static const int allowed_[] = { __VA_ARGS__, 0 };                    \
        expect_open_fails_((n), (o), (c), allowed_, __LINE__);               \
    } while (0)

static void test_corrupt_store(void **state)
{
    (void)state;
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.flags = WQ_CREATE | WQ_EXCL;
    char data[256];

    /* Garbage over the whole data.mdb. */
    const char *s1 = t_mkstore();
    const char *n1 = t_qname("garbage");
    populate(n1, s1, 20);
    snprintf(data, sizeof data, "%s/data.mdb", s1);
    fill_random(data, 0, file_size(data));
    o.store_path = s1;
    expect_open_fails(n1, &o, "garbage data.mdb", -EUCLEAN, -EIO);

    /* Truncated to its two meta pages: the data pages are gone. */
    const char *s2 = t_mkstore();
    const char *n2 = t_qname("trunc");
    populate(n2, s2, 20);
    snprintf(data, sizeof data, "%s/data.mdb", s2);
    long psz = sysconf(_SC_PAGESIZE);
    if (truncate(data, 2 * psz) != 0)
        fail_msg("truncate: %s", strerror(errno));
    o.store_path = s2;
    expect_open_fails(n2, &o, "data.mdb truncated to its meta pages", -EUCLEAN, -EIO);

    /* Truncated to 100 bytes (not even a meta page). */
    const char *s3 = t_mkstore();
    const char *n3 = t_qname("trunc100");
    populate(n3, s3, 20);
    snprintf(data, sizeof data, "%s/data.mdb", s3);
    if (truncate(data, 100) != 0)
        fail_msg("truncate: %s", strerror(errno));
    o.store_path = s3;
    expect_open_fails(n3, &o, "data.mdb truncated to 100 bytes", -EUCLEAN, -EIO);

    /* Meta pages intact, garbage in every data page: LMDB has no page
       checksums and dies walking them, in libwq's reader child, not in
       the opening process. */
    const char *s4 = t_mkstore();
    const char *n4 = t_qname("datapages");
    populate(n4, s4, 20);
    snprintf(data, sizeof data, "%s/data.mdb", s4);
    fill_random(data, 2 * psz, file_size(data));
    o.store_path = s4;
    expect_open_fails(n4, &o, "garbage in the data pages only (meta intact)", -EUCLEAN);

    /* One zeroed page of records in a larger store (the page holding the
       last record header found in the file: a leaf in use). */
    const char *s5 = t_mkstore();
    const char *n5 = t_qname("zeropage");
    populate(n5, s5, 2000);
    snprintf(data, sizeof data, "%s/data.mdb", s5);
    int fd = open(data, O_RDWR);
    assert_true(fd >= 0);
    off_t size = file_size(data), page = -1;
    static unsigned char buf[4096], zero[4096];
    for (off_t off = 0; off < size; off += 4096) {
        assert_int_equal(pread(fd, buf, sizeof buf, off), (ssize_t)sizeof buf);
        if (memmem(buf, sizeof buf, "WQR2", 4))
            page = off;
    }
    assert_true(page > 0);
    assert_int_equal(pwrite(fd, zero, sizeof zero, page), (ssize_t)sizeof zero);
    close(fd);
    o.store_path = s5;
    expect_open_fails(n5, &o, "a zeroed page", -EUCLEAN);

    /* Salvage walks on past a damaged leaf in a new reader: the records
       read before the cut (kept where the first reader left them) and
       after it come back, each exactly one of the keys written. Enough
       keys that the first reader hands records over before it dies (it
       writes 64 KiB at a time). The leaf: the middle one of the pages
       holding records (the last one above may be a free page's stale
       copy). */
    const char *s6 = t_mkstore();
    const char *n6 = t_qname("zeroleaf");
    populate(n6, s6, 20000);
    snprintf(data, sizeof data, "%s/data.mdb", s6);
    fd = open(data, O_RDWR);
    assert_true(fd >= 0);
    size = file_size(data);
    static off_t leaves[4096];
    int nleaves = 0;
    for (off_t off = 0; off < size && nleaves < 4096; off += 4096) {
        assert_int_equal(pread(fd, buf, sizeof buf, off), (ssize_t)sizeof buf);
        if (memmem(buf, sizeof buf, "WQR2", 4))
            leaves[nleaves++] = off;
    }
    assert_true(nleaves > 4);
    assert_int_equal(pwrite(fd, zero, sizeof zero, leaves[nleaves / 2]), (ssize_t)sizeof zero);
    close(fd);
    struct lines l = { .n = 0 };
    int kept = wq_store_salvage(s6, NULL, keep_line, &l);
    for (int i = 0; i < l.n; i++)
        printf("  zeroleaf salvage: %s\n", l.text[i]);
    assert_true(has_line(&l, "walk cut short"));
    /* The leaf's records are lost, and a few around it (the walk resumes
       in steps of up to 1/256 of the key space): 19,438 come back here.
       Stopping after the first step of 1/256 kept 14,651. */
    assert_in_range(kept, 19000, 19999);
    struct wq_options ro = { .store_path = s6, .flags = WQ_CREATE | WQ_EXCL | WQ_RESTORE };
    wq *q = t_track(T_OPEN(n6, &ro));
    assert_int_equal(wq_len(q), kept);
    static bool seen[20000];
    for (int i = 0; i < kept; i++) {
        char k[64];
        int got = wq_get(q, k, 32, 0);
        assert_in_range(got, 2, 6);
        k[got] = 0;
        char *end;
        long v = k[0] == 'p' ? strtol(k + 1, &end, 10) : -1;
        if (v < 0 || v >= 20000 || *end || seen[v])
            fail_msg("salvaged key '%s' was never written, or came back twice", k);
        seen[v] = true;
        assert_int_equal(wq_done(q, k, (size_t)got), 0);
    }
    t_close(q);
    t_unlink_all();
}

static void test_foreign_store(void **state)
{
    (void)state;
    const char *s = t_mkstore();
    const char *name = t_qname("foreign");
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_set_mapsize(env, 1 << 20), 0);
    assert_int_equal(mdb_env_open(env, s, 0, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    char kb[16], vb[32];
    snprintf(kb, sizeof kb, "foreign-%d", (int)getpid());
    for (size_t i = 0; i < sizeof vb; i++)
        vb[i] = (char)(i * 37 + 11);
    MDB_val k = { strlen(kb), kb }, v = { sizeof vb, vb };
    assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(env);

    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.store_path = s;
    o.flags = WQ_CREATE | WQ_EXCL;
    expect_open_fails(name, &o, "foreign LMDB environment", -EUCLEAN);

    /* The foreign environment was not written to. */
    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_open(env, s, MDB_RDONLY, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    MDB_stat ms;
    assert_int_equal(mdb_stat(txn, dbi, &ms), 0);
    MDB_val got;
    int grc = mdb_get(txn, dbi, &k, &got);
    mdb_txn_abort(txn);
    mdb_env_close(env);
    if (ms.ms_entries != 1 || grc != 0)
        fail_msg("foreign environment changed: %zu entries, our key %s", ms.ms_entries,
                 grc == 0 ? "present" : "missing");
}

/* Open the store's LMDB environment and change it as a careless tool
   would: LMDB is happy, libwq must not be. */
enum edit { EDIT_RECORD, DELETE_RECORD };
static void lmdb_change(const char *store, enum edit what)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi recs;
    MDB_cursor *c;
    MDB_val k, v;
    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_set_maxdbs(env, 4), 0);
    assert_int_equal(mdb_env_open(env, store, 0, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, "records", 0, &recs), 0);
    assert_int_equal(mdb_cursor_open(txn, recs, &c), 0);
    assert_int_equal(mdb_cursor_get(c, &k, &v, MDB_FIRST), 0);
    if (what == EDIT_RECORD) {
        unsigned char val[512];
        assert_true(v.mv_size <= sizeof val);
        memcpy(val, v.mv_data, v.mv_size);
        val[8] ^= 1;   /* the failure count: a plausible value, a wrong sum */
        MDB_val nv = { v.mv_size, val };
        assert_int_equal(mdb_cursor_put(c, &k, &nv, MDB_CURRENT), 0);
    } else {
        assert_int_equal(mdb_cursor_del(c, 0), 0);
    }
    mdb_cursor_close(c);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

/* wq_open in a child; the error and wq_last_error come back. */
struct named {
    int rc;
    char why[512];
};
static struct named open_named(const char *name, const char *store, unsigned flags)
{
    struct named *sh = t_shared_alloc(sizeof *sh);
    pid_t c = t_fork(20);
    if (c == 0) {
        struct wq_options o = { .store_path = store, .flags = WQ_CREATE | WQ_EXCL | flags };
        wq *q;
        sh->rc = wq_open(name, &o, &q);
        snprintf(sh->why, sizeof sh->why, "%s", wq_last_error());
        if (sh->rc == 0) {
            wq_close(q);
            wq_unlink(name);
        }
        _exit(0);
    }
    assert_int_equal(t_wait(c, 15000), 0);
    struct named r = *sh;
    t_shared_free(sh, sizeof *sh);
    T_EXPECT_NO_SHM(name, "after a refused restore");
    return r;
}

static void expect_named(struct named r, const char *store, const char *what)
{
    if (r.rc != -EUCLEAN || !strstr(r.why, store) || !strstr(r.why, what))
        fail_msg("wq_open = %d (%s), wq_last_error \"%s\": expected -EUCLEAN naming %s "
                 "and \"%s\"", r.rc, wq_strerror(r.rc), r.why, store, what);
    printf("  %s\n", r.why);
}

/* A store knows what it holds: an edited record, a lost record, a data
   file gone or emptied under the marker all fail the restore, and the
   message names the store and the damage. */
static void test_damage_named(void **state)
{
    (void)state;
    char data[300];
    const char *s1 = t_mkstore(), *n1 = t_qname("edited");
    populate(n1, s1, 20);
    lmdb_change(s1, EDIT_RECORD);
    expect_named(open_named(n1, s1, 0), s1, "checksum mismatch");

    const char *s2 = t_mkstore(), *n2 = t_qname("lost");
    populate(n2, s2, 20);
    lmdb_change(s2, DELETE_RECORD);
    expect_named(open_named(n2, s2, 0), s2, "holds 19 records, its meta record says 20");

    const char *s3 = t_mkstore(), *n3 = t_qname("nodata");
    populate(n3, s3, 5);
    snprintf(data, sizeof data, "%s/data.mdb", s3);
    assert_int_equal(unlink(data), 0);
    expect_named(open_named(n3, s3, 0), s3, "data.mdb is missing");
    expect_named(open_named(n3, s3, WQ_RESTORE), s3, "data.mdb is missing");

    const char *s4 = t_mkstore(), *n4 = t_qname("emptydata");
    populate(n4, s4, 5);
    snprintf(data, sizeof data, "%s/data.mdb", s4);
    assert_int_equal(truncate(data, 0), 0);
    expect_named(open_named(n4, s4, 0), s4, "data.mdb is empty");
    t_unlink_all();
}

/* wq_store_salvage keeps what verifies, says what it dropped, and keeps
   the damaged store aside; the queue restores from the new store. */
static void test_salvage(void **state)
{
    (void)state;
    const char *s = t_mkstore(), *name = t_qname("salvage");
    populate(name, s, 20);
    lmdb_change(s, EDIT_RECORD);   /* one record fails its checksum */
    struct lines l = { .n = 0 };
    assert_int_equal(wq_store_salvage(s, NULL, keep_line, &l), 19);
    for (int i = 0; i < l.n; i++)
        printf("  salvage: %s\n", l.text[i]);
    assert_true(has_line(&l, "dropped the record of key 'p"));
    assert_true(has_line(&l, "record checksum mismatch"));
    assert_true(has_line(&l, "kept 19 records; dropped 1 damaged, 0 missing"));
    /* The damaged store is kept, whole, next to the new one. */
    char parent[300], *slash;
    snprintf(parent, sizeof parent, "%s", s);
    slash = strrchr(parent, '/');
    assert_non_null(slash);
    *slash = 0;   /* parent: the directory; slash + 1: the store's name */
    DIR *d = opendir(parent);
    assert_non_null(d);
    struct dirent *de;
    int aside = 0;
    while ((de = readdir(d)))   /* this store's: other tests salvage theirs */
        aside += strncmp(de->d_name, slash + 1, strlen(slash + 1)) == 0 &&
                 strstr(de->d_name, ".damaged-") != NULL;
    closedir(d);
    assert_int_equal(aside, 1);
    struct named r = open_named(name, s, WQ_RESTORE);
    assert_int_equal(r.rc, 0);
    struct wq_options o = { .store_path = s, .flags = WQ_CREATE | WQ_EXCL | WQ_RESTORE };
    wq *q = t_track(T_OPEN(name, &o));
    assert_int_equal(wq_len(q), 19);
    t_check_clean(q, "salvaged");
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);

    /* Nothing to salvage: no data.mdb. */
    const char *empty = t_mkstore();
    assert_int_equal(wq_store_salvage(empty, NULL, NULL, NULL), -ENODATA);
    assert_int_equal(wq_store_salvage(NULL, NULL, NULL, NULL), -EINVAL);
}

static unsigned mode_of(const char *dir, const char *file)
{
    char p[400];
    struct stat sb;
    snprintf(p, sizeof p, "%s%s%s", dir, file ? "/" : "", file ? file : "");
    if (stat(p, &sb) != 0)
        fail_msg("stat(%s): %s", p, strerror(errno));
    return sb.st_mode & 07777;
}

/* A child as nobody: open the queue, add a key (and with key2, both
   keys with wq_add_many); the add's return code. */
/* nobody adds key (and key2: one wq_add_many) to queue `name`; with
   stop_at, it stops at that crash point (WQ_FAULT_STOP) and *pid says
   who to continue: the caller then collects the result with
   nobody_result. Returns the add's result, or the child's pid. */
struct nobody_add {
    int rc;
};

static pid_t nobody_start(const char *name, const char *key, const char *key2,
                          const char *stop_at, struct nobody_add *out)
{
    out->rc = 1;
    pid_t c = t_fork(20);
    if (c == 0) {
        wq *q;
        if (t_drop_to(T_NOBODY) != 0)
            _exit(90);
        int r = wq_open(name, NULL, &q);
        if (r == 0 && stop_at && wq_fault_arm(stop_at, 1, WQ_FAULT_STOP) != 0)
            _exit(91);
        if (r == 0 && key2) {
            struct iovec v[2] = { { (void *)key, strlen(key) }, { (void *)key2, strlen(key2) } };
            r = wq_add_many(q, v, 2);
            wq_close(q);
        } else if (r == 0) {
            r = wq_add(q, key, strlen(key));
            wq_close(q);
        }
        out->rc = r;
        _exit(0);
    }
    return c;
}

static int nobody_result(pid_t c, struct nobody_add *out)
{
    assert_int_equal(t_wait(c, 15000), 0);
    int r = out->rc;
    t_shared_free(out, sizeof *out);
    return r;
}

static int nobody_adds2(const char *name, const char *key, const char *key2)
{
    struct nobody_add *out = t_shared_alloc(sizeof *out);
    return nobody_result(nobody_start(name, key, key2, NULL, out), out);
}

static int nobody_adds(const char *name, const char *key)
{
    return nobody_adds2(name, key, NULL);
}

/* A store follows `mode` exactly (the umask not applied; the search bit
   wherever reading is granted), so every uid the mode lets use the queue
   can use its store: another uid's add is stored and comes back. (0666
   used to make the directory drwxr--r--: another uid's add failed.) */
static void test_shared_store_mode(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        printf("  not root: the shared store test needs setuid(%d)\n", T_NOBODY);
        skip();
    }
    mode_t old = umask(022);
    char dir[400];
    const char *parent = t_mkstore();
    assert_int_equal(chmod(parent, 0711), 0);   /* nobody may pass through */
    snprintf(dir, sizeof dir, "%s/shared", parent);
    const char *name = t_qname("shared");
    struct wq_options o = { .store_path = dir, .mode = 0666, .flags = WQ_CREATE | WQ_EXCL };
    wq *q = t_track(T_OPEN(name, &o));
    assert_int_equal(mode_of(dir, NULL), 0777);
    assert_int_equal(mode_of(dir, "data.mdb"), 0666);
    assert_int_equal(mode_of(dir, "lock.mdb"), 0666);
    assert_int_equal(mode_of(dir, "libwq-store"), 0666);
    assert_int_equal(mode_of(dir, "owner"), 0666);   /* the claim (owner.c) */
    assert_int_equal(nobody_adds(name, "from-nobody"), 0);
    assert_int_equal(t_key_state(q, "from-nobody"), WQ_KEY_QUEUED | WQ_KEY_DIRTY);
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
    o.flags = WQ_CREATE | WQ_EXCL | WQ_RESTORE;
    q = t_track(T_OPEN(name, &o));
    assert_int_equal(t_key_state(q, "from-nobody"), WQ_KEY_QUEUED | WQ_KEY_DIRTY);
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);

    /* 0640: group may read, so may search; others nothing. */
    snprintf(dir, sizeof dir, "%s/group", t_mkstore());
    o.store_path = dir;
    o.mode = 0640;
    o.flags = WQ_CREATE | WQ_EXCL;
    q = t_track(T_OPEN(t_qname("group"), &o));
    assert_int_equal(mode_of(dir, NULL), 0750);
    assert_int_equal(mode_of(dir, "data.mdb"), 0640);
    assert_int_equal(mode_of(dir, "owner"), 0640);
    t_close(q);
    umask(old);
}

/* A uid that may use the region but not write the store: its adds (one
   key, a batch) fail, and their keys are not queued, now or later (no
   later flush by another process completes them), nor stored. Nobody
   else is attached meanwhile: a process that can write the store could
   commit the adds for it first (test_refused_write_carried). */
/* As root: a queue `tag` that every uid may use (0666), holding
   "before", whose store only root may write. Skips unless root. */
static wq *readonly_store_queue(const char *tag, char *dir, size_t dn, const char **name,
                                struct wq_options *o)
{
    if (geteuid() != 0) {
        printf("  not root: the %s test needs setuid(%d)\n", tag, T_NOBODY);
        skip();
    }
    char p[500];
    const char *parent = t_mkstore();
    assert_int_equal(chmod(parent, 0711), 0);
    snprintf(dir, dn, "%s/%s", parent, tag);
    *name = t_qname(tag);
    *o = (struct wq_options){ .store_path = dir, .mode = 0666,
                              .flags = WQ_CREATE | WQ_EXCL };
    wq *q = t_track(T_OPEN(*name, o));
    assert_int_equal(wq_add(q, KS("before")), 0);
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    assert_int_equal(chmod(p, 0644), 0);
    snprintf(p, sizeof p, "%s/lock.mdb", dir);
    assert_int_equal(chmod(p, 0644), 0);
    return q;
}

static void test_refused_write_not_queued(void **state)
{
    (void)state;
    char dir[400];
    const char *name;
    struct wq_options o;
    wq *q = readonly_store_queue("refused", dir, sizeof dir, &name, &o);
    t_close(q);   /* the region stays; its writer is gone */
    int rc = nobody_adds(name, "refused");
    if (rc != -EACCES && rc != -EROFS && rc != -EIO)
        fail_msg("nobody's add to a store it cannot write: %d (%s)", rc, wq_strerror(rc));
    rc = nobody_adds2(name, "refused-m1", "refused-m2");   /* a batch, the same */
    if (rc != -EACCES && rc != -EROFS && rc != -EIO)
        fail_msg("nobody's wq_add_many to a store it cannot write: %d (%s)", rc,
                 wq_strerror(rc));
    o.flags = 0;
    q = t_track(T_OPEN(name, &o));
    assert_int_equal(t_key_state(q, "refused"), 0);
    assert_int_equal(t_key_state(q, "refused-m1"), 0);
    assert_int_equal(t_key_state(q, "refused-m2"), 0);
    /* Root writes to the store meanwhile: the refused keys stay out. */
    assert_int_equal(wq_add(q, KS("after")), 0);
    assert_true(wq_snapshot(q) >= 0);
    assert_int_equal(t_key_state(q, "refused"), 0);
    assert_int_equal(t_key_state(q, "refused-m1"), 0);
    assert_int_equal(t_key_state(q, "refused-m2"), 0);
    T_EXPECT_GET(q, "before");
    T_EXPECT_GET(q, "after");
    T_EXPECT_GET_RC(q, -EAGAIN);
    assert_int_equal(wq_done(q, KS("before")), 0);
    assert_int_equal(wq_done(q, KS("after")), 0);
    t_check_clean(q, "after a refused write");
    t_close(q);
    /* ... and they are not in the store either. */
    assert_int_equal(wq_unlink(name), 0);
    o.flags = WQ_CREATE | WQ_EXCL | WQ_RESTORE;
    q = t_track(T_OPEN(name, &o));
    assert_int_equal(t_key_state(q, "refused"), 0);
    assert_int_equal(t_key_state(q, "refused-m1"), 0);
    assert_int_equal(t_key_state(q, "refused-m2"), 0);
    assert_int_equal(wq_len(q), 0);   /* before and after were done */
    t_close(q);
}

/* nobody adds key (and key2, one batch) and stops between the add and
   its commit; root's process commits it (its snapshot, or its background
   thread's tick if that came first); nobody goes on. */
static void carried(wq *q, const char *name, const char *key, const char *key2)
{
    struct nobody_add *out = t_shared_alloc(sizeof *out);
    pid_t c = nobody_start(name, key, key2, "store.add.marked", out);
    t_wait_stopped(c, "nobody's add", "store.add.marked");
    /* Added: invisible until stored, unless root's tick stored it. */
    unsigned st = t_key_state(q, key);
    if (st != (WQ_KEY_QUEUED | WQ_KEY_DIRTY) && !(st & WQ_KEY_STORING))
        fail_msg("nobody's add of %s, stopped before its commit: state 0x%x", key, st);
    int wrote = wq_snapshot(q);   /* nobody's records, unless the tick was first */
    if (wrote < 0 || wrote > ((st & WQ_KEY_STORING) ? (key2 ? 2 : 1) : 0))
        fail_msg("root's snapshot wrote %d records (state before: 0x%x)", wrote, st);
    assert_int_equal(t_key_state(q, key), WQ_KEY_QUEUED | WQ_KEY_DIRTY);
    if (key2)
        assert_int_equal(t_key_state(q, key2), WQ_KEY_QUEUED | WQ_KEY_DIRTY);
    assert_int_equal(kill(c, SIGCONT), 0);
    /* Its own commit finds nothing left to write: the add succeeded. */
    assert_int_equal(nobody_result(c, out), 0);
}

/*
 * The same uid, while a process that can write the store is attached:
 * that process's flush may commit nobody's adds before nobody's own
 * commit fails (its background thread writes what is listed, and a
 * group commit takes every process's marks). The key is then stored and
 * queued, and the add returns success: a key is queued if and only if
 * it is stored, whoever wrote it. Made to happen in that order here
 * (WQ_FAULT_STOP); under valgrind the window is wide enough for the
 * background thread's 250 ms tick to do it by itself.
 */
static void test_refused_write_carried(void **state)
{
    (void)state;
    char dir[400];
    const char *name;
    struct wq_options o;
    wq *q = readonly_store_queue("carried", dir, sizeof dir, &name, &o);
    carried(q, name, "carried", NULL);
    carried(q, name, "carried-m1", "carried-m2");
    t_check_clean(q, "after carried writes");
    t_close(q);
    assert_int_equal(wq_unlink(name), 0);
    o.flags = WQ_CREATE | WQ_EXCL | WQ_RESTORE;
    q = t_track(T_OPEN(name, &o));
    T_EXPECT_GET(q, "before");
    T_EXPECT_GET(q, "carried");
    T_EXPECT_GET(q, "carried-m1");
    T_EXPECT_GET(q, "carried-m2");
    T_EXPECT_GET_RC(q, -EAGAIN);
    t_close(q);
}

/* The shm directory, as the kernel names its files in /proc. */
static const char *shm_dir(void)
{
    static char dir[PATH_MAX];
    const char *d = getenv("WQ_SHM_DIR");
    if (!realpath(d && d[0] ? d : "/dev/shm", dir))
        fail_msg("realpath of the shm directory: %s", strerror(errno));
    return dir;
}

/* A process's mappings of a region not yet linked (an O_TMPFILE, or the
   named temporary where there is none, in the shm directory): how many,
   their resident bytes and the last one's inode, from /proc/<pid>/smaps. */
static int unlinked_regions(pid_t pid, uint64_t *rss, unsigned long *ino)
{
    char path[64], line[PATH_MAX + 128], dir[PATH_MAX + 2];
    snprintf(dir, sizeof dir, "%s/", shm_dir());
    snprintf(path, sizeof path, "/proc/%d/smaps", (int)pid);
    FILE *f = fopen(path, "r");
    int n = 0;
    bool in = false;
    *rss = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long kb;
        unsigned long lo, hi, i;
        char *p = strstr(line, dir);
        if (sscanf(line, "%lx-%lx %*s %*s %*s %lu", &lo, &hi, &i) == 3) {
            /* a mapping's first line: range, perms, offset, device, inode, path */
            in = p && (p[strlen(dir)] == '#' || strncmp(p + strlen(dir), ".wq-tmp.", 8) == 0);
            n += in;
            if (in)
                *ino = i;
        } else if (in && sscanf(line, "Rss: %llu kB", &kb) == 1) {
            *rss += kb * 1024;
        }
    }
    if (f)
        fclose(f);
    return n;
}

/* The one child of `parent`, stopped (state T), or 0 after 15 s. */
static pid_t stopped_child(pid_t parent)
{
    uint64_t deadline = t_now_ns() + 15000ull * t_scale() * 1000000u;
    while (t_now_ns() < deadline) {
        DIR *dp = opendir("/proc");
        struct dirent *de;
        while (dp && (de = readdir(dp)) != NULL) {
            char path[300], buf[512];
            int pid = atoi(de->d_name), ppid;
            char st;
            if (pid <= 0)
                continue;
            snprintf(path, sizeof path, "/proc/%d/stat", pid);
            FILE *f = fopen(path, "r");
            if (!f)
                continue;
            size_t len = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[len] = 0;
            char *rp = strrchr(buf, ')');   /* the name may hold anything */
            if (rp && sscanf(rp + 1, " %c %d", &st, &ppid) == 2 && ppid == parent &&
                (st == 'T' || st == 't')) {
                closedir(dp);
                return pid;
            }
        }
        if (dp)
            closedir(dp);
        t_sleep_ms(1);
    }
    return 0;
}

/*
 * wq_open builds a restore's region while a child process reads the
 * store (region.c, `early`): once the meta record has arrived, the region
 * the store's settings ask for exists, unlinked, with room for every key
 * it counts. Here the reader stops at its 3000th record of 4000
 * (WQ_FAULT_STOP): the opener must by then map an unlinked region with
 * the room for 4000 entries resident. Then the reader goes on and:
 *   - sound store: the restore fills that region (the queue's region is
 *     that file: the same inode): all 4000 keys, in first-add order;
 *   - a record lost (meta says 4000, 3999 found): the restore fails with
 *     the store's own message, the early region is gone from the opener
 *     (no mapping left) and nothing is in the shm directory.
 */
struct early_out {
    int rc;
    char why[512];
    int len, in_order, unlinked_after;
    unsigned long ino;   /* the queue's region, once linked */
};

static void region_while_read(bool lost)
{
    const char *store = t_mkstore(), *name = t_qname(lost ? "earlylost" : "early");
    populate(name, store, 4000);
    if (lost)
        lmdb_change(store, DELETE_RECORD);
    struct early_out *out = t_shared_alloc(sizeof *out);
    out->rc = 1;
    pid_t c = t_fork(60);
    if (c == 0) {
        struct wq_options o = { .store_path = store, .flags = WQ_CREATE | WQ_EXCL };
        wq *q;
        /* The reader is stopped for as long as the test needs, under
           valgrind too: not a hung walk. */
        setenv("WQ_TEST_STALL_MS", "600000", 1);
        if (wq_fault_arm("store.read.record", 3000, WQ_FAULT_STOP) != 0)
            _exit(91);
        out->rc = wq_open(name, &o, &q);
        snprintf(out->why, sizeof out->why, "%s", wq_last_error());
        uint64_t rss;
        unsigned long ino;
        if (out->rc == 0) {
            char path[PATH_MAX + 64];
            struct stat sb;
            snprintf(path, sizeof path, "%s/wq.%s", shm_dir(), name);
            out->ino = stat(path, &sb) == 0 ? (unsigned long)sb.st_ino : 0;
            out->len = wq_len(q);
            char buf[64], k[16];
            int len, i = 0;
            while ((len = wq_get(q, buf, sizeof buf, 0)) > 0) {
                snprintf(k, sizeof k, "p%d", i++);
                out->in_order += len == (int)strlen(k) && memcmp(buf, k, (size_t)len) == 0;
                wq_done(q, buf, (size_t)len);
            }
            wq_close(q);
            wq_unlink(name);
        }
        out->unlinked_after = unlinked_regions(getpid(), &rss, &ino);
        _exit(0);
    }
    pid_t reader = stopped_child(c);
    if (reader <= 0)
        fail_msg("the store's reader did not stop at its 3000th record");
    uint64_t rss = 0, want = 4000 * 52;   /* the entries alone (52 bytes each) */
    unsigned long early = 0;
    int n = 0;
    uint64_t deadline = t_now_ns() + 10000ull * t_scale() * 1000000u;
    while ((n = unlinked_regions(c, &rss, &early)) != 1 || rss < want) {
        if (t_now_ns() > deadline) {
            kill(reader, SIGKILL);   /* not left stopped, holding its read txn */
            fail_msg("with the reader stopped at record 3000 of 4000, the opener maps %d "
                     "unlinked region(s), %llu bytes resident (expected 1, at least %llu)",
                     n, (unsigned long long)rss, (unsigned long long)want);
        }
        t_sleep_ms(1);
    }
    printf("  reader stopped at record 3000: the opener's region is built, %llu KiB "
           "resident\n", (unsigned long long)rss / 1024);
    assert_int_equal(kill(reader, SIGCONT), 0);
    assert_int_equal(t_wait(c, 30000), 0);
    if (lost) {
        if (out->rc != -EUCLEAN || !strstr(out->why, store) ||
            !strstr(out->why, "holds 3999 records, its meta record says 4000"))
            fail_msg("restore of a store that lost a record: %d (%s), \"%s\"", out->rc,
                     wq_strerror(out->rc), out->why);
        T_EXPECT_NO_SHM(name, "after a refused restore");
    } else {
        if (out->rc != 0)
            fail_msg("restore: %s (%s)", wq_strerror(out->rc), out->why);
        if (out->ino != early)
            fail_msg("the queue's region is inode %lu, the one built while the store was "
                     "read %lu", out->ino, early);
        assert_int_equal(out->len, 4000);
        assert_int_equal(out->in_order, 4000);
    }
    assert_int_equal(out->unlinked_after, 0);
    t_shared_free(out, sizeof *out);
}

static void test_region_while_read(void **state)
{
    (void)state;
    region_while_read(false);
    region_while_read(true);
}

static void test_store_path_is_file(void **state)
{
    (void)state;
    const char *dir = t_mkstore();
    char file[256];
    snprintf(file, sizeof file, "%s/plain-file", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs("not a directory\n", f);
    fclose(f);
    const char *name = t_qname("isfile");
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.store_path = file;
    o.flags = WQ_CREATE | WQ_EXCL;
    expect_open_fails(name, &o, "store_path is a regular file", -ENOTDIR, -EIO);
    assert_int_equal(file_size(file), 16);
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

/* In a child, as nobody: create a store with keys. */
static int nobody_populate(const char *name, const char *store)
{
    if (t_drop_to(T_NOBODY) != 0)
        return 90;
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.store_path = store;
    o.flags = WQ_CREATE | WQ_EXCL;
    wq *q = NULL;
    T_CHECK_EQ(wq_open(name, &o, &q), 0);
    for (int i = 0; i < 5; i++) {
        char k[8];
        snprintf(k, sizeof k, "n%d", i);
        T_CHECK_EQ(wq_add(q, KS(k)), 0);
    }
    wq_close(q);
    return 0;
}

static void check_perm_outcome(const char *ctx, int st, const struct child_result *res,
                               const char *name)
{
    if (st != 0)
        fail_msg("%s: the process died or could not drop privileges (status %d)", ctx, st);
    if (res->rc == 0) {
        /* Opened read-only: then the first write must fail and change
           nothing (wq.h: "gives -EIO ... from the call that needed it"). */
        printf("  %s: wq_open succeeded; wq_add = %s, len %d -> %d\n", ctx,
               wq_strerror(res->add_rc), res->len_before, res->len_after);
        if (res->add_rc != -EIO && res->add_rc != -EACCES && res->add_rc != -EROFS)
            fail_msg("%s: wq_open succeeded and wq_add = %d (%s), expected a clean "
                     "error", ctx, res->add_rc, wq_strerror(res->add_rc));
        if (res->len_after != res->len_before)
            fail_msg("%s: the failed add changed wq_len %d -> %d", ctx, res->len_before,
                     res->len_after);
    } else {
        printf("  %s: wq_open = %s\n", ctx, wq_strerror(res->rc));
        if (res->rc != -EACCES && res->rc != -EIO && res->rc != -EROFS &&
            res->rc != -EPERM)
            fail_msg("%s: wq_open = %d (%s), expected -EACCES/-EIO/-EROFS/-EPERM", ctx,
                     res->rc, res->rc < 0 ? wq_strerror(res->rc) : "?");
        T_EXPECT_NO_SHM(name, ctx);
    }
}

static void test_readonly_store(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        printf("  not root: the permission test needs setuid(%d)\n", T_NOBODY);
        skip();
    }
    struct child_result *res = t_shared_alloc(sizeof *res);
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.flags = WQ_CREATE | WQ_EXCL;

    /* An empty directory nobody may read but not write. */
    const char *s1 = t_mkstore();
    const char *n1 = t_qname("ro-empty");
    assert_int_equal(chown(s1, T_NOBODY, T_NOBODY), 0);
    assert_int_equal(chmod(s1, 0500), 0);
    o.store_path = s1;
    int st = open_in_child(n1, &o, res, T_NOBODY);
    check_perm_outcome("read-only empty store directory", st, res, n1);
    if (res->rc != 0 && count_entries(s1) != 0)
        fail_msg("read-only empty store: %d files created", count_entries(s1));

    /* A store with keys, made read-only afterwards. */
    const char *s2 = t_mkstore();
    const char *n2 = t_qname("ro-full");
    assert_int_equal(chown(s2, T_NOBODY, T_NOBODY), 0);
    pid_t c = t_fork(20);
    if (c == 0)
        _exit(nobody_populate(n2, s2));
    st = t_wait(c, 15000);
    T_ASSERT_BOARD_CLEAN();
    assert_int_equal(st, 0);
    assert_int_equal(wq_unlink(n2), 0);
    char p[256];
    struct stat before, after;
    snprintf(p, sizeof p, "%s/data.mdb", s2);
    assert_int_equal(stat(p, &before), 0);
    assert_int_equal(chmod(p, 0400), 0);
    snprintf(p, sizeof p, "%s/lock.mdb", s2);
    if (access(p, F_OK) == 0)
        assert_int_equal(chmod(p, 0400), 0);
    assert_int_equal(chmod(s2, 0500), 0);
    o.store_path = s2;
    memset(res, 0, sizeof *res);
    st = open_in_child(n2, &o, res, T_NOBODY);
    check_perm_outcome("read-only store with keys", st, res, n2);
    snprintf(p, sizeof p, "%s/data.mdb", s2);
    assert_int_equal(stat(p, &after), 0);
    if (after.st_size != before.st_size || after.st_mtim.tv_sec != before.st_mtim.tv_sec ||
        after.st_mtim.tv_nsec != before.st_mtim.tv_nsec)
        fail_msg("read-only store with keys: data.mdb was modified");

    /* Root's own view: the keys are all still there. */
    assert_int_equal(chmod(s2, 0700), 0);
    o.store_path = s2;
    wq *q = t_track(T_OPEN(n2, &o));
    T_EXPECT_STATS(q, 5, 5, 0, 0, "after the read-only attempt");
    t_close(q);
    t_shared_free(res, sizeof *res);
}

/* ------------------------------------------------------------------ */
/* Options and file modes                                              */
/* ------------------------------------------------------------------ */

static void expect_einval_(const struct wq_options *o, const char *ctx, int line)
{
    const char *name = t_qname("einval");
    wq *q = NULL;
    int rc = wq_open(name, o, &q);
    if (rc == 0)
        t_close(q);
    if (rc != -EINVAL)
        fail_msg("line %d: %s: wq_open = %d (%s), expected -EINVAL", line, ctx, rc,
                 wq_strerror(rc));
    t_expect_no_shm_(name, ctx, line);
}
#define expect_einval(o, c) expect_einval_((o), (c), __LINE__)

static int file_mode(const char *dir, const char *f)
{
    char p[256];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, f);
    if (stat(p, &st) != 0)
        fail_msg("stat(%s): %s", p, strerror(errno));
    return (int)(st.st_mode & 07777);
}

static void expect_modes(mode_t opt_mode, int want, mode_t mask)
{
    const char *s = t_mkstore();
    const char *name = t_qname("mode");
    struct wq_options o;
    memset(&o, 0, sizeof o);
    o.store_path = s;
    o.mode = opt_mode;
    o.flags = WQ_CREATE | WQ_EXCL;
    mode_t old = umask(mask);
    wq *q = NULL;
    int rc = wq_open(name, &o, &q);
    if (rc == 0) {
        t_track(q);
        rc = wq_add(q, KS("m"));
    }
    umask(old);
    if (rc != 0)
        fail_msg("mode 0%o, umask 0%03o: wq_open/wq_add = %d (%s)", (unsigned)opt_mode,
                 (unsigned)mask, rc, wq_strerror(rc));
    int md = file_mode(s, "data.mdb"), ml = file_mode(s, "lock.mdb");
    if (md != want || ml != want)
        fail_msg("mode 0%o, umask 0%03o: data.mdb 0%o lock.mdb 0%o, expected 0%o",
                 (unsigned)opt_mode, (unsigned)mask, md, ml, want);
    char shm[512];
    struct stat st;
    t_shm_path(name, shm, sizeof shm);
    assert_int_equal(stat(shm, &st), 0);
    if ((int)(st.st_mode & 0777) != want)
        fail_msg("shm object mode 0%o, expected 0%o", (unsigned)(st.st_mode & 0777), want);
    t_close(q);
}

static void test_options(void **state)
{
    (void)state;
    const char *s = t_mkstore();
    struct wq_options o;

    memset(&o, 0, sizeof o);
    o.flags = WQ_CREATE;
    o.durability = WQ_DURABLE_FSYNC;
    expect_einval(&o, "FSYNC without store_path");
    o.durability = WQ_DURABLE_NONE;
    expect_einval(&o, "NONE without store_path");
    o.snapshot_interval_ms = 100;
    expect_einval(&o, "NONE + interval without store_path");
    o.durability = WQ_DURABLE_PROCESS;
    expect_einval(&o, "interval without store_path");

    o.store_path = s;
    o.durability = WQ_DURABLE_PROCESS;
    o.snapshot_interval_ms = 100;
    expect_einval(&o, "interval with PROCESS");
    o.snapshot_interval_ms = 0;
    o.durability = WQ_DURABLE_NONE + 1;   /* no such level */
    expect_einval(&o, "durability 4");
    o.durability = -1;
    expect_einval(&o, "durability -1");
    if (count_entries(s) != 0)
        fail_msg("a refused wq_open created %d files in the store", count_entries(s));

    /* Accepted: NONE with an interval, with a store. */
    o.durability = WQ_DURABLE_NONE;
    o.snapshot_interval_ms = 100;
    const char *name = t_qname("okopts");
    wq *q = t_track(T_OPEN(name, &o));
    struct wq_stats st;
    st = t_stats(q);
    assert_int_equal(st.has_store, 1);
    assert_int_equal(st.durability, WQ_DURABLE_NONE);
    t_close(q);
    /* And FSYNC with one (how long a removal may wait for a flush). */
    o.store_path = t_mkstore();
    o.durability = WQ_DURABLE_FSYNC;
    q = t_track(T_OPEN(t_qname("okfsync"), &o));
    st = t_stats(q);
    assert_int_equal(st.durability, WQ_DURABLE_FSYNC);
    t_close(q);

    /* Store files: 0600 by default, else exactly `mode`, umask or not. */
    expect_modes(0, 0600, 022);
    expect_modes(0640, 0640, 022);
    expect_modes(0640, 0640, 077);
}

/* ------------------------------------------------------------------ */
/* main: the group in a child, then every store removed                */
/* ------------------------------------------------------------------ */

int main(void)
{
    static const struct CMUnitTest tests[] = {
        T_STORE_TEST(test_corrupt_store),
        T_STORE_TEST(test_foreign_store),
        T_STORE_TEST(test_damage_named),
        T_STORE_TEST(test_salvage),
        T_STORE_TEST(test_store_path_is_file),
        T_STORE_TEST(test_readonly_store),
        T_STORE_TEST(test_shared_store_mode),
        T_STORE_TEST(test_refused_write_not_queued),
        T_STORE_TEST(test_refused_write_carried),
        T_STORE_TEST(test_region_while_read),
        T_STORE_TEST(test_options),
        T_NO_LEFTOVERS,
    };
    static const struct t_guard g = {
        .prog = "test-store-errors",
        .max_stores = 64,
        /* Traversable, so a child running as nobody reaches its store. */
        .topdir_mode = 0711,
        .deadline_s = 300,
        T_GUARD_TESTS(tests),
    };
    return t_guard_main(&g);
}
