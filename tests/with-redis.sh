#!/bin/bash
# with-redis.sh PROGRAM [ARGS...] - run a test program against its own
# redis-server (tests/redis.sh starts it on a free loopback port in a
# temporary directory, and stops it and removes the directory whatever
# happens to the program).
#
# The program sees
#   WQ_TEST_PREFIX      redis://127.0.0.1:PORT/ - t.c puts it before every
#                       queue name (t_qname), so the program's queues are
#                       Redis queues
#   WQ_TEST_REDIS_PORT  the port
#   WQ_TEST_REDIS_DIR   the server's directory: redis.argv (the command
#                       line, NUL separated), redis.pid, redis.log; t.c's
#                       t_redis_restart uses them
#   WQ_TEST_REDIS_CMD   the command line, shell quoted (for people)
#   WQ_TEST_REDIS_CLI   redis-cli
# Extra arguments for redis-server: WQ_TEST_REDIS_ARGS (split on blanks),
# e.g. "--appendonly yes --appendfsync always".
#
# Exit status: the program's (77: skipped stays skipped); 77 when libwq
# was built without the Redis engine (no WQ_HAVE_REDIS in
# $top_builddir/config.h), or there is no redis-server or redis-cli, or
# the program was not built (no cmocka); 99 when the server could not be
# started.
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 PROGRAM [ARGS...]" >&2
    exit 99
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prog=$1
shift

config=${top_builddir:-.}/config.h
if [ ! -f "$config" ]; then
    config=$(dirname "$prog")/../config.h
fi
if ! grep -qs '^#define WQ_HAVE_REDIS 1' "$config"; then
    echo "SKIP: libwq was built without the Redis engine (no WQ_HAVE_REDIS in $config)"
    exit 77
fi
for tool in "${REDIS_SERVER:-redis-server}" "${REDIS_CLI:-redis-cli}"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "SKIP: $tool not found"
        exit 77
    fi
done
if [ ! -x "$prog" ]; then
    echo "SKIP: $prog was not built"
    exit 77
fi

. "$here/redis.sh"

# shellcheck disable=SC2086 # WQ_TEST_REDIS_ARGS is a list of words
if ! redis_start ${WQ_TEST_REDIS_ARGS:-}; then
    echo "ERROR: could not start redis-server"
    exit 99
fi
export WQ_TEST_PREFIX="redis://127.0.0.1:$REDIS_PORT/"
export WQ_TEST_REDIS_PORT=$REDIS_PORT WQ_TEST_REDIS_DIR=$REDIS_DIR
export WQ_TEST_REDIS_CMD=$REDIS_CMD WQ_TEST_REDIS_CLI=$REDIS_CLI
unset WQ_TEST_CLUSTER_PORTS WQ_TEST_CLUSTER_MASTER_PORTS
echo "with-redis: redis-server on port $REDIS_PORT (pid $REDIS_PID, $REDIS_DIR)"

rc=0
redis_run "$prog" "$@" || rc=$?
redis_stop || true
exit "$rc"
