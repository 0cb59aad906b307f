package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/prism-mesh/prism/admin/client"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Moves by handoff (docs/architecture.md#moves): prismctl proxy drain and
// uncordon, namespace move, move list. A command that waits (--wait,
// --watch) polls ListMoves, which the leader answers with the
// destinations' lag, and writes its progress lines on stderr, so stdout
// holds only the answer in --format.

// waitTimeout is --timeout for a command that waits, unless given: a drain
// or a move takes as long as catching up does, far beyond one call's 15s.
const waitTimeout = 10 * time.Minute

// waiting is a command that polls until a condition holds.
type waiting struct {
	wait     bool
	interval time.Duration
}

func (w *waiting) flags(c *cobra.Command, what string) {
	c.Flags().BoolVar(&w.wait, "wait", false, "wait until "+what+", printing progress on stderr (--timeout defaults to 10m)")
	c.Flags().DurationVar(&w.interval, "interval", time.Second, "how often --wait asks for progress")
}

// deadline is the context of a command that may wait: --timeout, or
// waitTimeout when it waits and --timeout was not given.
func deadline(cmd *cobra.Command, g *globals, waits bool) (context.Context, context.CancelFunc) {
	d := g.timeout
	if waits && !cmd.Flag("timeout").Changed {
		d = waitTimeout
	}
	return context.WithTimeout(cmd.Context(), d)
}

// poll calls check every interval until it reports done, printing each
// progress line that differs from the one before on stderr.
func poll(ctx context.Context, cmd *cobra.Command, interval time.Duration, check func(context.Context) (done bool, progress string, err error)) error {
	last := ""
	for {
		done, progress, err := check(ctx)
		if err != nil {
			return err
		}
		if progress != "" && progress != last {
			fmt.Fprintln(cmd.ErrOrStderr(), progress)
			last = progress
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return describe(status.Errorf(codes.DeadlineExceeded, "gave up waiting (--timeout); last seen: %s", orDash(last)))
		case <-time.After(interval):
		}
	}
}

func call[T proto.Message](ctx context.Context, c *client.Client, r client.Repeatable, f func(context.Context, *grpc.ClientConn) (T, error)) (T, error) {
	resp, err := client.Do(ctx, c, r, f)
	if err != nil {
		var zero T
		return zero, describe(err)
	}
	return resp, nil
}

// listMoves is every move, in as many pages as it takes.
func listMoves(ctx context.Context, c *client.Client) (*adminv1.ListMovesResponse, error) {
	return listAll(ctx, 0, c, listMovesPage(listPageSize))
}

func listMovesPage(size int32) func(context.Context, *grpc.ClientConn, string) (*adminv1.ListMovesResponse, error) {
	return func(ctx context.Context, cc *grpc.ClientConn, token string) (*adminv1.ListMovesResponse, error) {
		return adminv1.NewAdminClient(cc).ListMoves(ctx, &adminv1.ListMovesRequest{PageSize: size, PageToken: token})
	}
}

func state(m *adminv1.NamespaceMove) string {
	if m.GetState() == adminv1.MoveState_MOVE_STATE_HANDING_OFF {
		return "handing off"
	}
	return "catching up"
}

func lag(m *adminv1.NamespaceMove) string {
	if !m.GetLagKnown() {
		return "?"
	}
	return fmt.Sprint(m.GetLag())
}

func movesTable(w io.Writer, r *adminv1.ListMovesResponse) {
	fmt.Fprintln(w, "NAMESPACE\tFROM\tTO\tSTATE\tLAG\tREASON\tSTARTED\tSWITCHED\tHANDOFF UNTIL\tRECOVERY")
	for _, m := range r.GetMoves() {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.GetNamespace(), m.GetFromProxyId(), m.GetToProxyId(), state(m), lag(m),
			strings.ToLower(strings.TrimPrefix(m.GetReason().String(), "MOVE_REASON_")), ts(m.GetStartedAt()), ts(m.GetSwitchedAt()), ts(m.GetHandoffUntil()),
			recovery(m.GetRecovery()))
	}
	if p := r.GetPending(); p > 0 {
		fmt.Fprintf(w, "\n%d planned moves wait for room under the leader's --max-concurrent-moves\n", p)
	}
}

func moveCommand(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "move", Short: "Moves by handoff in progress (catching up, handing off)"}
	var (
		watch    bool
		interval time.Duration
		pageSize int32
	)
	list := &cobra.Command{
		Use: "list", Short: "List moves in progress and handoff tails with the destination's lag, as the leader knows it", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !watch {
				return runList(cmd, g, listMovesPage(pageSize), movesTable)
			}
			cl, err := connect(cmd, g)
			if err != nil {
				return err
			}
			defer cl.Close()
			// A watch runs until interrupted, or --timeout when given.
			ctx, cancel := context.WithCancel(cmd.Context())
			if cmd.Flag("timeout").Changed {
				ctx, cancel = context.WithTimeout(cmd.Context(), g.timeout)
			}
			defer cancel()
			var last *adminv1.ListMovesResponse
			for {
				r, err := listAll(ctx, 0, cl, listMovesPage(pageSize))
				switch {
				case ctx.Err() != nil:
					return nil
				case err != nil:
					return err
				}
				r.Index = 0 // every answer has a new one; print only changes
				if last == nil || !proto.Equal(last, r) {
					if last != nil && (g.format == "table" || g.wide()) {
						fmt.Fprintln(cmd.OutOrStdout())
					}
					if err := output(cmd, g, r, movesTable); err != nil {
						return err
					}
					last = r
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(interval):
				}
			}
		},
	}
	list.Flags().BoolVarP(&watch, "watch", "w", false, "print the list again whenever it changes, until interrupted (or --timeout, when given)")
	list.Flags().DurationVar(&interval, "interval", time.Second, "how often --watch asks")
	pageSizeFlag(list, &pageSize)
	c.AddCommand(list)
	return c
}

