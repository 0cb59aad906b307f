package store

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// DBOptions configure a runner's one Badger database, which every mailbox's Store shares.
type DBOptions struct {
	Dir      string // data directory (created 0700); ignored when InMemory
	InMemory bool   // for unit tests
	// Memory sizes what Badger holds in memory for the whole database: MemoryFor(budget, 1).
	Memory Memory
	Logger *slog.Logger // nil = slog.Default()

	// Test knobs, so that GC finds whole value-log files and compaction starts after two L0 tables in a small
	// store: 128 MiB and Badger's default otherwise.
	vlogFileSize int64
	l0Tables     int
	// holdDrops leaves a drop's keys for the next OpenDB, as a crash right after Drop returned would.
	holdDrops bool
	// headBytes, when not zero, is what the heads of the database's stores may hold together (head.go; below
	// zero: nothing), instead of one memtable's size.
	headBytes int64
	// gcEvery, when not zero, is how often the database runs value-log GC of its own accord (the constant
	// gcEvery otherwise).
	gcEvery time.Duration
}

// DB is a runner's store database: one Badger holding every mailbox (keys.go), so that opening a mailbox reads a
// few keys instead of opening a Badger of its own (3 ms of page faults each, 14 MiB of memtables and caches at
// the least, compactors and a value log per mailbox), and memory is one budget.
//
// Badger runs in managed mode: the store picks the timestamps. A read transaction of an unmanaged Badger waits,
// when opened, for every commit already sent to be applied and fsynced, whichever mailbox sent it; a mailbox's
// reads would wait behind another mailbox's batch. Here every commit takes the next timestamp (nextTs) and a
// mailbox reads at the timestamp of its own last applied commit, which nothing of its own in flight can change:
// what other mailboxes have in flight is under other keys, so the read never waits and sees a whole state of its
// mailbox. Versions that no open reader may need are let go by the discard timestamp (pins).
type DB struct {
	opts DBOptions
	log  *slog.Logger
	bdb  *badger.DB

	// ts is the last commit timestamp handed out.
	ts atomic.Uint64

	// pmu guards pinned: the read timestamps in use, with their counts. Compaction may drop a version only once
	// no reader at or above its timestamp and below the next version's is left, so the discard timestamp is the
	// lowest pinned (or ts, with none).
	pmu    sync.Mutex
	pinned map[uint64]int

	// mu guards the catalog, the stores open and closed, and serializes the database's own writes (catalog,
	// counter, drops) so that their timestamps are applied in order.
	mu      sync.Mutex
	catalog map[string]box // mailboxes holding a store
	last    uint32         // the last mailbox number handed out
	stores  map[string]*Store
	closed  bool
	// open is len(stores), for the head's share (headShare) without mu.
	open atomic.Int64

	// gc serializes value-log GC: one run at a time per database.
	gc chan struct{}
	// bg runs the drops and the discard timestamp's updates until Close cancels it.
	bgCtx  context.Context
	cancel context.CancelFunc
	bg     sync.WaitGroup
}

// The database's own keys, under mailbox number 0, which no mailbox gets.
var (
	sysBox     box
	versionKey = sysBox.key('v')
	counterKey = sysBox.key('n') // the last mailbox number handed out
)

func catalogKey(id string) []byte { return append(sysBox.key('c'), id...) } // -> box

func dropKey(b box) []byte { return append(sysBox.key('d'), b[:]...) } // a drop whose keys are not all deleted

// dbLayout is the layout version of a database (keys.go). Stores written before it (a Badger per mailbox, keys
// without a mailbox number) have no version key: OpenDB refuses them with ErrOldLayout.
const dbLayout = 1

// discardEvery is how often the discard timestamp follows the readers.
const discardEvery = time.Second

