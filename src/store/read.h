/*
 * read.h - a store read and verified without trusting it (read.c).
 */
#ifndef WQ_STORE_READ_H
#define WQ_STORE_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "format.h"

/* One record as read, decoded and verified. Its bytes stay where the
   reader left them, in the image's map: the LMDB key (10 bytes), then
   the header, the key and the message. 8 bytes a record: a restore of a
   million records fills this array at once, and in a VM every page of it
   costs a fault. */
struct wq_srec {
    const unsigned char *raw;      /* its header, in the map */
};

/* A record's header (check 0 for a version 1 record), key, message and
   LMDB key; key, msg and lkey may be NULL. For a record of a read image
   only: it was verified when read. */
static inline void wq__srec_open(struct wq_srec s, struct wq_rec *r, const unsigned char **key,
                                 const char **msg, const unsigned char **lkey)
{
    memcpy(r, s.raw, WQ_REC1_SIZE);   /* a version 1 header: all but the check */
    bool v1 = r->magic == WQ_REC_MAGIC1;
    r->check = 0;
    if (!v1)
        memcpy(&r->check, s.raw + WQ_REC1_SIZE, sizeof r->check);
    const unsigned char *k = s.raw + (v1 ? WQ_REC1_SIZE : sizeof *r);
    if (key)
        *key = k;
    if (msg)
        *msg = (const char *)k + r->keylen;
    if (lkey)
        *lkey = s.raw - 10;
}

static inline uint64_t wq__srec_order(struct wq_srec s)
{
    struct wq_rec r;
    wq__srec_open(s, &r, NULL, NULL, NULL);
    return r.order;
}

struct wq_store_img {
    /* in: */
    bool salvage;                  /* drop what fails instead of failing */
    wq_report_fn report;           /* salvage: one line per finding */
    void *report_arg;
    /* Called while the reader waits for the child's next output: one
       short piece of work instead of a sleep (about 100 us), true if it
       did some. wq_open builds the new region there (region.c, `early`). */
    bool (*in_wait)(void *arg, const struct wq_store_img *img);
    void *in_wait_arg;
    /* wq_open: claim the store for the region to be published at region
       with claim (owner.c), before its journal is replayed; live says
       whether another region that claimed it still exists. */
    uint64_t claim;
    const char *region;
    int (*live)(const char *region, uint64_t claim);
    bool published;                /* set by the maker: the claim stays */
    /* out: */
    struct wq_claim_hold *owner;   /* the claim's lock, until img_free */
    uint64_t claimed_ns;           /* when it was written (CLOCK_MONOTONIC) */
    /* What a read found, from here to the end (wq__store_img_clear_read): */
    bool has_meta, bad_meta;
    struct wq_meta meta;
    const char *meta_why;          /* bad_meta: what is wrong with it */
    bool v1;                       /* some records are version 1 */
    uint64_t sum;                  /* the version 2 records' checksums, added */
    bool complete;                 /* the walk reached the end */
    struct wq_srec *recs;
    size_t n, cap;
    uint64_t order_lo, order_hi;   /* the records' add orders lie within */
    size_t idle, with_result;      /* records of idle keys; holding a result */
    size_t bad;                    /* records that failed to decode or verify */
    unsigned cut;                  /* walks LMDB cut short (salvage) */
    int32_t fail_code;             /* the last walk's error: LMDB's or errno */
    char first_bad[160];           /* what was wrong with the first bad one */
    unsigned char *map;
    size_t map_len;
};

/* Read the store in dir in a child process (see read.c). 0: *img holds
   what was read (not yet checked against the meta: wq__store_verify);
   -EUCLEAN with why set when the walk failed and img->salvage is off. */
int wq__store_read(const char *dir, struct wq_store_img *img, char *why, size_t wn);
void wq__store_img_free(struct wq_store_img *img);
/* Forget what a read found, keeping the in fields and the claim: before
   reading the store again. */
void wq__store_img_clear_read(struct wq_store_img *img);

/* Write a read record into txn as a version 2 record (rewriting a
   version 1 store, or a salvaged one); counted into m's records and sum.
   0 or -errno. */
int wq__srec_put(MDB_txn *txn, struct wq_env *e, struct wq_srec s, struct wq_meta *m);

#endif
