package query

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	"github.com/prism-mesh/prism/mailbox/store"
	"github.com/prism-mesh/prism/mesh"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

const mailboxID = "$admin@proxy-01"

type staticMailboxes map[string]Source

func (m staticMailboxes) Mailbox(id string) (Source, uint64, bool) {
	s, ok := m[id]
	return s, 7, ok
}

func (m staticMailboxes) IDs() []string { return slices.Sorted(maps.Keys(m)) }

// fixture is a mailbox with 5 items (m-0 oldest … m-4 newest) behind real
// HTTP and gRPC servers on loopback.
type fixture struct {
	httpURL string
	grpc    mailboxv1.MailboxQueryClient
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var items []*mailboxv1.MailboxItem
	for i := range 5 {
		env := &envelopev1.PrismEnvelope{
			EnvelopeVersion: 1,
			Metadata: &envelopev1.PrismMetadata{
				MessageId: fmt.Sprintf("m-%d", i), Topic: []string{"a.events", "b.events"}[i%2],
				PublishedAt: timestamppb.New(base.Add(time.Duration(i) * time.Second)), CorrelationId: "c-1",
			},
			Security: &envelopev1.SecurityContext{PublisherId: fmt.Sprintf("user-%d", i%3)},
		}
		raw, _ := proto.Marshal(env)
		item, err := envelope.Process(raw, envelope.Strict, nil)
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, item)
	}
	if _, err := st.Write(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	other, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	raw, _ := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
		MessageId: "order/42 #1", Topic: "a.events", PublishedAt: timestamppb.New(base)}})
	odd, _ := envelope.Process(raw, envelope.Strict, nil)
	if _, err := other.Write(context.Background(), []*mailboxv1.MailboxItem{odd}); err != nil {
		t.Fatal(err)
	}
	// Two mailboxes of namespace "dup" on one runner is a placement fault
	// namespace lookups must refuse, not resolve to either.
	mb := staticMailboxes{mailboxID: st, "odd/box": other, "dup@proxy-01": other, "dup@proxy-02": other}
	f := serveFaces(t, mb)
	return &fixture{httpURL: f.httpURL, grpc: f.grpc}
}

func (f *fixture) get(t *testing.T, path string) (int, http.Header, map[string]any) {
	t.Helper()
	resp, err := http.Get(f.httpURL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatalf("GET %s: body is not JSON: %q", path, b)
	}
	return resp.StatusCode, resp.Header, body
}

