package security

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	prismmesh "github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/authtest"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// want is a door's answer to one input: the HTTP status (or gRPC code) and a
// part of the error message ("" for a success).
type want struct {
	code int
	msg  string
}

// httpInput is one request to the HTTP query API, answered as gw by prism
// gateway and as runner by the runner's query port.
type httpInput struct {
	name, path string
	gw, runner want
}

// notMailboxID is the end of the gateway's refusal of a mailbox id the mesh cannot route.
const notMailboxID = ` is not a mailbox id: want {namespace}@{proxy_id}`

// httpInputs are the inputs every HTTP door must refuse with a 400 naming the parameter (or, for an id
// a runner simply does not serve, a 404 naming it), never a 5xx, and their accepted neighbours.
func httpInputs() []httpInput {
	mb := "/v1/mailboxes/" + mailboxID
	both := func(code int, msg string) (want, want) { return want{code, msg}, want{code, msg} }
	in := func(name, path string, gw, runner want) httpInput { return httpInput{name, path, gw, runner} }
	same := func(name, path string, code int, msg string) httpInput {
		gw, r := both(code, msg)
		return in(name, path, gw, r)
	}
	params := func(n int, piece string) string { return strings.TrimSuffix(strings.Repeat(piece+"&", n), "&") }
	token := strings.Repeat("A", prismmesh.MaxPageTokenLen)
	out := []httpInput{
		same("a good query", mb+"/events?limit=5", 200, ""),
		same("a bad escape", mb+"/events?limit=%zz", 400, `limit: invalid URL escape "%zz"`),
		same("a bad escape after good parameters", mb+"/events?topic="+topic+"&limit=%zz", 400, `limit: invalid URL escape "%zz"`),
		same("an escape cut short", mb+"/events?topic=%4", 400, `topic: invalid URL escape "%4"`),
		same("a lone percent", mb+"/events?principal=%", 400, `principal: invalid URL escape "%"`),
		same("a non-hex escape", mb+"/events?trace_id=%g0", 400, `trace_id: invalid URL escape "%g0"`),
		same("a bad escape in a name", mb+"/events?%zz=1", 400, `"%zz": invalid URL escape "%zz" in the parameter name`),
		same("a bad escape where no parameter is taken", mb+"/stats?%zz", 400, `"%zz": invalid URL escape "%zz" in the parameter name`),
		same("a parameter where none is taken", mb+"/stats?limit=1", 400, `"limit": unknown parameter (this path takes none)`),
		same("an unknown parameter", mb+"/events?principals=a", 400, `"principals": unknown parameter`),
		same("a repeated single parameter", mb+"/events?limit=1&limit=2", 400, `limit: given 2 times, want at most once`),
		same("as many parameters as the bound", mb+"/events?"+params(prismmesh.MaxFilterValues, "topic="+topic)+"&"+params(httpapi.MaxParams-prismmesh.MaxFilterValues, ""), 200, ""),
		same("one parameter over the bound", mb+"/events?"+params(prismmesh.MaxFilterValues, "topic="+topic)+"&"+params(httpapi.MaxParams-prismmesh.MaxFilterValues+1, ""), 400, "query: 257 parameters, at most 256"),
		same("url.ParseQuery's bound", mb+"/events?"+params(10_000, "limit=5"), 400, "query: 10000 parameters, at most 256"),
		same("one over url.ParseQuery's bound", mb+"/events?"+params(10_001, "limit=5"), 400, "query: 10001 parameters, at most 256"),
		same("a page token that is not UTF-8", mb+"/events?page_token=%ff%fe", 400, `page_token: "\xff\xfe" is not UTF-8`),
		same("a page token of garbage", mb+"/events?page_token=%21%21", 400, `page_token: "!!" is not a page token`),
		same("a page token with a NUL", mb+"/events?page_token=AQ%00A", 400, `page_token: "AQ\x00A" is not a page token`),
		same("an overlong page token", mb+"/events?page_token="+token+"A", 400, "page_token: 65 characters, at most 64"),
		same("a page token of a token's form, not the store's", mb+"/events?page_token="+token, 400, "page_token: wrong length 48"),
		same("a topic that is not UTF-8", mb+"/events?topic=%ff", 400, `topic: "\xff" is not UTF-8`),
		same("a message id that is not UTF-8", mb+"/events/m%ff", 400, `message_id: "m\xff" is not UTF-8`),
		same("a message id with a NUL", mb+"/events/m%00", 404, `message_id "m\x00" not found`),
		// A well-formed id of a proxy that does not exist: routed, and not found.
		same("the longest proxy id", "/v1/mailboxes/"+namespace+"@"+strings.Repeat("p", prismmesh.MaxIDLen)+"/stats", 404, ""),
	}
	badID := func(name, id string) httpInput {
		q := strconv.Quote(prismmesh.Echo(id))
		return in(name, "/v1/mailboxes/"+url.PathEscape(id)+"/stats",
			want{400, "mailbox_id: " + q + notMailboxID}, want{404, "mailbox " + q + " is not served here"})
	}
	badNamespace := func(name, ns string) httpInput {
		q := strconv.Quote(prismmesh.Echo(ns))
		return in(name, "/v1/namespaces/"+url.PathEscape(ns)+"/stats",
			want{400, "namespace: " + q + " must be "}, want{404, "namespace " + q + " has no mailbox served here"})
	}
	out = append(out,
		badID("a non-ASCII mailbox id", "audït@"+proxyID),
		badID("an overlong namespace", strings.Repeat("n", prismmesh.MaxIDLen+1)+"@"+proxyID),
		badID("an overlong proxy id", namespace+"@"+strings.Repeat("p", prismmesh.MaxIDLen+1)),
		badID("a 10 KB mailbox id", strings.Repeat("x", 10_000)+"@"+proxyID),
		badID("a mailbox id with two @", namespace+"@"+proxyID+"@x"),
		badNamespace("a non-ASCII namespace", "audït"),
	)
	for c := range 0x80 {
		if c >= 0x20 && c < 0x7f {
			continue
		}
		out = append(out,
			badID(fmt.Sprintf("control character %#x in a mailbox id", c), namespace+string(rune(c))+"@"+proxyID),
			badNamespace(fmt.Sprintf("control character %#x in a namespace", c), namespace+string(rune(c))))
	}
	return out
}

