#!/usr/bin/env bash
# vmon networking benchmark (issue 5, "Benchmark"): prints a figures table and writes a JSON
# summary.
#
#   sudo bash bench/net.sh
#
# All in a loopback-only network namespace (sandboxes get NATed links; nothing may reach the
# machine's real network), all sequential:
#   1. Sandbox.create() → first commands.run('true') with the ready link pool (the default: one
#      pre-created link per --boot-concurrency slot) and without it (`--net-ready-links 0`: each
#      create builds its veth, namespace and rules on the request path). Both servers run with
#      `--warm-pool 0`, so every create is a cold boot and only the link differs. The two servers
#      take turns (BENCH_NET_ROUNDS rounds of BENCH_NET_CREATES creates each) so drift in the
#      machine's load hits both alike.
#   2. Attach and live-update latency with 1, 100 and 500 attached links in one namespace
#      (internal/firewall BenchmarkAttachUpdate).
#   3. TCP throughput guest → fake internet through the policy path vs an unfiltered veth in the
#      same run (internal/firewall BenchmarkThroughput), BENCH_NET_TPUT_COUNT runs.
# Phases 2 and 3 are `go test -bench` runs in their own throwaway namespaces (they need the Go
# toolchain). Figures only: nothing here fails on a time.
#
# Environment knobs (defaults in brackets):
#   VMON_BENCH_NET_DATA_DIR [/var/lib/vmon-bench-net]    data dir (the base template is hard-linked in)
#   VMON_BENCH_TEMPLATE_SRC [/var/lib/vmon/templates/base]  where to hard-link base from
#   VMON_BENCH_NET_OUT [/tmp/vmon-bench-net-<time>]      JSON files, go test output and vmon logs
#   VMON_BENCH_NET_SUMMARY [/tmp/vmon-bench-net-summary.json]
#   VMON_BIN [<repo>/bin/vmon], RUNSC [/usr/local/bin/runsc], GO [go]
#   BENCH_NET_CREATES [10] BENCH_NET_ROUNDS [2] BENCH_NET_ATTACH_N [50] BENCH_NET_TPUT_COUNT [5]
#   BENCH_NET_PHASES [create,attach,throughput]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

. "$repo/bench/lib.sh"
require_root
isolate_netns vmonbenchnet-iso VMON_BENCH_NET_IN_NETNS "$@"

DATA=${VMON_BENCH_NET_DATA_DIR:-/var/lib/vmon-bench-net}
TEMPLATE_SRC=${VMON_BENCH_TEMPLATE_SRC:-/var/lib/vmon/templates/base}
OUT=${VMON_BENCH_NET_OUT:-/tmp/vmon-bench-net-$(date +%Y%m%dT%H%M%S)}
SUMMARY=${VMON_BENCH_NET_SUMMARY:-/tmp/vmon-bench-net-summary.json}
RUNSC=${RUNSC:-/usr/local/bin/runsc}
GO=${GO:-go}
N_CREATES=${BENCH_NET_CREATES:-10}
ROUNDS=${BENCH_NET_ROUNDS:-2}
ATTACH_N=${BENCH_NET_ATTACH_N:-50}
TPUT_COUNT=${BENCH_NET_TPUT_COUNT:-5}
PHASES=${BENCH_NET_PHASES:-create,attach,throughput}
mkdir -p "$OUT"

ensure_sdk
snapshot_binaries

failed=()
trap on_exit EXIT
trap 'exit 130' INT TERM

prepare_data_dir
write_meta "$(cat <<EOF
  "warmPool": 0,
  "creates": $N_CREATES,
  "rounds": $ROUNDS,
  "attachIterations": $ATTACH_N,
  "throughputCount": $TPUT_COUNT,
  "phases": "$PHASES"
EOF
)"

want() { [[ ",$PHASES," == *",$1,"* ]]; }

# --- 1. create latency with and without the ready link pool ---------------------------------
create_round() { # $1 = label, $2 = round, rest = extra serve flags
  local label=$1 round=$2
  shift 2
  if ! start_vmon "$OUT/vmon-$label-$round.log" --warm-pool 0 "$@"; then
    failed+=("vmon-serve-$label")
    return
  fi
  node bench/sdk.mjs create --n "$N_CREATES" --label "$label" --out "$OUT/create-$label-$round.json" ||
    failed+=("create-$label-$round")
  if [ -n "$VMON_PID" ] && ! kill -0 "$VMON_PID" 2>/dev/null; then
    log "vmon serve died during create-$label-$round; log: $OUT/vmon-$label-$round.log"
    VMON_PID=
    failed+=("vmon-died-$label-$round")
  fi
  stop_vmon
}
if want create; then
  for round in $(seq 1 "$ROUNDS"); do
    create_round pool "$round"
    create_round nopool "$round" --net-ready-links 0
  done
fi
umount_null_netns "$DATA/runsc"

# --- 2 and 3. go test benchmarks ---------------------------------------------------------
if want attach; then
  log "attach/update latency: go test ./internal/firewall -bench AttachUpdate -benchtime ${ATTACH_N}x"
  "$GO" test ./internal/firewall -run '^$' -bench AttachUpdate -benchtime "${ATTACH_N}x" -count 1 \
    >"$OUT/attach.txt" 2>&1 || failed+=(attach)
fi
if want throughput; then
  log "throughput: go test ./internal/firewall -bench Throughput -benchtime 4x -count $TPUT_COUNT"
  "$GO" test ./internal/firewall -run '^$' -bench Throughput -benchtime 4x -count "$TPUT_COUNT" \
    >"$OUT/throughput.txt" 2>&1 || failed+=(throughput)
fi

node bench/net-report.mjs --dir "$OUT" --summary "$SUMMARY" --failed "${failed[*]:-}" || [ "${#failed[@]}" -gt 0 ] || failed+=(report)
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed: ${failed[*]}" >&2
  exit 1
fi