// gcEvery is how often the database runs value-log GC of its own accord, besides after a drop's deletes and a
// retention sweep. Those runs come before compaction has merged their tombstones with what they delete, which is
// what tells GC where the garbage is, so they find at most what earlier deletes left: without this a dropped
// mailbox's envelopes (a rebuild's old copy) kept their disk space until some mailbox's retention next removed
// something, forever in a runner whose mailboxes keep everything. A run that finds no file half garbage costs a
// look at Badger's discard counts, kept in memory.
const gcEvery = 5 * time.Minute

// OpenDB opens (or creates) the database described by opts. A damaged file is an error wrapping ErrDamaged, a
// database written in an older layout one wrapping ErrOldLayout. Drops cut short by a crash resume in the
// background.
func OpenDB(opts DBOptions) (*DB, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	bo := badger.DefaultOptions(opts.Dir).
		WithLogger(badgerLogger{log}).
		// Each Store writes with one writer and mailboxes never write each other's keys, so Badger's conflict
		// tracking is pure overhead.
		WithDetectConflicts(false).
		// Every commit is fsynced: a returned Write must survive a crash of the process or the machine, since
		// the Kafka offsets covering it are committed next. (An explicit DB.Sync after the commit would spare
		// retention's deletes their fsyncs, but it syncs only the newest value-log file: a commit that rotated
		// the log would leave its values unsynced in the previous one.)
		WithSyncWrites(true).
		WithNumCompactors(2).
		WithMetricsEnabled(false)
	bo = opts.Memory.apply(bo)
	if opts.InMemory {
		bo = bo.WithDir("").WithValueDir("").WithInMemory(true).WithMemTableSize(16 << 20).WithBlockCacheSize(8 << 20)
	} else {
		// Envelopes (about 1 KiB) go to the value log; the LSM tree holds only keys and small values. (In memory
		// there is no value log, so values stay in the tree.)
		bo = bo.WithValueThreshold(256).
			// Value-log GC rewrites a whole file once half of it is garbage: files of 128 MiB (not Badger's
			// 1 GiB) let retention give space back in steps.
			WithValueLogFileSize(cmp.Or(opts.vlogFileSize, 128<<20))
		if opts.l0Tables > 0 {
			bo = bo.WithNumLevelZeroTables(opts.l0Tables)
		}
		if opts.Dir == "" {
			return nil, errors.New("open store database: Dir is empty")
		}
		if err := os.MkdirAll(opts.Dir, dirMode); err != nil {
			return nil, fmt.Errorf("open store database: %w", err)
		}
		if err := fixModes(opts.Dir); err != nil {
			return nil, fmt.Errorf("open store database: %w", err)
		}
		if err := checkTables(opts.Dir, bo); err != nil {
			return nil, fmt.Errorf("open store database %s: %w", opts.Dir, err)
		}
		if err := checkValueLogs(opts.Dir, 2*bo.ValueLogFileSize); err != nil {
			return nil, fmt.Errorf("open store database %s: %w", opts.Dir, err)
		}
	}
	bdb, err := badger.OpenManaged(bo)
	if err != nil {
		return nil, fmt.Errorf("open store database %s: %w", opts.Dir, err)
	}
	db := &DB{
		opts: opts, log: log, bdb: bdb,
		pinned: map[uint64]int{}, catalog: map[string]box{}, stores: map[string]*Store{},
		gc: make(chan struct{}, 1),
	}
	db.ts.Store(bdb.MaxVersion())
	// Nothing reads yet, so every version a newer one hides may go: without this the compactions Badger starts
	// at open would run at discard timestamp 0 until followReaders' first tick, merging tombstones with what they
	// delete while keeping both, and value-log GC would find no garbage there until a later compaction.
	bdb.SetDiscardTs(bdb.MaxVersion())
	drops, err := db.load()
	if err == nil {
		err = db.fixModes()
	}
	if err != nil {
		_ = bdb.Close()
		return nil, fmt.Errorf("open store database %s: %w", opts.Dir, err)
	}
	db.bgCtx, db.cancel = context.WithCancel(context.Background())
	db.bg.Add(2)
	go db.followReaders()
	go db.collectPeriodically()
	for _, b := range drops {
		db.startDrop(b)
	}
	return db, nil
}

