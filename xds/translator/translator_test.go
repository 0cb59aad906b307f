package translator

import (
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	"github.com/prism-mesh/prism/xds/ir"
)

var update = flag.Bool("update", false, "rewrite the golden outputs in testdata")

// TestTranslateGolden translates every testdata/*.in.yaml and compares each
// resource type with its golden file; a new case is a new input file.
func TestTranslateGolden(t *testing.T) {
	t.Parallel()
	inputs, err := filepath.Glob("testdata/*.in.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs: %v", err)
	}
	for _, in := range inputs {
		name := strings.TrimSuffix(in, ".in.yaml")
		t.Run(filepath.Base(name), func(t *testing.T) {
			t.Parallel()
			x := readIR(t, in)
			res, terr := Translate(x)
			if res == nil {
				t.Fatalf("Translate returned no resources: %v", terr)
			}
			golden(t, name+".errors.txt", errorText(terr))
			golden(t, name+".listeners.yaml", toYAML(t, res.Listeners))
			golden(t, name+".routes.yaml", toYAML(t, res.Routes))
			golden(t, name+".clusters.yaml", toYAML(t, res.Clusters))
			golden(t, name+".endpoints.yaml", toYAML(t, res.Endpoints))
			golden(t, name+".envoy-clusters.yaml", variantYAML(t, res.EnvoyClusters))

			golden(t, name+".served.yaml", served(t, res))

			for _, byType := range []map[resource.Type][]types.Resource{res.ForGRPC(), res.ForEnvoy()} {
				if err := consistent(byType); err != nil {
					t.Errorf("resources not consistent: %v", err)
				}
			}
			again, _ := Translate(x)
			if !sameResources(res, again) {
				t.Error("two translations of the same IR differ")
			}
		})
	}
}

func readIR(t *testing.T, path string) *ir.IR {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var x ir.IR
	if err := yaml.UnmarshalStrict(b, &x); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return &x
}

// variantYAML is an Envoy variant's golden text, none when Envoy takes the
// shared resources.
func variantYAML[M proto.Message](t *testing.T, msgs []M) []byte {
	if msgs == nil {
		return nil
	}
	return toYAML(t, msgs)
}

// served names, by data plane and type, what each kind of client is sent:
// the golden that shows a listener or table going to the wrong one.
func served(t *testing.T, res *Resources) []byte {
	t.Helper()
	kinds := map[string]map[resource.Type][]types.Resource{"envoy": res.ForEnvoy(), "grpc-go": res.ForGRPC()}
	short := map[resource.Type]string{
		resource.ListenerType: "listeners", resource.RouteType: "routes",
		resource.ClusterType: "clusters", resource.EndpointType: "endpoints",
	}
	out := map[string]map[string][]string{}
	for kind, byType := range kinds {
		out[kind] = map[string][]string{}
		for typ, name := range short {
			names := []string{}
			for _, r := range byType[typ] {
				names = append(names, cachev3.GetResourceName(r))
			}
			out[kind][name] = names
		}
	}
	y, err := yaml.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return y
}

func errorText(err error) []byte {
	if err == nil {
		return nil
	}
	return []byte(err.Error() + "\n")
}

func toYAML[M proto.Message](t *testing.T, msgs []M) []byte {
	t.Helper()
	list := make([]json.RawMessage, 0, len(msgs))
	for _, m := range msgs {
		b, err := protojson.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, b)
	}
	j, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.JSONToYAML(j)
	if err != nil {
		t.Fatal(err)
	}
	return y
}

// golden compares got with the file; an empty got means the file must not
// exist (used for the errors of a valid IR).
func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if len(got) == 0 {
			if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			return
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if os.IsNotExist(err) && len(got) == 0 {
		return
	}
	if err != nil {
		t.Fatalf("%v (run go test ./xds/translator -update)", err)
	}
	if string(want) != string(got) {
		t.Errorf("%s differs (run go test ./xds/translator -update and review the diff):\n--- got\n%s", path, got)
	}
}

func sameResources(a, b *Resources) bool {
	eq := func(x, y []proto.Message) bool {
		if len(x) != len(y) {
			return false
		}
		for i := range x {
			if !proto.Equal(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	return eq(msgs(a.Listeners), msgs(b.Listeners)) && eq(msgs(a.Routes), msgs(b.Routes)) &&
		eq(msgs(a.Clusters), msgs(b.Clusters)) && eq(msgs(a.Endpoints), msgs(b.Endpoints)) &&
		(a.EnvoyClusters == nil) == (b.EnvoyClusters == nil) && eq(msgs(a.EnvoyClusters), msgs(b.EnvoyClusters))
}

func msgs[M proto.Message](in []M) []proto.Message {
	out := make([]proto.Message, len(in))
	for i, m := range in {
		out[i] = m
	}
	return out
}

// consistent checks what a client needs of one variant: every route table a
// listener names (the API listener's too, which go-control-plane's
// Snapshot.Consistent does not count) is there and none other, and every
// EDS cluster has its endpoints and no endpoints lack a cluster.
func consistent(byType map[resource.Type][]types.Resource) error {
	names := func(typ resource.Type) map[string]bool {
		out := map[string]bool{}
		for _, r := range byType[typ] {
			out[cachev3.GetResourceName(r)] = true
		}
		return out
	}
	wantRoutes := map[string]bool{}
	for _, r := range byType[resource.ListenerType] {
		l := r.(*listenerv3.Listener)
		configs := []*anypb.Any{l.GetApiListener().GetApiListener()}
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				configs = append(configs, f.GetTypedConfig())
			}
		}
		for _, a := range configs {
			if a == nil {
				continue
			}
			hcm := &hcmv3.HttpConnectionManager{}
			if err := a.UnmarshalTo(hcm); err != nil {
				return err
			}
			wantRoutes[hcm.GetRds().GetRouteConfigName()] = true
		}
	}
	if got := names(resource.RouteType); !maps.Equal(got, wantRoutes) {
		return fmt.Errorf("route tables %v, listeners name %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(wantRoutes)))
	}
	wantEDS := map[string]bool{}
	for _, r := range byType[resource.ClusterType] {
		if c := r.(*clusterv3.Cluster); c.GetType() == clusterv3.Cluster_EDS {
			wantEDS[c.GetName()] = true
		}
	}
	if got := names(resource.EndpointType); !maps.Equal(got, wantEDS) {
		return fmt.Errorf("endpoints %v, EDS clusters %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(wantEDS)))
	}
	return nil
}
