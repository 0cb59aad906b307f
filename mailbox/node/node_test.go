package node

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prism-mesh/prism/mailbox/runner"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// runnerConfig never reaches a broker: a runner dials Kafka only when it
// opens a mailbox.
func runnerConfig(t *testing.T) runner.Config {
	return runner.Config{DataDir: t.TempDir(), Brokers: []string{"127.0.0.1:1"}}
}

func TestStartRefusesBadConfigs(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })
	static := &runner.MailboxConfig{ID: "a@p", Topics: []string{"t"}}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"static mailbox with a control API", Config{Mailbox: static, ControlAddr: "127.0.0.1:0"}, "no control API"},
		{"neither", Config{}, "either a static mailbox or a control address"},
		{"control API on the network", Config{ControlAddr: "0.0.0.0:0"}, "must be a loopback address"},
		{"control API on a name", Config{ControlAddr: "runner.example:7071"}, "must be a loopback address"},
		{"query address taken", Config{ControlAddr: "127.0.0.1:0", QueryAddr: busy.Addr().String(), HTTPAddr: "127.0.0.1:0"}, "runner query listen"},
		{"http address taken", Config{ControlAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0", HTTPAddr: busy.Addr().String()}, "runner http listen"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.cfg.Runner, tc.cfg.Logger = runnerConfig(t), quiet()
			n, err := Start(tc.cfg)
			if err == nil {
				n.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to say %q", err, tc.want)
			}
		})
	}
}

// A runner without a static mailbox serves the control API on loopback and
// is ready by that API's rules: hosting nothing, it waits for the sidecar.
func TestStartControlled(t *testing.T) {
	t.Parallel()
	n, err := Start(Config{
		Runner: runnerConfig(t), Logger: quiet(),
		ControlAddr: "127.0.0.1:0", QueryAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := n.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}()
	cc, err := grpc.NewClient(n.ControlAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	stats, err := runnerv1.NewRunnerControlClient(cc).GetStats(context.Background(), &runnerv1.GetStatsRequest{})
	if err != nil {
		t.Fatalf("control API on %s: %v", n.ControlAddr(), err)
	}
	if len(stats.GetMailboxes()) != 0 {
		t.Fatalf("mailboxes before the sidecar opened any: %v", stats.GetMailboxes())
	}
	resp, err := http.Get("http://" + n.HTTPAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz %d: a controlled runner with no mailbox is ready (its own rule would say no mailbox open)", resp.StatusCode)
	}
	resp, err = http.Get("http://" + n.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "prism_runner_control_calls_total") {
		t.Fatal("/metrics lacks the control API's metrics")
	}
}
