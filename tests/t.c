/*
 * t.c - the process scaffolding of t.h: names and cleanup, the watchdog,
 * the cmocka fixtures, shared memory and time, the failure board,
 * processes and teams. (t-queue.c: handles, queue helpers, stores and
 * workloads.)
 *
 * Design notes:
 *   - Everything that cleans up (names, children) belongs to the process
 *     that registered it: `owner_pid` is checked, so a forked child that
 *     reaches exit() or the watchdog by accident removes nothing.
 *   - The watchdog runs in a signal handler: it only uses kill(), unlink()
 *     and write() on data prepared beforehand (the registered paths).
 *   - The failure board lives in a MAP_SHARED mapping created by the group
 *     setup, before any fork, so children and threads write to the same
 *     one.
 *   - Under tests/with-redis.sh names carry the prefix WQ_TEST_PREFIX
 *     (redis://...): they have no /dev/shm path (paths[] is empty, the
 *     watchdog cannot reach a server from a signal handler: the wrapper
 *     removes the server with everything in it), and the leftover checks
 *     look for keys with "t<pid>-" on the server as well. The server
 *     helpers run redis-cli and redis-server with fork/exec and bounded
 *     waits, never the library: t.c calls only libwq's public API.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_timedjoin_np, setgroups */
#endif
#include "t.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define T_DEFAULT_WATCHDOG_S 30
#define T_MAX_KIDS 1024

/* ------------------------------------------------------------------ */
/* State                                                               */
/* ------------------------------------------------------------------ */

struct board {
    atomic_int nfail;
    atomic_int claimed;
    char msg[1024];
};

static struct board *board;
static pid_t owner_pid;

/* "/dev/shm/wq." + name, prepared for the signal handler ("" for a Redis
   name). */
static char paths[T_MAX_NAMES][sizeof("/dev/shm/wq.") + WQ_MAX_NAME_LEN + 1];
static char names[T_MAX_NAMES][T_MAX_PREFIX + WQ_MAX_NAME_LEN + 1];
static volatile sig_atomic_t nnames;
static unsigned name_counter;

static volatile pid_t kids[T_MAX_KIDS];
static volatile sig_atomic_t nkids;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;

static void ensure_owner(void)
{
    if (owner_pid == 0)
        owner_pid = getpid();
}

static void ensure_board(void)
{
    ensure_owner();
    if (board == NULL)
        board = t_shared_alloc(sizeof *board);
}

/* ------------------------------------------------------------------ */
/* Names                                                               */
/* ------------------------------------------------------------------ */

void t_shm_path(const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "/dev/shm/wq.%s", name);
}

int t_shm_exists(const char *name)
{
    char p[512];

    t_shm_path(name, p, sizeof p);
    return access(p, F_OK) == 0;
}

uint64_t t_shm_used(const char *name)
{
    char p[512];
    struct stat sb;

    t_shm_path(name, p, sizeof p);
    assert_int_equal(stat(p, &sb), 0);
    return (uint64_t)sb.st_blocks * 512;
}

void t_expect_no_shm_(const char *name, const char *ctx, int line)
{
    char p[512];
    DIR *d;
    struct dirent *e;

    t_shm_path(name, p, sizeof p);
    if (access(p, F_OK) == 0)
        fail_msg("line %d: %s: %s exists after a failed wq_open", line, ctx, p);
    d = opendir("/dev/shm");
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, name) != NULL) {
            closedir(d);
            fail_msg("line %d: %s: /dev/shm/%s left behind", line, ctx,
                     e->d_name);
        }
    closedir(d);
}

static void atexit_cleanup(void)
{
    t_kill_children();
    t_unlink_all();
}

