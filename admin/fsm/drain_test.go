package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// registerAs registers proxy id from the sidecar process instance.
func registerAs(id, instance string) *adminv1.RegisterProxyRequest {
	r := register(id)
	r.Registration.Instance = instance
	return r
}

func drain(id, instance string) *adminv1.DrainProxyRequest {
	return &adminv1.DrainProxyRequest{ProxyId: id, Instance: instance}
}

// drainedHarness is movesHarness with p2 registered by sidecar process
// "a" and drained by it; it returns the namespaces p2 held.
func drainedHarness(t *testing.T) (*harness, []string) {
	t.Helper()
	h := movesHarness(t, 30)
	h.must(c(time.Minute, registerAs("p2", "a")))
	var onP2 []string
	for name, a := range assignedTo(h) {
		if a == "p2" {
			onP2 = append(onP2, name)
		}
	}
	if len(onP2) == 0 {
		t.Fatal("p2 holds no namespace; the test needs some")
	}
	res := h.must(c(time.Minute, drain("p2", "a"))).(*adminv1.DrainProxyResponse)
	if !res.GetDrained() || res.GetProxy().GetDrainingInstance() != "a" || res.GetProxy().GetCordoned() {
		t.Fatalf("drain p2: %v", res)
	}
	return h, onP2
}

// pendingOn is how many namespaces assigned to proxy wait to move off it.
func pendingOn(h *harness, proxy string) int {
	n := 0
	for _, name := range h.f.st.pendingMoves() {
		if h.f.st.namespaces[name].GetAssignedProxyId() == proxy {
			n++
		}
	}
	return n
}

// A proxy's own drain acts as a cordon: its namespaces move off by handoff
// (reason DRAIN), nothing new is placed on it, and no move may go to it.
func TestDrainProxyMovesNamespacesOff(t *testing.T) {
	t.Parallel()
	h, onP2 := drainedHarness(t)
	if got := pendingOn(h, "p2"); got != len(onP2) {
		t.Fatalf("%d of p2's %d namespaces wait to move off", got, len(onP2))
	}
	res := h.must(c(time.Minute, &adminv1.RebalanceCommand{MaxConcurrentMoves: 100})).(*RebalanceResult)
	if len(res.Started) != len(onP2) {
		t.Fatalf("started %d moves, p2 had %d namespaces", len(res.Started), len(onP2))
	}
	for _, name := range onP2 {
		if n, _, _ := h.f.Namespace(name); n.GetMoveReason() != adminv1.MoveReason_MOVE_REASON_DRAIN || n.GetIncomingProxyId() == "p2" {
			t.Fatalf("%s: %v, want a drain move off p2", name, n)
		}
	}
	if got := h.must(c(time.Minute, createNS("new-one", "t"))).(*adminv1.CreateNamespaceResponse); got.GetNamespace().GetAssignedProxyId() == "p2" {
		t.Fatal("a draining proxy got a new namespace")
	}
	var onP1 string
	for name, a := range assignedTo(h) {
		if a == "p1" {
			onP1 = name
			break
		}
	}
	r := h.must(c(time.Minute, &adminv1.StartMoveCommand{Namespace: onP1, ToProxyId: "p2"})).(*MoveResult)
	if r.Applied {
		t.Fatal("a move to a draining proxy started")
	}
	finishMoves(h, 2*time.Minute)
	finishMoves(h, 2*time.Minute)
	if info, _ := h.f.Proxy("p2"); len(info.GetNamespaces()) != 0 {
		t.Fatalf("drained p2 still holds %v", info.GetNamespaces())
	}
}

