package gateway

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcxds "google.golang.org/grpc/xds"
)

func TestBootstrap(t *testing.T) {
	t.Parallel()
	b, err := Bootstrap([]string{"127.0.0.1:1", "[::1]:2"}, "gw-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		XDSServers []struct {
			ServerURI string `json:"server_uri"`
		} `json:"xds_servers"`
		Node struct{ ID, Cluster string } `json:"node"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.XDSServers) != 1 || got.XDSServers[0].ServerURI != "prism-admins:///127.0.0.1:1,[::1]:2" || got.Node.ID != "gw-1" || got.Node.Cluster != DefaultNodeCluster {
		t.Fatalf("bootstrap = %s", b)
	}
	for _, tc := range []struct {
		admins []string
		node   string
		want   string
	}{
		{nil, "gw", "no admin node"},
		{[]string{"127.0.0.1"}, "gw", `admin "127.0.0.1"`},
		{[]string{"127.0.0.1:1"}, "", "node id"},
	} {
		if _, err := Bootstrap(tc.admins, tc.node, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Bootstrap(%q, %q) error = %v, want %q", tc.admins, tc.node, err, tc.want)
		}
	}
}

// TestAdminsResolverSkipsDeadNodes: a channel on a prism-admins target
// reaches the first live node of its list, which is how the xDS client
// finds another admin node when its own dies.
func TestAdminsResolverSkipsDeadNodes(t *testing.T) {
	t.Parallel()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	live, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, health.NewServer())
	go s.Serve(live)
	defer s.Stop()

	cc, err := grpc.NewClient(AdminScheme+":///"+deadAddr+","+live.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health through %s = %v, %v", AdminScheme, resp, err)
	}
}

// FuzzBootstrap: whatever --admin holds, Bootstrap either refuses it or
// produces a bootstrap grpc-go accepts.
func FuzzBootstrap(f *testing.F) {
	f.Add("127.0.0.1:7000,127.0.0.1:7001", "gw-1")
	f.Add("[::1]:1", "prism-gateway-host")
	f.Add("admin:x", "")
	f.Add(`"a\":1`, `}{`)
	f.Fuzz(func(t *testing.T, admins, node string) {
		b, err := Bootstrap(strings.Split(admins, ","), node, nil)
		if err != nil {
			return
		}
		if _, err := grpcxds.NewXDSResolverWithConfigForTesting(b); err != nil {
			t.Fatalf("grpc-go refuses Bootstrap(%q, %q) = %s: %v", admins, node, b, err)
		}
	})
}