// load checks the layout version (writing it into a new database) and reads the catalog, the counter and the
// drops in progress.
func (db *DB) load() ([]box, error) {
	ts, unpin := db.pinLatest()
	defer unpin()
	txn := db.bdb.NewTransactionAt(ts, false)
	defer txn.Discard()
	v, err := getValue(txn, versionKey)
	switch {
	case errors.Is(err, badger.ErrKeyNotFound):
		it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: false})
		it.Rewind()
		used := it.Valid()
		it.Close()
		if used {
			return nil, fmt.Errorf("no layout version: %w", ErrOldLayout)
		}
		if err := db.commit(func(w *badger.Txn) error { return w.Set(versionKey, []byte{dbLayout}) }); err != nil {
			return nil, fmt.Errorf("write layout version: %w", err)
		}
	case err != nil:
		return nil, fmt.Errorf("read layout version: %w", err)
	case len(v) != 1 || v[0] > dbLayout:
		return nil, fmt.Errorf("unknown layout version %v", v)
	case v[0] < dbLayout:
		return nil, fmt.Errorf("layout version %d: %w", v[0], ErrOldLayout)
	}
	if v, err := getValue(txn, counterKey); err == nil && len(v) == boxLen {
		db.last = binary.BigEndian.Uint32(v)
	} else if !errors.Is(err, badger.ErrKeyNotFound) {
		return nil, fmt.Errorf("read mailbox counter: %v %w", v, cmp.Or(err, errCorruptRecord))
	}
	prefix := sysBox.key('c')
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
	for it.Rewind(); it.Valid(); it.Next() {
		var b box
		err := it.Item().Value(func(v []byte) error {
			if len(v) != boxLen {
				return errCorruptRecord
			}
			copy(b[:], v)
			return nil
		})
		if err != nil {
			it.Close()
			return nil, fmt.Errorf("read catalog: %w", err)
		}
		db.catalog[string(it.Item().Key()[len(prefix):])] = b
	}
	it.Close()
	var drops []box
	prefix = sysBox.key('d')
	it = txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: false})
	for it.Rewind(); it.Valid(); it.Next() {
		var b box
		copy(b[:], it.Item().Key()[len(prefix):])
		drops = append(drops, b)
	}
	it.Close()
	return drops, nil
}

func getValue(txn *badger.Txn, key []byte) ([]byte, error) {
	it, err := txn.Get(key)
	if err != nil {
		return nil, err
	}
	return it.ValueCopy(nil)
}

// nextTs is the timestamp of a new commit.
func (db *DB) nextTs() uint64 { return db.ts.Add(1) }

// commit runs fill in a new transaction, reading the latest state, and commits it durably. It is for the
// database's own keys, with mu held (or before OpenDB returns).
func (db *DB) commit(fill func(txn *badger.Txn) error) error {
	ts, unpin := db.pinLatest()
	defer unpin()
	txn := db.bdb.NewTransactionAt(ts, true)
	defer txn.Discard()
	if err := fill(txn); err != nil {
		return err
	}
	return txn.CommitAt(db.nextTs(), nil)
}

// pin keeps the versions a reader at ts may read, until the returned function is called.
func (db *DB) pin(ts uint64) func() {
	db.pmu.Lock()
	db.pinned[ts]++
	db.pmu.Unlock()
	return func() {
		db.pmu.Lock()
		if db.pinned[ts]--; db.pinned[ts] == 0 {
			delete(db.pinned, ts)
		}
		db.pmu.Unlock()
	}
}

// pinLatest pins the last timestamp handed out. Reading at it sees every commit of a mailbox that has nothing
// in flight (a mailbox just opened, the database's own keys under mu), whatever other mailboxes are committing.
func (db *DB) pinLatest() (uint64, func()) {
	db.pmu.Lock()
	ts := db.ts.Load()
	db.pmu.Unlock()
	return ts, db.pin(ts)
}

