/*
 * lmdb.c - the store's LMDB layer: environments (one per path and
 * process), transactions, map growth, and reading and writing the
 * records whose format format.h documents. It knows nothing of regions.
 *
 * Environments: LMDB forbids opening one environment twice in a process
 * and using one across fork(), so each process keeps a registry of open
 * environments keyed by path and pid; a child opens its own, lazily.
 * Opening checks that the environment is a libwq store: LMDB verifies
 * nothing on its pages, so a data file shorter than LMDB's own idea of it
 * (unless only free pages are missing: tail_free), or a main database
 * holding anything but our two named databases, is refused before it is
 * used.
 *
 * Errors: LMDB's codes map to libwq's (wq__lmdb_err): a damaged or
 * foreign store is -EUCLEAN, a full map -ENOSPC (grown by the caller), a
 * full reader table -EUSERS, everything else the system's errno or -EIO.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "format.h"

#define INITIAL_MAP (64ull << 20)

static pthread_mutex_t envs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct wq_env *envs;

/* A fork while another thread (a lease thread's write, say) holds envs_mu
   would leave the child's copy locked for good: the child starts with a
   fresh one. (Not held across the fork: the env open below forks while
   holding it, tail_free.) The list stays readable: it changes by single
   pointer stores, and the child uses only the environments it opens. */
static void envs_child(void)
{
    pthread_mutex_init(&envs_mu, NULL);
    /* The journal's descriptors: the locks on them belong to their open
       file descriptions, which a copy here would keep alive after the
       parent died holding one (every writer of the queue would wait for
       this child). The child opens its own. */
    for (struct wq_env *e = envs; e; e = e->next) {
        if (e->jfd > 0)
            close(e->jfd - 1);
        if (e->rfd > 0)
            close(e->rfd - 1);
        if (e->ofd > 0)   /* no lock on it: closed for tidiness */
            close(e->ofd - 1);
        e->jfd = e->rfd = e->ofd = 0;
    }
}

static void envs_fork_setup(void)
{
    pthread_atfork(NULL, NULL, envs_child);
}

static void envs_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, envs_fork_setup);
}

int wq__lmdb_env_cached(const char *path, struct wq_env **out)
{
    pid_t me = getpid();
    envs_init();
    pthread_mutex_lock(&envs_mu);
    struct wq_env *e = envs;
    while (e && !(e->pid == me && strcmp(e->path, path) == 0))
        e = e->next;
    pthread_mutex_unlock(&envs_mu);
    *out = e;
    return e ? 0 : -ENOENT;
}

int wq__lmdb_err(int rc)
{
    switch (rc) {
    case 0: return 0;
    case MDB_MAP_FULL: case MDB_TXN_FULL: return -ENOSPC;
    case MDB_INVALID: case MDB_CORRUPTED: case MDB_PAGE_NOTFOUND:
    case MDB_VERSION_MISMATCH: case MDB_INCOMPATIBLE: case MDB_BAD_TXN:
        return -EUCLEAN;
    case MDB_NOTFOUND: return -ENOENT;
    case MDB_READERS_FULL: return -EUSERS;
    default: return rc > 0 ? -rc : -EIO;
    }
}

static size_t max_map(void)
{
#ifdef WQ_FAULT_INJECTION
    const char *cap = getenv("WQ_TEST_STORE_MAX_MAP");   /* "full disk" tests */
    if (cap)
        return (size_t)strtoull(cap, NULL, 0);
#endif
    return (size_t)1 << 40;
}

int wq__lmdb_snapshot(MDB_env *env, MDB_txn **txn, MDB_envinfo *info)
{
    for (int tries = 0; tries < 100; tries++) {
        int rc = mdb_env_info(env, info);
        if (rc == 0)
            rc = mdb_txn_begin(env, NULL, MDB_RDONLY, txn);
        if (rc != 0)
            return rc;
        if (mdb_txn_id(*txn) == info->me_last_txnid)
            return 0;
        mdb_txn_abort(*txn);   /* a commit came between: again */
    }
    return MDB_BAD_TXN;
}

int wq__lmdb_beyond(MDB_env *env, const MDB_envinfo *info, const char *dir, uint64_t *have,
                    uint64_t *beyond)
{
    MDB_stat st;
    struct stat sb;
    char file[4200];
    snprintf(file, sizeof file, "%s/data.mdb", dir);
    int rc = mdb_env_stat(env, &st);
    if (rc != 0)
        return rc;
    if (stat(file, &sb) < 0)
        return errno;
    if (st.ms_psize == 0)
        return MDB_CORRUPTED;
    uint64_t need = (uint64_t)info->me_last_pgno + 1;
    *have = (uint64_t)sb.st_size / st.ms_psize;
    *beyond = need > *have ? need - *have : 0;
    return 0;
}

