package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/gateway/auth"
	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// HTTPHandler serves the query API (docs/architecture.md#http-query-api) under /v1/mailboxes/{id}/
// and /v1/namespaces/{namespace}/, plus its description (/openapi.json), /metrics, /healthz and /readyz.
// Parameters are parsed and answers rendered by mailbox/query, as the
// runners do, so a query gets the same answer through the gateway as
// through Envoy. Without WithAuth every query is answered.
func (g *Gateway) HTTPHandler(opts ...Option) http.Handler {
	var d door
	for _, o := range opts {
		o(&d)
	}
	mux := http.NewServeMux()
	for _, p := range []struct {
		base, key string
	}{{"/v1/mailboxes/{id}", mesh.HeaderMailboxID}, {"/v1/namespaces/{id}", mesh.HeaderNamespace}} {
		mux.HandleFunc("GET "+p.base+"/events", handle(g, d, "QueryEvents", p.key, parseEvents, g.events))
		mux.HandleFunc("GET "+p.base+"/events/{message_id}", handle(g, d, "GetEvent", p.key, parseEvent, g.event))
		mux.HandleFunc("GET "+p.base+"/stats", handle(g, d, "GetStats", p.key, parseStats, g.stats))
		// The same paths without a method: any other method is refused
		// 405, not 404 by the catch-all below.
		for _, path := range []string{p.base + "/events", p.base + "/events/{message_id}", p.base + "/stats"} {
			mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
				httpapi.WriteMethodNotAllowed(w, r)
				g.metrics.http("none", http.StatusMethodNotAllowed, time.Now())
			})
		}
	}
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(w, http.StatusNotFound, "no such endpoint: "+mesh.Echo(r.Method+" "+r.URL.Path))
		g.metrics.http("none", http.StatusNotFound, time.Now())
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(g.cfg.Registry, promhttp.HandlerOpts{Registry: g.cfg.Registry}))
	mux.HandleFunc("GET /openapi.json", httpapi.ServeOpenAPI)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := g.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	return mux
}

// handle serves one query path: parse reads the request (checkPath the
// mailbox it names), any refusal is a 400 before the token check, then e
// answers the request req for the mailbox up names and returns the status
// it answered with.
func handle[T any](g *Gateway, d door, method, key string, parse func(*http.Request) (T, error), e func(w http.ResponseWriter, r *http.Request, up upstream, req T) int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		up := upstream{key: key, value: r.PathValue("id")}
		var req T
		err := checkPath(up)
		if err == nil {
			req, err = parse(r)
		}
		if err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, err.Error())
			g.metrics.http(method, http.StatusBadRequest, start)
			return
		}
		if d.auth != nil {
			p, err := d.auth.Request(r)
			if err == nil {
				err = mayRead(p, up)
			}
			var refusal *mesh.AuthError
			if errors.As(err, &refusal) {
				g.refused("http", method, up, refusal)
				refusal.Write(w)
				g.metrics.http(method, refusal.HTTPStatus(), start)
				return
			}
		}
		g.metrics.http(method, e(w, r, up, req), start)
	}
}

// Option changes how a front door (HTTPHandler, GRPCInterceptor) serves.
type Option func(*door)

type door struct {
	auth *auth.Authenticator
}

// WithAuth makes the door answer a query only for a caller a authenticates
// whose token (or certificate) may read the mailbox's namespace: without
// credentials, or with bad ones, 401 (gRPC Unauthenticated); for another
// namespace 403 (PermissionDenied); the runner is not asked. /openapi.json,
// /metrics, /healthz, /readyz and gRPC health stay open. A nil a checks nothing.
func WithAuth(a *auth.Authenticator) Option {
	return func(d *door) { d.auth = a }
}

// mayRead refuses a caller the namespace of the mailbox up names: the
// namespace itself for the /v1/namespaces/ alias, else the namespace part
// of the mailbox id.
func mayRead(p mesh.Principal, up upstream) error {
	if up.key == mesh.HeaderNamespace {
		return p.MayReadNamespace(up.value)
	}
	return p.MayReadMailbox(up.value)
}

// refused logs a refusal: a caller with valid credentials asking outside
// its namespaces is worth an operator's attention, a missing token is not.
func (g *Gateway) refused(api, method string, up upstream, e *mesh.AuthError) {
	level := slog.LevelDebug
	if e.Kind == mesh.Forbidden {
		level = slog.LevelInfo
	}
	g.log.Log(context.Background(), level, "query refused", "api", api, "method", method, up.logKey(), mesh.Echo(up.value), "code", e.Code(), "err", e.Msg)
}

func (g *Gateway) events(w http.ResponseWriter, r *http.Request, up upstream, req *mailboxv1.QueryEventsRequest) int {
	var resp *mailboxv1.QueryEventsResponse
	hdr, err := g.call(r.Context(), up, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = g.client.QueryEvents(ctx, req, opts...)
		return err
	})
	if err != nil {
		return writeUpstreamError(w, hdr, err)
	}
	httpapi.WriteEvents(w, answeredBy(w, hdr, up), resp)
	return http.StatusOK
}

func (g *Gateway) event(w http.ResponseWriter, r *http.Request, up upstream, req *mailboxv1.GetEventRequest) int {
	var resp *mailboxv1.GetEventResponse
	hdr, err := g.call(r.Context(), up, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = g.client.GetEvent(ctx, req, opts...)
		return err
	})
	if err != nil {
		return writeUpstreamError(w, hdr, err)
	}
	httpapi.WriteEvent(w, answeredBy(w, hdr, up), resp.GetItem())
	return http.StatusOK
}

func (g *Gateway) stats(w http.ResponseWriter, r *http.Request, up upstream, req *mailboxv1.GetStatsRequest) int {
	var resp *mailboxv1.GetStatsResponse
	hdr, err := g.call(r.Context(), up, func(ctx context.Context, opts ...grpc.CallOption) (err error) {
		resp, err = g.client.GetStats(ctx, req, opts...)
		return err
	})
	if err != nil {
		return writeUpstreamError(w, hdr, err)
	}
	answeredBy(w, hdr, up)
	httpapi.WriteStats(w, resp.GetStats())
	return http.StatusOK
}

// answeredBy copies the runner's x-prism-* headers to w and returns the
// mailbox that answered: the runner's word, else the one the path named.
func answeredBy(w http.ResponseWriter, hdr metadata.MD, up upstream) string {
	for k, v := range hdr {
		w.Header().Set(k, v[0])
	}
	if v := hdr.Get(mesh.HeaderMailbox); len(v) > 0 {
		return v[0]
	}
	return up.value
}

// writeUpstreamError answers err's gRPC code with the status the runners'
// HTTP API uses for it, and its message; it returns that status.
func writeUpstreamError(w http.ResponseWriter, hdr metadata.MD, err error) int {
	for k, v := range hdr {
		w.Header().Set(k, v[0])
	}
	st := status.Convert(err)
	code := httpapi.HTTPStatus(st.Code())
	msg := st.Message()
	if st.Code() == codes.Unavailable {
		msg = "no runner available for this mailbox: " + msg
	}
	httpapi.WriteError(w, code, msg)
	return code
}
