# tests/redis.sh - private Redis servers for the libwq tests (bash, sourced).
#
#   . tests/redis.sh
#   redis_start [redis-server args...]   one server: REDIS_PORT REDIS_PID REDIS_DIR
#   redis_restart [--kill]               the same server again (port, dir, args)
#   redis_stop [PORT]                    stop it, remove its directory
#   redis_cluster_start MASTERS REPLICAS [redis-server args...]
#                                        a Redis Cluster: REDIS_CLUSTER_PORTS
#                                        (masters first), REDIS_CLUSTER_MASTER_PORTS,
#                                        REDIS_CLUSTER_DIR
#   redis_cluster_stop                   stop every node, remove the directory
#   redis_run PROGRAM [ARGS...]          run a program so that a signal to
#                                        this shell reaches it; its status
#   redis_cli PORT ARGS...               redis-cli -p PORT ARGS, bounded
#
# Each server runs in its own directory under ${TMPDIR:-/tmp}
# (wq-redis.XXXXXX; a cluster: wq-redis-cluster.XXXXXX/node-N), on a
# free loopback port, with
#   --bind 127.0.0.1 --save '' --appendonly no --daemonize no
# (and --enable-debug-command yes from Redis 7 on, for DEBUG SLEEP;
# extra arguments come after these and override them, e.g.
# --appendonly yes --appendfsync always), its pid file (redis.pid), log
# (redis.log) and the command line that started it: redis.argv (the
# arguments, NUL separated) and redis.cmd (shell quoted), so that a test
# program can restart the server itself (t.h: t_redis_restart).
#
# Nothing outlives the shell that sourced this file:
#   - an EXIT trap stops every server it started and removes their
#     directories; INT, TERM and HUP first stop the program redis_run
#     runs (TERM, then KILL after 5 s), then do the same and exit 128+n;
#   - a server is found by its pid and by its working directory (redis
#     chdirs to --dir): a server that a test program restarted itself,
#     or whose pid file went stale, is found and killed all the same, and
#     a pid is only ever signalled when its cwd is one of our directories;
#   - a guard process per directory waits for this shell to end and, if
#     it ended without cleaning up (SIGKILL), kills the servers and
#     removes the directory.
# Every wait is bounded: start 5 s (REDIS_START_TIMEOUT), stop 3 s then
# SIGKILL, cluster formation 30 s (REDIS_CLUSTER_TIMEOUT), each redis-cli
# call 10 s.
#
# Ports: random in 20000..59999 (a cluster node: 20000..54999, as its
# bus port is port + 10000), skipped when something answers there; the
# remaining race (another test binds it first) makes redis-server exit
# with "Address already in use", and we try another port (5 times).
# Readiness is proven by the pid file holding our pid (redis writes it
# only after binding) and a PING answered with PONG (or NOAUTH), never by
# a PING alone: the port might be another test's server.

REDIS_SERVER=${REDIS_SERVER:-redis-server}
REDIS_CLI=${REDIS_CLI:-redis-cli}
REDIS_START_TIMEOUT=${REDIS_START_TIMEOUT:-5}
REDIS_CLUSTER_TIMEOUT=${REDIS_CLUSTER_TIMEOUT:-30}

_redis_topdirs=()            # directories we made (one per server or cluster)
declare -A _redis_guard=()   # top directory -> guard pid
declare -A _redis_dir=()     # port -> server directory
_redis_child=                # the program redis_run runs
_redis_owner=$$
# Redis 7 refuses DEBUG (DEBUG SLEEP, ...) unless told otherwise; older
# servers do not know the option.
_redis_v7_args=()
case $("$REDIS_SERVER" --version 2>/dev/null) in
*" v="[7-9].*|*" v="[1-9][0-9].*) _redis_v7_args=(--enable-debug-command yes) ;;
esac

# ------------------------------------------------------------------
# Small helpers

_redis_log() { echo "redis.sh: $*" >&2; }

# timeout(1) when there is one.
_redis_timeout() {
    local s=$1
    shift
    if command -v timeout >/dev/null 2>&1; then
        timeout -k 2 "$s" "$@"
    else
        "$@"
    fi
}

