#!/bin/sh
# wqctl metrics end to end: the text exposition (every output checked by
# promtool), exact values after known operations, a crash requeue, missing
# queues, usage errors; --all and a server for every queue, in a private
# /dev/shm (so that attaching to every queue disturbs no other test); and
# --listen on named queues: scrapes by curl while keys move, a removed
# queue dropping out, 404/405, SIGTERM.
# Every wait polls a condition under a deadline (sleeps only pace the
# polls); every background process is killed and every queue removed at
# exit.
set -u
WQCTL="${top_builddir:-.}/tools/wqctl"
case $WQCTL in /*) ;; *) WQCTL="$PWD/$WQCTL" ;; esac
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
T="${TMPDIR:-/tmp}/wqctl-metrics.$$"   # scratch files
P="t-wqm-$$"                            # queue name prefix
QUEUES="a b k c x"
DEADLINE=60                             # seconds, for every wait
pids=""                                 # background processes to kill

cleanup() {
    for p in $pids; do kill -9 "$p" 2>/dev/null; done
    [ -r "$T/task.pid" ] && kill -9 "$(cat "$T/task.pid")" 2>/dev/null
    for q in $QUEUES; do
        "$WQCTL" rm "$P-$q" >/dev/null 2>&1 || rm -f "/dev/shm/wq.$P-$q"
    done
    rm -rf "$T"
}
fail() { echo "FAIL: $*"; cleanup; trap - EXIT; exit 1; }
trap cleanup EXIT
trap 'fail "signal"' INT TERM HUP

for tool in promtool curl timeout; do
    command -v $tool >/dev/null 2>&1 ||
        { echo "SKIP: $tool not installed"; trap - EXIT; exit 77; }
done
mkdir -p "$T" || fail "mkdir $T"

# alive PID: the process exists and is not a zombie.
alive() {
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
gone() { ! alive "$1"; }
# wait_until DESC CMD...: poll CMD every 0.1 s for up to $DEADLINE s.
wait_until() {
    desc=$1; shift
    end=$(($(date +%s) + DEADLINE))
    until "$@"; do
        [ "$(date +%s)" -lt "$end" ] ||
            fail "timed out after ${DEADLINE}s waiting until $desc"
        sleep 0.1
    done
}
# promcheck FILE: promtool accepts FILE (an empty one too).
promcheck() {
    promtool check metrics < "$1" > "$T/promtool" 2>&1 ||
        { cat "$T/promtool"; sed 's/^/  /' "$1" | head -50; fail "promtool check metrics: $1"; }
}
# val FILE SERIES: the value of SERIES (name{labels}) in FILE, or "".
val() { awk -v s="$2" '$1 == s { print $2 }' "$1"; }
# expect FILE METRIC QUEUE WANT [LE]: one sample's exact value.
expect() {
    if [ $# -ge 5 ]; then s="$2{name=\"$3\",le=\"$5\"}"; else s="$2{name=\"$3\"}"; fi
    got=$(val "$1" "$s")
    [ "$got" = "$4" ] || fail "$s is '$got', want '$4' ($1)"
}
# metrics FILE ARGS...: wqctl metrics ARGS > FILE (exit 0), checked.
metrics() {
    f=$1; shift
    timeout -k 5 $DEADLINE "$WQCTL" metrics "$@" > "$f" 2> "$T/err" ||
        { cat "$T/err"; fail "'wqctl metrics $*' exited $?"; }
    promcheck "$f"
}
# expect_rc RC CMD...: CMD exits with RC; its output in $T/out.
expect_rc() {
    want=$1; shift
    timeout -k 5 $DEADLINE "$@" > "$T/out" 2>&1; rc=$?
    [ "$rc" = "$want" ] || { cat "$T/out"; fail "'$*' exited $rc, want $want"; }
}
# The families, in order, with their types.
FAMILIES="workqueue_depth gauge
workqueue_adds_total counter
workqueue_queue_duration_seconds histogram
workqueue_work_duration_seconds histogram
workqueue_unfinished_work_seconds gauge
workqueue_longest_running_processor_seconds gauge
workqueue_retries_total counter
workqueue_coalesced_adds_total counter
workqueue_crash_requeues_total counter
workqueue_waiting gauge
workqueue_processing gauge
workqueue_rate_limit_delay_seconds histogram
workqueue_live_keys gauge
workqueue_capacity gauge
workqueue_attached_processes gauge
workqueue_shutting_down gauge"
# families FILE: FILE's TYPE lines are FAMILIES, each once, each with a
# HELP line before it.
families() {
    got=$(sed -n 's/^# TYPE //p' "$1")
    [ "$got" = "$FAMILIES" ] || fail "TYPE lines of $1:
$got"
    [ "$(grep -c '^# HELP workqueue_[a-z_]* [^ ]' "$1")" = 16 ] ||
        fail "HELP lines of $1"
}
# names FILE: the queues of FILE's adds_total samples, one a line.
names() { sed -n 's/^workqueue_adds_total{name="\([^"]*\)"} .*/\1/p' "$1"; }

