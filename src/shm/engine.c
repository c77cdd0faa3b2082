/*
 * engine.c - the shared-memory engine as api.c sees it: opening and
 * closing handles, and the table of operations (engine.h). The
 * operations themselves live with their components (queue.c, delay.c,
 * limiter.c, results.c, metrics.c, inspect.c, repair.c, store.c).
 */
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shm.h"

static const struct wq_engine shm_engine = {
    .name = "shm",
    .close = wq__shm_close,
    .add = wq__shm_add,
    .add_publish = wq__shm_add_publish,
    .add_many = wq__shm_add_many,
    .get = wq__shm_get,
    .done = wq__shm_done,
    .done_get = wq__shm_done_get,
    .get_many = wq__shm_get_many,
    .done_many = wq__shm_done_many,
    .len = wq__shm_len,
    .shutdown = wq__shm_shutdown,
    .resume = wq__shm_resume,
    .drain = wq__shm_drain,
    .shutting_down = wq__shm_shutting_down,
    .forget = wq__shm_forget,
    .remove = wq__shm_remove,
    .num_requeues = wq__shm_num_requeues,
    .result = wq__shm_result,
    .stats = wq__shm_stats,
    .metrics = wq__shm_metrics,
    .dump = wq__shm_dump,
    .check = wq__shm_check,
    .snapshot = wq__shm_snapshot,
    .park = wq__shm_park,
    .release_pid = wq__shm_release_pid,
};

static void free_handle(shmq *q)
{
    if (q->base)
        munmap(q->base, q->size);
    if (q->fd >= 0)
        close(q->fd);
    free(q->scratch);
    free(q->held);
    free(q->rscratch);
    free(q->hints);
    free(q);
}

int wq__shm_open(const char *name, const struct wq_options *opts, wq **out)
{
    char path[WQ_REGION_PATH_MAX];
    int rc = wq__region_path(path, sizeof path, name);
    if (rc < 0)
        return rc;
    wq__fork_init();
    shmq *q = calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    q->pub.eng = &shm_engine;
    snprintf(q->pub.name, sizeof q->pub.name, "%s", name);
    q->slot = WQ_NIL;
    q->fd = -1;
    q->pub.observe = opts && (opts->flags & WQ_OBSERVE);   /* never registers */

    bool create = opts && (opts->flags & WQ_CREATE);
    bool excl = opts && (opts->flags & WQ_EXCL);
    /* EXCL on an existing queue: say so before touching a store (publish
       still decides a creation race). */
    if (excl && access(path, F_OK) == 0) {
        free(q);
        return -EEXIST;
    }
    for (int tries = 0;; tries++) {
        rc = excl ? -ENOENT : wq__region_attach(q, path);
        if (rc == 0 && opts) {
            /* An existing queue, created or only attached to (as the
               Redis engine): what the caller asks for must be what it is
               (a zero option: whatever it has). */
            struct wq_conf c;
            char why[300];
            wq__geom_conf(&q->g, &c);
            rc = wq__options_match(opts, &c, q->g.has_store ? q->g.store_path : NULL, why,
                                   sizeof why);
            if (rc < 0)
                wq__errf("queue '%s' exists with %s", name, why);
        }
        if (rc != -ENOENT || !create)
            break;
        rc = wq__region_create(path, opts);
        if (rc == -EEXIST && !excl && tries < 3)
            continue;   /* lost a creation race: attach to the winner */
        if (rc < 0)
            break;
        rc = wq__region_attach(q, path);
        if (rc != -ENOENT || tries >= 3)
            break;      /* unlinked between link and open: try again */
    }
    if (rc < 0)
        goto fail;
    q->scratch = calloc(3 * ((q->capacity + 63) / 64), sizeof(uint64_t));
    q->held = calloc(q->max_procs, sizeof(uint32_t));
    if (!q->scratch || !q->held) {
        rc = -ENOMEM;
        goto fail;
    }
    if (!q->fair && !q->g.has_store)   /* the coalesced add's (queue.c); optional */
        q->hints = calloc(WQ_HINTS, sizeof *q->hints);
    rc = wq__lock(q);   /* registers this process (see procs.c), or repairs */
    if (rc < 0)
        goto fail;
    wq__unlock(q);
    *out = &q->pub;
    return 0;
fail:
    free_handle(q);
    return rc;
}

void wq__shm_close(wq *pub)
{
    shmq *q = wq__shm(pub);
    bool last = wq__procs_unregister(q);
    /* The last process to close cleanly writes what the store lacks
       (WQ_DURABLE_NONE's changes since the last snapshot, removals a
       failed write left listed): nothing acknowledged is lost to a clean
       exit. The flush takes the lock without registering (store.c,
       region_lock). */
    if (last && q->g.has_store && wq_load_relaxed(&q->hdr->sq_count) > 0)
        wq__store_flush(q, true);
    free_handle(q);
}

/* wq_unlink: a queue with a store gets what it lacks written first, so
   the store holds every key a restore should bring back. */
int wq__shm_unlink(const char *name)
{
    char path[WQ_REGION_PATH_MAX];
    int rc = wq__region_path(path, sizeof path, name);
    if (rc < 0)
        return rc;
    wq *q;
    const struct wq_options look = { .flags = WQ_OBSERVE };   /* a full table too */
    if (wq__shm_open(name, &look, &q) == 0) {
        if (wq__shm(q)->g.has_store)
            wq__store_flush(wq__shm(q), true);
        wq__shm_close(q);
    }
    return unlink(path) < 0 ? -errno : 0;
}
