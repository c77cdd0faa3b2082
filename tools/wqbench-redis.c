/*
 * wqbench-redis.c - wqbench --engine redis: libwq's redis:// engine, and a
 * hand-written baseline queue on the same server in the same run. Built
 * only with hiredis (configure's HAVE_HIREDIS).
 *
 * SERVER
 *   Without --prefix, wqbench starts its own redis-server
 *   ($WQBENCH_REDIS_SERVER, else the one configure found, else
 *   redis-server on PATH) bound to 127.0.0.1 on a free port, with
 *   --save '' --appendonly no (it writes nothing), logging to a memfd
 *   that wqbench shows if it fails, in a fresh directory
 *   /tmp/wqbench-redis.<pid>.XXXXXX that is removed as soon as the server
 *   answers, in its own process group (a terminal's Ctrl-C reaches
 *   wqbench, which stops it in order) and with PR_SET_PDEATHSIG, so it
 *   cannot outlive wqbench, not even one that is SIGKILLed. It is stopped at the end, on failure, on SIGINT /
 *   SIGTERM / SIGHUP, and by the watchdog (a workload that takes minutes
 *   is wedged): see wqbench-util.c. With --prefix redis://HOST:PORT/ the
 *   caller's server is used instead and nothing is started.
 *
 * PINNING
 *   With two or more CPUs allowed, the server is pinned to the first
 *   allowed CPU and wqbench itself (so every worker it forks, and every
 *   thread libwq starts) to the others; on 2 CPUs that is one each, so
 *   every round trip crosses CPUs, for libwq and for the baseline alike.
 *   The table's "# engine redis" line (the JSON "engine" line) says what
 *   was done. With one CPU, or with --prefix, nothing is pinned.
 *
 * BASELINE "lua3"
 *   The smallest client-go-like queue on Redis: three Lua scripts loaded
 *   with SCRIPT LOAD and run with EVALSHA through hiredis, one round trip
 *   per operation, over three keys with one hash tag: lua3:{NAME}:d (the
 *   dirty set), :p (the processing set) and :q (the FIFO list).
 *     add   SADD d k; if k was new and is not in p: RPUSH q k
 *     get   LPOP q; SREM d k; SADD p k      (nil when empty: never blocks)
 *     done  SREM p k; if k is in d: RPUSH q k
 *   No delays, rate limits, leases, fencing, metrics or blocking get: what
 *   libwq does beyond this is the gap between the rows.
 *
 * WORKLOADS (variant "lua3": the baseline; "redis...": libwq through wq.h)
 *   cycle     one process, one key live at a time, distinct keys, as in
 *             wqbench-queue.c: lua3 (add, get, done: 3 round trips),
 *             redis (wq_add, wq_get, wq_done), redis-done_get (wq_add,
 *             wq_done_get). cycles/s; vs_lua3 = median / lua3's median.
 *   add_many  n distinct new keys, in batches of 64, into an empty queue
 *             (made afresh before each repetition, untimed): lua3 pipelines
 *             64 EVALSHA adds (redisAppendCommandArgv, then the 64
 *             replies), redis calls wq_add_many with 64 keys. keys/s; each
 *             repetition is checked to leave n keys queued.
 *   drain     1 and 2 consumer processes empty a queue of n keys
 *             (wqbench-mp.c's drain), then a pool of 1 and 2 workers
 *             (wq_run_workers) reconciles n keys.
 *   mpmc      producers and consumers on 1000 hot keys (wqbench-mp.c's
 *             mpmc): flat out, and paced at 2,000 adds/s for the latency
 *             of a queue that is not saturated.
 *   durable   lua3's cycle on a server of its own that writes an AOF:
 *             lua3-aof-always (appendfsync always: every write fsync'ed
 *             before its reply, so 3 per cycle) and lua3-aof-everysec;
 *             the peers of the shared-memory `durable` rows (FSYNC and
 *             PROCESS). Its directory is kept while it runs. Not with
 *             --prefix.
 *   Sizes are a few hundredths of the shared-memory ones: a round trip
 *   costs tens of microseconds, not tens of nanoseconds.
 *
 * When wq_open of a redis:// queue fails (a libwq without the engine, say
 * an older libwq.so), each libwq row says "libwq redis: wq_open: ..."
 * (wqb_skip_open) and the baseline rows still run.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis.h>

#include "wqbench.h"

#define NOINLINE __attribute__((noinline))

#ifndef WQB_REDIS_SERVER
#define WQB_REDIS_SERVER ""   /* configure's $(REDIS_SERVER) */
#endif

