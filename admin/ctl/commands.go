package ctl

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/prism-mesh/prism/admin/client"
	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/internal/kafkasec"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

type globals struct {
	// version is prismctl's build (version --client).
	version string
	admin   string
	format  string
	timeout time.Duration
	attempt time.Duration
	tls     tlsOptions
	kafka   kafkaOptions

	// config is the config file as read once; configPath is set when it
	// named the admin endpoints prismctl uses.
	config     *client.FileConfig
	configPath string
}

// envAdmin names the admin endpoints instead of --admin's default.
const envAdmin = "PRISM_ADMIN"

// run connects, calls f within --timeout and prints its result; r says
// whether f may run twice (see client.Repeatable).
func run[T proto.Message](cmd *cobra.Command, g *globals, r client.Repeatable, f func(context.Context, *grpc.ClientConn) (T, error), table func(io.Writer, T)) error {
	c, err := connect(cmd, g)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
	defer cancel()
	resp, err := client.Do(ctx, c, r, f)
	if err != nil {
		return describe(err)
	}
	return output(cmd, g, resp, table)
}

// connect makes the client for the admin endpoints, with the identity the
// flags (or their discovery) name.
func connect(cmd *cobra.Command, g *globals) (*client.Client, error) {
	src, err := g.resolve(g.adminSet(cmd))
	if err != nil {
		return nil, err
	}
	return newClient(g.admin, g.attempt, src)
}

// adminSet reports whether --admin or PRISM_ADMIN named the endpoints,
// which then win over the config file's.
func (g *globals) adminSet(cmd *cobra.Command) bool {
	return os.Getenv(envAdmin) != "" || cmd.Flag("admin").Changed
}

// adminSource says where --admin's value came from, for error hints.
func (g *globals) adminSource(cmd *cobra.Command) string {
	switch {
	case cmd.Flag("admin").Changed:
		return "from --admin"
	case os.Getenv(envAdmin) != "":
		return "from " + envAdmin
	case g.configPath != "":
		return "from " + g.configPath
	}
	return "the default, where prism dev and the chart serve it"
}

// fileConfig is the config file (client.ConfigPath), read once; the zero
// config when there is none.
func (g *globals) fileConfig() (client.FileConfig, bool, error) {
	if g.config != nil {
		return *g.config, true, nil
	}
	c, ok, err := client.ReadConfig(client.ConfigPath())
	if err != nil || !ok {
		return c, ok, err
	}
	g.config = &c
	return c, true, nil
}

func consistency(consistent bool) adminv1.Consistency {
	if consistent {
		return adminv1.Consistency_CONSISTENCY_LINEARIZABLE
	}
	return adminv1.Consistency_CONSISTENCY_STALE
}

func ts(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func clusterCommand(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "cluster", Short: "Cluster state"}
	c.AddCommand(&cobra.Command{
		Use: "status", Short: "Leader, term, indexes and members, as the answering node sees them", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return run(cmd, g, client.Idempotent, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.GetClusterStatusResponse, error) {
				return adminv1.NewAdminClient(cc).GetClusterStatus(ctx, &adminv1.GetClusterStatusRequest{})
			}, func(w io.Writer, r *adminv1.GetClusterStatusResponse) {
				fmt.Fprintf(w, "node\t%s (%s)\n", r.GetNodeId(), r.GetState())
				fmt.Fprintf(w, "version\t%s\n", orDash(r.GetVersion()))
				fmt.Fprintf(w, "leader\t%s %s\n", orDash(r.GetLeaderId()), r.GetLeaderAddress())
				fmt.Fprintf(w, "term\t%d\n", r.GetTerm())
				fmt.Fprintf(w, "commit/applied/snapshot\t%d/%d/%d\n", r.GetCommitIndex(), r.GetAppliedIndex(), r.GetLastSnapshotIndex())
				fmt.Fprintf(w, "namespaces/proxies/leases\t%d/%d/%d\n\n", r.GetNamespaceCount(), r.GetProxyCount(), r.GetLeaseCount())
				fmt.Fprintln(w, "MEMBER\tRAFT\tGRPC\tSUFFRAGE\tLEADER")
				for _, m := range r.GetMembers() {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\n", m.GetId(), m.GetRaftAddress(), orDash(m.GetGrpcAddress()),
						strings.TrimPrefix(m.GetSuffrage().String(), "MEMBER_SUFFRAGE_"), m.GetLeader())
				}
			})
		},
	})
	return c
}

