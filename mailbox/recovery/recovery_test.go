package recovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/prism-mesh/prism/mailbox/store"
	"github.com/prism-mesh/prism/mesh/identity"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

var quiet = slog.New(slog.DiscardHandler)

// source is one store served as the mailbox "ns@p1" to proxy p2.
type source struct {
	st        *store.Store
	snapshots atomic.Int32
}

func (s *source) RecoveryAllowed(id, caller string) error {
	if caller != "p2" {
		return status.Error(codes.PermissionDenied, "not p2")
	}
	if id != "ns@p1" {
		return status.Error(codes.NotFound, "not held")
	}
	return nil
}

func (s *source) RecoverySnapshot(string) (*store.Snapshot, []store.Position, error) {
	s.snapshots.Add(1)
	sn, err := s.st.Snapshot()
	return sn, []store.Position{{Topic: "t", Partition: 0, Next: 77}}, err
}

// serve serves srv on an in-memory listener, every caller taken to be proxy p2.
func serve(t *testing.T, srv *Server) runnerv1.MailboxRecoveryClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	as := identity.Identity{TrustDomain: identity.DefaultTrustDomain, Role: identity.Proxy, Name: "p2"}
	g := grpc.NewServer(grpc.ChainStreamInterceptor(func(s any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(s, &withCaller{ss, identity.WithCaller(ss.Context(), as)})
	}))
	srv.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient("passthrough:///bufnet", grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return lis.DialContext(ctx)
	}), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return runnerv1.NewMailboxRecoveryClient(cc)
}

// dialTo is a Dial that hands out c.
func dialTo(c runnerv1.MailboxRecoveryClient) func() (runnerv1.MailboxRecoveryClient, io.Closer, error) {
	return func() (runnerv1.MailboxRecoveryClient, io.Closer, error) { return c, io.NopCloser(nil), nil }
}

type withCaller struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *withCaller) Context() context.Context { return s.ctx }

// cutting is a client whose streams fail after n messages each, as a connection cut mid-copy; corrupt flips a
// byte of the first chunk it passes on instead.
type cutting struct {
	runnerv1.MailboxRecoveryClient
	n       atomic.Int64
	corrupt atomic.Bool
	streams atomic.Int32
}

func (c *cutting) FetchMailbox(ctx context.Context, in *runnerv1.FetchMailboxRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[runnerv1.FetchMailboxResponse], error) {
	c.streams.Add(1)
	s, err := c.MailboxRecoveryClient.FetchMailbox(ctx, in, opts...)
	return &cutStream{ServerStreamingClient: s, c: c}, err
}

type cutStream struct {
	grpc.ServerStreamingClient[runnerv1.FetchMailboxResponse]
	c    *cutting
	seen int
}

func (s *cutStream) Recv() (*runnerv1.FetchMailboxResponse, error) {
	if int64(s.seen) == s.c.n.Load() {
		return nil, status.Error(codes.Unavailable, "cut")
	}
	s.seen++
	m, err := s.ServerStreamingClient.Recv()
	if err == nil && len(m.GetEntries()) > 0 && s.c.corrupt.CompareAndSwap(true, false) {
		m.Entries[0].Value = append([]byte{0}, m.Entries[0].GetValue()...)
	}
	return m, err
}

