// Package gatewaye2e runs prism gateway against real processes on loopback:
// three `prism admin` nodes (raft-wal on temp dirs, real TCP transport,
// xDS served by every node), `prism runner` consuming an in-process kfake
// broker over TCP with `prism sidecar` holding its leases, and
// `prism gateway` routed by xDS from the admin nodes.
package gatewaye2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/internal/testproc"
	"github.com/prism-mesh/prism/internal/testwait"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
)

const proxyID = "proxy-1"

// ---- Kafka ----

func startKafka(t *testing.T, topics ...string) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func produce(t *testing.T, brokers []string, topic string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		id := fmt.Sprintf("%s-%04d", topic, i)
		b, err := proto.Marshal(&envelopev1.PrismEnvelope{
			EnvelopeVersion: 1,
			Metadata:        &envelopev1.PrismMetadata{MessageId: id, Topic: topic, PublishedAt: timestamppb.Now()},
		})
		if err != nil {
			t.Fatal(err)
		}
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(id), Value: b}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// ---- admin ----

type adminNode struct {
	*testproc.Proc
	id, raftAddr, grpcAddr, httpAddr string
	args                             []string
	cc                               *grpc.ClientConn
}

func (n *adminNode) admin() adminv1.AdminClient          { return adminv1.NewAdminClient(n.cc) }
func (n *adminNode) control() adminv1.ControlPlaneClient { return adminv1.NewControlPlaneClient(n.cc) }

// restart starts the node again on its addresses and data directory.
func (n *adminNode) restart(t *testing.T) {
	t.Helper()
	n.Proc = testproc.Start(t, n.id+"-restarted", n.args...)
}

// startAdmins starts three voters with a static peer list and waits for a
// leader.
func startAdmins(t *testing.T) []*adminNode {
	t.Helper()
	nodes := make([]*adminNode, 3)
	var peers []string
	for i := range nodes {
		nodes[i] = &adminNode{id: fmt.Sprintf("admin-%d", i+1), raftAddr: testproc.FreeAddr(t), grpcAddr: testproc.FreeAddr(t), httpAddr: testproc.FreeAddr(t)}
		peers = append(peers, nodes[i].id+"="+nodes[i].raftAddr+"="+nodes[i].grpcAddr)
	}
	for _, n := range nodes {
		n.args = []string{"admin", "--node-id", n.id, "--raft-addr", n.raftAddr, "--grpc-addr", n.grpcAddr, "--http-addr", n.httpAddr,
			"--data-dir", t.TempDir(), "--raft-timing", "fast", "--log-format", "text", "--peers", strings.Join(peers, ",")}
		n.Proc = testproc.Start(t, n.id, n.args...)
		cc, err := grpc.NewClient(n.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		n.cc = cc
	}
	testwait.For(t, 60*time.Second, "an admin leader", func() (bool, string) {
		return leaderOf(nodes) != nil, "no leader"
	})
	return nodes
}

// leaderOf is the live node that says it leads, or nil.
func leaderOf(nodes []*adminNode) *adminNode {
	for _, n := range nodes {
		if !n.Alive() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := n.admin().GetClusterStatus(ctx, &adminv1.GetClusterStatusRequest{})
		cancel()
		if err == nil && st.GetState() == "Leader" {
			return n
		}
	}
	return nil
}

// createNamespace creates ns on topic through any live node (followers
// forward writes to the leader).
func createNamespace(t *testing.T, nodes []*adminNode, ns, topic string) {
	t.Helper()
	lease := &adminv1.LeaseConfig{Ttl: durationpb.New(3 * time.Second), Grace: durationpb.New(2 * time.Second), HeartbeatInterval: durationpb.New(500 * time.Millisecond)}
	testwait.For(t, 60*time.Second, "namespace "+ns+" created", func() (bool, string) {
		var errs []string
		for _, n := range nodes {
			if !n.Alive() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := n.control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{topic}, Lease: lease}})
			cancel()
			if err == nil {
				return true, ""
			}
			errs = append(errs, n.id+": "+err.Error())
		}
		return false, strings.Join(errs, "; ")
	})
}

// ---- runner, sidecar, gateway ----

type runnerProc struct {
	*testproc.Proc
	queryAddr, httpAddr, controlAddr string
}

func startRunner(t *testing.T, brokers []string) *runnerProc {
	t.Helper()
	r := &runnerProc{queryAddr: testproc.FreeAddr(t), httpAddr: testproc.FreeAddr(t), controlAddr: testproc.FreeAddr(t)}
	r.Proc = testproc.Start(t, "runner", "runner", "--kafka", strings.Join(brokers, ","), "--data-dir", t.TempDir(),
		"--grpc-addr", r.queryAddr, "--http-addr", r.httpAddr, "--control-addr", r.controlAddr,
		"--batch-wait", "20ms", "--log-format", "json")
	testwait.For(t, 30*time.Second, "runner /healthz", func() (bool, string) {
		code, _, _, err := get("http://" + r.httpAddr + "/healthz")
		return err == nil && code == 200, fmt.Sprint(code, err)
	})
	return r
}

// startSidecar holds the runner's leases, advertising its query port (where
// it answers gRPC and HTTP alike) as the address routes point at.
func startSidecar(t *testing.T, r *runnerProc, admins []string) *testproc.Proc {
	t.Helper()
	return testproc.Start(t, "sidecar", "sidecar", "--proxy-id", proxyID, "--runner-id", "runner-1",
		"--admin-endpoints", strings.Join(admins, ","), "--runner-addr", r.controlAddr, "--advertise-addr", r.queryAddr,
		"--http-addr", testproc.FreeAddr(t), "--lease-ttl", "3s", "--heartbeat-interval", "500ms",
		"--retry-max", "250ms", "--admin-attempt-timeout", "700ms", "--log-format", "json")
}

type gatewayProc struct {
	*testproc.Proc
	httpAddr, grpcAddr string
}

func startGateway(t *testing.T, admins []string) *gatewayProc {
	t.Helper()
	g := &gatewayProc{httpAddr: testproc.FreeAddr(t), grpcAddr: testproc.FreeAddr(t)}
	g.Proc = testproc.Start(t, "gateway", "gateway", "--admin", strings.Join(admins, ","), "--node-id", "gateway-e2e",
		"--http-addr", g.httpAddr, "--grpc-addr", g.grpcAddr, "--timeout", "3s", "--log-format", "json")
	return g
}

// metric sums the samples of name whose label text contains every part.
func metric(base, name string, parts ...string) (float64, error) {
	code, body, _, err := get(base + "/metrics")
	if err != nil || code != 200 {
		return 0, fmt.Errorf("metrics: %d %v", code, err)
	}
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, p := range parts {
			if !strings.Contains(line, p) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			sum += v
		}
	}
	return sum, nil
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

func get(url string) (int, string, http.Header, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, err
}
