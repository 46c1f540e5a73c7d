# shellcheck shell=bash
# Shared by bench/run.sh and bench/templates.sh, which source it after `cd` to the repo root and
# `repo=$(pwd)`; the caller's `set -euo pipefail` applies. Before calling these functions the
# script sets DATA (the bench data dir), OUT (its output dir) and RUNSC. snapshot_binaries sets
# VMON; start_vmon sets VMON_PID and PORT and exports VMON_BENCH_URL and VMON_BENCH_KEY_FILE.
# "$0" is the sourcing script's path throughout (sourcing does not change it).

log() { printf '== %s\n' "$*" >&2; }

require_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "bench/${0##*/} must run as root (overlay mounts, network namespaces, runsc)" >&2
    exit 1
  fi
}

# Run everything in a loopback-only network namespace: vmon gives sandboxes NATed uplinks (and
# build sandboxes unrestricted egress), and a benchmark must never let them reach the machine's
# real network. nsenter switches the network namespace only (`ip netns exec` would remount /sys
# and hide the cgroups runsc needs).
# $1 = namespace, $2 = the variable that marks the run inside it, rest = the script's arguments.
# Outside, re-executes the script ("$0") inside the namespace and exits with its status; inside,
# returns.
isolate_netns() {
  local ns=$1 mark=$2
  shift 2
  [ -z "${!mark:-}" ] || return 0
  ip netns del "$ns" 2>/dev/null || true
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  local rc=0
  env "$mark=1" nsenter --net="/run/netns/$ns" bash "$0" "$@" || rc=$?
  ip netns del "$ns" 2>/dev/null || true
  exit "$rc"
}

# Snapshot the binaries: another build may replace bin/ while the benchmark runs. envd is taken
# from beside the vmon binary (vmon serve's default --envd-path).
snapshot_binaries() {
  local src=${VMON_BIN:-$repo/bin/vmon}
  mkdir -p "$OUT/bin"
  cp "$src" "$OUT/bin/vmon"
  cp "$(dirname "$src")/envd" "$OUT/bin/envd"
  # The code-interpreter service is installed with envd (vmon serve looks for it beside envd).
  if [ -e "$(dirname "$src")/vmon-code-interpreter" ]; then
    cp "$(dirname "$src")/vmon-code-interpreter" "$OUT/bin/vmon-code-interpreter"
  fi
  VMON="$OUT/bin/vmon"
}

VMON_PID=
PORT=
EXIT_CLEANUP= # see on_exit

# --- leftover cleanup (only things under the data dir) -------------------------------------
cleanup_cgroups() { # $1 = cgroup parent, $2 = id (or empty: the parent itself)
  local d
  for d in /sys/fs/cgroup/*/"$1"${2:+/$2}; do
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
start_vmon() { # $1 = log file, rest = extra serve flags
  local logf=$1
  shift
  PORT=$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
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

# The EXIT trap: stops vmon serve and removes what it left. A script that makes more than vmon's
# sandboxes names the function that removes it in EXIT_CLEANUP.
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  stop_vmon || true
  [ -z "${EXIT_CLEANUP:-}" ] || "$EXIT_CLEANUP" || true
  umount_null_netns "$DATA/runsc" || true
  exit "$rc"
}

# --- preparation -------------------------------------------------------------------------
# Installs the e2b SDK the scripts drive (pinned in test/e2e/package-lock.json) when it is missing.
ensure_sdk() {
  if [ ! -e "$repo/test/e2e/node_modules/e2b/package.json" ]; then
    log "installing test/e2e's node packages (the pinned e2b SDK)"
    (cd "$repo/test/e2e" && npm ci --no-audit --no-fund >&2)
  fi
}


# Hard-links the base template from TEMPLATE_SRC into the data dir, removes the sandboxes an
# earlier run left there and starts $OUT/leftovers.txt.
prepare_data_dir() {
  mkdir -p "$DATA/templates"
  if [ ! -e "$DATA/templates/base/manifest.json" ]; then
    log "hard-linking the base template from $TEMPLATE_SRC"
    cp -al "$TEMPLATE_SRC" "$DATA/templates/base"
  fi
  local pre
  pre=$(cleanup_vmon_leftovers)
  [ "$pre" = 0 ] || log "removed $pre sandbox(es) left in $DATA by an earlier run"
  : >"$OUT/leftovers.txt"
}

# Prints the host's proactive memory reclaim, if any: DAMON schemes that page memory out once it
# has been idle for a while make the first command after that idleness slower at any sandbox count,
# so a density figure is only comparable with one taken under the same policy.
reclaim_policy() {
  local out="" k c s age_min aggr_us action
  for k in /sys/kernel/mm/damon/admin/kdamonds/[0-9]*; do
    [ "$(cat "$k/state" 2>/dev/null)" = on ] || continue
    for c in "$k"/contexts/[0-9]*; do
      aggr_us=$(cat "$c/monitoring_attrs/intervals/aggr_us" 2>/dev/null || echo 0)
      for s in "$c"/schemes/[0-9]*; do
        action=$(cat "$s/action" 2>/dev/null) || continue
        age_min=$(cat "$s/access_pattern/age/min" 2>/dev/null || echo 0)
        out="${out:+$out; }DAMON $action of $(cat "$c/operations" 2>/dev/null) memory idle for $((age_min * aggr_us / 1000000)) s or more"
      done
    done
  done
  echo "${out:-none seen}"
}

# KSM's pace (what ksmd scans per wake-up), for runs with vmon serve --memory-merge.
ksm_pace() {
  local d=/sys/kernel/mm/ksm
  [ -e $d/run ] || { echo "no KSM"; return; }
  echo "run=$(cat $d/run) pages_to_scan=$(cat $d/pages_to_scan) sleep_millisecs=$(cat $d/sleep_millisecs) use_zero_pages=$(cat $d/use_zero_pages 2>/dev/null || echo -)"
}

# Writes $OUT/meta.json: the fields both benchmarks record, then $1 (the script's own members,
# JSON lines without the braces).
write_meta() {
  cat >"$OUT/meta.json" <<EOF
{
  "startedAt": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "command": "sudo bash bench/${0##*/}",
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
$1
}
EOF
}
