// Package recovery proves peer recovery with real runner processes (docs/architecture.md#peer-recovery): a
// mailbox seeded by copying another runner's live mailbox over mutual TLS, driven through each runner's control
// API as its sidecar would, ends complete and equal to the source when either runner is killed (kill -9)
// mid-copy: a destination killed resumes from the last key it made durable, a source killed makes the
// destination start over; never a mailbox with holes.
package recovery

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// events is the source's history: large enough that a copy throttled to rate takes seconds.
const (
	events = 20_000
	rate   = "400KiB"
)

var cfg = &runnerv1.MailboxConfig{Topics: []string{"t"}}

// controls are the runners' control APIs as their sidecars call them, one connection each (it reconnects to a
// runner restarted on the same address).
var (
	controlsMu sync.Mutex
	controls   = map[*e2e.Runner]runnerv1.RunnerControlClient{}
)

func control(t *testing.T, r *e2e.Runner) runnerv1.RunnerControlClient {
	controlsMu.Lock()
	defer controlsMu.Unlock()
	c, ok := controls[r]
	if !ok {
		c = runnerv1.NewRunnerControlClient(e2e.Dial(t, r.PKI, r.ControlAddr, identity.Proxy, r.ProxyID))
		controls[r] = c
	}
	return c
}

// open opens and activates id on r, seeded from src when set, as a sidecar holding its lease does.
func open(t *testing.T, r *e2e.Runner, id string, epoch uint64, src *runnerv1.RecoverySource) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := control(t, r).OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: id, Config: cfg, Epoch: epoch,
		ValidFor: durationpb.New(time.Hour), RecoverFrom: src})
	if err != nil {
		t.Fatalf("open %s: %v", id, err)
	}
}

func allow(t *testing.T, r *e2e.Runner, id string, proxies ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := control(t, r).AllowRecovery(ctx, &runnerv1.AllowRecoveryRequest{MailboxId: id, ProxyIds: proxies}); err != nil {
		t.Fatalf("allow recovery of %s: %v", id, err)
	}
}

func status(t *testing.T, r *e2e.Runner, id string) *runnerv1.MailboxStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := control(t, r).GetStats(ctx, &runnerv1.GetStatsRequest{MailboxId: id})
	if err != nil || len(resp.GetMailboxes()) != 1 {
		return nil
	}
	return resp.GetMailboxes()[0]
}

// ids is every message id mailbox id answers on r's query port, as a reader, newest first.
func ids(t *testing.T, r *e2e.Runner, id string) []string {
	t.Helper()
	q := mailboxv1.NewMailboxQueryClient(e2e.Dial(t, r.PKI, r.QueryAddr, identity.Reader, "ro"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, mesh.HeaderMailboxID, id)
	var out []string
	f := &mailboxv1.EventFilter{Limit: 1000}
	for {
		resp, err := q.QueryEvents(ctx, &mailboxv1.QueryEventsRequest{Filter: f})
		if err != nil {
			t.Fatalf("query %s: %v", id, err)
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

// trim has Kafka delete the first third of each partition's records, as retention does, so a mailbox built from
// Kafka alone could not hold them.
func trim(t *testing.T, c *kafkatest.Cluster, positions []*runnerv1.StoredPosition) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = "t"
	for _, p := range positions {
		rp := kmsg.NewDeleteRecordsRequestTopicPartition()
		rp.Partition, rp.Offset = p.GetPartition(), p.GetNextOffset()/3
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 5000
	if _, err := req.RequestWith(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
}

// kill9 kills r with SIGKILL and starts it again on the same data and addresses.
func kill9(t *testing.T, r *e2e.Runner) {
	t.Helper()
	r.Kill()
	r.Restart()
	testwait.For(t, 30*time.Second, "the runner's control API", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := control(t, r).GetStats(ctx, &runnerv1.GetStatsRequest{})
		return err == nil, fmt.Sprint(err)
	})
}

// awaitCopying waits until id on r has received part of its copy.
func awaitCopying(t *testing.T, r *e2e.Runner, id string) {
	t.Helper()
	testwait.For(t, 60*time.Second, id+" copying", func() (bool, string) {
		st := status(t, r, id)
		rec := st.GetRecovery()
		return rec.GetState() == runnerv1.RecoveryState_RECOVERY_STATE_COPYING && rec.GetBytesCopied() > 0, fmt.Sprint(rec)
	})
}

// awaitComplete waits until id on r is copied whole and consuming, and checks it answers as the source does.
func awaitComplete(t *testing.T, r *e2e.Runner, id string, want []string) {
	t.Helper()
	testwait.For(t, 120*time.Second, id+" copied", func() (bool, string) {
		st := status(t, r, id)
		return st.GetRecovery().GetState() == runnerv1.RecoveryState_RECOVERY_STATE_COPIED && st.GetConsuming() &&
			st.GetEventsStored() == events, fmt.Sprint(st)
	})
	if rec := status(t, r, id).GetRecovery(); !rec.GetHistoryComplete() || rec.GetEventsCopied() != events {
		t.Fatalf("%s recovery %v", id, rec)
	}
	if got := ids(t, r, id); !slices.Equal(got, want) {
		t.Fatalf("%s answers %d events, the source %d: not the same", id, len(got), len(want))
	}
}

// TestCopyCutByKill9 kills the destination mid-copy (it resumes) and then the source mid-copy to another
// destination (that one starts over); both end whole, equal to the source, history complete although Kafka no
// longer holds its first third.
func TestCopyCutByKill9(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(2, "t", "t.dlq"))
	c.ProduceEnvelopes(t, "t", kafkatest.Envelopes("t", events)...)
	args := []string{"--batch-wait", "20ms", "--recovery-rate", rate, "--log-format", "text"}
	start := func(proxy string) *e2e.Runner {
		return e2e.StartRunner(t, e2e.RunnerOptions{Name: "runner-" + proxy, Brokers: c.Brokers, ProxyID: proxy, Args: args})
	}
	p, q, r := start("p1"), start("p2"), start("p3")
	open(t, p, "ns@p1", 1, nil)
	testwait.For(t, 120*time.Second, "the source stores every event", func() (bool, string) {
		st := status(t, p, "ns@p1")
		return st.GetEventsStored() == events && len(st.GetStoredPositions()) == 2, fmt.Sprint(st)
	})
	trim(t, c, status(t, p, "ns@p1").GetStoredPositions())
	allow(t, p, "ns@p1", "p2", "p3")
	want := ids(t, p, "ns@p1")

	// The destination killed mid-copy resumes where its import's cursor is.
	open(t, q, "ns@p2", 1, &runnerv1.RecoverySource{MailboxId: "ns@p1", Address: p.QueryAddr})
	awaitCopying(t, q, "ns@p2")
	kill9(t, q)
	if st := status(t, q, "ns@p2"); st != nil {
		t.Fatalf("a restarted runner serves %v before its sidecar opens it", st)
	}
	open(t, q, "ns@p2", 2, &runnerv1.RecoverySource{MailboxId: "ns@p1", Address: p.QueryAddr})
	awaitComplete(t, q, "ns@p2", want)

	// The source killed mid-copy: its snapshot is gone with it, so the destination starts over once it is back.
	open(t, r, "ns@p3", 1, &runnerv1.RecoverySource{MailboxId: "ns@p1", Address: p.QueryAddr})
	awaitCopying(t, r, "ns@p3")
	kill9(t, p)
	open(t, p, "ns@p1", 2, nil)
	allow(t, p, "ns@p1", "p3")
	awaitComplete(t, r, "ns@p3", want)
}
