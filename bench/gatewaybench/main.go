// Command gatewaybench measures what mutual TLS adds to a query through
// prism gateway: two meshes in one process, the same in all but TLS (a real
// runner on an in-process Kafka broker, an xDS control plane, a gateway),
// one in plaintext and one with mutual TLS on every hop (gateway <-> admin
// for the routes, gateway -> runner for every query, the runner checking
// the gateway's identity). Queries alternate between the two meshes in
// blocks, so whatever else the machine does falls on both alike. The
// clients' connections to the front door and the gateway's to the runner are
// made before the clock starts and reused for every query. The front doors
// serve plaintext without query authentication in both meshes, as prism
// gateway --no-query-auth does: the figures are the cost of mTLS alone.
//
// It prints BENCH lines: gateway.query_{p50,p99}_us[_mtls] (gRPC
// QueryEvents), gateway.http_query_{p50,p99}_us[_mtls] (GET .../events) and
// the mtls/plaintext ratios of the p99s.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/gateway"
	"github.com/prism-mesh/prism/mailbox/ingest"
	"github.com/prism-mesh/prism/mailbox/runner"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/mesh/pki"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/xdstest"
	"github.com/prism-mesh/prism/xds/ir"
)

const (
	proxyID = "p1"
	mailbox = "audit@" + proxyID
	events  = 50
	// pageSize is the events one query asks for.
	pageSize = 10
)

func main() {
	n := flag.Int("n", 2000, "queries timed per mesh and door")
	block := flag.Int("block", 50, "queries in a row on one mesh before switching to the other")
	flag.Parse()
	if err := run(*n, *block); err != nil {
		fmt.Fprintln(os.Stderr, "gatewaybench:", err)
		os.Exit(1)
	}
}

func bench(name string, v float64, unit string) { fmt.Printf("BENCH %s %.3f %s\n", name, v, unit) }

var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

func run(n, block int) error {
	dir, err := os.MkdirTemp("", "gatewaybench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// A topic per mesh: the runners would share one consumer group.
	topics := [2]string{"plaintext.events", "mtls.events"}
	var seed []string
	for _, t := range topics {
		seed = append(seed, t, t+ingest.DLQSuffix)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, seed...))
	if err != nil {
		return fmt.Errorf("kfake: %w", err)
	}
	defer cluster.Close()
	for _, t := range topics {
		if err := produce(cluster.ListenAddrs(), t); err != nil {
			return err
		}
	}
	ca, err := pki.NewCA(identity.DefaultTrustDomain, 24*time.Hour)
	if err != nil {
		return err
	}
	var meshes [2]*benchMesh
	for k, mtls := range []bool{false, true} {
		m, err := startMesh(filepath.Join(dir, fmt.Sprint(k)), cluster.ListenAddrs(), topics[k], ca, mtls)
		if m != nil {
			defer m.close()
		}
		if err != nil {
			return fmt.Errorf("mesh %d (mtls %v): %w", k, mtls, err)
		}
		meshes[k] = m
	}
	doors := []struct {
		name string
		do   func(*benchMesh) error
	}{
		{"query", (*benchMesh).queryGRPC},
		{"http_query", (*benchMesh).queryHTTP},
	}
	for _, d := range doors {
		var lat [2][]time.Duration
		for k, m := range meshes {
			for range 100 { // connections, routes and caches warm
				if err := d.do(m); err != nil {
					return fmt.Errorf("%s warm-up (mesh %d): %w", d.name, k, err)
				}
			}
		}
		for len(lat[1]) < n {
			for k, m := range meshes {
				for range min(block, n-len(lat[k])) {
					t0 := time.Now()
					if err := d.do(m); err != nil {
						return fmt.Errorf("%s (mesh %d): %w", d.name, k, err)
					}
					lat[k] = append(lat[k], time.Since(t0))
				}
			}
		}
		var p99 [2]time.Duration
		for k, sfx := range []string{"", "_mtls"} {
			slices.Sort(lat[k])
			p99[k] = lat[k][len(lat[k])*99/100]
			bench("gateway."+d.name+"_p50_us"+sfx, us(lat[k][len(lat[k])/2]), "us")
			bench("gateway."+d.name+"_p99_us"+sfx, us(p99[k]), "us")
		}
		bench("gateway."+d.name+"_p99_mtls_ratio", float64(p99[1])/float64(p99[0]), "x")
	}
	return nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// produce writes the events a mailbox serves to topic.
func produce(brokers []string, topic string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	for i := range events {
		b, err := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
			MessageId: fmt.Sprintf("m-%d", i), Topic: topic, PublishedAt: timestamppb.New(time.UnixMilli(int64(1e12 + i)))}})
		if err != nil {
			return err
		}
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: b}).FirstErr(); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
	}
	return nil
}

// benchMesh is one runner, control plane and gateway, and clients of the
// gateway's two front doors.
type benchMesh struct {
	closers []func()
	grpcCC  *grpc.ClientConn
	query   mailboxv1.MailboxQueryClient
	http    *http.Client
	url     string
}

func (m *benchMesh) close() {
	for _, c := range slices.Backward(m.closers) {
		c()
	}
}

