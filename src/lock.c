/*
 * lock.c - the region lock: one robust, process-shared mutex.
 *
 * On EOWNERDEAD the new owner repairs the region (repair.c) and only then
 * calls pthread_mutex_consistent(); unlocking without it would leave the
 * mutex ENOTRECOVERABLE for everyone. If the dead holder was not in the
 * middle of a mutation (hdr->busy == 0) nothing needs rebuilding.
 *
 * A region whose busy flag is found set on a normal acquisition (a repair
 * that failed, e.g. on a corrupt header, and was marked consistent so
 * others get errors instead of a dead lock) is repaired again here.
 *
 * wq__lock also notices a fork: a handle used for the first time in a
 * child registers the child as a new process before doing anything else.
 */
#include <errno.h>

#include "internal.h"

int wq__mutex_init(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    int rc = pthread_mutexattr_init(&a);
    if (rc)
        return -rc;
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    rc = pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
    return -rc;
}

static int recover(wq *q)
{
    int rc = wq__repair(q, true, false, NULL, NULL);
    q->hdr->repairs_total++;
    /* Consistent even if repair failed: the next locker sees busy set and
       retries, instead of everyone being locked out for good. */
    pthread_mutex_consistent(&q->hdr->lock);
    return rc < 0 ? rc : 0;
}

int wq__lock(wq *q)
{
    int rc = pthread_mutex_lock(&q->hdr->lock);
    if (WQ_UNLIKELY(rc != 0)) {
        if (rc == EOWNERDEAD) {
            rc = recover(q);
            if (rc == 0)
                wq__procs_reap(q);
        } else {
            return rc == ENOTRECOVERABLE ? -ENOTRECOVERABLE : -rc;
        }
    } else if (WQ_UNLIKELY(q->hdr->busy || q->hdr->corrupt)) {
        /* A mutation cut short without a death (an error path), or a
           structure found inconsistent: rebuild thoroughly. */
        rc = wq__repair(q, true, q->hdr->corrupt != 0, NULL, NULL);
    }
    if (WQ_UNLIKELY(rc < 0)) {
        pthread_mutex_unlock(&q->hdr->lock);
        return rc;
    }
    /* Re-register after a fork, or if our slot is no longer ours (it can
       only be taken from a live handle by repairing a corrupt table). */
    if (WQ_UNLIKELY(atomic_load_explicit(&q->forkgen, memory_order_relaxed) !=
                        atomic_load_explicit(&wq__fork_gen, memory_order_relaxed) ||
                    q->slot >= q->max_procs ||
                    q->procs[q->slot].state != WQ_PROC_LIVE ||
                    q->procs[q->slot].gen != q->gen)) {
        rc = wq__procs_register(q);
        if (rc < 0) {
            pthread_mutex_unlock(&q->hdr->lock);
            return rc;
        }
    }
    return 0;
}

void wq__unlock(wq *q)
{
    pthread_mutex_unlock(&q->hdr->lock);
}
