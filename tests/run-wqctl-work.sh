#!/bin/sh
# wqctl work end to end: outcomes and results, {} and WQ_KEY, timeouts,
# requeues, -j concurrency, --exit-when-empty, signals, usage errors.
# Every wqctl work runs under a hard timeout; queues are removed at exit.
set -u
WQCTL="${top_builddir:-.}/tools/wqctl"
case $WQCTL in /*) ;; *) WQCTL="$PWD/$WQCTL" ;; esac
T="${TMPDIR:-/tmp}/wqctl-work.$$"   # scratch files of the tasks
P="t-work-$$"                        # queue name prefix
QUEUES="ok fail slow requeue req42 conc empty drain stop nf cap slots"
passed=0
wpid=

cleanup() {
    [ -n "$wpid" ] && kill -9 "$wpid" 2>/dev/null
    for q in $QUEUES; do
        "$WQCTL" rm "$P-$q" >/dev/null 2>&1 || rm -f "/dev/shm/wq.$P-$q"
    done
    rm -rf "$T"
}
fail() { echo "FAIL: $*"; cleanup; trap - EXIT; exit 1; }
ok() { passed=$((passed + 1)); }
trap cleanup EXIT
mkdir -p "$T" || fail "mkdir $T"

now_ms() { date +%s%3N; }
lines() { wc -l < "$1" | tr -d ' '; }
# alive PID: the process exists and is not a zombie (whose parent, maybe
# a PID 1 that reaps nothing, has not collected it).
alive() {
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
# field Q KEY NAME: a field of `wqctl result` (text output).
field() { "$WQCTL" result "$1" "$2" | sed -n "s/^$3  *//p"; }
# expect_field Q KEY NAME WANT
expect_field() {
    got=$(field "$1" "$2" "$3")
    [ "$got" = "$4" ] || fail "result $2: $3 is '$got', want '$4'"
    ok
}
# expect_rc RC CMD...: CMD exits with RC (under a hard timeout).
expect_rc() {
    want=$1; shift
    timeout -k 5 30 "$@" >"$T/out" 2>&1; rc=$?
    [ "$rc" = "$want" ] || { cat "$T/out"; fail "'$*' exited $rc, want $want"; }
    ok
}
# wait_until DESC CMD...: poll CMD every 50 ms for up to 15 s.
wait_until() {
    desc=$1; shift
    i=0
    until "$@" >/dev/null 2>&1; do
        i=$((i + 1))
        [ $i -lt 300 ] || fail "timed out waiting until $desc"
        sleep 0.05
    done
}
# start_work Q ARGS...: wqctl work in the background, $wpid; a watchdog
# SIGKILLs it after 30 s.
start_work() {
    "$WQCTL" work "$@" >"$T/work.out" 2>"$T/work.err" &
    wpid=$!
    ( i=0; while [ $i -lt 300 ] && kill -0 $wpid 2>/dev/null; do
          sleep 0.1; i=$((i + 1)); done
      kill -9 $wpid 2>/dev/null ) >/dev/null 2>&1 &
}
# end_work RC: wait for the background wqctl work; it exits with RC.
end_work() {
    wait $wpid; rc=$?
    wpid=
    [ "$rc" = "$1" ] || { cat "$T/work.err"; fail "wqctl work exited $rc, want $1"; }
    ok
}
requeues_at_least() { [ "$("$WQCTL" requeues "$1" "$2")" -ge "$3" ]; }
code_is() { [ "$(field "$1" "$2" code)" = "$3" ]; }
state_code_is() {
    [ "$(field "$1" "$2" state)" = "$3" ] && [ "$(field "$1" "$2" code)" = "$4" ]
}

# ---- success: message, {} substitution, WQ_KEY, stdout, stderr echo ----
Q="$P-ok"
expect_rc 0 "$WQCTL" create "$Q" --rl-base 1ms
expect_rc 0 "$WQCTL" add "$Q" k1 "k 2" quiet
expect_rc 0 "$WQCTL" work "$Q" -j 2 --exit-when-empty -- sh -c '
    [ "$WQ_KEY" = quiet ] && exit 0
    echo "out:$1:$WQ_KEY:$WQ_QUEUE:$2"
    read x && echo "stdin not empty" >&2
    echo "first line" >&2
    echo "last line of $WQ_KEY" >&2
    echo "   " >&2' sh "pre-{}-{}" "{}"
