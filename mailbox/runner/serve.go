package runner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/prism-mesh/prism/internal/debughttp"
	"github.com/prism-mesh/prism/mailbox/query"
	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/pki"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// readGuard lets a store close only once the reads that found it open are
// done; reads that come later get query.ErrClosed instead of a closed DB.
type readGuard struct {
	mu     sync.RWMutex
	closed bool
}

func (g *readGuard) acquire() error {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return query.ErrClosed
	}
	return nil
}

func (g *readGuard) release() { g.mu.RUnlock() }

func (g *readGuard) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// reopen serves reads again after close, once the store is swapped.
func (g *readGuard) reopen() {
	g.mu.Lock()
	g.closed = false
	g.mu.Unlock()
}

// guarded is a mailbox's store as the query servers see it.
type guarded struct{ mb *mailbox }

func (g guarded) Query(ctx context.Context, f *mailboxv1.EventFilter) (*mailboxv1.QueryEventsResponse, error) {
	if err := g.mb.reads.acquire(); err != nil {
		return nil, err
	}
	defer g.mb.reads.release()
	return g.mb.store.Load().Query(ctx, f)
}

func (g guarded) Get(ctx context.Context, id string) (*mailboxv1.MailboxItem, error) {
	if err := g.mb.reads.acquire(); err != nil {
		return nil, err
	}
	defer g.mb.reads.release()
	return g.mb.store.Load().Get(ctx, id)
}

func (g guarded) Stats(ctx context.Context) (*mailboxv1.MailboxStats, error) {
	if err := g.mb.reads.acquire(); err != nil {
		return nil, err
	}
	defer g.mb.reads.release()
	st, err := g.mb.store.Load().Stats(ctx)
	if err != nil {
		return nil, err
	}
	setHistory(st, g.mb.recoveryStatus())
	return st, nil
}

// Stats returns mailbox id's store totals with id and epoch filled in.
func (r *Runner) Stats(ctx context.Context, id string) (*mailboxv1.MailboxStats, error) {
	src, epoch, ok := r.Mailbox(id)
	if !ok {
		return nil, fmt.Errorf("stats %s: %w", id, ErrNotOpen)
	}
	st, err := src.Stats(ctx)
	if err != nil {
		return nil, fmt.Errorf("stats %s: %w", id, err)
	}
	st.MailboxId, st.Epoch = id, epoch
	return st, nil
}

// Ready reports whether the runner hosts at least one mailbox and every one
// of them is in an active consumer group session.
func (r *Runner) Ready() error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return errors.New("runner closing")
	}
	if len(r.mailboxes) == 0 {
		return errors.New("no mailbox open")
	}
	var notConsuming []string
	for id, mb := range r.mailboxes {
		if !mb.consuming() {
			notConsuming = append(notConsuming, id)
		}
	}
	if len(notConsuming) > 0 {
		slices.Sort(notConsuming)
		return fmt.Errorf("not consuming yet: %s", strings.Join(notConsuming, ", "))
	}
	return nil
}

// DiskPressure says why ingest is held back while the data dir's filesystem
// is below its free-space watermark (Config.MinFree), and is nil otherwise.
func (r *Runner) DiskPressure() error {
	if err := r.disk.Err(); err != nil {
		return fmt.Errorf("ingest paused: %w", err)
	}
	return nil
}

// Registry is where the runner's metrics live.
func (r *Runner) Registry() *prometheus.Registry { return r.reg }

// HTTPHandler serves the query API, /metrics, /healthz and /readyz.
func (r *Runner) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/", query.NewHTTPHandler(r, r.queryM))
	r.probes(mux)
	return mux
}

// probes adds /metrics, /healthz, /readyz and the query API's description,
// /openapi.json, to mux: a TLS runner serves them on its plaintext port too.
func (r *Runner) probes(mux *http.ServeMux) {
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg}))
	mux.HandleFunc("GET /openapi.json", httpapi.ServeOpenAPI)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		// A mailbox whose store failed to open is named, but does not
		// make the runner unready: that would take its other mailboxes
		// out of routing too.
		var failed strings.Builder
		fs := r.OpenFailures()
		for _, id := range slices.Sorted(maps.Keys(fs)) {
			fmt.Fprintf(&failed, "mailbox %s: store failed to open (%s): %v\n", mesh.Echo(id), openFailureReason(fs[id]), fs[id])
		}
		if err := r.cfg.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error()+"\n"+failed.String(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n" + failed.String()))
	})
}

// probeHandler is the plaintext HTTP port of a TLS runner: the probes, and
// a JSON 404 saying where the query API went instead of a bare one.
func (r *Runner) probeHandler() http.Handler {
	mux := http.NewServeMux()
	r.probes(mux)
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, _ *http.Request) {
		httpapi.WriteError(w, http.StatusNotFound, "the query API is served over mutual TLS on the query port, not on this plaintext port")
	})
	return mux
}

