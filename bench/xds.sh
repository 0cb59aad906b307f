#!/usr/bin/env bash
# xDS benchmarks (issue 4). Prints BENCH <name> <value> <unit> lines on stdout, notes on stderr.
#   XDS_BENCH_ARGS   extra flags for bench/xdsbench (see go run ./bench/xdsbench -h)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC2086
go run ./bench/xdsbench ${XDS_BENCH_ARGS:-}
