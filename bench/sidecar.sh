#!/usr/bin/env bash
# Benchmarks of the sidecar area. Prints one line per figure:
#   BENCH inject.p99_ms <v> ms   admission review latency (HTTPS, loopback, runner pod)
# The sidecar agent's figures, sidecar.acquire_ms, sidecar.release_ms and
# sidecar.fence_ms, come with the sidecar agent (prism sidecar), which lands
# in a later session; this script gains them then.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(go test -run '^$' -bench '^BenchmarkInject$' -benchtime 3000x -count 1 ./sidecar/inject)
echo "$out" >&2
echo "$out" | awk '/^BenchmarkInject/ {
  for (i = 2; i <= NF; i++) {
    if ($(i) == "p99_ms") { printf "BENCH inject.p99_ms %s ms\n", $(i-1); found = 1 }
    if ($(i) == "p50_ms") { printf "BENCH inject.p50_ms %s ms\n", $(i-1) }
  }
}
END { if (!found) { print "bench sidecar: no p99_ms in benchmark output" > "/dev/stderr"; exit 1 } }'