// drainCommands are proxy drain and proxy uncordon.
func drainCommands(g *globals) []*cobra.Command {
	var w waiting
	drain := &cobra.Command{
		Use:   "drain PROXY",
		Short: "Cordon a proxy: it takes no namespaces, and its namespaces move off by handoff",
		Long: `Cordon a proxy (an operator's cordon, which lasts until prismctl proxy
uncordon): placement leaves it out, so each of its namespaces moves by
handoff to the proxy hashing now places it on, at most the leader's
--max-concurrent-moves at a time, while the proxy keeps serving it until
the switch and its handoff tail. With --wait, prismctl waits until the
proxy serves no namespace.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cordon(cmd, g, args[0], true, w)
		},
	}
	w.flags(drain, "the proxy serves no namespace")
	uncordon := &cobra.Command{
		Use:   "uncordon PROXY",
		Short: "Clear a proxy's cordon: placement uses it again, and namespaces it now owns move back by handoff",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cordon(cmd, g, args[0], false, waiting{})
		},
	}
	return []*cobra.Command{drain, uncordon}
}

func cordon(cmd *cobra.Command, g *globals, proxy string, on bool, w waiting) error {
	cl, err := connect(cmd, g)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := deadline(cmd, g, w.wait)
	defer cancel()
	resp, err := call(ctx, cl, client.Idempotent, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.CordonProxyResponse, error) {
		return adminv1.NewAdminClient(cc).CordonProxy(ctx, &adminv1.CordonProxyRequest{ProxyId: proxy, Cordoned: on})
	})
	if err != nil {
		return err
	}
	if err := output(cmd, g, resp, func(w io.Writer, r *adminv1.CordonProxyResponse) {
		verb := map[bool]string{true: "cordoned", false: "uncordoned"}[on]
		if !r.GetChanged() {
			fmt.Fprintf(w, "%s was already %s\n", proxy, verb)
		} else {
			fmt.Fprintf(w, "%s %s at index %d\n", verb, proxy, r.GetIndex())
		}
		if !on && r.GetProxy().GetDrainingInstance() != "" {
			fmt.Fprintf(w, "%s is still draining itself (its pod is stopping): that ends when its next sidecar process registers\n", proxy)
		}
	}); err != nil {
		return err
	}
	if !w.wait {
		return nil
	}
	return poll(ctx, cmd, w.interval, func(ctx context.Context) (bool, string, error) {
		return drained(ctx, cl, proxy)
	})
}

// drained reports whether proxy serves no namespace (none assigned, none in
// a handoff tail from it) and describes what it still serves.
func drained(ctx context.Context, cl *client.Client, proxy string) (bool, string, error) {
	info, err := call(ctx, cl, client.Idempotent, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.GetProxyResponse, error) {
		return adminv1.NewAdminClient(cc).GetProxy(ctx, &adminv1.GetProxyRequest{ProxyId: proxy, Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
	})
	if err != nil {
		return false, "", err
	}
	moves, err := listMoves(ctx, cl)
	if err != nil {
		return false, "", err
	}
	var catching, handing []string
	for _, m := range moves.GetMoves() {
		switch {
		case m.GetFromProxyId() != proxy:
		case m.GetState() == adminv1.MoveState_MOVE_STATE_HANDING_OFF:
			handing = append(handing, fmt.Sprintf("%s to %s", m.GetNamespace(), m.GetToProxyId()))
		default:
			catching = append(catching, fmt.Sprintf("%s on %s lag %s", m.GetNamespace(), m.GetToProxyId(), lag(m)))
		}
	}
	assigned := len(info.GetProxy().GetNamespaces())
	if assigned == 0 && len(handing) == 0 {
		return true, fmt.Sprintf("%s drained: it serves no namespace", proxy), nil
	}
	waiting := assigned - len(catching)
	var parts []string
	if len(catching) > 0 {
		parts = append(parts, fmt.Sprintf("%d catching up (%s)", len(catching), strings.Join(catching, ", ")))
	}
	if len(handing) > 0 {
		parts = append(parts, fmt.Sprintf("%d switched, handing off (%s)", len(handing), strings.Join(handing, ", ")))
	}
	if waiting > 0 {
		parts = append(parts, fmt.Sprintf("%d not started yet", waiting))
	}
	return false, fmt.Sprintf("%s serves %d namespaces: %s", proxy, assigned+len(handing), strings.Join(parts, "; ")), nil
}

// moveNamespace is namespace move NS --to Q [--wait] and --cancel.
func moveNamespace(g *globals) *cobra.Command {
	var (
		to        string
		cancelled bool
		w         waiting
	)
	c := &cobra.Command{
		Use:   "move NAME (--to PROXY [--wait] | --cancel)",
		Short: "Move a namespace to a proxy by handoff, or cancel its move",
		Long: `Move a namespace to a proxy by handoff: the proxy's runner catches up on
the namespace's topics into its own mailbox while the current proxy keeps
serving, then the leader switches the namespace over and the old proxy
serves its in-flight and cached queries until its handoff tail ends. The
namespace stays on the proxy (rebalancing leaves it) while that proxy can
take namespaces. With --wait, prismctl waits for the switch. --cancel
abandons a move that has not switched; the current proxy serves on.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns := args[0]
			switch {
			case cancelled && (to != "" || w.wait):
				return &usageError{cmd, errors.New("--cancel takes neither --to nor --wait")}
			case !cancelled && to == "":
				return &usageError{cmd, errors.New("--to PROXY (or --cancel) is required")}
			case cancelled:
				return run(cmd, g, client.Once, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.CancelMoveResponse, error) {
					return adminv1.NewAdminClient(cc).CancelMove(ctx, &adminv1.CancelMoveRequest{Namespace: ns})
				}, func(w io.Writer, r *adminv1.CancelMoveResponse) {
					fmt.Fprintf(w, "cancelled the move of %s; it stays on %s\n", ns, r.GetNamespace().GetAssignedProxyId())
				})
			}
			cl, err := connect(cmd, g)
			if err != nil {
				return err
			}
			defer cl.Close()
			ctx, cancel := deadline(cmd, g, w.wait)
			defer cancel()
			resp, err := call(ctx, cl, client.Once, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.MoveNamespaceResponse, error) {
				return adminv1.NewAdminClient(cc).MoveNamespace(ctx, &adminv1.MoveNamespaceRequest{Namespace: ns, ToProxyId: to})
			})
			if err != nil {
				return err
			}
			from := resp.GetNamespace().GetAssignedProxyId()
			if err := output(cmd, g, resp, func(w io.Writer, r *adminv1.MoveNamespaceResponse) {
				fmt.Fprintf(w, "moving %s from %s to %s: %s catches up, %s serves meanwhile\n", ns, from, to, to, from)
			}); err != nil {
				return err
			}
			if !w.wait {
				return nil
			}
			return poll(ctx, cmd, w.interval, func(ctx context.Context) (bool, string, error) {
				return switched(ctx, cl, ns, from, to, resp.GetNamespace().GetMoveIndex())
			})
		},
	}
	c.Flags().StringVar(&to, "to", "", "the proxy to move the namespace to")
	c.Flags().BoolVar(&cancelled, "cancel", false, "abandon the namespace's move in progress")
	w.flags(c, "the namespace has switched to the proxy")
	return c
}