#define BATCH 64
#define START_TRIES 5          /* a free port can be taken before the server binds it */
#define START_NS (10ull * 1000 * 1000 * 1000)
#define CMD_TIMEOUT_S 10       /* any one reply */

static struct {
    char host[128];
    int port;
    char user[64], pass[128];   /* AUTH, from --prefix only */
    char dir[WQB_DIR_LEN];      /* our server's directory until it answers */
    int log_fd;                 /* memfd: our server's stdout and log */
    char bin[256];
    pid_t pid;                  /* our server, 0 for --prefix */
    char version[32];
    int server_cpu;             /* -1: not pinned */
    char client_cpus[128];
    cpu_set_t saved;            /* wqbench's affinity before pinning */
    bool pinned;
} srv = { .server_cpu = -1, .log_fd = -1 };

static unsigned lua3_seq;
static const char *srv_aof;   /* our server's appendfsync policy; NULL: no AOF */

/* ------------------------------------------------------------------ */
/* hiredis                                                             */
/* ------------------------------------------------------------------ */

static redisReply *reply_check(redisContext *ctx, redisReply *r, const char *what)
{
    if (!r && ctx->err == REDIS_ERR_IO && strcmp(ctx->errstr, strerror(EAGAIN)) == 0)
        wqb_die("redis %s:%d: %s: no reply within %d s", srv.host, srv.port, what,
                CMD_TIMEOUT_S);
    if (!r)
        wqb_die("redis %s:%d: %s: %s", srv.host, srv.port, what,
                ctx->errstr[0] ? ctx->errstr : "no reply");
    if (r->type == REDIS_REPLY_ERROR)
        wqb_die("redis %s:%d: %s: %s", srv.host, srv.port, what, r->str);
    return r;
}

static redisReply *command(redisContext *ctx, const char *what, int argc, const char **argv)
{
    return reply_check(ctx, redisCommandArgv(ctx, argc, argv, NULL), what);
}

/* A connection; NULL with why filled in (at most 0.2 s when `probe`). */
static redisContext *server_connect(bool probe, char *why, size_t cap)
{
    struct timeval tv = { probe ? 0 : 5, probe ? 200 * 1000 : 0 };
    redisContext *ctx = redisConnectWithTimeout(srv.host, srv.port, tv);
    if (!ctx || ctx->err) {
        snprintf(why, cap, "%s", ctx ? ctx->errstr : "out of memory");
        redisFree(ctx);
        return NULL;
    }
    tv = (struct timeval){ CMD_TIMEOUT_S, 0 };
    redisSetTimeout(ctx, tv);
    return ctx;
}

static redisContext *server_open(void)
{
    char why[128];
    redisContext *ctx = server_connect(false, why, sizeof why);
    if (!ctx)
        wqb_die("redis %s:%d: %s", srv.host, srv.port, why);
    if (srv.pass[0]) {   /* AUTH [user] password */
        const char *auth[] = { "AUTH", srv.user, srv.pass };
        if (srv.user[0])
            freeReplyObject(command(ctx, "AUTH", 3, auth));
        else
            freeReplyObject(command(ctx, "AUTH", 2, (const char *[]){ "AUTH", srv.pass }));
    }
    return ctx;
}

/* INFO server's redis_version. */
static void server_version(redisContext *ctx)
{
    const char *argv[] = { "INFO", "server" };
    redisReply *r = command(ctx, "INFO", 2, argv);
    const char *v = r->type == REDIS_REPLY_STRING ? strstr(r->str, "redis_version:") : NULL;
    snprintf(srv.version, sizeof srv.version, "?");
    if (v) {
        v += strlen("redis_version:");
        snprintf(srv.version, sizeof srv.version, "%.*s", (int)strcspn(v, "\r\n"), v);
    }
    freeReplyObject(r);
}

/* ------------------------------------------------------------------ */
/* The server: ours, or the caller's (--prefix)                        */
/* ------------------------------------------------------------------ */