// namespaceTable lists ns; wide adds how their events are checked and
// leased and where they are moving.
func namespaceTable(w io.Writer, ns []*adminv1.Namespace, wide bool) {
	fmt.Fprint(w, "NAMESPACE\tPARTITION\tPROXY\tTOPICS\tCREATED")
	if wide {
		fmt.Fprint(w, "\tVALIDATION\tLEASE TTL\tDEAD LETTER TOPIC\tINCOMING\tHANDOFF\tREPLICAS")
	}
	fmt.Fprintln(w)
	for _, n := range ns {
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s", n.GetName(), n.GetPartition(), orDash(n.GetAssignedProxyId()),
			strings.Join(n.GetConfig().GetTopics(), ","), ts(n.GetCreatedAt()))
		if wide {
			c := n.GetConfig()
			ttl := "-"
			if d := c.GetLease().GetTtl(); d != nil {
				ttl = d.AsDuration().String()
			}
			fmt.Fprintf(w, "\t%s\t%s\t%s\t%s\t%s\t%s", strings.ToLower(strings.TrimPrefix(c.GetValidationMode().String(), "VALIDATION_MODE_")),
				ttl, orDash(c.GetDeadLetterTopic()), orDash(n.GetIncomingProxyId()), orDash(n.GetHandoffProxyId()), orDash(strings.Join(n.GetReplicaProxyIds(), ",")))
		}
		fmt.Fprintln(w)
	}
}

