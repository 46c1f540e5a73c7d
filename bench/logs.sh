#!/usr/bin/env bash
# Sandbox logs (issue 25, "Benchmark"): what logging costs on the hot path, and how fast a long
# log is queried.
#   1. commands.run('true') on one live sandbox with sandbox logs on (every command adds envd's
#      start and exit entries to the log) and off (vmon serve --sandbox-logs=false), in alternating
#      rounds so drift of this shared machine hits both alike; p50/p95 of each and the p50 ratio.
#   2. Log queries on a sandbox log of 100,000 entries (go test -bench in internal/sandboxlog):
#      one page of 1000 forward and backward, a level filter and a search over the whole log.
#
#   sudo bash bench/logs.sh
#
# Environment knobs (defaults in brackets):
#   VMON_BENCH_DATA_DIR [/var/lib/vmon-bench]  VMON_BENCH_TEMPLATE_SRC [/var/lib/vmon/templates/base]
#   VMON_BENCH_OUT [/tmp/vmon-bench-logs-<time>]  VMON_BIN [<repo>/bin/vmon]  RUNSC [/usr/local/bin/runsc]
#   BENCH_ROUNDS [3, per setting]  BENCH_RUNS [200, commands per round]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

. "$repo/bench/lib.sh"
require_root
isolate_netns vmonbench-logs VMON_BENCH_IN_NETNS "$@"

DATA=${VMON_BENCH_DATA_DIR:-/var/lib/vmon-bench}
TEMPLATE_SRC=${VMON_BENCH_TEMPLATE_SRC:-/var/lib/vmon/templates/base}
OUT=${VMON_BENCH_OUT:-/tmp/vmon-bench-logs-$(date +%Y%m%dT%H%M%S)}
RUNSC=${RUNSC:-/usr/local/bin/runsc}
ROUNDS=${BENCH_ROUNDS:-3}
RUNS=${BENCH_RUNS:-200}
mkdir -p "$OUT"

ensure_sdk
snapshot_binaries
trap on_exit EXIT
trap 'exit 130' INT TERM
prepare_data_dir
write_meta "  \"rounds\": $ROUNDS, \"runs\": $RUNS"

for r in $(seq 1 "$ROUNDS"); do
  for setting in on off; do
    flag=true
    [ "$setting" = on ] || flag=false
    start_vmon "$OUT/vmon-$setting-$r.log" --warm-pool 0 --sandbox-logs="$flag"
    node bench/sdk.mjs exec --n "$RUNS" --out "$OUT/exec-$setting-$r.json"
    stop_vmon
  done
done

log "log queries over 100,000 entries (go test -bench)"
(cd "$repo" && go test -run '^$' -bench 'BenchmarkQuery100k' -benchtime 20x ./internal/sandboxlog) | tee "$OUT/query.txt"

node bench/logs-report.mjs "$OUT"