func TestHTTP(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// at is second sec of the minute the fixture's events are stored in.
	at := func(sec int) time.Time { return time.Date(2026, 1, 2, 3, 4, sec, 0, time.UTC) }
	esc := url.PathEscape(mailboxID) // "$admin@proxy-01" stays readable; also try fully encoded
	tests := []struct {
		name      string
		path      string
		status    int
		errSubstr string   // for errors: the message must name this
		wantIDs   []string // for event lists, in order
	}{
		{"all newest first", "/v1/mailboxes/" + esc + "/events", 200, "", []string{"m-4", "m-3", "m-2", "m-1", "m-0"}},
		{"percent-encoded id", "/v1/mailboxes/%24admin%40proxy-01/events?limit=2", 200, "", []string{"m-4", "m-3"}},
		{"topic filter", "/v1/mailboxes/" + esc + "/events?topic=a.events", 200, "", []string{"m-4", "m-2", "m-0"}},
		{"principals comma and repeat", "/v1/mailboxes/" + esc + "/events?principal=user-0,user-1&principal=user-2&limit=1000000", 200, "", []string{"m-4", "m-3", "m-2", "m-1", "m-0"}},
		{"time range rfc3339", "/v1/mailboxes/" + esc + "/events?start=2026-01-02T03:04:06Z&end=2026-01-02T03:04:08Z", 200, "", []string{"m-2", "m-1"}},
		{"time range millis", fmt.Sprintf("/v1/mailboxes/%s/events?start=%d", esc, time.Date(2026, 1, 2, 3, 4, 8, 0, time.UTC).UnixMilli()), 200, "", []string{"m-4", "m-3"}},
		{"unknown mailbox", "/v1/mailboxes/nope@proxy-01/events", 404, "nope@proxy-01", nil},
		{"bad limit", "/v1/mailboxes/" + esc + "/events?limit=ten", 400, "limit", nil},
		{"negative limit", "/v1/mailboxes/" + esc + "/events?limit=-1", 400, "limit", nil},
		{"bad start", "/v1/mailboxes/" + esc + "/events?start=yesterday", 400, "start", nil},
		{"end before start", fmt.Sprintf("/v1/mailboxes/%s/events?start=%d&end=%d", esc, at(8).UnixMilli(), at(6).UnixMilli()), 400, "start: must be before end", nil},
		{"time range rfc3339 offset and fraction", "/v1/mailboxes/" + esc + "/events?start=2026-01-02T04:04:06.5%2B01:00&end=2026-01-02T03:04:08.000Z", 200, "", []string{"m-2"}},
		{"time range rfc3339 lower-case t and z", "/v1/mailboxes/" + esc + "/events?start=2026-01-02t03:04:06z&end=2026-01-02t03:04:07z", 200, "", []string{"m-1"}},
		{"start zero: the beginning", "/v1/mailboxes/" + esc + "/events?start=0", 200, "", []string{"m-4", "m-3", "m-2", "m-1", "m-0"}},
		{"start in seconds", fmt.Sprintf("/v1/mailboxes/%s/events?start=%d", esc, at(6).Unix()), 400,
			fmt.Sprintf("start: %d looks like unix seconds (2026-01-02T03:04:06Z): start takes unix milliseconds (%d) or an RFC 3339 time", at(6).Unix(), at(6).UnixMilli()), nil},
		{"end in seconds", "/v1/mailboxes/" + esc + "/events?end=1700000000", 400, "end: 1700000000 looks like unix seconds", nil},
		{"end in microseconds", fmt.Sprintf("/v1/mailboxes/%s/events?end=%d", esc, at(6).UnixMicro()), 400, "(microseconds or nanoseconds?): end takes unix milliseconds or an RFC 3339 time", nil},
		{"bad page token", "/v1/mailboxes/" + esc + "/events?page_token=%21%21", 400, "page_token", nil},
		{"repeated trace id", "/v1/mailboxes/" + esc + "/events?trace_id=a&trace_id=b", 400, "trace_id", nil},
		{"empty principal", "/v1/mailboxes/" + esc + "/events?principal=a,", 400, "principal", nil},
		{"unknown param", "/v1/mailboxes/" + esc + "/events?principals=a", 400, "principals", nil},
		{"bad escape", "/v1/mailboxes/" + esc + "/events?limit=%zz", 400, `limit: invalid URL escape "%zz"`, nil},
		{"bad escape in a name", "/v1/mailboxes/" + esc + "/events?%zz=1", 400, `"%zz": invalid URL escape "%zz" in the parameter name`, nil},
		{"as many parameters as the bound", "/v1/mailboxes/" + esc + "/events?" + strings.Repeat("limit=1&", httpapi.MaxParams-1) + "topic=a.events", 400, "limit: given 255 times", nil},
		{"one parameter over the bound", "/v1/mailboxes/" + esc + "/events?" + strings.Repeat("&", httpapi.MaxParams), 400, "query: 257 parameters, at most 256", nil},
		{"url.ParseQuery's bound plus one", "/v1/mailboxes/" + esc + "/events?" + strings.Repeat("limit=5&", 10_000) + "limit=5", 400, "query: 10001 parameters, at most 256", nil},
		{"page token not UTF-8", "/v1/mailboxes/" + esc + "/events?page_token=%ff%fe", 400, `page_token: "\xff\xfe" is not UTF-8`, nil},
		{"page token of the right form, not the store's", "/v1/mailboxes/" + esc + "/events?page_token=AAAA", 400, "page_token: wrong length 3", nil},
		{"topic not UTF-8", "/v1/mailboxes/" + esc + "/events?topic=%ff", 400, `topic: "\xff" is not UTF-8`, nil},
		{"a parameter where none is taken", "/v1/mailboxes/" + esc + "/stats?limit=1", 400, `"limit": unknown parameter (this path takes none)`, nil},
		{"a bad escape where none is taken", "/v1/mailboxes/" + esc + "/events/m-1?%zz", 400, `"%zz": invalid URL escape "%zz" in the parameter name`, nil},
		{"message id not UTF-8", "/v1/mailboxes/" + esc + "/events/m%ff", 400, `message_id: "m\xff" is not UTF-8`, nil},
		{"NUL in an id", "/v1/mailboxes/a%00@proxy-01/events", 404, `"a\x00@proxy-01" is not served here`, nil},
		{"non-ASCII id", "/v1/mailboxes/%C3%A4@proxy-01/events", 404, `"ä@proxy-01" is not served here`, nil},
		{"unknown event", "/v1/mailboxes/" + esc + "/events/nope", 404, "nope", nil},
		{"unknown endpoint", "/v1/mailboxes/" + esc + "/whatever", 404, "whatever", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			status, hdr, body := f.get(t, tc.path)
			if status != tc.status {
				t.Fatalf("status = %d, want %d (body %v)", status, tc.status, body)
			}
			if tc.errSubstr != "" {
				msg, _ := body["error"].(string)
				if !strings.Contains(msg, tc.errSubstr) {
					t.Fatalf("error %q does not name %q", msg, tc.errSubstr)
				}
				return
			}
			if hdr.Get(mesh.HeaderMailbox) != mailboxID || hdr.Get(mesh.HeaderEpoch) != "7" {
				t.Errorf("headers %s=%q %s=%q", mesh.HeaderMailbox, hdr.Get(mesh.HeaderMailbox), mesh.HeaderEpoch, hdr.Get(mesh.HeaderEpoch))
			}
			var got []string
			for _, it := range body["items"].([]any) {
				got = append(got, it.(map[string]any)["message_id"].(string))
			}
			if strings.Join(got, ",") != strings.Join(tc.wantIDs, ",") {
				t.Fatalf("ids = %v, want %v", got, tc.wantIDs)
			}
		})
	}
}

func TestHTTPEventAndStats(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	status, _, body := f.get(t, "/v1/mailboxes/%24admin%40proxy-01/events/m-3")
	if status != 200 {
		t.Fatalf("status %d: %v", status, body)
	}
	item := body["item"].(map[string]any)
	if item["message_id"] != "m-3" || item["principal"] != "user-0" || item["envelope_blob"] == "" {
		t.Fatalf("item = %v", item)
	}
	env, _ := item["envelope"].(map[string]any)
	if env["metadata"].(map[string]any)["message_id"] != "m-3" {
		t.Fatalf("decoded envelope = %v", env)
	}
	// Escaped '/', ' ' and '#' stay inside their path segment.
	status, _, body = f.get(t, "/v1/mailboxes/odd%2Fbox/events/order%2F42%20%231")
	if status != 200 || body["item"].(map[string]any)["message_id"] != "order/42 #1" {
		t.Fatalf("escaped ids: %d %v", status, body)
	}
	status, _, body = f.get(t, "/v1/mailboxes/"+mailboxID+"/stats")
	if status != 200 || body["total_events"] != float64(5) || body["mailbox_id"] != mailboxID || body["epoch"] != float64(7) {
		t.Fatalf("stats %d %v", status, body)
	}
}

func TestHTTPPagination(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var got []string
	token := ""
	for range 10 {
		q := url.Values{"limit": {"2"}}
		if token != "" {
			q.Set("page_token", token)
		}
		status, _, body := f.get(t, "/v1/mailboxes/"+url.PathEscape(mailboxID)+"/events?"+q.Encode())
		if status != 200 {
			t.Fatalf("status %d %v", status, body)
		}
		for _, it := range body["items"].([]any) {
			got = append(got, it.(map[string]any)["message_id"].(string))
		}
		token, _ = body["next_page_token"].(string)
		if token == "" {
			break
		}
	}
	if strings.Join(got, ",") != "m-4,m-3,m-2,m-1,m-0" {
		t.Fatalf("pages gave %v", got)
	}
}

func TestGRPC(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	withID := func(id string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), mesh.HeaderMailboxID, id)
	}
	withNamespace := func(ns string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), mesh.HeaderNamespace, ns)
	}
	tests := []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"no metadata", func() error {
			_, err := f.grpc.QueryEvents(context.Background(), &mailboxv1.QueryEventsRequest{})
			return err
		}, codes.InvalidArgument, mesh.HeaderMailboxID},
		{"unknown mailbox", func() error {
			_, err := f.grpc.GetStats(withID("nope@proxy-01"), &mailboxv1.GetStatsRequest{})
			return err
		}, codes.NotFound, "nope@proxy-01"},
		{"empty namespace", func() error {
			_, err := f.grpc.GetStats(withNamespace(""), &mailboxv1.GetStatsRequest{})
			return err
		}, codes.InvalidArgument, mesh.HeaderNamespace},
		{"namespace with no mailbox here", func() error {
			_, err := f.grpc.GetStats(withNamespace("audit"), &mailboxv1.GetStatsRequest{})
			return err
		}, codes.NotFound, `namespace "audit" has no mailbox served here`},
		{"namespace a prefix of a served one", func() error {
			_, err := f.grpc.GetStats(withNamespace("$adm"), &mailboxv1.GetStatsRequest{})
			return err
		}, codes.NotFound, `namespace "$adm"`},
		{"namespace with two mailboxes here", func() error {
			_, err := f.grpc.QueryEvents(withNamespace("dup"), &mailboxv1.QueryEventsRequest{})
			return err
		}, codes.FailedPrecondition, `namespace "dup" has 2 mailboxes served here (dup@proxy-01, dup@proxy-02)`},
		{"namespace, unknown event", func() error {
			_, err := f.grpc.GetEvent(withNamespace("$admin"), &mailboxv1.GetEventRequest{MessageId: "nope"})
			return err
		}, codes.NotFound, `"nope" not found in mailbox "$admin@proxy-01"`},
		{"unknown mailbox wins over a served namespace", func() error {
			ctx := metadata.AppendToOutgoingContext(withNamespace("$admin"), mesh.HeaderMailboxID, "nope@proxy-01")
			_, err := f.grpc.GetStats(ctx, &mailboxv1.GetStatsRequest{})
			return err
		}, codes.NotFound, "nope@proxy-01"},
		{"negative limit", func() error {
			_, err := f.grpc.QueryEvents(withID(mailboxID), &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{Limit: -1}})
			return err
		}, codes.InvalidArgument, "limit"},
		{"bad page token", func() error {
			_, err := f.grpc.QueryEvents(withID(mailboxID), &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{PageToken: "!!"}})
			return err
		}, codes.InvalidArgument, "page_token"},
		{"empty range", func() error {
			ts := timestamppb.Now()
			_, err := f.grpc.QueryEvents(withID(mailboxID), &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{StartTime: ts, EndTime: ts}})
			return err
		}, codes.InvalidArgument, "start_time"},
		{"empty topic", func() error {
			_, err := f.grpc.QueryEvents(withID(mailboxID), &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{Topics: []string{""}}})
			return err
		}, codes.InvalidArgument, "topics"},
		{"unknown event", func() error {
			_, err := f.grpc.GetEvent(withID(mailboxID), &mailboxv1.GetEventRequest{MessageId: "nope"})
			return err
		}, codes.NotFound, "nope"},
		{"no message id", func() error {
			_, err := f.grpc.GetEvent(withID(mailboxID), &mailboxv1.GetEventRequest{})
			return err
		}, codes.InvalidArgument, "message_id"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.call()
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("err = %v, want %s naming %q", err, tc.code, tc.msg)
			}
		})
	}

	var hdr metadata.MD
	resp, err := f.grpc.QueryEvents(withID(mailboxID), &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{Principals: []string{"user-1"}}}, grpc.Header(&hdr))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Items) != 2 || resp.Items[0].MessageId != "m-4" || resp.Items[1].MessageId != "m-1" {
		t.Fatalf("items = %v", resp.Items)
	}
	if got := hdr.Get(mesh.HeaderMailbox); len(got) != 1 || got[0] != mailboxID {
		t.Fatalf("header %s = %v", mesh.HeaderMailbox, got)
	}
	st, err := f.grpc.GetStats(withID(mailboxID), &mailboxv1.GetStatsRequest{})
	if err != nil || st.Stats.TotalEvents != 5 || st.Stats.MailboxId != mailboxID || st.Stats.Epoch != 7 {
		t.Fatalf("stats = %v, %v", st, err)
	}
}

// TestGRPCByNamespace: a call naming only its namespace is answered by the
// namespace's mailbox exactly as a call naming the mailbox, headers naming
// the real mailbox and epoch; x-mailbox-id wins when both are given.
func TestGRPCByNamespace(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := func(kv ...string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), kv...)
	}
	filter := &mailboxv1.EventFilter{Topics: []string{"a.events"}, Limit: 2}
	tests := []struct {
		name    string
		ctx     context.Context
		mailbox string
	}{
		{"namespace", ctx(mesh.HeaderNamespace, "$admin"), mailboxID},
		{"mailbox", ctx(mesh.HeaderMailboxID, mailboxID), mailboxID},
		{"both: the mailbox wins", ctx(mesh.HeaderNamespace, "$admin", mesh.HeaderMailboxID, "odd/box"), "odd/box"},
		{"empty mailbox, namespace", ctx(mesh.HeaderMailboxID, "", mesh.HeaderNamespace, "$admin"), mailboxID},
	}
	want := map[string]*mailboxv1.QueryEventsResponse{}
	for _, id := range []string{mailboxID, "odd/box"} {
		resp, err := f.grpc.QueryEvents(ctx(mesh.HeaderMailboxID, id), &mailboxv1.QueryEventsRequest{Filter: filter})
		if err != nil {
			t.Fatal(err)
		}
		want[id] = resp
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var hdr metadata.MD
			resp, err := f.grpc.QueryEvents(tt.ctx, &mailboxv1.QueryEventsRequest{Filter: filter}, grpc.Header(&hdr))
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(resp, want[tt.mailbox]) {
				t.Errorf("events = %v, want mailbox %q's %v", resp, tt.mailbox, want[tt.mailbox])
			}
			if got := hdr.Get(mesh.HeaderMailbox); len(got) != 1 || got[0] != tt.mailbox {
				t.Errorf("header %s = %v, want %q", mesh.HeaderMailbox, got, tt.mailbox)
			}
			if got := hdr.Get(mesh.HeaderEpoch); len(got) != 1 || got[0] != "7" {
				t.Errorf("header %s = %v, want 7", mesh.HeaderEpoch, got)
			}
			st, err := f.grpc.GetStats(tt.ctx, &mailboxv1.GetStatsRequest{})
			if err != nil || st.GetStats().GetMailboxId() != tt.mailbox || st.GetStats().GetEpoch() != 7 {
				t.Errorf("stats = %v, %v; want mailbox %q epoch 7", st, err, tt.mailbox)
			}
		})
	}
}

