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
)

// RebuildConfig says which mailboxes' stores Rebuild drops and how it
// reaches Kafka to reset their consumer groups.
type RebuildConfig struct {
	DataDir string
	Brokers []string
	Sarama  *sarama.Config // nil = ingest.SaramaConfig()
	Logger  *slog.Logger   // nil = slog.Default()
}

// Rebuild drops the store of each mailbox ids under cfg.DataDir together with
// its consumer group's committed offsets (the group is the mailbox id), so
// that the mailbox's next open, by prism runner or by its sidecar, re-ingests
// it from the earliest offset Kafka retains: ingest starts a group without
// offsets at the oldest. A store dropped while its offsets stayed would come
// back empty and never be refilled, so the group goes first, and a mailbox
// still in use is refused and left as it is: its store locked by a running
// runner (Badger's directory lock), or its group with live members. It
// returns the ids rebuilt; an error names the first that failed, and the
// ones after it are not touched.
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
	var done []string
	for _, id := range ids {
		if err := rebuildOne(cfg, admin, id); err != nil {
			return done, err
		}
		done = append(done, id)
	}
	return done, nil
}

func rebuildOne(cfg RebuildConfig, admin sarama.ClusterAdmin, id string) error {
	dir := Dir(cfg.DataDir, id)
	unlock, err := lockDir(dir)
	if err != nil {
		return fmt.Errorf("rebuild %s: %w", id, err)
	}
	defer unlock()
	switch err := admin.DeleteConsumerGroup(id); {
	case err == nil, errors.Is(err, sarama.ErrGroupIDNotFound):
	case errors.Is(err, sarama.ErrNonEmptyGroup):
		return fmt.Errorf("rebuild %s: consumer group %s still has members (a runner consumes this mailbox): stop it first", id, id)
	default:
		return fmt.Errorf("rebuild %s: delete consumer group %s: %w", id, id, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("rebuild %s: drop store %s (its consumer group is reset already: remove the directory by hand): %w", id, dir, err)
	}
	cfg.Logger.Info("mailbox store dropped and its consumer group reset; its next open re-ingests it from Kafka's earliest offset",
		"mailbox_id", id, "dir", dir)
	return nil
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

// StoredIDs lists the mailboxes with a store under dataDir, sorted.
func StoredIDs(dataDir string) ([]string, error) {
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
		if err != nil || Dir(dataDir, id) != filepath.Join(dataDir, "mailboxes", e.Name()) {
			continue // not a directory Dir names
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}
