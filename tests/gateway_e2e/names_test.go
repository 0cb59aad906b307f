package gatewaye2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// nameChars are the characters mesh.NamespaceRule allows after the first.
const nameChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._~-"

// namespaceCandidates are strings to offer the FSM as namespace names: the
// rule's edges (the longest name, a leading '$', every punctuation mark) and
// random names of random lengths from the allowed characters, each mutated
// now and then with a character the rule refuses.
func namespaceCandidates(r *rand.Rand, n int) []string {
	first := func() byte {
		for {
			if c := nameChars[r.IntN(len(nameChars))]; c != '.' && c != '_' && c != '~' && c != '-' {
				return c
			}
		}
	}
	random := func(length int) string {
		b := []byte{first()}
		for len(b) < length {
			b = append(b, nameChars[r.IntN(len(nameChars))])
		}
		return string(b)
	}
	out := []string{random(mesh.MaxIDLen), "$" + random(8), "a.b_c~d-e", "0", "Z-~"}
	for len(out) < n {
		s := random(1 + r.IntN(40))
		if r.IntN(3) == 0 {
			bad := []string{"☃", "@", "/", "%00", " ", "\x00", "?", "#", "$"}[r.IntN(9)]
			at := r.IntN(len(s) + 1)
			s = s[:at] + bad + s[at:]
		}
		out = append(out, s)
	}
	return append(out, "", ".a", "-a", "uni☃", strings.Repeat("a", mesh.MaxIDLen+1))
}

// TestAnyAcceptedNamespaceIsServed: every string the
// FSM accepts as a namespace is routable and servable end to end (leased by
// the sidecar, stored by the runner, answered through prism gateway by its
// mailbox id and by the namespace's path), every string it refuses is
// refused with InvalidArgument naming the namespace, and a caller's name
// with a leading '$' with PermissionDenied, each changing nothing.
func TestAnyAcceptedNamespaceIsServed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an admin node, a runner, a sidecar and a gateway")
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("candidate seed %d", seed)
	candidates := namespaceCandidates(rand.New(rand.NewPCG(seed, 12)), 16)
	topics := make([]string, len(candidates))
	for i := range candidates {
		topics[i] = fmt.Sprintf("names-%d.events", i)
	}
	kafka := kafkatest.Start(t, kafkatest.Topics(1, topics...))
	cluster := e2e.StartAdmins(t, e2e.AdminOptions{Size: 1})
	admin := cluster.Nodes[0]

	const events = 3
	var accepted []string
	for i, ns := range candidates {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := admin.Control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{
			Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{topics[i]}, Lease: lease.Config()},
		})
		cancel()
		switch {
		case err == nil:
			if !mesh.ValidNamespace(ns) {
				t.Errorf("the FSM accepted %q, which mesh.NamespaceRule refuses", ns)
			}
			accepted = append(accepted, ns)
			kafka.ProduceEnvelopes(t, topics[i], kafkatest.Envelopes(topics[i], events)...)
		case strings.HasPrefix(ns, "$"):
			// A leading '$' is the admin's own (docs/architecture.md, "The
			// admin audit trail"): no caller may create one, valid or not.
			if status.Code(err) != codes.PermissionDenied {
				t.Errorf("create namespace %q: %v, want PermissionDenied for a name the admin reserves", ns, err)
			}
		case status.Code(err) == codes.InvalidArgument:
			if mesh.ValidNamespace(ns) {
				t.Errorf("the FSM refused %q, which mesh.NamespaceRule allows: %v", ns, err)
			}
			if !strings.Contains(err.Error(), "namespace") {
				t.Errorf("refusal of %q does not name the namespace: %v", ns, err)
			}
		default:
			t.Fatalf("create namespace %q: %v", ns, err)
		}
	}
	if len(accepted) < 5 {
		t.Fatalf("only %d candidates accepted (%q): the generator is off", len(accepted), accepted)
	}
	listed, err := admin.Admin().ListNamespaces(context.Background(), &adminv1.ListNamespacesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(listed.GetNamespaces()); got != len(accepted) {
		t.Errorf("%d namespaces listed after %d accepted: a refusal changed the FSM", got, len(accepted))
	}

	r := e2e.StartRunner(t, e2e.RunnerOptions{Brokers: kafka.Brokers, Args: []string{"--batch-wait", "20ms"}})
	e2e.StartSidecar(t, e2e.SidecarOptions{ProxyID: proxyID, RunnerID: "runner-1", Runner: r, Admins: cluster.GRPCAddrs(), Lease: lease})
	gw := e2e.StartGateway(t, e2e.GatewayOptions{NodeID: "gateway-names", Admins: cluster.GRPCAddrs(), Timeout: 3 * time.Second})
	for _, ns := range accepted {
		mailbox := ns + "@" + proxyID
		served(t, gw, url.PathEscape(mailbox), events)
		testwait.For(t, 60*time.Second, "namespace "+ns+" served by its path", func() (bool, string) {
			code, body, _, err := web.Get(gw.HTTPURL() + "/v1/namespaces/" + url.PathEscape(ns) + "/stats")
			return code == 200 && strings.Contains(body, fmt.Sprintf(`"total_events":%d`, events)), fmt.Sprint(code, " ", body, err)
		})
	}
	t.Logf("%d of %d candidates accepted and served: %q", len(accepted), len(candidates), accepted)
}
