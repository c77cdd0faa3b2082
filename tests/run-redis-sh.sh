#!/bin/bash
# run-redis-sh.sh - the Redis test machinery itself (no engine needed):
# tests/redis.sh and the wrappers start their servers, pass the status of
# the program through (77 stays a skip), and leave nothing behind, not
# when the program is killed, not when the wrapper is (SIGTERM, SIGKILL:
# the guard); persistence across redis_restart; a three-master cluster;
# and tests/test-redis-harness (t.h's Redis helpers) with persistence and
# under the cluster.
set -euo pipefail

src=${top_srcdir:-.}/tests
build=${top_builddir:-.}
for tool in "${REDIS_SERVER:-redis-server}" "${REDIS_CLI:-redis-cli}"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "SKIP: $tool not found"
        exit 77
    fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/wq-redis-sh.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

# Whether nothing is left of server directory $1: neither the directory
# nor a process working in it (waits up to 5 s for stragglers).
gone() {
    local dir=$1 i p cwd left
    [ -n "$dir" ] || return 1
    for ((i = 0; i < 50; i++)); do
        left=
        [ ! -e "$dir" ] || left="$dir exists"
        for p in /proc/[0-9]*; do
            cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
            cwd=${cwd% (deleted)}
            case $cwd in "$dir"|"$dir"/*) left="$left; pid ${p#/proc/} in it" ;; esac
        done
        [ -n "$left" ] || return 0
        sleep 0.1
    done
    echo "left behind: $left"
    return 1
}

# A program that writes its environment and then does "$1".
cat >"$work/prog.sh" <<'EOF'
#!/bin/bash
env | grep '^WQ_TEST' >"$OUT"
redis-cli -p "$WQ_TEST_REDIS_PORT" PING >>"$OUT" 2>&1 || true
eval "$1"
EOF
chmod +x "$work/prog.sh"
val() { sed -n "s/^$1=//p" "$work/out"; }

# 1. Exit statuses, the environment, and cleanup.
for c in 'exit 0:0' 'exit 1:1' 'exit 77:77' 'kill -KILL $$:137'; do
    rc=0
    OUT=$work/out bash "$src/with-redis.sh" "$work/prog.sh" "${c%:*}" >/dev/null 2>&1 || rc=$?
    dir=$(val WQ_TEST_REDIS_DIR)
    port=$(val WQ_TEST_REDIS_PORT)
    if [ "$rc" != "${c##*:}" ]; then
        bad "with-redis.sh, program '${c%:*}': status $rc, not ${c##*:}"
    elif [ "$(val WQ_TEST_PREFIX)" != "redis://127.0.0.1:$port/" ] ||
        ! grep -qx PONG "$work/out"; then
        bad "with-redis.sh: environment or server:"; cat "$work/out"
    elif ! gone "$dir"; then
        bad "with-redis.sh, program '${c%:*}': $dir not cleaned up"
    else
        ok "with-redis.sh, program '${c%:*}': status $rc, server gone"
    fi
done

# 2. No Redis engine in the build: skip.
mkdir "$work/nobuild"
echo '/* no engine */' >"$work/nobuild/config.h"
rc=0
top_builddir=$work/nobuild bash "$src/with-redis.sh" /bin/true >/dev/null 2>&1 || rc=$?
if [ "$rc" = 77 ]; then ok "no WQ_HAVE_REDIS: skip"; else bad "no WQ_HAVE_REDIS: status $rc"; fi
rc=0
top_builddir=$work/nobuild bash "$src/with-redis-cluster.sh" /bin/true >/dev/null 2>&1 || rc=$?
if [ "$rc" = 77 ]; then ok "cluster, no WQ_HAVE_REDIS: skip"; else bad "cluster, no WQ_HAVE_REDIS: status $rc"; fi
if ! grep -qs '^#define WQ_HAVE_REDIS 1' "$build/config.h"; then
    echo "SKIP: the rest needs a build with the Redis engine (WQ_HAVE_REDIS)"
    exit 77
fi

# 3. The wrapper killed while the program runs: SIGTERM (its trap), then
# SIGKILL (the guard): program, server and directory all go.
for sig in TERM KILL; do
    rm -f "$work/out"
    OUT=$work/out bash "$src/with-redis.sh" "$work/prog.sh" 'echo $$ >"$OUT.pid"; exec sleep 60' \
        >/dev/null 2>&1 &
    w=$!
    for ((i = 0; i < 100; i++)); do
        [ ! -s "$work/out.pid" ] || break
        sleep 0.05
    done
    kill "-$sig" "$w"
    rc=0
    wait "$w" 2>/dev/null || rc=$?
    dir=$(val WQ_TEST_REDIS_DIR)
    prog=$(cat "$work/out.pid" 2>/dev/null || true)
    rm -f "$work/out.pid"
    sleep_left=no
    for ((i = 0; i < 50; i++)); do
        kill -0 "$prog" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$prog" 2>/dev/null; then sleep_left=yes; kill -KILL "$prog"; fi
    if ! gone "$dir" || [ "$sleep_left" = yes ]; then
        bad "wrapper SIG$sig: left behind (program running: $sleep_left)"
    else
        ok "wrapper SIG$sig (status $rc): program, server and $dir gone"
    fi
done

# 4. redis.sh: persistence across redis_restart, clean and SIGKILL.
if (
    . "$src/redis.sh"
    redis_start --appendonly yes --appendfsync always
    d=$REDIS_DIR
    redis_cli "$REDIS_PORT" SET a 1 >/dev/null
    redis_restart
    [ "$(redis_cli "$REDIS_PORT" GET a)" = 1 ] || { echo "a lost"; exit 1; }
    redis_cli "$REDIS_PORT" SET b 2 >/dev/null
    redis_restart --kill
    [ "$(redis_cli "$REDIS_PORT" GET b)" = 2 ] || { echo "b lost"; exit 1; }
    redis_stop
    gone "$d"
) >"$work/log" 2>&1; then
    ok "redis_restart keeps an AOF server's data (clean and SIGKILL)"
else
    bad "redis_restart:"; cat "$work/log"
fi

# 5. t.h's helpers: the harness with persistence, which restarts the
# server itself (the wrapper removes the server the program started),
# and under the cluster.
harness=$build/tests/test-redis-harness
if [ -x "$harness" ]; then
    rc=0
    WQ_TEST_REDIS_ARGS='--appendonly yes --appendfsync always' \
        bash "$src/with-redis.sh" "$harness" >"$work/log" 2>&1 || rc=$?
    dir=$(sed -n 's/^with-redis: .*, \(.*\))$/\1/p' "$work/log")
    if [ "$rc" = 0 ] && grep -q 'server with persistence' "$work/log" && gone "$dir"; then
        ok "test-redis-harness with persistence"
    else
        bad "test-redis-harness with persistence (status $rc):"; cat "$work/log"
    fi
    rc=0
    bash "$src/with-redis-cluster.sh" "$harness" >"$work/log" 2>&1 || rc=$?
    dir=$(sed -n 's/^with-redis-cluster: .*; \(.*\))$/\1/p' "$work/log")
    if [ "$rc" = 0 ] && gone "$dir"; then
        ok "test-redis-harness under the cluster"
    else
        bad "test-redis-harness under the cluster (status $rc):"; cat "$work/log"
    fi
else
    echo "(no $harness: cmocka missing; harness runs skipped)"
fi

echo "run-redis-sh: $fail failure(s)"
[ "$fail" = 0 ]
