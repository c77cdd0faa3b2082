/*
 * store.h - persistence of a shared-memory queue in LMDB, as the region
 * sees it. Three files:
 *   lmdb.c     environments, transactions, map growth and the on-disk
 *              format (format.h): knows LMDB, knows nothing of regions;
 *   store.c    the region side: marks, the store queue, flush and settle,
 *              the add epilogue, wq_snapshot;
 *   restore.c  building a new region from a store at wq_open.
 */
#ifndef WQ_STORE_H
#define WQ_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct wq;
struct wq_shm;
struct wq_geom;
struct wq_options;

/* store.c. Lock and busy held: the entry's store record is out of date. */
void wq__store_mark(struct wq_shm *q, uint32_t idx);
int wq__shm_snapshot(struct wq *q);
/* Write what is marked (all: until the store queue is empty). Lock not
   held. Returns records written or -errno. */
int wq__store_flush(struct wq_shm *q, bool all);
/* After an operation that marked entries: as durable as the queue's
   durability asks. Lock not held. */
int wq__store_after(struct wq_shm *q);
/* The add epilogue (queue.c's one add path): an add met -WQ_EFLUSH, make
   room (0: try again, or -errno); an add is done with the region (rc):
   make it durable, or undo it (the added keys) if the store refuses. */
int wq__store_make_room(struct wq_shm *q, int tries);
int wq__store_finish_add(struct wq_shm *q, const struct iovec *keys, size_t n, int rc);

/* restore.c. wq_open with a store_path, before the region is built:
   resolve the path into abs, open (creating) the environment, and copy
   the options to eff with what they leave 0 taken from the store's meta
   record (-EUCLEAN when that record breaks the option rules). */
int wq__store_prepare(const struct wq_options *o, struct wq_options *eff, char *abs,
                      size_t abslen, bool *has_meta);
/* Write the meta record of a (new or restored) queue. */
int wq__store_init_meta(const struct wq_geom *g);
/* Fill a region nobody else sees yet from the store: keys restored or -errno. */
int wq__store_restore(struct wq_shm *view);

#endif
