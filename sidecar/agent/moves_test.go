package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

const (
	serving    = adminv1.AssignmentRole_ASSIGNMENT_ROLE_SERVING
	catchingUp = adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP
	handingOff = adminv1.AssignmentRole_ASSIGNMENT_ROLE_HANDING_OFF
)

type roled struct {
	ns   string
	role adminv1.AssignmentRole
}

// assignRoles sends an assignment set whose namespaces have roles.
func (h *harness) assignRoles(index uint64, set ...roled) {
	h.admin.assign <- rolesSet(index, set...)
}

// rolesSet is the assignment set of proxy p1 at index.
func rolesSet(index uint64, set ...roled) *adminv1.WatchAssignmentsResponse {
	msg := &adminv1.WatchAssignmentsResponse{ProxyId: "p1", Index: index}
	for _, a := range set {
		msg.Assignments = append(msg.Assignments, &adminv1.NamespaceAssignment{
			Namespace: a.ns, MailboxId: a.ns + "@p1", Role: a.role,
			Config: &adminv1.NamespaceConfig{Topics: []string{a.ns + ".events"}},
		})
	}
	return msg
}

func (h *harness) applied(index uint64) {
	h.t.Helper()
	h.waitFor("assignment set applied", func() bool {
		h.agent.mu.Lock()
		defer h.agent.mu.Unlock()
		return h.agent.lastIndex == index
	})
}

// releasePrefix is how a mode's fake admin logs a release of mailbox id.
func releasePrefix(mode LeaseMode, id string) string {
	if mode == LeaseModeSession {
		return "admin release-leases 1 " + id
	}
	return "admin release " + id
}

// A move's roles on either end (docs/architecture.md#moves), in both lease modes: a
// namespace catching up is opened, acquired and served like a served one;
// its switch to serving changes the role only (nothing is drained, closed or
// released, the epoch stays); a served one's to handing off also drains it
// in the runner (it stops ingesting and keeps serving, nothing closed or
// released, the epoch stays); once a namespace leaves the set, handed off or
// abandoned while catching up, the runner drains and closes it and only
// then is its lease released.
func TestMoveRoles(t *testing.T) {
	t.Parallel()
	for _, mode := range []LeaseMode{LeaseModeMailbox, LeaseModeSession} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *Config) { c.LeaseMode = mode })
			h.assignRoles(1, roled{"in", catchingUp}, roled{"out", serving}, roled{"gone", catchingUp})
			h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 3 })
			for id, want := range map[string]adminv1.AssignmentRole{"in@p1": catchingUp, "out@p1": serving, "gone@p1": catchingUp} {
				if v := h.lease(id); v.State != StateActive || v.Role != want || activations(h)[id] != v.Epoch {
					t.Fatalf("%s: %+v, want active as %v under its activated epoch", id, v, want)
				}
			}
			in, out := h.lease("in@p1").Epoch, h.lease("out@p1").Epoch

			// The switch: in serves, out hands off; gone's move is abandoned.
			h.assignRoles(2, roled{"in", serving}, roled{"out", handingOff})
			iClose, _ := h.waitEvent(h.waitIndex("runner drain gone@p1"), "runner close gone@p1")
			h.waitEvent(iClose, releasePrefix(mode, "gone@p1"))
			h.applied(2)
			h.waitIndex("runner drain out@p1")
			if v := h.lease("in@p1"); v.Role != serving || v.State != StateActive || v.Epoch != in {
				t.Fatalf("in@p1 after the switch: %+v, want serving, active, epoch %d", v, in)
			}
			if v := h.lease("out@p1"); v.Role != handingOff || v.State != StateActive || v.Epoch != out {
				t.Fatalf("out@p1 after the switch: %+v, want handing off, active, epoch %d", v, out)
			}
			for _, id := range []string{"in@p1", "out@p1"} {
				for _, what := range []string{"runner drain " + id, "runner close " + id, "runner fence " + id, releasePrefix(mode, id), "runner open " + id} {
					once := what == "runner open "+id || what == "runner drain out@p1"
					if n := h.ev.count(what); n != map[bool]int{true: 1, false: 0}[once] {
						t.Fatalf("%q seen %d times across a role change:\n%s", what, n, h.ev)
					}
				}
			}

			// The tail ends: out leaves the set, closed then released.
			h.assignRoles(3, roled{"in", serving})
			iClose, _ = h.waitEvent(h.waitIndex("runner drain out@p1"), "runner close out@p1")
			h.waitEvent(iClose, releasePrefix(mode, "out@p1"))
			if v := h.lease("in@p1"); v.State != StateActive || v.Epoch != in {
				t.Fatalf("in@p1 %+v, want untouched", v)
			}
		})
	}
}

// A tail's proxy that gets its namespace back (an unplanned reassignment:
// handing off to serving) has the runner ingest it again: activated anew
// under the same epoch after the drain of the handoff, nothing closed or
// released; handing off once more drains it again.
func TestHandoffTakenBack(t *testing.T) {
	t.Parallel()
	for _, mode := range []LeaseMode{LeaseModeMailbox, LeaseModeSession} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *Config) { c.LeaseMode = mode })
			h.assignRoles(1, roled{"out", serving})
			h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 1 })
			epoch := h.lease("out@p1").Epoch
			h.assignRoles(2, roled{"out", handingOff})
			drained := h.waitIndex("runner drain out@p1")
			h.assignRoles(3, roled{"out", serving})
			reactivated, _ := h.waitEvent(drained, fmt.Sprintf("runner activate out@p1 %d ", epoch))
			h.assignRoles(4, roled{"out", handingOff})
			h.waitEvent(reactivated, "runner drain out@p1")
			if v := h.lease("out@p1"); v.State != StateActive || v.Epoch != epoch || v.Role != handingOff {
				t.Fatalf("out@p1 %+v, want active under epoch %d, handing off", v, epoch)
			}
			for _, what := range []string{"runner close out@p1", "runner fence out@p1", releasePrefix(mode, "out@p1")} {
				if n := h.ev.count(what); n != 0 {
					t.Fatalf("%q seen %d times:\n%s", what, n, h.ev)
				}
			}
		})
	}
}

func (h *harness) waitIndex(prefix string) int {
	h.t.Helper()
	i, _ := h.waitEvent(0, prefix)
	return i
}

// The proxy heartbeat reports each namespace's lag and stored positions
// from the runner's stats probe: known with the runner's figures when it
// gives them, unknown (lag_known false, no positions) when it does not.
func TestProxyHeartbeatReportsLag(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assignRoles(1, roled{"in", catchingUp}, roled{"fresh", catchingUp}, roled{"out", serving})
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 3 })
	h.runner.setLag("in@p1", proto.Int64(120))
	h.runner.setLag("out@p1", proto.Int64(0))
	h.runner.setPositions("in@p1", &runnerv1.StoredPosition{Topic: "t", Partition: 0, NextOffset: 30}, &runnerv1.StoredPosition{Topic: "t", Partition: 1, NextOffset: 7})
	h.settle(4)
	h.clk.Step(testInterval)
	h.waitFor("proxy heartbeat", func() bool { hbs, _ := h.admin.proxyReports(); return len(hbs) > 0 })
	hbs, _ := h.admin.proxyReports()
	got := map[string]*adminv1.NamespaceHealth{}
	for _, nh := range hbs[0].GetNamespaceHealth() {
		got[nh.GetNamespace()] = nh
	}
	for ns, want := range map[string]*adminv1.NamespaceHealth{
		"in": {Namespace: "in", Status: adminv1.HealthStatus_HEALTH_STATUS_HEALTHY, Lag: 120, LagKnown: true, StoredPositions: []*adminv1.StoredPosition{
			{Topic: "t", Partition: 0, NextOffset: 30}, {Topic: "t", Partition: 1, NextOffset: 7}}},
		"fresh": {Namespace: "fresh", Status: adminv1.HealthStatus_HEALTH_STATUS_HEALTHY},
		"out":   {Namespace: "out", Status: adminv1.HealthStatus_HEALTH_STATUS_HEALTHY, Lag: 0, LagKnown: true},
	} {
		if !proto.Equal(got[ns], want) {
			t.Fatalf("%s: health %v, want %v", ns, got[ns], want)
		}
	}
}

// drainCall is one POST /drain in flight.
type drainCall struct {
	done chan struct{}
	rec  *httptest.ResponseRecorder
}

func (h *harness) postDrain(query string) *drainCall {
	c := &drainCall{done: make(chan struct{}), rec: httptest.NewRecorder()}
	go func() {
		defer close(c.done)
		req := httptest.NewRequest(http.MethodPost, "/drain?"+query, nil)
		req.RemoteAddr = "127.0.0.1:40000"
		h.agent.Handler().ServeHTTP(c.rec, req)
	}()
	return c
}

