package query

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
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

// leases is a Mailboxes whose mailboxes and epochs change while the servers
// run, as a runner's do when its sidecar activates, fences and closes them.
type leases struct {
	mu   sync.Mutex
	held map[string]lease
}

type lease struct {
	src   Source
	epoch uint64
}

func (l *leases) Mailbox(id string) (Source, uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.held[id]
	return h.src, h.epoch, ok
}

func (l *leases) IDs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]string, 0, len(l.held))
	for id := range l.held {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (l *leases) set(id string, src Source, epoch uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if src == nil {
		delete(l.held, id)
		return
	}
	l.held[id] = lease{src, epoch}
}

// storeWith is an in-memory store holding one event per message id.
func storeWith(t *testing.T, ids ...string) *store.Store {
	t.Helper()
	st, err := store.Open(store.Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var items []*mailboxv1.MailboxItem
	for i, id := range ids {
		raw, _ := proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
			MessageId: id, Topic: "a.events", PublishedAt: timestamppb.New(time.Unix(int64(1000+i), 0))}})
		item, err := envelope.Process(raw, envelope.Strict, nil)
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, item)
	}
	if _, err := st.Write(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	return st
}

// faces serves mb over HTTP and gRPC on loopback.
type faces struct {
	httpURL string
	grpc    mailboxv1.MailboxQueryClient
}

func serveFaces(t *testing.T, mb Mailboxes) faces {
	t.Helper()
	m := NewMetrics(prometheus.NewRegistry())
	hs := httptest.NewServer(NewHTTPHandler(mb, m))
	t.Cleanup(hs.Close)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	NewGRPCServer(mb, m).Register(gs)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return faces{httpURL: hs.URL, grpc: mailboxv1.NewMailboxQueryClient(cc)}
}

// ask is one query, sent through both faces of the API.
type ask struct {
	op     string // "events", "event" or "stats"
	key    string // mesh.HeaderMailboxID or mesh.HeaderNamespace
	value  string // the mailbox id or namespace
	seg    string // its HTTP path segment; "" = value as it is
	msgID  string // for "event", escaped in its HTTP path
	limit  int32  // for "events"; negative is refused
	expect answer
}

// answer is what both faces must say: the gRPC code (HTTP: its status), a
// part of the message for refusals, and the x-prism-* headers ("" = absent).
type answer struct {
	code           codes.Code
	msg            string
	mailbox, epoch string
}

func (a ask) http(t *testing.T, base string) (int, http.Header, string) {
	t.Helper()
	seg := a.seg
	if seg == "" {
		seg = a.value
	}
	path := "/v1/mailboxes/" + seg
	if a.key == mesh.HeaderNamespace {
		path = "/v1/namespaces/" + seg
	}
	switch a.op {
	case "events":
		path += fmt.Sprintf("/events?limit=%d", a.limit)
	case "event":
		path += "/events/" + url.PathEscape(a.msgID)
	default:
		path += "/stats"
	}
	resp, err := http.Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var body struct {
		Error     string `json:"error"`
		MailboxID string `json:"mailbox_id"`
	}
	if err := json.Unmarshal(b, &body); err != nil || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %s body %q is not JSON: %v", path, resp.Header.Get("Content-Type"), b, err)
	}
	if resp.StatusCode == http.StatusOK && a.op != "event" && body.MailboxID != resp.Header.Get(mesh.HeaderMailbox) {
		t.Errorf("GET %s: body names mailbox %q, header %q", path, body.MailboxID, resp.Header.Get(mesh.HeaderMailbox))
	}
	return resp.StatusCode, resp.Header, body.Error
}

func (a ask) grpc(c mailboxv1.MailboxQueryClient) (metadata.MD, error) {
	ctx := metadata.AppendToOutgoingContext(context.Background(), a.key, a.value)
	var hdr metadata.MD
	var err error
	switch a.op {
	case "events":
		_, err = c.QueryEvents(ctx, &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{Limit: a.limit}}, grpc.Header(&hdr))
	case "event":
		_, err = c.GetEvent(ctx, &mailboxv1.GetEventRequest{MessageId: a.msgID}, grpc.Header(&hdr))
	default:
		var resp *mailboxv1.GetStatsResponse
		resp, err = c.GetStats(ctx, &mailboxv1.GetStatsRequest{}, grpc.Header(&hdr))
		if err == nil && (resp.GetStats().GetMailboxId() != a.expect.mailbox || fmt.Sprint(resp.GetStats().GetEpoch()) != a.expect.epoch) {
			err = fmt.Errorf("stats name mailbox %q epoch %d", resp.GetStats().GetMailboxId(), resp.GetStats().GetEpoch())
		}
	}
	return hdr, err
}

