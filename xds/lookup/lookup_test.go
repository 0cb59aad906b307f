package lookup

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	lookupv1 "github.com/prism-mesh/prism/proto/prism/lookup/v1"
)

// fakeRoutes maps a namespace to its mailbox id, and to its in-sync
// replicas' in replicas.
type fakeRoutes struct {
	mu       sync.Mutex
	routes   map[string]string
	replicas map[string][]string
}

func (f *fakeRoutes) NamespaceRoute(ns string) (*adminv1.NamespaceRoute, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, ok := f.routes[ns]
	if !ok {
		return nil, false
	}
	r := &adminv1.NamespaceRoute{Namespace: ns, MailboxId: id, Epoch: 7}
	for _, mid := range f.replicas[ns] {
		r.InSyncReplicas = append(r.InSyncReplicas, &adminv1.NamespaceRouteReplica{MailboxId: mid, Epoch: 8})
	}
	return r, true
}

func (f *fakeRoutes) set(ns, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routes[ns] = id
}

func testRoutes() *fakeRoutes {
	return &fakeRoutes{routes: map[string]string{
		"audit-logs": "audit-logs@proxy-02",
		"billing":    "billing@proxy-01",
		"corrupt":    "not an id",
		"orders":     "orders@proxy-01",
	}, replicas: map[string][]string{"orders": {"orders@proxy-03", "orders@proxy-02"}}}
}

func TestRouteLookup(t *testing.T) {
	t.Parallel()
	s := New(Config{Routes: testRoutes()})
	for _, tc := range []struct {
		name    string
		keys    map[string]string
		targets []string
		data    string
	}{
		{"routed namespace", map[string]string{NamespaceKey: "audit-logs"}, []string{"lookup/proxy/proxy-02"}, "audit-logs@proxy-02"},
		{"another", map[string]string{NamespaceKey: "billing", "other": "x"}, []string{"lookup/proxy/proxy-01"}, "billing@proxy-01"},
		{"unknown namespace", map[string]string{NamespaceKey: "nope"}, []string{"lookup/prism/admin"}, ""},
		{"no namespace key", map[string]string{"other": "audit-logs"}, []string{"lookup/prism/admin"}, ""},
		{"empty key map", nil, []string{"lookup/prism/admin"}, ""},
		{"route naming an invalid id", map[string]string{NamespaceKey: "corrupt"}, []string{"lookup/prism/admin"}, ""},
		// The serving mailbox, then the in-sync replicas in order: grpc-go
		// takes the first target whose connection has not failed.
		{"replicated", map[string]string{NamespaceKey: "orders"},
			[]string{"lookup/proxy/proxy-01", "lookup/proxy/proxy-03", "lookup/proxy/proxy-02"}, "orders@proxy-01"},
		// A retry's skip starts at the next copy, wrapping around.
		{"replicated, skip 1", map[string]string{NamespaceKey: "orders", SkipKey: "1"},
			[]string{"lookup/proxy/proxy-03", "lookup/proxy/proxy-02", "lookup/proxy/proxy-01"}, "orders@proxy-03"},
		{"replicated, skip 4", map[string]string{NamespaceKey: "orders", SkipKey: "4"},
			[]string{"lookup/proxy/proxy-03", "lookup/proxy/proxy-02", "lookup/proxy/proxy-01"}, "orders@proxy-03"},
		{"one copy, skip 1", map[string]string{NamespaceKey: "billing", SkipKey: "1"}, []string{"lookup/proxy/proxy-01"}, "billing@proxy-01"},
		{"skip not a number", map[string]string{NamespaceKey: "orders", SkipKey: "x"},
			[]string{"lookup/proxy/proxy-01", "lookup/proxy/proxy-03", "lookup/proxy/proxy-02"}, "orders@proxy-01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := s.RouteLookup(context.Background(), &lookupv1.RouteLookupRequest{
				TargetType: "grpc", Reason: lookupv1.RouteLookupRequest_REASON_MISS, KeyMap: tc.keys,
			})
			if err != nil {
				t.Fatalf("RouteLookup: %v", err)
			}
			want := &lookupv1.RouteLookupResponse{Targets: tc.targets, HeaderData: tc.data}
			if !proto.Equal(res, want) {
				t.Fatalf("RouteLookup(%v) = %v, want %v", tc.keys, res, want)
			}
		})
	}
}

