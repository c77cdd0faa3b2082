# public-names.awk - the public names of include/wq.h, for the checks.
#
#   awk -v what=functions -f public-names.awk wq.h   WQ_API declarations
#   awk -v what=constants -f public-names.awk wq.h   #define WQ_* and enum WQ_*
#   awk -v what=undocumented -f public-names.awk wq.h
#       functions without a comment block right before their declaration
#       group, and constants with neither a comment on their own line nor a
#       mention in any comment of the header ("function NAME" /
#       "constant NAME", one a line)
#
# Deliberately independent of tools/mkman.sh, so that the doc check also
# checks the generator.  Plain C reading: comments and preprocessor
# conditionals are dropped, statements are split at ';'.  Left out as not
# part of the API: the include guard (a #define with no value) and WQ_API
# itself (the export macro).
function flush_stmt(    s, name, p) {
    s = stmt; stmt = ""
    if (s ~ /(^|[^A-Za-z0-9_])WQ_API([^A-Za-z0-9_]|$)/) {
        sub(/.*WQ_API/, "", s)
        if ((p = index(s, "(")) > 0) s = substr(s, 1, p - 1)
        else { sub(/=.*$/, "", s); sub(/\[.*$/, "", s) }
        sub(/[ \t]+$/, "", s)
        if (match(s, /[A-Za-z_][A-Za-z0-9_]*$/)) {
            name = substr(s, RSTART, RLENGTH)
            if (!(name in seenf)) { seenf[name] = 1; fn[++nfn] = name; fdoc[name] = stmt_doc }
        }
    } else if (s ~ /^[ \t]*(typedef[ \t]+)?enum[^{]*[{]/) {
        sub(/^[^{]*[{]/, "", s); sub(/[}].*$/, "", s)
        n = split(s, parts, ",")
        for (p = 1; p <= n; p++) {
            e = parts[p]; sub(/^[ \t]+/, "", e)
            if (match(e, /^WQ_[A-Za-z0-9_]*/)) { e = substr(e, 1, RLENGTH); add_const(e, e in enumdoc) }
        }
    }
}
function add_const(name, documented) {
    if (name in seenc) return
    seenc[name] = 1; cn[++ncn] = name; cdoc[name] = documented
}
function words_of_comment(s,    w) {
    while (match(s, /[A-Za-z_][A-Za-z0-9_]*/)) {
        w = substr(s, RSTART, RLENGTH); mentioned[w] = 1
        s = substr(s, RSTART + RLENGTH)
    }
}
BEGIN { inbanner = 0; incomment = 0; stmt = ""; group_doc = 0; stmt_doc = 0 }
{
    line = $0
    # Blank line: a declaration group ends (a comment block may follow).
    if (!incomment && line ~ /^[ \t]*$/) { group_doc = 0; next }
    # Section banners (rule, title, rule) document nothing.
    if (!incomment && line ~ /^\/\*[ ]*----+[ ]*\*\/[ \t]*$/) { inbanner = !inbanner; group_doc = 0; next }
    if (inbanner) { words_of_comment(line); next }
    # A comment block that starts a line documents the group it opens.
    if (!incomment && line ~ /^\/\*/) group_doc = 1
    # Preprocessor lines (with continuations).
    if (!incomment && (line ~ /^[ \t]*#/ || cont)) {
        cont = (line ~ /\\$/)
        if (match(line, /^[ \t]*#[ \t]*define[ \t]+WQ_[A-Za-z0-9_]*/)) {
            d = substr(line, RSTART, RLENGTH); sub(/.*[ \t]/, "", d)
            rest = substr(line, RSTART + RLENGTH)
            c = index(rest, "/*")
            val = c ? substr(rest, 1, c - 1) : rest
            if (val !~ /^[ \t]*$/ && d != "WQ_API") add_const(d, c > 0)
            if (c) { words_of_comment(substr(rest, c)); if (index(substr(rest, c), "*/") == 0) incomment = 1 }
        }
        next
    }
    # Code and comments: comments feed the mention set, code the statement.
    code = ""
    while (line != "") {
        if (incomment) {
            p = index(line, "*/")
            if (!p) { words_of_comment(line); line = ""; break }
            words_of_comment(substr(line, 1, p - 1))
            line = substr(line, p + 2); incomment = 0
            continue
        }
        p = index(line, "/*")
        if (!p) { code = code line; break }
        code = code substr(line, 1, p - 1); line = substr(line, p + 2); incomment = 1
        # A comment after an enumerator documents it.
        if (match(code, /WQ_[A-Za-z0-9_]*[ \t]*(=[^,]*)?[ \t,]*$/)) {
            t = substr(code, RSTART); sub(/[^A-Za-z0-9_].*/, "", t); enumdoc[t] = 1
        }
    }
    if (code !~ /[^ \t]/) next
    if (stmt !~ /[^ \t]/) stmt_doc = group_doc
    while ((p = index(code, ";")) > 0) {
        stmt = stmt " " substr(code, 1, p - 1); flush_stmt()
        code = substr(code, p + 1)
        if (code ~ /[^ \t]/) stmt_doc = group_doc
    }
    stmt = stmt " " code
}
END {
    if (what == "functions") for (i = 1; i <= nfn; i++) print fn[i]
    else if (what == "constants") for (i = 1; i <= ncn; i++) print cn[i]
    else if (what == "undocumented") {
        for (i = 1; i <= nfn; i++) if (!fdoc[fn[i]]) print "function " fn[i]
        for (i = 1; i <= ncn; i++)
            if (!cdoc[cn[i]] && !(cn[i] in mentioned)) print "constant " cn[i]
    } else { print "public-names.awk: what=functions|constants|undocumented" > "/dev/stderr"; exit 2 }
}
