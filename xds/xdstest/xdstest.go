// Package xdstest runs the xDS pipeline in-process for tests and benchmarks:
// a control plane on 127.0.0.1:0 (ADS plus the not-found service, as an admin
// node serves them), MailboxQuery servers that say which runner answered, and
// grpc-go xDS clients with their own bootstrap.
package xdstest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	// The RLS policy: without it grpc-go refuses (NACKs) a route table
	// naming the RLS cluster specifier plugin, as mailbox-routes does.
	_ "google.golang.org/grpc/balancer/rls"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	grpcxds "google.golang.org/grpc/xds"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/xds"
)

// ControlPlane is one admin node's xDS side.
type ControlPlane struct {
	// Addr is the gRPC address serving ADS and the not-found service.
	Addr     string
	Registry *prometheus.Registry
	*xds.ControlPlane

	grpc   *grpc.Server
	cancel context.CancelFunc
	done   chan struct{}
}

// StartControlPlane serves xDS on 127.0.0.1:0 until Close. debounce 0 takes
// the updater's default; opts configure the gRPC server (e.g. its TLS
// credentials).
func StartControlPlane(log *slog.Logger, debounce time.Duration, opts ...grpc.ServerOption) (*ControlPlane, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("control plane listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	reg := prometheus.NewRegistry()
	x := xds.New(ctx, xds.Config{Registerer: reg, Log: log, Debounce: debounce})
	g := grpc.NewServer(opts...)
	x.Register(g)
	healthpb.RegisterHealthServer(g, health.NewServer())
	cp := &ControlPlane{Addr: lis.Addr().String(), Registry: reg, ControlPlane: x, grpc: g, cancel: cancel, done: make(chan struct{})}
	go func() { _ = g.Serve(lis) }()
	go func() { defer close(cp.done); _ = x.Run(ctx) }()
	return cp, nil
}

// Close stops serving.
func (cp *ControlPlane) Close() {
	cp.cancel()
	<-cp.done
	cp.grpc.Stop()
}

// Bootstrap is a grpc-go xDS bootstrap pointing at the ADS server addr.
func Bootstrap(addr, nodeID string) []byte {
	b, _ := json.Marshal(map[string]any{
		"xds_servers": []any{map[string]any{
			"server_uri":      addr,
			"channel_creds":   []any{map[string]any{"type": "insecure"}},
			"server_features": []string{"xds_v3"},
		}},
		"node": map[string]any{"id": nodeID, "cluster": "prism-gateway"},
	})
	return b
}

// DialMailboxQuery connects to xds:///mailbox-query through grpc-go's xDS
// resolver, configured with bootstrap rather than the process environment so
// tests can run in parallel.
func DialMailboxQuery(bootstrap []byte) (*grpc.ClientConn, error) {
	rb, err := grpcxds.NewXDSResolverWithConfigForTesting(bootstrap)
	if err != nil {
		return nil, fmt.Errorf("xds resolver: %w", err)
	}
	return grpc.NewClient("xds:///"+mesh.QueryListenerName,
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(rb))
}

// RunnerHeader is the response header a test runner names itself in.
const RunnerHeader = "x-test-runner"

// Runner is a MailboxQuery server that answers GetStats for any mailbox with
// its own id in RunnerHeader and the mailbox id it was asked for.
type Runner struct {
	ID   string
	Addr string
	grpc *grpc.Server
}

// StartRunner serves on 127.0.0.1:0 until Close; opts configure the gRPC
// server.
func StartRunner(id string, opts ...grpc.ServerOption) (*Runner, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("runner %s listen: %w", id, err)
	}
	r := &Runner{ID: id, Addr: lis.Addr().String(), grpc: grpc.NewServer(opts...)}
	mailboxv1.RegisterMailboxQueryServer(r.grpc, &runnerService{id: id})
	healthpb.RegisterHealthServer(r.grpc, health.NewServer())
	go func() { _ = r.grpc.Serve(lis) }()
	return r, nil
}

// Close stops the runner.
func (r *Runner) Close() { r.grpc.Stop() }

type runnerService struct {
	mailboxv1.UnimplementedMailboxQueryServer
	id string
}

func (s *runnerService) GetStats(ctx context.Context, _ *mailboxv1.GetStatsRequest) (*mailboxv1.GetStatsResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	_ = grpc.SetHeader(ctx, metadata.Pairs(RunnerHeader, s.id))
	return &mailboxv1.GetStatsResponse{Stats: &mailboxv1.MailboxStats{MailboxId: first(md.Get(mesh.HeaderMailboxID))}}, nil
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// WhoAnswers asks for the stats of mailbox through conn and returns the
// runner that answered, or the call's error.
func WhoAnswers(ctx context.Context, conn *grpc.ClientConn, mailbox string) (string, error) {
	ctx = metadata.AppendToOutgoingContext(ctx, mesh.HeaderMailboxID, mailbox)
	var hdr metadata.MD
	resp, err := mailboxv1.NewMailboxQueryClient(conn).GetStats(ctx, &mailboxv1.GetStatsRequest{}, grpc.Header(&hdr))
	if err != nil {
		return "", err
	}
	if got := resp.GetStats().GetMailboxId(); got != mailbox {
		return "", fmt.Errorf("runner answered for mailbox %q, asked %q", got, mailbox)
	}
	return first(hdr.Get(RunnerHeader)), nil
}
