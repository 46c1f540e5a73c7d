#!/usr/bin/env bash
# Installs vmon and everything it needs on a Debian 12 host: apt packages, the pinned gVisor
# runtime (built from the Go module proxy), and the vmon/envd binaries in /usr/local/bin.
# Idempotent; run as root. The base template is built by `vmon serve` on first start (or by
# `vmon template build base`). --systemd also installs the systemd units (scripts/install-systemd.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

systemd=false
for arg in "$@"; do
  case "$arg" in
    --systemd) systemd=true ;;
    *) echo "install.sh: unknown option $arg (use --systemd)" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (sudo bash scripts/install.sh)" >&2
  exit 1
fi
export PATH="/usr/local/go/bin:$PATH"
if ! command -v go >/dev/null; then
  echo "install.sh: Go 1.26 or newer is needed at /usr/local/go (Debian 12's golang is too old)" >&2
  exit 1
fi

bash scripts/install-deps.sh
bash scripts/install-runsc.sh
make build
make install PREFIX=/usr/local
if $systemd; then
  bash scripts/install-systemd.sh
fi
echo "install.sh: vmon $(vmon version 2>/dev/null || true) installed in /usr/local/bin"
