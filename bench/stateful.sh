#!/usr/bin/env bash
# Stateful sandboxes (issue 11, "Benchmark"): pause/resume through the SDK against raw runsc
# checkpoint/restore of the same rootfs, idle and with 256 MiB of touched memory, alternating
# iteration by iteration in one run; disk per paused sandbox; fork of 1 and of 10.
#
#   sudo bash bench/stateful.sh
#
# Environment knobs (defaults in brackets):
#   VMON_BENCH_DATA_DIR [/var/lib/vmon-bench]  VMON_BENCH_TEMPLATE_SRC [/var/lib/vmon/templates/base]
#   VMON_BENCH_OUT [/tmp/vmon-bench-stateful-<time>]  VMON_BIN [<repo>/bin/vmon]  RUNSC [/usr/local/bin/runsc]
#   BENCH_PAIRS [15] (per shape)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

. "$repo/bench/lib.sh"
require_root
isolate_netns vmonbench-iso VMON_BENCH_IN_NETNS "$@"

DATA=${VMON_BENCH_DATA_DIR:-/var/lib/vmon-bench}
TEMPLATE_SRC=${VMON_BENCH_TEMPLATE_SRC:-/var/lib/vmon/templates/base}
OUT=${VMON_BENCH_OUT:-/tmp/vmon-bench-stateful-$(date +%Y%m%dT%H%M%S)}
RUNSC=${RUNSC:-/usr/local/bin/runsc}
PAIRS=${BENCH_PAIRS:-15}
mkdir -p "$OUT"

ensure_sdk
snapshot_binaries
trap on_exit EXIT
trap 'exit 130' INT TERM
prepare_data_dir
write_meta "  \"pairs\": $PAIRS"

# The same start-command template before issue 11 (start command per create) and after (restored).
start_vmon "$OUT/vmon-build-per-create.log" --warm-pool 0 --template-start-snapshots=false
node bench/stateful.mjs build --name bench-start-per-create --variant per-create
stop_vmon
start_vmon "$OUT/vmon.log" --warm-pool 0
node bench/stateful.mjs build --name bench-start-snapshot --variant snapshot
# vmon's own OCI config for a sandbox, so the raw side runs the same shape.
node bench/sdk.mjs create --n 1 --label config --out "$OUT/config-create.json" \
  --capture-config "$OUT/vmon-config.json" --data-dir "$DATA"
node bench/stateful.mjs --n "$PAIRS" --out "$OUT/stateful.json" --data-dir "$DATA" \
  --template-config "$OUT/vmon-config.json" --runsc "$RUNSC"
node bench/stateful.mjs templates --n "$PAIRS" --snap bench-start-snapshot --cold bench-start-per-create \
  --out "$OUT/templates.json" --template-config "$OUT/vmon-config.json"
stop_vmon

node bench/stateful-report.mjs "$OUT"
