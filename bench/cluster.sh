#!/usr/bin/env bash
# vmon cluster benchmark (issue 20): prints Markdown tables with ratios and writes a JSON summary.
#
#   sudo bash bench/cluster.sh
#
# Everything runs in its own network namespace (vmbench-iso): a bridge vmbench0 (10.98.0.1/24)
# is made inside it, and each node gets a network namespace of its own (vmbench-n1..3) with a
# veth on that bridge, so no member and no sandbox can reach the machine's real network. In order:
#   0. the Go benchmarks of the placement decision with 1,000 sandboxes recorded
#      (internal/placement BenchmarkOrder1000Nodes, internal/cluster BenchmarkCreateWith1000Recorded);
#   1. one `vmon serve --role all --warm-pool 0` on 127.0.0.1: sequential creates, commands.run('true');
#   2. a `--role driver` (API on 127.0.0.1, cluster and gossip on 10.98.0.1) with one
#      `--role node` (n1, which has the base template and publishes it to the store): the same,
#      plus C concurrent creators;
#   3. nodes n2 and n3 join (they fetch base from the store): sequential and concurrent creates
#      again, then resume of a paused 512 MiB sandbox with 200 MiB of /dev/shm written, on the
#      node that paused it vs on another one (its holder drained before Sandbox.connect()).
# Every member runs with --warm-pool 0 (cold boots everywhere). Every sandbox is killed, every
# process, namespace, bridge and mount this script made is removed on exit (also on failure).
# Figures only: nothing here fails on a time.
#
# Environment knobs (defaults in brackets):
#   VMON_BENCH_CL_ROOT [/var/lib/vmon-bench-cluster]  data dirs (all, driver, n1..n3) and the store
#   VMON_BENCH_TEMPLATE_SRC [/var/lib/vmon-test/templates/base]  where to hard-link base from
#   VMON_BENCH_CL_OUT [/tmp/vmon-bench-cluster-<time>]  JSON files and the members' logs
#   VMON_BENCH_CL_SUMMARY [/tmp/vmon-bench-cluster-summary.json]
#   VMON_BIN [<repo>/bin/vmon], RUNSC [/usr/local/bin/runsc]
#   BENCH_CL_CREATES [20]   sequential creates per setup
#   BENCH_CL_EXECS [200]    commands.run('true') on one sandbox per setup
#   BENCH_CL_CREATORS [4]   concurrent creators
#   BENCH_CL_BURST [24]     creates (create → run → kill cycles) shared by those creators
#   BENCH_CL_RESUMES [5]    resumes of each kind (same node, another node)
#   BENCH_CL_GO [yes]       run the Go benchmarks (needs the Go toolchain; "no" skips them)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

. "$repo/bench/lib.sh"
require_root
isolate_netns vmbench-iso VMON_BENCH_CL_IN_NETNS "$@"

ROOT=${VMON_BENCH_CL_ROOT:-/var/lib/vmon-bench-cluster}
TEMPLATE_SRC=${VMON_BENCH_TEMPLATE_SRC:-/var/lib/vmon-test/templates/base}
OUT=${VMON_BENCH_CL_OUT:-/tmp/vmon-bench-cluster-$(date +%Y%m%dT%H%M%S)}
SUMMARY=${VMON_BENCH_CL_SUMMARY:-/tmp/vmon-bench-cluster-summary.json}
RUNSC=${RUNSC:-/usr/local/bin/runsc}
N_CREATES=${BENCH_CL_CREATES:-20}
N_EXECS=${BENCH_CL_EXECS:-200}
N_CREATORS=${BENCH_CL_CREATORS:-4}
N_BURST=${BENCH_CL_BURST:-24}
N_RESUMES=${BENCH_CL_RESUMES:-5}
RUN_GO=${BENCH_CL_GO:-yes}

BRIDGE=vmbench0
DRIVER_IP=10.98.0.1
NODE_NAMES=(n1 n2 n3)
NODE_IPS=(10.98.0.11 10.98.0.12 10.98.0.13)
STORE=$ROOT/store
DRIVER_DIR=$ROOT/driver
DATA=$ROOT/all # lib.sh's start_vmon/stop_vmon work on $DATA: the --role all server, then the driver
mkdir -p "$OUT" "$ROOT"

ensure_sdk
snapshot_binaries

failed=()
declare -A NODE_PID=()

# --- cleanup ---------------------------------------------------------------------------------
stop_pid() { # $1 = pid, $2 = grace in tenths of a second
  local pid=$1 i
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 "${2:-200}"); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && { log "pid $pid ignored SIGTERM; SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
  wait "$pid" 2>/dev/null || true
}

