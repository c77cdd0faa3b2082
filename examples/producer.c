/*
 * producer.c - put work into a queue that other processes serve.
 *
 *     producer QUEUE COUNT        (adds the keys job-00000 .. job-<COUNT-1>)
 *
 * Run it next to one or more workers (worker.c), started before or after
 * it, in any order:
 *
 *     ./worker jobs > w1.out &  ./worker jobs > w2.out &  ./producer jobs 1000
 *
 * The queue is named, not inherited: any process that opens "jobs" shares
 * it, whatever its parent (it is the shared-memory object /dev/shm/wq.jobs;
 * `wqctl stat jobs` shows it). When it has added everything, this producer
 * shuts the queue down: "no more work is coming". The workers hand out
 * what is still queued and then leave. A long-lived producer (a
 * controller's event handlers) would not shut the queue down.
 *
 * Build against an installed libwq:
 *     cc producer.c $(pkg-config --cflags --libs libwq) -o producer
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <wq.h>

int main(int argc, char **argv)
{
    if (argc != 3 || atoi(argv[2]) <= 0) {
        fprintf(stderr, "usage: producer QUEUE COUNT\n");
        return 2;
    }
    const char *name = argv[1];
    int count = atoi(argv[2]);

    /* Whoever comes first creates the queue (WQ_CREATE), the others
       attach to it. Options given (not 0) must be the queue's, so the
       producer and the workers give the same ones (or leave them 0 to
       take whatever the queue has). */
    struct wq_options opts = { .capacity = 16384, .max_key_len = 64, .flags = WQ_CREATE };
    wq *q;
    int rc = wq_open(name, &opts, &q);
    if (rc < 0) {
        fprintf(stderr, "wq_open %s: %s (%s)\n", name, wq_strerror(rc), wq_last_error());
        return 1;
    }

    int coalesced = 0;
    for (int i = 0; i < count; i++) {
        char key[32];
        int len = snprintf(key, sizeof key, "job-%05d", i);
        /* Returns 0 when the key was queued, 1 when it was already
           waiting in the queue (coalesced: it is handed out once).
           Many keys at once: wq_add_many, one lock for all of them. */
        rc = wq_add(q, key, (size_t)len);
        if (rc < 0) {
            /* -ENOSPC: `capacity` keys are live; -ESHUTDOWN: someone
               shut the queue down. */
            fprintf(stderr, "wq_add %s: %s\n", key, wq_strerror(rc));
            wq_close(q);
            return 1;
        }
        coalesced += rc;
    }
    fprintf(stderr, "producer: added %d keys (%d coalesced)\n", count, coalesced);

    /* No more work: every process attached sees the shutdown. Keys still
       queued are handed out first; then wq_get returns -ESHUTDOWN. (With
       wq_shutdown_drain, this call would also wait until no key is
       being processed.) */
    wq_shutdown(q);
    wq_close(q);
    return 0;
}
