package lookup

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	statuspb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

const (
	// AuthorizationMethod is Envoy's ext_authz call, as a full gRPC method
	// name.
	AuthorizationMethod = "/envoy.service.auth.v3.Authorization/Check"
	// jwtAuthnFilter and jwtPayloadKey are where Envoy's jwt_authn leaves
	// the verified token's payload (the translator configures both).
	jwtAuthnFilter = "envoy.filters.http.jwt_authn"
	jwtPayloadKey  = "jwt_payload"

	mailboxesPrefix  = "/v1/mailboxes/"
	namespacesPrefix = "/v1/namespaces/"
)

// mailboxQueryPrefix is the path prefix of every MailboxQuery gRPC call.
var mailboxQueryPrefix = "/" + mailboxv1.MailboxQuery_ServiceDesc.ServiceName + "/"

// request is what one request names: the mailbox or namespace its path
// names (percent-decoded), and its x-mailbox-id and x-prism-namespace
// headers. Empty fields name nothing. mailboxQuery is a MailboxQuery call
// (by its path), grpc one Envoy answers as gRPC (by its content-type).
type request struct {
	pathMailbox, pathNamespace     string
	headerMailbox, headerNamespace string
	mailboxQuery, grpc             bool
}

// parseRequest reads path (as Envoy's :path, query string included) and
// headers (lower-case names, as ext_authz sends them).
func parseRequest(path string, headers map[string]string) request {
	r := request{
		headerMailbox:   headers[mesh.HeaderMailboxID],
		headerNamespace: headers[mesh.HeaderNamespace],
		mailboxQuery:    strings.HasPrefix(path, mailboxQueryPrefix),
		grpc:            strings.HasPrefix(headers["content-type"], "application/grpc"),
	}
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	if rest, ok := strings.CutPrefix(path, mailboxesPrefix); ok {
		r.pathMailbox = firstSegment(rest)
	} else if rest, ok := strings.CutPrefix(path, namespacesPrefix); ok {
		r.pathNamespace = firstSegment(rest)
	}
	return r
}

// firstSegment is the first path segment of rest, percent-decoded as the
// runner's HTTP API decodes it. An undecodable one is kept as sent: it
// names no valid mailbox or namespace, so it is routed nowhere and read by
// a token only if that token reads everything.
func firstSegment(rest string) string {
	seg, _, _ := strings.Cut(rest, "/")
	if dec, err := url.PathUnescape(seg); err == nil {
		return dec
	}
	return seg
}

// alias is the namespace whose current mailbox the request is for: the one
// its /v1/namespaces/ path names, or for a MailboxQuery call without
// x-mailbox-id its x-prism-namespace. An HTTP request's header names no
// alias, since the runner serves the mailbox its path names.
func (r request) alias() string {
	switch {
	case r.pathNamespace != "":
		return r.pathNamespace
	case r.mailboxQuery && r.headerMailbox == "":
		return r.headerNamespace
	default:
		return ""
	}
}

// mayRead refuses the first mailbox or namespace the request names that p
// may not read.
func (r request) mayRead(p mesh.Principal) error {
	for _, id := range []string{r.pathMailbox, r.headerMailbox} {
		if id != "" {
			if err := p.MayReadMailbox(id); err != nil {
				return err
			}
		}
	}
	for _, ns := range []string{r.pathNamespace, r.headerNamespace} {
		if ns != "" {
			if err := p.MayReadNamespace(ns); err != nil {
				return err
			}
		}
	}
	return nil
}

// Check is Envoy's ext_authz. Under query auth it refuses a request naming
// a namespace the verified token may not read, as prism gateway would (401
// without a verified token, 403 otherwise). A request for a routed alias is
// let through with x-mailbox-id set to the namespace's mailbox, so Envoy's
// per-proxy route takes it once the route cache is cleared; anything else
// is let through unchanged, to its own route. It never fails: Envoy would
// answer the request 503 (status_on_error).
func (s *Server) Check(_ context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	h := req.GetAttributes().GetRequest().GetHttp()
	r := parseRequest(h.GetPath(), h.GetHeaders())
	if s.claim != "" {
		p, err := s.principal(req.GetAttributes().GetMetadataContext())
		if err == nil {
			err = r.mayRead(p)
		}
		if err != nil {
			return denied(err, r.grpc), nil
		}
	}
	ok := &authv3.OkHttpResponse{}
	if ids := s.route(r.alias()); len(ids) > 0 {
		ok.Headers = []*corev3.HeaderValueOption{{
			Header:       &corev3.HeaderValue{Key: mesh.HeaderMailboxID, Value: ids[0].String()},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		}}
	}
	return &authv3.CheckResponse{
		Status:       &statuspb.Status{Code: int32(codes.OK)},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: ok},
	}, nil
}

// principal reads the token jwt_authn verified out of the request's
// metadata, by the query-token rules prism gateway shares (mesh.Claimed).
func (s *Server) principal(md *corev3.Metadata) (mesh.Principal, error) {
	payload := md.GetFilterMetadata()[jwtAuthnFilter].GetFields()[jwtPayloadKey].GetStructValue()
	if payload == nil {
		return mesh.Principal{}, &mesh.AuthError{Kind: mesh.MissingToken, Msg: "no verified bearer token: send Authorization: Bearer <JWT>"}
	}
	return mesh.Claimed(payload.GetFields()["sub"].GetStringValue(), s.claim, rawClaim(payload.GetFields()[s.claim]))
}

// rawClaim is a claim as the JSON it was in the token; nil if absent.
func rawClaim(v *structpb.Value) json.RawMessage {
	if v == nil {
		return nil
	}
	b, err := protojson.Marshal(v)
	if err != nil {
		// Only a Value without a kind fails, which no JSON payload holds.
		return nil
	}
	return b
}

// denied is a refusal as Envoy answers it: the refusal's status and
// challenge, with its JSON body for HTTP, or for a gRPC call the message
// alone, which Envoy puts in grpc-message (it maps the status to
// PERMISSION_DENIED or UNAUTHENTICATED).
func denied(err error, grpcCall bool) *authv3.CheckResponse {
	var ae *mesh.AuthError
	if !errors.As(err, &ae) {
		ae = &mesh.AuthError{Kind: mesh.Forbidden, Msg: err.Error()}
	}
	var headers []*corev3.HeaderValueOption
	set := func(k, v string) {
		headers = append(headers, &corev3.HeaderValueOption{
			Header:       &corev3.HeaderValue{Key: k, Value: v},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
		})
	}
	if c := ae.Challenge(); c != "" {
		set("www-authenticate", c)
	}
	body := ae.Msg
	if !grpcCall {
		set("content-type", "application/json")
		body = string(ae.Body())
	}
	return &authv3.CheckResponse{
		Status: &statuspb.Status{Code: int32(ae.GRPCStatus().Code()), Message: ae.Msg},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(ae.HTTPStatus())},
			Headers: headers,
			Body:    body,
		}},
	}
}
