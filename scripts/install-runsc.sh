#!/bin/sh
# Installs gVisor's runsc as vmon builds it: the gVisor version pinned in runsc/go.mod, from the Go
# module proxy, with runsc/main.go's one addition (an idle sentry or gofer hands its unused heap
# back to the host) and the patches in runsc/patches (each says what it changes and why). A static
# binary.
#
# The patches are applied to a copy of the pinned module in a build directory of its own, which a
# `replace` in a build-time copy of go.mod points the build at: the module cache stays pristine,
# and the build directory's path is fixed so Go's build cache still serves the unchanged packages.
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
go mod download gvisor.dev/gvisor
src=$(go list -m -f '{{.Dir}}' gvisor.dev/gvisor)
if [ -z "$src" ] || [ ! -d "$src" ]; then
	echo "install-runsc: gvisor.dev/gvisor $pin is not in the module cache" >&2
	exit 1
fi
build="${RUNSC_BUILD_DIR:-/var/cache/vmon-runsc}"
mkdir -p "$build"
rm -rf "$build/gvisor"
cp -R "$src" "$build/gvisor"
chmod -R u+w "$build/gvisor"
for p in patches/*.patch; do
	[ -e "$p" ] || continue
	if ! patch -d "$build/gvisor" -p1 --forward --quiet <"$p"; then
		echo "install-runsc: $p does not apply to gVisor $pin" >&2
		exit 1
	fi
done
cp go.mod "$build/go.mod"
cp go.sum "$build/go.sum"
echo "replace gvisor.dev/gvisor => $build/gvisor" >>"$build/go.mod"

tmp=$(mktemp "$BIN_DIR/.runsc.XXXXXX")
trap 'rm -f "$tmp"' EXIT
echo "building runsc (gVisor $pin, static, patched: $(ls patches/*.patch 2>/dev/null | xargs -n1 basename | tr '\n' ' '))"
CGO_ENABLED=0 go build -modfile="$build/go.mod" -trimpath -buildvcs=false -o "$tmp" .

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
