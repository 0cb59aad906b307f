// Package xdsenvoy runs a real Envoy against the in-process control plane
// with the bootstrap from envoy/, and queries through it. It needs an envoy
// binary on PATH and skips, saying so, without one.
package xdsenvoy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/envoy"
	"github.com/prism-mesh/prism/internal/testproc"
	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/xds/ir"
	"github.com/prism-mesh/prism/xds/translator"
	"github.com/prism-mesh/prism/xds/xdstest"
)

func TestEnvoyGatewayRoutesByMailbox(t *testing.T) {
	bin, err := exec.LookPath("envoy")
	if err != nil {
		t.Skip("envoy not on PATH: skipping the real-Envoy gateway test (resources are still checked by golden tests and ValidateAll)")
	}
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cp, err := xdstest.StartControlPlane(log, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	runner, err := xdstest.StartRunner("runner-a")
	if err != nil {
		t.Fatal(err)
	}
	defer runner.Close()

	gateway, admin := testproc.FreeAddr(t), testproc.FreeAddr(t)
	cp.Update(&ir.IR{
		Version:   1,
		Gateway:   ir.Gateway{Address: gateway},
		NotFound:  []string{cp.Addr},
		Runners:   []ir.Runner{{ID: runner.ID, Address: runner.Addr, Healthy: true}},
		Mailboxes: []ir.Mailbox{{ID: "$admin@proxy-01", Namespace: "$admin", RunnerID: runner.ID, Epoch: 7}},
	})

	boot, err := envoy.YAML(envoy.Config{NodeID: "test-gateway", AdminNodes: []string{cp.Addr}, AdminAddress: admin})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "bootstrap.yaml")
	if err := os.WriteFile(path, boot, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-c", path, "--base-id", fmt.Sprint(time.Now().UnixNano()%100000),
		"--log-level", "warn", "--disable-hot-restart")
	logf, err := os.Create(filepath.Join(dir, "envoy.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("envoy log:\n%s", b)
		}
	}()

	// Unknown mailbox over HTTP: the direct 404 with a JSON body.
	var resp *http.Response
	poll(t, "gateway answers HTTP", func() bool {
		r, err := http.Get("http://" + gateway + "/v1/mailboxes/nobody@proxy-09/events") //nolint:bodyclose // closed below, after the poll
		if err != nil {
			return false
		}
		resp = r
		return true
	})
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get("content-type") != "application/json" || string(body) != translator.NotFoundBody {
		t.Fatalf("unknown mailbox over HTTP: %d %q %s", resp.StatusCode, resp.Header.Get("content-type"), body)
	}

	// gRPC through Envoy: routed by x-mailbox-id, answered by the owner, who
	// answered named in the response headers.
	conn, err := grpc.NewClient(gateway, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := mailboxv1.NewMailboxQueryClient(conn)
	var hdr metadata.MD
	poll(t, "gRPC routed to the runner", func() bool {
		ctx := metadata.AppendToOutgoingContext(context.Background(), mesh.HeaderMailboxID, "$admin@proxy-01")
		_, err := client.GetStats(ctx, &mailboxv1.GetStatsRequest{}, grpc.Header(&hdr))
		return err == nil
	})
	if got := hdr.Get(xdstest.RunnerHeader); len(got) != 1 || got[0] != runner.ID {
		t.Errorf("answered by %v, want %s", got, runner.ID)
	}
	if m, e := hdr.Get(mesh.HeaderMailbox), hdr.Get(mesh.HeaderEpoch); len(m) != 1 || m[0] != "$admin@proxy-01" || len(e) != 1 || e[0] != "7" {
		t.Errorf("x-prism-mailbox %v x-prism-epoch %v, want $admin@proxy-01 and 7", m, e)
	}

	// Unknown mailbox over gRPC through Envoy: NotFound from the admin node.
	uctx := metadata.AppendToOutgoingContext(context.Background(), mesh.HeaderMailboxID, "ghost@proxy-02")
	if _, err := client.GetStats(uctx, &mailboxv1.GetStatsRequest{}); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "ghost@proxy-02") {
		t.Errorf("unknown mailbox over gRPC: %v, want NotFound naming it", err)
	}
}

func poll(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