func (c *drainCall) answered() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *drainCall) result(t *testing.T) DrainResult {
	t.Helper()
	var r DrainResult
	if err := json.Unmarshal(c.rec.Body.Bytes(), &r); err != nil {
		t.Fatalf("drain body %q: %v", c.rec.Body, err)
	}
	return r
}

// cordons records the proxies Config.Cordon was called for, failing the
// first fails calls.
type cordons struct {
	mu    sync.Mutex
	calls []string
	fails int
}

func (c *cordons) cordon(_ context.Context, proxyID string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, proxyID)
	if len(c.calls) <= c.fails {
		return errors.New("admin unavailable")
	}
	return nil
}

func (c *cordons) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

// POST /drain cordons the proxy (retrying a failed cordon), then answers
// only once the proxy holds no namespace it serves or hands off and every
// unassigned one has been closed and released: a namespace catching up
// does not hold it, one handing off does until it leaves the set.
func TestDrainWaitsForHandoffs(t *testing.T) {
	t.Parallel()
	for _, mode := range []LeaseMode{LeaseModeMailbox, LeaseModeSession} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			cs := &cordons{fails: 1}
			h := newHarness(t, func(c *Config) { c.LeaseMode, c.Cordon = mode, cs.cordon })
			h.assignRoles(1, roled{"a", serving}, roled{"b", serving}, roled{"c", catchingUp})
			h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 3 })
			call := h.postDrain("timeout=1m")
			h.waitFor("a cordon attempt", func() bool { return cs.n() == 1 })
			// The failed cordon is retried after the backoff (1s).
			for cs.n() < 2 {
				h.clk.Step(time.Second)
				time.Sleep(5 * time.Millisecond)
			}
			// The admin switches a away and starts b's handoff tail.
			h.assignRoles(2, roled{"b", handingOff}, roled{"c", catchingUp})
			h.waitEvent(h.waitIndex("runner close a@p1"), releasePrefix(mode, "a@p1"))
			h.applied(2)
			time.Sleep(20 * time.Millisecond)
			if call.answered() {
				t.Fatalf("drain answered %d %s while b@p1 hands off", call.rec.Code, call.rec.Body)
			}
			// b's tail ends; c's move to this cordoned proxy is abandoned.
			h.assignRoles(3)
			h.waitFor("drain answered", call.answered)
			if call.rec.Code != http.StatusOK {
				t.Fatalf("drain %d %s, want 200", call.rec.Code, call.rec.Body)
			}
			res := call.result(t)
			if !res.Cordoned || res.ProxyID != "p1" || !slices.Equal(res.WaitedFor, []string{"a@p1", "b@p1"}) || len(res.Remaining) != 0 {
				t.Fatalf("drain result %+v", res)
			}
			// Answered only after b was closed and released.
			if _, _, ok := h.ev.find(0, releasePrefix(mode, "b@p1")); !ok {
				t.Fatalf("drain answered before b@p1 was released:\n%s", h.ev)
			}
			if cs.calls[0] != "p1" || cs.calls[1] != "p1" {
				t.Fatalf("cordoned %v, want p1", cs.calls)
			}
		})
	}
}

// A drain with nowhere to hand off (the admin says no proxy is placeable)
// waits only for what is already leaving, then answers 200 naming what
// it keeps, which stays served until the runner stops.
func TestDrainWithNowhereToHandOff(t *testing.T) {
	t.Parallel()
	for _, mode := range []LeaseMode{LeaseModeMailbox, LeaseModeSession} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			cs := &cordons{}
			h := newHarness(t, func(c *Config) { c.LeaseMode, c.Cordon = mode, cs.cordon })
			h.assignRoles(1, roled{"a", serving}, roled{"b", handingOff})
			h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 2 })
			call := h.postDrain("timeout=1m")
			h.waitFor("the cordon", func() bool { return cs.n() == 1 })
			nowhere := rolesSet(2, roled{"a", serving}, roled{"b", handingOff})
			nowhere.NoPlaceableProxy = true
			h.admin.assign <- nowhere
			h.applied(2)
			time.Sleep(20 * time.Millisecond)
			if call.answered() {
				t.Fatalf("drain answered %d %s while b@p1 hands off", call.rec.Code, call.rec.Body)
			}
			nowhere = rolesSet(3, roled{"a", serving})
			nowhere.NoPlaceableProxy = true
			h.admin.assign <- nowhere
			h.waitFor("drain answered", call.answered)
			res := call.result(t)
			if call.rec.Code != http.StatusOK || !res.NowhereToHandOff || !slices.Equal(res.Remaining, []string{"a@p1"}) ||
				!slices.Equal(res.WaitedFor, []string{"a@p1", "b@p1"}) || res.Error != "" {
				t.Fatalf("drain %d %+v, want 200 keeping a@p1 for want of a proxy", call.rec.Code, res)
			}
			if v := h.lease("a@p1"); v.State != StateActive {
				t.Fatalf("a@p1 %+v after the drain, want still served until the runner stops", v)
			}
		})
	}
}

