package node

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/admin/server"
	runnernode "github.com/prism-mesh/prism/mailbox/node"
	"github.com/prism-mesh/prism/mailbox/runner"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// TestTLSEndToEnd: over mutual TLS everywhere, a sidecar registers its
// proxy with an admin node, acquires the lease of the namespace an operator
// creates and has its runner (same identity) serve the mailbox under the
// lease's epoch, which a gateway then queries; POST /drain drains the proxy
// (ControlPlane DrainProxy, as its own identity) for this sidecar process;
// on stop it releases, and the next sidecar process of the proxy is placed
// again.
func TestTLSEndToEnd(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := pkitest.New(t)
	admin, err := server.Start(server.NodeConfig{
		Raft:     raftnode.Config{ID: "solo", Bootstrap: true, Timing: raftnode.FastTiming()},
		GRPCAddr: "127.0.0.1:0", TLS: p.Source(identity.Admin, "solo"), Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = admin.Stop(ctx)
	})
	c := kafkatest.Start(t, kafkatest.Topics(1, "audit.events", "audit.events.dlq"))
	files := p.Files(identity.Proxy, "p1")
	r, err := runnernode.Start(runnernode.Config{
		Runner: runner.Config{DataDir: t.TempDir(), Brokers: c.Brokers}, TLS: load(t, files), Logger: quiet,
		ControlAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	httpAddr := freeAddr(t)
	sidecar := func() (stop func() error) {
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- Run(runCtx, Config{
				ProxyID: "p1", AdvertiseAddr: r.QueryAddr(), RunnerAddr: r.ControlAddr(), HTTPAddr: httpAddr,
				AdminEndpoints: []string{admin.GRPCAddr()}, Registration: &adminv1.ProxyRegistration{Capabilities: []string{"mailbox"}},
				HeartbeatInterval: 200 * time.Millisecond, StopTimeout: 5 * time.Second, AttemptTimeout: 2 * time.Second, RetryMax: 200 * time.Millisecond,
				TLS: load(t, files), Logger: quiet,
			})
		}()
		return func() error { cancel(); return <-done }
	}
	stop := sidecar()

	operator := p.Source(identity.Operator, "ops")
	opConn := dialTLS(t, admin.GRPCAddr(), operator.ClientConfig(pki.RoleIs(identity.Admin)))
	cp := adminv1.NewControlPlaneClient(opConn)
	eventually(t, ctx, "the operator creates namespace audit", func() error {
		_, err := cp.CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: "audit", Config: &adminv1.NamespaceConfig{Topics: []string{"audit.events"}}})
		return err
	})
	gateway := p.Source(identity.Gateway, "gw")
	qc := mailboxv1.NewMailboxQueryClient(dialTLS(t, r.QueryAddr(), gateway.ClientConfig(pki.Exactly(pkitest.ID(identity.Proxy, "p1")))))
	qctx := metadata.AppendToOutgoingContext(ctx, mesh.HeaderMailboxID, "audit@p1")
	eventually(t, ctx, "the gateway queries audit@p1 under a lease epoch", func() error {
		resp, err := qc.GetStats(qctx, &mailboxv1.GetStatsRequest{})
		if err == nil && resp.GetStats().GetEpoch() == 0 {
			return errNoEpoch
		}
		return err
	})

	// No other proxy can take audit, which the admin's watch says once the
	// proxy is drained, so the drain answers at once, long before its
	// timeout, keeping audit; what it must have done is drain the proxy for
	// this sidecar's instance.
	resp, err := http.Post("http://"+httpAddr+"/drain?timeout=5m", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Remaining        []string `json:"remaining"`
		NowhereToHandOff bool     `json:"nowhere_to_hand_off"`
	}
	err = json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !res.NowhereToHandOff || !slices.Equal(res.Remaining, []string{"audit@p1"}) {
		t.Fatalf("POST /drain: %s %+v (err %v), want 200 keeping audit@p1 for want of a proxy", resp.Status, res, err)
	}
	adm := adminv1.NewAdminClient(opConn)
	proxy := func() *adminv1.Proxy {
		t.Helper()
		p, err := adm.GetProxy(ctx, &adminv1.GetProxyRequest{ProxyId: "p1"})
		if err != nil {
			t.Fatal(err)
		}
		return p.GetProxy().GetProxy()
	}
	drained := proxy()
	if i := drained.GetDrainingInstance(); i == "" || i != drained.GetRegistration().GetInstance() || drained.GetCordoned() {
		t.Fatalf("after POST /drain: %v, want draining for the registered instance, not cordoned", drained)
	}

	if err := stop(); err != nil {
		t.Fatalf("the sidecar's stop: %v", err)
	}
	leases, err := adm.ListLeases(ctx, &adminv1.ListLeasesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.GetLeases() {
		if l.GetMailboxId() == "audit@p1" {
			t.Fatalf("lease %v still held after the sidecar stopped", l)
		}
	}

	// The pod's next sidecar process registers another instance, which
	// ends the drain: a rolling restart leaves no proxy drained.
	stop = sidecar()
	eventually(t, ctx, "the next sidecar process ends the drain", func() error {
		if p := proxy(); p.GetDrainingInstance() != "" || p.GetRegistration().GetInstance() == drained.GetRegistration().GetInstance() {
			return constError("still draining: " + p.String())
		}
		return nil
	})
	if err := stop(); err != nil {
		t.Fatalf("the second sidecar's stop: %v", err)
	}
}

type constError string

func (e constError) Error() string { return string(e) }

const errNoEpoch = constError("served without a lease epoch")

func dialTLS(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func eventually(t *testing.T, ctx context.Context, what string, try func() error) {
	t.Helper()
	var err error
	for {
		if err = try(); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting until %s: %v", what, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freeAddr is a loopback address nothing listens on just now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
