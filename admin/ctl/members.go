package ctl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/mesh/pki"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// probeTimeout bounds the status call prismctl makes to each member itself.
const probeTimeout = 2 * time.Second

// memberStatus is one admin node: its place in the Raft configuration, as
// the node that answered first reports it, and what it says of itself when
// asked directly at its gRPC address.
type memberStatus struct {
	ID          string `json:"id"`
	RaftAddress string `json:"raft_address"`
	GRPCAddress string `json:"grpc_address,omitempty"`
	Suffrage    string `json:"suffrage"`
	Leader      bool   `json:"leader"`
	// Healthy: the member answered and sees a leader.
	Healthy      bool   `json:"healthy"`
	State        string `json:"state,omitempty"`
	Term         uint64 `json:"term,omitempty"`
	CommitIndex  uint64 `json:"commit_index,omitempty"`
	AppliedIndex uint64 `json:"applied_index,omitempty"`
	Version      string `json:"version,omitempty"`
	// Error is why the member could not be asked, or its answer.
	Error string `json:"error,omitempty"`
}

func (m *memberStatus) fill(st *adminv1.GetClusterStatusResponse) {
	m.Healthy = st.GetLeaderId() != ""
	m.State, m.Term, m.CommitIndex, m.AppliedIndex = st.GetState(), st.GetTerm(), st.GetCommitIndex(), st.GetAppliedIndex()
	m.Version = st.GetVersion()
	if !m.Healthy {
		m.Error = "sees no leader"
	}
}

func getStatus(ctx context.Context, cc *grpc.ClientConn) (*adminv1.GetClusterStatusResponse, error) {
	return adminv1.NewAdminClient(cc).GetClusterStatus(ctx, &adminv1.GetClusterStatusRequest{})
}

// members asks any admin node for the Raft configuration, then every
// other member for its own status, at once, each within probeTimeout.
func members(cmd *cobra.Command, g *globals) ([]memberStatus, error) {
	src, err := g.resolve(g.adminSet(cmd))
	if err != nil {
		return nil, err
	}
	c, err := newClient(g.admin, g.attempt, src)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
	defer cancel()
	st, err := client.Do(ctx, c, client.Idempotent, getStatus)
	if err != nil {
		return nil, describe(err)
	}
	out := make([]memberStatus, len(st.GetMembers()))
	var wg sync.WaitGroup
	for i, m := range st.GetMembers() {
		out[i] = memberStatus{ID: m.GetId(), RaftAddress: m.GetRaftAddress(), GRPCAddress: m.GetGrpcAddress(),
			Suffrage: m.GetSuffrage().String(), Leader: m.GetLeader()}
		switch {
		case m.GetId() == st.GetNodeId():
			out[i].fill(st)
		case m.GetGrpcAddress() == "":
			out[i].Error = "its admin gRPC address is not known"
		default:
			wg.Go(func() { out[i].probe(ctx, g, src) })
		}
	}
	wg.Wait()
	return out, nil
}

// probe asks the member itself, once.
func (m *memberStatus) probe(ctx context.Context, g *globals, src *pki.Source) {
	c, err := client.New(client.Config{Endpoints: []string{m.GRPCAddress}, Attempt: min(g.attempt, probeTimeout), Rounds: 1, TLS: src})
	if err != nil {
		m.Error = err.Error()
		return
	}
	defer c.Close()
	st, err := client.Do(ctx, c, client.Idempotent, getStatus)
	if err != nil {
		s := status.Convert(err)
		m.Error = fmt.Sprintf("%s: %s", s.Code(), s.Message())
		return
	}
	m.fill(st)
}

func suffrage(s string) string {
	if s == adminv1.MemberSuffrage_MEMBER_SUFFRAGE_VOTER.String() {
		return "voter"
	}
	return "non-voter"
}

func memberList(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the Raft members: addresses, voter or not, leader, and each one's own health and indexes",
		Long: `List the Raft members as any admin node reports them, then ask each member
directly (within 2s) for its own status: HEALTHY is true when it answered and
sees a leader; APPLIED is its applied index. -o wide adds its state, term,
commit index, version and why it is not healthy. A member prismctl cannot
reach from here (an address only the cluster resolves) shows as not healthy,
with the error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ms, err := members(cmd, g)
			if err != nil {
				return err
			}
			return emit(cmd, g, struct {
				Members []memberStatus `json:"members"`
			}{ms}, func(w io.Writer) {
				fmt.Fprint(w, "ID\tRAFT\tGRPC\tSUFFRAGE\tLEADER\tHEALTHY\tAPPLIED")
				if g.wide() {
					fmt.Fprint(w, "\tSTATE\tTERM\tCOMMIT\tVERSION\tERROR")
				}
				fmt.Fprintln(w)
				for _, m := range ms {
					applied := "-"
					if m.AppliedIndex > 0 {
						applied = fmt.Sprint(m.AppliedIndex)
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\t%v\t%s", m.ID, m.RaftAddress, orDash(m.GRPCAddress), suffrage(m.Suffrage), m.Leader, m.Healthy, applied)
					if g.wide() {
						fmt.Fprintf(w, "\t%s\t%d\t%d\t%s\t%s", orDash(m.State), m.Term, m.CommitIndex, orDash(m.Version), orDash(strings.ReplaceAll(m.Error, "\n", " ")))
					}
					fmt.Fprintln(w)
				}
			})
		},
	}
}