# redis_cli PORT ARGS...: redis-cli against 127.0.0.1:PORT, 10 s at most.
redis_cli() {
    local port=$1
    shift
    _redis_timeout 10 "$REDIS_CLI" -h 127.0.0.1 -p "$port" "$@"
}

# Whether pid runs (a zombie does not).
_redis_alive() {
    local pid=$1 stat
    [ -n "$pid" ] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    if [ -r "/proc/$pid/stat" ]; then
        stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
        stat=${stat##*) }
        [ "${stat%% *}" != Z ] || return 1
    fi
    return 0
}

# The pids given that are alive, on stdout.
_redis_alive_of() {
    local p
    for p in "$@"; do
        if _redis_alive "$p"; then echo "$p"; fi
    done
    return 0
}

# Whether something accepts connections on 127.0.0.1:port.
_redis_listening() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Whether the server on port answers PING (PONG, or NOAUTH when it has a
# password); LOADING and the like do not count. One second at most.
_redis_ping() {
    (
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf 'PING\r\n' >&3
        IFS= read -r -t 1 reply <&3 || exit 1
        case $reply in
        +PONG*|-NOAUTH*) exit 0 ;;
        *) exit 1 ;;
        esac
    ) 2>/dev/null
}

# Processes whose working directory is dir or below it (redis-server
# chdirs to its --dir), on stdout.
_redis_pids_in() {
    local dir=$1 p cwd
    for p in /proc/[0-9]*; do
        cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
        cwd=${cwd% (deleted)}
        case $cwd in
        "$dir"|"$dir"/*) echo "${p#/proc/}" ;;
        esac
    done
}

# Stop every process working in dir or below (its servers, and their
# fork children): signal sig (TERM: a clean shutdown; KILL), wait at most
# 3 s, then SIGKILL and wait at most 2 s more. The servers are not jobs
# (disowned): bash reaps them, and a zombie counts as gone.
_redis_kill_in() {
    local dir=$1 sig=${2:-TERM} pids p i
    pids=$(_redis_pids_in "$dir")
    [ -n "$pids" ] || return 0
    for p in $pids; do kill "-$sig" "$p" 2>/dev/null || true; done
    for ((i = 0; i < 60; i++)); do
        pids=$(_redis_alive_of $pids)
        [ -n "$pids" ] || break
        sleep 0.05
    done
    if [ -n "$pids" ]; then
        [ "$sig" = KILL ] || _redis_log "server(s) $pids in $dir did not stop on $sig: SIGKILL"
        for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
        for ((i = 0; i < 40; i++)); do
            pids=$(_redis_alive_of $pids)
            [ -n "$pids" ] || break
            sleep 0.05
        done
        [ -z "$pids" ] || _redis_log "server(s) $pids in $dir survive SIGKILL"
    fi
    # Reap our own children among them (never blocks: they are dead).
    for p in $(jobs -p 2>/dev/null); do
        _redis_alive "$p" || wait "$p" 2>/dev/null || true
    done
    return 0
}

# A guard for top directory dir: once this shell is gone, kill what runs
# in dir and remove it. Ends when this shell's cleanup kills it.
_redis_guard_start() {
    local dir=$1 owner=$_redis_owner
    (
        set +e
        trap 'kill "$t" 2>/dev/null; exit 0' TERM
        trap '' INT HUP
        t=
        tail -s 0.2 --pid="$owner" -f /dev/null &
        t=$!
        wait "$t"
        # tail may be missing or refuse --pid: poll then.
        while kill -0 "$owner" 2>/dev/null; do sleep 1; done
        if [ -d "$dir" ]; then
            p=$(cat "$dir/program.pid" 2>/dev/null) && kill -KILL "$p" 2>/dev/null
            _redis_kill_in "$dir" KILL
            rm -rf "$dir"
        fi
    ) </dev/null >/dev/null 2>&1 &
    _redis_guard[$dir]=$!
}

# Make a top directory (template name) with its guard: _redis_newdir.
_redis_mktop() {
    local d
    d=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX") || return 1
    d=$(cd "$d" && pwd -P) || return 1
    _redis_topdirs+=("$d")
    _redis_guard_start "$d"
    _redis_newdir=$d
}

# Stop what runs in top directory dir, stop its guard, remove it.
_redis_rmtop() {
    local dir=$1 g i keep=()
    _redis_kill_in "$dir" TERM
    g=${_redis_guard[$dir]:-}
    if [ -n "$g" ]; then
        kill -TERM "$g" 2>/dev/null || true
        for ((i = 0; i < 40; i++)); do
            _redis_alive "$g" || break
            sleep 0.05
        done
        if _redis_alive "$g"; then kill -KILL "$g" 2>/dev/null || true; fi
        wait "$g" 2>/dev/null || true
        unset '_redis_guard[$dir]'
    fi
    rm -rf "$dir"
    for i in "${_redis_topdirs[@]}"; do
        [ "$i" = "$dir" ] || keep+=("$i")
    done
    _redis_topdirs=("${keep[@]}")
    for i in "${!_redis_dir[@]}"; do
        case ${_redis_dir[$i]} in
        "$dir"|"$dir"/*) unset '_redis_dir[$i]' ;;
        esac
    done
}

# A random port (cluster: with a free bus port) that nothing answers on
# and that is not one of ours: _redis_port.
_redis_pick_port() {
    local bus=${1:-} span=40000 p i
    [ -z "$bus" ] || span=35000
    for ((i = 0; i < 200; i++)); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % span))
        [ -z "${_redis_dir[$p]:-}" ] || continue
        [ -z "$bus" ] || [ -z "${_redis_dir[$((p + 10000))]:-}" ] || continue
        ! _redis_listening "$p" || continue
        [ -z "$bus" ] || ! _redis_listening "$((p + 10000))" || continue
        _redis_port=$p
        return 0
    done
    _redis_log "no free port found"
    return 1
}

# Start redis-server from the argv saved in dir/redis.argv, in the
# background, and wait until it is ready: _redis_pid. 1 when it failed
# (it is killed then; dir/redis.log says why).
_redis_exec_saved() {
    local dir=$1 port=$2 pid i n argv=()
    mapfile -d '' argv <"$dir/redis.argv"
    "${argv[@]}" </dev/null >>"$dir/redis.out" 2>&1 &
    pid=$!
    # Not a job: no "Killed" notices when we stop it; still reaped (we
    # are its parent), and _redis_alive takes a zombie for dead.
    disown "$pid"
    n=$((REDIS_START_TIMEOUT * 20))
    for ((i = 0; i < n; i++)); do
        if ! _redis_alive "$pid"; then
            wait "$pid" 2>/dev/null || true
            return 1
        fi
        if [ "$(cat "$dir/redis.pid" 2>/dev/null)" = "$pid" ] && _redis_ping "$port"; then
            _redis_pid=$pid
            return 0
        fi
        sleep 0.05
    done
    _redis_log "redis-server (pid $pid, port $port) not ready within ${REDIS_START_TIMEOUT} s"
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return 1
}

# Start a server in dir (made already) on a free port, retrying on a lost
# port race: _redis_port, _redis_pid. Arguments: dir bus(""|1) args...
_redis_launch() {
    local dir=$1 bus=$2 attempt argv
    shift 2
    for attempt in 1 2 3 4 5; do
        _redis_pick_port "$bus" || return 1
        argv=("$REDIS_SERVER" --port "$_redis_port" --bind 127.0.0.1
            --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
            --save '' --appendonly no --daemonize no "${_redis_v7_args[@]}" "$@")
        printf '%s\0' "${argv[@]}" >"$dir/redis.argv"
        printf '%q ' "${argv[@]}" >"$dir/redis.cmd"
        echo "$_redis_port" >"$dir/redis.port"
        rm -f "$dir/redis.pid"
        _redis_dir[$_redis_port]=$dir
        if _redis_exec_saved "$dir" "$_redis_port"; then
            return 0
        fi
        unset '_redis_dir[$_redis_port]'
        if ! grep -qs -e 'Address already in use' "$dir/redis.log" "$dir/redis.out"; then
            break
        fi
        _redis_log "port $_redis_port was taken meanwhile; another one"
        rm -f "$dir/redis.log" "$dir/redis.out"
    done
    _redis_log "could not start $REDIS_SERVER $*; its log:"
    tail -n 20 "$dir/redis.log" "$dir/redis.out" >&2 2>/dev/null || true
    return 1
}

# ------------------------------------------------------------------
# One server

redis_start() {
    local dir
    _redis_mktop wq-redis || return 1
    dir=$_redis_newdir
    if ! _redis_launch "$dir" "" "$@"; then
        _redis_rmtop "$dir"
        return 1
    fi
    REDIS_PORT=$_redis_port
    REDIS_PID=$_redis_pid
    REDIS_DIR=$dir
    REDIS_CMD=$(cat "$dir/redis.cmd")
    export REDIS_PORT REDIS_PID REDIS_DIR REDIS_CMD
}

# redis_stop [PORT]: the server on PORT (default REDIS_PORT).
redis_stop() {
    local port=${1:-${REDIS_PORT:-}} dir=
    [ -z "$port" ] || dir=${_redis_dir[$port]:-}
    if [ -z "$dir" ] || [ -z "${_redis_guard[$dir]:-}" ]; then
        _redis_log "redis_stop: no server of ours on port '${port}'"
        return 1
    fi
    _redis_rmtop "$dir"
    if [ "$port" = "${REDIS_PORT:-}" ]; then
        unset REDIS_PORT REDIS_PID REDIS_DIR REDIS_CMD
    fi
}

# redis_restart [--kill]: stop the current server (SIGTERM: a clean
# shutdown that writes the AOF out; --kill: SIGKILL, a crash) and start
# it again on the same port, in the same directory, with the same
# arguments; waits until it answers (AOF loaded).
redis_restart() {
    local sig=TERM dir port
    [ "${1:-}" != --kill ] || sig=KILL
    port=${REDIS_PORT:-}
    dir=
    [ -z "$port" ] || dir=${_redis_dir[$port]:-}
    if [ -z "$dir" ]; then
        _redis_log "redis_restart: no server"
        return 1
    fi
    _redis_kill_in "$dir" "$sig"
    if ! _redis_exec_saved "$dir" "$port"; then
        _redis_log "redis_restart: could not start the server again on port $port; its log:"
        tail -n 20 "$dir/redis.log" >&2 2>/dev/null || true
        return 1
    fi
    REDIS_PID=$_redis_pid
    export REDIS_PID
}

# ------------------------------------------------------------------
# A cluster

_redis_cluster_info() {
    redis_cli "$1" CLUSTER INFO 2>/dev/null | tr -d '\r'
}

# redis_cluster_start MASTERS REPLICAS [redis-server args...]
redis_cluster_start() {
    local masters=$1 replicas=$2 total top n i port info ok role deadline
    local ports=() mports=() addrs=()
    shift 2
    total=$((masters * (1 + replicas)))
    if [ "$masters" -lt 3 ]; then
        _redis_log "redis_cluster_start: a Redis Cluster needs 3 masters at least"
        return 1
    fi
    _redis_mktop wq-redis-cluster || return 1
    top=$_redis_newdir
    for ((n = 1; n <= total; n++)); do
        mkdir "$top/node-$n"
        if ! _redis_launch "$top/node-$n" 1 --cluster-enabled yes \
            --cluster-config-file nodes.conf --cluster-node-timeout 5000 "$@"; then
            _redis_rmtop "$top"
            return 1
        fi
        ports+=("$_redis_port")
        addrs+=("127.0.0.1:$_redis_port")
    done
    if ! _redis_timeout "$REDIS_CLUSTER_TIMEOUT" "$REDIS_CLI" --cluster create "${addrs[@]}" \
        --cluster-replicas "$replicas" --cluster-yes >"$top/create.log" 2>&1; then
        _redis_log "redis-cli --cluster create failed:"
        tail -n 30 "$top/create.log" >&2
        _redis_rmtop "$top"
        return 1
    fi
    # Every node: state ok, every slot served, every node known; every
    # replica linked to its master.
    deadline=$((SECONDS + REDIS_CLUSTER_TIMEOUT))
    for port in "${ports[@]}"; do
        while :; do
            info=$(_redis_cluster_info "$port")
            ok=0
            case $info in *cluster_state:ok*) ok=$((ok + 1)) ;; esac
            case $info in *cluster_slots_ok:16384*) ok=$((ok + 1)) ;; esac
            case $info in *"cluster_known_nodes:$total"$'\n'*|*"cluster_known_nodes:$total") ok=$((ok + 1)) ;; esac
            role=$(redis_cli "$port" INFO replication 2>/dev/null | tr -d '\r')
            case $role in
            *role:master*) ;;
            *master_link_status:up*) ;;
            *) ok=0 ;;
            esac
            [ "$ok" != 3 ] || break
            if [ "$SECONDS" -ge "$deadline" ]; then
                _redis_log "cluster not ready within ${REDIS_CLUSTER_TIMEOUT} s (node $port):"
                echo "$info" >&2
                _redis_rmtop "$top"
                return 1
            fi
            sleep 0.1
        done
    done
    for port in "${ports[@]}"; do
        case $(redis_cli "$port" ROLE 2>/dev/null | head -n 1) in
        master) mports+=("$port") ;;
        esac
    done
    REDIS_CLUSTER_DIR=$top
    REDIS_CLUSTER_MASTER_PORTS="${mports[*]}"
    # Masters first.
    REDIS_CLUSTER_PORTS="${mports[*]}"
    for port in "${ports[@]}"; do
        case " ${mports[*]} " in *" $port "*) ;; *) REDIS_CLUSTER_PORTS+=" $port" ;; esac
    done
    export REDIS_CLUSTER_DIR REDIS_CLUSTER_PORTS REDIS_CLUSTER_MASTER_PORTS
}

redis_cluster_stop() {
    if [ -z "${REDIS_CLUSTER_DIR:-}" ]; then
        _redis_log "redis_cluster_stop: no cluster"
        return 1
    fi
    _redis_rmtop "$REDIS_CLUSTER_DIR"
    unset REDIS_CLUSTER_DIR REDIS_CLUSTER_PORTS REDIS_CLUSTER_MASTER_PORTS
}

# ------------------------------------------------------------------
# Running the program, and the end

# redis_run PROGRAM [ARGS...]: run it in the background and wait for it,
# so that the traps below run at once on a signal (bash defers traps
# while a foreground command runs) and stop it first. Returns its status
# (128 + n when signal n killed it).
redis_run() {
    local rc=0 d
    "$@" &
    _redis_child=$!
    for d in "${_redis_topdirs[@]}"; do echo "$_redis_child" >"$d/program.pid"; done
    wait "$_redis_child" || rc=$?
    _redis_child=
    return "$rc"
}

# Everything this shell started: the program redis_run runs, every
# server, every directory, every guard. Idempotent.
redis_cleanup() {
    local d i
    if [ -n "$_redis_child" ] && _redis_alive "$_redis_child"; then
        kill -TERM "$_redis_child" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            _redis_alive "$_redis_child" || break
            sleep 0.05
        done
        kill -KILL "$_redis_child" 2>/dev/null || true
        wait "$_redis_child" 2>/dev/null || true
    fi
    _redis_child=
    for d in "${_redis_topdirs[@]}"; do
        _redis_rmtop "$d"
    done
}

_redis_on_exit() {
    local rc=$?
    trap - EXIT
    # Only the shell that sourced us: never a subshell.
    [ "$BASHPID" = "$_redis_owner" ] || exit "$rc"
    redis_cleanup
    exit "$rc"
}

_redis_on_signal() {
    trap - EXIT INT TERM HUP
    _redis_log "SIG$1: stopping the program and the servers"
    redis_cleanup
    exit "$2"
}

trap _redis_on_exit EXIT
trap '_redis_on_signal INT 130' INT
trap '_redis_on_signal TERM 143' TERM
trap '_redis_on_signal HUP 129' HUP
