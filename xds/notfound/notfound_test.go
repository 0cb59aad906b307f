package notfound

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

func TestCodes(t *testing.T) {
	t.Parallel()
	ctx := func(kv ...string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs(kv...))
	}
	withID := ctx(mesh.HeaderMailboxID, "gone@proxy-01")
	long := strings.Repeat("x", 10_000)
	tests := []struct {
		name    string
		call    func(context.Context) error
		ctx     context.Context
		want    codes.Code
		message string
	}{
		{"stats", func(ctx context.Context) error {
			_, err := Server{}.GetStats(ctx, &mailboxv1.GetStatsRequest{})
			return err
		}, withID, codes.NotFound, `mailbox "gone@proxy-01" not found: no live lease routes it`},
		{"query", func(ctx context.Context) error {
			_, err := Server{}.QueryEvents(ctx, &mailboxv1.QueryEventsRequest{})
			return err
		}, withID, codes.NotFound, `mailbox "gone@proxy-01" not found: no live lease routes it`},
		{"event", func(ctx context.Context) error {
			_, err := Server{}.GetEvent(ctx, &mailboxv1.GetEventRequest{})
			return err
		}, withID, codes.NotFound, `mailbox "gone@proxy-01" not found: no live lease routes it`},
		{"namespace", func(ctx context.Context) error {
			_, err := Server{}.QueryEvents(ctx, &mailboxv1.QueryEventsRequest{})
			return err
		}, ctx(mesh.HeaderNamespace, "audit-logs"), codes.NotFound, `namespace "audit-logs" is not routed: no live lease serves it`},
		{"mailbox and namespace name the mailbox", func(ctx context.Context) error {
			_, err := Server{}.GetStats(ctx, &mailboxv1.GetStatsRequest{})
			return err
		}, ctx(mesh.HeaderNamespace, "audit-logs", mesh.HeaderMailboxID, "gone@proxy-01"), codes.NotFound, `mailbox "gone@proxy-01" not found: no live lease routes it`},
		{"10 KB mailbox id echoed cut", func(ctx context.Context) error {
			_, err := Server{}.GetStats(ctx, &mailboxv1.GetStatsRequest{})
			return err
		}, ctx(mesh.HeaderMailboxID, long), codes.NotFound, `mailbox "` + long[:mesh.MaxEchoLen] + `…" not found: no live lease routes it`},
		{"10 KB namespace echoed cut", func(ctx context.Context) error {
			_, err := Server{}.GetStats(ctx, &mailboxv1.GetStatsRequest{})
			return err
		}, ctx(mesh.HeaderNamespace, long), codes.NotFound, `namespace "` + long[:mesh.MaxEchoLen] + `…" is not routed: no live lease serves it`},
		{"empty namespace", func(ctx context.Context) error {
			_, err := Server{}.GetStats(ctx, &mailboxv1.GetStatsRequest{})
			return err
		}, ctx(mesh.HeaderNamespace, ""), codes.InvalidArgument, "missing x-mailbox-id (or x-prism-namespace) metadata naming the mailbox"},
		{"no id", func(ctx context.Context) error {
			_, err := Server{}.GetStats(ctx, &mailboxv1.GetStatsRequest{})
			return err
		}, context.Background(), codes.InvalidArgument, "missing x-mailbox-id (or x-prism-namespace) metadata naming the mailbox"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st := status.Convert(tt.call(tt.ctx))
			if st.Code() != tt.want || st.Message() != tt.message {
				t.Fatalf("got %v %q, want %v %q", st.Code(), st.Message(), tt.want, tt.message)
			}
		})
	}
}
