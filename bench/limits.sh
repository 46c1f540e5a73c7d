#!/usr/bin/env bash
# What the sandbox limits cost and what they protect: SDK create latency with the per-sandbox
# disk limit in place (--sandbox-disk-mb 10240) and without it (0), measured in the same run by
# alternating servers round by round, plus the memory and host disk of idle sandboxes each way;
# then a neighbour's commands.run latency while another sandbox runs an unprivileged fork bomb and
# while another runs a CPU burner, as a ratio to the neighbour alone, and how long root in the
# bombed sandbox needs to run a command once the bomb's timeout ended.
#
#   sudo bash bench/limits.sh
#
# Environment knobs (defaults in brackets):
#   VMON_BENCH_DATA_DIR [/var/lib/vmon-bench]  VMON_BENCH_TEMPLATE_SRC [/var/lib/vmon/templates/base]
#   VMON_BENCH_OUT [/tmp/vmon-bench-limits-<time>]  VMON_BIN [<repo>/bin/vmon]  RUNSC [/usr/local/bin/runsc]
#   BENCH_ROUNDS [3] BENCH_CREATES [10] (per round and mode) BENCH_MEM_SANDBOXES [5]
#   BENCH_NEIGHBOUR_RUNS [30] BENCH_AGGRESSOR_S [40]
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
N_NEIGHBOUR=${BENCH_NEIGHBOUR_RUNS:-30}
AGGRESSOR_S=${BENCH_AGGRESSOR_S:-40}
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

log "neighbour under a fork bomb and a CPU burner"
start_vmon "$OUT/vmon-neighbour.log" --warm-pool 0
node bench/sdk.mjs neighbour --n "$N_NEIGHBOUR" --aggressor-s "$AGGRESSOR_S" --out "$OUT/neighbour.json"
stop_vmon

node bench/limits-report.mjs "$OUT"
