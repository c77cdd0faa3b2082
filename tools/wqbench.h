/*
 * wqbench.h - shared declarations of the wqbench programs (wqbench and its
 * fault-injection helper wqbench-recover). Not installed.
 *
 * wqbench-util.c owns everything that is not a workload: run modes and
 * sizes, the result record and its JSON / table output, timing, key
 * formatting, the registry of queue names and child pids that the signal
 * handler cleans up, the start barrier in a shared mapping, and forking.
 * The workload files only measure and fill in results. wqbench-redis.c
 * (built with hiredis only) runs some of them on redis:// queues against
 * a server it starts, beside a hand-written Lua baseline.
 */
#ifndef WQBENCH_H
#define WQBENCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <wq.h>

#define WQB_KEY_LEN   12   /* every key: 'k' + 11 decimal digits */
#define WQB_BUF_LEN   64   /* wq_get buffers (>= max_key_len) */
#define WQB_MAX_REPS  32
#define WQB_MAX_EXTRA 10
#define WQB_NAME_LEN  256  /* queue names: [prefix]wqbench.<pid>.<seq>.<tag> */

enum wqb_mode { WQB_QUICK, WQB_DEFAULT, WQB_FULL };

struct wqb_cfg {
    enum wqb_mode mode;
    bool table;        /* human-readable rows instead of JSON lines */
    int reps;          /* 0: the mode's default */
    uint64_t n;        /* 0: each workload's default size */
    bool no_header;    /* table mode: the caller printed the header */
    const char *variants[32];  /* --variant filter; none: all */
    int nvariants;
    bool redis;        /* --engine redis or --prefix redis://... */
    const char *prefix;   /* --prefix: a redis:// server of the caller's */
    const char *pin;      /* --pin split (default), same or none */
};

#define WQB_MAX_NAMES 32

/* How an extra field is printed in the table (JSON always prints the
   raw number). */
enum wqb_kind { WQB_X_INT, WQB_X_NUM, WQB_X_NS, WQB_X_FRAC };

struct wqb_extra {
    const char *name;
    double v;
    enum wqb_kind kind;
};

/* One variant's result: one figure per repetition plus extra fields. */
struct wqb_result {
    const char *workload;
    char variant[32];
    const char *unit;
    double v[WQB_MAX_REPS];
    int reps;
    struct wqb_extra x[WQB_MAX_EXTRA];
    int nx;
};

/* wqbench-util.c: configuration */
int wqb_reps(const struct wqb_cfg *c);
bool wqb_want(const struct wqb_cfg *c, const char *variant);
uint64_t wqb_size(const struct wqb_cfg *c, uint64_t quick, uint64_t dflt);
int wqb_parse_args(int argc, char **argv, struct wqb_cfg *c, const char **names,
                   int *nnames);
void wqb_usage(FILE *f);

/* wqbench-util.c: results */
void wqb_result_init(struct wqb_result *r, const char *workload, const char *variant,
                     const char *unit);
void wqb_result_add(struct wqb_result *r, double v);
void wqb_result_extra(struct wqb_result *r, const char *name, double v, enum wqb_kind k);
double wqb_median(const double *v, int n);
void wqb_emit(const struct wqb_cfg *c, const struct wqb_result *r);
void wqb_skip(const struct wqb_cfg *c, const char *workload, const char *variant,
              const char *reason);
void wqb_table_header(void);

/* wqbench-util.c: time, keys, errors */
uint64_t wqb_now(void);
void wqb_pace_until(uint64_t t);
void wqb_sleep_ns(uint64_t ns);
void wqb_key(char out[WQB_KEY_LEN], uint64_t i);
void wqb_key_next(char k[WQB_KEY_LEN]);
uint64_t wqb_key_index(const char *key);
void wqb_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void wqb_check(int rc, const char *what);
bool wqb_failed(void);
void wqb_watchdog(unsigned seconds, const char *what);

/* wqbench-util.c: queues and cleanup */
void wqb_init(void);
void wqb_set_prefix(const char *prefix);
bool wqb_prefixed(void);
int wqb_open_new(const char *tag, struct wq_options *o, wq **out, char name[WQB_NAME_LEN]);
void wqb_skip_open(const struct wqb_cfg *c, const char *workload, const char *variant,
                   int rc);
