package translator

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/prism-mesh/prism/xds/ir"
)

// TestQueryAuthLeavesGRPCGoAlone: every golden input with query auth gives
// grpc-go (Listeners, Routes, Clusters, Endpoints) exactly what the same
// input without it gives, and Envoy its own variant; prism gateway checks
// tokens in Go.
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
			if without.EnvoyListeners != nil || without.EnvoyRoutes != nil {
				t.Fatal("Envoy variants without query auth")
			}
			grpcGo := func(r *Resources) *Resources {
				return &Resources{Listeners: r.Listeners, Routes: r.Routes, Clusters: r.Clusters, Endpoints: r.Endpoints}
			}
			if !sameResources(grpcGo(with), grpcGo(without)) {
				t.Error("grpc-go's resources change with query auth")
			}
			if with.EnvoyListeners == nil || with.EnvoyRoutes == nil {
				t.Error("no Envoy variant under query auth")
			}
		})
	}
}

// TestTranslatorQueryAuthToggles: one Translator switched between no query
// auth, one claim and another gives what fresh translations give, so
// remembered routes never keep checking an old claim (or none).
func TestTranslatorQueryAuthToggles(t *testing.T) {
	t.Parallel()
	x := readIR(t, "testdata/auth-file.in.yaml")
	auth := x.Gateway.QueryAuth
	other := auth
	other.NamespacesClaim = "scopes"
	tr := New()
	for _, q := range []ir.QueryAuth{{}, auth, other, auth, {}} {
		x.Gateway.QueryAuth = q
		got, gotErr := tr.Translate(x)
		want, wantErr := Translate(x)
		if gotErr != nil || wantErr != nil {
			t.Fatalf("errors: %v, %v", gotErr, wantErr)
		}
		if !sameResources(got, want) {
			t.Fatalf("claim %q: reused translator differs from a fresh one", q.NamespacesClaim)
		}
	}
}