func namespaceCommand(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "namespace", Aliases: []string{"ns"}, Short: "Create, list, get and delete namespaces"}
	var (
		topics               []string
		ttl, interval, grace time.Duration
		validation, dlq      string
		maxAge               time.Duration
		maxSize              string
		consistent           bool
		replicas             uint32
	)
	create := &cobra.Command{
		Use: "create NAME --topic T", Short: "Create a namespace (placed on a proxy by its partition)", Args: cobra.ExactArgs(1),
		Long: `Create a namespace consuming the --topic topics. NAME must be ` + mesh.NamespaceRule + `.

With Kafka brokers (--kafka-brokers, ` + envKafka + `, or the config file prism dev
writes) prismctl first looks the topics (and --dead-letter-topic) up and
refuses, exit 3, when one does not exist; --create-topic creates it instead.
It reaches them as prism runner does: --kafka-tls* and --kafka-sasl* are the
runner's flags (the password from a file or ` + kafkasec.EnvSASLPassword + `); brokers
it cannot reach or that refuse it fail the command, exit 4.
Without brokers it says the topics were not checked.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := mesh.CheckNamespace(args[0]); err != nil {
				return &usageError{cmd, err}
			}
			mode, ok := adminv1.ValidationMode_value["VALIDATION_MODE_"+strings.ToUpper(validation)]
			if !ok {
				return &usageError{cmd, fmt.Errorf("--validation: %q is not strict, warn or disabled", validation)}
			}
			retention, err := retentionConfig(maxAge, maxSize)
			if err != nil {
				return &usageError{cmd, err}
			}
			if replicas > placement.MaxReplicas {
				return &usageError{cmd, fmt.Errorf("--replicas: %d copies, at most %d", replicas, placement.MaxReplicas)}
			}
			if dlq != "" && slices.Contains(topics, dlq) {
				return &usageError{cmd, fmt.Errorf("--dead-letter-topic: %q is also a --topic: its dead letters would be consumed again", dlq)}
			}
			// Without a topic the admin refuses the namespace, and says why.
			if len(topics) > 0 {
				must := topics
				if dlq != "" {
					must = append(slices.Clone(topics), dlq)
				}
				if err := g.checkTopics(cmd, must); err != nil {
					return err
				}
			}
			req := &adminv1.CreateNamespaceRequest{Namespace: args[0], Config: &adminv1.NamespaceConfig{
				Topics: topics, ValidationMode: adminv1.ValidationMode(mode), DeadLetterTopic: dlq, Retention: retention, Replicas: replicas,
				Lease: &adminv1.LeaseConfig{Ttl: optDuration(ttl), HeartbeatInterval: optDuration(interval), Grace: optDuration(grace)},
			}}
			return run(cmd, g, client.Once, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.CreateNamespaceResponse, error) {
				return adminv1.NewControlPlaneClient(cc).CreateNamespace(ctx, req)
			}, func(w io.Writer, r *adminv1.CreateNamespaceResponse) {
				namespaceTable(w, []*adminv1.Namespace{r.GetNamespace()}, g.wide())
				if !r.GetCreated() {
					fmt.Fprintln(w, "(already existed with this config)")
				}
			})
		},
	}
	create.Flags().StringArrayVar(&topics, "topic", nil, "Kafka topic to consume (repeatable, at least one)")
	create.Flags().DurationVar(&ttl, "lease-ttl", 0, "lease ttl of the namespace's mailboxes (0: admin default)")
	create.Flags().DurationVar(&interval, "heartbeat-interval", 0, "sidecar heartbeat interval (0: admin default)")
	create.Flags().DurationVar(&grace, "lease-grace", 0, "grace after ttl before expiry (0: admin default)")
	create.Flags().StringVar(&validation, "validation", "strict", "envelope validation: strict, warn or disabled")
	create.Flags().StringVar(&dlq, "dead-letter-topic", "", "topic every poison record goes to (default: its own topic with .dlq appended)")
	create.Flags().DurationVar(&maxAge, "retention-max-age", 0, "retention: the mailbox deletes events published longer ago than this (0 keeps them)")
	create.Flags().StringVar(&maxSize, "retention-max-size", "0", "retention: bound on the mailbox's stored envelope bytes, oldest deleted first, e.g. 10GiB (0 is unbounded)")
	create.Flags().Uint32Var(&replicas, "replicas", 0, "copies of the namespace's mailbox, each on its own proxy: the serving one and replicas that take over when it is lost (0 or 1: one copy)")
	g.kafka.register(create.Flags())

	list := listCommand(g, "List namespaces", &consistent, func(ctx context.Context, a adminv1.AdminClient, p listPage) (*adminv1.ListNamespacesResponse, error) {
		return a.ListNamespaces(ctx, &adminv1.ListNamespacesRequest{Consistency: p.consistency, PageSize: p.size, PageToken: p.token})
	}, func(w io.Writer, r *adminv1.ListNamespacesResponse) { namespaceTable(w, r.GetNamespaces(), g.wide()) })
	get := &cobra.Command{
		Use: "get NAME", Short: "Show a namespace, where its alias routes, and its mailboxes' state and history", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return run(cmd, g, client.Idempotent, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.GetNamespaceResponse, error) {
				return adminv1.NewAdminClient(cc).GetNamespace(ctx, &adminv1.GetNamespaceRequest{Namespace: args[0], Consistency: consistency(consistent)})
			}, func(w io.Writer, r *adminv1.GetNamespaceResponse) {
				namespaceTable(w, []*adminv1.Namespace{r.GetNamespace()}, g.wide())
				if rt := r.GetRoute(); rt != nil {
					fmt.Fprintf(w, "\nroutes to\t%s (epoch %d)\n", rt.GetMailboxId(), rt.GetEpoch())
					for _, x := range rt.GetInSyncReplicas() {
						fmt.Fprintf(w, "then\t%s (epoch %d)\n", x.GetMailboxId(), x.GetEpoch())
					}
				}
				replicasTable(w, r.GetReplicas())
			})
		},
	}
	for _, sub := range []*cobra.Command{list, get} {
		sub.Flags().BoolVar(&consistent, "consistent", false, "linearizable read (through the leader) instead of this node's state")
	}
	del := &cobra.Command{
		Use: "delete NAME", Short: "Delete a namespace", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return run(cmd, g, client.Once, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.DeleteNamespaceResponse, error) {
				return adminv1.NewControlPlaneClient(cc).DeleteNamespace(ctx, &adminv1.DeleteNamespaceRequest{Namespace: args[0]})
			}, func(w io.Writer, r *adminv1.DeleteNamespaceResponse) {
				if r.GetDeleted() {
					fmt.Fprintf(w, "deleted %s\n", args[0])
				} else {
					fmt.Fprintf(w, "no namespace %s\n", args[0])
				}
			})
		},
	}
	c.AddCommand(create, list, get, del, moveNamespace(g))
	return c
}

// retentionConfig is the namespace's retention from the --retention-* flags,
// nil when neither bounds it.
func retentionConfig(maxAge time.Duration, maxSize string) (*adminv1.RetentionConfig, error) {
	if maxAge < 0 {
		return nil, fmt.Errorf("--retention-max-age: must not be negative, got %s", maxAge)
	}
	size, err := humanize.ParseBytes(maxSize)
	if err != nil {
		return nil, fmt.Errorf("--retention-max-size: %w", err)
	}
	if size > math.MaxInt64 {
		return nil, fmt.Errorf("--retention-max-size: %s is more than %d bytes", maxSize, int64(math.MaxInt64))
	}
	if maxAge == 0 && size == 0 {
		return nil, nil
	}
	return &adminv1.RetentionConfig{MaxAge: optDuration(maxAge), MaxSizeBytes: int64(size)}, nil
}

func optDuration(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

func proxyCommand(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "proxy", Short: "Registered proxies"}
	var consistent bool
	list := listCommand(g, "List proxies with their partitions and namespaces", &consistent, func(ctx context.Context, a adminv1.AdminClient, p listPage) (*adminv1.ListProxiesResponse, error) {
		return a.ListProxies(ctx, &adminv1.ListProxiesRequest{Consistency: p.consistency, PageSize: p.size, PageToken: p.token})
	}, func(w io.Writer, r *adminv1.ListProxiesResponse) {
		fmt.Fprint(w, "PROXY\tADDRESS\tSTATUS\tLAST SEEN\tPARTITIONS\tNAMESPACES")
		if g.wide() {
			fmt.Fprint(w, "\tRUNNER\tVERSION\tZONE\tREGISTERED")
		}
		fmt.Fprintln(w)
		for _, p := range r.GetProxies() {
			parts := 0
			for _, pr := range p.GetPartitionRanges() {
				parts += int(pr.GetEnd()-pr.GetStart()) + 1
			}
			reg := p.GetProxy().GetRegistration()
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s", reg.GetProxyId(), reg.GetAddress(), proxyStatus(p.GetProxy()),
				ts(p.GetProxy().GetLastSeen()), parts, orDash(strings.Join(p.GetNamespaces(), ",")))
			if g.wide() {
				fmt.Fprintf(w, "\t%s\t%s\t%s\t%s", orDash(reg.GetRunnerId()), orDash(reg.GetVersion()), orDash(reg.GetZone()),
					ts(p.GetProxy().GetRegisteredAt()))
			}
			fmt.Fprintln(w)
		}
	})
	list.Flags().BoolVar(&consistent, "consistent", false, "linearizable read (through the leader)")
	c.AddCommand(list)
	c.AddCommand(drainCommands(g)...)
	return c
}

// proxyStatus is LIVE or STALE, with why placement leaves a live proxy out.
func proxyStatus(p *adminv1.Proxy) string {
	s := strings.TrimPrefix(p.GetStatus().String(), "PROXY_STATUS_")
	if p.GetRunnerNotReady() {
		s += ",runner-not-ready"
	}
	if p.GetCordoned() {
		s += ",cordoned"
	}
	if p.GetDrainingInstance() != "" {
		s += ",draining"
	}
	return s
}

func leaseCommand(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "lease", Short: "Mailbox leases"}
	var (
		consistent       bool
		namespace, proxy string
	)
	list := listCommand(g, "List leases (the leader shows renewals not yet checkpointed)", &consistent, func(ctx context.Context, a adminv1.AdminClient, p listPage) (*adminv1.ListLeasesResponse, error) {
		return a.ListLeases(ctx, &adminv1.ListLeasesRequest{Consistency: p.consistency, Namespace: namespace, ProxyId: proxy, PageSize: p.size, PageToken: p.token})
	}, func(w io.Writer, r *adminv1.ListLeasesResponse) {
		fmt.Fprint(w, "MAILBOX\tRUNNER\tADDRESS\tEPOCH\tEXPIRES\tTTL")
		if g.wide() {
			fmt.Fprint(w, "\tPARTITION\tSESSION\tGRANTED\tLAST HEARTBEAT")
		}
		fmt.Fprintln(w)
		for _, l := range r.GetLeases() {
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s", l.GetMailboxId(), l.GetRunnerId(), l.GetRunnerAddress(),
				l.GetEpoch(), ts(l.GetExpiresAt()), l.GetTtl().AsDuration())
			if g.wide() {
				session := "-"
				if id := l.GetSessionId(); id != 0 {
					session = strconv.FormatUint(id, 10)
				}
				fmt.Fprintf(w, "\t%d\t%s\t%s\t%s", l.GetPartition(), session, ts(l.GetGrantedAt()), ts(l.GetLastHeartbeatAt()))
			}
			fmt.Fprintln(w)
		}
	})
	list.Flags().BoolVar(&consistent, "consistent", false, "linearizable read (through the leader)")
	list.Flags().StringVar(&namespace, "namespace", "", "only this namespace's leases")
	list.Flags().StringVar(&proxy, "proxy", "", "only this proxy's leases")
	c.AddCommand(list)
	return c
}

func sessionCommand(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "session", Short: "Sidecar sessions: one renewal keeps all of a sidecar's leases"}
	var (
		consistent bool
		proxy      string
	)
	list := listCommand(g, "List open sessions with their lease counts (the leader shows live expiries)", &consistent, func(ctx context.Context, a adminv1.AdminClient, p listPage) (*adminv1.ListSessionsResponse, error) {
		return a.ListSessions(ctx, &adminv1.ListSessionsRequest{Consistency: p.consistency, ProxyId: proxy, PageSize: p.size, PageToken: p.token})
	}, func(w io.Writer, r *adminv1.ListSessionsResponse) {
		fmt.Fprint(w, "SESSION\tPROXY\tRUNNER\tADDRESS\tLEASES\tEXPIRES\tTTL")
		if g.wide() {
			fmt.Fprint(w, "\tGRACE\tOPENED")
		}
		fmt.Fprintln(w)
		for _, s := range r.GetSessions() {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s", s.GetId(), s.GetProxyId(), s.GetRunnerId(), s.GetRunnerAddress(),
				s.GetLeaseCount(), ts(s.GetExpiresAt()), s.GetTtl().AsDuration())
			if g.wide() {
				fmt.Fprintf(w, "\t%s\t%s", s.GetGrace().AsDuration(), ts(s.GetOpenedAt()))
			}
			fmt.Fprintln(w)
		}
	})
	list.Flags().BoolVar(&consistent, "consistent", false, "linearizable read (through the leader)")
	list.Flags().StringVar(&proxy, "proxy", "", "only this proxy's sessions")
	get := &cobra.Command{
		Use: "get ID", Short: "Show a session and its leases", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || id == 0 {
				return fmt.Errorf("session id %q: want a positive number, as session list shows it", args[0])
			}
			return run(cmd, g, client.Idempotent, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.GetSessionResponse, error) {
				return adminv1.NewAdminClient(cc).GetSession(ctx, &adminv1.GetSessionRequest{SessionId: id, Consistency: consistency(consistent)})
			}, func(w io.Writer, r *adminv1.GetSessionResponse) {
				s := r.GetSession()
				fmt.Fprintf(w, "session\t%d\nproxy\t%s\nrunner\t%s\naddress\t%s\nopened\t%s\nexpires\t%s\nttl\t%s\ngrace\t%s\nleases\t%d\n",
					s.GetId(), s.GetProxyId(), s.GetRunnerId(), s.GetRunnerAddress(), ts(s.GetOpenedAt()), ts(s.GetExpiresAt()),
					s.GetTtl().AsDuration(), s.GetGrace().AsDuration(), len(r.GetLeases()))
				if len(r.GetLeases()) > 0 {
					fmt.Fprintln(w, "\nMAILBOX\tEPOCH\tGRANTED")
					for _, l := range r.GetLeases() {
						fmt.Fprintf(w, "%s\t%d\t%s\n", l.GetMailboxId(), l.GetEpoch(), ts(l.GetGrantedAt()))
					}
				}
			})
		},
	}
	get.Flags().BoolVar(&consistent, "consistent", false, "linearizable read (through the leader)")
	c.AddCommand(list, get)
	return c
}

func routeCommand(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "route", Short: "Routes derived from live leases"}
	var consistent bool
	list := listCommand(g, "List mailbox and namespace routes", &consistent, func(ctx context.Context, a adminv1.AdminClient, p listPage) (*adminv1.ListRoutesResponse, error) {
		return a.ListRoutes(ctx, &adminv1.ListRoutesRequest{Consistency: p.consistency, PageSize: p.size, PageToken: p.token})
	}, func(w io.Writer, r *adminv1.ListRoutesResponse) {
		fmt.Fprint(w, "MAILBOX\tRUNNER\tADDRESS\tPARTITION\tEPOCH")
		if g.wide() {
			fmt.Fprint(w, "\tNAMESPACE\tPROXY")
		}
		fmt.Fprintln(w)
		for _, rt := range r.GetRoutes() {
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d", rt.GetMailboxId(), rt.GetRunnerId(), rt.GetRunnerAddress(), rt.GetPartition(), rt.GetEpoch())
			if g.wide() {
				fmt.Fprintf(w, "\t%s\t%s", rt.GetNamespace(), rt.GetProxyId())
			}
			fmt.Fprintln(w)
		}
		if len(r.GetNamespaceRoutes()) > 0 {
			fmt.Fprintln(w, "\nNAMESPACE\tMAILBOX\tEPOCH")
			for _, nr := range r.GetNamespaceRoutes() {
				fmt.Fprintf(w, "%s\t%s\t%d\n", nr.GetNamespace(), nr.GetMailboxId(), nr.GetEpoch())
			}
		}
	})
	list.Flags().BoolVar(&consistent, "consistent", false, "linearizable read (through the leader)")
	c.AddCommand(list)
	return c
}

func memberCommand(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "member", Short: "Raft membership"}
	var forceAdd, forceRemove bool
	add := &cobra.Command{
		Use:   "add ID RAFT_ADDR GRPC_ADDR",
		Short: "Add a voter; its admin gRPC address is replicated so every node can forward to it when it leads",
		Long: `Add a voter. Start the new node with --join first: the leader refuses
(FailedPrecondition) a configuration that would have no quorum of healthy
voters, counting the new one only once it answers at GRPC_ADDR.`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			return run(cmd, g, client.Once, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.AddVoterResponse, error) {
				return adminv1.NewAdminClient(cc).AddVoter(ctx, &adminv1.AddVoterRequest{Id: args[0], RaftAddress: args[1], GrpcAddress: args[2], Force: forceAdd})
			}, func(w io.Writer, r *adminv1.AddVoterResponse) {
				fmt.Fprintf(w, "added %s at index %d\n", args[0], r.GetIndex())
			})
		},
	}
	add.Flags().BoolVar(&forceAdd, "force", false, "add even if the new configuration would have no quorum of healthy voters")
	remove := &cobra.Command{
		Use: "remove ID", Short: "Remove a server", Args: cobra.ExactArgs(1),
		Long: `Remove a server. The leader refuses (FailedPrecondition) removing a voter
when the voters left would have no quorum of healthy ones.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return run(cmd, g, client.Once, func(ctx context.Context, cc *grpc.ClientConn) (*adminv1.RemoveServerResponse, error) {
				return adminv1.NewAdminClient(cc).RemoveServer(ctx, &adminv1.RemoveServerRequest{Id: args[0], Force: forceRemove})
			}, func(w io.Writer, r *adminv1.RemoveServerResponse) {
				fmt.Fprintf(w, "removed %s at index %d\n", args[0], r.GetIndex())
			})
		},
	}
	remove.Flags().BoolVar(&forceRemove, "force", false, "remove even if the voters left would have no quorum of healthy ones")
	c.AddCommand(memberList(g), add, remove)
	return c
}
