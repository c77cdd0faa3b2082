/*
 * task-runner.c - run long tasks and record how each one ended.
 *
 *     task-runner QUEUE
 *
 * A task is a key: here the path of a file whose lines the task counts,
 * slowly (each task takes about half a second, like a deployment or a
 * backup would take minutes). Another process submits tasks and polls
 * their results (task-client.c), as Sveltos' deployer does: the caller
 * asks for a piece of work, goes on with its own, and asks "how did it
 * go?" later. The queue carries both ways:
 *
 *   submit      wq_add(key)              task-client
 *   run         wq_get(key) ... work ... task-runner (this program)
 *   report      wq_finish(key, code, message): wq_done and the outcome,
 *               in one step, so no one ever sees the task done without
 *               its result
 *   poll        wq_result(key): PENDING, RUNNING, SUCCEEDED or FAILED,
 *               with the code and message of wq_finish
 *
 * Results live in the queue's shared memory, not in this process: they
 * are there after the runner exited, for any process that asks.
 *
 * The runner leaves when the queue is shut down (wqctl shutdown QUEUE).
 *
 * Build against an installed libwq:
 *     cc task-runner.c $(pkg-config --cflags --libs libwq) -o task-runner
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <wq.h>

/* The task: count the lines of file `path`. Returns 0 and writes a
   message on success, or a positive errno and writes why it failed. */
static int run_task(const char *path, char *msg, size_t msgsize)
{
    /* Pretend the task is long, so that it is seen RUNNING. */
    struct timespec pause = { 0, 500 * 1000 * 1000 };
    nanosleep(&pause, NULL);

    FILE *f = fopen(path, "r");
    if (f == NULL) {
        int err = errno;
        snprintf(msg, msgsize, "cannot open %s: %s", path, strerror(err));
        return err;
    }
    unsigned long lines = 0;
    int c;
    while ((c = getc(f)) != EOF)
        if (c == '\n')
            lines++;
    fclose(f);
    snprintf(msg, msgsize, "%lu lines", lines);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: task-runner QUEUE\n");
        return 2;
    }
    const char *name = argv[1];
    /* Results are kept in result_capacity slots (0: as many as capacity);
       the client gives the same options. */
    struct wq_options opts = { .capacity = 1024, .max_key_len = 256, .flags = WQ_CREATE };
    wq *q;
    int rc = wq_open(name, &opts, &q);
    if (rc < 0) {
        fprintf(stderr, "wq_open %s: %s (%s)\n", name, wq_strerror(rc), wq_last_error());
        return 1;
    }

    /* Keys are not NUL-terminated: one byte more to make a C string of
       the path. */
    size_t cap = (size_t)wq_max_key_len(q);
    char *key = malloc(cap + 1);
    if (key == NULL) {
        wq_close(q);
        return 1;
    }
    for (;;) {
        int n = wq_get(q, key, cap, -1);
        if (n == -ESHUTDOWN)
            break;
        if (n < 0) {
            fprintf(stderr, "wq_get: %s\n", wq_strerror(n));
            rc = n;
            break;
        }
        key[n] = '\0';
        fprintf(stderr, "task-runner: running %s\n", key);

        char msg[256]; /* wq_result keeps up to 255 bytes of it */
        int code = run_task(key, msg, sizeof msg);
        /* Code 0 records SUCCEEDED, anything else FAILED. A task that
           should be tried again later would call wq_add_rate_limited
           before this (see controller.c). */
        rc = wq_finish(q, key, (size_t)n, code, msg);
        if (rc < 0) {
            fprintf(stderr, "wq_finish: %s\n", wq_strerror(rc));
            break;
        }
    }
    free(key);
    wq_close(q);
    return rc < 0 ? 1 : 0;
}
