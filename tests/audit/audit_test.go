// Package audit tests the admin's audit trail end to end: three admin
// processes on Raft over TCP publishing to Kafka (kfake), a runner and its
// sidecar serving the $admin namespace, and a gateway answering queries of
// it (docs/architecture.md#the-admin-audit-trail).
package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/admin/audit"
	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

var lease = e2e.Lease{TTL: 6 * time.Second, Grace: 2 * time.Second, Heartbeat: time.Second}

// item is one stored event as the query API answers it.
type item struct {
	MessageID     string            `json:"message_id"`
	Principal     string            `json:"principal"`
	CustomHeaders map[string]string `json:"custom_headers"`
}

func events(web e2e.HTTP, base, query string) ([]item, error) {
	code, body, _, err := web.Get(base + "/events?limit=1000" + query)
	if err != nil || code != 200 {
		return nil, fmt.Errorf("events: %d %s %v", code, strings.TrimSpace(body), err)
	}
	var page struct {
		Items []item `json:"items"`
	}
	if err := json.Unmarshal([]byte(body), &page); err != nil {
		return nil, fmt.Errorf("events %q: %w", body, err)
	}
	return page.Items, nil
}

// created is a namespace whose CreateNamespace was acknowledged, at index.
type created struct {
	name  string
	index uint64
}

