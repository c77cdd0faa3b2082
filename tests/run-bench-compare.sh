#!/bin/sh
# tools/wqbench-compare.sh: the table from two builds (rows, rounds, the
# ratio column, the JSON kept); every usage error and bad input named,
# with exit status 2; and, in a git checkout, a revision built once and
# found in the cache the second time.
set -u
unset CDPATH
src=$(cd "${top_srcdir:-.}" && pwd)
b=$(cd "${top_builddir:-.}" && pwd)
cmp=$src/tools/wqbench-compare.sh
tmp=$(mktemp -d /tmp/wq-bcmp.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "PASS: $1"; }
bad() { echo "FAIL: $1"; fail=$((fail + 1)); }

# Two builds (the same one twice), two rounds, one row.
"$cmp" -r 2 -o "$tmp/out" "$b" "$b" -- --workload cycle --variant memory --reps 2 --n 20000 \
    >"$tmp/table" 2>"$tmp/err"
rc=$?
num='[0-9][0-9.]*[kM]\{0,1\}'
cell="$num\( ($num\.\.$num)\)\{0,1\}"
if [ $rc = 0 ] && [ "$(wc -l <"$tmp/table")" = 3 ] &&
    [ "$(sed -n 1p "$tmp/table")" = "| row | unit | $b r1 | $b r2 | $b r1 | $b r2 | new / old |" ] &&
    [ "$(sed -n 2p "$tmp/table")" = "|---|---|---|---|---|---|---|" ] &&
    sed -n 3p "$tmp/table" |
    grep -q "^| cycle memory | cycles/s | $cell | $cell | $cell | $cell | [0-9]\.[0-9][0-9][0-9] |\$"; then
    ok "table of two builds"
else
    bad "table of two builds (exit $rc)"; cat "$tmp/table" "$tmp/err"
fi
n=0
for f in old-r1 old-r2 new-r1 new-r2; do
    grep -q '^{"workload":"cycle","variant":"memory",' "$tmp/out/$f.json" && n=$((n + 1))
done
if [ $n = 4 ]; then ok "each run's JSON kept"; else bad "each run's JSON kept ($n of 4)"; fi
# The same DIR again with one round: round 2's files are not this run's.
"$cmp" -r 1 -o "$tmp/out" "$b" "$b" -- --workload cycle --variant memory --reps 1 --n 20000 \
    >"$tmp/table" 2>"$tmp/err"
rc=$?
if [ $rc = 0 ] && [ "$(wc -l <"$tmp/out/rows")" = 2 ] &&
    [ "$(sed -n 1p "$tmp/table")" = "| row | unit | $b r1 | $b r1 | new / old |" ]; then
    ok "a DIR reused: this run's rounds only"
else
    bad "a DIR reused (exit $rc)"; cat "$tmp/table" "$tmp/err" "$tmp/out/rows"
fi

# Usage errors and bad input: exit 2, the cause named on stderr.
expect_err() {
    name=$1 want=$2
    shift 2
    "$cmp" "$@" >"$tmp/o" 2>"$tmp/e"
    rc=$?
    if [ $rc = 2 ] && [ ! -s "$tmp/o" ] && grep -qF -- "$want" "$tmp/e"; then
        ok "$name"
    else
        bad "$name (exit $rc)"; echo "wanted: $want"; cat "$tmp/o" "$tmp/e"
    fi
}
expect_err "no arguments" "usage: wqbench-compare.sh [-r ROUNDS] [-o DIR] OLD NEW"
expect_err "one build" "usage: wqbench-compare.sh" "$b"
expect_err "rounds 0" "wqbench-compare.sh: -r: '0' is not a number of rounds (1 or more)" -r 0 "$b" "$b"
expect_err "rounds not a number" "-r: 'x2' is not a number of rounds" -r x2 "$b" "$b"
expect_err "rounds 00" "-r: '00' is not a number of rounds (1 or more)" -r 00 "$b" "$b"
expect_err "unknown option" "wqbench-compare.sh: unknown option '-x'" -x "$b" "$b"
expect_err "junk after the builds" "after OLD and NEW, only '-- WQBENCH_ARGS' (got '--reps')" \
    "$b" "$b" --reps 1
mkdir "$tmp/empty"
expect_err "a directory that is no build" \
    "'$tmp/empty' is a directory with no tools/wqbench: not a build of libwq (run make there)" \
    "$tmp/empty" "$b"
# A checkout of its own (make distcheck's tree sits inside one and is none).
checkout=false
[ "$(git -C "$src" rev-parse --show-toplevel 2>/dev/null)" = "$src" ] && checkout=true
if $checkout; then
    expect_err "no such revision" \
        "'no-such-rev-$$' is neither a build directory nor a revision of $src" "no-such-rev-$$" "$b"
else
    expect_err "no such revision" \
        "'no-such-rev-$$' is no directory, and $src is not a git checkout" "no-such-rev-$$" "$b"
fi
# wqbench prints no row (a workload it skips whole): nothing to compare.
expect_err "no rows" "wqbench-compare.sh: no rows in wqbench's output ($tmp/none/*.json): nothing to compare" \
    -r 1 -o "$tmp/none" "$b" "$b" -- --workload cycle --variant no-such-variant
expect_err "wqbench refuses its arguments" "old's wqbench failed in round 1; see $tmp/bad/old-r1.err" \
    -r 1 -o "$tmp/bad" "$b" "$b" -- --workload no-such-workload

# A revision, built once into the cache (a release build of the commit
# under test), then found there.
if $checkout && command -v autoreconf >/dev/null; then
    export WQBENCH_COMPARE_CACHE="$tmp/cache"
    sha=$(git -C "$src" rev-parse HEAD)
    for pass in 1 2; do
        "$cmp" -r 1 -o "$tmp/rev$pass" HEAD "$b" -- --workload cycle --variant memory --reps 1 \
            --n 20000 >"$tmp/table" 2>"$tmp/err"
        rc=$?
        built=$(grep -c "^wqbench-compare.sh: building HEAD ($sha) in $tmp/cache/$sha\$" "$tmp/err")
        if [ $rc = 0 ] && [ "$built" = $((2 - pass)) ] &&
            [ -x "$tmp/cache/$sha/build/tools/wqbench" ] && [ -e "$tmp/cache/$sha/built" ] &&
            [ "$(sed -n 1p "$tmp/table")" = "| row | unit | HEAD r1 | $b r1 | new / old |" ] &&
            sed -n 3p "$tmp/table" | grep -q "^| cycle memory | cycles/s | $cell | $cell | [0-9]\.[0-9][0-9][0-9] |\$"
        then
            ok "a revision, pass $pass (built $built time)"
        else
            bad "a revision, pass $pass (exit $rc, built $built times)"; cat "$tmp/table" "$tmp/err"
            tail -20 "$tmp/cache/$sha/build.log" 2>/dev/null
        fi
    done
else
    echo "SKIP: a revision (not a git checkout, or no autoreconf)"
fi
echo "bench-compare: $fail failed"
[ $fail = 0 ]
