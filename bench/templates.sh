#!/usr/bin/env bash
# vmon template benchmark: prints a figures table and writes a JSON summary.
#
#   sudo bash bench/templates.sh
#
# One `vmon serve --warm-pool 0` on 127.0.0.1, then bench/templates.mjs (all sequential):
#   1. Template.build() of a 3-step template from `base` (RUN, COPY of a small tree, ENV): cold (a
#      fresh nonce in the RUN command and in the copied tree), `skipCache: true`, and fully cached
#      (the same template rebuilt, every step `CACHED [n/3]`), BENCH_TPL_BUILDS builds each
#   2. Sandbox.create() → first commands.run('true') from `base` and from a template with a start
#      and ready command, BENCH_TPL_CREATES sequential creates each (alternating), both cold boots
# Every sandbox is killed; the vmon serve this script starts is stopped on exit. Figures only:
# nothing here fails on a time.
#
# Environment knobs (defaults in brackets):
#   VMON_BENCH_TPL_DATA_DIR [/var/lib/vmon-bench-templates]  data dir (the base template is hard-linked in)
#   VMON_BENCH_TEMPLATE_SRC [/var/lib/vmon/templates/base]   where to hard-link base from
#   VMON_BENCH_TPL_OUT [/tmp/vmon-bench-templates-<time>]    JSON files and the vmon log
#   VMON_BENCH_TPL_SUMMARY [/tmp/vmon-bench-templates-summary.json]
#   VMON_BIN [<repo>/bin/vmon], RUNSC [/usr/local/bin/runsc]
#   BENCH_TPL_BUILDS [5] BENCH_TPL_CREATES [20] BENCH_TPL_SKIP_CACHE [yes]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

if [ "$(id -u)" != 0 ]; then
  echo "bench/templates.sh must run as root (overlay mounts, network namespaces, runsc)" >&2
  exit 1
fi

# Loopback-only network namespace, as in bench/run.sh: sandboxes (and build sandboxes, whose
# egress is unrestricted) must never reach the machine's real network. nsenter switches the
# network namespace only (`ip netns exec` would remount /sys and hide the cgroups runsc needs).
if [ -z "${VMON_BENCH_TPL_IN_NETNS:-}" ]; then
  ns=vmonbenchtpl-iso
  ip netns del "$ns" 2>/dev/null || true
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  rc=0
  VMON_BENCH_TPL_IN_NETNS=1 nsenter --net="/run/netns/$ns" bash "$0" "$@" || rc=$?
  ip netns del "$ns" 2>/dev/null || true
  exit "$rc"
fi

DATA=${VMON_BENCH_TPL_DATA_DIR:-/var/lib/vmon-bench-templates}
TEMPLATE_SRC=${VMON_BENCH_TEMPLATE_SRC:-/var/lib/vmon/templates/base}
OUT=${VMON_BENCH_TPL_OUT:-/tmp/vmon-bench-templates-$(date +%Y%m%dT%H%M%S)}
SUMMARY=${VMON_BENCH_TPL_SUMMARY:-/tmp/vmon-bench-templates-summary.json}
RUNSC=${RUNSC:-/usr/local/bin/runsc}
N_BUILDS=${BENCH_TPL_BUILDS:-5}
N_CREATES=${BENCH_TPL_CREATES:-20}
SKIP_CACHE=${BENCH_TPL_SKIP_CACHE:-yes}
mkdir -p "$OUT"

# Snapshot the binaries: another build may replace bin/ while the benchmark runs.
BIN_DIR="$OUT/bin"
mkdir -p "$BIN_DIR"
cp "${VMON_BIN:-$repo/bin/vmon}" "$BIN_DIR/vmon"
cp "$(dirname "${VMON_BIN:-$repo/bin/vmon}")/envd" "$BIN_DIR/envd"
VMON="$BIN_DIR/vmon"

log() { printf '== %s\n' "$*" >&2; }

VMON_PID=
PORT=
failed=()

# --- leftover cleanup (only things under this data dir) --------------------------------------
cleanup_cgroups() { # $1 = cgroup parent, $2 = id
  local d
  for d in /sys/fs/cgroup/*/"$1"/"$2"; do
    [ -d "$d" ] || continue
    xargs -r kill -9 <"$d/cgroup.procs" 2>/dev/null || true
    rmdir "$d" 2>/dev/null || true
  done
}

# Sandboxes (build sandboxes included) of the data dir that still run after vmon stopped (or
# before it starts); prints how many there were.
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

# runsc keeps an nsfs bind mount <root>/null-netns in its state dir; it is only removed once no
# container of that root is left.
umount_null_netns() {
  local root=$1
  if [ -d "$root" ] && [ -z "$("$RUNSC" --root="$root" list -quiet 2>/dev/null)" ]; then
    if mountpoint -q "$root/null-netns" 2>/dev/null; then umount "$root/null-netns" || umount -l "$root/null-netns" || true; fi
  fi
}

# --- vmon serve ----------------------------------------------------------------------------
start_vmon() { # args: extra serve flags
  PORT=$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
  local logf="$OUT/vmon.log"
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
: >"$OUT/leftovers.txt"

cat >"$OUT/meta.json" <<EOF
{
  "startedAt": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "command": "sudo bash bench/templates.sh",
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
  "warmPool": 0,
  "builds": $N_BUILDS,
  "creates": $N_CREATES
}
EOF

# --- the run -----------------------------------------------------------------------------
if start_vmon --warm-pool 0; then
  log "templates: $N_BUILDS builds each, $N_CREATES creates each"
  node bench/templates.mjs run --dir "$OUT" --builds "$N_BUILDS" --creates "$N_CREATES" --skip-cache "$SKIP_CACHE" ||
    failed+=(run)
  if [ -n "$VMON_PID" ] && ! kill -0 "$VMON_PID" 2>/dev/null; then
    st=0
    wait "$VMON_PID" 2>/dev/null || st=$?
    log "vmon serve (pid $VMON_PID) died during the run, exit status $st; log: $OUT/vmon.log"
    VMON_PID=
    failed+=(vmon-died)
  fi
  stop_vmon
else
  failed+=(vmon-serve)
fi
umount_null_netns "$DATA/runsc"

node bench/templates.mjs report --dir "$OUT" --summary "$SUMMARY" --failed "${failed[*]:-}" || [ "${#failed[@]}" -gt 0 ] || failed+=(report)
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
