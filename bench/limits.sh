#!/usr/bin/env bash
# What the sandbox limits cost (issue 10, "Benchmark"): SDK create latency with the per-sandbox
# disk limit in place (--sandbox-disk-mb 10240) and without it (0), measured in the same run by
# alternating servers round by round, plus the memory and host disk of idle sandboxes each way.
#
#   sudo bash bench/limits.sh
#
# Environment knobs (defaults in brackets):
#   VMON_BENCH_DATA_DIR [/var/lib/vmon-bench]  VMON_BENCH_TEMPLATE_SRC [/var/lib/vmon/templates/base]
#   VMON_BENCH_OUT [/tmp/vmon-bench-limits-<time>]  VMON_BIN [<repo>/bin/vmon]  RUNSC [/usr/local/bin/runsc]
#   BENCH_ROUNDS [3] BENCH_CREATES [10] (per round and mode) BENCH_MEM_SANDBOXES [5]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

. "$repo/bench/lib.sh"
require_root
isolate_netns vmonbench-iso VMON_BENCH_IN_NETNS "$@"

DATA=${VMON_BENCH_DATA_DIR:-/var/lib/vmon-bench}
TEMPLATE_SRC=${VMON_BENCH_TEMPLATE_SRC:-/var/lib/vmon/templates/base}
OUT=${VMON_BENCH_OUT:-/tmp/vmon-bench-limits-$(date +%Y%m%dT%H%M%S)}
RUNSC=${RUNSC:-/usr/local/bin/runsc}
ROUNDS=${BENCH_ROUNDS:-3}
N_CREATES=${BENCH_CREATES:-10}
N_MEM=${BENCH_MEM_SANDBOXES:-5}
mkdir -p "$OUT"

ensure_sdk
snapshot_binaries
trap on_exit EXIT
trap 'exit 130' INT TERM
prepare_data_dir
write_meta "  \"rounds\": $ROUNDS, \"createsPerRound\": $N_CREATES, \"memSandboxes\": $N_MEM"

for round in $(seq 1 "$ROUNDS"); do
  for disk in 10240 0; do
    log "round $round, --sandbox-disk-mb $disk"
    start_vmon "$OUT/vmon-r$round-disk$disk.log" --warm-pool 0 --sandbox-disk-mb "$disk"
    node bench/sdk.mjs create --n "$N_CREATES" --label "disk$disk" --out "$OUT/create-r$round-disk$disk.json"
    if [ "$round" = 1 ]; then
      node bench/sdk.mjs memory --n "$N_MEM" --settle-ms 5000 --data-dir "$DATA" --out "$OUT/memory-disk$disk.json"
    fi
    stop_vmon
  done
done

node bench/limits-report.mjs "$OUT"
