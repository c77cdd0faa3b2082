/*
 * test-redis.c - what only a Redis queue has: names, refused options,
 * leases and fencing, dropped connections, a server that goes away and
 * comes back (with its AOF), a blocked get woken by an add, and a Redis
 * Cluster whose slot moves and whose master fails.
 *
 * The program starts its own servers (redis-server on free loopback
 * ports, in temporary directories) and stops them, whatever happens: a
 * watchdog and an atexit handler kill every server it started. The
 * witness for what the server holds is hiredis used directly, never the
 * library under test.
 *
 * The semantics every queue shares (coalescing, delays, limiters, results,
 * pools, crash torture) are the shared-memory test programs run again
 * against a redis:// prefix (tests/with-redis.sh).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <pthread.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "wq.h"

#define MS ((uint64_t)1000000)
#define SEC ((uint64_t)1000000000)
#define KS(s) (s), strlen(s)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* ------------------------------------------------------------------ */
/* Servers                                                             */
/* ------------------------------------------------------------------ */

struct srv {
    pid_t pid;
    int port;
    char dir[128];
    char extra[8][64];   /* extra "--name value" pairs, as separate words */
    int nextra;
};

#define MAX_SRV 8
static struct srv *started[MAX_SRV];

/* Every server this program started, stopped, and its directory gone:
   also when a failed assertion skipped a test's own cleanup. */
static void kill_all(void)
{
    for (int i = 0; i < MAX_SRV; i++)
        if (started[i]) {
            if (started[i]->pid > 0) {
                kill(started[i]->pid, SIGKILL);
                waitpid(started[i]->pid, NULL, 0);
                started[i]->pid = 0;
            }
            if (started[i]->dir[0]) {
                char cmd[256];
                snprintf(cmd, sizeof cmd, "rm -rf '%s'", started[i]->dir);
                if (system(cmd) != 0) {
                }
            }
            started[i] = NULL;
        }
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char m[] = "test-redis: watchdog: killing servers\n";
    if (write(2, m, sizeof m - 1) < 0) {
    }
    for (int i = 0; i < MAX_SRV; i++)
        if (started[i] && started[i]->pid > 0)
            kill(started[i]->pid, SIGKILL);
    _exit(99);
}

static bool port_free(int port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = bind(s, (struct sockaddr *)&a, sizeof a) == 0;
    close(s);
    /* the cluster bus port is port + 10000 */
    if (ok && port + 10000 < 65536) {
        s = socket(AF_INET, SOCK_STREAM, 0);
        a.sin_port = htons((uint16_t)(port + 10000));
        ok = bind(s, (struct sockaddr *)&a, sizeof a) == 0;
        close(s);
    }
    return ok;
}

static redisContext *witness(int port)
{
    struct timeval tv = { 2, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && c->err) {
        redisFree(c);
        return NULL;
    }
    return c;
}

static bool ping(int port)
{
    redisContext *c = witness(port);
    if (!c)
        return false;
    redisReply *r = redisCommand(c, "PING");
    bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    redisFree(c);
    return ok;
}

static void srv_arg(struct srv *s, const char *name, const char *value)
{
    snprintf(s->extra[s->nextra++], sizeof s->extra[0], "%s", name);
    snprintf(s->extra[s->nextra++], sizeof s->extra[0], "%s", value);
}

