#!/usr/bin/env bash
# Density (issue 24): one node filled with idle `base` sandboxes, measured at 1, 100, 250 and 500
# live (bench/density.mjs says what is measured at each step); then the report.
#
#   sudo bash bench/density.sh
#
# Environment knobs (defaults in brackets):
#   VMON_BENCH_DATA_DIR [/var/lib/vmon-bench]  VMON_BENCH_TEMPLATE_SRC [/var/lib/vmon/templates/base]
#   VMON_BENCH_OUT [/tmp/vmon-bench-density-<time>]  VMON_BIN [<repo>/bin/vmon]  RUNSC [/usr/local/bin/runsc]
#   DENSITY_STEPS [1,100,250,500]  DENSITY_SAMPLES [20]  DENSITY_IDLE_S [20]  DENSITY_SETTLE_S [10]
#   DENSITY_GAP_S [3] (think time before the matched-idle command samples)  DENSITY_RECHECK [1] (the first step again at the end)
#   DENSITY_CONCURRENCY [4]  DENSITY_PAUSED [0] (the paused-sandbox phase: so many created and paused; DENSITY_STEPS=0 for it alone)
#   DENSITY_SERVE_ARGS [] (more `vmon serve` flags, e.g. to compare runtime options)
#   DENSITY_WARM_POOL [0] (vmon serve --warm-pool; above 0, each create sample waits for the pool
#     to refill, so it times a warm create: the default node's path while its pool keeps up)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

. "$repo/bench/lib.sh"
require_root
isolate_netns vmonbench-iso VMON_BENCH_IN_NETNS "$@"

DATA=${VMON_BENCH_DATA_DIR:-/var/lib/vmon-bench}
TEMPLATE_SRC=${VMON_BENCH_TEMPLATE_SRC:-/var/lib/vmon/templates/base}
OUT=${VMON_BENCH_OUT:-/tmp/vmon-bench-density-$(date +%Y%m%dT%H%M%S)}
RUNSC=${RUNSC:-/usr/local/bin/runsc}
STEPS=${DENSITY_STEPS:-1,100,250,500}
SAMPLES=${DENSITY_SAMPLES:-20}
IDLE_S=${DENSITY_IDLE_S:-20}
SETTLE_S=${DENSITY_SETTLE_S:-10}
CONCURRENCY=${DENSITY_CONCURRENCY:-4}
GAP_S=${DENSITY_GAP_S:-3}
RECHECK=${DENSITY_RECHECK:-1}
PAUSED=${DENSITY_PAUSED:-0}
WARM_POOL=${DENSITY_WARM_POOL:-0}
mkdir -p "$OUT"

ensure_sdk
snapshot_binaries
# vmon serve --memory-merge starts ksmd; a host that had it stopped gets it stopped again.
ksm_run_before=$(cat /sys/kernel/mm/ksm/run 2>/dev/null || true)
restore_ksm() {
  if [ -n "$ksm_run_before" ] && [ "$(cat /sys/kernel/mm/ksm/run)" != "$ksm_run_before" ]; then
    echo "$ksm_run_before" >/sys/kernel/mm/ksm/run
  fi
}
EXIT_CLEANUP=restore_ksm
trap on_exit EXIT
trap 'exit 130' INT TERM
prepare_data_dir
write_meta "  \"reclaim\": \"$(reclaim_policy)\", \"ksm\": \"$(ksm_pace)\", \"serveArgs\": \"${DENSITY_SERVE_ARGS:-}\", \"steps\": \"$STEPS\", \"samples\": $SAMPLES, \"idleSeconds\": $IDLE_S, \"settleSeconds\": $SETTLE_S, \"warmPool\": $WARM_POOL"

max=${STEPS##*,}
max=${max:-0}
metrics_port=$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
# Room for the step's sandboxes, the ones measured on top of it and the warm pool's. With no warm
# pool (the default here) what is measured at idle is the sandboxes alone, and every create boots.
# A root image of an earlier envd build would pass for this one's below: each run builds its own.
rm -rf "$DATA/root-images"
# shellcheck disable=SC2086
start_vmon "$OUT/vmon.log" --warm-pool "$WARM_POOL" --max-sandboxes $((max + 8 + PAUSED + WARM_POOL)) \
  --metrics-listen "127.0.0.1:$metrics_port" ${DENSITY_SERVE_ARGS:-}
case " ${DENSITY_SERVE_ARGS:-} " in
*" --root-images=false "*) ;;
*)
  # serve builds the template's root image in the background; creates before it is ready boot
  # from an overlay, which is not what this run measures.
  for _ in $(seq 1 600); do
    compgen -G "$DATA/root-images/*.json" >/dev/null && break
    sleep 0.5
  done
  compgen -G "$DATA/root-images/*.json" >/dev/null || { echo "no root image after 5 min; see $OUT/vmon.log" >&2; exit 1; }
  log "root image ready: $(basename "$(compgen -G "$DATA/root-images/*.erofs" | head -1)")"
  ;;
esac
node bench/density.mjs --steps "$STEPS" --samples "$SAMPLES" --idle-s "$IDLE_S" --settle-s "$SETTLE_S" --concurrency "$CONCURRENCY" \
  --gap-s "$GAP_S" --recheck "$RECHECK" --warm-pool "$WARM_POOL" \
  --paused "$PAUSED" --data-dir "$DATA" --vmon-pid "$VMON_PID" --metrics "http://127.0.0.1:$metrics_port" --out "$OUT/density.json"
stop_vmon

node bench/density-report.mjs "$OUT"
