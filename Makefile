# Every target installs what it needs into bin/tools (ignored by git), so a
# fresh Debian machine with Go needs nothing else.
SHELL := /bin/bash
GO ?= go
TOOLS := $(CURDIR)/bin/tools
BUF_VERSION := v1.75.0
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
GOLANGCI_LINT_VERSION := v2.15.0
# TEST_FLAGS lets CI and developers narrow or widen a run without editing here.
TEST_FLAGS ?= -race -count=1 -timeout 15m
# BENCH picks one area's benchmarks (mailbox, admin, xds, sidecar); empty runs all.
BENCH ?=

.PHONY: all build test bench proto lint dev clean tools

all: build

# Static binaries (no cgo: nothing outside bench/ needs it), stamped with the
# git version so `prism --version` names the commit it was built from.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
BUILD_FLAGS := -trimpath -ldflags "-X main.version=$(VERSION)"

build:
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o bin/prism ./cmd/prism
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o bin/prismctl ./cmd/prismctl

test:
	$(GO) test $(TEST_FLAGS) ./...

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

$(TOOLS)/golangci-lint:
	GOBIN=$(TOOLS) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

tools: $(TOOLS)/buf $(TOOLS)/protoc-gen-go $(TOOLS)/protoc-gen-go-grpc

proto: tools
	$(TOOLS)/buf generate

# golangci-lint runs go vet, gofmt and goimports among its linters (.golangci.yml).
lint: $(TOOLS)/buf $(TOOLS)/golangci-lint
	$(TOOLS)/buf lint
	$(TOOLS)/golangci-lint run ./...

clean:
	rm -rf bin
