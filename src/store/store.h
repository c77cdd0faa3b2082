/*
 * store.h - persistence of a shared-memory queue in LMDB, as the region
 * sees it. Its files:
 *   lmdb.c     environments, transactions, map growth and the on-disk
 *              format (format.h): knows LMDB, knows nothing of regions;
 *   store.c    the region side: marks, the store queue, flush and settle,
 *              the add epilogue, wq_snapshot;
 *   read.c     reading a store of unknown health in a child process;
 *   restore.c  building a new region from a store at wq_open;
 *   journal.c  the FSYNC journal, its checkpoints and replay;
 *   owner.c    which region the store serves (its claim);
 *   salvage.c  wq_store_salvage.
 */
#ifndef WQ_STORE_H
#define WQ_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "wq.h"

struct wq;
struct wq_shm;
struct wq_geom;
struct wq_options;
struct wq_store_img;
struct wq_meta;

/* store.c. Lock and busy held: the entry's store record is out of date. */
void wq__store_mark(struct wq_shm *q, uint32_t idx);
/* Lock held: an add left a key STORING that waits for an fsync. */
void wq__store_sync_request(struct wq_shm *q);
int wq__shm_snapshot(struct wq *q);
/* Write what is marked (all: until the store queue is empty). Lock not
   held. Returns records written or -errno. */
int wq__store_flush(struct wq_shm *q, bool all);
/* After an operation that marked entries: as durable as the queue's
   durability asks. Lock not held. */
int wq__store_after(struct wq_shm *q);
/* The same from a lease thread (procs.c), which no call may be waiting
   for: what is due is written unless a flusher or the region lock is busy
   or this process never opened the store (then a call or a later tick
   writes it). Never blocks on the region lock or the flush lock; gives up
   waiting for the region lock once *stop (read atomically) is set. */
void wq__store_idle(struct wq_shm *q, const int *stop);
/* The add epilogue (queue.c's one add path): an add met -WQ_EFLUSH, make
   room (0: try again, or -errno); an add is done with the region (rc):
   make it durable (all: every key of the call), or undo it (keys: the
   ones it added) if the store refuses. drops: the header's storing_drops
   read under the lock that added them (a repair since may have dropped
   one: -EBADMSG). */
int wq__store_make_room(struct wq_shm *q, int tries);
int wq__store_finish_add(struct wq_shm *q, const struct iovec *all, size_t nall,
                         const struct iovec *keys, size_t n, uint32_t drops, int rc);

/* restore.c. wq_open with a store_path, before the region is built:
   resolve the path into abs; an existing store is read and verified into
   *img (read.c); a new one is created; the options are copied to eff
   with what they leave 0 taken from the store's meta record. -EUCLEAN,
   with wq_last_error saying why, for a damaged or foreign store. */
int wq__store_prepare(const struct wq_options *o, struct wq_options *eff, char *abs,
                      size_t abslen, struct wq_store_img *img);
/* The options a restore of a store with meta record m takes: eff's,
   with what they leave 0 from m (wq__store_prepare does this once the
   store has passed; a region built while it is read does it earlier).
   -EUCLEAN if the result breaks wq_open's rules. */
int wq__store_options(struct wq_options *eff, const struct wq_meta *m);
/* Write the meta record of a (new or restored) queue, and the marker;
   journal: the store's journal id and last journal group, for the
   region's header (j_id, j_lsn). */
int wq__store_init_meta(const struct wq_geom *g, const struct wq_store_img *img,
                        uint64_t journal[2]);
/* Fill a region nobody else sees yet from the store read by prepare:
   keys restored or -errno. */
int wq__store_restore(struct wq_shm *view, struct wq_store_img *img);
int wq__store_write_marker(const char *dir, mode_t mode);
/* salvage.c: wq_store_salvage (wq.h). */
int wq__store_salvage(const char *path, const struct wq_options *opts, wq_report_fn report,
                      void *arg);

#endif