int wq__lmdb_tail(MDB_txn *txn, const MDB_envinfo *info, const char *dir, bool *sound)
{
    uint64_t have, beyond, seen = 0, need = (uint64_t)info->me_last_pgno + 1;
    int rc = wq__lmdb_beyond(mdb_txn_env(txn), info, dir, &have, &beyond);
    if (rc != 0)
        return rc > 0 ? MDB_CORRUPTED : rc;   /* data.mdb gone or unreadable */
    *sound = beyond == 0;
    if (*sound)
        return 0;
    if (beyond > (1u << 24))
        return 0;   /* 64 GiB past the end: no commit frees that much */
    unsigned char *bit = calloc((size_t)(beyond + 7) / 8, 1);
    MDB_cursor *c;
    MDB_val k, v;
    if (!bit)
        return ENOMEM;
    if ((rc = mdb_cursor_open(txn, 0, &c)) != 0) {   /* the free-page list */
        free(bit);
        return rc;
    }
    while ((rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) == 0) {
        const size_t *ids = v.mv_data;
        size_t n = v.mv_size >= sizeof *ids ? ids[0] : 0;
        if (v.mv_size < sizeof *ids || n > v.mv_size / sizeof *ids - 1) {
            rc = MDB_CORRUPTED;
            break;
        }
        for (size_t i = 1; i <= n; i++) {
            if (ids[i] < have || ids[i] >= need)
                continue;
            uint64_t j = ids[i] - have;
            seen += !(bit[j / 8] & (1u << (j % 8)));
            bit[j / 8] |= (unsigned char)(1u << (j % 8));
        }
    }
    mdb_cursor_close(c);
    free(bit);
    if (rc != MDB_NOTFOUND)
        return rc;
    *sound = seen == beyond;
    return 0;
}

/* The child of tail_free: its verdict, one byte. */
static char tail_child(const char *path)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_envinfo info;
    bool sound = false;
    int rc = mdb_env_create(&env);
    if (rc == 0 && (rc = mdb_env_set_maxdbs(env, 4)) == 0 &&
        (rc = mdb_env_open(env, path, MDB_RDONLY | MDB_NOTLS, 0600)) == 0 &&
        (rc = wq__lmdb_snapshot(env, &txn, &info)) == 0) {
        rc = wq__lmdb_tail(txn, &info, path, &sound);
        mdb_txn_abort(txn);
    }
    return rc == 0 ? (sound ? 'Y' : 'N')
         : rc == MDB_READERS_FULL ? 'U'
         : rc == ENOMEM ? 'M'
         : wq__lmdb_err(rc) == -EUCLEAN ? 'N' : 'E';
}

/*
 * Are all the pages past data.mdb's end free? A commit does not write
 * the pages it allocated and freed again (LMDB's loose pages), so one
 * that removed many records can leave the file shorter than its last
 * page; a page in use there means a truncated file. Asked in a child: a
 * page LMDB faults on, or a free list it loops on (10 s), kills the
 * child, not the caller. The verdict comes through a pipe, not the exit
 * status, which a caller ignoring SIGCHLD never sees.
 */
#define TAIL_WAIT_MS 10000
static int tail_free(const char *path)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0)
        return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        int err = errno;
        close(fds[0]);
        close(fds[1]);
        return -err;
    }
    if (pid == 0) {
        close(fds[0]);
        int null = open("/dev/null", O_WRONLY);   /* LMDB's asserts print */
        if (null >= 0)
            dup2(null, 2);
        char v = tail_child(path);
        _exit(write(fds[1], &v, 1) == 1 ? 0 : 1);
    }
    close(fds[1]);
    char v = 0;   /* none: the child died reading the store */
    struct pollfd p = { .fd = fds[0], .events = POLLIN };
    uint64_t end = wq__now_mono() + TAIL_WAIT_MS * 1000000ull;
    for (;;) {
        uint64_t now = wq__now_mono();
        int r = now >= end ? 0 : poll(&p, 1, (int)((end - now) / 1000000u) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r > 0 && read(fds[0], &v, 1) < 0 && errno == EINTR)
            continue;
        if (r == 0)
            kill(pid, SIGKILL);   /* looping on a damaged free list */
        break;
    }
    close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return v == 'Y' ? 0 : v == 'U' ? -EUSERS : v == 'M' ? -ENOMEM : v == 'E' ? -EIO : -EUCLEAN;
}

