package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

func openSession(proxy, runner string) *adminv1.OpenSessionRequest {
	return &adminv1.OpenSessionRequest{ProxyId: proxy, RunnerId: runner, RunnerAddress: runner + ".svc:9090", Ttl: durationpb.New(15 * time.Second)}
}

// sessionFixture is one FSM with proxies p1 and p2 registered and, for each,
// n namespaces placed on it.
type sessionFixture struct {
	h   *harness
	mbx map[string][]string // proxy -> its mailbox ids
}

func newSessionFixture(t testing.TB, n int) *sessionFixture {
	fx := &sessionFixture{h: newHarness(t), mbx: map[string][]string{}}
	live := []string{"p1", "p2"}
	for _, p := range live {
		fx.h.must(c(0, register(p)))
	}
	for i := 0; len(fx.mbx["p1"]) < n || len(fx.mbx["p2"]) < n; i++ {
		ns := fmt.Sprintf("ns-%d", i)
		p := ownerOf(ns, live...)
		if len(fx.mbx[p]) >= n {
			continue
		}
		fx.h.must(c(0, createNS(ns, "t")))
		fx.mbx[p] = append(fx.mbx[p], ns+"@"+p)
	}
	return fx
}

func (fx *sessionFixture) open(proxy string) uint64 {
	r := fx.h.must(c(0, openSession(proxy, proxy))).(*adminv1.OpenSessionResponse)
	if r.GetSession().GetId() == 0 {
		fx.h.t.Fatalf("open session for %s: %v", proxy, r.GetRefusal())
	}
	return r.GetSession().GetId()
}

func (fx *sessionFixture) acquire(proxy string, sid uint64, mids ...string) *adminv1.AcquireLeasesResponse {
	return fx.h.must(c(time.Second, &adminv1.AcquireLeasesRequest{ProxyId: proxy, SessionId: sid, MailboxIds: mids})).(*adminv1.AcquireLeasesResponse)
}

// A proxy with 1,000 mailboxes gets all their leases from one log entry,
// each with its own epoch, consecutive, above every earlier token and below
// every later grant's, and the routes change once, at that entry.
func TestBulkGrantOfAThousandIsOneEntry(t *testing.T) {
	t.Parallel()
	fx := newSessionFixture(t, 1000)
	sid := fx.open("p1")
	before := fx.h.f.AppliedIndex()
	r := fx.acquire("p1", sid, fx.mbx["p1"]...)
	if got := fx.h.f.AppliedIndex(); got != before+1 {
		t.Fatalf("applied index %d -> %d: want one entry", before, got)
	}
	if fx.h.f.RoutesIndex() != r.GetIndex() {
		t.Fatalf("routes index %d, want the grant's %d", fx.h.f.RoutesIndex(), r.GetIndex())
	}
	if len(r.GetResults()) != 1000 {
		t.Fatalf("%d results, want 1000", len(r.GetResults()))
	}
	var epochs []uint64
	for i, res := range r.GetResults() {
		if !res.GetOk() || res.GetMailboxId() != fx.mbx["p1"][i] || res.GetLease().GetSessionId() != sid {
			t.Fatalf("result %d: %v", i, res)
		}
		epochs = append(epochs, res.GetLease().GetEpoch())
	}
	for i := 1; i < len(epochs); i++ {
		if epochs[i] != epochs[i-1]+1 {
			t.Fatalf("epochs %d and %d of one grant: %d, %d; want consecutive", i-1, i, epochs[i-1], epochs[i])
		}
	}
	if epochs[0] <= sid {
		t.Fatalf("first epoch %d not above the session id %d", epochs[0], sid)
	}
	one := fx.h.must(c(2*time.Second, acquire(fx.mbx["p2"][0], "p2"))).(*adminv1.AcquireLeaseResponse)
	if !one.GetGranted() || one.GetLease().GetEpoch() <= epochs[len(epochs)-1] {
		t.Fatalf("next single grant: epoch %d, want above %d", one.GetLease().GetEpoch(), epochs[len(epochs)-1])
	}
	if got := fx.h.f.Counts().Leases; got != 1001 {
		t.Fatalf("%d leases, want 1001", got)
	}
	if s, _ := fx.h.f.Session(sid); s.GetLeaseCount() != 1000 {
		t.Fatalf("session lease count %d, want 1000", s.GetLeaseCount())
	}
}