// The drain lasts as long as the sidecar process that asked: the same
// instance registering again (an admin failover) keeps it; another one, or
// a sidecar that names none, ends it and the proxy takes its partitions
// back; an operator's cordon outlives both.
func TestDrainProxyEndsWithItsInstance(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		cordoned  bool
		instance  string
		draining  bool
		placeable bool
	}{
		{"same instance keeps the drain", false, "a", true, false},
		{"new instance ends the drain", false, "b", false, true},
		{"sidecar without an instance ends the drain", false, "", false, true},
		{"new instance leaves the cordon", true, "b", false, false},
		{"same instance keeps both", true, "a", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h, onP2 := drainedHarness(t)
			if tc.cordoned {
				h.must(c(time.Minute, &adminv1.CordonProxyCommand{ProxyId: "p2", Cordoned: true}))
			}
			res := h.must(c(2*time.Minute, registerAs("p2", tc.instance))).(*adminv1.RegisterProxyResponse)
			if got := res.GetProxy().GetDrainingInstance() != ""; got != tc.draining {
				t.Fatalf("draining after registering %q = %t, want %t (%v)", tc.instance, got, tc.draining, res.GetProxy())
			}
			if res.GetProxy().GetCordoned() != tc.cordoned {
				t.Fatalf("cordoned = %t, want %t", res.GetProxy().GetCordoned(), tc.cordoned)
			}
			if got := placeable(res.GetProxy()); got != tc.placeable {
				t.Fatalf("placeable = %t, want %t", got, tc.placeable)
			}
			// Nothing moved yet: the namespaces that waited to leave p2
			// wait no more once it is placeable again.
			want := len(onP2)
			if tc.placeable {
				want = 0
			}
			if got := pendingOn(h, "p2"); got != want {
				t.Fatalf("%d namespaces wait to move off p2, want %d", got, want)
			}
		})
	}
}

// Draining again for the same instance is a retry that changes nothing;
// a drain from another instance or of an unknown proxy is refused and
// changes nothing either.
func TestDrainProxyRefusals(t *testing.T) {
	t.Parallel()
	h, _ := drainedHarness(t)
	before := tables(t, h.f)
	res := h.must(c(3*time.Minute, drain("p2", "a"))).(*adminv1.DrainProxyResponse)
	if res.GetDrained() || res.GetProxy().GetDrainingInstance() != "a" {
		t.Fatalf("drain again: %v, want drained=false", res)
	}
	for _, tc := range []struct {
		name string
		req  *adminv1.DrainProxyRequest
		want error
	}{
		{"another instance", drain("p1", "x"), ErrNotRegisteredInstance},
		{"a superseded instance", drain("p2", "old"), ErrNotRegisteredInstance},
		{"an unknown proxy", drain("p9", "a"), ErrProxyNotFound},
		{"no instance", drain("p1", ""), ErrInvalid},
	} {
		err, _ := h.apply(c(3*time.Minute, tc.req)).(error)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if !bytes.Equal(before, tables(t, h.f)) {
		t.Fatal("a retried or refused drain changed the state")
	}
}

// The drain survives a snapshot, and every replica applies it alike.
func TestDrainProxySnapshotted(t *testing.T) {
	t.Parallel()
	h, _ := drainedHarness(t)
	g, _ := drainedHarness(t)
	if !bytes.Equal(dump(t, h.f), dump(t, g.f)) {
		t.Fatal("two replicas applying the same commands differ")
	}
	r := roundTrip(t, h.f)
	if p, _ := r.Proxy("p2"); p.GetProxy().GetDrainingInstance() != "a" {
		t.Fatalf("restored p2: %v", p.GetProxy())
	}
	if fmt.Sprint(r.st.pendingMoves()) != fmt.Sprint(h.f.st.pendingMoves()) {
		t.Fatal("restored placement differs")
	}
}

// A watch says when no proxy can take a namespace, so a draining proxy's
// sidecar stops waiting for handoffs that cannot start: it turns true once
// the last placeable proxy drains, and false again when one comes back.
func TestAssignmentsSayWhenNoProxyIsPlaceable(t *testing.T) {
	t.Parallel()
	h, _ := drainedHarness(t)
	nowhere := func() bool {
		t.Helper()
		a, _ := h.f.Assignments("p2")
		return a.GetNoPlaceableProxy()
	}
	if nowhere() {
		t.Fatal("p1 and p3 take namespaces, yet p2's watch says no proxy is placeable")
	}
	for _, p := range []string{"p1", "p3"} {
		h.must(c(time.Minute, registerAs(p, "i-"+p)))
		h.must(c(time.Minute, drain(p, "i-"+p)))
	}
	if !nowhere() {
		t.Fatal("every proxy drains, yet p2's watch says some proxy is placeable")
	}
	h.must(c(time.Minute, registerAs("p3", "next")))
	if nowhere() {
		t.Fatal("p3's next sidecar ended its drain, yet p2's watch says no proxy is placeable")
	}
}