/* A truncated data file would make LMDB fault on a page past its end. */
static int check_size(MDB_env *env, const char *path)
{
    MDB_envinfo info;
    uint64_t have, beyond;
    if (mdb_env_info(env, &info))
        return -EUCLEAN;
    int rc = wq__lmdb_beyond(env, &info, path, &have, &beyond);
    if (rc != 0)
        return rc > 0 ? -EIO : -EUCLEAN;   /* data.mdb unreadable; LMDB's own error */
    return beyond > 0 ? tail_free(path) : 0;   /* rare: only after such a commit */
}

/*
 * The store directory for a queue created with `mode`: exactly the mode's
 * read and write bits, with the search bit wherever reading is granted
 * (0666 -> 0777, 0640 -> 0750, 0600 -> 0700), the umask not applied, so
 * the uids the mode lets use the queue can use its store. A directory
 * that exists already is left as its owner made it.
 */
int wq__store_mkdir(const char *path, mode_t mode)
{
    mode_t m = (mode & 0666) | ((mode & 0444) >> 2) | 0700;
    if (mkdir(path, m) < 0)
        return errno == EEXIST ? 0 : -errno;
    return chmod(path, m) < 0 ? -errno : 0;
}

/* Open (or find) this process's environment for path. create: make the
   directory and the meta database if missing. */
int wq__lmdb_env(const char *path, mode_t mode, bool create, struct wq_env **out)
{
    pid_t me = getpid();
    envs_init();
    pthread_mutex_lock(&envs_mu);
    for (struct wq_env *e = envs; e; e = e->next) {
        if (e->pid == me && strcmp(e->path, path) == 0) {
            pthread_mutex_unlock(&envs_mu);
            *out = e;
            return 0;
        }
    }
    int rc;
    struct wq_env *e = calloc(1, sizeof *e);
    if (!e) {
        rc = -ENOMEM;
        goto fail;
    }
    snprintf(e->path, sizeof e->path, "%s", path);
    pthread_mutex_init(&e->jmu, NULL);
    e->pid = me;
    e->mapsize = INITIAL_MAP;
    if (e->mapsize > max_map())
        e->mapsize = max_map();
    if (create && (rc = wq__store_mkdir(path, mode)) < 0)
        goto fail;
    if ((rc = wq__lmdb_err(mdb_env_create(&e->env))) < 0)
        goto fail;
    mdb_env_set_maxdbs(e->env, 4);
    mdb_env_set_maxreaders(e->env, 1024);
    mdb_env_set_mapsize(e->env, e->mapsize);
    /* NOSYNC: commits reach the page cache (PROCESS durability); an FSYNC
       store's writers clear it before each commit (store.c). NOTLS: one handle
       serves every thread of the process. */
    rc = mdb_env_open(e->env, path, MDB_NOSYNC | MDB_NOTLS | MDB_NORDAHEAD, mode & 0777);
    if (rc) {
        rc = rc == ENOENT ? -ENOENT : rc == EACCES ? -EACCES : rc == ENOTDIR ? -ENOTDIR
                                                                             : wq__lmdb_err(rc);
        mdb_env_close(e->env);
        goto fail;
    }
    int dead;
    mdb_reader_check(e->env, &dead);   /* slots of dead readers */
    if (create) {   /* the umask must not decide the files' mode */
        char f[1100];
        snprintf(f, sizeof f, "%s/data.mdb", path);
        chmod(f, mode & 0666);
        snprintf(f, sizeof f, "%s/lock.mdb", path);
        chmod(f, mode & 0666);
    }
    MDB_envinfo info;
    if (mdb_env_info(e->env, &info) == 0 && info.me_mapsize > e->mapsize)
        e->mapsize = info.me_mapsize;
    if ((rc = check_size(e->env, path)) < 0)
        goto close;
    MDB_txn *txn;
    if ((rc = wq__lmdb_err(mdb_txn_begin(e->env, NULL, 0, &txn))) < 0)
        goto close;
    /* Named databases are keys of the main one: anything else there
       means somebody else's environment. */
    MDB_dbi main_db;
    MDB_cursor *cur;
    MDB_val k, v;
    if ((rc = mdb_dbi_open(txn, NULL, 0, &main_db)) == 0 &&
        (rc = mdb_cursor_open(txn, main_db, &cur)) == 0) {
        for (int r = mdb_cursor_get(cur, &k, &v, MDB_FIRST); r == 0;
             r = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            if (!(k.mv_size == 4 && memcmp(k.mv_data, "meta", 4) == 0) &&
                !(k.mv_size == 7 && memcmp(k.mv_data, "records", 7) == 0)) {
                rc = MDB_INCOMPATIBLE;
                break;
            }
        }
        mdb_cursor_close(cur);
    }
    if (rc) {
        mdb_txn_abort(txn);
        rc = rc == MDB_INCOMPATIBLE ? -EUCLEAN : wq__lmdb_err(rc);
        goto close;
    }
    unsigned flags = create ? MDB_CREATE : 0;
    rc = mdb_dbi_open(txn, "meta", flags, &e->meta);
    if (rc == 0)
        rc = mdb_dbi_open(txn, "records", flags, &e->recs);
    if (rc == MDB_NOTFOUND) {
        rc = -EUCLEAN;   /* an LMDB environment, but not a libwq store */
        mdb_txn_abort(txn);
        goto close;
    }
    if (rc) {
        mdb_txn_abort(txn);
        rc = rc == MDB_INCOMPATIBLE ? -EUCLEAN : wq__lmdb_err(rc);
        goto close;
    }
    if ((rc = mdb_txn_commit(txn)) != 0) {   /* frees the txn either way */
        rc = wq__lmdb_err(rc);
        goto close;
    }
    e->next = envs;
    envs = e;
    pthread_mutex_unlock(&envs_mu);
    *out = e;
    return 0;
close:
    mdb_env_close(e->env);
fail:
    pthread_mutex_unlock(&envs_mu);
    free(e);
    return rc;
}

