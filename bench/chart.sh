#!/usr/bin/env bash
# The chart, run (issue 14). Prints BENCH <name> <value> <unit> lines on stdout, notes on stderr.
# tests/chart renders helm/prism and starts every Prism container with its rendered arguments, each pod in a
# network namespace of its own; needs root (it skips otherwise, and so prints nothing):
#   chart.ready_s        the defaults (3 admin nodes, 2 runners with their sidecars, 2 injectors): from the first
#                        process's start until every readiness probe passes
#   chart.ready_s_3a5r   the same with 3 admin nodes and 5 runners, identities from Secrets
set -euo pipefail
cd "$(dirname "$0")/.."

out=$(PRISM_CHART_BENCH=1 go test -count=1 -run 'TestChartRuns' -v ./tests/chart/ 2>&1) || {
  echo "$out" | tail -40 >&2
  exit 1
}
echo "$out" | grep -E 'SKIP|run in pods of their own' >&2 || true
echo "$out" | grep -E '^BENCH ' || true