# ====================================================================
# --all, and a server for every queue, in a private /dev/shm: this part
# runs as `run-wqctl-metrics.sh --private-shm` under unshare(1).
# ====================================================================
if [ "${1:-}" = --private-shm ]; then
    mount -t tmpfs -o mode=1777 wq-metrics-test /dev/shm ||
        fail "mount a private /dev/shm"
    metrics "$T/p0" --all
    [ -s "$T/p0" ] && fail "--all without queues printed something"
    for q in one two; do
        expect_rc 0 "$WQCTL" create "$q"
    done
    expect_rc 0 "$WQCTL" add two k1 k2
    metrics "$T/p1" --all
    families "$T/p1"
    [ "$(names "$T/p1" | tr '\n' ' ')" = "one two " ] ||
        fail "--all: queues $(names "$T/p1")"
    expect "$T/p1" workqueue_adds_total two 2
    # A server for every queue: new queues appear, removed ones go.
    "$WQCTL" metrics --listen 127.0.0.1:0 > "$T/purl" 2> "$T/perr" &
    spid=$!; pids="$pids $spid"
    wait_until "the server says where it listens" grep -q '^http://' "$T/purl"
    url=$(cat "$T/purl")
    pscrape() {
        code=$(timeout -k 5 $DEADLINE curl -sS -o "$1" -w '%{http_code}' "$url") ||
            fail "curl $url"
        [ "$code" = 200 ] || fail "scrape: HTTP $code"
        promcheck "$1"
    }
    pscrape "$T/ps1"
    [ "$(names "$T/ps1" | tr '\n' ' ')" = "one two " ] ||
        fail "server: queues $(names "$T/ps1")"
    expect_rc 0 "$WQCTL" create three
    expect_rc 0 "$WQCTL" rm one
    pscrape "$T/ps2"
    [ "$(names "$T/ps2" | tr '\n' ' ')" = "three two " ] ||
        fail "server after create three, rm one: queues $(names "$T/ps2")"
    expect_rc 0 "$WQCTL" rm two
    expect_rc 0 "$WQCTL" rm three
    pscrape "$T/ps3"
    [ -s "$T/ps3" ] && fail "server without queues sent samples"
    # SIGINT here (SIGTERM below). sh starts background commands with
    # SIGINT ignored; wqctl blocks it and takes it with sigwait all the
    # same.
    kill -INT "$spid"
    wait_until "the server exits on SIGINT" gone "$spid"
    wait "$spid"; rc=$?
    [ "$rc" = 0 ] || { cat "$T/perr"; fail "server exited $rc after SIGINT"; }
    [ -s "$T/perr" ] && { cat "$T/perr"; fail "server (every queue) wrote to stderr"; }
    pids=""
    trap - EXIT
    rm -rf "$T"
    exit 0
fi