// switched reports whether the move of ns to `to` begun at index has
// switched; an error once it ended without a switch.
func switched(ctx context.Context, cl *client.Client, ns, from, to string, index uint64) (bool, string, error) {
	r, err := call(ctx, cl, client.Idempotent, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.GetNamespaceResponse, error) {
		return adminv1.NewAdminClient(cc).GetNamespace(ctx, &adminv1.GetNamespaceRequest{Namespace: ns, Consistency: adminv1.Consistency_CONSISTENCY_LINEARIZABLE})
	})
	if err != nil {
		return false, "", err
	}
	n := r.GetNamespace()
	switch {
	case n.GetAssignedProxyId() == to:
		tail := ""
		if n.GetHandoffProxyId() != "" {
			tail = fmt.Sprintf("; %s hands off until %s", n.GetHandoffProxyId(), ts(n.GetHandoffUntil()))
		}
		return true, fmt.Sprintf("%s switched to %s%s", ns, to, tail), nil
	case n.GetIncomingProxyId() != to || n.GetMoveIndex() != index:
		return false, "", fmt.Errorf("the move of %s to %s ended without a switch (abandoned: the destination failed, was cordoned or did not catch up in time, or it was cancelled; the leader's log says which); %s serves it on %s",
			ns, to, ns, orDash(n.GetAssignedProxyId()))
	}
	moves, err := listMoves(ctx, cl)
	if err != nil {
		return false, "", err
	}
	for _, m := range moves.GetMoves() {
		if m.GetNamespace() == ns {
			if m.GetRecovery().GetState() == adminv1.RecoveryState_RECOVERY_STATE_COPYING {
				return false, fmt.Sprintf("%s recovering on %s, %s; %s serves", ns, to, recovery(m.GetRecovery()), from), nil
			}
			return false, fmt.Sprintf("%s catching up on %s, lag %s; %s serves", ns, to, lag(m), from), nil
		}
	}
	return false, fmt.Sprintf("%s catching up on %s; %s serves", ns, to, from), nil
}
