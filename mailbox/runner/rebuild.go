package runner

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/IBM/sarama"

	"github.com/prism-mesh/prism/mailbox/ingest"
	"github.com/prism-mesh/prism/mailbox/store"
)

// RebuildConfig says which runner's mailboxes Rebuild drops and how it
// reaches Kafka to reset their consumer groups.
type RebuildConfig struct {
	DataDir string
	Brokers []string
	Sarama  *sarama.Config // nil = ingest.SaramaConfig()
	Logger  *slog.Logger   // nil = slog.Default()
}

// Rebuild drops the stored data of each mailbox ids under cfg.DataDir
// together with its consumer group's committed offsets (the group is the
// mailbox id), so that the mailbox's next open, by prism runner or by its
// sidecar, re-ingests it from the earliest offset Kafka retains: ingest
// starts a group without offsets at the oldest. Data dropped while its
// offsets stayed would come back empty and never be refilled, so the group
// goes first, and a mailbox still in use is refused and left as it is: its
// group with live members, or its data in a store a running runner holds
// (Badger's directory lock).
//
// A mailbox with a store of an older version (OldDir) loses that directory;
// the runner's store is not opened for it, since a runner never opens a
// mailbox that has one, so this runs while the runner serves its other
// mailboxes. Any other mailbox is dropped from the runner's store
// (store.DB.Drop), which needs the runner stopped. It returns the ids
// rebuilt; an error names the first that failed, and the ones after it are
// not touched.
func Rebuild(cfg RebuildConfig, ids []string) ([]string, error) {
	if cfg.DataDir == "" || len(cfg.Brokers) == 0 {
		return nil, errors.New("rebuild: data dir and brokers are required")
	}
	if cfg.Sarama == nil {
		cfg.Sarama = ingest.SaramaConfig()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	for _, id := range ids {
		if err := validID(id); err != nil {
			return nil, fmt.Errorf("rebuild: %w", err)
		}
	}
	admin, err := sarama.NewClusterAdmin(cfg.Brokers, cfg.Sarama)
	if err != nil {
		return nil, fmt.Errorf("rebuild: kafka admin client: %w", err)
	}
	defer admin.Close()
	rb := rebuilder{cfg: cfg, admin: admin}
	defer rb.close()
	var done []string
	for _, id := range ids {
		if err := rb.one(id); err != nil {
			return done, err
		}
		done = append(done, id)
	}
	return done, nil
}

type rebuilder struct {
	cfg   RebuildConfig
	admin sarama.ClusterAdmin
	// db is the runner's store once a mailbox needed it (opened is then
	// true); nil if the data dir has none yet.
	db     *store.DB
	opened bool
}

func (rb *rebuilder) close() {
	if rb.db != nil {
		if err := rb.db.Close(); err != nil {
			rb.cfg.Logger.Error("close the runner store", "dir", StoreDir(rb.cfg.DataDir), "err", err)
		}
	}
}

func (rb *rebuilder) one(id string) error {
	old := OldDir(rb.cfg.DataDir, id)
	switch _, err := os.Stat(old); {
	case err == nil:
		return rb.oldLayout(id, old)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("rebuild %s: %w", id, err)
	}
	if err := rb.openStore(); err != nil {
		return fmt.Errorf("rebuild %s: %w", id, err)
	}
	if err := rb.resetGroup(id); err != nil {
		return err
	}
	if rb.db != nil {
		if err := rb.db.Drop(id); err != nil {
			return fmt.Errorf("rebuild %s: drop it from the runner store %s (its consumer group is reset already: run the rebuild again): %w", id, StoreDir(rb.cfg.DataDir), err)
		}
	}
	rb.cfg.Logger.Info("mailbox dropped from the runner store and its consumer group reset; its next open re-ingests it from Kafka's earliest offset",
		"mailbox_id", id, "dir", StoreDir(rb.cfg.DataDir))
	return nil
}

// oldLayout drops mailbox id's store of an older version, at dir.
func (rb *rebuilder) oldLayout(id, dir string) error {
	unlock, err := lockDir(dir)
	if err != nil {
		return fmt.Errorf("rebuild %s: %w", id, err)
	}
	defer unlock()
	if err := rb.resetGroup(id); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("rebuild %s: drop store %s (its consumer group is reset already: remove the directory by hand): %w", id, dir, err)
	}
	rb.cfg.Logger.Info("mailbox store of an older version dropped and its consumer group reset; its next open re-ingests it from Kafka's earliest offset",
		"mailbox_id", id, "dir", dir)
	return nil
}