// grpcInput is one MailboxQuery call as raw HTTP/2 (a grpc-go client refuses to send metadata that is
// not printable ASCII, but the wire carries it), answered gw by prism gateway and runner by the runner.
type grpcInput struct {
	name       string
	method     string
	md         [][2]string
	req        any // a proto.Message, or []byte: bytes that need not be protobuf
	gw, runner want
}

func grpcInputs() []grpcInput {
	stats := &mailboxv1.GetStatsRequest{}
	byID := func(id string) [][2]string { return [][2]string{{prismmesh.HeaderMailboxID, id}} }
	ok := want{0, ""}
	invalid := func(msg string) want { return want{3, msg} }
	notFound := want{5, "is not served here"}
	events := func(tok string) *mailboxv1.QueryEventsRequest {
		return &mailboxv1.QueryEventsRequest{Filter: &mailboxv1.EventFilter{PageToken: tok}}
	}
	out := []grpcInput{
		{"a good call", "GetStats", byID(mailboxID), stats, ok, ok},
		{"a non-ASCII mailbox id", "GetStats", byID("audït@" + proxyID), stats, invalid(`x-mailbox-id: "audït@proxy-1"` + notMailboxID), notFound},
		{"a mailbox id with a byte that is not UTF-8", "GetStats", byID("audit\xff@" + proxyID), stats, invalid(`x-mailbox-id: "audit\xff@proxy-1"` + notMailboxID), notFound},
		{"a mailbox id with a tab", "GetStats", byID("audit\t@" + proxyID), stats, invalid(`x-mailbox-id: "audit\t@proxy-1"` + notMailboxID), notFound},
		{"an overlong namespace", "GetStats", byID(strings.Repeat("n", prismmesh.MaxIDLen+1) + "@" + proxyID), stats, invalid(notMailboxID), notFound},
		{"a mailbox id with two @", "GetStats", byID(mailboxID + "@x"), stats, invalid(notMailboxID), notFound},
		{"a non-ASCII namespace", "GetStats", [][2]string{{prismmesh.HeaderNamespace, "audït"}}, stats, invalid(`x-prism-namespace: "audït" must be `), want{5, "has no mailbox served here"}},
		// The runner reads the first: the gateway, which routes by it, refuses the ambiguity.
		{"a mailbox id given twice", "GetStats", append(byID(mailboxID), byID("other@"+proxyID)...), stats, invalid("x-mailbox-id: given 2 times, want once"), ok},
		{"a page token of garbage", "QueryEvents", byID(mailboxID), events("!!"), invalid(`filter.page_token: "!!" is not a page token`), invalid(`filter.page_token: "!!" is not a page token`)},
		{"an overlong page token", "QueryEvents", byID(mailboxID), events(strings.Repeat("A", 65)), invalid("filter.page_token: 65 characters, at most 64"), invalid("filter.page_token: 65 characters, at most 64")},
		{"a page token of a token's form, not the store's", "QueryEvents", byID(mailboxID), events("AAAA"), invalid("page_token: wrong length 3"), invalid("page_token: wrong length 3")},
		{"no message id", "GetEvent", byID(mailboxID), &mailboxv1.GetEventRequest{}, invalid("message_id: required"), invalid("message_id: required")},
	}
	// Strings that are not UTF-8, in every string field of a request: proto.Marshal sends them as they
	// are, since mailbox.proto does not validate them (the doors do).
	filter := func(f *mailboxv1.EventFilter) *mailboxv1.QueryEventsRequest {
		return &mailboxv1.QueryEventsRequest{Filter: f}
	}
	for _, c := range []struct {
		name   string
		method string
		req    proto.Message
		msg    string
	}{
		{"a topic", "QueryEvents", filter(&mailboxv1.EventFilter{Topics: []string{topic, "\xff"}}), `filter.topics: "\xff" is not UTF-8`},
		{"a principal", "QueryEvents", filter(&mailboxv1.EventFilter{Principals: []string{"p\xc3"}}), `filter.principals: "p\xc3" is not UTF-8`},
		{"a correlation id", "QueryEvents", filter(&mailboxv1.EventFilter{CorrelationId: "\xed\xa0\x80"}), `filter.correlation_id: "\xed\xa0\x80" is not UTF-8`},
		{"a trace id", "QueryEvents", filter(&mailboxv1.EventFilter{TraceId: "t\xfe"}), `filter.trace_id: "t\xfe" is not UTF-8`},
		{"a page token", "QueryEvents", filter(&mailboxv1.EventFilter{PageToken: "\xff\xfe"}), `filter.page_token: "\xff\xfe" is not UTF-8`},
		{"a message id", "GetEvent", &mailboxv1.GetEventRequest{MessageId: "m\xff"}, `message_id: "m\xff" is not UTF-8`},
	} {
		out = append(out, grpcInput{name: c.name + " that is not UTF-8", method: c.method, md: byID(mailboxID), req: c.req, gw: invalid(c.msg), runner: invalid(c.msg)})
	}
	// Messages that are not protobuf at all, refused before the metadata is looked at.
	for _, c := range []struct {
		name, method string
		body         []byte
	}{
		{"a truncated field", "QueryEvents", []byte{0x0a, 0x05, 0x1a, 0x7f}},
		{"a length past the end", "GetEvent", []byte{0x0a, 0x7f, 'm'}},
		{"bytes of garbage", "GetStats", []byte{0xff, 0xff, 0xff, 0xff}},
		{"a field of wire type 7", "GetEvent", []byte{0x0f}},
	} {
		out = append(out, grpcInput{name: c.name, method: c.method, md: byID("not a mailbox id"), req: c.body, gw: invalid("request: proto"), runner: invalid("request: proto")})
	}
	return out
}