/* redis://[[user]:password@]host[:port]/[name prefix] */
static int parse_prefix(const char *prefix)
{
    const char *a = prefix + strlen("redis://");
    const char *slash = strchr(a, '/'), *at = NULL;
    for (const char *p = a; p < slash; p++)
        if (*p == '@')
            at = p;
    if (at) {
        const char *colon = memchr(a, ':', (size_t)(at - a));
        if (!colon)
            colon = a - 1;   /* password only */
        if ((size_t)(colon - a + 1) > sizeof srv.user ||
            (size_t)(at - colon) > sizeof srv.pass)
            return -1;
        if (colon >= a)
            snprintf(srv.user, sizeof srv.user, "%.*s", (int)(colon - a), a);
        snprintf(srv.pass, sizeof srv.pass, "%.*s", (int)(at - colon - 1), colon + 1);
        a = at + 1;
    }
    const char *hend = slash, *port = NULL;
    if (*a == '[') {   /* [v6 address] */
        const char *close = memchr(a, ']', (size_t)(slash - a));
        if (!close)
            return -1;
        port = close + 1 < slash && close[1] == ':' ? close + 2 : NULL;
        hend = close;
        a++;
    } else {
        const char *colon = memchr(a, ':', (size_t)(slash - a));
        if (colon) {
            hend = colon;
            port = colon + 1;
        }
    }
    if (hend == a || (size_t)(hend - a) >= sizeof srv.host)
        return -1;
    snprintf(srv.host, sizeof srv.host, "%.*s", (int)(hend - a), a);
    srv.port = 6379;
    if (port) {
        char *end;
        long v = strtol(port, &end, 10);
        if (end != slash || v <= 0 || v > 65535)
            return -1;
        srv.port = (int)v;
    }
    return 0;
}

/* A loopback port nobody listens on now (the server may still lose it). */
static int free_port(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        wqb_die("socket: %s", strerror(errno));
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) < 0)
        wqb_die("a free loopback port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

static void server_binary(void)
{
    const char *env = getenv("WQBENCH_REDIS_SERVER");
    if (env && *env)
        snprintf(srv.bin, sizeof srv.bin, "%s", env);
    else if (WQB_REDIS_SERVER[0] && access(WQB_REDIS_SERVER, X_OK) == 0)
        snprintf(srv.bin, sizeof srv.bin, "%s", WQB_REDIS_SERVER);
    else
        snprintf(srv.bin, sizeof srv.bin, "redis-server");
}

/*
 * Server CPU: the first one allowed. Clients: the others (split, the
 * default; nothing is pinned with fewer than 2 CPUs), or the server's
 * (same). none: nothing is pinned.
 */
static void pin_plan(const char *mode)
{
    cpu_set_t *s = &srv.saved;
    bool same = mode && strcmp(mode, "same") == 0;
    srv.server_cpu = -1;
    srv.client_cpus[0] = 0;
    if ((mode && strcmp(mode, "none") == 0) || sched_getaffinity(0, sizeof *s, s) < 0 ||
        CPU_COUNT(s) < (same ? 1 : 2))
        return;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, s))
            continue;
        if (srv.server_cpu < 0)
            srv.server_cpu = cpu;
        if (cpu == srv.server_cpu && !same)
            continue;
        size_t l = strlen(srv.client_cpus);
        snprintf(srv.client_cpus + l, sizeof srv.client_cpus - l, "%s%d", l ? "," : "", cpu);
        if (same)
            break;
    }
}

static void pin_clients(void)
{
    cpu_set_t s;
    if (srv.server_cpu < 0)
        return;
    CPU_ZERO(&s);
    for (const char *p = srv.client_cpus; *p; p += strcspn(p, ","), p += *p == ',')
        CPU_SET(atoi(p), &s);
    if (sched_setaffinity(0, sizeof s, &s) < 0)
        wqb_die("sched_setaffinity (clients): %s", strerror(errno));
    srv.pinned = true;
}