func (m *benchMesh) queryGRPC() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, mesh.HeaderMailboxID, mailbox)
	resp, err := m.query.QueryEvents(ctx, &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{Limit: pageSize}})
	if err != nil {
		return err
	}
	if len(resp.GetItems()) != pageSize {
		return fmt.Errorf("QueryEvents: %d events, want %d", len(resp.GetItems()), pageSize)
	}
	return nil
}

func (m *benchMesh) queryHTTP() error {
	resp, err := m.http.Get(m.url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d", m.url, resp.StatusCode)
	}
	return nil
}

// startMesh starts a mesh serving topic's events over mutual TLS with identities from ca (the
// runner proxy/p1, the control plane admin/a1, the gateway gateway/gw), or in
// plaintext. On error the returned mesh, if any, holds what started.
func startMesh(dir string, brokers []string, topic string, ca *pki.CA, mtls bool) (*benchMesh, error) {
	m := &benchMesh{}
	source := func(role identity.Role, name string) (*pki.Source, *pki.Files, error) {
		if !mtls {
			return nil, nil, nil
		}
		f, err := ca.IssueFiles(filepath.Join(dir, "pki", string(role)+"-"+name), pki.Request{Role: role, Name: name})
		if err != nil {
			return nil, nil, err
		}
		src, err := pki.Load(f, quiet)
		return src, &f, err
	}
	runnerTLS, _, err := source(identity.Proxy, proxyID)
	if err != nil {
		return nil, err
	}
	r, err := runner.New(runner.Config{DataDir: filepath.Join(dir, "runner"), Brokers: brokers, BatchWait: 10 * time.Millisecond,
		Logger: quiet, TLS: runnerTLS})
	if err != nil {
		return nil, err
	}
	m.closers = append(m.closers, func() { r.Close() })
	ql, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return m, err
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		ql.Close()
		return m, err
	}
	r.Serve(ql, hl)
	if err := r.Open(runner.MailboxConfig{ID: mailbox, Topics: []string{topic}, Epoch: 1}); err != nil {
		return m, err
	}
	if err := await("the runner to ingest the events", func() error {
		st, err := r.Stats(context.Background(), mailbox)
		if err == nil && st.GetTotalEvents() < events {
			err = fmt.Errorf("%d of %d events", st.GetTotalEvents(), events)
		}
		return err
	}); err != nil {
		return m, err
	}

	adminTLS, _, err := source(identity.Admin, "a1")
	if err != nil {
		return m, err
	}
	var cpOpts []grpc.ServerOption
	state := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}}
	if mtls {
		cpOpts = append(cpOpts, grpc.Creds(credentials.NewTLS(adminTLS.ServerConfig(pki.RoleIs(identity.Gateway)))))
		state.Gateway.UpstreamTLS = ir.UpstreamTLS{TrustDomain: ca.TrustDomain}
	}
	cp, err := xdstest.StartControlPlane(quiet, time.Millisecond, cpOpts...)
	if err != nil {
		return m, err
	}
	m.closers = append(m.closers, cp.Close)
	state.Admins = []string{cp.Addr}
	state.Proxies = []ir.Proxy{{ID: proxyID, RunnerID: "r1", Address: ql.Addr().String(), Healthy: true}}
	cp.Update(state)

	gwTLS, gwFiles, err := source(identity.Gateway, "gw")
	if err != nil {
		return m, err
	}
	boot, err := gateway.Bootstrap([]string{cp.Addr}, fmt.Sprintf("gatewaybench-%v", mtls), gwFiles)
	if err != nil {
		return m, err
	}
	gw, err := gateway.New(gateway.Config{Bootstrap: boot, Timeout: 10 * time.Second, Logger: quiet, TLS: gwTLS})
	if err != nil {
		return m, err
	}
	m.closers = append(m.closers, func() { gw.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := gw.Run(ctx); err != nil {
		return m, fmt.Errorf("the gateway got no routes: %w", err)
	}

	// The front doors, as prism gateway --no-query-auth serves them.
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(gw.GRPCInterceptor()))
	gw.RegisterGRPC(gs)
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return m, err
	}
	go func() { _ = gs.Serve(gl) }()
	m.closers = append(m.closers, gs.Stop)
	hs := &http.Server{Handler: gw.HTTPHandler(), ReadHeaderTimeout: 10 * time.Second}
	fl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return m, err
	}
	go func() {
		if err := hs.Serve(fl); err != nil && !errors.Is(err, http.ErrServerClosed) {
			quiet.Error("front door stopped", "err", err)
		}
	}()
	m.closers = append(m.closers, func() { hs.Close() })

	if m.grpcCC, err = grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return m, err
	}
	m.closers = append(m.closers, func() { m.grpcCC.Close() })
	m.query = mailboxv1.NewMailboxQueryClient(m.grpcCC)
	m.http = &http.Client{Timeout: 10 * time.Second}
	m.closers = append(m.closers, m.http.CloseIdleConnections)
	m.url = fmt.Sprintf("http://%s/v1/mailboxes/%s/events?limit=%d", fl.Addr(), mailbox, pageSize)
	return m, nil
}

// await retries f until it succeeds, for up to 30 s.
func await(what string, f func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
