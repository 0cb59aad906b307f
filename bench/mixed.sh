#!/usr/bin/env bash
# Queries beside ingest (issue 18). Prints BENCH <name> <value> <unit> lines on stdout, notes on stderr.
#   MIXED_BENCH_N     backlog of ~1 KiB envelopes on 3 partitions (default 300000; the issue's 1M needs ~1 GiB
#                     in the in-process broker and several minutes)
#   MIXED_BENCH_ARGS  extra flags for bench/mixedbench (see cd bench && go run ./mixedbench -h)
set -euo pipefail
cd "$(dirname "$0")" # the bench module (bench/go.mod)
n="${MIXED_BENCH_N:-300000}"
# Ingest alone, for mixed.ingest_events_per_s beside the figure with queries.
go run ./mixedbench -n "$n" -qps 0
# Ingest with 200 indexed queries/s and 20 stats/s beside it, then 10 s of queries after the drain over HTTP
# and gRPC.
# shellcheck disable=SC2086
go run ./mixedbench -n "$n" -qps 200 -stats-qps 20 ${MIXED_BENCH_ARGS:-}
