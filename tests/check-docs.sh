#!/bin/sh
# check-docs.sh - the manual pages cover what they must:
#  1. every WQ_API function of include/wq.h is in the NAME section of the
#     generated wq.3 (so it has a link page) and in its DESCRIPTION, and
#     every #define WQ_* and enum WQ_* value appears in its DESCRIPTION;
#  2. every name(3) reference of tools/wqctl.1 to a libwq page (wq...)
#     names a page that make install provides: wq.3 and one link page per
#     public function (tools/mkman.sh --names);
#  3. every command in wqctl's usage (wqctl help) has an entry in the
#     COMMANDS section of wqctl.1, and every entry there is a command;
#  4. when groff is installed, wq.3 and wqctl.1 format without warnings;
#  5. in a build tree (a Makefile there), the man pages that make install
#     really installs (into a temporary DESTDIR): every libwq page cited
#     by wqctl.1 or wq.3, name(3) for wq* and name(1) for wq*, is one of
#     them, every link page's .so names an installed page, and man(1), if
#     present, finds wq_add_after(3) there.
# Also printed, and failing unless WQ_DOCS_STRICT=0: public functions
# with no comment and constants that no comment explains.
# Environment: top_srcdir, top_builddir (default: from $0 and ".").
set -u
top_srcdir=${top_srcdir:-$(dirname "$0")/..}
top_builddir=${top_builddir:-.}
hdr=$top_srcdir/include/wq.h
man3=$top_builddir/wq.3
man1=$top_srcdir/tools/wqctl.1
wqctl=$top_builddir/tools/wqctl
names_awk=$top_srcdir/tests/public-names.awk

status=0
fail() { echo "FAIL: $*"; status=1; }

for f in "$hdr" "$man3" "$man1" "$names_awk"; do
    [ -r "$f" ] || { echo "FAIL: cannot read $f"; exit 1; }
done
tmp=${TMPDIR:-/tmp}/check-docs.$$
mkdir "$tmp" || exit 99
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT

# troff source -> words: comments dropped, font and no-break escapes
# removed, the character escapes the generator uses turned back.
plain() {
    sed -e '/^\.\\"/d' \
        -e 's/\\f[BIRP]//g' -e 's/\\f(..//g' -e 's/\\f\[[^]]*\]//g' \
        -e 's/\\[%&]//g' -e 's/\\-/-/g' -e 's/\\(aq/'"'"'/g' \
        -e 's/\\(ga/`/g' -e 's/\\(dq/"/g' -e 's/\\e/\\/g' "$@"
}
plain "$man3" > "$tmp/wq3"
# The NAME section, and everything from DESCRIPTION on.
awk '/^\.SH/ { sec = $0; next } sec ~ /^\.SH "?NAME/' "$tmp/wq3" |
    tr -c 'A-Za-z0-9_\n' '\n' | sort -u > "$tmp/name-words"
awk '/^\.SH/ { sec = $0 } sec ~ /^\.SH "?DESCRIPTION/, 0' "$tmp/wq3" |
    tr -c 'A-Za-z0-9_\n' '\n' | sort -u > "$tmp/desc-words"

# 1. Functions and constants of the header in wq.3.
awk -v what=functions -f "$names_awk" "$hdr" > "$tmp/functions" ||
    { echo "FAIL: cannot read the functions of $hdr"; exit 1; }
awk -v what=constants -f "$names_awk" "$hdr" > "$tmp/constants" ||
    { echo "FAIL: cannot read the constants of $hdr"; exit 1; }
nf=0; nc=0
while read -r f; do
    nf=$((nf + 1))
    grep -qx "$f" "$tmp/name-words" || fail "wq.3: $f is not in NAME (no wq_*.3 link page for it)"
    grep -qx "$f" "$tmp/desc-words" || fail "wq.3: $f is not in DESCRIPTION"
done < "$tmp/functions"
while read -r c; do
    nc=$((nc + 1))
    grep -qx "$c" "$tmp/desc-words" || fail "wq.3: constant $c is not in DESCRIPTION"
done < "$tmp/constants"
[ "$nf" -gt 0 ] || fail "no WQ_API function found in $hdr"

# Comments the header lacks (fatal unless WQ_DOCS_STRICT=0).
awk -v what=undocumented -f "$names_awk" "$hdr" > "$tmp/undocumented"
while read -r kind name; do
    if [ "$kind" = function ]; then
        msg="include/wq.h: function $name has no comment (nothing describes it in wq.3)"
    else
        msg="include/wq.h: constant $name is explained by no comment (none on its line, no mention)"
    fi
    if [ "${WQ_DOCS_STRICT:-1}" = 1 ]; then fail "$msg"; else echo "WARNING: $msg"; fi
done < "$tmp/undocumented"

# 2. name(3) references in wqctl.1 against the installed pages.
{ echo wq; sh "$top_srcdir/tools/mkman.sh" --names "$hdr"; } | sort -u > "$tmp/pages" ||
    { echo "FAIL: tools/mkman.sh --names failed"; exit 1; }
plain "$man1" | sed -e 's/"//g' |
    awk '{ s = $0
           while (match(s, /[A-Za-z_][A-Za-z0-9_.:-]*[ ]*\(3[a-z]*\)/)) {
               r = substr(s, RSTART, RLENGTH); sub(/[ ]*\(.*/, "", r); print r
               s = substr(s, RSTART + RLENGTH) } }' | sort -u > "$tmp/refs"
