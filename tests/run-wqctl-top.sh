#!/bin/sh
# wqctl top in a real terminal: a private tmux server runs it, send-keys
# drives it, capture-pane reads what it drew. Exact numbers: depth, the
# processing key with its holder's pid (found from outside, through the
# process tree) and liveness, the next keys; switching queues, a resize,
# q quits with status 0. Then --once, a missing queue, and no terminal.
# Without tmux: skipped (77), except in CI (CI=true), where that fails.
set -u
WQCTL="${top_builddir:-.}/tools/wqctl"
case $WQCTL in /*) ;; *) WQCTL="$PWD/$WQCTL" ;; esac
A="t-top-a-$$"
B="t-top-b-$$"
MARK="wqtop-mark-$$"
SOCK="wqtop-$$"
DIR=$(mktemp -d "${TMPDIR:-/tmp}/wqctl-top.XXXXXX") || exit 99
PASS=0
WORK_PID=
T() { tmux -L "$SOCK" -f /dev/null "$@"; }
cleanup() {
    T kill-server >/dev/null 2>&1
    [ -n "$WORK_PID" ] && kill -9 "$WORK_PID" 2>/dev/null
    pkill -9 -f "$MARK" 2>/dev/null
    for q in "$A" "$B"; do
        "$WQCTL" rm "$q" >/dev/null 2>&1 || rm -f "/dev/shm/wq.$q"
    done
    rm -rf "$DIR"
}
fail() {
    echo "FAIL: $*"
    [ -s "$DIR/screen" ] && { echo "--- the screen:"; cat "$DIR/screen"; }
    cleanup; trap - EXIT; echo "wqctl-top: $PASS passed, 1 failed"; exit 1
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM
ok() { PASS=$((PASS + 1)); }

if ! command -v tmux >/dev/null 2>&1; then
    [ "${CI:-}" = true ] && { echo "run-wqctl-top: tmux not found (tools/deps.sh installs it)"; exit 1; }
    echo "run-wqctl-top: tmux not found: skipped (sh tools/deps.sh installs it)"
    exit 77
fi

# screen_has ERE [SECONDS]: poll the pane until a line matches (60 s).
screen_has() {
    end=$(( $(date +%s) + ${2:-60} ))
    while :; do
        T capture-pane -p -t top > "$DIR/screen" 2>/dev/null
        grep -Eq -- "$1" "$DIR/screen" && return 0
        [ "$(date +%s)" -ge "$end" ] && return 1
        sleep 0.1
    done
}

"$WQCTL" create "$A" --capacity 100 >/dev/null || fail "create $A"
"$WQCTL" create "$B" --capacity 50 >/dev/null || fail "create $B"
"$WQCTL" add "$A" a b c >/dev/null || fail "add $A"
"$WQCTL" add "$B" k1 >/dev/null || fail "add $B"
# A key processing in $B, held by a worker of wqctl work: the holder is
# the parent of the command it runs (sh, marked by its $0).
"$WQCTL" work "$B" -j 1 -- sh -c 'sleep 300' "$MARK" >/dev/null 2>&1 &
WORK_PID=$!
end=$(( $(date +%s) + 60 ))
HOLDER=
while [ -z "$HOLDER" ]; do
    sh_pid=$(pgrep -f "^sh -c sleep 300 $MARK\$" | head -1)
    [ -n "$sh_pid" ] && HOLDER=$(ps -o ppid= -p "$sh_pid" | tr -d ' ')
    [ "$(date +%s)" -ge "$end" ] && fail "the worker never took k1"
    [ -z "$HOLDER" ] && sleep 0.1
done

# ---- the live view ----------------------------------------------------
T new-session -d -s top -x 120 -y 40 \
    "$WQCTL top $A $B --interval 200ms; echo \$? > $DIR/exit; sleep 60" ||
    fail "tmux new-session"
# The table: exact numbers for both queues.
screen_has "^$A +3 +[0-9.]+ +0\\.0 +0 +- +0 +0 +0 open\$" ||
    fail "row of $A (depth 3) not shown"
ok
screen_has "^$B +0 +[0-9.]+ +0\\.0 +1 +[0-9.]+(ms|s) +0 +0 +0 open\$" ||
    fail "row of $B (1 processing) not shown"
ok
# The chosen queue (the first): its next keys in order, nothing processing.
screen_has "^$A: 3 live of 100, 0 attached\$" || fail "detail title of $A"
grep -Eq '^ 1 a$' "$DIR/screen" && grep -Eq '^ 2 b$' "$DIR/screen" &&
    grep -Eq '^ 3 c$' "$DIR/screen" || fail "next keys of $A"
ok
# Keys move: the view follows.
"$WQCTL" add "$A" d e >/dev/null || fail "add d e"
screen_has "^$A +5 " || fail "depth 5 not shown after two adds"
screen_has "^ 5 e\$" || fail "next key e not shown"
ok
# Down chooses $B: its processing key, the holder's pid, alive.
T send-keys -t top Down
# (attached: wqctl work's one worker; its supervisor gave its slot up)
screen_has "^$B: 1 live of 50, 1 attached\$" || fail "Down did not choose $B"
screen_has "^k1 +$HOLDER +yes +[0-9.]+(ms|s)\$" || fail "k1 held by $HOLDER not shown"
ok
# A resize redraws to the new size (the title fits 80 columns' width).
T resize-window -t top -x 80 -y 24 2>/dev/null || T refresh-client -C 80,24
screen_has "^wqctl top - 2 queues, every 0\\.2s" || fail "no title after the resize"
awk 'length > 80 { bad = 1 } END { exit bad }' "$DIR/screen" || fail "lines wider than 80 after the resize"
[ "$(wc -l < "$DIR/screen")" -le 24 ] || fail "more than 24 lines after the resize"
screen_has "^k1 +$HOLDER " || fail "detail lost after the resize"
ok
# + doubles the interval.
T send-keys -t top +
screen_has "every 0\\.4s" || fail "+ did not double the interval"
ok
# q quits, status 0.
T send-keys -t top q
end=$(( $(date +%s) + 60 ))
while [ ! -s "$DIR/exit" ]; do
    [ "$(date +%s)" -ge "$end" ] && fail "q did not end wqctl top"
    sleep 0.1
done
[ "$(cat "$DIR/exit")" = 0 ] || fail "wqctl top exited $(cat "$DIR/exit") after q"
ok
T kill-server >/dev/null 2>&1

# ---- --once -----------------------------------------------------------
out=$("$WQCTL" top "$A" --once --interval 100ms 2>&1) || fail "--once exited $?: $out"
printf '%s\n' "$out" > "$DIR/once"
head -1 "$DIR/once" | grep -Eq '^QUEUE +DEPTH +ADD/s +DONE/s +PROC +OLDEST +WAIT +FAIL +CRASH +STATE$' ||
    fail "--once header: $out"
sed -n 2p "$DIR/once" | grep -Eq "^$A +5 +0\\.0 +0\\.0 +0 +- +0 +0 +0 open\$" ||
    fail "--once row: $out"
grep -Eq "^$A: 5 live of 100, 0 attached\$" "$DIR/once" || fail "--once detail: $out"
[ "$(grep -Ec '^ [1-5] [a-e]$' "$DIR/once")" = 5 ] || fail "--once next keys: $out"
grep -q "$(printf '\033')" "$DIR/once" && fail "--once printed escape sequences"
ok
# A missing queue: its row says so, stderr names it, status 1; the other
# queue is shown all the same.
"$WQCTL" top "$A" "t-top-nope-$$" --once --interval 100ms >"$DIR/o" 2>"$DIR/e"
rc=$?
[ "$rc" = 1 ] || fail "--once with a missing queue exited $rc"
grep -Eq "^t-top-nope-$$ +missing: no such queue\$" "$DIR/o" || fail "missing row: $(cat "$DIR/o")"
grep -Eq "^$A +5 " "$DIR/o" || fail "the other queue not shown: $(cat "$DIR/o")"
[ "$(cat "$DIR/e")" = "wqctl: queue 't-top-nope-$$': no such queue" ] || fail "stderr: $(cat "$DIR/e")"
ok
# No terminal, no --once: a usage error that says what to do.
"$WQCTL" top "$A" </dev/null >"$DIR/o" 2>"$DIR/e"
rc=$?
[ "$rc" = 2 ] || fail "top without a terminal exited $rc"
grep -q "the live view needs a terminal (--once prints one frame)" "$DIR/e" ||
    fail "no-terminal message: $(cat "$DIR/e")"
ok
"$WQCTL" top --interval 10ms --once >/dev/null 2>"$DIR/e"
[ $? = 2 ] && grep -q -- "--interval must be at least 100ms" "$DIR/e" || fail "short interval: $(cat "$DIR/e")"
ok

echo "wqctl-top: $PASS passed, 0 failed"
