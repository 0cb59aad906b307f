package ingest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mailbox/store"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// fakeSpace is a disk the test makes short or roomy.
type fakeSpace struct {
	mu    sync.Mutex
	short error
	fulls []error
	waits atomic.Int64
}

func (s *fakeSpace) set(short error) {
	s.mu.Lock()
	s.short = short
	s.mu.Unlock()
}

func (s *fakeSpace) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.short
}

func (s *fakeSpace) Wait(ctx context.Context) error {
	s.waits.Add(1)
	for s.Err() != nil {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

func (s *fakeSpace) Full(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fulls = append(s.fulls, cause)
	s.short = fmt.Errorf("full: %w", cause)
}

func (s *fakeSpace) fullCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.fulls)
}

// noSpaceWriter fails its first failures writes with ENOSPC, wrapped as
// Badger wraps a failed value-log write, then writes to st.
type noSpaceWriter struct {
	st       *store.Store
	failures atomic.Int64
	calls    atomic.Int64
}

func (w *noSpaceWriter) Write(ctx context.Context, items []*mailboxv1.MailboxItem) (store.WriteResult, error) {
	w.calls.Add(1)
	if w.failures.Add(-1) >= 0 {
		return store.WriteResult{}, fmt.Errorf("write: commit: %w",
			&fs.PathError{Op: "write", Path: "000001.vlog", Err: syscall.ENOSPC})
	}
	return w.st.Write(ctx, items)
}

// spaceClaim runs ConsumeClaim over a fake session with three records (one
// batch) and returns what the test needs to watch it.
func spaceClaim(t *testing.T, space *fakeSpace, w *noSpaceWriter) (i *Ingester, sess *fakeSession, claim *fakeClaim, done chan error) {
	t.Helper()
	cfg := Config{MailboxID: "disk@p", Brokers: []string{"x"}, Topics: []string{"t"}, BatchSize: 3, BatchWait: time.Hour,
		BackoffMin: time.Millisecond, StallAfter: 1, Space: space, Metrics: NewMetrics(prometheus.NewRegistry())}
	cfg.setDefaults()
	i = &Ingester{cfg: cfg, w: w, log: cfg.Logger}
	i.runCtx, i.stopRun = context.WithCancel(context.Background())
	i.drainCtx = context.Background()
	t.Cleanup(i.stopRun)
	claim = &fakeClaim{ch: make(chan *sarama.ConsumerMessage, 10)}
	for k := range 3 {
		b, _ := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
			MessageId: fmt.Sprint(k), Topic: "t", PublishedAt: timestamppb.Now()}})
		claim.ch <- &sarama.ConsumerMessage{Topic: "t", Offset: int64(10 + k), Value: b}
	}
	sess = &fakeSession{}
	h := &handler{i: i}
	if err := h.Setup(sess); err != nil {
		t.Fatal(err)
	}
	done = make(chan error, 1)
	go func() { done <- h.ConsumeClaim(sess, claim) }()
	return i, sess, claim, done
}

func TestDiskPressurePausesBeforeTheWrite(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		short    bool  // the disk is short before the first write
		failures int64 // writes that fail with ENOSPC
	}{
		{name: "below the watermark", short: true},
		{name: "ENOSPC above the watermark", failures: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st, err := store.Open(store.Options{InMemory: true})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			space := &fakeSpace{}
			if tc.short {
				space.set(errors.New("runner data dir /data has 1 bytes free"))
			}
			w := &noSpaceWriter{st: st}
			w.failures.Store(tc.failures)
			i, sess, claim, done := spaceClaim(t, space, w)
			paused := i.cfg.Metrics.paused.WithLabelValues("disk@p", "t", "0")
			waitFor(t, "the partition paused", func() bool { return testutil.ToFloat64(paused) == 1 })
			// Held: no write while short (one ENOSPC write per failure at most), nothing marked.
			time.Sleep(20 * time.Millisecond)
			if got := w.calls.Load(); got > 1 {
				t.Fatalf("%d writes while the disk was short, want at most the one that found it full", got)
			}
			if got := sess.markedOffset(); got != 0 {
				t.Fatalf("offset %d marked while the batch waits for space", got)
			}
			if int64(space.fullCount()) != min(tc.failures, 1) {
				t.Fatalf("Full called %d times, want %d", space.fullCount(), min(tc.failures, 1))
			}
			// An ENOSPC is a pause, not a stall, whatever StallAfter says.
			if got := testutil.ToFloat64(i.cfg.Metrics.stalls.WithLabelValues("disk@p", "store")); got != 0 {
				t.Fatalf("%v stalls counted for a full disk", got)
			}

			space.set(nil)
			waitFor(t, "the batch stored", func() bool { return sess.markedOffset() == 13 })
			if testutil.ToFloat64(paused) != 0 {
				t.Fatal("still reported paused after the write")
			}
			s, _ := st.Stats(context.Background())
			if s.TotalEvents != 3 || w.calls.Load() != tc.failures+1 {
				t.Fatalf("stored %d in %d writes, want 3 in %d", s.TotalEvents, w.calls.Load(), tc.failures+1)
			}
			close(claim.ch)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Closing while the disk is short gives the held batch up at once, uncommitted.
func TestDiskPressureCloseAbandonsTheBatch(t *testing.T) {
	t.Parallel()
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	space := &fakeSpace{}
	space.set(errors.New("short"))
	w := &noSpaceWriter{st: st}
	i, sess, claim, done := spaceClaim(t, space, w)
	waitFor(t, "a wait for space", func() bool { return space.waits.Load() == 1 })
	i.stopRun()
	close(claim.ch)
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("ConsumeClaim returned no error for a batch it could not store")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ConsumeClaim still waiting for space after close")
	}
	if sess.markedOffset() != 0 || w.calls.Load() != 0 {
		t.Fatalf("marked %d after %d writes, want nothing", sess.markedOffset(), w.calls.Load())
	}
}
