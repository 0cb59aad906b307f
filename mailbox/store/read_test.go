package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// answerBound is how long a read may take while a write is held: far above an idle read (well under a
// millisecond here) and far below the hold, which lasts until every read has answered.
const answerBound = 2 * time.Second

// TestReadsDoNotWaitForAHeldCommit holds a write group mid-commit (Badger has applied it; the store has not
// published it and its Write has not returned) with a second Write queued behind it holding the write lock, and
// checks that every read answers within answerBound from the state before the group, and sees the group once
// it is released.
func TestReadsDoNotWaitForAHeldCommit(t *testing.T) {
	t.Parallel()
	s := openDir(t, t.TempDir(), Options{})
	t.Cleanup(func() { _ = s.Close() })
	mustWrite(t, s, item("before", 1000))

	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	unhold := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unhold)
	s.heldCommit = func() {
		close(held)
		<-release
	}
	written := make(chan error, 2)
	go func() {
		_, err := s.Write(context.Background(), []*mailboxv1.MailboxItem{item("held", 2000)})
		written <- err
	}()
	<-held
	s.wmu.Lock()
	s.heldCommit = nil // read by the next group under the write lock
	heldFlight := s.inflight
	s.wmu.Unlock()
	go func() {
		_, err := s.Write(context.Background(), []*mailboxv1.MailboxItem{item("queued", 3000)})
		written <- err
	}()
	// The queued Write's group is sent behind the held one and waits for it to be published.
	for deadline := time.Now().Add(answerBound); ; {
		s.wmu.Lock()
		sent := s.inflight != heldFlight
		s.wmu.Unlock()
		if sent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second Write's group was never sent")
		}
		time.Sleep(time.Millisecond)
	}

	ctx := context.Background()
	page := func(f *mailboxv1.EventFilter) func() error {
		return func() error {
			resp, err := s.Query(ctx, f)
			if got := ids(resp.GetItems()); err == nil && !slices.Equal(got, []string{"before@1000"}) {
				return fmt.Errorf("got %v, want only the item written before", got)
			}
			return err
		}
	}
	reads := []struct {
		name string
		read func() error
	}{
		{"query latest", page(&mailboxv1.EventFilter{})},
		{"query by topic", page(&mailboxv1.EventFilter{Topics: []string{"orders.created"}})},
		{"query by correlation id", page(&mailboxv1.EventFilter{CorrelationId: "corr-before"})},
		{"get", func() error {
			_, err := s.Get(ctx, "before")
			return err
		}},
		{"get held", func() error {
			if _, err := s.Get(ctx, "held"); !errors.Is(err, ErrNotFound) {
				return fmt.Errorf("the held item is visible before its commit is published (err %v)", err)
			}
			return nil
		}},
		{"stats", func() error {
			st, err := s.Stats(ctx)
			if err == nil && (st.GetTotalEvents() != 1 || st.GetNewestEvent().AsTime().UnixMilli() != 1000) {
				return fmt.Errorf("stats count the held batch: %v", st)
			}
			return err
		}},
	}
	for _, r := range reads {
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- r.read() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s while a write is held mid-commit: %v", r.name, err)
			}
		case <-time.After(answerBound):
			t.Fatalf("%s did not answer within %v while a write was held mid-commit", r.name, answerBound)
		}
		t.Logf("%s answered in %v", r.name, time.Since(start))
	}

	unhold()
	for range 2 {
		if err := <-written; err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetTotalEvents() != 3 || st.GetOldestEvent().AsTime().UnixMilli() != 1000 || st.GetNewestEvent().AsTime().UnixMilli() != 3000 {
		t.Errorf("stats after the release: %v, want 3 events from 1000 to 3000", st)
	}
	for _, id := range []string{"held", "queued"} {
		if _, err := s.Get(ctx, id); err != nil {
			t.Errorf("get %s after the release: %v", id, err)
		}
	}
}
