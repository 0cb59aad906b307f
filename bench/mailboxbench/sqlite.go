//go:build libsqlite3

package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	_ "github.com/mattn/go-sqlite3"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// The baseline's table, a plain relational mailbox: every indexed header a column, the envelope a blob, and one
// single-column index per queried header.
var sqliteSchema = []string{
	`CREATE TABLE IF NOT EXISTS mailbox (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		message_id TEXT NOT NULL UNIQUE,
		timestamp INTEGER NOT NULL,
		topic TEXT NOT NULL,
		content_type TEXT,
		schema_url TEXT,
		schema_version TEXT,
		encryption TEXT,
		correlation_id TEXT,
		principal TEXT,
		namespace TEXT,
		trace_id TEXT,
		span_id TEXT,
		custom_headers TEXT,
		envelope_blob BLOB NOT NULL,
		created_at INTEGER NOT NULL
	)`,
	`CREATE INDEX IF NOT EXISTS idx_timestamp ON mailbox(timestamp)`,
	`CREATE INDEX IF NOT EXISTS idx_topic ON mailbox(topic)`,
	`CREATE INDEX IF NOT EXISTS idx_principal ON mailbox(principal)`,
	`CREATE INDEX IF NOT EXISTS idx_correlation_id ON mailbox(correlation_id)`,
	`CREATE INDEX IF NOT EXISTS idx_trace_id ON mailbox(trace_id)`,
}

// The usual settings for a write-heavy SQLite store: WAL, relaxed sync, a large page cache, temp tables in
// memory, mmap.
var sqlitePragmas = []string{
	`PRAGMA journal_mode=WAL`,
	`PRAGMA synchronous=NORMAL`,
	`PRAGMA cache_size=10000`,
	`PRAGMA temp_store=MEMORY`,
	`PRAGMA mmap_size=30000000000`,
}

const sqliteColumns = `message_id, timestamp, topic, content_type, schema_url, schema_version, encryption,
	correlation_id, principal, namespace, trace_id, span_id, custom_headers, envelope_blob`

// sqliteBatch is the baseline's insert batching: 100 events per transaction. sqliteBulkBatch only fills the table up
// to the query benchmark's size in the time budget: with 5 indexes, every small transaction rewrites hundreds of
// index pages into the WAL, which big transactions amortize.
const (
	sqliteBatch     = 100
	sqliteBulkBatch = 20_000
)

func benchSQLite(c config, path string, queries map[string][]query) error {
	db, err := sql.Open("sqlite3", "file:"+filepath.ToSlash(path))
	if err != nil {
		return err
	}
	defer db.Close()
	// One connection, so the pragmas apply to every statement (they are per connection).
	db.SetMaxOpenConns(1)
	for _, stmt := range append(append([]string{}, sqlitePragmas...), sqliteSchema...) {
		if _, err := db.Exec(stmt); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	var inTx time.Duration
	wall := time.Now()
	measured := min(c.sqliteRate, c.n)
	err = forBatches(0, measured, sqliteBatch, func(rows []*mailboxv1.MailboxItem) error {
		t := time.Now()
		err := insertBatch(db, rows)
		inTx += time.Since(t)
		return err
	})
	if err != nil {
		return err
	}
	note("sqlite: loaded %d items in %v (%v inside transactions of %d)", measured, time.Since(wall).Round(time.Millisecond), inTx.Round(time.Millisecond), sqliteBatch)
	// Measured on the first items, while the table and its indexes are smallest: the rate SQLite starts at,
	// which is its best.
	bench("mailbox.ingest_sqlite_events_per_s", float64(measured)/inTx.Seconds(), "events/s")
	wall = time.Now()
	if err := forBatches(measured, c.n, sqliteBulkBatch, func(rows []*mailboxv1.MailboxItem) error {
		return insertBatch(db, rows)
	}); err != nil {
		return err
	}
	note("sqlite: bulk-loaded the other %d items in %v (transactions of %d, not a measured figure)", c.n-measured, time.Since(wall).Round(time.Millisecond), sqliteBulkBatch)
	if _, err := db.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		return err
	}
	size, err := dirSize(filepath.Dir(path))
	if err != nil {
		return err
	}
	bench("mailbox.sqlite_disk_bytes_per_event", float64(size)/float64(c.n), "bytes")

	stmts := map[string]string{
		"topic":       `WHERE topic = ?`,
		"principal":   `WHERE principal = ?`,
		"correlation": `WHERE correlation_id = ?`,
		"trace":       `WHERE trace_id = ?`,
		"time_range":  `WHERE timestamp >= ? AND timestamp < ?`,
	}
	stmt := func(k string) string {
		return `SELECT ` + sqliteColumns + ` FROM mailbox ` + stmts[k] + ` ORDER BY timestamp DESC, id DESC LIMIT 100`
	}
	args := func(q query) []any {
		if q.kind == "time_range" {
			return []any{q.start, q.end}
		}
		return []any{q.value}
	}
	for _, k := range kinds { // the same warm-up as the store gets
		st, err := db.Prepare(stmt(k))
		if err != nil {
			return err
		}
		err = warmUp(queries[k], func(q query) error {
			_, err := scanAll(st, args(q))
			return err
		})
		st.Close()
		if err != nil {
			return err
		}
	}
	var worst float64
	for _, k := range kinds {
		st, err := db.Prepare(stmt(k))
		if err != nil {
			return err
		}
		p99, err := latencies(c, "mailbox.query_sqlite_"+k, queries[k], func(q query) (int, error) {
			return scanAll(st, args(q))
		})
		st.Close()
		if err != nil {
			return err
		}
		worst = max(worst, p99)
	}
	bench("mailbox.query_sqlite_p99_ms", worst, "ms")

	// The baseline's retention, one DELETE by timestamp, on the same 100k oldest items.
	t := time.Now()
	res, err := db.Exec(`DELETE FROM mailbox WHERE timestamp < ?`, tsOf(c.retain))
	if err != nil {
		return err
	}
	n, _ := res.RowsAffected()
	took := time.Since(t)
	note("sqlite: retention deleted %d rows in %v", n, took.Round(time.Millisecond))
	bench("mailbox.retention_sqlite_100k_s", took.Seconds()*100_000/float64(n), "s")
	return nil
}

func insertBatch(db *sql.DB, items []*mailboxv1.MailboxItem) error {
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	st, err := tx.Prepare(`INSERT OR IGNORE INTO mailbox (` + sqliteColumns + `, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`)
	if err != nil {
		return err
	}
	defer st.Close()
	now := time.Now().UnixMilli()
	for _, it := range items {
		custom, err := json.Marshal(it.GetCustomHeaders())
		if err != nil {
			return err
		}
		if _, err := st.Exec(it.GetMessageId(), it.GetTimestamp(), it.GetTopic(), it.GetContentType(), it.GetSchemaUrl(),
			it.GetSchemaVersion(), it.GetEncryption(), it.GetCorrelationId(), it.GetPrincipal(), it.GetNamespace(),
			it.GetTraceId(), it.GetSpanId(), string(custom), it.GetEnvelopeBlob(), now); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// scanAll reads every column of every row, as the store's query returns whole items.
func scanAll(st *sql.Stmt, args []any) (int, error) {
	rows, err := st.Query(args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id, topic string
		var ts int64
		var ct, su, sv, enc, corr, prin, ns, trace, span, custom sql.NullString
		var blob []byte
		if err := rows.Scan(&id, &ts, &topic, &ct, &su, &sv, &enc, &corr, &prin, &ns, &trace, &span, &custom, &blob); err != nil {
			return n, err
		}
		n++
	}
	return n, rows.Err()
}