/* MDB_MAP_RESIZED from another process's growth: adopt its size. */
int wq__lmdb_txn(struct wq_env *e, unsigned flags, MDB_txn **txn)
{
    int rc = mdb_txn_begin(e->env, NULL, flags, txn);
    if (rc == MDB_MAP_RESIZED) {
        mdb_env_set_mapsize(e->env, 0);
        rc = mdb_txn_begin(e->env, NULL, flags, txn);
    }
    return wq__lmdb_err(rc);
}

int wq__lmdb_grow(struct wq_env *e)
{
    MDB_envinfo info;
    if (mdb_env_info(e->env, &info) == 0 && info.me_mapsize > e->mapsize)
        e->mapsize = info.me_mapsize;
    if (e->mapsize >= max_map())
        return -ENOSPC;
    size_t want = e->mapsize * 2 > max_map() ? max_map() : e->mapsize * 2;
    if (mdb_env_set_mapsize(e->env, want))
        return -ENOSPC;
    e->mapsize = want;
    return 0;
}

/* The store's own key hash: fixed, since regions (and their seeds) come
   and go while the store stays. */
static uint64_t store_hash(const void *key, size_t len)
{
    uint64_t h = wq__fnv1a(key, len);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static void lkey(unsigned char out[10], uint64_t h, uint16_t n)
{
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)(h >> (56 - 8 * i));
    out[8] = (unsigned char)(n >> 8);
    out[9] = (unsigned char)n;
}

void wq__lmdb_key(unsigned char out[10], const void *key, size_t len, uint16_t n)
{
    lkey(out, store_hash(key, len), n);
}

uint64_t wq__rec_check(const unsigned char lk[10], const struct wq_rec *r, const void *key,
                       const void *msg)
{
    struct wq_rec h = *r;
    h.check = 0;
    uint64_t c = wq__hash64(WQ_CHECK_SEED, lk, 10);
    c = wq__hash64(c, &h, sizeof h);
    c = wq__hash64(c, key, r->keylen);
    return wq__hash64(c, msg, r->msglen);
}