# ====================================================================
# Text output, exact values.
# ====================================================================
A=$P-a B=$P-b K=$P-k C=$P-c X=$P-x
expect_rc 0 "$WQCTL" create "$A" --capacity 64
expect_rc 0 "$WQCTL" add "$A" a b c a          # 3 adds, 1 coalesced
expect_rc 0 "$WQCTL" get "$A"                  # a, done
expect_rc 0 "$WQCTL" get "$A"                  # b, done
expect_rc 0 "$WQCTL" add "$A" --after 1h w     # waiting: a retry, no add yet
metrics "$T/a" "$A"
families "$T/a"
expect "$T/a" workqueue_depth "$A" 1
expect "$T/a" workqueue_adds_total "$A" 3
expect "$T/a" workqueue_coalesced_adds_total "$A" 1
expect "$T/a" workqueue_retries_total "$A" 1
expect "$T/a" workqueue_crash_requeues_total "$A" 0
expect "$T/a" workqueue_waiting "$A" 1
expect "$T/a" workqueue_processing "$A" 0
expect "$T/a" workqueue_live_keys "$A" 2
expect "$T/a" workqueue_capacity "$A" 64
expect "$T/a" workqueue_attached_processes "$A" 0
expect "$T/a" workqueue_shutting_down "$A" 0
expect "$T/a" workqueue_unfinished_work_seconds "$A" 0
expect "$T/a" workqueue_longest_running_processor_seconds "$A" 0
expect "$T/a" workqueue_queue_duration_seconds_count "$A" 2
expect "$T/a" workqueue_queue_duration_seconds_bucket "$A" 2 +Inf
expect "$T/a" workqueue_work_duration_seconds_count "$A" 2
expect "$T/a" workqueue_work_duration_seconds_bucket "$A" 2 +Inf
expect "$T/a" workqueue_rate_limit_delay_seconds_count "$A" 0
expect "$T/a" workqueue_rate_limit_delay_seconds_sum "$A" 0
# Every histogram: client-go's le values, in order, cumulative.
for h in queue_duration work_duration rate_limit_delay; do
    les=$(sed -n "s/^workqueue_${h}_seconds_bucket{name=\"$A\",le=\"\([^\"]*\)\"} .*/\1/p" "$T/a" | tr '\n' ' ')
    [ "$les" = "1e-08 1e-07 1e-06 1e-05 0.0001 0.001 0.01 0.1 1 10 +Inf " ] ||
        fail "$h le values: $les"
    sed -n "s/^workqueue_${h}_seconds_bucket{.*} //p" "$T/a" |
        awk 'NR > 1 && $1 < prev { exit 1 } { prev = $1 }' ||
        fail "$h buckets not cumulative"
done

# The rate limiter's delays: 1 h, then 2 h (exponential, capped at 2 h).
expect_rc 0 "$WQCTL" create "$B" --rl-limiters exponential --rl-base 1h --rl-max 2h
expect_rc 0 "$WQCTL" add "$B" --rate-limited r
expect_rc 0 "$WQCTL" add "$B" --rate-limited r
metrics "$T/b" "$B"
expect "$T/b" workqueue_rate_limit_delay_seconds_count "$B" 2
expect "$T/b" workqueue_rate_limit_delay_seconds_sum "$B" 10800
expect "$T/b" workqueue_rate_limit_delay_seconds_bucket "$B" 0 10
expect "$T/b" workqueue_rate_limit_delay_seconds_bucket "$B" 2 +Inf
expect "$T/b" workqueue_waiting "$B" 1
expect "$T/b" workqueue_retries_total "$B" 2
expect "$T/b" workqueue_coalesced_adds_total "$B" 1
expect "$T/b" workqueue_adds_total "$B" 0
expect "$T/b" workqueue_live_keys "$B" 1
expect_rc 0 "$WQCTL" shutdown "$B"
metrics "$T/b" "$B"
expect "$T/b" workqueue_shutting_down "$B" 1
expect_rc 0 "$WQCTL" resume "$B"
metrics "$T/b" "$B"
expect "$T/b" workqueue_shutting_down "$B" 0

