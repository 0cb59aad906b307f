package request

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

const notMailboxID = " is not a mailbox id: want {namespace}@{proxy_id}, each part " + mesh.NameRule + " (the namespace optionally after one leading '$')"

// Every metadata value the mesh cannot route is refused, naming the key:
// each control character, non-ASCII, overlong parts, repeats.
func TestFromMetadata(t *testing.T) {
	t.Parallel()
	type tc struct {
		name string
		md   metadata.MD
		want Target
		err  string // the whole message; empty when accepted
	}
	cases := []tc{
		{name: "mailbox id", md: metadata.Pairs(mesh.HeaderMailboxID, "audit@proxy-1"), want: Target{mesh.HeaderMailboxID, "audit@proxy-1"}},
		{name: "system namespace", md: metadata.Pairs(mesh.HeaderMailboxID, "$admin@proxy-1"), want: Target{mesh.HeaderMailboxID, "$admin@proxy-1"}},
		{name: "namespace", md: metadata.Pairs(mesh.HeaderNamespace, "audit"), want: Target{mesh.HeaderNamespace, "audit"}},
		{name: "mailbox id wins", md: metadata.Pairs(mesh.HeaderNamespace, "billing", mesh.HeaderMailboxID, "audit@p"), want: Target{mesh.HeaderMailboxID, "audit@p"}},
		{name: "longest parts", md: metadata.Pairs(mesh.HeaderMailboxID, strings.Repeat("n", mesh.MaxIDLen)+"@"+strings.Repeat("p", mesh.MaxIDLen)),
			want: Target{mesh.HeaderMailboxID, strings.Repeat("n", mesh.MaxIDLen) + "@" + strings.Repeat("p", mesh.MaxIDLen)}},
		{name: "none", md: metadata.MD{}, err: "x-mailbox-id (or x-prism-namespace) metadata is required"},
		{name: "non-ASCII", md: metadata.Pairs(mesh.HeaderMailboxID, "audït@proxy-1"), err: `x-mailbox-id: "audït@proxy-1"` + notMailboxID},
		{name: "not UTF-8", md: metadata.Pairs(mesh.HeaderMailboxID, "a\xff@p"), err: `x-mailbox-id: "a\xff@p"` + notMailboxID},
		{name: "empty", md: metadata.Pairs(mesh.HeaderMailboxID, ""), err: "x-mailbox-id (or x-prism-namespace) metadata is required"},
		{name: "empty mailbox id, a namespace", md: metadata.Pairs(mesh.HeaderMailboxID, "", mesh.HeaderNamespace, "audit"), want: Target{mesh.HeaderNamespace, "audit"}},
		{name: "empty and another", md: metadata.Pairs(mesh.HeaderMailboxID, "", mesh.HeaderMailboxID, "a@p"), err: "x-mailbox-id: given 2 times, want once"},
		{name: "no proxy", md: metadata.Pairs(mesh.HeaderMailboxID, "audit"), err: `x-mailbox-id: "audit"` + notMailboxID},
		{name: "two @", md: metadata.Pairs(mesh.HeaderMailboxID, "a@b@c"), err: `x-mailbox-id: "a@b@c"` + notMailboxID},
		{name: "overlong namespace", md: metadata.Pairs(mesh.HeaderMailboxID, strings.Repeat("n", mesh.MaxIDLen+1)+"@p"),
			err: `x-mailbox-id: ` + quoteOf(strings.Repeat("n", mesh.MaxIDLen+1)+"@p") + notMailboxID},
		{name: "overlong proxy", md: metadata.Pairs(mesh.HeaderMailboxID, "n@"+strings.Repeat("p", mesh.MaxIDLen+1)),
			err: `x-mailbox-id: ` + quoteOf("n@"+strings.Repeat("p", mesh.MaxIDLen+1)) + notMailboxID},
		{name: "10 KB id", md: metadata.Pairs(mesh.HeaderMailboxID, strings.Repeat("x", 10_000)+"@p"),
			err: `x-mailbox-id: "` + strings.Repeat("x", mesh.MaxEchoLen) + `…"` + notMailboxID},
		{name: "repeated", md: metadata.Pairs(mesh.HeaderMailboxID, "a@p", mesh.HeaderMailboxID, "b@p"), err: "x-mailbox-id: given 2 times, want once"},
		{name: "bad namespace", md: metadata.Pairs(mesh.HeaderNamespace, "a b"), err: `x-prism-namespace: "a b" must be ` + mesh.NamespaceRule},
		{name: "overlong namespace alone", md: metadata.Pairs(mesh.HeaderNamespace, strings.Repeat("n", mesh.MaxIDLen+1)),
			err: `x-prism-namespace: ` + quoteOf(strings.Repeat("n", mesh.MaxIDLen+1)) + ` must be ` + mesh.NamespaceRule},
	}
	for c := 0; c < 0x80; c++ {
		if c >= 0x20 && c < 0x7f {
			continue
		}
		id := "audit@proxy" + string(rune(c)) + "1"
		cases = append(cases,
			tc{name: "control in mailbox id " + string(rune('0'+c%10)), md: metadata.Pairs(mesh.HeaderMailboxID, id), err: "x-mailbox-id: " + quoteOf(id) + notMailboxID},
			tc{name: "control in namespace", md: metadata.Pairs(mesh.HeaderNamespace, "au"+string(rune(c))), err: "x-prism-namespace: " + quoteOf("au"+string(rune(c))) + " must be " + mesh.NamespaceRule})
	}
	for _, tc := range cases {
		got, err := FromMetadata(tc.md)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, tc.want)
		case tc.err != "" && (err == nil || err.Error() != tc.err):
			t.Errorf("%s: %v; want error %q", tc.name, err, tc.err)
		}
	}
}

