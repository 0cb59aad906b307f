#!/usr/bin/env bash
# Admin cluster benchmarks (issue 3). Prints BENCH <name> <value> <unit> lines on stdout, notes on stderr.
# Same machine, same run, same client concurrency for every system:
#   prism admin, 1 and 3 nodes (raft-wal, fsync on every append), clients on the leader and on a follower;
#   etcd (Debian's etcd-server, 3 members, default fsync): LeaseGrant + put-if-absent with the lease, KeepAliveOnce, Revoke;
#   Redis (Debian's redis-server, appendfsync always): SET NX PX, PEXPIRE, DEL.
# Then failover (kill -9 of the leader to the first acknowledged write, ADMIN_BENCH_KILLS times) and scale
# (10,000 leases each heartbeating every second on 3 nodes: heartbeat latency and admin CPU), and the cost of the
# leadership check per renewal (admin.renewal_leader_check_us, a Go benchmark of admin/leadership).
# The cost of mutual TLS (issue 11), side by side in the same run (adminbench -security both, the default): the
# 3-node latency and the scale run again over mTLS (figures suffixed _mtls, ratios admin.acquire_p99_mtls_ratio and
# admin.heartbeat_p99_10k_mtls_ratio), and security.handshake_ms, a fresh mTLS connection's first call, next to
# security.handshake_ms_plaintext. Every other figure is plaintext (--insecure), as before.
# Sessions (issue 20, adminbench -only sessions, over mTLS, one identity per proxy): one AcquireLeases of 1,000
# mailboxes (admin.bulk_grant_ms_1k), S sessions x L leases keeping alive every 5 s (admin.session_renew_p99_ms_<size>,
# admin.session_leader_cpu_pct_<size>, admin.heap_mb_<size>), a silent session's 1,000 leases gone after ttl + grace
# (admin.session_expiry_routes_ms_1k, and _lag_ms_1k past ttl + grace), and etcd's one lease with 1,000 keys renewed
# by one KeepAliveOnce. Failover with 100k leases held in 100 sessions (adminbench -only failover-sessions): leader
# kill -9 -> first acknowledged write (admin.failover_p99_ms_100k) and the leases lost across the kills
# (admin.failover_leases_lost_100k, must be 0).
#   ADMIN_BENCH_ARGS   extra flags for bench/adminbench (cd bench && go run ./adminbench -h)
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
  echo "# installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/prism" ./cmd/prism
go -C bench build -o "$tmp/adminbench" ./adminbench
# shellcheck disable=SC2086
"$tmp/adminbench" -prism "$tmp/prism" -etcd "$(command -v etcd)" -redis "$(command -v redis-server)" \
  -concurrency 16 -phase 3s -kills "${ADMIN_BENCH_KILLS:-20}" ${ADMIN_BENCH_ARGS:-}

# The leadership check every renewal passes (admin/leadership): per-renewal cost with 2 goroutines, rounds included.
go test -run '^$' -bench '^BenchmarkLease$' -benchtime 2s ./admin/leadership/ |
  awk '$1 ~ /^BenchmarkLease/ { printf "BENCH admin.renewal_leader_check_us %.3f us\n", $3 / 1000 }'
