package runner

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/query"
	"github.com/prism-mesh/prism/mesh"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// serve has r serve its query and HTTP ports on fresh loopback listeners
// and returns their addresses (host:port).
func serve(t *testing.T, r *Runner) (queryAddr, httpAddr string) {
	t.Helper()
	ql, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.Serve(ql, hl)
	return ql.Addr().String(), hl.Addr().String()
}

// gauge is the value of the metric name labelled mailbox in r's registry, or -1 when there is none.
func gauge(t *testing.T, r *Runner, name, mailbox string) float64 {
	t.Helper()
	mfs, err := r.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "mailbox" && l.GetValue() == mailbox {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}

func status(t *testing.T, url string) (int, http.Header) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// TestRunnerLifecycle hosts two mailboxes in one runner, checks readiness,
// epochs in responses, retention on an injected clock, and that a closed
// mailbox is no longer served.
func TestRunnerLifecycle(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Start(t, kafkatest.Topics(2, "a.events", "b.events", "a.events.dlq", "b.events.dlq")).Brokers
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 20 {
		topic := []string{"a.events", "b.events"}[i%2]
		b, _ := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
			MessageId: fmt.Sprint("m-", i), Topic: topic, PublishedAt: timestamppb.New(old.Add(time.Duration(i) * time.Minute))}})
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: b}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}

	// Strict would dead-letter this one; b's mailbox runs in warn mode and stores it.
	v2, _ := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 2, Metadata: &envelopev1.PrismMetadata{MessageId: "v2", Topic: "b.events"}})
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "b.events", Value: v2}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	// The clock says 2020-01-01 01:00 once retention is switched on: items
	// older than 50 minutes (m-0 … m-9) must go.
	clk := clocktesting.NewFakeClock(old.Add(-time.Hour))
	r, err := New(Config{DataDir: t.TempDir(), Brokers: brokers, RetentionInterval: 20 * time.Millisecond, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	queryAddr, httpAddr := serve(t, r)
	base := "http://" + httpAddr

	if code, _ := status(t, base+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with no mailbox = %d, want 503", code)
	}
	if err := r.Open(MailboxConfig{ID: "a@p1", Topics: []string{"a.events"}, MaxAge: 50 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := r.Open(MailboxConfig{ID: "$b@p1", Topics: []string{"b.events"}, Mode: envelope.Warn}); err != nil {
		t.Fatal(err)
	}
	if err := r.Open(MailboxConfig{ID: "a@p1", Topics: []string{"a.events"}}); err == nil {
		t.Fatal("second Open of a@p1 succeeded")
	}
	if err := r.Open(MailboxConfig{ID: "../x", Topics: []string{"a.events"}}); err == nil {
		t.Fatal("Open accepted a path-like id")
	}
	waitFor(t, "ready", func() bool { code, _ := status(t, base+"/readyz"); return code == 200 })
	cc, err := grpc.NewClient(queryAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	waitFor(t, "grpc health SERVING", func() bool {
		clk.Step(time.Second) // past a health tick
		resp, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{})
		return err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING
	})
	waitFor(t, "both mailboxes filled", func() bool {
		a, errA := r.Stats(context.Background(), "a@p1")
		b, errB := r.Stats(context.Background(), "$b@p1")
		return errA == nil && errB == nil && a.TotalEvents == 10 && b.TotalEvents == 11
	})
	// The control API's view, read at once: what each mailbox's consumer
	// and store last recorded.
	waitFor(t, "both mailboxes' statuses", func() bool {
		all := r.Statuses()
		a, b := all["a@p1"], all["$b@p1"]
		return len(all) == 2 && a.StoreKnown && a.Events == 10 && b.Events == 11 && a.Consuming && b.Consuming &&
			a.LagKnown && a.Lag == 0 && len(a.Positions) == 2 && a.Positions[0].Topic == "a.events"
	})
	if st, ok := r.Status("$b@p1"); !ok || st.Events != 11 {
		t.Fatalf("Status($b@p1) = %+v, %v", st, ok)
	}
	if _, ok := r.Status("zz@p1"); ok {
		t.Fatal("Status of a mailbox not open here")
	}

	if err := r.SetEpoch("$b@p1", 42); err != nil {
		t.Fatal(err)
	}
	code, hdr := status(t, base+"/v1/mailboxes/%24b%40p1/stats")
	if code != 200 || hdr.Get(mesh.HeaderEpoch) != "42" || hdr.Get(mesh.HeaderMailbox) != "$b@p1" {
		t.Fatalf("stats: %d, headers %v", code, hdr)
	}

	clk.SetTime(old.Add(time.Hour))
	waitFor(t, "retention of a@p1", func() bool {
		a, err := r.Stats(context.Background(), "a@p1")
		return err == nil && a.TotalEvents == 5 // m-10 … m-18 (even ids) remain
	})
	if b, _ := r.Stats(context.Background(), "$b@p1"); b.TotalEvents != 11 {
		t.Fatalf("mailbox without max age lost items: %d", b.TotalEvents)
	}
	// The pass and its sweep show in the metrics; the floor is the cutoff, 2020-01-01 00:10.
	waitFor(t, "the sweep in the metrics", func() bool { return gauge(t, r, "prism_mailbox_retention_swept_events_total", "a@p1") == 5 })
	for name, want := range map[string]float64{
		"prism_mailbox_stored_events":                     5,
		"prism_mailbox_retention_deleted_events_total":    5,
		"prism_mailbox_retention_floor_timestamp_seconds": float64(old.Add(10 * time.Minute).Unix()),
	} {
		if got := gauge(t, r, name, "a@p1"); got != want {
			t.Errorf("%s{mailbox=a@p1} = %v, want %v", name, got, want)
		}
	}
	if got := gauge(t, r, "prism_mailbox_stored_events", "$b@p1"); got != 11 {
		t.Errorf("prism_mailbox_stored_events{mailbox=$b@p1} = %v, want 11", got)
	}

	if err := r.Drain("a@p1"); err != nil {
		t.Fatal(err)
	}
	if code, _ := status(t, base+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with a drained mailbox = %d, want 503", code)
	}
	if code, _ := status(t, base+"/v1/mailboxes/a@p1/events"); code != http.StatusOK {
		t.Fatalf("drained mailbox answered %d, want 200 (still served)", code)
	}
	held, _, _ := r.Mailbox("a@p1") // as a request in flight holds it
	if err := r.CloseMailbox("a@p1"); err != nil {
		t.Fatal(err)
	}
	if _, err := held.Stats(context.Background()); !errors.Is(err, query.ErrClosed) {
		t.Fatalf("read of a closed mailbox: %v, want query.ErrClosed", err)
	}
	if err := r.CloseMailbox("a@p1"); !errors.Is(err, ErrNotOpen) {
		t.Fatalf("second close: %v", err)
	}
	if code, _ := status(t, base+"/v1/mailboxes/a@p1/events"); code != http.StatusNotFound {
		t.Fatalf("closed mailbox answered %d", code)
	}
	if ids := r.IDs(); len(ids) != 1 || ids[0] != "$b@p1" {
		t.Fatalf("IDs = %v", ids)
	}
	// Reopening resumes from the committed offsets and the same data: nothing new, nothing lost.
	if err := r.Open(MailboxConfig{ID: "a@p1", Topics: []string{"a.events"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ready again", func() bool { return r.Ready() == nil })
	if a, _ := r.Stats(context.Background(), "a@p1"); a.TotalEvents != 5 {
		t.Fatalf("reopened a@p1 holds %d items, want 5", a.TotalEvents)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Ready(); err == nil {
		t.Fatal("closed runner is ready")
	}
}
