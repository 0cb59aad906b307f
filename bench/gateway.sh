#!/usr/bin/env bash
# prism gateway benchmarks: stats query latency straight to a runner, through
# the gateway's HTTP API and through its gRPC front door (in-process xDS
# control plane, real runner, loopback, sequential requests). Prints
#   BENCH gateway.{runner_http,http,grpc}_stats_{p50,p99}_us <v> us
# Then the cost of mutual TLS (issue 11, bench/gatewaybench): the same query through two meshes that differ only
# in TLS, alternating, connections reused. Prints
#   BENCH gateway.{query,http_query}_{p50,p99}_us[_mtls] <v> us   and   gateway.{query,http_query}_p99_mtls_ratio
#   GATEWAY_BENCH_ARGS   extra flags for bench/gatewaybench (cd bench && go run ./gatewaybench -h)
set -euo pipefail
cd "$(dirname "$0")" # the bench module (bench/go.mod)
out=$(go -C .. test -run '^$' -bench '^BenchmarkGateway$' -benchtime 1x -count 1 ./gateway 2>&1) || { echo "$out" >&2; exit 1; }
echo "$out" | grep -v '^BENCH' >&2 || true
echo "$out" | grep '^BENCH gateway\.' || { echo "bench gateway: no figures in benchmark output" >&2; exit 1; }
# shellcheck disable=SC2086
go run ./gatewaybench ${GATEWAY_BENCH_ARGS:-}
