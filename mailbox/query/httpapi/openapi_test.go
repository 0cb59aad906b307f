package httpapi_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	"github.com/prism-mesh/prism/mailbox/runner"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/openapitest"
)

// TestOpenAPIDocument: the served document is valid OpenAPI 3, and every
// operation answers each of its statuses with a JSON error body or a
// described result, so a malformed or careless edit fails here.
func TestOpenAPIDocument(t *testing.T) {
	t.Parallel()
	doc, err := openapitest.Load()
	if err != nil {
		t.Fatal(err)
	}
	if doc.OpenAPI[:2] != "3." {
		t.Fatalf("openapi %q, want 3.x", doc.OpenAPI)
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.OperationID == "" {
				t.Errorf("%s %s has no operationId", method, path)
			}
			for code, ref := range op.Responses.Map() {
				if ref.Value.Content.Get("application/json") == nil {
					t.Errorf("%s %s %s: not application/json", method, path, code)
				}
			}
		}
	}
	// The checks bite: a dangling reference or a wrong type is refused.
	for _, broken := range [][2]string{
		{`"#/components/schemas/Item"`, `"#/components/schemas/Nothing"`},
		{`"type":"integer"`, `"type":"int"`},
	} {
		if !bytes.Contains(httpapi.OpenAPI(), []byte(broken[0])) {
			t.Fatalf("the document has no %s to break", broken[0])
		}
		if _, err := openapitest.Parse(bytes.ReplaceAll(httpapi.OpenAPI(), []byte(broken[0]), []byte(broken[1]))); err == nil {
			t.Errorf("a document with %s in place of %s loads and validates", broken[1], broken[0])
		}
	}
}

// mailbox is the runner's mailbox in these tests; its id needs escaping.
const mailbox = "$audit@p1"

// events are what the test mailbox holds, oldest first: every item field
// set on each, so each of them reaches the JSON the document describes.
func events() []*envelopev1.PrismEnvelope {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var out []*envelopev1.PrismEnvelope
	for i := range 5 {
		payload, _ := anypb.New(timestamppb.New(base))
		out = append(out, &envelopev1.PrismEnvelope{
			EnvelopeVersion: 1,
			Metadata: &envelopev1.PrismMetadata{
				MessageId: fmt.Sprintf("m-%d", i), Topic: []string{"a.events", "b.events"}[i%2], Namespace: "$audit",
				PublishedAt: timestamppb.New(base.Add(time.Duration(i) * time.Second)), ContentType: "application/protobuf",
				CorrelationId: fmt.Sprintf("c-%d", i/2),
			},
			Payload:       payload,
			Security:      &envelopev1.SecurityContext{PublisherId: fmt.Sprintf("user-%d", i%3), Encryption: &envelopev1.EncryptionInfo{Algorithm: "none"}},
			Observability: &envelopev1.ObservabilityContext{TraceId: fmt.Sprintf("trace-%d", i), SpanId: "span-1"},
			Schema:        &envelopev1.SchemaContext{SchemaUrl: "https://schemas.example/ts", SchemaVersion: "1"},
			Extensions:    map[string][]byte{"tenant": []byte("t-1")},
		})
	}
	return out
}