static pid_t server_spawn(void)
{
    char port[16];
    pid_t parent = getpid();
    snprintf(port, sizeof port, "%d", srv.port);
    const char *argv[] = { srv.bin, "--bind", "127.0.0.1", "--port", port, "--dir", srv.dir,
                           "--logfile", "", "--save", "", "--daemonize", "no",
                           "--appendonly", srv_aof ? "yes" : "no",
                           srv_aof ? "--appendfsync" : NULL, srv_aof, NULL };
    if (srv.log_fd >= 0)
        close(srv.log_fd);
    srv.log_fd = memfd_create("wqbench-redis-log", MFD_CLOEXEC);
    if (srv.log_fd < 0)
        wqb_die("memfd_create: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        wqb_die("fork: %s", strerror(errno));
    if (pid > 0) {
        wqb_register_server(pid);
        return pid;
    }
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    if (srv.server_cpu >= 0) {
        cpu_set_t s;
        CPU_ZERO(&s);
        CPU_SET(srv.server_cpu, &s);
        if (sched_setaffinity(0, sizeof s, &s) < 0)
            _exit(126);
    }
    int nul = open("/dev/null", O_RDONLY);
    if (nul < 0 || dup2(nul, 0) < 0 || dup2(srv.log_fd, 1) < 0 || dup2(srv.log_fd, 2) < 0)
        _exit(126);
    signal(SIGPIPE, SIG_DFL);
    execvp(srv.bin, (char *const *)argv);
    dprintf(2, "exec %s: %s\n", srv.bin, strerror(errno));
    _exit(127);
}

/* Wait until the server answers PING (10 s). 0, or -1 if it exited
   (*status: how). */
static int server_await(pid_t pid, int *status)
{
    uint64_t limit = wqb_now() + START_NS;
    char why[128] = "";
    for (;;) {
        if (waitpid(pid, status, WNOHANG) == pid) {
            wqb_register_server(0);
            return -1;
        }
        redisContext *ctx = server_connect(true, why, sizeof why);
        if (ctx) {
            const char *ping[] = { "PING" };
            redisReply *r = redisCommandArgv(ctx, 1, ping, NULL);
            bool ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
            freeReplyObject(r);
            if (ok) {
                server_version(ctx);
                redisFree(ctx);
                return 0;
            }
            redisFree(ctx);
        }
        if (wqb_now() > limit)
            wqb_die("%s on 127.0.0.1:%d did not answer within 10 s (%s)", srv.bin, srv.port,
                    why);
        wqb_sleep_ns(10 * 1000 * 1000);
    }
}

/* The end of the server's output (its log), on stderr. */
static void server_tell(void)
{
    char buf[2048];
    off_t end = srv.log_fd >= 0 ? lseek(srv.log_fd, 0, SEEK_END) : -1;
    off_t from = end > (off_t)sizeof buf - 1 ? end - (off_t)sizeof buf + 1 : 0;
    ssize_t n = end > 0 ? pread(srv.log_fd, buf, sizeof buf - 1, from) : -1;
    if (n <= 0)
        return;
    buf[n] = 0;
    for (char *save = NULL, *line = strtok_r(buf, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save))
        fprintf(stderr, "  redis-server: %s\n", line);
}

static int server_start(const char *pin)
{
    server_binary();
    snprintf(srv.host, sizeof srv.host, "127.0.0.1");
    int rc = wqb_temp_dir("redis", srv.dir);
    if (rc < 0)
        wqb_die("mkdtemp %s: %s", srv.dir, strerror(-rc));
    pin_plan(pin);
    for (int t = 0, st = 0; t < START_TRIES; t++) {
        if (WIFEXITED(st) && WEXITSTATUS(st) >= 126)   /* could not run it */
            break;
        srv.port = free_port();
        srv.pid = server_spawn();
        if (server_await(srv.pid, &st) == 0) {
            /* Without AOF it writes nothing there (its log is a memfd):
               remove the directory now, so that not even a SIGKILLed
               wqbench leaves it behind; the server keeps a working
               directory nobody can find. Its AOF needs one: removed when
               the server is stopped. */
            if (!srv_aof) {
                wqb_unregister_path(srv.dir);
                srv.dir[0] = 0;
            }
            return 0;
        }
        srv.pid = 0;
    }
    fprintf(stderr, "wqbench: --engine redis: %s did not start; its output:\n", srv.bin);
    server_tell();
    fprintf(stderr, "wqbench: set WQBENCH_REDIS_SERVER to a redis-server, or use "
                    "--prefix redis://HOST:PORT/ with a running one\n");
    wqb_unregister_path(srv.dir);
    srv.dir[0] = 0;
    return -1;
}

/*
 * Start (or reach) the server, pin, and set the queue name prefix.
 * 0, or -1 with the reason on stderr.
 */
int wqb_redis_start(const struct wqb_cfg *c)
{
    char prefix[160];
    signal(SIGPIPE, SIG_IGN);   /* a dead server is an error, not a kill */
    if (c->prefix) {
        if (parse_prefix(c->prefix) < 0) {
            fprintf(stderr, "wqbench: --prefix %s: not redis://[[USER]:PASS@]HOST[:PORT]/\n",
                    c->prefix);
            return -1;
        }
        redisContext *ctx = server_open();
        server_version(ctx);
        redisFree(ctx);
        wqb_set_prefix(c->prefix);
        return 0;
    }
    if (server_start(c->pin) < 0)
        return -1;
    pin_clients();
    snprintf(prefix, sizeof prefix, "redis://127.0.0.1:%d/", srv.port);
    wqb_set_prefix(prefix);
    return 0;
}

/* Where the server runs and who is pinned where: a table comment, or one
   JSON line {"engine":"redis",...}. */
void wqb_redis_describe(const struct wqb_cfg *c)
{
    if (!c->table) {
        printf("{\"engine\":\"redis\",\"server\":\"%s:%d\",\"redis_version\":\"%s\","
               "\"started\":%s,\"server_cpu\":",
               srv.host, srv.port, srv.version, srv.pid > 0 ? "true" : "false");
        if (srv.server_cpu >= 0)
            printf("%d,\"client_cpus\":\"%s\"}\n", srv.server_cpu, srv.client_cpus);
        else
            printf("null,\"client_cpus\":null}\n");
    } else if (srv.pid > 0) {
        printf("# engine redis: redis-server %s (%s) on %s:%d, --save '' --appendonly no; ",
               srv.version, srv.bin, srv.host, srv.port);
        if (srv.server_cpu >= 0)
            printf("server pinned to CPU %d, wqbench and its workers to CPU %s\n",
                   srv.server_cpu, srv.client_cpus);
        else
            printf("nothing pinned%s\n", c->pin && strcmp(c->pin, "none") == 0 ? " (--pin none)"
                                                                         : " (one CPU)");
        printf("# baseline lua3: 3 Lua scripts (add, get, done), one EVALSHA round trip "
               "each, hiredis, same server\n");
    } else {
        printf("# engine redis: the caller's server %s:%d (redis %s); nothing pinned\n",
               srv.host, srv.port, srv.version);
        printf("# baseline lua3: 3 Lua scripts (add, get, done), one EVALSHA round trip "
               "each, hiredis, same server\n");
    }
    fflush(stdout);
}

/* Stop our server, remove its directory, undo the pinning. */
void wqb_redis_stop(void)
{
    if (srv.pid > 0) {
        int st = wqb_stop_server();
        if (st != -1 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0) &&
            !(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM)) {
            fprintf(stderr, "wqbench: redis-server ended with wait status 0x%x:\n", st);
            server_tell();
        }
        srv.pid = 0;
    }
    if (srv.log_fd >= 0) {
        close(srv.log_fd);
        srv.log_fd = -1;
    }
    if (srv.dir[0]) {   /* an AOF server's */
        wqb_unregister_path(srv.dir);
        srv.dir[0] = 0;
    }
    if (srv.pinned && sched_setaffinity(0, sizeof srv.saved, &srv.saved) == 0)
        srv.pinned = false;
}

