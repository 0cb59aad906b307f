package runner

import (
	"net/http"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	"github.com/prism-mesh/prism/mesh/identity"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// queryRoles are the identities that may query mailboxes on a TLS query
// port: the gateway routing clients' queries, and operators and readers
// reaching a runner directly.
var queryRoles = []identity.Role{identity.Gateway, identity.Operator, identity.Reader}

// queryPolicy is who may call what on the query port's gRPC: MailboxQuery
// for queryRoles, health for any identity of the trust domain (Envoy's
// health checks, a kubelet gRPC probe through a client certificate).
func queryPolicy() identity.Policy {
	queries := identity.AnyOf(queryRoles...)
	anyone := func(identity.Identity, any) error { return nil }
	return identity.Policy{
		mailboxv1.MailboxQuery_QueryEvents_FullMethodName: queries,
		mailboxv1.MailboxQuery_GetEvent_FullMethodName:    queries,
		mailboxv1.MailboxQuery_GetStats_FullMethodName:    queries,
		// Any proxy's runner may ask; the server lets through only those
		// the mailbox's placement allows (RecoveryAllowed).
		runnerv1.MailboxRecovery_FetchMailbox_FullMethodName: identity.AnyOf(identity.Proxy),
		healthpb.Health_Check_FullMethodName:                 anyone,
		healthpb.Health_List_FullMethodName:                  anyone,
		healthpb.Health_Watch_FullMethodName:                 anyone,
	}
}

// authorizeHTTP lets through requests whose client certificate names one of
// queryRoles, and answers the others as the query API answers every refusal:
// 401 without a certificate, 403 naming the caller and the allowed roles.
func authorizeHTTP(h http.Handler) http.Handler {
	allowed := identity.AnyOf(queryRoles...)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		caller, err := identity.FromRequest(req)
		if err != nil {
			httpapi.WriteError(w, http.StatusUnauthorized, "a client certificate is required: "+err.Error())
			return
		}
		if err := allowed(caller, nil); err != nil {
			httpapi.WriteError(w, http.StatusForbidden, grpcstatus.Convert(err).Message())
			return
		}
		h.ServeHTTP(w, req.WithContext(identity.WithCaller(req.Context(), caller)))
	})
}
