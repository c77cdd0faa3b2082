/*
 * test-redis-harness.c - the test harness for Redis (t.h "Redis",
 * tests/redis.sh, tests/with-redis.sh, tests/with-redis-cluster.sh), not
 * the Redis engine: nothing here opens a queue, so it runs before the
 * engine exists. Run alone it checks that everything Redis is off; under
 * a wrapper (make check: tests/redis/test-redis-harness; and
 * tests/run-redis-sh.sh, with persistence and under the cluster) that:
 *   - t_qname puts WQ_TEST_PREFIX before every name, and the prefix
 *     names the server the wrapper started;
 *   - T_SHM_ONLY skips under Redis only, T_REDIS_ONLY without it only;
 *   - t_redis_cli runs commands (quoting, several per call, error replies
 *     as text, NULL when nobody listens; -c under the cluster);
 *   - t_redis_leftovers finds and removes keys with this process's
 *     names, on every master of a cluster;
 *   - t_redis_stop / t_redis_start / t_redis_restart stop and start the
 *     wrapper's server (data kept across a clean restart and a SIGKILL
 *     when the wrapper ran it with --appendonly yes --appendfsync always,
 *     lost without persistence), and the wrapper removes a server this
 *     program started (tests/run-redis-sh.sh checks that part).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "t.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void names_carry_the_prefix(void **state)
{
    (void)state;
    const char *a = t_qname("harness");
    const char *b = t_qname("harness");
    char own[64];

    snprintf(own, sizeof own, "t%ld-harness-", (long)getpid());
    assert_string_not_equal(a, b);
    assert_int_equal(strncmp(a, t_prefix(), strlen(t_prefix())), 0);
    assert_int_equal(strncmp(a + strlen(t_prefix()), own, strlen(own)), 0);
    if (!t_redis()) {
        assert_string_equal(t_prefix(), "");
        assert_null(strstr(a, "redis://"));
        assert_int_equal(t_redis_port(), 0);
        return;
    }
    char want[64];
    snprintf(want, sizeof want, "redis://127.0.0.1:%d/", t_redis_port());
    assert_string_equal(t_prefix(), want);
    /* No /dev/shm path for a Redis name: nothing there to look at. */
    assert_false(t_shm_exists(a));
}

static void shm_only_skips_under_redis(void **state)
{
    (void)state;
    T_SHM_ONLY("checks the skip itself");
    assert_false(t_redis());
}

static void redis_only_skips_without(void **state)
{
    (void)state;
    T_REDIS_ONLY("checks the skip itself");
    assert_true(t_redis());
}

static void cli_runs_commands(void **state)
{
    (void)state;
    const char *r;

    if (!t_redis()) {
        assert_null(t_redis_cli("PING"));
        return;
    }
    r = t_redis_cli("PING");
    assert_non_null(r);
    assert_string_equal(r, "PONG");
    /* Quoting, two commands, an error reply as text. */
    r = t_redis_cli("SET \"{h}k\" \"a b\"\nGET \"{h}k\"");
    assert_non_null(r);
    assert_string_equal(r, "OK\na b");
    r = t_redis_cli("NO-SUCH-COMMAND");
    assert_non_null(r);
    assert_int_equal(strncmp(r, "ERR", 3), 0);
    r = t_redis_cli("DEL \"{h}k\"");
    assert_non_null(r);
    assert_string_equal(r, "1");
    /* A bounded DEBUG SLEEP. */
    r = t_redis_cli("DEBUG SLEEP 0.1");
    assert_non_null(r);
    assert_string_equal(r, "OK");
    /* Nobody on port 1. */
    assert_null(t_redis_cli_at(1, "PING"));
}

