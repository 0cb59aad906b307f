package ctl

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/testkit/testproc"
)

// member add and remove carry --force to the leader: without it, adding a
// voter that does not answer to a single node is refused FailedPrecondition
// saying why; with it the quorum check is skipped.
func TestMemberForce(t *testing.T) {
	t.Parallel()
	a := startAdmin(t)
	op := a.as(identity.Operator, "ops")
	ghost := testproc.FreeAddr(t)
	cases := []struct {
		args    []string
		refused bool
	}{
		{[]string{"member", "remove", "solo"}, true},
		{[]string{"member", "add", "ghost", ghost, ghost}, true},
		{[]string{"member", "add", "ghost", ghost, ghost, "--force"}, false},
	}
	for _, tc := range cases {
		out, err := prismctl(t, append(slices.Clone(op), tc.args...)...)
		refused := err != nil && strings.Contains(err.Error(), "FailedPrecondition") && strings.Contains(err.Error(), "a quorum needs")
		if refused != tc.refused {
			t.Fatalf("%v: refused %v, want %v: %v\n%s", tc.args, refused, tc.refused, err, out)
		}
	}
}

// member list shows each member's place in the configuration and what it
// says of itself; version shows prismctl's build and each node's.
func TestMemberListAndVersion(t *testing.T) {
	t.Parallel()
	a := startAdmin(t)
	op := append(a.as(identity.Operator, "ops"), "--timeout", "20s")
	run := func(args ...string) string {
		t.Helper()
		out, err := prismctl(t, append(slices.Clone(op), args...)...)
		if err != nil {
			t.Fatalf("prismctl %v: %v\n%s", args, err, out)
		}
		return out
	}
	// A writing command waits out the election.
	run("namespace", "create", "ns", "--topic", "t", "--skip-topic-check")
	table := run("member", "list")
	if !regexp.MustCompile(`(?m)^solo\s+\S+\s+` + regexp.QuoteMeta(a.addr) + `\s+voter\s+true\s+true\s+[1-9]\d*\s*$`).MatchString(table) {
		t.Errorf("member list:\n%s\nwant solo, its addresses, voter, leader, healthy and its applied index", table)
	}
	var list struct {
		Members []struct {
			ID           string      `json:"id"`
			Suffrage     string      `json:"suffrage"`
			Leader       bool        `json:"leader"`
			Healthy      bool        `json:"healthy"`
			State        string      `json:"state"`
			AppliedIndex json.Number `json:"applied_index"`
			Version      string      `json:"version"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(run("member", "list", "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Members) != 1 {
		t.Fatalf("member list -o json: %+v", list)
	}
	m := list.Members[0]
	if n, err := m.AppliedIndex.Int64(); err != nil || n < 1 || m.ID != "solo" || !m.Leader || !m.Healthy ||
		m.Suffrage != "MEMBER_SUFFRAGE_VOTER" || m.State != "Leader" || m.Version != testServerVersion {
		t.Errorf("member list -o json: %+v", m)
	}

	if out := run("version"); !regexp.MustCompile(`(?m)^client\s+dev\s+\(go`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^admin solo\s+`+regexp.QuoteMeta(testServerVersion)+`\s+\(`+regexp.QuoteMeta(a.addr)+`\)`).MatchString(out) {
		t.Errorf("version:\n%s\nwant the client's and solo's", out)
	}
	var v struct {
		Client  struct{ Version string }
		Servers []struct {
			ID      string
			Version string
		}
	}
	if err := json.Unmarshal([]byte(run("version", "-o", "json")), &v); err != nil {
		t.Fatal(err)
	}
	if v.Client.Version != "dev" || len(v.Servers) != 1 || v.Servers[0].ID != "solo" || v.Servers[0].Version != testServerVersion {
		t.Errorf("version -o json: %+v", v)
	}
	// A member that does not answer is listed, not healthy, with why.
	ghost := testproc.FreeAddr(t)
	run("member", "add", "ghost", ghost, ghost, "--force")
	wide := run("member", "list", "-o", "wide")
	if !regexp.MustCompile(`(?m)^ghost\s+` + regexp.QuoteMeta(ghost) + `\s+` + regexp.QuoteMeta(ghost) + `\s+voter\s+false\s+false\s+-\s+-\s+0\s+0\s+-\s+Unavailable: `).MatchString(wide) {
		t.Errorf("member list -o wide with a dead member:\n%s", wide)
	}
	if out := run("version"); !regexp.MustCompile(`(?m)^admin ghost\s+\? \(Unavailable: `).MatchString(out) {
		t.Errorf("version with a dead member:\n%s", out)
	}

	// --client asks no one: it works with nothing listening.
	out, err := prismctl(t, "--admin", testproc.FreeAddr(t), "--insecure", "version", "--client")
	if err != nil || strings.Contains(out, "admin") || !strings.Contains(out, "dev") {
		t.Errorf("version --client: %v\n%s", err, out)
	}
}