const char *t_qname(const char *tag)
{
    static int atexit_done;
    char clean[96];
    size_t j = 0;

    ensure_board();
    for (size_t i = 0; tag[i] != '\0' && j < sizeof clean - 1; i++) {
        char c = tag[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
            (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')
            clean[j++] = c;
    }
    clean[j] = '\0';

    pthread_mutex_lock(&reg_lock);
    if (!atexit_done) {
        atexit(atexit_cleanup);
        atexit_done = 1;
    }
    if (nnames >= T_MAX_NAMES) {
        pthread_mutex_unlock(&reg_lock);
        t_fatal("t_qname: too many names");
    }
    int k = nnames;
    const char *prefix = t_prefix();
    snprintf(names[k], sizeof names[k], "%st%ld-%s-%u", prefix,
             (long)getpid(), clean, ++name_counter);
    if (prefix[0] == '\0')
        t_shm_path(names[k], paths[k], sizeof paths[k]);
    else
        paths[k][0] = '\0';
    nnames = k + 1;
    pthread_mutex_unlock(&reg_lock);
    return names[k];
}

void t_unlink_all(void)
{
    if (owner_pid == 0 || getpid() != owner_pid)
        return;
    pthread_mutex_lock(&reg_lock);
    for (int i = 0; i < nnames; i++) {
        int rc = wq_unlink(names[i]);
        if (paths[i][0] == '\0')
            continue; /* Redis: t_redis_leftovers checks */
        if (rc != 0 && rc != -ENOENT)
            (void)unlink(paths[i]);
        /* Whatever the library did, the object must be gone. */
        if (access(paths[i], F_OK) == 0)
            (void)unlink(paths[i]);
    }
    nnames = 0;
    pthread_mutex_unlock(&reg_lock);
}

int t_shm_leftovers(char *buf, size_t cap)
{
    char prefix[32];
    int n = 0;
    size_t used = 0;
    DIR *d;
    struct dirent *e;

    ensure_owner();
    snprintf(prefix, sizeof prefix, "t%ld-", (long)owner_pid);
    if (buf != NULL && cap > 0)
        buf[0] = '\0';
    d = opendir("/dev/shm");
    if (d == NULL)
        return 0;
    while ((e = readdir(d)) != NULL) {
        if (strstr(e->d_name, prefix) == NULL)
            continue;
        n++;
        if (buf != NULL && used + strlen(e->d_name) + 2 < cap) {
            used += (size_t)snprintf(buf + used, cap - used, "%s%s",
                                     used ? "," : "", e->d_name);
        }
    }
    closedir(d);
    return n;
}

/* ------------------------------------------------------------------ */
/* Redis                                                               */
/* ------------------------------------------------------------------ */

#define CLI_OUT_MAX 65536
#define CLI_IN_MAX 16384 /* fits a pipe's buffer: written before the fork */
#define REDIS_WAIT_MS 10000
#define REDIS_MAX_ARGS 128
#define REDIS_MAX_PIDS 64

static char cli_out[CLI_OUT_MAX];
static pid_t server_child; /* the server t_redis_start started */

static char name_prefix[T_MAX_PREFIX];
static pthread_once_t prefix_once = PTHREAD_ONCE_INIT;

static void read_prefix(void)
{
    const char *e = getenv("WQ_TEST_PREFIX");

    if (e != NULL && strlen(e) >= sizeof name_prefix) {
        fprintf(stderr, "WQ_TEST_PREFIX is longer than %d bytes\n",
                T_MAX_PREFIX - 1);
        _exit(99);
    }
    snprintf(name_prefix, sizeof name_prefix, "%s", e != NULL ? e : "");
}

const char *t_prefix(void)
{
    pthread_once(&prefix_once, read_prefix);
    return name_prefix;
}

bool t_redis(void)
{
    return t_prefix()[0] != '\0';
}

static int env_port(const char *var)
{
    const char *e = getenv(var);
    long v = e != NULL ? strtol(e, NULL, 10) : 0;

    return v > 0 && v < 65536 ? (int)v : 0;
}

int t_redis_port(void)
{
    return env_port("WQ_TEST_REDIS_PORT");
}

/* The ports listed (blank separated) in environment variable var. */
static int env_ports(const char *var, int *ports, int max)
{
    const char *e = getenv(var);
    int n = 0;

    while (e != NULL && *e != '\0') {
        char *end;
        long v = strtol(e, &end, 10);
        if (end == e)
            break;
        if (v > 0 && v < 65536) {
            if (n < max)
                ports[n] = (int)v;
            n++;
        }
        e = end;
    }
    return n;
}

int t_redis_cluster_ports(int *ports, int max)
{
    return env_ports("WQ_TEST_CLUSTER_PORTS", ports, max);
}

/* Read what is left of fd into buf[*len .. cap - 1] (the rest is dropped);
   0 at EOF, 1 when more may come. */
static int drain_fd(int fd, char *buf, size_t *len, size_t cap)
{
    char tmp[4096];
    ssize_t r = read(fd, tmp, sizeof tmp);

    if (r < 0)
        return errno == EINTR || errno == EAGAIN ? 1 : 0;
    if (r == 0)
        return 0;
    if (*len + 1 < cap) {
        size_t k = (size_t)r;
        if (k > cap - 1 - *len)
            k = cap - 1 - *len;
        memcpy(buf + *len, tmp, k);
        *len += k;
    }
    return 1;
}

/* redis-cli -h 127.0.0.1 -p port [-c] with `input` on its stdin: 0 and
   its stdout in cli_out, or -1 (reason on stderr). */
static int cli_run(int port, const char *input)
{
    const char *cli = getenv("WQ_TEST_REDIS_CLI");
    int in[2], out[2], err[2];
    char portbuf[16], errbuf[1024];
    size_t inlen = strlen(input), olen = 0, elen = 0;
    bool cluster = getenv("WQ_TEST_CLUSTER_PORTS") != NULL;
    pid_t pid;
    int st = 0, open_fds = 2, timed_out = 0;
    uint64_t deadline;

    cli_out[0] = '\0';
    if (cli == NULL || cli[0] == '\0')
        cli = "redis-cli";
    if (port <= 0) {
        fprintf(stderr, "t_redis_cli: no Redis server (not under tests/with-redis.sh)\n");
        return -1;
    }
    if (inlen + 2 > CLI_IN_MAX) {
        fprintf(stderr, "t_redis_cli: commands longer than %d bytes\n", CLI_IN_MAX);
        return -1;
    }
    snprintf(portbuf, sizeof portbuf, "%d", port);
    if (pipe2(in, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(out, O_CLOEXEC) != 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    if (pipe2(err, O_CLOEXEC) != 0) {
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        return -1;
    }
    /* The whole input before the child exists: no SIGPIPE, no deadlock. */
    if (write(in[1], input, inlen) != (ssize_t)inlen ||
        write(in[1], "\n", 1) != 1) {
        fprintf(stderr, "t_redis_cli: write: %s\n", strerror(errno));
        for (int i = 0; i < 2; i++) {
            close(in[i]);
            close(out[i]);
            close(err[i]);
        }
        return -1;
    }
    close(in[1]);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(err[1], 2);
        if (cluster)
            execlp(cli, cli, "-h", "127.0.0.1", "-p", portbuf, "-c",
                   (char *)NULL);
        else
            execlp(cli, cli, "-h", "127.0.0.1", "-p", portbuf, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        fprintf(stderr, "t_redis_cli: fork: %s\n", strerror(errno));
        close(out[0]);
        close(err[0]);
        return -1;
    }
    deadline = t_now_ns() + (uint64_t)REDIS_WAIT_MS * t_scale() * 1000000u;
    struct pollfd pf[2] = { { out[0], POLLIN, 0 }, { err[0], POLLIN, 0 } };
    while (open_fds > 0) {
        uint64_t now = t_now_ns();
        if (now >= deadline) {
            timed_out = 1;
            break;
        }
        int ms = (int)((deadline - now) / 1000000u) + 1;
        int r = poll(pf, 2, ms > 100 ? 100 : ms);
        if (r < 0 && errno != EINTR)
            break;
        if (r <= 0)
            continue;
        if (pf[0].fd >= 0 && pf[0].revents != 0 &&
            !drain_fd(out[0], cli_out, &olen, sizeof cli_out)) {
            pf[0].fd = -1;
            open_fds--;
        }
        if (pf[1].fd >= 0 && pf[1].revents != 0 &&
            !drain_fd(err[0], errbuf, &elen, sizeof errbuf)) {
            pf[1].fd = -1;
            open_fds--;
        }
    }
    close(out[0]);
    close(err[0]);
    if (timed_out)
        kill(pid, SIGKILL);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    cli_out[olen] = '\0';
    errbuf[elen] = '\0';
    /* -c: redis-cli says where it was redirected; not a reply. */
    for (char *l = cli_out; (l = strstr(l, "-> Redirected to ")) != NULL;) {
        if (l != cli_out && l[-1] != '\n') {
            l++;
            continue;
        }
        size_t ll = strcspn(l, "\n");
        ll += l[ll] == '\n';
        memmove(l, l + ll, strlen(l + ll) + 1);
        olen -= ll;
    }
    while (olen > 0 && (cli_out[olen - 1] == '\n' || cli_out[olen - 1] == '\r'))
        cli_out[--olen] = '\0';
    if (timed_out) {
        fprintf(stderr, "t_redis_cli: %s -p %d took more than %d ms: killed\n",
                cli, port, REDIS_WAIT_MS * (int)t_scale());
        return -1;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || elen > 0) {
        fprintf(stderr, "t_redis_cli: %s -p %d: %s%s(status %d)\n", cli,
                port, errbuf, elen > 0 && errbuf[elen - 1] == '\n' ? "" : " ",
                WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        return -1;
    }
    return 0;
}

__attribute__((format(printf, 2, 0)))
static const char *cli_v(int port, const char *fmt, va_list ap)
{
    char input[CLI_IN_MAX];
    int n = vsnprintf(input, sizeof input, fmt, ap);

    if (n < 0 || (size_t)n >= sizeof input) {
        fprintf(stderr, "t_redis_cli: commands longer than %zu bytes\n",
                sizeof input - 1);
        return NULL;
    }
    return cli_run(port, input) == 0 ? cli_out : NULL;
}

const char *t_redis_cli(const char *fmt, ...)
{
    va_list ap;
    const char *r;

    va_start(ap, fmt);
    r = cli_v(t_redis_port(), fmt, ap);
    va_end(ap);
    return r;
}

const char *t_redis_cli_at(int port, const char *fmt, ...)
{
    va_list ap;
    const char *r;

    va_start(ap, fmt);
    r = cli_v(port, fmt, ap);
    va_end(ap);
    return r;
}

/* The keys of one SCAN page (newline separated, in keys) that have no
   expiry: counted into *n and listed in buf; with `remove`, every key of
   the page is deleted. A key with a TTL goes by itself (the engine's
   doorbells after wq_unlink) and is no leftover. 0, or -1 when redis-cli
   failed. */
static int page_leftovers(int port, char *keys, char *buf, size_t cap,
                          size_t *used, int *n, bool remove)
{
    char *k = keys;

    while (*k != '\0') {
        /* A batch of keys that fits one redis-cli input. */
        char cmds[CLI_IN_MAX], dels[CLI_IN_MAX];
        size_t cl = 0, dl = 0;
        char *batch = k;
        int nb = 0;
        while (*k != '\0') {
            size_t kl = strcspn(k, "\n");
            if (kl == 0) {
                k++;
                continue;
            }
            if (cl + kl + 16 >= sizeof cmds)
                break;
            cl += (size_t)snprintf(cmds + cl, sizeof cmds - cl, "PTTL \"%.*s\"\n",
                                   (int)kl, k);
            dl += (size_t)snprintf(dels + dl, sizeof dels - dl, "DEL \"%.*s\"\n",
                                   (int)kl, k);
            nb++;
            k += kl;
        }
        if (nb == 0)
            break;
        const char *r = t_redis_cli_at(port, "%s", cmds);
        if (r == NULL)
            return -1;
        /* One reply per key, in order. */
        const char *line = r;
        for (char *b = batch; b < k;) {
            size_t kl = strcspn(b, "\n");
            if (kl == 0) {
                b++;
                continue;
            }
            size_t ll = strcspn(line, "\n");
            if (ll == 2 && strncmp(line, "-1", 2) == 0) { /* no expiry */
                (*n)++;
                if (buf != NULL && *used + kl + 2 < cap)
                    *used += (size_t)snprintf(buf + *used, cap - *used, "%s%.*s",
                                              *used ? "," : "", (int)kl, b);
            }
            line += ll + (line[ll] == '\n');
            b += kl;
        }
        if (remove && t_redis_cli_at(port, "%s", dels) == NULL)
            return -1;
    }
    return 0;
}

int t_redis_leftovers(char *buf, size_t cap, bool remove)
{
    int ports[32], nports, n = 0;
    size_t used = 0;

    if (buf != NULL && cap > 0)
        buf[0] = '\0';
    if (!t_redis())
        return 0;
    ensure_owner();
    nports = env_ports("WQ_TEST_CLUSTER_MASTER_PORTS", ports, 32);
    if (nports > 32)
        nports = 32;
    if (nports == 0 && (ports[0] = t_redis_port()) > 0)
        nports = 1;
    for (int i = 0; i < nports; i++) {
        char cursor[32] = "0";
        do {
            const char *r = t_redis_cli_at(ports[i],
                                           "SCAN %s MATCH *t%ld-* COUNT 1000",
                                           cursor, (long)owner_pid);
            char *keys;
            int rc;
            if (r == NULL)
                goto unreachable;
            /* The new cursor, then a key per line. */
            size_t cl = strcspn(r, "\n");
            snprintf(cursor, sizeof cursor, "%.*s", (int)cl, r);
            keys = strdup(r + cl);
            if (keys == NULL)
                t_fatal("strdup");
            rc = page_leftovers(ports[i], keys, buf, cap, &used, &n, remove);
            free(keys);
            if (rc != 0)
                goto unreachable;
        } while (strcmp(cursor, "0") != 0 && cursor[0] != '\0');
        continue;
    unreachable:
        fprintf(stderr, "warning: could not look for keys left in Redis on "
                        "port %d\n", ports[i]);
        return -1;
    }
    return n;
}

/* Whether pid runs (a zombie does not; a child of ours is reaped). */
static bool pid_alive(pid_t pid)
{
    char p[64], stat[512];
    int fd;
    ssize_t r;

    if (pid <= 0)
        return false;
    if (pid == server_child) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            server_child = 0;
            return false;
        }
    }
    if (kill(pid, 0) != 0)
        return false;
    snprintf(p, sizeof p, "/proc/%ld/stat", (long)pid);
    fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno != ENOENT;
    r = read(fd, stat, sizeof stat - 1);
    close(fd);
    if (r <= 0)
        return false;
    stat[r] = '\0';
    const char *s = strrchr(stat, ')');
    return s == NULL || s[1] == '\0' || s[2] != 'Z';
}

/* The processes whose working directory is dir (redis-server chdirs to
   its --dir): how many, their pids in pids. */
static int pids_in_dir(const char *dir, pid_t *pids, int max)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;

    if (d == NULL)
        return 0;
    while ((e = readdir(d)) != NULL && n < max) {
        char link[256], cwd[PATH_MAX];
        ssize_t r;
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end != '\0' || pid <= 0)
            continue;
        snprintf(link, sizeof link, "/proc/%ld/cwd", pid);
        r = readlink(link, cwd, sizeof cwd - 1);
        if (r <= 0)
            continue;
        cwd[r] = '\0';
        if (strcmp(cwd, dir) == 0 && pid_alive((pid_t)pid))
            pids[n++] = (pid_t)pid;
    }
    closedir(d);
    return n;
}

/* Whether the server on 127.0.0.1:port answers PING (PONG, or NOAUTH);
   one second at most. */
static bool redis_ping(int port)
{
    struct sockaddr_in a;
    struct timeval tv = { 1, 0 };
    char reply[64];
    ssize_t r;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool ok = false;

    if (fd < 0)
        return false;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        send(fd, "PING\r\n", 6, MSG_NOSIGNAL) == 6 &&
        (r = recv(fd, reply, sizeof reply - 1, 0)) > 0) {
        reply[r] = '\0';
        ok = strncmp(reply, "+PONG", 5) == 0 || strncmp(reply, "-NOAUTH", 7) == 0;
    }
    close(fd);
    return ok;
}

