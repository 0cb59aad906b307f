package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prism-mesh/prism/mesh/identity"
)

// handshake measures what a new connection to a real `prism admin` costs:
// a fresh client, TCP connect, the TLS 1.3 handshake with both certificates
// checked (over mTLS) and the first RPC (a health check, which the node
// authorizes by the caller's identity), then close. One single-node cluster
// per mode; with both modes the connections alternate between them, so
// whatever else the machine does falls on both alike.
func handshake(ctx context.Context, o options, dir string, mtlsModes []bool, certsFor func(bool) (*certs, error)) error {
	clusters := make([]*prismCluster, len(mtlsModes))
	for k, mtls := range mtlsModes {
		cs, err := certsFor(mtls)
		if err != nil {
			return err
		}
		c, err := startPrism(o.prism, filepath.Join(dir, fmt.Sprintf("hs%s", tlsSuffix(mtls))), 1, false, cs)
		if err != nil {
			return err
		}
		defer c.stop()
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err = c.leader(lctx, -1)
		cancel()
		if err != nil {
			return err
		}
		clusters[k] = c
	}
	took := make([][]time.Duration, len(mtlsModes))
	for range o.handshakes {
		for k, c := range clusters {
			d, err := connectOnce(ctx, c.conns)
			if err != nil {
				return fmt.Errorf("handshake%s: %w", tlsSuffix(mtlsModes[k]), err)
			}
			took[k] = append(took[k], d)
		}
	}
	var median [2]time.Duration
	for k, mtls := range mtlsModes {
		sort.Slice(took[k], func(i, j int) bool { return took[k][i] < took[k][j] })
		p := func(q float64) time.Duration { return took[k][int(q*float64(len(took[k])-1))] }
		// The issue names the mTLS figure security.handshake_ms; the same
		// measurement in plaintext is its baseline.
		sfx := ""
		if !mtls {
			sfx = "_plaintext"
		}
		bench("security.handshake_ms"+sfx, ms(p(0.5)), "ms")
		bench("security.handshake_p99_ms"+sfx, ms(p(0.99)), "ms")
		median[b2i(mtls)] = p(0.5)
	}
	ratio("security.handshake_mtls_ratio", median[0], median[1])
	return nil
}

// connectOnce times one new connection as the bench's operator, from
// creating the client to the answer of its first call.
func connectOnce(ctx context.Context, cs *conns) (time.Duration, error) {
	t0 := time.Now()
	cc, err := cs.dial(cs.addrs[0], identity.Operator, benchOperator)
	if err != nil {
		return 0, err
	}
	defer cc.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		return 0, fmt.Errorf("first call: %w", err)
	}
	return time.Since(t0), nil
}
