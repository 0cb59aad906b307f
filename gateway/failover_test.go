package gateway_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/gateway"
	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/xdstest"
	"github.com/prism-mesh/prism/xds/ir"
)

// failoverMesh is an in-process admin node's xDS side (ADS, the not-found
// service and the namespace lookup) with stand-in runners, and a gateway
// on grpc-go's own xDS client routed by it.
type failoverMesh struct {
	cp      *xdstest.ControlPlane
	runners map[string]*xdstest.Runner // by proxy id
	url     string
	query   mailboxv1.MailboxQueryClient // the gateway's gRPC front door
}

func startFailoverMesh(t *testing.T, proxies ...string) *failoverMesh {
	t.Helper()
	cp, err := xdstest.StartControlPlane(quiet(), time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	m := &failoverMesh{cp: cp, runners: map[string]*xdstest.Runner{}}
	x := &ir.IR{Version: 1, Gateway: ir.Gateway{Address: "127.0.0.1:8080"}, Admins: []string{cp.Addr}, Lookup: "dns:///" + cp.Addr}
	for _, p := range proxies {
		r, err := xdstest.StartRunner("runner-" + p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		m.runners[p] = r
		x.Proxies = append(x.Proxies, ir.Proxy{ID: p, RunnerID: r.ID, Address: r.Addr, Healthy: true})
	}
	cp.Update(x)
	boot, err := gateway.Bootstrap([]string{cp.Addr}, "gateway-"+t.Name(), nil)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{Bootstrap: boot, Timeout: upstreamTimeout, ProbeInterval: 20 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	hs := httptest.NewServer(gw.HTTPHandler())
	t.Cleanup(hs.Close)
	m.url = hs.URL
	gs := grpc.NewServer()
	gw.RegisterGRPC(gs)
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(gl) }()
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	m.query = mailboxv1.NewMailboxQueryClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := gw.Run(ctx); err != nil {
		t.Fatalf("gateway never got its routes: %v", err)
	}
	return m
}

// served asks path's stats through the gateway: the HTTP status and the
// mailbox that answered.
func (m *failoverMesh) served(t *testing.T, path string) (int, string) {
	t.Helper()
	r := get(t, m.url+path+"/stats")
	var st struct {
		MailboxID string `json:"mailbox_id"`
	}
	_ = json.Unmarshal([]byte(r.body), &st)
	return r.code, st.MailboxID
}

// servedGRPC asks namespace ns's stats through the gateway's gRPC front
// door: the code and the mailbox that answered.
func (m *failoverMesh) servedGRPC(ns string) (codes.Code, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := m.query.GetStats(metadata.AppendToOutgoingContext(ctx, mesh.HeaderNamespace, ns), &mailboxv1.GetStatsRequest{})
	return status.Code(err), resp.GetStats().GetMailboxId()
}

// TestRunnerBackOnItsAddressIsAnsweredAtOnce: a runner restarts on its
// address (the same endpoint, so xDS sends nothing) while a client queries
// it through the gateway every 10 ms; the gateway reconnects within a few
// hundred milliseconds of the runner listening again, not after grpc-go's
// default one-second connect backoff, and queries sent while it is down
// wait for it within the retry window instead of failing at once.
func TestRunnerBackOnItsAddressIsAnsweredAtOnce(t *testing.T) {
	t.Parallel()
	m := startFailoverMesh(t, "proxy-a")
	r := m.runners["proxy-a"]
	r.Hold("audit@proxy-a")
	waitFor(t, "audit@proxy-a served", func() (bool, string) {
		code, mb := m.served(t, "/v1/mailboxes/audit@proxy-a")
		return code == 200 && mb == "audit@proxy-a", mb
	})

	type answer struct {
		end  time.Time
		code int
	}
	var (
		mu      sync.Mutex
		answers []answer
	)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			code, _ := m.served(t, "/v1/mailboxes/audit@proxy-a")
			mu.Lock()
			answers = append(answers, answer{end: time.Now(), code: code})
			mu.Unlock()
		}
	}()

	r.Close()
	down := time.Now()
	// The runner stays down long enough for grpc-go's connect backoff to
	// matter: several refused connects.
	time.Sleep(400 * time.Millisecond)
	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	firstAfter := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		for _, a := range answers {
			if a.code == 200 && a.end.After(back) {
				return a.end
			}
		}
		return time.Time{}
	}
	waitFor(t, "a query answered after the restart", func() (bool, string) { return !firstAfter().IsZero(), "" })
	// A second of steady queries after it is back.
	time.Sleep(time.Second)
	close(stop)
	<-done
	failed, total := 0, 0
	for _, a := range answers {
		if a.end.After(down) {
			total++
			if a.code != 200 {
				failed++
			}
		}
	}
	late := firstAfter().Sub(back)
	t.Logf("runner down %v; first answer %v after it listened again; %d of %d queries since the stop failed", back.Sub(down).Round(time.Millisecond), late.Round(time.Millisecond), failed, total)
	if late > 400*time.Millisecond {
		t.Errorf("the runner back on its address was answered %v after it listened again, want within 400ms", late)
	}
}