// payload is jwt_authn's dynamic metadata for a token whose claim is v
// (absent when v is nil).
func payload(t *testing.T, v any) *corev3.Metadata {
	t.Helper()
	fields := map[string]any{"sub": "alice", "iss": "https://idp"}
	if v != nil {
		fields[mesh.DefaultNamespacesClaim] = v
	}
	st, err := structpb.NewStruct(fields)
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		jwtAuthnFilter: {Fields: map[string]*structpb.Value{jwtPayloadKey: structpb.NewStructValue(st)}},
	}}
}

func checkRequest(path string, headers map[string]string, md *corev3.Metadata) *authv3.CheckRequest {
	h := map[string]string{":path": path}
	for k, v := range headers {
		h[k] = v
	}
	if _, ok := h["content-type"]; !ok && !strings.HasPrefix(path, mailboxQueryPrefix) {
		h["content-type"] = "application/json"
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request:         &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Path: path, Headers: h, Method: "GET"}},
		MetadataContext: md,
	}}
}

const grpcStats = "/prism.mailbox.v1.MailboxQuery/GetStats"

// Without query auth, Check only routes aliases: it sets x-mailbox-id for a
// routed namespace the request is for, and lets everything else through
// untouched.
func TestCheckRoutesAliases(t *testing.T) {
	t.Parallel()
	s := New(Config{Routes: testRoutes()})
	grpcH := func(kv ...string) map[string]string {
		h := map[string]string{"content-type": "application/grpc"}
		for i := 0; i < len(kv); i += 2 {
			h[kv[i]] = kv[i+1]
		}
		return h
	}
	for _, tc := range []struct {
		name    string
		path    string
		headers map[string]string
		set     string // x-mailbox-id set, "" for none
	}{
		{"namespace path", "/v1/namespaces/audit-logs/events", nil, "audit-logs@proxy-02"},
		{"namespace path percent-encoded", "/v1/namespaces/audit%2Dlogs/events/m-1", nil, "audit-logs@proxy-02"},
		{"namespace path with query", "/v1/namespaces/billing?limit=3", nil, "billing@proxy-01"},
		{"namespace path stats", "/v1/namespaces/billing/stats", nil, "billing@proxy-01"},
		{"namespace path overrides a sent id", "/v1/namespaces/billing/events", map[string]string{mesh.HeaderMailboxID: "x@proxy-09"}, "billing@proxy-01"},
		{"unrouted namespace path", "/v1/namespaces/nope/events", nil, ""},
		{"empty namespace segment", "/v1/namespaces//events", nil, ""},
		{"bad escape", "/v1/namespaces/audit%zz/events", nil, ""},
		{"mailbox path", "/v1/mailboxes/audit-logs@proxy-01/events", nil, ""},
		{"http namespace header names no alias", "/v1/mailboxes/billing@proxy-01/events", map[string]string{mesh.HeaderNamespace: "audit-logs"}, ""},
		{"grpc namespace header", grpcStats, grpcH(mesh.HeaderNamespace, "audit-logs"), "audit-logs@proxy-02"},
		{"grpc namespace header unrouted", grpcStats, grpcH(mesh.HeaderNamespace, "nope"), ""},
		{"grpc mailbox header wins", grpcStats, grpcH(mesh.HeaderNamespace, "audit-logs", mesh.HeaderMailboxID, "audit-logs@proxy-01"), ""},
		{"other path", "/healthz", nil, ""},
		{"no http attributes", "", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := s.Check(context.Background(), checkRequest(tc.path, tc.headers, nil))
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if res.GetStatus().GetCode() != int32(codes.OK) || res.GetOkResponse() == nil {
				t.Fatalf("Check(%s) = %v, want OK", tc.path, res)
			}
			var want []*corev3.HeaderValueOption
			if tc.set != "" {
				want = []*corev3.HeaderValueOption{{
					Header:       &corev3.HeaderValue{Key: mesh.HeaderMailboxID, Value: tc.set},
					AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
				}}
			}
			if got := res.GetOkResponse(); !proto.Equal(got, &authv3.OkHttpResponse{Headers: want}) {
				t.Fatalf("Check(%s) ok response %v, want headers %v", tc.path, got, want)
			}
		})
	}
}

