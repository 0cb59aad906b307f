package helm

import (
	"testing"

	"helm.sh/helm/v3/pkg/engine"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/prism-mesh/prism/helm/chartrender"
)

// secretsProvider answers the chart's lookup calls from a fake cluster
// holding only Secrets, as the API server would during `helm upgrade`.
type secretsProvider struct {
	client *dynamicfake.FakeDynamicClient
}

func (p secretsProvider) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	return p.client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}), true, nil
}

// TestGeneratedTLSKeptAcrossUpgrades: an upgrade must not replace the
// injector's CA, or the webhook's caBundle and the running injector's
// certificate would disagree until every injector pod restarts.
func TestGeneratedTLSKeptAcrossUpgrades(t *testing.T) {
	t.Parallel()
	first := render(t, valueSets["defaults"])
	installed := chartrender.MustGet(t, first.Secrets, injectorName+"-tls")
	caFirst := string(firstCABundle(first))

	// Without a cluster every render generates a new CA; this is what lookup
	// must prevent.
	if caFresh := string(firstCABundle(render(t, valueSets["defaults"]))); caFresh == caFirst {
		t.Fatal("two installs generated the same CA")
	}

	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cluster := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{{Version: "v1", Resource: "secrets"}: "SecretList"}, installed)
	ch := loadChart(t)
	vals := renderValues(t, ch, valueSets["defaults"])
	files, err := engine.RenderWithClientProvider(ch, vals, secretsProvider{client: cluster})
	if err != nil {
		t.Fatalf("upgrade render: %v", err)
	}
	upgraded := decodeAll(t, files)
	kept := chartrender.MustGet(t, upgraded.Secrets, injectorName+"-tls")
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if string(kept.Data[k]) != string(installed.Data[k]) {
			t.Errorf("upgrade replaced %s", k)
		}
	}
	if string(firstCABundle(upgraded)) != caFirst {
		t.Error("upgrade changed the webhook caBundle")
	}
	verifyServingCert(t, kept, firstCABundle(upgraded), injectorName+"."+namespace+".svc")
}

func firstCABundle(r *rendered) []byte {
	for _, cfg := range r.Webhooks {
		return cfg.Webhooks[0].ClientConfig.CABundle
	}
	return nil
}
