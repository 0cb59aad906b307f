// Package xdstest runs the xDS pipeline in-process for tests and benchmarks:
// a control plane on 127.0.0.1:0 (ADS, the not-found service and the
// namespace lookup, as an admin node serves them), MailboxQuery servers that
// serve the mailboxes they hold and say which runner answered, and grpc-go
// xDS clients with their own bootstrap.
package xdstest

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	// The RLS policy: without it grpc-go refuses (NACKs) a route table
	// naming the RLS cluster specifier plugin, as mailbox-routes does.
	_ "google.golang.org/grpc/balancer/rls"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	grpcxds "google.golang.org/grpc/xds"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/xds"
	"github.com/prism-mesh/prism/xds/lookup"
)

// ControlPlane is one admin node's xDS side.
type ControlPlane struct {
	// Addr is the gRPC address serving ADS, the not-found service and the
	// namespace lookup.
	Addr     string
	Registry *prometheus.Registry
	// Namespaces is what the lookup answers, as an FSM's namespace routes.
	Namespaces *Namespaces
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
	ns := &Namespaces{routes: map[string]*adminv1.NamespaceRoute{}}
	lookup.New(lookup.Config{Routes: ns, Logger: log}).Register(g)
	healthpb.RegisterHealthServer(g, health.NewServer())
	cp := &ControlPlane{Addr: lis.Addr().String(), Registry: reg, Namespaces: ns, ControlPlane: x, grpc: g, cancel: cancel, done: make(chan struct{})}
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

// Namespaces is a namespace → mailbox table the lookup reads, standing in
// for the FSM's namespace routes.
type Namespaces struct {
	mu     sync.Mutex
	routes map[string]*adminv1.NamespaceRoute
}

// Set routes namespace ns to mailbox id ("ns@proxy") under epoch; an empty
// id removes the route.
func (n *Namespaces) Set(ns, id string, epoch uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if id == "" {
		delete(n.routes, ns)
		return
	}
	n.routes[ns] = &adminv1.NamespaceRoute{Namespace: ns, MailboxId: id, Epoch: epoch}
}

// SetReplicas routes namespace ns to mailbox id under epoch, with the
// in-sync replicas replicas ("ns@proxy" each) after it, in order.
func (n *Namespaces) SetReplicas(ns, id string, epoch uint64, replicas ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r := &adminv1.NamespaceRoute{Namespace: ns, MailboxId: id, Epoch: epoch}
	for _, mid := range replicas {
		r.InSyncReplicas = append(r.InSyncReplicas, &adminv1.NamespaceRouteReplica{MailboxId: mid, Epoch: epoch})
	}
	n.routes[ns] = r
}

// NamespaceRoute implements lookup.Routes.
func (n *Namespaces) NamespaceRoute(ns string) (*adminv1.NamespaceRoute, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.routes[ns]
	return r, ok
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

// Runner is a MailboxQuery server standing in for a mailbox runner: it
// answers GetStats for the mailboxes it holds (Hold), by id or by
// namespace, with its own id in RunnerHeader and the mailbox id it served,
// and NotFound naming the mailbox or namespace otherwise, as a runner
// answers for a mailbox it holds no lease on.
type Runner struct {
	ID   string
	Addr string
	grpc *grpc.Server
	svc  *runnerService
}

// StartRunner serves on 127.0.0.1:0 until Close, holding nothing; opts
// configure the gRPC server.
func StartRunner(id string, opts ...grpc.ServerOption) (*Runner, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("runner %s listen: %w", id, err)
	}
	svc := &runnerService{id: id, held: map[string]bool{}}
	r := &Runner{ID: id, Addr: lis.Addr().String(), grpc: grpc.NewServer(opts...), svc: svc}
	mailboxv1.RegisterMailboxQueryServer(r.grpc, svc)
	healthpb.RegisterHealthServer(r.grpc, health.NewServer())
	go func() { _ = r.grpc.Serve(lis) }()
	return r, nil
}

// Hold makes the runner serve the mailboxes, as when it is granted their
// leases.
func (r *Runner) Hold(ids ...string) {
	r.svc.mu.Lock()
	defer r.svc.mu.Unlock()
	for _, id := range ids {
		r.svc.held[id] = true
	}
}

// Release makes the runner stop serving the mailboxes.
func (r *Runner) Release(ids ...string) {
	r.svc.mu.Lock()
	defer r.svc.mu.Unlock()
	for _, id := range ids {
		delete(r.svc.held, id)
	}
}

// Refuse makes the runner answer every query Unavailable while it keeps
// its connections, as a runner shutting down refuses (503); false ends it.
func (r *Runner) Refuse(refuse bool) {
	r.svc.mu.Lock()
	defer r.svc.mu.Unlock()
	r.svc.refuse = refuse
}

// Close stops the runner: its connections close and new ones are refused.
func (r *Runner) Close() { r.grpc.Stop() }

// Restart serves again on the address Close freed, holding what it held,
// as a runner restarted in place; opts configure the new gRPC server.
func (r *Runner) Restart(opts ...grpc.ServerOption) error {
	lis, err := net.Listen("tcp", r.Addr)
	if err != nil {
		return fmt.Errorf("runner %s listen again: %w", r.ID, err)
	}
	r.grpc = grpc.NewServer(opts...)
	mailboxv1.RegisterMailboxQueryServer(r.grpc, r.svc)
	healthpb.RegisterHealthServer(r.grpc, health.NewServer())
	go func() { _ = r.grpc.Serve(lis) }()
	return nil
}

type runnerService struct {
	mailboxv1.UnimplementedMailboxQueryServer
	id     string
	mu     sync.Mutex
	held   map[string]bool
	refuse bool
}

func (s *runnerService) GetStats(ctx context.Context, _ *mailboxv1.GetStatsRequest) (*mailboxv1.GetStatsResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	_ = grpc.SetHeader(ctx, metadata.Pairs(RunnerHeader, s.id))
	id, ns := first(md.Get(mesh.HeaderMailboxID)), first(md.Get(mesh.HeaderNamespace))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refuse {
		return nil, status.Errorf(codes.Unavailable, "runner %s is shutting down", s.id)
	}
	if id == "" && ns != "" {
		for held := range s.held {
			if m, err := mesh.ParseMailboxID(held); err == nil && m.Namespace == ns {
				id = held
			}
		}
		if id == "" {
			return nil, status.Errorf(codes.NotFound, "namespace %q is not served here", ns)
		}
	}
	if !s.held[id] {
		return nil, status.Errorf(codes.NotFound, "mailbox %q is not served here", id)
	}
	return &mailboxv1.GetStatsResponse{Stats: &mailboxv1.MailboxStats{MailboxId: id}}, nil
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
