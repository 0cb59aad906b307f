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

// nextEpoch is the fencing token of a grant applied by tx.
func nextEpoch(tx *txn) (uint64, error) { return epochAt(tx.term, tx.index) }
