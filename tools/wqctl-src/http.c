/*
 * http.c - `wqctl metrics --listen HOST:PORT`: the metrics for a
 * Prometheus scrape, over HTTP (libmicrohttpd).
 *
 * Design note. GET (or HEAD) /metrics runs one scrape (metrics_scrape
 * in metrics.c: every queue read afresh, the machine's queues listed
 * again when no names were given) and answers with its text; any other
 * path is 404, any other method on /metrics 405 with an Allow header.
 *
 * A scrape can be slow: a Redis server that stopped answering holds
 * each of its queues for up to 20 s, a big queue's wq_metrics is
 * O(capacity). So that slow scrapes never wedge the server:
 *   - libmicrohttpd runs a thread per connection (and one polling the
 *     listening socket): a slow scrape holds up its own connection only,
 *     and 404s, 405s and other scrapes are answered meanwhile;
 *   - at most MAX_SCRAPES scrapes run at once; a request finding them
 *     all busy waits up to SLOT_WAIT_S for one, then gets 503, so a
 *     scraper that keeps asking while the queues are stuck cannot pile up
 *     threads until MAX_CONNECTIONS are taken;
 *   - idle connections are closed after IDLE_TIMEOUT_S.
 *
 * A queue that cannot be read is left out of the scrape; the server says
 * so on stderr when that starts or its reason changes, and again when
 * the queue is readable again (not at every scrape, which would flood
 * the log every 15 s): `failing` remembers which queues are out.
 *
 * The socket is bound here, not by libmicrohttpd, so that a port in use
 * or an address that is not this machine's is told in the words of the
 * system, naming HOST:PORT, and so that port 0 (a free port) can be
 * read back: once the server answers, the one line
 * "http://ADDRESS:PORT/metrics" goes to standard output (flushed), for
 * scripts and tests to wait for.
 *
 * SIGINT and SIGTERM are blocked before any thread starts, so every
 * thread (libmicrohttpd's, libwq's lease threads) inherits the mask and
 * the main thread alone takes them, with sigwait: no handler, nothing
 * async-signal-unsafe. It then sets `stopping` (waiting requests get
 * 503, scrapes stop before their next queue) and stops the server,
 * which waits for the scrapes under way; if one is still stuck in a
 * queue after STOP_GRACE_S, wqctl says so and exits 0 without it (the
 * queues are crash-safe: libwq expects processes to die at any point).
 */
#include "wqctl.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

/* The handler's return type changed from int in 0.9.71. */
#if MHD_VERSION < 0x00097002
typedef int mhd_result;
#else
typedef enum MHD_Result mhd_result;
#endif

#define MAX_CONNECTIONS 64
#define IDLE_TIMEOUT_S 30
#define MAX_SCRAPES 4
#define SLOT_WAIT_S 10
#define STOP_GRACE_S 5
#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* A queue left out of the scrapes, and why (as last logged). */
struct failing {
    char *name;
    char *msg;
};

struct server {
    char **names;           /* the queues; NULL: every queue, each scrape */
    size_t n;
    struct MHD_Daemon *daemon;
    pthread_mutex_t lock;   /* guards all below */
    pthread_cond_t cond;    /* CLOCK_MONOTONIC: a slot freed, stopping,
                               stopped */
    unsigned scraping;      /* scrapes under way, <= MAX_SCRAPES */
    bool stopping;          /* a signal came: finish, start nothing */
    bool stopped;           /* MHD_stop_daemon returned */
    struct failing *failing;
    size_t nfailing, cap;
};

/* An absolute CLOCK_MONOTONIC time, seconds from now. */
static struct timespec deadline(int seconds)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += seconds;
    return t;
}

/* A scrape slot: true, or false after SLOT_WAIT_S or once stopping. */
static bool slot_get(struct server *s)
{
    struct timespec until = deadline(SLOT_WAIT_S);
    bool ok;

    pthread_mutex_lock(&s->lock);
    while (s->scraping >= MAX_SCRAPES && !s->stopping)
        if (pthread_cond_timedwait(&s->cond, &s->lock, &until) == ETIMEDOUT)
            break;
    ok = s->scraping < MAX_SCRAPES && !s->stopping;
    if (ok)
        s->scraping++;
    pthread_mutex_unlock(&s->lock);
    return ok;
}