/* Whether anything accepts connections on 127.0.0.1:port. */
static bool port_open(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool open_ = false;

    if (fd < 0)
        return false;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    open_ = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return open_;
}

/* The server's directory and port, or NULL (reason on stderr). */
static const char *server_dir(const char *who, int *port)
{
    const char *dir = getenv("WQ_TEST_REDIS_DIR");

    *port = t_redis_port();
    if (dir == NULL || dir[0] == '\0' || *port == 0) {
        fprintf(stderr, "%s: no Redis server to control (only under "
                        "tests/with-redis.sh)\n", who);
        return NULL;
    }
    ensure_owner();
    if (getpid() != owner_pid) {
        fprintf(stderr, "%s: only in the process that runs the tests\n", who);
        return NULL;
    }
    return dir;
}

int t_redis_stop(int sig)
{
    pid_t pids[REDIS_MAX_PIDS];
    int port;
    const char *dir = server_dir("t_redis_stop", &port);

    if (dir == NULL)
        return -1;
    for (;;) {
        int n = pids_in_dir(dir, pids, REDIS_MAX_PIDS);
        uint64_t deadline = t_now_ns() +
                            (uint64_t)REDIS_WAIT_MS * t_scale() * 1000000u;
        for (int i = 0; i < n; i++)
            kill(pids[i], sig);
        while (t_now_ns() < deadline) {
            if (pids_in_dir(dir, pids, REDIS_MAX_PIDS) == 0 && !port_open(port))
                return 0;
            t_sleep_ms(10);
        }
        if (sig == SIGKILL)
            break;
        fprintf(stderr, "t_redis_stop: the server did not stop on signal %d "
                        "within %d ms: SIGKILL\n", sig,
                REDIS_WAIT_MS * (int)t_scale());
        sig = SIGKILL;
    }
    fprintf(stderr, "t_redis_stop: the server (or something else) is still "
                    "on port %d\n", port);
    return -1;
}