/* Stop our server and start another, with AOF (appendfsync aof) or
   without (NULL), pinned as before. */
static void server_restart(const struct wqb_cfg *c, const char *aof)
{
    char prefix[160];
    wqb_redis_stop();
    srv_aof = aof;
    if (server_start(c->pin) < 0)
        wqb_die("redis-server with %s%s did not start", aof ? "appendfsync " : "no AOF",
                aof ? aof : "");
    pin_clients();
    snprintf(prefix, sizeof prefix, "redis://127.0.0.1:%d/", srv.port);
    wqb_set_prefix(prefix);
}

/* ------------------------------------------------------------------ */
/* The baseline: three Lua scripts                                     */
/* ------------------------------------------------------------------ */

enum { L_ADD, L_GET, L_DONE };

/* KEYS: dirty set, processing set, FIFO list; ARGV[1]: the key. */
static const char *const lua3_src[] = {
    [L_ADD] = "if redis.call('SADD', KEYS[1], ARGV[1]) == 1 and "
              "redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0 then "
              "redis.call('RPUSH', KEYS[3], ARGV[1]) return 1 end return 0",
    [L_GET] = "local k = redis.call('LPOP', KEYS[3]) "
              "if not k then return false end "
              "redis.call('SREM', KEYS[1], k) redis.call('SADD', KEYS[2], k) return k",
    [L_DONE] = "if redis.call('SREM', KEYS[2], ARGV[1]) == 1 and "
               "redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then "
               "redis.call('RPUSH', KEYS[3], ARGV[1]) return 1 end return 0",
};

struct lua3 {
    redisContext *ctx;
    char sha[3][41];
    char keys[3][96];   /* lua3:{wqbench.<pid>.<seq>.<tag>}:d, :p, :q */
    const char *argv[7];
    size_t len[7];
};