void wqb_queue_create(const char *tag, uint32_t capacity, wq **out, char name[WQB_NAME_LEN]);
void wqb_queue_destroy(wq *q, const char *name);
wq *wqb_attach(const char *name);
void wqb_fill(wq *q, uint64_t first, uint64_t n);
void wqb_register_path(const char *path);
void wqb_unregister_path(const char *path);
/* A new directory /tmp/wqbench-<tag>.<pid>.XXXXXX in dir, registered
   (removed at exit or by wqb_unregister_path); 0 or -errno. */
#define WQB_DIR_LEN 64
int wqb_temp_dir(const char *tag, char dir[WQB_DIR_LEN]);
void wqb_register_server(pid_t pid);
int wqb_stop_server(void);

/* wqbench-util.c: processes and the start barrier */
void *wqb_shared_alloc(size_t size);
void wqb_shared_free(void *p, size_t size);
pid_t wqb_fork(void);
void wqb_wait_child(pid_t pid);
void wqb_wait_status(pid_t pid, int *status);

struct wqb_gate {
    _Atomic uint32_t ready;  /* workers arrived */
    _Atomic uint32_t go;     /* futex word: 1 once released */
    uint64_t t0;             /* release time; written before go (release) */
};
void wqb_gate_arrive(struct wqb_gate *g);
uint64_t wqb_gate_release(struct wqb_gate *g, uint32_t n);

/* Workloads. Each prints its own lines. */
void wqb_run_cycle(const struct wqb_cfg *c);
void wqb_run_scale(const struct wqb_cfg *c);
void wqb_run_durable(const struct wqb_cfg *c);
/* wqbench-peers.c: durable/sqlite-full. */
void wqb_peer_sqlite(const struct wqb_cfg *c);
void wqb_run_restore(const struct wqb_cfg *c);
void wqb_run_drain(const struct wqb_cfg *c);
void wqb_run_mpmc(const struct wqb_cfg *c);
void wqb_run_starve(const struct wqb_cfg *c);
void wqb_run_tenants(const struct wqb_cfg *c);
void wqb_run_floor_mutex(const struct wqb_cfg *c);
void wqb_run_floor_mq(const struct wqb_cfg *c);

/* Single variants, for the engines that run them with their own sizes
   (wqbench-redis.c). ref_name / ref: a figure to compare the median with
   (extra field ref_name = median / ref), or NULL. */
enum wqb_loop { WQB_LOOP_MEMORY, WQB_LOOP_DONE_GET, WQB_LOOP_ADD_MANY };
double wqb_cycle_variant(const struct wqb_cfg *c, const char *variant, enum wqb_loop loop,
                         unsigned flags, uint64_t n, const char *ref_name, double ref);
/* batch > 1: consumers take keys with wq_get_many and finish them with
   wq_done_many, `batch` at a time. work_ns: each key's work between its
   get and its done (a busy loop). */
void wqb_drain_variant(const struct wqb_cfg *c, const char *variant, int consumers,
                       int batch, uint64_t work_ns, uint64_t n);
/* The same n keys reconciled by wq_run_workers' pool of `workers`. */
void wqb_pool_variant(const struct wqb_cfg *c, const char *variant, int workers, uint64_t n);
struct wqb_mpmc {
    const char *variant;
    int producers, consumers;
    uint64_t adds;
    uint64_t pace_ns;   /* 0: flat out */
    int batch;          /* > 1: consumers use wq_get_many / wq_done_many;
                           WQB_DONE_GET: wq_done_get */
    bool publish;       /* producers use wq_add_publish ("-pub") */
};
/* A consumer's batch that means: each done and the next get are one
   wq_done_get (one lock acquisition, or one round trip, per key). */
#define WQB_DONE_GET 0
void wqb_mpmc_variant(const struct wqb_cfg *c, const struct wqb_mpmc *p);

/* wqbench-redis.c (built with hiredis only): --engine redis. */
int wqb_redis_start(const struct wqb_cfg *c);
void wqb_redis_describe(const struct wqb_cfg *c);
void wqb_redis_stop(void);
void wqb_redis_cycle(const struct wqb_cfg *c);
void wqb_redis_durable(const struct wqb_cfg *c);
void wqb_redis_add_many(const struct wqb_cfg *c);
void wqb_redis_drain(const struct wqb_cfg *c);
void wqb_redis_mpmc(const struct wqb_cfg *c);

#endif
