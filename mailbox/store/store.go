// Package store is a mailbox's durable event store (RFC-037) on Badger v4: the
// full envelope bytes with their indexed headers, secondary indexes so filtered
// queries never scan the whole mailbox, cursor pagination, and retention.
package store

import (
	"context"
	"errors"
	"log/slog"
	"time"

	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// Limits of a query page.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
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
	MaxSize  int64         // retention: bytes bound on the store, oldest deleted first; 0 = unbounded
	Logger   *slog.Logger  // nil = slog.Default()
}

// WriteResult counts what a Write did with its items.
type WriteResult struct{ Stored, Duplicates int }

// RetentionResult reports what one retention pass removed.
type RetentionResult struct {
	Deleted      int
	DeletedBytes int64
}

// Store is one mailbox's event store.
type Store struct {
	opts Options
}

// Open opens (or creates) the store described by opts.
func Open(opts Options) (*Store, error) {
	return nil, errors.New("store: not implemented yet")
}

// Close releases the store.
func (s *Store) Close() error { return nil }

// Write stores items atomically and durably (synced to disk before it returns), so the caller may commit the Kafka
// offsets covering them. An item whose message_id is already stored (or repeated earlier in the same batch) is
// skipped and counted as a duplicate: redelivery never creates a second item.
func (s *Store) Write(ctx context.Context, items []*mailboxv1.MailboxItem) (WriteResult, error) {
	return WriteResult{}, errors.New("store: not implemented yet")
}

// Query returns items matching f, newest first, at most clamp(f.Limit) of them, and a next_page_token when more
// remain.
func (s *Store) Query(ctx context.Context, f *mailboxv1.EventFilter) (*mailboxv1.QueryEventsResponse, error) {
	return nil, errors.New("store: not implemented yet")
}

// Get returns the item with messageID, or ErrNotFound.
func (s *Store) Get(ctx context.Context, messageID string) (*mailboxv1.MailboxItem, error) {
	return nil, ErrNotFound
}

// Stats reports total events, total envelope bytes, oldest and newest timestamps. mailbox_id and epoch are left
// empty for the caller to fill.
func (s *Store) Stats(ctx context.Context) (*mailboxv1.MailboxStats, error) {
	return nil, errors.New("store: not implemented yet")
}

// RetainOnce runs one retention pass at time now.
func (s *Store) RetainOnce(ctx context.Context, now time.Time) (RetentionResult, error) {
	return RetentionResult{}, errors.New("store: not implemented yet")
}

// RunRetention runs RetainOnce every interval until ctx ends.
func (s *Store) RunRetention(ctx context.Context, interval time.Duration, now func() time.Time) {}
