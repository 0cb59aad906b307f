package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prism-mesh/prism/mesh"
)

// TestDrainWait: prism sidecar drain-wait POSTs /drain with its timeout to
// the sidecar at --addr, prints the answer, and succeeds only on a 200.
func TestDrainWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		code int
		ok   bool
	}{
		{"drained", http.StatusOK, true},
		{"deadline passed", http.StatusGatewayTimeout, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reqs := make(chan *http.Request, 1)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				reqs <- r
				w.WriteHeader(tc.code)
				w.Write([]byte(`{"proxy_id":"p1"}`))
			}))
			defer srv.Close()
			cmd := sidecarCommand()
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs([]string{"drain-wait", "--addr", strings.TrimPrefix(srv.URL, "http://"), "--timeout", "90s"})
			err := cmd.Execute()
			if (err == nil) != tc.ok {
				t.Fatalf("drain-wait = %v on a %d, want ok %v", err, tc.code, tc.ok)
			}
			got := <-reqs
			if got.Method != http.MethodPost || got.URL.Path != "/drain" || got.URL.Query().Get("timeout") != "1m30s" {
				t.Fatalf("request %v, want POST /drain?timeout=1m30s", got)
			}
			if !strings.Contains(out.String(), `{"proxy_id":"p1"}`) {
				t.Fatalf("output %q, want the sidecar's answer", out.String())
			}
		})
	}
	if err := execute(sidecarCommand(), "drain-wait", "--timeout", "0s"); err == nil {
		t.Fatal("drain-wait --timeout 0s accepted")
	}
}

// TestSidecarRefusesUnroutableIDs: a proxy or runner id routing could not
// carry is refused at start, stating the rule, before the admin is called.
func TestSidecarRefusesUnroutableIDs(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--proxy-id", "uni☃"},
		{"--proxy-id", "p", "--runner-id", "r 1"},
	} {
		cmd := sidecarCommand()
		cmd.SetArgs(append(args, "--admin-endpoints", "127.0.0.1:1"))
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), mesh.NameRule) {
			t.Errorf("%v: %v, want a refusal stating %q", args, err, mesh.NameRule)
		}
	}
}
