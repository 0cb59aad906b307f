package runner

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/prism-mesh/prism/mailbox/ingest"
	"github.com/prism-mesh/prism/mailbox/store"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// TestMailboxesShareTheRunnersKafka opens eight mailboxes of one topic at
// once: their dead-letter topic is created and described once for all of
// them (one Kafka per runner), every one consumes, and Close closes the
// shared client after them.
func TestMailboxesShareTheRunnersKafka(t *testing.T) {
	t.Parallel()
	const topic, n = "s.events", 8
	c := kafkatest.Start(t, kafkatest.Topics(1, topic))
	var creates, describes atomic.Int64
	for key, count := range map[kmsg.Key]*atomic.Int64{kmsg.CreateTopics: &creates, kmsg.DescribeConfigs: &describes} {
		c.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			count.Add(1)
			return nil, nil, false
		})
	}
	r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = r.Open(MailboxConfig{ID: fmt.Sprintf("m%d@p1", i), Topics: []string{topic}}) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "every mailbox consuming", func() bool {
		for i := range n {
			if !r.Consuming(fmt.Sprintf("m%d@p1", i)) {
				return false
			}
		}
		return true
	})
	if creates.Load() != 1 || describes.Load() != 1 {
		t.Fatalf("%d mailboxes opened: %d CreateTopics and %d DescribeConfigs, want one of each", n, creates.Load(), describes.Load())
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if ing, err := ingest.Start(ingest.Config{MailboxID: "late@p1", Kafka: r.kafka, Topics: []string{topic}}, st); err == nil {
		ing.Close()
		t.Fatal("the runner's Kafka still starts ingest after the runner closed")
	}
}
