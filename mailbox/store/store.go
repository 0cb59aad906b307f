// Package store is a mailbox's durable event store on Badger v4
// (docs/architecture.md#mailbox-store): the
// full envelope bytes with their indexed headers, secondary indexes so filtered
// queries never scan the whole mailbox, cursor pagination, and retention.
// A runner keeps all its mailboxes in one Badger database (DB, db.go), each
// under a key prefix of its own; the key layout is described in keys.go.
package store

import (
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
	"github.com/klauspost/compress/s2"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

var (
	// ErrNotFound is returned by Get for an unknown message id.
	ErrNotFound = errors.New("not found")
	// ErrInvalidFilter is wrapped with the parameter name, e.g. "page_token: ...".
	ErrInvalidFilter = errors.New("invalid filter")
)

// Options configure a Store. Through a DB (DB.Open) only ID, MaxAge, MaxSize and Logger apply; Open alone (a
// private database holding one mailbox, which the Store's Close closes) takes Dir, InMemory and Memory too.
type Options struct {
	ID       string        // the mailbox id; DB.Open's key
	Dir      string        // data directory (created 0700); ignored when InMemory
	InMemory bool          // for unit tests
	MaxAge   time.Duration // retention: items older than this are deleted; 0 = keep forever
	// MaxSize bounds the stored envelope bytes (Stats.total_bytes), oldest deleted first; 0 = unbounded. The
	// bound is on the counted bytes rather than on the files, which lag behind deletes until compaction and
	// value-log GC, so a pass lands under it (as of the pass's start) rather than chasing disk usage.
	MaxSize int64
	Logger  *slog.Logger // nil = slog.Default()
	// Memory sizes what Badger holds in memory for this store; zero fields keep Badger's defaults. A runner
	// divides its memory budget among its stores with MemoryFor.
	Memory Memory

	// Test knobs, so that GC finds whole value-log files and compaction starts after two L0 tables in a small
	// store: 128 MiB and Badger's default otherwise.
	vlogFileSize int64
	l0Tables     int
	// headBytes sizes the private database's heads (DBOptions.headBytes).
	headBytes int64
	// plainRecords writes every record uncompressed, as stores written before compression hold them.
	plainRecords bool
}

// WriteResult counts what a Write did with its items: stored, dropped as duplicates of a stored message id, or
// dropped as older than the retention floor.
type WriteResult struct{ Stored, Duplicates, Expired int }

// RetentionResult reports what one retention pass removed.
type RetentionResult struct {
	Deleted      int
	DeletedBytes int64
}

// Store is one mailbox's event store, its keys under the mailbox's number in a database shared with the
// runner's other mailboxes (DB). It is safe for concurrent use; writes are serialized (there is one ingest path
// per mailbox anyway), reads run concurrently on Badger snapshots.
type Store struct {
	opts  Options
	log   *slog.Logger
	db    *badger.DB
	owner *DB
	box   box // the mailbox's number: the first bytes of all its keys
	// private is set for a store opened by Open alone: its Close closes the database too.
	private bool
	// created, for a mailbox new to the database, is the commit of its catalog entry, which its first write waits
	// for (DB.create).
	created *flight
	// closed is set by Close under wmu; writes after it fail.
	closed atomic.Bool

	// wmu serializes Write and retention's delete transactions: dedup checks and counters are only correct with
	// one writer. It also guards the write pipeline (write.go): wm, the counters as of the last group sent (m is
	// as of the last one durable), the last flight sent to Badger and the one before it, if not known durable.
	wmu      sync.Mutex
	wm       meta
	inflight *flight
	before   *flight
	// wfloor is the floor writes obey, guarded by wmu: a retention pass raises it before it counts what it
	// deletes, so nothing lands below the floor between the count and the commit (retention.go).
	wfloor int64
	// rmu serializes retention passes.
	rmu sync.Mutex
	// qmu guards queue: Writes waiting for wmu, committed together by the next holder.
	qmu   sync.Mutex
	queue []*writeReq
	// mmu guards m, applied and snap, and is held for nothing longer than a pointer swap or a reference count:
	// reads take it to find what to read, writes to publish what is durable.
	mmu     sync.Mutex
	m       meta
	applied uint64    // the timestamp of the store's last applied commit, which reads read at
	snap    *snapshot // nil once closed
	// live counts the snapshots not yet discarded, so Close waits for the reads still using one.
	live sync.WaitGroup
	// heldCommit, when set (tests only), is called by a write group's commit once Badger has applied it and
	// before the store publishes it or its Write returns: a batch held mid-commit.
	heldCommit func()
	// heldSend, when set (tests only), is called by a write group once it has its commit timestamp and before it
	// is sent to Badger: a commit in flight.
	heldSend func()
	// readBadger, when set (tests only), is called by each query and Get that reads Badger, not only the head.
	readBadger func()

	// hmu serializes publishing, so that each snapshot's head view (head.go) follows the one before; head is the
	// view last published, and lower a bound the next view takes, for items a failed flight stored all the same
	// (they are in Badger, not in the head).
	hmu   sync.Mutex
	head  *headView
	lower pos

	chunk int // items per retention transaction; retentionChunk except in tests

	// dict is the store's compression dictionary (record.go), nil until the first write big enough to make one;
	// dictMu serializes making it.
	dict   atomic.Pointer[s2.Dict]
	dictMu sync.Mutex

	// seed is the stored positions a copy seeded the mailbox with (copy.go), read at open; recovery, guarded by
	// mmu, its recovery record.
	seed     []Position
	recovery Recovery

	// Since Open: items and bytes deleted by retention passes, and items whose keys the sweep removed.
	deleted, deletedBytes, swept atomic.Int64
}

const (
	dirMode  fs.FileMode = 0o700
	fileMode fs.FileMode = 0o600
)

// Open opens (or creates) the store described by opts in a database of its own at opts.Dir (or in memory),
// holding this one mailbox (opts.ID, which may be empty); the store's Close closes the database.
func Open(opts Options) (*Store, error) {
	db, err := OpenDB(DBOptions{
		Dir: opts.Dir, InMemory: opts.InMemory, Memory: opts.Memory, Logger: opts.Logger,
		vlogFileSize: opts.vlogFileSize, l0Tables: opts.l0Tables, headBytes: opts.headBytes,
	})
	if err != nil {
		return nil, err
	}
	so := opts
	so.Dir, so.InMemory, so.Memory = "", false, Memory{}
	s, err := db.Open(so)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	s.private = true
	return s, nil
}

// newStore reads the state of mailbox b as its last commit left it.
func newStore(db *DB, opts Options, b box) (*Store, error) {
	log := opts.Logger
	if log == nil {
		log = db.log
	}
	s := &Store{opts: opts, log: log, db: db.bdb, owner: db, box: b, chunk: retentionChunk}
	// Nothing of the mailbox is in flight: it was not open.
	ts, unpin := db.pinLatest()
	defer unpin()
	txn := db.bdb.NewTransactionAt(ts, false)
	defer txn.Discard()
	v, err := getValue(txn, b.metaKey())
	if err == nil {
		s.m, err = decodeMeta(v)
	}
	if err != nil && !errors.Is(err, badger.ErrKeyNotFound) {
		return nil, fmt.Errorf("open store %q: read counters: %w", opts.ID, err)
	}
	s.m.setBounds(txn, b)
	v, err = getValue(txn, b.dictKey())
	if err == nil {
		d := s2.NewDict(v)
		if d == nil {
			err = fmt.Errorf("%w: invalid dictionary", errCorruptRecord)
		}
		s.dict.Store(d)
	}
	if err != nil && !errors.Is(err, badger.ErrKeyNotFound) {
		return nil, fmt.Errorf("open store %q: read compression dictionary: %w", opts.ID, err)
	}
	if err := s.loadRecovery(txn); err != nil {
		return nil, fmt.Errorf("open store %q: read recovery record: %w", opts.ID, err)
	}
	s.wm = s.m
	s.wfloor = s.m.floor()
	s.head, s.lower = emptyHead(s.m), maxPos
	s.publish(s.m, ts)
	return s, nil
}

// snapshot is what every read uses: a Badger read transaction at the timestamp of the store's last applied
// commit, and the counters, floor and bounds as of the same commit. In managed mode (DB) opening it never waits;
// it is shared, so a query opens no transaction at all. Badger's read-only transactions are safe for concurrent
// Gets and iterators.
type snapshot struct {
	txn   *badger.Txn
	unpin func()
	m     meta
	head  *headView // the items of the commit's newest write groups (head.go)
	refs  int       // guarded by Store.mmu; the store holds one while the snapshot is current
}

// publish makes the store's state as of its commit at ts, with counters m, what reads see from now on. It is
// called once that commit is applied, with none of the store's own in flight.
func (s *Store) publish(m meta, ts uint64) { s.publishWith(m, ts, nil) }

// publishWith is publish for a commit that stored the write group seg (nil: none), which the head takes.
func (s *Store) publishWith(m meta, ts uint64, seg *headSegment) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	s.head = s.head.with(seg, s.lower, s.owner.headShare())
	s.lower = maxPos
	sn := &snapshot{unpin: s.owner.pin(ts), txn: s.db.NewTransactionAt(ts, false), m: m, head: s.head, refs: 1}
	s.live.Add(1)
	s.mmu.Lock()
	s.m = m
	s.applied = ts
	old := s.snap
	s.snap = sn
	s.mmu.Unlock()
	if old != nil {
		s.release(old)
	}
}

