package runner

// Lag is how many records mailbox id's consumer is behind its topics' high
// watermarks, summed over their partitions (ingest.Ingester.Lag); known is
// false for a mailbox not open here or whose consumer has not yet reported
// every partition.
func (r *Runner) Lag(id string) (lag int64, known bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	mb, ok := r.mailboxes[id]
	if !ok {
		return 0, false
	}
	return mb.ingest.Lag()
}
