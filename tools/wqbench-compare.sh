#!/bin/sh
# wqbench-compare.sh - two builds of libwq in one run: wqbench rounds
# alternated between them, and a Markdown table of every row's medians.
#
# Usage: tools/wqbench-compare.sh [-r ROUNDS] [-o DIR] OLD NEW [-- WQBENCH_ARGS...]
#
#   OLD, NEW  a build directory (one that `make` ran in: it holds
#             tools/wqbench), or a git revision of the repository this
#             script is in, built once (release, ./configure's defaults)
#             under $WQBENCH_COMPARE_CACHE (default ~/.cache/wqbench-compare),
#             in a directory named by its commit
#   -r N      rounds (default 3): each runs OLD's wqbench, then NEW's
#   -o DIR    where the JSON of each run goes (default: a new directory
#             under /tmp, named on stderr); the table goes to stdout
#   WQBENCH_ARGS  wqbench's own (default: --workload cycle,drain,mpmc);
#             --json is added
#
# Each build runs its own wqbench and wqbench-recover, so a row that only
# one of them has shows "-" for the other. Rounds alternate because this
# machine's speed drifts between minutes more than many changes move a
# row (tools/PERFORMANCE.md); a table cell is one run's median with its
# min..max over --reps, and the last column is the median of NEW's
# medians over the median of OLD's.
set -eu
unset CDPATH

usage() {
    echo "usage: wqbench-compare.sh [-r ROUNDS] [-o DIR] OLD NEW [-- WQBENCH_ARGS...]" >&2
    exit 2
}
die() {
    echo "wqbench-compare.sh: $*" >&2
    exit 2
}

rounds=3
out=
while [ $# -gt 0 ]; do
    case $1 in
    -r)
        [ $# -ge 2 ] || usage
        rounds=$(printf '%s' "$2" | sed 's/^0*//')   # no octal
        case $rounds in '' | *[!0-9]*) die "-r: '$2' is not a number of rounds (1 or more)" ;; esac
        shift 2
        ;;
    -o)
        [ $# -ge 2 ] || usage
        out=$2
        shift 2
        ;;
    -h | --help) usage ;;
    --) usage ;;
    -*) die "unknown option '$1'" ;;
    *) break ;;
    esac