/* (Re)start s on its port and directory (chosen on the first start). */
static void srv_start(struct srv *s)
{
    if (!s->port) {
        for (int tries = 0; tries < 200 && !s->port; tries++) {
            int p = 20000 + (int)((now_ns() / 1000 + (uint64_t)getpid() * 7919 + (uint64_t)tries * 104729) % 30000);
            if (port_free(p))
                s->port = p;
        }
        assert_true(s->port > 0);
        snprintf(s->dir, sizeof s->dir, "/tmp/wq-test-redis-%d-%d", (int)getpid(), s->port);
        assert_int_equal(mkdir(s->dir, 0700), 0);
        int i = 0;
        while (i < MAX_SRV && started[i])
            i++;
        assert_true(i < MAX_SRV);
        started[i] = s;
    }
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    const char *argv[40] = { "redis-server", "--port", port, "--bind", "127.0.0.1", "--dir",
                             s->dir, "--daemonize", "no", "--save", "", "--logfile",
                             "server.log" };
    int n = 13;
    bool aof = false;
    for (int i = 0; i < s->nextra; i++) {
        argv[n++] = s->extra[i];
        aof |= strcmp(s->extra[i], "--appendonly") == 0;
    }
    if (!aof) {
        argv[n++] = "--appendonly";
        argv[n++] = "no";
    }
    argv[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_RDWR);
        dup2(fd, 0);
        dup2(fd, 1);
        execvp("redis-server", (char *const *)argv);
        _exit(127);
    }
    s->pid = pid;
    for (int i = 0; i < 500 && !ping(s->port); i++)
        sleep_ms(10);
    assert_true(ping(s->port));
}

/* SIGKILL: a crash of the server, not a clean shutdown. */
static void srv_kill(struct srv *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
    }
    s->pid = 0;
}

static void srv_remove(struct srv *s)
{
    srv_kill(s);
    if (s->dir[0]) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", s->dir);
        if (system(cmd) != 0) {
        }
    }
    for (int i = 0; i < MAX_SRV; i++)
        if (started[i] == s)
            started[i] = NULL;
    memset(s, 0, sizeof *s);
}

static redisReply *wcmd(int port, const char *fmt, ...)
{
    redisContext *c = witness(port);
    assert_non_null(c);
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    assert_non_null(r);
    return r;
}

static long long wint(int port, const char *fmt, ...)
{
    redisContext *c = witness(port);
    assert_non_null(c);
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    assert_non_null(r);
    long long v = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    return v;
}

static void qname(char *out, size_t n, int port, const char *tag)
{
    snprintf(out, n, "redis://127.0.0.1:%d/t%d-%s", port, (int)getpid(), tag);
}

static wq *open_q(const char *name, const struct wq_options *o)
{
    wq *q = NULL;
    int rc = wq_open(name, o, &q);
    if (rc < 0)
        fail_msg("wq_open(%s): %s (%s)", name, wq_strerror(rc), wq_last_error());
    return q;
}

/* A standalone server for most tests, started once. */
static struct srv one;

