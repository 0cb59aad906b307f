package ingest

import (
	"sync"

	"github.com/IBM/sarama"
)

// lagSum keeps what each claim of the current consumer group session last
// reported as its lag, so the runner can tell the sidecar how far the
// mailbox is behind (issue 15: a catching-up namespace switches once its
// lag is small).
type lagSum struct {
	mu    sync.Mutex
	parts map[lagKey]int64 // nil between sessions; -1 until the claim reports
}

type lagKey struct {
	topic     string
	partition int32
}

// begin starts a session's claims, each unknown.
func (l *lagSum) begin(claims map[string][]int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.parts = map[lagKey]int64{}
	for t, ps := range claims {
		for _, p := range ps {
			l.parts[lagKey{t, p}] = -1
		}
	}
}

// end forgets the session's claims: they may move before the next one.
func (l *lagSum) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.parts = nil
}

func (l *lagSum) set(topic string, partition int32, lag int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := lagKey{topic, partition}
	if _, ok := l.parts[k]; ok {
		l.parts[k] = lag
	}
}

// Lag is the number of records the mailbox is behind its partitions' high
// watermarks, summed over the claims of the current group session (every
// partition of the topics: the mailbox is its group's only member), as of
// each claim's last report (after each durable batch and every
// Config.LagInterval). known is false outside a session and until every
// claim has reported once.
func (i *Ingester) Lag() (lag int64, known bool) {
	i.lag.mu.Lock()
	defer i.lag.mu.Unlock()
	if len(i.lag.parts) == 0 {
		return 0, false
	}
	for _, n := range i.lag.parts {
		if n < 0 {
			return 0, false
		}
		lag += n
	}
	return lag, true
}

// setLag reports a claim's lag to the metrics and to Lag.
func (i *Ingester) setLag(c sarama.ConsumerGroupClaim, lag int64) {
	i.cfg.Metrics.setLag(i.cfg.MailboxID, c.Topic(), c.Partition(), lag)
	i.lag.set(c.Topic(), c.Partition(), lag)
}

// claimLag is the claim's lag given next, the offset after its last durable
// record. Before its first record (next < 0: a new group) the claim starts
// at the partition's oldest offset, so an empty partition is known to be
// 0 behind rather than unknown until a record arrives.
func (i *Ingester) claimLag(c sarama.ConsumerGroupClaim, next int64) (int64, bool) {
	if next < 0 {
		oldest, err := i.client.GetOffset(c.Topic(), c.Partition(), sarama.OffsetOldest)
		if err != nil {
			return 0, false
		}
		next = oldest
	}
	return max(0, c.HighWaterMarkOffset()-next), true
}