nr=0
while read -r r; do
    case $r in
    wq*) nr=$((nr + 1))
         grep -qx "$r" "$tmp/pages" || fail "wqctl.1: $r(3) is referenced but make install provides no $r.3" ;;
    *)   echo "note: wqctl.1 refers to $r(3), not a libwq page: not checked" ;;
    esac
done < "$tmp/refs"

# 3. wqctl's commands against the COMMANDS section of wqctl.1.
if [ -x "$wqctl" ]; then
    "$wqctl" help > "$tmp/usage" 2>&1 || fail "'$wqctl help' exited $?"
    awk '/^Commands:/ { on = 1; next } on && /^[ \t]*$/ { exit }
         on && /^  [A-Za-z0-9][A-Za-z0-9_-]*( |$)/ { print $1 }' "$tmp/usage" |
        sort -u > "$tmp/commands"
    [ -s "$tmp/commands" ] || fail "no command list in the output of '$wqctl help'"
    # Entries: the tag of each .TP at the section's own level (not inside
    # .RS/.RE, where the options are); its first word is the command.
    plain "$man1" | awk '
        /^\.SH/ { on = ($0 ~ /^\.SH "?COMMANDS/); depth = 0; next }
        !on { next }
        /^\.RS/ { depth++; next }
        /^\.RE/ { if (depth > 0) depth--; next }
        /^\.TP/ { tag = (depth == 0); next }
        tag { tag = 0; s = $0; sub(/^\.[A-Z]+[ \t]*/, "", s); gsub(/"/, "", s)
              split(s, w, /[ \t]+/)
              if (w[1] != "" && w[1] !~ /^-/) print w[1] }' | sort -u > "$tmp/entries"
    while read -r c; do
        grep -qx "$c" "$tmp/entries" || fail "wqctl.1: command '$c' (wqctl help) has no entry in COMMANDS"
    done < "$tmp/commands"
    while read -r c; do
        grep -qx "$c" "$tmp/commands" || fail "wqctl.1: COMMANDS has an entry '$c' that wqctl help does not list"
    done < "$tmp/entries"
else
    fail "no wqctl program at $wqctl"
fi

# 4. Formatting warnings (groff-base; skipped without it).
if command -v groff >/dev/null 2>&1; then
    for page in "$man3" "$man1"; do
        LC_ALL=C groff -man -ww -z "$page" > "$tmp/groff" 2>&1
        if [ -s "$tmp/groff" ]; then
            sed 's/^/  /' "$tmp/groff"
            fail "groff reports warnings for $page"
        fi
    done
else
    echo "note: groff not installed, formatting warnings not checked"
fi

# 5. What make install installs. References of both pages, any section.
ni=0
if [ -f "$top_builddir/Makefile" ]; then
    dest=$tmp/dest
    # A make of its own: not the jobserver or variables of the make that
    # runs this test.
    if ! (unset MAKEFLAGS MFLAGS MAKELEVEL
          ${MAKE:-make} -s -C "$top_builddir" install-man install-man3-links \
              DESTDIR="$dest") > "$tmp/install" 2>&1; then
        sed 's/^/  /' "$tmp/install"
        fail "make install-man install-man3-links DESTDIR=... failed"
    fi
    m3=$(find "$dest" -type d -name man3 | head -n 1)
    mandir=${m3%/man3}
    if [ -z "$m3" ] || [ ! -d "$mandir/man1" ]; then
        fail "make install-man installed no man3 and man1 directories under $dest"
    else
        plain "$man1" "$man3" | sed -e 's/"//g' |
            awk '{ s = $0
                   while (match(s, /wq[A-Za-z0-9_.-]*[ ]*\([0-9][a-z]*\)/)) {
                       r = substr(s, RSTART, RLENGTH); gsub(/[ ()]/, " ", r)
                       split(r, w, / +/); print w[1], substr(w[2], 1, 1)
                       s = substr(s, RSTART + RLENGTH) } }' | sort -u > "$tmp/cited"
        while read -r page sec; do
            ni=$((ni + 1))
            [ -f "$mandir/man$sec/$page.$sec" ] ||
                fail "$page($sec) is cited but make install installs no man$sec/$page.$sec"
        done < "$tmp/cited"
        for f in "$mandir"/man3/*.3 "$mandir"/man1/*.1; do
            so=$(sed -n 's/^\.so[ ]*//p' "$f" | head -n 1)
            [ -z "$so" ] || [ -f "$mandir/$so" ] ||
                fail "installed ${f#"$mandir"/} is '.so $so', which is not installed"
        done
        if command -v man >/dev/null 2>&1; then
            MANPAGER=cat MANWIDTH=80 man -M "$mandir" 3 wq_add_after > "$tmp/man" 2>&1
            grep -q 'wq_add_after' "$tmp/man" ||
                { sed 's/^/  /' "$tmp/man" | head; fail "man -M $mandir 3 wq_add_after does not show wq(3)"; }
        else
            echo "note: man not installed, 'man 3 wq_add_after' not tried"
        fi
    fi
else
    echo "note: no Makefile in $top_builddir, installed pages not checked"
fi

if [ "$status" = 0 ]; then
    echo "PASS: $nf functions and $nc constants in wq.3, $nr libwq references in wqctl.1," \
         "$(wc -l < "$tmp/commands") wqctl commands documented, $ni cited pages installed"
fi
exit $status
