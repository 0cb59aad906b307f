package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	badger "github.com/dgraph-io/badger/v4"
)

// Peer recovery (docs/architecture.md#peer-recovery) copies one mailbox's keys from a runner's database into
// another's. Everything a mailbox is lives under its number (keys.go): its items, message ids and posting blocks,
// and the keys that make the rest of its state, the counters, floor and widest span ('!meta'), the compression
// dictionary ('!dict'), and those of this file, the stored positions it was seeded with ('!seed') and how its
// history was recovered ('!recovery'). So a copy of those keys read at one timestamp (Snapshot), put under the
// receiver's own number, is the same mailbox: the same queries, pages, stats and retention floor, and the next
// write takes the next sequence number the source would have. Keys below the floor that a sweep has not removed
// yet come along and are hidden by the same floor; the receiver's sweep removes them.
//
// The receiver writes the copy under a number of its own that no catalog entry names (Import), so nothing opens
// it as a mailbox while it is partial, and a crash leaves either the import record (resume from its cursor, or
// Abort) or, once Finish has committed, the whole copy in the catalog: never a mailbox with holes.

func (b box) seedKey() []byte { return b.key([]byte("!seed")...) }

func (b box) recoveryKey() []byte { return b.key([]byte("!recovery")...) }

func importKey(id string) []byte { return append(sysBox.key('i'), id...) } // -> box, snapshot id, cursor

// Entry is one key of a mailbox as a copy carries it: the key without the mailbox's number, its value and Badger's
// user meta byte (how a record is encoded).
type Entry struct {
	Key, Value []byte
	Meta       byte
}

// Position is where a mailbox's stored history of one topic-partition ends: the offset after the last record
// stored.
type Position struct {
	Topic     string
	Partition int32
	Next      int64
}

// Recovery is how a mailbox's history came to be, kept with the mailbox (and copied with it).
type Recovery struct {
	// Source is the mailbox copied from; empty when none was.
	Source string `json:"source,omitempty"`
	// Copied: the mailbox was seeded from Source's copy.
	Copied bool `json:"copied,omitempty"`
	// Incomplete: the history has a gap at its start, the mailbox (or the one it was copied from) having been
	// built from Kafka when an earlier copy of it existed and could not be had.
	Incomplete bool `json:"incomplete,omitempty"`
	// Bytes and Events copied.
	Bytes  int64 `json:"bytes,omitempty"`
	Events int64 `json:"events,omitempty"`
	// When the copy (or the fall back to Kafka) started and ended.
	Started  time.Time `json:"started,omitzero"`
	Finished time.Time `json:"finished,omitzero"`
}

// Snapshot is a mailbox's keys as of one read timestamp, pinned until Close; it outlives the store it was taken
// from (it holds a transaction of the database, not the store's), but not the database.
type Snapshot struct {
	txn    *badger.Txn
	unpin  func()
	box    box
	events int64
}

// Snapshot reads the store as of its last applied commit: everything a Write that returned has stored.
func (s *Store) Snapshot() (*Snapshot, error) {
	s.mmu.Lock()
	defer s.mmu.Unlock()
	if s.snap == nil {
		return nil, fmt.Errorf("snapshot: %w", badger.ErrDBClosed)
	}
	ts := s.applied
	return &Snapshot{txn: s.db.NewTransactionAt(ts, false), unpin: s.owner.pin(ts), box: s.box, events: s.m.events}, nil
}

// Events is how many events the snapshot holds.
func (sn *Snapshot) Events() int64 { return sn.events }

// Next returns the entries after key after (nil: from the first), in key order, until their keys and values pass
// maxBytes (at least one entry); more is false once the last key is among them.
func (sn *Snapshot) Next(after []byte, maxBytes int) (entries []Entry, more bool, err error) {
	it := sn.txn.NewIterator(badger.IteratorOptions{Prefix: sn.box[:]})
	defer it.Close()
	it.Seek(sn.box.key(after...))
	size := 0
	for ; it.Valid(); it.Next() {
		item := it.Item()
		k := item.Key()[boxLen:]
		if after != nil && bytes.Equal(k, after) {
			continue
		}
		if size >= maxBytes && len(entries) > 0 {
			return entries, true, nil
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return nil, false, fmt.Errorf("snapshot: read %q: %w", k, err)
		}
		entries = append(entries, Entry{Key: bytes.Clone(k), Value: v, Meta: item.UserMeta()})
		size += len(k) + len(v)
	}
	return entries, false, nil
}