# Removes what a member's data dir left: sandboxes still running, runsc's null-netns mount and
# the mount namespace a member pins in its data dir (it outlives the process).
cleanup_member_dir() { # $1 = data dir
  local DATA=$1 left
  [ -d "$DATA" ] || return 0
  left=$(cleanup_vmon_leftovers)
  if [ "$left" != 0 ]; then
    log "removed $left sandbox(es) of $DATA left running"
    echo "$left" >>"$OUT/leftovers.txt"
  fi
  umount_null_netns "$DATA/runsc"
  local m
  for m in mntns/mnt mntns; do
    if mountpoint -q "$DATA/$m" 2>/dev/null; then umount -l "$DATA/$m" 2>/dev/null || true; fi
  done
}

stop_nodes() {
  local n
  for n in "${!NODE_PID[@]}"; do stop_pid "${NODE_PID[$n]}" 300; done
  NODE_PID=()
}

cluster_cleanup() {
  stop_vmon || true # the driver or the --role all server, whichever runs (kills its sandboxes first)
  stop_nodes
  local d n i
  for d in "$ROOT/all" "$DRIVER_DIR" "${NODE_NAMES[@]/#/$ROOT/}"; do cleanup_member_dir "$d"; done
  # Anything still running out of the bench's data dirs (a runsc the steps above missed).
  for i in $(pgrep -f "$ROOT/" 2>/dev/null || true); do kill -KILL "$i" 2>/dev/null || true; done
  for n in "${NODE_NAMES[@]}"; do ip netns del "vmbench-$n" 2>/dev/null || true; done
  ip link del "$BRIDGE" 2>/dev/null || true
}
EXIT_CLEANUP=cluster_cleanup
trap on_exit EXIT
trap 'exit 130' INT TERM

# --- preparation -----------------------------------------------------------------------------
# An earlier run killed hard may have left all of it behind.
cluster_cleanup
rm -rf "$STORE" "$ROOT"/{all,driver,n1,n2,n3}
: >"$OUT/leftovers.txt"
member_dir() { # $1 = name, $2 = yes: hard-link base in
  mkdir -p "$ROOT/$1/templates"
  [ "${2:-}" != yes ] || cp -al "$TEMPLATE_SRC" "$ROOT/$1/templates/base"
}
member_dir all yes
member_dir driver
member_dir n1 yes
member_dir n2
member_dir n3
mkdir -p "$STORE"

ip link add "$BRIDGE" type bridge
ip addr add "$DRIVER_IP/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
for i in 0 1 2; do
  ns=vmbench-${NODE_NAMES[$i]}
  ip netns add "$ns"
  ip link add "vmbench-v$i" type veth peer name eth0 netns "$ns"
  ip link set "vmbench-v$i" master "$BRIDGE" up
  ip -n "$ns" addr add "${NODE_IPS[$i]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done

write_meta "$(cat <<EOF
  "rootDir": "$ROOT",
  "creates": $N_CREATES,
  "execs": $N_EXECS,
  "creators": $N_CREATORS,
  "burst": $N_BURST,
  "resumes": $N_RESUMES
EOF
)"

# --- 0. Go benchmarks (before any vmon runs: they compete for the same 2 cores) ---------------
if [ "$RUN_GO" = yes ]; then
  log "go test -bench (placement with 1,000 sandboxes recorded)"
  if ! (go test ./internal/placement -run '^$' -bench 'Order1000Nodes' -benchmem &&
    go test ./internal/cluster -run '^$' -bench 'CreateWith1000Recorded' -benchmem) >"$OUT/go-bench.txt" 2>&1; then
    tail -n 20 "$OUT/go-bench.txt" >&2
    failed+=(go-bench)
  fi
fi

sdk() { node bench/cluster.mjs "$@" --dir "$OUT" --vmon "$VMON" --driver-dir "$DRIVER_DIR"; }

# --- 1. one vmon serve --role all ----------------------------------------------------------------
DATA=$ROOT/all
if start_vmon "$OUT/all.log" --warm-pool 0; then
  sdk creates --label all --n "$N_CREATES" || failed+=(all-creates)
  sdk exec --label all --n "$N_EXECS" || failed+=(all-exec)
  stop_vmon
else
  failed+=(all-serve)
fi
cleanup_member_dir "$ROOT/all"

