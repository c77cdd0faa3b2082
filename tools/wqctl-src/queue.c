/*
 * queue.c - what the commands do alike with a queue.
 *
 * Design note. Attaching, reading the stats and checking keys are the
 * first steps of most commands; these print why they failed, so that a
 * command only passes their status on.
 */
#include "wqctl.h"

#include <inttypes.h>
#include <string.h>
#include <time.h>

/* Attach to an existing queue; on failure print why and return EXIT_FAIL.
   flags: 0 for a command that adds, gets or changes keys, WQ_OBSERVE for
   one that only looks or acts on the whole queue: it then takes no
   process slot and works when max_procs workers hold them all. */
int open_queue(const char *name, unsigned flags, wq **q)
{
    const struct wq_options o = { .flags = flags };
    int rc = wq_open(name, &o, q);

    return rc < 0 ? queue_error(name, NULL, rc) : EXIT_OK;
}

/* Attach to an existing queue as an observer (WQ_OBSERVE), printing
   nothing: for the readers that report a queue's error in their own
   output (ls, top, metrics). */
int observe_queue(const char *name, wq **q)
{
    const struct wq_options o = { .flags = WQ_OBSERVE };

    return wq_open(name, &o, q);
}

/* wq_stats; on failure print why, close q and return EXIT_FAIL. */
int queue_stats(wq *q, const char *name, struct wq_stats *st)
{
    int rc = wq_stats(q, st);

    if (rc < 0) {
        wq_close(q);
        return queue_error(name, "stats", rc);
    }
    return EXIT_OK;
}

/* Attach and read the stats; on failure print why and return EXIT_FAIL. */
int open_queue_stats(const char *name, unsigned flags, wq **q, struct wq_stats *st)
{
    int rc;

    if ((rc = open_queue(name, flags, q)) != EXIT_OK)
        return rc;
    return queue_stats(*q, name, st);
}

/* Attach and read max_key_len; on failure print why and return EXIT_FAIL. */
int open_queue_keys(const char *name, unsigned flags, wq **q, uint64_t *max_key_len)
{
    struct wq_stats st;
    int rc;

    if ((rc = open_queue_stats(name, flags, q, &st)) != EXIT_OK)
        return rc;
    *max_key_len = st.max_key_len;
    return EXIT_OK;
}

/*
 * Check a key's length before sending it, to say which key is wrong
 * ("key 2: empty key", "line 7: key of ... bytes is longer ...").
 */
int check_key(uint64_t max_key_len, size_t len, const char *where,
              uint64_t index)
{
    if (len == 0) {
        fprintf(stderr, "wqctl: %s %" PRIu64 ": empty key\n", where, index);
        return EXIT_FAIL;
    }
    if (len > max_key_len) {
        fprintf(stderr, "wqctl: %s %" PRIu64 ": key of %zu bytes is longer "
                "than max_key_len (%" PRIu64 ")\n", where, index, len,
                max_key_len);
        return EXIT_FAIL;
    }
    return EXIT_OK;
}

/* Check every key given as an argument (numbered from 1). */
int check_keys(uint64_t max_key_len, char **keys, size_t n)
{
    int rc;

    for (size_t i = 0; i < n; i++)
        if ((rc = check_key(max_key_len, strlen(keys[i]), "key", i + 1)) !=
            EXIT_OK)
            return rc;
    return EXIT_OK;
}

/* CLOCK_MONOTONIC now, the clock of wq_key_info.ready_ns. */
uint64_t now_mono(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