// Under query auth every mailbox and namespace a request names must be one
// the verified token may read, and a refusal reads exactly as prism
// gateway's (gateway/auth) would.
func TestCheckQueryAuth(t *testing.T) {
	t.Parallel()
	s := New(Config{Routes: testRoutes(), NamespacesClaim: mesh.DefaultNamespacesClaim})
	grpcH := func(k, v string) map[string]string {
		return map[string]string{"content-type": "application/grpc", k: v}
	}
	for _, tc := range []struct {
		name    string
		path    string
		headers map[string]string
		claim   any // nil: no claim in the payload
		noToken bool
		// refusedNS or refusedID is the namespace or mailbox refused (403);
		// a 401 sets code instead; none of them: let through.
		refusedNS, refusedID string
		code                 string
		set                  string
	}{
		{name: "no verified token", path: "/v1/namespaces/billing/events", noToken: true, code: "missing_token"},
		{name: "no verified token, grpc", path: grpcStats, headers: grpcH(mesh.HeaderMailboxID, "billing@proxy-01"), noToken: true, code: "missing_token"},
		{name: "malformed claim", path: "/v1/namespaces/billing/events", claim: 42.0, code: "invalid_token"},
		{name: "claim lists the namespace", path: "/v1/namespaces/billing/events", claim: []any{"billing"}, set: "billing@proxy-01"},
		{name: "claim is the namespace", path: "/v1/namespaces/billing/events", claim: "billing", set: "billing@proxy-01"},
		{name: "claim is all", path: "/v1/namespaces/audit-logs/events", claim: []any{"x", "*"}, set: "audit-logs@proxy-02"},
		{name: "claim without the namespace", path: "/v1/namespaces/audit-logs/events", claim: []any{"billing"}, refusedNS: "audit-logs"},
		{name: "no claim", path: "/v1/namespaces/audit-logs/events", refusedNS: "audit-logs"},
		{name: "unrouted namespace still checked", path: "/v1/namespaces/nope/events", claim: []any{"billing"}, refusedNS: "nope"},
		{name: "mailbox path allowed", path: "/v1/mailboxes/billing@proxy-07/events", claim: []any{"billing"}},
		{name: "mailbox path percent-encoded", path: "/v1/mailboxes/audit-logs%40proxy-01/events", claim: []any{"billing"}, refusedID: "audit-logs@proxy-01"},
		{name: "mailbox path naming no namespace", path: "/v1/mailboxes/garbage/events", claim: []any{"billing"}, refusedID: "garbage"},
		{name: "mailbox path naming no namespace, all", path: "/v1/mailboxes/garbage/events", claim: "*"},
		{name: "http header names another namespace", path: "/v1/mailboxes/billing@proxy-01/events", headers: map[string]string{mesh.HeaderNamespace: "audit-logs"}, claim: []any{"billing"}, refusedNS: "audit-logs"},
		{name: "http header names another mailbox", path: "/v1/namespaces/billing/events", headers: map[string]string{mesh.HeaderMailboxID: "audit-logs@proxy-02"}, claim: []any{"billing"}, refusedID: "audit-logs@proxy-02"},
		{name: "grpc mailbox header", path: grpcStats, headers: grpcH(mesh.HeaderMailboxID, "billing@proxy-01"), claim: []any{"billing"}},
		{name: "grpc mailbox header refused", path: grpcStats, headers: grpcH(mesh.HeaderMailboxID, "audit-logs@proxy-01"), claim: []any{"billing"}, refusedID: "audit-logs@proxy-01"},
		{name: "grpc namespace header", path: grpcStats, headers: grpcH(mesh.HeaderNamespace, "billing"), claim: []any{"billing"}, set: "billing@proxy-01"},
		{name: "grpc namespace header refused", path: grpcStats, headers: grpcH(mesh.HeaderNamespace, "audit-logs"), claim: []any{"billing"}, refusedNS: "audit-logs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var md *corev3.Metadata
			if !tc.noToken {
				md = payload(t, tc.claim)
			}
			req := checkRequest(tc.path, tc.headers, md)
			res, err := s.Check(context.Background(), req)
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if tc.refusedNS == "" && tc.refusedID == "" && tc.code == "" {
				if res.GetStatus().GetCode() != int32(codes.OK) {
					t.Fatalf("Check refused: %v", res)
				}
				if got := res.GetOkResponse().GetHeaders(); tc.set != "" && (len(got) != 1 || got[0].GetHeader().GetValue() != tc.set) || tc.set == "" && len(got) != 0 {
					t.Fatalf("headers set %v, want x-mailbox-id %q", got, tc.set)
				}
				return
			}
			// What prism gateway answers for the same refusal.
			var want *mesh.AuthError
			switch tc.code {
			case "missing_token":
				want = &mesh.AuthError{Kind: mesh.MissingToken, Msg: "no verified bearer token: send Authorization: Bearer <JWT>"}
			case "invalid_token":
				_, err := mesh.Claimed("alice", mesh.DefaultNamespacesClaim, json.RawMessage(`42`))
				want = authError(t, err)
			default:
				raw, _ := json.Marshal(tc.claim)
				if tc.claim == nil {
					raw = nil
				}
				p, err := mesh.Claimed("alice", mesh.DefaultNamespacesClaim, raw)
				if err != nil {
					t.Fatal(err)
				}
				if tc.refusedID != "" {
					want = authError(t, p.MayReadMailbox(tc.refusedID))
				} else {
					want = authError(t, p.MayReadNamespace(tc.refusedNS))
				}
			}
			d := res.GetDeniedResponse()
			if d == nil || res.GetStatus().GetCode() != int32(want.GRPCStatus().Code()) {
				t.Fatalf("Check = %v, want a refusal %v", res, want)
			}
			rec := httptest.NewRecorder()
			want.Write(rec)
			if got := int(d.GetStatus().GetCode()); got != rec.Code {
				t.Fatalf("status %d, want %d", got, rec.Code)
			}
			headers := map[string]string{}
			for _, h := range d.GetHeaders() {
				if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
					t.Fatalf("header %s appended, not set", h.GetHeader().GetKey())
				}
				headers[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
			}
			if headers["www-authenticate"] != rec.Header().Get("WWW-Authenticate") {
				t.Fatalf("challenge %q, want %q", headers["www-authenticate"], rec.Header().Get("WWW-Authenticate"))
			}
			if req.GetAttributes().GetRequest().GetHttp().GetHeaders()["content-type"] == "application/grpc" {
				if d.GetBody() != want.Msg || headers["content-type"] != "" {
					t.Fatalf("grpc refusal body %q content-type %q, want the message %q alone", d.GetBody(), headers["content-type"], want.Msg)
				}
				return
			}
			if d.GetBody() != rec.Body.String() || headers["content-type"] != "application/json" {
				t.Fatalf("body %q (content-type %q), want prism gateway's %q", d.GetBody(), headers["content-type"], rec.Body.String())
			}
		})
	}
}

// authError is err as a query refusal (mesh.AuthError).
func authError(t *testing.T, err error) *mesh.AuthError {
	t.Helper()
	var ae *mesh.AuthError
	if !errors.As(err, &ae) {
		t.Fatalf("%v is not a query refusal", err)
	}
	return ae
}
