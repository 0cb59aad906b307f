package demo

import (
	"bytes"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
)

const events = 10_000

func generate(t *testing.T, o Options) []*envelopev1.PrismEnvelope {
	t.Helper()
	o.Clock = clocktesting.NewFakePassiveClock(time.UnixMilli(1_700_000_000_000))
	g := New(o)
	out := make([]*envelopev1.PrismEnvelope, events)
	for i := range out {
		out[i] = g.Next("audit.events")
	}
	return out
}

// runs splits the events into runs of consecutive events sharing key, and fails if a key comes back after its run.
func runs(t *testing.T, envs []*envelopev1.PrismEnvelope, name string, key func(*envelopev1.PrismEnvelope) string) [][]*envelopev1.PrismEnvelope {
	t.Helper()
	var out [][]*envelopev1.PrismEnvelope
	seen := map[string]bool{}
	for _, e := range envs {
		k := key(e)
		if n := len(out); n > 0 && key(out[n-1][0]) == k {
			out[n-1] = append(out[n-1], e)
			continue
		}
		if seen[k] {
			t.Fatalf("%s %q comes back after its run", name, k)
		}
		seen[k] = true
		out = append(out, []*envelopev1.PrismEnvelope{e})
	}
	return out
}

func traceID(e *envelopev1.PrismEnvelope) string { return e.GetObservability().GetTraceId() }
func corrID(e *envelopev1.PrismEnvelope) string  { return e.GetMetadata().GetCorrelationId() }

// Traces are runs of 5-15 events, 10 on average, made of whole requests (a correlation burst of 1-4 events never
// spans two traces), each event a span of its own: the repetition the store's posting lists see in real traffic.
func TestTracesSpanWholeRequests(t *testing.T) {
	t.Parallel()
	envs := generate(t, Options{Seed: 5})
	traces := runs(t, envs, "trace id", traceID)
	total := 0
	for i, tr := range traces[:len(traces)-1] { // the last one is cut by the end of the sample
		if len(tr) < minTrace || len(tr) > maxTrace {
			t.Fatalf("trace %d has %d events, want %d-%d", i, len(tr), minTrace, maxTrace)
		}
		total += len(tr)
		for _, e := range tr[1:] {
			if e.GetObservability().GetSampled() != tr[0].GetObservability().GetSampled() {
				t.Fatalf("trace %d: events sampled differently", i)
			}
		}
	}
	if mean := float64(total) / float64(len(traces)-1); mean < 9.5 || mean > 10.5 {
		t.Errorf("traces have %.2f events on average, want about 10", mean)
	}
	traceOf := map[string]string{}
	for _, req := range runs(t, envs, "correlation id", corrID) {
		if len(req) > 4 {
			t.Fatalf("request %s has %d events, want 1-4", corrID(req[0]), len(req))
		}
		for _, e := range req {
			if tr, ok := traceOf[corrID(e)]; ok && tr != traceID(e) {
				t.Fatalf("request %s spans traces %s and %s", corrID(e), tr, traceID(e))
			}
			traceOf[corrID(e)] = traceID(e)
		}
	}
	if n := len(traceOf); n < events/3 {
		t.Errorf("%d requests in %d events, want bursts of 2.5 or so", n, events)
	}
	spans := map[string]bool{}
	for _, e := range envs {
		spans[e.GetObservability().GetSpanId()] = true
	}
	if len(spans) != events {
		t.Errorf("%d span ids for %d events, want one each", len(spans), events)
	}
}

// UniqueTraces changes the trace ids alone: a trace per event, everything else as the same seed gives without it.
func TestUniqueTraces(t *testing.T) {
	t.Parallel()
	shared, unique := generate(t, Options{Seed: 5}), generate(t, Options{Seed: 5, UniqueTraces: true})
	ids := map[string]bool{}
	for i, e := range unique {
		ids[traceID(e)] = true
		s := shared[i]
		if corrID(e) != corrID(s) || e.GetObservability().GetSpanId() != s.GetObservability().GetSpanId() ||
			!bytes.Equal(e.GetPayload().GetValue(), s.GetPayload().GetValue()) ||
			e.GetSecurity().GetPublisherId() != s.GetSecurity().GetPublisherId() {
			t.Fatalf("event %d differs beyond its trace", i)
		}
	}
	if len(ids) != events {
		t.Errorf("%d trace ids for %d events, want one each", len(ids), events)
	}
}

// A seed gives the same envelopes; another seed others.
func TestDeterministicPerSeed(t *testing.T) {
	t.Parallel()
	for _, unique := range []bool{false, true} {
		a, b := generate(t, Options{Seed: 3, UniqueTraces: unique}), generate(t, Options{Seed: 3, UniqueTraces: unique})
		for i := range a {
			if !proto.Equal(a[i], b[i]) {
				t.Fatalf("unique traces %v: envelope %d differs between two generators of one seed", unique, i)
			}
		}
		if c := generate(t, Options{Seed: 4, UniqueTraces: unique}); proto.Equal(a[0], c[0]) {
			t.Errorf("unique traces %v: seeds 3 and 4 give the same first envelope", unique)
		}
	}
}
