package ingest

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mailbox/envelope"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// TestDecodeInRunsIsDecodeInOrder is the property the parallel decoding rests
// on: for any batch (valid envelopes, undecodable and invalid ones, records
// that make the decoder panic or fail without a reason, in any mix and
// number) and any number of runs, decode gives exactly the items and dead
// letters, in record order and with the same reasons, that one goroutine
// going through the batch gives. The writer stores, dead-letters and marks
// what decode gives, so per-partition order and the commit point follow.
func TestDecodeInRunsIsDecodeInOrder(t *testing.T) {
	t.Parallel()
	boom, opaque := []byte("boom"), []byte("opaque")
	process := func(raw []byte, mode envelope.Mode, log *slog.Logger) (*mailboxv1.MailboxItem, error) {
		switch string(raw) {
		case string(boom):
			panic("decoder bug")
		case string(opaque):
			return nil, errors.New("no reason given")
		}
		return envelope.Process(raw, mode, log)
	}
	quiet := slog.New(slog.DiscardHandler)
	r := rand.New(rand.NewPCG(16, 16))
	record := func(off int64) *sarama.ConsumerMessage {
		var v []byte
		switch r.IntN(20) {
		case 0:
			v = []byte{0xff, 0xff, 0xff}
		case 1:
			v, _ = proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{Topic: "t"}})
		case 2:
			v = boom
		case 3:
			v = opaque
		default:
			v, _ = proto.Marshal(&envelopev1.PrismEnvelope{EnvelopeVersion: 1, Metadata: &envelopev1.PrismMetadata{
				MessageId: fmt.Sprintf("m-%d", off), Topic: "t", PublishedAt: timestamppb.Now()}})
		}
		return &sarama.ConsumerMessage{Topic: "t", Partition: 3, Offset: off, Value: v}
	}
	for trial := range 24 {
		n := r.IntN(3 * minDecodeRun * 4)
		if trial%4 == 0 {
			n = r.IntN(minDecodeRun) // small batches stay on the claim's goroutine
		}
		batch := make([]*sarama.ConsumerMessage, n)
		for j := range batch {
			batch[j] = record(int64(1000 + j))
		}
		ingester := func(runs int) *Ingester {
			cfg := Config{Metrics: NewMetrics(prometheus.NewRegistry()), process: process, decodeRuns: runs, Logger: quiet}
			cfg.setDefaults()
			return &Ingester{cfg: cfg, log: quiet}
		}
		want := decodeSerially(ingester(1), batch)
		for _, runs := range []int{2, 3, 7} {
			got := ingester(runs).decode(batch)
			if err := sameDecoded(got, want); err != nil {
				t.Fatalf("batch of %d in %d runs: %v", n, runs, err)
			}
		}
	}
}

// decodeSerially is decode as one goroutine does it: record by record.
func decodeSerially(i *Ingester, batch []*sarama.ConsumerMessage) decoded {
	d := decoded{batch: batch}
	for _, msg := range batch {
		item, err := i.process(msg)
		if err != nil {
			reason := envelope.ReasonOf(err)
			if reason == "" {
				reason = reasonUnextractable
			}
			d.dead = append(d.dead, deadLetter{msg: msg, reason: reason, err: err})
			continue
		}
		d.items = append(d.items, item)
	}
	return d
}

func sameDecoded(got, want decoded) error {
	if len(got.batch) != len(want.batch) || len(got.items) != len(want.items) || len(got.dead) != len(want.dead) {
		return fmt.Errorf("%d records, %d items, %d dead; want %d, %d, %d",
			len(got.batch), len(got.items), len(got.dead), len(want.batch), len(want.items), len(want.dead))
	}
	for j := range got.items {
		if !proto.Equal(got.items[j], want.items[j]) {
			return fmt.Errorf("item %d is %s, want %s", j, got.items[j].GetMessageId(), want.items[j].GetMessageId())
		}
	}
	for j := range got.dead {
		g, w := got.dead[j], want.dead[j]
		if g.msg != w.msg || g.reason != w.reason || g.err.Error() != w.err.Error() || g.ref {
			return fmt.Errorf("dead letter %d is offset %d (%s: %v), want offset %d (%s: %v)",
				j, g.msg.Offset, g.reason, g.err, w.msg.Offset, w.reason, w.err)
		}
	}
	return nil
}