static void slot_put(struct server *s)
{
    pthread_mutex_lock(&s->lock);
    s->scraping--;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

/*
 * One stderr line, "wqctl: queue 'NAME': ..." (NAME escaped as
 * put_text does) or "wqctl: metrics: ...", formatted first and written
 * with one call, so that lines of concurrent scrapes never interleave.
 */
static void log_line(const char *name, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void log_line(const char *name, const char *fmt, ...)
{
    char buf[1024];
    size_t off;
    va_list ap;

    if (name) {
        off = (size_t)snprintf(buf, sizeof buf, "wqctl: queue '");
        /* Room kept for the longest escape and "': ". */
        for (const char *s = name; *s && off < sizeof buf - 8; s++) {
            unsigned char c = (unsigned char)*s;

            if (c == '\\')
                off += (size_t)snprintf(buf + off, sizeof buf - off, "\\\\");
            else if (c < 0x20 || c >= 0x7f)
                off += (size_t)snprintf(buf + off, sizeof buf - off,
                                        "\\x%02x", c);
            else
                buf[off++] = (char)c;
        }
        off += (size_t)snprintf(buf + off, sizeof buf - off, "': ");
    } else {
        off = (size_t)snprintf(buf, sizeof buf, "wqctl: metrics: ");
    }
    if (off < sizeof buf) {
        va_start(ap, fmt);
        vsnprintf(buf + off, sizeof buf - off, fmt, ap);
        va_end(ap);
    }
    fprintf(stderr, "%s\n", buf);
}

static struct failing *find_failing(struct server *s, const char *name)
{
    for (size_t i = 0; i < s->nfailing; i++)
        if (strcmp(s->failing[i].name, name) == 0)
            return &s->failing[i];
    return NULL;
}

/* Remember that name is out, and why; out of memory, it is logged again
   at the next scrape, which is all that is lost. */
static void add_failing(struct server *s, const char *name, const char *msg)
{
    struct failing *f;

    if (grow((void **)&s->failing, s->nfailing, &s->cap,
             sizeof *s->failing, 8) < 0)
        return;
    f = &s->failing[s->nfailing];
    f->name = strdup(name);
    f->msg = strdup(msg);
    if (f->name && f->msg) {
        s->nfailing++;
    } else {
        free(f->name);
        free(f->msg);
    }
}

/* metrics_scrape's report: log a queue going out, coming back, or out
   for another reason; nothing while it stays as it was. Non-zero (stop
   the scrape) once stopping. */
static int report(const char *name, int err, const char *msg, void *arg)
{
    struct server *s = arg;
    struct failing *f;
    bool stop;

    pthread_mutex_lock(&s->lock);
    f = find_failing(s, name);
    if (err == 0 && f) {
        log_line(name, "readable again");
        free(f->name);
        free(f->msg);
        *f = s->failing[--s->nfailing];
    } else if (err < 0 && (!f || strcmp(f->msg, msg) != 0)) {
        log_line(name, "%s (left out of the scrapes)", msg);
        if (f) {
            char *m = strdup(msg);

            if (m) {
                free(f->msg);
                f->msg = m;
            }
        } else {
            add_failing(s, name, msg);
        }
    }
    stop = s->stopping;
    pthread_mutex_unlock(&s->lock);
    return stop;
}

/* A short plain-text answer (errors); allow: the Allow header, or NULL. */
static mhd_result reply(struct MHD_Connection *c, unsigned status,
                        const char *body, const char *allow)
{
    struct MHD_Response *r;
    mhd_result ret;

    r = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                        MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            "text/plain; charset=utf-8");
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static mhd_result handle(void *cls, struct MHD_Connection *c,
                         const char *url, const char *method,
                         const char *version, const char *upload_data,
                         size_t *upload_data_size, void **con_cls)
{
    static int started;     /* its address marks a request under way */
    struct server *s = cls;
    struct MHD_Response *r;
    mhd_result ret;
    char *text;
    size_t len;
    int err;

    (void)version;
    (void)upload_data;
    /* Refused at once, on the first call: libmicrohttpd then reads no
       body, and closes the connection if one was sent. */
    if (strcmp(url, "/metrics") != 0)
        return reply(c, MHD_HTTP_NOT_FOUND, "404 page not found\n", NULL);
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
        strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED,
                     "405 method not allowed\n", "GET, HEAD");
    /* First call: the headers only. Then any body (ignored), then the
       last call, where the answer goes. */
    if (!*con_cls) {
        *con_cls = &started;
        return MHD_YES;
    }
    if (*upload_data_size) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (!slot_get(s))
        return reply(c, MHD_HTTP_SERVICE_UNAVAILABLE,
                     "503 too many scrapes under way, or stopping\n", NULL);
    err = metrics_scrape(s->names, s->n, report, s, &text, &len);
    slot_put(s);
    if (err == -ECANCELED)
        return reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, "503 stopping\n",
                     NULL);
    if (err < 0) {
        log_line(NULL, "scrape failed: %s", err == -ENOMEM
                 ? "out of memory" : wq_strerror(err));
        return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR,
                     "500 scrape failed (see the server's stderr)\n", NULL);
    }
    /* No queue: an empty body (text is NULL then, which libmicrohttpd
       takes with a length of 0). */
    r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, CONTENT_TYPE);
    ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* libmicrohttpd's own messages (bad requests, failed sends). */