func (rb *rebuilder) resetGroup(id string) error {
	switch err := rb.admin.DeleteConsumerGroup(id); {
	case err == nil, errors.Is(err, sarama.ErrGroupIDNotFound):
		return nil
	case errors.Is(err, sarama.ErrNonEmptyGroup):
		return fmt.Errorf("rebuild %s: consumer group %s still has members (a runner consumes this mailbox): stop it first", id, id)
	default:
		return fmt.Errorf("rebuild %s: delete consumer group %s: %w", id, id, err)
	}
}

// openStore opens the runner's store the first time a mailbox needs it,
// unless the data dir has none (nothing is stored: only the group is reset,
// and the runner creates its store at its first open).
func (rb *rebuilder) openStore() error {
	if rb.opened {
		return nil
	}
	db, err := openStoreStopped(rb.cfg.DataDir, rb.cfg.Logger)
	if err != nil {
		return err
	}
	rb.db, rb.opened = db, true
	return nil
}

// openStoreStopped opens the runner's store under dataDir for a tool run
// while the runner is stopped: nil if there is none, refused while a runner
// holds it.
func openStoreStopped(dataDir string, log *slog.Logger) (*store.DB, error) {
	dir := StoreDir(dataDir)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	// Asked first so that a running runner is named as such, not as
	// Badger's lock error; released before Badger takes it.
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	unlock()
	db, err := store.OpenDB(store.DBOptions{Dir: dir, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("open the runner store %s: %w (damaged: move the directory aside, never delete it before you know why, and rebuild each mailbox it held by id; docs/operations.md)", dir, err)
	}
	return db, nil
}

// lockDir takes Badger's lock of a store directory (flock on the directory
// itself) so that a runner cannot open the store while it is dropped, and
// refuses while a runner holds it. A directory that does not exist needs no
// lock.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return func() {}, nil
	}
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("store %s is open in a running runner: stop it first", dir)
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { f.Close() }, nil
}

// StoredIDs lists the mailboxes with data under dataDir, sorted: those in
// the runner's store and those with a store of an older version. It opens
// the runner's store, so the runner must be stopped.
func StoredIDs(dataDir string) ([]string, error) {
	ids, err := OldLayoutIDs(dataDir)
	if err != nil {
		return nil, err
	}
	db, err := openStoreStopped(dataDir, slog.Default())
	if err != nil || db == nil {
		return ids, err
	}
	inStore, err := db.IDs()
	if cerr := db.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close the runner store: %w", cerr)
	}
	if err != nil {
		return nil, fmt.Errorf("list the runner store's mailboxes: %w", err)
	}
	for _, id := range inStore {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// OldLayoutIDs lists the mailboxes with a store of an older version under
// dataDir (OldDir), sorted; the runner may be running.
func OldLayoutIDs(dataDir string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(dataDir, "mailboxes"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list mailbox stores: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		id, err := url.PathUnescape(e.Name())
		if b, rerr := os.ReadFile(filepath.Join(dataDir, "mailboxes", e.Name(), idFile)); rerr == nil {
			id, err = string(b), nil
		}
		if err != nil || OldDir(dataDir, id) != filepath.Join(dataDir, "mailboxes", e.Name()) {
			continue // not a directory OldDir names
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}
