package query

import (
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	"github.com/prism-mesh/prism/mailbox/query/request"
	"github.com/prism-mesh/prism/mesh"
)

// NewHTTPHandler serves the HTTP/JSON query API of the mailboxes found through
// mb: under /v1/mailboxes/{id}/ the mailbox the path names, under
// /v1/namespaces/{namespace}/ the one mailbox of that namespace served here
// (as gRPC's x-prism-namespace), with the same parameters and answers.
// Mailbox ids and namespaces hold '$' and '@' and may arrive percent-encoded:
// ServeMux matches the escaped path segment by segment and PathValue
// unescapes it, so "/v1/mailboxes/%24admin%40proxy-01/events" names
// "$admin@proxy-01" (and an escaped '/' in a message id stays inside its
// segment).
func NewHTTPHandler(mb Mailboxes, m *Metrics) http.Handler {
	h := &httpServer{mailboxes: mb, metrics: m}
	mux := http.NewServeMux()
	for _, p := range []struct {
		base string
		find finder
	}{{"/v1/mailboxes/{id}", byID}, {"/v1/namespaces/{namespace}", byNamespace}} {
		mux.HandleFunc("GET "+p.base+"/events", h.events(p.find))
		mux.HandleFunc("GET "+p.base+"/events/{message_id}", h.event(p.find))
		mux.HandleFunc("GET "+p.base+"/stats", h.stats(p.find))
		// The same paths without a method: any other method is refused
		// 405, not 404 by the catch-all below.
		for _, path := range []string{p.base + "/events", p.base + "/events/{message_id}", p.base + "/stats"} {
			mux.HandleFunc(path, httpapi.WriteMethodNotAllowed)
		}
	}
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		httpapi.WriteError(w, http.StatusNotFound, "no such endpoint: "+mesh.Echo(r.Method+" "+r.URL.Path))
	})
	return mux
}

// finder names the mailbox a request is for, or says with a gRPC status why
// it names none served here.
type finder func(mb Mailboxes, r *http.Request) (string, error)

func byID(_ Mailboxes, r *http.Request) (string, error) { return r.PathValue("id"), nil }

func byNamespace(mb Mailboxes, r *http.Request) (string, error) {
	return namespaceMailbox(mb, r.PathValue("namespace"))
}

type httpServer struct {
	mailboxes Mailboxes
	metrics   *Metrics
}

// resolve finds the request's mailbox and sets the headers naming it, so
// every answer from the mailbox, refusals included, says who answered under
// which epoch. When the request names no mailbox served here it answers
// itself (404 naming the mailbox or namespace, 400 for a namespace with
// several) and returns the code it answered with.
func (h *httpServer) resolve(w http.ResponseWriter, r *http.Request, find finder) (string, Source, uint64, codes.Code) {
	id, err := find(h.mailboxes, r)
	if err != nil {
		st := status.Convert(err)
		httpapi.WriteError(w, httpapi.HTTPStatus(st.Code()), st.Message())
		return "", nil, 0, st.Code()
	}
	src, epoch, ok := h.mailboxes.Mailbox(id)
	if !ok {
		httpapi.WriteError(w, http.StatusNotFound, "mailbox "+strconv.Quote(mesh.Echo(id))+" is not served here")
		return "", nil, 0, codes.NotFound
	}
	w.Header().Set(mesh.HeaderMailbox, id)
	if epoch != 0 {
		w.Header().Set(mesh.HeaderEpoch, strconv.FormatUint(epoch, 10))
	}
	return id, src, epoch, codes.OK
}

func (h *httpServer) events(find finder) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id, src, _, c := h.resolve(w, r, find)
		if c != codes.OK {
			h.metrics.observe("http", "QueryEvents", "", start, c)
			return
		}
		f, err := httpapi.ParseQuery(r.URL.RawQuery)
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
}

func (h *httpServer) event(find finder) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id, src, _, c := h.resolve(w, r, find)
		if c != codes.OK {
			h.metrics.observe("http", "GetEvent", "", start, c)
			return
		}
		msgID := r.PathValue("message_id")
		err := httpapi.ParseNoParams(r.URL.RawQuery)
		if err == nil {
			err = request.MessageID(msgID)
		}
		if err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, err.Error())
			h.metrics.observe("http", "GetEvent", id, start, codes.InvalidArgument)
			return
		}
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
}

func (h *httpServer) stats(find finder) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id, src, epoch, c := h.resolve(w, r, find)
		if c != codes.OK {
			h.metrics.observe("http", "GetStats", "", start, c)
			return
		}
		if err := httpapi.ParseNoParams(r.URL.RawQuery); err != nil {
			httpapi.WriteError(w, http.StatusBadRequest, err.Error())
			h.metrics.observe("http", "GetStats", id, start, codes.InvalidArgument)
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
}

// writeStoreError answers a store error with the status matching its code.
func writeStoreError(w http.ResponseWriter, err error) codes.Code {
	c := code(err)
	httpapi.WriteError(w, httpapi.HTTPStatus(c), err.Error())
	return c
}