// TestEveryQueryDoorRefusesBadInput sends every door of the query API (prism gateway's HTTP and gRPC
// APIs in front of a real runner, and the runner's own HTTP and gRPC query port) the inputs it must refuse
// and their neighbours: each gets the documented status and message, never a 5xx, and afterwards both
// servers are healthy, the mailbox is still served under the same lease, and the mesh's state is
// what it was.
func TestEveryQueryDoorRefusesBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three admin nodes, a runner, a sidecar and a gateway")
	}
	const events = 5
	kafka := kafkatest.Start(t, kafkatest.Topics(2, topic))
	kafka.ProduceEnvelopes(t, topic, kafkatest.Envelopes(topic, events)...)
	key := authtest.NewKey(t, "k1", "ES256")
	jwks := t.TempDir()
	authtest.WriteJWKS(t, jwks+"/jwks.json", key)
	token := key.Sign(t, authtest.Claims("https://issuer.test", "prism", namespace))
	m := startMesh(t, kafka.Brokers, jwksArgs(jwks), token)
	served := func() (bool, string) {
		code, body, hdr := getHTTP(t, http.DefaultClient, m.gateway.HTTPURL()+"/v1/mailboxes/"+mailboxID+"/stats", token)
		return code == 200 && strings.Contains(body, fmt.Sprintf(`"total_events":%d`, events)), fmt.Sprint(code, " ", body, " ", hdr.Get(prismmesh.HeaderEpoch))
	}
	testwait.For(t, 60*time.Second, "the events stored", served)
	_, _, hdr := getHTTP(t, http.DefaultClient, m.gateway.HTTPURL()+"/v1/mailboxes/"+mailboxID+"/stats", token)
	epoch := hdr.Get(prismmesh.HeaderEpoch)
	before := m.state(t)

	reader := credential{tls: e2e.ClientTLS(t, nil, identity.Reader, "dash")}.http()
	for _, in := range httpInputs() {
		for _, door := range []struct {
			name, base, token string
			client            *http.Client
			want              want
		}{
			{"gateway", m.gateway.HTTPURL(), token, http.DefaultClient, in.gw},
			{"runner", "https://" + m.runner.QueryAddr, "", reader, in.runner},
		} {
			code, body, _ := getHTTP(t, door.client, door.base+in.path, door.token)
			checkHTTP(t, door.name+" HTTP: "+in.name, code, body, door.want)
		}
	}

	// A path that is no URI (a bad percent-escape) never reaches the API's handlers: Go's HTTP server
	// refuses it while reading the request, over HTTP/1.1 with a plain-text 400 closing the connection
	// (docs/query-api.md#errors). Never a 5xx.
	h1TLS := e2e.ClientTLS(t, nil, identity.Reader, "dash")
	h1TLS.NextProtos = []string{"http/1.1"}
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: h1TLS}, Timeout: 10 * time.Second}
	for _, path := range []string{
		"/v1/mailboxes/%zz/stats",
		"/v1/mailboxes/" + mailboxID + "/events/m%4",
		"/v1/namespaces/%/events",
		"/v1/mailboxes/" + mailboxID + "%g0/events?limit=5",
	} {
		for _, door := range []struct {
			name, base, token string
			client            *http.Client
		}{
			{"gateway", m.gateway.HTTPURL(), token, http.DefaultClient},
			{"runner", "https://" + m.runner.QueryAddr, "", h1},
		} {
			code, body, closed, err := getOpaque(door.client, door.base, path, door.token)
			if err != nil || code != 400 || body != "400 Bad Request" || !closed {
				t.Errorf("%s: GET %s = %d %q (closing %v, err %v), want Go's plain-text 400 closing the connection", door.name, path, code, body, closed, err)
			}
		}
	}

	gwGRPC := rawGRPCClient(nil)
	runnerGRPC := rawGRPCClient(e2e.ClientTLS(t, nil, identity.Gateway, "gw-1"))
	for _, in := range grpcInputs() {
		for _, door := range []struct {
			name, base string
			md         [][2]string
			client     *http.Client
			want       want
		}{
			{"gateway", "http://" + m.gateway.GRPCAddr, append([][2]string{{"authorization", "Bearer " + token}}, in.md...), gwGRPC, in.gw},
			{"runner", "https://" + m.runner.QueryAddr, in.md, runnerGRPC, in.runner},
		} {
			code, msg, err := rawGRPC(door.client, door.base, in.method, door.md, in.req)
			if err != nil {
				t.Errorf("%s gRPC: %s: %v", door.name, in.name, err)
				continue
			}
			if code != door.want.code || !strings.Contains(msg, door.want.msg) {
				t.Errorf("%s gRPC: %s: code %d %q, want %d containing %q", door.name, in.name, code, msg, door.want.code, door.want.msg)
			}
		}
	}

	for _, probe := range []string{m.gateway.HTTPURL() + "/healthz", m.gateway.HTTPURL() + "/readyz", m.runner.HTTPURL() + "/healthz", m.runner.HTTPURL() + "/readyz"} {
		if code, body, _ := getHTTP(t, http.DefaultClient, probe, ""); code != 200 {
			t.Errorf("after the bad input, %s = %d %s", probe, code, body)
		}
	}
	if ok, got := served(); !ok {
		t.Errorf("after the bad input, the mailbox's stats = %s, want %d events", got, events)
	}
	if _, _, hdr := getHTTP(t, http.DefaultClient, m.gateway.HTTPURL()+"/v1/mailboxes/"+mailboxID+"/stats", token); hdr.Get(prismmesh.HeaderEpoch) != epoch {
		t.Errorf("after the bad input, served under epoch %q, want %q", hdr.Get(prismmesh.HeaderEpoch), epoch)
	}
	if d := diff(before, m.state(t)); d != "" {
		t.Errorf("bad input changed the state: %s", d)
	}
	if v, err := e2e.NewHTTP(5*time.Second).Metric(m.sidecar.HTTPURL(), "prism_sidecar_lease_losses_total"); err == nil && v != 0 {
		t.Errorf("the sidecar lost its lease %v times during the bad input", v)
	}
}

