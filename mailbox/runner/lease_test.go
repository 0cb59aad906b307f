package runner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/prism-mesh/prism/mailbox/control"
	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	"github.com/prism-mesh/prism/mailbox/runner"
	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// leaseMailbox is the mailbox the sidecar drives in these tests, and
// leaseNamespace its namespace.
const (
	leaseMailbox   = "$audit@p1"
	leaseNamespace = "$audit"
)

// answerOf is what the runner's query port says to one request: the gRPC
// code (over HTTP: the status it maps to), the message, and the x-prism-*
// headers ("" = absent).
type answerOf struct {
	code           codes.Code
	msg            string
	mailbox, epoch string
}

// queryPort asks a runner's query port, where Envoy and grpc-go send gRPC
// and HTTP alike.
type queryPort struct {
	base string
	grpc mailboxv1.MailboxQueryClient
}

// ask sends one request naming key (mesh.HeaderMailboxID or
// mesh.HeaderNamespace) = value: stats, or with msgID one event.
func (q queryPort) ask(t *testing.T, overGRPC bool, key, value, msgID string) answerOf {
	t.Helper()
	if overGRPC {
		ctx := metadata.AppendToOutgoingContext(context.Background(), key, value)
		var hdr metadata.MD
		var err error
		if msgID != "" {
			_, err = q.grpc.GetEvent(ctx, &mailboxv1.GetEventRequest{MessageId: msgID}, grpc.Header(&hdr))
		} else {
			_, err = q.grpc.GetStats(ctx, &mailboxv1.GetStatsRequest{}, grpc.Header(&hdr))
		}
		one := func(k string) string { return strings.Join(hdr.Get(k), ",") }
		return answerOf{status.Code(err), status.Convert(err).Message(), one(mesh.HeaderMailbox), one(mesh.HeaderEpoch)}
	}
	path := "/v1/mailboxes/"
	if key == mesh.HeaderNamespace {
		path = "/v1/namespaces/"
	}
	// Escaped as a client would: '$' as %24, '@' as %40.
	path += strings.NewReplacer("$", "%24", "@", "%40").Replace(value)
	if msgID != "" {
		path += "/events/" + msgID
	} else {
		path += "/stats"
	}
	resp, err := http.Get(q.base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("GET %s: body %q is not JSON", path, b)
	}
	c := codes.Unknown
	for _, k := range []codes.Code{codes.OK, codes.NotFound, codes.FailedPrecondition} {
		if httpapi.HTTPStatus(k) == resp.StatusCode {
			c = k
		}
	}
	return answerOf{c, body.Error, resp.Header.Get(mesh.HeaderMailbox), resp.Header.Get(mesh.HeaderEpoch)}
}

// expect fails t unless every face of the query port answers leaseMailbox,
// by id and by namespace, as a mailbox held under epoch ("" = not held):
// stats and an unknown event answered with both headers, or NotFound naming
// what was asked with neither; a mailbox of the namespace on another proxy
// is never served here.
func (q queryPort) expect(t *testing.T, epoch string) {
	t.Helper()
	for _, overGRPC := range []bool{false, true} {
		face := "HTTP"
		if overGRPC {
			face = "gRPC"
		}
		for _, tc := range []struct {
			key, value, msgID string
			want              answerOf
		}{
			{mesh.HeaderMailboxID, leaseMailbox, "", answerOf{codes.OK, "", leaseMailbox, epoch}},
			{mesh.HeaderNamespace, leaseNamespace, "", answerOf{codes.OK, "", leaseMailbox, epoch}},
			{mesh.HeaderMailboxID, leaseMailbox, "nope", answerOf{codes.NotFound, `"nope" not found in mailbox "$audit@p1"`, leaseMailbox, epoch}},
			{mesh.HeaderNamespace, leaseNamespace, "nope", answerOf{codes.NotFound, `"nope" not found in mailbox "$audit@p1"`, leaseMailbox, epoch}},
			{mesh.HeaderMailboxID, "$audit@p2", "", answerOf{codes.NotFound, `mailbox "$audit@p2" is not served here`, "", ""}},
		} {
			if epoch == "" && tc.want.mailbox != "" {
				// Not held: what the mailbox would have answered is NotFound.
				if tc.key == mesh.HeaderNamespace {
					tc.want = answerOf{codes.NotFound, `namespace "$audit" has no mailbox served here`, "", ""}
				} else {
					tc.want = answerOf{codes.NotFound, fmt.Sprintf("mailbox %q is not served here", tc.value), "", ""}
				}
			}
			got := q.ask(t, overGRPC, tc.key, tc.value, tc.msgID)
			if got.code != tc.want.code || !strings.Contains(got.msg, tc.want.msg) || got.mailbox != tc.want.mailbox || got.epoch != tc.want.epoch {
				t.Errorf("%s %s=%s event %q: %s %q headers %q %q, want %s naming %q, headers %q %q",
					face, tc.key, tc.value, tc.msgID, got.code, got.msg, got.mailbox, got.epoch, tc.want.code, tc.want.msg, tc.want.mailbox, tc.want.epoch)
			}
		}
	}
}