// discardTs is the highest timestamp at or below which compaction may drop versions that a newer one hides:
// the lowest one pinned, and with none the last handed out (a reader pins nothing lower: a store's reads are at
// or above its current snapshot's, which stays pinned while it is open, and pinLatest reads ts under pmu).
func (db *DB) discardTs() uint64 {
	db.pmu.Lock()
	defer db.pmu.Unlock()
	low := db.ts.Load()
	for ts := range db.pinned {
		low = min(low, ts)
	}
	return low
}

// followReaders moves the discard timestamp up behind the readers, so compaction drops overwritten and deleted
// versions (meta, trimmed posting blocks, swept and dropped keys) and value-log GC finds their space.
func (db *DB) followReaders() {
	defer db.bg.Done()
	t := time.NewTicker(discardEvery)
	defer t.Stop()
	for {
		select {
		case <-db.bgCtx.Done():
			return
		case <-t.C:
			db.bdb.SetDiscardTs(db.discardTs())
		}
	}
}

// collectPeriodically runs value-log GC every gcEvery until Close.
func (db *DB) collectPeriodically() {
	defer db.bg.Done()
	t := time.NewTicker(cmp.Or(db.opts.gcEvery, gcEvery))
	defer t.Stop()
	for {
		select {
		case <-db.bgCtx.Done():
			return
		case <-t.C:
			db.collectGarbage(db.bgCtx)
		}
	}
}

