/*
 * format.h - the store's on-disk format, and the calls of its LMDB layer
 * (lmdb.c) and of its verified reader (read.c).
 *
 * A store is a directory holding an LMDB environment (data.mdb, lock.mdb)
 * and a marker file, WQ_STORE_MARKER, written once the store holds a
 * queue: a directory with the marker and without a readable data.mdb is
 * a damaged store, never a new, empty one. The environment holds exactly
 * two named databases and nothing else:
 *
 *   "meta"     one record under the key "meta": struct wq_meta, the
 *              queue's settings, the next first-add order number, and
 *              what the store holds: the number of records and the sum
 *              of their checksums, kept in the same transaction as every
 *              change, so a lost, added or altered record is detected;
 *   "records"  one record per key the queue must bring back: struct
 *              wq_rec followed by the key bytes and the result message.
 *
 * Record keys (10 bytes): the key's 64-bit store hash, big-endian (so
 * LMDB's byte order keeps one hash's records together), then a 16-bit
 * big-endian collision index: keys whose hashes collide take the next
 * free index, and lookups compare the full key stored in the value. So
 * keys of up to WQ_MAX_KEY_LEN bytes fit under LMDB's 511-byte key limit.
 * The hash is fixed (FNV-1a, then a 64-bit finaliser) and independent of
 * any region's seed, since regions come and go while the store stays.
 *
 * Checksums: wq__hash64 with a fixed seed. A record's covers its 10-byte
 * LMDB key, its header (check field 0), key and message; the meta's
 * covers the meta (check field 0).
 *
 * Values are the structs below in the machine's byte order, which is
 * little-endian (checked at compile time): a store written on one
 * little-endian machine reads on another. Both structs have no implicit
 * padding (asserted) and magic numbers that a foreign or big-endian
 * reader would not match. Version 1 stores (no checksums, no counts) are
 * read once and rewritten by the restore that opens them; version 2
 * stores (no journal fields in the meta) take them at their next meta
 * write. A store of a version this library does not know is refused, so
 * an older library never restores a store whose journal it would ignore.
 *
 * The journal (journal.c), a file WQ_JOURNAL_FILE beside data.mdb, of a
 * WQ_DURABLE_FSYNC store: the store's changes since its last checkpoint,
 * as groups of records in WQ_JOURNAL_BLOCK-aligned slots from offset 0:
 *
 *   struct wq_jgroup, then nrec records: struct wq_rec (check unused,
 *   cls WQ_CLS_DELETE for a removal), the key, the message.
 *
 * The alignment is the file system's block: a group never shares a
 * block with an earlier one, so a write torn by a power failure (which
 * may tear the whole block it wrote) damages only its own group.
 * A record's `order` and `check` are unused in the journal: the apply
 * assigns the one and computes the other.
 * A group's lsn is larger than every earlier group's; its check covers
 * the header (check 0) and the payload; its id is the meta's journal_id,
 * so another store's journal is never applied. Groups are applied in
 * file order from offset 0 while they verify and their lsn rises;
 * journal_lsn says which the LMDB records already hold.
 */
#ifndef WQ_STORE_FORMAT_H
#define WQ_STORE_FORMAT_H

#include <lmdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "wq.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the store's on-disk format is little-endian; see store/format.h"
#endif

#define WQ_STORE_MARKER "libwq-store"
#define WQ_REC_MAGIC1 0x31525157u   /* "WQR1": version 1 records */
#define WQ_REC_MAGIC  0x32525157u   /* "WQR2" */
#define WQ_META_MAGIC "libwq-store-v1"  /* both versions; `version` tells */
#define WQ_STORE_VERSION 3u
#define WQ_CHECK_SEED 0x6c6962777173746full   /* "libwqsto" */

/* wq_rec.cls: what the key comes back as. */
enum { WQ_CLS_PENDING = 1, WQ_CLS_WAITING = 2, WQ_CLS_IDLE = 3,
       WQ_CLS_DELETE = 4 /* in memory only: remove the record */ };

