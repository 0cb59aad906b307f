package node

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/prism-mesh/prism/mailbox/runner"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// TestTLSControlAPIOnlyItsOwnSidecar: a TLS runner's control API takes
// orders from its own identity (the sidecar's, from the same files) and
// from nobody else: no certificate, another CA, an expired certificate of
// the very same identity, another proxy or a gateway cannot fence or close
// the mailbox, which stays active and served.
func TestTLSControlAPIOnlyItsOwnSidecar(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	files := p.Files(identity.Proxy, "p1")
	load := func() *pki.Source {
		src, err := pki.Load(files, quiet())
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	c := kafkatest.Start(t, kafkatest.Topics(1, "a.events", "a.events.dlq"))
	n, err := Start(Config{
		Runner: runner.Config{DataDir: t.TempDir(), Brokers: c.Brokers}, Logger: quiet(), TLS: load(),
		ControlAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	sidecar := load()
	own := runnerv1.NewRunnerControlClient(dial(t, n.ControlAddr(), credentials.NewTLS(sidecar.ClientConfig(pki.Exactly(sidecar.Identity())))))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	validFor := durationpb.New(time.Hour)
	if _, err := own.OpenMailbox(ctx, &runnerv1.OpenMailboxRequest{MailboxId: "a@p1", Config: &runnerv1.MailboxConfig{Topics: []string{"a.events"}}}); err != nil {
		t.Fatalf("the sidecar's OpenMailbox: %v", err)
	}
	if _, err := own.ActivateMailbox(ctx, &runnerv1.ActivateMailboxRequest{MailboxId: "a@p1", Epoch: 3, ValidFor: validFor}); err != nil {
		t.Fatalf("the sidecar's ActivateMailbox: %v", err)
	}
	if _, err := own.AllowRecovery(ctx, &runnerv1.AllowRecoveryRequest{MailboxId: "a@p1", ProxyIds: []string{"p2"}}); err != nil {
		t.Fatalf("the sidecar's AllowRecovery: %v", err)
	}

	expired := p.Expired(identity.Proxy, "p1")
	for _, tc := range []struct {
		name  string
		creds credentials.TransportCredentials
	}{
		{"plaintext", insecure.NewCredentials()},
		{"no client certificate", credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})}, //nolint:gosec // the test is about the server's check
		{"certificate of another CA for the same identity", credentials.NewTLS(pkitest.Presented(t, pkitest.New(t).Files(identity.Proxy, "p1")))},
		{"expired certificate of the same identity", credentials.NewTLS(pkitest.Presented(t, expired))},
		{"another proxy", credentials.NewTLS(p.Source(identity.Proxy, "p2").ClientConfig(pki.Any))},
		{"a gateway", credentials.NewTLS(p.Source(identity.Gateway, "gw").ClientConfig(pki.Any))},
		{"an operator", credentials.NewTLS(p.Source(identity.Operator, "ops").ClientConfig(pki.Any))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := runnerv1.NewRunnerControlClient(dial(t, n.ControlAddr(), tc.creds))
			calls := map[string]func() error{
				"FenceMailbox": func() error {
					_, err := other.FenceMailbox(ctx, &runnerv1.FenceMailboxRequest{MailboxId: "a@p1", Reason: "stolen"})
					return err
				},
				"CloseMailbox": func() error {
					_, err := other.CloseMailbox(ctx, &runnerv1.CloseMailboxRequest{MailboxId: "a@p1"})
					return err
				},
				"Drain": func() error {
					_, err := other.Drain(ctx, &runnerv1.DrainRequest{})
					return err
				},
				"GetStats": func() error {
					_, err := other.GetStats(ctx, &runnerv1.GetStatsRequest{})
					return err
				},
				"AllowRecovery": func() error {
					_, err := other.AllowRecovery(ctx, &runnerv1.AllowRecoveryRequest{MailboxId: "a@p1", ProxyIds: []string{"p2"}})
					return err
				},
			}
			for name, call := range calls {
				// The handshake refuses every identity but the runner's
				// own, so the call fails before any method is reached.
				if err := call(); grpcstatus.Code(err) != codes.Unavailable {
					t.Errorf("%s = %v, want the connection refused (Unavailable)", name, err)
				}
			}
			st, err := own.GetStats(ctx, &runnerv1.GetStatsRequest{MailboxId: "a@p1"})
			if err != nil {
				t.Fatal(err)
			}
			if got := st.GetMailboxes(); len(got) != 1 || got[0].GetState() != runnerv1.MailboxState_MAILBOX_STATE_ACTIVE || got[0].GetEpoch() != 3 || got[0].GetDrained() {
				t.Fatalf("after the refused calls the mailbox is %v, want ACTIVE under epoch 3, not drained", got)
			}
		})
	}

	// Still served on the query port, to a gateway.
	gw := p.Source(identity.Gateway, "gw")
	qc := mailboxv1.NewMailboxQueryClient(dial(t, n.QueryAddr(), credentials.NewTLS(gw.ClientConfig(pki.Exactly(sidecar.Identity())))))
	qctx := metadata.AppendToOutgoingContext(ctx, mesh.HeaderMailboxID, "a@p1")
	resp, err := qc.GetStats(qctx, &mailboxv1.GetStatsRequest{})
	if err != nil || resp.GetStats().GetMailboxId() != "a@p1" || resp.GetStats().GetEpoch() != 3 {
		t.Fatalf("the gateway's GetStats = %v, %v; want a@p1 served under epoch 3", resp, err)
	}
}

// The control policy names every RunnerControl method: a method missing
// from it would be refused even to the runner's own sidecar.
func TestControlPolicyNamesEveryMethod(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	files := p.Files(identity.Proxy, "p1")
	src, err := pki.Load(files, quiet())
	if err != nil {
		t.Fatal(err)
	}
	n, err := Start(Config{
		Runner: runnerConfig(t), Logger: quiet(), TLS: src,
		ControlAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	cc := dial(t, n.ControlAddr(), credentials.NewTLS(src.ClientConfig(pki.Exactly(src.Identity()))))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, m := range runnerv1.RunnerControl_ServiceDesc.Methods {
		method := "/" + runnerv1.RunnerControl_ServiceDesc.ServiceName + "/" + m.MethodName
		// An empty request: the handler refuses it (InvalidArgument,
		// NotFound) or answers, but the policy must not.
		err := cc.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{})
		if c := grpcstatus.Code(err); c == codes.PermissionDenied || c == codes.Unauthenticated || c == codes.Unavailable {
			t.Errorf("%s from the runner's own identity = %v", method, err)
		}
	}
}