static void lua3_open(struct lua3 *l, const char *tag)
{
    static const char suffix[] = "dpq";
    memset(l, 0, sizeof *l);
    l->ctx = server_open();
    for (int i = 0; i < 3; i++) {
        const char *load[] = { "SCRIPT", "LOAD", lua3_src[i] };
        redisReply *r = command(l->ctx, "SCRIPT LOAD", 3, load);
        if (r->type != REDIS_REPLY_STRING || r->len != 40)
            wqb_die("lua3: SCRIPT LOAD gave no SHA1");
        memcpy(l->sha[i], r->str, 41);
        freeReplyObject(r);
        snprintf(l->keys[i], sizeof l->keys[i], "lua3:{wqbench.%d.%u.%s}:%c", (int)getpid(),
                 lua3_seq, tag, suffix[i]);
    }
    lua3_seq++;
    /* EVALSHA sha 3 dirty processing fifo [key] */
    l->argv[0] = "EVALSHA";
    l->len[0] = 7;
    l->len[1] = 40;
    l->argv[2] = "3";
    l->len[2] = 1;
    for (int i = 0; i < 3; i++) {
        l->argv[3 + i] = l->keys[i];
        l->len[3 + i] = strlen(l->keys[i]);
    }
    l->len[6] = WQB_KEY_LEN;
}

/* EVALSHA op's script; key NULL for get. */
static inline void lua3_argv(struct lua3 *l, int op, const char *key)
{
    l->argv[1] = l->sha[op];
    l->argv[6] = key;
}

static redisReply *lua3_call(struct lua3 *l, int op, const char *key)
{
    lua3_argv(l, op, key);
    return reply_check(l->ctx, redisCommandArgv(l->ctx, key ? 7 : 6, l->argv, l->len),
                       "lua3: EVALSHA");
}

/* How many of the queue's three keys exist. */
static long long lua3_exists(struct lua3 *l)
{
    const char *argv[] = { "EXISTS", l->keys[0], l->keys[1], l->keys[2] };
    redisReply *r = command(l->ctx, "EXISTS", 4, argv);
    long long n = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    return n;
}

static long long lua3_llen(struct lua3 *l)
{
    const char *argv[] = { "LLEN", l->keys[2] };
    redisReply *r = command(l->ctx, "LLEN", 2, argv);
    long long n = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    return n;
}

static void lua3_clear(struct lua3 *l)
{
    const char *argv[] = { "DEL", l->keys[0], l->keys[1], l->keys[2] };
    freeReplyObject(command(l->ctx, "DEL", 4, argv));
}

static void lua3_close(struct lua3 *l)
{
    lua3_clear(l);
    redisFree(l->ctx);
    l->ctx = NULL;
}

static void expect_int(redisReply *r, long long v, const char *what)
{
    if (r->type != REDIS_REPLY_INTEGER)
        wqb_die("lua3: %s: reply of type %d, not an integer", what, r->type);
    if (r->integer != v)
        wqb_die("lua3: %s: %lld, not %lld", what, r->integer, v);
    freeReplyObject(r);
}

/* add, get, done of one new key per iteration: three round trips. */
static NOINLINE void loop_lua3(struct lua3 *l, uint64_t first, uint64_t n)
{
    char key[WQB_KEY_LEN], buf[WQB_KEY_LEN];
    wqb_key(key, first);
    for (uint64_t i = 0; i < n; i++, wqb_key_next(key)) {
        expect_int(lua3_call(l, L_ADD, key), 1, "add of a new key");
        redisReply *r = lua3_call(l, L_GET, NULL);
        if (r->type != REDIS_REPLY_STRING || r->len != WQB_KEY_LEN ||
            memcmp(r->str, key, WQB_KEY_LEN) != 0)
            wqb_die("lua3: get did not hand out the key just added");
        memcpy(buf, r->str, WQB_KEY_LEN);
        freeReplyObject(r);
        expect_int(lua3_call(l, L_DONE, buf), 0, "done");
    }
}

/* n new keys, BATCH EVALSHA adds per write, then their replies. */
static NOINLINE void loop_lua3_pipe(struct lua3 *l, uint64_t first, uint64_t n)
{
    char key[WQB_KEY_LEN];
    wqb_key(key, first);
    lua3_argv(l, L_ADD, key);
    for (uint64_t i = 0; i < n;) {
        uint64_t b = 0;
        for (; b < BATCH && i < n; b++, i++, wqb_key_next(key))
            if (redisAppendCommandArgv(l->ctx, 7, l->argv, l->len) != REDIS_OK)
                wqb_die("lua3: redisAppendCommandArgv: %s", l->ctx->errstr);
        for (uint64_t j = 0; j < b; j++) {
            void *r = NULL;
            if (redisGetReply(l->ctx, &r) != REDIS_OK)
                r = NULL;
            expect_int(reply_check(l->ctx, r, "lua3: pipelined EVALSHA"), 1,
                       "pipelined add of a new key");
        }
    }
}