struct wq_rec {
    uint32_t magic;           /* WQ_REC_MAGIC */
    uint8_t cls;              /* WQ_CLS_PENDING .. WQ_CLS_IDLE */
    uint8_t has_result;       /* 0 or 1 */
    uint16_t keylen;          /* 1 .. WQ_MAX_KEY_LEN; the key follows */
    uint32_t failures;        /* rate limiter failure count */
    int32_t code;             /* result code (has_result) */
    uint64_t ready_wall_ns;   /* WAITING: CLOCK_REALTIME ready time */
    uint64_t updated_ns;      /* result: CLOCK_REALTIME of its wq_finish */
    uint64_t order;           /* first-add order: restore keeps it */
    uint16_t msglen;          /* result message bytes, <= 255, after the key */
    uint16_t pad0;            /* 0 */
    int32_t prio;             /* WQ_FAIR priority */
    uint64_t check;           /* checksum, see above (version 2) */
};
_Static_assert(sizeof(struct wq_rec) == 56, "store record header is 56 bytes");
_Static_assert(offsetof(struct wq_rec, order) == 32 && offsetof(struct wq_rec, prio) == 44 &&
               offsetof(struct wq_rec, check) == 48, "store record header layout");
#define WQ_REC1_SIZE 48       /* a version 1 header: the same without `check` */

struct wq_meta {
    char magic[16];           /* WQ_META_MAGIC, NUL-padded */
    uint32_t version;         /* 1 or 2 */
    uint32_t capacity, max_key_len, max_procs, result_capacity;
    uint32_t durability, snapshot_ms, flags;
    uint32_t rl_limiters, rl_burst, rl_max_fast_attempts;
    uint32_t pad0;            /* 0 */
    uint64_t rl_base_delay_ns, rl_max_delay_ns, rl_fast_delay_ns, rl_slow_delay_ns;
    double rl_qps;
    uint64_t next_order;      /* the order the next new record gets */
    uint32_t fair_share;
    int32_t tenant_sep;
    /* version 2 */
    uint64_t records;         /* records in "records" */
    uint64_t sum;             /* their checks added up (mod 2^64) */
    /* version 3 */
    uint64_t journal_id;      /* the id the journal's groups carry; 0: none yet */
    uint64_t journal_lsn;     /* the last journal group this store holds */
    uint64_t check;           /* checksum of this struct, check = 0 */
};
_Static_assert(sizeof(struct wq_meta) == 160, "store meta record is 160 bytes");
_Static_assert(offsetof(struct wq_meta, rl_base_delay_ns) == 64 &&
               offsetof(struct wq_meta, records) == 120 &&
               offsetof(struct wq_meta, journal_id) == 136, "store meta layout");
#define WQ_META1_SIZE 120     /* a version 1 meta: up to tenant_sep */
#define WQ_META2_SIZE 144     /* a version 2 meta: up to sum, then check */

/* One environment per store path and process (LMDB forbids opening one
   twice in a process, and using one across fork()). */
struct wq_env {
    char path[1024];
    pid_t pid;
    MDB_env *env;
    MDB_dbi recs, meta;
    size_t mapsize;
    int jfd;                  /* the journal's descriptor + 1; 0: not open */
    int rfd;                  /* a replay's locked descriptor + 1, or 0 */
    bool jstale;              /* the journal's name leads to another file:
                                 open it again before the next write */
    pthread_mutex_t jmu;      /* jfd's opening, and this process's side of
                                 the journal lock (journal.c) */
    int ofd;                  /* the owner file's descriptor + 1 (owner.c),
                                 set once (atomically); 0: not open */
    uint64_t oino;            /* its inode (set before ofd) */
    uint64_t oseen, oclaim;   /* CLOCK_MONOTONIC ns of the last check that
                                 found this claim ours (LMDB writes, under
                                 LMDB's writer lock; owner.c) */
    struct wq_env *next;
};

/* A record to write, copied out of the region under the lock. */
struct wq_item {
    uint32_t idx, sgen;       /* the entry and its change count then */
    struct wq_rec r;
    const unsigned char *key;
    const char *msg;
};

int wq__lmdb_err(int rc);
int wq__store_mkdir(const char *path, mode_t mode);
int wq__lmdb_env(const char *path, mode_t mode, bool create, struct wq_env **out);
/* The environment this process already opened for path, or -ENOENT:
   never opens one (an open verifies the store, with LMDB's writer lock
   and perhaps a child process: too much for a lease thread). */
