package gateway_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/gateway"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/pkitest"
	"github.com/prism-mesh/prism/testkit/xdstest"
	"github.com/prism-mesh/prism/xds/ir"
)

// anyClientCert serves files' certificate and asks for a client certificate
// without checking it, so a refused call is the gateway's own refusal of the
// runner.
func anyClientCert(t *testing.T, files pki.Files) grpc.ServerOption {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	return grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS13,
	}))
}

// tlsMesh is an admin node serving xDS and the not-found service over mTLS
// (admin/a1, accepting gateways only) with upstream TLS switched on.
func tlsMesh(t *testing.T, p *pkitest.PKI) *xdstest.ControlPlane {
	t.Helper()
	admin := p.Source(identity.Admin, "a1")
	cp, err := xdstest.StartControlPlane(quiet(), time.Millisecond,
		grpc.Creds(credentials.NewTLS(admin.ServerConfig(pki.RoleIs(identity.Gateway)))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	return cp
}

// tlsState is proxy proxyID's runner r1 at runnerAddr under upstream TLS.
func tlsState(cp *xdstest.ControlPlane, runnerAddr, proxyID string) *ir.IR {
	return &ir.IR{
		Version: 1,
		Gateway: ir.Gateway{Address: "127.0.0.1:8080", UpstreamTLS: ir.UpstreamTLS{TrustDomain: pkitest.TrustDomain}},
		Admins:  []string{cp.Addr},
		Lookup:  "dns:///" + cp.Addr,
		Proxies: []ir.Proxy{{ID: proxyID, RunnerID: "r1", Address: runnerAddr, Healthy: true}},
	}
}

// startTLSGateway runs a gateway with bootstrap files (nil: none) and
// returns it with its gRPC front door's address.
func startTLSGateway(t *testing.T, cp *xdstest.ControlPlane, files *pki.Files) (*gateway.Gateway, string) {
	t.Helper()
	boot, err := gateway.Bootstrap([]string{cp.Addr}, "gateway-"+t.Name(), files)
	if err != nil {
		t.Fatal(err)
	}
	cfg := gateway.Config{Bootstrap: boot, Timeout: upstreamTimeout, ProbeInterval: 20 * time.Millisecond, Logger: quiet()}
	if files != nil {
		if cfg.TLS, err = pki.Load(*files, quiet()); err != nil {
			t.Fatal(err)
		}
	}
	gw, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	gs := grpc.NewServer()
	gw.RegisterGRPC(gs)
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(gl)
	t.Cleanup(gs.Stop)
	return gw, gl.Addr().String()
}

// getStats asks the gateway's gRPC front door for mailbox's stats and
// returns the mailbox the answer names (xdstest's runner echoes the one it
// was asked for; the not-found service names none).
func getStats(t *testing.T, addr, mailbox string) (string, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*upstreamTimeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, mesh.HeaderMailboxID, mailbox)
	resp, err := mailboxv1.NewMailboxQueryClient(conn).GetStats(ctx, &mailboxv1.GetStatsRequest{})
	return resp.GetStats().GetMailboxId(), err
}

// TestGatewayUpstreamMTLS: with TLS the gateway gets its routes from an
// admin node over mTLS and queries a runner over mTLS only when the runner
// presents its cluster's proxy identity from the mesh's CA; any other
// runner certificate fails the call (Unavailable) before a byte of the
// query reaches it.
func TestGatewayUpstreamMTLS(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	other := pkitest.New(t)
	cases := []struct {
		name   string
		runner pki.Files
		want   codes.Code
	}{
		{"the cluster's proxy identity", p.Files(identity.Proxy, "p1"), codes.OK},
		{"another CA's proxy/p1", other.Files(identity.Proxy, "p1"), codes.Unavailable},
		{"another proxy", p.Files(identity.Proxy, "p2"), codes.Unavailable},
		{"not a proxy", p.Files(identity.Reader, "p1"), codes.Unavailable},
		{"an admin", p.Files(identity.Admin, "p1"), codes.Unavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cp := tlsMesh(t, p)
			r, err := xdstest.StartRunner("r1", anyClientCert(t, tc.runner))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Close)
			r.Hold("audit@p1")
			cp.Update(tlsState(cp, r.Addr, "p1"))
			gwFiles := p.Files(identity.Gateway, "gw")
			gw, addr := startTLSGateway(t, cp, &gwFiles)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// Ready means the routes came over mTLS and the admin node's
			// not-found service answered over mTLS too.
			if err := gw.Run(ctx); err != nil {
				t.Fatalf("gateway never got its routes over mTLS: %v", err)
			}
			answered, err := getStats(t, addr, "audit@p1")
			if got := status.Code(err); got != tc.want {
				t.Fatalf("GetStats = %v, want %v", err, tc.want)
			}
			if tc.want == codes.OK && answered != "audit@p1" {
				t.Fatalf("the runner answered for %q, want audit@p1", answered)
			}
		})
	}
}

// TestGatewayWithoutClientCertificateGetsNoRoutes: a gateway whose
// bootstrap has no certificates cannot subscribe to an mTLS control plane,
// so it never becomes ready.
func TestGatewayWithoutClientCertificateGetsNoRoutes(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	cp := tlsMesh(t, p)
	cp.Update(tlsState(cp, "127.0.0.1:1", "p1"))
	gw, _ := startTLSGateway(t, cp, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := gw.Run(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run = %v, want no routes until the deadline", err)
	}
	if gw.Ready() == nil {
		t.Fatal("gateway ready without routes")
	}
}
