/*
 * wqbench-recover - wqbench's recover workload. Not installed: it links the
 * test-only fault-injection build of the library (libwq-fault.la), whose
 * crash points let a process die at an exact instruction of a mutation.
 * wqbench runs it as a child with the same output options; it can also be
 * run by hand with wqbench's options (--workload is ignored).
 *
 * repair   A queue holding N = 1,000,000 live keys (capacity N + a few).
 *          A child attaches, arms the crash point "add.state" and calls
 *          wq_add on a new key: it is SIGKILLed right after the commit
 *          store, holding the region lock, with hdr->busy set. The parent
 *          then times its next wq_stats(): the lock answers EOWNERDEAD and
 *          the full repair (entries, index, ring, process table) runs inside
 *          that call. The repair is checked (repairs_total + 1, the new key
 *          live, wq_check clean). check_ns, the time of a verify-only
 *          wq_check on the healthy region, is given for contrast.
 *          "repair" uses the default options (a results table of
 *          capacity slots), "repair-r1" result_capacity = 1.
 *          Note the whole library here is the fault build (each crash point
 *          is a function call), which slows repair by a few percent at most.
 * (Restore from the LMDB store, recover's other half, needs no crash points:
 * wqbench measures it itself, see wqbench-queue.c.)
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wqbench.h"
#include "fault-api.h"

/* A child dies holding the lock in the middle of adding key `idx`. */
static void crash_mid_add(const char *name, uint64_t idx)
{
    pid_t pid = wqb_fork();
    if (pid == 0) {
        wq *q = wqb_attach(name);
        char key[WQB_KEY_LEN];
        wqb_key(key, idx);
        if (wq_fault_arm("add.state", 1, WQ_FAULT_KILL) < 0)
            _exit(2);
        wq_add(q, key, WQB_KEY_LEN);
        _exit(3);   /* the crash point was not reached */
    }
    int st;
    wqb_wait_status(pid, &st);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
        wqb_die("recover: the victim did not die at add.state (wait status 0x%x)", st);
}

/* Time the repairing wq_stats() after one crash; verify the outcome. */
static double repair_once(wq *q, const char *name, uint64_t new_idx, uint64_t live_before)
{
    struct wq_stats before, after;
    wqb_check(wq_stats(q, &before), "wq_stats");
    crash_mid_add(name, new_idx);
    uint64_t t0 = wqb_now();
    int rc = wq_stats(q, &after);
    uint64_t t1 = wqb_now();
    wqb_check(rc, "recover: wq_stats after the crash");
    if (after.repairs_total != before.repairs_total + 1)
        wqb_die("recover: no repair ran (repairs_total %llu)",
                (unsigned long long)after.repairs_total);
    if (after.live != live_before + 1)
        wqb_die("recover: %llu live keys after repair, expected %llu",
                (unsigned long long)after.live, (unsigned long long)live_before + 1);
    return (double)(t1 - t0);
}

/* One variant: a queue of n live keys with the given result_capacity
   (0: the default, = capacity). */
static void run_repair(const struct wqb_cfg *c, const char *variant, uint32_t result_cap)
{
    uint64_t n = wqb_size(c, 1000000, 1000000);
    int reps = wqb_reps(c);
    wq *q;
    char name[WQB_NAME_LEN];
    struct wqb_result r;
    struct wq_stats st;
    struct wq_options o = { .capacity = (uint32_t)(n + (uint64_t)reps + 16),
                            .result_capacity = result_cap };
    if (!wqb_want(c, variant))
        return;
    wqb_check(wqb_open_new("recover", &o, &q, name), "recover: wq_open");
    wqb_fill(q, 0, n);
    uint64_t t0 = wqb_now();
    int rc = wq_check(q, 0);
    double check_ns = (double)(wqb_now() - t0);
    if (rc != 0)
        wqb_die("recover: wq_check on the filled region: %d", rc);
    wqb_result_init(&r, "recover", variant, "ns");
    for (int i = 0; i < reps; i++)
        wqb_result_add(&r, repair_once(q, name, n + (uint64_t)i, n + (uint64_t)i));
    if ((rc = wq_check(q, 0)) != 0)
        wqb_die("recover: wq_check after the repairs: %d", rc);
    wqb_check(wq_stats(q, &st), "wq_stats");
    wqb_result_extra(&r, "live", (double)n, WQB_X_INT);
    wqb_result_extra(&r, "region_bytes", (double)st.region_bytes, WQB_X_INT);
    wqb_result_extra(&r, "check_ns", check_ns, WQB_X_NS);
    wqb_emit(c, &r);
    wqb_queue_destroy(q, name);
}

int main(int argc, char **argv)
{
    struct wqb_cfg c;
    const char *names[WQB_MAX_NAMES];
    int nnames;
    if (wqb_parse_args(argc, argv, &c, names, &nnames) < 0) {
        wqb_usage(stderr);
        return 2;
    }
    wqb_init();
    if (c.table && !c.no_header)
        wqb_table_header();
    run_repair(&c, "repair", 0);
    run_repair(&c, "repair-r1", 1);
    return 0;
}