// TestNamespaceAnsweredOnceItsLeaseIsGranted: a namespace with no lease is
// answered 404 (the admin nodes' NotFound, which grpc-go's lookup cache
// keeps); once its lease is granted and its runner serves it, the very next
// query is answered by it: the 404's retry takes a fresh lookup.
func TestNamespaceAnsweredOnceItsLeaseIsGranted(t *testing.T) {
	t.Parallel()
	m := startFailoverMesh(t, "proxy-a")
	waitFor(t, "fresh not routed", func() (bool, string) {
		code, mb := m.served(t, "/v1/namespaces/fresh")
		return code == 404, mb
	})
	m.runners["proxy-a"].Hold("fresh@proxy-a")
	m.cp.Namespaces.Set("fresh", "fresh@proxy-a", 7)
	if code, mb := m.served(t, "/v1/namespaces/fresh"); code != 200 || mb != "fresh@proxy-a" {
		t.Fatalf("the first query after the grant: %d from %q, want 200 from fresh@proxy-a", code, mb)
	}
}

// TestNamespaceRetriedThroughAFreshLookup: a namespace query whose runner
// just went away, or no longer holds the namespace's mailbox, while its
// lease went to another proxy, is answered by the new holder without an
// error to the client, though grpc-go's cached lookup still names the old
// one (the query comes right after one the old holder answered); through
// either front door.
func TestNamespaceRetriedThroughAFreshLookup(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		gone func(old *xdstest.Runner)
	}{
		{"runner stopped", func(old *xdstest.Runner) { old.Close() }},
		{"mailbox closed", func(old *xdstest.Runner) { old.Release("audit@proxy-a") }},
	} {
		for _, door := range []string{"http", "grpc"} {
			t.Run(tc.name+" "+door, func(t *testing.T) {
				t.Parallel()
				m := startFailoverMesh(t, "proxy-a", "proxy-b")
				ask := func() (bool, string) {
					if door == "grpc" {
						code, mb := m.servedGRPC("audit")
						return code == codes.OK, mb
					}
					code, mb := m.served(t, "/v1/namespaces/audit")
					return code == 200, mb
				}
				m.runners["proxy-a"].Hold("audit@proxy-a")
				m.cp.Namespaces.Set("audit", "audit@proxy-a", 3)
				waitFor(t, "audit served by proxy-a", func() (bool, string) {
					ok, mb := ask()
					return ok && mb == "audit@proxy-a", mb
				})
				tc.gone(m.runners["proxy-a"])
				m.runners["proxy-b"].Hold("audit@proxy-b")
				m.cp.Namespaces.Set("audit", "audit@proxy-b", 9)
				if ok, mb := ask(); !ok || mb != "audit@proxy-b" {
					t.Fatalf("the first query after the move: answered %v by %q, want audit@proxy-b", ok, mb)
				}
			})
		}
	}
}

// TestNamespaceFailsOverToAnInSyncReplica: a replicated namespace whose
// serving runner refuses (Unavailable) or cannot be reached is answered,
// within the same request and through either front door, by its in-sync
// replica, though the lookup still names the serving mailbox first (as the
// FSM does until its lease ends); a namespace whose only copy refuses
// stays Unavailable.
func TestNamespaceFailsOverToAnInSyncReplica(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fail func(r *xdstest.Runner)
	}{
		{"serving runner refuses", func(r *xdstest.Runner) { r.Refuse(true) }},
		{"serving runner gone", func(r *xdstest.Runner) { r.Close() }},
	} {
		for _, door := range []string{"http", "grpc"} {
			t.Run(tc.name+" "+door, func(t *testing.T) {
				t.Parallel()
				m := startFailoverMesh(t, "proxy-a", "proxy-b", "proxy-c")
				ask := func(ns string) (bool, string) {
					if door == "grpc" {
						code, mb := m.servedGRPC(ns)
						return code == codes.OK, mb
					}
					code, mb := m.served(t, "/v1/namespaces/"+ns)
					return code == 200, mb
				}
				m.runners["proxy-a"].Hold("orders@proxy-a", "single@proxy-a")
				m.runners["proxy-c"].Hold("orders@proxy-c")
				m.runners["proxy-b"].Hold("orders@proxy-b")
				m.cp.Namespaces.SetReplicas("orders", "orders@proxy-a", 3, "orders@proxy-c", "orders@proxy-b")
				m.cp.Namespaces.Set("single", "single@proxy-a", 3)
				waitFor(t, "orders served by proxy-a", func() (bool, string) {
					ok, mb := ask("orders")
					return ok && mb == "orders@proxy-a", mb
				})
				waitFor(t, "single served by proxy-a", func() (bool, string) {
					ok, mb := ask("single")
					return ok && mb == "single@proxy-a", mb
				})
				tc.fail(m.runners["proxy-a"])
				for i := range 5 {
					if ok, mb := ask("orders"); !ok || mb != "orders@proxy-c" {
						t.Fatalf("query %d after proxy-a failed: answered %v by %q, want the first in-sync replica orders@proxy-c", i, ok, mb)
					}
				}
				if ok, mb := ask("single"); ok {
					t.Fatalf("a namespace with one copy was answered by %q with its runner failed", mb)
				}
			})
		}
	}
}
