package runner

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/prism-mesh/prism/mailbox/store"
)

// openMailboxStore opens mailbox mc in the runner's store, opening that
// first if no open has yet, and contains a failure to the mailboxes: a panic
// in the open is its error, never the process's, and a failure is recorded
// (failed, the metric, the log) for /readyz while the runner's other
// mailboxes go on serving. A failure of the runner's store is every
// mailbox's, each reported with it, so the sidecar reports them all
// open_failed and the admin moves them. The caller sees the error; the
// sidecar retries with backoff, and its next open tries the store again.
func (r *Runner) openMailboxStore(mc MailboxConfig) (st *store.Store, err error) {
	func() {
		defer func() {
			if p := recover(); p != nil {
				st, err = nil, fmt.Errorf("%w: panic opening mailbox %s: %v", store.ErrDamaged, mc.ID, p)
			}
		}()
		st, err = r.openInStore(mc)
	}()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.failed, mc.ID)
		return st, nil
	}
	reason := openFailureReason(err)
	r.failed[mc.ID] = err
	r.openFailures.WithLabelValues(reason).Inc()
	r.log.Error("mailbox store failed to open", "mailbox_id", mc.ID, "reason", reason, "err", err)
	return nil, err
}

func (r *Runner) openInStore(mc MailboxConfig) (*store.Store, error) {
	old := OldDir(r.cfg.DataDir, mc.ID)
	switch _, err := os.Stat(old); {
	case err == nil:
		return nil, fmt.Errorf("%w: %s holds the mailbox's store of an older version (a Badger per mailbox), whose Kafka offsets are committed: "+
			"opened empty here it would never get its history back; drop it and re-ingest it with prism runner rebuild --mailbox %s (or --old-layout for every such store)",
			store.ErrOldLayout, old, mc.ID)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("look for an older store of the mailbox: %w", err)
	}
	db, err := r.db.Get(r.openStoreDB)
	if err != nil {
		return nil, err
	}
	return r.openView(db, r.storeOptions(mc))
}

func (r *Runner) storeOptions(mc MailboxConfig) store.Options {
	return store.Options{ID: mc.ID, MaxAge: mc.MaxAge, MaxSize: mc.MaxSize, Logger: r.log.With("mailbox_id", mc.ID)}
}

// openStoreDB is r.db's open of the runner's store: a panic in it (a
// damaged store) is its error, and a failure is logged once a try, not once
// for each of the thousand mailbox opens that may take its answer.
func (r *Runner) openStoreDB() (*store.DB, error) {
	dir := StoreDir(r.cfg.DataDir)
	db, err := func() (db *store.DB, err error) {
		defer func() {
			if p := recover(); p != nil {
				db, err = nil, fmt.Errorf("%w: panic opening %s: %v", store.ErrDamaged, dir, p)
			}
		}()
		return r.openDB(store.DBOptions{Dir: dir, Memory: store.MemoryFor(r.cfg.MemoryBudget, 1), Logger: r.log})
	}()
	if err != nil {
		r.dbFailed = true
		r.log.Error("the runner's store failed to open: every mailbox's open fails with it until one opens it", "dir", dir, "reason", openFailureReason(err), "err", err)
		return nil, fmt.Errorf("runner store %s: %w", dir, err)
	}
	if r.dbFailed {
		r.log.Info("the runner's store opened after failing", "dir", dir)
	}
	r.dbFailed = false
	return db, nil
}

// openFailureReason is the reason label, /readyz's and the log's, of a
// store open that failed with err: each names what an operator does next
// (rebuild a damaged store or one of the old layout, free space).
func openFailureReason(err error) string {
	switch {
	case errors.Is(err, store.ErrDamaged):
		return "damaged"
	case errors.Is(err, store.ErrOldLayout):
		return "old_layout"
	case errors.Is(err, syscall.ENOSPC):
		return "no_space"
	}
	return "other"
}
