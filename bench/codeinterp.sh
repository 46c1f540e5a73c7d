#!/usr/bin/env bash
# The code interpreter (issue 13, "Benchmark"): @e2b/code-interpreter against one vmon serve, in
# each language (Python, JavaScript, TypeScript, R, bash, Java): Sandbox.create() → the first
# runCode result and runCode on a live sandbox; the first runCode of a sandbox created with
# BENCH_ENVS environment variables against one created without (what applying the sandbox's
# envs to a kernel costs); a matplotlib plot round trip; the idle memory of code-interpreter
# sandboxes.
#
#   sudo bash bench/codeinterp.sh
#
# Environment knobs (defaults in brackets):
#   VMON_BENCH_DATA_DIR [/var/lib/vmon-bench]  VMON_BENCH_TEMPLATE_SRC [/var/lib/vmon/templates/base]
#   VMON_BENCH_OUT [/tmp/vmon-bench-codeinterp-<time>]  VMON_BIN [<repo>/bin/vmon]  RUNSC [/usr/local/bin/runsc]
#   BENCH_CREATES [10, per language and with/without envs] BENCH_RUNS [50, per language]
#   BENCH_PLOTS [15] BENCH_MEM_SANDBOXES [3] BENCH_ENVS [20]
#   BENCH_LANGS [python,javascript,typescript,r,bash,java]
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

. "$repo/bench/lib.sh"
require_root

DATA=${VMON_BENCH_DATA_DIR:-/var/lib/vmon-bench}
TEMPLATE_SRC=${VMON_BENCH_TEMPLATE_SRC:-/var/lib/vmon/templates/base}
CI_SRC="$(dirname "$TEMPLATE_SRC")/code-interpreter-v1-rootfs"
# The rootfs comes from Debian's mirrors: built (or found) before the run moves into its
# loopback-only namespace.
if [ -z "${VMON_BENCH_IN_NETNS:-}" ]; then
  mkdir -p "$DATA/templates"
  if [ ! -e "$DATA/templates/code-interpreter-v1-rootfs/manifest.json" ]; then
    if [ -e "$CI_SRC/manifest.json" ]; then
      cp -al "$CI_SRC" "$DATA/templates/code-interpreter-v1-rootfs"
    else
      "${VMON_BIN:-$repo/bin/vmon}" template build code-interpreter-v1 --rootfs-only --data-dir "$DATA"
    fi
  fi
fi
isolate_netns vmonbench-iso VMON_BENCH_IN_NETNS "$@"

OUT=${VMON_BENCH_OUT:-/tmp/vmon-bench-codeinterp-$(date +%Y%m%dT%H%M%S)}
RUNSC=${RUNSC:-/usr/local/bin/runsc}
N_CREATES=${BENCH_CREATES:-10}
N_RUNS=${BENCH_RUNS:-50}
N_PLOTS=${BENCH_PLOTS:-15}
N_MEM=${BENCH_MEM_SANDBOXES:-3}
N_ENVS=${BENCH_ENVS:-20}
LANGS=${BENCH_LANGS:-python,javascript,typescript,r,bash,java}
mkdir -p "$OUT"

ensure_sdk
snapshot_binaries
trap on_exit EXIT
trap 'exit 130' INT TERM
prepare_data_dir
write_meta "  \"creates\": $N_CREATES, \"runs\": $N_RUNS, \"plots\": $N_PLOTS, \"memSandboxes\": $N_MEM, \"envs\": $N_ENVS, \"langs\": \"$LANGS\""

start_vmon "$OUT/vmon.log" --warm-pool 0
node bench/codeinterp.mjs --creates "$N_CREATES" --runs "$N_RUNS" --plots "$N_PLOTS" --mem "$N_MEM" --envs "$N_ENVS" \
  --langs "$LANGS" --out "$OUT/codeinterp.json"
stop_vmon
node bench/codeinterp.mjs report "$OUT"
