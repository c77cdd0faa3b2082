#!/bin/sh
# wqctl end to end, store and fair mode: create --store, restore, snapshot,
# create --fair, add --priority, and what stat and dump show of them.
set -u
WQCTL="${top_builddir:-.}/tools/wqctl"
P="t-wqs-p-$$"        # store, durability process
N="t-wqs-n-$$"        # store, durability none
C="t-wqs-c-$$"        # a key processing when the region goes
F="t-wqs-f-$$"        # fair
G="t-wqs-g-$$"        # fair, tenant separator none
D="t-wqs-d-$$"        # default mode, no store
X="t-wqs-x-$$"        # never created (usage errors)
DIR=$(mktemp -d "${TMPDIR:-/tmp}/wqctl-store.XXXXXX") || exit 1
PASS=0
WORK_PID=
HOLDER=
# A failed run must not leave the holder's worker and its task running.
kill_tree() {
    for c in $(pgrep -P "$1"); do kill_tree "$c"; done
    kill -9 "$1" 2>/dev/null
}
cleanup() {
    [ -n "$WORK_PID" ] && kill -9 "$WORK_PID" 2>/dev/null
    [ -n "$HOLDER" ] && kill_tree "$HOLDER"
    for q in "$P" "$N" "$C" "$F" "$G" "$D" "$X" "t-wqs-s-$$"; do
        "$WQCTL" rm "$q" >/dev/null 2>&1 || rm -f "/dev/shm/wq.$q"
    done
    rm -rf "$DIR"
}
fail() { echo "FAIL: $*"; cleanup; trap - EXIT; echo "wqctl-store: $PASS passed, 1 failed"; exit 1; }
trap cleanup EXIT
trap 'exit 1' HUP INT TERM
ok() { PASS=$((PASS + 1)); }

