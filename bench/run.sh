#!/usr/bin/env bash
# vmon benchmark (issue 3, "Benchmark"): prints a figures table and writes a JSON summary.
#
#   sudo bash bench/run.sh
#
# Phases (all sequential, on 127.0.0.1 only):
#   1. SDK Sandbox.create() → first commands.run('true'), 30 sequential creates, `--warm-pool 0`
#   2. the same directly with runsc on the same rootfs (overlay + netns + vmon's config shape)
#   3. warm path: `--warm-pool 2`, 30 sequential creates with a 1 s gap so the pool refills
#   4. commands.run('true') on one live sandbox, 100 runs
#   5. idle memory with 20 sandboxes running
# Each phase cleans up what it made; the vmon serve this script starts is stopped on exit.
#
# Environment knobs (defaults in brackets):
#   VMON_BENCH_DATA_DIR [/var/lib/vmon-bench]   data dir (the base template is hard-linked in)
#   VMON_BENCH_TEMPLATE_SRC [/var/lib/vmon/templates/base]  where to hard-link base from
#   VMON_BENCH_OUT [/tmp/vmon-bench-<time>]      per-phase JSON files and vmon logs
#   VMON_BENCH_SUMMARY [/tmp/vmon-bench-summary.json]
#   VMON_BIN [<repo>/bin/vmon], RUNSC [/usr/local/bin/runsc]
#   BENCH_CREATES [30] BENCH_EXECS [100] BENCH_MEM_SANDBOXES [20] BENCH_WARM_POOL [2] BENCH_WARM_GAP_MS [1000]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

if [ "$(id -u)" != 0 ]; then
  echo "bench/run.sh must run as root (overlay mounts, network namespaces, runsc)" >&2
  exit 1
fi

# Run everything in a loopback-only network namespace: vmon gives sandboxes NATed uplinks, and a
# benchmark must never let them reach the machine's real network. nsenter switches the network
# namespace only (`ip netns exec` would remount /sys and hide the cgroups runsc needs).
if [ -z "${VMON_BENCH_IN_NETNS:-}" ]; then
  ns=vmonbench-iso
  ip netns del "$ns" 2>/dev/null || true
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  rc=0
  VMON_BENCH_IN_NETNS=1 nsenter --net="/run/netns/$ns" bash "$0" "$@" || rc=$?
  ip netns del "$ns" 2>/dev/null || true
  exit "$rc"
fi

DATA=${VMON_BENCH_DATA_DIR:-/var/lib/vmon-bench}
TEMPLATE_SRC=${VMON_BENCH_TEMPLATE_SRC:-/var/lib/vmon/templates/base}
OUT=${VMON_BENCH_OUT:-/tmp/vmon-bench-$(date +%Y%m%dT%H%M%S)}
SUMMARY=${VMON_BENCH_SUMMARY:-/tmp/vmon-bench-summary.json}
RUNSC=${RUNSC:-/usr/local/bin/runsc}
N_CREATES=${BENCH_CREATES:-30}
N_EXECS=${BENCH_EXECS:-100}
N_MEM=${BENCH_MEM_SANDBOXES:-20}
WARM_POOL=${BENCH_WARM_POOL:-2}
WARM_GAP_MS=${BENCH_WARM_GAP_MS:-1000}
mkdir -p "$OUT"

# Snapshot the binaries: another build may replace bin/ while the benchmark runs. envd is taken
# from beside the vmon binary (vmon serve's default --envd-path).
BIN_DIR="$OUT/bin"
mkdir -p "$BIN_DIR"
cp "${VMON_BIN:-$repo/bin/vmon}" "$BIN_DIR/vmon"
cp "$(dirname "${VMON_BIN:-$repo/bin/vmon}")/envd" "$BIN_DIR/envd"
VMON="$BIN_DIR/vmon"

log() { printf '== %s\n' "$*" >&2; }

VMON_PID=
PORT=
failed=()

# --- leftover cleanup (only things under this data dir / with this script's names) ----------
cleanup_cgroups() { # $1 = cgroup parent, $2 = id (or empty: the parent itself)
  local d
  for d in /sys/fs/cgroup/*/"$1"${2:+/$2}; do
    [ -d "$d" ] || continue
    xargs -r kill -9 <"$d/cgroup.procs" 2>/dev/null || true
    rmdir "$d" 2>/dev/null || true
  done
}

# Sandboxes of the bench data dir that still run after vmon stopped (or before it starts); prints
# how many there were.
cleanup_vmon_leftovers() {
  local -A ids=()
  local id dir
  if [ -d "$DATA/runsc" ]; then
    for id in $("$RUNSC" --root="$DATA/runsc" list -quiet 2>/dev/null || true); do ids[$id]=1; done
  fi
  for dir in "$DATA"/sandboxes/*/; do
    if [ -d "$dir" ]; then ids[$(basename "$dir")]=1; fi
  done
  for id in "${!ids[@]}"; do
    "$RUNSC" --root="$DATA/runsc" kill "$id" KILL >/dev/null 2>&1 || true
    "$RUNSC" --root="$DATA/runsc" delete --force "$id" >/dev/null 2>&1 || true
    dir="$DATA/sandboxes/$id"
    if mountpoint -q "$dir/root" 2>/dev/null; then umount "$dir/root" 2>/dev/null || umount -l "$dir/root" || true; fi
    if [ -e "/run/netns/vmon-$id" ]; then ip netns del "vmon-$id" 2>/dev/null || true; fi
    cleanup_cgroups vmon "$id"
    if ! mountpoint -q "$dir/root" 2>/dev/null; then rm -rf "$dir"; fi
  done
  echo "${#ids[@]}"
}

