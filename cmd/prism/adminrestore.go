package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/prism-mesh/prism/admin/backup"
)

// backupFlags are prism admin's periodic snapshot files.
type backupFlags struct {
	dir      string
	interval time.Duration
	retain   int
}

func (b *backupFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&b.dir, "backup-dir", "", "write a snapshot file of this node's state here every --backup-interval (every node writes its own; prism admin restore reads one); empty writes none")
	fs.DurationVar(&b.interval, "backup-interval", time.Hour, "how often --backup-dir gets a snapshot file")
	fs.IntVar(&b.retain, "backup-retain", 24, "snapshot files of this node kept in --backup-dir; older ones are removed")
}

func (b backupFlags) config() (backup.PeriodicConfig, error) {
	if b.dir == "" {
		return backup.PeriodicConfig{}, nil
	}
	if b.interval <= 0 || b.retain < 1 {
		return backup.PeriodicConfig{}, errors.New("--backup-interval must be positive and --backup-retain at least 1")
	}
	return backup.PeriodicConfig{Dir: b.dir, Interval: b.interval, Retain: b.retain}, nil
}

type restoreFlags struct {
	snapshot  string
	dataDir   string
	nodeID    string
	peers     string
	minTerm   uint64
	logLevel  string
	logFormat string
}

func adminRestoreCommand() *cobra.Command {
	var f restoreFlags
	cmd := &cobra.Command{
		Use:   "restore",
		Short: "Build a new admin node's data dir from a snapshot file (disaster recovery)",
		Long: `Build a new admin node's --data-dir from a file prismctl snapshot save or
--backup-dir wrote, as etcdutl snapshot restore does for etcd. Run it for every
node of the new cluster with the same --snapshot and --peers and each node's own
--node-id and empty --data-dir, then start each node with prism admin and the
same --node-id, --data-dir and --peers.

The file's checksum is verified first; a non-empty data dir is refused. Every
lease and session in the snapshot is revoked: sidecars open new sessions and
re-acquire, at epochs above every epoch granted before the snapshot, because the
new cluster's terms start 65,536 above the snapshot's (or above --min-term):
no old holder can act on a lease the new cluster grants (docs/operations.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runRestore(cmd, f)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.snapshot, "snapshot", "", "snapshot file (required)")
	fs.StringVar(&f.dataDir, "data-dir", "", "the new node's data dir, empty or absent (required)")
	fs.StringVar(&f.nodeID, "node-id", "", "the new node's raft server id, one of --peers (required)")
	fs.StringVar(&f.peers, "peers", "", "the new cluster's voters, id=raft_addr=grpc_addr,... as prism admin --peers (required)")
	fs.Uint64Var(&f.minTerm, "min-term", 0, "the last raft term the old cluster is known to have reached, when more than 65,536 elections may have followed the snapshot")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&f.logFormat, "log-format", "json", "log format: json or text")
	return cmd
}

func runRestore(cmd *cobra.Command, f restoreFlags) error {
	log, err := newLogger(f.logLevel, f.logFormat)
	if err != nil {
		return err
	}
	if f.snapshot == "" || f.dataDir == "" || f.nodeID == "" || f.peers == "" {
		return errors.New("--snapshot, --data-dir, --node-id and --peers are required")
	}
	peers, grpcAddrs, err := parsePeers(f.peers)
	if err != nil {
		return err
	}
	res, err := backup.RestoreFile(f.snapshot, backup.Options{
		DataDir: f.dataDir, NodeID: f.nodeID, Peers: peers, GRPCAddrs: grpcAddrs, MinTerm: f.minTerm, Logger: log,
	})
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "restored %s into %s: %d namespaces, %d proxies; %d leases and %d sessions revoked; starts at index %d, term %d\n",
		f.snapshot, f.dataDir, res.Info.GetNamespaceCount(), res.Info.GetProxyCount(), res.RevokedLeases, res.RevokedSessions, res.Index, res.Term)
	return err
}