// A drain whose namespaces never move answers 504 at its deadline, on the
// agent's clock, naming what is still held; a bad timeout is refused.
func TestDrainDeadline(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assignRoles(1, roled{"a", serving}, roled{"c", catchingUp})
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 2 })
	call := h.postDrain("timeout=30s")
	start := h.clk.Now()
	for !call.answered() {
		if h.clk.Since(start) > time.Minute {
			t.Fatal("drain did not end at its deadline")
		}
		h.clk.Step(time.Second)
		time.Sleep(5 * time.Millisecond)
	}
	if took := h.clk.Since(start); took < 30*time.Second {
		t.Fatalf("drain answered after %v, before its 30s deadline: %d %s", took, call.rec.Code, call.rec.Body)
	}
	res := call.result(t)
	if call.rec.Code != http.StatusGatewayTimeout || res.Cordoned || !slices.Equal(res.Remaining, []string{"a@p1"}) || res.Error == "" {
		t.Fatalf("drain %d %+v, want 504 naming a@p1, not cordoned (no Cordon configured)", call.rec.Code, res)
	}
	if v := h.lease("a@p1"); v.State != StateActive {
		t.Fatalf("a@p1 %+v after a timed-out drain, want still served", v)
	}
	for _, q := range []string{"", "timeout=soon", "timeout=-1s"} {
		bad := h.postDrain(q)
		<-bad.done
		if bad.rec.Code != http.StatusBadRequest {
			t.Fatalf("POST /drain?%s: %d, want 400", q, bad.rec.Code)
		}
	}
}

// Only a caller in the pod may drain: from any other address POST /drain
// is refused and nothing is cordoned or handed off.
func TestDrainOnlyFromLoopback(t *testing.T) {
	t.Parallel()
	for _, peer := range []string{"10.1.2.3:5555", "[2001:db8::1]:5555", "192.0.2.1:1234", "not-an-address"} {
		t.Run(peer, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			cordoned := false
			h.agent.cfg.Cordon = func(context.Context, string) error { cordoned = true; return nil }
			h.assignRoles(1, roled{"a", serving})
			h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 1 })
			req := httptest.NewRequest(http.MethodPost, "/drain?timeout=1s", nil)
			req.RemoteAddr = peer
			rec := httptest.NewRecorder()
			h.agent.Handler().ServeHTTP(rec, req)
			if rec.Code != http.StatusForbidden || cordoned {
				t.Fatalf("POST /drain from %s: %d (cordoned %v), want 403 and nothing cordoned", peer, rec.Code, cordoned)
			}
			if v := h.lease("a@p1"); v.State != StateActive {
				t.Fatalf("a@p1 %+v after a refused drain, want still served", v)
			}
		})
	}
}

// With native sidecars the kubelet stops the sidecar only after the runner
// has exited: once the preStop drain has handed every namespace off, the
// sidecar holds nothing and its stop must succeed without the runner.
func TestStopAfterDrainWithoutRunner(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.assignRoles(1, roled{"a", serving})
	h.waitFor("ready", func() bool { return h.agent.Ready() == nil && len(h.agent.Leases()) == 1 })
	h.assignRoles(2)
	h.waitFor("a handed off: closed in the runner and released", func() bool {
		_, _, closed := h.ev.find(0, "runner close a@p1")
		_, _, released := h.ev.find(0, "admin release")
		return len(h.agent.Leases()) == 0 && closed && released
	})
	h.runner.setDown(true)
	if err := h.stop(); err != nil {
		t.Fatalf("stop with nothing held and the runner gone: %v\n%s", err, h.ev)
	}
	if _, _, ok := h.ev.find(0, "runner down drain"); ok {
		t.Fatalf("the stop asked a gone runner to drain with nothing held:\n%s", h.ev)
	}
}
