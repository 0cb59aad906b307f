package node

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

// A sidecar that cannot serve its probes fails at once, before it registers
// the proxy or touches a lease.
func TestRunFailsOnATakenHTTPAddress(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = Run(ctx, Config{
		ProxyID: "p", AdvertiseAddr: "127.0.0.1:9090", RunnerAddr: "127.0.0.1:1", HTTPAddr: busy.Addr().String(),
		AdminEndpoints: []string{"127.0.0.1:1"}, HeartbeatInterval: time.Second, StopTimeout: time.Second,
		AttemptTimeout: time.Second, RetryMax: time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err == nil || !strings.Contains(err.Error(), "sidecar http listen") {
		t.Fatalf("Run = %v, want the listen error", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run waited for its context instead of failing")
	}
}

// A sidecar whose certificate names another identity than proxy/<its proxy
// id> refuses to start, before it dials anything.
func TestRunRefusesAnotherIdentity(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	for _, tc := range []struct {
		name string
		src  *pki.Source
		want string
	}{
		{"another proxy", p.Source(identity.Proxy, "p2"), "the TLS certificate is spiffe://prism.local/proxy/p2, want spiffe://prism.local/proxy/p1"},
		{"another role", p.Source(identity.Gateway, "p1"), "the TLS certificate is spiffe://prism.local/gateway/p1, want spiffe://prism.local/proxy/p1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := Run(ctx, Config{
				ProxyID: "p1", AdvertiseAddr: "127.0.0.1:9090", RunnerAddr: "127.0.0.1:1", HTTPAddr: "127.0.0.1:0",
				AdminEndpoints: []string{"127.0.0.1:1"}, HeartbeatInterval: time.Second, StopTimeout: time.Second,
				AttemptTimeout: time.Second, RetryMax: time.Second, TLS: tc.src,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want it to say %q", err, tc.want)
			}
			if ctx.Err() != nil {
				t.Fatal("Run waited for its context instead of failing")
			}
		})
	}
}

// The sidecar dials its runner's control API with the identity they share
// and accepts only a runner presenting that same identity, not another
// pod's runner found on the address.
func TestRunnerCredentials(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	files := p.Files(identity.Proxy, "p1")
	for _, tc := range []struct {
		name   string
		runner *pki.Source
		want   codes.Code
	}{
		// The stand-in runner implements no method: reaching it is
		// Unimplemented, refusing it Unavailable.
		{"the runner of the same proxy", load(t, files), codes.Unimplemented},
		{"the runner of another proxy", p.Source(identity.Proxy, "p2"), codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The server accepts anyone, so a refusal is the sidecar's.
			srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tc.runner.ServerConfig(pki.Any))))
			runnerv1.RegisterRunnerControlServer(srv, runnerv1.UnimplementedRunnerControlServer{})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go srv.Serve(ln)
			defer srv.Stop()
			cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(runnerCredentials(load(t, files))))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = runnerv1.NewRunnerControlClient(cc).GetStats(ctx, &runnerv1.GetStatsRequest{})
			if got := grpcstatus.Code(err); got != tc.want {
				t.Fatalf("GetStats = %v, want %v", err, tc.want)
			}
		})
	}
}

func load(t *testing.T, files pki.Files) *pki.Source {
	t.Helper()
	src, err := pki.Load(files, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return src
}
