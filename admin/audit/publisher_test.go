package audit

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/raftnode"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// leadership is a settable raftnode view for one package's unit test.
type leadership struct {
	mu      sync.Mutex
	l       raftnode.Leadership
	changed chan struct{}
}

func newLeadership() *leadership { return &leadership{changed: make(chan struct{})} }

func (f *leadership) Leadership() (raftnode.Leadership, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.l, f.changed
}

func (f *leadership) set(isLeader bool, term uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.l = raftnode.Leadership{IsLeader: isLeader, Term: term}
	close(f.changed)
	f.changed = make(chan struct{})
}

var t0 = time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)

// createAt is a committed CreateNamespace at index, asked for by principal.
func createAt(index uint64, principal string) fsm.Commit {
	return fsm.Commit{Index: index, Term: 1, Command: &adminv1.Command{
		Now: timestamppb.New(t0.Add(time.Duration(index) * time.Millisecond)), Principal: principal,
		Body: &adminv1.Command_CreateNamespace{CreateNamespace: &adminv1.CreateNamespaceRequest{Namespace: fmt.Sprintf("ns-%d", index)}},
	}}
}

// heartbeatAt is a committed proxy heartbeat, which the trail leaves out.
func heartbeatAt(index uint64) fsm.Commit {
	return fsm.Commit{Index: index, Term: 1, Command: &adminv1.Command{
		Now:  timestamppb.New(t0),
		Body: &adminv1.Command_ProxyHeartbeat{ProxyHeartbeat: &adminv1.ProxyHeartbeatRequest{ProxyId: "p1"}},
	}}
}

type node struct {
	p      *Publisher
	lead   *leadership
	cancel context.CancelFunc
	done   chan struct{}
}

func startNode(t *testing.T, brokers []string, cfg Config) *node {
	t.Helper()
	cfg.Brokers = brokers
	cfg.FollowerPoll = 50 * time.Millisecond
	cfg.Retry = 50 * time.Millisecond
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{p: p, lead: newLeadership(), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() { defer close(n.done); p.Run(ctx, n.lead, nil) }()
	t.Cleanup(n.stop)
	return n
}

func (n *node) stop() {
	n.cancel()
	<-n.done
	n.p.Close()
}

func (n *node) feed(cs ...fsm.Commit) {
	for _, c := range cs {
		n.p.Committed(c)
	}
}

// messageIDs reads the topic's partition 0 and returns the message ids and
// principals in order.
func messageIDs(t *testing.T, k *kafkatest.Cluster, want int) ([]string, []string) {
	t.Helper()
	var ids, principals []string
	for _, r := range k.ReadAll(t, DefaultTopic, want) {
		env := &envelopev1.PrismEnvelope{}
		if err := proto.Unmarshal(r.Value, env); err != nil {
			t.Fatalf("record at offset %d: %v", r.Offset, err)
		}
		if r.Partition != 0 {
			t.Errorf("event %s in partition %d, want 0", env.GetMetadata().GetMessageId(), r.Partition)
		}
		ids = append(ids, env.GetMetadata().GetMessageId())
		principals = append(principals, env.GetSecurity().GetPublisherId())
	}
	return ids, principals
}

// TestNewLeaderResumesAfterTheLastPublishedIndex: the leader publishes what
// it applied; it dies; a follower that applied the same entries, and more
// after, leads and publishes from the index after the topic's last, so
// every change is in the topic once, in index order, and what the trail
// leaves out is in it never.
func TestNewLeaderResumesAfterTheLastPublishedIndex(t *testing.T) {
	t.Parallel()
	k := kafkatest.Start(t, kafkatest.Topics(1, DefaultTopic))
	a := startNode(t, k.Brokers, Config{})
	b := startNode(t, k.Brokers, Config{})
	first := []fsm.Commit{createAt(1, "spiffe://prism.local/operator/alice"), heartbeatAt(2), createAt(3, "")}
	a.feed(first...)
	b.feed(first...)
	a.lead.set(true, 1)
	testwait.For(t, 10*time.Second, "leader a to publish index 3", func() (bool, string) {
		return a.p.Published() == 3, fmt.Sprintf("published %d", a.p.Published())
	})
	testwait.For(t, 10*time.Second, "follower b to trim what a published", func() (bool, string) {
		return b.p.Published() == 3, fmt.Sprintf("b knows %d published", b.p.Published())
	})
	a.stop()
	b.feed(createAt(4, "spiffe://prism.local/operator/bob"), heartbeatAt(5), createAt(6, ""))
	b.lead.set(true, 2)
	testwait.For(t, 10*time.Second, "leader b to publish index 6", func() (bool, string) {
		return b.p.Published() == 6, fmt.Sprintf("published %d", b.p.Published())
	})

	ids, principals := messageIDs(t, k, 4)
	if want := []string{"1", "3", "4", "6"}; !slices.Equal(ids, want) {
		t.Errorf("topic holds %v, want %v", ids, want)
	}
	if want := []string{"spiffe://prism.local/operator/alice", SystemPrincipal, "spiffe://prism.local/operator/bob", SystemPrincipal}; !slices.Equal(principals, want) {
		t.Errorf("principals %v, want %v", principals, want)
	}
}

// TestBacklogIsBoundedAndNeverBlocks: with no leader publishing, Committed
// returns at once whatever the backlog, which keeps the newest changes and
// counts those it dropped.
func TestBacklogIsBoundedAndNeverBlocks(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	p, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Backlog: 3, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := uint64(1); i <= 5; i++ {
		p.Committed(createAt(i, ""))
	}
	if got := testutil.ToFloat64(p.m.dropped); got != 2 {
		t.Errorf("dropped %v, want 2", got)
	}
	if got := testutil.ToFloat64(p.m.backlog); got != 3 {
		t.Errorf("backlog %v, want 3", got)
	}
	batch, last := p.next()
	var idx []uint64
	for _, e := range batch {
		idx = append(idx, e.Index)
	}
	if !slices.Equal(idx, []uint64{3, 4, 5}) || last != 5 {
		t.Errorf("next batch %v up to %d, want [3 4 5] up to 5", idx, last)
	}
}
