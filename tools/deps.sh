#!/bin/sh
# Install what building and testing libwq needs, on Debian/Ubuntu, as root.
# Usage: sh tools/deps.sh [ci]   ("ci" adds clang, valgrind, and groff-base
# so that make check also lints the man pages; without groff that part of
# tests/check-docs.sh is skipped)
# hiredis builds the Redis engine; redis-server and redis-tools (redis-cli)
# are the servers and the cluster the tests start themselves.
# golang-go runs client-go's queue_test.go against libwq (tests/client-go).
# libncurses-dev: wqctl top (tmux drives it in the tests);
# libmicrohttpd-dev: wqctl metrics --listen (curl scrapes it in the tests,
# prometheus brings promtool, which checks what is scraped);
# strace counts the syncs of WQ_DURABLE_FSYNC (tests/run-fsync.sh).
# libsqlite3-dev: wqbench's durable peer (durable/sqlite-full).
# Only missing packages are installed; nothing happens when all are there.
set -e
pkgs="gcc make autoconf automake libtool pkg-config liblmdb-dev libcmocka-dev
      libhiredis-dev redis-server redis-tools golang-go
      libncurses-dev tmux libmicrohttpd-dev curl prometheus strace libsqlite3-dev procps"
[ "${1:-}" = ci ] && pkgs="$pkgs clang valgrind groff-base"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "deps.sh: missing packages:$missing (run as root, or install them)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing
