// Package httpapi is the HTTP/JSON face of the mailbox query API, which the
// runners serve and prism gateway serves again in front of them: the query
// parameters, the JSON shape of every answer and refusal, and the HTTP status
// of each gRPC code. The gateway gets its answers over gRPC and renders them
// here exactly as a runner would, without linking the store.
package httpapi

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mesh"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// An item as the HTTP API shows it, in this order: message_id, timestamp,
// time, its other headers (each left out when empty, custom_headers by key),
// envelope_blob (base64), and when the blob decodes the envelope itself as
// protojson with its payload kept apart as payload {type_url, value} (the
// payload's type is usually not known here, and its bytes are often
// encrypted). A page is {"mailbox_id", "items", "next_page_token"}. Items are
// written straight into the answer's buffer, not through an intermediate
// struct and encoding/json's reflection: a page holds up to a thousand; the
// envelope is written from its wire bytes by envelope.AppendJSON, not decoded
// and marshalled by protojson, unless it is a shape AppendJSON leaves to them.

type statsJSON struct {
	MailboxID   string `json:"mailbox_id"`
	TotalEvents int64  `json:"total_events"`
	TotalBytes  int64  `json:"total_bytes"`
	OldestEvent string `json:"oldest_event,omitempty"`
	NewestEvent string `json:"newest_event,omitempty"`
	Epoch       uint64 `json:"epoch,omitempty"`
	// HistoryComplete is false when the mailbox lacks the start of its namespace's history
	// (docs/architecture.md#peer-recovery); HistoryStartsAt is then where it starts.
	HistoryComplete bool   `json:"history_complete"`
	HistoryStartsAt string `json:"history_starts_at,omitempty"`
}

var envelopeJSON = protojson.MarshalOptions{UseProtoNames: true}

// bufs holds answer buffers between requests; one outgrows the rest only for
// large pages, and is then let go rather than kept.
var bufs = sync.Pool{New: func() any { return new([]byte) }}

const maxPooledBuf = 4 << 20

// appendItem appends it as JSON.
func appendItem(b []byte, it *mailboxv1.MailboxItem) []byte {
	b = append(b, `{"message_id":`...)
	b = appendString(b, it.GetMessageId())
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, it.GetTimestamp(), 10)
	b = append(b, `,"time":"`...)
	b = time.UnixMilli(it.GetTimestamp()).UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	for _, f := range [...]struct{ name, v string }{
		{"topic", it.GetTopic()}, {"content_type", it.GetContentType()}, {"schema_url", it.GetSchemaUrl()},
		{"schema_version", it.GetSchemaVersion()}, {"encryption", it.GetEncryption()},
		{"correlation_id", it.GetCorrelationId()}, {"principal", it.GetPrincipal()},
		{"namespace", it.GetNamespace()}, {"trace_id", it.GetTraceId()}, {"span_id", it.GetSpanId()},
	} {
		if f.v != "" {
			b = append(b, ',', '"')
			b = append(b, f.name...)
			b = append(b, '"', ':')
			b = appendString(b, f.v)
		}
	}
	if h := it.GetCustomHeaders(); len(h) > 0 {
		b = append(b, `,"custom_headers":{`...)
		for k, key := range slices.Sorted(maps.Keys(h)) {
			if k > 0 {
				b = append(b, ',')
			}
			b = appendString(b, key)
			b = append(b, ':')
			b = appendString(b, h[key])
		}
		b = append(b, '}')
	}
	b = append(b, `,"envelope_blob":`...)
	b = appendBytes(b, it.GetEnvelopeBlob())
	n := len(b)
	if eb, p, ok := envelope.AppendJSON(append(b, `,"envelope":`...), it.GetEnvelopeBlob()); ok {
		b = eb
		if p.Present {
			b = appendPayload(b, string(p.TypeURL), p.Value)
		}
		return append(b, '}')
	}
	return append(appendDecodedEnvelope(b[:n], it.GetEnvelopeBlob()), '}')
}

// appendDecodedEnvelope appends the envelope and payload as protojson writes
// the decoded envelope, for the blobs envelope.AppendJSON leaves to the
// decoder (repeated messages, which proto merges; blobs that do not decode or
// that protojson refuses, shown without the envelope).
func appendDecodedEnvelope(b, blob []byte) []byte {
	env := &envelopev1.PrismEnvelope{}
	if proto.Unmarshal(blob, env) != nil {
		return b
	}
	p := env.GetPayload()
	env.Payload = nil
	if ej, err := envelopeJSON.Marshal(env); err == nil {
		// As protojson writes it: valid JSON whose spacing protojson varies from build to build on purpose.
		b = append(b, `,"envelope":`...)
		b = append(b, ej...)
	}
	if p != nil {
		b = appendPayload(b, p.GetTypeUrl(), p.GetValue())
	}
	return b
}

func appendPayload(b []byte, typeURL string, value []byte) []byte {
	b = append(b, `,"payload":{"type_url":`...)
	b = appendString(b, typeURL)
	b = append(b, `,"value":`...)
	b = appendBytes(b, value)
	return append(b, '}')
}

// appendBytes appends v as encoding/json does a []byte: base64, null for nil.
func appendBytes(b, v []byte) []byte {
	if v == nil {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, v)
	return append(b, '"')
}

// appendString appends s as a JSON string escaped as encoding/json escapes
// it, so the answers built by hand read as the ones json.Marshal writes.
func appendString(b []byte, s string) []byte { return envelope.AppendJSONString(b, s, true) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client went away; nothing to tell it
}

// writeBuilt answers 200 with the JSON build appends, from a pooled buffer.
func writeBuilt(w http.ResponseWriter, build func([]byte) []byte) {
	bp := bufs.Get().(*[]byte)
	b := append(build((*bp)[:0]), '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b) // the client went away; nothing to tell it
	if cap(b) <= maxPooledBuf {
		*bp = b
		bufs.Put(bp)
	}
}

// WriteEvents answers 200 with a page of mailbox id's items.
func WriteEvents(w http.ResponseWriter, id string, resp *mailboxv1.QueryEventsResponse) {
	writeBuilt(w, func(b []byte) []byte {
		b = append(b, `{"mailbox_id":`...)
		b = appendString(b, id)
		b = append(b, `,"items":[`...)
		for k, it := range resp.GetItems() {
			if k > 0 {
				b = append(b, ',')
			}
			b = appendItem(b, it)
		}
		b = append(b, ']')
		if tok := resp.GetNextPageToken(); tok != "" {
			b = append(b, `,"next_page_token":`...)
			b = appendString(b, tok)
		}
		return append(b, '}')
	})
}

// WriteEvent answers 200 with one item of mailbox id.
func WriteEvent(w http.ResponseWriter, id string, it *mailboxv1.MailboxItem) {
	writeBuilt(w, func(b []byte) []byte {
		b = append(b, `{"item":`...)
		b = appendItem(b, it)
		b = append(b, `,"mailbox_id":`...)
		b = appendString(b, id)
		return append(b, '}')
	})
}

// WriteStats answers 200 with a mailbox's totals.
func WriteStats(w http.ResponseWriter, st *mailboxv1.MailboxStats) {
	out := statsJSON{MailboxID: st.GetMailboxId(), TotalEvents: st.GetTotalEvents(), TotalBytes: st.GetTotalBytes(), Epoch: st.GetEpoch(),
		HistoryComplete: !st.GetHistoryIncomplete()}
	if st.GetHistoryIncomplete() && st.GetHistoryStartsAt() != nil {
		out.HistoryStartsAt = st.GetHistoryStartsAt().AsTime().Format(time.RFC3339Nano)
	}
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
