// Package sidecare2e runs the lease sidecar against real processes on
// loopback: `prism admin` (raft-wal on temp dirs, real TCP transport),
// `prism runner` consuming an in-process kfake broker over TCP, and
// `prism sidecar` between them, with internal/faultproxy where the network
// must fail.
package sidecare2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
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

const (
	topic     = "audit.events"
	namespace = "audit"
	proxyID   = "proxy-1"
	mailboxID = namespace + "@" + proxyID
)

// Lease timing of the tests: short enough to observe expiry, long enough for
// a loaded 2-core machine.
var (
	ttl      = 3 * time.Second
	grace    = 2 * time.Second
	interval = 500 * time.Millisecond
)

// ---- Kafka ----

func startKafka(t *testing.T) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

func produce(t *testing.T, brokers []string, prefix string, n int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		id := fmt.Sprintf("%s-%04d", prefix, i)
		b, err := proto.Marshal(&envelopev1.PrismEnvelope{
			EnvelopeVersion: 1,
			Metadata:        &envelopev1.PrismMetadata{MessageId: id, Topic: topic, PublishedAt: timestamppb.Now(), CorrelationId: "c"},
			Security:        &envelopev1.SecurityContext{PublisherId: "user-1"},
			Observability:   &envelopev1.ObservabilityContext{TraceId: "trace-" + id},
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

// committed sums the group's committed offsets on topic.
func committed(t *testing.T, brokers []string, group string) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	var sum int64
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			if tp.Topic == topic && p.Offset > 0 {
				sum += p.Offset
			}
		}
	}
	return sum
}

// ---- admin ----

type adminNode struct {
	*testproc.Proc
	id, raftAddr, grpcAddr, httpAddr string
	cc                               *grpc.ClientConn
}

func (n *adminNode) admin() adminv1.AdminClient          { return adminv1.NewAdminClient(n.cc) }
func (n *adminNode) control() adminv1.ControlPlaneClient { return adminv1.NewControlPlaneClient(n.cc) }