static int group_setup(void **state)
{
    (void)state;
    srv_start(&one);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    srv_remove(&one);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Names and options                                                   */
/* ------------------------------------------------------------------ */

static void expect_open_err(const char *name, const struct wq_options *o, int err,
                            const char *words)
{
    wq *q = NULL;
    int rc = wq_open(name, o, &q);
    if (rc != err)
        fail_msg("wq_open(%s) = %d (%s), expected %d", name, rc, wq_last_error(), err);
    assert_null(q);
    if (words && !strstr(wq_last_error(), words))
        fail_msg("wq_open(%s): last error \"%s\" does not say \"%s\"", name, wq_last_error(),
                 words);
}

static void names_and_options(void **state)
{
    (void)state;
    struct wq_options c = { .flags = WQ_CREATE };
    expect_open_err("redis://", &c, -EINVAL, "no host");
    expect_open_err("redis://127.0.0.1:99999/q", &c, -EINVAL, "port");
    expect_open_err("redis://127.0.0.1:6379/bad name", &c, -EINVAL, "not a queue name");
    expect_open_err("redis://127.0.0.1:6379/", &c, -EINVAL, "not a queue name");
    expect_open_err("redis://[::1/q", &c, -EINVAL, "']'");
    expect_open_err("redis://u:%zz@127.0.0.1/q", &c, -EINVAL, "percent");
    char name[256];
    qname(name, sizeof name, one.port, "opts");
    struct wq_options st = { .flags = WQ_CREATE, .store_path = "/tmp/x" };
    expect_open_err(name, &st, -EINVAL, "store_path");
    struct wq_options md = { .flags = WQ_CREATE, .mode = 0666 };
    expect_open_err(name, &md, -EINVAL, "mode");
    struct wq_options lz = { .flags = WQ_CREATE, .lease_ns = 5 * MS };
    expect_open_err(name, &lz, -EINVAL, "lease_ns");
    /* lease_ns means nothing in shared memory */
    wq *q = NULL;
    struct wq_options shm = { .flags = WQ_CREATE, .lease_ns = SEC };
    assert_int_equal(wq_open("t-redis-lease", &shm, &q), -EINVAL);
    assert_non_null(strstr(wq_last_error(), "lease_ns"));
    /* attach only, to a queue that is not there */
    expect_open_err(name, NULL, -ENOENT, "does not exist");
    /* a server that is not there: the error names it */
    char gone[128];
    snprintf(gone, sizeof gone, "redis://127.0.0.1:%d/q", one.port == 65000 ? 65001 : 65000);
    expect_open_err(gone, &c, -ECONNREFUSED, "127.0.0.1:6500");
    /* FSYNC on a server without AOF */
    struct wq_options fs = { .flags = WQ_CREATE, .durability = WQ_DURABLE_FSYNC };
    expect_open_err(name, &fs, -ENOTSUP, "appendonly yes");
    /* options that differ from the queue's */
    q = open_q(name, &(struct wq_options){ .flags = WQ_CREATE, .capacity = 16 });
    expect_open_err(name, &(struct wq_options){ .flags = WQ_CREATE, .capacity = 32 }, -EEXIST,
                    "capacity 16, not 32");
    expect_open_err(name, &(struct wq_options){ .flags = WQ_CREATE | WQ_EXCL }, -EEXIST, NULL);
    /* wq_name leaves the password out; wq_list_at finds the queue */
    assert_string_equal(wq_name(q), name);
    wq_close(q);
    assert_int_equal(wq_unlink(name), 0);
    assert_int_equal(wq_unlink(name), -ENOENT);
    assert_int_equal(wint(one.port, "EXISTS wq:{t%d-opts}:m", (int)getpid()), 0);
}

static int count_fn(const char *name, void *arg)
{
    char **want = arg;
    if (strcmp(name, want[0]) == 0)
        want[1] = (char *)name;
    return 0;
}

static void list_at(void **state)
{
    (void)state;
    char name[256], where[64];
    qname(name, sizeof name, one.port, "listed");
    snprintf(where, sizeof where, "redis://127.0.0.1:%d", one.port);
    wq *q = open_q(name, &(struct wq_options){ .flags = WQ_CREATE });
    char *want[2] = { name, NULL };
    assert_int_equal(wq_list_at(where, count_fn, want), 0);
    assert_non_null(want[1]);
    wq_close(q);
    assert_int_equal(wq_unlink(name), 0);
    want[1] = NULL;
    assert_int_equal(wq_list_at(where, count_fn, want), 0);
    assert_null(want[1]);
    assert_int_equal(wq_list_at("nowhere", count_fn, want), -EINVAL);
}

/* ------------------------------------------------------------------ */
/* Leases and fencing                                                  */
/* ------------------------------------------------------------------ */

/* Child: open, take the one key, tell the parent, wait for a byte, then
   wq_done and exit with its result (0: done worked, 1: -ESTALE, 2 other). */
static pid_t holder_child(const char *name, int to_parent[2], int to_child[2])
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid)
        return pid;
    alarm(30);
    wq *q = NULL;
    if (wq_open(name, NULL, &q) < 0)
        _exit(3);
    char buf[256];
    int n = wq_get(q, buf, sizeof buf, (int64_t)(5 * SEC));
    if (n <= 0)
        _exit(4);
    char b = 'g';
    if (write(to_parent[1], &b, 1) != 1)
        _exit(5);
    if (read(to_child[0], &b, 1) != 1)
        _exit(6);
    int rc = wq_done(q, buf, (size_t)n);
    _exit(rc == 0 ? 0 : rc == -ESTALE ? 1 : 2);
}

