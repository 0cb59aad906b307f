package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
)

// startKafka starts an in-process kfake broker on loopback with topics of the
// given partition counts.
func startKafka(t *testing.T, topics map[string]int32) []string {
	t.Helper()
	opts := []kfake.Opt{kfake.NumBrokers(1)}
	for topic, parts := range topics {
		opts = append(opts, kfake.SeedTopics(parts, topic))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// produce writes records synchronously with a franz-go client.
func produce(t *testing.T, brokers []string, recs []*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for start := 0; start < len(recs); start += 5000 {
		if err := cl.ProduceSync(ctx, recs[start:min(start+5000, len(recs))]...).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

// readAll consumes topic from the start until want records arrived or the
// deadline passed.
func readAll(t *testing.T, brokers []string, topic string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	return out
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

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

func getJSON(base, path string, v any) (int, error) {
	resp, err := http.Get(base + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(v)
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

// metric scrapes /metrics and returns the value of the sample named name with
// all of labels (a "k=v" list), summed over the matching series; it is an
// error if no series matches.
func metric(base, name string, labels ...string) (float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	matched := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		match := true
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			if !strings.Contains(line, k+`="`+v+`"`) {
				match = false
			}
		}
		if !match {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += f
		matched++
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if matched == 0 {
		return 0, fmt.Errorf("no series %s%v", name, labels)
	}
	return sum, nil
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
