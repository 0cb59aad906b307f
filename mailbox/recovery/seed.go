package recovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/mailbox/store"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// Defaults of SeedConfig.
const (
	DefaultGiveUp     = 2 * time.Minute
	DefaultBackoffMin = 200 * time.Millisecond
	DefaultBackoffMax = 5 * time.Second
)

// SeedConfig configures Seed. DB, MailboxID, SourceID and Dial are required.
type SeedConfig struct {
	DB        *store.DB
	MailboxID string // the mailbox seeded
	SourceID  string // the mailbox copied
	// Dial reaches the source's runner (MailboxRecovery on its query port, mutual TLS), once per try: where
	// it runs may change while a copy fails (a source restarted elsewhere). The caller closes what it returns.
	Dial func() (runnerv1.MailboxRecoveryClient, io.Closer, error)
	// GiveUp bounds the time spent failing: a copy that has made no progress for this long is given up
	// (0: DefaultGiveUp).
	GiveUp                 time.Duration
	BackoffMin, BackoffMax time.Duration // between tries (0: the defaults)
	// Progress, when set, is told the bytes and entries received so far by this seed (since it began, over its
	// tries).
	Progress func(bytes, entries int64)
	Clock    clock.WithTicker // nil = clock.RealClock{}
	Logger   *slog.Logger     // nil = slog.Default()
}

// Copied is a copy received whole, still an import: the caller closes the mailbox's store (if open), then calls
// Import.Finish with Positions, and opens the store again.
type Copied struct {
	Import    *store.Import
	Positions []store.Position
	Done      *runnerv1.RecoveryDone
}

// ErrGaveUp wraps the last error of a copy given up.
var ErrGaveUp = errors.New("peer recovery gave up")

// Seed copies cfg.SourceID into an import of cfg.MailboxID: it resumes an import in progress from its cursor,
// retries with backoff while it fails, and starts over (aborting the import) when the source no longer holds
// the snapshot it began. It returns once the copy is whole, or an error wrapping ErrGaveUp after GiveUp without
// progress, or ctx's error; the import stays on disk for a later Seed unless it was given up (then it is aborted).
func Seed(ctx context.Context, cfg SeedConfig) (*Copied, error) {
	if cfg.GiveUp <= 0 {
		cfg.GiveUp = DefaultGiveUp
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = DefaultBackoffMin
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	log := cfg.Logger.With("mailbox_id", cfg.MailboxID, "source_mailbox_id", cfg.SourceID)
	im, err := cfg.DB.Import(cfg.MailboxID)
	if err != nil {
		return nil, err
	}
	var got progress
	delay := cfg.BackoffMin
	lastProgress := cfg.Clock.Now()
	for {
		before := got
		done, err := fetch(ctx, cfg, im, &got)
		if err == nil {
			positions := make([]store.Position, 0, len(done.GetStoredPositions()))
			for _, p := range done.GetStoredPositions() {
				positions = append(positions, store.Position{Topic: p.GetTopic(), Partition: p.GetPartition(), Next: p.GetNextOffset()})
			}
			log.Info("recovery copy received", "entries", done.GetEntries(), "bytes", done.GetBytes(), "events", done.GetEvents())
			return &Copied{Import: im, Positions: positions, Done: done}, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if status.Code(err) == codes.Aborted || errors.Is(err, errRestart) {
			// The source no longer holds the snapshot begun: what was received is of a state it has left.
			log.Warn("recovery copy starts over", "err", err)
			if err := im.Abort(); err != nil {
				return nil, err
			}
			if im, err = cfg.DB.Import(cfg.MailboxID); err != nil {
				return nil, err
			}
			got.restarts++
			continue
		}
		if got.bytes > before.bytes {
			lastProgress, delay = cfg.Clock.Now(), cfg.BackoffMin
		}
		if cfg.Clock.Since(lastProgress) >= cfg.GiveUp {
			log.Warn("recovery copy given up", "err", err, "after", cfg.GiveUp)
			return nil, errors.Join(fmt.Errorf("copy %s from %s: %w: %w", cfg.MailboxID, cfg.SourceID, ErrGaveUp, err), im.Abort())
		}
		log.Info("recovery copy failed; retrying", "err", err, "in", delay)
		t := cfg.Clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C():
		}
		delay = min(2*delay, cfg.BackoffMax)
	}
}

// errRestart is a chunk that cannot be taken (a bad checksum, a snapshot other than the import's): the copy
// starts over.
var errRestart = errors.New("restart the copy")

type progress struct {
	bytes, entries int64
	restarts       int
}

// fetch runs one stream from the import's cursor into it until the copy's last message, and returns that.
func fetch(ctx context.Context, cfg SeedConfig, im *store.Import, got *progress) (*runnerv1.RecoveryDone, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client, conn, err := cfg.Dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stream, err := client.FetchMailbox(ctx, &runnerv1.FetchMailboxRequest{
		MailboxId: cfg.SourceID, SnapshotId: im.Snapshot(), Cursor: im.Cursor(),
	}, grpc.MaxCallRecvMsgSize(MaxMessageBytes))
	if err != nil {
		return nil, err
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, status.Error(codes.Unavailable, "stream ended before the copy's last message")
		}
		if err != nil {
			return nil, err
		}
		if ChunkChecksum(msg.GetEntries()) != msg.GetCrc32C() {
			return nil, fmt.Errorf("chunk after %q: checksum mismatch: %w", im.Cursor(), errRestart)
		}
		if s := im.Snapshot(); s != "" && msg.GetSnapshotId() != s {
			return nil, fmt.Errorf("chunk of snapshot %q, the import's is %q: %w", msg.GetSnapshotId(), s, errRestart)
		}
		entries := make([]store.Entry, len(msg.GetEntries()))
		var size int64
		for i, e := range msg.GetEntries() {
			if e.GetMeta() > 0xff {
				return nil, fmt.Errorf("entry %q: meta %d: %w", e.GetKey(), e.GetMeta(), errRestart)
			}
			entries[i] = store.Entry{Key: e.GetKey(), Value: e.GetValue(), Meta: byte(e.GetMeta())}
			size += int64(len(e.GetKey()) + len(e.GetValue()))
		}
		if len(entries) > 0 {
			if err := im.Put(msg.GetSnapshotId(), entries); err != nil {
				return nil, err
			}
			got.bytes += size
			got.entries += int64(len(entries))
			if cfg.Progress != nil {
				cfg.Progress(got.bytes, got.entries)
			}
		}
		if d := msg.GetDone(); d != nil {
			return d, nil
		}
	}
}
