#!/usr/bin/env bash
# Disk pressure (issue 12): how fast a runner's ingest resumes once its full disk has space again, on a tmpfs
# the benchmark mounts (root only; otherwise it says so and prints nothing). Prints
# BENCH mailbox.disk_full_recover_s <v> s on stdout, notes on stderr.
#   DISK_BENCH_ARGS   extra flags for bench/diskbench (see cd bench && go run ./diskbench -h)
set -euo pipefail
cd "$(dirname "$0")" # the bench module (bench/go.mod)
# shellcheck disable=SC2086
go run ./diskbench ${DISK_BENCH_ARGS:-}
