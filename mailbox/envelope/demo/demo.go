// Package demo generates realistic PrismEnvelopes (audit-like events with
// principals, correlation and trace ids, some with encrypted-looking payloads)
// for `prism dev`, tests and benchmarks.
package demo

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/utils/clock"

	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
)

var (
	actions   = []string{"user.login", "user.logout", "role.assigned", "policy.changed", "record.read", "record.updated", "export.requested"}
	resources = []string{"accounts", "invoices", "policies", "reports", "customers"}
	outcomes  = []string{"success", "success", "success", "denied", "error"}
)

// Generator makes envelopes. It is not safe for concurrent use.
type Generator struct {
	rng         *rand.Rand
	clock       clock.PassiveClock
	namespace   string
	prefix      string
	seq         int
	payloadSize int
	correlation string
	corrLeft    int
}

// Options of a Generator.
type Options struct {
	Seed        uint64
	Clock       clock.PassiveClock // published_at; nil = clock.RealClock{}
	Namespace   string             // metadata.namespace
	IDPrefix    string             // message ids are "<prefix>-<seq>"; "" = "evt"
	PayloadSize int                // payload bytes; 0 = 64..512 random
}

// New makes a generator.
func New(o Options) *Generator {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.IDPrefix == "" {
		o.IDPrefix = "evt"
	}
	return &Generator{rng: rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)), clock: o.Clock,
		namespace: o.Namespace, prefix: o.IDPrefix, payloadSize: o.PayloadSize}
}

func (g *Generator) hexID(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(g.rng.Uint32())
	}
	return hex.EncodeToString(b)
}

// Next returns the next envelope for topic. Events come in small bursts that
// share a correlation id, like the steps of one request; about a third carry
// an AES-GCM "encrypted" payload (random bytes) with its key id.
func (g *Generator) Next(topic string) *envelopev1.PrismEnvelope {
	g.seq++
	if g.corrLeft == 0 {
		g.correlation = "req-" + g.hexID(6)
		g.corrLeft = 1 + g.rng.IntN(4)
	}
	g.corrLeft--
	action := actions[g.rng.IntN(len(actions))]
	size := g.payloadSize
	if size == 0 {
		size = 64 + g.rng.IntN(448)
	}
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(g.rng.Uint32())
	}
	env := &envelopev1.PrismEnvelope{
		EnvelopeVersion: 1,
		Metadata: &envelopev1.PrismMetadata{
			MessageId:     fmt.Sprintf("%s-%08d", g.prefix, g.seq),
			Topic:         topic,
			Namespace:     g.namespace,
			PublishedAt:   timestamppb.New(g.clock.Now()),
			ContentType:   "application/x-protobuf",
			CorrelationId: g.correlation,
		},
		Payload:       &anypb.Any{TypeUrl: "type.googleapis.com/prism.audit.v1.AuditEvent", Value: payload},
		Security:      &envelopev1.SecurityContext{PublisherId: fmt.Sprintf("user-%03d", g.rng.IntN(50)), PublisherTeam: "platform"},
		Observability: &envelopev1.ObservabilityContext{TraceId: g.hexID(16), SpanId: g.hexID(8), Sampled: g.rng.IntN(10) == 0},
		Schema:        &envelopev1.SchemaContext{SchemaUrl: "https://schemas.prism.dev/audit/v1", SchemaVersion: "v1", SchemaName: "AuditEvent"},
		Extensions: map[string][]byte{
			"action":   []byte(action),
			"resource": []byte(resources[g.rng.IntN(len(resources))]),
			"outcome":  []byte(outcomes[g.rng.IntN(len(outcomes))]),
		},
	}
	if g.rng.IntN(3) == 0 {
		env.Metadata.ContentType = "application/octet-stream"
		env.Security.Encryption = &envelopev1.EncryptionInfo{Algorithm: "AES-256-GCM", KeyId: "kms://audit/key-" + fmt.Sprint(1+g.rng.IntN(3)), Iv: payload[:12]}
	}
	return env
}

// NextBytes returns the next envelope for topic, marshalled, and its id.
func (g *Generator) NextBytes(topic string) (string, []byte) {
	env := g.Next(topic)
	b, err := proto.Marshal(env)
	if err != nil {
		panic(fmt.Sprintf("demo envelope does not marshal: %v", err)) // only valid UTF-8 strings are set
	}
	return env.GetMetadata().GetMessageId(), b
}
