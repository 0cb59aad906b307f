// Package httpapi is the HTTP/JSON face of the mailbox query API, which the
// runners serve and prism gateway serves again in front of them: the query
// parameters, the JSON shape of every answer and refusal, and the HTTP status
// of each gRPC code. The gateway gets its answers over gRPC and renders them
// here exactly as a runner would, without linking the store.
package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/mesh"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

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

// WriteError answers status with {"error": msg}, the body of every refusal.
func WriteError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// Allow is what the query paths answer: GET, and HEAD, which net/http
// serves with every GET route.
const Allow = "GET, HEAD"

// WriteMethodNotAllowed answers a query path asked with another method: 405
// with the Allow header and the JSON body of every refusal.
func WriteMethodNotAllowed(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Allow", Allow)
	WriteError(w, http.StatusMethodNotAllowed, "method "+strconv.Quote(mesh.Echo(r.Method))+" not allowed; this path answers "+Allow)
}

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
