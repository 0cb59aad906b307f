package sidecare2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mailbox/ingest"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// A namespace's dead_letter_topic and retention reach its runner through the
// sidecar: a poison record lands in the topic the namespace names, with its
// reason, and events older than retention.max_age are gone from queries after
// the runner's retention pass while the newer ones stay.
func TestNamespaceDeadLetterTopicAndRetention(t *testing.T) {
	const dlq = "audit.poison"
	kafka := kafkatest.Start(t, kafkatest.Topics(2, topic), kafkatest.Topics(1, dlq))
	cluster := e2e.StartAdmins(t, e2e.AdminOptions{Size: 1})
	cluster.CreateNamespace(30*time.Second, namespace, &adminv1.NamespaceConfig{
		Topics: []string{topic}, Lease: lease.Config(), DeadLetterTopic: dlq,
		Retention: &adminv1.RetentionConfig{MaxAge: durationpb.New(time.Hour)},
	})
	r := startRunner(t, "runner-a", kafka.Brokers)
	startSidecar(t, "sidecar-a", "runner-a", r, cluster.Nodes[0].GRPCAddr)

	fresh := envelopes("fresh", 5)
	old := envelopes("old", 5)
	for _, e := range old {
		e.Metadata.PublishedAt = timestamppb.New(time.Now().Add(-2 * time.Hour))
	}
	kafka.ProduceEnvelopes(t, topic, append(old, fresh...)...)
	kafka.Produce(t, &kgo.Record{Topic: topic, Key: []byte("poison"), Value: []byte("not an envelope")})

	dead := kafka.ReadAll(t, dlq, 1)
	if len(dead) != 1 {
		t.Fatalf("%d records in %s, want the poison record", len(dead), dlq)
	}
	if reason, src := kafkatest.Header(dead[0], ingest.HeaderReason), kafkatest.Header(dead[0], ingest.HeaderSourceTopic); string(dead[0].Value) != "not an envelope" || reason != "undecodable" || src != topic {
		t.Fatalf("dead letter %q with reason %q from %q, want the poison record, reason undecodable, from %s", dead[0].Value, reason, src, topic)
	}

	// The runner's retention passes run once a minute.
	testwait.For(t, 150*time.Second, "only the events newer than max_age served", func() (bool, string) {
		ids, err := servedIDs(r)
		slices.Sort(ids)
		want := make([]string, len(fresh))
		for i, e := range fresh {
			want[i] = e.GetMetadata().GetMessageId()
		}
		return err == nil && slices.Equal(ids, want), fmt.Sprint(ids, err)
	})
}

// servedIDs are the message ids r's query API answers for the mailbox.
func servedIDs(r *e2e.Runner) ([]string, error) {
	code, body, _, err := web.Get(r.QueryURL() + "/v1/mailboxes/" + mailboxID + "/events?limit=1000")
	if err != nil || code != 200 {
		return nil, fmt.Errorf("events: %d %s %v", code, strings.TrimSpace(body), err)
	}
	var page struct {
		Items []struct {
			MessageID string `json:"message_id"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(body), &page); err != nil {
		return nil, fmt.Errorf("events %q: %w", body, err)
	}
	ids := make([]string, len(page.Items))
	for i, it := range page.Items {
		ids[i] = it.MessageID
	}
	return ids, nil
}