static void leftovers_found_and_removed(void **state)
{
    (void)state;
    char buf[512];
    const char *r;

    T_REDIS_ONLY("keys on a server");
    assert_int_equal(t_redis_leftovers(buf, sizeof buf, false), 0);
    /* Two keys with this process's names (different slots in a cluster),
       one of another process. */
    r = t_redis_cli("SET \"wq:{t%ld-a-1}:meta\" 1\nSET \"wq:{t%ld-b-2}:meta\" 1\n"
                    "SET \"wq:{t%ld0-c-1}:meta\" 1",
                    (long)getpid(), (long)getpid(), (long)getpid());
    assert_non_null(r);
    assert_int_equal(t_redis_leftovers(buf, sizeof buf, false), 2);
    assert_non_null(strstr(buf, "-a-1}"));
    assert_non_null(strstr(buf, "-b-2}"));
    assert_int_equal(t_redis_leftovers(buf, sizeof buf, true), 2);
    assert_int_equal(t_redis_leftovers(buf, sizeof buf, false), 0);
    r = t_redis_cli("DEL \"wq:{t%ld0-c-1}:meta\"", (long)getpid());
    assert_non_null(r);
    assert_string_equal(r, "1");
}

static void cluster_ports(void **state)
{
    (void)state;
    int ports[16];
    int n = t_redis_cluster_ports(ports, 16);
    const char *r;

    if (getenv("WQ_TEST_CLUSTER_PORTS") == NULL) {
        assert_int_equal(n, 0);
        return;
    }
    assert_true(n >= 3);
    assert_int_equal(ports[0], t_redis_port());
    for (int i = 0; i < n && i < 16; i++) {
        r = t_redis_cli_at(ports[i], "CLUSTER INFO");
        assert_non_null(r);
        assert_non_null(strstr(r, "cluster_state:ok"));
    }
    /* -c: keys of every slot through the first node. */
    for (int i = 0; i < 20; i++) {
        r = t_redis_cli("SET \"{s%d}x\" %d\nGET \"{s%d}x\"\nDEL \"{s%d}x\"", i, i, i, i);
        assert_non_null(r);
        char want[64];
        snprintf(want, sizeof want, "OK\n%d\n1", i);
        assert_string_equal(r, want);
    }
    /* No server to control under the cluster wrapper. */
    assert_int_not_equal(t_redis_restart(), 0);
}

/* The value of key, "" when it has none. */
static const char *get(const char *key)
{
    const char *r = t_redis_cli("GET \"%s\"", key);
    assert_non_null(r);
    return r;
}

static void server_stops_and_starts(void **state)
{
    (void)state;
    const char *r;
    int aof;

    T_REDIS_ONLY("a server to restart");
    if (getenv("WQ_TEST_CLUSTER_PORTS") != NULL)
        skip(); /* cluster_ports checks that restarts are refused */
    r = t_redis_cli("CONFIG GET appendonly");
    assert_non_null(r);
    aof = strstr(r, "yes") != NULL;
    print_message("server with%s persistence\n", aof ? "" : "out");

    /* A clean restart. */
    assert_non_null(t_redis_cli("SET {h}clean 1"));
    assert_int_equal(t_redis_restart(), 0);
    assert_string_equal(get("{h}clean"), aof ? "1" : "");
    /* A crash. */
    assert_non_null(t_redis_cli("SET {h}crash 2"));
    assert_int_equal(t_redis_stop(SIGKILL), 0);
    assert_null(t_redis_cli("PING"));
    assert_int_equal(t_redis_stop(SIGTERM), 0); /* nothing running: 0 */
    assert_int_equal(t_redis_start(), 0);
    assert_int_not_equal(t_redis_start(), 0);   /* it runs already */
    assert_string_equal(get("{h}crash"), aof ? "2" : "");
    /* Twice more, to leave a server this program started for the
       wrapper to remove. */
    assert_int_equal(t_redis_restart(), 0);
    assert_int_equal(t_redis_restart(), 0);
    assert_string_equal(get("{h}clean"), aof ? "1" : "");
    assert_non_null(t_redis_cli("DEL {h}clean {h}crash"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        T_TEST(names_carry_the_prefix),
        T_TEST(shm_only_skips_under_redis),
        T_TEST(redis_only_skips_without),
        T_TEST(cli_runs_commands),
        T_TEST(leftovers_found_and_removed),
        T_TEST(cluster_ports),
        T_TEST(server_stops_and_starts),
        T_NO_LEFTOVERS,
    };
    return T_RUN_GROUP("redis-harness", tests);
}