// Closing or expiring a session removes exactly its leases, in one entry:
// not another session's, not a per-mailbox lease of the same runner.
func TestSessionEndRemovesExactlyItsLeases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		end  func(sid uint64) any
	}{
		{"close", func(sid uint64) any { return &adminv1.CloseSessionRequest{ProxyId: "p1", SessionId: sid} }},
		{"expire", func(sid uint64) any { return &adminv1.ExpireSessionsCommand{SessionIds: []uint64{sid}} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fx := newSessionFixture(t, 4)
			s1 := fx.open("p1")
			s2 := fx.open("p2")
			fx.acquire("p1", s1, fx.mbx["p1"][:3]...)
			fx.acquire("p2", s2, fx.mbx["p2"]...)
			fx.h.must(c(time.Second, acquire(fx.mbx["p1"][3], "p1")))
			if got := mailboxIDs(fx.h.f.SessionLeases(s1)); !slices.Equal(got, slices.Sorted(slices.Values(fx.mbx["p1"][:3]))) {
				t.Fatalf("session %d's leases %v, want %v", s1, got, fx.mbx["p1"][:3])
			}
			before := fx.h.f.AppliedIndex()
			res := fx.h.must(c(2*time.Second, tc.end(s1)))
			if got := fx.h.f.AppliedIndex(); got != before+1 || fx.h.f.RoutesIndex() != got {
				t.Fatalf("applied %d -> %d, routes index %d: want one entry changing routes", before, got, fx.h.f.RoutesIndex())
			}
			switch r := res.(type) {
			case *adminv1.CloseSessionResponse:
				if !r.GetClosed() || r.GetLeasesReleased() != 3 {
					t.Fatalf("close: %v", r)
				}
			case *ExpireSessionsResult:
				if len(r.Sessions) != 1 || len(r.Leases) != 3 {
					t.Fatalf("expire: %d sessions, %d leases", len(r.Sessions), len(r.Leases))
				}
			}
			ls, _ := fx.h.f.Leases()
			var left []string
			for _, l := range ls {
				left = append(left, l.GetMailboxId())
			}
			want := append([]string{fx.mbx["p1"][3]}, fx.mbx["p2"]...)
			slices.Sort(want)
			if !slices.Equal(left, want) {
				t.Fatalf("leases left %v, want %v", left, want)
			}
			if s, _ := fx.h.f.Session(s1); s != nil {
				t.Fatalf("session %d still open", s1)
			}
			if got := mailboxIDs(fx.h.f.SessionLeases(s1)); len(got) != 0 {
				t.Fatalf("ended session %d still lists leases %v", s1, got)
			}
			if got := fx.h.f.ProxyLeases("p1"); got != 1 {
				t.Fatalf("p1 lease count %d, want 1", got)
			}
			// Ending it again changes nothing.
			again := tables(t, fx.h.f)
			fx.h.must(c(3*time.Second, tc.end(s1)))
			if !bytes.Equal(again, tables(t, fx.h.f)) {
				t.Fatal("ending an ended session changed the state")
			}
		})
	}
}

