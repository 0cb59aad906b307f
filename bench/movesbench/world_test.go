package movesbench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/internal/e2e"
	"github.com/prism-mesh/prism/internal/kafkatest"
	"github.com/prism-mesh/prism/internal/testwait"
	"github.com/prism-mesh/prism/mesh"
)

// quiet is the topic most namespaces read; seeded with seedEvents.
const (
	quiet      = "moves.events"
	seedEvents = 40
)

// lease is tests/moves' lease timing: proxies heartbeat every 500 ms, so
// a destination's lag reaches the mover within about a second.
var lease = e2e.Lease{TTL: 3 * time.Second, Grace: time.Second, Heartbeat: 500 * time.Millisecond}

// world is three admin nodes, an in-process Kafka, runners with their
// sidecars and a gateway, all on loopback.
type world struct {
	b       testing.TB
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

// newWorld's Kafka has the quiet topic (2 partitions) and seeds.
func newWorld(b testing.TB, seeds ...kafkatest.Option) *world {
	b.Helper()
	w := &world{b: b, proxies: map[string]*proxy{}, web: e2e.NewHTTP(5 * time.Second)}
	w.kafka = kafkatest.Start(b, append([]kafkatest.Option{kafkatest.Topics(2, quiet)}, seeds...)...)
	w.kafka.ProduceEnvelopes(b, quiet, envelopes(quiet, 0, seedEvents)...)
	w.admins = e2e.StartAdmins(b, e2e.AdminOptions{Size: 3})
	return w
}

func (w *world) startProxy(id string) {
	w.b.Helper()
	r := e2e.StartRunner(w.b, e2e.RunnerOptions{Name: "runner-" + id, ProxyID: id, Brokers: w.kafka.Brokers})
	s := e2e.StartSidecar(w.b, e2e.SidecarOptions{Name: "sidecar-" + id, ProxyID: id, RunnerID: id, Runner: r, Admins: w.admins.GRPCAddrs(), Lease: lease})
	w.proxies[id] = &proxy{runner: r, sidecar: s}
}

func (w *world) startGateway() {
	w.gw = e2e.StartGateway(w.b, e2e.GatewayOptions{NodeID: "gw", Admins: w.admins.GRPCAddrs(), Timeout: 3 * time.Second})
}

// awaitProxies waits until ids are registered with the admin.
func (w *world) awaitProxies(ids ...string) {
	w.b.Helper()
	testwait.For(w.b, 60*time.Second, "proxies registered", func() (bool, string) {
		var r *adminv1.ListProxiesResponse
		err := w.admin(func(ctx context.Context, a adminv1.AdminClient) (err error) {
			r, err = a.ListProxies(ctx, &adminv1.ListProxiesRequest{})
			return err
		})
		return err == nil && len(r.GetProxies()) == len(ids), fmt.Sprint(len(r.GetProxies()), err)
	})
}

// admin runs f on the first admin node that answers.
func (w *world) admin(f func(context.Context, adminv1.AdminClient) error) error {
	var err error
	for _, n := range w.admins.Nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = f(ctx, n.Admin())
		cancel()
		if err == nil {
			return nil
		}
	}
	return err
}