cleanup_runtime_leftovers() {
  local id dir
  if [ -d "$DATA/bench-runtime/runsc" ]; then
    for id in $("$RUNSC" --root="$DATA/bench-runtime/runsc" list -quiet 2>/dev/null || true); do
      "$RUNSC" --root="$DATA/bench-runtime/runsc" delete --force "$id" >/dev/null 2>&1 || true
    done
  fi
  for dir in "$DATA"/bench-runtime/vbench-*/; do
    [ -d "$dir" ] || continue
    if mountpoint -q "$dir/root"; then umount "$dir/root" 2>/dev/null || umount -l "$dir/root" || true; fi
    if ! mountpoint -q "$dir/root"; then rm -rf "$dir"; fi
  done
  for id in $(ip netns list 2>/dev/null | awk '$1 ~ /^vbench-/ {print $1}'); do ip netns del "$id" || true; done
  for dir in /sys/fs/cgroup/*/vmonbench/*/; do
    if [ -d "$dir" ]; then cleanup_cgroups vmonbench "$(basename "$dir")"; fi
  done
  cleanup_cgroups vmonbench ""
  umount_null_netns "$DATA/bench-runtime/runsc"
  rm -rf "$DATA/bench-runtime/runsc" || true
  rmdir "$DATA/bench-runtime" 2>/dev/null || true
}

# runsc keeps an nsfs bind mount <root>/null-netns in its state dir; it is only removed once no
# container of that root is left.
umount_null_netns() {
  local root=$1
  if [ -d "$root" ] && [ -z "$("$RUNSC" --root="$root" list -quiet 2>/dev/null)" ]; then
    if mountpoint -q "$root/null-netns" 2>/dev/null; then umount "$root/null-netns" || umount -l "$root/null-netns" || true; fi
  fi
}

# --- vmon serve ----------------------------------------------------------------------------
start_vmon() { # $1 = tag, rest = extra serve flags
  local tag=$1
  shift
  PORT=$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
  local logf="$OUT/vmon-$tag.log"
  log "vmon serve --data-dir $DATA --listen 127.0.0.1:$PORT $* (log: $logf)"
  setsid "$VMON" serve --data-dir "$DATA" --listen "127.0.0.1:$PORT" "$@" >"$logf" 2>&1 </dev/null &
  VMON_PID=$!
  export VMON_BENCH_URL="http://127.0.0.1:$PORT" VMON_BENCH_KEY_FILE="$DATA/api-key"
  local i
  for i in $(seq 1 1200); do # ≤ 120 s
    if ! kill -0 "$VMON_PID" 2>/dev/null; then
      echo "vmon serve exited early; last lines of $logf:" >&2
      tail -n 30 "$logf" >&2
      VMON_PID=
      return 1
    fi
    if curl -fsS -o /dev/null --max-time 2 "$VMON_BENCH_URL/health" 2>/dev/null && [ -s "$DATA/api-key" ]; then
      return 0
    fi
    sleep 0.1
  done
  echo "vmon serve not healthy after 120 s" >&2
  return 1
}

stop_vmon() {
  if [ -n "$VMON_PID" ] && kill -0 "$VMON_PID" 2>/dev/null; then
    timeout 120 node bench/sdk.mjs cleanup || true
    kill -TERM "$VMON_PID" 2>/dev/null || true
    local i
    for i in $(seq 1 200); do # ≤ 20 s
      kill -0 "$VMON_PID" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$VMON_PID" 2>/dev/null; then
      log "vmon serve ignored SIGTERM for 20 s; SIGKILL"
      kill -KILL "$VMON_PID" 2>/dev/null || true
    fi
  fi
  [ -z "$VMON_PID" ] || wait "$VMON_PID" 2>/dev/null || true
  VMON_PID=
  local left
  left=$(cleanup_vmon_leftovers)
  if [ "$left" != 0 ]; then
    log "removed $left sandbox(es) of $DATA left running after vmon stopped"
    echo "$left" >>"$OUT/leftovers.txt"
  fi
}