static void fencing_after_sigstop(void **state)
{
    (void)state;
    char name[256];
    qname(name, sizeof name, one.port, "fence");
    wq *q = open_q(name, &(struct wq_options){ .flags = WQ_CREATE, .lease_ns = 600 * MS });
    assert_int_equal(wq_add(q, KS("k")), 0);
    int tp[2], tc[2];
    assert_int_equal(pipe(tp), 0);
    assert_int_equal(pipe(tc), 0);
    pid_t pid = holder_child(name, tp, tc);
    char b;
    assert_int_equal(read(tp[0], &b, 1), 1);
    /* The witness: the server says the child holds it. */
    assert_int_equal(wint(one.port, "HLEN wq:{t%d-fence}:p", (int)getpid()), 1);
    kill(pid, SIGSTOP);
    uint64_t t0 = now_ns();
    char buf[256];
    int n = wq_get(q, buf, sizeof buf, (int64_t)(5 * SEC));
    uint64_t waited = now_ns() - t0;
    assert_int_equal(n, 1);
    assert_memory_equal(buf, "k", 1);
    /* not before the stopped holder's lease ran out (its connection is
       alive: only the lease can say it is gone) */
    assert_true(waited >= 400 * MS);
    struct wq_stats s;
    assert_int_equal(wq_stats(q, &s), 0);
    assert_int_equal(s.crash_requeues_total, 1);
    assert_int_equal(wq_num_requeues(q, KS("k")), 1);   /* through the limiter */
    kill(pid, SIGCONT);
    assert_int_equal(write(tc[1], "d", 1), 1);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 1);   /* -ESTALE: fenced */
    /* and it changed nothing: still ours */
    assert_int_equal(wint(one.port, "HLEN wq:{t%d-fence}:p", (int)getpid()), 1);
    assert_int_equal(wq_done(q, buf, 1), 0);
    assert_int_equal(wq_get(q, buf, sizeof buf, 0), -EAGAIN);
    close(tp[0]), close(tp[1]), close(tc[0]), close(tc[1]);
    wq_close(q);
    assert_int_equal(wq_unlink(name), 0);
}

static void sigkill_holder_comes_back_once(void **state)
{
    (void)state;
    char name[256];
    qname(name, sizeof name, one.port, "kill");
    /* A long lease: only the dropped connection can bring the key back
       this soon. */
    wq *q = open_q(name, &(struct wq_options){ .flags = WQ_CREATE, .lease_ns = 60 * SEC });
    assert_int_equal(wq_add(q, KS("k")), 0);
    int tp[2], tc[2];
    assert_int_equal(pipe(tp), 0);
    assert_int_equal(pipe(tc), 0);
    pid_t pid = holder_child(name, tp, tc);
    char b;
    assert_int_equal(read(tp[0], &b, 1), 1);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    uint64_t t0 = now_ns();
    char buf[256];
    assert_int_equal(wq_get(q, buf, sizeof buf, (int64_t)(10 * SEC)), 1);
    assert_true(now_ns() - t0 < 5 * SEC);
    struct wq_stats s;
    assert_int_equal(wq_stats(q, &s), 0);
    assert_int_equal(s.crash_requeues_total, 1);
    assert_int_equal(s.processes, 1);   /* the dead holder is gone */
    /* once: nothing else comes */
    assert_int_equal(wq_get(q, buf, sizeof buf, (int64_t)(300 * MS)), -ETIMEDOUT);
    assert_int_equal(wq_done(q, KS("k")), 0);
    close(tp[0]), close(tp[1]), close(tc[0]), close(tc[1]);
    wq_close(q);
    assert_int_equal(wq_unlink(name), 0);
}

/* ------------------------------------------------------------------ */
/* Connections and servers                                             */
/* ------------------------------------------------------------------ */