// TestServesOnlyUnderLease drives a real runner through the sidecar's
// control API, as a lease is acquired, renewed, re-granted, lost, expired
// and released, and asks its query port after each step: the mailbox is
// answered exactly while the control API has it active (or drained) under
// an epoch, with that epoch in every answer, and is NotFound naming it
// otherwise. Routes per proxy send every query for *@p1 here whatever the
// lease says, so this runner alone decides.
func TestServesOnlyUnderLease(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(1, "a.events", "a.events.dlq"))
	r, err := runner.New(runner.Config{DataDir: t.TempDir(), Brokers: c.Brokers, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ql, _ := net.Listen("tcp", "127.0.0.1:0")
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	r.Serve(ql, hl)
	cc, err := grpc.NewClient(ql.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	q := queryPort{base: "http://" + ql.Addr().String(), grpc: mailboxv1.NewMailboxQueryClient(cc)}

	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ctl := control.New(control.Config{Host: r, Clock: clk, Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	validFor := durationpb.New(10 * time.Second)
	activate := func(epoch uint64) error {
		_, err := ctl.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: leaseMailbox, Epoch: epoch, ValidFor: validFor})
		return err
	}

	for _, step := range []struct {
		name    string
		do      func() error
		refused codes.Code // the control API refuses the step
		epoch   string     // served under it afterwards; "" = not served
	}{
		{"never opened", func() error { return nil }, codes.OK, ""},
		{"opened, waiting for a lease", func() error {
			_, err := ctl.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: leaseMailbox, Config: &runnerv1.MailboxConfig{Topics: []string{"a.events"}}})
			return err
		}, codes.OK, ""},
		{"lease acquired at epoch 3", func() error { return activate(3) }, codes.OK, "3"},
		{"renewed", func() error {
			_, err := ctl.ExtendMailbox(ctx, &runnerv1.ExtendMailboxRequest{MailboxId: leaseMailbox, Epoch: 3, ValidFor: validFor})
			return err
		}, codes.OK, "3"},
		{"re-granted to the same holder at epoch 5", func() error { return activate(5) }, codes.OK, "5"},
		{"fenced: the lease is lost to a newer epoch", func() error {
			_, err := ctl.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: leaseMailbox, Reason: "expired"})
			return err
		}, codes.OK, ""},
		{"a stale activation at epoch 4 is refused", func() error { return activate(4) }, codes.FailedPrecondition, ""},
		{"re-acquired at epoch 8", func() error { return activate(8) }, codes.OK, "8"},
		{"drained: still served until released", func() error {
			_, err := ctl.Drain(ctx, &runnerv1.DrainRequest{MailboxIds: []string{leaseMailbox}})
			return err
		}, codes.OK, "8"},
		{"valid_for ran out without a renewal: fenced by the runner itself", func() error {
			clk.Step(11 * time.Second)
			// The control API fences on its timer's goroutine.
			waitFor(t, "the self-fence", func() bool {
				st, err := ctl.GetStats(ctx, &runnerv1.GetStatsRequest{MailboxId: leaseMailbox})
				return err == nil && st.GetMailboxes()[0].GetState() == runnerv1.MailboxState_MAILBOX_STATE_FENCED
			})
			return nil
		}, codes.OK, ""},
		{"re-acquired at epoch 9", func() error { return activate(9) }, codes.OK, "9"},
		{"released and closed", func() error {
			_, err := ctl.CloseMailbox(ctx, &runnerv1.CloseMailboxRequest{MailboxId: leaseMailbox})
			return err
		}, codes.OK, ""},
		{"a closed mailbox is not activated by a late epoch", func() error { return activate(10) }, codes.NotFound, ""},
	} {
		if err := step.do(); status.Code(err) != step.refused {
			t.Fatalf("%s: %v, want %s", step.name, err, step.refused)
		}
		t.Run(step.name, func(t *testing.T) { q.expect(t, step.epoch) })
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