int t_redis_start(void)
{
    pid_t pids[REDIS_MAX_PIDS], pid;
    char path[PATH_MAX], args[8192], *argv[REDIS_MAX_ARGS + 1];
    int port, fd, outfd, nullfd, argc = 0;
    ssize_t len;
    uint64_t deadline;
    const char *dir = server_dir("t_redis_start", &port);

    if (dir == NULL)
        return -1;
    if (pids_in_dir(dir, pids, REDIS_MAX_PIDS) > 0) {
        fprintf(stderr, "t_redis_start: the server is running (pid %ld)\n",
                (long)pids[0]);
        return -1;
    }
    /* The command line the wrapper saved: arguments, NUL terminated. */
    snprintf(path, sizeof path, "%s/redis.argv", dir);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "t_redis_start: %s: %s\n", path, strerror(errno));
        return -1;
    }
    len = read(fd, args, sizeof args - 1);
    close(fd);
    if (len <= 0 || (size_t)len >= sizeof args - 1 || args[len - 1] != '\0') {
        fprintf(stderr, "t_redis_start: %s: unreadable\n", path);
        return -1;
    }
    for (ssize_t i = 0; i < len && argc < REDIS_MAX_ARGS; i += (ssize_t)strlen(args + i) + 1)
        argv[argc++] = args + i;
    argv[argc] = NULL;
    snprintf(path, sizeof path, "%s/redis.pid", dir);
    (void)unlink(path);
    snprintf(path, sizeof path, "%s/redis.out", dir);
    outfd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (outfd < 0 || nullfd < 0) {
        fprintf(stderr, "t_redis_start: %s: %s\n", path, strerror(errno));
        if (outfd >= 0)
            close(outfd);
        if (nullfd >= 0)
            close(nullfd);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        static const int sigs[] = { SIGINT, SIGQUIT, SIGHUP, SIGTERM, SIGPIPE };
        sigset_t none;
        long max = sysconf(_SC_OPEN_MAX);
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            signal(sigs[i], SIG_DFL);
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(nullfd, 0);
        dup2(outfd, 1);
        dup2(outfd, 2);
        /* Nothing of the test (connections, pipes, regions) in the server. */
        if (max < 0 || max > 65536)
            max = 65536;
        for (int i = 3; i < max; i++)
            close(i);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(outfd);
    close(nullfd);
    if (pid < 0) {
        fprintf(stderr, "t_redis_start: fork: %s\n", strerror(errno));
        return -1;
    }
    server_child = pid;
    /* Ready: the pid file holds our pid (redis writes it once it has the
       port) and PING answers (after the data is loaded). */
    snprintf(path, sizeof path, "%s/redis.pid", dir);
    deadline = t_now_ns() + (uint64_t)REDIS_WAIT_MS * t_scale() * 1000000u;
    while (t_now_ns() < deadline) {
        char pidbuf[32] = "";
        if (!pid_alive(pid)) {
            fprintf(stderr, "t_redis_start: %s exited; see %s/redis.log\n",
                    argv[0], dir);
            return -1;
        }
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t r = read(fd, pidbuf, sizeof pidbuf - 1);
            close(fd);
            pidbuf[r > 0 ? r : 0] = '\0';
        }
        if (strtol(pidbuf, NULL, 10) == (long)pid && redis_ping(port))
            return 0;
        t_sleep_ms(10);
    }
    fprintf(stderr, "t_redis_start: the server was not ready within %d ms; "
                    "see %s/redis.log\n", REDIS_WAIT_MS * (int)t_scale(), dir);
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    server_child = 0;
    return -1;
}