static void killed_connections_reconnect(void **state)
{
    (void)state;
    char name[256];
    qname(name, sizeof name, one.port, "reconn");
    wq *q = open_q(name, &(struct wq_options){ .flags = WQ_CREATE });
    assert_int_equal(wq_add(q, KS("a")), 0);
    redisReply *r = wcmd(one.port, "CLIENT KILL TYPE normal SKIPME yes");
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_true(r->integer >= 1);
    freeReplyObject(r);
    /* the next call finds its connection gone and sends again */
    assert_int_equal(wq_add(q, KS("b")), 0);
    assert_int_equal(wq_len(q), 2);
    char buf[256];
    assert_int_equal(wq_get(q, buf, sizeof buf, 0), 1);
    assert_memory_equal(buf, "a", 1);
    r = wcmd(one.port, "CLIENT KILL TYPE normal SKIPME yes");
    freeReplyObject(r);
    assert_int_equal(wq_done(q, KS("a")), 0);   /* its epoch survived */
    wq_close(q);
    assert_int_equal(wq_unlink(name), 0);
}

static void server_down_and_back(void **state)
{
    (void)state;
    struct srv s = { 0 };
    srv_arg(&s, "--appendonly", "yes");
    srv_arg(&s, "--appendfsync", "always");
    srv_start(&s);
    char name[256];
    qname(name, sizeof name, s.port, "aof");
    wq *q = open_q(name, &(struct wq_options){ .flags = WQ_CREATE,
                                               .durability = WQ_DURABLE_FSYNC });
    /* every acknowledged add survives a crash of the server */
    int acked = 0;
    for (int i = 0; i < 500; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%03d", i);
        if (wq_add(q, KS(k)) == 0)
            acked++;
    }
    assert_int_equal(acked, 500);
    srv_kill(&s);
    int rc = wq_add(q, KS("while-down"));
    assert_true(rc == -ECONNREFUSED || rc == -ECONNRESET);
    char where[32];
    snprintf(where, sizeof where, "127.0.0.1:%d", s.port);
    if (!strstr(wq_last_error(), where))
        fail_msg("error while down does not name the server: %s", wq_last_error());
    assert_int_equal(wq_len(q) < 0, 1);
    srv_start(&s);
    /* the same handle works again */
    assert_int_equal(wq_len(q), 500);
    char buf[256];
    for (int i = 0; i < 500; i++) {
        int n = wq_get(q, buf, sizeof buf, 0);
        assert_int_equal(n, 4);
        char k[16];
        snprintf(k, sizeof k, "k%03d", i);
        assert_memory_equal(buf, k, 4);   /* in order */
        assert_int_equal(wq_done(q, buf, 4), 0);
    }
    assert_int_equal(wq_get(q, buf, sizeof buf, 0), -EAGAIN);
    wq_close(q);
    srv_remove(&s);
}

struct waker {
    wq *q;
    uint64_t got_at;
    int rc;
};

static void *blocked_get(void *arg)
{
    struct waker *w = arg;
    char buf[256];
    w->rc = wq_get(w->q, buf, sizeof buf, (int64_t)(5 * SEC));
    w->got_at = now_ns();
    return NULL;
}

static void add_wakes_blocked_get(void **state)
{
    (void)state;
    char name[256];
    qname(name, sizeof name, one.port, "wake");
    wq *q = open_q(name, &(struct wq_options){ .flags = WQ_CREATE });
    wq *p = open_q(name, NULL);
    uint64_t worst = 0;
    for (int round = 0; round < 5; round++) {
        struct waker w = { .q = q };
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, blocked_get, &w), 0);
        sleep_ms(150);   /* well inside its BLPOP */
        uint64_t t0 = now_ns();
        char k[8];
        snprintf(k, sizeof k, "w%d", round);
        assert_int_equal(wq_add(p, KS(k)), 0);
        pthread_join(t, NULL);
        assert_int_equal(w.rc, 2);
        uint64_t d = w.got_at - t0;
        worst = d > worst ? d : worst;
        assert_int_equal(wq_done(q, KS(k)), 0);
    }
    /* woken by the add, not by the once-a-second look */
    if (worst > 100 * MS)
        fail_msg("an add woke a blocked wq_get after %llu us", (unsigned long long)(worst / 1000));
    print_message("worst wake after add: %llu us\n", (unsigned long long)(worst / 1000));
    wq_close(p);
    wq_close(q);
    assert_int_equal(wq_unlink(name), 0);
}

