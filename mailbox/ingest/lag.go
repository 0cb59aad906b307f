package ingest

import (
	"cmp"
	"slices"
	"strings"
	"sync"

	"github.com/IBM/sarama"
)

// lagSum keeps what each claim of the current consumer group session last
// reported as its lag, so the runner can tell the sidecar how far the
// mailbox is behind (a catching-up namespace switches once its lag is
// small: docs/architecture.md#moves).
type lagSum struct {
	mu    sync.Mutex
	parts map[lagKey]claimReport // nil between sessions
}

// claimReport is a claim's last report; lag is -1 until it reports.
type claimReport struct {
	lag  int64
	next int64 // the offset after the last stored record
}

type lagKey struct {
	topic     string
	partition int32
}

// begin starts a session's claims, each unknown.
func (l *lagSum) begin(claims map[string][]int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.parts = map[lagKey]claimReport{}
	for t, ps := range claims {
		for _, p := range ps {
			l.parts[lagKey{t, p}] = claimReport{lag: -1}
		}
	}
}

// end forgets the session's claims: they may move before the next one.
func (l *lagSum) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.parts = nil
}

func (l *lagSum) set(topic string, partition int32, next, lag int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := lagKey{topic, partition}
	// A periodic report that loaded next before a batch's flush may land
	// after it: within a session positions only grow, so it is stale.
	if r, ok := l.parts[k]; ok && (r.lag < 0 || next >= r.next) {
		l.parts[k] = claimReport{lag: lag, next: next}
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
	for _, r := range i.lag.parts {
		if r.lag < 0 {
			return 0, false
		}
		lag += r.lag
	}
	return lag, true
}

// Position is where the mailbox's stored history of one partition ends.
type Position struct {
	Topic     string
	Partition int32
	// Next is the offset after the last durably stored record (the
	// partition's oldest offset before the first).
	Next int64
}

// Positions are the claims' stored positions as of their last reports,
// sorted by topic then partition; known as for Lag. Unlike lag, a position
// does not depend on when it was measured against a moving high watermark,
// so two mailboxes' positions compare as what each has stored
// (docs/architecture.md#moves).
func (i *Ingester) Positions() ([]Position, bool) {
	i.lag.mu.Lock()
	defer i.lag.mu.Unlock()
	if len(i.lag.parts) == 0 {
		return nil, false
	}
	out := make([]Position, 0, len(i.lag.parts))
	for k, r := range i.lag.parts {
		if r.lag < 0 {
			return nil, false
		}
		out = append(out, Position{Topic: k.topic, Partition: k.partition, Next: r.next})
	}
	slices.SortFunc(out, func(a, b Position) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out, true
}

// setLag reports a claim's lag to the metrics and to Lag, and next, the
// offset after its last durable record, to Positions.
func (i *Ingester) setLag(c sarama.ConsumerGroupClaim, next, lag int64) {
	i.cfg.Metrics.setLag(i.cfg.MailboxID, c.Topic(), c.Partition(), lag)
	i.lag.set(c.Topic(), c.Partition(), next, lag)
}

// claimLag is the claim's lag given next, the offset after its last durable
// record, and that offset resolved. Before its first record (next < 0: a
// new group) the claim starts at the partition's oldest offset, so an empty
// partition is known to be 0 behind rather than unknown until a record
// arrives.
func (i *Ingester) claimLag(c sarama.ConsumerGroupClaim, next int64) (resolved, lag int64, ok bool) {
	if next < 0 {
		oldest, err := i.client.GetOffset(c.Topic(), c.Partition(), sarama.OffsetOldest)
		if err != nil {
			return 0, 0, false
		}
		next = oldest
	}
	return next, max(0, c.HighWaterMarkOffset()-next), true
}
