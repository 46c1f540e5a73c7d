#!/usr/bin/env bash
# Regenerates the Go code for envd's Connect services into internal/envd/gen, and for the
# driver-node contract into internal/nodeapi/gen.
# The output is committed; CI does not run this. Needs protoc (apt: protobuf-compiler) plus the
# plugins pinned to the versions in go.mod:
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$(go env GOPATH)/bin:$PATH"
out=../internal/envd/gen
rm -rf "$out/process" "$out/filesystem"
mkdir -p "$out"
protoc -I . \
  --go_out="$out" --go_opt=module=github.com/vibemon/vmon/internal/envd/gen \
  --connect-go_out="$out" --connect-go_opt=module=github.com/vibemon/vmon/internal/envd/gen \
  process/process.proto filesystem/filesystem.proto
out=../internal/nodeapi/gen
rm -rf "$out/node"
mkdir -p "$out"
protoc -I . \
  --go_out="$out" --go_opt=module=github.com/vibemon/vmon/internal/nodeapi/gen \
  --connect-go_out="$out" --connect-go_opt=module=github.com/vibemon/vmon/internal/nodeapi/gen \
  node/node.proto
