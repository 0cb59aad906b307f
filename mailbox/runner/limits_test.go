package runner

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/internal/connlimit"
)

func serveLimited(t *testing.T, streams uint32, idle time.Duration) (queryAddr, httpAddr string) {
	t.Helper()
	r, err := New(Config{DataDir: t.TempDir(), Brokers: []string{"127.0.0.1:1"}, MaxStreams: streams, Conn: connlimit.Bounds{Idle: idle}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return serve(t, r)
}

// TestIdleConnectionsAreClosed: a connection that asked once and then
// nothing is closed by both ports after the idle bound.
func TestIdleConnectionsAreClosed(t *testing.T) {
	t.Parallel()
	queryAddr, httpAddr := serveLimited(t, 0, 200*time.Millisecond)
	for name, addr := range map[string]string{"query port": queryAddr, "http port": httpAddr} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: runner\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
				t.Fatalf("idle connection: read %v, want the server to close it (EOF)", err)
			}
		})
	}
}

// TestQueryPortStreamsPerConnection: calls beyond MaxStreams on one
// connection wait for a stream to end instead of being taken on.
func TestQueryPortStreamsPerConnection(t *testing.T) {
	t.Parallel()
	queryAddr, _ := serveLimited(t, 2, 0)
	cc, err := grpc.NewClient(queryAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cancels []context.CancelFunc
	for range 2 {
		wctx, wcancel := context.WithCancel(ctx)
		cancels = append(cancels, wcancel)
		w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil { // the server has taken the stream on
			t.Fatal(err)
		}
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := hc.Check(short, &healthpb.HealthCheckRequest{}); grpcstatus.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a third call beside two open streams = %v, want it to wait (DeadlineExceeded)", err)
	}
	cancels[0]()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check once a stream ended: %v", err)
	}
	cancels[1]()
}
