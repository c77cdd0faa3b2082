#!/bin/sh
# mkman.sh - generate the wq(3) manual page from include/wq.h.
#
# Usage: tools/mkman.sh [-v VERSION] [-d DATE] include/wq.h > wq.3
#        tools/mkman.sh --names include/wq.h    (public functions, one a line)
#
# POSIX sh and awk only (mawk, gawk and busybox awk all do).
#
# wq.h is the manual; this script only lays it out as troff.  It relies on
# these conventions of wq.h, and needs no editing when functions, constants
# or sections are added:
#
#   1. The file starts with a block comment.  Its first text line is
#      "wq.h - one-line summary" (the summary goes to NAME).  A line in
#      capitals (a lower-case parenthesis may follow), at the comment's
#      smallest indent and after a blank line ("CRASH GUARANTEES",
#      "ERRORS (what ...)") is a heading: a subsection of DESCRIPTION, in
#      sentence case.  The text under a heading is indented two spaces more.
#   2. Everything between that comment and the first section banner
#      (include guard, #includes, the WQ_API macro) is boilerplate and is
#      left out of the page, as are preprocessor conditionals and the
#      #ifdef __cplusplus blocks.
#   3. A section banner is a rule line, one or more title lines and a rule
#      line, all at column 0:
#          /* ------------------------------------------------------ */
#          /* Title, possibly continued                               */
#          /* on a second line                                        */
#          /* ------------------------------------------------------ */
#      Each banner becomes a subsection (.SS Title) of DESCRIPTION and a
#      group of SYNOPSIS.
#   4. A block comment that starts at column 0 documents the code that
#      follows it without a blank line in between (a typedef, #defines, a
#      struct, one or more WQ_API declarations).  A comment followed by a
#      blank line stands alone (prose).  A blank line ends a declaration
#      group, except inside braces or parentheses.
#   5. Public functions are declared with WQ_API, up to the ';'.  A group
#      with a WQ_API declaration prints its code first (bold, parameter
#      names in italics), then its comment, indented.  Other groups print
#      their comment, then their code verbatim (with its comments).
#   6. Comment text: blank lines separate paragraphs; lines at the text's
#      own indent are prose and are filled.  "- " and "1. " items are lists (continuation lines aligned
#      with the item's text).  Lines indented further, lines with a gap of
#      two or more spaces inside (tables such as ERRORS) and lines that a
#      more indented line continues inside such a block are kept verbatim,
#      line by line.  `word` is set in italics; public function names and
#      WQ_* names are set in bold.
set -eu

mode=man
version=
date=
while [ $# -gt 0 ]; do
    case $1 in
    --names) mode=names; shift ;;
    -v) version=$2; shift 2 ;;
    -d) date=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "usage: mkman.sh [--names] [-v VERSION] [-d DATE] wq.h" >&2; exit 2 ;;
    *) break ;;
    esac
