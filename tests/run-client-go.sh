#!/usr/bin/env bash
# client-go's own util/workqueue/queue_test.go, unchanged, against libwq
# through the cgo adapter in tests/client-go (its README.md says what is
# vendored from where). Offline: GOPROXY=off, every module it needs is a
# local replace. Runs go test, then go test -race where Go has a race
# detector (WQ_GO_RACE=0 skips it); against an ASan build of libwq it runs
# go test -asan instead, as the ASan runtime must come first.
# Without go: skipped (77), except in CI (CI=true), where that fails.
set -euo pipefail

srcdir=${top_srcdir:-$(cd "$(dirname "$0")/.." && pwd)}
builddir=${top_builddir:-.}
srcdir=$(cd "$srcdir" && pwd)
builddir=$(cd "$builddir" && pwd)

if ! command -v go >/dev/null 2>&1; then
    if [ "${CI:-}" = true ]; then
        echo "run-client-go: go not found (tools/deps.sh installs golang-go)" >&2
        exit 1
    fi
    echo "run-client-go: go not found: skipped (sh tools/deps.sh installs golang-go)"
    exit 77
fi

libdir=$builddir/src/.libs
if [ ! -e "$libdir/libwq.so" ]; then
    echo "run-client-go: $libdir/libwq.so not built" >&2
    exit 1
fi

# Go's caches live in the build tree (make clean removes them), never in
# $HOME; nothing is downloaded.
cache=$builddir/tests/client-go.cache
mkdir -p "$cache"
unset GOTOOLCHAIN GOROOT GOFLAGS GOPATH GOMODCACHE GOCACHE
export GOENV=off GOWORK=off GO111MODULE=on GOPROXY=off GOSUMDB=off
export GOFLAGS=-mod=mod GOPATH=$cache/gopath GOCACHE=$cache/gocache
export CGO_ENABLED=1
export CGO_CFLAGS="-I$srcdir/include -O2 -g"
export CGO_LDFLAGS="-L$libdir -Wl,-rpath,$libdir"
# Queue names: t-client-go-<this script's pid>-<test pid>-<n>, so leftovers
# in /dev/shm can be told apart (there should be none: the adapter
# unlinks each name as soon as the queue exists).
export WQ_GO_QUEUE_PREFIX="t-client-go-$$"

modes=(plain)
# Not `ldd | grep -q`: under pipefail, grep -q leaving at the first match
# can kill ldd with SIGPIPE and the test would run an ASan library as plain.
deps=$(ldd "$libdir/libwq.so" 2>/dev/null || true)
if [[ $deps == *libasan* ]]; then
    modes=(asan)
elif [ "${WQ_GO_RACE:-1}" != 0 ]; then
    case "$(go env GOOS)/$(go env GOARCH)" in
    linux/amd64 | linux/arm64 | linux/ppc64le | linux/s390x) modes+=(race) ;;
    esac
fi

echo "run-client-go: $(go version)"
cd "$srcdir/tests/client-go"
out=$(mktemp "$cache/out.XXXXXX")
trap 'rm -f "$out"' EXIT
passed=0 failed=0 status=0
for mode in "${modes[@]}"; do
    flags=()
    [ "$mode" = plain ] || flags=("-$mode")
    echo "run-client-go: go test ${flags[*]:+${flags[*]} }-count=1 -v ./..."
    start=$SECONDS
    rc=0
    go test "${flags[@]}" -count=1 -v -timeout 300s ./... >"$out" 2>&1 || rc=$?
    # TestBasic logs two lines per item processed: leave them out.
    grep -Ev '^ +queue_test\.go:[0-9]+: Worker [0-9]+: (begin|done) processing' "$out" || true
    p=$(grep -c -- '^--- PASS' "$out" || true)
    f=$(grep -c -- '^--- FAIL' "$out" || true)
    echo "run-client-go: $mode: $p tests passed, $f failed, $((SECONDS - start)) s (go test exit $rc)"
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$rc" != 0 ] || [ "$p" = 0 ]; then status=1; fi
done

left=$(ls /dev/shm 2>/dev/null | grep -E "^wq\\.$WQ_GO_QUEUE_PREFIX-" || true)
if [ -n "$left" ]; then
    echo "run-client-go: left in /dev/shm: $left" >&2
    for n in $left; do rm -f "/dev/shm/$n"; done
    status=1
fi
echo "client-go: $passed passed, $failed failed"
exit $status
