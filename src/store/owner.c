/*
 * owner.c - a store serves one queue: the region last made from it.
 *
 * Two regions writing one store lose acknowledged writes: each writes
 * the journal from where it thinks the end is, over the other's groups,
 * and each deletes records the other may still need. That happens when
 * two queues (two names, two WQ_SHM_DIRs, two containers with their own
 * /dev/shm) are given one store_path. So a region claims the store when
 * it is made from it (format.h, struct wq_owner):
 *   - The claim is written before the region's maker replays the
 *     journal and reads the store: a group the old owner writes after
 *     the claim is refused, one written before is replayed.
 *   - The file's lock is kept until the region is published, so creators
 *     of one store take turns: the loser of a creation race finds the
 *     winner's region at its own path and attaches to it, without
 *     claiming (-EEXIST).
 *   - A claim by a region that still exists is refused (-EBUSY): a
 *     misconfiguration, which the second queue's maker hears about
 *     instead of the first queue's adds. One the maker cannot see (a
 *     region in another container's /dev/shm) is taken over: the old
 *     region's store writes then fail with -EIDRM.
 * The record names the owner file's own inode: a copy of a store
 * directory (cp -r) is not claimed by the original's region, and one
 * directory reached by two paths (a bind mount, a volume mounted at
 * another path in another container) is one store.
 * A maker that fails before it publishes its region puts the record it
 * found back. Forked children close their copies of a held claim's lock
 * (it would outlive the maker otherwise).
 *
 * Knows the file and its format; what a live region is, region.c says.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "format.h"

#define OSEED 0x6c6962776f776e72ull   /* "libwownr" */

static uint64_t owner_check(const struct wq_owner *o)
{
    return wq__hash64(OSEED, o, offsetof(struct wq_owner, check));
}

/* Is the record whole, and written into this very file (ino)? */
static bool owner_ok(const struct wq_owner *o, uint64_t ino)
{
    return o->magic == WQ_OWNER_MAGIC && o->claim != 0 && o->check == owner_check(o) &&
           memchr(o->store, 0, sizeof o->store) && memchr(o->region, 0, sizeof o->region) &&
           o->ino == ino;
}

static ssize_t pread_full(int fd, void *buf, size_t n)
{
    ssize_t r;
    do
        r = pread(fd, buf, n, 0);
    while (r < 0 && errno == EINTR);
    return r;
}

/* A claim held until its region is published. The list is for forked
   children, which close their copies of the locks. */
struct wq_claim_hold {
    int fd;
    size_t prevlen;            /* the file's bytes before the claim */
    struct wq_owner prev;
    struct wq_claim_hold *next;
};
static pthread_mutex_t holds_mu = PTHREAD_MUTEX_INITIALIZER;
static struct wq_claim_hold *holds;

/* A fork waits while a claim's descriptor is being opened and listed,
   or closed and unlisted: the child's list then matches its copies. */
static void holds_prepare(void)
{
    pthread_mutex_lock(&holds_mu);
}

static void holds_parent(void)
{
    pthread_mutex_unlock(&holds_mu);
}

static void holds_child(void)
{
    pthread_mutex_unlock(&holds_mu);   /* this thread took it (holds_prepare) */
    for (struct wq_claim_hold *h = holds; h; h = h->next) {
        if (h->fd >= 0)
            close(h->fd);
        h->fd = -1;   /* the parent's to release, not ours */
    }
}

static void holds_init(void)
{
    pthread_atfork(holds_prepare, holds_parent, holds_child);
}

