#!/usr/bin/env bash
# Runs the end-to-end suite: the official e2b npm SDK (pinned in test/e2e/package-lock.json)
# against real `vmon serve` processes on a test data dir holding the base template.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
export VMON_BIN="${VMON_BIN:-$repo/bin/vmon}"
export VMON_TEST_DATA_DIR="${VMON_TEST_DATA_DIR:-/var/lib/vmon-test}"
mkdir -p "$VMON_TEST_DATA_DIR"

# Reuse a base template already built for the default data dir: templates are read-only lower
# layers, so hard links are safe and save a rebuild.
if [ ! -e "$VMON_TEST_DATA_DIR/templates/base/manifest.json" ] && [ -e /var/lib/vmon/templates/base/manifest.json ]; then
  mkdir -p "$VMON_TEST_DATA_DIR/templates"
  cp -al /var/lib/vmon/templates/base "$VMON_TEST_DATA_DIR/templates/base"
fi
"$VMON_BIN" template build base --data-dir "$VMON_TEST_DATA_DIR"

# node:test with --test-concurrency/--test-timeout needs Node.js 20.11 or newer.
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$node_major" -lt 20 ]; then
  echo "test-e2e: Node.js >= 20 is required for the SDK tests (found: $(node --version 2>/dev/null || echo none))" >&2
  exit 1
fi

cd test/e2e
npm ci --no-audit --no-fund

# The SDK suite runs in a network namespace with loopback only: sandboxes get real uplinks and
# NAT, and a node under test must never reach the machine's real network. nsenter switches the
# network namespace only (`ip netns exec` would remount /sys and hide the cgroup hierarchy runsc
# needs).
iso=vmone2e-iso
ip netns del "$iso" 2>/dev/null || true
ip netns add "$iso"
trap 'ip netns del "$iso" 2>/dev/null || true' EXIT
ip -n "$iso" link set lo up
nsenter --net="/run/netns/$iso" npm test