on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  stop_vmon || true
  cleanup_runtime_leftovers || true
  umount_null_netns "$DATA/runsc" || true
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# --- preparation -------------------------------------------------------------------------
mkdir -p "$DATA/templates"
if [ ! -e "$DATA/templates/base/manifest.json" ]; then
  log "hard-linking the base template from $TEMPLATE_SRC"
  cp -al "$TEMPLATE_SRC" "$DATA/templates/base"
fi
pre=$(cleanup_vmon_leftovers)
[ "$pre" = 0 ] || log "removed $pre sandbox(es) left in $DATA by an earlier run"
cleanup_runtime_leftovers
: >"$OUT/leftovers.txt"
: >"$OUT/incidents.txt"

warm_flag=no
if "$VMON" serve --help 2>&1 | grep -q -- '--warm-pool'; then warm_flag=yes; fi
cold_flags=()
[ "$warm_flag" = yes ] && cold_flags=(--warm-pool 0)

cat >"$OUT/meta.json" <<EOF
{
  "startedAt": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "command": "sudo bash bench/run.sh",
  "git": "$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')",
  "gitDirty": $( [ -n "$(git -C "$repo" status --porcelain -- . ':!bench' 2>/dev/null)" ] && echo true || echo false),
  "vmonSha256": "$(sha256sum "$VMON" | cut -c1-12)",
  "runsc": "$(readlink -f "$RUNSC")",
  "runscVersion": "$("$RUNSC" --version 2>/dev/null | head -1)",
  "kernel": "$(uname -r)",
  "cpus": $(nproc),
  "memTotalMiB": $(awk '/^MemTotal:/ {print int($2/1024)}' /proc/meminfo),
  "cpuModel": "$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo | sed 's/"/\\"/g')",
  "node": "$(node --version)",
  "dataDir": "$DATA",
  "warmPoolFlag": $( [ "$warm_flag" = yes ] && echo true || echo false),
  "warmPool": $WARM_POOL,
  "warmGapMs": $WARM_GAP_MS
}
EOF

phase() { # $1 = name, rest = command; a failed phase is reported and the rest still runs
  local name=$1
  shift
  log "phase $name"
  if ! "$@"; then
    log "phase $name FAILED"
    failed+=("$name")
  fi
  if [ -n "$VMON_PID" ] && ! kill -0 "$VMON_PID" 2>/dev/null; then
    local st=0
    wait "$VMON_PID" 2>/dev/null || st=$?
    log "vmon serve (pid $VMON_PID) died during phase $name, exit status $st$( [ "$st" -gt 128 ] && echo " (signal $((st - 128)))"); log: $OUT"
    echo "vmon serve died during phase $name, exit status $st" >>"$OUT/incidents.txt"
    VMON_PID=
    [[ " ${failed[*]} " == *" $name "* ]] || failed+=("$name")
  fi
}

# --- cold server: phases 1, 2, 4, 5 ------------------------------------------------------
vmon_rss() { awk '/^VmRSS:/ {print $2 * 1024}' "/proc/$VMON_PID/status" 2>/dev/null || echo null; }
if start_vmon cold "${cold_flags[@]}"; then
  phase 1-sdk-cold node bench/sdk.mjs create --n "$N_CREATES" --label cold --out "$OUT/sdk-cold.json" \
    --capture-config "$OUT/vmon-config.json" --data-dir "$DATA"
  # No sandbox runs during phase 2 (vmon idles).
  phase 2-runtime node bench/runtime.mjs --n "$N_CREATES" --out "$OUT/runtime.json" --data-dir "$DATA" \
    --template-config "$OUT/vmon-config.json" --runsc "$RUNSC"
  [ -n "$VMON_PID" ] && phase 4-exec node bench/sdk.mjs exec --n "$N_EXECS" --out "$OUT/exec.json"
  [ -n "$VMON_PID" ] && phase 5-memory node bench/sdk.mjs memory --n "$N_MEM" --settle-ms 10000 --out "$OUT/memory.json"
  [ -n "$VMON_PID" ] && echo "{\"vmonServeRssBytes\": $(vmon_rss)}" >"$OUT/vmon-rss.json" # after phases 1, 2, 4, 5
  stop_vmon
else
  failed+=(vmon-serve-cold)
fi

# --- warm server: phase 3 ----------------------------------------------------------------
if [ "$warm_flag" = yes ]; then
  if start_vmon warm --warm-pool "$WARM_POOL"; then
    phase 3-sdk-warm node bench/sdk.mjs create --n "$N_CREATES" --label warm --gap-ms "$WARM_GAP_MS" \
      --initial-wait-ms 3000 --out "$OUT/sdk-warm.json"
    stop_vmon
  else
    failed+=(vmon-serve-warm)
  fi
else
  log "vmon serve has no --warm-pool flag: phase 3 skipped"
fi
cleanup_runtime_leftovers

node bench/report.mjs --dir "$OUT" --summary "$SUMMARY" --failed "${failed[*]:-}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed phases: ${failed[*]}" >&2
  exit 1
fi
