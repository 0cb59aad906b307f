package runner

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// deleteRecords has Kafka delete topic's records before offset on every partition given, as retention does.
func deleteRecords(t *testing.T, c *kafkatest.Cluster, topic string, before map[int32]int64) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	for p, off := range before {
		rp := kmsg.NewDeleteRecordsRequestTopicPartition()
		rp.Partition, rp.Offset = p, off
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 5000
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			if p.ErrorCode != 0 {
				t.Fatalf("delete records of %s/%d: error %d", topic, p.Partition, p.ErrorCode)
			}
		}
	}
}

// allIDs is every message id mailbox id of r answers, newest first, paged to the end.
func allIDs(t *testing.T, r *Runner, id string) []string {
	t.Helper()
	src, _, ok := r.Mailbox(id)
	if !ok {
		t.Fatalf("mailbox %s not served", id)
	}
	var out []string
	f := &mailboxv1.EventFilter{Limit: 1000}
	for {
		resp, err := src.Query(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range resp.GetItems() {
			out = append(out, it.GetMessageId())
		}
		if resp.GetNextPageToken() == "" {
			return out
		}
		f.PageToken = resp.GetNextPageToken()
	}
}

func totalEvents(r *Runner, id string) int64 {
	st, err := r.Stats(context.Background(), id)
	if err != nil {
		return -1
	}
	return st.GetTotalEvents()
}

// TestPeerRecoveryKeepsWhatKafkaDeleted is a move by peer recovery between two runners over mutual TLS: P holds
// ns@p1 with 300 events, Kafka then deletes the first 100 of them (retention), and Q opens ns@p2 seeded from
// ns@p1. Q's copy is refused until P allows proxy p2, then Q holds all 300 (what Kafka no longer has included), the
// same answers as P, its recovery reported copied and its history complete; it consumes from the copied
// positions (the 50 events produced after, nothing twice), its consumer group starting there rather than at the
// oldest offset.
func TestPeerRecoveryKeepsWhatKafkaDeleted(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	c := kafkatest.Start(t, kafkatest.Topics(2, "t", "t.dlq"))
	envs := kafkatest.Envelopes("t", 350)
	c.ProduceEnvelopes(t, "t", envs[:300]...)
	newRunner := func(proxy string) (*Runner, string) {
		r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers, BatchWait: 10 * time.Millisecond,
			TLS: p.Source(identity.Proxy, proxy), RecoveryGiveUp: time.Minute, Logger: testLog(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		q, _ := serve(t, r)
		return r, q
	}
	rp, addrP := newRunner("p1")
	rq, _ := newRunner("p2")
	if err := rp.Open(MailboxConfig{ID: "ns@p1", Topics: []string{"t"}, Epoch: 4}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "P stores 300 events and knows its positions", func() bool {
		st, ok := rp.Status("ns@p1")
		return ok && st.Events == 300 && len(st.Positions) == 2
	})
	st, _ := rp.Status("ns@p1")
	before := map[int32]int64{}
	for _, pos := range st.Positions {
		before[pos.Partition] = pos.Next / 3
	}
	deleteRecords(t, c, "t", before)

	if err := rq.Open(MailboxConfig{ID: "ns@p2", Topics: []string{"t"}, Epoch: 1,
		Recover: &RecoverySource{MailboxID: "ns@p1", Address: addrP}}); err != nil {
		t.Fatal(err)
	}
	// Refused while P's placement does not name p2: Q keeps trying and consumes nothing.
	waitFor(t, "Q's copy refused", func() bool {
		st, _ := rq.Status("ns@p2")
		return st.Recovery.State == RecoveryCopying
	})
	time.Sleep(300 * time.Millisecond)
	if st, _ := rq.Status("ns@p2"); st.Consuming || st.Events != 0 || st.Recovery.HistoryComplete {
		t.Fatalf("Q before its copy: %+v", st)
	}
	rp.AllowRecovery("ns@p1", []string{"p2"})
	waitFor(t, "Q copied", func() bool {
		st, _ := rq.Status("ns@p2")
		return st.Recovery.State == RecoveryCopied
	})
	got, _ := rq.Status("ns@p2")
	if !got.Recovery.HistoryComplete || got.Recovery.Source != "ns@p1" || got.Recovery.Events != 300 || got.Recovery.Bytes == 0 {
		t.Fatalf("Q's recovery %+v", got.Recovery)
	}
	if gotIDs, want := allIDs(t, rq, "ns@p2"), allIDs(t, rp, "ns@p1"); len(want) != 300 || !slices.Equal(gotIDs, want) {
		t.Fatalf("Q answers %d events, P %d: not the same", len(gotIDs), len(want))
	}
	c.ProduceEnvelopes(t, "t", envs[300:]...)
	waitFor(t, "both store the 50 new events", func() bool { return totalEvents(rq, "ns@p2") == 350 && totalEvents(rp, "ns@p1") == 350 })
	waitFor(t, "Q's group commits the end of the topic", func() bool { return c.Committed(t, "ns@p2", "t") == 350 })
	// The same events; among events of one millisecond the order is each store's own write order, which
	// differs once each has batched the new records its own way.
	if gotIDs, want := allIDs(t, rq, "ns@p2"), allIDs(t, rp, "ns@p1"); !slices.Equal(slices.Sorted(slices.Values(gotIDs)), slices.Sorted(slices.Values(want))) {
		t.Fatalf("after the copy Q and P differ: %d and %d events", len(gotIDs), len(want))
	}
	stats, err := rq.Stats(context.Background(), "ns@p2")
	if err != nil || stats.GetHistoryIncomplete() {
		t.Fatalf("Q's stats %v, %v", stats, err)
	}
}

// TestFetchMailboxRefusals: the copy door on a runner's query port refuses a caller without a certificate, of
// another CA, of a role other than proxy, a proxy the mailbox's placement does not name, and an allowed proxy
// asking for a mailbox not held here under a live lease, or past its lease; a refused call holds no snapshot
// and changes nothing.
func TestFetchMailboxRefusals(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	c := kafkatest.Start(t, kafkatest.Topics(1, "t", "t.dlq"))
	c.ProduceEnvelopes(t, "t", kafkatest.Envelopes("t", 20)...)
	r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers, BatchWait: 10 * time.Millisecond,
		TLS: p.Source(identity.Proxy, "p1"), Logger: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	addr, _ := serve(t, r)
	if err := r.Open(MailboxConfig{ID: "ns@p1", Topics: []string{"t"}, Epoch: 4}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "20 events stored", func() bool { st, ok := r.Status("ns@p1"); return ok && st.Events == 20 && st.Positions != nil })
	r.AllowRecovery("ns@p1", []string{"p2"})
	r.AllowRecovery("gone@p1", []string{"p2"})
	r.AllowRecovery("late@p1", []string{"p2"})
	if err := r.Open(MailboxConfig{ID: "late@p1", Topics: []string{"t"}, Epoch: 4}); err != nil {
		t.Fatal(err)
	}
	if err := r.SetValidFor("late@p1", time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	as := func(role identity.Role, name string) *tls.Config {
		return p.Source(role, name).ClientConfig(pki.Exactly(identity.Identity{TrustDomain: identity.DefaultTrustDomain, Role: identity.Proxy, Name: "p1"}))
	}
	for _, tc := range []struct {
		name    string
		tls     *tls.Config
		mailbox string
		want    codes.Code
	}{
		{"no client certificate", &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}, "ns@p1", codes.Unavailable}, //nolint:gosec // the test is about the server's check
		{"certificate of another CA", pkitest.Presented(t, pkitest.New(t).Files(identity.Proxy, "p2")), "ns@p1", codes.Unavailable},
		{"gateway identity", as(identity.Gateway, "gw"), "ns@p1", codes.PermissionDenied},
		{"operator identity", as(identity.Operator, "ops"), "ns@p1", codes.PermissionDenied},
		{"proxy not in the placement", as(identity.Proxy, "p3"), "ns@p1", codes.PermissionDenied},
		{"the runner's own identity", as(identity.Proxy, "p1"), "ns@p1", codes.PermissionDenied},
		{"allowed proxy, mailbox not held", as(identity.Proxy, "p2"), "gone@p1", codes.NotFound},
		{"allowed proxy, lease deadline passed", as(identity.Proxy, "p2"), "late@p1", codes.NotFound},
		{"allowed proxy, snapshot not held", as(identity.Proxy, "p2"), "ns@p1", codes.Aborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc.tls)))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req := &runnerv1.FetchMailboxRequest{MailboxId: tc.mailbox}
			if tc.want == codes.Aborted {
				req.SnapshotId = "0123"
			}
			stream, err := runnerv1.NewMailboxRecoveryClient(cc).FetchMailbox(ctx, req)
			if err == nil {
				_, err = stream.Recv()
			}
			if got := grpcstatus.Code(err); got != tc.want {
				t.Fatalf("FetchMailbox = %v, want %v", err, tc.want)
			}
			if n := r.recoverySrv.Held(); n != 0 {
				t.Fatalf("a refused call holds %d snapshots", n)
			}
		})
	}
	if st, _ := r.Status("ns@p1"); st.Events != 20 {
		t.Fatalf("refusals changed the mailbox: %d events", st.Events)
	}
	// The allowed proxy gets the whole copy, in key order, checksummed, ending with the positions.
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(as(identity.Proxy, "p2"))))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	stream, err := runnerv1.NewMailboxRecoveryClient(cc).FetchMailbox(context.Background(), &runnerv1.FetchMailboxRequest{MailboxId: "ns@p1"})
	if err != nil {
		t.Fatal(err)
	}
	var done *runnerv1.RecoveryDone
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if d := msg.GetDone(); d != nil {
			done = d
		}
	}
	if done.GetEvents() != 20 || len(done.GetStoredPositions()) != 1 || done.GetStoredPositions()[0].GetNextOffset() != 20 {
		t.Fatalf("last message %v", done)
	}
}

