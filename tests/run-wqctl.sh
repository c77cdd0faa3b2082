#!/bin/sh
# wqctl end to end: exact outputs and exit codes.
set -u
WQCTL="${top_builddir:-.}/tools/wqctl"
Q="t-wqctl-$$"        # basic commands
D="t-wqctl-d-$$"      # delays
R="t-wqctl-r-$$"      # rate limiter (exponential, 1h base: keys stay waiting)
F="t-wqctl-f-$$"      # fast-slow limiter (1ms, then 1h): failing keys
M="t-wqctl-m-$$"      # metrics
N="t-wqctl-n-$$"      # metrics with --no-metrics
P="t-wqctl-p-$$"      # a full process table
OUT="/tmp/wqctl.out.$$"
cleanup() {
    rm -f "$OUT"
    [ -n "${HD:-}" ] && rm -rf "$HD"
    [ -n "${GETS:-}" ] && kill $GETS 2>/dev/null
    for q in "$Q" "$D" "$R" "$F" "$M" "$N" "$P"; do
        "$WQCTL" rm "$q" >/dev/null 2>&1 || rm -f "/dev/shm/wq.$q"
    done
}
fail() { echo "FAIL: $*"; cleanup; trap - EXIT; exit 1; }
trap cleanup EXIT

# expect_rc RC CMD...: CMD exits with RC.
expect_rc() { want=$1; shift; "$@" >"$OUT" 2>&1; rc=$?; [ "$rc" = "$want" ] || { cat "$OUT"; fail "'$*' exited $rc, want $want"; }; }
# expect_out WANT CMD...: CMD exits 0 and prints exactly WANT.
expect_out() {
    want=$1; shift
    got=$("$@" 2>&1) || fail "'$*' exited $?: $got"
    [ "$got" = "$want" ] || fail "'$*' printed '$got', want '$want'"
}
# run CMD...: CMD exits 0; its output goes to $out.
run() { out=$("$@" 2>&1) || fail "'$*' exited $?: $out"; }
# has_line LINE: $out has exactly this line.  has_re RE: a line matching RE.
has_line() { printf '%s\n' "$out" | grep -Fxq -- "$1" || fail "no line '$1' in:
$out"; }
has_re() { printf '%s\n' "$out" | grep -xq -- "$1" || fail "no line matching '$1' in:
$out"; }

# ---- basics ----------------------------------------------------------
expect_rc 0 "$WQCTL" create "$Q" --capacity 100 --max-key-len 32
expect_rc 1 "$WQCTL" create "$Q" --capacity 100
expect_rc 2 "$WQCTL" create
expect_rc 2 "$WQCTL" frobnicate
expect_rc 1 "$WQCTL" stat "bad/name"
expect_rc 1 "$WQCTL" stat "missing-$$"
expect_rc 0 "$WQCTL" add "$Q" a b a c
printf 'd\ne\na\n' | "$WQCTL" add "$Q" - >/dev/null || fail "add from stdin"
run "$WQCTL" stat "$Q" --json
has_re '.*"queued":5,.*'
has_re '.*"coalesced_total":2,.*'
has_re '.*"waiting":0,"failing":0,"next_ready_in_ns":null,.*'
run "$WQCTL" stat "$Q"
has_re 'next_ready  *-'
has_re 'failing  *0'
expect_rc 0 "$WQCTL" dump "$Q"
first=$("$WQCTL" dump "$Q" | sed -n 2p)   # line 1 is the column header
echo "$first" | grep -q 'a' || fail "dump order: $first"
got=$("$WQCTL" get "$Q") || fail "get"
[ "$got" = "a" ] || fail "get returned '$got', want a"
# --count: up to n keys in queue order, each done (wq_get_many/done_many)
got=$("$WQCTL" get "$Q" --count 3) || fail "get --count 3"
[ "$got" = "$(printf 'b\nc\nd')" ] || fail "get --count 3 returned '$got', want b c d"
got=$("$WQCTL" get "$Q" -n 10) || fail "get -n 10"
[ "$got" = "e" ] || fail "get -n 10 returned '$got', want e"
expect_rc 1 "$WQCTL" get "$Q" -n 5
[ ! -s "$OUT" ] || fail "get -n of an empty queue printed: $(cat "$OUT")"
run "$WQCTL" stat "$Q" --json
has_re '.*"live":0,.*'
expect_rc 2 "$WQCTL" get "$Q" --count 0
grep -Fq "bad value '0' for --count (at least 1)" "$OUT" || fail "get --count 0 said: $(cat "$OUT")"
expect_rc 2 "$WQCTL" get "$Q" --count x
"$WQCTL" add "$Q" x y z >/dev/null || fail "add x y z"
got=$("$WQCTL" get "$Q" -n 2 -0 | tr '\0' ,) || fail "get -n 2 -0"
[ "$got" = "x,y," ] || fail "get -n 2 -0 returned '$got', want x,y,"
got=$("$WQCTL" get "$Q") || fail "get z"
[ "$got" = "z" ] || fail "get returned '$got', want z"
expect_rc 0 "$WQCTL" check "$Q"
expect_rc 0 "$WQCTL" ls

# ---- add --after -----------------------------------------------------
expect_rc 0 "$WQCTL" create "$D" --capacity 10
expect_out "added 1, coalesced 0" "$WQCTL" add "$D" --after 1h w
expect_out "added 0, coalesced 1" "$WQCTL" add "$D" --after=2h w
run "$WQCTL" stat "$D"
has_re 'queued  *0'
has_re 'waiting  *1'
has_re 'live  *1'
has_re 'retries_total  *2'
has_re 'next_ready  *in 3[5-9][0-9][0-9]\.[0-9][0-9][0-9]s'
run "$WQCTL" stat "$D" --json
has_re '.*"waiting":1,"failing":0,"next_ready_in_ns":3[5-9][0-9]\{11\},.*'
run "$WQCTL" dump "$D"
has_line 'POSITION   STATE              OWNER    READY        FAILURES RESULT    CODE  KEY'
has_re '-  *waiting  *-  *in 3[5-9][0-9][0-9]\.[0-9]\{3\}s  *0  *pending  *-  *w'
run "$WQCTL" dump "$D" --json
has_re '{"name":"'"$D"'","keys":\[{"key":"w","state":\["waiting"\],"position":null,"owner_pid":null,"ready_in_ns":3[5-9][0-9]\{11\},"failures":0,"result":"pending","result_code":0,"result_message":""}\]}'
expect_rc 1 "$WQCTL" get "$D"                 # nothing ready
expect_out "added 1, coalesced 0" "$WQCTL" add "$D" --after 0 now
expect_out "now" "$WQCTL" get "$D"
expect_out "added 1, coalesced 0" "$WQCTL" add "$D" --after 10ms soon
expect_out "soon" "$WQCTL" get "$D" --timeout 5s
printf 'x\ny\n' | "$WQCTL" add "$D" --after 1h - >"$OUT" 2>&1 ||
    fail "add --after from stdin"
[ "$(cat "$OUT")" = "added 2, coalesced 0" ] || fail "add --after -: $(cat "$OUT")"
run "$WQCTL" stat "$D"
has_re 'waiting  *3'

# ---- add --rate-limited, requeues, forget ----------------------------
expect_rc 0 "$WQCTL" create "$R" --rl-limiters exponential --rl-base 1h --rl-max 2h
expect_out "added 1, coalesced 0" "$WQCTL" add "$R" --rate-limited r
expect_out "1" "$WQCTL" requeues "$R" r
expect_out "added 0, coalesced 1" "$WQCTL" add "$R" --rate-limited r
expect_out "2" "$WQCTL" requeues "$R" r
expect_out "0" "$WQCTL" requeues "$R" unknown
run "$WQCTL" dump "$R"
has_re '-  *waiting  *-  *in 3[5-9][0-9][0-9]\.[0-9]\{3\}s  *2  *pending  *-  *r'
run "$WQCTL" stat "$R"
has_re 'retries_total  *2'
expect_out "" "$WQCTL" forget "$R" r unknown
expect_out "0" "$WQCTL" requeues "$R" r
run "$WQCTL" stat "$R"
has_re 'waiting  *1'                          # forget does not dequeue
expect_rc 1 "$WQCTL" requeues "$R" "$(printf '%0300d' 0)"   # > max_key_len

# ---- failing keys (fast-slow: first failure 1ms, then 1h) ------------
expect_rc 0 "$WQCTL" create "$F" --rl-limiters fast-slow --rl-fast 1ms \
    --rl-slow 1h --rl-max-fast 1
expect_out "added 1, coalesced 0" "$WQCTL" add "$F" --rate-limited x
expect_out "x" "$WQCTL" get "$F" --timeout 5s
run "$WQCTL" stat "$F"
has_re 'failing  *1'
has_re 'live  *0'
has_re 'next_ready  *-'
run "$WQCTL" dump "$F"
has_re '-  *failing  *-  *-  *1  *none  *-  *x'
run "$WQCTL" dump "$F" --json
has_line '{"name":"'"$F"'","keys":[{"key":"x","state":["failing"],"position":null,"owner_pid":null,"ready_in_ns":null,"failures":1,"result":"none","result_code":0,"result_message":""}]}'
expect_out "added 1, coalesced 0" "$WQCTL" add "$F" --rate-limited x
run "$WQCTL" dump "$F"
has_re '-  *waiting  *-  *in 3[5-9][0-9][0-9]\.[0-9]\{3\}s  *2  *pending  *-  *x'
expect_out "" "$WQCTL" forget "$F" x
run "$WQCTL" stat "$F" --json
has_re '.*"waiting":1,"failing":0,.*'

# ---- metrics ---------------------------------------------------------
expect_rc 0 "$WQCTL" create "$M"
expect_out "added 2, coalesced 1" "$WQCTL" add "$M" a b a
expect_out "a" "$WQCTL" get "$M"
run "$WQCTL" metrics "$M"
metrics=$out
has_line "workqueue_depth{name=\"$M\"} 1"
has_line "workqueue_adds_total{name=\"$M\"} 2"
has_line "workqueue_queue_duration_seconds_count{name=\"$M\"} 1"
has_line "workqueue_work_duration_seconds_count{name=\"$M\"} 1"
has_line "workqueue_work_duration_seconds_bucket{name=\"$M\",le=\"+Inf\"} 1"
has_line "workqueue_queue_duration_seconds_bucket{name=\"$M\",le=\"+Inf\"} 1"
has_line "workqueue_unfinished_work_seconds{name=\"$M\"} 0"
has_line "workqueue_longest_running_processor_seconds{name=\"$M\"} 0"
has_line "workqueue_retries_total{name=\"$M\"} 0"
has_line "workqueue_coalesced_adds_total{name=\"$M\"} 1"
has_line "workqueue_crash_requeues_total{name=\"$M\"} 0"
has_line "workqueue_waiting{name=\"$M\"} 0"
has_line "workqueue_processing{name=\"$M\"} 0"
for t in "depth gauge" "adds_total counter" \
         "queue_duration_seconds histogram" "work_duration_seconds histogram" \
         "unfinished_work_seconds gauge" \
         "longest_running_processor_seconds gauge" "retries_total counter" \
         "coalesced_adds_total counter" "crash_requeues_total counter" \
         "waiting gauge" "processing gauge" \
         "rate_limit_delay_seconds histogram" "live_keys gauge" \
         "capacity gauge" "attached_processes gauge" \
         "shutting_down gauge"; do
    has_line "# TYPE workqueue_$t"
    has_re "# HELP workqueue_${t% *} .*"
done
[ "$(printf '%s\n' "$out" | grep -c '^# TYPE ')" = 16 ] || fail "TYPE count"
[ "$(printf '%s\n' "$out" | grep -c '^# HELP ')" = 16 ] || fail "HELP count"
# Every sample is NAME{name="Q"[,le="X"]} VALUE with a float VALUE.
printf '%s\n' "$out" | grep -v '^# ' |
    grep -vx 'workqueue_[a-z_]*{name="'"$M"'"\(,le="[^"]*"\)\{0,1\}} [0-9][0-9.e+-]*' &&
    fail "malformed sample lines"
# Each histogram: client-go's le values in order, cumulative, +Inf == count.
for h in queue_duration_seconds work_duration_seconds rate_limit_delay_seconds; do
    les=$(printf '%s\n' "$out" | sed -n "s/^workqueue_${h}_bucket{.*,le=\"\([^\"]*\)\"} .*/\1/p" | tr '\n' ' ')
    [ "$les" = "1e-08 1e-07 1e-06 1e-05 0.0001 0.001 0.01 0.1 1 10 +Inf " ] ||
        fail "$h le values: $les"
    printf '%s\n' "$out" | sed -n "s/^workqueue_${h}_bucket{.*} //p" |
        awk 'NR > 1 && $1 < prev { exit 1 } { prev = $1 }' ||
        fail "$h buckets not cumulative"
    inf=$(printf '%s\n' "$out" | sed -n "s/^workqueue_${h}_bucket{.*le=\"+Inf\"} //p")
    cnt=$(printf '%s\n' "$out" | sed -n "s/^workqueue_${h}_count{.*} //p")
    [ -n "$inf" ] && [ "$inf" = "$cnt" ] || fail "$h +Inf bucket '$inf' != count '$cnt'"
    has_re "workqueue_${h}_sum{name=\"$M\"} [0-9][0-9.e+-]*"
done
# A strict parser, where installed (Debian: apt-get install prometheus).
if command -v promtool >/dev/null 2>&1; then
    printf '%s\n' "$metrics" | promtool check metrics >"$OUT" 2>&1 ||
        { cat "$OUT"; fail "promtool check metrics"; }
else
    echo "note: promtool not installed; strict parser check skipped"
fi
# --no-metrics: counters still count, durations are not measured.
expect_rc 0 "$WQCTL" create "$N" --no-metrics
expect_out "added 1, coalesced 0" "$WQCTL" add "$N" k
expect_out "k" "$WQCTL" get "$N"
run "$WQCTL" metrics "$N"
has_line "workqueue_adds_total{name=\"$N\"} 1"
has_line "workqueue_work_duration_seconds_count{name=\"$N\"} 0"
# Several queues: one HELP/TYPE per family, one sample per queue.
run "$WQCTL" metrics "$M" "$N"
[ "$(printf '%s\n' "$out" | grep -c '^# TYPE workqueue_adds_total ')" = 1 ] ||
    fail "metrics of two queues repeat a family"
has_line "workqueue_adds_total{name=\"$M\"} 2"
has_line "workqueue_adds_total{name=\"$N\"} 1"
if command -v promtool >/dev/null 2>&1; then
    printf '%s\n' "$out" | promtool check metrics >"$OUT" 2>&1 ||
        { cat "$OUT"; fail "promtool check metrics (two queues)"; }
fi
# A missing queue: exit 1, the others still printed (more in
# tests/run-wqctl-metrics.sh).
expect_rc 1 "$WQCTL" metrics "$M" "missing-$$"
"$WQCTL" metrics "$M" "missing-$$" 2>/dev/null |
    grep -Fqx "workqueue_adds_total{name=\"$M\"} 2" ||
    fail "metrics with a missing queue left the others out"

# ---- usage errors ----------------------------------------------------
expect_rc 2 "$WQCTL" add "$D" --after
expect_rc 2 "$WQCTL" add "$D" --after bogus k
expect_rc 2 "$WQCTL" add "$D" --after forever k
expect_rc 2 "$WQCTL" add "$D" --after -1s k
expect_rc 2 "$WQCTL" add "$D" --after 1s --rate-limited k
expect_rc 2 "$WQCTL" add "$D" --rate-limited=yes k
expect_rc 2 "$WQCTL" forget "$D"
expect_rc 2 "$WQCTL" requeues "$D"
expect_rc 2 "$WQCTL" requeues "$D" a b
expect_rc 2 "$WQCTL" metrics
expect_rc 2 "$WQCTL" metrics "$M" "$M"
expect_rc 2 "$WQCTL" metrics "$M" --json
expect_rc 2 "$WQCTL" create "x-$$" --rl-limiters bogus
expect_rc 2 "$WQCTL" create "x-$$" --rl-limiters exponential,
expect_rc 2 "$WQCTL" create "x-$$" --rl-limiters fast-slow
expect_rc 2 "$WQCTL" create "x-$$" --rl-fast 1s
expect_rc 2 "$WQCTL" create "x-$$" --rl-qps 5 --rl-limiters exponential
expect_rc 2 "$WQCTL" create "x-$$" --rl-qps -1
expect_rc 2 "$WQCTL" create "x-$$" --rl-qps inf
expect_rc 2 "$WQCTL" create "x-$$" --rl-base 2s --rl-max 1s
expect_rc 2 "$WQCTL" create "x-$$" --rl-burst many
expect_rc 1 "$WQCTL" stat "x-$$"              # none of those created it

expect_rc 0 "$WQCTL" rm "$Q"
expect_rc 1 "$WQCTL" rm "$Q"

# ---- WQ_SHM_DIR: queues in another directory -------------------------
H="t-wqctl-h-$$"
HD="/tmp/wqctl.shmdir.$$"
mkdir -p "$HD" || fail "mkdir $HD"
expect_rc 0 env WQ_SHM_DIR="$HD" "$WQCTL" create "$H" --capacity 1000
[ -f "$HD/wq.$H" ] && [ ! -e "/dev/shm/wq.$H" ] || fail "WQ_SHM_DIR: not made in $HD"
expect_rc 1 "$WQCTL" stat "$H"                  # not in /dev/shm
expect_out "added 2, coalesced 0" env WQ_SHM_DIR="$HD" "$WQCTL" add "$H" a b
expect_out "a" env WQ_SHM_DIR="$HD" "$WQCTL" get "$H"
run env WQ_SHM_DIR="$HD" "$WQCTL" ls
has_re "$H  *1 .*"
expect_rc 1 env WQ_SHM_DIR=relative "$WQCTL" stat "$H"
grep -Fxq "wqctl: queue '$H': invalid argument (WQ_SHM_DIR 'relative': not an absolute path)" \
    "$OUT" || fail "relative WQ_SHM_DIR said: $(cat "$OUT")"
expect_rc 0 env WQ_SHM_DIR="$HD" "$WQCTL" rm "$H"
[ -z "$(ls -A "$HD")" ] || fail "WQ_SHM_DIR: left $(ls -A "$HD")"
# A tmpfs with transparent huge pages (root, and a kernel that has them
# for shmem): a queue's entries come in 2 MiB pages (the kernel's count
# of shmem huge pages rises).
if [ "$(id -u)" = 0 ] && grep -q . /sys/kernel/mm/transparent_hugepage/shmem_enabled 2>/dev/null &&
   unshare -m true 2>/dev/null; then
    unshare -m sh -c 'mount -t tmpfs -o huge=always,size=64m tmpfs "$3" || exit 9
        before=$(sed -n "s/^ShmemHugePages: *\([0-9]*\) kB/\1/p" /proc/meminfo)
        WQ_SHM_DIR=$3 "$1" create "$2" --capacity 100000 || exit 8
        seq 1 50000 | WQ_SHM_DIR=$3 "$1" add "$2" - >/dev/null || exit 7
        after=$(sed -n "s/^ShmemHugePages: *\([0-9]*\) kB/\1/p" /proc/meminfo)
        WQ_SHM_DIR=$3 "$1" check "$2" || exit 6
        echo "$before $after"' sh "$WQCTL" "$H" "$HD" >"$OUT" 2>&1
    rc=$?
    [ "$rc" = 0 ] || fail "huge-page tmpfs: exit $rc: $(cat "$OUT")"
    set -- $(tail -1 "$OUT")
    [ "$2" -ge $(($1 + 4096)) ] || fail "huge-page tmpfs: ShmemHugePages $1 -> $2 kB"
else
    echo "note: no root, no shmem huge pages or no private mount: huge-page case skipped"
fi
rmdir "$HD"

# ---- a full process table ---------------------------------------------
# Two blocked gets hold both slots of P. Commands that only look or act
# on the whole queue open it as observers (WQ_OBSERVE): they work, and
# are not counted among its processes; one that adds is refused.
expect_rc 0 "$WQCTL" create "$P" --capacity 10 --max-procs 2
timeout -k 5 120 "$WQCTL" get "$P" --timeout 1h >/dev/null 2>&1 &
GETS=$!
timeout -k 5 120 "$WQCTL" get "$P" --timeout 1h >/dev/null 2>&1 &
GETS="$GETS $!"
i=0
until "$WQCTL" stat "$P" --json 2>/dev/null | grep -q '"processes":2,'; do
    i=$((i + 1)); [ $i -lt 600 ] || fail "the two gets never attached to $P"
    sleep 0.1
done
expect_rc 1 "$WQCTL" add "$P" x
grep -Fxq "wqctl: queue '$P': process table full (max_procs handles attached)" "$OUT" ||
    fail "add to a full table said: $(cat "$OUT")"
# create --exist-ok compares the options as an observer.
expect_rc 0 "$WQCTL" create "$P" --capacity 10 --max-procs 2 --exist-ok
expect_rc 1 "$WQCTL" create "$P" --capacity 11 --exist-ok
grep -Fxq "wqctl: queue '$P' exists with capacity 10, not 11" "$OUT" ||
    fail "create --exist-ok with another capacity said: $(cat "$OUT")"
run "$WQCTL" stat "$P"
has_re 'processes  *2'
run "$WQCTL" ls
has_re "$P  *0  *0  *0  *10  *2"
run "$WQCTL" metrics "$P"
has_line "workqueue_attached_processes{name=\"$P\"} 2"
expect_rc 0 "$WQCTL" dump "$P"
expect_rc 0 "$WQCTL" check "$P"
expect_rc 0 "$WQCTL" check "$P" --repair
expect_out "0" "$WQCTL" requeues "$P" x
run "$WQCTL" result "$P" x
has_re 'state  *none'
expect_rc 0 "$WQCTL" shutdown "$P"
for pid in $GETS; do
    wait "$pid"; rc=$?
    [ "$rc" = 1 ] || fail "a get woken by the shutdown exited $rc, want 1 (nothing got)"
done
GETS=
expect_rc 0 "$WQCTL" resume "$P"
run "$WQCTL" stat "$P"
has_re 'processes  *0'
expect_rc 0 "$WQCTL" rm "$P"
echo "wqctl: 1 passed, 0 failed"
