#!/usr/bin/env bash
# Backup and restore of a large admin state (issue 14). Prints BENCH <name> <value> <unit> lines on stdout, notes on
# stderr. bench/backupbench builds 100,000 namespaces and 100,000 leases (one session, bulk acquires) directly in an
# FSM, then times:
#   admin.restore_s_100k        prism admin restore: verify the file, revoke every lease and session, write raft's stores
#   admin.snapshot_save_s_100k  prismctl snapshot save: Admin.SaveSnapshot on a running node over loopback gRPC into a
#                               synced, renamed file
# Target: 2 s each.
#   BACKUP_BENCH_ARGS   extra flags for bench/backupbench (cd bench && go run ./backupbench -h)
set -euo pipefail
cd "$(dirname "$0")" # the bench module (bench/go.mod)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/backupbench" ./backupbench
# shellcheck disable=SC2086
"$tmp/backupbench" ${BACKUP_BENCH_ARGS:-}
