#!/usr/bin/env bash
# Runs the benchmarks of one area (mailbox, admin, xds, sidecar) or of all, and
# prints one line per figure: BENCH <name> <value> <unit>.
# Each area has bench/<area>.sh, which installs its own baselines.
set -euo pipefail
cd "$(dirname "$0")/.."
areas=("$@")
if [ ${#areas[@]} -eq 0 ]; then
  areas=()
  for f in bench/*.sh; do
    a=$(basename "$f" .sh)
    [ "$a" = run ] || areas+=("$a")
  done
fi
for a in "${areas[@]}"; do
  if [ ! -f "bench/$a.sh" ]; then
    echo "bench: no benchmarks for area '$a'" >&2
    exit 2
  fi
  echo "# bench area $a" >&2
  bash "bench/$a.sh"
done
