#!/bin/sh
# wqctl's error messages, as an operator meets them: each names the object
# at fault (queue 'NAME', store 'DIR', a key) and the real cause, gives
# only advice that applies, and exits 1. Exact texts and exit statuses.
# Root only parts (skipped otherwise, and said so): another user's view
# of a store (setpriv), a full /dev/shm (a small tmpfs mounted over it in
# a private mount namespace: unshare -m, so other tests never see it).
set -u
WQCTL="${top_builddir:-.}/tools/wqctl"
case $WQCTL in /*) ;; *) WQCTL="$PWD/$WQCTL" ;; esac
P="t-wqe-$$"
DIR=$(mktemp -d "${TMPDIR:-/tmp}/wqctl-errors.XXXXXX") || exit 99
DIR=$(cd "$DIR" && pwd -P)
OUT="$DIR/out"
cleanup() {
    for q in "$P-s1" "$P-s2" "$P-s3" "$P-r" "$P-c" "$P-p" "$P-d" "$P-full" \
             "$P-nope"; do
        "$WQCTL" rm "$q" >/dev/null 2>&1 || rm -f "/dev/shm/wq.$q"
    done
    chmod -R u+rwx "$DIR" 2>/dev/null
    rm -rf "$DIR"
}
fail() { echo "FAIL: $*"; cleanup; trap - EXIT; exit 1; }
trap cleanup EXIT
ok() { :; }

# expect RC WANT CMD...: CMD exits RC, prints nothing on stdout and
# exactly WANT (one line) on stderr.
expect() {
    want_rc=$1 want=$2; shift 2
    "$@" >"$OUT.1" 2>"$OUT.2"; rc=$?
    got=$(cat "$OUT.2")
    [ "$rc" = "$want_rc" ] || fail "'$*' exited $rc, want $want_rc: $got"
    [ ! -s "$OUT.1" ] || fail "'$*' printed on stdout: $(cat "$OUT.1")"
    [ "$got" = "$want" ] || fail "'$*' said
  '$got', want
  '$want'"
}
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
is_root() { [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1; }
no_shm() { [ ! -e "/dev/shm/wq.$1" ] || fail "queue $1 was made"; }

rule="(a name is 1 to 200 bytes of A-Z a-z 0-9 . _ -)"

# ---- queues that are not there -----------------------------------------
N="$P-nope"
for cmd in rm stat check snapshot dump shutdown resume get; do
    expect 1 "wqctl: queue '$N': no such queue" "$WQCTL" $cmd "$N"
done
expect 1 "wqctl: queue '$N': no such queue" "$WQCTL" check "$N" --repair
expect 1 "wqctl: queue '$N': no such queue" "$WQCTL" requeues "$N" k
expect 1 "wqctl: queue '$N': no such queue" "$WQCTL" add "$N" k

# ---- names -------------------------------------------------------------
expect 1 "wqctl: queue 'bad/name': invalid name: '/' is not allowed $rule" \
    "$WQCTL" create 'bad/name'
expect 1 "wqctl: queue 'a b': invalid name: byte 0x20 is not allowed $rule" \
    "$WQCTL" stat 'a b'
expect 1 "wqctl: queue 'x\\x01': invalid name: byte 0x01 is not allowed $rule" \
    "$WQCTL" rm "$(printf 'x\001')"
long=$(printf '%0201d' 0)
expect 1 "wqctl: queue '$(printf '%040d' 0)...': invalid name: 201 bytes $rule" \
    "$WQCTL" create "$long"

# ---- a queue without a store --------------------------------------------
expect 0 "" "$WQCTL" create "$P-s1" --capacity 10
expect 1 "wqctl: queue '$P-s1': snapshot: the queue has no store (it was created without --store)" \
    "$WQCTL" snapshot "$P-s1"
expect 0 "" "$WQCTL" rm "$P-s1"

# ---- store paths that cannot be stores ------------------------------------
expect 1 "wqctl: store '$DIR/a/missing/parent': cannot make the directory: its parent '$DIR/a/missing' does not exist" \
    "$WQCTL" create "$P-s1" --store "$DIR/a/missing/parent"
no_shm "$P-s1"
expect 1 "wqctl: store 'rel-missing-$$/x': cannot make the directory: its parent 'rel-missing-$$' does not exist" \
    "$WQCTL" create "$P-s1" --store "rel-missing-$$/x"
: > "$DIR/afile"
expect 1 "wqctl: store '$DIR/afile': not a directory" \
    "$WQCTL" create "$P-s1" --store "$DIR/afile"
expect 1 "wqctl: store '$DIR/afile': not a directory" \
    "$WQCTL" restore "$P-s1" --store "$DIR/afile"
expect 1 "wqctl: store '/proc/wqctl-none-$$': cannot make the directory: No such file or directory" \
    "$WQCTL" create "$P-s1" --store "/proc/wqctl-none-$$"
expect 1 "wqctl: store '/proc/wqctl-none-$$': no such directory: nothing to restore" \
    "$WQCTL" restore "$P-s1" --store "/proc/wqctl-none-$$"
expect 1 "wqctl: store '/proc/wqctl-none-$$': no such directory: nothing to salvage" \
    "$WQCTL" restore "$P-s1" --store "/proc/wqctl-none-$$" --salvage
expect 1 "wqctl: store '$DIR/missing': no such directory: nothing to restore" \
    "$WQCTL" restore "$P-s1" --store "$DIR/missing"
[ ! -e "$DIR/missing" ] || fail "restore made a store"
mkdir "$DIR/empty"
expect 1 "wqctl: store '$DIR/empty': holds no store (no data.mdb): nothing to restore" \
    "$WQCTL" restore "$P-s1" --store "$DIR/empty"
# A dangling data.mdb link: named, and its target never made.
mkdir "$DIR/dl"
ln -s "$DIR/nowhere" "$DIR/dl/data.mdb"
expect 1 "wqctl: store '$DIR/dl': data.mdb is a symbolic link to '$DIR/nowhere', which does not exist" \
    "$WQCTL" create "$P-s1" --store "$DIR/dl"
expect 1 "wqctl: store '$DIR/dl': data.mdb is a symbolic link to '$DIR/nowhere', which does not exist" \
    "$WQCTL" restore "$P-s1" --store "$DIR/dl"
[ ! -e "$DIR/nowhere" ] || fail "a store was made through a dangling data.mdb link"
no_shm "$P-s1"

# ---- damaged stores and regions ---------------------------------------------
expect 0 "" "$WQCTL" create "$P-c" --store "$DIR/c"
"$WQCTL" add "$P-c" a b c >/dev/null || fail "add"
expect 0 "" "$WQCTL" rm "$P-c"
truncate -s 8192 "$DIR/c/data.mdb" || fail "truncate"
salvage="wqctl: 'wqctl restore $P-c --store $DIR/c --salvage' keeps what verifies and moves the damaged store aside"
damaged="wqctl: store '$DIR/c': data.mdb is shorter than the environment says: MDB_CORRUPTED: Located page was wrong type"
expect 1 "$damaged
$salvage" "$WQCTL" restore "$P-c" --store "$DIR/c"
expect 1 "$damaged
$salvage" "$WQCTL" create "$P-c" --store "$DIR/c"
no_shm "$P-c"
# ... and the advice given works.
"$WQCTL" restore "$P-c" --store "$DIR/c" --salvage >"$OUT" 2>&1 ||
    fail "restore --salvage: $(cat "$OUT")"
expect 0 "" "$WQCTL" rm "$P-c"

# A truncated region: named as such; the advice (rm) works.
expect 0 "" "$WQCTL" create "$P-r" --capacity 100
size=$(stat -c %s "/dev/shm/wq.$P-r")
truncate -s 4096 "/dev/shm/wq.$P-r"
bad="wqctl: queue '$P-r': /dev/shm/wq.$P-r is truncated or damaged: 4096 bytes, its header says $size (wqctl rm $P-r removes it)"
expect 1 "$bad" "$WQCTL" stat "$P-r"
expect 1 "$bad" "$WQCTL" check "$P-r" --repair
expect 1 "$bad" "$WQCTL" get "$P-r"
expect 0 "" "$WQCTL" rm "$P-r"
no_shm "$P-r"
# A foreign file in its place.
head -c 100000 /dev/zero > "/dev/shm/wq.$P-r"
expect 1 "wqctl: queue '$P-r': /dev/shm/wq.$P-r is not a libwq region (no libwq magic) (wqctl rm $P-r removes it)" \
    "$WQCTL" stat "$P-r"
expect 0 "" "$WQCTL" rm "$P-r"
# ls names the cause too.
head -c 100 /dev/zero > "/dev/shm/wq.$P-r"
"$WQCTL" ls > "$OUT" 2>&1 || fail "ls: $(cat "$OUT")"
grep -q "^$P-r *error: not a libwq region of this version (foreign, truncated or damaged)\$" "$OUT" ||
    fail "ls: $(cat "$OUT")"
expect 0 "" "$WQCTL" rm "$P-r"

# ---- another user ---------------------------------------------------------
if is_root; then
    chmod 755 "$DIR"
    # nobody must be able to run wqctl, and the build tree may sit in a
    # directory only root can enter (CI: mktemp -d): a copy of the program
    # and of libwq in $DIR/bin (libtool's wrapper script runs .libs/).
    mkdir "$DIR/bin"
    real="$WQCTL"
    [ -f "$(dirname "$WQCTL")/.libs/wqctl" ] && real="$(dirname "$WQCTL")/.libs/wqctl"
    cp "$real" "$DIR/bin/wqctl" || fail "copy $real"
    cp -P "$(dirname "$WQCTL")/../src/.libs/"libwq.so* "$DIR/bin/" 2>/dev/null
    chmod -R go+rX "$DIR/bin"
    as_nobody() {
        cmd=$1; shift
        [ "$cmd" = "$WQCTL" ] && cmd="$DIR/bin/wqctl"
        setpriv --reuid=nobody --regid=nogroup --clear-groups \
            env LD_LIBRARY_PATH="$DIR/bin" "$cmd" "$@"
    }
    expect 0 "" "$WQCTL" create "$P-p" --store "$DIR/p"
    expect 0 "" "$WQCTL" rm "$P-p"
    chmod 700 "$DIR/p"
    expect 1 "wqctl: store '$DIR/p': permission denied (the directory cannot be searched)" \
        as_nobody "$WQCTL" restore "$P-p" --store "$DIR/p"
    expect 1 "wqctl: store '$DIR/p': permission denied (the directory cannot be searched)" \
        as_nobody "$WQCTL" create "$P-p" --store "$DIR/p"
    chmod 755 "$DIR/p"   # its files stay 0600: the claim (owner.c) is the first write
    expect 1 "wqctl: store '$DIR/p': cannot open its owner file $DIR/p/owner: Permission denied" \
        as_nobody "$WQCTL" restore "$P-p" --store "$DIR/p"
    no_shm "$P-p"
    # A queue of another user's, mode 0600.
    expect 0 "" "$WQCTL" create "$P-p" --capacity 10
    expect 1 "wqctl: queue '$P-p': permission denied" as_nobody "$WQCTL" stat "$P-p"
    expect 0 "" "$WQCTL" rm "$P-p"
else
    echo "note: not root (or no setpriv): permission cases skipped"
fi

# ---- a full /dev/shm --------------------------------------------------------
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
    # A new default queue takes 32 KiB: 16 KiB is too little.
    unshare -m sh -c 'mount -t tmpfs -o size=16k tmpfs /dev/shm &&
                      exec "$1" create "$2"' sh "$WQCTL" "$P-full" >"$OUT.1" 2>"$OUT.2"
    rc=$?
    [ "$rc" = 1 ] || fail "create on a full /dev/shm exited $rc: $(cat "$OUT.2")"
    grep -qx "wqctl: queue '$P-full': no room in /dev/shm for its region: it needs [0-9]* bytes, [0-9]* are free" \
        "$OUT.2" || fail "create on a full /dev/shm said: $(cat "$OUT.2")"
    no_shm "$P-full"
    # A queue that outgrows a 2 MiB /dev/shm: the add that needs pages the
    # tmpfs refuses fails (exit 1, no SIGBUS) naming the queue and the room
    # it lacks; every key added before is there and the region is clean;
    # keys done free entries that new keys then reuse.
    unshare -m sh -c 'mount -t tmpfs -o size=2M tmpfs /dev/shm || exit 9
        W=$1 Q=$2 O=$3
        "$W" create "$Q" || exit 8
        seq 1 40000 | sed s/^/key-/ | "$W" add "$Q" - >"$O.add" 2>"$O.adderr"
        echo $? >"$O.addrc"
        "$W" stat "$Q" >"$O.stat" 2>&1
        "$W" check "$Q" >"$O.check" 2>&1 || echo "check failed" >>"$O.check"
        "$W" get "$Q" -n 100 >"$O.got" 2>&1 || echo "get failed" >>"$O.got"
        seq 1 100 | sed s/^/new-/ | "$W" add "$Q" - >"$O.readd" 2>&1 ||
            echo "add after done failed" >>"$O.readd"
        "$W" check "$Q" >>"$O.check" 2>&1 || echo "check failed" >>"$O.check"' \
        sh "$WQCTL" "$P-grow" "$OUT" 2>"$OUT.2"
    rc=$?
    [ "$rc" = 0 ] || fail "the 2 MiB /dev/shm script exited $rc: $(cat "$OUT.2")"
    [ "$(cat "$OUT.addrc")" = 1 ] || fail "add past a full /dev/shm exited $(cat "$OUT.addrc")"
    # The entries, the index or the ring (which double) meet the limit first.
    grep -Eqx "wqctl: queue '$P-grow': no room in /dev/shm to grow its region to [0-9]+ (entries|index slots|ring slots) \([0-9]+ bytes more, [0-9]+ free\)" \
        "$OUT.adderr" || fail "add past a full /dev/shm said: $(cat "$OUT.adderr")"
    added=$(sed -n 's/^added \([0-9]*\), coalesced 0$/\1/p' "$OUT.add")
    [ -n "$added" ] && [ "$added" -gt 1000 ] && [ "$added" -lt 40000 ] ||
        fail "add past a full /dev/shm reported: $(cat "$OUT.add")"
    grep -qx "live  *$added" "$OUT.stat" || fail "$added added, but: $(cat "$OUT.stat")"
    [ "$(grep -c "^queue '$P-grow': clean$" "$OUT.check")" = 2 ] ||
        fail "the grown queue is not clean: $(cat "$OUT.check")"
    [ "$(sed -n 1p "$OUT.got")" = key-1 ] && [ "$(wc -l <"$OUT.got")" = 100 ] ||
        fail "get from the grown queue: $(head -3 "$OUT.got")"
    grep -qx "added 100, coalesced 0" "$OUT.readd" ||
        fail "adds into reused entries: $(cat "$OUT.readd")"
else
    echo "note: cannot mount a tmpfs in a private namespace: full /dev/shm cases skipped"
fi

# A full queue is another thing.
expect 0 "" "$WQCTL" create "$P-d" --capacity 2
"$WQCTL" add "$P-d" a b >/dev/null || fail "add"
"$WQCTL" add "$P-d" c >"$OUT.1" 2>"$OUT.2" && fail "add to a full queue succeeded"
grep -qx "wqctl: queue '$P-d': full: it holds 2 live keys of its capacity 2, the batch has 1 new" "$OUT.2" ||
    fail "add to a full queue said: $(cat "$OUT.2")"
expect 0 "" "$WQCTL" rm "$P-d"

# ---- keys -------------------------------------------------------------------
expect 0 "" "$WQCTL" create "$P-d" --capacity 10 --max-key-len 8
expect 1 "wqctl: key 1: key of 9 bytes is longer than max_key_len (8)" \
    "$WQCTL" requeues "$P-d" 123456789
expect 0 "" "$WQCTL" rm "$P-d"
exit 0
