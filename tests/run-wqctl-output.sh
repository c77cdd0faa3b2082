#!/bin/sh
# wqctl output that scripts use: keys printed raw when stdout is not a
# terminal (escaped on one; --raw / --escaped force either, -0 ends
# records with NUL), so `key=$(wqctl get q)` hands the key back to wqctl
# intact; `work`'s {q} placeholder quotes a key for sh; every --json
# output is valid JSON whatever bytes the keys hold.
set -u
WQCTL="${top_builddir:-.}/tools/wqctl"
case $WQCTL in /*) ;; *) WQCTL="$PWD/$WQCTL" ;; esac
Q="t-wqo-$$"
W="t-wqo-w-$$"
DIR=$(mktemp -d "${TMPDIR:-/tmp}/wqctl-output.XXXXXX") || exit 99
cleanup() {
    for q in "$Q" "$W"; do
        "$WQCTL" rm "$q" >/dev/null 2>&1 || rm -f "/dev/shm/wq.$q"
    done
    rm -rf "$DIR"
}
fail() { echo "FAIL: $*"; cleanup; trap - EXIT; exit 1; }
trap cleanup EXIT

# JSON checker: python3, else jq; the test is skipped without both.
if command -v python3 >/dev/null 2>&1; then
    json_ok() { python3 -m json.tool >/dev/null; }
elif command -v jq >/dev/null 2>&1; then
    json_ok() { jq . >/dev/null; }
else
    echo "SKIP: neither python3 nor jq to check JSON"; exit 77
fi

bs='dir\file'
utf=$(printf 'caf\303\251')
sp='a b'
tab=$(printf 'x\ty')
q1='say "hi"'
ctl=$(printf 'c\001\033[31m')
bin=$(printf 'b\377\376')
"$WQCTL" create "$Q" --capacity 100 --max-key-len 64 || fail "create"

# ---- get: raw when piped, and back into wqctl -----------------------------
for k in "$bs" "$utf" "$sp" "$tab" "$q1" "$ctl" "$bin"; do
    "$WQCTL" add "$Q" -- "$k" >/dev/null || fail "add '$k'"
    key=$("$WQCTL" get "$Q") || fail "get '$k'"
    [ "$key" = "$k" ] || fail "get printed '$key', want '$k'"
    n=$("$WQCTL" requeues "$Q" "$key") || fail "requeues of '$key'"
    [ "$n" = 0 ] || fail "requeues of '$key': $n"
    "$WQCTL" result "$Q" "$key" > "$DIR/r" || fail "result of '$key'"
    [ "$(sed -n 1p "$DIR/r")" = "key      $k" ] || fail "result printed $(sed -n 1p "$DIR/r")"
    "$WQCTL" result "$Q" "$key" --json | json_ok || fail "result --json of '$key'"
done
# --escaped, and the default on a terminal (script(1) gives one).
"$WQCTL" add "$Q" "$bs" "$utf" >/dev/null || fail "add"
[ "$("$WQCTL" get "$Q" --escaped)" = 'dir\\file' ] || fail "get --escaped"
if command -v script >/dev/null 2>&1; then
    got=$(script -qec "$WQCTL get $Q" /dev/null | tr -d '\r')
    [ "$got" = 'caf\xc3\xa9' ] || fail "get on a terminal printed '$got'"
else
    "$WQCTL" get "$Q" >/dev/null
    echo "note: no script(1): the terminal default is not checked"
fi
# -0: NUL-terminated, raw; a key with a newline survives.
nl=$(printf 'l1\nl2')
"$WQCTL" add "$Q" "$nl" >/dev/null || fail "add"
"$WQCTL" get "$Q" -0 > "$DIR/g" || fail "get -0"
printf 'l1\nl2\000' | cmp -s - "$DIR/g" || fail "get -0 printed $(od -c "$DIR/g")"
"$WQCTL" get "$Q" --raw --escaped >/dev/null 2>&1
[ $? = 2 ] || fail "--raw --escaped is not a usage error"
"$WQCTL" dump "$Q" --json -0 >/dev/null 2>&1
[ $? = 2 ] || fail "dump --json -0 is not a usage error"

# ---- dump: the same rules ----------------------------------------------------
"$WQCTL" add "$Q" "$bs" "$nl" >/dev/null || fail "add"
"$WQCTL" dump "$Q" > "$DIR/d" || fail "dump"
grep -q ' dir\\file$' "$DIR/d" || fail "dump (piped) is not raw: $(cat "$DIR/d")"
"$WQCTL" dump "$Q" --escaped > "$DIR/d" || fail "dump --escaped"
grep -q ' dir\\\\file$' "$DIR/d" || fail "dump --escaped: $(cat "$DIR/d")"
grep -q ' l1\\x0al2$' "$DIR/d" || fail "dump --escaped: $(cat "$DIR/d")"
"$WQCTL" dump "$Q" -0 | tr '\0' '\n' | tail -n 2 | grep -q '^l2$' || fail "dump -0"
[ "$("$WQCTL" dump "$Q" -0 | tr -cd '\0' | wc -c)" = 3 ] || fail "dump -0: not 3 records"

# ---- --json: valid whatever the keys hold ----------------------------------------
for k in "$q1" "$ctl" "$bin" "$tab" 'back\slash' "$utf"; do
    "$WQCTL" add "$Q" -- "$k" >/dev/null || fail "add '$k'"
done
"$WQCTL" dump "$Q" --json > "$DIR/j" || fail "dump --json"
json_ok < "$DIR/j" || fail "dump --json is not JSON: $(cat "$DIR/j")"
if command -v python3 >/dev/null 2>&1; then
    # Each byte b is U+00bb: the keys come back exactly.
    python3 -c '
import json, sys
keys = [k["key"].encode("latin-1") for k in json.load(open(sys.argv[1]))["keys"]]
for want in sys.argv[2:]:
    w = want.encode("utf-8", "surrogateescape")
    assert w in keys, (w, keys)
' "$DIR/j" "$q1" "$ctl" "$bin" "$tab" 'back\slash' "$utf" || fail "dump --json keys: $(cat "$DIR/j")"
fi
for c in "stat $Q" "ls" "check $Q" "result $Q $bin"; do
    # shellcheck disable=SC2086
    "$WQCTL" $c --json > "$DIR/j" || fail "$c --json"
    json_ok < "$DIR/j" || fail "$c --json is not JSON: $(cat "$DIR/j")"
done
# A fair queue's tenants are key bytes too.
"$WQCTL" create "$W" --fair --max-key-len 64 >/dev/null || fail "create --fair"
"$WQCTL" add "$W" "$bin/x" "$q1/y" "$ctl/z" >/dev/null || fail "add (fair)"
for c in stat dump; do
    "$WQCTL" $c "$W" --json > "$DIR/j" || fail "$c --json (fair)"
    json_ok < "$DIR/j" || fail "$c --json (fair) is not JSON: $(cat "$DIR/j")"
done
"$WQCTL" rm "$W" || fail "rm"

# ---- work: {q} quotes for sh, $WQ_KEY needs no quoting ------------------------
"$WQCTL" create "$W" --capacity 10 >/dev/null || fail "create"
cd "$DIR" || fail "cd"
"$WQCTL" add "$W" 'a;touch x' >/dev/null || fail "add"
out=$("$WQCTL" work "$W" --exit-when-empty -- sh -c 'echo {q}' 2>/dev/null) ||
    fail "work {q}"
[ ! -e x ] || fail "work {q}: the key ran as shell code"
[ "$out" = 'a;touch x' ] || fail "work {q} echoed '$out'"
"$WQCTL" resume "$W" >/dev/null 2>&1
"$WQCTL" add "$W" "it's \$(touch y) \`touch z\`" >/dev/null || fail "add"
out=$("$WQCTL" work "$W" --exit-when-empty -- sh -c 'printf "%s|%s\n" {q} "$WQ_KEY"' 2>/dev/null) ||
    fail "work {q} with quotes"
[ ! -e y ] && [ ! -e z ] || fail "work: the key ran as shell code"
[ "$out" = "it's \$(touch y) \`touch z\`|it's \$(touch y) \`touch z\`" ] ||
    fail "work printed '$out'"
cd / || fail "cd"
exit 0