/* The baseline cycle row; its median (NaN if not selected). */
static double lua3_cycle(const struct wqb_cfg *c, const char *workload, const char *variant,
                         uint64_t n)
{
    struct lua3 l;
    struct wqb_result r;
    if (!wqb_want(c, variant))
        return NAN;
    lua3_open(&l, workload);
    wqb_result_init(&r, workload, variant, "cycles/s");
    loop_lua3(&l, 0, n < 1000 ? n : 1000);   /* warm up */
    for (int rep = 0; rep < wqb_reps(c); rep++) {
        uint64_t t0 = wqb_now();
        loop_lua3(&l, (uint64_t)rep * n, n);
        uint64_t t1 = wqb_now();
        wqb_result_add(&r, (double)n * 1e9 / (double)(t1 - t0));
    }
    if (lua3_exists(&l) != 0)   /* every set and the list are empty again */
        wqb_die("lua3: cycle left keys behind");
    lua3_close(&l);
    double median = wqb_median(r.v, r.reps);
    wqb_result_extra(&r, "n", (double)n, WQB_X_INT);
    wqb_result_extra(&r, "ns_per_cycle", 1e9 / median, WQB_X_NS);
    wqb_emit(c, &r);
    return median;
}

/* The baseline's pipelined adds row; its median (NaN if not selected). */
static double lua3_add_many(const struct wqb_cfg *c, uint64_t n)
{
    struct lua3 l;
    struct wqb_result r;
    if (!wqb_want(c, "lua3"))
        return NAN;
    lua3_open(&l, "add_many");
    wqb_result_init(&r, "add_many", "lua3", "keys/s");
    loop_lua3_pipe(&l, 0, n < 6400 ? n : 6400);   /* warm up */
    lua3_clear(&l);
    for (int rep = 0; rep < wqb_reps(c); rep++) {
        uint64_t t0 = wqb_now();
        loop_lua3_pipe(&l, (uint64_t)rep * n, n);
        uint64_t t1 = wqb_now();
        wqb_result_add(&r, (double)n * 1e9 / (double)(t1 - t0));
        if (lua3_llen(&l) != (long long)n)
            wqb_die("lua3: %llu pipelined adds did not queue %llu keys",
                    (unsigned long long)n, (unsigned long long)n);
        lua3_clear(&l);
    }
    lua3_close(&l);
    wqb_result_extra(&r, "n", (double)n, WQB_X_INT);
    wqb_result_extra(&r, "batch", BATCH, WQB_X_INT);
    wqb_emit(c, &r);
    return wqb_median(r.v, r.reps);
}

/* ------------------------------------------------------------------ */
/* libwq's add_many                                                    */
/* ------------------------------------------------------------------ */

static NOINLINE void loop_add64(wq *q, uint64_t first, uint64_t n)
{
    char keys[BATCH][WQB_KEY_LEN], key[WQB_KEY_LEN];
    struct iovec iov[BATCH];
    wqb_key(key, first);
    for (uint64_t i = 0; i < n;) {
        size_t b = 0;
        for (; b < BATCH && i < n; b++, i++, wqb_key_next(key)) {
            memcpy(keys[b], key, WQB_KEY_LEN);
            iov[b] = (struct iovec){ keys[b], WQB_KEY_LEN };
        }
        int rc = wq_add_many(q, iov, b);
        if (rc != 0)
            wqb_die("add_many: wq_add_many of new keys: %s",
                    rc < 0 ? wq_strerror(rc) : "some were coalesced");
    }
}

/* n adds into a fresh queue; keys/s, or a negative wq_open error. */
static double add64_rep(uint64_t n, bool warm_up)
{
    wq *q;
    char name[WQB_NAME_LEN];
    struct wq_options o = { .capacity = (uint32_t)n };
    int rc = wqb_open_new("add_many", &o, &q, name);
    if (rc < 0)
        return rc;
    uint64_t t0 = wqb_now();
    loop_add64(q, 0, n);
    uint64_t t1 = wqb_now();
    if (!warm_up) {
        rc = wq_len(q);
        if (rc != -ENOTSUP && rc != (int)n)
            wqb_die("add_many: wq_len says %d after %llu adds", rc, (unsigned long long)n);
    }
    wqb_queue_destroy(q, name);
    return (double)n * 1e9 / (double)(t1 - t0);
}

