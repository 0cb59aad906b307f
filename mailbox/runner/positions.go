package runner

import "github.com/prism-mesh/prism/mailbox/ingest"

// Positions are mailbox id's stored positions per topic-partition
// (ingest.Ingester.Positions); known is false as for Lag.
func (r *Runner) Positions(id string) ([]ingest.Position, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	mb, ok := r.mailboxes[id]
	if !ok {
		return nil, false
	}
	return mb.ingest.Positions()
}
