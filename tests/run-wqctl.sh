#!/bin/sh
# wqctl end to end: exact outputs and exit codes.
set -u
WQCTL="${top_builddir:-.}/tools/wqctl"
Q="t-wqctl-$$"
fail() { echo "FAIL: $*"; "$WQCTL" rm "$Q" >/dev/null 2>&1; exit 1; }
expect_rc() { want=$1; shift; "$@" >/tmp/wqctl.out.$$ 2>&1; rc=$?; [ "$rc" = "$want" ] || { cat /tmp/wqctl.out.$$; fail "'$*' exited $rc, want $want"; }; }
trap 'rm -f /tmp/wqctl.out.$$; "$WQCTL" rm "$Q" >/dev/null 2>&1' EXIT

expect_rc 0 "$WQCTL" create "$Q" --capacity 100 --max-key-len 32
expect_rc 1 "$WQCTL" create "$Q" --capacity 100
expect_rc 2 "$WQCTL" create
expect_rc 2 "$WQCTL" frobnicate
expect_rc 1 "$WQCTL" stat "bad/name"
expect_rc 1 "$WQCTL" stat "missing-$$"
expect_rc 0 "$WQCTL" add "$Q" a b a c
printf 'd\ne\na\n' | "$WQCTL" add "$Q" - >/dev/null || fail "add from stdin"
out=$("$WQCTL" stat "$Q" --json) || fail "stat"
echo "$out" | grep -q '"queued": *5' || fail "stat queued: $out"
echo "$out" | grep -q '"coalesced_total": *2' || fail "stat coalesced: $out"
expect_rc 0 "$WQCTL" dump "$Q"
first=$("$WQCTL" dump "$Q" | sed -n 2p)   # line 1 is the column header
echo "$first" | grep -q 'a' || fail "dump order: $first"
got=$("$WQCTL" get "$Q") || fail "get"
[ "$got" = "a" ] || fail "get returned '$got', want a"
expect_rc 0 "$WQCTL" check "$Q"
expect_rc 0 "$WQCTL" ls
expect_rc 0 "$WQCTL" rm "$Q"
expect_rc 1 "$WQCTL" rm "$Q"
echo "wqctl: 1 passed, 0 failed"
