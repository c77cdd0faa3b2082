#!/bin/sh
# check-abi.sh - the public functions are one set: the WQ_API declarations
# of include/wq.h, the global names of src/libwq.map, and the functions the
# built libwq.so exports (nm -D --defined-only, T/W/i symbols).
# Prints each name that is not in all three, with where it is missing, and
# exits 1 then.  Environment: top_srcdir, top_builddir (default: from $0
# and "."), NM, LIBWQ_SO (default $top_builddir/src/.libs/libwq.so).
set -u
top_srcdir=${top_srcdir:-$(dirname "$0")/..}
top_builddir=${top_builddir:-.}
hdr=$top_srcdir/include/wq.h
map=$top_srcdir/src/libwq.map
lib=${LIBWQ_SO:-$top_builddir/src/.libs/libwq.so}
NM=${NM:-nm}

if [ ! -e "$lib" ]; then
    echo "SKIP: no shared library at $lib (built with --disable-shared?)"
    exit 77
fi
tmp=${TMPDIR:-/tmp}/check-abi.$$
mkdir "$tmp" || exit 99
trap 'rm -rf "$tmp"' EXIT

awk -v what=functions -f "$top_srcdir/tests/public-names.awk" "$hdr" | sort -u > "$tmp/header" ||
    { echo "FAIL: cannot read the WQ_API names of $hdr"; exit 1; }

# Version script: names ended by ';' in the global part of every node.
# Comments (# and /* */) are dropped; patterns and extern blocks are
# reported, they cannot be compared by name.
awk '
{ sub(/#.*/, ""); text = text " " $0 }
END {
    while ((p = index(text, "/*")) > 0) {
        q = index(substr(text, p + 2), "*/")
        text = substr(text, 1, p - 1) " " (q ? substr(text, p + 2 + q + 1) : "")
    }
    gsub(/[{}:;]/, " & ", text)
    n = split(text, tok, /[ \t\n]+/)
    depth = 0; global = 1
    for (i = 1; i <= n; i++) {
        t = tok[i]
        if (t == "") continue
        if (t == "{") { depth++; if (depth == 1) global = 1; continue }
        if (t == "}") { depth--; continue }
        if (depth == 0) continue
        if (t == "global" && tok[i + 1] == ":") { global = 1; i++; continue }
        if (t == "local" && tok[i + 1] == ":") { global = 0; i++; continue }
        if (t == ";") continue
        if (!global) continue
        if (t ~ /^[A-Za-z_][A-Za-z0-9_]*$/) print t
        else print "libwq.map: cannot compare pattern or block: " t > "/dev/stderr"
    }
}' "$map" | sort -u > "$tmp/map" || { echo "FAIL: cannot read $map"; exit 1; }

$NM -D --defined-only "$lib" > "$tmp/nm.out" 2>"$tmp/nm.err" ||
    { cat "$tmp/nm.err"; echo "FAIL: $NM -D --defined-only $lib failed"; exit 1; }
awk 'NF >= 3 && $2 ~ /^[TWi]$/ { s = $3; sub(/@.*/, "", s); print s }' "$tmp/nm.out" |
    sort -u > "$tmp/lib"

sort -u "$tmp/header" "$tmp/map" "$tmp/lib" > "$tmp/all"
status=0
while read -r name; do
    miss=""
    grep -qx "$name" "$tmp/header" || miss="${miss:+$miss; }not declared WQ_API in include/wq.h"
    grep -qx "$name" "$tmp/map" || miss="${miss:+$miss; }not global in src/libwq.map"
    grep -qx "$name" "$tmp/lib" || miss="${miss:+$miss; }not exported by $(basename "$lib")"
    if [ -n "$miss" ]; then
        echo "ABI mismatch: $name: $miss"
        status=1
    fi
done < "$tmp/all"

n=$(wc -l < "$tmp/all")
if [ "$status" = 0 ]; then
    echo "PASS: $n public functions, identical in include/wq.h, src/libwq.map and $lib"
else
    echo "FAIL: include/wq.h ($(wc -l < "$tmp/header")), src/libwq.map ($(wc -l < "$tmp/map")) and $(basename "$lib") ($(wc -l < "$tmp/lib")) differ"
fi
exit $status
