#!/usr/bin/env bash
# Mailbox benchmarks (issue 2). Prints BENCH <name> <value> <unit> lines on stdout, notes on stderr.
#   MAILBOX_BENCH_N      items loaded into the store and the SQLite baseline (default 1000000)
#   MAILBOX_BENCH_ARGS   extra flags for bench/mailboxbench (see cd bench && go run ./mailboxbench -h)
set -euo pipefail
cd "$(dirname "$0")" # the bench module (bench/go.mod)

# The SQLite baseline links Debian's libsqlite3 (go-sqlite3's libsqlite3 build tag) rather than compiling the
# amalgamation; install its headers once.
if ! dpkg-query -W -f='${Status}' libsqlite3-dev 2>/dev/null | grep -q "install ok installed"; then
  echo "# installing libsqlite3-dev" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libsqlite3-dev >&2
fi

# Store at scale: direct durable writes, indexed queries at N events, retention of 100k, bytes on disk; and
# the SQLite baseline (bench/mailboxbench/sqlite.go) fed the same items.
# shellcheck disable=SC2086
go run -tags libsqlite3 ./mailboxbench -n "${MAILBOX_BENCH_N:-1000000}" ${MAILBOX_BENCH_ARGS:-}

# End-to-end ingest (broker -> sarama -> store, mailbox.ingest_events_per_s) is appended below by the runner.
go run ./ingestbench -n "${MAILBOX_INGEST_N:-200000}"

# The Kafka side alone (broker -> sarama -> envelope decoding, items dropped): mailbox.kafka_decode_events_per_s.
go run ./ingestbench -discard -n "${MAILBOX_DECODE_N:-500000}"