// startRunner is a real runner serving the test mailbox (lease epoch 7) and
// two empty ones of one namespace, filled through Kafka; it returns the base URLs of its query
// port and of its plaintext HTTP port.
func startRunner(t *testing.T) (query, plain string) {
	t.Helper()
	c := kafkatest.Start(t, kafkatest.Topics(1, "a.events", "b.events", "a.events.dlq", "c.events", "c.events.dlq"))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, env := range events() {
		b, _ := proto.Marshal(env)
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: env.GetMetadata().GetTopic(), Value: b}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	r, err := runner.New(runner.Config{DataDir: t.TempDir(), Brokers: c.Brokers, BatchWait: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		RecoveryGiveUp: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ql, _ := net.Listen("tcp", "127.0.0.1:0")
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	r.Serve(ql, hl)
	if err := r.Open(runner.MailboxConfig{ID: mailbox, Topics: []string{"a.events", "b.events"}, Epoch: 7}); err != nil {
		t.Fatal(err)
	}
	// Namespace "empty" has two mailboxes here, which its namespace paths
	// refuse to choose between.
	for i, id := range []string{"empty@p1", "empty@p2"} {
		if err := r.Open(runner.MailboxConfig{ID: id, Topics: []string{"c.events"}, Epoch: uint64(3 + i)}); err != nil {
			t.Fatal(err)
		}
	}
	// A mailbox whose copy could not be had (nothing answers at its source's address) is built from Kafka and
	// says its history is incomplete.
	if err := r.Open(runner.MailboxConfig{ID: "partial@p1", Topics: []string{"a.events"}, Epoch: 2,
		Recover: &runner.RecoverySource{MailboxID: "partial@p0", Address: "127.0.0.1:1"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := r.Stats(context.Background(), mailbox)
		partial, errPartial := r.Stats(context.Background(), "partial@p1")
		if err == nil && st.TotalEvents == 5 && errPartial == nil && partial.TotalEvents == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("mailbox never held the 5 events: %v %v", st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "http://" + ql.Addr().String(), "http://" + hl.Addr().String()
}

// TestRunnerAnswersAsDocumented sends a real runner every filter, a paged
// query, and requests it must refuse, and checks each request and answer
// against the document with kin-openapi; then that every query parameter,
// every operation's statuses and every documented field were exercised,
// so the document describes neither less nor more than the code does.
func TestRunnerAnswersAsDocumented(t *testing.T) {
	t.Parallel()
	base, plain := startRunner(t)
	c := openapitest.New(t)
	client := &http.Client{Timeout: 10 * time.Second}
	esc := "/v1/mailboxes/" + url.PathEscape(mailbox)
	ns := "/v1/namespaces/%24audit"
	ms := func(s string) string {
		tm, _ := time.Parse(time.RFC3339, s)
		return fmt.Sprint(tm.UnixMilli())
	}
	seen := map[string]bool{} // schema.property names found in answers

	for _, tc := range []struct {
		name, method, path string
		valid              bool // the document allows the request
		docRejects         bool // the document alone says the request is wrong
		status             int
		wantIDs            []string // for event pages, in order
		errSubstr          string
	}{
		{"all newest first", "GET", esc + "/events", true, false, 200, []string{"m-4", "m-3", "m-2", "m-1", "m-0"}, ""},
		{"raw id", "GET", "/v1/mailboxes/" + mailbox + "/events?limit=1", true, false, 200, []string{"m-4"}, ""},
		{"topic", "GET", esc + "/events?topic=a.events", true, false, 200, []string{"m-4", "m-2", "m-0"}, ""},
		{"topics comma and repeated", "GET", esc + "/events?topic=a.events,b.events&topic=c.events", true, false, 200, []string{"m-4", "m-3", "m-2", "m-1", "m-0"}, ""},
		{"principal", "GET", esc + "/events?principal=user-0", true, false, 200, []string{"m-3", "m-0"}, ""},
		{"principals", "GET", esc + "/events?principal=user-1,user-2&principal=nobody", true, false, 200, []string{"m-4", "m-2", "m-1"}, ""},
		{"correlation id", "GET", esc + "/events?correlation_id=c-1", true, false, 200, []string{"m-3", "m-2"}, ""},
		{"trace id", "GET", esc + "/events?trace_id=trace-3", true, false, 200, []string{"m-3"}, ""},
		{"rfc 3339 window", "GET", esc + "/events?start=2026-01-02T03:04:06Z&end=2026-01-02T03:04:08.5%2B00:00", true, false, 200, []string{"m-3", "m-2", "m-1"}, ""},
		{"unix ms window", "GET", esc + "/events?start=" + ms("2026-01-02T03:04:08Z") + "&end=" + ms("2026-01-02T03:04:09Z"), true, false, 200, []string{"m-3"}, ""},
		{"every filter", "GET", esc + "/events?topic=b.events&principal=user-0&correlation_id=c-1&trace_id=trace-3&start=0&end=253402300799999&limit=10", true, false, 200, []string{"m-3"}, ""},
		{"limit 0 is the default", "GET", esc + "/events?limit=0", true, false, 200, []string{"m-4", "m-3", "m-2", "m-1", "m-0"}, ""},
		{"limit over the cap", "GET", esc + "/events?limit=5000", true, false, 200, []string{"m-4", "m-3", "m-2", "m-1", "m-0"}, ""},
		{"nothing matches", "GET", esc + "/events?topic=nope", true, false, 200, nil, ""},
		{"one event", "GET", esc + "/events/m-2", true, false, 200, nil, ""},
		{"stats", "GET", esc + "/stats", true, false, 200, nil, ""},
		{"stats of an empty mailbox", "GET", "/v1/mailboxes/empty@p1/stats", true, false, 200, nil, ""},
		{"stats of a mailbox with an incomplete history", "GET", "/v1/mailboxes/partial@p1/stats", true, false, 200, nil, ""},
		{"unknown mailbox events", "GET", "/v1/mailboxes/nobody@p9/events", true, false, 404, nil, "nobody@p9"},
		{"unknown mailbox event", "GET", "/v1/mailboxes/nobody@p9/events/m-1", true, false, 404, nil, "nobody@p9"},
		{"unknown mailbox stats", "GET", "/v1/mailboxes/nobody@p9/stats", true, false, 404, nil, "nobody@p9"},
		{"unknown message id", "GET", esc + "/events/m-9", true, false, 404, nil, "m-9"},
		{"limit not a number", "GET", esc + "/events?limit=ten", false, true, 400, nil, "limit"},
		{"negative limit", "GET", esc + "/events?limit=-1", false, true, 400, nil, "limit"},
		{"start not a time", "GET", esc + "/events?start=yesterday", false, true, 400, nil, "start"},
		{"empty topic", "GET", esc + "/events?topic=", false, true, 400, nil, "topic"},
		{"start after end", "GET", esc + "/events?start=" + ms("2026-01-02T03:04:09Z") + "&end=" + ms("2026-01-02T03:04:08Z"), false, false, 400, nil, "start"},
		{"start in seconds", "GET", esc + "/events?start=1767323048", false, false, 400, nil, "start: 1767323048 looks like unix seconds"},
		{"millis out of range", "GET", esc + "/events?end=253402300800000", false, false, 400, nil, "end"},
		{"bad page token", "GET", esc + "/events?page_token=%21%21", false, false, 400, nil, "page_token"},
		{"trace id twice", "GET", esc + "/events?trace_id=a&trace_id=b", false, false, 400, nil, "trace_id"},
		{"empty principal in a list", "GET", esc + "/events?principal=a,", false, false, 400, nil, "principal"},
		{"unknown parameter", "GET", esc + "/events?principals=a", false, false, 400, nil, "principals"},
		{"POST events", "POST", esc + "/events", false, false, 405, nil, "POST"},
		{"PUT one event", "PUT", esc + "/events/m-2", false, false, 405, nil, "PUT"},
		{"DELETE stats", "DELETE", esc + "/stats", false, false, 405, nil, "DELETE"},
		{"unknown endpoint", "GET", esc + "/whatever", false, false, 404, nil, "whatever"},
		{"namespace: all newest first", "GET", ns + "/events", true, false, 200, []string{"m-4", "m-3", "m-2", "m-1", "m-0"}, ""},
		{"namespace raw", "GET", "/v1/namespaces/$audit/events?limit=1", true, false, 200, []string{"m-4"}, ""},
		{"namespace: every filter", "GET", ns + "/events?topic=b.events&principal=user-0&correlation_id=c-1&trace_id=trace-3&start=0&end=253402300799999&limit=10", true, false, 200, []string{"m-3"}, ""},
		{"namespace: one event", "GET", ns + "/events/m-2", true, false, 200, nil, ""},
		{"namespace: stats", "GET", ns + "/stats", true, false, 200, nil, ""},
		{"namespace: unknown message id", "GET", ns + "/events/m-9", true, false, 404, nil, "m-9"},
		{"namespace: limit not a number", "GET", ns + "/events?limit=ten", false, true, 400, nil, "limit"},
		{"namespace: unknown parameter", "GET", ns + "/events?principals=a", false, false, 400, nil, "principals"},
		{"unknown namespace events", "GET", "/v1/namespaces/nobody/events", true, false, 404, nil, `namespace "nobody"`},
		{"unknown namespace event", "GET", "/v1/namespaces/nobody/events/m-1", true, false, 404, nil, `namespace "nobody"`},
		{"unknown namespace stats", "GET", "/v1/namespaces/nobody/stats", true, false, 404, nil, `namespace "nobody"`},
		{"namespace with two mailboxes", "GET", "/v1/namespaces/empty/events", true, false, 400, nil, "empty@p1, empty@p2"},
		{"namespace with two mailboxes, stats", "GET", "/v1/namespaces/empty/stats", true, false, 400, nil, `namespace "empty"`},
		{"namespace: POST events", "POST", ns + "/events", false, false, 405, nil, "POST"},
		{"namespace: PUT one event", "PUT", ns + "/events/m-2", false, false, 405, nil, "PUT"},
		{"namespace: DELETE stats", "DELETE", ns + "/stats", false, false, 405, nil, "DELETE"},
		{"namespace: unknown endpoint", "GET", ns + "/whatever", false, false, 404, nil, "whatever"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, base+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.docRejects {
				if c.RequestError(req) == nil {
					t.Errorf("the document allows %s, which the runner refuses", tc.path)
				}
			}
			ex := c.Do(t, client, req, tc.valid)
			if ex.Status != tc.status {
				t.Fatalf("%s %s = %d %q, want %d", tc.method, tc.path, ex.Status, ex.Body, tc.status)
			}
			body := ex.JSON(t)
			if tc.status != 200 {
				if msg, _ := body["error"].(string); !strings.Contains(msg, tc.errSubstr) {
					t.Fatalf("error %q does not name %q", msg, tc.errSubstr)
				}
				return
			}
			record(seen, body)
			if items, ok := body["items"].([]any); ok {
				got := []string{}
				for _, it := range items {
					got = append(got, it.(map[string]any)["message_id"].(string))
				}
				if !slices.Equal(got, append([]string{}, tc.wantIDs...)) {
					t.Fatalf("ids %v, want %v", got, tc.wantIDs)
				}
			}
		})
	}

	// Pagination: next_page_token round trips until the last page, with
	// every page as documented.
	var got []string
	token := ""
	for page := 0; ; page++ {
		q := url.Values{"limit": {"2"}, "topic": {"a.events,b.events"}}
		if token != "" {
			q.Set("page_token", token)
		}
		req, _ := http.NewRequest("GET", base+esc+"/events?"+q.Encode(), nil)
		ex := c.Do(t, client, req, true)
		body := ex.JSON(t)
		record(seen, body)
		for _, it := range body["items"].([]any) {
			got = append(got, it.(map[string]any)["message_id"].(string))
		}
		token, _ = body["next_page_token"].(string)
		if token == "" || page > 5 {
			break
		}
	}
	if strings.Join(got, ",") != "m-4,m-3,m-2,m-1,m-0" {
		t.Fatalf("pages gave %v", got)
	}

	// The document itself, on both ports, without credentials.
	for _, u := range []string{base, plain} {
		req, _ := http.NewRequest("GET", u+"/openapi.json", nil)
		ex := c.Do(t, client, req, true)
		if ex.Status != 200 || !bytes.Equal(ex.Body, httpapi.OpenAPI()) || ex.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("GET /openapi.json = %d %s %.60q", ex.Status, ex.Header.Get("Content-Type"), ex.Body)
		}
	}

	for _, p := range c.Doc.Paths.Value("/v1/mailboxes/{mailbox_id}/events").Get.Parameters {
		if p.Value.In == "query" && !c.Sent(p.Value.Name) {
			t.Errorf("query parameter %s is documented but never sent", p.Value.Name)
		}
	}
	for op, statuses := range map[string][]int{
		"queryEvents": {200, 400, 404},
		"getEvent":    {200, 404},
		"getStats":    {200, 404},
		"getOpenAPI":  {200},
		// The namespace paths answer what the mailbox paths do, and 400
		// for a namespace with two mailboxes here.
		"queryNamespaceEvents": {200, 400, 404},
		"getNamespaceEvent":    {200, 404},
		"getNamespaceStats":    {200, 400, 404},
	} {
		for _, s := range statuses {
			if !c.Answered(op, s) {
				t.Errorf("%s never answered %d", op, s)
			}
		}
	}
	for _, schema := range []string{"Events", "Event", "Item", "Payload", "Stats"} {
		for prop := range c.Doc.Components.Schemas[schema].Value.Properties {
			if !seen[schema+"."+prop] {
				t.Errorf("%s.%s is documented but never answered", schema, prop)
			}
		}
	}
}

// record notes the fields of a 200 answer under the schema names the
// document gives them.
func record(seen map[string]bool, body map[string]any) {
	note := func(schema string, m map[string]any) {
		for k := range m {
			seen[schema+"."+k] = true
		}
	}
	item := func(m map[string]any) {
		note("Item", m)
		if p, ok := m["payload"].(map[string]any); ok {
			note("Payload", p)
		}
	}
	switch {
	case body["items"] != nil:
		note("Events", body)
		for _, it := range body["items"].([]any) {
			item(it.(map[string]any))
		}
	case body["item"] != nil:
		note("Event", body)
		item(body["item"].(map[string]any))
	default:
		note("Stats", body)
	}
}
