package query

import (
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	"github.com/prism-mesh/prism/mesh"
)

// NewHTTPHandler serves the HTTP/JSON query API of the mailboxes found through
// mb. Mailbox ids hold '$' and '@' and may arrive percent-encoded: ServeMux
// matches the escaped path segment by segment and PathValue unescapes it, so
// "/v1/mailboxes/%24admin%40proxy-01/events" names "$admin@proxy-01" (and an
// escaped '/' in a message id stays inside its segment).
func NewHTTPHandler(mb Mailboxes, m *Metrics) http.Handler {
	h := &httpServer{mailboxes: mb, metrics: m}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/mailboxes/{id}/events", h.events)
	mux.HandleFunc("GET /v1/mailboxes/{id}/events/{message_id}", h.event)
	mux.HandleFunc("GET /v1/mailboxes/{id}/stats", h.stats)
	// The same paths without a method: any other method is refused 405,
	// not 404 by the catch-all below.
	for _, p := range []string{"/v1/mailboxes/{id}/events", "/v1/mailboxes/{id}/events/{message_id}", "/v1/mailboxes/{id}/stats"} {
		mux.HandleFunc(p, httpapi.WriteMethodNotAllowed)
	}
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(w, http.StatusNotFound, "no such endpoint: "+mesh.Echo(r.Method+" "+r.URL.Path))
	})
	return mux
}

type httpServer struct {
	mailboxes Mailboxes
	metrics   *Metrics
}

// resolve finds the path's mailbox, sets the headers naming it, and answers
// 404 itself when it is not served here.
func (h *httpServer) resolve(w http.ResponseWriter, r *http.Request) (string, Source, uint64, bool) {
	id := r.PathValue("id")
	src, epoch, ok := h.mailboxes.Mailbox(id)
	if !ok {
		httpapi.WriteError(w, http.StatusNotFound, "mailbox "+strconv.Quote(mesh.Echo(id))+" is not served here")
		return "", nil, 0, false
	}
	w.Header().Set(mesh.HeaderMailbox, id)
	if epoch != 0 {
		w.Header().Set(mesh.HeaderEpoch, strconv.FormatUint(epoch, 10))
	}
	return id, src, epoch, true
}

func (h *httpServer) events(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id, src, _, ok := h.resolve(w, r)
	if !ok {
		h.metrics.observe("http", "QueryEvents", "", start, codes.NotFound)
		return
	}
	f, err := httpapi.ParseFilter(r.URL.Query())
	if err != nil {
		httpapi.WriteError(w, http.StatusBadRequest, err.Error())
		h.metrics.observe("http", "QueryEvents", id, start, codes.InvalidArgument)
		return
	}
	resp, err := src.Query(r.Context(), f)
	if err != nil {
		h.metrics.observe("http", "QueryEvents", id, start, writeStoreError(w, err))
		return
	}
	if err := bounded(resp); err != nil {
		httpapi.WriteError(w, httpapi.HTTPStatus(codes.OutOfRange), status.Convert(err).Message())
		h.metrics.observe("http", "QueryEvents", id, start, codes.OutOfRange)
		return
	}
	httpapi.WriteEvents(w, id, resp)
	h.metrics.observe("http", "QueryEvents", id, start, codes.OK)
}

func (h *httpServer) event(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id, src, _, ok := h.resolve(w, r)
	if !ok {
		h.metrics.observe("http", "GetEvent", "", start, codes.NotFound)
		return
	}
	msgID := r.PathValue("message_id")
	it, err := src.Get(r.Context(), msgID)
	if err != nil {
		if code(err) == codes.NotFound {
			httpapi.WriteError(w, http.StatusNotFound, "message_id "+strconv.Quote(mesh.Echo(msgID))+" not found in mailbox "+strconv.Quote(mesh.Echo(id)))
			h.metrics.observe("http", "GetEvent", id, start, codes.NotFound)
			return
		}
		h.metrics.observe("http", "GetEvent", id, start, writeStoreError(w, err))
		return
	}
	httpapi.WriteEvent(w, id, it)
	h.metrics.observe("http", "GetEvent", id, start, codes.OK)
}

func (h *httpServer) stats(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id, src, epoch, ok := h.resolve(w, r)
	if !ok {
		h.metrics.observe("http", "GetStats", "", start, codes.NotFound)
		return
	}
	st, err := stats(r.Context(), id, epoch, src)
	if err != nil {
		h.metrics.observe("http", "GetStats", id, start, writeStoreError(w, err))
		return
	}
	httpapi.WriteStats(w, st)
	h.metrics.observe("http", "GetStats", id, start, codes.OK)
}

// writeStoreError answers a store error with the status matching its code.
func writeStoreError(w http.ResponseWriter, err error) codes.Code {
	c := code(err)
	httpapi.WriteError(w, httpapi.HTTPStatus(c), err.Error())
	return c
}