// RegisterGRPC adds MailboxQuery and the gRPC health service to s.
func (r *Runner) RegisterGRPC(s *grpc.Server) {
	query.NewGRPCServer(r, r.queryM).Register(s)
	r.recoverySrv.Register(s)
	healthpb.RegisterHealthServer(s, r.health)
}

// Serve answers on queryLis both gRPC and the HTTP API, telling them apart
// per request by content type, and on httpLis the HTTP API (without TLS) or
// only the probes (with TLS), until Close; it keeps the gRPC health status
// in line with Ready. queryLis is the address the sidecar advertises: Envoy
// has one endpoint per runner and sends it gRPC calls and /v1/mailboxes
// requests alike, multiplexed on one HTTP/2 connection, so one port must
// answer both. Without TLS that port speaks HTTP/1.1 and h2c; with TLS it
// offers h2 and http/1.1 by ALPN and requires a client certificate.
func (r *Runner) Serve(queryLis, httpLis net.Listener) {
	var opts []grpc.ServerOption
	if r.cfg.TLS != nil {
		p := queryPolicy()
		opts = append(opts, grpc.ChainUnaryInterceptor(p.UnaryInterceptor()), grpc.ChainStreamInterceptor(p.StreamInterceptor()))
	}
	// gRPC is served through net/http here, so grpc-go's transport limits
	// (MaxConcurrentStreams, keepalive) do not apply: the http.Servers' do,
	// with cfg.Conn's handshake and idle bounds, and cfg.Conn's listener
	// (plaintext) or HTTP/2 server (TLS) holds clients to gRPC's ping
	// policy, which net/http's HTTP/2 lacks. The size bound does apply.
	opts = append(opts, grpc.MaxSendMsgSize(query.MaxResponseBytes))
	r.grpc = grpc.NewServer(opts...)
	r.RegisterGRPC(r.grpc)
	api := r.HTTPHandler()
	var plain http.Protocols
	plain.SetHTTP1(true)
	plain.SetUnencryptedHTTP2(true)
	limited := func(h http.Handler) *http.Server {
		return r.cfg.Conn.HTTP(&http.Server{
			Handler: h, Protocols: &plain,
			HTTP2: &http.HTTP2Config{MaxConcurrentStreams: int(r.cfg.MaxStreams)},
		})
	}
	r.query = limited(grpcOr(r.grpc, api))
	r.http = limited(api)
	if r.cfg.TLS != nil {
		var secure http.Protocols
		secure.SetHTTP1(true)
		secure.SetHTTP2(true)
		r.query.Handler = grpcOr(r.grpc, authorizeHTTP(api))
		r.query.Protocols = &secure
		// Any identity of the trust domain may connect: health is open to
		// all, and a refused query is a PermissionDenied or 403 naming
		// the caller rather than a failed handshake.
		r.query.TLSConfig = r.cfg.TLS.ServerConfig(pki.Any)
		// HTTP/2 over TLS held to the ping bound too; it fails only for a
		// TLS 1.2 cipher list without HTTP/2's, and ServerConfig is TLS 1.3.
		if err := r.cfg.Conn.HTTP2(r.query); err != nil {
			r.log.Error("query port serves HTTP/2 without the ping bound", "err", err)
		}
		r.http.Handler = r.probeHandler()
	}
	if r.cfg.Pprof {
		r.http.Handler = debughttp.With(r.http.Handler)
	}
	for _, s := range []struct {
		srv *http.Server
		lis net.Listener
	}{{r.query, queryLis}, {r.http, httpLis}} {
		go func() {
			var err error
			if s.srv.TLSConfig != nil {
				err = s.srv.ServeTLS(s.lis, "", "")
			} else {
				err = s.srv.Serve(r.cfg.Conn.Listener(s.lis))
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				r.log.Error("server stopped", "addr", s.lis.Addr().String(), "err", err)
			}
		}()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stopWatch, r.watchDone = cancel, make(chan struct{})
	go r.watchHealth(ctx)
	r.log.Info("runner serving", "query_addr", queryLis.Addr().String(), "http_addr", httpLis.Addr().String(), "tls", r.cfg.TLS != nil)
}

// grpcOr sends gRPC requests (HTTP/2, content type application/grpc[+...])
// to g and every other request to h.
func grpcOr(g *grpc.Server, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.ProtoMajor == 2 && strings.HasPrefix(req.Header.Get("Content-Type"), "application/grpc") {
			g.ServeHTTP(w, req)
			return
		}
		h.ServeHTTP(w, req)
	})
}

func (r *Runner) watchHealth(ctx context.Context) {
	defer close(r.watchDone)
	t := r.cfg.Clock.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_SERVING
		if r.cfg.Ready() != nil {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		r.health.SetServingStatus("", st)
		r.health.SetServingStatus(mailboxv1.MailboxQuery_ServiceDesc.ServiceName, st)
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}