grep -qxF "out:pre-k1-k1:k1:$Q:k1" "$T/out" || { cat "$T/out"; fail "{} or WQ_KEY (k1)"; }
ok
grep -qxF "out:pre-k 2-k 2:k 2:$Q:k 2" "$T/out" || { cat "$T/out"; fail "{} or WQ_KEY (k 2)"; }
ok
grep -qxF "first line" "$T/out" || fail "task stderr not echoed"
ok
grep -q "stdin not empty" "$T/out" && fail "task stdin is not /dev/null"
ok
expect_field "$Q" k1 state succeeded
expect_field "$Q" k1 code 0
expect_field "$Q" k1 message "last line of k1"
expect_field "$Q" "k 2" message "last line of k 2"
expect_field "$Q" quiet message ok
field "$Q" k1 updated |
    grep -qx '20[0-9][0-9]-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]\.[0-9][0-9][0-9]Z' ||
    fail "updated is not ISO 8601 UTC with ms: $(field "$Q" k1 updated)"
ok
out=$("$WQCTL" result "$Q" k1 --json) || fail "result --json"
printf '%s\n' "$out" | grep -qx '{"name":"'"$Q"'","key":"k1","state":"succeeded","code":0,"updated":"[-0-9T:.]*Z","updated_ns":[0-9]*,"message":"last line of k1"}' ||
    fail "result --json: $out"
ok
expect_field "$Q" unknown state none
expect_rc 0 "$WQCTL" result "$Q" unknown
"$WQCTL" stat "$Q" | grep -qx 'results  *3' || fail "stat results"
ok
"$WQCTL" stat "$Q" --json | grep -q '"results":3,"result_capacity":65536,' ||
    fail "stat --json results"
ok
"$WQCTL" stat "$Q" | grep -qx 'shutting_down  *no' || fail "--exit-when-empty shut the queue down"
ok
"$WQCTL" dump "$Q" | grep -q '^-  *idle  *-  *-  *0  *succeeded 0  *k1$' ||
    { "$WQCTL" dump "$Q"; fail "dump result columns"; }
ok
"$WQCTL" dump "$Q" --json | grep -qF '"key":"k1","state":["idle"],"position":null,"owner_pid":null,"ready_in_ns":null,"failures":0,"result":"succeeded","result_code":0,"result_message":"last line of k1"}' ||
    { "$WQCTL" dump "$Q" --json; fail "dump --json result fields"; }
ok

