package ctl

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/prism-mesh/prism/admin/backup"
	"github.com/prism-mesh/prism/admin/client"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

func snapshotCommand(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "snapshot", Short: "Save the cluster's state to a file (restore it with prism admin restore)"}
	c.AddCommand(&cobra.Command{
		Use:   "save FILE",
		Short: "Stream a consistent snapshot from the leader into FILE",
		Long: `Stream a consistent copy of every table (namespaces, proxies, leases, sessions,
members) from the leader, taken after a ReadIndex barrier, into FILE: written to
a temporary file, checked against the leader's SHA-256, then renamed, so FILE is
either whole or untouched. Operators only. prism admin restore --snapshot FILE
builds a new cluster from it (docs/operations.md). One call gets the whole
--timeout, not --attempt-timeout.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := args[0]
			whole := *g
			whole.attempt = g.timeout
			return run(cmd, &whole, client.Idempotent, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.SnapshotInfo, error) {
				return backup.Save(ctx, adminv1.NewAdminClient(cc), path)
			}, func(w io.Writer, info *adminv1.SnapshotInfo) {
				fmt.Fprintf(w, "saved\t%s\n", path)
				fmt.Fprintf(w, "from\t%s at %s\n", info.GetNodeId(), ts(info.GetSavedAt()))
				fmt.Fprintf(w, "index/term\t%d/%d\n", info.GetIndex(), info.GetTerm())
				fmt.Fprintf(w, "namespaces/proxies/leases/sessions\t%d/%d/%d/%d\n",
					info.GetNamespaceCount(), info.GetProxyCount(), info.GetLeaseCount(), info.GetSessionCount())
				fmt.Fprintf(w, "bytes\t%d\n", info.GetSize())
				fmt.Fprintf(w, "sha256\t%s\n", hex.EncodeToString(info.GetSha256()))
			})
		},
	})
	return c
}
