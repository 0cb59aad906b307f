package fsm

import "fmt"

// A lease's epoch (the fencing token) is the grant's Raft term in the high
// epochTermBits bits and its log index in the low epochIndexBits bits, so
// epochs order like (term, index) pairs (docs/architecture.md#fencing-epochs).
//
// The index alone orders grants only while the log is never lost: a node
// whose raft-wal tail was cut (a torn write, a disk that acknowledged an
// fsync it did not do) restarts without the last entries and reuses their
// indexes for new grants, handing out epochs below ones already held. The
// term lives in raft's stable store (raft-wal's meta DB, a separate file that
// a cut log tail does not touch), and a leader's term is above the term of
// every entry committed before its election: some node of its electing
// quorum also stored the committed entry, so had persisted a current term at
// least that high, and grants a vote only for a higher term, or for the same
// term to the one leader of that term, whose own log does not shrink while it
// runs. Within one term the leader's indexes grow. So every committed grant's
// (term, index) is above every earlier committed grant's, however much of
// any log was lost, as long as the stable store kept its writes.
//
// The split: 2^40 indexes (1.1e12 entries: 3.5 years at a sustained 10,000
// Raft entries a second; renewals are leader-local and do not use the log)
// and 2^24 terms (16.7 million elections: 2.6 years of an election every
// 5 s). Past either limit a grant is refused with an error rather than
// wrapping to a smaller epoch; the cluster then needs to be recreated.
const (
	epochIndexBits = 40
	epochTermBits  = 64 - epochIndexBits
)

// epochAt is the epoch of a grant committed at (term, index). Term 0 only
// appears in hand-made logs (unit tests); it yields epoch = index.
func epochAt(term, index uint64) (uint64, error) {
	if term >= 1<<epochTermBits || index >= 1<<epochIndexBits {
		return 0, fmt.Errorf("epoch space exhausted at term %d index %d (limits %d terms, %d indexes): recreate the admin cluster", term, index, uint64(1)<<epochTermBits, uint64(1)<<epochIndexBits)
	}
	return term<<epochIndexBits | index, nil
}

// # Many grants in one entry
//
// A bulk grant (AcquireLeasesCommand) hands out n epochs in one entry, and
// an open session takes one for its id. epochAt(term, index) + k cannot be
// the rule on its own: with k >= 1 it equals the epoch of the entry at
// index + k, so the next single grant would get an epoch already held. So the
// FSM keeps the highest token handed out, st.epochHighWater (replicated
// state: derived from the log by every replica alike, and carried in every
// snapshot), and an entry's grants take
//
//	first = max(epochAt(term, index), epochHighWater + 1)
//	epochs first, first+1, ..., first+n-1;  epochHighWater = first+n-1
//
// in request order. Every token is above every earlier one (high water)
// and every later entry's are above these, within a term and across terms.
// The cut-log argument above still holds: a term's tokens stay below
// (term+1) << epochIndexBits (allocEpochs refuses an entry whose last token
// would reach it), and a node that lost its log's tail, and with it part of
// the high water, can grant again only as leader of a later term, whose
// tokens start at epochAt(newTerm, index), above all of the old term's.
// An entry that grants one token gets exactly epochAt(term, index), the
// rule above; a snapshot that carries no high water restores zero, which is
// below every epochAt of a later entry too.
//
// The cost is index space: a term spends as many of its 2^40 tokens as it
// grants leases, not one per entry: 1.1e12 is 35 years of a bulk grant of
// 1,000 every second. allocEpochs mutates the high water, so handlers call
// it only once every check has passed.

// allocEpochs takes n (>= 1) consecutive fencing tokens for grants applied
// by tx and returns the first.
func (tx *txn) allocEpochs(n int) (uint64, error) {
	first, err := epochAt(tx.term, tx.index)
	if err != nil {
		return 0, err
	}
	first = max(first, tx.st.epochHighWater+1)
	last := first + uint64(n) - 1
	if last>>epochIndexBits != tx.term {
		return 0, fmt.Errorf("epoch space of term %d exhausted at index %d granting %d: recreate the admin cluster", tx.term, tx.index, n)
	}
	tx.st.epochHighWater = last
	return first, nil
}
