/*
 * url.c - queue names that select the Redis engine:
 *
 *     redis://[[user]:password@]host[:port]/NAME
 *
 * host is a name, an IPv4 address or a bracketed IPv6 address; port
 * defaults to 6379; user and password may be percent-encoded (a ':' or
 * '@' in a password must be); NAME follows the usual queue-name rule.
 * Every refusal says what is wrong (wq_last_error).
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "redis.h"

#define SCHEME "redis://"

bool wq__redis_name(const char *name)
{
    return name && strncmp(name, SCHEME, sizeof SCHEME - 1) == 0;
}

static int hexval(int c)
{
    return isdigit(c) ? c - '0' : isxdigit(c) ? (tolower(c) - 'a' + 10) : -1;
}

/* Percent-decode [s, s+n) into out (cap bytes with the NUL). */
static int decode(const char *s, size_t n, char *out, size_t cap, const char *what,
                  const char *name)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            int hi = i + 2 < n ? hexval((unsigned char)s[i + 1]) : -1;
            int lo = i + 2 < n ? hexval((unsigned char)s[i + 2]) : -1;
            if (hi < 0 || lo < 0 || hi * 16 + lo == 0) {
                wq__errf("queue name '%s': bad percent-encoding in the %s", name, what);
                return -EINVAL;
            }
            c = hi * 16 + lo;
            i += 2;
        }
        if (o + 1 >= cap) {
            wq__errf("queue name '%s': the %s is longer than %zu bytes", name, what, cap - 1);
            return -EINVAL;
        }
        out[o++] = (char)c;
    }
    out[o] = 0;
    return 0;
}

int wq__redis_url(const char *name, bool queue_optional, struct rq_url *u)
{
    memset(u, 0, sizeof *u);
    if (!wq__redis_name(name))
        return -EINVAL;
    const char *p = name + sizeof SCHEME - 1;
    const char *slash = strchr(p, '/');
    const char *end = slash ? slash : p + strlen(p);
    /* userinfo: up to the last '@' before the path */
    const char *at = NULL;
    for (const char *x = p; x < end; x++)
        if (*x == '@')
            at = x;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        int rc;
        if (colon) {
            if ((rc = decode(p, (size_t)(colon - p), u->user, sizeof u->user, "user", name)) < 0 ||
                (rc = decode(colon + 1, (size_t)(at - colon - 1), u->pass, sizeof u->pass,
                             "password", name)) < 0)
                return rc;
        } else if ((rc = decode(p, (size_t)(at - p), u->pass, sizeof u->pass, "password",
                                name)) < 0) {
            return rc;   /* redis://secret@host: a password alone, as redis-cli */
        }
        p = at + 1;
    }
    const char *hs = p, *he;
    if (*p == '[') {   /* [IPv6] */
        he = memchr(p, ']', (size_t)(end - p));
        if (!he) {
            wq__errf("queue name '%s': '[' without ']' in the host", name);
            return -EINVAL;
        }
        hs = p + 1;
        p = he + 1;
    } else {
        he = p;
        while (he < end && *he != ':')
            he++;
        p = he;
    }
    size_t hl = (size_t)(he - hs);
    if (hl == 0 || hl > RQ_HOST_MAX) {
        wq__errf("queue name '%s': %s host", name, hl ? "too long a" : "no");
        return -EINVAL;
    }
    memcpy(u->addr.host, hs, hl);
    u->addr.host[hl] = 0;
    u->addr.port = 6379;
    if (p < end) {
        if (*p != ':' || p + 1 == end) {
            wq__errf("queue name '%s': expected ':port' after the host", name);
            return -EINVAL;
        }
        long port = 0;
        for (const char *x = p + 1; x < end; x++) {
            if (!isdigit((unsigned char)*x) || (port = port * 10 + (*x - '0')) > 65535) {
                port = 0;
                break;
            }
        }
        if (port <= 0) {
            wq__errf("queue name '%s': the port must be 1..65535", name);
            return -EINVAL;
        }
        u->addr.port = (int)port;
    }
    const char *q = slash ? slash + 1 : "";
    if (*q == 0 && queue_optional)
        return 0;
    if (!wq__name_ok(q)) {
        wq__errf("queue name '%s': '%s' is not a queue name ([A-Za-z0-9._-], 1 to %d bytes)",
                 name, q, WQ_MAX_NAME_LEN);
        return -EINVAL;
    }
    strcpy(u->queue, q);
    return 0;
}
