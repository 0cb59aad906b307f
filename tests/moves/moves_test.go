// Package moves proves that namespaces move between proxies without a failed
// query (issue 15): a client reads namespace URLs through `prism gateway` in
// a tight, bounded loop while namespaces are handed off (make-before-break:
// the destination catches up from Kafka while the source serves, then one
// Raft command switches the alias, and the source keeps serving through the
// gateways' lookup age before it releases).
package moves

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/internal/e2e"
	"github.com/prism-mesh/prism/internal/kafkatest"
	"github.com/prism-mesh/prism/internal/testwait"
	"github.com/prism-mesh/prism/mesh"
)

const (
	topic  = "moves.events"
	events = 40
)

var lease = e2e.Lease{TTL: 3 * time.Second, Grace: time.Second, Heartbeat: 500 * time.Millisecond}

// world is three admin nodes, Kafka with a quiet topic every namespace
// reads (so every mailbox of a namespace holds the same events once caught
// up), runners with their sidecars, and a gateway.
type world struct {
	t       *testing.T
	kafka   *kafkatest.Cluster
	admins  *e2e.AdminCluster
	proxies map[string]*proxy
	gw      *e2e.Gateway
	web     e2e.HTTP
}

type proxy struct {
	runner  *e2e.Runner
	sidecar *e2e.Sidecar
}

// newWorld's Kafka has the quiet topic and the other topics named.
func newWorld(t *testing.T, topics ...string) *world {
	t.Helper()
	w := &world{t: t, proxies: map[string]*proxy{}, web: e2e.NewHTTP(5 * time.Second)}
	w.kafka = kafkatest.Start(t, kafkatest.Topics(2, append([]string{topic}, topics...)...))
	w.kafka.ProduceEnvelopes(t, topic, kafkatest.Envelopes(topic, events)...)
	w.admins = e2e.StartAdmins(t, e2e.AdminOptions{Size: 3})
	return w
}

func (w *world) startProxy(id string) {
	w.t.Helper()
	r := e2e.StartRunner(w.t, e2e.RunnerOptions{Name: "runner-" + id, ProxyID: id, Brokers: w.kafka.Brokers, Args: []string{"--batch-wait", "20ms"}})
	s := e2e.StartSidecar(w.t, e2e.SidecarOptions{Name: "sidecar-" + id, ProxyID: id, RunnerID: id, Runner: r, Admins: w.admins.GRPCAddrs(), Lease: lease})
	w.proxies[id] = &proxy{runner: r, sidecar: s}
}

func (w *world) startGateway() {
	w.gw = e2e.StartGateway(w.t, e2e.GatewayOptions{NodeID: "gw", Admins: w.admins.GRPCAddrs(), Timeout: 3 * time.Second})
}

// answer is one query's outcome.
type answer struct {
	ns             string
	at             time.Time
	code           int
	mailbox, epoch string
	events         int64
	body           string
	err            error
}

func (a answer) String() string {
	return fmt.Sprintf("%s: %d mailbox=%q epoch=%q events=%d %s %v", a.ns, a.code, a.mailbox, a.epoch, a.events, strings.TrimSpace(a.body), a.err)
}

func (w *world) ask(ns string) answer {
	code, body, hdr, err := w.web.Get(w.gw.HTTPURL() + "/v1/namespaces/" + ns + "/stats")
	a := answer{ns: ns, at: time.Now(), code: code, body: body, err: err}
	if hdr != nil {
		a.mailbox, a.epoch = hdr.Get(mesh.HeaderMailbox), hdr.Get(mesh.HeaderEpoch)
	}
	var st struct {
		TotalEvents int64 `json:"total_events"`
	}
	if json.Unmarshal([]byte(body), &st) == nil {
		a.events = st.TotalEvents
	}
	return a
}

// served waits until every namespace is answered by its mailbox on want[ns]
// with every event.
func (w *world) served(want map[string]string, bound time.Duration) {
	w.t.Helper()
	for ns, p := range want {
		testwait.For(w.t, bound, ns+" served by "+p, func() (bool, string) {
			a := w.ask(ns)
			return a.code == 200 && a.mailbox == ns+"@"+p && a.events == events, a.String()
		})
	}
}

// reader queries the namespaces round robin until stop, at most one
// query per few milliseconds, and keeps every answer.
type reader struct {
	mu      sync.Mutex
	answers []answer
	stop    chan struct{}
	done    chan struct{}
}

func (w *world) read(namespaces []string) *reader {
	r := &reader{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		deadline := time.Now().Add(3 * time.Minute)
		for i := 0; time.Now().Before(deadline); i++ {
			select {
			case <-r.stop:
				return
			default:
			}
			a := w.ask(namespaces[i%len(namespaces)])
			r.mu.Lock()
			r.answers = append(r.answers, a)
			r.mu.Unlock()
			time.Sleep(3 * time.Millisecond)
		}
	}()
	return r
}

