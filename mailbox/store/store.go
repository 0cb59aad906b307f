// Package store is a mailbox's durable event store on Badger v4
// (docs/architecture.md#mailbox-store): the
// full envelope bytes with their indexed headers, secondary indexes so filtered
// queries never scan the whole mailbox, cursor pagination, and retention.
// The key layout is described in keys.go.
package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

var (
	// ErrNotFound is returned by Get for an unknown message id.
	ErrNotFound = errors.New("not found")
	// ErrInvalidFilter is wrapped with the parameter name, e.g. "page_token: ...".
	ErrInvalidFilter = errors.New("invalid filter")
)

// Options configure a Store.
type Options struct {
	Dir      string        // data directory (created 0700); ignored when InMemory
	InMemory bool          // for unit tests
	MaxAge   time.Duration // retention: items older than this are deleted; 0 = keep forever
	// MaxSize bounds the stored envelope bytes (Stats.total_bytes), oldest deleted first; 0 = unbounded. The
	// bound is on the counted bytes rather than on the files, which lag behind deletes until compaction and
	// value-log GC, so a pass lands under it (as of the pass's start) rather than chasing disk usage.
	MaxSize int64
	Logger  *slog.Logger // nil = slog.Default()

	// Test knobs, so that GC finds whole value-log files and compaction starts after two L0 tables in a small
	// store: 128 MiB and Badger's default otherwise.
	vlogFileSize int64
	l0Tables     int
}

// WriteResult counts what a Write did with its items: stored, dropped as duplicates of a stored message id, or
// dropped as older than the retention floor.
type WriteResult struct{ Stored, Duplicates, Expired int }

// RetentionResult reports what one retention pass removed.
type RetentionResult struct {
	Deleted      int
	DeletedBytes int64
}

// Store is one mailbox's event store. It is safe for concurrent use; writes are serialized (there is one ingest
// path per mailbox anyway), reads run concurrently on Badger snapshots.
type Store struct {
	opts Options
	log  *slog.Logger
	db   *badger.DB

	// wmu serializes Write and retention's delete transactions: dedup checks and counters are only correct with
	// one writer. It also guards the write pipeline (write.go): wm, the counters as of the last group sent (m is
	// as of the last one durable), the flight Badger is writing, and the spare transaction opened before it.
	wmu      sync.Mutex
	wm       meta
	inflight *flight
	spare    *badger.Txn
	// wfloor is the floor writes obey, guarded by wmu: a retention pass raises it before it counts what it
	// deletes, so nothing lands below the floor between the count and the commit (retention.go).
	wfloor int64
	// rmu serializes retention passes.
	rmu sync.Mutex
	// qmu guards queue: Writes waiting for wmu, committed together by the next holder.
	qmu   sync.Mutex
	queue []*writeReq
	// mmu guards m, so Stats does not wait behind a write's fsync.
	mmu sync.Mutex
	m   meta

	chunk int // items per retention transaction; retentionChunk except in tests

	// Since Open: items and bytes deleted by retention passes, and items whose keys the sweep removed.
	deleted, deletedBytes, swept atomic.Int64
}

const (
	dirMode  fs.FileMode = 0o700
	fileMode fs.FileMode = 0o600
)

// Open opens (or creates) the store described by opts.
func Open(opts Options) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	bo := badger.DefaultOptions(opts.Dir).
		WithLogger(badgerLogger{log}).
		// Write calls are serialized by the store, so Badger's conflict tracking is pure overhead.
		WithDetectConflicts(false).
		// Every commit is fsynced: a returned Write must survive a crash of the process or the machine, since
		// the Kafka offsets covering it are committed next. (An explicit DB.Sync after the commit would spare
		// retention's deletes their fsyncs, but it syncs only the newest value-log file: a commit that rotated
		// the log would leave its values unsynced in the previous one.)
		WithSyncWrites(true).
		WithNumCompactors(2).
		WithMetricsEnabled(false)
	if opts.InMemory {
		bo = bo.WithDir("").WithValueDir("").WithInMemory(true).WithMemTableSize(16 << 20).WithBlockCacheSize(8 << 20)
	} else {
		// Envelopes (about 1 KiB) go to the value log; the LSM tree holds only keys and small values. (In memory
		// there is no value log, so values stay in the tree.)
		bo = bo.WithValueThreshold(256).
			// Value-log GC rewrites a whole file once half of it is garbage: files of 128 MiB (not Badger's
			// 1 GiB) let retention give space back in steps proportionate to a mailbox.
			WithValueLogFileSize(cmp.Or(opts.vlogFileSize, 128<<20))
		if opts.l0Tables > 0 {
			bo = bo.WithNumLevelZeroTables(opts.l0Tables)
		}
		if opts.Dir == "" {
			return nil, errors.New("open store: Dir is empty")
		}
		if err := os.MkdirAll(opts.Dir, dirMode); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		if err := fixModes(opts.Dir); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
	}
	db, err := badger.Open(bo)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", opts.Dir, err)
	}
	s := &Store{opts: opts, log: log, db: db, chunk: retentionChunk}
	if err := db.View(func(txn *badger.Txn) error {
		it, err := txn.Get(metaKey)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return it.Value(func(v []byte) error {
			s.m, err = decodeMeta(v)
			return err
		})
	}); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open store %s: read counters: %w", opts.Dir, err)
	}
	s.wm = s.m
	s.wfloor = s.m.floor()
	if err := s.fixModes(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open store: %w", err)
	}
	return s, nil
}

