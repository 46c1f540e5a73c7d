# vmon build and test entry points. `make test` is the README's test command and what CI runs.
GO ?= go
BIN := bin
PREFIX ?= /usr/local
export CGO_ENABLED := 0
# What `vmon version` prints: the git description of the tree built (dev outside a git checkout).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

.PHONY: build install image image-check test test-go test-e2e lint proto clean FORCE

build:
	$(GO) build -trimpath -ldflags='-X main.version=$(VERSION)' -o $(BIN)/vmon ./cmd/vmon
	$(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/envd ./cmd/envd
	$(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/vmon-code-interpreter ./cmd/vmon-code-interpreter

install: build
	install -m 0755 $(BIN)/vmon $(PREFIX)/bin/vmon
	install -m 0755 $(BIN)/envd $(PREFIX)/bin/envd
	install -m 0755 $(BIN)/vmon-code-interpreter $(PREFIX)/bin/vmon-code-interpreter

# vmon's container image, assembled without a container engine (cmd/vmon-image): an OCI image
# layout at bin/image, its digest in bin/image.digest. Needs root, mmdebstrap and runsc; the
# Debian root is cached in IMAGE_CACHE. SOURCE_DATE_EPOCH is the commit's time, so the same tree
# gives the same digest.
IMAGE_CACHE ?= /var/cache/vmon-image
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
image: build
	$(GO) build -trimpath -o $(BIN)/vmon-image ./cmd/vmon-image
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(BIN)/vmon-image --bin $(BIN) --out $(BIN)/image --cache-dir $(IMAGE_CACHE)

# Reproducibility: a second `make image` must give the digest of the first.
image-check: image
	cp $(BIN)/image.digest $(BIN)/image.digest.first
	$(MAKE) image
	@if cmp -s $(BIN)/image.digest.first $(BIN)/image.digest; then \
		echo "image-check: two builds, one digest: $$(cat $(BIN)/image.digest)"; \
	else \
		echo "image-check: the image is not reproducible: $$(cat $(BIN)/image.digest.first) then $$(cat $(BIN)/image.digest)" >&2; exit 1; \
	fi

lint:
	test -z "$$(gofmt -l $$(git ls-files '*.go'))"
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	cd deploy/helm && $(GO) vet ./... && $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	cd runsc && $(GO) vet ./... && $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

# Go unit and kernel/runtime integration tests (root: namespaces, overlayfs, runsc).
# internal/artifacts goes last: its S3 tests need SeaweedFS's weed (scripts/weed.sh), which CI
# builds in the background meanwhile. The Helm chart's test is a module of its own (deploy/helm:
# Helm's dependencies stay out of vmon's); it checks the chart against the vmon just built. So is
# runsc/ (vmon's build of gVisor's runsc; gVisor's dependencies stay out of vmon's), tested with
# install-runsc.sh's -trimpath so the test reuses that build's compiled gVisor.
test-go: build
	$(GO) test -count=1 -p 1 -timeout 20m $$($(GO) list ./... | grep -v '/internal/artifacts$$') ./internal/artifacts
	cd deploy/helm && VMON_BIN=$(CURDIR)/$(BIN)/vmon $(GO) test -count=1 -timeout 10m ./...
	cd runsc && $(GO) test -trimpath -count=1 ./...

# The fixture OCI registry the template tests pull from (loopback only).
$(BIN)/vmon-test-registry: FORCE
	$(GO) build -trimpath -o $@ ./test/registry

# The PostgreSQL server the cluster tests run their drivers on (Debian's binaries, a temp dir).
$(BIN)/vmon-test-pg: FORCE
	$(GO) build -trimpath -o $@ ./test/pgserver

# The official e2b SDK against a real `vmon serve` (needs the base template; see scripts/test.sh).
# tests/image.test.js runs the container image image-check built.
test-e2e: build $(BIN)/vmon-test-registry $(BIN)/vmon-test-pg image-check
	bash scripts/test-e2e.sh

test: lint test-go test-e2e

proto:
	bash proto/generate.sh

clean:
	rm -rf $(BIN)
