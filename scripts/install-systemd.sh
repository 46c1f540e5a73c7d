#!/usr/bin/env bash
# Installs vmon's systemd units (vmon.service: one machine; vmon-driver.service and
# vmon-node.service: a cluster) and their environment files, which it never overwrites: they hold
# the operator's settings (join tokens, keys: mode 0600). `scripts/install.sh --systemd` runs it
# after installing vmon. --root DIR installs under DIR instead of / (tests, images).
# Nothing is enabled or started: `systemctl enable --now vmon` does that.
set -euo pipefail
cd "$(dirname "$0")/.."
root=
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root="${2:?--root needs a directory}"; shift 2 ;;
    *) echo "install-systemd.sh: unknown option $1 (use --root DIR)" >&2; exit 2 ;;
  esac
done
units="$root/etc/systemd/system"
envdir="$root/etc/vmon"
install -d -m 0755 "$units"
install -d -m 0755 "$envdir"
for name in vmon vmon-driver vmon-node; do
  install -m 0644 "deploy/systemd/$name.service" "$units/$name.service"
  if [ ! -e "$envdir/$name.env" ]; then
    install -m 0600 "deploy/systemd/$name.env" "$envdir/$name.env"
  fi
done
if [ -z "$root" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
echo "install-systemd.sh: units in $units, settings in $envdir; start one machine with: systemctl enable --now vmon"
