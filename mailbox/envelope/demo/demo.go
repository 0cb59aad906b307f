// Package demo generates realistic PrismEnvelopes (audit-like events with
// principals, correlation and trace ids, some with encrypted-looking payloads)
// for `prism dev`, tests and benchmarks.
//
// Ids repeat the way tracing makes them repeat: a request is a burst of 1-4
// consecutive events sharing a correlation id, and a trace is a run of 5-15
// consecutive events (10 on average) made of whole requests, each event a span
// of its own. The store's indexes write a posting block per distinct value in a
// batch, so how often a value repeats is what the benchmarks measure: a trace id
// per event (Options.UniqueTraces) is the worst case, kept to measure it.
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

// Trace runs are minTrace..maxTrace events long, uniformly: 10 on average.
const (
	minTrace = 5
	maxTrace = 15
)

// Generator makes envelopes. It is not safe for concurrent use.
type Generator struct {
	rng *rand.Rand
	// trng draws the trace runs (lengths, ids, sampling) and urng UniqueTraces' ids, off rng's stream: a seed
	// gives the same events, trace ids aside, whatever UniqueTraces says.
	trng, urng   *rand.Rand
	clock        clock.PassiveClock
	namespace    string
	prefix       string
	seq          int
	payloadSize  int
	uniqueTraces bool
	correlation  string
	corrLeft     int
	trace        string
	sampled      bool
	traceLeft    int
}

// Options of a Generator.
type Options struct {
	Seed        uint64
	Clock       clock.PassiveClock // published_at; nil = clock.RealClock{}
	Namespace   string             // metadata.namespace
	IDPrefix    string             // message ids are "<prefix>-<seq>"; "" = "evt"
	PayloadSize int                // payload bytes; 0 = 64..512 random
	// UniqueTraces gives every event a trace id of its own (and its own sampling decision) instead of runs of
	// 5-15 events: the worst case for the trace index, the shape the generator had before.
	UniqueTraces bool
}

// New makes a generator.
func New(o Options) *Generator {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.IDPrefix == "" {
		o.IDPrefix = "evt"
	}
	return &Generator{
		rng:   rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)),
		trng:  rand.New(rand.NewPCG(o.Seed^0x5851f42d4c957f2d, o.Seed)),
		urng:  rand.New(rand.NewPCG(o.Seed, o.Seed^0x14057b7ef767814f)),
		clock: o.Clock, namespace: o.Namespace, prefix: o.IDPrefix, payloadSize: o.PayloadSize,
		uniqueTraces: o.UniqueTraces,
	}
}

func hexID(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return hex.EncodeToString(b)
}

// Next returns the next envelope for topic. Events come in small bursts that
// share a correlation id, like the steps of one request, and runs of whole
// bursts share a trace id (each event a span of it); about a third carry an
// AES-GCM "encrypted" payload (random bytes) with its key id.
func (g *Generator) Next(topic string) *envelopev1.PrismEnvelope {
	g.seq++
	if g.traceLeft == 0 {
		g.trace, g.sampled = hexID(g.trng, 16), g.trng.IntN(10) == 0
		g.traceLeft = minTrace + g.trng.IntN(maxTrace-minTrace+1)
	}
	if g.corrLeft == 0 {
		g.correlation = "req-" + hexID(g.rng, 6)
		// A request never spans two traces: the last one of a trace is cut to what the trace has left.
		g.corrLeft = min(1+g.rng.IntN(4), g.traceLeft)
	}
	g.corrLeft--
	g.traceLeft--
	trace, sampled := g.trace, g.sampled
	if g.uniqueTraces {
		trace, sampled = hexID(g.urng, 16), g.urng.IntN(10) == 0
	}
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
		Observability: &envelopev1.ObservabilityContext{TraceId: trace, SpanId: hexID(g.rng, 8), Sampled: sampled},
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
