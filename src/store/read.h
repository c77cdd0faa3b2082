/*
 * read.h - a store read and verified without trusting it (read.c).
 */
#ifndef WQ_STORE_READ_H
#define WQ_STORE_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format.h"

/* One record as read: decoded and verified; key and msg point into the
   image's map. */
struct wq_srec {
    struct wq_rec r;
    unsigned char lkey[10];
    bool v1;                       /* a version 1 record (no checksum) */
    const unsigned char *key;      /* into the map */
    const char *msg;
};

struct wq_store_img {
    /* in: */
    bool salvage;                  /* drop what fails instead of failing */
    wq_report_fn report;           /* salvage: one line per finding */
    void *report_arg;
    /* out: */
    bool has_meta, bad_meta;
    struct wq_meta meta;
    const char *meta_why;          /* bad_meta: what is wrong with it */
    bool v1;                       /* some records are version 1 */
    bool complete;                 /* the walk reached the end */
    struct wq_srec *recs;
    size_t n, cap;
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

#endif
