#!/usr/bin/env bash
# xDS benchmarks (issues 4, 13): runner moves at 10 and 1,000 proxies, then a 1M-lease admin FSM
# (about 2 GB of memory, 2-3 minutes). Prints BENCH <name> <value> <unit> lines on stdout, notes on stderr.
#   XDS_BENCH_ARGS   extra flags for bench/xdsbench (see cd bench && go run ./xdsbench -h)
set -euo pipefail
cd "$(dirname "$0")" # the bench module (bench/go.mod)
# shellcheck disable=SC2086
go run ./xdsbench ${XDS_BENCH_ARGS:-}