// check sends a through both faces and fails t unless each answers as
// a.expect says, with the x-prism-* headers it says and no others.
func (a ask) check(t *testing.T, f faces) {
	t.Helper()
	want := a.expect
	code, hdr, msg := a.http(t, f.httpURL)
	if code != httpapi.HTTPStatus(want.code) || !strings.Contains(msg, want.msg) {
		t.Errorf("HTTP: %d %q, want %d naming %q", code, msg, httpapi.HTTPStatus(want.code), want.msg)
	}
	if got := [2]string{hdr.Get(mesh.HeaderMailbox), hdr.Get(mesh.HeaderEpoch)}; got != [2]string{want.mailbox, want.epoch} {
		t.Errorf("HTTP headers %s, %s = %q, want %q", mesh.HeaderMailbox, mesh.HeaderEpoch, got, [2]string{want.mailbox, want.epoch})
	}
	md, err := a.grpc(f.grpc)
	if status.Code(err) != want.code || !strings.Contains(status.Convert(err).Message(), want.msg) {
		t.Errorf("gRPC: %v, want %s naming %q", err, want.code, want.msg)
	}
	one := func(k string) string {
		switch v := md.Get(k); len(v) {
		case 0:
			return ""
		case 1:
			return v[0]
		default:
			return fmt.Sprint(v)
		}
	}
	if got := [2]string{one(mesh.HeaderMailbox), one(mesh.HeaderEpoch)}; got != [2]string{want.mailbox, want.epoch} {
		t.Errorf("gRPC header metadata %s, %s = %q, want %q", mesh.HeaderMailbox, mesh.HeaderEpoch, got, [2]string{want.mailbox, want.epoch})
	}
}