# Attached processes: a blocked get is one handle; the scraper is none.
expect_rc 0 "$WQCTL" create "$K"
timeout -k 5 $DEADLINE "$WQCTL" get "$K" --timeout 1h > "$T/got" 2>&1 &
gpid=$!; pids="$pids $gpid"
attached() {
    "$WQCTL" metrics "$K" > "$T/k" 2>&1 &&
        [ "$(val "$T/k" "workqueue_attached_processes{name=\"$K\"}")" = "$1" ]
}
wait_until "a blocked get is attached to $K" attached 1
expect_rc 0 "$WQCTL" add "$K" first
wait "$gpid" || fail "get exited $?"
[ "$(cat "$T/got")" = first ] || fail "get printed '$(cat "$T/got")'"
wait_until "the get is gone from $K" attached 0
# A crash: the holder of a key is SIGKILLed; the next get requeues the
# key through the rate limiter (default: 5 ms) and takes it.
"$WQCTL" work "$K" -- sh -c "echo \$\$ > '$T/task.pid'; exec sleep 600" \
    > /dev/null 2>&1 &
wpid=$!; pids="$pids $wpid"
expect_rc 0 "$WQCTL" add "$K" k
processing() {
    "$WQCTL" metrics "$K" > "$T/k" 2>&1 &&
        [ "$(val "$T/k" "workqueue_processing{name=\"$K\"}")" = 1 ] &&
        [ -s "$T/task.pid" ]
}
wait_until "k is processing" processing
awk -v s="workqueue_unfinished_work_seconds{name=\"$K\"}" '$1 == s && $2 > 0 { f = 1 } END { exit !f }' "$T/k" ||
    fail "unfinished_work_seconds is not above 0 while k is processing"
kill -9 "$wpid"
wait "$wpid" 2>/dev/null
kill -9 "$(cat "$T/task.pid")"
expect_rc 0 "$WQCTL" get "$K" --timeout ${DEADLINE}s
[ "$(cat "$T/out")" = k ] || fail "get after the crash printed '$(cat "$T/out")'"
metrics "$T/k" "$K"
expect "$T/k" workqueue_crash_requeues_total "$K" 1
expect "$T/k" workqueue_rate_limit_delay_seconds_count "$K" 1
expect "$T/k" workqueue_rate_limit_delay_seconds_bucket "$K" 1 0.01
expect "$T/k" workqueue_rate_limit_delay_seconds_sum "$K" 0.005
expect "$T/k" workqueue_processing "$K" 0
expect "$T/k" workqueue_attached_processes "$K" 0

# Several queues: one HELP/TYPE per family, every queue's samples in it.
metrics "$T/ab" "$A" "$B"
families "$T/ab"
[ "$(names "$T/ab" | tr '\n' ' ')" = "$A $B " ] || fail "queues: $(names "$T/ab")"
[ "$(grep -c '^workqueue_capacity{' "$T/ab")" = 2 ] || fail "capacity samples"

# ---- a missing queue: said on stderr, exit 1, the others printed -----
timeout -k 5 $DEADLINE "$WQCTL" metrics "$A" "$P-missing" "$B" bad/name \
    > "$T/m" 2> "$T/merr"; rc=$?
[ "$rc" = 1 ] || fail "metrics with a missing queue exited $rc, want 1"
[ "$(sed -n 1p "$T/merr")" = "wqctl: queue '$P-missing': no such queue" ] &&
    sed -n 2p "$T/merr" | grep -q "^wqctl: queue 'bad/name': [a-z].*name" &&
    [ "$(wc -l < "$T/merr")" = 2 ] || fail "stderr: $(cat "$T/merr")"
promcheck "$T/m"
families "$T/m"
[ "$(names "$T/m" | tr '\n' ' ')" = "$A $B " ] || fail "queues printed: $(names "$T/m")"
expect "$T/m" workqueue_adds_total "$A" 3
# Only missing queues: nothing on stdout, still exit 1.
timeout -k 5 $DEADLINE "$WQCTL" metrics "$P-missing" > "$T/m" 2> /dev/null; rc=$?
[ "$rc" = 1 ] && [ ! -s "$T/m" ] || fail "metrics of a missing queue: exit $rc, $(wc -c < "$T/m") bytes"

# ---- usage errors -----------------------------------------------------
expect_rc 2 "$WQCTL" metrics
expect_rc 2 "$WQCTL" metrics --all "$A"
expect_rc 2 "$WQCTL" metrics "$A" "$A"
expect_rc 2 "$WQCTL" metrics --listen
for bad in bogus 127.0.0.1 127.0.0.1:65536 127.0.0.1:-1 127.0.0.1:x ::1:9101 ""; do
    expect_rc 2 "$WQCTL" metrics --listen "$bad" "$A"
done
expect_rc 1 "$WQCTL" metrics --listen 192.0.2.1:0 "$A"   # not this machine's
grep -q "^wqctl: metrics: cannot listen on 192.0.2.1:0: " "$T/out" ||
    fail "no 'cannot listen' message: $(cat "$T/out")"

# ====================================================================
# --all: in a private /dev/shm, where this test's queues are the only
# ones (the others' tests run in parallel under make -j).
# ====================================================================
if unshare --mount --map-root-user true 2>/dev/null; then
    ns="unshare --mount --map-root-user"
elif unshare --mount true 2>/dev/null; then
    ns="unshare --mount"
else
    ns=""
fi
if [ -n "$ns" ] && $ns sh -c 'mount -t tmpfs none /dev/shm' 2>/dev/null; then
    timeout -k 5 $((DEADLINE * 3)) $ns env top_builddir="${WQCTL%/tools/wqctl}" \
        TMPDIR="$T" sh "$SELF" --private-shm || fail "--all (private /dev/shm)"
else
    echo "note: no private mount namespace (unshare, mount); --all not checked"
fi

# ====================================================================
# --listen: named queues, one missing; keys move in one, another is
# removed while served.
# ====================================================================
expect_rc 0 "$WQCTL" create "$C"
expect_rc 0 "$WQCTL" create "$X" --capacity 16
"$WQCTL" metrics --listen 127.0.0.1:0 "$C" "$X" "$P-gone" \
    > "$T/url" 2> "$T/server.err" &
spid=$!; pids="$pids $spid"
ready() {
    alive "$spid" || { cat "$T/server.err"; fail "the server exited"; }
    grep -q '^http://' "$T/url"
}
wait_until "the server says where it listens" ready
url=$(cat "$T/url")
base=${url%/metrics}
printf '%s\n' "$url" | grep -qx 'http://127\.0\.0\.1:[1-9][0-9]*/metrics' ||
    fail "server printed '$url'"
n=0
# scrape: GET /metrics into $T/s$n (200, promtool); $s is the file.
scrape() {
    n=$((n + 1)); s="$T/s$n"
    code=$(timeout -k 5 $DEADLINE curl -sS -D "$s.h" -o "$s" -w '%{http_code}' "$url") ||
        fail "curl $url"
    [ "$code" = 200 ] || fail "scrape $n: HTTP $code"
    grep -qi '^Content-Type: text/plain; version=0.0.4' "$s.h" ||
        fail "scrape $n: $(cat "$s.h")"
    promcheck "$s"
}
scrape
first=$s
families "$first"
[ "$(names "$first" | tr '\n' ' ')" = "$C $X " ] || fail "served queues: $(names "$first")"
expect "$first" workqueue_adds_total "$C" 0
wait_until "the server reports $P-gone" \
    grep -qx "wqctl: queue '$P-gone': no such queue (left out of the scrapes)" "$T/server.err"

# Keys move: a worker takes them, a producer adds them (paced, bounded).
"$WQCTL" work "$C" -- true > /dev/null 2>&1 &
pids="$pids $!"
( i=0
  while [ $i -lt 3000 ]; do
      "$WQCTL" add "$C" "k$i" > /dev/null 2>&1 || exit 0
      i=$((i + 1)); sleep 0.02
  done ) &
pids="$pids $!"
# advanced ADDS WORK: a new scrape shows more adds and more finished work
# in C than ADDS and WORK (left in $a1 and $w1), and no counter of C
# went down since the scrape before.
prev=$first
advanced() {
    scrape
    for m in adds_total queue_duration_seconds_count work_duration_seconds_count; do
        old=$(val "$prev" "workqueue_$m{name=\"$C\"}")
        new=$(val "$s" "workqueue_$m{name=\"$C\"}")
        [ -n "$new" ] && [ "$new" -ge "$old" ] || fail "workqueue_$m went from $old to '$new'"
    done
    prev=$s
    a1=$(val "$s" "workqueue_adds_total{name=\"$C\"}")
    w1=$(val "$s" "workqueue_work_duration_seconds_count{name=\"$C\"}")
    [ "$a1" -gt "$1" ] && [ "$w1" -gt "$2" ]
}
wait_until "scrapes show keys moving in $C" advanced \
    "$(val "$first" "workqueue_adds_total{name=\"$C\"}")" \
    "$(val "$first" "workqueue_work_duration_seconds_count{name=\"$C\"}")"
wait_until "a later scrape shows more" advanced "$a1" "$w1"
attached=$(val "$s" "workqueue_attached_processes{name=\"$C\"}")
[ "$attached" -ge 1 ] || fail "attached_processes of $C is '$attached' with a worker"

# X is removed: the next scrape has no X, and says why once, not at
# every scrape.
expect "$s" workqueue_capacity "$X" 16
expect_rc 0 "$WQCTL" rm "$X"
scrape
[ "$(names "$s" | tr '\n' ' ')" = "$C " ] || fail "after rm $X: $(names "$s")"
grep -q "$X" "$s" && fail "$X still in the scrape"
scrape
[ "$(grep -c "^wqctl: queue '$X': no such queue (left out of the scrapes)\$" "$T/server.err")" = 1 ] ||
    { cat "$T/server.err"; fail "the removal of $X was not said exactly once"; }

# Other paths 404, other methods 405 (with Allow), HEAD 200.
# status METHOD PATH: the HTTP status; headers in $T/h.
status() {
    timeout -k 5 $DEADLINE curl -sS -o /dev/null -D "$T/h" -X "$1" -w '%{http_code}' "$base$2" ||
        fail "curl -X $1 $base$2"
}
for p in / /metric /metrics/ /foo; do
    [ "$(status GET "$p")" = 404 ] || fail "GET $p: not 404"
done
[ "$(status POST /foo)" = 404 ] || fail "POST /foo: not 404"
for m in POST PUT DELETE OPTIONS; do
    [ "$(status "$m" /metrics)" = 405 ] || fail "$m /metrics: not 405"
    grep -qi '^Allow: GET, HEAD' "$T/h" || fail "$m /metrics: no Allow header"
done
code=$(timeout -k 5 $DEADLINE curl -sS -I -o "$T/h" -w '%{http_code}' "$url") || fail "curl -I"
[ "$code" = 200 ] || fail "HEAD /metrics: $code"
[ "$(status GET '/metrics?x=1')" = 200 ] || fail "GET /metrics?x=1: not 200"
# A request that is not HTTP: the server answers the next one.
printf 'garbage\r\n\r\n' | timeout -k 1 10 curl -sS -o /dev/null \
    "telnet://127.0.0.1:${base##*:}" > /dev/null 2>&1
scrape

# SIGTERM: the server stops and exits 0.
kill -TERM "$spid"
wait_until "the server exits on SIGTERM" gone "$spid"
wait "$spid"; rc=$?
[ "$rc" = 0 ] || { cat "$T/server.err"; fail "server exited $rc after SIGTERM"; }
timeout -k 5 10 curl -sS -o /dev/null "$url" 2>/dev/null &&
    fail "the server still answers after SIGTERM"
echo "wqctl metrics: $n scrapes, all checks passed"
