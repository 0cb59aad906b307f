package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/envelope/demo"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// refItem is an item as encoding/json wrote it before items were appended by
// hand: the reference the hand-written encoder must agree with.
type refItem struct {
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
	Payload       *struct {
		TypeURL string `json:"type_url"`
		Value   []byte `json:"value"`
	} `json:"payload,omitempty"`
}

func refJSON(it *mailboxv1.MailboxItem) refItem {
	out := refItem{
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
		out.Payload = &struct {
			TypeURL string `json:"type_url"`
			Value   []byte `json:"value"`
		}{p.GetTypeUrl(), p.GetValue()}
		env.Payload = nil
	}
	if b, err := envelopeJSON.Marshal(env); err == nil {
		out.Envelope = b
	}
	return out
}

func items(t *testing.T) []*mailboxv1.MailboxItem {
	t.Helper()
	gen := demo.New(demo.Options{Seed: 7, IDPrefix: "t"})
	var out []*mailboxv1.MailboxItem
	for k := range 6 {
		env := gen.Next("audit.events")
		if k == 1 {
			env.Metadata.CorrelationId = "<a href=\"x\">&amp;</a>\n\t\x01\u2028é"
		}
		blob, err := proto.Marshal(env)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &mailboxv1.MailboxItem{
			MessageId: env.GetMetadata().GetMessageId(), Timestamp: env.GetMetadata().GetPublishedAt().AsTime().UnixMilli(),
			Topic: env.GetMetadata().GetTopic(), ContentType: env.GetMetadata().GetContentType(),
			CorrelationId: env.GetMetadata().GetCorrelationId(), Principal: env.GetSecurity().GetPublisherId(),
			TraceId: env.GetObservability().GetTraceId(), EnvelopeBlob: blob,
		})
	}
	out[2].CustomHeaders = map[string]string{"z": "1", "a": "\"quoted\"", "": "empty key", "bad\xffutf8": "v"}
	out[3].EnvelopeBlob = []byte("not an envelope \xff")
	out[4].EnvelopeBlob = nil
	out[5].EnvelopeBlob = []byte{}
	return append(out, &mailboxv1.MailboxItem{}, &mailboxv1.MailboxItem{MessageId: "only", Timestamp: -62135596800001})
}

// declinedItems are items whose blobs envelope.AppendJSON leaves to the
// decoder and protojson: envelopes given twice (which proto merges), and one
// whose published_at protojson refuses (shown with its payload but without
// the envelope).
func declinedItems(t *testing.T) []*mailboxv1.MailboxItem {
	t.Helper()
	gen := demo.New(demo.Options{Seed: 9, IDPrefix: "d"})
	var out []*mailboxv1.MailboxItem
	for range 3 {
		blob, err := proto.Marshal(gen.Next("audit.events"))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, &mailboxv1.MailboxItem{MessageId: "merged", EnvelopeBlob: append(blob, blob...)})
	}
	env := gen.Next("audit.events")
	env.Metadata.PublishedAt.Seconds = 253402300800 // year 10000
	blob, err := proto.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return append(out, &mailboxv1.MailboxItem{MessageId: "bad-time", EnvelopeBlob: blob})
}

// TestDeclinedItemsAreReal: the items the fallback test relies on are
// declined by envelope.AppendJSON, and the reference shows each as it should.
func TestDeclinedItemsAreReal(t *testing.T) {
	t.Parallel()
	for _, it := range declinedItems(t) {
		if _, _, ok := envelope.AppendJSON(nil, it.GetEnvelopeBlob()); ok {
			t.Fatalf("%s: envelope.AppendJSON took it", it.GetMessageId())
		}
		ref := refJSON(it)
		if (ref.Envelope != nil) != (it.GetMessageId() == "merged") || ref.Payload == nil {
			t.Fatalf("%s: reference envelope %s, payload %v", it.GetMessageId(), ref.Envelope, ref.Payload)
		}
	}
}

func decode(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("invalid JSON %q: %v", b, err)
	}
	return v
}

