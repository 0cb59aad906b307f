package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prism-mesh/prism/mailbox/store"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// openMailboxes is how many mailboxes mailbox.open_1k_ms opens, each holding openItems items.
const (
	openMailboxes = 1000
	openItems     = 100
)

// benchOpen measures mailbox.open_1k_ms: a runner's database holding 1,000 mailboxes is opened and every
// mailbox's store with it, page cache warm, as a runner restarting with 1,000 mailboxes does before serving
// them (a session's bulk grant, docs/architecture.md#sessions, wants them all served within a second). A query on each follows
// (mailbox.open_1k_first_query_ms, all of them together).
func benchOpen(dir string) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx := context.Background()
	db, err := store.OpenDB(store.DBOptions{Dir: dir, Logger: log})
	if err != nil {
		return err
	}
	id := func(i int) string { return fmt.Sprintf("mailbox-%04d@bench", i) }
	for i := range openMailboxes {
		s, err := db.Open(store.Options{ID: id(i), Logger: log})
		if err != nil {
			return errors.Join(err, db.Close())
		}
		err = forBatches(i*openItems, (i+1)*openItems, openItems, func(b []*mailboxv1.MailboxItem) error {
			_, err := s.Write(ctx, b)
			return err
		})
		if err := errors.Join(err, s.Close()); err != nil {
			return errors.Join(err, db.Close())
		}
	}
	if err := db.Close(); err != nil {
		return err
	}

	t := time.Now()
	if db, err = store.OpenDB(store.DBOptions{Dir: dir, Logger: log}); err != nil {
		return err
	}
	defer db.Close()
	openDB := time.Since(t)
	ids, err := db.IDs()
	if err != nil {
		return err
	}
	if len(ids) != openMailboxes {
		return fmt.Errorf("%d mailboxes listed, want %d", len(ids), openMailboxes)
	}
	stores := make([]*store.Store, 0, len(ids))
	for _, id := range ids {
		s, err := db.Open(store.Options{ID: id, Logger: log})
		if err != nil {
			return err
		}
		stores = append(stores, s)
	}
	opened := time.Since(t)
	t = time.Now()
	for _, s := range stores {
		resp, err := s.Query(ctx, &mailboxv1.EventFilter{Limit: 10})
		if err != nil {
			return err
		}
		if len(resp.GetItems()) != 10 {
			return fmt.Errorf("a mailbox answered %d items, want 10", len(resp.GetItems()))
		}
	}
	queried := time.Since(t)
	note("open: %d mailboxes of %d items in one database opened in %v (OpenDB %v of it: checking the value log, Badger's open), a query on each in %v",
		openMailboxes, openItems, opened.Round(time.Microsecond), openDB.Round(time.Microsecond), queried.Round(time.Microsecond))
	bench("mailbox.open_1k_ms", float64(opened)/float64(time.Millisecond), "ms")
	bench("mailbox.open_1k_first_query_ms", float64(queried)/float64(time.Millisecond), "ms")
	return nil
}
