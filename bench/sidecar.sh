#!/usr/bin/env bash
# Benchmarks of the sidecar area. Prints one line per figure:
#   BENCH inject.p99_ms <v> ms   admission review latency (HTTPS, loopback, runner pod)
#   BENCH sidecar.acquire_ms <v> ms   sidecar start -> runner serving under a granted lease
#   BENCH sidecar.release_ms <v> ms   SIGTERM to the sidecar -> lease and route gone (drain first)
#   BENCH sidecar.fence_ms <v> ms     sidecar kill -9 -> runner stopped serving (<= ttl, 3s here)
#   BENCH sidecar.regrant_ms <v> ms   sidecar kill -9 -> lease granted to another runner (>= ttl + grace, 5s)
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

# The agent's figures come from the process tests in tests/sidecar_e2e: real
# prism admin, runner (on an in-process kfake broker) and sidecar on loopback.
out=$(go test -count 1 -v -run '^(TestSidecarStartAndSIGTERM|TestSidecarKill9FencesBeforeRegrant)$/^1_admin_nodes$' ./tests/sidecar_e2e 2>&1) || { echo "$out" >&2; exit 1; }
echo "$out" | grep -v '^BENCH' >&2 || true
echo "$out" | grep '^BENCH sidecar\.' || { echo "bench sidecar: no sidecar figures in test output" >&2; exit 1; }