int t_redis_restart(void)
{
    if (t_redis_stop(SIGTERM) != 0)
        return -1;
    return t_redis_start();
}

/* ------------------------------------------------------------------ */
/* Watchdog and fatal exit                                             */
/* ------------------------------------------------------------------ */

static void write_str(const char *s)
{
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

static void emergency_cleanup(void)
{
    /* Async-signal-safe: kill, waitpid, unlink only. */
    if (getpid() != owner_pid)
        return;
    for (int i = 0; i < nkids; i++)
        if (kids[i] > 0)
            kill(kids[i], SIGKILL);
    for (int i = 0; i < nkids; i++)
        if (kids[i] > 0)
            (void)waitpid(kids[i], NULL, 0);
    nkids = 0;
    for (int i = 0; i < nnames; i++)
        if (paths[i][0] != '\0')
            (void)unlink(paths[i]);
}

static void on_alarm(int sig)
{
    (void)sig;
    write_str("\n*** watchdog: test took too long, killing children, "
              "removing queues, exiting 124\n");
    emergency_cleanup();
    _exit(124);
}

void t_watchdog(unsigned seconds)
{
    struct sigaction sa;

    ensure_owner();
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    alarm(seconds);
}

void t_fatal(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "\n*** fatal: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    if (board != NULL && atomic_load(&board->nfail) > 0)
        fprintf(stderr, "*** first recorded failure: %s\n", board->msg);
    fflush(stderr);
    emergency_cleanup();
    _exit(1);
}

/* ------------------------------------------------------------------ */
/* Fixtures                                                            */
/* ------------------------------------------------------------------ */

static void on_term(int sig)
{
    write_str("\n*** terminated by a signal: killing children, removing "
              "queues\n");
    emergency_cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

int t_group_setup(void **state)
{
    static const int sigs[] = { SIGTERM, SIGINT, SIGHUP };
    struct sigaction sa;

    (void)state;
    ensure_board();
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, NULL);
    return board == NULL ? -1 : 0;
}

int t_group_teardown(void **state)
{
    char buf[512];

    (void)state;
    alarm(0);
    t_kill_children();
    t_unlink_all();
    if (t_shm_leftovers(buf, sizeof buf) != 0) {
        fprintf(stderr, "leftovers in /dev/shm: %s\n", buf);
        return -1;
    }
    if (t_redis_leftovers(buf, sizeof buf, false) > 0) {
        fprintf(stderr, "leftovers in Redis: %s\n", buf);
        return -1;
    }
    return 0;
}

int t_setup(void **state)
{
    (void)state;
    ensure_board();
    t_failures_reset();
    t_watchdog(T_DEFAULT_WATCHDOG_S * t_scale());
    return 0;
}

int t_teardown(void **state)
{
    (void)state;
    alarm(0);
    t_kill_children();
    t_close_all();
    t_unlink_all();
    return 0;
}

void t_test_no_leftovers(void **state)
{
    char buf[1024];
    int n;

    (void)state;
    n = t_shm_leftovers(buf, sizeof buf);
    if (n != 0)
        fail_msg("%d object(s) left in /dev/shm: %s", n, buf);
    n = t_redis_leftovers(buf, sizeof buf, false);
    if (n > 0)
        fail_msg("%d key(s) left in Redis: %s", n, buf);
}

int t_final_check(void)
{
    char buf[1024];
    char prefix[32];
    DIR *d;
    struct dirent *e;
    int left = 0;

    t_kill_children();
    t_unlink_all();
    if (t_redis_leftovers(buf, sizeof buf, true) > 0) {
        fprintf(stderr, "FAIL: keys left in Redis: %s (removed them)\n", buf);
        left = 1;
    }
    if (t_shm_leftovers(buf, sizeof buf) == 0)
        return left;
    fprintf(stderr, "FAIL: objects left in /dev/shm: %s (removing them)\n",
            buf);
    snprintf(prefix, sizeof prefix, "t%ld-", (long)owner_pid);
    d = opendir("/dev/shm");
    if (d != NULL) {
        while ((e = readdir(d)) != NULL) {
            if (strstr(e->d_name, prefix) != NULL) {
                char p[512];
                snprintf(p, sizeof p, "/dev/shm/%s", e->d_name);
                (void)unlink(p);
            }
        }
        closedir(d);
    }
    return 1;
}

void t_test_filters(void)
{
    const char *filter = getenv("WQ_TEST_FILTER"); /* e.g. "test_full*" */
    const char *skip = getenv("WQ_TEST_SKIP");

    if (filter != NULL)
        cmocka_set_test_filter(filter);
    if (skip != NULL)
        cmocka_set_skip_filter(skip);
}

int t_exit_status(int failed)
{
    int left;

    t_stores_cleanup();
    left = t_final_check();
    return failed != 0 || left != 0 ? 1 : 0;
}

/* ------------------------------------------------------------------ */
/* Shared memory and time                                              */
/* ------------------------------------------------------------------ */

void *t_shared_alloc(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        t_fatal("mmap(%zu): %s", size, strerror(errno));
    return p;
}

void t_shared_free(void *p, size_t size)
{
    if (p != NULL)
        munmap(p, size);
}

unsigned t_scale(void)
{
    static unsigned scale;
    if (scale == 0) {
        const char *e = getenv("WQ_TEST_TIMEOUT_SCALE");
        const char *pre = getenv("LD_PRELOAD");
        unsigned v = 1;
        if (e != NULL && atoi(e) >= 1 && atoi(e) <= 100)
            v = (unsigned)atoi(e);
        else if (pre != NULL && strstr(pre, "vgpreload") != NULL)
            v = 10;
        scale = v;
    }
    return scale;
}

uint64_t t_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void t_sleep_ms(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

void t_atomic_max(atomic_ullong *a, unsigned long long v)
{
    unsigned long long cur = atomic_load(a);
    while (cur < v && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

int t_wait_count(atomic_int *v, int target, int ms)
{
    uint64_t deadline = t_now_ns() + (uint64_t)ms * t_scale() * 1000000u;
    while (atomic_load(v) < target) {
        if (t_now_ns() >= deadline)
            return -1;
        usleep(500);
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* Failure board                                                       */
/* ------------------------------------------------------------------ */

void t_failf(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    char msg[768];

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* Always visible on stderr, with who said it. */
    fprintf(stderr, "  [pid %ld] %s:%d: %s\n", (long)getpid(), file, line,
            msg);
    if (board == NULL)
        return;
    if (atomic_fetch_add(&board->nfail, 1) == 0 &&
        atomic_exchange(&board->claimed, 1) == 0) {
        snprintf(board->msg, sizeof board->msg, "[pid %ld] %s:%d: %s",
                 (long)getpid(), file, line, msg);
    }
}

int t_failures(void)
{
    return board == NULL ? 0 : atomic_load(&board->nfail);
}

const char *t_failure_msg(void)
{
    return board == NULL ? "" : board->msg;
}

void t_failures_reset(void)
{
    if (board == NULL)
        return;
    atomic_store(&board->nfail, 0);
    atomic_store(&board->claimed, 0);
    board->msg[0] = '\0';
}

/* ------------------------------------------------------------------ */
/* Processes                                                           */
/* ------------------------------------------------------------------ */

static void forget_kid(pid_t pid)
{
    pthread_mutex_lock(&reg_lock);
    for (int i = 0; i < nkids; i++) {
        if (kids[i] == pid) {
            kids[i] = kids[nkids - 1];
            nkids = nkids - 1;
            break;
        }
    }
    pthread_mutex_unlock(&reg_lock);
}

pid_t t_fork(unsigned alarm_s)
{
    pid_t pid;

    ensure_board();
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        t_fatal("fork: %s", strerror(errno));
    if (pid == 0) {
        static const int sigs[] = { SIGSEGV, SIGILL, SIGFPE, SIGBUS,
                                    SIGSYS, SIGABRT, SIGALRM, SIGTERM,
                                    SIGINT, SIGHUP };
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            signal(sigs[i], SIG_DFL);
        nkids = 0;
        alarm(alarm_s * t_scale());
        return 0;
    }
    pthread_mutex_lock(&reg_lock);
    if (nkids < T_MAX_KIDS) {
        kids[nkids] = pid;
        nkids = nkids + 1;
    }
    pthread_mutex_unlock(&reg_lock);
    return pid;
}

void t_wait_stopped(pid_t pid, const char *who, const char *point)
{
    uint64_t deadline = t_now_ns() + 15000ull * t_scale() * 1000000u;
    while (t_now_ns() < deadline) {
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)pid, &si, WSTOPPED | WEXITED | WNOHANG | WNOWAIT) == 0 &&
            si.si_pid == pid) {
            if (si.si_code != CLD_STOPPED)
                fail_msg("%s ended (code %d, status %d) instead of stopping at %s", who,
                         si.si_code, si.si_status, point);
            return;
        }
        t_sleep_ms(1);
    }
    fail_msg("%s did not stop at %s within 15 s", who, point);
}

int t_wait(pid_t pid, int timeout_ms)
{
    uint64_t deadline = t_now_ns() +
                        (uint64_t)timeout_ms * t_scale() * 1000000u;
    int st;

    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR) {
            forget_kid(pid);
            return -1;
        }
        if (t_now_ns() >= deadline) {
            fprintf(stderr, "  child %ld did not exit within %d ms: SIGKILL\n",
                    (long)pid, timeout_ms);
            kill(pid, SIGKILL);
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
            forget_kid(pid);
            return -1;
        }
        t_sleep_ms(1);
    }
    forget_kid(pid);
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return -1;
}

void t_kill_children(void)
{
    if (owner_pid == 0 || getpid() != owner_pid)
        return;
    pthread_mutex_lock(&reg_lock);
    for (int i = 0; i < nkids; i++)
        if (kids[i] > 0)
            kill(kids[i], SIGKILL);
    for (int i = 0; i < nkids; i++)
        if (kids[i] > 0)
            while (waitpid(kids[i], NULL, 0) < 0 && errno == EINTR)
                ;
    nkids = 0;
    pthread_mutex_unlock(&reg_lock);
}

int t_drop_to(uid_t uid)
{
    if (setgroups(0, NULL) != 0 || setgid(uid) != 0 || setuid(uid) != 0 ||
        getuid() != uid || geteuid() != uid)
        return -1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Teams                                                               */
/* ------------------------------------------------------------------ */

struct t_team {
    enum t_mode mode;
    int n;
    t_actor_fn fn;
    struct t_actor *actors;
    pthread_t *threads;
    int *started;
    int *rc;
    pid_t *pids;
    unsigned alarm_s;
};

struct thread_start {
    struct t_team *t;
    int i;
};

const char *t_mode_name(enum t_mode m)
{
    switch (m) {
    case T_THREADS_SHARED: return "threads/shared-handle";
    case T_THREADS_OWN:    return "threads/own-handle";
    case T_PROCS_OPEN:     return "processes/own-open";
    case T_PROCS_INHERIT:  return "processes/inherited-handle";
    default:                return "?";
    }
}

static int run_actor(struct t_team *t, int i)
{
    struct t_actor *a = &t->actors[i];
    int own = t->mode == T_THREADS_OWN || t->mode == T_PROCS_OPEN;
    int rc;

    if (own) {
        wq *q = NULL;
        int orc = wq_open(a->qname, NULL, &q);
        if (orc != 0) {
            t_failf(__FILE__, __LINE__, "actor %d: wq_open(%s) = %d (%s)",
                     i, a->qname, orc, wq_strerror(orc));
            return 1;
        }
        a->q = q;
    }
    rc = t->fn(a);
    if (own || t->mode == T_PROCS_INHERIT)
        wq_close(a->q);
    return rc;
}

static void *thread_main(void *p)
{
    struct thread_start *s = p;
    s->t->rc[s->i] = run_actor(s->t, s->i);
    free(s);
    return NULL;
}

struct t_team *t_team_start(enum t_mode mode, const char *qname, wq *mainq,
                              int n, t_actor_fn fn, void *arg)
{
    struct t_team *t = calloc(1, sizeof *t);

    if (t == NULL)
        t_fatal("calloc");
    t->mode = mode;
    t->n = n;
    t->fn = fn;
    t->actors = calloc((size_t)n, sizeof *t->actors);
    t->threads = calloc((size_t)n, sizeof *t->threads);
    t->started = calloc((size_t)n, sizeof *t->started);
    t->rc = calloc((size_t)n, sizeof *t->rc);
    t->pids = calloc((size_t)n, sizeof *t->pids);
    t->alarm_s = 25 * t_scale();
    if (!t->actors || !t->threads || !t->started || !t->rc || !t->pids)
        t_fatal("calloc");
    for (int i = 0; i < n; i++) {
        struct t_actor *a = &t->actors[i];
        a->id = i;
        a->n = n;
        a->mode = mode;
        a->q = (mode == T_THREADS_SHARED || mode == T_PROCS_INHERIT) ? mainq
                                                                       : NULL;
        a->qname = qname;
        a->arg = arg;
    }
    for (int i = 0; i < n; i++) {
        if (T_MODE_IS_PROC(mode)) {
            pid_t pid = t_fork(t->alarm_s);
            if (pid == 0) {
                int rc = run_actor(t, i);
                _exit(rc == 0 ? 0 : 1);
            }
            t->pids[i] = pid;
            t->started[i] = 1;
        } else {
            struct thread_start *s = malloc(sizeof *s);
            int e;
            if (s == NULL)
                t_fatal("malloc");
            s->t = t;
            s->i = i;
            e = pthread_create(&t->threads[i], NULL, thread_main, s);
            if (e != 0)
                t_fatal("pthread_create: %s", strerror(e));
            t->started[i] = 1;
        }
    }
    return t;
}

int t_team_wait(struct t_team *t, int timeout_ms)
{
    uint64_t deadline = t_now_ns() +
                        (uint64_t)timeout_ms * t_scale() * 1000000u;
    int failed = 0;

    for (int i = 0; i < t->n; i++) {
        if (!t->started[i])
            continue;
        int64_t left_ms = (int64_t)(deadline - t_now_ns()) / 1000000;
        if ((int64_t)(deadline - t_now_ns()) < 0)
            left_ms = 0;
        if (T_MODE_IS_PROC(t->mode)) {
            /* t_wait scales its timeout; left_ms is already scaled. */
            int rc = t_wait(t->pids[i], (int)(left_ms / t_scale()) + 1);
            if (rc != 0) {
                t_failf(__FILE__, __LINE__,
                         "%s actor %d (pid %ld): %s %d",
                         t_mode_name(t->mode), i, (long)t->pids[i],
                         rc < 0 ? "timed out, killed," :
                         rc > 128 ? "killed by signal" : "exit code",
                         rc > 128 ? rc - 128 : rc);
                failed++;
            }
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += left_ms / 1000;
            ts.tv_nsec += (left_ms % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            int e = pthread_timedjoin_np(t->threads[i], NULL, &ts);
            if (e != 0)
                t_fatal("%s actor %d did not finish within %d ms (%s)",
                         t_mode_name(t->mode), i, timeout_ms, strerror(e));
            if (t->rc[i] != 0)
                failed++;
        }
    }
    free(t->actors);
    free(t->threads);
    free(t->started);
    free(t->rc);
    free(t->pids);
    free(t);
    return failed;
}