// testLog logs to the test's output at info, so a failure shows the copy's story.
func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// TestPeerRecoveryOff: with peer recovery off a runner serves no copy, and a mailbox opened with a source reads
// its topics from Kafka at once and reports its history incomplete.
func TestPeerRecoveryOff(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(1, "t", "t.dlq"))
	c.ProduceEnvelopes(t, "t", kafkatest.Envelopes("t", 10)...)
	r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers, BatchWait: 10 * time.Millisecond, NoPeerRecovery: true, Logger: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	if err := r.Open(MailboxConfig{ID: "ns@p2", Topics: []string{"t"}, Epoch: 1, Recover: &RecoverySource{MailboxID: "ns@p1", Address: "127.0.0.1:1"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "built from Kafka", func() bool {
		st, _ := r.Status("ns@p2")
		return st.Events == 10 && st.Recovery.State == RecoveryIncomplete && !st.Recovery.HistoryComplete && !st.Recovery.HistoryStartsAt.IsZero()
	})
	r.AllowRecovery("ns@p2", []string{"p3"})
	if err := r.RecoveryAllowed("ns@p2", "p3"); grpcstatus.Code(err) != codes.Unavailable {
		t.Fatalf("a copy from a runner with peer recovery off: %v, want Unavailable", err)
	}
}

// TestHistoryBeforeMarksIncomplete: a mailbox opened with HistoryBefore while it holds nothing and is not copied
// consumes Kafka at once and records its history incomplete from its oldest event, also after it is opened again;
// a namespace's first mailbox (no HistoryBefore) and a mailbox holding data of its own stay complete.
func TestHistoryBeforeMarksIncomplete(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(1, "t", "t.dlq"))
	c.ProduceEnvelopes(t, "t", kafkatest.Envelopes("t", 10)...)
	r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers, BatchWait: 10 * time.Millisecond, Logger: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	open := func(id, before string) {
		t.Helper()
		if err := r.Open(MailboxConfig{ID: id, Topics: []string{"t"}, Epoch: 1, HistoryBefore: before}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, id+" stores the 10 events", func() bool { st, _ := r.Status(id); return st.Events == 10 })
	}
	check := func(id string, complete bool, source string) {
		t.Helper()
		st, _ := r.Status(id)
		rs := st.Recovery
		want := RecoveryNone
		if !complete {
			want = RecoveryIncomplete
		}
		if rs.State != want || rs.HistoryComplete != complete || rs.Source != source || rs.HistoryStartsAt.IsZero() == !complete {
			t.Fatalf("%s's recovery %+v, want state %v, complete %v, source %q", id, rs, want, complete, source)
		}
		stats, err := r.Stats(context.Background(), id)
		if err != nil || stats.GetHistoryIncomplete() == complete || (stats.GetHistoryStartsAt() == nil) == !complete {
			t.Fatalf("%s's stats %v, %v", id, stats, err)
		}
	}
	open("lost@p2", "lost@p1")
	check("lost@p2", false, "lost@p1")
	if err := r.CloseMailbox("lost@p2"); err != nil {
		t.Fatal(err)
	}
	open("lost@p2", "")
	check("lost@p2", false, "lost@p1")

	open("first@p2", "")
	check("first@p2", true, "")

	open("back@p2", "")
	if err := r.CloseMailbox("back@p2"); err != nil {
		t.Fatal(err)
	}
	open("back@p2", "back@p3")
	check("back@p2", true, "")
}
