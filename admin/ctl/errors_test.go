package ctl

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/testkit/testproc"
)

func TestDescribe(t *testing.T) {
	t.Parallel()
	notFound := status.Error(codes.NotFound, `namespace "x" not found`)
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"a status", notFound, `NotFound: namespace "x" not found`},
		{"a status the client wrapped in context", fmt.Errorf("GetNamespace on 127.0.0.1:1: %w", notFound), `NotFound: namespace "x" not found`},
		{"no status", errors.New("--format: bad"), "--format: bad"},
	}
	for _, tc := range cases {
		if got := describe(tc.err).Error(); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Each kind of answer has its own exit status, and a cluster nothing
// listens for fails within 2s, whatever --timeout, naming the address it
// tried, where that came from and how to give another.
func TestExitCodesByAnswer(t *testing.T) {
	t.Parallel()
	a := startAdmin(t)
	op := append(a.as(identity.Operator, "ops"), "--timeout", "20s")
	reader := append(a.as(identity.Reader, "dash"), "--timeout", "20s")
	dead := testproc.FreeAddr(t)
	cases := []struct {
		name   string
		args   []string
		code   int
		want   []string
		within time.Duration // 0: no bound
	}{
		{"not found", append(slices.Clone(op), "namespace", "get", "missing"), exitNotFound, []string{"NotFound"}, 0},
		{"refused argument", append(slices.Clone(op), "namespace", "create", "x"), exitUsage, []string{"InvalidArgument"}, 0},
		{"permission denied", append(slices.Clone(reader), "namespace", "create", "x", "--topic", "t", "--skip-topic-check"), exitDenied, []string{"PermissionDenied"}, 0},
		{"refused in this state", append(slices.Clone(op), "member", "remove", "solo"), exitRefused, []string{"FailedPrecondition"}, 0},
		{"bad -o", append(slices.Clone(op), "-o", "xml", "cluster", "status"), exitUsage, []string{"-o/--output", "table, wide, json, yaml"}, 0},
		{"nothing listening", []string{"--admin", dead, "--insecure", "--timeout", "15s", "cluster", "status"}, exitUnavailable,
			[]string{"Unavailable", "no admin node accepted a connection at " + dead + " (from --admin)", "is prism admin (or prism dev) running there?", "PRISM_ADMIN"}, 2 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			out, err := prismctl(t, tc.args...)
			took := time.Since(start)
			var stderr bytes.Buffer
			code := exit(err, &stderr)
			if code != tc.code {
				t.Errorf("exit %d, want %d: %s%s", code, tc.code, out, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("printed %q, want %q in it", stderr.String(), w)
				}
			}
			if tc.within > 0 && took > tc.within {
				t.Errorf("took %v, want at most %v", took, tc.within)
			}
		})
	}
}

// With no --admin, PRISM_ADMIN or config file prismctl calls where prism
// dev serves the admin API and where the chart's admin pods listen.
func TestDefaultAdmin(t *testing.T) {
	t.Setenv(envAdmin, "")
	root := rootCommand("dev")
	if got := root.PersistentFlags().Lookup("admin").DefValue; got != "127.0.0.1:7001" {
		t.Fatalf("--admin defaults to %s", got)
	}
	for _, tc := range []struct{ file, pattern string }{
		{"../../cmd/prism/dev.go", `"admin-addr", "127.0.0.1:7001"`},
		{"../../helm/prism/values.yaml", "\n    grpc: 7001\n"},
	} {
		b, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), tc.pattern) {
			t.Errorf("%s no longer has %q: prismctl's default admin address is out of step", tc.file, tc.pattern)
		}
	}
}
