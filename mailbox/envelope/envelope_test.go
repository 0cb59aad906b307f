package envelope

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
)

func fullEnvelope() *envelopev1.PrismEnvelope {
	return &envelopev1.PrismEnvelope{
		EnvelopeVersion: 1,
		Metadata: &envelopev1.PrismMetadata{
			MessageId:     "m-1",
			Topic:         "audit.events",
			Namespace:     "audit-logs",
			PublishedAt:   timestamppb.New(time.UnixMilli(1_700_000_000_123)),
			ContentType:   "application/json",
			CorrelationId: "corr-1",
		},
		Payload: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: []byte{1, 2}},
		Security: &envelopev1.SecurityContext{
			PublisherId: "user-123",
			Encryption:  &envelopev1.EncryptionInfo{Algorithm: "AES-256-GCM", KeyId: "k1"},
		},
		Observability: &envelopev1.ObservabilityContext{TraceId: "t-1", SpanId: "s-1"},
		Schema:        &envelopev1.SchemaContext{SchemaUrl: "https://schemas/x", SchemaVersion: "v2"},
		Extensions:    map[string][]byte{"action": []byte("login"), "bin": {0xff, 'a'}},
	}
}

func TestExtractMailboxItem(t *testing.T) {
	t.Parallel()
	env := fullEnvelope()
	raw, err := proto.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	item, err := Process(raw, Strict, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"message_id": item.MessageId, "topic": item.Topic, "namespace": item.Namespace,
		"content_type": item.ContentType, "correlation_id": item.CorrelationId, "principal": item.Principal,
		"encryption": item.Encryption, "trace_id": item.TraceId, "span_id": item.SpanId,
		"schema_url": item.SchemaUrl, "schema_version": item.SchemaVersion,
	}
	got := map[string]string{
		"message_id": "m-1", "topic": "audit.events", "namespace": "audit-logs",
		"content_type": "application/json", "correlation_id": "corr-1", "principal": "user-123",
		"encryption": "AES-256-GCM", "trace_id": "t-1", "span_id": "s-1",
		"schema_url": "https://schemas/x", "schema_version": "v2",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, v, got[k])
		}
	}
	if item.Timestamp != 1_700_000_000_123 {
		t.Errorf("timestamp = %d", item.Timestamp)
	}
	if item.CustomHeaders["action"] != "login" || item.CustomHeaders["bin"] != "\uFFFDa" {
		t.Errorf("custom headers = %q", item.CustomHeaders)
	}
	if string(item.EnvelopeBlob) != string(raw) {
		t.Error("blob is not the envelope as it arrived")
	}
	if _, err := proto.Marshal(item); err != nil {
		t.Errorf("item does not marshal: %v", err)
	}
}

func TestExtractNilSafe(t *testing.T) {
	t.Parallel()
	item, err := ExtractMailboxItem(&envelopev1.PrismEnvelope{Metadata: &envelopev1.PrismMetadata{MessageId: "x"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if item.MessageId != "x" || item.Timestamp != 0 || item.Principal != "" || item.Encryption != "" || item.EnvelopeBlob == nil {
		t.Errorf("unexpected item %v", item)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	mutate := func(f func(e *envelopev1.PrismEnvelope)) *envelopev1.PrismEnvelope {
		e := fullEnvelope()
		f(e)
		return e
	}
	noMeta := mutate(func(e *envelopev1.PrismEnvelope) { e.Metadata = nil })
	noID := mutate(func(e *envelopev1.PrismEnvelope) { e.Metadata.MessageId = "" })
	v2 := mutate(func(e *envelopev1.PrismEnvelope) { e.EnvelopeVersion = 2 })
	noTime := mutate(func(e *envelopev1.PrismEnvelope) { e.Metadata.PublishedAt = nil })
	badTime := mutate(func(e *envelopev1.PrismEnvelope) { e.Metadata.PublishedAt = &timestamppb.Timestamp{Nanos: -1} })
	noTopic := mutate(func(e *envelopev1.PrismEnvelope) { e.Metadata.Topic = "" })
	tests := []struct {
		name string
		env  *envelopev1.PrismEnvelope
		mode Mode
		want Reason
	}{
		{"valid strict", fullEnvelope(), Strict, ""},
		{"no metadata strict", noMeta, Strict, ReasonMissingMetadata},
		{"no metadata disabled", noMeta, Disabled, ReasonMissingMetadata},
		{"no message id warn", noID, Warn, ReasonMissingMessageID},
		{"no message id disabled", noID, Disabled, ReasonMissingMessageID},
		{"version 2 strict", v2, Strict, ReasonBadVersion},
		{"version 2 warn", v2, Warn, ""},
		{"version 2 disabled", v2, Disabled, ""},
		{"no time strict", noTime, Strict, ReasonMissingTime},
		{"bad time strict", badTime, Strict, ReasonBadTime},
		{"no time warn", noTime, Warn, ""},
		{"no topic strict", noTopic, Strict, ReasonMissingTopic},
		{"no topic disabled", noTopic, Disabled, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := Validate(tc.env, tc.mode, nil)
			if got := ReasonOf(err); got != tc.want {
				t.Fatalf("reason = %q (err %v), want %q", got, err, tc.want)
			}
		})
	}
}

func TestDecodeGarbage(t *testing.T) {
	t.Parallel()
	_, err := Process([]byte{0xff, 0xff, 0xff}, Disabled, nil)
	var re *RejectError
	if !errors.As(err, &re) || re.Reason != ReasonUndecodable {
		t.Fatalf("err = %v, want undecodable rejection", err)
	}
}

func TestParseMode(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"strict", "warn", "disabled"} {
		if m, err := ParseMode(s); err != nil || string(m) != s {
			t.Errorf("ParseMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseMode("lenient"); err == nil {
		t.Error("ParseMode(lenient) succeeded")
	}
}

// FuzzProcess checks that no input panics and that every accepted envelope
// yields a storable item: a message id, a marshallable item and the original
// bytes as blob.
func FuzzProcess(f *testing.F) {
	raw, _ := proto.Marshal(fullEnvelope())
	f.Add(raw, uint8(0))
	f.Add([]byte{}, uint8(1))
	f.Add([]byte{0x12, 0x00}, uint8(2))
	modes := []Mode{Strict, Warn, Disabled}
	f.Fuzz(func(t *testing.T, b []byte, m uint8) {
		mode := modes[int(m)%len(modes)]
		item, err := Process(b, mode, nil)
		if err != nil {
			if ReasonOf(err) == "" {
				t.Fatalf("error without a reason: %v", err)
			}
			return
		}
		if item.MessageId == "" {
			t.Fatal("accepted an item without message id")
		}
		if string(item.EnvelopeBlob) != string(b) {
			t.Fatal("blob differs from input")
		}
		if _, err := proto.Marshal(item); err != nil {
			t.Fatalf("accepted item does not marshal: %v", err)
		}
		if mode == Strict && item.Topic == "" {
			t.Fatal("strict accepted an item without topic")
		}
	})
}