// begin opens a transaction reading the store as of its last applied commit, pinned until done is called. It is
// for the writer (wmu held; what it has in flight it cannot see), and fails once the store is closed.
func (s *Store) begin(update bool) (txn *badger.Txn, done func(), err error) {
	if s.closed.Load() {
		return nil, nil, badger.ErrDBClosed
	}
	s.mmu.Lock()
	ts := s.applied
	unpin := s.owner.pin(ts)
	s.mmu.Unlock()
	txn = s.db.NewTransactionAt(ts, update)
	return txn, func() { txn.Discard(); unpin() }, nil
}

// ready waits for the commit that created the mailbox, if it is new, and says if that failed.
func (s *Store) ready() error {
	if s.created == nil {
		return nil
	}
	<-s.created.done
	return s.created.err
}

// acquire returns the current snapshot, referenced until release, or nil once the store is closed.
func (s *Store) acquire() *snapshot {
	s.mmu.Lock()
	defer s.mmu.Unlock()
	sn := s.snap
	if sn != nil {
		sn.refs++
	}
	return sn
}

func (s *Store) release(sn *snapshot) {
	s.mmu.Lock()
	sn.refs--
	last := sn.refs == 0
	s.mmu.Unlock()
	if last {
		sn.txn.Discard()
		sn.unpin()
		s.live.Done()
	}
}

