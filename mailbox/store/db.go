package store

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// DBOptions configure a runner's one Badger database, which every mailbox's Store shares.
type DBOptions struct {
	Dir      string // data directory (created 0700); ignored when InMemory
	InMemory bool   // for unit tests
	// Memory sizes what Badger holds in memory for the whole database: MemoryFor(budget, 1).
	Memory Memory
	Logger *slog.Logger // nil = slog.Default()

	// Test knobs, as Options' (store.go).
	vlogFileSize int64
	l0Tables     int
}

// DB is a runner's store database: every mailbox's Store opened through it shares it.
type DB struct {
	opts DBOptions
	log  *slog.Logger

	mu     sync.Mutex
	stores map[string]*Store // open, by mailbox id
	closed bool
}

// OpenDB opens (or creates) the database described by opts. A damaged file is an error wrapping ErrDamaged, a
// database written in an older layout one wrapping ErrOldLayout.
func OpenDB(opts DBOptions) (*DB, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if !opts.InMemory {
		if opts.Dir == "" {
			return nil, errors.New("open store database: Dir is empty")
		}
		if err := os.MkdirAll(opts.Dir, dirMode); err != nil {
			return nil, fmt.Errorf("open store database: %w", err)
		}
	}
	return &DB{opts: opts, log: log, stores: map[string]*Store{}}, nil
}

// Open opens (or creates) the store of mailbox opts.ID. Dir, InMemory and Memory must be left zero: the
// database has its own. A mailbox's store is open at most once at a time.
func (db *DB) Open(opts Options) (*Store, error) {
	if opts.Dir != "" || opts.InMemory || opts.Memory != (Memory{}) {
		return nil, fmt.Errorf("open store %q: Dir, InMemory and Memory belong to the database", opts.ID)
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.closed {
		return nil, fmt.Errorf("open store %q: database closed", opts.ID)
	}
	if _, open := db.stores[opts.ID]; open {
		return nil, fmt.Errorf("open store %q: already open", opts.ID)
	}
	opts.InMemory = db.opts.InMemory
	if !opts.InMemory {
		opts.Dir = db.dir(opts.ID)
	}
	opts.Memory = db.opts.Memory
	opts.vlogFileSize, opts.l0Tables = db.opts.vlogFileSize, db.opts.l0Tables
	s, err := Open(opts)
	if err != nil {
		return nil, err
	}
	s.owner = db
	db.stores[opts.ID] = s
	return s, nil
}

func (db *DB) dir(id string) string { return filepath.Join(db.opts.Dir, url.PathEscape(id)) }

// closed is called by a Store of db once it is closed.
func (db *DB) forget(s *Store) {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.stores[s.opts.ID] == s {
		delete(db.stores, s.opts.ID)
	}
}

// Drop deletes mailbox id's data: a later Open of id starts empty. Its store must not be open.
func (db *DB) Drop(id string) error {
	db.mu.Lock()
	defer db.mu.Unlock()
	if _, open := db.stores[id]; open {
		return fmt.Errorf("drop store %q: it is open", id)
	}
	if db.opts.InMemory {
		return nil
	}
	if err := os.RemoveAll(db.dir(id)); err != nil {
		return fmt.Errorf("drop store %q: %w", id, err)
	}
	return nil
}

// IDs lists the mailboxes holding a store, sorted.
func (db *DB) IDs() ([]string, error) {
	if db.opts.InMemory {
		db.mu.Lock()
		defer db.mu.Unlock()
		var ids []string
		for id := range db.stores {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return ids, nil
	}
	entries, err := os.ReadDir(db.opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("list stores: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if id, err := url.PathUnescape(e.Name()); err == nil && e.IsDir() {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// Close closes the database. Stores of it still open are closed first, as their own Close would.
func (db *DB) Close() error {
	db.mu.Lock()
	db.closed = true
	open := make([]*Store, 0, len(db.stores))
	for _, s := range db.stores {
		open = append(open, s)
	}
	db.mu.Unlock()
	var errs []error
	for _, s := range open {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
