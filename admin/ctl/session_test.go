package ctl

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// A sidecar's session, opened and filled as proxy p1, is listed with its
// lease count and shown with its leases; a missing or malformed id is an
// error that says so.
func TestSessionCommands(t *testing.T) {
	t.Parallel()
	a := startAdmin(t)
	g := append(a.as(identity.Operator, "ops"), "--timeout", "20s")
	run := func(args ...string) (string, error) {
		t.Helper()
		return prismctl(t, append(g, args...)...)
	}
	if out, err := run("namespace", "create", "audit", "--topic", "audit.events"); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	cc := a.dial(t, identity.Proxy, "p1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := adminv1.NewControlPlaneClient(cc).RegisterProxy(ctx, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{
		ProxyId: "p1", Address: "10.0.0.1:9090", RunnerId: "r1", Capabilities: []string{"mailbox"},
	}}); err != nil {
		t.Fatal(err)
	}
	sc := adminv1.NewSessionsClient(cc)
	open, err := sc.OpenSession(ctx, &adminv1.OpenSessionRequest{ProxyId: "p1", RunnerId: "r1", RunnerAddress: "10.0.0.1:9090"})
	if err != nil || open.GetSession() == nil {
		t.Fatalf("open session: %v %v", open, err)
	}
	id := strconv.FormatUint(open.GetSession().GetId(), 10)
	acq, err := sc.AcquireLeases(ctx, &adminv1.AcquireLeasesRequest{ProxyId: "p1", SessionId: open.GetSession().GetId(), MailboxIds: []string{"audit@p1"}})
	if err != nil || len(acq.GetResults()) != 1 || !acq.GetResults()[0].GetOk() {
		t.Fatalf("acquire: %v %v", acq, err)
	}
	epoch := strconv.FormatUint(acq.GetResults()[0].GetLease().GetEpoch(), 10)

	tests := []struct {
		args []string
		want []string // every one on one line of the output
		err  string
	}{
		{args: []string{"session", "list", "--consistent"}, want: []string{id, "p1", "r1", "10.0.0.1:9090", "  1  "}},
		{args: []string{"session", "list", "--proxy", "p2"}, want: []string{"SESSION"}},
		{args: []string{"session", "get", id}, want: []string{"audit@p1", epoch}},
		{args: []string{"session", "get", "12"}, err: "not found"},
		{args: []string{"session", "get", "x"}, err: "want a positive number"},
	}
	for _, tc := range tests {
		out, err := run(tc.args...)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(out+err.Error(), tc.err) {
				t.Errorf("%v: %v\n%s, want an error with %q", tc.args, err, out, tc.err)
			}
			continue
		case err != nil:
			t.Errorf("%v: %v\n%s", tc.args, err, out)
			continue
		}
		if !hasLine(out, tc.want...) {
			t.Errorf("%v:\n%s\nwant a line with %q", tc.args, out, tc.want)
		}
	}
	if out, _ := run("session", "list", "--proxy", "p2"); strings.Contains(out, id) {
		t.Errorf("session list --proxy p2 shows p1's session:\n%s", out)
	}
}

func hasLine(out string, parts ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return true
		}
	}
	return false
}
