package runner

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"github.com/prism-mesh/prism/testkit/kafkatest"
)

// TestQueryPortAnswersGRPCAndHTTP pins what Envoy needs from the address the
// sidecar advertises: gRPC, HTTP/1.1 and h2c HTTP/JSON on one port.
func TestQueryPortAnswersGRPCAndHTTP(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kafkatest.Topics(1, "a.events", "a.events.dlq"))
	r, err := New(Config{DataDir: t.TempDir(), Brokers: c.Brokers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	queryAddr, httpAddr := serve(t, r)
	if err := r.Open(MailboxConfig{ID: "$a@p1", Topics: []string{"a.events"}, Epoch: 7}); err != nil {
		t.Fatal(err)
	}

	cc, err := grpc.NewClient(queryAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	qc := mailboxv1.NewMailboxQueryClient(cc)
	var hdr metadata.MD
	ctx := metadata.AppendToOutgoingContext(context.Background(), mesh.HeaderMailboxID, "$a@p1")
	resp, err := qc.GetStats(ctx, &mailboxv1.GetStatsRequest{}, grpc.Header(&hdr))
	if err != nil || resp.GetStats().GetMailboxId() != "$a@p1" || resp.GetStats().GetEpoch() != 7 {
		t.Fatalf("gRPC GetStats on the query port = %v, %v", resp, err)
	}
	if got := hdr.Get(mesh.HeaderEpoch); len(got) != 1 || got[0] != "7" {
		t.Errorf("gRPC %s header = %v, want 7", mesh.HeaderEpoch, got)
	}
	ctx = metadata.AppendToOutgoingContext(context.Background(), mesh.HeaderMailboxID, "nobody@p1")
	if _, err := qc.GetStats(ctx, &mailboxv1.GetStatsRequest{}); grpcstatus.Code(err) != codes.NotFound {
		t.Errorf("gRPC GetStats of an unknown mailbox = %v, want NotFound", err)
	}

	var h1, h2c http.Protocols
	h1.SetHTTP1(true)
	h2c.SetUnencryptedHTTP2(true)
	for _, tc := range []struct {
		name      string
		addr      string
		protocols *http.Protocols
		wantMajor int
	}{
		{"query port HTTP/1.1", queryAddr, &h1, 1},
		{"query port h2c", queryAddr, &h2c, 2},
		{"http port HTTP/1.1", httpAddr, &h1, 1},
		{"http port h2c", httpAddr, &h2c, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := &http.Client{Transport: &http.Transport{Protocols: tc.protocols}}
			defer client.CloseIdleConnections()
			base := "http://" + tc.addr + "/v1/mailboxes/"
			resp, err := client.Get(base + "%24a%40p1/stats")
			if err != nil {
				t.Fatal(err)
			}
			var st struct {
				MailboxID string `json:"mailbox_id"`
				Epoch     uint64 `json:"epoch"`
			}
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || resp.ProtoMajor != tc.wantMajor || st.MailboxID != "$a@p1" || st.Epoch != 7 {
				t.Fatalf("GET stats = %d over HTTP/%d, %+v, %v", resp.StatusCode, resp.ProtoMajor, st, err)
			}
			resp, err = client.Get(base + "nobody@p1/stats")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("GET stats of an unknown mailbox = %d %q, want a JSON 404", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
		})
	}
}
