package query

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// pages answers every query with items of one size.
type pages struct {
	items, itemBytes int
}

func (p pages) Query(context.Context, *mailboxv1.EventFilter) (*mailboxv1.QueryEventsResponse, error) {
	resp := &mailboxv1.QueryEventsResponse{}
	for range p.items {
		resp.Items = append(resp.Items, &mailboxv1.MailboxItem{MessageId: "m", Principal: strings.Repeat("x", p.itemBytes)})
	}
	return resp, nil
}

func (pages) Get(context.Context, string) (*mailboxv1.MailboxItem, error) { return nil, nil }

func (pages) Stats(context.Context) (*mailboxv1.MailboxStats, error) {
	return &mailboxv1.MailboxStats{}, nil
}

// TestResponseBound: a page over MaxResponseBytes is refused on both faces
// of the API (OutOfRange, HTTP 400 as JSON) saying how to ask for less,
// and a page under it is answered.
func TestResponseBound(t *testing.T) {
	t.Parallel()
	mb := staticMailboxes{"big@p": pages{items: 20, itemBytes: 1 << 20}, "small@p": pages{items: 10, itemBytes: 1 << 20}}
	f := serveFaces(t, mb)
	qc := f.grpc

	for _, tc := range []struct {
		mailbox string
		refused bool
	}{{"big@p", true}, {"small@p", false}} {
		t.Run(tc.mailbox, func(t *testing.T) {
			t.Parallel()
			ctx := metadata.AppendToOutgoingContext(context.Background(), mesh.HeaderMailboxID, tc.mailbox)
			_, err := qc.QueryEvents(ctx, &mailboxv1.QueryEventsRequest{}, grpc.MaxCallRecvMsgSize(64<<20))
			if tc.refused {
				if status.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), "fewer events") {
					t.Errorf("gRPC QueryEvents = %v, want OutOfRange saying to ask for fewer events", err)
				}
			} else if err != nil {
				t.Errorf("gRPC QueryEvents = %v", err)
			}
			resp, err := http.Get(f.httpURL + "/v1/mailboxes/" + tc.mailbox + "/events")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Error string `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			want := http.StatusOK
			if tc.refused {
				want = http.StatusBadRequest
			}
			if resp.StatusCode != want || (tc.refused && !strings.Contains(body.Error, "fewer events")) {
				t.Errorf("GET events = %d %q, want %d", resp.StatusCode, body.Error, want)
			}
		})
	}
}
