package tests

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
)

// validEnvelope is a strict-valid envelope with id.
func validEnvelope(id, topic string, ts time.Time) []byte {
	b, err := proto.Marshal(&envelopev1.PrismEnvelope{
		EnvelopeVersion: 1,
		Metadata: &envelopev1.PrismMetadata{
			MessageId: id, Topic: topic, PublishedAt: timestamppb.New(ts), CorrelationId: "corr-" + id[len(id)-1:],
		},
		Security:      &envelopev1.SecurityContext{PublisherId: "user-" + id[len(id)-1:]},
		Observability: &envelopev1.ObservabilityContext{TraceId: "trace-" + id},
	})
	if err != nil {
		panic(err)
	}
	return b
}

// web presents the harness's reader identity to runners' query APIs over mutual TLS.
var web = e2e.NewHTTP(30 * time.Second)

func getJSON(base, path string, v any) (int, error) {
	code, body, _, err := web.Get(base + path)
	if err != nil {
		return 0, err
	}
	return code, json.Unmarshal([]byte(body), v)
}

// mailboxStats is the HTTP stats answer.
type mailboxStats struct {
	TotalEvents int64 `json:"total_events"`
}

func totalEvents(base, mailbox string) (int64, error) {
	var st mailboxStats
	code, err := getJSON(base, "/v1/mailboxes/"+url.PathEscape(mailbox)+"/stats", &st)
	if err == nil && code != 200 {
		err = fmt.Errorf("stats: HTTP %d", code)
	}
	return st.TotalEvents, err
}

// httpIDs pages through every event of the mailbox over HTTP and returns the
// message ids in answer order.
func httpIDs(t *testing.T, base, mailbox string) []string {
	t.Helper()
	var ids []string
	token := ""
	for page := 0; page < 100000; page++ {
		q := url.Values{"limit": {"500"}}
		if token != "" {
			q.Set("page_token", token)
		}
		var body struct {
			Items []struct {
				MessageID string `json:"message_id"`
			} `json:"items"`
			NextPageToken string `json:"next_page_token"`
		}
		code, err := getJSON(base, "/v1/mailboxes/"+url.PathEscape(mailbox)+"/events?"+q.Encode(), &body)
		if err != nil || code != 200 {
			t.Fatalf("query page %d: HTTP %d, %v", page, code, err)
		}
		for _, it := range body.Items {
			ids = append(ids, it.MessageID)
		}
		if token = body.NextPageToken; token == "" {
			return ids
		}
	}
	t.Fatal("too many pages")
	return nil
}

// metric scrapes base/metrics and sums the samples of name with all of
// labels (a "k=v" list); it is an error if no series matches.
func metric(base, name string, labels ...string) (float64, error) {
	var want []string
	for _, l := range labels {
		k, v, _ := strings.Cut(l, "=")
		want = append(want, e2e.Label(k, v))
	}
	return e2e.NewHTTP(0).Metric(base, name, want...)
}

// exactlyOnce checks that got holds every id of want once and nothing else.
func exactlyOnce(t *testing.T, got []string, want map[string]bool) {
	t.Helper()
	seen := map[string]int{}
	for _, id := range got {
		seen[id]++
	}
	var missing, extra, dup int
	for id := range want {
		if seen[id] == 0 {
			missing++
		}
	}
	for id, n := range seen {
		if !want[id] {
			extra++
		}
		if n > 1 {
			dup++
		}
	}
	if missing+extra+dup > 0 || len(got) != len(want) {
		t.Fatalf("%d ids returned for %d expected: %d missing, %d unexpected, %d duplicated", len(got), len(want), missing, extra, dup)
	}
}