static void redis_add_many(const struct wqb_cfg *c, uint64_t n, double base)
{
    struct wqb_result r;
    if (!wqb_want(c, "redis"))
        return;
    double v = add64_rep(n < 6400 ? n : 6400, true);   /* warm up */
    if (v < 0) {
        wqb_skip_open(c, "add_many", "redis", (int)v);
        return;
    }
    wqb_result_init(&r, "add_many", "redis", "keys/s");
    for (int rep = 0; rep < wqb_reps(c); rep++) {
        v = add64_rep(n, false);
        if (v < 0)
            wqb_die("add_many: wq_open: %s", wq_strerror((int)v));
        wqb_result_add(&r, v);
    }
    wqb_result_extra(&r, "n", (double)n, WQB_X_INT);
    wqb_result_extra(&r, "batch", BATCH, WQB_X_INT);
    if (base > 0)
        wqb_result_extra(&r, "vs_lua3", wqb_median(r.v, r.reps) / base, WQB_X_NUM);
    wqb_emit(c, &r);
}

/* ------------------------------------------------------------------ */
/* Workloads                                                           */
/* ------------------------------------------------------------------ */

void wqb_redis_cycle(const struct wqb_cfg *c)
{
    uint64_t n = wqb_size(c, 1000, 5000);
    double base = lua3_cycle(c, "cycle", "lua3", n);
    wqb_cycle_variant(c, "redis", WQB_LOOP_MEMORY, 0, n, "vs_lua3", base);
    wqb_cycle_variant(c, "redis-done_get", WQB_LOOP_DONE_GET, 0, n, "vs_lua3", base);
}

void wqb_redis_add_many(const struct wqb_cfg *c)
{
    uint64_t n = wqb_size(c, 12800, 64000);
    double base = lua3_add_many(c, n);
    redis_add_many(c, n, base);
}

void wqb_redis_drain(const struct wqb_cfg *c)
{
    uint64_t n = wqb_size(c, 2000, 10000);
    wqb_drain_variant(c, "redis-C=1", 1, 1, 0, n);
    wqb_drain_variant(c, "redis-C=2", 2, 1, 0, n);
    wqb_pool_variant(c, "redis-pool-C=1", 1, n);
    wqb_pool_variant(c, "redis-pool-C=2", 2, n);
}

/* durable: the baseline's cycle on a server that writes an AOF, fsync'ed
   on every write (always: add, get and done each wait for one) or once a
   second (everysec); the peers of the shared-memory `durable` rows. Then
   the plain server again. Not with --prefix (the caller's server is as
   it is). */
void wqb_redis_durable(const struct wqb_cfg *c)
{
    static const char *const policy[] = { "always", "everysec" };
    if (srv.pid <= 0) {
        for (size_t i = 0; i < 2; i++) {
            char v[32];
            snprintf(v, sizeof v, "lua3-aof-%s", policy[i]);
            if (wqb_want(c, v))
                wqb_skip(c, "durable", v, "needs the server wqbench starts (not --prefix)");
        }
        return;
    }
    for (size_t i = 0; i < 2; i++) {
        char v[32];
        snprintf(v, sizeof v, "lua3-aof-%s", policy[i]);
        if (!wqb_want(c, v))
            continue;
        server_restart(c, policy[i]);
        lua3_cycle(c, "durable", v, i == 0 ? wqb_size(c, 300, 1000) : wqb_size(c, 1000, 5000));
    }
    if (srv_aof)
        server_restart(c, NULL);
}

void wqb_redis_mpmc(const struct wqb_cfg *c)
{
    uint64_t adds = wqb_size(c, 2000, 10000);
    uint64_t paced = c->mode == WQB_QUICK ? 500 : 2000;   /* 0.25 s or 1 s */
    const struct wqb_mpmc v[] = {
        { "redis-p1c1", 1, 1, adds, 0, 1, false },
        { "redis-p1c2", 1, 2, adds, 0, 1, false },
        { "redis-p2c1", 2, 1, adds, 0, 1, false },
        { "redis-p2c2", 2, 2, adds, 0, 1, false },
        { "redis-paced2k", 1, 1, paced, 500000, 1, false },
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        wqb_mpmc_variant(c, &v[i]);
}