// TestEventsAsEncodingJSON: pages and single items written by hand decode to
// exactly what encoding/json made of the same items, and end
// with a trailing newline and a Content-Length.
func TestEventsAsEncodingJSON(t *testing.T) {
	t.Parallel()
	its := items(t)
	for _, tc := range []struct {
		name  string
		resp  *mailboxv1.QueryEventsResponse
		write func(*httptest.ResponseRecorder)
		ref   any
	}{
		{name: "page", resp: &mailboxv1.QueryEventsResponse{Items: its, NextPageToken: "tok<&>"}},
		{name: "empty page", resp: &mailboxv1.QueryEventsResponse{}},
		{name: "page left to the decoder", resp: &mailboxv1.QueryEventsResponse{Items: append(declinedItems(t), its...)}},
		{name: "event", write: func(w *httptest.ResponseRecorder) { WriteEvent(w, "a@p", its[1]) },
			ref: map[string]any{"mailbox_id": "a@p", "item": refJSON(its[1])}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := httptest.NewRecorder()
			ref := tc.ref
			if tc.resp != nil {
				WriteEvents(w, "$ns@p", tc.resp)
				page := struct {
					MailboxID     string    `json:"mailbox_id"`
					Items         []refItem `json:"items"`
					NextPageToken string    `json:"next_page_token,omitempty"`
				}{MailboxID: "$ns@p", Items: []refItem{}, NextPageToken: tc.resp.GetNextPageToken()}
				for _, it := range tc.resp.GetItems() {
					page.Items = append(page.Items, refJSON(it))
				}
				ref = page
			} else {
				tc.write(w)
			}
			var want bytes.Buffer
			if err := json.NewEncoder(&want).Encode(ref); err != nil {
				t.Fatal(err)
			}
			got := w.Body.Bytes()
			if !reflect.DeepEqual(decode(t, got), decode(t, want.Bytes())) {
				t.Fatalf("hand-written JSON differs from encoding/json's:\n got %s\nwant %s", got, want.Bytes())
			}
			if got[len(got)-1] != '\n' {
				t.Fatalf("no trailing newline: %q", got)
			}
			if cl := w.Header().Get("Content-Length"); cl != strconv.Itoa(len(got)) || w.Header().Get("Content-Type") != "application/json" {
				t.Fatalf("headers %v for %d bytes", w.Header(), len(got))
			}
		})
	}
}

// FuzzAppendString: strings are escaped byte for byte as encoding/json escapes them.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", "<a&b>", "\"\\\n\r\t\b\f\x00\x1f\x7f", "\u2028\u2029é日本", "bad\xff\xfe", "\xed\xa0\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendString(nil, s); !bytes.Equal(got, want) {
			t.Fatalf("appendString(%q) = %s, want %s", s, got, want)
		}
	})
}

// BenchmarkWriteEvents writes a page of 100 demo items of ~1 KiB.
func BenchmarkWriteEvents(b *testing.B) {
	gen := demo.New(demo.Options{Seed: 1, IDPrefix: "b", PayloadSize: 700})
	resp := &mailboxv1.QueryEventsResponse{}
	for range 100 {
		env := gen.Next("audit.events")
		blob, _ := proto.Marshal(env)
		resp.Items = append(resp.Items, &mailboxv1.MailboxItem{MessageId: env.GetMetadata().GetMessageId(),
			Timestamp: time.Now().UnixMilli(), Topic: "audit.events", CorrelationId: env.GetMetadata().GetCorrelationId(), EnvelopeBlob: blob})
	}
	b.ReportAllocs()
	for b.Loop() {
		WriteEvents(httptest.NewRecorder(), "bench@p", resp)
	}
}

// BenchmarkWriteEventsEncodingJSON is the same page the way it was written
// before: an intermediate struct per item and encoding/json, for comparison.
func BenchmarkWriteEventsEncodingJSON(b *testing.B) {
	gen := demo.New(demo.Options{Seed: 1, IDPrefix: "b", PayloadSize: 700})
	resp := &mailboxv1.QueryEventsResponse{}
	for range 100 {
		env := gen.Next("audit.events")
		blob, _ := proto.Marshal(env)
		resp.Items = append(resp.Items, &mailboxv1.MailboxItem{MessageId: env.GetMetadata().GetMessageId(),
			Timestamp: time.Now().UnixMilli(), Topic: "audit.events", CorrelationId: env.GetMetadata().GetCorrelationId(), EnvelopeBlob: blob})
	}
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		items := make([]refItem, 0, len(resp.Items))
		for _, it := range resp.Items {
			items = append(items, refJSON(it))
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(struct {
			MailboxID string    `json:"mailbox_id"`
			Items     []refItem `json:"items"`
		}{"bench@p", items})
	}
}