func fill(t *testing.T, n int) *store.Store {
	t.Helper()
	st, err := store.Open(store.Options{InMemory: true, ID: "ns@p1", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	items := make([]*mailboxv1.MailboxItem, n)
	for i := range items {
		items[i] = &mailboxv1.MailboxItem{MessageId: fmt.Sprintf("m-%05d", i), Timestamp: int64(i), Topic: "t", EnvelopeBlob: make([]byte, 300)}
	}
	if _, err := st.Write(context.Background(), items); err != nil {
		t.Fatal(err)
	}
	return st
}

func seedInto(t *testing.T, client runnerv1.MailboxRecoveryClient) (*store.DB, *Copied, error) {
	t.Helper()
	db, err := store.OpenDB(store.DBOptions{Dir: t.TempDir(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	copied, err := Seed(context.Background(), SeedConfig{DB: db, MailboxID: "ns@p2", SourceID: "ns@p1", Dial: dialTo(client),
		GiveUp: 5 * time.Second, BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond, Logger: quiet})
	return db, copied, err
}

// finish makes the copy the mailbox and says how many events it holds.
func finish(t *testing.T, db *store.DB, c *Copied) int64 {
	t.Helper()
	if err := c.Import.Finish(c.Positions, store.Recovery{Copied: true}); err != nil {
		t.Fatal(err)
	}
	st, err := db.Open(store.Options{ID: "ns@p2", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	return st.Usage().Events
}

// TestSeedResumesACutStream: streams cut every few chunks resume on the same snapshot from the last key received,
// so the copy ends whole, from one snapshot, with the positions of its last message.
func TestSeedResumesACutStream(t *testing.T) {
	t.Parallel()
	src := &source{st: fill(t, 2000)}
	srv := NewServer(ServerConfig{Source: src, ChunkBytes: 16 << 10, Logger: quiet})
	client := &cutting{MailboxRecoveryClient: serve(t, srv)}
	client.n.Store(3)
	db, copied, err := seedInto(t, client)
	if err != nil {
		t.Fatal(err)
	}
	if got := finish(t, db, copied); got != 2000 {
		t.Fatalf("copy holds %d events, want 2000", got)
	}
	if client.streams.Load() < 3 || src.snapshots.Load() != 1 {
		t.Fatalf("%d streams over %d snapshots: want several streams resuming one snapshot", client.streams.Load(), src.snapshots.Load())
	}
	if len(copied.Positions) != 1 || copied.Positions[0].Next != 77 || copied.Done.GetEvents() != 2000 {
		t.Fatalf("positions %+v, done %v", copied.Positions, copied.Done)
	}
}

// TestSeedStartsOverWhenTheSnapshotIsGone: a resume the source no longer holds the snapshot for (it restarted)
// is ABORTED, and the seed drops what it had and copies a new snapshot whole; so does a chunk whose checksum
// does not match.
func TestSeedStartsOverWhenTheSnapshotIsGone(t *testing.T) {
	t.Parallel()
	src := &source{st: fill(t, 2000)}
	first := NewServer(ServerConfig{Source: src, ChunkBytes: 16 << 10, Logger: quiet})
	// The first server lets go of its snapshot as soon as the stream is cut: the source "restarted".
	first.cfg.Linger = time.Nanosecond
	client := &cutting{MailboxRecoveryClient: serve(t, first)}
	client.n.Store(3)
	client.corrupt.Store(true)
	go func() {
		// After the first cut, every stream runs to its end.
		for client.streams.Load() < 2 {
			time.Sleep(time.Millisecond)
		}
		client.n.Store(1 << 30)
	}()
	db, copied, err := seedInto(t, client)
	if err != nil {
		t.Fatal(err)
	}
	if got := finish(t, db, copied); got != 2000 {
		t.Fatalf("copy holds %d events, want 2000", got)
	}
	if src.snapshots.Load() < 2 {
		t.Fatalf("%d snapshots: the copy did not start over", src.snapshots.Load())
	}
}

// TestSeedGivesUp: a source that refuses for longer than GiveUp is given up, and nothing of the import is left.
func TestSeedGivesUp(t *testing.T) {
	t.Parallel()
	src := &source{st: fill(t, 10)}
	srv := NewServer(ServerConfig{Source: src, Logger: quiet})
	db, err := store.OpenDB(store.DBOptions{InMemory: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, err = Seed(context.Background(), SeedConfig{DB: db, MailboxID: "ns@p2", SourceID: "other@p1", Dial: dialTo(serve(t, srv)),
		GiveUp: 50 * time.Millisecond, BackoffMin: time.Millisecond, Logger: quiet})
	if status.Code(err) != codes.NotFound || !errors.Is(err, ErrGaveUp) {
		t.Fatalf("Seed = %v, want NotFound given up", err)
	}
	if on, _ := db.Importing("ns@p2"); on {
		t.Fatal("a given-up import is left")
	}
	if srv.Held() != 0 {
		t.Fatalf("a refused copy holds %d snapshots", srv.Held())
	}
}
