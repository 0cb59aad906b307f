package store

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

func TestMemoryFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		budget int64
		stores int
		want   Memory
	}{
		{0, 3, Memory{}},
		{1 << 30, 1, Memory{MemTableSize: 64 << 20, NumMemtables: 3, BlockCacheSize: 187904819, IndexCacheSize: 134217728}},
		{1 << 30, 4, Memory{MemTableSize: 17895697, NumMemtables: 3, BlockCacheSize: 46976204, IndexCacheSize: 33554432}},
		{64 << 20, 0, Memory{MemTableSize: 4473924, NumMemtables: 3, BlockCacheSize: 11744051, IndexCacheSize: 8 << 20}},
		{64 << 20, 100, Memory{MemTableSize: 4 << 20, NumMemtables: 3, BlockCacheSize: 1 << 20, IndexCacheSize: 1 << 20}},
		// The memtables' floor takes more than 40% of the share: the caches get the rest.
		{256 << 20, 5, Memory{MemTableSize: 4 << 20, NumMemtables: 3, BlockCacheSize: 8318702, IndexCacheSize: 5941930}},
	}
	for _, tc := range tests {
		if got := MemoryFor(tc.budget, tc.stores); got != tc.want {
			t.Errorf("MemoryFor(%d, %d) = %+v, want %+v", tc.budget, tc.stores, got, tc.want)
		}
	}
}

// heapPeak samples the Go heap's live and unswept objects every few ms until stop is closed.
func heapPeak(stop <-chan struct{}) *atomic.Uint64 {
	var peak atomic.Uint64
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	go func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(sample)
			if v := sample[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return &peak
}

// TestSmallMemoryBudget: two stores sized from a small budget, as a runner sizes its mailboxes, take a large
// ingest (several times their memtables, of envelopes together ten times the budget) without error, and the Go
// heap stays within a small multiple of the budget. Not parallel: it measures the process's heap.
func TestSmallMemoryBudget(t *testing.T) {
	const (
		budget  = 32 << 20
		stores  = 2
		batches = 16
		batch   = 1000
	)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(budget))
	stop := make(chan struct{})
	peak := heapPeak(stop)
	var wg sync.WaitGroup
	errs := make([]error, stores)
	for i := range stores {
		s := openDir(t, filepath.Join(t.TempDir(), "mbox"), Options{Memory: MemoryFor(budget, stores)})
		defer s.Close()
		wg.Go(func() {
			errs[i] = func() error {
				for b := range batches {
					items := make([]*mailboxv1.MailboxItem, batch)
					for j := range items {
						n := b*batch + j
						items[j] = item(fmt.Sprintf("s%d-%06d", i, n), int64(n))
						items[j].EnvelopeBlob = make([]byte, 1024)
						fillRandom(items[j].EnvelopeBlob, uint64(n))
					}
					res, err := s.Write(context.Background(), items)
					if err != nil {
						return err
					}
					if res.Stored != batch {
						return fmt.Errorf("batch %d: %+v", b, res)
					}
				}
				st, err := s.Stats(context.Background())
				if err == nil && st.GetTotalEvents() != batches*batch {
					err = fmt.Errorf("%d events stored, want %d", st.GetTotalEvents(), batches*batch)
				}
				return err
			}()
		})
	}
	wg.Wait()
	close(stop)
	for i, err := range errs {
		if err != nil {
			t.Errorf("store %d: %v", i, err)
		}
	}
	t.Logf("Go heap peak %d MiB under a %d MiB budget", peak.Load()>>20, budget>>20)
	if p := peak.Load(); p > 4*budget {
		t.Errorf("Go heap peaked at %d MiB, over 4× the %d MiB budget", p>>20, budget>>20)
	}
}
