package query

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
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
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
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
		writeError(w, http.StatusNotFound, "mailbox "+strconv.Quote(id)+" is not served here")
		return "", nil, 0, false
	}
	w.Header().Set(HeaderMailbox, id)
	if epoch != 0 {
		w.Header().Set(HeaderEpoch, strconv.FormatUint(epoch, 10))
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
	f, err := ParseFilter(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		h.metrics.observe("http", "QueryEvents", id, start, codes.InvalidArgument)
		return
	}
	resp, err := src.Query(r.Context(), f)
	if err != nil {
		h.metrics.observe("http", "QueryEvents", id, start, writeStoreError(w, err))
		return
	}
	WriteEvents(w, id, resp)
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
			writeError(w, http.StatusNotFound, "message_id "+strconv.Quote(msgID)+" not found in mailbox "+strconv.Quote(id))
			h.metrics.observe("http", "GetEvent", id, start, codes.NotFound)
			return
		}
		h.metrics.observe("http", "GetEvent", id, start, writeStoreError(w, err))
		return
	}
	WriteEvent(w, id, it)
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
	WriteStats(w, st)
	h.metrics.observe("http", "GetStats", id, start, codes.OK)
}

type eventsJSON struct {
	MailboxID     string     `json:"mailbox_id"`
	Items         []itemJSON `json:"items"`
	NextPageToken string     `json:"next_page_token,omitempty"`
}

// itemJSON is an item as the HTTP API shows it: its indexed headers, the
// envelope blob (base64) and, when the blob decodes, the envelope itself as
// protojson with its payload kept apart (the payload's type is usually not
// known here, and its bytes are often encrypted).
type itemJSON struct {
	MessageID     string            `json:"message_id"`
	Timestamp     int64             `json:"timestamp"`
	Time          string            `json:"time"`
	Topic         string            `json:"topic,omitempty"`
	ContentType   string            `json:"content_type,omitempty"`
	SchemaURL     string            `json:"schema_url,omitempty"`
	SchemaVersion string            `json:"schema_version,omitempty"`
	Encryption    string            `json:"encryption,omitempty"`
	CorrelationID string            `json:"correlation_id,omitempty"`
	Principal     string            `json:"principal,omitempty"`
	Namespace     string            `json:"namespace,omitempty"`
	TraceID       string            `json:"trace_id,omitempty"`
	SpanID        string            `json:"span_id,omitempty"`
	CustomHeaders map[string]string `json:"custom_headers,omitempty"`
	EnvelopeBlob  []byte            `json:"envelope_blob"`
	Envelope      json.RawMessage   `json:"envelope,omitempty"`
	Payload       *payloadJSON      `json:"payload,omitempty"`
}

type payloadJSON struct {
	TypeURL string `json:"type_url"`
	Value   []byte `json:"value"`
}

type statsJSON struct {
	MailboxID   string `json:"mailbox_id"`
	TotalEvents int64  `json:"total_events"`
	TotalBytes  int64  `json:"total_bytes"`
	OldestEvent string `json:"oldest_event,omitempty"`
	NewestEvent string `json:"newest_event,omitempty"`
	Epoch       uint64 `json:"epoch,omitempty"`
}

var envelopeJSON = protojson.MarshalOptions{UseProtoNames: true}

func toItemJSON(it *mailboxv1.MailboxItem) itemJSON {
	out := itemJSON{
		MessageID: it.GetMessageId(), Timestamp: it.GetTimestamp(),
		Time:  time.UnixMilli(it.GetTimestamp()).UTC().Format(time.RFC3339Nano),
		Topic: it.GetTopic(), ContentType: it.GetContentType(), SchemaURL: it.GetSchemaUrl(),
		SchemaVersion: it.GetSchemaVersion(), Encryption: it.GetEncryption(), CorrelationID: it.GetCorrelationId(),
		Principal: it.GetPrincipal(), Namespace: it.GetNamespace(), TraceID: it.GetTraceId(), SpanID: it.GetSpanId(),
		CustomHeaders: it.GetCustomHeaders(), EnvelopeBlob: it.GetEnvelopeBlob(),
	}
	env := &envelopev1.PrismEnvelope{}
	if proto.Unmarshal(it.GetEnvelopeBlob(), env) != nil {
		return out
	}
	if p := env.GetPayload(); p != nil {
		out.Payload = &payloadJSON{TypeURL: p.GetTypeUrl(), Value: p.GetValue()}
		env.Payload = nil
	}
	if b, err := envelopeJSON.Marshal(env); err == nil {
		out.Envelope = b
	}
	return out
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client went away; nothing to tell it
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// writeStoreError answers a store error with the status matching its code.
func writeStoreError(w http.ResponseWriter, err error) codes.Code {
	c := code(err)
	writeError(w, HTTPStatus(c), err.Error())
	return c
}

// The exported writers answer in the HTTP API's JSON shapes, so that
// prism gateway, which gets the same answers over gRPC, renders them exactly
// as the runners do.

// WriteEvents answers 200 with a page of mailbox id's items.
func WriteEvents(w http.ResponseWriter, id string, resp *mailboxv1.QueryEventsResponse) {
	out := eventsJSON{MailboxID: id, Items: make([]itemJSON, 0, len(resp.GetItems())), NextPageToken: resp.GetNextPageToken()}
	for _, it := range resp.GetItems() {
		out.Items = append(out.Items, toItemJSON(it))
	}
	writeJSON(w, http.StatusOK, out)
}

// WriteEvent answers 200 with one item of mailbox id.
func WriteEvent(w http.ResponseWriter, id string, it *mailboxv1.MailboxItem) {
	writeJSON(w, http.StatusOK, map[string]any{"mailbox_id": id, "item": toItemJSON(it)})
}

// WriteStats answers 200 with a mailbox's totals.
func WriteStats(w http.ResponseWriter, st *mailboxv1.MailboxStats) {
	out := statsJSON{MailboxID: st.GetMailboxId(), TotalEvents: st.GetTotalEvents(), TotalBytes: st.GetTotalBytes(), Epoch: st.GetEpoch()}
	if st.GetOldestEvent() != nil {
		out.OldestEvent = st.GetOldestEvent().AsTime().Format(time.RFC3339Nano)
	}
	if st.GetNewestEvent() != nil {
		out.NewestEvent = st.GetNewestEvent().AsTime().Format(time.RFC3339Nano)
	}
	writeJSON(w, http.StatusOK, out)
}

// WriteError answers status with {"error": msg}.
func WriteError(w http.ResponseWriter, status int, msg string) { writeError(w, status, msg) }

// HTTPStatus is the HTTP status the API answers a gRPC code with.
func HTTPStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.OutOfRange, codes.FailedPrecondition:
		return http.StatusBadRequest
	case codes.NotFound:
		return http.StatusNotFound
	case codes.Canceled:
		return 499 // client closed request; it will not read the answer
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.Unimplemented:
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}
