#!/bin/sh
# Installs the pinned gVisor runsc as a static binary built from the Go module proxy.
#
# Static (CGO_ENABLED=0) matters: a dynamically linked runsc dies after pivot_root ("error executing
# umounter: fork/exec /proc/self/exe"). Debian's runsc package (2022) is too old for
# --network=sandbox on current kernels. Idempotent: does nothing if the pinned build is installed.
# Needs Go (the version in go.mod) and network access to the module proxy; takes ~2.5 min.
set -eu

GVISOR_VERSION="${GVISOR_VERSION:-v0.0.0-20260905035102-160fafc42237}"
BIN_DIR="${BIN_DIR:-/usr/local/bin}"
RUNSC="$BIN_DIR/runsc"

# runsc built from the module proxy reports "VERSION_MISSING"; the module version embedded in the
# binary's build info is the reliable pin.
installed_version() {
	[ -x "$RUNSC" ] || return 0
	go version -m "$RUNSC" 2>/dev/null | awk '$1 == "mod" && $2 == "gvisor.dev/gvisor" { print $3 }'
}

if [ "$(installed_version)" = "$GVISOR_VERSION" ]; then
	echo "runsc $GVISOR_VERSION already installed at $RUNSC"
	exit 0
fi

if ! command -v go >/dev/null 2>&1; then
	echo "install-runsc: go is required (see go.mod for the version)" >&2
	exit 1
fi

echo "installing runsc $GVISOR_VERSION to $RUNSC (static build, takes a few minutes)"
CGO_ENABLED=0 GOBIN="$BIN_DIR" go install "gvisor.dev/gvisor/runsc@$GVISOR_VERSION"

if [ "$(installed_version)" != "$GVISOR_VERSION" ]; then
	echo "install-runsc: $RUNSC does not report $GVISOR_VERSION after install" >&2
	exit 1
fi
if file "$RUNSC" 2>/dev/null | grep -q 'dynamically linked'; then
	echo "install-runsc: $RUNSC is dynamically linked; it must be built with CGO_ENABLED=0" >&2
	exit 1
fi
"$RUNSC" --version
