package movesbench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"

	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/movetest"
)

// world is testkit/movetest's, which tests/moves runs in too.
type world struct{ *movetest.World }

// newWorld's Kafka has movetest.Quiet (2 partitions, seeded) and seeds.
func newWorld(b testing.TB, seeds ...kafkatest.Option) *world {
	return &world{movetest.New(b, seeds...)}
}

// atLeast accepts an event count of min or more.
func atLeast(min int64) func(int64) bool { return func(n int64) bool { return n >= min } }

// create creates namespaces reading topic and returns where hashing over
// ids places each.
func (w *world) create(names []string, topic string, ids ...string) map[string]string {
	w.TB.Helper()
	tab := placement.Compute(ids)
	where := map[string]string{}
	for _, ns := range names {
		w.Admins.CreateNamespace(60*time.Second, ns, &adminv1.NamespaceConfig{Topics: []string{topic}, Lease: movetest.Lease.Config()})
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
			err := w.Admin(func(ctx context.Context, a adminv1.AdminClient) (err error) {
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
func pauses(answers []movetest.Answer, handoffs []window) (during, quiet []time.Duration) {
	byNS := map[string][]time.Time{}
	for _, a := range answers {
		if a.OK() {
			byNS[a.NS] = append(byNS[a.NS], a.At)
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
	w.TB.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(w.Kafka.Brokers...), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		w.TB.Fatal(err)
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
			for _, e := range envelopes(topic, movetest.SeedEvents+n, max(1, rate/10)) {
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
	w.TB.Helper()
	const chunk = 50_000
	for i := 0; i < n; i += chunk {
		w.Kafka.ProduceEnvelopes(w.TB, topic, envelopes(topic, i, min(chunk, n-i))...)
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