// must is admin, retried for 10 s, failing the benchmark at the end.
func (w *world) must(what string, f func(context.Context, adminv1.AdminClient) error) {
	w.b.Helper()
	var err error
	for range 50 {
		if err = w.admin(f); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	w.b.Fatalf("%s: %v", what, err)
}

// create creates namespaces reading topic and returns where hashing over
// ids places each.
func (w *world) create(names []string, topic string, ids ...string) map[string]string {
	w.b.Helper()
	tab := placement.Compute(ids)
	where := map[string]string{}
	for _, ns := range names {
		w.admins.CreateNamespace(60*time.Second, ns, &adminv1.NamespaceConfig{Topics: []string{topic}, Lease: lease.Config()})
		where[ns] = tab.Owner(placement.Partition(ns))
	}
	return where
}

// namesOn returns n names prefix-i that hashing over ids places on id.
func namesOn(n int, prefix, id string, ids ...string) []string {
	tab := placement.Compute(ids)
	var out []string
	for i := 0; len(out) < n; i++ {
		if name := fmt.Sprintf("%s-%d", prefix, i); tab.Owner(placement.Partition(name)) == id {
			out = append(out, name)
		}
	}
	return out
}

// answer is one query's outcome.
type answer struct {
	ns             string
	at             time.Time
	code           int
	mailbox, epoch string
	events         int64
	err            error
}

func (a answer) ok() bool { return a.err == nil && a.code == 200 }

func (a answer) String() string {
	return fmt.Sprintf("%s: %d mailbox=%q epoch=%q events=%d %v", a.ns, a.code, a.mailbox, a.epoch, a.events, a.err)
}

// ask queries ns's stats through the gateway's namespace URL.
func (w *world) ask(ns string) answer {
	code, body, hdr, err := w.web.Get(w.gw.HTTPURL() + "/v1/namespaces/" + ns + "/stats")
	a := answer{ns: ns, at: time.Now(), code: code, err: err}
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

// served waits until every namespace is answered by its mailbox on
// want[ns] with at least min events.
func (w *world) served(want map[string]string, min int64, bound time.Duration) {
	w.b.Helper()
	for _, ns := range sortedKeys(want) {
		p := want[ns]
		testwait.For(w.b, bound, ns+" served by "+p, func() (bool, string) {
			a := w.ask(ns)
			return a.ok() && a.mailbox == ns+"@"+p && a.events >= min, a.String()
		})
	}
}

// settled waits until every namespace of want is assigned to want[ns]
// with no move or handoff tail in progress, and returns when it saw that.
func (w *world) settled(want map[string]string, bound time.Duration) time.Time {
	w.b.Helper()
	var at time.Time
	testwait.For(w.b, bound, "every namespace where it belongs, no move in progress", func() (bool, string) {
		var r *adminv1.ListNamespacesResponse
		if err := w.admin(func(ctx context.Context, a adminv1.AdminClient) (err error) {
			r, err = a.ListNamespaces(ctx, &adminv1.ListNamespacesRequest{})
			return err
		}); err != nil {
			return false, err.Error()
		}
		at = time.Now()
		got := map[string]*adminv1.Namespace{}
		for _, n := range r.GetNamespaces() {
			got[n.GetName()] = n
		}
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

// reader queries namespaces until stop: workers goroutines, each round
// robin over its share, pausing between queries; it keeps every answer.
type reader struct {
	mu      sync.Mutex
	answers []answer
	stop    chan struct{}
	wg      sync.WaitGroup
}

func (w *world) read(namespaces []string, workers int, pause time.Duration) *reader {
	r := &reader{stop: make(chan struct{})}
	deadline := time.Now().Add(8 * time.Minute)
	for i := range min(workers, len(namespaces)) {
		var mine []string
		for j := i; j < len(namespaces); j += workers {
			mine = append(mine, namespaces[j])
		}
		r.wg.Go(func() {
			var got []answer
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
				got = append(got, w.ask(mine[k%len(mine)]))
				time.Sleep(pause)
			}
		})
	}
	return r
}

func (r *reader) end() []answer {
	close(r.stop)
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.answers)
	sort.SliceStable(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// verdict is issue 15's properties over a run's answers.
type verdict struct {
	queries, failed, noMailbox, epochDown, eventsDown int
	firstFailures, firstDowns                         []string
}

func judge(answers []answer) verdict {
	var v verdict
	lastEpoch := map[string]uint64{}
	last := map[string]answer{}
	for _, a := range answers {
		v.queries++
		if !a.ok() {
			v.failed++
			if len(v.firstFailures) < 5 {
				v.firstFailures = append(v.firstFailures, a.String())
			}
			continue
		}
		e, err := strconv.ParseUint(a.epoch, 10, 64)
		if !strings.HasPrefix(a.mailbox, a.ns+"@") || err != nil || e == 0 {
			v.noMailbox++
			continue
		}
		if e < lastEpoch[a.ns] {
			v.epochDown++
		}
		if prev := last[a.ns]; a.events < prev.events {
			v.eventsDown++
			if len(v.firstDowns) < 5 {
				v.firstDowns = append(v.firstDowns, fmt.Sprintf("%s at %s after %s at %s", a, a.at.Format("15:04:05.000"), prev, prev.at.Format("15:04:05.000")))
			}
		}
		lastEpoch[a.ns], last[a.ns] = e, a
	}
	return v
}

func (v verdict) String() string {
	return fmt.Sprintf("%d queries: %d failed, %d without mailbox or epoch, epoch down %d times, events down %d times; first failures %q; first drops %q",
		v.queries, v.failed, v.noMailbox, v.epochDown, v.eventsDown, v.firstFailures, v.firstDowns)
}

// window is one handoff as ListMoves showed it: from the first poll that
// listed the move to the last.
type window struct {
	ns          string
	from, to    string
	first, last time.Time
}

// watchMoves polls ListMoves every 100 ms until stop and returns the
// handoffs it saw, keyed by namespace and move index.
func (w *world) watchMoves() (stop func() []window) {
	done := make(chan struct{})
	var out []window
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		seen := map[string]int{}
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			var r *adminv1.ListMovesResponse
			err := w.admin(func(ctx context.Context, a adminv1.AdminClient) (err error) {
				r, err = a.ListMoves(ctx, &adminv1.ListMovesRequest{})
				return err
			})
			now := time.Now()
			if err == nil {
				for _, m := range r.GetMoves() {
					k := fmt.Sprint(m.GetNamespace(), "/", m.GetMoveIndex())
					i, ok := seen[k]
					if !ok {
						i = len(out)
						seen[k] = i
						out = append(out, window{ns: m.GetNamespace(), from: m.GetFromProxyId(), to: m.GetToProxyId(), first: now})
					}
					out[i].last = now
				}
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() []window {
		close(done)
		<-finished
		return out
	}
}

// pauses is, per handoff, the longest gap between two successful answers
// of its namespace that overlaps the handoff (widened by a poll on each
// side). For comparison, quiet is the same measure over windows as long as
// the median handoff that overlap no handoff of their namespace: the gaps
// the machine's load makes anyway.
func pauses(answers []answer, handoffs []window) (during, quiet []time.Duration) {
	byNS := map[string][]time.Time{}
	for _, a := range answers {
		if a.ok() {
			byNS[a.ns] = append(byNS[a.ns], a.at)
		}
	}
	const poll = 100 * time.Millisecond
	longest := func(ns string, from, to time.Time) time.Duration {
		ts := byNS[ns]
		var d time.Duration
		for i := 1; i < len(ts); i++ {
			if ts[i-1].Before(to) && ts[i].After(from) {
				d = max(d, ts[i].Sub(ts[i-1]))
			}
		}
		return d
	}
	var lengths []time.Duration
	for _, h := range handoffs {
		from, to := h.first.Add(-poll), h.last.Add(poll)
		during = append(during, longest(h.ns, from, to))
		lengths = append(lengths, to.Sub(from))
	}
	slices.Sort(during)
	slices.Sort(lengths)
	span := percentile(lengths, 50)
	if span == 0 {
		return during, nil
	}
	for ns, ts := range byNS {
		for from := ts[0]; from.Add(span).Before(ts[len(ts)-1]); from = from.Add(span) {
			to := from.Add(span)
			if !slices.ContainsFunc(handoffs, func(h window) bool {
				return h.ns == ns && from.Before(h.last.Add(poll)) && to.After(h.first.Add(-poll))
			}) {
				quiet = append(quiet, longest(ns, from, to))
			}
		}
	}
	slices.Sort(quiet)
	return during, quiet
}

// percentile is the nearest-rank p-th percentile of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p/100+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// producer produces to topic at rate events/s (in batches every 100 ms)
// until stopped, and returns how many it produced.
func (w *world) producer(topic string, rate int) (stop func() int) {
	w.b.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(w.kafka.Brokers...), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		w.b.Fatal(err)
	}
	done, finished := make(chan struct{}), make(chan struct{})
	n := 0
	go func() {
		defer close(finished)
		defer cl.Close()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			var recs []*kgo.Record
			for _, e := range envelopes(topic, seedEvents+n, max(1, rate/10)) {
				b, err := proto.Marshal(e)
				if err != nil {
					panic(err)
				}
				recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(e.GetMetadata().GetMessageId()), Value: b})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := cl.ProduceSync(ctx, recs...).FirstErr(); err == nil {
				n += len(recs)
			}
			cancel()
		}
	}()
	return func() int {
		close(done)
		<-finished
		return n
	}
}

// produceMany produces n envelopes to topic in chunks, so a large backlog
// is never all in memory at once.
func (w *world) produceMany(topic string, n int) {
	w.b.Helper()
	const chunk = 50_000
	for i := 0; i < n; i += chunk {
		w.kafka.ProduceEnvelopes(w.b, topic, envelopes(topic, i, min(chunk, n-i))...)
	}
}

// envelopes are n envelopes numbered from first, ids unique per topic.
func envelopes(topic string, first, n int) []*envelopev1.PrismEnvelope {
	out := make([]*envelopev1.PrismEnvelope, n)
	for i := range out {
		out[i] = &envelopev1.PrismEnvelope{
			EnvelopeVersion: 1,
			Metadata:        &envelopev1.PrismMetadata{MessageId: fmt.Sprintf("%s-%08d", topic, first+i), Topic: topic, PublishedAt: timestamppb.Now()},
		}
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// figure prints one BENCH line.
func figure(name string, value any, unit string) {
	fmt.Printf("BENCH %s %v %s\n", name, value, unit)
}

// countName renders n as 1m, 200k or 1234 for a figure's name.
func countName(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dm", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return strconv.Itoa(n)
}
