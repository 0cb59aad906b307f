package lookup

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/codes"

	"github.com/prism-mesh/prism/mesh"
)

// Whatever the path and headers, parsing names what the path's segment
// decodes to (so encoding it again names the same), and Check answers
// without failing: let through (setting at most x-mailbox-id, to the
// mailbox of the alias the request is for) or refused 401/403.
func FuzzCheck(f *testing.F) {
	for _, seed := range []struct{ path, mailbox, namespace string }{
		{"/v1/namespaces/audit-logs/events", "", ""},
		{"/v1/namespaces/audit%2Dlogs/events?limit=1", "x@p", ""},
		{"/v1/mailboxes/billing%40proxy-01/events/m-1", "", "audit-logs"},
		{"/v1/mailboxes/%zz", "", ""},
		{grpcStats, "", "billing"},
		{grpcStats, "billing@proxy-01", "audit-logs"},
		{"/v1/namespaces/%2F%2e%2e/x#frag", "", ""},
		{"", "", ""},
	} {
		f.Add(seed.path, seed.mailbox, seed.namespace, "billing")
	}
	routes := testRoutes()
	open := New(Config{Routes: routes})
	guarded := New(Config{Routes: routes, NamespacesClaim: mesh.DefaultNamespacesClaim})
	f.Fuzz(func(t *testing.T, path, mailbox, namespace, claim string) {
		if !utf8.ValidString(claim) {
			return // a JSON payload's strings are UTF-8
		}
		headers := map[string]string{mesh.HeaderMailboxID: mailbox, mesh.HeaderNamespace: namespace}
		for k, v := range headers {
			if v == "" {
				delete(headers, k)
			}
		}
		r := parseRequest(path, headers)
		for prefix, got := range map[string]string{mailboxesPrefix: r.pathMailbox, namespacesPrefix: r.pathNamespace} {
			if got == "" || strings.Contains(got, "%") {
				continue
			}
			again := parseRequest(prefix+url.PathEscape(got)+"/events", nil)
			if again.pathMailbox+again.pathNamespace != got {
				t.Fatalf("%q names %q; encoded again it names %q", path, got, again.pathMailbox+again.pathNamespace)
			}
		}
		for _, s := range []*Server{open, guarded} {
			res, err := s.Check(context.Background(), checkRequest(path, headers, payload(t, []any{claim})))
			if err != nil {
				t.Fatalf("Check(%q): %v", path, err)
			}
			if d := res.GetDeniedResponse(); d != nil {
				if s == open {
					t.Fatalf("Check(%q) without query auth refused: %v", path, res)
				}
				if c := d.GetStatus().GetCode(); c != 401 && c != 403 {
					t.Fatalf("Check(%q) refused with %d", path, c)
				}
				continue
			}
			if res.GetStatus().GetCode() != int32(codes.OK) {
				t.Fatalf("Check(%q) = %v", path, res)
			}
			set := res.GetOkResponse().GetHeaders()
			if len(set) == 0 {
				continue
			}
			id, err := mesh.ParseMailboxID(set[0].GetHeader().GetValue())
			if len(set) != 1 || set[0].GetHeader().GetKey() != mesh.HeaderMailboxID || err != nil || id.Namespace != r.alias() {
				t.Fatalf("Check(%q) set %v; the request's alias is %q", path, set, r.alias())
			}
		}
	})
}
