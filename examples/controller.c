/*
 * controller.c - a controller loop with rate-limited retries.
 *
 *     controller [QUEUE]        (default queue name: example-controller)
 *
 * This is client-go's workqueue example (k8s.io/client-go/examples/
 * workqueue) in C. A Kubernetes controller does not react to events one
 * by one: an event only says "key K may have changed", the key goes into
 * a queue, and a worker later reads the current state of K and makes the
 * world match it ("reconcile", "sync"). Three rules of the queue make
 * that safe and cheap:
 *
 *   - a key added twice before a worker takes it is handed out once
 *     (coalescing: the worker reads the current state anyway);
 *   - a key is never handed to two workers at once;
 *   - a key that failed is retried later with a growing delay
 *     (wq_add_rate_limited), and its failure count is reset when it
 *     finally succeeds (wq_forget).
 *
 * Here the "world" is a small table of objects; one of them fails twice
 * before it syncs, one never syncs and is dropped after MAX_RETRIES
 * retries, exactly as the client-go example does. The program stops once
 * every key has either synced or been dropped (a real controller runs
 * until it is told to stop).
 *
 * Build against an installed libwq:
 *     cc controller.c $(pkg-config --cflags --libs libwq) -o controller
 */
#define _POSIX_C_SOURCE 200809L /* only POSIX is needed besides <wq.h> */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <wq.h>

/* How often a failing key is retried before it is dropped (client-go's
   example uses 5 as well). */
#define MAX_RETRIES 5

/* The state we reconcile. `fail` is how many more syncs of the object
   fail: 0 syncs at once, -1 never syncs. */
struct object {
    const char *key;  /* "namespace/name", as Kubernetes keys are */
    int fail;
    int settled;      /* synced, or dropped after MAX_RETRIES */
};
static struct object world[] = {
    { "default/web", 0, 0 },
    { "default/db", 0, 0 },
    { "default/flaky", 2, 0 },   /* fails twice, then syncs */
    { "default/broken", -1, 0 }, /* never syncs: dropped */
};
#define NOBJECTS (sizeof world / sizeof world[0])
static unsigned settled; /* objects that synced or were dropped */

static struct object *lookup(const char *key, size_t len)
{
    for (size_t i = 0; i < NOBJECTS; i++)
        if (strlen(world[i].key) == len && memcmp(world[i].key, key, len) == 0)
            return &world[i];
    return NULL;
}

/* The business logic: make the world match the object. Returns 0 on
   success, -1 on a (simulated) error. Called for one key at a time: the
   queue never hands a key out twice at once, in any process. */
static int sync_handler(const char *key, size_t len)
{
    struct object *o = lookup(key, len);
    if (o == NULL)
        return 0; /* deleted meanwhile: nothing to do */
    if (o->fail != 0) {
        if (o->fail > 0)
            o->fail--;
        return -1;
    }
    printf("%.*s: synced\n", (int)len, key);
    return 0;
}

static void settle(const char *key, size_t len)
{
    struct object *o = lookup(key, len);
    if (o != NULL && !o->settled) {
        o->settled = 1;
        settled++;
    }
}

/* What to do with the outcome of one sync: client-go's handleErr. */
static void handle_err(wq *q, const char *key, size_t len, int err)
{
    if (err == 0) {
        /* Success: reset the key's failure count, so that its next
           failure starts again from the shortest delay. */
        wq_forget(q, key, len);
        settle(key, len);
        return;
    }
    /* wq_num_requeues: how many times the key was re-added rate limited
       since its last wq_forget. */
    int retries = wq_num_requeues(q, key, len);
    if (retries >= 0 && retries < MAX_RETRIES) {
        printf("%.*s: error syncing, retry %d of %d\n", (int)len, key,
               retries + 1, MAX_RETRIES);
        /* Back into the queue after the rate limiter's delay: by default
           5 ms * 2^failures for this key (capped at 1000 s), and at most
           10 retries a second over all keys (burst 100). The key is
           still ours (processing): it becomes available again only after
           our wq_done, and not before its delay is over. */
        int rc = wq_add_rate_limited(q, key, len);
        if (rc < 0)
            fprintf(stderr, "wq_add_rate_limited: %s\n", wq_strerror(rc));
        return;
    }
    /* Too many failures: give up on the key. Forget it, or its failure
       count would stay in the queue (it occupies a slot until the queue
       needs the room). */
    wq_forget(q, key, len);
    printf("%.*s: dropped after %d retries\n", (int)len, key, MAX_RETRIES);
    settle(key, len);
}

