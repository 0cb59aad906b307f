package main

import (
	"fmt"
	"math/rand/v2"
	"time"

	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/bench/internal/payload"
)

// The data set is a pure function of the item number, so the Badger store and the SQLite baseline get the same
// items without holding 1 GiB of envelopes in memory, and queries can pick real values.
const (
	numTopics     = 50
	numPrincipals = 10_000
	corrGroup     = 4   // consecutive items sharing a correlation id (request, reply, retries)
	traceGroup    = 10  // consecutive items sharing a trace id
	payloadBytes  = 704 // a multiple of 8: random payloads are 64-bit random words
	// Items are about 86 ms apart (1M per day) with up to 200 ms of jitter, so timestamps collide and arrive
	// slightly out of order, as they do from several producers.
	stepMillis   = 86
	jitterMillis = 200
)

// payloadKind is what envelopes carry (-payload): JSON audit events by default, as users store; random bytes are
// an encrypted body, which no compression shrinks.
var payloadKind = payload.JSON

var baseMillis = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()

// topicOf skews topics like real traffic: a few topics carry most events.
func topicOf(r *rand.Rand) string {
	x := r.Float64()
	return fmt.Sprintf("svc%02d.events", int(x*x*numTopics))
}

func tsOf(i int) int64 {
	return baseMillis + int64(i)*stepMillis + int64(hash(uint64(i), 7)%jitterMillis)
}

func hash(i, salt uint64) uint64 {
	x := i*0x9E3779B97F4A7C15 ^ salt
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

func corrOf(i int) string { return fmt.Sprintf("corr-%016x", hash(uint64(i/corrGroup), 1)) }

func traceOf(i int) string {
	return fmt.Sprintf("%016x%016x", hash(uint64(i/traceGroup), 2), hash(uint64(i/traceGroup), 3))
}

// headers are an item's indexed values, enough to build queries without the envelope.
type headers struct {
	topic, principal, corr, trace string
	ts                            int64
}

func headersOf(i int) headers {
	r := rand.New(rand.NewPCG(uint64(i), 42))
	return headers{
		topic:     topicOf(r),
		principal: fmt.Sprintf("user-%05d", r.IntN(numPrincipals)),
		corr:      corrOf(i),
		trace:     traceOf(i),
		ts:        tsOf(i),
	}
}

// itemOf builds item i: a marshaled PrismEnvelope (about 1 KiB, payload of payloadKind) and the headers extracted
// from it as mailbox/envelope's ExtractMailboxItem does.
func itemOf(i int) *mailboxv1.MailboxItem {
	h := headersOf(i)
	r := rand.New(rand.NewPCG(uint64(i), 43))
	body := payloadKind.Make(r, payloadBytes)
	id := fmt.Sprintf("msg-%08d-%08x", i, r.Uint32())
	spanID := fmt.Sprintf("%016x", r.Uint64())
	env := &envelopev1.PrismEnvelope{
		EnvelopeVersion: 1,
		Metadata: &envelopev1.PrismMetadata{
			MessageId:     id,
			Topic:         h.topic,
			Namespace:     "audit-logs",
			PublishedAt:   timestamppb.New(time.UnixMilli(h.ts)),
			ContentType:   "application/json",
			CorrelationId: h.corr,
		},
		Payload:  &anypb.Any{TypeUrl: "type.googleapis.com/acme.audit.v1.UserUpdated", Value: body},
		Security: &envelopev1.SecurityContext{PublisherId: h.principal},
		Observability: &envelopev1.ObservabilityContext{
			TraceId: h.trace, SpanId: spanID, Sampled: true,
			Labels: map[string]string{"region": "eu-west-1", "service": h.topic[:5]},
		},
		Schema: &envelopev1.SchemaContext{
			SchemaUrl:     "github.com/acme/schemas/audit/v1/user.proto",
			SchemaVersion: "v1.4.2",
			SchemaName:    "acme.audit.v1.UserUpdated",
		},
		Extensions: map[string][]byte{"tenant": []byte("acme"), "source": []byte("ingest-gw-3")},
	}
	encryption := ""
	if payloadKind == payload.Random { // an encrypted protobuf body
		encryption = "AES-256-GCM"
		env.Metadata.ContentType = "application/protobuf"
		env.Security.Encryption = &envelopev1.EncryptionInfo{Algorithm: encryption, KeyId: "kms://audit/key-7", Iv: body[:12]}
	}
	blob, err := proto.Marshal(env)
	if err != nil {
		panic(err) // a fixed, valid message
	}
	return &mailboxv1.MailboxItem{
		MessageId:     id,
		Timestamp:     h.ts,
		Topic:         h.topic,
		ContentType:   env.GetMetadata().GetContentType(),
		SchemaUrl:     env.GetSchema().GetSchemaUrl(),
		SchemaVersion: env.GetSchema().GetSchemaVersion(),
		Encryption:    encryption,
		CorrelationId: h.corr,
		Principal:     h.principal,
		Namespace:     "audit-logs",
		TraceId:       h.trace,
		SpanId:        spanID,
		CustomHeaders: map[string]string{"tenant": "acme", "source": "ingest-gw-3"},
		EnvelopeBlob:  blob,
	}
}

// forBatches builds items from..to-1 in batches and hands each to write. Building is not overlapped with writing:
// callers time only write, and a generator running beside it would take CPU from the engine under test.
func forBatches(from, to, size int, write func([]*mailboxv1.MailboxItem) error) error {
	b := make([]*mailboxv1.MailboxItem, 0, size)
	for i := from; i < to; i += size {
		b = b[:0]
		for j := i; j < min(i+size, to); j++ {
			b = append(b, itemOf(j))
		}
		if err := write(b); err != nil {
			return fmt.Errorf("batch at item %d: %w", i, err)
		}
	}
	return nil
}
