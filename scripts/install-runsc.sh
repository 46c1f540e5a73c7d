#!/bin/sh
# Installs gVisor's runsc as vmon builds it: the gVisor version pinned in runsc/go.mod, from the Go
# module proxy, with runsc/main.go's one addition (an idle sentry or gofer hands its unused heap
# back to the host). A static binary.
#
# Static (CGO_ENABLED=0) matters: a dynamically linked runsc dies after pivot_root ("error executing
# umounter: fork/exec /proc/self/exe"). Debian's runsc package (2022) is too old for
# --network=sandbox on current kernels. Idempotent: the build depends on runsc/ alone (-trimpath;
# -buildvcs=false, no commit stamp), and the installed binary is replaced only when the new one
# differs. Needs Go (the version in go.mod) and the module proxy; the first build takes a few
# minutes, later ones seconds (Go's build cache).
set -eu
cd "$(dirname "$0")/../runsc"

BIN_DIR="${BIN_DIR:-/usr/local/bin}"
RUNSC="$BIN_DIR/runsc"

if ! command -v go >/dev/null 2>&1; then
	echo "install-runsc: go is required (see go.mod for the version)" >&2
	exit 1
fi

pin=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)
tmp=$(mktemp "$BIN_DIR/.runsc.XXXXXX")
trap 'rm -f "$tmp"' EXIT
echo "building runsc (gVisor $pin, static)"
CGO_ENABLED=0 go build -trimpath -buildvcs=false -o "$tmp" .

if file "$tmp" 2>/dev/null | grep -q 'dynamically linked'; then
	echo "install-runsc: the runsc built is dynamically linked; it must be built with CGO_ENABLED=0" >&2
	exit 1
fi
if cmp -s "$tmp" "$RUNSC"; then
	echo "runsc (gVisor $pin) already installed at $RUNSC"
	exit 0
fi
chmod 0755 "$tmp"
# A rename, so a sandbox starting meanwhile runs either the old binary or the new, never half of one.
mv -f "$tmp" "$RUNSC"
echo "installed runsc (gVisor $pin) at $RUNSC"
"$RUNSC" --version
