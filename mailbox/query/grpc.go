package query

import (
	"context"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mailbox/query/request"
	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// GRPCServer implements prism.mailbox.v1.MailboxQuery.
type GRPCServer struct {
	mailboxv1.UnimplementedMailboxQueryServer
	mailboxes Mailboxes
	metrics   *Metrics
}

// NewGRPCServer serves the mailboxes found through mb.
func NewGRPCServer(mb Mailboxes, m *Metrics) *GRPCServer {
	return &GRPCServer{mailboxes: mb, metrics: m}
}

// Register adds the service to s.
func (g *GRPCServer) Register(s grpc.ServiceRegistrar) { request.Register(s, g) }

// resolve finds the request's mailbox and sets the response headers naming it.
// x-mailbox-id names it; without one, x-prism-namespace names its namespace,
// which routes send to the runner serving the namespace's current mailbox.
func (g *GRPCServer) resolve(ctx context.Context) (string, Source, uint64, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	id := first(md, mesh.HeaderMailboxID)
	if id == "" {
		ns := first(md, mesh.HeaderNamespace)
		if ns == "" {
			return "", nil, 0, status.Errorf(codes.InvalidArgument, "%s (or %s) metadata is required", mesh.HeaderMailboxID, mesh.HeaderNamespace)
		}
		var err error
		if id, err = namespaceMailbox(g.mailboxes, ns); err != nil {
			return "", nil, 0, err
		}
	}
	src, epoch, ok := g.mailboxes.Mailbox(id)
	if !ok {
		return "", nil, 0, status.Errorf(codes.NotFound, "mailbox %q is not served here", mesh.Echo(id))
	}
	hdr := metadata.Pairs(mesh.HeaderMailbox, id)
	if epoch != 0 {
		hdr.Append(mesh.HeaderEpoch, strconv.FormatUint(epoch, 10))
	}
	_ = grpc.SetHeader(ctx, hdr) // fails only outside a unary handler
	return id, src, epoch, nil
}

// namespaceMailbox returns the id of namespace ns's mailbox served here. A
// runner serves at most one mailbox per namespace; more is a placement fault
// the caller cannot resolve by retrying.
func namespaceMailbox(mb Mailboxes, ns string) (string, error) {
	var found []string
	for _, id := range mb.IDs() {
		if m, err := mesh.ParseMailboxID(id); err == nil && m.Namespace == ns {
			found = append(found, id)
		}
	}
	switch len(found) {
	case 0:
		return "", status.Errorf(codes.NotFound, "namespace %q has no mailbox served here", mesh.Echo(ns))
	case 1:
		return found[0], nil
	default:
		return "", status.Errorf(codes.FailedPrecondition, "namespace %q has %d mailboxes served here (%s); name one in %s",
			mesh.Echo(ns), len(found), strings.Join(found, ", "), mesh.HeaderMailboxID)
	}
}

func first(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (g *GRPCServer) finish(method, mailbox string, start time.Time, err error) error {
	if err == nil {
		g.metrics.observe("grpc", method, mailbox, start, codes.OK)
		return nil
	}
	if _, ok := status.FromError(err); !ok {
		err = status.Error(code(err), err.Error())
	}
	g.metrics.observe("grpc", method, mailbox, start, status.Code(err))
	return err
}

// QueryEvents answers a filtered page of items, newest first.
func (g *GRPCServer) QueryEvents(ctx context.Context, req *mailboxv1.QueryEventsRequest) (_ *mailboxv1.QueryEventsResponse, err error) {
	start := time.Now()
	id, src, _, err := g.resolve(ctx)
	defer func() { err = g.finish("QueryEvents", id, start, err) }()
	if err != nil {
		return nil, err
	}
	if err := request.QueryEvents(req); err != nil {
		return nil, request.Invalid(err)
	}
	f := req.GetFilter()
	if f == nil {
		f = &mailboxv1.EventFilter{}
	}
	resp, err := src.Query(ctx, f)
	if err != nil {
		return nil, err
	}
	if err := bounded(resp); err != nil {
		return nil, err
	}
	return resp, nil
}

// GetEvent answers one item by message id.
func (g *GRPCServer) GetEvent(ctx context.Context, req *mailboxv1.GetEventRequest) (_ *mailboxv1.GetEventResponse, err error) {
	start := time.Now()
	id, src, _, err := g.resolve(ctx)
	defer func() { err = g.finish("GetEvent", id, start, err) }()
	if err != nil {
		return nil, err
	}
	if err := request.GetEvent(req); err != nil {
		return nil, request.Invalid(err)
	}
	item, err := src.Get(ctx, req.GetMessageId())
	if err != nil {
		if code(err) == codes.NotFound {
			return nil, status.Errorf(codes.NotFound, "message_id %q not found in mailbox %q", mesh.Echo(req.GetMessageId()), mesh.Echo(id))
		}
		return nil, err
	}
	return &mailboxv1.GetEventResponse{Item: item}, nil
}

// GetStats answers the mailbox's totals, with its id and epoch filled in.
func (g *GRPCServer) GetStats(ctx context.Context, _ *mailboxv1.GetStatsRequest) (_ *mailboxv1.GetStatsResponse, err error) {
	start := time.Now()
	id, src, epoch, err := g.resolve(ctx)
	defer func() { err = g.finish("GetStats", id, start, err) }()
	if err != nil {
		return nil, err
	}
	st, err := stats(ctx, id, epoch, src)
	if err != nil {
		return nil, err
	}
	return &mailboxv1.GetStatsResponse{Stats: st}, nil
}

func stats(ctx context.Context, id string, epoch uint64, src Source) (*mailboxv1.MailboxStats, error) {
	st, err := src.Stats(ctx)
	if err != nil {
		return nil, err
	}
	st.MailboxId = id
	st.Epoch = epoch
	return st, nil
}