// Open opens (or creates) the store of mailbox opts.ID. Dir, InMemory and Memory must be left zero: they are
// the database's. A mailbox's store is open at most once at a time. Opening reads a few keys of the mailbox; a
// new mailbox gets its number in a commit that its first write waits for, not Open.
func (db *DB) Open(opts Options) (*Store, error) {
	if opts.Dir != "" || opts.InMemory || opts.Memory != (Memory{}) {
		return nil, fmt.Errorf("open store %q: Dir, InMemory and Memory belong to the database", opts.ID)
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.closed {
		return nil, fmt.Errorf("open store %q: %w", opts.ID, badger.ErrDBClosed)
	}
	if _, open := db.stores[opts.ID]; open {
		return nil, fmt.Errorf("open store %q: already open", opts.ID)
	}
	b, known := db.catalog[opts.ID]
	var created *flight
	if !known {
		if db.last == math.MaxUint32 {
			return nil, fmt.Errorf("open store %q: every mailbox number is used", opts.ID)
		}
		b = boxOf(db.last + 1)
		var err error
		if created, err = db.create(opts.ID, b); err != nil {
			return nil, fmt.Errorf("open store %q: %w", opts.ID, err)
		}
		db.last = b.num()
		db.catalog[opts.ID] = b
	}
	s, err := newStore(db, opts, b)
	if err != nil {
		return nil, err
	}
	s.created = created
	db.stores[opts.ID] = s
	db.open.Store(int64(len(db.stores)))
	return s, nil
}

// create sends the commit of a new mailbox's catalog entry and number without waiting for it (Badger writes
// and fsyncs it with whatever else it has queued, so opening a thousand new mailboxes costs a few fsyncs, not a
// thousand); the mailbox's first write waits for it.
func (db *DB) create(id string, b box) (*flight, error) {
	txn := db.bdb.NewTransactionAt(db.ts.Load(), true)
	defer txn.Discard()
	if err := txn.Set(catalogKey(id), b[:]); err != nil {
		return nil, err
	}
	if err := txn.Set(counterKey, b[:]); err != nil {
		return nil, err
	}
	f := &flight{done: make(chan struct{})}
	if err := txn.CommitAt(db.nextTs(), func(err error) {
		if err != nil {
			f.err = fmt.Errorf("create mailbox %q: %w", id, err)
		}
		close(f.done)
	}); err != nil {
		return nil, err
	}
	return f, nil
}

// headShare is what one open store's head may hold: the database's head bytes, as much as one memtable holds
// (the head keeps the newest write groups, about what Badger's current memtable holds of them), divided among
// its open stores. A store takes its share when it publishes, so an idle one keeps what it had until its next
// write or its close.
func (db *DB) headShare() int64 {
	total := db.opts.headBytes
	switch {
	case total < 0:
		return 0
	case total == 0 && db.opts.Memory.MemTableSize > 0:
		total = db.opts.Memory.MemTableSize
	case total == 0:
		total = defaultHeadBytes
	}
	return total / max(db.open.Load(), 1)
}

// forget is called by a Store of db once it is closed.
func (db *DB) forget(s *Store) {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.stores[s.opts.ID] == s {
		delete(db.stores, s.opts.ID)
		db.open.Store(int64(len(db.stores)))
	}
}

// Drop deletes mailbox id's data: from its return a new Open of id starts empty, under a new number. The catalog
// entry goes in one commit; the mailbox's keys are deleted in the background, in chunks (a drop cut short
// resumes on the next OpenDB), and value-log GC gives their space back once compaction has merged the deletes
// with what they delete (gcEvery). An import of id in progress (copy.go) is dropped with it. Its store must not
// be open; dropping a mailbox holding no store does nothing.
func (db *DB) Drop(id string) error {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.closed {
		return fmt.Errorf("drop store %q: %w", id, badger.ErrDBClosed)
	}
	if _, open := db.stores[id]; open {
		return fmt.Errorf("drop store %q: it is open", id)
	}
	var drops []box
	if b, ok := db.catalog[id]; ok {
		drops = append(drops, b)
	}
	// An import in progress (copy.go) goes too: the mailbox's next open starts from nothing.
	err := db.commit(func(txn *badger.Txn) error {
		switch v, err := getValue(txn, importKey(id)); {
		case err == nil:
			im, err := decodeImport(v)
			if err != nil {
				return err
			}
			drops = append(drops, im.box)
			if err := txn.Delete(importKey(id)); err != nil {
				return err
			}
		case !errors.Is(err, badger.ErrKeyNotFound):
			return err
		}
		if len(drops) == 0 {
			return nil
		}
		if err := txn.Delete(catalogKey(id)); err != nil {
			return err
		}
		for _, b := range drops {
			if err := txn.Set(dropKey(b), nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("drop store %q: %w", id, err)
	}
	delete(db.catalog, id)
	for _, b := range drops {
		db.startDrop(b)
	}
	return nil
}

// dropChunk is how many keys one of a drop's transactions deletes at most (fewer if Badger finds it too big).
const dropChunk = 4096

func (db *DB) startDrop(b box) {
	if db.opts.holdDrops {
		return
	}
	db.bg.Add(1)
	go func() {
		defer db.bg.Done()
		n, err := db.deleteBox(db.bgCtx, b)
		if err != nil {
			if db.bgCtx.Err() == nil {
				db.log.Error("drop: delete a mailbox's keys", "mailbox_number", b.num(), "deleted", n, "err", err)
			}
			return
		}
		db.log.Debug("drop: deleted a mailbox's keys", "mailbox_number", b.num(), "deleted", n)
		db.collectGarbage(db.bgCtx)
	}()
}

// deleteBox deletes every key of mailbox b, then its drop record. Nothing else writes b's keys any more, so one
// read of them at the latest timestamp finds them all.
func (db *DB) deleteBox(ctx context.Context, b box) (int, error) {
	ts, unpin := db.pinLatest()
	defer unpin()
	read := db.bdb.NewTransactionAt(ts, false)
	defer read.Discard()
	it := read.NewIterator(badger.IteratorOptions{Prefix: b[:], PrefetchValues: false})
	defer it.Close()
	deleted := 0
	var keys [][]byte
	flush := func() error {
		for len(keys) > 0 {
			n, err := db.deleteKeys(keys)
			if err != nil {
				return err
			}
			deleted += n
			keys = keys[n:]
		}
		return nil
	}
	for it.Rewind(); it.Valid(); it.Next() {
		keys = append(keys, it.Item().KeyCopy(nil))
		if len(keys) == dropChunk {
			if err := ctx.Err(); err != nil {
				return deleted, err
			}
			if err := flush(); err != nil {
				return deleted, err
			}
		}
	}
	if err := flush(); err != nil {
		return deleted, err
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.closed {
		return deleted, badger.ErrDBClosed
	}
	if err := db.commit(func(txn *badger.Txn) error { return txn.Delete(dropKey(b)) }); err != nil {
		return deleted, fmt.Errorf("end the drop: %w", err)
	}
	return deleted, nil
}

// deleteKeys deletes the first of keys in one transaction, as many as it takes, and says how many.
func (db *DB) deleteKeys(keys [][]byte) (int, error) {
	txn := db.bdb.NewTransactionAt(db.ts.Load(), true)
	defer txn.Discard()
	n := 0
	for _, k := range keys {
		if err := txn.Delete(k); errors.Is(err, badger.ErrTxnTooBig) && n > 0 {
			break
		} else if err != nil {
			return 0, fmt.Errorf("delete %x: %w", k, err)
		}
		n++
	}
	if err := txn.CommitAt(db.nextTs(), nil); err != nil {
		return 0, fmt.Errorf("commit deletes: %w", err)
	}
	return n, nil
}

// IDs lists the mailboxes holding a store (opened at least once and not dropped since), sorted.
func (db *DB) IDs() ([]string, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.closed {
		return nil, fmt.Errorf("list stores: %w", badger.ErrDBClosed)
	}
	return slices.Sorted(maps.Keys(db.catalog)), nil
}

// maxGCRounds bounds one GC run; each round rewrites at most one value-log file.
const maxGCRounds = 100

// collectGarbage runs Badger's value-log GC until it finds nothing more to rewrite, so deleted envelopes give
// their disk space back; one run at a time (a caller waits for the one running, then runs its own, which finds
// at once whatever that one left).
func (db *DB) collectGarbage(ctx context.Context) {
	if db.opts.InMemory {
		return
	}
	select {
	case db.gc <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-db.gc }()
	db.bdb.SetDiscardTs(db.discardTs())
	for range maxGCRounds {
		if ctx.Err() != nil {
			return
		}
		err := db.bdb.RunValueLogGC(0.5)
		if errors.Is(err, badger.ErrNoRewrite) || errors.Is(err, badger.ErrRejected) {
			return
		}
		if err != nil {
			db.log.Warn("value-log GC", "dir", db.opts.Dir, "err", err)
			return
		}
	}
}

func (db *DB) fixModes() error {
	if db.opts.InMemory {
		return nil
	}
	return fixModes(db.opts.Dir)
}

// Close closes the database. Stores of it still open are closed first, as their own Close would; drops in
// progress stop and resume on the next OpenDB.
func (db *DB) Close() error {
	db.mu.Lock()
	if db.closed {
		db.mu.Unlock()
		return nil
	}
	db.closed = true
	open := slices.Collect(maps.Values(db.stores))
	db.mu.Unlock()
	var errs []error
	for _, s := range open {
		errs = append(errs, s.Close())
	}
	db.cancel()
	db.bg.Wait()
	// Closing flushes the memtable and may compact the table it makes: at the discard timestamp of now, not of
	// followReaders' last tick, which may predate the last deletes (they would be merged and kept with what they
	// delete, their space not given back until a later compaction).
	db.bdb.SetDiscardTs(db.discardTs())
	if err := db.bdb.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close store database %s: %w", db.opts.Dir, err))
	} else {
		errs = append(errs, db.fixModes())
	}
	return errors.Join(errs...)
}