# expect_rc RC CMD...: CMD exits with RC; its output goes to $out.
expect_rc() {
    want=$1; shift
    out=$("$@" 2>&1); rc=$?
    [ "$rc" = "$want" ] || fail "'$*' exited $rc, want $want: $out"
    ok
}
# expect_out WANT CMD...: CMD exits 0 and prints exactly WANT.
expect_out() {
    want=$1; shift
    got=$("$@" 2>&1) || fail "'$*' exited $?: $got"
    [ "$got" = "$want" ] || fail "'$*' printed '$got', want '$want'"
    ok
}
# run CMD...: CMD exits 0; its output goes to $out.
run() { out=$("$@" 2>&1) || fail "'$*' exited $?: $out"; ok; }
# has_line LINE: $out has exactly this line.  has_re RE: a line matching RE.
has_line() { printf '%s\n' "$out" | grep -Fxq -- "$1" || fail "no line '$1' in:
$out"; ok; }
has_re() { printf '%s\n' "$out" | grep -xq -- "$1" || fail "no line matching '$1' in:
$out"; ok; }
no_re() { printf '%s\n' "$out" | grep -xq -- "$1" && fail "a line matches '$1' in:
$out"; ok; }
# keys: the KEY column of $out (a dump), one line, in order.
keys() { printf '%s\n' "$out" | sed 1d | awk '{ print $NF }' | tr '\n' ' '; }
# wait_for RE CMD...: poll CMD (10 s at most) until a line matches RE.
wait_for() {
    re=$1; shift
    i=0
    while [ $i -lt 100 ]; do
        "$@" 2>/dev/null | grep -xq -- "$re" && { ok; return; }
        sleep 0.1
        i=$((i + 1))
    done
    fail "'$*' never printed a line matching '$re'"
}

# ---- durability process: rm, restore -------------------------------------
expect_rc 0 "$WQCTL" create "$P" --store "$DIR/p" --capacity 100 --max-key-len 64
[ -f "$DIR/p/data.mdb" ] || fail "no LMDB environment in $DIR/p"
ok
expect_out "added 4, coalesced 1" "$WQCTL" add "$P" k1 k2 k3 k1 k4
expect_out "k1" "$WQCTL" get "$P"                   # done: leaves the store
expect_out "added 1, coalesced 0" "$WQCTL" add "$P" --after 1h later
run "$WQCTL" stat "$P"
has_re 'store  *yes'
has_re 'durability  *process'
has_re 'store_unsynced  *0'
has_re 'mode  *default'
run "$WQCTL" stat "$P" --json
has_re '.*,"fair":false,"store":{"durability":"process","unsynced":0},"priorities":null,"tenants":null,"tenants_more":null}'
expect_rc 0 "$WQCTL" rm "$P"
expect_rc 1 "$WQCTL" stat "$P"
# Geometry comes from the store: no --capacity or --max-key-len here.
expect_out "restored 4 keys (3 queued, 1 waiting, 0 failing)" \
    "$WQCTL" restore "$P" --store "$DIR/p"
run "$WQCTL" stat "$P" --json
has_re '{"name":"'"$P"'","queued":3,"processing":0,"waiting":1,.*'
has_re '.*"capacity":100,.*"max_key_len":64,.*'
run "$WQCTL" dump "$P"
[ "$(keys)" = "k2 k3 k4 later " ] || fail "dump order after restore: $(keys)"
ok
has_re '-  *waiting  *-  *in 3[5-9][0-9][0-9]\.[0-9]\{3\}s  *0  *pending  *-  *later'
# Never into an existing queue, and the store is not even opened then.
expect_rc 1 "$WQCTL" restore "$P" --store "$DIR/p"
has_line "wqctl: queue '$P': queue exists: restore only builds a missing queue; wqctl rm it first"
expect_rc 1 "$WQCTL" restore "$P" --store "$DIR/missing"
has_re '.*queue exists.*'
[ ! -e "$DIR/missing" ] || fail "restore onto an existing queue made a store"
ok
expect_rc 1 "$WQCTL" create "$P" --store "$DIR/p"     # exists
# A store must be there: restore does not make an empty one.
expect_rc 1 "$WQCTL" restore "$X" --store "$DIR/missing"
has_line "wqctl: store '$DIR/missing': no such directory: nothing to restore"
[ ! -e "$DIR/missing" ] || fail "restore made a store"
ok
mkdir "$DIR/empty"
expect_rc 1 "$WQCTL" restore "$X" --store "$DIR/empty"
has_re "wqctl: store '.*/empty': holds no store (no data.mdb): nothing to restore"
expect_rc 1 "$WQCTL" stat "$X"
# create over a store that holds keys restores them too, and says so.
expect_rc 0 "$WQCTL" rm "$P"
expect_out "restored 4 keys (3 queued, 1 waiting, 0 failing)" \
    "$WQCTL" create "$P" --store "$DIR/p"
expect_out "wrote 0 records" "$WQCTL" snapshot "$P"  # process: all written

# ---- a key processing when the region goes comes back queued --------------
expect_rc 0 "$WQCTL" create "$C" --store "$DIR/c"
expect_out "added 2, coalesced 0" "$WQCTL" add "$C" busy idle
"$WQCTL" work "$C" -j 1 -- sleep 60 >/dev/null 2>&1 &
WORK_PID=$!
wait_for 'processing  *1' "$WQCTL" stat "$C"
expect_rc 0 "$WQCTL" rm "$C"
kill -9 "$WORK_PID"; wait "$WORK_PID" 2>/dev/null; WORK_PID=
# (its worker and task die with it: PR_SET_PDEATHSIG)
expect_out "restored 2 keys (2 queued, 0 waiting, 0 failing)" \
    "$WQCTL" restore "$C" --store "$DIR/c"
run "$WQCTL" dump "$C"
[ "$(keys)" = "busy idle " ] || fail "dump order after a crash: $(keys)"
ok

# ---- durability none: snapshot -------------------------------------------
# While a process stays attached (a get waiting on another key's queue is
# not enough: here a work that holds nothing), changes wait for the
# snapshot; the last process to close writes them.
expect_rc 0 "$WQCTL" create "$N" --store "$DIR/n" --durability none \
    --snapshot-interval 1h
"$WQCTL" work "$N" -- sh -c 'sleep 600' >/dev/null 2>&1 &   # holds the queue open
HOLDER=$!
# poll_stat RE: wait (up to 20 s) until stat shows a line matching RE.
poll_stat() {
    i=0
    until "$WQCTL" stat "$N" 2>/dev/null | grep -qx -- "$1"; do
        i=$((i + 1)); [ $i -lt 400 ] || fail "stat never showed '$1'"; sleep 0.05
    done
}
# The work's worker is attached (wqctl gives its own slot up while its
# workers run, so the worker is the one process): registered, it has its
# lease thread beside its main one.
i=0
until W=$(pgrep -P $HOLDER -x wqctl-w0) && [ "$(ls /proc/$W/task | wc -l)" -ge 2 ]; do
    i=$((i + 1)); [ $i -lt 400 ] || fail "the work's worker never attached"; sleep 0.05
done
poll_stat 'processes  *1'
expect_out "added 3, coalesced 0" "$WQCTL" add "$N" n1 n2 n3
poll_stat 'processing  *1'        # the holder took n1 and keeps it
run "$WQCTL" stat "$N"
has_re 'durability  *none'
has_re 'store_unsynced  *3'
run "$WQCTL" stat "$N" --json
has_re '.*,"store":{"durability":"none","unsynced":3},.*'
expect_out "wrote 3 records" "$WQCTL" snapshot "$N"
expect_out "wrote 0 records" "$WQCTL" snapshot "$N"
expect_out "added 1, coalesced 0" "$WQCTL" add "$N" n4   # not snapshotted yet
run "$WQCTL" stat "$N"
has_re 'store_unsynced  *1'
kill -TERM $HOLDER; sleep 0.3; kill -TERM $HOLDER   # stop, then at once: n1 goes back
wait $HOLDER 2>/dev/null
HOLDER=
# The last process to close cleanly wrote n4: nothing acknowledged is lost.
expect_rc 0 "$WQCTL" rm "$N"
expect_out "restored 4 keys (4 queued, 0 waiting, 0 failing)" \
    "$WQCTL" restore "$N" --store "$DIR/n" --durability none
run "$WQCTL" dump "$N"
[ "$(keys)" = "n1 n2 n3 n4 " ] || fail "dump after restore (none): $(keys)"
ok
# A queue without a store has nothing to snapshot.
expect_rc 0 "$WQCTL" create "$D" --capacity 10
expect_rc 1 "$WQCTL" snapshot "$D"
has_line "wqctl: queue '$D': snapshot: the queue has no store (it was created without --store)"
run "$WQCTL" stat "$D"
has_re 'store  *no'
has_re 'durability  *-'
expect_rc 1 "$WQCTL" snapshot "$X"                     # no such queue

# ---- fair mode: priorities and tenants -----------------------------------
expect_rc 0 "$WQCTL" create "$F" --fair --fair-share 1000 --capacity 100 \
    --rl-limiters exponential --rl-base 1h --rl-max 2h
expect_out "added 3, coalesced 0" "$WQCTL" add "$F" ns-a/1 ns-a/2 ns-b/1
expect_out "added 1, coalesced 0" "$WQCTL" add "$F" --priority 5 ns-c/hot
expect_out "added 1, coalesced 0" "$WQCTL" add "$F" --priority -1 ns-b/low
expect_out "added 0, coalesced 1" "$WQCTL" add "$F" --priority 9 ns-a/2
expect_out "added 1, coalesced 0" "$WQCTL" add "$F" --priority 3 --after 1h ns-d/later
expect_out "added 1, coalesced 0" "$WQCTL" add "$F" --priority 3 --rate-limited ns-d/rl
run "$WQCTL" dump "$F"
has_re 'POSITION  *STATE  *OWNER  *READY  *FAILURES  *RESULT  *CODE  *PRIORITY  *SEQ  *TENANT  *KEY'
# Highest priority first (a merge keeps the higher one); the delayed keys
# are not queued yet.
first=$(printf '%s\n' "$out" | sed -n 2p)
printf '%s\n' "$first" | grep -xq '0  *queued,dirty .* 9  *[0-9][0-9]*  *ns-a/\{0,1\}  *ns-a/2' ||
    fail "dump: first line '$first'"
ok
has_re '1  *queued,dirty .* 5  *[0-9][0-9]*  *ns-c/\{0,1\}  *ns-c/hot'
has_re '-  *waiting .* 0  *pending  *-  *3  *[0-9][0-9]*  *[^ ][^ ]*  *ns-d/later'
has_re '-  *waiting .* 1  *pending  *-  *3  *[0-9][0-9]*  *[^ ][^ ]*  *ns-d/rl'
last=$(printf '%s\n' "$out" | grep ' queued,dirty ' | tail -n 1)
printf '%s\n' "$last" | grep -q ' ns-b/low$' || fail "dump: last queued '$last'"
ok
run "$WQCTL" dump "$F" --json
has_re '{"name":"'"$F"'","keys":\[{"key":"ns-a/2","state":\["queued","dirty"\],"position":0,.*,"result_message":"","priority":9,"tenant":"ns-a/\{0,1\}","seq":[0-9]*},.*'
has_re '.*{"key":"ns-b/low",[^}]*,"priority":-1,"tenant":"ns-b/\{0,1\}","seq":[0-9]*}.*'
expect_out "ns-a/2" "$WQCTL" get "$F"
run "$WQCTL" stat "$F"
has_re 'mode  *fair'
has_line 'queued_by_priority'
has_re '  5  *1'
has_re '  0  *2'
has_re '  -1  *1'
has_line 'queued_by_tenant'
has_re '  ns-b/\{0,1\}  *2'
has_re '  ns-a/\{0,1\}  *1'
no_re '  ns-d/\{0,1\}  *[0-9]*'                        # waiting: not queued
run "$WQCTL" stat "$F" --json
has_re '.*,"fair":true,"store":null,"priorities":{"5":1,"0":2,"-1":1},"tenants":{"ns-b/\{0,1\}":2,"ns-a/\{0,1\}":1,"ns-c/\{0,1\}":1},"tenants_more":0}'
# The top 10 tenants by depth, then how many more.
for t in 1 2 3 4 5 6 7 8 9 10 11 12; do
    "$WQCTL" add "$F" "t$t/x" "t$t/y" >/dev/null || fail "add t$t"
done
ok
run "$WQCTL" stat "$F"
has_line '  (5 more)'
[ "$(printf '%s\n' "$out" | sed -n '/^queued_by_tenant$/,$p' | grep -c '^  [^(]')" = 10 ] ||
    fail "stat lists other than 10 tenants: $out"
ok
run "$WQCTL" stat "$F" --json
has_re '.*"tenants_more":5}'
# Without tenants (--tenant-sep none) no key has one.
expect_rc 0 "$WQCTL" create "$G" --fair --tenant-sep none
expect_out "added 2, coalesced 0" "$WQCTL" add "$G" a/1 b/1
run "$WQCTL" dump "$G" --json
has_re '.*"key":"a/1",.*"priority":0,"tenant":null,"seq":[0-9]*},.*'
run "$WQCTL" stat "$G" --json
has_re '.*"priorities":{"0":2},"tenants":{},"tenants_more":0}'

# ---- priorities need a fair queue ---------------------------------------
expect_rc 1 "$WQCTL" add "$D" --priority 3 k
has_line "wqctl: queue '$D': priorities need a fair queue (wqctl create --fair)"
run "$WQCTL" stat "$D" --json
has_re '.*"queued":0,.*'                               # nothing was added
expect_out "added 1, coalesced 0" "$WQCTL" add "$D" --priority 0 k
run "$WQCTL" dump "$D"                                  # default columns
has_line 'POSITION   STATE              OWNER    READY        FAILURES RESULT    CODE  KEY'

# ---- a damaged store: named, then salvaged ---------------------------------
S="t-wqs-s-$$"
expect_rc 0 "$WQCTL" create "$S" --store "$DIR/s"
expect_out "added 5, coalesced 0" "$WQCTL" add "$S" s1 s2 s3 s4 s5
expect_rc 0 "$WQCTL" rm "$S"
# Flip one byte inside the last record header in the file (a record's
# failure count): LMDB sees nothing wrong, the record's checksum does.
off=$(grep -obUa WQR2 "$DIR/s/data.mdb" | tail -1 | cut -d: -f1)
[ -n "$off" ] || fail "no record found in $DIR/s/data.mdb"
printf '\001' | dd of="$DIR/s/data.mdb" bs=1 seek=$((off + 8)) conv=notrunc 2>/dev/null ||
    fail "cannot damage the store"
expect_rc 1 "$WQCTL" restore "$S" --store "$DIR/s"
has_re "wqctl: store '.*/s': 1 damaged record (the record of key 's[1-5]': record checksum mismatch)"
has_line "wqctl: 'wqctl restore $S --store $DIR/s --salvage' keeps what verifies and moves the damaged store aside"
expect_rc 1 "$WQCTL" stat "$S"                          # nothing was built
expect_rc 0 "$WQCTL" restore "$S" --store "$DIR/s" --salvage
has_re "wqctl: salvage: dropped the record of key 's[1-5]': record checksum mismatch"
has_re "wqctl: salvage: kept 4 records; dropped 1 damaged, 0 missing; the damaged store is kept at .*/s.damaged-[0-9T]*Z"
has_line "restored 4 keys (4 queued, 0 waiting, 0 failing)"
[ "$(ls -d "$DIR"/s.damaged-* | wc -l)" = 1 ] || fail "the damaged store was not kept aside"
[ -f "$DIR"/s.damaged-*/data.mdb ] || fail "the damaged store lost its data.mdb"
expect_rc 0 "$WQCTL" check "$S"
expect_rc 0 "$WQCTL" rm "$S"
# A store whose data.mdb is gone is not an empty queue.
rm "$DIR/s/data.mdb"
expect_rc 1 "$WQCTL" restore "$S" --store "$DIR/s"
has_re "wqctl: store '.*/s': it held a queue (libwq-store is there) but data.mdb is missing"

# ---- usage errors --------------------------------------------------------
expect_rc 2 "$WQCTL" create "$X" --store "$DIR/x" --durability bogus
expect_rc 2 "$WQCTL" create "$X" --durability none
expect_rc 2 "$WQCTL" create "$X" --snapshot-interval 1s
expect_rc 2 "$WQCTL" create "$X" --store "$DIR/x" --snapshot-interval 1s
expect_rc 2 "$WQCTL" create "$X" --store "$DIR/x" --durability none --snapshot-interval 1500us
expect_rc 2 "$WQCTL" create "$X" --store ""
expect_rc 2 "$WQCTL" create "$X" --fair-share 2
expect_rc 2 "$WQCTL" create "$X" --tenant-sep :
expect_rc 2 "$WQCTL" create "$X" --fair --tenant-sep ::
expect_rc 2 "$WQCTL" create "$X" --fair --fair-share -1
expect_rc 2 "$WQCTL" create "$X" --fair=yes
expect_rc 2 "$WQCTL" restore "$X"
expect_rc 2 "$WQCTL" restore "$X" --store "$DIR/x" --exist-ok
expect_rc 2 "$WQCTL" snapshot
expect_rc 2 "$WQCTL" snapshot "$X" "$D"
expect_rc 2 "$WQCTL" add "$F" --priority high k
expect_rc 2 "$WQCTL" add "$F" --priority 2147483648 k
expect_rc 2 "$WQCTL" add "$F" --priority 1 --after 1s --rate-limited k
expect_rc 1 "$WQCTL" stat "$X"                         # none of those made it
[ ! -e "$DIR/x" ] || fail "a usage error made a store"
ok

echo "wqctl-store: $PASS passed, 0 failed"