# ---- failure: exit 3 is recorded and retried rate limited --------------
# f fails once, then its second run waits for a go file and succeeds;
# g always fails. The queue is shut down from outside.
Q="$P-fail"
expect_rc 0 "$WQCTL" create "$Q" --rl-base 1ms
expect_rc 0 "$WQCTL" add "$Q" f g
start_work "$Q" -j 2 -- sh -c '
    echo x >> "$0/runs.$WQ_KEY"
    if [ "$WQ_KEY" = g ]; then echo "g is broken" >&2; exit 3; fi
    if [ ! -e "$0/f.failed" ]; then touch "$0/f.failed"; echo boom >&2; exit 3; fi
    i=0; while [ ! -e "$0/go" ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done
    echo fixed >&2' "$T"
wait_until "f runs again after failing with 3" state_code_is "$Q" f running 3
expect_field "$Q" f message boom
requeues_at_least "$Q" f 1 || fail "f: requeues $("$WQCTL" requeues "$Q" f), want >= 1"
ok
wait_until "g fails twice" requeues_at_least "$Q" g 2
touch "$T/go"
wait_until "f succeeds" state_code_is "$Q" f succeeded 0
expect_field "$Q" f message fixed
[ "$("$WQCTL" requeues "$Q" f)" = 0 ] || fail "f: failure count not forgotten"
ok
[ "$(lines "$T/runs.f")" = 2 ] || fail "f ran $(lines "$T/runs.f") times, want 2"
ok
expect_rc 0 "$WQCTL" shutdown "$Q"
end_work 0
expect_field "$Q" g state failed
expect_field "$Q" g code 3
expect_field "$Q" g message "g is broken"
requeues_at_least "$Q" g 2 || fail "g: requeues"
ok
"$WQCTL" stat "$Q" --json | grep -q '"retries_total":[1-9]' || fail "retries_total"
ok
grep -qxF "g is broken" "$T/work.err" || fail "failing task's stderr not echoed"
ok

# ---- timeout: SIGTERM, then SIGKILL after 1 s; code 124 ----------------
# t1 dies on SIGTERM, t2 ignores it; a key with a NUL byte cannot run.
Q="$P-slow"
expect_rc 0 "$WQCTL" create "$Q" --rl-base 1ms
expect_rc 0 "$WQCTL" add "$Q" t1 t2
printf 'nu\000l\n' | "$WQCTL" add "$Q" - >/dev/null || fail "add a key with a NUL byte"
t0=$(now_ms)
start_work "$Q" -j 3 --timeout 200ms -- sh -c '
    [ "$1" = t2 ] && trap "" TERM
    sleep 5' sh {}
wait_until "t1 times out" code_is "$Q" t1 124
t1=$(now_ms)
[ $((t1 - t0)) -lt 2500 ] || fail "t1 timed out after $((t1 - t0)) ms"
ok
wait_until "t2 is killed" code_is "$Q" t2 124
t2=$(now_ms)
[ $((t2 - t0)) -lt 4000 ] || fail "t2 killed after $((t2 - t0)) ms"
ok
[ $((t2 - t0)) -ge 1000 ] || fail "t2 ignores SIGTERM but died after $((t2 - t0)) ms"
ok
expect_field "$Q" t1 message "timed out after 200ms"
expect_rc 0 "$WQCTL" shutdown "$Q"
end_work 0
expect_field "$Q" t1 state failed
expect_field "$Q" t2 state failed
expect_field "$Q" t2 code 124
"$WQCTL" dump "$Q" --json | grep -qF '"key":"nu\u0000l","state":["failing"],"position":null,"owner_pid":null,"ready_in_ns":null,"failures":' ||
    { "$WQCTL" dump "$Q" --json; fail "NUL key state"; }
ok
"$WQCTL" dump "$Q" --json | grep -q '"key":"nu\\u0000l",[^}]*"result":"failed","result_code":126,"result_message":"[^"]*NUL byte' ||
    { "$WQCTL" dump "$Q" --json; fail "NUL key result"; }
ok

# ---- requeue: exit 75 asks to run again after --requeue-after ---------
Q="$P-requeue"
expect_rc 0 "$WQCTL" create "$Q"
expect_rc 0 "$WQCTL" add "$Q" r
expect_rc 0 "$WQCTL" work "$Q" --requeue-after 300ms --exit-when-empty -- sh -c '
    date +%s%3N >> "$0/r.times"
    [ -e "$0/r.once" ] && { echo "second run" >&2; exit 0; }
    touch "$0/r.once"; exit 75' "$T"
[ "$(lines "$T/r.times")" = 2 ] || fail "r ran $(lines "$T/r.times") times, want 2"
ok
gap=$(($(sed -n 2p "$T/r.times") - $(sed -n 1p "$T/r.times")))
[ $gap -ge 280 ] || fail "r ran again after $gap ms, want >= 300"
ok
expect_field "$Q" r state succeeded
expect_field "$Q" r message "second run"
[ "$("$WQCTL" requeues "$Q" r)" = 0 ] || fail "a requeue is not a failure"
ok
# --requeue-status: another status; 75 is then a failure.
Q="$P-req42"
expect_rc 0 "$WQCTL" create "$Q" --rl-base 1ms
expect_rc 0 "$WQCTL" add "$Q" a b
expect_rc 0 "$WQCTL" work "$Q" --requeue-status 42 --requeue-after 10ms --exit-when-empty -- sh -c '
    [ -e "$0/$1.once" ] && exit 0
    touch "$0/$1.once"
    [ "$1" = a ] && exit 42
    exit 75' "$T" {}
expect_field "$Q" a state succeeded
expect_field "$Q" a code 0
"$WQCTL" stat "$Q" --json | grep -q '"retries_total":2,' ||
    fail "want one requeue (a) and one rate limited retry (b)"
ok

# ---- -j 4: 8 keys in two waves of exactly 4 --------------------------
# Concurrency is proven by a barrier, not by a wall-clock bound (a loaded
# or sanitized machine may take any time to spawn): each task takes a
# ticket (mkdir is atomic) and waits until the whole wave of 4 it belongs
# to has started. Tickets 5-8 can only all start while 5-7 still wait, so
# every task passing its barrier means 4 ran at once; a task that finds 5
# running means -j was exceeded. A wave that never fills gives up after
# 5 s and says so (within the 30 s the work command is given).
Q="$P-conc"
mkdir -p "$T/running" "$T/tickets"
expect_rc 0 "$WQCTL" create "$Q"
expect_rc 0 "$WQCTL" add "$Q" c1 c2 c3 c4 c5 c6 c7 c8
t0=$(now_ms)
expect_rc 0 "$WQCTL" work "$Q" -j 4 --exit-when-empty -- sh -c '
    touch "$0/running/$1"; ls "$0/running" | wc -l >> "$0/conc"
    n=1; until mkdir "$0/tickets/$n" 2>/dev/null; do n=$((n + 1)); done
    want=$(( (n + 3) / 4 * 4 )); i=0
    while [ "$(ls "$0/tickets" | wc -l)" -lt $want ]; do
        i=$((i + 1)); [ $i -gt 500 ] && { echo "$1 timeout" >> "$0/barrier"; exit 1; }
        sleep 0.01
    done
    echo "$1 passed $n" >> "$0/barrier"
    sleep 0.3; rm -f "$0/running/$1"' "$T" {}
el=$(($(now_ms) - t0))
! grep -q timeout "$T/barrier" || fail "-j 4: a wave never reached 4 tasks: $(grep timeout "$T/barrier" | tr '\n' ' ')"
ok
[ "$(grep -c passed "$T/barrier")" = 8 ] || fail "-j 4: $(grep -c passed "$T/barrier") tasks passed the barrier, want 8"
ok
[ "$(sed 's/.* passed //' "$T/barrier" | sort -n | tr '\n' ' ')" = "1 2 3 4 5 6 7 8 " ] ||
    fail "-j 4: tickets $(sed 's/.* passed //' "$T/barrier" | sort -n | tr '\n' ' ')"
ok
[ $el -ge 600 ] || fail "-j 4: two waves of 0.3 s took only $el ms"
ok
max=$(sort -n "$T/conc" | tail -n 1 | tr -d ' ')
[ "$max" -le 4 ] || fail "-j 4: up to $max tasks at once"
ok
[ "$(lines "$T/conc")" = 8 ] || fail "-j 4: $(lines "$T/conc") tasks ran, want 8"
ok
for k in c1 c2 c3 c4 c5 c6 c7 c8; do expect_field "$Q" $k state succeeded; done

# ---- --exit-when-empty on an empty queue -------------------------------
Q="$P-empty"
expect_rc 0 "$WQCTL" create "$Q"
expect_rc 0 "$WQCTL" work "$Q" -j 2 --exit-when-empty -- false
"$WQCTL" stat "$Q" | grep -qx 'shutting_down  *no' || fail "--exit-when-empty shut the queue down"
ok

# ---- -j N on a queue created with --max-procs N -------------------------
# wqctl gives its own process slot up while its workers run; a monitor
# only looks and takes none. One more job than slots is refused.
Q="$P-slots"
expect_rc 0 "$WQCTL" create "$Q" --max-procs 2
for k in m1 m2 m3 m4; do expect_rc 0 "$WQCTL" add "$Q" $k; done
timeout -k 5 30 "$WQCTL" work "$Q" -j 2 --exit-when-empty -- sh -c 'echo "$WQ_KEY"' \
    >"$T/slots" 2>"$T/slots.err" || { cat "$T/slots.err"; fail "work -j 2 with --max-procs 2"; }
[ "$(sort "$T/slots" | tr '\n' ' ')" = "m1 m2 m3 m4 " ] || fail "-j 2 ran: $(tr '\n' ' ' < "$T/slots")"
ok
for k in m1 m2 m3 m4; do expect_field "$Q" $k state succeeded; done
"$WQCTL" stat "$Q" | grep -qx 'processes  *0' || fail "processes after work: $("$WQCTL" stat "$Q")"
ok
expect_rc 1 "$WQCTL" work "$Q" -j 3 --exit-when-empty -- true
[ "$(cat "$T/out")" = "wqctl: queue '$Q': -j 3 needs 3 free process slots, 2 of 2 are free (see create --max-procs)" ] ||
    fail "-j 3: $(cat "$T/out")"
ok

# ---- signals: the first stops this work, not the queue (exit 0): the task
# running finishes, queued keys stay queued for the next work; the second
# stops at once (exit 130) ----
Q="$P-drain"
expect_rc 0 "$WQCTL" create "$Q"
expect_rc 0 "$WQCTL" add "$Q" d1 d2 d3
# d1 runs until the signal was sent (a fixed sleep raced with slow polls:
# d2 could start before the signal, and the running task finishes).
start_work "$Q" -- sh -c 'while [ ! -e "$0/drain-go" ]; do sleep 0.02; done' "$T"
wait_until "d1 runs" state_code_is "$Q" d1 running 0
kill -TERM $wpid
sleep 0.2   # the supervisor has taken the signal before d1 ends
touch "$T/drain-go"
end_work 0
expect_field "$Q" d1 state succeeded
for k in d2 d3; do expect_field "$Q" $k state pending; done
"$WQCTL" stat "$Q" | grep -qx 'shutting_down  *no' || fail "a signal to work shut the queue down"
"$WQCTL" stat "$Q" | grep -qx 'queued  *2' || fail "the queued keys did not stay queued"
ok
expect_rc 0 "$WQCTL" work "$Q" --exit-when-empty -- true   # the next work finishes them
for k in d2 d3; do expect_field "$Q" $k state succeeded; done
Q="$P-stop"
expect_rc 0 "$WQCTL" create "$Q"
expect_rc 0 "$WQCTL" add "$Q" s1 s2
start_work "$Q" -j 2 -- sh -c 'sleep 10 & echo $! > "$0/child.$1"; wait' "$T" {}
wait_until "tasks started" test -s "$T/child.s1" -a -s "$T/child.s2"
t0=$(now_ms)
kill -TERM $wpid
sleep 0.2
kill -TERM $wpid
end_work 130
[ $(($(now_ms) - t0)) -lt 3000 ] || fail "second signal did not stop at once"
ok
sleep 0.2
for k in s1 s2; do
    alive "$(cat "$T/child.$k")" && fail "a task's child outlived the stop"
done
ok

# ---- a command that cannot be run: 127, the reason as message ----------
Q="$P-nf"
expect_rc 0 "$WQCTL" create "$Q" --rl-base 1ms
expect_rc 0 "$WQCTL" add "$Q" k
start_work "$Q" -- "$T/no-such-command" {}
wait_until "the exec failure is recorded" code_is "$Q" k 127
field "$Q" k message | grep -q "no-such-command: No such file or directory" ||
    fail "exec failure message: $(field "$Q" k message)"
ok
expect_rc 0 "$WQCTL" shutdown "$Q"
end_work 0

# ---- create --result-capacity: older results are evicted ---------------
Q="$P-cap"
expect_rc 0 "$WQCTL" create "$Q" --result-capacity 2
expect_rc 0 "$WQCTL" add "$Q" a b c
expect_rc 0 "$WQCTL" work "$Q" --exit-when-empty -- true
"$WQCTL" stat "$Q" --json | grep -q '"results":2,"result_capacity":2,' ||
    fail "result capacity: $("$WQCTL" stat "$Q" --json)"
ok
expect_field "$Q" a state none
expect_field "$Q" c state succeeded

# ---- usage and operational errors --------------------------------------
Q="$P-ok"
expect_rc 2 "$WQCTL" work
expect_rc 2 "$WQCTL" work "$Q"
expect_rc 2 "$WQCTL" work "$Q" -j 2
expect_rc 2 "$WQCTL" work "$Q" -j 0 -- true
expect_rc 2 "$WQCTL" work "$Q" -j x -- true
expect_rc 2 "$WQCTL" work "$Q" -j 1025 -- true
expect_rc 2 "$WQCTL" work "$Q" -j
expect_rc 2 "$WQCTL" work "$Q" --timeout bogus -- true
expect_rc 2 "$WQCTL" work "$Q" --timeout 0 -- true
expect_rc 2 "$WQCTL" work "$Q" --requeue-status 0 -- true
expect_rc 2 "$WQCTL" work "$Q" --requeue-status 256 -- true
expect_rc 2 "$WQCTL" work "$Q" --requeue-after 0 -- true
expect_rc 2 "$WQCTL" work "$Q" --frobnicate -- true
expect_rc 2 "$WQCTL" work "$Q" -x -- true
expect_rc 2 "$WQCTL" work "$Q" -- ""
expect_rc 2 "$WQCTL" result "$Q"
expect_rc 2 "$WQCTL" result "$Q" a b
expect_rc 2 "$WQCTL" create "$P-x" --result-capacity many
expect_rc 1 "$WQCTL" work "missing-$$" -- true
expect_rc 1 "$WQCTL" work "bad/name" -- true
expect_rc 1 "$WQCTL" result "missing-$$" k
expect_rc 1 "$WQCTL" result "$Q" "$(printf '%0300d' 0)"   # > max_key_len
expect_rc 1 "$WQCTL" work "$Q" -j 1000 -- true           # max_procs 256
# Options after CMD belong to CMD.
expect_rc 0 "$WQCTL" help work
expect_rc 0 "$WQCTL" shutdown "$P-empty"    # so that work returns at once
expect_rc 0 "$WQCTL" work "$P-empty" echo -j 0

echo "wqctl-work: $passed passed, 0 failed"