// Refusals of the session commands leave the state as it was.
func TestSessionRefusalsChangeNothing(t *testing.T) {
	t.Parallel()
	fx := newSessionFixture(t, 2)
	s1 := fx.open("p1")
	s2 := fx.open("p2")
	fx.h.must(c(0, acquire(fx.mbx["p1"][1], "p1")))
	for _, tc := range []struct {
		name    string
		body    any
		wantErr error
		check   func(t *testing.T, res any)
	}{
		{"open for an unregistered proxy", openSession("p9", "p9"), ErrProxyNotFound, nil},
		{"open as another runner", openSession("p1", "intruder"), nil, func(t *testing.T, res any) {
			if r := res.(*adminv1.OpenSessionResponse); r.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NOT_PROXY_RUNNER {
				t.Fatalf("got %v", r)
			}
		}},
		{"acquire in another proxy's session", &adminv1.AcquireLeasesRequest{ProxyId: "p1", SessionId: s2, MailboxIds: fx.mbx["p1"][:1]}, ErrSessionNotOwned, nil},
		{"release in another proxy's session", &adminv1.ReleaseLeasesRequest{ProxyId: "p1", SessionId: s2, MailboxIds: fx.mbx["p1"][:1]}, ErrSessionNotOwned, nil},
		{"close another proxy's session", &adminv1.CloseSessionRequest{ProxyId: "p1", SessionId: s2}, ErrSessionNotOwned, nil},
		{"acquire another proxy's mailbox", &adminv1.AcquireLeasesRequest{ProxyId: "p1", SessionId: s1, MailboxIds: fx.mbx["p2"][:1]}, ErrInvalid, nil},
		{"acquire a mailbox twice", &adminv1.AcquireLeasesRequest{ProxyId: "p1", SessionId: s1, MailboxIds: []string{fx.mbx["p1"][0], fx.mbx["p1"][0]}}, ErrInvalid, nil},
		{"acquire in an unknown session", &adminv1.AcquireLeasesRequest{ProxyId: "p1", SessionId: 12345, MailboxIds: fx.mbx["p1"][:1]}, nil, func(t *testing.T, res any) {
			if r := res.(*adminv1.AcquireLeasesResponse); r.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_SESSION || len(r.GetResults()) != 0 {
				t.Fatalf("got %v", r)
			}
		}},
		{"release a lease held outside the session", &adminv1.ReleaseLeasesRequest{ProxyId: "p1", SessionId: s1, MailboxIds: fx.mbx["p1"][1:2]}, nil, func(t *testing.T, res any) {
			r := res.(*adminv1.ReleaseLeasesResponse).GetResults()[0]
			if r.GetOk() || r.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_UNKNOWN_SESSION || r.GetRefusal().GetCurrent().GetSessionId() != 0 {
				t.Fatalf("got %v", r)
			}
		}},
		{"acquire a mailbox of a missing namespace", &adminv1.AcquireLeasesRequest{ProxyId: "p1", SessionId: s1, MailboxIds: []string{"nope@p1"}}, nil, func(t *testing.T, res any) {
			r := res.(*adminv1.AcquireLeasesResponse).GetResults()[0]
			if r.GetOk() || r.GetRefusal().GetReason() != adminv1.LeaseRefusalReason_LEASE_REFUSAL_REASON_NAMESPACE_NOT_FOUND {
				t.Fatalf("got %v", r)
			}
		}},
	} {
		before := tables(t, fx.h.f)
		res := fx.h.apply(c(time.Second, tc.body))
		err, _ := res.(error)
		if tc.wantErr != nil {
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("%s: got %v, want %v", tc.name, res, tc.wantErr)
			}
		} else {
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			tc.check(t, res)
		}
		if !bytes.Equal(before, tables(t, fx.h.f)) {
			t.Fatalf("%s changed the state", tc.name)
		}
	}
}

