package ctl

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mesh/identity"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// The list commands page through every item: with pages of two, seven
// namespaces, their leases and routes and three sessions come whole, in
// order, as one answer (one table header, no next_page_token).
func TestListCommandsPageThroughEverything(t *testing.T) {
	t.Parallel()
	a := startAdmin(t)
	g := append(a.as(identity.Operator, "ops"), "--timeout", "20s")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	op, p1 := adminv1.NewControlPlaneClient(a.dial(t, identity.Operator, "ops")), a.dial(t, identity.Proxy, "p1")
	if _, err := adminv1.NewControlPlaneClient(p1).RegisterProxy(ctx, &adminv1.RegisterProxyRequest{Registration: &adminv1.ProxyRegistration{
		ProxyId: "p1", Address: "10.0.0.1:9090", RunnerId: "r1", Capabilities: []string{"mailbox"},
	}}); err != nil {
		t.Fatal(err)
	}
	var namespaces, mailboxes []string
	for i := range 7 {
		ns := fmt.Sprintf("ns-%d", i)
		if _, err := op.CreateNamespace(ctx, &adminv1.CreateNamespaceRequest{Namespace: ns, Config: &adminv1.NamespaceConfig{Topics: []string{"t"}}}); err != nil {
			t.Fatal(err)
		}
		namespaces, mailboxes = append(namespaces, ns), append(mailboxes, ns+"@p1")
	}
	sc := adminv1.NewSessionsClient(p1)
	var sessions []string
	var first uint64
	for range 3 {
		open, err := sc.OpenSession(ctx, &adminv1.OpenSessionRequest{ProxyId: "p1", RunnerId: "r1", RunnerAddress: "10.0.0.1:9090"})
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, fmt.Sprint(open.GetSession().GetId()))
		first = cmp.Or(first, open.GetSession().GetId())
	}
	acq, err := sc.AcquireLeases(ctx, &adminv1.AcquireLeasesRequest{ProxyId: "p1", SessionId: first, MailboxIds: mailboxes})
	if err != nil || len(acq.GetResults()) != len(mailboxes) {
		t.Fatalf("acquire: %v %v", acq, err)
	}
	for _, r := range acq.GetResults() {
		if !r.GetOk() {
			t.Fatalf("acquire: %v", acq)
		}
	}

	for _, tc := range []struct {
		args []string
		// list and key name the JSON answer's items and each one's key.
		list, key string
		want      []string
		header    string
	}{
		{[]string{"namespace", "list"}, "namespaces", "name", namespaces, "NAMESPACE"},
		{[]string{"lease", "list"}, "leases", "mailbox_id", mailboxes, "MAILBOX"},
		{[]string{"lease", "list", "--proxy", "p1", "--consistent"}, "leases", "mailbox_id", mailboxes, "MAILBOX"},
		{[]string{"route", "list"}, "routes", "mailbox_id", mailboxes, "MAILBOX"},
		{[]string{"route", "list"}, "namespace_routes", "namespace", namespaces, "NAMESPACE"},
		{[]string{"session", "list"}, "sessions", "id", sessions, "SESSION"},
	} {
		name := strings.Join(tc.args, " ") + " " + tc.list
		for _, size := range []string{"2", "0"} {
			out, err := prismctl(t, append(append(g, tc.args...), "--page-size", size, "-o", "json")...)
			if err != nil {
				t.Fatalf("%s --page-size %s: %v\n%s", name, size, err, out)
			}
			var got map[string]any
			d := json.NewDecoder(strings.NewReader(out))
			d.UseNumber()
			if err := d.Decode(&got); err != nil {
				t.Fatalf("%s --page-size %s -o json: %v\n%s", name, size, err, out)
			}
			var keys []string
			items, _ := got[tc.list].([]any)
			for _, it := range items {
				keys = append(keys, fmt.Sprint(it.(map[string]any)[tc.key]))
			}
			if !slices.Equal(keys, tc.want) {
				t.Errorf("%s --page-size %s: %q, want %q", name, size, keys, tc.want)
			}
			if _, ok := got["next_page_token"]; ok {
				t.Errorf("%s --page-size %s shows a next_page_token:\n%s", name, size, out)
			}
		}
		out, err := prismctl(t, append(append(g, tc.args...), "--page-size", "2")...)
		if err != nil {
			t.Fatalf("%s --page-size 2: %v\n%s", name, err, out)
		}
		n := 0
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) > 0 && f[0] == tc.header {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s --page-size 2: %d %s headers, want one table:\n%s", name, n, tc.header, out)
		}
		for _, k := range tc.want {
			if !hasLine(out, k+" ") {
				t.Errorf("%s --page-size 2: no line of %s:\n%s", name, k, out)
			}
		}
	}
	if out, err := prismctl(t, append(g, "lease", "list", "--page-size", "-1")...); err == nil || !strings.Contains(out+err.Error(), "page_size -1") {
		t.Errorf("lease list --page-size -1: %v\n%s, want an error about page_size", err, out)
	}
}
