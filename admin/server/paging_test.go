package server

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// lister asks for one page of a List call and names its items by key.
type lister func(size int32, token string) (keys []string, next string, err error)

// listers are the List calls, one lister each, with the filters given.
func listers(adm adminv1.AdminClient, t *testing.T) map[string]lister {
	c := ctx(t)
	return map[string]lister{
		"namespaces": func(size int32, tok string) ([]string, string, error) {
			r, err := adm.ListNamespaces(c, &adminv1.ListNamespacesRequest{PageSize: size, PageToken: tok})
			var keys []string
			for _, n := range r.GetNamespaces() {
				keys = append(keys, n.GetName())
			}
			return keys, r.GetNextPageToken(), err
		},
		"proxies": func(size int32, tok string) ([]string, string, error) {
			r, err := adm.ListProxies(c, &adminv1.ListProxiesRequest{PageSize: size, PageToken: tok, Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
			var keys []string
			for _, p := range r.GetProxies() {
				keys = append(keys, p.GetProxy().GetRegistration().GetProxyId())
			}
			return keys, r.GetNextPageToken(), err
		},
		"leases":       leaseLister(c, adm, "", ""),
		"leases of p1": leaseLister(c, adm, "", "p1"),
		"sessions": func(size int32, tok string) ([]string, string, error) {
			r, err := adm.ListSessions(c, &adminv1.ListSessionsRequest{PageSize: size, PageToken: tok})
			var keys []string
			for _, s := range r.GetSessions() {
				keys = append(keys, fmt.Sprintf("%020d", s.GetId()))
			}
			return keys, r.GetNextPageToken(), err
		},
		"routes": func(size int32, tok string) ([]string, string, error) {
			r, err := adm.ListRoutes(c, &adminv1.ListRoutesRequest{PageSize: size, PageToken: tok, Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
			// "r" < "z": the routes come first, then the namespace routes.
			var keys []string
			for _, rt := range r.GetRoutes() {
				keys = append(keys, "r "+rt.GetMailboxId())
			}
			for _, nr := range r.GetNamespaceRoutes() {
				keys = append(keys, "z "+nr.GetNamespace())
			}
			return keys, r.GetNextPageToken(), err
		},
		"moves": func(size int32, tok string) ([]string, string, error) {
			r, err := adm.ListMoves(c, &adminv1.ListMovesRequest{PageSize: size, PageToken: tok})
			var keys []string
			for _, m := range r.GetMoves() {
				keys = append(keys, listedMoveKey(m))
			}
			return keys, r.GetNextPageToken(), err
		},
	}
}

func leaseLister(c context.Context, adm adminv1.AdminClient, namespace, proxy string) lister {
	return func(size int32, tok string) ([]string, string, error) {
		r, err := adm.ListLeases(c, &adminv1.ListLeasesRequest{PageSize: size, PageToken: tok, Namespace: namespace, ProxyId: proxy})
		var keys []string
		for _, l := range r.GetLeases() {
			keys = append(keys, l.GetMailboxId())
		}
		return keys, r.GetNextPageToken(), err
	}
}

// pageAll lists every page of size, calling between after each page but
// the last, and returns the keys in the order listed and the pages' sizes.
func pageAll(t *testing.T, list lister, size int32, between func()) ([]string, []int) {
	t.Helper()
	var all []string
	var sizes []int
	tok := ""
	for {
		keys, next, err := list(size, tok)
		if err != nil {
			t.Fatalf("page %d: %v", len(sizes)+1, err)
		}
		all, sizes = append(all, keys...), append(sizes, len(keys))
		if next == "" {
			return all, sizes
		}
		if len(sizes) > 10000 {
			t.Fatal("more than 10,000 pages: the token does not move on")
		}
		tok = next
		if between != nil {
			between()
		}
	}
}

// pagingNode is one admin node on a fake clock (no lease expires, no move
// advances) with proxies p1-p4, namespaces ns-00..ns-19 each leased on its
// proxy, two sessions per proxy and five namespaces moving.
func pagingNode(t *testing.T) (*Node, adminv1.AdminClient) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	n, cp, adm, cc := startSingleWith(t, clk, time.Hour, MoveConfig{Interval: time.Hour, Timeout: time.Hour})
	c := ctx(t)
	proxies := []string{"p1", "p2", "p3", "p4"}
	for _, p := range proxies {
		if _, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: p, Address: "127.0.0.1:9000", RunnerId: "r" + p}}); err != nil {
			t.Fatal(err)
		}
	}
	moved := 0
	for i := range 20 {
		name := fmt.Sprintf("ns-%02d", i)
		r, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: name, Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}})
		if err != nil {
			t.Fatal(err)
		}
		p := r.GetNamespace().GetAssignedProxyId()
		if a, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: name + "@" + p, RunnerId: "r" + p, RunnerAddress: "127.0.0.1:9001"}); err != nil || !a.GetGranted() {
			t.Fatalf("acquire %s@%s: %v, %v", name, p, a, err)
		}
		if moved < 5 {
			to := proxies[(slices.Index(proxies, p)+1)%len(proxies)]
			if _, err := adm.MoveNamespace(c, &adminv1.MoveNamespaceRequest{Namespace: name, ToProxyId: to}); err != nil {
				t.Fatalf("move %s to %s: %v", name, to, err)
			}
			moved++
		}
	}
	ss := adminv1.NewSessionsClient(cc)
	for _, p := range proxies {
		for range 2 {
			if _, err := ss.OpenSession(c, &adminv1.OpenSessionRequest{ProxyId: p, RunnerId: "r" + p, RunnerAddress: "127.0.0.1:9001"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return n, adm
}

// Every List call pages: across pages of every size every item comes once,
// in key order, as one page of all of them lists them; no page is larger
// than asked.
func TestListPagesListEveryItemOnceInOrder(t *testing.T) {
	t.Parallel()
	n, adm := pagingNode(t)
	// A page's items are the whole listing's: a proxy's page carries its
	// partitions and namespaces.
	var proxies []*adminv1.ProxyInfo
	for tok := ""; ; {
		r, err := adm.ListProxies(ctx(t), &adminv1.ListProxiesRequest{PageSize: 1, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		proxies = append(proxies, r.GetProxies()...)
		if tok = r.GetNextPageToken(); tok == "" {
			break
		}
	}
	if want, _ := n.FSM.Proxies(); !slices.EqualFunc(proxies, want, func(a, b *adminv1.ProxyInfo) bool { return proto.Equal(a, b) }) {
		t.Errorf("proxies in pages of one:\n%v\nwant\n%v", proxies, want)
	}
	for name, list := range listers(adm, t) {
		t.Run(name, func(t *testing.T) {
			// Above the cap is the cap, which holds them all.
			want, next, err := list(math.MaxInt32, "")
			if err != nil || next != "" {
				t.Fatalf("one page of all: next %q, %v", next, err)
			}
			if !slices.IsSorted(want) || len(slices.Compact(slices.Clone(want))) != len(want) {
				t.Fatalf("one page of all is not in key order: %q", want)
			}
			if len(want) < 4 {
				t.Fatalf("only %d items: %q; the test wants several pages", len(want), want)
			}
			for _, size := range []int32{1, 2, 3, int32(len(want) - 1), int32(len(want))} {
				got, sizes := pageAll(t, list, size, nil)
				if !slices.Equal(got, want) {
					t.Errorf("pages of %d: %q, want %q", size, got, want)
				}
				for i, n := range sizes {
					if n > int(size) || n == 0 && len(sizes) > 1 {
						t.Errorf("pages of %d: page %d holds %d", size, i+1, n)
					}
				}
				if wantPages := (len(want) + int(size) - 1) / int(size); len(sizes) < wantPages {
					t.Errorf("pages of %d: %d pages, want at least %d", size, len(sizes), wantPages)
				}
			}
		})
	}
}

// Between pages items are added and removed, before and after where the
// listing is: every item present throughout is listed exactly once, keys
// only ever grow, and an item removed before its page came is not listed.
func TestListPagesWhileTheTableChanges(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// key is the listed key of namespace name's item.
		key func(name string) string
		// list lists the items with a filter the added ones meet.
		list func(adminv1.AdminClient, *testing.T) lister
	}{
		{"namespaces", func(n string) string { return n }, func(adm adminv1.AdminClient, t *testing.T) lister {
			return listers(adm, t)["namespaces"]
		}},
		{"leases of p1", func(n string) string { return n + "@p1" }, func(adm adminv1.AdminClient, t *testing.T) lister {
			return leaseLister(ctx(t), adm, "", "p1")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, cp, adm, _ := startSingle(t)
			c := ctx(t)
			if _, err := cp.RegisterProxy(c, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{ProxyId: "p1", Address: "127.0.0.1:9000", RunnerId: "r1"}}); err != nil {
				t.Fatal(err)
			}
			add := func(name string) {
				t.Helper()
				if _, err := cp.CreateNamespace(c, &adminv1.CreateNamespaceRequest{Namespace: name, Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
					t.Fatal(err)
				}
				if a, err := cp.AcquireLease(c, &adminv1.AcquireLeaseRequest{MailboxId: name + "@p1", RunnerId: "r1", RunnerAddress: "127.0.0.1:9001"}); err != nil || !a.GetGranted() {
					t.Fatalf("acquire %s@p1: %v, %v", name, a, err)
				}
			}
			remove := func(name string) {
				t.Helper()
				if r, err := cp.ReleaseLease(c, &adminv1.ReleaseLeaseRequest{MailboxId: name + "@p1", RunnerId: "r1"}); err != nil || !r.GetReleased() {
					t.Fatalf("release %s@p1: %v, %v", name, r, err)
				}
				if r, err := cp.DeleteNamespace(c, &adminv1.DeleteNamespaceRequest{Namespace: name}); err != nil || !r.GetDeleted() {
					t.Fatalf("delete %s: %v, %v", name, r, err)
				}
			}
			var initial []string
			for i := 10; i < 40; i++ {
				initial = append(initial, fmt.Sprintf("n-%02d", i))
				add(initial[len(initial)-1])
			}

			list := tc.list(adm, t)
			listed := map[string]bool{}
			// removed: listed before its removal (true) or not (false).
			removed := map[string]bool{}
			// Each turn adds one item before the listing's place and one at
			// the end, and removes the last initial item not listed yet and
			// the last listed one, the key the next page starts after.
			turn := 0
			got, _ := pageAll(t, func(size int32, tok string) ([]string, string, error) {
				keys, next, err := list(size, tok)
				for _, k := range keys {
					listed[k] = true
				}
				return keys, next, err
			}, 4, func() {
				turn++
				add(fmt.Sprintf("n-0%d", turn%10) + strings.Repeat("x", turn/10))
				add(fmt.Sprintf("n-99-%02d", turn))
				for _, wasListed := range []bool{false, true} {
					for _, name := range slices.Backward(initial) {
						if _, gone := removed[name]; !gone && listed[tc.key(name)] == wasListed {
							remove(name)
							removed[name] = wasListed
							break
						}
					}
				}
			})
			if turn < 3 {
				t.Fatalf("%d pages; the test wants several", turn+1)
			}
			for i := 1; i < len(got); i++ {
				if got[i-1] >= got[i] {
					t.Fatalf("listed %q then %q: keys must only grow (%q)", got[i-1], got[i], got)
				}
			}
			for _, name := range initial {
				wasListed, gone := removed[name]
				switch k := tc.key(name); {
				case gone && !wasListed && slices.Contains(got, k):
					t.Errorf("%s was removed before its page and listed: %q", k, got)
				case !gone && !slices.Contains(got, k):
					t.Errorf("%s, present throughout, was not listed: %q", k, got)
				}
			}
			ends := 0
			for _, k := range got {
				switch {
				case strings.HasPrefix(k, "n-99-"):
					ends++
				case strings.HasPrefix(k, "n-0"):
					t.Errorf("%s was added before the listing's place and listed: %q", k, got)
				}
			}
			if ends != turn {
				t.Errorf("%d of the %d items added after the listing's place were listed: %q", ends, turn, got)
			}
		})
	}
}

// A request whose paging is wrong is refused INVALID_ARGUMENT, saying what
// is wrong, and changes nothing.
func TestListPagingRefusals(t *testing.T) {
	t.Parallel()
	n, adm := pagingNode(t)
	c := ctx(t)
	firstToken := func(list lister) string {
		t.Helper()
		_, next, err := list(1, "")
		if err != nil || next == "" {
			t.Fatalf("first page: next %q, %v", next, err)
		}
		return next
	}
	ls := listers(adm, t)
	proxiesToken := firstToken(ls["proxies"])
	p1LeasesToken := firstToken(ls["leases of p1"])
	p1SessionsToken := func() string {
		r, err := adm.ListSessions(c, &adminv1.ListSessionsRequest{ProxyId: "p1", PageSize: 1})
		if err != nil || r.GetNextPageToken() == "" {
			t.Fatalf("first page of p1's sessions: %v, %v", r, err)
		}
		return r.GetNextPageToken()
	}()
	before := sessionState(t, n)

	type refusal struct {
		name string
		err  error
		says string
	}
	var cases []refusal
	for name, list := range ls {
		_, _, err := list(-1, "")
		cases = append(cases, refusal{name + ": negative page_size", err, "page_size -1"})
		_, _, err = list(10, "%%% not base64")
		cases = append(cases, refusal{name + ": token not base64", err, "page_token: malformed"})
		_, _, err = list(10, "bm90IGpzb24")
		cases = append(cases, refusal{name + ": token not JSON", err, "page_token: malformed"})
		_, _, err = list(10, pageToken{List: "ListNamespaces"}.encode())
		cases = append(cases, refusal{name + ": token without a key", err, "page_token: malformed"})
		if name != "proxies" {
			_, _, err = list(10, proxiesToken)
			cases = append(cases, refusal{name + ": ListProxies' token", err, "issued by ListProxies"})
		}
	}
	_, _, err := ls["leases"](10, p1LeasesToken)
	cases = append(cases, refusal{"leases without the token's proxy filter", err, "other filters"})
	_, _, err = leaseLister(c, adm, "ns-01", "p1")(10, p1LeasesToken)
	cases = append(cases, refusal{"leases with a namespace filter the token had not", err, "other filters"})
	_, err = adm.ListSessions(c, &adminv1.ListSessionsRequest{ProxyId: "p2", PageToken: p1SessionsToken})
	cases = append(cases, refusal{"sessions of another proxy", err, "other filters"})
	_, err = adm.ListSessions(c, &adminv1.ListSessionsRequest{PageToken: pageToken{List: "ListSessions", After: "x"}.encode()})
	cases = append(cases, refusal{"sessions after a key that is not an id", err, "page_token: malformed"})

	for _, tc := range cases {
		if status.Code(tc.err) != codes.InvalidArgument || !strings.Contains(status.Convert(tc.err).Message(), tc.says) {
			t.Errorf("%s: %v, want InvalidArgument saying %q", tc.name, tc.err, tc.says)
		}
	}
	if after := sessionState(t, n); !slices.Equal(before, after) {
		t.Errorf("refused calls changed the state:\n%q\nwant\n%q", after, before)
	}
}

func TestPageOf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		size     int32
		wantSize int
		wantErr  bool
	}{
		{0, defaultPageSize, false},
		{1, 1, false},
		{maxPageSize, maxPageSize, false},
		{maxPageSize + 1, maxPageSize, false},
		{math.MaxInt32, maxPageSize, false},
		{-1, 0, true},
		{math.MinInt32, 0, true},
	} {
		p, err := pageOf("ListLeases", "", tc.size, "")
		switch {
		case tc.wantErr && status.Code(err) != codes.InvalidArgument:
			t.Errorf("page_size %d: %v, want InvalidArgument", tc.size, err)
		case !tc.wantErr && (err != nil || p.size != tc.wantSize):
			t.Errorf("page_size %d: size %d, %v; want %d", tc.size, p.size, err, tc.wantSize)
		}
	}
}
