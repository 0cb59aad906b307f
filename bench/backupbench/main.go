// Command backupbench times the admin's disaster-recovery path on a large
// state and prints BENCH lines:
//
//	admin.restore_s_100k        prism admin restore's work: read and verify a
//	                            snapshot file, revoke its leases and sessions,
//	                            write the new node's raft snapshot and stores
//	admin.snapshot_save_s_100k  prismctl snapshot save's: Admin.SaveSnapshot on a
//	                            running node (ReadIndex barrier, FSM copy,
//	                            persist, SHA-256) streamed over loopback gRPC
//	                            into a file, synced and renamed
//
// The state is built directly in an FSM by applying commands at increasing
// indexes (no Raft, no gRPC: building 100k objects through a cluster would
// time the build, not the backup): -n namespaces on one proxy, each with its
// mailbox's lease, granted in one session by bulk acquires. The save runs on
// a single admin node, in plaintext, whose raft snapshot is that FSM.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/admin/backup"
	"github.com/prism-mesh/prism/admin/fsm"
	"github.com/prism-mesh/prism/admin/raftnode"
	"github.com/prism-mesh/prism/admin/server"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

func main() {
	n := flag.Int("n", 100_000, "namespaces, and leases (one per namespace)")
	suffix := flag.String("suffix", "100k", "figure name suffix")
	flag.Parse()
	if err := run(*n, *suffix); err != nil {
		log.Fatal(err)
	}
}

func run(n int, suffix string) error {
	tmp, err := os.MkdirTemp("", "backupbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	start := time.Now()
	f, err := build(n)
	if err != nil {
		return err
	}
	seed := filepath.Join(tmp, "seed.snap")
	info, data, err := backup.Capture(f, fixedNode{}, time.Now())
	if err != nil {
		return err
	}
	if err := backup.WriteFile(seed, info, bytes.NewReader(data)); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "# built %d namespaces and %d leases in an FSM in %s; snapshot file %d bytes\n",
		info.GetNamespaceCount(), info.GetLeaseCount(), time.Since(start).Round(time.Millisecond), info.GetSize())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	peers := []raftnode.Peer{{ID: "admin-1", Addr: ln.Addr().String()}}
	start = time.Now()
	res, err := backup.RestoreFile(seed, backup.Options{DataDir: filepath.Join(tmp, "restored"), NodeID: "admin-1", Peers: peers})
	if err != nil {
		return err
	}
	restore := time.Since(start)
	fmt.Printf("BENCH admin.restore_s_%s %.3f s\n", suffix, restore.Seconds())
	fmt.Fprintf(os.Stderr, "# restore revoked %d leases and %d sessions\n", res.RevokedLeases, res.RevokedSessions)

	// The node saved from holds the leases too: its raft snapshot is the
	// built FSM as is (raftnode.Restore, without the revocation).
	dir := filepath.Join(tmp, "admin-1")
	if err := raftnode.Restore(dir, "admin-1", raftnode.Seed{Index: info.GetIndex(), Term: 2, Peers: peers, FSM: bytes.NewReader(data)}); err != nil {
		return err
	}
	node, err := server.Start(server.NodeConfig{
		Raft:     raftnode.Config{ID: "admin-1", DataDir: dir, Listener: ln, Timing: raftnode.FastTiming()},
		GRPCAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = node.Stop(ctx)
	}()
	cc, err := grpc.NewClient(node.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := awaitLeader(ctx, node); err != nil {
		return err
	}
	out := filepath.Join(tmp, "saved.snap")
	start = time.Now()
	saved, err := backup.Save(ctx, adminv1.NewAdminClient(cc), out)
	if err != nil {
		return err
	}
	save := time.Since(start)
	if saved.GetNamespaceCount() != uint64(n) || saved.GetLeaseCount() != uint64(n) {
		return fmt.Errorf("saved %d namespaces and %d leases, want %d of each", saved.GetNamespaceCount(), saved.GetLeaseCount(), n)
	}
	fmt.Printf("BENCH admin.snapshot_save_s_%s %.3f s\n", suffix, save.Seconds())
	fmt.Fprintf(os.Stderr, "# saved file %d bytes\n", saved.GetSize())
	return nil
}

func awaitLeader(ctx context.Context, node *server.Node) error {
	for {
		l, changed := node.Raft.Leadership()
		if l.IsLeader {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("the restored node never led: %w", ctx.Err())
		}
	}
}

// build applies a proxy, n namespaces, a session and n leases to a new FSM.
func build(n int) (*fsm.FSM, error) {
	f := fsm.New(fsm.WithLogger(slog.New(slog.DiscardHandler)))
	var index uint64
	now := timestamppb.Now()
	apply := func(cmd *adminv1.Command) (any, error) {
		cmd.Now = now
		b, err := fsm.Encode(cmd)
		if err != nil {
			return nil, err
		}
		index++
		res := f.Apply(&raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: b})
		if err, ok := res.(error); ok {
			return nil, err
		}
		return res, nil
	}
	if _, err := apply(&adminv1.Command{Body: &adminv1.Command_RegisterProxy{RegisterProxy: &adminv1.RegisterProxyRequest{
		Registration: &adminv1.ProxyRegistration{ProxyId: "p1", Address: "10.0.0.1:8980", RunnerId: "r1", Version: "0.1.0"},
	}}}); err != nil {
		return nil, err
	}
	cfg := &adminv1.NamespaceConfig{Topics: []string{"events"}, Lease: &adminv1.LeaseConfig{
		Ttl: durationpb.New(20 * time.Second), HeartbeatInterval: durationpb.New(5 * time.Second), Grace: durationpb.New(7 * time.Second),
	}}
	mailboxes := make([]string, n)
	for i := range n {
		ns := fmt.Sprintf("ns-%06d", i)
		if _, err := apply(&adminv1.Command{Body: &adminv1.Command_CreateNamespace{CreateNamespace: &adminv1.CreateNamespaceRequest{Namespace: ns, Config: cfg}}}); err != nil {
			return nil, err
		}
		mailboxes[i] = ns + "@p1"
	}
	res, err := apply(&adminv1.Command{Body: &adminv1.Command_OpenSession{OpenSession: &adminv1.OpenSessionRequest{ProxyId: "p1", RunnerId: "r1", RunnerAddress: "10.0.0.1:9090"}}})
	if err != nil {
		return nil, err
	}
	sid := res.(*adminv1.OpenSessionResponse).GetSession().GetId()
	for len(mailboxes) > 0 {
		k := min(len(mailboxes), fsm.MaxBulkLeases)
		res, err := apply(&adminv1.Command{Body: &adminv1.Command_AcquireLeases{AcquireLeases: &adminv1.AcquireLeasesRequest{ProxyId: "p1", SessionId: sid, MailboxIds: mailboxes[:k]}}})
		if err != nil {
			return nil, err
		}
		for _, r := range res.(*adminv1.AcquireLeasesResponse).GetResults() {
			if !r.GetOk() {
				return nil, fmt.Errorf("acquire %s refused: %v", r.GetMailboxId(), r.GetRefusal())
			}
		}
		mailboxes = mailboxes[k:]
	}
	return f, nil
}

type fixedNode struct{}

func (fixedNode) ID() string   { return "old-1" }
func (fixedNode) Term() uint64 { return 1 }