// TestEveryAnswerNamesItsMailbox: whatever a served mailbox answers, by id
// or by namespace, success or refusal, over HTTP or gRPC, carries
// x-prism-mailbox and x-prism-epoch; a request naming nothing served here
// (an unknown id, the same namespace on another proxy, a namespace with no
// or two mailboxes here) is refused naming what it asked for, with neither
// header, so no client takes the refusal for the mailbox's word.
func TestEveryAnswerNamesItsMailbox(t *testing.T) {
	t.Parallel()
	l := &leases{held: map[string]lease{}}
	l.set(mailboxID, storeWith(t, "m-0", "m/1"), 7)
	l.set("dup@proxy-01", storeWith(t), 2)
	l.set("dup@proxy-02", storeWith(t), 3)
	f := serveFaces(t, l)
	byID, byNS := mesh.HeaderMailboxID, mesh.HeaderNamespace
	served := answer{code: codes.OK, mailbox: mailboxID, epoch: "7"}
	refused := func(c codes.Code, msg string) answer {
		return answer{code: c, msg: msg, mailbox: mailboxID, epoch: "7"}
	}
	notHere := func(c codes.Code, msg string) answer { return answer{code: c, msg: msg} }
	for _, tc := range []struct {
		name string
		ask  ask
	}{
		{"events by id", ask{op: "events", key: byID, value: mailboxID, expect: served}},
		{"one event by id, escaped", ask{op: "event", key: byID, value: mailboxID, seg: "%24admin%40proxy-01", msgID: "m/1", expect: served}},
		{"stats by id", ask{op: "stats", key: byID, value: mailboxID, expect: served}},
		{"events by namespace", ask{op: "events", key: byNS, value: "$admin", expect: served}},
		{"one event by namespace, escaped", ask{op: "event", key: byNS, value: "$admin", seg: "%24admin", msgID: "m-0", expect: served}},
		{"stats by namespace", ask{op: "stats", key: byNS, value: "$admin", seg: "%24admin", expect: served}},
		{"unknown event by id", ask{op: "event", key: byID, value: mailboxID, msgID: "nope", expect: refused(codes.NotFound, `"nope" not found in mailbox "$admin@proxy-01"`)}},
		{"unknown event by namespace", ask{op: "event", key: byNS, value: "$admin", msgID: "nope", expect: refused(codes.NotFound, `"nope" not found in mailbox "$admin@proxy-01"`)}},
		{"bad filter by id", ask{op: "events", key: byID, value: mailboxID, limit: -1, expect: refused(codes.InvalidArgument, "limit")}},
		{"bad filter by namespace", ask{op: "events", key: byNS, value: "$admin", limit: -1, expect: refused(codes.InvalidArgument, "limit")}},
		{"unknown mailbox", ask{op: "stats", key: byID, value: "nope@proxy-01", expect: notHere(codes.NotFound, `mailbox "nope@proxy-01" is not served here`)}},
		{"the namespace's mailbox on another proxy", ask{op: "events", key: byID, value: "$admin@proxy-02", seg: "%24admin%40proxy-02", expect: notHere(codes.NotFound, `mailbox "$admin@proxy-02" is not served here`)}},
		{"another proxy's mailbox, one event", ask{op: "event", key: byID, value: "$admin@proxy-02", msgID: "m-0", expect: notHere(codes.NotFound, `"$admin@proxy-02"`)}},
		{"namespace not served", ask{op: "stats", key: byNS, value: "audit", expect: notHere(codes.NotFound, `namespace "audit" has no mailbox served here`)}},
		{"namespace a prefix of a served one", ask{op: "events", key: byNS, value: "$adm", seg: "%24adm", expect: notHere(codes.NotFound, `namespace "$adm" has no mailbox served here`)}},
		{"namespace with two mailboxes here", ask{op: "events", key: byNS, value: "dup", expect: notHere(codes.FailedPrecondition, `namespace "dup" has 2 mailboxes served here (dup@proxy-01, dup@proxy-02)`)}},
		{"namespace with two mailboxes here, stats", ask{op: "stats", key: byNS, value: "dup", expect: notHere(codes.FailedPrecondition, `namespace "dup" has 2 mailboxes`)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.ask.check(t, f)
		})
	}
}

// TestServesOnlyWhatIsHeldNow: the servers ask Mailboxes on every request,
// so a mailbox is answered exactly while it is held and under the epoch it
// is held with now: never held, released, taken by a newer epoch elsewhere
// (fenced here) are NotFound naming it, and a re-grant answers with the new
// epoch, by id and by namespace alike.
func TestServesOnlyWhatIsHeldNow(t *testing.T) {
	t.Parallel()
	const id = "audit@proxy-01"
	l := &leases{held: map[string]lease{}}
	f := serveFaces(t, l)
	src := storeWith(t, "m-0")
	gone := []answer{
		{code: codes.NotFound, msg: `mailbox "audit@proxy-01" is not served here`},
		{code: codes.NotFound, msg: `namespace "audit" has no mailbox served here`},
	}
	held := func(epoch string) []answer {
		a := answer{code: codes.OK, mailbox: id, epoch: epoch}
		return []answer{a, a}
	}
	for _, step := range []struct {
		name  string
		apply func()
		want  []answer // by id, by namespace
	}{
		{"never held", func() {}, gone},
		{"activated at epoch 3", func() { l.set(id, src, 3) }, held("3")},
		{"released", func() { l.set(id, nil, 0) }, gone},
		{"re-granted at epoch 5", func() { l.set(id, src, 5) }, held("5")},
		{"renewed as epoch 6", func() { l.set(id, src, 6) }, held("6")},
		{"fenced: epoch 7 granted elsewhere", func() { l.set(id, nil, 0) }, gone},
	} {
		step.apply()
		for i, key := range []string{mesh.HeaderMailboxID, mesh.HeaderNamespace} {
			value := id
			if key == mesh.HeaderNamespace {
				value = "audit"
			}
			for _, op := range []string{"events", "event", "stats"} {
				t.Run(fmt.Sprintf("%s/%s/%s", step.name, key, op), func(t *testing.T) {
					ask{op: op, key: key, value: value, msgID: "m-0", expect: step.want[i]}.check(t, f)
				})
			}
		}
	}
}
