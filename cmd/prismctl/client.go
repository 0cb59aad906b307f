package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prism-mesh/prism/internal/grpcpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// client calls an admin cluster through any of its nodes. Every node accepts
// every call (followers forward writes), so a node that answers UNAVAILABLE
// (down, no leader yet) is simply skipped; when all are, it backs off and
// goes round again until the context ends.
type client struct {
	endpoints []string
	attempt   time.Duration // per-call timeout on one endpoint

	conns grpcpool.Pool

	mu   sync.Mutex
	next int // endpoint to try first: the last one that answered
}

func newClient(admin string, attempt time.Duration) (*client, error) {
	var eps []string
	for _, e := range strings.Split(admin, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, errors.New("no admin endpoints: set --admin host:port,... or PRISM_ADMIN")
	}
	return &client{endpoints: eps, attempt: attempt}, nil
}

func (c *client) close() { c.conns.Close() }

// retryable: the node could not serve the call now, another might.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// do runs f against the endpoints until one answers with anything but a
// retryable error, with exponential backoff between rounds.
func do[T any](ctx context.Context, c *client, f func(context.Context, *grpc.ClientConn) (T, error)) (T, error) {
	var zero T
	backoff := 50 * time.Millisecond
	var errs []string
	for {
		c.mu.Lock()
		start := c.next
		c.mu.Unlock()
		for i := range c.endpoints {
			idx := (start + i) % len(c.endpoints)
			ep := c.endpoints[idx]
			cc, err := c.conns.Get(ep)
			if err != nil {
				return zero, err
			}
			actx, cancel := context.WithTimeout(ctx, c.attempt)
			resp, err := f(actx, cc)
			cancel()
			if err == nil || !retryable(err) || ctx.Err() != nil {
				if err == nil {
					c.mu.Lock()
					c.next = idx
					c.mu.Unlock()
				}
				return resp, err
			}
			errs = append(errs, fmt.Sprintf("%s: %s", ep, status.Convert(err).Message()))
		}
		select {
		case <-ctx.Done():
			return zero, status.Errorf(codes.Unavailable, "no admin node could answer: %s", strings.Join(lastN(errs, len(c.endpoints)), "; "))
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

func lastN(s []string, n int) []string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
