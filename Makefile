# vmon build and test entry points. `make test` is the README's test command and what CI runs.
GO ?= go
BIN := bin
PREFIX ?= /usr/local
export CGO_ENABLED := 0

.PHONY: build install test test-go test-e2e lint proto clean FORCE

build:
	$(GO) build -trimpath -o $(BIN)/vmon ./cmd/vmon
	$(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/envd ./cmd/envd
	$(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/vmon-code-interpreter ./cmd/vmon-code-interpreter

install: build
	install -m 0755 $(BIN)/vmon $(PREFIX)/bin/vmon
	install -m 0755 $(BIN)/envd $(PREFIX)/bin/envd
	install -m 0755 $(BIN)/vmon-code-interpreter $(PREFIX)/bin/vmon-code-interpreter

lint:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))"
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	cd deploy/helm && $(GO) vet ./... && $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

# Go unit and kernel/runtime integration tests (root: namespaces, overlayfs, runsc).
# internal/artifacts goes last: its S3 tests need SeaweedFS's weed (scripts/weed.sh), which CI
# builds in the background meanwhile. The Helm chart's test is a module of its own (deploy/helm:
# Helm's dependencies stay out of vmon's); it checks the chart against the vmon just built.
test-go: build
	$(GO) test -count=1 -p 1 -timeout 20m $$($(GO) list ./... | grep -v '/internal/artifacts$$') ./internal/artifacts
	cd deploy/helm && VMON_BIN=$(CURDIR)/$(BIN)/vmon $(GO) test -count=1 -timeout 10m ./...

# The fixture OCI registry the template tests pull from (loopback only).
$(BIN)/vmon-test-registry: FORCE
	$(GO) build -trimpath -o $@ ./test/registry

# The official e2b SDK against a real `vmon serve` (needs the base template; see scripts/test.sh).
test-e2e: build $(BIN)/vmon-test-registry
	bash scripts/test-e2e.sh

test: lint test-go test-e2e

proto:
	bash proto/generate.sh

clean:
	rm -rf $(BIN)