/* One step of the worker loop: client-go's processNextItem. Returns 0 to
   go on, 1 when the queue was shut down, -1 on an error. */
static int process_next_item(wq *q, char *key, size_t cap)
{
    /* Blocks until a key is available (-1: no timeout), sleeping until
       the earliest delayed key is due when only delayed keys are left. */
    int n = wq_get(q, key, cap, -1);
    if (n == -ESHUTDOWN)
        return 1;
    if (n < 0) {
        fprintf(stderr, "wq_get: %s\n", wq_strerror(n));
        return -1;
    }
    /* The key is not NUL-terminated: it is n bytes. */
    handle_err(q, key, (size_t)n, sync_handler(key, (size_t)n));
    /* Always tell the queue we are done with the key, success or not:
       until then no one else may take it. */
    int rc = wq_done(q, key, (size_t)n);
    if (rc < 0) {
        fprintf(stderr, "wq_done: %s\n", wq_strerror(rc));
        return -1;
    }
    /* This example stops once every object has settled. A controller
       would run on; wq_shutdown is how an operator stops a queue. */
    if (settled == NOBJECTS)
        wq_shutdown(q);
    return 0;
}

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "example-controller";
    /* Zero means "the default" for every option. WQ_EXCL: this example
       wants a fresh queue, so that the counts it prints are its own. To
       tune the retry delays, set rl_base_delay_ns, rl_max_delay_ns,
       rl_qps and rl_burst (struct wq_options in wq.h). */
    struct wq_options opts = {
        .capacity = 1024,   /* at most 1024 keys queued, processing or waiting */
        .max_key_len = 64,  /* bytes */
        .flags = WQ_CREATE | WQ_EXCL,
    };
    wq *q;
    int rc = wq_open(name, &opts, &q);
    if (rc == -EEXIST) {
        fprintf(stderr, "queue %s exists (remove it with: wqctl rm %s)\n", name, name);
        return 1;
    }
    if (rc < 0) {
        /* wq_last_error says more than the errno after a failed wq_open. */
        fprintf(stderr, "wq_open %s: %s (%s)\n", name, wq_strerror(rc), wq_last_error());
        return 1;
    }

    /* The informer's event handlers: every object is added once, and the
       web object twice, as when two events arrive for it. */
    for (size_t i = 0; i < NOBJECTS; i++) {
        rc = wq_add(q, world[i].key, strlen(world[i].key));
        if (rc < 0) {
            fprintf(stderr, "wq_add: %s\n", wq_strerror(rc));
            goto out;
        }
    }
    rc = wq_add(q, "default/web", strlen("default/web"));
    printf("default/web added again: %s\n", rc == 1 ? "coalesced" : "queued twice?");

    /* The worker loop. One worker here; a controller may run several
       threads, or processes (see producer.c and worker.c), on the same
       queue. */
    char key[64];
    while ((rc = process_next_item(q, key, sizeof key)) == 0)
        ;
    if (rc > 0)
        rc = 0;

    /* What the queue counted (client-go's workqueue metrics). */
    struct wq_metrics m;
    if (wq_metrics(q, &m) == 0)
        printf("adds %llu, coalesced %llu, retries %llu\n",
               (unsigned long long)m.adds_total, (unsigned long long)m.coalesced_total,
               (unsigned long long)m.retries_total);
    printf("default/flaky failure count after forget: %d\n",
           wq_num_requeues(q, "default/flaky", strlen("default/flaky")));
out:
    wq_close(q);
    /* The queue would outlive this process; remove it, as this example
       made it for itself. */
    wq_unlink(name);
    return rc < 0 ? 1 : 0;
}
