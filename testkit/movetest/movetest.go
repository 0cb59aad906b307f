// Package movetest is the world that tests/moves and bench/movesbench run moves
// by handoff in (docs/architecture.md#moves): three `prism admin` nodes, an in-process Kafka whose
// quiet topic every namespace can read, runners with their sidecars and a
// gateway, all on loopback; a client reading namespace URLs through the
// gateway; and the properties a run's answers must keep.
package movetest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// Quiet is the topic New seeds with SeedEvents envelopes and produces no more
// to, so every mailbox of a namespace reading it holds the same events once
// caught up.
const (
	Quiet      = "moves.events"
	SeedEvents = 40
)

// Lease is every namespace's and sidecar's timing: proxies heartbeat every
// 500 ms, so a destination's progress reaches the mover within about a second.
var Lease = e2e.Lease{TTL: 3 * time.Second, Grace: time.Second, Heartbeat: 500 * time.Millisecond}

// OwnedBy is the first namespace named prefix-0, prefix-1, ... whose
// partition placement gives owner among proxies.
func OwnedBy(prefix, owner string, proxies ...string) string {
	tab := placement.Compute(proxies)
	for i := 0; ; i++ {
		if name := fmt.Sprintf("%s-%d", prefix, i); tab.Owner(placement.Partition(name)) == owner {
			return name
		}
	}
}

// World is the processes of one test or benchmark.
type World struct {
	TB      testing.TB
	Kafka   *kafkatest.Cluster
	Admins  *e2e.AdminCluster
	Proxies map[string]*Proxy
	Gateway *e2e.Gateway
	web     e2e.HTTP
}

// Proxy is one runner and its sidecar.
type Proxy struct {
	Runner  *e2e.Runner
	Sidecar *e2e.Sidecar
}

// New starts Kafka with the Quiet topic (2 partitions, seeded) and whatever
// else opts ask for, and three admin nodes.
func New(tb testing.TB, opts ...kafkatest.Option) *World {
	tb.Helper()
	w := &World{TB: tb, Proxies: map[string]*Proxy{}, web: e2e.NewHTTP(5 * time.Second)}
	w.Kafka = kafkatest.Start(tb, append([]kafkatest.Option{kafkatest.Topics(2, Quiet)}, opts...)...)
	w.Kafka.ProduceEnvelopes(tb, Quiet, kafkatest.Envelopes(Quiet, SeedEvents)...)
	w.Admins = e2e.StartAdmins(tb, e2e.AdminOptions{Size: 3})
	return w
}

// StartProxy starts proxy id's runner, with runnerArgs added to its flags,
// and its sidecar.
func (w *World) StartProxy(id string, runnerArgs ...string) {
	w.TB.Helper()
	r := e2e.StartRunner(w.TB, e2e.RunnerOptions{Name: "runner-" + id, ProxyID: id, Brokers: w.Kafka.Brokers, Args: runnerArgs})
	s := e2e.StartSidecar(w.TB, e2e.SidecarOptions{Name: "sidecar-" + id, ProxyID: id, RunnerID: id, Runner: r, Admins: w.Admins.GRPCAddrs(), Lease: Lease})
	w.Proxies[id] = &Proxy{Runner: r, Sidecar: s}
}

// StartGateway starts the `prism gateway` every query goes through.
func (w *World) StartGateway() {
	w.Gateway = e2e.StartGateway(w.TB, e2e.GatewayOptions{NodeID: "gw", Admins: w.Admins.GRPCAddrs(), Timeout: 3 * time.Second})
}

// AwaitProxies waits until ids are registered with the admin.
func (w *World) AwaitProxies(ids ...string) {
	w.TB.Helper()
	testwait.For(w.TB, 60*time.Second, "proxies registered", func() (bool, string) {
		var r *adminv1.ListProxiesResponse
		err := w.Admin(func(ctx context.Context, a adminv1.AdminClient) (err error) {
			// One page: a world has a handful of proxies, far below a page.
			r, err = a.ListProxies(ctx, &adminv1.ListProxiesRequest{})
			return err
		})
		return err == nil && len(r.GetProxies()) == len(ids), fmt.Sprint(len(r.GetProxies()), err)
	})
}

// Admin runs f on the first admin node that answers.
func (w *World) Admin(f func(context.Context, adminv1.AdminClient) error) error {
	var err error
	for _, n := range w.Admins.Nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = f(ctx, n.Admin())
		cancel()
		if err == nil {
			return nil
		}
	}
	return err
}