// Close releases the store.
func (s *Store) Close() error {
	s.wmu.Lock()
	s.settle()
	s.wmu.Unlock()
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close store %s: %w", s.opts.Dir, err)
	}
	return s.fixModes()
}

func (s *Store) fixModes() error {
	if s.opts.InMemory {
		return nil
	}
	return fixModes(s.opts.Dir)
}

// fixModes makes dir 0700 and every file in it 0600. Badger creates its tables, memtables and value logs with
// mode 0666 (minus umask); the directory's 0700 already keeps other users out, and this sweep (on open, close
// and after each retention pass) brings the files themselves to 0600 too.
func fixModes(dir string) error {
	if err := os.Chmod(dir, dirMode); err != nil {
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	for _, e := range entries {
		want := fileMode
		if e.IsDir() {
			want = dirMode
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // Badger removed it meanwhile (compaction, GC).
		}
		if err != nil {
			return fmt.Errorf("stat %s: %w", e.Name(), err)
		}
		if info.Mode().Perm() == want {
			continue
		}
		if err := os.Chmod(filepath.Join(dir, e.Name()), want); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("chmod %s: %w", e.Name(), err)
		}
	}
	return nil
}

// Get returns the item with messageID, or an error wrapping ErrNotFound.
func (s *Store) Get(ctx context.Context, messageID string) (*mailboxv1.MailboxItem, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out *mailboxv1.MailboxItem
	err := s.db.View(func(txn *badger.Txn) error {
		p, ok, err := lookupMsgID(txn, messageID)
		if err != nil {
			return err
		}
		if !ok || p.ts() < s.meta().floor() {
			return ErrNotFound
		}
		out, err = readItem(txn, p)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("get %q: %w", messageID, err)
	}
	return out, nil
}

func lookupMsgID(txn *badger.Txn, id string) (pos, bool, error) {
	var p pos
	it, err := txn.Get(msgIDKey(id))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return p, false, nil
	}
	if err != nil {
		return p, false, err
	}
	err = it.Value(func(v []byte) error {
		if len(v) != posLen {
			return errCorruptRecord
		}
		copy(p[:], v)
		return nil
	})
	return p, err == nil, err
}

func readItem(txn *badger.Txn, p pos) (*mailboxv1.MailboxItem, error) {
	it, err := txn.Get(itemKey(p))
	if err != nil {
		return nil, fmt.Errorf("read item: %w", err)
	}
	var out *mailboxv1.MailboxItem
	err = it.Value(func(v []byte) error {
		out, err = decodeItem(v)
		return err
	})
	return out, err
}

// Usage is what a store holds and what retention has removed from it since it was opened, cheap enough for
// every metrics scrape.
type Usage struct {
	Events, Bytes         int64     // stored, as Stats counts them
	Floor                 time.Time // the retention floor; zero while retention has deleted nothing
	Deleted, DeletedBytes int64     // deleted by retention passes since Open
	Swept                 int64     // deleted items whose keys the sweep has removed since Open
}

// Usage reports the counters and the retention floor, without reading the store.
func (s *Store) Usage() Usage {
	m := s.meta()
	u := Usage{Events: m.events, Bytes: m.bytes, Deleted: s.deleted.Load(), DeletedBytes: s.deletedBytes.Load(), Swept: s.swept.Load()}
	if f := m.floor(); f != math.MinInt64 {
		u.Floor = time.UnixMilli(f)
	}
	return u
}

// Stats reports total events, total envelope bytes, oldest and newest timestamps. mailbox_id and epoch are left
// empty for the caller to fill. The counters are kept by every write and retention pass; oldest and newest are
// the first live key at either end of the primary order.
func (s *Store) Stats(ctx context.Context) (*mailboxv1.MailboxStats, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m := s.meta()
	st := &mailboxv1.MailboxStats{TotalEvents: m.events, TotalBytes: m.bytes}
	err := s.db.View(func(txn *badger.Txn) error {
		for _, reverse := range []bool{false, true} {
			it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: false, Reverse: reverse, Prefix: []byte{prefixItem}})
			seek := []byte{prefixItem}
			if reverse {
				seek = oldestFrom(m.floor())
			}
			it.Seek(seek)
			if it.Valid() {
				var p pos
				copy(p[:], it.Item().Key()[1:])
				if ts := p.ts(); ts >= m.floor() {
					if reverse {
						st.OldestEvent = timestamppb.New(time.UnixMilli(ts))
					} else {
						st.NewestEvent = timestamppb.New(time.UnixMilli(ts))
					}
				}
			}
			it.Close()
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	return st, nil
}

// badgerLogger sends Badger's logs to slog; its chatty info lines (compactions, flushes) go to debug.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) logf(level slog.Level, f string, a []any) {
	if b.l.Enabled(context.Background(), level) {
		b.l.Log(context.Background(), level, strings.TrimSpace(fmt.Sprintf(f, a...)), "component", "badger")
	}
}

func (b badgerLogger) Errorf(f string, a ...any)   { b.logf(slog.LevelError, f, a) }
func (b badgerLogger) Warningf(f string, a ...any) { b.logf(slog.LevelWarn, f, a) }
func (b badgerLogger) Infof(f string, a ...any)    { b.logf(slog.LevelDebug, f, a) }
func (b badgerLogger) Debugf(f string, a ...any)   { b.logf(slog.LevelDebug, f, a) }