int wq__lmdb_env_cached(const char *path, struct wq_env **out);
int wq__lmdb_txn(struct wq_env *e, unsigned flags, MDB_txn **txn);
int wq__lmdb_grow(struct wq_env *e);
/* A read transaction on the newest snapshot, with that snapshot's info
   (mdb_env_info alone may describe a later commit): LMDB's rc. */
int wq__lmdb_snapshot(MDB_env *env, MDB_txn **txn, MDB_envinfo *info);
/* data.mdb's pages in dir (*have), and how many more the snapshot
   described by info counts (*beyond: legal only as free pages, see
   wq__lmdb_tail). LMDB's rc, or the errno of data.mdb's stat. */
int wq__lmdb_beyond(MDB_env *env, const MDB_envinfo *info, const char *dir, uint64_t *have,
                    uint64_t *beyond);
/* *sound: every page the snapshot counts past data.mdb's end is on its
   free list (a commit leaves the pages it allocated and freed again
   unwritten), each once; false means a truncated file. LMDB's rc. */
int wq__lmdb_tail(MDB_txn *txn, const MDB_envinfo *info, const char *dir, bool *sound);
/* Decode and verify a record (k: its LMDB key, for the checksum and the
   key hash): 0, or -EUCLEAN with *why saying what is wrong. Version 1
   records decode with v1 set (no checksum to verify). */
int wq__rec_decode(const MDB_val *k, const MDB_val *v, struct wq_rec *r,
                   const unsigned char **key, const char **msg, bool *v1, const char **why);
int wq__meta_decode(const void *p, size_t n, struct wq_meta *m, const char **why);
uint64_t wq__rec_check(const unsigned char lkey[10], const struct wq_rec *r,
                       const void *key, const void *msg);
void wq__meta_seal(struct wq_meta *m);
int wq__lmdb_put(MDB_txn *txn, struct wq_env *e, struct wq_item *it, struct wq_meta *m);
int wq__lmdb_meta_get(MDB_txn *txn, struct wq_env *e, struct wq_meta *m);
int wq__lmdb_meta_put(MDB_txn *txn, struct wq_env *e, struct wq_meta *m);
void wq__lmdb_key(unsigned char out[10], const void *key, size_t len, uint16_t n);
int wq__lmdb_env_close(const char *path);

/* restore.c. wq_last_error = "store '<dir>': <what>"; returns rc. */
int wq__store_err(int rc, const char *dir, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* owner.c. Which region a store serves: a file WQ_OWNER_FILE beside
   data.mdb holds the claim of the region last made from the store. A
   region claims the store before it replays the journal and reads the
   store, and keeps the file's lock until it is published (creators of
   one store take turns); every store write compares the region's claim
   with the file's. Never synced: no region outlives a reboot, nor does
   its claim need to. */
#define WQ_OWNER_FILE  "owner"
#define WQ_OWNER_MAGIC 0x3152454e574f5157ull   /* "WQOWNER1" */
struct wq_owner {
    uint64_t magic;           /* WQ_OWNER_MAGIC */
    uint64_t claim;           /* the region's wq_hdr.claim (never 0) */
    uint64_t ino;             /* the inode of the file it was written to: a
                                 copied file's record is no claim */
    char store[1024];         /* the store's absolute path, as the claimer saw it */
    char region[1024];        /* the claiming region's path */
    uint64_t check;           /* wq__hash64 of the above */
};
_Static_assert(sizeof(struct wq_owner) == 2080, "owner record is 2080 bytes");
/* Does a region at path hold claim? (region.c answers: 1 yes, 0 no, or
   -errno when it cannot be looked at.) */
typedef int (*wq_claim_live_fn)(const char *region, uint64_t claim);
/* Claim the store at abs (absolute) for the region to be published at
   region, with claim (never 0), under the owner file's lock, which
   *hold keeps until wq__owner_release (published: the region is out;
   else the record found is put back).
   -EEXIST: a region is at `region` already (a creation race was lost:
   attach to it); -EBUSY: the store serves another region that exists
   (wq_last_error names it); else 0 or -errno with wq_last_error set. */
struct wq_claim_hold;
int wq__owner_claim(const char *abs, mode_t mode, const char *region, uint64_t claim,
                    wq_claim_live_fn live, struct wq_claim_hold **hold);
void wq__owner_release(struct wq_claim_hold *hold, bool published);
/* A store write of the region holding claim (0: a region made before
   claims, never refused): 0, or -EIDRM when another region has claimed
   the store since (its path in who). Cannot tell (no file, a damaged
   record, another store's): 0. One small pread when the claim is ours. */
