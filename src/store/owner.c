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
 * The record names the store's path too: a copy of a store directory
 * (cp -r) is not claimed by the original's region.
 *
 * Knows the file and its format; what a live region is, region.c says.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "format.h"

#define OSEED 0x6c6962776f776e72ull   /* "libwownr" */

static uint64_t owner_check(const struct wq_owner *o)
{
    return wq__hash64(OSEED, o, offsetof(struct wq_owner, check));
}

/* Is the record whole and of the store at abs? */
static bool owner_ok(const struct wq_owner *o, const char *abs)
{
    return o->magic == WQ_OWNER_MAGIC && o->claim != 0 && o->check == owner_check(o) &&
           memchr(o->store, 0, sizeof o->store) && memchr(o->region, 0, sizeof o->region) &&
           strcmp(o->store, abs) == 0;
}

/* Read the record: 0 when it is whole and of this store, else -ENODATA
   (none, short, damaged, another store's: a copy's) or -errno. */
static int owner_read(int fd, const char *abs, struct wq_owner *o)
{
    ssize_t n;
    do
        n = pread(fd, o, sizeof *o, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    return (size_t)n == sizeof *o && owner_ok(o, abs) ? 0 : -ENODATA;
}

int wq__owner_claim(const char *abs, mode_t mode, const char *region, uint64_t claim,
                    wq_claim_live_fn live, int *lockfd)
{
    char f[PATH_MAX];
    struct wq_owner o;
    *lockfd = -1;
    if (claim == 0 || strlen(abs) >= sizeof o.store || strlen(region) >= sizeof o.region)
        return wq__store_err(-ENAMETOOLONG, abs, "path too long to claim");
    snprintf(f, sizeof f, "%s/%s", abs, WQ_OWNER_FILE);
    int fd = open(f, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, mode & 0666);
    if (fd < 0)
        return wq__store_err(-errno, abs, "claiming it (file %s): %s", WQ_OWNER_FILE,
                         strerror(errno));
    struct stat sb;
    int rc = fstat(fd, &sb) < 0 ? -errno : 0;
    if (rc == 0 && !S_ISREG(sb.st_mode))
        rc = wq__store_err(-EUCLEAN, abs, "claiming it (file %s): not a regular file",
                       WQ_OWNER_FILE);
    /* A new file gets the store's mode, not the umask's: the store's
       other users claim it too. */
    if (rc == 0 && sb.st_size == 0 && sb.st_uid == geteuid() && fchmod(fd, mode & 0666) < 0)
        rc = wq__store_err(-errno, abs, "claiming it (file %s): %s", WQ_OWNER_FILE,
                       strerror(errno));
    struct flock l = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
    while (rc == 0 && fcntl(fd, F_OFD_SETLKW, &l) < 0)
        if (errno != EINTR)
            rc = wq__store_err(-errno, abs, "claiming it (file %s): cannot lock it: %s",
                           WQ_OWNER_FILE, strerror(errno));
    if (rc < 0)
        goto fail;
    /* Our own path first: a region there won a creation race while we
       waited for the lock (publish would refuse ours anyway). */
    if (access(region, F_OK) == 0) {
        rc = -EEXIST;
        goto fail;
    }
    if (owner_read(fd, abs, &o) == 0 && strcmp(o.region, region) != 0) {
        int alive = live(o.region, o.claim);
        if (alive != 0) {
            rc = wq__store_err(-EBUSY, abs, "it serves the queue whose region is %s%s; a store "
                           "serves one queue: give this queue a store_path of its own, or "
                           "remove that queue first (wq_unlink)", o.region,
                           alive < 0 ? " (which this process cannot look at)" : "");
            goto fail;
        }
    }
    memset(&o, 0, sizeof o);
    o.magic = WQ_OWNER_MAGIC;
    o.claim = claim;
    snprintf(o.store, sizeof o.store, "%s", abs);
    snprintf(o.region, sizeof o.region, "%s", region);
    o.check = owner_check(&o);
    ssize_t w;
    do
        w = pwrite(fd, &o, sizeof o, 0);
    while (w < 0 && errno == EINTR);
    if (w != (ssize_t)sizeof o) {
        rc = wq__store_err(w < 0 ? -errno : -EIO, abs, "claiming it (file %s): %s", WQ_OWNER_FILE,
                       w < 0 ? strerror(errno) : "short write");
        goto fail;
    }
    *lockfd = fd;
    return 0;
fail:
    close(fd);
    return rc;
}

/* The owner file of e, mapped (or NULL: none there yet, or too short). */
static const struct wq_owner *owner_map(struct wq_env *e)
{
    char f[sizeof e->path + 16];
    snprintf(f, sizeof f, "%s/%s", e->path, WQ_OWNER_FILE);
    int fd = open(f, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    struct stat sb;
    void *m = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size >= sizeof(struct wq_owner))
        m = mmap(NULL, sizeof(struct wq_owner), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return NULL;
    void *none = NULL;
    if (!__atomic_compare_exchange_n(&e->omap, &none, m, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        munmap(m, sizeof(struct wq_owner));   /* another thread was first */
        m = none;
    }
    return m;
}

int wq__owner_check(struct wq_env *e, uint64_t claim, char *who, size_t wn)
{
    who[0] = 0;
    if (claim == 0)
        return 0;
    const struct wq_owner *m = __atomic_load_n(&e->omap, __ATOMIC_ACQUIRE);
    if (!m && !(m = owner_map(e)))
        return 0;   /* cannot tell */
    if (__atomic_load_n(&m->claim, __ATOMIC_RELAXED) == claim)
        return 0;
    /* Another claim, or a record being written, or damage: a copy that
       verifies, of this store, says which. */
    struct wq_owner o;
    memcpy(&o, m, sizeof o);
    if (!owner_ok(&o, e->path) || o.claim == claim)
        return 0;
    snprintf(who, wn, "%s", o.region);
    return -EIDRM;
}