func quoteOf(s string) string { return quote(s) }

var at = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestCalls(t *testing.T) {
	t.Parallel()
	token := "AQAAAAAAAAAAAAAAAAAAAAA"
	for _, tc := range []struct {
		name string
		req  any
		err  string
	}{
		{"stats", &mailboxv1.GetStatsRequest{}, ""},
		{"no filter", &mailboxv1.QueryEventsRequest{}, ""},
		{"a page token", &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{PageToken: token}}, ""},
		{"garbage page token", &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{PageToken: "!!"}},
			`filter.page_token: "!!" is not a page token (base64url without padding): send the next_page_token of an earlier answer as it came`},
		{"page token with a NUL", &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{PageToken: "AQ\x00A"}},
			`filter.page_token: "AQ\x00A" is not a page token (base64url without padding): send the next_page_token of an earlier answer as it came`},
		{"overlong page token", &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{PageToken: strings.Repeat("A", 65)}},
			`filter.page_token: 65 characters, at most 64: send the next_page_token of an earlier answer as it came`},
		{"negative limit", &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{Limit: -1}}, "filter.limit: must not be negative, got -1"},
		{"empty topic", &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{Topics: []string{"a", ""}}}, "filter.topics: empty value"},
		{"too many principals", &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{Principals: make([]string, mesh.MaxFilterValues+1)}}, "filter.principals: at most 100 values, got 101"},
		{"topic not UTF-8", &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{Topics: []string{"\xff"}}}, `filter.topics: "\xff" is not UTF-8`},
		{"trace id not UTF-8", &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{TraceId: "\xfe"}}, `filter.trace_id: "\xfe" is not UTF-8`},
		{"bad time", &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{StartTime: &timestamppb.Timestamp{Nanos: -1}}}, "filter.start_time: proto"},
		{"empty range", &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{StartTime: timestamppb.New(at), EndTime: timestamppb.New(at)}}, "filter.start_time: must be before end_time"},
		{"message id", &mailboxv1.GetEventRequest{MessageId: "m-1"}, ""},
		{"no message id", &mailboxv1.GetEventRequest{}, "message_id: required"},
		{"message id not UTF-8", &mailboxv1.GetEventRequest{MessageId: "m\xff"}, `message_id: "m\xff" is not UTF-8`},
	} {
		err := Call(tc.req)
		switch {
		case err == nil && tc.err != "":
			t.Errorf("%s: accepted, want %q", tc.name, tc.err)
		case err != nil && (tc.err == "" || !strings.HasPrefix(err.Error(), tc.err)):
			t.Errorf("%s: %q, want %q", tc.name, err, tc.err)
		}
	}
}

// FuzzCall: no metadata or request panics the validators; a target they
// accept is one the mesh routes and gRPC metadata carries as it is
// (printable ASCII), and a request they accept holds only UTF-8 strings (so
// any proto3 decoder reads it when it is sent on) and names its field when
// refused.
func FuzzCall(f *testing.F) {
	f.Add("audit@proxy-1", "", "m-1", "AQAAAAAAAAAAAAAAAAAAAAA", "audit.events")
	f.Add("audït@proxy-1", "", "", "", "")
	f.Add("a\x00@p", "audit", "m\xff", "%zz", "\xff")
	f.Add("", "\xff", "m", "!!", "")
	f.Add("", "$admin", "m", strings.Repeat("A", 65), ",")
	f.Fuzz(func(t *testing.T, mailboxID, namespace, messageID, token, topic string) {
		md := metadata.MD{}
		if mailboxID != "" {
			md.Set(mesh.HeaderMailboxID, mailboxID)
		}
		if namespace != "" {
			md.Set(mesh.HeaderNamespace, namespace)
		}
		if tg, err := FromMetadata(md); err == nil {
			for i := 0; i < len(tg.Value); i++ {
				if c := tg.Value[i]; c < 0x20 || c > 0x7e {
					t.Fatalf("accepted %q, which holds byte %#x", tg.Value, c)
				}
			}
			if _, err := mesh.CheckMailboxID(tg.Value); tg.Key == mesh.HeaderMailboxID && err != nil {
				t.Fatalf("accepted mailbox id %q the mesh refuses: %v", tg.Value, err)
			}
		} else if !strings.HasPrefix(err.Error(), mesh.HeaderMailboxID) && !strings.HasPrefix(err.Error(), mesh.HeaderNamespace) {
			t.Fatalf("error names no metadata key: %v", err)
		}
		var topics []string
		if topic != "" {
			topics = strings.Split(topic, ",")
		}
		for _, c := range []struct {
			req     proto.Message
			strings string // every string of req
		}{
			{&mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{PageToken: token, Topics: topics, CorrelationId: messageID}}, token + topic + messageID},
			{&mailboxv1.GetEventRequest{MessageId: messageID}, messageID},
		} {
			if err := Call(c.req); err != nil {
				if !strings.HasPrefix(err.Error(), "filter.") && !strings.HasPrefix(err.Error(), "message_id: ") {
					t.Fatalf("error names no field: %v", err)
				}
				continue
			}
			if !utf8.ValidString(c.strings) {
				t.Fatalf("accepted %v, which holds a string that is not UTF-8: a proto3 decoder refuses it", c.req)
			}
		}
	})
}
