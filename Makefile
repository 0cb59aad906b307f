# Every target installs what it needs into bin/tools (ignored by git), so a
# fresh Debian machine with Go needs nothing else.
SHELL := /bin/bash
GO ?= go
TOOLS := $(CURDIR)/bin/tools
BUF_VERSION := v1.75.0
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
GOLANGCI_LINT_VERSION := v2.15.0
# promtool runs the alert rules' unit tests (helm/testdata) in make test.
PROMTOOL_VERSION := v0.316.0
# TEST_FLAGS lets CI and developers narrow or widen a run without editing here.
TEST_FLAGS ?= -race -count=1 -timeout 15m
# BENCH picks one area's benchmarks (mailbox, admin, xds, sidecar); empty runs all.
BENCH ?=

.PHONY: all build test bench proto lint dev clean tools image

all: build

# Static binaries (no cgo: only the bench module's SQLite baseline needs it), stamped with the
# git version so `prism --version` and `prismctl version` name the commit they were built from
# (each main passes its version to what it runs, admin/ctl included).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
BUILD_FLAGS := -trimpath -ldflags "-X main.version=$(VERSION)"

build:
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o bin/prism ./cmd/prism
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o bin/prismctl ./cmd/prismctl

# make image writes IMAGE_OUT (bin/prism-image.tar), an OCI image of prism
# for IMAGE_PLATFORMS made by tools/image with no Docker engine and no base
# image (the Dockerfile makes the same image with Docker). prismctl is a
# symbolic link to prism there, which is prismctl when run by that name: one
# binary instead of two holding nearly the same code (issue 14's 60 MB). docker load,
# podman load, crane push and kind load image-archive read it. It is named as
# the chart runs it by default (values.yaml's image.repository, Chart.yaml's
# appVersion) and by VERSION. prism is stripped (-s -w: panics still
# print stack traces), and every time in the image is the commit's, so two
# builds of a commit agree.
IMAGE_REPO ?= ghcr.io/prism-mesh/prism
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' helm/prism/Chart.yaml)
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
IMAGE_OUT ?= bin/prism-image.tar
IMAGE_REFS = $(IMAGE_REPO):$(IMAGE_TAG) $(filter-out $(IMAGE_REPO):$(IMAGE_TAG),$(IMAGE_REPO):$(VERSION))
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)

image:
	cd tools && $(GO) build -o $(TOOLS)/prism-image ./image
	@set -e; platforms=; for p in $(IMAGE_PLATFORMS); do \
	  os=$${p%%/*}; arch=$${p#*/}; arch=$${arch%%/*}; dir=bin/image/$${os}_$$arch; \
	  echo "CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -o $$dir/prism ./cmd/prism"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $$dir/prism ./cmd/prism; \
	  platforms="$$platforms -platform $$p=$$dir"; \
	done; \
	$(TOOLS)/prism-image build -out $(IMAGE_OUT) $(addprefix -ref ,$(IMAGE_REFS)) $$platforms \
	  -created "$(SOURCE_DATE_EPOCH)" -version "$(VERSION)" -revision "$(REVISION)"
	$(TOOLS)/prism-image check -archive $(IMAGE_OUT) -ref $(IMAGE_REPO):$(IMAGE_TAG) -version "$(VERSION)" -chart helm/prism

# bench/ and tools/ are modules of their own (their dependencies stay out of
# the binaries' module), so ./... at the root does not reach them.
MODULES := . bench tools

# The root module's packages that take longest (real processes, fault and
# crash loops, property tests of many cases under -race), longest first (as
# measured in BENCHMARKS.md#make-test). go test starts packages in the order
# they are named, -p at a time (the number of CPUs by default): named first,
# they run beside the many short packages instead of after them as the run's
# tail. ./tests/... and ./... then add the rest once each.
SLOW_TESTS := ./tests/moves ./mailbox/store ./tests/admin_cluster ./tests/chart ./tests/sidecar_e2e \
	./xds/cache ./tests/moves/history ./mailbox/runner ./mailbox/envelope ./tests/routing ./tests/recovery ./tests/...

# The modules run one after the other: bench/'s mixedbench tests judge their
# own pacing by the wall clock and fail when the root's multi-process suites
# take the cores beside them (BENCHMARKS.md#make-test); bench/ and tools/
# take under a minute.
test: $(TOOLS)/promtool
	@set -e; for m in $(MODULES); do \
	  if [ $$m = . ]; then pkgs="$(SLOW_TESTS) ./..."; else pkgs=./...; fi; \
	  echo "cd $$m && $(GO) test $(TEST_FLAGS) $$pkgs"; (cd $$m && $(GO) test $(TEST_FLAGS) $$pkgs); \
	done

bench: build
	bash bench/run.sh $(BENCH)

dev: build
	./bin/prism dev

$(TOOLS)/buf:
	GOBIN=$(TOOLS) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

$(TOOLS)/protoc-gen-go:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(TOOLS)/protoc-gen-go-grpc:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

# Debian's prometheus package carries promtool: downloaded and unpacked into
# bin/tools (not installed, so no daemon is set up), which takes seconds where
# building it from source takes minutes; the source build is the fallback
# where apt is not available.
$(TOOLS)/promtool:
	@mkdir -p $(TOOLS)
	@if command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null && bash tools/promtool-deb.sh $(TOOLS); then :; else \
	  GOBIN=$(TOOLS) $(GO) install github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION); fi

$(TOOLS)/golangci-lint:
	GOBIN=$(TOOLS) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

tools: $(TOOLS)/buf $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc

proto: tools
	$(TOOLS)/buf generate

# golangci-lint runs go vet, gofmt and goimports among its linters (.golangci.yml).
lint: $(TOOLS)/buf $(TOOLS)/golangci-lint
	$(TOOLS)/buf lint
	@set -e; for m in $(MODULES); do echo "cd $$m && golangci-lint run ./..."; (cd $$m && $(TOOLS)/golangci-lint run ./...); done

clean:
	rm -rf bin