done
[ $# -eq 1 ] || { echo "usage: mkman.sh [--names] [-v VERSION] [-d DATE] wq.h" >&2; exit 2; }
[ -r "$1" ] || { echo "mkman.sh: cannot read $1" >&2; exit 1; }

exec awk -v mode="$mode" -v version="$version" -v date="$date" '
function rtrim(s) { sub(/[ \t]+$/, "", s); return s }
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
function spaces(n,    s) { s = ""; while (n-- > 0) s = s " "; return s }
function indent_of(s) { return match(s, /[^ ]/) ? RSTART - 1 : -1 }
function out(s) { print s }

# Escape one piece of text for troff (no font changes inside).
function esc(s,    o, i, c, n) {
    o = ""; n = length(s)
    for (i = 1; i <= n; i++) {
        c = substr(s, i, 1)
        if (c == "\\") o = o "\\e"
        else if (c == "-") o = o "\\-"
        else if (c == SQ) o = o "\\(aq"
        else if (c == "`") o = o "\\(ga"
        else if (c == "^") o = o "\\(ha"
        else if (c == "~") o = o "\\(ti"
        else o = o c
    }
    return o
}
# A text line must not start with a control character.
function lead(s) { return (s ~ /^[.]/) ? "\\&" s : s }

# Strip C comments from a code line; INC carries an open comment over.
function strip_c(s,    o, p, q) {
    o = ""
    while (s != "") {
        if (INC) {
            p = index(s, "*/")
            if (!p) return rtrim(o)
            s = substr(s, p + 2); INC = 0
            continue
        }
        p = index(s, "/*"); q = index(s, "//")
        if (q && (!p || q < p)) { o = o substr(s, 1, q - 1); break }
        if (!p) { o = o s; break }
        o = o substr(s, 1, p - 1); s = substr(s, p + 2); INC = 1
    }
    return rtrim(o)
}

function is_ident_start(c) { return c ~ /^[A-Za-z_]$/ }
function is_ident(c) { return c ~ /^[A-Za-z0-9_]$/ }

# Prose: `x` in italics, public names in bold (tick: handle backquotes).
function fmt_text(s, tick,    o, i, j, c, n, w) {
    o = ""; n = length(s); i = 1
    while (i <= n) {
        c = substr(s, i, 1)
        if (tick && c == "`" && (j = index(substr(s, i + 1), "`")) > 1) {
            o = o "\\fI" esc(substr(s, i + 1, j - 1)) "\\fR"
            i += j + 1
            continue
        }
        if (is_ident(c)) {
            j = i
            while (j <= n && is_ident(substr(s, j, 1))) j++
            w = substr(s, i, j - i)
            w = (w ~ /_/ || w ~ /[a-z][A-Z]/) ? "\\%" esc(w) : esc(w)
            if (!NOB && (substr(s, i, j - i) in BOLD)) o = o "\\fB" w "\\fR"
            else o = o w
            i = j
            continue
        }
        o = o esc(c); i++
    }
    return o
}

# Code (comments already stripped) in bold; with ital, parameter names in
# italics.  CD is the parenthesis depth, carried over lines of a statement.
function fmt_code(s, ital,    o, i, j, k, c, n, w, c0, c2, c3) {
    o = "\\fB"; n = length(s); i = 1
    while (i <= n) {
        c = substr(s, i, 1)
        if (is_ident_start(c)) {
            j = i
            while (j <= n && is_ident(substr(s, j, 1))) j++
            w = substr(s, i, j - i)
            c0 = (i > 1) ? substr(s, i - 1, 1) : ""
            k = j; while (k <= n && substr(s, k, 1) == " ") k++
            c2 = substr(s, k, 1); c3 = substr(s, k + 1, 1)
            if (ital && CD >= 1 && (c0 == " " || c0 == "*") &&
                (c2 == "," || (c2 == ")" && !(CD == 1 && c3 == "("))))
                o = o "\\fI" esc(w) "\\fB"
            else
                o = o esc(w)
            i = j
            continue
        }
        if (c == "(") CD++
        else if (c == ")") CD--
        o = o esc(c); i++
    }
    return o "\\fR"
}

# A line of a block comment, comment marks turned into spaces.
function cline(s) {
    if (s ~ /^\/\*/) s = "  " substr(s, 3)
    else if (s ~ /^ \*$/ || s ~ /^ \*[^\/]/) s = "  " substr(s, 3)
    sub(/[ \t]*\*\/[ \t]*$/, "", s)
    return rtrim(s)
}

function is_rule(s) { return s ~ /^\/\*[ ]*----+[ ]*\*\/[ \t]*$/ }
function is_heading(s) {
    return s ~ /^[A-Z][A-Z0-9 ,\/&-]*[A-Z0-9]( \(.*\))?$/
}
function sentence_case(s,    p, h) {
    p = match(s, / \(/) ? RSTART : length(s) + 1
    h = substr(s, 1, p - 1)
    return substr(h, 1, 1) tolower(substr(h, 2)) substr(s, p)
}
function title_arg(s,    t, p) {
    NOB = 1; t = fmt_text(s, 0); NOB = 0
    while ((p = index(t, "\"")) > 0) t = substr(t, 1, p - 1) "\\(dq" substr(t, p + 1)
    return "\"" t "\""
}

function is_item(s) { return s ~ /^- / || s ~ /^[0-9]+\. / }

function close_list(    k) {
    for (k = LD; k > 1; k--) out(".RE")
    LD = 0
}

# Render T[a..b] (comment text, blank lines as "") with text indent base.
function render(a, b, base,    i, r, s, mode, needpp, m, mk, w, nx) {
    mode = ""; needpp = 0; LD = 0
    for (i = a; i <= b; i++) {
        s = T[i]
        if (s == "") {
            if (mode == "verb") out(".fi")
            if (mode == "list") close_list()
            if (mode != "") needpp = 1
            mode = ""
            continue
        }
        r = indent_of(s) - base; if (r < 0) r = 0
        s = trim(s)
        if (mode == "list" && r >= LTC && !is_item(s)) {
            out(lead(fmt_text(s, 1)))
            continue
        }
        if (is_item(s)) {
            if (mode == "verb") out(".fi")
            while (LD > 0 && r < LI[LD]) { if (LD > 1) out(".RE"); LD-- }
            if (LD == 0 || r > LI[LD]) {
                if (LD >= 1) out(".RS")
                LI[++LD] = r
            }
            m = index(s, " ")
            mk = substr(s, 1, m - 1)
            if (mk == "-") out(".IP \\(bu 2")
            else out(".IP " mk " " (length(mk) + 1))
            out(lead(fmt_text(substr(s, m + 1), 1)))
            LTC = r + m; mode = "list"; needpp = 0
            continue
        }
        if (mode == "list") { close_list(); out(".PP"); mode = ""; needpp = 0 }
        nx = (i < b && T[i + 1] != "") ? indent_of(T[i + 1]) - base : -1
        if (r > 0 || s ~ /[^ ]  +[^ ]/ || (mode == "verb" && nx > 0)) {
            if (mode != "verb") {
                if (needpp) out(".PP")
                out(".nf"); mode = "verb"
            }
            out(lead(spaces(r) fmt_text(s, 0)))
        } else {
            if (mode == "verb") out(".fi")
            if (needpp) out(".PP")
            out(lead(fmt_text(s, 1)))
            mode = "prose"
        }
        needpp = 0
    }
    if (mode == "verb") out(".fi")
    if (mode == "list") close_list()
}

# Render comment c of unit u (or the top comment, u == 0, from line from).
function load_comment(u, from,    j, a, b) {
    TN = 0
    if (u == 0) for (j = from; j <= TCN; j++) T[++TN] = TC[j]
    else for (j = 1; j <= UCN[u]; j++) T[++TN] = UC[u, j]
    a = 1; while (a <= TN && T[a] == "") a++
    b = TN; while (b >= a && T[b] == "") b--
    TA = a; TB = b
}
function min_indent(a, b,    i, k, m) {
    m = -1
    for (i = a; i <= b; i++)
        if (T[i] != "") { k = indent_of(T[i]); if (m < 0 || k < m) m = k }
    return m < 0 ? 0 : m
}

function close_unit() {
    if (!cur) return
    while (UKN[U] > 0 && UK[U, UKN[U]] == "") UKN[U]--
    if (UKN[U] == 0 && UCN[U] == 0) U--
    cur = 0
}
function open_unit() {
    U++; USEC[U] = SEC; UCN[U] = 0; UKN[U] = 0; cur = 1; BD = 0; PD = 0
}
function track_depth(s,    t, i, c) {
    t = strip_c(s)
    for (i = 1; i <= length(t); i++) {
        c = substr(t, i, 1)
        if (c == "{") BD++; else if (c == "}") BD--
        else if (c == "(") PD++; else if (c == ")") PD--
    }
}

{ L[NR] = $0 }

END {
    SQ = sprintf("%c", 39)
    n = NR; i = 1
    # 1. The top comment.
    TCN = 0
    if (n > 0 && L[1] ~ /^\/\*/) {
        for (; i <= n; i++) {
            TC[++TCN] = cline(L[i])
            if (index(L[i], "*/")) { i++; break }
        }
    }
    # 2. Sections and units.
    SEC = 0; U = 0; cur = 0; INC = 0
    for (; i <= n; i++) {
        l = L[i]
        if (is_rule(l) && i + 2 <= n) {
            t = ""; j = i + 1
            while (j <= n && L[j] ~ /^\/\*.*\*\/[ \t]*$/ && !is_rule(L[j])) {
                s = L[j]; sub(/^\/\*/, "", s); sub(/\*\/[ \t]*$/, "", s)
                t = t (t == "" ? "" : " ") trim(s); j++
            }
            if (t != "" && j <= n && is_rule(L[j])) {
                close_unit()
                STITLE[++SEC] = t
                i = j
                continue
            }
        }
        if (SEC == 0) continue
        if (l ~ /^[ \t]*#[ \t]*ifdef[ \t]+__cplusplus/) {
            for (lv = 0; i <= n; i++) {
                if (L[i] ~ /^[ \t]*#[ \t]*if/) lv++
                else if (L[i] ~ /^[ \t]*#[ \t]*endif/ && --lv == 0) break
            }
            continue
        }
        if (l ~ /^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif|include|pragma|undef|error|warning)([^A-Za-z0-9_]|$)/)
            continue
        if (l ~ /^[ \t]*$/) {
            if (cur && (BD > 0 || PD > 0) && UKN[U] > 0) UK[U, ++UKN[U]] = ""
            else close_unit()
            continue
        }
        if (l ~ /^\/\*/ && !(cur && (BD > 0 || PD > 0))) {
            close_unit(); open_unit()
            for (; i <= n; i++) {
                UC[U, ++UCN[U]] = cline(L[i])
                if (index(L[i], "*/")) break
            }
            continue
        }
        if (!cur) open_unit()
        UK[U, ++UKN[U]] = rtrim(l)
        track_depth(l)
    }
    close_unit()

    # 3. Public functions and WQ_* names, per unit.
    NF_ = 0
    for (u = 1; u <= U; u++) {
        INC = 0; st = ""; UF[u] = 0
        for (k = 1; k <= UKN[u]; k++) {
            s = strip_c(UK[u, k])
            if (s !~ /^[ \t]*#/) st = st " " s
            t = s
            while (match(t, /WQ_[A-Za-z0-9_]*/)) {
                w = substr(t, RSTART, RLENGTH)
                if (w != "WQ_API") BOLD[w] = 1
                t = substr(t, RSTART + RLENGTH)
            }
        }
        while ((p = index(st, "WQ_API")) > 0) {
            st = substr(st, p + 6)
            q = index(st, ";"); d = q ? substr(st, 1, q - 1) : st
            if ((p = index(d, "(")) > 0) d = substr(d, 1, p - 1)
            else sub(/[ \t]*(\[.*|=.*)$/, "", d)
            d = rtrim(d)
            if (match(d, /[A-Za-z_][A-Za-z0-9_]*$/)) {
                w = substr(d, RSTART, RLENGTH)
                FN[++NF_] = w; BOLD[w] = 1; UF[u]++
            }
            st = q ? substr(st, q + 1) : ""
        }
    }

    if (mode == "names") {
        for (k = 1; k <= NF_; k++) print FN[k]
        exit 0
    }

    # NAME summary: the top comment first text line, "wq.h - summary".
    summary = ""; first = 0
    for (k = 1; k <= TCN; k++) if (TC[k] != "") { first = k; break }
    if (first) {
        summary = trim(TC[first])
        if ((p = index(summary, " - ")) > 0) summary = substr(summary, p + 3)
        sub(/\.$/, "", summary)
    }

    out(".\\\" Generated from include/wq.h by tools/mkman.sh: do not edit.")
    out(".\\\" Edit the comments of include/wq.h instead.")
    out(".TH WQ 3 " title_arg(date) " " title_arg("libwq" (version == "" ? "" : " " version)) \
        " \"Library Functions Manual\"")
    out(".SH NAME")
    names = "wq"
    for (k = 1; k <= NF_; k++) names = names ", \\%" esc(FN[k])
    out(names " \\- " esc(summary))
    out(".SH LIBRARY")
    out("libwq (\\fI\\-lwq\\fR; \\fIpkg\\-config \\-\\-cflags \\-\\-libs libwq\\fR)")

    out(".SH SYNOPSIS")
    out(".nf")
    out("\\fB#include <wq.h>\\fR")
    out(".fi")
    for (sec = 1; sec <= SEC; sec++) {
        started = 0; prevn = 0
        for (u = 1; u <= U; u++) {
            if (USEC[u] != sec || UKN[u] == 0) continue
            INC = 0; CD = 0; bd = 0; m = 0
            for (k = 1; k <= UKN[u]; k++) {
                s = strip_c(UK[u, k]); sub(/^WQ_API[ \t]+/, "", s)
                SL[k] = s
                if (s != "") m++
            }
            if (m == 0) continue
            if (!started) {
                out(".PP")
                out(lead("\\fI/* " esc(STITLE[sec]) " */\\fR"))
                out(".nf")
                started = 1
            } else if (prevn > 1 || m > 1) out(".sp")
            for (k = 1; k <= UKN[u]; k++) {
                s = SL[k]
                if (s == "") continue
                out(lead(fmt_code(s, bd == 0 && s !~ /^[ \t]*#/)))
                t = s; bd += gsub(/[{]/, "{", t); bd -= gsub(/[}]/, "}", t)
            }
            prevn = m
        }
        if (started) out(".fi")
    }

    out(".SH DESCRIPTION")
    # The top comment: summary line left out, headings become .SS.
    load_comment(0, first + 1)
    a = TA; b = TB
    if (a <= b) {
        hind = min_indent(a, b)
        cs = a; ch = ""
        for (k = a; k <= b + 1; k++) {
            hd = (k <= b && indent_of(T[k]) == hind && is_heading(trim(T[k])) &&
                  (k == a || T[k - 1] == ""))
            if (k == b + 1 || hd) {
                if (ch != "") out(".SS " title_arg(sentence_case(ch)))
                if (cs <= k - 1) {
                    base = min_indent(cs, k - 1)
                    if (ch != "" && base > hind + 2) base = hind + 2
                    render(cs, k - 1, base)
                }
                if (hd) { ch = trim(T[k]); cs = k + 1 }
            }
        }
    }
    for (sec = 1; sec <= SEC; sec++) {
        out(".SS " title_arg(STITLE[sec]))
        firstu = 1
        for (u = 1; u <= U; u++) {
            if (USEC[u] != sec) continue
            if (!firstu) out(".PP")
            firstu = 0
            load_comment(u)
            if (UF[u] > 0) {
                out(".nf")
                INC = 0; CD = 0; bd = 0
                for (k = 1; k <= UKN[u]; k++) {
                    s = strip_c(UK[u, k]); sub(/^WQ_API[ \t]+/, "", s)
                    if (s == "") continue
                    out(lead(fmt_code(s, bd == 0 && s !~ /^[ \t]*#/)))
                    t = s; bd += gsub(/[{]/, "{", t); bd -= gsub(/[}]/, "}", t)
                }
                out(".fi")
                if (TA <= TB) {
                    out(".RS 4")
                    render(TA, TB, min_indent(TA, TB))
                    out(".RE")
                }
            } else {
                if (TA <= TB) render(TA, TB, min_indent(TA, TB))
                if (UKN[u] > 0) {
                    if (TA <= TB) out(".PP")
                    out(".EX")
                    for (k = 1; k <= UKN[u]; k++) out(UK[u, k] == "" ? ".sp" : lead(esc(UK[u, k])))
                    out(".EE")
                }
            }
        }
    }
    out(".SH SEE ALSO")
    out(".BR wqctl (1),")
    out(".BR shm_overview (7)")
}
' "$1"