// view runs fn on the current snapshot.
func (s *Store) view(fn func(txn *badger.Txn, m meta) error) error {
	return s.viewSnapshot(func(sn *snapshot) error { return fn(sn.txn, sn.m) })
}

// viewSnapshot runs fn on the current snapshot, head included.
func (s *Store) viewSnapshot(fn func(sn *snapshot) error) error {
	sn := s.acquire()
	if sn == nil {
		return badger.ErrDBClosed
	}
	defer s.release(sn)
	return fn(sn)
}

// lowerHead makes the next head view's bound at most the newest of ps, items stored in Badger but not given to
// the head.
func (s *Store) lowerHead(ps [][]pos) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	for _, batch := range ps {
		for _, p := range batch {
			if p != (pos{}) && comparePos(p, s.lower) < 0 {
				s.lower = p
			}
		}
	}
}

// Close releases the store, after its write in flight and its reads in progress; a store opened by Open alone
// closes its database too.
func (s *Store) Close() error {
	s.wmu.Lock()
	s.settle()
	s.closed.Store(true)
	s.wmu.Unlock()
	s.mmu.Lock()
	sn := s.snap
	s.snap = nil
	s.mmu.Unlock()
	if sn != nil {
		s.release(sn)
	}
	s.live.Wait()
	s.owner.forget(s)
	if s.private {
		return s.owner.Close()
	}
	return nil
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
	err := s.viewSnapshot(func(sn *snapshot) error {
		txn, m := sn.txn, sn.m
		if p, v, ok := sn.head.get(messageID); ok {
			if p.ts() < m.floor() {
				return ErrNotFound
			}
			var buf []byte
			v.dict = s.dict.Load()
			rec, err := v.record(&buf)
			if err == nil {
				out, err = decodeItem(rec)
			}
			return err
		}
		if s.readBadger != nil {
			s.readBadger()
		}
		p, ok, err := lookupPos(txn, msgIDKey(s.box, messageID))
		if err != nil {
			return err
		}
		if !ok || p.ts() < m.floor() {
			return ErrNotFound
		}
		out, err = readItem(txn, s.box, p, s.dict.Load())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("get %q: %w", messageID, err)
	}
	return out, nil
}

// lookupPos reads the position a message-id key holds.
func lookupPos(txn *badger.Txn, key []byte) (pos, bool, error) {
	var p pos
	it, err := txn.Get(key)
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

func readItem(txn *badger.Txn, b box, p pos, dict *s2.Dict) (*mailboxv1.MailboxItem, error) {
	it, err := txn.Get(b.itemKey(p))
	if err != nil {
		return nil, fmt.Errorf("read item: %w", err)
	}
	var out *mailboxv1.MailboxItem
	err = it.Value(func(v []byte) error {
		var buf []byte
		rec, err := itemValue{v, it.UserMeta(), dict}.record(&buf)
		if err != nil {
			return err
		}
		out, err = decodeItem(rec)
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
// empty for the caller to fill. Everything comes from the counters and bounds that writes and retention passes
// keep (meta), as of the last durable one: Stats reads no key and never waits for a write.
func (s *Store) Stats(ctx context.Context) (*mailboxv1.MailboxStats, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mmu.Lock()
	m, closed := s.m, s.snap == nil
	s.mmu.Unlock()
	if closed {
		return nil, fmt.Errorf("stats: %w", badger.ErrDBClosed)
	}
	st := &mailboxv1.MailboxStats{TotalEvents: m.events, TotalBytes: m.bytes}
	if m.newest >= m.oldest {
		st.OldestEvent = timestamppb.New(time.UnixMilli(m.oldest))
		st.NewestEvent = timestamppb.New(time.UnixMilli(m.newest))
	}
	return st, nil
}

// setBounds finds oldest and newest of mailbox b in txn: the first live key at either end of its primary order.
func (m *meta) setBounds(txn *badger.Txn, b box) {
	m.oldest, m.newest = math.MaxInt64, math.MinInt64
	floor := m.floor()
	for _, reverse := range []bool{false, true} {
		it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: false, Reverse: reverse, Prefix: b.itemPrefix()})
		seek := b.itemPrefix()
		if reverse {
			seek = b.oldestFrom(floor)
		}
		it.Seek(seek)
		if it.Valid() {
			if ts := posOfItem(it.Item().Key()).ts(); ts >= floor {
				if reverse {
					m.oldest = ts
				} else {
					m.newest = ts
				}
			}
		}
		it.Close()
	}
	if m.oldest > m.newest {
		m.oldest, m.newest = math.MaxInt64, math.MinInt64
	}
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
