#!/usr/bin/env bash
# Queries beside ingest (issue 18): a `prism runner` process with its sidecar-held lease (and one prism admin,
# and a prism gateway routed by its xDS) drains a backlog while a paced loop sends indexed queries, half directly
# to the runner and half through the gateway. Prints BENCH <name> <value> <unit> lines on stdout (each query
# figure whole and as its _direct and _gateway halves), notes on stderr.
#   MIXED_BENCH_N       backlog of ~1 KiB envelopes on 3 partitions (default 1000000, the issue's; the in-process
#                       broker holds it, ~1.2 GiB, and a run takes several minutes on a quiet machine)
#   MIXED_BENCH_BUDGET  the runner's --memory-budget (default 1GiB), which mixed.runner_rss_peak_mb is measured under
#   MIXED_BENCH_ARGS    extra flags for bench/mixedbench (see cd bench && go run ./mixedbench -h), e.g. -payload random,
#                       -runner-env GOGC=200 (the runner's environment), or -trace /tmp/t.out (the runner's trace 5 s
#                       into ingest, its request cycles and holds of Badger's DB lock summed up on stderr)
set -euo pipefail
cd "$(dirname "$0")" # the bench module (bench/go.mod)
n="${MIXED_BENCH_N:-1000000}"
budget="${MIXED_BENCH_BUDGET:-1GiB}"
# Ingest alone, for mixed.ingest_events_per_s beside the figure with queries.
# shellcheck disable=SC2086
go run ./mixedbench -n "$n" -memory-budget "$budget" -qps 0 ${MIXED_BENCH_ARGS:-} |
  sed 's/^BENCH mixed.runner_rss_peak_mb /BENCH mixed.runner_rss_peak_mb_ingest_alone /'
# Ingest with 200 indexed queries/s and 20 stats/s beside it, then 10 s of queries after the drain over HTTP,
# 10 s over gRPC, and 10 s at 1,000/s over both (mixed.query_p99_ms_1000qps_after); mixed.runner_rss_peak_mb is
# this run's.
# shellcheck disable=SC2086
go run ./mixedbench -n "$n" -memory-budget "$budget" -qps 200 -stats-qps 20 ${MIXED_BENCH_ARGS:-}