# --- 2. driver + n1 ----------------------------------------------------------------------------
start_node() { # $1 = index into NODE_NAMES, $2 = its join token
  local i=$1 name=${NODE_NAMES[$1]} token=$2
  log "vmon serve --role node --name $name in netns vmbench-$name (log: $OUT/$name.log)"
  setsid nsenter --net="/run/netns/vmbench-$name" "$VMON" serve --role node --name "$name" \
    --data-dir "$ROOT/$name" --listen "${NODE_IPS[$i]}:3001" --gossip-listen "${NODE_IPS[$i]}:7946" \
    --join "$DRIVER_IP:3100" --join-token "$token" --warm-pool 0 --store "$STORE" \
    >"$OUT/$name.log" 2>&1 </dev/null &
  NODE_PID[$name]=$!
  local t
  for t in $(seq 1 3000); do # ≤ 300 s (n2 and n3 fetch base from the store first)
    if ! kill -0 "${NODE_PID[$name]}" 2>/dev/null; then
      echo "node $name exited early; last lines of $OUT/$name.log:" >&2
      tail -n 30 "$OUT/$name.log" >&2
      return 1
    fi
    grep -q "^vmon node $name serving on " "$OUT/$name.log" && return 0
    sleep 0.1
  done
  echo "node $name not serving after 300 s" >&2
  return 1
}

# Waits until `vmon node ls` on the driver lists $1 nodes ready.
wait_ready() {
  local want=$1 t
  for t in $(seq 1 600); do # ≤ 60 s
    [ "$("$VMON" node ls --json --data-dir "$DRIVER_DIR" 2>/dev/null | grep -c '"state":"ready"')" -ge "$want" ] && return 0
    sleep 0.1
  done
  echo "fewer than $want nodes ready after 60 s:" >&2
  "$VMON" node ls --data-dir "$DRIVER_DIR" >&2 || true
  return 1
}

cluster_phase() {
  local token
  # The first token is issued before the driver runs: it makes the cluster CA the driver serves.
  token=$("$VMON" node join-token --data-dir "$DRIVER_DIR")
  DATA=$DRIVER_DIR
  start_vmon "$OUT/driver.log" --role driver --name driver --cluster-listen "$DRIVER_IP:3100" \
    --gossip-listen "$DRIVER_IP:7946" --store "$STORE" || { failed+=(driver); return 1; }
  start_node 0 "$token" || { failed+=(node-n1); return 1; }
  wait_ready 1 || { failed+=(node-n1-ready); return 1; }
  # The driver knows base once n1 has published it to the store (n2 and n3 take it from there).
  local build t
  build=$(sed -n 's/.*"buildId": *"\([^"]*\)".*/\1/p' "$ROOT/n1/templates/base/manifest.json" | head -1)
  for t in $(seq 1 3000); do
    [ -e "$STORE/refs/templates/base/$build/manifest.ref" ] && break
    sleep 0.1
  done
  [ -e "$STORE/refs/templates/base/$build/manifest.ref" ] || { echo "n1 did not publish base to the store" >&2; failed+=(publish); return 1; }
  sdk ready || { failed+=(driver-template); return 1; }
  sdk creates --label node1 --n "$N_CREATES" || failed+=(node1-creates)
  sdk exec --label node1 --n "$N_EXECS" || failed+=(node1-exec)
  sdk burst --label node1 --n "$N_BURST" --creators "$N_CREATORS" || failed+=(node1-burst)

  # Later tokens through the running driver's API.
  for t in 1 2; do
    token=$("$VMON" node join-token --api-url "$VMON_BENCH_URL" --data-dir "$DRIVER_DIR")
    start_node "$t" "$token" || { failed+=("node-${NODE_NAMES[$t]}"); return 1; }
  done
  wait_ready 3 || { failed+=(nodes-ready); return 1; }
  sdk creates --label node3 --n "$N_CREATES" || failed+=(node3-creates)
  sdk burst --label node3 --n "$N_BURST" --creators "$N_CREATORS" || failed+=(node3-burst)
  sdk resume --n "$N_RESUMES" || failed+=(resume)
}
cluster_phase || true
for n in "${!NODE_PID[@]}"; do
  kill -0 "${NODE_PID[$n]}" 2>/dev/null || { log "node $n died during the run; log: $OUT/$n.log"; failed+=("$n-died"); }
done
if [ -n "$VMON_PID" ] && ! kill -0 "$VMON_PID" 2>/dev/null; then
  log "the driver died during the run; log: $OUT/driver.log"
  failed+=(driver-died)
fi
cluster_cleanup

node bench/cluster.mjs report --dir "$OUT" --summary "$SUMMARY" --failed "${failed[*]:-}" || [ "${#failed[@]}" -gt 0 ] || failed+=(report)
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