// Must is Admin, retried for 10 s, failing the test at the end.
func (w *World) Must(what string, f func(context.Context, adminv1.AdminClient) error) {
	w.TB.Helper()
	var err error
	for range 50 {
		if err = w.Admin(f); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	w.TB.Fatalf("%s: %v", what, err)
}

// Answer is one query's outcome.
type Answer struct {
	NS             string
	At             time.Time
	Code           int
	Mailbox, Epoch string
	Events         int64
	Err            error
}

// OK reports whether the query succeeded.
func (a Answer) OK() bool { return a.Err == nil && a.Code == 200 }

func (a Answer) String() string {
	return fmt.Sprintf("%s: %d mailbox=%q epoch=%q events=%d %v", a.NS, a.Code, a.Mailbox, a.Epoch, a.Events, a.Err)
}

// Ask queries ns's stats through the gateway's namespace URL.
func (w *World) Ask(ns string) Answer {
	code, body, hdr, err := w.web.Get(w.Gateway.HTTPURL() + "/v1/namespaces/" + ns + "/stats")
	a := Answer{NS: ns, At: time.Now(), Code: code, Err: err}
	if hdr != nil {
		a.Mailbox, a.Epoch = hdr.Get(mesh.HeaderMailbox), hdr.Get(mesh.HeaderEpoch)
	}
	var st struct {
		TotalEvents int64 `json:"total_events"`
	}
	if json.Unmarshal([]byte(body), &st) == nil {
		a.Events = st.TotalEvents
	}
	return a
}

// Served waits until every namespace is answered by its mailbox on want[ns]
// with events the namespace's event count accepts.
func (w *World) Served(want map[string]string, events func(int64) bool, bound time.Duration) {
	w.TB.Helper()
	for _, ns := range slices.Sorted(maps.Keys(want)) {
		p := want[ns]
		testwait.For(w.TB, bound, ns+" served by "+p, func() (bool, string) {
			a := w.Ask(ns)
			return a.OK() && a.Mailbox == ns+"@"+p && events(a.Events), a.String()
		})
	}
}

// Settled waits until every namespace of want is assigned to want[ns] with no
// move or handoff tail in progress, and returns when it saw that.
func (w *World) Settled(want map[string]string, bound time.Duration) time.Time {
	w.TB.Helper()
	var at time.Time
	testwait.For(w.TB, bound, "every namespace where it belongs, no move in progress", func() (bool, string) {
		got := map[string]*adminv1.Namespace{}
		if err := w.Admin(func(ctx context.Context, a adminv1.AdminClient) error {
			clear(got)
			// Every page: a bench world may hold more namespaces than one.
			return mesh.AllPages(func(token string) (*adminv1.ListNamespacesResponse, error) {
				return a.ListNamespaces(ctx, &adminv1.ListNamespacesRequest{PageToken: token})
			}, func(r *adminv1.ListNamespacesResponse) {
				for _, n := range r.GetNamespaces() {
					got[n.GetName()] = n
				}
			})
		}); err != nil {
			return false, err.Error()
		}
		at = time.Now()
		for ns, p := range want {
			n := got[ns]
			if n.GetAssignedProxyId() != p || n.GetIncomingProxyId() != "" || n.GetHandoffProxyId() != "" {
				return false, fmt.Sprintf("%s: assigned %q (want %q), incoming %q, handing off from %q", ns, n.GetAssignedProxyId(), p, n.GetIncomingProxyId(), n.GetHandoffProxyId())
			}
		}
		return true, ""
	})
	return at
}

// Reader queries namespaces until End or its deadline: workers goroutines,
// each round robin over its share, pausing between queries; it keeps every
// answer.
type Reader struct {
	mu      sync.Mutex
	answers []Answer
	stop    chan struct{}
	wg      sync.WaitGroup
}

// Read starts a Reader that stops by itself after limit.
func (w *World) Read(namespaces []string, workers int, pause, limit time.Duration) *Reader {
	r := &Reader{stop: make(chan struct{})}
	deadline := time.Now().Add(limit)
	for i := range min(workers, len(namespaces)) {
		var mine []string
		for j := i; j < len(namespaces); j += workers {
			mine = append(mine, namespaces[j])
		}
		r.wg.Go(func() {
			var got []Answer
			defer func() {
				r.mu.Lock()
				r.answers = append(r.answers, got...)
				r.mu.Unlock()
			}()
			for k := 0; time.Now().Before(deadline); k++ {
				select {
				case <-r.stop:
					return
				default:
				}
				got = append(got, w.Ask(mine[k%len(mine)]))
				time.Sleep(pause)
			}
		})
	}
	return r
}

// End stops the reader and returns its answers in the order they came.
func (r *Reader) End() []Answer {
	close(r.stop)
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.answers)
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// Verdict is the properties a move keeps over a run's answers: no failed query,
// every answer names its mailbox and epoch, and no namespace's epoch or
// event count goes down.
type Verdict struct {
	Queries, Failed, NoMailbox, EpochDown, EventsDown int
	FirstFailures, FirstDowns                         []string
}

// Judge reads answers in the order they came.
func Judge(answers []Answer) Verdict {
	var v Verdict
	lastEpoch := map[string]uint64{}
	last := map[string]Answer{}
	for _, a := range answers {
		v.Queries++
		if !a.OK() {
			v.Failed++
			if len(v.FirstFailures) < 5 {
				v.FirstFailures = append(v.FirstFailures, a.String())
			}
			continue
		}
		e, err := strconv.ParseUint(a.Epoch, 10, 64)
		if !strings.HasPrefix(a.Mailbox, a.NS+"@") || err != nil || e == 0 {
			v.NoMailbox++
			continue
		}
		if e < lastEpoch[a.NS] {
			v.EpochDown++
		}
		if prev := last[a.NS]; a.Events < prev.Events {
			v.EventsDown++
			if len(v.FirstDowns) < 5 {
				v.FirstDowns = append(v.FirstDowns, fmt.Sprintf("%s at %s after %s at %s", a, a.At.Format("15:04:05.000"), prev, prev.At.Format("15:04:05.000")))
			}
		}
		lastEpoch[a.NS], last[a.NS] = e, a
	}
	return v
}

// Kept reports whether every property held over at least one query.
func (v Verdict) Kept() bool {
	return v.Queries > 0 && v.Failed == 0 && v.NoMailbox == 0 && v.EpochDown == 0 && v.EventsDown == 0
}

func (v Verdict) String() string {
	return fmt.Sprintf("%d queries: %d failed, %d without mailbox or epoch, epoch down %d times, events down %d times; first failures %q; first drops %q",
		v.Queries, v.Failed, v.NoMailbox, v.EpochDown, v.EventsDown, v.FirstFailures, v.FirstDowns)
}