int wq__rec_decode(const MDB_val *k, const MDB_val *v, struct wq_rec *r,
                   const unsigned char **key, const char **msg, bool *v1, const char **why)
{
    *why = NULL;
    uint32_t magic;
    if (k->mv_size != 10)
        *why = "record key is not 10 bytes";
    else if (v->mv_size < 4)
        *why = "record shorter than its header";
    if (*why)
        return -EUCLEAN;
    memcpy(&magic, v->mv_data, 4);
    *v1 = magic == WQ_REC_MAGIC1;
    size_t hdr = *v1 ? WQ_REC1_SIZE : sizeof *r;
    memset(r, 0, sizeof *r);
    if (magic != WQ_REC_MAGIC && magic != WQ_REC_MAGIC1)
        *why = "record magic is not libwq's";
    else if (v->mv_size < hdr)
        *why = "record shorter than its header";
    if (*why)
        return -EUCLEAN;
    memcpy(r, v->mv_data, hdr);
    if (r->keylen == 0 || r->keylen > WQ_MAX_KEY_LEN)
        *why = "record key length out of range";
    else if (r->msglen > 255)
        *why = "record message longer than 255 bytes";
    else if (r->cls < WQ_CLS_PENDING || r->cls > WQ_CLS_IDLE)
        *why = "record class unknown";
    else if (r->has_result > 1 || r->pad0 != 0 || (!r->has_result && r->msglen))
        *why = "record fields out of range";
    else if (v->mv_size != hdr + r->keylen + r->msglen)
        *why = "record size does not match its lengths";
    if (*why)
        return -EUCLEAN;
    *key = (const unsigned char *)v->mv_data + hdr;
    *msg = (const char *)*key + r->keylen;
    unsigned char want[10];
    wq__lmdb_key(want, *key, r->keylen, 0);
    if (memcmp(want, k->mv_data, 8) != 0)
        *why = "record filed under another key's hash";
    else if (!*v1 && r->check != wq__rec_check(k->mv_data, r, *key, *msg))
        *why = "record checksum mismatch";
    return *why ? -EUCLEAN : 0;
}

/* Find the LMDB key holding `key`; *n = its collision index, or the next
   free one when absent (returns 0 found, -ENOENT absent). */
static int find(MDB_txn *txn, struct wq_env *e, const void *key, size_t len, uint64_t h,
                uint16_t *n, struct wq_rec *old)
{
    unsigned char kb[10];
    MDB_cursor *c;
    MDB_val k, v;
    int rc = mdb_cursor_open(txn, e->recs, &c);
    if (rc)
        return wq__lmdb_err(rc);
    lkey(kb, h, 0);
    k.mv_data = kb;
    k.mv_size = sizeof kb;
    uint32_t next = 0;
    rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
    while (rc == 0 && k.mv_size == 10 && memcmp(k.mv_data, kb, 8) == 0) {
        const unsigned char *kp = k.mv_data, *rk;
        uint16_t idx = (uint16_t)(kp[8] << 8 | kp[9]);
        const char *msg, *why;
        struct wq_rec r;
        bool v1;
        if (wq__rec_decode(&k, &v, &r, &rk, &msg, &v1, &why) == 0 && r.keylen == len &&
            memcmp(rk, key, len) == 0) {
            *n = idx;
            if (old)
                *old = r;
            mdb_cursor_close(c);
            return 0;
        }
        next = (uint32_t)idx + 1;
        rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
    }
    mdb_cursor_close(c);
    if (rc && rc != MDB_NOTFOUND)
        return wq__lmdb_err(rc);
    if (next > UINT16_MAX)
        return -ENOSPC;   /* 65536 keys with one 64-bit hash: refuse */
    *n = (uint16_t)next;
    return -ENOENT;
}

/* Write (or, for WQ_CLS_DELETE, remove) the item's record; a new record
   takes the next first-add order. The meta's count and sum follow, in
   the same transaction. */
int wq__lmdb_put(MDB_txn *txn, struct wq_env *e, struct wq_item *it, struct wq_meta *m)
{
    uint64_t h = store_hash(it->key, it->r.keylen);
    uint16_t n = 0;
    struct wq_rec old;
    unsigned char kb[10];
    memset(&old, 0, sizeof old);
    int rc = find(txn, e, it->key, it->r.keylen, h, &n, &old);
    if (rc < 0 && rc != -ENOENT)
        return rc;
    bool found = rc == 0;
    lkey(kb, h, n);
    MDB_val k = { sizeof kb, kb }, v;
    if (it->r.cls == WQ_CLS_DELETE) {
        if (!found)
            return 0;
        if ((rc = wq__lmdb_err(mdb_del(txn, e->recs, &k, NULL))) < 0)
            return rc;
        m->records--;
        m->sum -= old.check;
        return 0;
    }
    it->r.order = found ? old.order : m->next_order++;
    it->r.magic = WQ_REC_MAGIC;
    it->r.check = wq__rec_check(kb, &it->r, it->key, it->msg);
    v.mv_size = sizeof it->r + it->r.keylen + it->r.msglen;
    rc = mdb_put(txn, e->recs, &k, &v, MDB_RESERVE);
    if (rc)
        return wq__lmdb_err(rc);
    memcpy(v.mv_data, &it->r, sizeof it->r);
    memcpy((char *)v.mv_data + sizeof it->r, it->key, it->r.keylen);
    memcpy((char *)v.mv_data + sizeof it->r + it->r.keylen, it->msg, it->r.msglen);
    if (found) {
        m->sum -= old.check;
    } else {
        m->records++;
    }
    m->sum += it->r.check;
    return 0;
}

