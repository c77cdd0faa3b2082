#!/bin/sh
# What WQ_DURABLE_FSYNC pays for, seen from outside the library: strace
# counts the disk flushes of each wqctl process (sync calls, and writes to
# a file opened with O_DSYNC or O_SYNC), `wqctl stat` the changes the
# store does not have yet. An add flushes once: its group in the store's
# journal. The done of a clean key (wqctl get: get and done) flushes
# nothing and writes nothing while another process has the queue open:
# the removal is deferred to the next group that is written anyway (the
# next add's), or to the last process's close. wq_snapshot (wqctl
# snapshot), and the last close when something is deferred, write it as a
# group and then checkpoint: LMDB takes the journal's groups in one
# synced commit (two flushes: its pages, then its meta page). A snapshot
# with nothing deferred and nothing in the journal flushes nothing; a
# last close with nothing deferred leaves the journal as it is (a restore
# replays it). Durability process never
# flushes. Without strace: skipped (77), except in CI (CI=true), where
# that fails.
set -u
WQCTL="${top_builddir:-.}/tools/wqctl"
F="t-fsync-f-$$"
P="t-fsync-p-$$"
DIR=$(mktemp -d "${TMPDIR:-/tmp}/wq-fsync.XXXXXX") || exit 1
PASS=0
cleanup() {
    for q in "$F" "$P"; do
        "$WQCTL" rm "$q" >/dev/null 2>&1 || rm -f "/dev/shm/wq.$q"
    done
    rm -rf "$DIR"
}
fail() { echo "FAIL: $*"; cleanup; trap - EXIT; echo "fsync: $PASS passed, 1 failed"; exit 1; }
trap cleanup EXIT
trap 'exit 1' HUP INT TERM

if ! command -v strace >/dev/null 2>&1; then
    [ "${CI:-}" = true ] && { echo "run-fsync: strace not found (tools/deps.sh installs it)"; exit 1; }
    echo "run-fsync: strace not found: skipped (sh tools/deps.sh installs it)"
    exit 77
fi
# strace may be refused (no ptrace in a container): then say so and skip.
if ! strace -f -o /dev/null true 2>/dev/null; then
    echo "run-fsync: strace cannot trace here (ptrace refused): skipped"
    exit 77
fi

# syncs WANT WANT_OUT CMD...: CMD prints WANT_OUT and flushes the disk
# WANT times: fsync, fdatasync, msync, sync_file_range, and each write to
# a descriptor opened with O_DSYNC or O_SYNC (the libtool wrapper's exec
# is followed; descriptors are tracked from open to close).
syncs() {
    want=$1 want_out=$2; shift 2
    # LeakSanitizer cannot run under ptrace (an ASan build): leaks are
    # checked by the other tests.
    got_out=$(ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
        strace -f -qq -e trace=fsync,fdatasync,msync,sync_file_range,open,openat,close,write,pwrite64,writev,pwritev,pwritev2 \
        -o "$DIR/trace" "$@" 2>&1) || fail "'$*' exited $?: $got_out"
    [ "$got_out" = "$want_out" ] || fail "'$*' printed '$got_out', want '$want_out'"
    n=$(awk '
        /open(at)?\(/ {
            if (/O_DSYNC|O_SYNC/ && match($0, /= [0-9]+$/))
                dsync[substr($0, RSTART + 2)] = 1
            next
        }
        / close\([0-9]+/ {
            match($0, /close\([0-9]+/)
            delete dsync[substr($0, RSTART + 6, RLENGTH - 6)]
            next
        }
        / (fsync|fdatasync|msync|sync_file_range)\(/ { n++; next }
        / (write|pwrite64|writev|pwritev|pwritev2)\([0-9]+/ {
            match($0, /\([0-9]+/)
            if (substr($0, RSTART + 1, RLENGTH - 1) in dsync)
                n++
        }
        END { print n + 0 }' "$DIR/trace")
    [ "$n" = "$want" ] ||
        fail "'$*' flushed $n times, want $want: $(cat "$DIR/trace")"
    PASS=$((PASS + 1))
}

# An hour: no removal is due by time during the test, however slow.
"$WQCTL" create "$F" --store "$DIR/f" --durability fsync --snapshot-interval 1h \
    >/dev/null || fail "create $F"
"$WQCTL" create "$P" --store "$DIR/p" --durability process >/dev/null || fail "create $P"

# unsynced N: the queue F lists N changes its store does not have yet.
unsynced() {
    got=$("$WQCTL" stat "$F" | awk '$1 == "store_unsynced" { print $2 }')
    [ "$got" = "$1" ] || fail "store_unsynced is '$got', want $1"
    PASS=$((PASS + 1))
}

# A holder: wqctl add reading keys from a fifo that stays empty keeps F
# open, so the wqctl processes below are not the last to close it. (wqctl
# stat is an observer: it takes no slot, so the holder is the 1.)
mkfifo "$DIR/fifo" || fail "mkfifo"
"$WQCTL" add "$F" - <"$DIR/fifo" >"$DIR/holder.out" 2>&1 &
HOLDER=$!
exec 3>"$DIR/fifo"
i=0
until "$WQCTL" stat "$F" | grep -q "^processes  *1$"; do
    i=$((i + 1))
    [ $i -lt 200 ] || fail "the holder did not attach in 10 s"
    sleep 0.05
done

syncs 1 "added 1, coalesced 0" "$WQCTL" add "$F" k1  # its journal group
syncs 0 "k1" "$WQCTL" get "$F"                        # get, done: a removal, deferred
unsynced 1
syncs 1 "added 2, coalesced 0" "$WQCTL" add "$F" k2 k3  # one group, k1's removal in it
unsynced 0
syncs 0 "k2" "$WQCTL" get "$F"
unsynced 1
syncs 3 "wrote 1 record" "$WQCTL" snapshot "$F"        # k2's removal, then a checkpoint
syncs 0 "wrote 0 records" "$WQCTL" snapshot "$F"       # nothing deferred, nothing journaled
syncs 0 "k3" "$WQCTL" get "$F"
unsynced 1
exec 3>&-                                             # the holder reads EOF, closes last
wait "$HOLDER" || fail "the holder exited $?: $(cat "$DIR/holder.out")"
unsynced 0                                            # its close wrote k3's removal
syncs 1 "added 1, coalesced 0" "$WQCTL" add "$F" k4   # the last close: nothing listed, no checkpoint
syncs 3 "k4" "$WQCTL" get "$F"                        # the last close: the removal's group, a checkpoint
unsynced 0
syncs 0 "added 1, coalesced 0" "$WQCTL" add "$P" k1
syncs 0 "k1" "$WQCTL" get "$P"

echo "fsync: $PASS passed, 0 failed"