// A lease held by another runner is refused per mailbox while the rest of
// the bulk grant goes through; the session's runner takes over its own
// per-mailbox lease (a reconnect, with a new epoch).
func TestBulkGrantMixesGrantsAndRefusals(t *testing.T) {
	t.Parallel()
	fx := newSessionFixture(t, 3)
	fx.h.must(c(0, registerRunner("p1", "r1")))
	prev := fx.h.must(c(0, acquire(fx.mbx["p1"][0], "r1"))).(*adminv1.AcquireLeaseResponse)
	fx.h.must(c(0, registerRunner("p1", "r2")))
	fx.h.must(c(0, acquire(fx.mbx["p1"][1], "r2")))
	sid := fx.h.must(c(0, openSession("p1", "r2"))).(*adminv1.OpenSessionResponse).GetSession().GetId()
	r := fx.acquire("p1", sid, fx.mbx["p1"]...)
	got := make([]string, 0, 3)
	for _, res := range r.GetResults() {
		got = append(got, fmt.Sprint(res.GetOk(), res.GetRefusal().GetReason()))
	}
	want := []string{"false LEASE_REFUSAL_REASON_HELD_BY_OTHER", "true LEASE_REFUSAL_REASON_UNSPECIFIED", "true LEASE_REFUSAL_REASON_UNSPECIFIED"}
	if !slices.Equal(got, want) {
		t.Fatalf("results %v, want %v", got, want)
	}
	if r.GetResults()[0].GetRefusal().GetCurrent().GetEpoch() != prev.GetLease().GetEpoch() {
		t.Fatal("refusal does not name the holder's grant")
	}
	if s, _ := fx.h.f.Session(sid); s.GetLeaseCount() != 2 {
		t.Fatalf("session holds %d leases, want 2", s.GetLeaseCount())
	}
}

// Whatever the sequence of bulk grants, single grants, releases, session
// closes and expiries, lease expiries, snapshot restores and elections
// (new terms): no two grants ever share an epoch, each grant's epoch is
// above every earlier one (so a mailbox's epochs only rise), and the
// per-session and per-proxy counts equal a recount of the lease table.
func TestEpochsRiseAcrossBulkGrants(t *testing.T) {
	t.Parallel()
	for seed := range uint64(12) {
		rng := rand.New(rand.NewPCG(seed, 20))
		fx := newSessionFixture(t, 12)
		h := fx.h
		h.term = 1
		var highest uint64
		seen := map[uint64]bool{}
		check := func(op string, ls ...*adminv1.Lease) {
			t.Helper()
			for _, l := range ls {
				e := l.GetEpoch()
				if seen[e] || e <= highest {
					t.Fatalf("seed %d %s: epoch %d of %s reused or not above %d", seed, op, e, l.GetMailboxId(), highest)
				}
				seen[e] = true
				highest = e
			}
		}
		sessions := map[string][]uint64{}
		pick := func(xs []string, n int) []string {
			out := slices.Clone(xs)
			rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
			return out[:1+rng.IntN(n)]
		}
		for step := range 300 {
			p := []string{"p1", "p2"}[rng.IntN(2)]
			d := time.Duration(step) * time.Second
			var sid uint64
			if ss := sessions[p]; len(ss) > 0 {
				sid = ss[rng.IntN(len(ss))]
			}
			switch r := rng.IntN(100); {
			case r < 10 || sid == 0:
				res := h.must(c(d, openSession(p, p))).(*adminv1.OpenSessionResponse)
				if id := res.GetSession().GetId(); id <= highest || seen[id] {
					t.Fatalf("seed %d: session id %d not above %d", seed, id, highest)
				} else {
					seen[id], highest = true, id
				}
				sessions[p] = append(sessions[p], res.GetSession().GetId())
			case r < 40:
				res := h.must(c(d, &adminv1.AcquireLeasesRequest{ProxyId: p, SessionId: sid, MailboxIds: pick(fx.mbx[p], 12)})).(*adminv1.AcquireLeasesResponse)
				for _, x := range res.GetResults() {
					if x.GetOk() {
						check("bulk", x.GetLease())
					}
				}
			case r < 55:
				res := h.must(c(d, acquire(pick(fx.mbx[p], 1)[0], p))).(*adminv1.AcquireLeaseResponse)
				if res.GetGranted() {
					check("single", res.GetLease())
				}
			case r < 65:
				h.must(c(d, &adminv1.ReleaseLeasesRequest{ProxyId: p, SessionId: sid, MailboxIds: pick(fx.mbx[p], 6)}))
			case r < 72:
				h.must(c(d, &adminv1.CloseSessionRequest{ProxyId: p, SessionId: sid}))
				sessions[p] = slices.DeleteFunc(sessions[p], func(x uint64) bool { return x == sid })
			case r < 80:
				h.must(c(d, &adminv1.ExpireSessionsCommand{SessionIds: []uint64{sid}}))
				sessions[p] = slices.DeleteFunc(sessions[p], func(x uint64) bool { return x == sid })
			case r < 86:
				if ls, _ := h.f.Leases(); len(ls) > 0 {
					l := ls[rng.IntN(len(ls))]
					h.must(c(d, &adminv1.ExpireLeasesCommand{Leases: []*adminv1.LeaseRef{{MailboxId: l.GetMailboxId(), Epoch: l.GetEpoch()}}}))
				}
			case r < 93:
				g := New()
				if err := g.Restore(io.NopCloser(bytes.NewReader(dump(t, h.f)))); err != nil {
					t.Fatal(err)
				}
				g.applied = h.f.AppliedIndex()
				h.f = g
			default:
				h.term++
			}
			ls, _ := h.f.Leases()
			if !equalCounts(h.f.st.sessionLeases, countSessionLeases(h.f.st.leases)) {
				t.Fatalf("seed %d step %d: session lease sets differ from a recount", seed, step)
			}
			for sid := range h.f.st.sessionLeases {
				if _, ok := h.f.st.sessions[sid]; !ok {
					t.Fatalf("seed %d step %d: leases of closed session %d remain", seed, step, sid)
				}
			}
			if got := h.f.Counts().Leases; got != len(ls) {
				t.Fatalf("seed %d step %d: count %d, table %d", seed, step, got, len(ls))
			}
		}
	}
}

