#!/usr/bin/env bash
# prism gateway benchmarks: stats query latency straight to a runner, through
# the gateway's HTTP API and through its gRPC front door (in-process xDS
# control plane, real runner, loopback, sequential requests). Prints
#   BENCH gateway.{runner_http,http,grpc}_stats_{p50,p99}_us <v> us
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(go test -run '^$' -bench '^BenchmarkGateway$' -benchtime 1x -count 1 ./gateway 2>&1) || { echo "$out" >&2; exit 1; }
echo "$out" | grep -v '^BENCH' >&2 || true
echo "$out" | grep '^BENCH gateway\.' || { echo "bench gateway: no figures in benchmark output" >&2; exit 1; }