// TestAuditTrailAcrossLeaderKill: operators create namespaces while the
// leader is killed -9. Every acknowledged create is in the $admin mailbox
// exactly once, as its Raft index, under the operator's identity; the
// topic holds the changes in index order; calls refused (by authorization,
// by the '$' name rule, by the state) are nowhere in it; and the gateway
// answers "who did what" by principal.
func TestAuditTrailAcrossLeaderKill(t *testing.T) {
	t.Parallel()
	kafka := kafkatest.Start(t, kafkatest.Topics(1, audit.DefaultTopic))
	cluster := e2e.StartAdmins(t, e2e.AdminOptions{Size: 3, Args: []string{"--audit-brokers", strings.Join(kafka.Brokers, ",")}})
	r := e2e.StartRunner(t, e2e.RunnerOptions{Name: "runner", Brokers: kafka.Brokers, Args: []string{"--batch-wait", "20ms"}})
	e2e.StartSidecar(t, e2e.SidecarOptions{Name: "sidecar", ProxyID: e2e.DefaultProxyID, RunnerID: e2e.DefaultProxyID, Runner: r,
		Admins: cluster.GRPCAddrs(), Lease: lease})
	web := e2e.NewHTTP(5 * time.Second)
	mailbox := r.QueryURL() + "/v1/mailboxes/" + url.PathEscape(audit.Namespace+"@"+e2e.DefaultProxyID)
	testwait.For(t, 90*time.Second, "the leader's own $admin served", func() (bool, string) {
		items, err := events(web, mailbox, "")
		return err == nil && len(items) > 0, fmt.Sprint(len(items), err)
	})

	// Creates, one after another through any live node, while the leader
	// is killed after the tenth acknowledgement.
	const creates = 30
	var mu sync.Mutex
	var acked []created
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < creates; i++ {
			name := fmt.Sprintf("orders-%d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			for try := i; ctx.Err() == nil; try++ {
				n := cluster.Nodes[try%len(cluster.Nodes)]
				if !n.Alive() {
					continue
				}
				cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
				res, err := n.Control().CreateNamespace(cctx, &adminv1.CreateNamespaceRequest{Namespace: name,
					Config: &adminv1.NamespaceConfig{Topics: []string{"orders.events"}}})
				ccancel()
				if err == nil {
					mu.Lock()
					// A retry of a create that committed unanswered is
					// answered with the namespace as it was created.
					acked = append(acked, created{name, res.GetNamespace().GetCreatedIndex()})
					mu.Unlock()
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
		}
	}()
	testwait.For(t, 60*time.Second, "ten creates acknowledged", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) >= 10, fmt.Sprint(len(acked))
	})
	lead := cluster.AwaitLeader()
	cluster.Nodes[lead].Kill()
	mu.Lock()
	t.Logf("killed leader %s after %d creates", cluster.Nodes[lead].ID, len(acked))
	mu.Unlock()
	<-done
	if len(acked) < creates-2 {
		t.Fatalf("%d of %d creates acknowledged", len(acked), creates)
	}

	// Refused calls: a reader may not create, nobody may create a '$'
	// name, and a create of an existing namespace with another config is
	// refused by the state.
	survivor := cluster.Nodes[cluster.AwaitLeader(lead)]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reader := adminv1.NewControlPlaneClient(survivor.ConnAs(identity.Reader, "auditor"))
	refused := []struct {
		name string
		call func() error
	}{
		{"refused-reader", func() error {
			_, err := reader.CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: "refused-reader", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}})
			return err
		}},
		{"$refused", func() error {
			_, err := survivor.Control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: "$refused", Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}})
			return err
		}},
		{"orders-0", func() error {
			_, err := survivor.Control().CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: "orders-0", Config: &adminv1.NamespaceConfig{Topics: []string{"other.events"}}})
			return err
		}},
	}
	for _, rc := range refused {
		if err := rc.call(); err == nil || status.Code(err) == codes.Unavailable {
			t.Fatalf("create %s: %v, want a refusal", rc.name, err)
		}
	}
	// A last change after the refusals, so that once it is stored every
	// refusal would have been too.
	last := "after-refusals"
	cluster.CreateNamespace(30*time.Second, last, &adminv1.NamespaceConfig{Topics: []string{"orders.events"}})

	var stored []item
	testwait.For(t, 60*time.Second, "every acknowledged create in $admin", func() (bool, string) {
		items, err := events(web, mailbox, "&topic=admin.namespace.created")
		if err != nil {
			return false, err.Error()
		}
		stored = items
		have := map[string]bool{}
		for _, it := range items {
			have[it.CustomHeaders[audit.HeaderResource]] = true
		}
		missing := []string{}
		for _, c := range append(slices.Clone(acked), created{name: last}) {
			if !have[c.name] {
				missing = append(missing, c.name)
			}
		}
		return len(missing) == 0, fmt.Sprint("missing ", missing)
	})

	byName := map[string][]item{}
	for _, it := range stored {
		byName[it.CustomHeaders[audit.HeaderResource]] = append(byName[it.CustomHeaders[audit.HeaderResource]], it)
	}
	operator := ""
	for _, c := range acked {
		got := byName[c.name]
		if len(got) != 1 {
			t.Errorf("%s created %d times in $admin, want once", c.name, len(got))
			continue
		}
		if got[0].MessageID != audit.MessageID(c.index) || got[0].CustomHeaders[audit.HeaderIndex] != audit.MessageID(c.index) {
			t.Errorf("%s stored as %s (raft_index %s), want its index %d", c.name, got[0].MessageID, got[0].CustomHeaders[audit.HeaderIndex], c.index)
		}
		if !strings.HasSuffix(got[0].Principal, "/operator/"+e2e.Operator) {
			t.Errorf("%s created by %q, want the operator's identity", c.name, got[0].Principal)
		}
		operator = got[0].Principal
	}
	for _, rc := range refused[:2] {
		if n := len(byName[rc.name]); n != 0 {
			t.Errorf("refused create of %s in $admin %d times", rc.name, n)
		}
	}

	// The topic: each change's first copy in index order (a later copy,
	// from a leader resuming, is stored once by message_id).
	all, err := events(web, mailbox, "")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, it := range all {
		if ids[it.MessageID] {
			t.Errorf("message %s stored twice", it.MessageID)
		}
		ids[it.MessageID] = true
	}
	// The admin goes on publishing (leases, proxies) while the test reads, so
	// the topic is compared up to the newest change the mailbox holds: every
	// change there is in the mailbox, once, in index order.
	var newest uint64
	for id := range ids {
		idx, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			t.Fatalf("stored message id %q: %v", id, err)
		}
		newest = max(newest, idx)
	}
	var order []uint64
	for want, tries := len(all), 0; tries < 5; want, tries = want+len(all), tries+1 {
		order = order[:0]
		seen := map[uint64]bool{}
		for _, rec := range kafka.ReadAll(t, audit.DefaultTopic, want) {
			env := &envelopev1.PrismEnvelope{}
			if err := proto.Unmarshal(rec.Value, env); err != nil {
				t.Fatalf("offset %d: %v", rec.Offset, err)
			}
			idx, err := strconv.ParseUint(env.GetMetadata().GetMessageId(), 10, 64)
			if err != nil {
				t.Fatalf("offset %d: message id %q: %v", rec.Offset, env.GetMetadata().GetMessageId(), err)
			}
			if !seen[idx] {
				seen[idx] = true
				order = append(order, idx)
			}
		}
		if seen[newest] {
			break
		}
	}
	if !slices.IsSorted(order) {
		t.Errorf("the topic's changes are not in index order: %v", order)
	}
	upTo := order[:0:0]
	for _, idx := range order {
		if idx <= newest {
			upTo = append(upTo, idx)
			if !ids[audit.MessageID(idx)] {
				t.Errorf("change %d is in the topic, not in the mailbox", idx)
			}
		}
	}
	if len(upTo) != len(ids) {
		t.Errorf("topic holds %d changes up to index %d, the mailbox %d", len(upTo), newest, len(ids))
	}

	// Who did what, through the gateway.
	gw := e2e.StartGateway(t, e2e.GatewayOptions{NodeID: "gw", Admins: cluster.GRPCAddrs(), Timeout: 3 * time.Second})
	testwait.For(t, 60*time.Second, "the operator's changes through the gateway", func() (bool, string) {
		items, err := events(web, gw.HTTPURL()+"/v1/namespaces/"+url.PathEscape(audit.Namespace), "&principal="+url.QueryEscape(operator))
		if err != nil {
			return false, err.Error()
		}
		for _, it := range items {
			if it.Principal != operator {
				return false, "an item of " + it.Principal
			}
		}
		return len(items) == len(acked)+1, fmt.Sprintf("%d items, want %d", len(items), len(acked)+1)
	})
}