// Close lets the snapshot's versions go.
func (sn *Snapshot) Close() {
	sn.txn.Discard()
	sn.unpin()
}

// Import is a copy of a mailbox being received into the database: its entries go under a number of their own,
// and the cursor (the last key received) is committed with them, so a copy cut at any point resumes after the
// last key that is durable.
type Import struct {
	db       *DB
	id       string
	box      box
	snapshot string // the source's snapshot id; empty until the first Put
	cursor   []byte // the last key sent to Badger

	// Puts are pipelined: each commit is sent without waiting for the one before, at most importInFlight at once,
	// since Badger applies and syncs commits in the order they are sent (one fsync for those it finds queued),
	// so a cursor that is durable has every key up to it durable too. fmu guards durable, the cursor of the last
	// commit known durable, and failed, the first commit error; flights holds a token per commit in flight.
	fmu     sync.Mutex
	durable []byte
	failed  error
	flights chan struct{}
}

// importInFlight bounds an import's commits in flight, and so the memory its chunks hold.
const importInFlight = 8

// Import returns mailbox id's import in progress, or starts one. While it is in progress the mailbox's own store
// (if any) is as it was; Finish replaces it with the copy.
func (db *DB) Import(id string) (*Import, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.closed {
		return nil, fmt.Errorf("import %q: %w", id, badger.ErrDBClosed)
	}
	ts, unpin := db.pinLatest()
	defer unpin()
	txn := db.bdb.NewTransactionAt(ts, false)
	defer txn.Discard()
	v, err := getValue(txn, importKey(id))
	if err == nil {
		im, err := decodeImport(v)
		if err != nil {
			return nil, fmt.Errorf("import %q: %w", id, err)
		}
		im.db, im.id, im.durable, im.flights = db, id, im.cursor, make(chan struct{}, importInFlight)
		return im, nil
	}
	if !errors.Is(err, badger.ErrKeyNotFound) {
		return nil, fmt.Errorf("import %q: %w", id, err)
	}
	if db.last == 1<<32-1 {
		return nil, fmt.Errorf("import %q: every mailbox number is used", id)
	}
	im := &Import{db: db, id: id, box: boxOf(db.last + 1), flights: make(chan struct{}, importInFlight)}
	err = db.commit(func(w *badger.Txn) error {
		if err := w.Set(counterKey, im.box[:]); err != nil {
			return err
		}
		return w.Set(importKey(id), im.encode())
	})
	if err != nil {
		return nil, fmt.Errorf("import %q: %w", id, err)
	}
	db.last = im.box.num()
	return im, nil
}

// Importing says if mailbox id has an import in progress.
func (db *DB) Importing(id string) (bool, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.closed {
		return false, fmt.Errorf("import %q: %w", id, badger.ErrDBClosed)
	}
	ts, unpin := db.pinLatest()
	defer unpin()
	txn := db.bdb.NewTransactionAt(ts, false)
	defer txn.Discard()
	_, err := txn.Get(importKey(id))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, nil
	}
	return err == nil, err
}

func (im *Import) encode() []byte { return encodeImport(im.box, im.snapshot, im.cursor) }

func encodeImport(b box, snapshot string, cursor []byte) []byte {
	v := append([]byte{}, b[:]...)
	v = binary.AppendUvarint(v, uint64(len(snapshot)))
	v = append(v, snapshot...)
	return append(v, cursor...)
}

func decodeImport(v []byte) (*Import, error) {
	if len(v) < boxLen {
		return nil, fmt.Errorf("%w: import record", errCorruptRecord)
	}
	im := &Import{}
	copy(im.box[:], v)
	n, w := binary.Uvarint(v[boxLen:])
	if w <= 0 || uint64(len(v)-boxLen-w) < n {
		return nil, fmt.Errorf("%w: import record", errCorruptRecord)
	}
	rest := v[boxLen+w:]
	im.snapshot = string(rest[:n])
	if c := rest[n:]; len(c) > 0 {
		im.cursor = bytes.Clone(c)
	}
	return im, nil
}

