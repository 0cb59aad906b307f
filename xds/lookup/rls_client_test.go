package lookup

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/balancer"
	_ "google.golang.org/grpc/balancer/rls" // the RLS policy under test
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/prism-mesh/prism/mesh"
	lookupv1 "github.com/prism-mesh/prism/proto/prism/lookup/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// targetPolicy is an RLS child policy standing in for xDS's
// cds_experimental: RLS hands it the target it looked up (a cluster name)
// in its config's "target" field, and it connects to the backend
// registered under that name.
const targetPolicy = "prism-lookup-test-target"

// backends maps a target (cluster name) to the address serving it.
var backends sync.Map

func init() { balancer.Register(targetBuilder{}) }

type targetConfig struct {
	serviceconfig.LoadBalancingConfig
	Target string `json:"target"`
}

type targetBuilder struct{}

func (targetBuilder) Name() string { return targetPolicy }

func (targetBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	return &targetBalancer{Balancer: balancer.Get("pick_first").Build(cc, opts)}
}

func (targetBuilder) ParseConfig(c json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	cfg := &targetConfig{}
	if err := json.Unmarshal(c, cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

type targetBalancer struct{ balancer.Balancer }

func (b *targetBalancer) UpdateClientConnState(s balancer.ClientConnState) error {
	addr, ok := backends.Load(s.BalancerConfig.(*targetConfig).Target)
	if !ok {
		return balancer.ErrBadResolverState
	}
	return b.Balancer.UpdateClientConnState(balancer.ClientConnState{ResolverState: resolver.State{
		Endpoints: []resolver.Endpoint{{Addresses: []resolver.Address{{Addr: addr.(string)}}}},
	}})
}

// backend answers GetStats with headers naming itself and the RLS header
// data the call carried.
type backend struct {
	mailboxv1.UnimplementedMailboxQueryServer
	name string
}

func (b backend) GetStats(ctx context.Context, _ *mailboxv1.GetStatsRequest) (*mailboxv1.GetStatsResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	data := ""
	if v := md.Get("x-google-rls-data"); len(v) > 0 {
		data = v[0]
	}
	if err := grpc.SetHeader(ctx, metadata.Pairs("x-served-by", b.name, "x-rls-data", data)); err != nil {
		return nil, err
	}
	return &mailboxv1.GetStatsResponse{}, nil
}

func serve(t *testing.T, register func(grpc.ServiceRegistrar)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	register(s)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

// grpc-go's own RLS policy, configured as the translator configures it for
// x-prism-namespace (only the child policy differs: xDS's picks the
// cluster), looks namespaces up in the Server and sends each call to the
// namespace's proxy with its mailbox id as header data, an unknown
// namespace to the admin target, and a moved namespace to its new proxy
// once the cached answer is older than max_age.
func TestGRPCRLSClient(t *testing.T) {
	routes := testRoutes()
	lookupAddr := serve(t, New(Config{Routes: routes}).Register)
	for _, target := range []string{ProxyTarget("proxy-02"), ProxyTarget("proxy-03"), AdminTarget} {
		name := target
		backends.Store(target, serve(t, func(s grpc.ServiceRegistrar) { mailboxv1.RegisterMailboxQueryServer(s, backend{name: name}) }))
	}
	rlc, err := protojson.Marshal(&lookupv1.RouteLookupConfig{
		GrpcKeybuilders: []*lookupv1.GrpcKeyBuilder{{
			Names:   []*lookupv1.GrpcKeyBuilder_Name{{Service: mailboxv1.MailboxQuery_ServiceDesc.ServiceName}},
			Headers: []*lookupv1.NameMatcher{{Key: NamespaceKey, Names: []string{mesh.HeaderNamespace}}},
		}},
		LookupService:        "passthrough:///" + lookupAddr,
		LookupServiceTimeout: durationpb.New(2 * time.Second),
		MaxAge:               durationpb.New(time.Second),
		StaleAge:             durationpb.New(500 * time.Millisecond),
		CacheSizeBytes:       4 << 20,
		DefaultTarget:        AdminTarget,
	})
	if err != nil {
		t.Fatal(err)
	}
	sc := fmt.Sprintf(`{"loadBalancingConfig": [{"rls_experimental": {
		"routeLookupConfig": %s,
		"childPolicy": [{%q: {}}],
		"childPolicyConfigTargetFieldName": "target"
	}}]}`, rlc, targetPolicy)
	cc, err := grpc.NewClient("passthrough:///gateway", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(sc))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	client := mailboxv1.NewMailboxQueryClient(cc)
	call := func(ns string) (servedBy, data string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var hdr metadata.MD
		if _, err := client.GetStats(metadata.AppendToOutgoingContext(ctx, mesh.HeaderNamespace, ns), &mailboxv1.GetStatsRequest{}, grpc.Header(&hdr)); err != nil {
			t.Fatalf("GetStats for namespace %s: %v", ns, err)
		}
		return first(hdr, "x-served-by"), first(hdr, "x-rls-data")
	}
	for _, tc := range []struct{ ns, servedBy, data string }{
		{"audit-logs", ProxyTarget("proxy-02"), "audit-logs@proxy-02"},
		{"billing-unserved", AdminTarget, ""},
	} {
		if by, data := call(tc.ns); by != tc.servedBy || data != tc.data {
			t.Fatalf("namespace %s served by %s with RLS data %q, want %s with %q", tc.ns, by, data, tc.servedBy, tc.data)
		}
	}
	routes.set("audit-logs", "audit-logs@proxy-03")
	deadline := time.Now().Add(10 * time.Second)
	for {
		by, data := call("audit-logs")
		if by == ProxyTarget("proxy-03") && data == "audit-logs@proxy-03" {
			break
		}
		if by != ProxyTarget("proxy-02") || time.Now().After(deadline) {
			t.Fatalf("after the move: served by %s with %q", by, data)
		}
		time.Sleep(50 * time.Millisecond) // polling the client's cache age out
	}
}

func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}
