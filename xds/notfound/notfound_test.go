package notfound

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

func TestCodes(t *testing.T) {
	t.Parallel()
	withID := metadata.NewIncomingContext(context.Background(), metadata.Pairs(MailboxHeader, "gone@proxy-01"))
	tests := []struct {
		name string
		call func(context.Context) error
		ctx  context.Context
		want codes.Code
	}{
		{"stats", func(ctx context.Context) error {
			_, err := Server{}.GetStats(ctx, &mailboxv1.GetStatsRequest{})
			return err
		}, withID, codes.NotFound},
		{"query", func(ctx context.Context) error {
			_, err := Server{}.QueryEvents(ctx, &mailboxv1.QueryEventsRequest{})
			return err
		}, withID, codes.NotFound},
		{"event", func(ctx context.Context) error {
			_, err := Server{}.GetEvent(ctx, &mailboxv1.GetEventRequest{})
			return err
		}, withID, codes.NotFound},
		{"no id", func(ctx context.Context) error {
			_, err := Server{}.GetStats(ctx, &mailboxv1.GetStatsRequest{})
			return err
		}, context.Background(), codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := status.Code(tt.call(tt.ctx)); got != tt.want {
				t.Fatalf("code = %v, want %v", got, tt.want)
			}
		})
	}
}
