package ir

import (
	"reflect"
	"testing"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

func TestFromAdmin(t *testing.T) {
	t.Parallel()
	s := AdminState{
		RoutesIndex: 42,
		Routes: []*adminv1.Route{
			{MailboxId: "b@proxy-02", Namespace: "b", ProxyId: "proxy-02", RunnerId: "runner-02", RunnerAddress: "10.0.0.2:8982", Epoch: 30},
			// runner-01 restarted on a new address: its newest lease wins.
			{MailboxId: "a@proxy-01", Namespace: "a", ProxyId: "proxy-01", RunnerId: "runner-01", RunnerAddress: "10.0.0.1:8982", Epoch: 10},
			{MailboxId: "$admin@proxy-01", Namespace: "$admin", ProxyId: "proxy-01", RunnerId: "runner-01", RunnerAddress: "10.0.0.11:8982", Epoch: 40},
		},
		NamespaceRoutes: []*adminv1.NamespaceRoute{{Namespace: "b", MailboxId: "b@proxy-02", Epoch: 30}},
		StaleProxies:    map[string]bool{"proxy-02": true},
		Gateway:         Gateway{Address: "0.0.0.0:8080"},
		NotFound:        []string{"10.0.0.100:9000"},
	}
	got := FromAdmin(s)
	want := &IR{
		Version:  42,
		Gateway:  Gateway{Address: "0.0.0.0:8080"},
		NotFound: []string{"10.0.0.100:9000"},
		Runners: []Runner{
			{ID: "runner-01", Address: "10.0.0.11:8982", Healthy: true, ProxyID: "proxy-01"},
			{ID: "runner-02", Address: "10.0.0.2:8982", Healthy: false, ProxyID: "proxy-02"},
		},
		Mailboxes: []Mailbox{
			{ID: "$admin@proxy-01", Namespace: "$admin", RunnerID: "runner-01", Epoch: 40},
			{ID: "a@proxy-01", Namespace: "a", RunnerID: "runner-01", Epoch: 10},
			{ID: "b@proxy-02", Namespace: "b", RunnerID: "runner-02", Epoch: 30},
		},
		Aliases: []Alias{{Namespace: "b", MailboxID: "b@proxy-02"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("FromAdmin =\n%+v\nwant\n%+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("FromAdmin gave an invalid IR: %v", err)
	}
}
