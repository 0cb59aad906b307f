package ir

import (
	"reflect"
	"testing"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

func TestFromAdmin(t *testing.T) {
	t.Parallel()
	info := func(id, runner, addr string, status adminv1.ProxyStatus, runnerNotReady bool) *adminv1.ProxyInfo {
		return &adminv1.ProxyInfo{Proxy: &adminv1.Proxy{
			Registration:   &adminv1.ProxyRegistration{ProxyId: id, RunnerId: runner, Address: addr},
			Status:         status,
			RunnerNotReady: runnerNotReady,
		}}
	}
	s := AdminState{
		Index: 42,
		Proxies: []*adminv1.ProxyInfo{
			info("proxy-02", "runner-02", "10.0.0.2:8982", adminv1.ProxyStatus_PROXY_STATUS_STALE, false),
			info("proxy-01", "", "10.0.0.1:8982", adminv1.ProxyStatus_PROXY_STATUS_LIVE, false),
			// Live, its sidecar heartbeating, but its runner given up on.
			info("proxy-03", "runner-03", "10.0.0.3:8982", adminv1.ProxyStatus_PROXY_STATUS_LIVE, true),
		},
		Gateway: Gateway{Address: "0.0.0.0:8080"},
		Admins:  []string{"10.0.0.100:9000"},
		Lookup:  "dns:///10.0.0.100:9000",
	}
	got := FromAdmin(s)
	want := &IR{
		Version: 42,
		Gateway: Gateway{Address: "0.0.0.0:8080"},
		Admins:  []string{"10.0.0.100:9000"},
		Lookup:  "dns:///10.0.0.100:9000",
		Proxies: []Proxy{
			// No runner id registered: the proxy id, as AcquireLease takes it.
			{ID: "proxy-01", RunnerID: "proxy-01", Address: "10.0.0.1:8982", Healthy: true},
			{ID: "proxy-02", RunnerID: "runner-02", Address: "10.0.0.2:8982", Healthy: false},
			{ID: "proxy-03", RunnerID: "runner-03", Address: "10.0.0.3:8982", Healthy: false},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("FromAdmin =\n%+v\nwant\n%+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("FromAdmin gave an invalid IR: %v", err)
	}
}