/* ------------------------------------------------------------------ */
/* Redis Cluster                                                       */
/* ------------------------------------------------------------------ */

static struct srv cl[6];

static void node_id(int port, char out[41])
{
    redisReply *r = wcmd(port, "CLUSTER MYID");
    assert_int_equal(r->type, REDIS_REPLY_STRING);
    snprintf(out, 41, "%s", r->str);
    freeReplyObject(r);
}

/* The master port serving slot, as node `ask` sees it. */
static int slot_owner(int ask, long long slot)
{
    redisReply *r = wcmd(ask, "CLUSTER SLOTS");
    int port = 0;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        redisReply *s = r->element[i];
        if (s->element[0]->integer <= slot && slot <= s->element[1]->integer)
            port = (int)s->element[2]->element[1]->integer;
    }
    freeReplyObject(r);
    return port;
}

static bool cluster_ok(int port)
{
    redisReply *r = wcmd(port, "CLUSTER INFO");
    bool ok = r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
    freeReplyObject(r);
    return ok;
}

static void cluster_start(void)
{
    char cmd[1024] = "redis-cli --cluster create";
    for (int i = 0; i < 6; i++) {
        srv_arg(&cl[i], "--cluster-enabled", "yes");
        srv_arg(&cl[i], "--cluster-node-timeout", "1000");
        srv_arg(&cl[i], "--cluster-config-file", "nodes.conf");
        srv_start(&cl[i]);
        char a[32];
        snprintf(a, sizeof a, " 127.0.0.1:%d", cl[i].port);
        strcat(cmd, a);
    }
    strcat(cmd, " --cluster-replicas 1 --cluster-yes >/dev/null 2>&1");
    assert_int_equal(system(cmd), 0);
    for (int i = 0; i < 100; i++) {
        bool all = true;
        for (int j = 0; j < 6; j++)
            all &= cluster_ok(cl[j].port);
        if (all)
            break;
        sleep_ms(100);
    }
    for (int j = 0; j < 6; j++)
        assert_true(cluster_ok(cl[j].port));
}

static void cluster_stop(void)
{
    for (int i = 0; i < 6; i++)
        srv_remove(&cl[i]);
}

/* Move slot from one master to another the way redis-cli does. */
static void move_slot(long long slot, int from, int to, const char *tag)
{
    char from_id[41], to_id[41];
    node_id(from, from_id);
    node_id(to, to_id);
    freeReplyObject(wcmd(to, "CLUSTER SETSLOT %lld IMPORTING %s", slot, from_id));
    freeReplyObject(wcmd(from, "CLUSTER SETSLOT %lld MIGRATING %s", slot, to_id));
    for (;;) {
        redisReply *k = wcmd(from, "CLUSTER GETKEYSINSLOT %lld 100", slot);
        size_t n = k->elements;
        for (size_t i = 0; i < n; i++) {
            redisReply *m = wcmd(from, "MIGRATE 127.0.0.1 %d %b 0 5000 REPLACE", to,
                                 k->element[i]->str, (size_t)k->element[i]->len);
            freeReplyObject(m);
        }
        freeReplyObject(k);
        if (n == 0)
            break;
    }
    (void)tag;
    for (int i = 0; i < 6; i++)
        if (cl[i].pid > 0)
            freeReplyObject(wcmd(cl[i].port, "CLUSTER SETSLOT %lld NODE %s", slot, to_id));
}