// startAdmin starts size voters (one bootstraps alone; more use a static
// peer list) and waits for a leader.
func startAdmin(t *testing.T, size int) []*adminNode {
	t.Helper()
	nodes := make([]*adminNode, size)
	var peers []string
	for i := range nodes {
		nodes[i] = &adminNode{id: fmt.Sprintf("admin-%d", i+1), raftAddr: testproc.FreeAddr(t), grpcAddr: testproc.FreeAddr(t), httpAddr: testproc.FreeAddr(t)}
		peers = append(peers, nodes[i].id+"="+nodes[i].raftAddr+"="+nodes[i].grpcAddr)
	}
	for _, n := range nodes {
		args := []string{"admin", "--node-id", n.id, "--raft-addr", n.raftAddr, "--grpc-addr", n.grpcAddr, "--http-addr", n.httpAddr,
			"--data-dir", t.TempDir(), "--raft-timing", "fast", "--log-format", "text"}
		if size == 1 {
			args = append(args, "--bootstrap")
		} else {
			args = append(args, "--peers", strings.Join(peers, ","))
		}
		n.Proc = testproc.Start(t, n.id, args...)
		cc, err := grpc.NewClient(n.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		n.cc = cc
	}
	testwait.For(t, 60*time.Second, "an admin leader", func() (bool, string) {
		l := leaderOf(nodes)
		return l != nil, "no leader"
	})
	return nodes
}

// leaderOf is the node that says it leads, or nil.
func leaderOf(nodes []*adminNode) *adminNode {
	for _, n := range nodes {
		select {
		case <-n.Exited():
			continue
		default:
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

func createNamespace(t *testing.T, n *adminNode) {
	t.Helper()
	testwait.For(t, 30*time.Second, "namespace created", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := n.control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: namespace, Config: &adminv1.NamespaceConfig{
			Topics: []string{topic},
			Lease:  &adminv1.LeaseConfig{Ttl: durationpb.New(ttl), Grace: durationpb.New(grace), HeartbeatInterval: durationpb.New(interval)},
		}})
		return err == nil, fmt.Sprint(err)
	})
}

// lease returns the mailbox's lease as n sees it (linearizable), or nil.
func lease(n *adminNode) (*adminv1.Lease, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := n.admin().ListLeases(ctx, &adminv1.ListLeasesRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
	if err != nil {
		return nil, err
	}
	for _, l := range resp.GetLeases() {
		if l.GetMailboxId() == mailboxID {
			return l, nil
		}
	}
	return nil, nil
}

func route(n *adminNode) (*adminv1.Route, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := n.admin().ListRoutes(ctx, &adminv1.ListRoutesRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
	if err != nil {
		return nil, err
	}
	for _, r := range resp.GetRoutes() {
		if r.GetMailboxId() == mailboxID {
			return r, nil
		}
	}
	return nil, nil
}

// ---- runner + sidecar ----

type runnerProc struct {
	*testproc.Proc
	grpcAddr, httpAddr, controlAddr string
}

func startRunner(t *testing.T, name string, brokers []string) *runnerProc {
	t.Helper()
	r := &runnerProc{grpcAddr: testproc.FreeAddr(t), httpAddr: testproc.FreeAddr(t), controlAddr: testproc.FreeAddr(t)}
	r.Proc = testproc.Start(t, name, "runner", "--kafka", strings.Join(brokers, ","), "--data-dir", t.TempDir(),
		"--grpc-addr", r.grpcAddr, "--http-addr", r.httpAddr, "--control-addr", r.controlAddr,
		"--batch-wait", "20ms", "--log-format", "json")
	testwait.For(t, 30*time.Second, name+" /healthz", func() (bool, string) {
		code, _, err := get("http://" + r.httpAddr + "/healthz")
		return err == nil && code == 200, fmt.Sprint(code, err)
	})
	return r
}

// mailboxStats is the runner's HTTP stats for the mailbox: status code and
// the epoch it serves under.
func (r *runnerProc) mailboxStats() (int, uint64, int64, error) {
	code, body, err := get("http://" + r.httpAddr + "/v1/mailboxes/" + mailboxID + "/stats")
	if err != nil || code != 200 {
		return code, 0, 0, err
	}
	var st struct {
		TotalEvents int64  `json:"total_events"`
		Epoch       uint64 `json:"epoch"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		return code, 0, 0, fmt.Errorf("stats %q: %w", body, err)
	}
	return code, st.Epoch, st.TotalEvents, nil
}

type sidecarProc struct {
	*testproc.Proc
	httpAddr string
}

func startSidecar(t *testing.T, name, runnerID string, r *runnerProc, admins ...string) *sidecarProc {
	t.Helper()
	s := &sidecarProc{httpAddr: testproc.FreeAddr(t)}
	s.Proc = testproc.Start(t, name, "sidecar", "--proxy-id", proxyID, "--runner-id", runnerID,
		"--admin-endpoints", strings.Join(admins, ","), "--runner-addr", r.controlAddr, "--advertise-addr", r.grpcAddr,
		"--http-addr", s.httpAddr, "--lease-ttl", ttl.String(), "--heartbeat-interval", interval.String(),
		"--retry-max", "250ms", "--admin-attempt-timeout", "700ms", "--log-format", "json")
	return s
}

func (s *sidecarProc) ready() (bool, string) {
	code, body, err := get("http://" + s.httpAddr + "/readyz")
	return err == nil && code == 200, fmt.Sprint(code, " ", strings.TrimSpace(body), " ", err)
}

// metric sums the samples of name whose label text contains every part.
func metric(base, name string, parts ...string) (float64, error) {
	code, body, err := get(base + "/metrics")
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
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, nil
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

func get(url string) (int, string, error) {
	resp, err := httpClient.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// timeline records what happened when, printed with the test's output so
// the figures behind each assertion are visible.
type timeline struct {
	mu    sync.Mutex
	start time.Time
	rows  []string
}

func newTimeline() *timeline { return &timeline{start: time.Now()} }

func (tl *timeline) mark(format string, args ...any) time.Time {
	now := time.Now()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.rows = append(tl.rows, fmt.Sprintf("%8.3fs  %s", now.Sub(tl.start).Seconds(), fmt.Sprintf(format, args...)))
	return now
}

func (tl *timeline) String() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return strings.Join(tl.rows, "\n")
}
