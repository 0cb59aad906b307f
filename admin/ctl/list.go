package ctl

import (
	"context"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// listPageSize is --page-size's default: the admin's cap, so a large table
// takes the fewest calls, each answer still within 2 MiB (the admin cuts
// pages there).
const listPageSize = 10000

// paged is a List call's answer (admin.proto, Paging).
type paged interface {
	proto.Message
	mesh.Page
}

// pageSizeFlag adds --page-size to a list command.
func pageSizeFlag(cmd *cobra.Command, size *int32) {
	cmd.Flags().Int32Var(size, "page-size", listPageSize, "items per call; the list asks page after page until it has every item (0: the admin's default, 1,000)")
}

// runList is run for a paged List call: list asks for the page at token,
// and the pages show as one answer (see listAll). --timeout bounds each
// page, retries included, so a table of a million leases is not cut short.
func runList[T paged](cmd *cobra.Command, g *globals, list func(ctx context.Context, cc *grpc.ClientConn, token string) (T, error), table func(io.Writer, T)) error {
	c, err := connect(cmd, g)
	if err != nil {
		return err
	}
	defer c.Close()
	all, err := listAll(cmd.Context(), g.timeout, c, list)
	if err != nil {
		return err
	}
	return output(cmd, g, all, table)
}

// listAll asks a List call for every page, each within perPage (0: ctx's
// deadline only) and retried like any read, and merges them into the first:
// every page's items in order, the scalars (index) of the last page, no
// next_page_token.
func listAll[T paged](ctx context.Context, perPage time.Duration, c *client.Client, list func(ctx context.Context, cc *grpc.ClientConn, token string) (T, error)) (T, error) {
	var all T
	first := true
	err := mesh.AllPages(func(token string) (T, error) {
		ctx, cancel := ctx, context.CancelFunc(func() {})
		if perPage > 0 {
			ctx, cancel = context.WithTimeout(ctx, perPage)
		}
		defer cancel()
		return call(ctx, c, client.Idempotent, func(ctx context.Context, cc *grpc.ClientConn) (T, error) {
			return list(ctx, cc, token)
		})
	}, func(p T) {
		if first {
			all, first = p, false
			return
		}
		proto.Merge(all, p)
	})
	if err != nil {
		var zero T
		return zero, err
	}
	m := all.ProtoReflect()
	m.Clear(m.Descriptor().Fields().ByName("next_page_token"))
	return all, nil
}

// listPage is what a list command asks one page with: --consistent's
// consistency, --page-size and the token of the page.
type listPage struct {
	consistency adminv1.Consistency
	size        int32
	token       string
}

// listCommand is the `list` command of a paged Admin call: page asks for one
// page, table prints every page merged into one answer (runList). It adds
// --page-size; consistent is the command's --consistent, which the caller
// registers.
func listCommand[T paged](g *globals, short string, consistent *bool, page func(ctx context.Context, a adminv1.AdminClient, p listPage) (T, error), table func(io.Writer, T)) *cobra.Command {
	var size int32
	cmd := &cobra.Command{
		Use: "list", Short: short, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runList(cmd, g, func(ctx context.Context, cc *grpc.ClientConn, token string) (T, error) {
				return page(ctx, adminv1.NewAdminClient(cc), listPage{consistency: consistency(*consistent), size: size, token: token})
			}, table)
		},
	}
	pageSizeFlag(cmd, &size)
	return cmd
}