void wq__meta_seal(struct wq_meta *m)
{
    m->version = WQ_STORE_VERSION;
    m->check = 0;
    m->check = wq__hash64(WQ_CHECK_SEED, m, sizeof *m);
}

int wq__meta_decode(const void *p, size_t n, struct wq_meta *m, const char **why)
{
    memset(m, 0, sizeof *m);
    *why = NULL;
    uint32_t version = 0;
    if (n == sizeof *m || n == WQ_META2_SIZE || n == WQ_META1_SIZE)
        memcpy(&version, (const char *)p + offsetof(struct wq_meta, version), sizeof version);
    else
        *why = "meta record has the wrong size";
    if (!*why && memcmp(p, WQ_META_MAGIC, sizeof WQ_META_MAGIC) != 0)
        *why = "meta record magic is not libwq's";
    else if (!*why && !((version == 1 && n == WQ_META1_SIZE) ||
                        (version == 2 && n == WQ_META2_SIZE) ||
                        (version == WQ_STORE_VERSION && n == sizeof *m)))
        *why = "meta record version unknown";
    else if (!*why && version >= 2) {
        /* The check is the record's last 8 bytes, over the record with
           them 0: version 2's record is version 3's without the journal
           fields. */
        unsigned char b[sizeof *m];
        uint64_t c;
        memcpy(b, p, n);
        memcpy(&c, b + n - sizeof c, sizeof c);
        memset(b + n - sizeof c, 0, sizeof c);
        if (c != wq__hash64(WQ_CHECK_SEED, b, n))
            *why = "meta record checksum mismatch";
    }
    if (!*why) {
        memcpy(m, p, n < offsetof(struct wq_meta, journal_id) ? n
                                                                : offsetof(struct wq_meta, journal_id));
        if (version == WQ_STORE_VERSION)
            memcpy(m, p, n);
    }
    if (!*why && (m->capacity == 0 || m->capacity > WQ_MAX_CAPACITY || m->max_key_len == 0 ||
                  m->max_key_len > WQ_MAX_KEY_LEN || m->pad0 != 0))
        *why = "meta record settings out of range";
    /* Version 1 numbered the durability levels from 0. */
    if (!*why && m->version == 1)
        m->durability = m->durability <= 2 ? m->durability + 1 : UINT32_MAX;
    return *why ? -EUCLEAN : 0;
}

int wq__lmdb_meta_get(MDB_txn *txn, struct wq_env *e, struct wq_meta *m)
{
    MDB_val k = { 4, "meta" }, v;
    const char *why;
    int rc = mdb_get(txn, e->meta, &k, &v);
    if (rc)
        return wq__lmdb_err(rc);
    return wq__meta_decode(v.mv_data, v.mv_size, m, &why);
}

int wq__lmdb_meta_put(MDB_txn *txn, struct wq_env *e, struct wq_meta *m)
{
    wq__meta_seal(m);
    MDB_val k = { 4, "meta" }, v = { sizeof *m, (void *)m };
    return wq__lmdb_err(mdb_put(txn, e->meta, &k, &v, 0));
}

/* Forget this process's environment for path (the store is being moved
   aside). Only when no queue of this process uses it. */
int wq__lmdb_env_close(const char *path)
{
    pid_t me = getpid();
    pthread_mutex_lock(&envs_mu);
    for (struct wq_env **pp = &envs; *pp; pp = &(*pp)->next) {
        struct wq_env *e = *pp;
        if (e->pid == me && strcmp(e->path, path) == 0) {
            *pp = e->next;
            mdb_env_close(e->env);
            if (e->jfd > 0)
                close(e->jfd - 1);
            if (e->ofd > 0)
                close(e->ofd - 1);
            pthread_mutex_destroy(&e->jmu);
            free(e);
            break;
        }
    }
    pthread_mutex_unlock(&envs_mu);
    return 0;
}