// Snapshot is the source snapshot the import receives, empty before its first entry.
func (im *Import) Snapshot() string { return im.snapshot }

// Cursor is the last key received (nil: none yet); the copy resumes after it.
func (im *Import) Cursor() []byte { return im.cursor }

// Put sends entries, the next ones of snapshot after the cursor in key order, to be stored, and moves the cursor
// to the last of them; they are durable once a later Put or Finish has returned (Sync). Entries of another
// snapshot than the one begun, or out of order, are refused: a copy must come from one snapshot to be a state the
// source was in (Abort and start over). After a failed commit, Put fails and the cursor is back at the last
// durable one.
func (im *Import) Put(snapshot string, entries []Entry) error {
	if err := im.check(); err != nil {
		return err
	}
	if im.snapshot != "" && snapshot != im.snapshot {
		return fmt.Errorf("import %q: entries of snapshot %q, not of %q", im.id, snapshot, im.snapshot)
	}
	prev := im.cursor
	for i, e := range entries {
		if len(e.Key) == 0 || (prev != nil && bytes.Compare(e.Key, prev) <= 0) {
			return fmt.Errorf("import %q: entry %d: key %q not after %q", im.id, i, e.Key, prev)
		}
		prev = e.Key
	}
	for len(entries) > 0 {
		n, err := im.put(snapshot, entries)
		if err != nil {
			return fmt.Errorf("import %q: %w", im.id, err)
		}
		entries = entries[n:]
	}
	return nil
}

// check fails once a commit has failed, first waiting for those in flight, and puts the cursor back where it is
// durable.
func (im *Import) check() error {
	im.fmu.Lock()
	failed := im.failed
	im.fmu.Unlock()
	if failed == nil {
		return nil
	}
	if err := im.Sync(); err == nil {
		return failed
	}
	return fmt.Errorf("import %q: %w", im.id, failed)
}

// Sync waits for the commits in flight and says if one failed; the cursor is then the last durable one.
func (im *Import) Sync() error {
	for range cap(im.flights) {
		im.flights <- struct{}{}
	}
	for range cap(im.flights) {
		<-im.flights
	}
	im.fmu.Lock()
	defer im.fmu.Unlock()
	if im.failed != nil {
		im.cursor = bytes.Clone(im.durable)
		return fmt.Errorf("import %q: %w", im.id, im.failed)
	}
	return nil
}

// put sends the commit of the first of entries, as many as one transaction takes, with the cursor after them.
func (im *Import) put(snapshot string, entries []Entry) (int, error) {
	txn := im.db.bdb.NewTransactionAt(im.db.ts.Load(), true)
	n := 0
	for _, e := range entries {
		err := txn.SetEntry(badger.NewEntry(im.box.key(e.Key...), e.Value).WithMeta(e.Meta))
		if errors.Is(err, badger.ErrTxnTooBig) && n > 0 {
			break
		}
		if err != nil {
			txn.Discard()
			return 0, err
		}
		n++
	}
	cursor := bytes.Clone(entries[n-1].Key)
	if err := txn.Set(importKey(im.id), encodeImport(im.box, snapshot, cursor)); err != nil {
		txn.Discard()
		return 0, err
	}
	im.flights <- struct{}{}
	// With a callback Badger discards the transaction itself once the commit is done.
	err := txn.CommitAt(im.db.nextTs(), func(err error) {
		im.fmu.Lock()
		if err != nil && im.failed == nil {
			im.failed = err
		} else if err == nil && im.failed == nil {
			im.durable = cursor
		}
		im.fmu.Unlock()
		<-im.flights
	})
	if err != nil {
		return 0, err
	}
	im.snapshot, im.cursor = snapshot, cursor
	return n, nil
}