// Another method on a query path is a JSON 405 saying which ones it answers,
// not the 404 of an unknown path.
func TestHTTPWrongMethod(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	esc := url.PathEscape(mailboxID)
	paths := []string{"/v1/mailboxes/" + esc + "/events", "/v1/mailboxes/" + esc + "/events/m-3", "/v1/mailboxes/" + esc + "/stats", "/v1/mailboxes/nope@proxy-01/stats",
		"/v1/namespaces/%24admin/events", "/v1/namespaces/%24admin/events/m-3", "/v1/namespaces/%24admin/stats", "/v1/namespaces/nobody/stats"}
	for _, path := range paths {
		for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
			t.Run(method+" "+path, func(t *testing.T) {
				t.Parallel()
				code, hdr, body := f.do(t, method, path)
				if code != http.StatusMethodNotAllowed || hdr.Get("Allow") != httpapi.Allow {
					t.Fatalf("%s %s = %d Allow %q, want 405 Allow %q", method, path, code, hdr.Get("Allow"), httpapi.Allow)
				}
				if msg, _ := body["error"].(string); !strings.Contains(msg, method) || !strings.Contains(msg, "GET") {
					t.Fatalf("error %q names neither the method nor GET", msg)
				}
			})
		}
	}
	if code, _, _ := f.do(t, http.MethodHead, paths[2]); code != http.StatusOK {
		t.Errorf("HEAD %s = %d, want 200 (Allow promises it)", paths[2], code)
	}
	if code, _, _ := f.do(t, http.MethodHead, paths[6]); code != http.StatusOK {
		t.Errorf("HEAD %s = %d, want 200 (Allow promises it)", paths[6], code)
	}
	for _, path := range []string{"/v1/mailboxes/" + esc + "/whatever", "/v1/namespaces/%24admin/whatever"} {
		if code, _, body := f.do(t, http.MethodPost, path); code != http.StatusNotFound {
			t.Errorf("POST to an unknown path %s = %d %v, want 404", path, code, body)
		}
	}
}

func (f *fixture) do(t *testing.T, method, path string) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, f.httpURL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body map[string]any
	if method != http.MethodHead && json.Unmarshal(b, &body) != nil {
		t.Fatalf("%s %s: body is not JSON: %q", method, path, b)
	}
	return resp.StatusCode, resp.Header, body
}

// A 10 KB id is refused without echoing 10 KB back: over HTTP and gRPC the
// message names its first mesh.MaxEchoLen bytes and marks the cut.
func TestLongIDsEchoedTruncated(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	long := strings.Repeat("x", 10_000)
	want := long[:mesh.MaxEchoLen] + "…"
	check := func(t *testing.T, what, msg string) {
		t.Helper()
		if !strings.Contains(msg, want) || len(msg) > mesh.MaxEchoLen+100 {
			t.Errorf("%s: %d-byte message %.80q…, want the id cut to %d bytes and …", what, len(msg), msg, mesh.MaxEchoLen)
		}
	}
	for _, path := range []string{"/v1/mailboxes/" + long + "/stats", "/v1/mailboxes/" + url.PathEscape(mailboxID) + "/events/" + long} {
		code, _, body := f.get(t, path)
		msg, _ := body["error"].(string)
		if code != http.StatusNotFound {
			t.Errorf("GET %.40s… = %d, want 404", path, code)
		}
		check(t, "HTTP "+path[:40], msg)
	}
	// An unknown path is echoed as "GET /v1/…", cut the same way.
	code, _, body := f.get(t, "/v1/mailboxes/"+long+"/whatever")
	if msg, _ := body["error"].(string); code != http.StatusNotFound || !strings.HasSuffix(msg, "x…") || len(msg) > mesh.MaxEchoLen+100 {
		t.Errorf("unknown path: %d, %d-byte message %.80q…, want a 404 with the path cut", code, len(msg), msg)
	}
	for name, ctx := range map[string]context.Context{
		"mailbox":   metadata.AppendToOutgoingContext(context.Background(), mesh.HeaderMailboxID, long),
		"namespace": metadata.AppendToOutgoingContext(context.Background(), mesh.HeaderNamespace, long),
	} {
		_, err := f.grpc.GetStats(ctx, &mailboxv1.GetStatsRequest{})
		if status.Code(err) != codes.NotFound {
			t.Errorf("gRPC %s: %v, want NotFound", name, err)
		}
		check(t, "gRPC "+name, status.Convert(err).Message())
	}
	_, err := f.grpc.GetEvent(metadata.AppendToOutgoingContext(context.Background(), mesh.HeaderMailboxID, mailboxID), &mailboxv1.GetEventRequest{MessageId: long})
	check(t, "gRPC message_id", status.Convert(err).Message())
}
