package ingest

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"

	"github.com/IBM/sarama"

	"github.com/prism-mesh/prism/mailbox/envelope"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

type deadLetter struct {
	msg    *sarama.ConsumerMessage
	reason envelope.Reason
	err    error
	ref    bool // the DLQ refused the record as too large: send a reference without its value
}

// decoded is a batch of records split into the items to store and the records to dead-letter.
type decoded struct {
	batch []*sarama.ConsumerMessage
	items []*mailboxv1.MailboxItem
	msgs  []*sarama.ConsumerMessage // msgs[j] is the record items[j] came from
	dead  []deadLetter
}

// minDecodeRun is the fewest records worth a goroutine of their own: below it
// the hand-off costs more than the decoding it spreads.
const minDecodeRun = 256

// decode splits a batch into its items and dead letters, each in record order.
// Envelopes decode independently, so a large batch is cut into contiguous runs
// decoded at once, one per processor: a mailbox with a single partition then
// decodes on every core instead of one. The runs write to their own slots and
// are joined before anything is handed on, so what the writer gets, and so
// what is stored, dead-lettered and committed, is what one goroutine going
// through the batch would make. While queries are answered (Config.Governor)
// the batch is decoded on one goroutine, in a turn on the governor's lanes.
func (i *Ingester) decode(batch []*sarama.ConsumerMessage) decoded {
	i.cfg.Metrics.consumed.WithLabelValues(i.cfg.MailboxID).Add(float64(len(batch)))
	items := make([]*mailboxv1.MailboxItem, len(batch))
	errs := make([]error, len(batch))
	decodeRun := func(lo, hi int) {
		for j := lo; j < hi; j++ {
			items[j], errs[j] = i.process(batch[j])
		}
	}
	runs := i.cfg.decodeRuns
	if runs == 0 {
		runs = runtime.GOMAXPROCS(0)
	}
	end, took := i.cfg.Governor.lane(i.runCtx)
	defer end()
	if took || i.cfg.Governor.Held() {
		runs = 1 // leave the other cores to the queries ingest gives way to
	}
	runs = min(runs, len(batch)/minDecodeRun)
	if runs <= 1 {
		decodeRun(0, len(batch))
	} else {
		var wg sync.WaitGroup
		for r := range runs {
			wg.Go(func() { decodeRun(r*len(batch)/runs, (r+1)*len(batch)/runs) })
		}
		wg.Wait()
	}
	d := decoded{batch: batch, items: items[:0]}
	for j, msg := range batch {
		if err := errs[j]; err != nil {
			reason := envelope.ReasonOf(err)
			if reason == "" {
				reason = reasonUnextractable
			}
			d.dead = append(d.dead, deadLetter{msg: msg, reason: reason, err: err})
			continue
		}
		d.items = append(d.items, items[j])
		d.msgs = append(d.msgs, msg)
	}
	return d
}

// process decodes one record, turning a panic of the decoder into a rejection of the record.
func (i *Ingester) process(msg *sarama.ConsumerMessage) (item *mailboxv1.MailboxItem, err error) {
	defer func() {
		if p := recover(); p != nil {
			i.log.Error("decoder panicked; dead-lettering the record", "topic", msg.Topic, "partition", msg.Partition,
				"offset", msg.Offset, "panic", p, "stack", string(debug.Stack()))
			item, err = nil, &envelope.RejectError{Reason: reasonDecodePanic, Err: fmt.Errorf("panic: %v", p)}
		}
	}()
	return i.cfg.process(msg.Value, i.cfg.Mode, i.log)
}
