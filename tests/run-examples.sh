#!/bin/sh
# The programs of examples/ run and print what examples/README.md says:
#   controller   every key synced or dropped after 5 retries, the web key
#                coalesced, 7 retries counted, a failure count forgotten;
#   producer + 2 workers   every key processed exactly once, over both
#                worker processes, and both leave after the shutdown;
#   task-runner + task-client   results polled from another process:
#                SUCCEEDED with the runner's message, FAILED with its
#                code, RUNNING seen on the way; wqctl reads the same result.
# Every program runs under a hard timeout; queues are removed at exit.
set -u
b="${top_builddir:-.}"
case $b in /*) ;; *) b="$PWD/$b" ;; esac
EX="$b/examples"
WQCTL="$b/tools/wqctl"
T="${TMPDIR:-/tmp}/run-examples.$$"
P="t-examples-$$"
QUEUES="ctl jobs tasks"
pids=

cleanup() {
    for p in $pids; do kill -9 "$p" 2>/dev/null; done
    for q in $QUEUES; do
        "$WQCTL" rm "$P-$q" >/dev/null 2>&1 || rm -f "/dev/shm/wq.$P-$q"
    done
    rm -rf "$T"
}
fail() { echo "FAIL: $*"; cleanup; trap - EXIT; exit 1; }
trap cleanup EXIT
mkdir -p "$T" || fail "mkdir $T"
for p in controller producer worker task-runner task-client; do
    [ -x "$EX/$p" ] || fail "no program $EX/$p"
done
# has FILE LINE: FILE has exactly this line.
has() { grep -qxF "$2" "$1" || { cat "$1"; fail "no line '$2' in $1"; }; }

# 1. controller.
timeout -k 5 60 "$EX/controller" "$P-ctl" > "$T/ctl" 2>&1 ||
    { cat "$T/ctl"; fail "controller exited $?"; }
has "$T/ctl" "default/web added again: coalesced"
has "$T/ctl" "default/web: synced"
has "$T/ctl" "default/db: synced"
has "$T/ctl" "default/flaky: error syncing, retry 2 of 5"
has "$T/ctl" "default/flaky: synced"
has "$T/ctl" "default/broken: error syncing, retry 5 of 5"
has "$T/ctl" "default/broken: dropped after 5 retries"
has "$T/ctl" "adds 11, coalesced 1, retries 7"
has "$T/ctl" "default/flaky failure count after forget: 0"
[ "$(grep -c 'synced$' "$T/ctl")" = 3 ] || { cat "$T/ctl"; fail "controller: not 3 syncs"; }
grep -q 'flaky: error syncing, retry 3' "$T/ctl" && fail "controller: flaky retried 3 times"
[ ! -e "/dev/shm/wq.$P-ctl" ] || fail "controller left its queue behind"
echo "ok 1 controller"

# 2. Two workers, then a producer of 2000 keys that shuts the queue down.
N=2000
timeout -k 5 60 "$EX/worker" "$P-jobs" > "$T/w1" 2> "$T/w1.err" & w1=$!
timeout -k 5 60 "$EX/worker" "$P-jobs" > "$T/w2" 2> "$T/w2.err" & w2=$!
pids="$w1 $w2"
timeout -k 5 60 "$EX/producer" "$P-jobs" $N > "$T/prod" 2>&1 ||
    { cat "$T/prod"; fail "producer exited $?"; }
has "$T/prod" "producer: added $N keys (0 coalesced)"
wait $w1 || { cat "$T/w1.err"; fail "worker 1 exited $?"; }
wait $w2 || { cat "$T/w2.err"; fail "worker 2 exited $?"; }
pids=
i=0
while [ $i -lt $N ]; do printf 'job-%05d\n' $i; i=$((i + 1)); done > "$T/want"
cat "$T/w1" "$T/w2" | sort > "$T/got"
dups=$(uniq -d "$T/got" | head -3 | tr '\n' ' ')
[ -z "$dups" ] || fail "keys processed twice: $dups"
cmp -s "$T/want" "$T/got" ||
    fail "workers processed $(wc -l < "$T/got") keys, want the $N added (diff: $(diff "$T/want" "$T/got" | head -3 | tr '\n' ' '))"
echo "ok 2 producer and two workers: $N keys, each once ($(wc -l < "$T/w1") + $(wc -l < "$T/w2"))"

# 3. A task runner and a client that polls results.
printf 'one\ntwo\nthree\n' > "$T/three-lines"
: > "$T/empty"
timeout -k 5 60 "$EX/task-runner" "$P-tasks" 2> "$T/runner.err" & runner=$!
pids=$runner
timeout -k 5 60 "$EX/task-client" "$P-tasks" "$T/three-lines" "$T/missing" "$T/empty" \
    > "$T/client" 2>&1
rc=$?
[ $rc = 1 ] || { cat "$T/client"; fail "task-client exited $rc, want 1 (one task failed)"; }
has "$T/client" "$T/three-lines: SUCCEEDED: 3 lines"
has "$T/client" "$T/empty: SUCCEEDED: 0 lines"
has "$T/client" "$T/missing: FAILED (code 2): cannot open $T/missing: No such file or directory"
grep -q ': RUNNING$' "$T/client" || { cat "$T/client"; fail "task-client never saw a task RUNNING"; }
# The result stays in the queue for any process that asks.
"$WQCTL" result "$P-tasks" "$T/three-lines" > "$T/result" 2>&1 || fail "wqctl result exited $?"
grep -q '^message  *3 lines$' "$T/result" || { cat "$T/result"; fail "wqctl result: no message '3 lines'"; }
"$WQCTL" shutdown "$P-tasks" >/dev/null || fail "wqctl shutdown exited $?"
wait $runner || { cat "$T/runner.err"; fail "task-runner exited $?"; }
pids=
echo "ok 3 task-runner and task-client"
exit 0
