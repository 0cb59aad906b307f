package gateway

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
)

// runnerConnectParams is how the xDS channel reconnects to a runner whose
// connection failed (docs/architecture.md#routing). grpc-go's default
// waits a full second after the first refused connect and grows to two
// minutes, so a runner that restarts on its address went unanswered for a
// second or more after it listened again. Here the first reconnect comes
// 50 ms after a failure and none waits more than 200 ms: a refused connect
// costs the runner's host next to nothing, and an endpoint the control
// plane marks unhealthy is not dialled at all. A connect attempt (TCP, TLS
// and the HTTP/2 preface) keeps grpc-go's 20 s: one shorter than the
// gateway's timeout would end an attempt an earlier query started before a
// later query's deadline, so a runner that takes connections and never
// answers would be a 503 instead of the 504 the query API documents.
var runnerConnectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
	MinConnectTimeout: 20 * time.Second,
}

// A query the mesh did not answer is sent again, up to retries times
// (docs/architecture.md#routing). Queries are reads, so a second try is
// safe. The retries wait for a connection to the runner they are routed to
// (wait for ready), all of them together at most retryWindow from the
// first: enough for a runner restarting on its address and for the
// cluster of a holder this gateway has not queried yet (grpc-go subscribes
// to it and connects on the lookup's answer), small enough that a query to
// a runner that is gone fails within about a second. The window ends only
// a wait for a connection, never a query a runner has been sent. A
// namespace query's retry takes a fresh lookup (mesh.HeaderLookupNonce),
// so one whose runner went away or no longer holds the namespace's mailbox
// is answered by the mailbox the lookup names now; a retry after an
// Unavailable answer also passes over one more of the route's copies
// (mesh.HeaderLookupSkip), so a replicated namespace fails over to its next
// in-sync replica within the request. The request's deadline bounds every
// try.
const (
	retries     = 2
	retryWindow = time.Second
)

// errNoConnection ends a retry that found no connection within the retry
// window.
var errNoConnection = errors.New("no connection to the runner within the retry window")

// upstream is what a request names its mailbox by.
type upstream struct {
	key, value string // mesh.HeaderMailboxID or mesh.HeaderNamespace
}

func (u upstream) logKey() string {
	if u.key == mesh.HeaderNamespace {
		return "namespace"
	}
	return "mailbox_id"
}

// call runs fn with the request's metadata and a bounded deadline, retried
// as the constants above say, and returns the x-prism-* headers the runner
// answered with.
func (g *Gateway) call(ctx context.Context, up upstream, fn func(context.Context, ...grpc.CallOption) error) (metadata.MD, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, up.key, up.value)
	var hdr metadata.MD
	err := fn(ctx, grpc.Header(&hdr))
	var windowEnd time.Time
	skip := 0
	for try := 1; try <= retries; try++ {
		why := retryable(up, hdr, err, try)
		if why == "" || ctx.Err() != nil {
			break
		}
		if windowEnd.IsZero() {
			windowEnd = g.cfg.Clock.Now().Add(retryWindow)
		}
		wait := windowEnd.Sub(g.cfg.Clock.Now())
		if wait <= 0 {
			break
		}
		g.metrics.retry(why)
		g.log.Debug("retrying upstream call", up.logKey(), up.value, "reason", why, "try", try, "err", status.Convert(err).Message())
		if why == "unavailable" {
			skip++
		}
		h, e, connected := g.try(ctx, up, fn, wait, skip)
		if !connected && ctx.Err() == nil {
			break // the window is spent and nothing new came: the earlier answer stands
		}
		hdr, err = h, e
	}
	switch c := status.Code(err); c {
	case codes.OK, codes.NotFound, codes.InvalidArgument, codes.Canceled:
	default:
		// The mesh failed the call, not the caller's input.
		g.log.Warn("upstream call failed", up.logKey(), up.value, "code", c.String(), "err", status.Convert(err).Message())
	}
	out := metadata.MD{}
	for _, k := range []string{mesh.HeaderMailbox, mesh.HeaderEpoch} {
		if v := hdr.Get(k); len(v) > 0 {
			out.Set(k, v[0])
		}
	}
	return out, err
}

// retryable says why an answer is tried again, or "" when it stands:
//   - Unavailable: no runner answered (refused, reset, unreachable, or
//     none healthy): the runner may be back on its address within the
//     window, or, for a namespace, the fresh lookup may name another;
//   - a namespace's NotFound from a runner that serves no mailbox of it
//     (no x-prism-mailbox, docs/architecture.md#routing), or from the admin
//     nodes for a namespace grpc-go's cached lookup had no route for:
//     once, through a fresh lookup, which names the mailbox holding the
//     namespace now. A second NotFound is the answer.
func retryable(up upstream, hdr metadata.MD, err error, try int) string {
	switch status.Code(err) {
	case codes.Unavailable:
		return "unavailable"
	case codes.NotFound:
		if up.key == mesh.HeaderNamespace && try == 1 && len(hdr.Get(mesh.HeaderMailbox)) == 0 {
			return "namespace not served"
		}
	}
	return ""
}

// try makes one retry of fn: wait for ready, ended after wait unless the
// call was sent to a runner by then; a namespace's lookup is taken anew,
// passing over the first skip of its route's mailboxes (the serving one,
// then its in-sync replicas: docs/architecture.md#replicas), so a retry
// after a copy could not answer goes to the next. connected is false when
// it was ended so.
func (g *Gateway) try(ctx context.Context, up upstream, fn func(context.Context, ...grpc.CallOption) error, wait time.Duration, skip int) (hdr metadata.MD, err error, connected bool) {
	if up.key == mesh.HeaderNamespace {
		ctx = metadata.AppendToOutgoingContext(ctx, mesh.HeaderLookupNonce, strconv.FormatUint(g.nonce.Add(1), 10))
		if skip > 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, mesh.HeaderLookupSkip, strconv.Itoa(skip))
		}
	}
	s := &sent{ch: make(chan struct{})}
	ctx, cancel := context.WithCancelCause(context.WithValue(ctx, sentKey{}, s))
	defer cancel(nil)
	t := g.cfg.Clock.NewTimer(wait)
	defer t.Stop()
	go func() {
		select {
		case <-t.C():
			select {
			case <-s.ch:
			default:
				cancel(errNoConnection)
			}
		case <-s.ch:
		case <-ctx.Done():
		}
	}()
	err = fn(ctx, grpc.Header(&hdr), grpc.WaitForReady(true))
	return hdr, err, !errors.Is(context.Cause(ctx), errNoConnection)
}

// sent is closed once a call went out on a connection to a runner.
type sent struct {
	once sync.Once
	ch   chan struct{}
}

type sentKey struct{}

// sentHandler closes the sent of a call's context when grpc-go writes the
// call's headers on a connection: from then on a retry is being answered,
// not waiting for a connection.
type sentHandler struct{}

func (sentHandler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (sentHandler) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.OutHeader); !ok {
		return
	}
	if c, ok := ctx.Value(sentKey{}).(*sent); ok {
		c.once.Do(func() { close(c.ch) })
	}
}

func (sentHandler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (sentHandler) HandleConn(context.Context, stats.ConnStats) {}
