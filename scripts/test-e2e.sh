#!/usr/bin/env bash
# Runs the end-to-end suite: the official e2b npm SDK (pinned in test/e2e/package-lock.json)
# against real `vmon serve` processes on a test data dir holding the base template.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
export VMON_BIN="${VMON_BIN:-$repo/bin/vmon}"
export VMON_TEST_DATA_DIR="${VMON_TEST_DATA_DIR:-/var/lib/vmon-test}"
mkdir -p "$VMON_TEST_DATA_DIR"

# Reuse templates already built for the default data dir: they are read-only lower layers, so
# hard links are safe and save a rebuild. The code-interpreter tests need its rootfs (the servers
# under test make code-interpreter-v1 from it when they start); it is built here, outside the
# tests' network namespaces, from this machine's Debian sources.
for t in base code-interpreter-v1-rootfs; do
  if [ ! -e "$VMON_TEST_DATA_DIR/templates/$t/manifest.json" ] && [ -e "/var/lib/vmon/templates/$t/manifest.json" ]; then
    mkdir -p "$VMON_TEST_DATA_DIR/templates"
    rm -rf "${VMON_TEST_DATA_DIR:?}/templates/$t"
    cp -al "/var/lib/vmon/templates/$t" "$VMON_TEST_DATA_DIR/templates/$t"
  fi
done
"$VMON_BIN" template build base --data-dir "$VMON_TEST_DATA_DIR"
"$VMON_BIN" template build code-interpreter-v1 --rootfs-only --data-dir "$VMON_TEST_DATA_DIR"

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

# Networking stage (tests-net/): the SDK against `vmon serve --net tap` with real traffic.
# test/nettopo builds a "node" namespace whose only way out is a "fake internet" namespace holding
# responders on documentation and always-denied addresses; the runner and every server it starts
# run in the node namespace (nsenter, not `ip netns exec`, for the reason above) with a private
# /run/netns, so the sandbox namespaces (vmon-net-<N>) of these servers and of any other vmon on
# this host never see each other.
topo="${VMON_E2E_NET_TOPO:-vmone2e}"
netdir=$(mktemp -d)
nettopo_pid=
net_cleanup() {
  if [ -n "$nettopo_pid" ] && kill -0 "$nettopo_pid" 2>/dev/null; then
    kill -TERM "$nettopo_pid" 2>/dev/null || true
    wait "$nettopo_pid" 2>/dev/null || true
  fi
  if [ -x "$netdir/nettopo" ]; then "$netdir/nettopo" down --name "$topo" || true; fi
  rm -rf "$netdir"
  # An interrupted run leaves its sandboxes running (vmon keeps them for recovery): stop the runsc
  # processes of this data dir, which only this script's servers started.
  for pid in $(pgrep -f -- "--root=$(realpath -s "$VMON_TEST_DATA_DIR")/runsc " || true); do
    kill -KILL "$pid" 2>/dev/null || true
  done
  ip netns del "$iso" 2>/dev/null || true # the SDK stage's namespace (this trap replaces its own)
}
trap net_cleanup EXIT
(cd "$repo" && go build -o "$netdir/nettopo" ./test/nettopo)
"$netdir/nettopo" down --name "$topo" # leftovers of a crashed run
"$netdir/nettopo" up --name "$topo" >"$netdir/nettopo.log" 2>&1 &
nettopo_pid=$!
for _ in $(seq 1 300); do
  grep -q '^READY$' "$netdir/nettopo.log" && break
  if ! kill -0 "$nettopo_pid" 2>/dev/null; then break; fi
  sleep 0.1
done
if ! grep -q '^READY$' "$netdir/nettopo.log"; then
  echo "test-e2e: nettopo did not come up:" >&2
  cat "$netdir/nettopo.log" >&2
  exit 1
fi
# The node resolves names (the egress proxy dials allowOut domains by name) through the fake
# internet's DNS server, never the machine's: a private /etc/resolv.conf in the same mount
# namespace.
printf 'nameserver 203.0.113.53\noptions timeout:2 attempts:1\n' >"$netdir/resolv.conf"
# That private mount namespace is the servers' own (private /run/netns and resolv.conf), so they
# stay in it rather than pin one of their own (VMON_MOUNT_NAMESPACE_MODE=inherit).
VMON_MOUNT_NAMESPACE_MODE=inherit nsenter --net="/run/netns/$topo-node" unshare --mount --propagation private \
  sh -c 'mount -t tmpfs -o mode=0755 vmon-e2e-netns /run/netns &&
    mount --bind "$1" /etc/resolv.conf && exec npm run test:net' sh "$netdir/resolv.conf"
