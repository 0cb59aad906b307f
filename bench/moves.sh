#!/usr/bin/env bash
# Moves by handoff (issue 15) on real processes (bench/movesbench: three prism admin, runners with their sidecars, a
# gateway, Kafka in process). Prints BENCH <name> <value> <unit> lines on stdout, notes on stderr:
#   moves.failed_queries_rolling_restart   3 runners restarted in the kubelet's order, one reader per namespace
#   moves.events_went_down_rolling_restart answers with fewer events than the namespace's previous one (flowing topic)
#   moves.switch_pause_p99_ms              longest gap between two successful answers during a handoff, p99
#   moves.quiet_pause_p99_ms               the same over windows as long with no handoff: the load's own gaps
#   moves.catchup_s_<n>                    a namespace with n events moved, its mailbox read from Kafka: start to switch
#   moves.recovery_s_<n>                   the same, its mailbox copied from the source's (peer recovery)
#   moves.drain_s_100ns                    a proxy with 100 namespaces cordoned until it serves none
#   moves.failed_queries_drain_100ns       queries that failed during that drain
#   MOVES_BENCH_CATCHUP_N  events of the caught-up namespace (default 1000000; the source reads them all first, so
#                          this part takes about 2.5x the figure)
#   MOVES_BENCH_ARGS       extra flags for the benchmarks (-rolling-namespaces, -produce-rate, -drain-namespaces)
set -euo pipefail
cd "$(dirname "$0")" # the bench module (bench/go.mod)
n="${MOVES_BENCH_CATCHUP_N:-1000000}"
# shellcheck disable=SC2086
out=$(go test -run '^$' -bench '^Benchmark(RollingRestart|CatchUp|Drain)$' -benchtime 1x -count 1 -timeout 20m \
  ./movesbench -args -catchup-events "$n" ${MOVES_BENCH_ARGS:-} 2>&1) || { echo "$out" >&2; exit 1; }
echo "$out" | grep -v '^BENCH' >&2 || true
echo "$out" | grep '^BENCH moves\.' || { echo "bench moves: no figures in benchmark output" >&2; exit 1; }