int wq__owner_check(struct wq_env *e, uint64_t claim, char *who, size_t wn);
/* The same for an LMDB write, under LMDB's writer lock: a check that
   found our claim less than WQ_OWNER_FRESH_NS ago stands. A maker waits
   WQ_OWNER_SETTLE_NS after its claim before it takes that lock to look
   for writes it missed (restore.c), so every write that skipped the
   check after the claim is done by then. (A PROCESS cycle makes two
   LMDB writes of a few microseconds: a read of the file for each cost
   8% of it.) */
#define WQ_OWNER_FRESH_NS  1000000ull
#define WQ_OWNER_SETTLE_NS 2000000ull
int wq__owner_check_lmdb(struct wq_env *e, uint64_t claim, char *who, size_t wn);

/* journal.c */
#define WQ_JOURNAL_FILE  "journal"
#define WQ_JOURNAL_SIZE  (4u << 20)
#define WQ_JOURNAL_BLOCK 4096u
#define WQ_JGROUP_MAGIC  0x314a5157u   /* "WQJ1" */
struct wq_jgroup {
    uint32_t magic;           /* WQ_JGROUP_MAGIC */
    uint32_t nrec;            /* records that follow, >= 1 */
    uint64_t id;              /* the store's journal_id */
    uint64_t lsn;             /* rises from group to group */
    uint64_t bytes;           /* payload bytes after this header */
    uint64_t check;           /* wq__hash64 of header (check 0) and payload */
};
_Static_assert(sizeof(struct wq_jgroup) == 40, "journal group header is 40 bytes");
/* The journal lock: one writer (or replays, shared) of the file at a
   time, across processes (an open file description lock, which the
   kernel drops with a dead holder's descriptors) and across this
   process's threads (e->jmu). 0 or -errno. */
int wq__journal_lock(struct wq_env *e, int fd, bool shared);
void wq__journal_unlock(struct wq_env *e, int fd);
/* The journal of e, open (made and filled to WQ_JOURNAL_SIZE the first
   time, with mode; opened again once wq__journal_replaced said so) and
   locked for writing: its descriptor, valid until the release, or
   -errno (-EUCLEAN: not a regular file). */
int wq__journal_acquire(struct wq_env *e, mode_t mode);   /* wq__journal_unlock releases */
/* Locked: does the journal's name lead to another file than fd's (it was
   removed or replaced)? Then the next acquire opens that one. */
bool wq__journal_replaced(struct wq_env *e, int fd);
/* Bytes the group of items takes in the journal (header, padding). */
uint64_t wq__journal_bytes(const struct wq_item *items, uint32_t n);
/* Write the group of items at off, with O_DSYNC: on disk on return. */
int wq__journal_write(int fd, uint64_t id, uint64_t lsn, uint64_t off,
                      const struct wq_item *items, uint32_t n);
/* Apply to txn the groups of the journal (fd) that m->journal_lsn does
   not cover: every group below `upto` must verify (else -EBADMSG: the
   region says it was written); from there on, groups are applied while
   they verify and their lsn rises. With `upto` 0 (a replay, nobody
   knows where the groups end) a group that does not verify ends the
   walk, unless a verified group of a higher lsn follows it somewhere:
   then the journal is damaged (-EUCLEAN). m->journal_lsn is the last
   group applied; *groups counts them. why: a message for an error. */
int wq__journal_apply(MDB_txn *txn, struct wq_env *e, int fd, uint64_t upto,
                      struct wq_meta *m, uint64_t *groups, char *why, size_t wn);
/* The same in one synced commit of e's store (its map grown as needed):
   a checkpoint or a replay. id: the journal id the caller writes with (a
   store whose meta names another is -EUCLEAN; 0: a replay, no check);
   floor: the number the store must cover afterwards (a checkpoint: the
   region's last number taken; with an id, a store beyond it is
   -EBADMSG). always:
   commit even with nothing applied (a checkpoint records floor); else
   nothing is written then. point: the fault point before the commit.
   Returns the groups applied, or -errno with why saying what failed. */
int wq__journal_commit(struct wq_env *e, int fd, uint64_t upto, uint64_t id, uint64_t floor,
                       bool always, const char *point, char *why, size_t wn);

#endif