int wq__owner_claim(const char *abs, mode_t mode, const char *region, uint64_t claim,
                    wq_claim_live_fn live, struct wq_claim_hold **out)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, holds_init);
    char f[PATH_MAX];
    struct wq_owner o;
    *out = NULL;
    if (claim == 0 || strlen(abs) >= sizeof o.store || strlen(region) >= sizeof o.region)
        return wq__store_err(-ENAMETOOLONG, abs, "path too long to claim");
    struct wq_claim_hold *h = calloc(1, sizeof *h);
    if (!h)
        return -ENOMEM;
    snprintf(f, sizeof f, "%s/%s", abs, WQ_OWNER_FILE);
    /* Opened and listed under the mutex a fork takes (holds_prepare):
       every child's copy is closed in the child (its lock would outlive
       us). */
    pthread_mutex_lock(&holds_mu);
    h->fd = open(f, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, mode & 0666);
    int err = errno;
    h->next = holds;
    holds = h;
    pthread_mutex_unlock(&holds_mu);
    if (h->fd < 0) {
        wq__owner_release(h, false);
        return wq__store_err(-err, abs, "cannot open its owner file %s: %s", f, strerror(err));
    }
    struct stat sb;
    int rc = fstat(h->fd, &sb) < 0 ? -errno : 0;
    if (rc == 0 && !S_ISREG(sb.st_mode))
        rc = wq__store_err(-EUCLEAN, abs, "its owner file %s is not a regular file", f);
    /* A new file gets the store's mode, not the umask's: the store's
       other users claim it too. */
    if (rc == 0 && sb.st_size == 0 && sb.st_uid == geteuid() && fchmod(h->fd, mode & 0666) < 0)
        rc = wq__store_err(-errno, abs, "its owner file %s: %s", f, strerror(errno));
    struct flock l = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
    while (rc == 0 && fcntl(h->fd, F_OFD_SETLKW, &l) < 0)
        if (errno != EINTR)
            rc = wq__store_err(-errno, abs, "cannot lock its owner file %s: %s", f,
                               strerror(errno));
    if (rc < 0)
        goto fail;
    /* Our own path first: a region there won a creation race while we
       waited for the lock (publish would refuse ours anyway). */
    if (access(region, F_OK) == 0) {
        rc = -EEXIST;
        goto fail;
    }
    ssize_t n = pread_full(h->fd, &h->prev, sizeof h->prev);
    h->prevlen = n > 0 ? (size_t)n : 0;
    if (h->prevlen == sizeof h->prev && owner_ok(&h->prev, (uint64_t)sb.st_ino) &&
        strcmp(h->prev.region, region) != 0) {
        int alive = live(h->prev.region, h->prev.claim);
        if (alive != 0) {
            rc = wq__store_err(-EBUSY, abs, "it serves the queue whose region is %s%s; a store "
                               "serves one queue: give this queue a store_path of its own, "
                               "or remove that queue first (wq_unlink)", h->prev.region,
                               alive < 0 ? " (which this process cannot look at)" : "");
            goto fail;
        }
    }
    memset(&o, 0, sizeof o);
    o.magic = WQ_OWNER_MAGIC;
    o.claim = claim;
    o.ino = (uint64_t)sb.st_ino;
    snprintf(o.store, sizeof o.store, "%s", abs);
    snprintf(o.region, sizeof o.region, "%s", region);
    o.check = owner_check(&o);
    ssize_t w;
    do
        w = pwrite(h->fd, &o, sizeof o, 0);
    while (w < 0 && errno == EINTR);
    if (w != (ssize_t)sizeof o) {
        rc = wq__store_err(w < 0 ? -errno : -EIO, abs, "cannot write its owner file %s: %s", f,
                           w < 0 ? strerror(errno) : "short write");
        goto fail;
    }
    *out = h;
    return 0;
fail:
    h->prevlen = SIZE_MAX;   /* nothing written: nothing to put back */
    wq__owner_release(h, false);
    return rc;
}

void wq__owner_release(struct wq_claim_hold *h, bool published)
{
    if (!h)
        return;
    /* Not published: the region that claimed the store will never
       write it; the one it displaced may still (best effort). */
    if (h->fd >= 0 && !published && h->prevlen != SIZE_MAX) {
        if (h->prevlen > 0)
            (void)!pwrite(h->fd, &h->prev, h->prevlen, 0);
        (void)!ftruncate(h->fd, (off_t)h->prevlen);
    }
    /* Unlisted and closed under the mutex, so no fork comes between. */
    pthread_mutex_lock(&holds_mu);
    for (struct wq_claim_hold **pp = &holds; *pp; pp = &(*pp)->next)
        if (*pp == h) {
            *pp = h->next;
            break;
        }
    if (h->fd >= 0)
        close(h->fd);   /* the lock goes with it */
    pthread_mutex_unlock(&holds_mu);
    free(h);
}

int wq__owner_check(struct wq_env *e, uint64_t claim, char *who, size_t wn)
{
    who[0] = 0;
    if (claim == 0)
        return 0;
    int fd = __atomic_load_n(&e->ofd, __ATOMIC_ACQUIRE) - 1;
    if (fd < 0) {
        char f[sizeof e->path + 16];
        struct stat sb;
        snprintf(f, sizeof f, "%s/%s", e->path, WQ_OWNER_FILE);
        fd = open(f, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0)
            return 0;   /* cannot tell */
        if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
            close(fd);
            return 0;
        }
        e->oino = (uint64_t)sb.st_ino;   /* before ofd is seen */
        int none = 0;
        if (!__atomic_compare_exchange_n(&e->ofd, &none, fd + 1, false, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE)) {
            close(fd);   /* another thread was first */
            fd = none - 1;
        }
    }
    /* Magic and claim: ours is the answer nearly always. (A read, not a
       mapping: a file truncated under a mapping is a SIGBUS.) */
    uint64_t head[2];
    if (pread_full(fd, head, sizeof head) != (ssize_t)sizeof head ||
        head[0] != WQ_OWNER_MAGIC || head[1] == claim)
        return 0;
    /* Another claim, or a record being written, or damage: the whole
       record, verified, of this very file, says which. */
    struct wq_owner o;
    if (pread_full(fd, &o, sizeof o) != (ssize_t)sizeof o || !owner_ok(&o, e->oino) ||
        o.claim == claim)
        return 0;
    snprintf(who, wn, "%s", o.region);
    return -EIDRM;
}

int wq__owner_check_lmdb(struct wq_env *e, uint64_t claim, char *who, size_t wn)
{
    uint64_t now = wq__now_mono();
    if (claim != 0 && e->oclaim == claim && now - e->oseen < WQ_OWNER_FRESH_NS) {
        who[0] = 0;
        return 0;
    }
    int rc = wq__owner_check(e, claim, who, wn);
    e->oseen = now;
    e->oclaim = rc == 0 ? claim : 0;
    return rc;
}