done
[ $# -ge 2 ] || usage
old=$1 new=$2
shift 2
if [ $# -gt 0 ]; then
    [ "$1" = -- ] || die "after OLD and NEW, only '-- WQBENCH_ARGS' (got '$1')"
    shift
fi
[ $# -gt 0 ] || set -- --workload cycle,drain,mpmc

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${WQBENCH_COMPARE_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/wqbench-compare}

# A build directory for $1: itself, or its revision's (built if need be).
build_of() {
    if [ -d "$1" ]; then
        [ -x "$1/tools/wqbench" ] || die "'$1' is a directory with no tools/wqbench: not a build of libwq (run make there)"
        (cd "$1" && pwd)
        return
    fi
    # (A tree inside another checkout, as make distcheck's, is none.)
    [ "$(git -C "$repo" rev-parse --show-toplevel 2>/dev/null)" = "$repo" ] ||
        die "'$1' is no directory, and $repo is not a git checkout to find a revision in"
    sha=$(git -C "$repo" rev-parse --verify --quiet "$1^{commit}") ||
        die "'$1' is neither a build directory nor a revision of $repo"
    b=$cache/$sha
    if [ ! -e "$b/built" ]; then   # written after a make that finished
        echo "wqbench-compare.sh: building $1 ($sha) in $b" >&2
        rm -rf "$b"
        mkdir -p "$b/src" "$b/build"
        git -C "$repo" archive "$sha" | tar -x -C "$b/src"
        (cd "$b/src" && autoreconf -fi >"$b/build.log" 2>&1) &&
            (cd "$b/build" && ../src/configure -q >>"$b/build.log" 2>&1 &&
                make -j"$(nproc 2>/dev/null || echo 2)" >>"$b/build.log" 2>&1) ||
            die "building $1 failed; its log: $b/build.log"
        : >"$b/built"
    fi
    echo "$b/build"
}

ob=$(build_of "$old")
nb=$(build_of "$new")
if [ -z "$out" ]; then
    out=$(mktemp -d /tmp/wqbench-compare.XXXXXX)
    echo "wqbench-compare.sh: runs in $out" >&2
fi
mkdir -p "$out" || die "cannot make '$out'"

r=1
while [ "$r" -le "$rounds" ]; do
    for side in old new; do
        if [ $side = old ]; then b=$ob; else b=$nb; fi
        echo "wqbench-compare.sh: round $r of $rounds, $side" >&2
        WQBENCH_RECOVER=$b/tools/wqbench-recover "$b/tools/wqbench" "$@" --json \
            >"$out/$side-r$r.json" 2>"$out/$side-r$r.err" ||
            die "$side's wqbench failed in round $r; see $out/$side-r$r.err"
    done
    r=$((r + 1))
done

# One line per run and row: side round workload variant unit median min max
# (this run's rounds only: a reused DIR may hold more).
r=1
while [ "$r" -le "$rounds" ]; do
    echo "old $r"
    echo "new $r"
    r=$((r + 1))
done | while read -r side round; do
    f=$out/$side-r$round.json
    sed -n 's/^{"workload":"\([^"]*\)","variant":"\([^"]*\)","unit":"\([^"]*\)","median":\([^,]*\),"min":\([^,]*\),"max":\([^,]*\),.*/\1 \2 \3 \4 \5 \6/p' "$f" |
        while read -r w v u med mn mx; do
            echo "$side $round $w $v $u $med $mn $mx"
        done
done >"$out/rows"
[ -s "$out/rows" ] || die "no rows in wqbench's output ($out/*.json): nothing to compare"
awk -v rounds="$rounds" -v old="$old" -v new="$new" '
function fmt(x, unit) {
    if (unit == "ns" && x >= 1e6) return sprintf("%.1fms", x / 1e6)
    if (unit == "ns" && x >= 1e3) return sprintf("%.1fus", x / 1e3)
    if (x >= 1e6) return sprintf("%.2fM", x / 1e6)
    if (x >= 1e4) return sprintf("%.1fk", x / 1e3)
    if (x == int(x)) return sprintf("%d", x)
    return sprintf("%.2f", x)
}
function median(s, n,    a, i, j, t, k) {
    n = split(s, a, " ")
    for (i = 2; i <= n; i++)
        for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) {
            t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
        }
    k = int((n + 1) / 2)
    return n % 2 ? a[k] : (a[k] + a[k + 1]) / 2
}
{
    row = $3 " " $4
    if (!(row in unit)) { order[++nrows] = row; unit[row] = $5 }
    lo = fmt($7, $5); hi = fmt($8, $5)
    cell[$1, $2, row] = fmt($6, $5) (lo != hi ? " (" lo ".." hi ")" : "")
    meds[$1, row] = meds[$1, row] " " $6
}
END {
    printf "| row | unit |"
    for (r = 1; r <= rounds; r++) printf " %s r%d |", old, r
    for (r = 1; r <= rounds; r++) printf " %s r%d |", new, r
    printf " new / old |\n|---|---|"
    for (r = 1; r <= 2 * rounds + 1; r++) printf "---|"
    printf "\n"
    for (i = 1; i <= nrows; i++) {
        row = order[i]
        printf "| %s | %s |", row, unit[row]
        for (s = 0; s < 2; s++)
            for (r = 1; r <= rounds; r++) {
                side = s ? "new" : "old"
                printf " %s |", ((side, r, row) in cell) ? cell[side, r, row] : "-"
            }
        if (meds["old", row] != "" && meds["new", row] != "" && median(meds["old", row]) + 0 != 0)
            printf " %.3f |\n", median(meds["new", row]) / median(meds["old", row])
        else
            printf " - |\n"
    }
}' "$out/rows"
