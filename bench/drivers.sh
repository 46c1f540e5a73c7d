#!/usr/bin/env bash
# Several drivers on PostgreSQL vs one driver on SQLite (issue 21): create p50/p95 through one
# driver on SQLite, one on PostgreSQL and two on PostgreSQL, as ratios in one run, and the
# database's share of a create (statements and time per create). See bench/drivers.mjs.
#
#   sudo bash bench/drivers.sh
#
# Runs in a network namespace of its own (vmbench-drv); the clusters it starts (lib/cluster.js of
# the end-to-end tests) put each node in a namespace of its own on a bridge inside it, so nothing
# reaches the machine's network. PostgreSQL is Debian's, started in a temporary directory on a
# Unix socket and removed afterwards.
#
# Environment: VMON_BIN [bin/vmon], VMON_TEST_DATA_DIR [/var/lib/vmon-test] (a data dir with the
# base template built), BENCH_DRV_CREATES [30], BENCH_DRV_CREATORS [4], BENCH_DRV_BURST [24],
# VMON_BENCH_DRV_OUT [a temporary directory].
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
. "$repo/bench/lib.sh"
require_root
isolate_netns vmbench-drv VMON_BENCH_DRV_IN_NETNS "$@"
ip link set lo up
export VMON_TEST_DATA_DIR=${VMON_TEST_DATA_DIR:-/var/lib/vmon-test}
export VMON_BIN=${VMON_BIN:-$repo/bin/vmon}
[ -x "$repo/bin/vmon-test-pg" ] || make -s bin/vmon-test-pg
node bench/drivers.mjs
