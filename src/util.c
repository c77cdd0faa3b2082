/*
 * util.c - small pure helpers: key hash, header checksum, clocks, name
 * and timeout validation, fork detection, page population.
 *
 * Fork detection: a pthread_atfork child handler bumps wq__fork_gen; a
 * handle remembers the value it registered under and re-registers when it
 * differs. That costs one relaxed load per operation instead of a
 * getpid() system call.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

unsigned wq__fork_gen;   /* written by the atfork handler, read relaxed */

static void on_fork_child(void)
{
    wq_store_relaxed(&wq__fork_gen, wq_load_relaxed(&wq__fork_gen) + 1);
}

static void fork_setup(void)
{
    pthread_atfork(NULL, NULL, on_fork_child);
}

void wq__fork_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fork_setup);
}

static inline uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint64_t load32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 64x64->128 multiply folded: the mixing step of wyhash-style hashes. */
static inline uint64_t mum(uint64_t a, uint64_t b)
{
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

#define P0 0xa0761d6478bd642full
#define P1 0xe7037ed1a0b428dbull
#define P2 0x8ebc6af09c88c6e3ull

uint32_t wq__hash(uint64_t seed, const void *key, size_t len)
{
    const unsigned char *p = key;
    size_t n = len;
    uint64_t h = seed ^ P0 ^ ((uint64_t)len * P2);
    uint64_t a, b;

    while (n > 16) {
        h = mum(load64(p) ^ P1, load64(p + 8) ^ h);
        p += 16;
        n -= 16;
    }
    if (n >= 8) {
        a = load64(p);
        b = load64(p + n - 8);
    } else if (n >= 4) {
        a = load32(p);
        b = load32(p + n - 4);
    } else if (n > 0) {
        a = ((uint64_t)p[0] << 16) | ((uint64_t)p[n >> 1] << 8) | p[n - 1];
        b = 0;
    } else {
        a = b = 0;
    }
    h = mum(a ^ P1 ^ h, b ^ P2);
    h = mum(h ^ P0, (uint64_t)len ^ P1);
    return (uint32_t)(h ^ (h >> 32));
}

/* 64-bit hash of the same construction: store checksums (not a crypto
   hash; it detects damage, not forgery). */
uint64_t wq__hash64(uint64_t seed, const void *key, size_t len)
{
    const unsigned char *p = key;
    size_t n = len;
    uint64_t h = seed ^ P0 ^ ((uint64_t)len * P2);
    while (n > 16) {
        h = mum(load64(p) ^ P1, load64(p + 8) ^ h);
        p += 16;
        n -= 16;
    }
    uint64_t a = 0, b = 0;
    if (n >= 8) {
        a = load64(p);
        b = load64(p + n - 8);
    } else if (n >= 4) {
        a = load32(p);
        b = load32(p + n - 4);
    } else if (n > 0) {
        a = ((uint64_t)p[0] << 16) | ((uint64_t)p[n >> 1] << 8) | p[n - 1];
    }
    h = mum(a ^ P1 ^ h, b ^ P2);
    return mum(h ^ P0, (uint64_t)len ^ P1);
}

uint64_t wq__fnv1a(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#ifdef WQ_FAULT_INJECTION
uint64_t wq__test_clock;
#endif

uint64_t wq__clock_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t wq__now_mono(void)
{
#ifdef WQ_FAULT_INJECTION
    uint64_t fake = wq_load_relaxed(&wq__test_clock);
    if (fake)
        return fake;
#endif
    return wq__clock_mono();
}

uint64_t wq__now_real(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int wq__name_ok(const char *name)
{
    size_t n = 0;
    if (!name)
        return 0;
    for (; name[n]; n++) {
        char c = name[n];
        if (n >= WQ_MAX_NAME_LEN)
            return 0;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return n > 0;
}

/* wq__name_ok, and when the name is refused, wq_last_error says which
   rule it breaks (a queue name is also a file name in /dev/shm: hence
   the rule, which callers cannot guess from a bare -EINVAL). */
int wq__name_check(const char *name)
{
#define NAME_RULE "a name is 1 to 200 bytes of A-Z a-z 0-9 . _ -"
    _Static_assert(WQ_MAX_NAME_LEN == 200, "NAME_RULE says 200");
    if (wq__name_ok(name))
        return 0;
    if (!name) {
        wq__errf("queue name is NULL (" NAME_RULE ")");
        return -EINVAL;
    }
    size_t n = strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-");
    unsigned char c = (unsigned char)name[n];
    if (n == 0 && c == 0)
        wq__errf("queue '': invalid name: empty (" NAME_RULE ")");
    else if (c == 0)
        wq__errf("queue '%.40s...': invalid name: %zu bytes (" NAME_RULE ")", name, n);
    else if (c > 0x20 && c < 0x7f)
        wq__errf("queue '%s': invalid name: '%c' is not allowed (" NAME_RULE ")", name, c);
    else
        wq__errf("queue '%s': invalid name: byte 0x%02x is not allowed (" NAME_RULE ")", name,
                 c);
#undef NAME_RULE
    return -EINVAL;
}

/* deadline: UINT64_MAX for "forever", 0 for "do not block". */
int wq__deadline(int64_t timeout_ns, uint64_t *deadline)
{
    if (timeout_ns < -1)
        return -EINVAL;
    if (timeout_ns == -1)
        *deadline = UINT64_MAX;
    else if (timeout_ns == 0)
        *deadline = 0;
    else
        *deadline = wq__now_mono() + (uint64_t)timeout_ns;
    return 0;
}

/* The description of the last error that had more to say than its errno
   (wq_last_error): per thread, written only on error paths. Room for
   the longest there is: a store's -EBUSY and -EIDRM name the store and
   another region, each up to PATH_MAX, and then say what to do. */
static _Thread_local char detail[4096];

void wq__errf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
}

void wq__err_clear(void)
{
    detail[0] = 0;
}

const char *wq_last_error(void)
{
    return detail;
}

/* A fault per page is slow in a VM: doubling the index at 1M keys (4M
   slots) took 139 ms page by page and 42 ms populated in one call on the
   2-vCPU VM. Only an optimisation: kernels before 5.14 lack the advice,
   and the faults happen then. madvise rounds the length up itself; the
   start must be page aligned. */
void wq__mem_populate(const void *p, size_t len, int advice)
{
    if (len == 0)
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(page - 1);
    (void)madvise((void *)a, (uintptr_t)p + len - a, advice);
}