// getHTTP is GET url with token (if any) as a bearer token.
func getHTTP(t *testing.T, c *http.Client, u, token string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %.80s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// getOpaque is GET path on base over HTTP/1.1, the path sent as it is (it need not be a URI), with
// token (if any) as a bearer token; closed is whether the server closes the connection after it.
func getOpaque(c *http.Client, base, path, token string) (code int, body string, closed bool, err error) {
	req, err := http.NewRequest(http.MethodGet, base+"/", nil)
	if err != nil {
		return 0, "", false, err
	}
	req.URL.Opaque = path
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Close, err
}

// checkHTTP checks one answer: the status, and for a refusal a JSON {"error"} containing w.msg.
func checkHTTP(t *testing.T, what string, code int, body string, w want) {
	t.Helper()
	if code != w.code {
		t.Errorf("%s: %d %.300s, want %d", what, code, body, w.code)
		return
	}
	if w.code == 200 {
		return
	}
	var e struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || !strings.Contains(e.Error, w.msg) {
		t.Errorf("%s: %d %.300s, want a JSON error containing %q", what, code, body, w.msg)
	}
}

// rawGRPCClient speaks HTTP/2 with TLS cfg, or in cleartext (h2c) when cfg is nil.
func rawGRPCClient(cfg *tls.Config) *http.Client {
	tr := &http.Transport{TLSClientConfig: cfg, Protocols: new(http.Protocols)}
	if cfg == nil {
		tr.Protocols.SetUnencryptedHTTP2(true)
	} else {
		tr.Protocols.SetHTTP2(true)
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// rawGRPC makes one unary MailboxQuery call as gRPC over HTTP/2 frames it, with the metadata md sent as
// it is and msg (a proto.Message, or bytes sent as they are) as the request message, and returns the grpc-status and grpc-message the server answered.
func rawGRPC(c *http.Client, base, method string, md [][2]string, msg any) (int, string, error) {
	b, ok := msg.([]byte)
	if !ok {
		var err error
		if b, err = proto.Marshal(msg.(proto.Message)); err != nil {
			return 0, "", err
		}
	}
	frame := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b)))
	req, err := http.NewRequest(http.MethodPost, base+"/"+mailboxv1.MailboxQuery_ServiceDesc.ServiceName+"/"+method, bytes.NewReader(append(frame, b...)))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	for _, kv := range md {
		req.Header[kv[0]] = append(req.Header[kv[0]], kv[1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, "", err
	}
	get := func(k string) string {
		if v := resp.Trailer.Get(k); v != "" {
			return v
		}
		return resp.Header.Get(k) // a trailers-only answer
	}
	code, err := strconv.Atoi(get("grpc-status"))
	if err != nil {
		return 0, "", fmt.Errorf("HTTP %d without a grpc-status: %w", resp.StatusCode, err)
	}
	text, err := url.PathUnescape(get("grpc-message"))
	if err != nil {
		text = get("grpc-message")
	}
	return code, text, nil
}
