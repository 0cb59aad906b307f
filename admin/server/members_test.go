package server

import (
	"testing"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// The first leader commits the gRPC addresses it knows into the members
// table, and cluster status reads them from there.
func TestLeaderPublishesMemberAddresses(t *testing.T) {
	t.Parallel()
	n, _, adm, _ := startSingle(t)
	deadline := time.Now().Add(20 * time.Second)
	for n.FSM.MemberAddress("solo") != n.GRPCAddr() {
		if time.Now().After(deadline) {
			got, _ := n.FSM.MemberAddresses()
			t.Fatalf("members table %v, want solo at %s", got, n.GRPCAddr())
		}
		time.Sleep(5 * time.Millisecond)
	}
	st, err := adm.GetClusterStatus(ctx(t), &adminv1.GetClusterStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GetMembers()) != 1 || st.GetMembers()[0].GetGrpcAddress() != n.GRPCAddr() || st.GetLeaderAddress() != n.GRPCAddr() {
		t.Fatalf("status members %v leader address %q, want solo at %s", st.GetMembers(), st.GetLeaderAddress(), n.GRPCAddr())
	}
}

func TestPublishable(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:8981":               true,
		"admin-0.admin.prism.svc:8981": true,
		"[::1]:8981":                   true,
		"0.0.0.0:8981":                 false,
		"[::]:8981":                    false,
		"":                             false,
		"no-port":                      false,
		"127.0.0.1:0":                  false,
	} {
		if got := publishable(addr); got != want {
			t.Errorf("publishable(%q) = %v, want %v", addr, got, want)
		}
	}
}
