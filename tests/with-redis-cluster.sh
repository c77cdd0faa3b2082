#!/bin/bash
# with-redis-cluster.sh PROGRAM [ARGS...] - run a test program against
# its own Redis Cluster: three masters (WQ_TEST_CLUSTER_MASTERS) with no
# replicas (WQ_TEST_CLUSTER_REPLICAS) on free loopback ports, in one
# temporary directory (tests/redis.sh), stopped and removed at the end
# whatever happens to the program.
#
# The program sees
#   WQ_TEST_PREFIX                redis://127.0.0.1:PORT/, PORT the first
#                                 master (t_qname puts it before names)
#   WQ_TEST_REDIS_PORT            that port (t_redis_cli talks to it, -c)
#   WQ_TEST_CLUSTER_PORTS         every node's port, masters first
#   WQ_TEST_CLUSTER_MASTER_PORTS  the masters' ports
#   WQ_TEST_REDIS_CLI             redis-cli
# (no WQ_TEST_REDIS_DIR: t_redis_restart is for a single server).
#
# Exit status as tests/with-redis.sh.
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
if ! redis_cluster_start "${WQ_TEST_CLUSTER_MASTERS:-3}" "${WQ_TEST_CLUSTER_REPLICAS:-0}" \
    ${WQ_TEST_REDIS_ARGS:-}; then
    echo "ERROR: could not start the Redis Cluster"
    exit 99
fi
first=${REDIS_CLUSTER_MASTER_PORTS%% *}
export WQ_TEST_PREFIX="redis://127.0.0.1:$first/"
export WQ_TEST_REDIS_PORT=$first WQ_TEST_REDIS_CLI=$REDIS_CLI
export WQ_TEST_CLUSTER_PORTS=$REDIS_CLUSTER_PORTS
export WQ_TEST_CLUSTER_MASTER_PORTS=$REDIS_CLUSTER_MASTER_PORTS
unset WQ_TEST_REDIS_DIR WQ_TEST_REDIS_CMD
echo "with-redis-cluster: nodes on ports $REDIS_CLUSTER_PORTS (masters $REDIS_CLUSTER_MASTER_PORTS; $REDIS_CLUSTER_DIR)"

rc=0
redis_run "$prog" "$@" || rc=$?
redis_cluster_stop || true
exit "$rc"