// Finish makes the copy mailbox id's store, in one commit: with positions, the source's stored positions as of
// its snapshot, as the stored positions it starts from (Store.Seed), and rec as its recovery record (an
// incomplete history of the source stays incomplete). The mailbox's own store, which must not be open, is dropped.
func (im *Import) Finish(positions []Position, rec Recovery) error {
	if err := im.Sync(); err != nil {
		return err
	}
	db := im.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.closed {
		return fmt.Errorf("finish import %q: %w", im.id, badger.ErrDBClosed)
	}
	if _, open := db.stores[im.id]; open {
		return fmt.Errorf("finish import %q: its store is open", im.id)
	}
	old, hadOld := db.catalog[im.id]
	seed, err := json.Marshal(positions)
	if err != nil {
		return fmt.Errorf("finish import %q: %w", im.id, err)
	}
	err = db.commit(func(txn *badger.Txn) error {
		if v, err := getValue(txn, im.box.recoveryKey()); err == nil {
			var src Recovery
			if json.Unmarshal(v, &src) == nil && src.Incomplete {
				rec.Incomplete = true
			}
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		r, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		for _, kv := range [][2][]byte{{im.box.seedKey(), seed}, {im.box.recoveryKey(), r}, {catalogKey(im.id), im.box[:]}} {
			if err := txn.Set(kv[0], kv[1]); err != nil {
				return err
			}
		}
		if err := txn.Delete(importKey(im.id)); err != nil {
			return err
		}
		if hadOld {
			return txn.Set(dropKey(old), nil)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("finish import %q: %w", im.id, err)
	}
	db.catalog[im.id] = im.box
	if hadOld {
		db.startDrop(old)
	}
	return nil
}

// Abort ends the import and drops what it received, so the next Import of the mailbox starts from scratch.
func (im *Import) Abort() error {
	_ = im.Sync() // what it failed on is dropped with the rest
	db := im.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.closed {
		return fmt.Errorf("abort import %q: %w", im.id, badger.ErrDBClosed)
	}
	err := db.commit(func(txn *badger.Txn) error {
		if err := txn.Delete(importKey(im.id)); err != nil {
			return err
		}
		return txn.Set(dropKey(im.box), nil)
	})
	if err != nil {
		return fmt.Errorf("abort import %q: %w", im.id, err)
	}
	db.startDrop(im.box)
	return nil
}

// Seed is the stored positions the mailbox was seeded with by a copy, nil if it was not: its ingest starts each
// partition at least there.
func (s *Store) Seed() []Position { return slices.Clone(s.seed) }

// Recovery is the mailbox's recovery record (zero: built from Kafka with nothing to copy from).
func (s *Store) Recovery() Recovery {
	s.mmu.Lock()
	defer s.mmu.Unlock()
	return s.recovery
}

// SetRecovery records rec as how the mailbox's history came to be, durably.
func (s *Store) SetRecovery(rec Recovery) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.ready(); err != nil {
		return fmt.Errorf("set recovery: %w", err)
	}
	// After the writes in flight: the record is under a key no write touches, committed on its own.
	s.settle()
	txn, done, err := s.begin(true)
	if err != nil {
		return fmt.Errorf("set recovery: %w", err)
	}
	defer done()
	if err := txn.Set(s.box.recoveryKey(), v); err != nil {
		return fmt.Errorf("set recovery: %w", err)
	}
	ts := s.owner.nextTs()
	if err := txn.CommitAt(ts, nil); err != nil {
		return fmt.Errorf("set recovery: %w", err)
	}
	s.mmu.Lock()
	s.recovery = rec
	s.mmu.Unlock()
	// Reads from now on (a copy's snapshot among them) see the record.
	s.publish(s.meta(), ts)
	return nil
}

// loadRecovery reads the seed and the recovery record of mailbox b in txn.
func (s *Store) loadRecovery(txn *badger.Txn) error {
	for _, kv := range []struct {
		key []byte
		to  any
	}{{s.box.seedKey(), &s.seed}, {s.box.recoveryKey(), &s.recovery}} {
		v, err := getValue(txn, kv.key)
		if errors.Is(err, badger.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if err := json.Unmarshal(v, kv.to); err != nil {
			return fmt.Errorf("%w: %s: %v", errCorruptRecord, kv.key[boxLen:], err)
		}
	}
	return nil
}