static void log_mhd(void *cls, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
static void log_mhd(void *cls, const char *fmt, va_list ap)
{
    char buf[512];
    size_t n;

    (void)cls;
    vsnprintf(buf, sizeof buf, fmt, ap);
    n = strlen(buf);
    while (n && buf[n - 1] == '\n')
        buf[--n] = '\0';
    log_line(NULL, "http: %s", buf);
}

/*
 * HOST:PORT -> host (brackets of [IPv6] removed; "" for every address)
 * and port (digits, at most 65535). false if it is not of that form.
 */
static bool split_listen(const char *spec, char *host, size_t hsize,
                         char *port, size_t psize)
{
    const char *colon = strrchr(spec, ':');
    size_t hlen, plen;

    if (!colon)
        return false;
    hlen = (size_t)(colon - spec);
    plen = strlen(colon + 1);
    if (plen == 0 || plen >= psize || plen > 5 ||
        strspn(colon + 1, "0123456789") != plen ||
        strtoul(colon + 1, NULL, 10) > 65535)
        return false;
    memcpy(port, colon + 1, plen + 1);
    if (hlen >= 2 && spec[0] == '[' && spec[hlen - 1] == ']') {
        spec++;
        hlen -= 2;
    } else if (memchr(spec, ':', hlen) || memchr(spec, '[', hlen) ||
               memchr(spec, ']', hlen)) {
        return false;   /* an IPv6 address needs its brackets */
    }
    if (hlen >= hsize)
        return false;
    memcpy(host, spec, hlen);
    host[hlen] = '\0';
    return true;
}

/*
 * A listening socket on host:port: the first of host's addresses that
 * binds; for every address (host ""), IPv6 first, made to take IPv4 too
 * where the system allows, then IPv4. -1 after saying why, naming spec.
 */
static int bind_listen(const char *spec, const char *host, const char *port)
{
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC,
        .ai_socktype = SOCK_STREAM,
        .ai_flags = AI_PASSIVE | AI_NUMERICSERV,
    };
    struct addrinfo *res, *ai;
    int one = 1, zero = 0, first_err = 0, rc, fd = -1;

    rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
    if (rc != 0) {
        log_line(NULL, "cannot listen on %s: %s", spec,
                 rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        return -1;
    }
    for (int pass = 0; pass < 2 && fd < 0; pass++) {
        for (ai = res; ai && fd < 0; ai = ai->ai_next) {
            if (!host[0] && (ai->ai_family == AF_INET6) != (pass == 0))
                continue;
            if (host[0] && pass == 1)
                break;
            fd = socket(ai->ai_family,
                        ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                        ai->ai_protocol);
            if (fd < 0) {
                first_err = first_err ? first_err : errno;
                continue;
            }
            /* A restarted server rebinds while old connections linger
               in TIME_WAIT. */
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            if (ai->ai_family == AF_INET6 && !host[0])
                setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
            if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 ||
                listen(fd, 128) < 0) {
                first_err = first_err ? first_err : errno;
                close(fd);
                fd = -1;
            }
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        log_line(NULL, "cannot listen on %s: %s", spec,
                 strerror(first_err ? first_err : EADDRNOTAVAIL));
    return fd;
}

/* "http://ADDRESS:PORT/metrics" on stdout, with the port bound. */
static int say_serving(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char h[NI_MAXHOST], p[NI_MAXSERV];
    int rc;

    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        log_line(NULL, "getsockname: %s", strerror(errno));
        return -1;
    }
    rc = getnameinfo((struct sockaddr *)&ss, sl, h, sizeof h, p, sizeof p,
                     NI_NUMERICHOST | NI_NUMERICSERV);
    if (rc != 0) {
        log_line(NULL, "getnameinfo: %s", gai_strerror(rc));
        return -1;
    }
    printf("http://%s%s%s:%s/metrics\n", ss.ss_family == AF_INET6 ? "[" : "",
           h, ss.ss_family == AF_INET6 ? "]" : "", p);
    return fflush(stdout) == 0 ? 0 : -1;
}

/* The stopping thread: MHD_stop_daemon waits for every connection's
   thread, scrapes included, for as long as they take. */
static void *stopper(void *arg)
{
    struct server *s = arg;

    MHD_stop_daemon(s->daemon);
    pthread_mutex_lock(&s->lock);
    s->stopped = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/*
 * Stop the server, giving the scrapes under way STOP_GRACE_S to end. A
 * scrape still stuck in a queue then is left behind: wqctl exits 0 at
 * once, without the clean-up that would pull memory from under it.
 */
static void stop_server(struct server *s)
{
    struct timespec until = deadline(STOP_GRACE_S);
    pthread_t t;
    bool stopped;

    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    if (pthread_create(&t, NULL, stopper, s) != 0) {
        MHD_stop_daemon(s->daemon);
        return;
    }
    pthread_mutex_lock(&s->lock);
    while (!s->stopped)
        if (pthread_cond_timedwait(&s->cond, &s->lock, &until) == ETIMEDOUT)
            break;
    stopped = s->stopped;
    pthread_mutex_unlock(&s->lock);
    if (!stopped) {
        log_line(NULL, "stopped; a scrape still reading a queue after %d s "
                 "was abandoned", STOP_GRACE_S);
        fflush(stdout);
        _exit(EXIT_OK);
    }
    pthread_join(t, NULL);
}

int metrics_listen(const char *spec, char **names, size_t n,
                   const struct command *c)
{
    struct server s = { .names = names, .n = n };
    char host[256], port[8];
    pthread_condattr_t ca;
    sigset_t stop;
    int fd, sig = 0, rc = EXIT_OK;

    if (!split_listen(spec, host, sizeof host, port, sizeof port))
        return usage_error(c, "bad value '%s' for --listen (HOST:PORT, "
                           "e.g. 127.0.0.1:9101, [::1]:9101, :9101; "
                           "port 0: any free port)", spec);
    pthread_mutex_init(&s.lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s.cond, &ca);
    pthread_condattr_destroy(&ca);
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    if ((fd = bind_listen(spec, host, port)) < 0) {
        rc = EXIT_FAIL;
        goto out;
    }
    /* libmicrohttpd owns fd from here: MHD_stop_daemon closes it. */
    s.daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION |
                                MHD_USE_INTERNAL_POLLING_THREAD |
                                MHD_USE_POLL | MHD_USE_ITC |
                                MHD_USE_ERROR_LOG,
                                0, NULL, NULL, handle, &s,
                                MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
                                MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
                                MHD_OPTION_CONNECTION_LIMIT,
                                (unsigned)MAX_CONNECTIONS,
                                MHD_OPTION_CONNECTION_TIMEOUT,
                                (unsigned)IDLE_TIMEOUT_S,
                                MHD_OPTION_END);
    if (!s.daemon) {
        log_line(NULL, "cannot start the HTTP server on %s", spec);
        close(fd);
        rc = EXIT_FAIL;
        goto out;
    }
    if (say_serving(fd) < 0)
        rc = EXIT_FAIL;             /* nobody would know where: stop */
    else
        while (sigwait(&stop, &sig) != 0)
            ;
    stop_server(&s);
out:
    for (size_t i = 0; i < s.nfailing; i++) {
        free(s.failing[i].name);
        free(s.failing[i].msg);
    }
    free(s.failing);
    pthread_cond_destroy(&s.cond);
    pthread_mutex_destroy(&s.lock);
    /* SIGINT and SIGTERM stay blocked: wqctl is about to exit with rc,
       and a second signal, pending now, must not turn that into death by
       signal. */
    return rc;
}
