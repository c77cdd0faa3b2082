/*
 * task-client.c - submit long tasks and poll their results.
 *
 *     task-client QUEUE PATH...
 *
 * Submits one task per PATH (the task runner, task-runner.c, counts the
 * file's lines), then polls every task's state and prints each change,
 * until every task has ended:
 *
 *     /etc/hostname: PENDING
 *     /etc/hostname: RUNNING
 *     /etc/hostname: SUCCEEDED: 1 lines
 *     /nonexistent: FAILED (code 2): cannot open /nonexistent: No such file ...
 *
 * Exit status: 0 when every task succeeded, 1 when one failed, 2 on a
 * usage error. This is the shape of Sveltos' deployer API: Deploy (here
 * wq_add), then GetResult (wq_result) until it is not "in progress".
 *
 * Polling is the simple way to wait: wq_result is one short lock of the
 * queue, so a few polls a second cost nothing. The client does not need
 * to stay: a later process can ask for the same key's result (wqctl
 * result QUEUE KEY does).
 *
 * Build against an installed libwq:
 *     cc task-client.c $(pkg-config --cflags --libs libwq) -o task-client
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <wq.h>

static const char *state_name(enum wq_state s)
{
    switch (s) {
    case WQ_STATE_NONE: return "NONE";           /* the queue knows nothing of it */
    case WQ_STATE_PENDING: return "PENDING";     /* submitted, not started */
    case WQ_STATE_RUNNING: return "RUNNING";     /* a runner has it */
    case WQ_STATE_SUCCEEDED: return "SUCCEEDED"; /* wq_finish with code 0 */
    case WQ_STATE_FAILED: return "FAILED";       /* wq_finish with another code */
    }
    return "?";
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: task-client QUEUE PATH...\n");
        return 2;
    }
    const char *name = argv[1];
    char **paths = argv + 2;
    int ntasks = argc - 2;

    /* The runner's options (see task-runner.c). */
    struct wq_options opts = { .capacity = 1024, .max_key_len = 256, .flags = WQ_CREATE };
    wq *q;
    int rc = wq_open(name, &opts, &q);
    if (rc < 0) {
        fprintf(stderr, "wq_open %s: %s (%s)\n", name, wq_strerror(rc), wq_last_error());
        return 1;
    }

    /* Submit. From here on the key's state is PENDING (it was queued by
       this call) until a runner takes it; an earlier result of the same
       key is replaced when this run finishes. */
    for (int i = 0; i < ntasks; i++) {
        rc = wq_add(q, paths[i], strlen(paths[i]));
        if (rc < 0) {
            fprintf(stderr, "wq_add %s: %s\n", paths[i], wq_strerror(rc));
            wq_close(q);
            return 1;
        }
    }

    /* Poll every 20 ms; print each change of state. */
    enum wq_state *seen = calloc((size_t)ntasks, sizeof *seen); /* all NONE */
    if (seen == NULL) {
        wq_close(q);
        return 1;
    }
    int ended = 0, failed = 0;
    while (ended < ntasks) {
        for (int i = 0; i < ntasks; i++) {
            if (seen[i] == WQ_STATE_SUCCEEDED || seen[i] == WQ_STATE_FAILED)
                continue;
            struct wq_result r;
            rc = wq_result(q, paths[i], strlen(paths[i]), &r);
            if (rc < 0) {
                fprintf(stderr, "wq_result %s: %s\n", paths[i], wq_strerror(rc));
                free(seen);
                wq_close(q);
                return 1;
            }
            if (r.state == seen[i])
                continue;
            seen[i] = r.state;
            if (r.state == WQ_STATE_SUCCEEDED) {
                printf("%s: SUCCEEDED: %s\n", paths[i], r.message);
                ended++;
            } else if (r.state == WQ_STATE_FAILED) {
                printf("%s: FAILED (code %d): %s\n", paths[i], r.code, r.message);
                ended++;
                failed++;
            } else {
                printf("%s: %s\n", paths[i], state_name(r.state));
            }
            fflush(stdout);
        }
        struct timespec pause = { 0, 20 * 1000 * 1000 };
        if (ended < ntasks)
            nanosleep(&pause, NULL);
    }
    free(seen);
    wq_close(q);
    return failed ? 1 : 0;
}
