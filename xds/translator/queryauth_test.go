package translator

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/xds/ir"
)

// TestQueryAuthLeavesGRPCGoAlone: every golden input with query auth gives
// grpc-go (its API listener, its table, clusters and endpoints) exactly what
// the same input without it gives; prism gateway checks tokens in Go.
func TestQueryAuthLeavesGRPCGoAlone(t *testing.T) {
	t.Parallel()
	inputs, err := filepath.Glob("testdata/auth-*.in.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no query auth inputs: %v", err)
	}
	for _, in := range inputs {
		t.Run(strings.TrimSuffix(filepath.Base(in), ".in.yaml"), func(t *testing.T) {
			t.Parallel()
			x := readIR(t, in)
			if !x.Gateway.QueryAuth.Enabled() {
				t.Fatal("input has no query auth")
			}
			with, _ := Translate(x)
			x.Gateway.QueryAuth = ir.QueryAuth{}
			without, err := Translate(x)
			if err != nil {
				t.Fatal(err)
			}
			grpcGo := func(r *Resources) *Resources {
				out := &Resources{Clusters: r.Clusters, Endpoints: r.Endpoints}
				for _, l := range r.Listeners {
					if l.GetName() == mesh.QueryListenerName {
						out.Listeners = append(out.Listeners, l)
					}
				}
				for _, rc := range r.Routes {
					if rc.GetName() == RouteConfigName {
						out.Routes = append(out.Routes, rc)
					}
				}
				return out
			}
			if g := grpcGo(with); len(g.Listeners) != 1 || len(g.Routes) != 1 || !sameResources(g, grpcGo(without)) {
				t.Error("grpc-go's resources change with query auth")
			}
		})
	}
}

// Every local-reply mapper rewrites only jwt_authn's refusals: ext_authz's
// own 401 and 403 already carry gateway/auth's body and challenge, and a
// mapper matching them would wrap that JSON again (or turn a 403
// insufficient_scope into 401). A metadata filter left at its default
// matches when the key is absent, so each must say false.
func TestLocalRepliesTouchOnlyJWTFailures(t *testing.T) {
	t.Parallel()
	for i, m := range localReplies().GetMappers() {
		var ok bool
		for _, f := range m.GetFilter().GetAndFilter().GetFilters() {
			if mf := f.GetMetadataFilter(); mf != nil && mf.GetMatcher().GetFilter() == jwtAuthnFilter {
				ok = mf.GetMatchIfKeyNotFound() != nil && !mf.GetMatchIfKeyNotFound().GetValue()
			}
		}
		if !ok {
			t.Errorf("local reply mapper %d does not require jwt_authn's failure (with matchIfKeyNotFound false): %v", i, m.GetFilter())
		}
	}
}
