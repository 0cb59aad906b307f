package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/prism-mesh/prism/mesh/identity"
	"github.com/prism-mesh/prism/testkit/pkitest"
)

func execute(cmd *cobra.Command, args ...string) error {
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs(args)
	return cmd.Execute()
}

// TestRunnerAndSidecarRefuseToStart: without TLS files or --insecure
// neither serves, and a sidecar whose certificate is another proxy's (or
// another role's) than --proxy-id refuses before it dials anything.
func TestRunnerAndSidecarRefuseToStart(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	tlsArgs := func(role identity.Role, name string) []string {
		f := p.Files(role, name)
		return []string{"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key}
	}
	sidecar := []string{"--proxy-id", "p1", "--admin-endpoints", "127.0.0.1:1", "--advertise-addr", "127.0.0.1:9090", "--http-addr", "127.0.0.1:0", "--log-level", "error"}
	for _, tc := range []struct {
		name string
		cmd  *cobra.Command
		args []string
		want string
	}{
		{"runner without TLS", runnerCommand(), []string{"--data-dir", t.TempDir(), "--log-level", "error"}, "TLS is required"},
		{"sidecar without TLS", sidecarCommand(), sidecar, "TLS is required"},
		{"sidecar of another proxy", sidecarCommand(), append(tlsArgs(identity.Proxy, "p2"), sidecar...), "want spiffe://prism.local/proxy/p1"},
		{"sidecar with a gateway certificate", sidecarCommand(), append(tlsArgs(identity.Gateway, "p1"), sidecar...), "want spiffe://prism.local/proxy/p1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if err := execute(tc.cmd, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v = %v, want it to say %q", tc.args, err, tc.want)
			}
		})
	}
}

// TestRunnerPprofFlag: the runner serves profiles only with --enable-pprof,
// and the block and mutex profiles' rates are refused without it.
func TestRunnerPprofFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		args      []string
		wantPprof bool
		wantErr   string
	}{
		{"off by default", nil, false, ""},
		{"on with the flag", []string{"--enable-pprof"}, true, ""},
		{"rates with it", []string{"--enable-pprof", "--block-profile-rate", "1000", "--mutex-profile-fraction", "10"}, true, ""},
		{"block rate without it", []string{"--block-profile-rate", "1000"}, false, "need --enable-pprof"},
		{"mutex fraction without it", []string{"--mutex-profile-fraction", "10"}, false, "need --enable-pprof"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var f runnerFlags
			cmd := &cobra.Command{}
			f.register(cmd, runnerFlags{})
			if err := cmd.Flags().Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			cfg, err := f.nodeConfig(slog.New(slog.DiscardHandler), []string{"127.0.0.1:1"})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("nodeConfig(%v) = %v, want it to say %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Runner.Pprof != tc.wantPprof {
				t.Errorf("nodeConfig(%v).Runner.Pprof = %v, want %v", tc.args, cfg.Runner.Pprof, tc.wantPprof)
			}
		})
	}
}

// TestRunnerExpectedMailboxesFlag: --expected-mailboxes, which sized the
// stores of a runner with one per mailbox, is still accepted, so that a
// runner upgraded with its old command line starts, but deprecated and
// hidden: the runner's one store is sized from the budget alone.
func TestRunnerExpectedMailboxesFlag(t *testing.T) {
	t.Parallel()
	var f runnerFlags
	cmd := &cobra.Command{}
	f.register(cmd, runnerFlags{})
	if err := cmd.Flags().Parse([]string{"--expected-mailboxes", "200", "--memory-budget", "1GiB"}); err != nil {
		t.Fatalf("an old command line with --expected-mailboxes: %v", err)
	}
	if fl := cmd.Flags().Lookup("expected-mailboxes"); fl.Deprecated == "" || !fl.Hidden {
		t.Errorf("--expected-mailboxes deprecated %q hidden %v, want deprecated and hidden", fl.Deprecated, fl.Hidden)
	}
	cfg, err := f.nodeConfig(slog.New(slog.DiscardHandler), []string{"127.0.0.1:1"})
	if err != nil || cfg.Runner.MemoryBudget != 1<<30 {
		t.Errorf("nodeConfig = budget %d, %v; want 1GiB", cfg.Runner.MemoryBudget, err)
	}
}

// TestQueryProcs: prism runner gives the runtime a P more than the cores, and
// keeps ingest's lanes a core short of them, only where the governor is on
// and neither GOMAXPROCS nor a CPU limit chose the procs.
func TestQueryProcs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		target           time.Duration
		envSet           bool
		procs, cpus      int
		wantProcs, lanes int
	}{
		{"two cores", 10 * time.Millisecond, false, 2, 2, 3, 1},
		{"the default target", 0, false, 8, 8, 9, 7},
		{"one core keeps one lane", 10 * time.Millisecond, false, 1, 1, 2, 1},
		{"governor off", -1, false, 2, 2, 2, 0},
		{"GOMAXPROCS in the environment", 10 * time.Millisecond, true, 2, 2, 2, 0},
		{"a CPU limit below the cores", 10 * time.Millisecond, false, 2, 16, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			procs, lanes := queryProcs(tc.target, tc.envSet, tc.procs, tc.cpus)
			if procs != tc.wantProcs || lanes != tc.lanes {
				t.Errorf("queryProcs(%v, %v, %d, %d) = %d, %d; want %d, %d", tc.target, tc.envSet, tc.procs, tc.cpus, procs, lanes, tc.wantProcs, tc.lanes)
			}
		})
	}
}