func equalCounts(a, b map[uint64]map[string]struct{}) bool {
	if len(a) != len(b) {
		return false
	}
	for k, x := range a {
		if len(x) != len(b[k]) {
			return false
		}
		for m := range x {
			if _, ok := b[k][m]; !ok {
				return false
			}
		}
	}
	return true
}

// Sessions, their leases and the epoch high water survive a snapshot: the
// restored FSM answers alike and grants the next epoch above the bulk grant
// exactly as the original does.
func TestSessionSnapshotRoundTrip(t *testing.T) {
	t.Parallel()
	fx := newSessionFixture(t, 5)
	s1 := fx.open("p1")
	fx.open("p2")
	bulk := fx.acquire("p1", s1, fx.mbx["p1"]...).GetResults()
	top := bulk[len(bulk)-1].GetLease().GetEpoch()
	g := roundTrip(t, fx.h.f)
	if got := g.Counts().Sessions; got != 2 {
		t.Fatalf("%d sessions restored, want 2", got)
	}
	if s, _ := g.Session(s1); s.GetLeaseCount() != 5 {
		t.Fatalf("restored session holds %d leases, want 5", s.GetLeaseCount())
	}
	// The next entry lands at the next index: with the high water lost it
	// would get an epoch inside the bulk grant's range.
	h2 := &harness{t: t, f: g, index: fx.h.index}
	next := c(time.Minute, acquire(fx.mbx["p2"][0], "p2"))
	a := fx.h.must(next).(*adminv1.AcquireLeaseResponse)
	b := h2.must(next).(*adminv1.AcquireLeaseResponse)
	if a.GetLease().GetEpoch() != b.GetLease().GetEpoch() {
		t.Fatalf("epoch after restore %d, without %d", b.GetLease().GetEpoch(), a.GetLease().GetEpoch())
	}
	if a.GetLease().GetEpoch() <= top {
		t.Fatalf("epoch %d not above the bulk grant's %d", a.GetLease().GetEpoch(), top)
	}
	// Ending the session on the restored FSM finds its leases.
	h2.must(c(time.Minute, &adminv1.CloseSessionRequest{ProxyId: "p1", SessionId: s1}))
	if got := g.ProxyLeases("p1"); got != 0 {
		t.Fatalf("p1 holds %d leases after close on the restored FSM", got)
	}
}

func mailboxIDs(ls []*adminv1.Lease, _ uint64) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.GetMailboxId())
	}
	return out
}
