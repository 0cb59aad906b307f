package tests

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// startRunner starts a `prism runner` hosting mailbox on topics (no lease)
// on dataDir.
func startRunner(t *testing.T, brokers []string, mailbox, dataDir string, topics ...string) *e2e.Runner {
	t.Helper()
	return e2e.StartRunner(t, e2e.RunnerOptions{Brokers: brokers, Mailbox: mailbox, Topics: topics, DataDir: dataDir,
		Args: []string{"--batch-size", "100", "--log-level", "warn"}})
}

func stored(p *e2e.Runner, mailbox string) (int64, error) { return totalEvents(p.QueryURL(), mailbox) }

func envelopes(prefix, topic string, n int) ([]*kgo.Record, map[string]bool) {
	recs := make([]*kgo.Record, 0, n)
	ids := make(map[string]bool, n)
	base := time.Now().Add(-time.Hour)
	for i := range n {
		id := fmt.Sprintf("%s-%06d", prefix, i)
		ids[id] = true
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(id), Value: validEnvelope(id, topic, base.Add(time.Duration(i)*time.Microsecond))})
	}
	return recs, ids
}

func waitStored(t *testing.T, p *e2e.Runner, mailbox string, want int, d time.Duration) {
	t.Helper()
	testwait.For(t, d, fmt.Sprintf("%d events stored", want), func() (bool, string) {
		n, err := stored(p, mailbox)
		return err == nil && n == int64(want), fmt.Sprintf("%d stored (%v)", n, err)
	})
}

// TestMailboxRunnerKill9 kills a real runner process mid-ingest and restarts
// it on the same data dir: every message id is then stored exactly once.
func TestMailboxRunnerKill9(t *testing.T) {
	t.Parallel()
	const mailbox, topic = "crash@proxy-01", "crash.events"
	kafka := kafkatest.Start(t, kafkatest.Topics(3, topic), kafkatest.Topics(1, topic+".dlq"))
	brokers := kafka.Brokers
	// Small batches (flag above) and a large backlog keep the runner busy
	// long enough that the kill lands mid-ingest even on a fast machine.
	recs, want := envelopes("crash", topic, 50000)
	kafka.Produce(t, recs[:40000]...)

	dataDir := t.TempDir()
	p := startRunner(t, brokers, mailbox, dataDir, topic)
	var before int64
	testwait.For(t, 120*time.Second, "ingest under way", func() (bool, string) {
		n, err := stored(p, mailbox)
		before = n
		return err == nil && n >= 1000, fmt.Sprintf("%d stored (%v)", n, err)
	})
	if got := processUmask(t, p.Pid()); got != "0077" {
		t.Errorf("runner umask %s, want 0077: store files must be created owner-only", got)
	}
	p.Kill()
	if before >= 40000 {
		t.Fatalf("runner stored everything (%d) before the kill; the test proves nothing", before)
	}
	t.Logf("killed with %d of 40000 stored", before)
	kafka.Produce(t, recs[40000:]...) // arrives while the runner is down

	p2 := startRunner(t, brokers, mailbox, dataDir, topic)
	// The killed member stays in the group until its session times out, so
	// the restart may wait for a rebalance.
	waitStored(t, p2, mailbox, len(want), 180*time.Second)
	exactlyOnce(t, httpIDs(t, p2.QueryURL(), mailbox), want)
}

// TestMailboxRunnerSIGTERM stops a real runner with SIGTERM mid-ingest and
// restarts it: nothing is lost and nothing is consumed twice (the duplicates
// metric of the second run is 0), and the first run's offsets were committed
// (the second run consumes fewer records than were produced).
func TestMailboxRunnerSIGTERM(t *testing.T) {
	t.Parallel()
	const mailbox, topic = "term@proxy-01", "term.events"
	kafka := kafkatest.Start(t, kafkatest.Topics(3, topic), kafkatest.Topics(1, topic+".dlq"))
	brokers := kafka.Brokers
	recs, want := envelopes("term", topic, 40000)
	kafka.Produce(t, recs...)

	dataDir := t.TempDir()
	p := startRunner(t, brokers, mailbox, dataDir, topic)
	testwait.For(t, 120*time.Second, "ingest under way", func() (bool, string) {
		n, err := stored(p, mailbox)
		return err == nil && n >= 1000, fmt.Sprintf("%d stored (%v)", n, err)
	})
	start := time.Now()
	if err := p.Term(60 * time.Second); err != nil {
		t.Fatalf("runner after SIGTERM: %v", err)
	}
	t.Logf("graceful stop took %v", time.Since(start))

	p2 := startRunner(t, brokers, mailbox, dataDir, topic)
	waitStored(t, p2, mailbox, len(want), 180*time.Second)
	exactlyOnce(t, httpIDs(t, p2.QueryURL(), mailbox), want)
	// Whatever the second run consumed has reached the store by now (the store
	// count is complete), so its metrics are final.
	dups, err := metric(p2.HTTPURL(), "prism_mailbox_duplicates_dropped_total", "mailbox="+mailbox)
	if err != nil || dups != 0 {
		t.Fatalf("second run dropped %v duplicates (%v): offsets of stored events were not committed", dups, err)
	}
	consumed, err := metric(p2.HTTPURL(), "prism_mailbox_events_consumed_total", "mailbox="+mailbox)
	if err != nil || consumed >= float64(len(want)) || consumed <= 0 {
		t.Fatalf("second run consumed %v of %d records (%v); want the remainder only", consumed, len(want), err)
	}
	t.Logf("second run consumed %v records", consumed)
}

// processUmask reads a process's umask from /proc (Linux 4.7 and later).
func processUmask(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no Umask line in /proc/%d/status", pid)
	return ""
}