func (r *reader) end() []answer {
	close(r.stop)
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.answers)
}

// check asserts issue 15's properties over a run: no failed query, every
// answer names its mailbox and epoch, each namespace's epochs never go
// down, nor its event count.
func check(t *testing.T, answers []answer) {
	t.Helper()
	if len(answers) == 0 {
		t.Fatal("no queries ran")
	}
	lastEpoch := map[string]uint64{}
	lastEvents := map[string]int64{}
	failed := 0
	for _, a := range answers {
		e, err := strconv.ParseUint(a.epoch, 10, 64)
		switch {
		case a.err != nil || a.code != 200:
			failed++
			if failed <= 5 {
				t.Errorf("failed query: %s", a)
			}
			continue
		case !strings.HasPrefix(a.mailbox, a.ns+"@") || err != nil || e == 0:
			t.Errorf("answer without its mailbox and epoch: %s", a)
			continue
		}
		if e < lastEpoch[a.ns] {
			t.Errorf("%s: epoch went down from %d: %s", a.ns, lastEpoch[a.ns], a)
		}
		if a.events < lastEvents[a.ns] {
			t.Errorf("%s: events went down from %d: %s", a.ns, lastEvents[a.ns], a)
		}
		lastEpoch[a.ns], lastEvents[a.ns] = e, a.events
	}
	if failed > 0 {
		t.Errorf("%d of %d queries failed", failed, len(answers))
	}
}

// namespace returns the admin's view of ns.
func (w *world) namespace(ctx context.Context, ns string) (*adminv1.Namespace, error) {
	var last error
	for _, n := range w.admins.Nodes {
		r, err := n.Admin().GetNamespace(ctx, &adminv1.GetNamespaceRequest{Namespace: ns})
		if err == nil {
			return r.GetNamespace(), nil
		}
		last = err
	}
	return nil, last
}

// settled waits until every namespace of want is assigned to want[ns]
// with no move or handoff tail in progress.
func (w *world) settled(want map[string]string, bound time.Duration) {
	w.t.Helper()
	testwait.For(w.t, bound, "every namespace where it belongs, no move in progress", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for ns, p := range want {
			n, err := w.namespace(ctx, ns)
			if err != nil {
				return false, err.Error()
			}
			if n.GetAssignedProxyId() != p || n.GetIncomingProxyId() != "" || n.GetHandoffProxyId() != "" {
				return false, fmt.Sprintf("%s: assigned %q (want %q), incoming %q, handing off from %q", ns, n.GetAssignedProxyId(), p, n.GetIncomingProxyId(), n.GetHandoffProxyId())
			}
		}
		return true, ""
	})
}

// TestJoinRebalancesWithoutAFailedQuery: proxy-2 joins a mesh whose
// namespaces all sit on proxy-1. Exactly the namespaces rendezvous hashing
// now gives proxy-2 move there by handoff while a client reads every
// namespace through the gateway: no query fails, no epoch or event count
// goes down, and the rest stay on proxy-1.
func TestJoinRebalancesWithoutAFailedQuery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three admin nodes, two runners with sidecars and a gateway")
	}
	w := newWorld(t)
	w.startProxy("proxy-1")
	var names []string
	for i := range 8 {
		ns := fmt.Sprintf("join-%d", i)
		w.admins.CreateNamespace(60*time.Second, ns, &adminv1.NamespaceConfig{Topics: []string{topic}, Lease: lease.Config()})
		names = append(names, ns)
	}
	w.startGateway()
	before := map[string]string{}
	for _, ns := range names {
		before[ns] = "proxy-1"
	}
	w.served(before, 60*time.Second)

	r := w.read(names)
	started := time.Now()
	w.startProxy("proxy-2")
	tab := placement.Compute([]string{"proxy-1", "proxy-2"})
	want := map[string]string{}
	moving := 0
	for _, ns := range names {
		want[ns] = tab.Owner(placement.Partition(ns))
		if want[ns] == "proxy-2" {
			moving++
		}
	}
	if moving == 0 || moving == len(names) {
		t.Fatalf("hashing puts %d of %d namespaces on proxy-2: pick other names", moving, len(names))
	}
	// Catch-up of a quiet topic is quick; the bound is the switch (a lag
	// report and a mover tick) plus the source's handoff tail (12 s), for
	// at most --max-concurrent-moves (4) at a time.
	w.settled(want, 90*time.Second)
	w.served(want, 30*time.Second)
	// The tails have ended and the sources closed their mailboxes: reads
	// go on a little to see that nothing reaches a closed one.
	time.Sleep(2 * time.Second)
	answers := r.end()
	t.Logf("%d of %d namespaces moved to proxy-2 by handoff in %v; %d queries", moving, len(names), time.Since(started).Round(time.Millisecond), len(answers))
	check(t, answers)
}