static void cluster_reshard_and_failover(void **state)
{
    (void)state;
    cluster_start();
    char qn[64], name[256];
    snprintf(qn, sizeof qn, "t%d-cl", (int)getpid());
    /* the first node's address, whoever owns the slot: MOVED leads */
    snprintf(name, sizeof name, "redis://127.0.0.1:%d/%s", cl[0].port, qn);
    /* The default lease (10 s) outlasts the failover (~2.5 s, more under
       load): this test is about finding the queue again, not about
       leases running out meanwhile (fencing_after_sigstop is). */
    wq *q = open_q(name, &(struct wq_options){ .flags = WQ_CREATE });
    for (int i = 0; i < 100; i++) {
        char k[16];
        snprintf(k, sizeof k, "a%02d", i);
        assert_int_equal(wq_add(q, KS(k)), 0);
    }
    redisReply *r = wcmd(cl[0].port, "CLUSTER KEYSLOT {%s}", qn);
    long long slot = r->integer;
    freeReplyObject(r);
    int owner = slot_owner(cl[0].port, slot), other = 0;
    for (int i = 0; i < 3 && !other; i++) {
        int m = slot_owner(cl[0].port, i * 5461 + 10);
        if (m && m != owner)
            other = m;
    }
    assert_true(owner && other);
    char buf[256];
    assert_int_equal(wq_get(q, buf, sizeof buf, 0), 3);
    assert_memory_equal(buf, "a00", 3);
    /* reshard: the queue's slot moves to another master */
    move_slot(slot, owner, other, qn);
    assert_int_equal(slot_owner(cl[0].port, slot), other);
    assert_int_equal(wq_done(q, KS("a00")), 0);
    assert_int_equal(wq_len(q), 99);
    for (int i = 1; i < 50; i++) {
        char k[16];
        snprintf(k, sizeof k, "a%02d", i);
        assert_int_equal(wq_get(q, buf, sizeof buf, 0), 3);
        assert_memory_equal(buf, k, 3);
        assert_int_equal(wq_done(q, buf, 3), 0);
    }
    /* everything acknowledged is on the replica, then the master dies. A
       replica still (re)connecting to its master is not counted (0 of 0
       acknowledged): wait, up to 20 s, for one that is and acknowledges. */
    int rc;
    uint64_t w0 = now_ns();
    while ((rc = wq_snapshot(q)) < 1 && now_ns() - w0 < 20 * SEC)
        sleep_ms(100);
    if (now_ns() - w0 > 100 * MS)
        print_message("snapshot: a replica acknowledged after %llu ms\n",
                      (unsigned long long)((now_ns() - w0) / MS));
    assert_true(rc >= 1);
    int victim = -1;
    for (int i = 0; i < 6; i++)
        if (cl[i].port == other)
            victim = i;
    srv_kill(&cl[victim]);
    uint64_t t0 = now_ns();
    int n;
    /* calls fail for a while (or wait inside), then work on the new master */
    while ((n = wq_len(q)) < 0 && now_ns() - t0 < 30 * SEC)
        sleep_ms(200);
    assert_int_equal(n, 50);
    print_message("failover: queue back after %llu ms\n",
                  (unsigned long long)((now_ns() - t0) / MS));
    for (int i = 50; i < 100; i++) {
        char k[16];
        snprintf(k, sizeof k, "a%02d", i);
        assert_int_equal(wq_get(q, buf, sizeof buf, 0), 3);
        assert_memory_equal(buf, k, 3);
        assert_int_equal(wq_done(q, buf, 3), 0);
    }
    assert_int_equal(wq_add(q, KS("after")), 0);
    assert_int_equal(wq_len(q), 1);
    wq_close(q);
    /* by any live node's address (the first may be the one that died) */
    snprintf(name, sizeof name, "redis://127.0.0.1:%d/%s", cl[victim == 0 ? 1 : 0].port, qn);
    assert_int_equal(wq_unlink(name), 0);
    cluster_stop();
}

int main(void)
{
    signal(SIGALRM, on_alarm);
    alarm(240);
    atexit(kill_all);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(names_and_options),
        cmocka_unit_test(list_at),
        cmocka_unit_test(fencing_after_sigstop),
        cmocka_unit_test(sigkill_holder_comes_back_once),
        cmocka_unit_test(killed_connections_reconnect),
        cmocka_unit_test(add_wakes_blocked_get),
        cmocka_unit_test(server_down_and_back),
        cmocka_unit_test(cluster_reshard_and_failover),
    };
    int rc = cmocka_run_group_tests_name("redis", tests, group_setup, group_teardown);
    kill_all();
    return rc;
}
