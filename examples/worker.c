/*
 * worker.c - take keys from a queue that other processes fill.
 *
 *     worker QUEUE        (prints each key it processed, one a line)
 *
 * Start as many as you like, on the same queue (see producer.c): each key
 * is handed to exactly one of them at a time, and a key added again
 * while a worker processes it is handed out again only after that
 * worker's wq_done. The worker leaves when the queue is shut down and
 * nothing is left in it (wqctl shutdown QUEUE does that too).
 *
 * A worker that dies (kill -9, a crash) between wq_get and wq_done does
 * not lose its key: once the process is certainly gone, the key is
 * queued again for another worker.
 *
 * Build against an installed libwq:
 *     cc worker.c $(pkg-config --cflags --libs libwq) -o worker
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <wq.h>

/* The work: here only a pause of 200 us, so that several workers share
   the keys. */
static void process(const char *key, size_t len)
{
    struct timespec pause = { 0, 200 * 1000 };
    nanosleep(&pause, NULL);
    printf("%.*s\n", (int)len, key);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: worker QUEUE\n");
        return 2;
    }
    const char *name = argv[1];
    /* The same options as the producer's (see producer.c). */
    struct wq_options opts = { .capacity = 16384, .max_key_len = 64, .flags = WQ_CREATE };
    wq *q;
    int rc = wq_open(name, &opts, &q);
    if (rc < 0) {
        fprintf(stderr, "wq_open %s: %s (%s)\n", name, wq_strerror(rc), wq_last_error());
        return 1;
    }

    /* wq_get needs a buffer of the queue's max_key_len. */
    size_t cap = (size_t)wq_max_key_len(q);
    char *key = malloc(cap);
    if (key == NULL) {
        wq_close(q);
        return 1;
    }
    unsigned long processed = 0;
    for (;;) {
        /* Blocks (timeout -1) on a futex until a key comes or the queue
           is shut down; returns the key's length. */
        int n = wq_get(q, key, cap, -1);
        if (n == -ESHUTDOWN)
            break;                 /* shut down, and nothing left */
        if (n < 0) {
            fprintf(stderr, "wq_get: %s\n", wq_strerror(n));
            rc = n;
            break;
        }
        process(key, (size_t)n);
        processed++;
        /* Until wq_done, the key is ours: no other worker gets it. */
        rc = wq_done(q, key, (size_t)n);
        if (rc < 0) {
            fprintf(stderr, "wq_done: %s\n", wq_strerror(rc));
            break;
        }
    }
    fflush(stdout);
    fprintf(stderr, "worker %ld: processed %lu keys\n", (long)getpid(), processed);
    free(key);
    wq_close(q);
    return rc < 0 ? 1 : 0;
}
