#!/usr/bin/env bash
# vmon benchmark (issue 3, "Benchmark"): prints a figures table and writes a JSON summary.
#
#   sudo bash bench/run.sh
#
# Phases (all sequential, on 127.0.0.1 only):
#   1. SDK Sandbox.create() → first commands.run('true'), 30 sequential creates, `--warm-pool 0`
#   2. the same directly with runsc on the same rootfs (overlay + netns + vmon's config shape);
#      2b. phases 1, 2 and 4 again as alternating vmon/runsc pairs (bench/pairs.mjs), for the ratios
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

. "$repo/bench/lib.sh"
require_root
isolate_netns vmonbench-iso VMON_BENCH_IN_NETNS "$@"

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

ensure_sdk
snapshot_binaries

failed=()

# --- leftovers of phase 2 (only things under this data dir / with this script's names) -------
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

EXIT_CLEANUP=cleanup_runtime_leftovers
trap on_exit EXIT
trap 'exit 130' INT TERM

# --- preparation -------------------------------------------------------------------------
prepare_data_dir
cleanup_runtime_leftovers
: >"$OUT/incidents.txt"

warm_flag=no
if "$VMON" serve --help 2>&1 | grep -q -- '--warm-pool'; then warm_flag=yes; fi
cold_flags=()
[ "$warm_flag" = yes ] && cold_flags=(--warm-pool 0)

write_meta "$(cat <<EOF
  "warmPoolFlag": $( [ "$warm_flag" = yes ] && echo true || echo false),
  "warmPool": $WARM_POOL,
  "warmGapMs": $WARM_GAP_MS
EOF
)"

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
if start_vmon "$OUT/vmon-cold.log" "${cold_flags[@]}"; then
  phase 1-sdk-cold node bench/sdk.mjs create --n "$N_CREATES" --label cold --out "$OUT/sdk-cold.json" \
    --capture-config "$OUT/vmon-config.json" --data-dir "$DATA"
  # No sandbox runs during phase 2 (vmon idles).
  phase 2-runtime node bench/runtime.mjs --n "$N_CREATES" --out "$OUT/runtime.json" --data-dir "$DATA" \
    --template-config "$OUT/vmon-config.json" --runsc "$RUNSC"
  # The ratios: the same two measurements as alternating pairs in one phase.
  [ -n "$VMON_PID" ] && phase 2b-pairs node bench/pairs.mjs --n "$N_CREATES" --out "$OUT/pairs.json" --data-dir "$DATA" \
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
  if start_vmon "$OUT/vmon-warm.log" --warm-pool "$WARM_POOL"; then
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
