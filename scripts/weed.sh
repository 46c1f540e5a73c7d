#!/bin/sh
# Builds SeaweedFS's `weed` (a real S3-compatible server, for the artifact store's S3 tests) once
# per machine from the Go module proxy, caches it by version, and prints the binary's path.
#
# `go install weed@version` is refused because seaweedfs's go.mod has a replace directive, so the
# build goes through a throwaway module that requires it and repeats that replace. The first build
# takes about 10 minutes and 1-2 GB of module downloads; later runs print the cached path at once.
# Concurrent runs (CI's background build and a test) wait for each other on a lock.
#
#   weed.sh            print the binary's path, building it first if needed
#   weed.sh --cached   print it only if it is built (exit 3 if not); never builds or waits
#
#   WEED_CACHE   cache root (default /var/cache/vmon-ci); the binary is $WEED_CACHE/weed-<version>/weed
set -eu

WEED_VERSION="v0.0.0-20261109003541-7506e5f91cd6"
CACHE="${WEED_CACHE:-/var/cache/vmon-ci}"
DIR="$CACHE/weed-$WEED_VERSION"
BIN="$DIR/weed"

if [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi
if [ "${1:-}" = "--cached" ]; then
	echo "weed.sh: weed $WEED_VERSION is not built (run scripts/weed.sh)" >&2
	exit 3
fi
if ! command -v go >/dev/null 2>&1; then
	echo "weed.sh: go is required" >&2
	exit 1
fi
mkdir -p "$DIR"

# One build at a time: a second caller waits for the first and then finds the binary.
exec 9>"$DIR/.lock"
flock 9
if [ -x "$BIN" ]; then
	echo "$BIN"
	exit 0
fi

work=$(mktemp -d "$DIR/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "weed.sh: building weed $WEED_VERSION into $BIN (first time only, about 10 minutes)" >&2
(
	cd "$work"
	cat >go.mod <<MOD
module vmon.local/weedbuild

go 1.26

require github.com/seaweedfs/seaweedfs $WEED_VERSION

replace github.com/tyler-smith/go-bip39 => github.com/cosmos/go-bip39 v1.0.0
MOD
	cat >tools.go <<'SRC'
//go:build tools

package weedbuild

import _ "github.com/seaweedfs/seaweedfs/weed"
SRC
	GOFLAGS=-mod=mod go mod tidy >&2
	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$work/weed" github.com/seaweedfs/seaweedfs/weed >&2
)
"$work/weed" version >/dev/null
mv "$work/weed" "$BIN"
echo "$BIN"
