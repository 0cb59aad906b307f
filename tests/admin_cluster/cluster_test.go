package admincluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mesh"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/testbin"
	"github.com/prism-mesh/prism/testkit/testproc"
	"github.com/prism-mesh/prism/testkit/testwait"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func nsConfig() *adminv1.NamespaceConfig {
	return &adminv1.NamespaceConfig{Topics: []string{"audit.events"}}
}

func TestElectionForwardingAndPrismctl(t *testing.T) {
	c := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	lead := c.AwaitLeader()
	f := c.Follower(lead)
	fol := c.Nodes[f]

	// A write through a follower is forwarded to the leader and visible to a
	// linearizable read on the other follower.
	resp, err := fol.Control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: "audit-logs", Config: nsConfig()})
	if err != nil || !resp.GetCreated() {
		t.Fatalf("create through follower: %v, %v", resp, err)
	}
	if metricValue(t, fol, "prism_admin_forwards_total") < 1 {
		t.Fatal("follower did not count a forward")
	}
	other := c.Nodes[3-lead-f]
	got, err := other.Admin().GetNamespace(ctx, &adminv1.GetNamespaceRequest{Namespace: "audit-logs", Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
	if err != nil || got.GetNamespace().GetCreatedIndex() != resp.GetIndex() {
		t.Fatalf("linearizable read on the other follower: %v, %v", got, err)
	}
	for _, n := range c.Nodes {
		r, err := http.Get("http://" + n.HTTPAddr + "/readyz")
		if err != nil || r.StatusCode != http.StatusOK {
			t.Fatalf("%s /readyz: %v %v", n.ID, r, err)
		}
		r.Body.Close()
	}

	// prismctl against a follower, with a dead endpoint first in the list.
	ctl, err := testbin.Path("prismctl")
	if err != nil {
		t.Fatal(err)
	}
	dead := testproc.FreeAddr(t)
	op := e2e.CtlArgs(t, nil, identity.Operator, e2e.Operator)
	prismctl := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, ctl, append(append(op, "--admin", dead+","+fol.GRPCAddr, "--attempt-timeout", "1s"), args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("prismctl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	var st struct {
		NodeID   string `json:"node_id"`
		LeaderID string `json:"leader_id"`
		Members  []struct {
			ID          string `json:"id"`
			GrpcAddress string `json:"grpc_address"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(prismctl("cluster", "status", "--format", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.NodeID != fol.ID || st.LeaderID != c.Nodes[lead].ID || len(st.Members) != 3 {
		t.Fatalf("cluster status through follower: %+v", st)
	}
	prismctl("namespace", "create", "billing", "--topic", "billing.events", "--lease-ttl", "5s")
	if out := prismctl("namespace", "list", "--consistent"); !strings.Contains(out, "billing") || !strings.Contains(out, "audit-logs") {
		t.Fatalf("namespace list:\n%s", out)
	}
	if out := prismctl("namespace", "get", "billing", "--format", "json"); !strings.Contains(out, `"5s"`) {
		t.Fatalf("namespace get:\n%s", out)
	}
	for _, args := range [][]string{{"proxy", "list"}, {"lease", "list"}, {"route", "list"}} {
		if out := prismctl(args...); !strings.Contains(out, strings.ToUpper(args[0])) && !strings.Contains(out, "MAILBOX") {
			t.Fatalf("prismctl %v:\n%s", args, out)
		}
	}
	if out := prismctl("namespace", "delete", "billing"); !strings.Contains(out, "deleted billing") {
		t.Fatalf("namespace delete:\n%s", out)
	}
	cmd := exec.CommandContext(ctx, ctl, append(op, "--admin", fol.GRPCAddr, "namespace", "get", "billing")...)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "NotFound") {
		t.Fatalf("get deleted namespace: %v\n%s", err, out)
	}
	cmd = exec.CommandContext(ctx, ctl, append(op, "--admin", fol.GRPCAddr, "member", "add", "x", "not-an-address", "127.0.0.1:1")...)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "InvalidArgument") {
		t.Fatalf("member add with a bad address: %v\n%s", err, out)
	}
}

type ack struct {
	mailbox string
	epoch   uint64
}

// TestKillLeaderUnderLoad: kill -9 of the leader while clients acquire
// leases and heartbeat others. A new leader is elected, every acknowledged
// grant is there, the held leases were never refused or re-granted (no
// spurious expiry although ttl is 1 s), and the killed node restarts on its
// data dir and catches up.
func TestKillLeaderUnderLoad(t *testing.T) {
	c := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	lead := c.AwaitLeader()

	// Short leases, heartbeated every 250 ms: without the extension on
	// promotion, the new leader would expire them during the failover.
	short := &adminv1.NamespaceConfig{Topics: []string{"t"}, Lease: &adminv1.LeaseConfig{
		Ttl: durationpb.New(time.Second), Grace: durationpb.New(200 * time.Millisecond),
	}}
	// Five proxies, each its own runner (a registration without a runner id
	// names the proxy), and one held mailbox on each.
	for i := range 5 {
		registerRunner(ctx, t, c, fmt.Sprintf("p%d", i), "")
	}
	held := map[string]uint64{}
	runnerOf := map[string]string{}
	for i := range 5 {
		proxy := fmt.Sprintf("p%d", i)
		mb := placedMailbox(ctx, t, c, proxy, "held-"+proxy, short)
		r, err := c.Nodes[lead].ControlAs(proxy).AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: mb, RunnerId: proxy, RunnerAddress: "127.0.0.1:9000"})
		if err != nil || !r.GetGranted() {
			t.Fatalf("acquire %s: %v %v", mb, r, err)
		}
		held[mb] = r.GetLease().GetEpoch()
		runnerOf[mb] = proxy
	}

	loadCtx, stopLoad := context.WithCancel(ctx)
	var (
		mu       sync.Mutex
		acks     []ack
		refusals []string
		wg       sync.WaitGroup
	)
	for mb, epoch := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 400 && loadCtx.Err() == nil; i++ {
				r, err := anyNode(loadCtx, c, i, func(ctx context.Context, n *e2e.AdminNode) (*adminv1.MailboxHeartbeatResponse, error) {
					return n.ControlAs(runnerOf[mb]).MailboxHeartbeat(ctx, &adminv1.MailboxHeartbeatRequest{MailboxId: mb, RunnerId: runnerOf[mb], Epoch: epoch})
				})
				if err == nil && !r.GetRenewed() {
					mu.Lock()
					refusals = append(refusals, fmt.Sprintf("%s: %v", mb, r.GetRefusal()))
					mu.Unlock()
				}
				select {
				case <-loadCtx.Done():
				case <-time.After(250 * time.Millisecond):
				}
			}
		}()
	}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000 && loadCtx.Err() == nil; i++ {
				// Each acquire is for a new namespace's mailbox, by the
				// runner of the proxy it is placed on.
				created, err := anyNode(loadCtx, c, w+i, func(ctx context.Context, n *e2e.AdminNode) (*adminv1.CreateNamespaceResponse, error) {
					return n.Control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: fmt.Sprintf("load-w%d-%d", w, i), Config: nsConfig()})
				})
				if err != nil {
					continue
				}
				proxy := created.GetNamespace().GetAssignedProxyId()
				mb := created.GetNamespace().GetName() + "@" + proxy
				r, err := anyNode(loadCtx, c, w+i, func(ctx context.Context, n *e2e.AdminNode) (*adminv1.AcquireLeaseResponse, error) {
					return n.ControlAs(proxy).AcquireLease(ctx, &adminv1.AcquireLeaseRequest{MailboxId: mb, RunnerId: proxy, RunnerAddress: "127.0.0.1:9000", Ttl: durationpb.New(time.Hour)})
				})
				if err == nil && r.GetGranted() {
					mu.Lock()
					acks = append(acks, ack{mb, r.GetLease().GetEpoch()})
					mu.Unlock()
				}
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acks) }
	testwait.For(t, 30*time.Second, "load before the kill", func() (bool, string) { return count() >= 50, fmt.Sprint(count()) })

	oldTerm := mustStatus(t, c.Nodes[lead]).GetTerm()
	killed := lead
	c.Nodes[killed].Kill()
	newLead := c.AwaitLeader(killed)
	if newLead == killed {
		t.Fatal("killed node still leads")
	}
	if term := mustStatus(t, c.Nodes[newLead]).GetTerm(); term <= oldTerm {
		t.Fatalf("term %d not after %d", term, oldTerm)
	}
	before := count()
	testwait.For(t, 30*time.Second, "load after the failover", func() (bool, string) { return count() >= before+50, fmt.Sprint(count()) })
	stopLoad()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(refusals) > 0 {
		t.Fatalf("held leases refused across the failover: %v", refusals)
	}
	// Every page: the load acquires up to 8,000 leases.
	have := map[string]uint64{}
	if err := mesh.AllPages(func(token string) (*adminv1.ListLeasesResponse, error) {
		return c.Nodes[newLead].Admin().ListLeases(ctx, &adminv1.ListLeasesRequest{Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE, PageToken: token})
	}, func(r *adminv1.ListLeasesResponse) {
		for _, l := range r.GetLeases() {
			have[l.GetMailboxId()] = l.GetEpoch()
		}
	}); err != nil {
		t.Fatal(err)
	}
	for _, a := range acks {
		if have[a.mailbox] != a.epoch {
			t.Fatalf("acknowledged grant %s epoch %d lost (have epoch %d)", a.mailbox, a.epoch, have[a.mailbox])
		}
	}
	for mb, epoch := range held {
		if have[mb] != epoch {
			t.Fatalf("held lease %s: epoch %d, want %d (expired or re-granted)", mb, have[mb], epoch)
		}
	}
	if v := metricValue(t, c.Nodes[newLead], "prism_admin_lease_expirations_total"); v != 0 {
		t.Fatalf("new leader expired %v leases", v)
	}
	t.Logf("%d acknowledged grants, %d during or after the failover", len(acks), len(acks)-before)

	// The killed node restarts on its data dir, is not re-bootstrapped, and
	// catches up with everything committed while it was down. (The held
	// leases expire now that nobody heartbeats them, so compare the rest.)
	c.Nodes[killed].Restart()
	var target uint64
	testwait.For(t, 60*time.Second, "the restarted node to catch up", func() (bool, string) {
		target = mustStatus(t, c.Nodes[newLead]).GetCommitIndex()
		st, err := c.Nodes[killed].Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		return st.GetAppliedIndex() >= target && st.GetLeaderId() != "", fmt.Sprintf("applied %d of %d", st.GetAppliedIndex(), target)
	})
	loadLeases := func(n *e2e.AdminNode, c adminv1.Consistency) map[string]uint64 {
		out := map[string]uint64{}
		if err := mesh.AllPages(func(token string) (*adminv1.ListLeasesResponse, error) {
			return n.Admin().ListLeases(ctx, &adminv1.ListLeasesRequest{Consistency: c, PageToken: token})
		}, func(r *adminv1.ListLeasesResponse) {
			for _, l := range r.GetLeases() {
				if strings.HasPrefix(l.GetNamespace(), "load-") {
					out[l.GetMailboxId()] = l.GetEpoch()
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	want := loadLeases(c.Nodes[newLead], adminv1.Consistency_CONSISTENCY_LINEARIZABLE)
	got := loadLeases(c.Nodes[killed], adminv1.Consistency_CONSISTENCY_STALE)
	if len(got) != len(want) || len(want) < len(acks) {
		t.Fatalf("restarted node has %d load leases, leader %d, acknowledged %d", len(got), len(want), len(acks))
	}
	for mb, e := range want {
		if got[mb] != e {
			t.Fatalf("restarted node: %s epoch %d, leader %d", mb, got[mb], e)
		}
	}
}

func mustStatus(t *testing.T, n *e2e.AdminNode) *adminv1.GetClusterStatusResponse {
	t.Helper()
	st, err := n.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestGracefulShutdownHandsOverLeadership: SIGTERM on the leader transfers
// leadership, and the cluster keeps accepting writes.
func TestGracefulShutdownHandsOverLeadership(t *testing.T) {
	c := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lead := c.AwaitLeader()
	if err := c.Nodes[lead].Term(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	next := c.AwaitLeader(lead)
	if _, err := c.Nodes[next].Control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: "after", Config: nsConfig()}); err != nil {
		t.Fatal(err)
	}
}

// TestMembershipThroughPrismctl: a fourth node started with --join is added
// with `prismctl member add` through a follower, replicates, serves writes
// (forwarded to the leader), and is removed again.
func TestMembershipThroughPrismctl(t *testing.T) {
	c := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	lead := c.AwaitLeader()
	fol := c.Nodes[c.Follower(lead)]
	if _, err := fol.Control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: "before-join", Config: nsConfig()}); err != nil {
		t.Fatal(err)
	}
	j := c.AddJoiner()
	joiner := c.Nodes[j]
	ctl, err := testbin.Path("prismctl")
	if err != nil {
		t.Fatal(err)
	}
	prismctl := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, ctl, append(append(e2e.CtlArgs(t, nil, identity.Operator, e2e.Operator), "--admin", fol.GRPCAddr), args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("prismctl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	memberAdd(ctx, t, fol, joiner)
	testwait.For(t, 30*time.Second, "the joiner to replicate", func() (bool, string) {
		r, err := joiner.Admin().GetNamespace(ctx, &adminv1.GetNamespaceRequest{Namespace: "before-join"})
		return err == nil && r.GetNamespace() != nil, fmt.Sprint(err)
	})
	st := mustStatus(t, c.Nodes[lead])
	if len(st.GetMembers()) != 4 {
		t.Fatalf("members after add: %v", st.GetMembers())
	}
	if _, err := joiner.Control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: "via-joiner", Config: nsConfig()}); err != nil {
		t.Fatalf("write through the joiner: %v", err)
	}
	prismctl("member", "remove", joiner.ID)
	testwait.For(t, 30*time.Second, "the member list to shrink", func() (bool, string) {
		st := mustStatus(t, c.Nodes[c.AwaitLeader(j)])
		return len(st.GetMembers()) == 3, fmt.Sprint(st.GetMembers())
	})
	// Removing a non-member succeeds (safe to retry).
	prismctl("member", "remove", joiner.ID)
}

// TestPartitionedLeader: a leader cut off by the fault proxies cannot commit
// (a write sent to it fails instead of succeeding), the majority elects a new
// leader and keeps committing, and after the heal the old leader follows and
// has everything.
func TestPartitionedLeader(t *testing.T) {
	c := startCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	old := c.AwaitLeader()
	c.Isolate(old, true)
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := c.Nodes[old].Control().CreateNamespace(wctx, &adminv1.CreateNamespaceRequest{Namespace: "minority", Config: nsConfig()})
	wcancel()
	if err == nil {
		t.Fatal("the isolated leader acknowledged a write")
	}
	next := c.AwaitLeader(old)
	if _, err := c.Nodes[next].Control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: "majority", Config: nsConfig()}); err != nil {
		t.Fatal(err)
	}
	c.Isolate(old, false)
	testwait.For(t, 30*time.Second, "the old leader to follow and catch up", func() (bool, string) {
		st, err := c.Nodes[old].Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		r, err := c.Nodes[old].Admin().GetNamespace(ctx, &adminv1.GetNamespaceRequest{Namespace: "majority"})
		return st.GetState() == "Follower" && err == nil && r.GetNamespace() != nil, fmt.Sprintf("%s leader=%s: %v", st.GetState(), st.GetLeaderId(), err)
	})
	// The minority's entry never reached a majority: the new leader's log
	// replaced it on the old leader, so it exists nowhere.
	for _, n := range []*e2e.AdminNode{c.Nodes[old], c.Nodes[next]} {
		_, err := n.Admin().GetNamespace(ctx, &adminv1.GetNamespaceRequest{Namespace: "minority"})
		if status.Code(err) != codes.NotFound {
			t.Fatalf("%s: the unacknowledged minority write: %v", n.ID, err)
		}
	}
}
