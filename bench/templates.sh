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

. "$repo/bench/lib.sh"
require_root
isolate_netns vmonbenchtpl-iso VMON_BENCH_TPL_IN_NETNS "$@"

DATA=${VMON_BENCH_TPL_DATA_DIR:-/var/lib/vmon-bench-templates}
TEMPLATE_SRC=${VMON_BENCH_TEMPLATE_SRC:-/var/lib/vmon/templates/base}
OUT=${VMON_BENCH_TPL_OUT:-/tmp/vmon-bench-templates-$(date +%Y%m%dT%H%M%S)}
SUMMARY=${VMON_BENCH_TPL_SUMMARY:-/tmp/vmon-bench-templates-summary.json}
RUNSC=${RUNSC:-/usr/local/bin/runsc}
N_BUILDS=${BENCH_TPL_BUILDS:-5}
N_CREATES=${BENCH_TPL_CREATES:-20}
SKIP_CACHE=${BENCH_TPL_SKIP_CACHE:-yes}
mkdir -p "$OUT"

ensure_sdk
snapshot_binaries

failed=()

trap on_exit EXIT
trap 'exit 130' INT TERM

# --- preparation -------------------------------------------------------------------------
prepare_data_dir

write_meta "$(cat <<EOF
  "warmPool": 0,
  "builds": $N_BUILDS,
  "creates": $N_CREATES
EOF
)"

# --- the run -----------------------------------------------------------------------------
if start_vmon "$OUT/vmon.log" --warm-pool 0; then
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
