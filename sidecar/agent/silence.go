package agent

import "time"

// silence is how long the runner has failed its stats probes, counted on
// the sidecar's monotonic clock over time this process was running to see
// it, so that a pause of the sidecar itself (SIGSTOP, a GC or a stall of
// the machine, CPU throttling) is never taken for the runner's: a pause
// shorter than ttl keeps every lease, however it falls on the probes.
//
// The silence starts at the runner's last answer, as the bound is stated,
// and grows with each probe that fails by
//   - the wait before that probe was sent, but at most spacing, the longest
//     a running sidecar waits between the end of one probe and the send of
//     the next: a longer gap is the sidecar's own pause (its timer fired
//     late), not the runner's silence;
//   - the probe's own time, but at most its timeout, by which the runner had
//     to answer.
//
// A probe that took far longer than its timeout (pausedAfter) failed
// because the sidecar was stopped while it was in flight, perhaps with the
// runner's answer unread: it counts for nothing, nor does the wait before
// it. An answer ends the silence: the probe's, or the runner's answer to
// any other call (heard), so a runner too busy to answer its stats in time
// (opening a thousand stores on two cores) but answering its opens is not
// taken for dead.
type silence struct {
	timeout, spacing time.Duration
	// from is when the silence began, moved later by every stretch not
	// counted, so that the silence known at at is at - from; from == at
	// after an answer.
	from, at time.Time
	// last is when the latest probe ended, the start of the next gap.
	last time.Time
}

// newSilence starts judging a runner that answered at answeredAt, with
// probes of timeout sent at most spacing after the end of the one before.
func newSilence(answeredAt time.Time, timeout, spacing time.Duration) silence {
	return silence{timeout: timeout, spacing: spacing, from: answeredAt, at: answeredAt, last: answeredAt}
}

// pausedAfter is how long a probe may take before its failure is put down
// to the sidecar's own pause rather than the runner: twice its timeout.
// A probe that fails by its deadline takes the timeout and a little
// scheduling on a loaded machine; one that took twice as long was stopped.
func pausedAfter(timeout time.Duration) time.Duration { return 2 * timeout }

// observe judges a probe sent at sentAt that ended at end; err is why the
// runner did not answer (nil: it did), heard when it last answered any call
// (Agent.heard). It returns how long the runner has now been silent.
func (s *silence) observe(sentAt, end time.Time, err error, heard time.Time) time.Duration {
	if err == nil {
		s.from, s.at, s.last = end, end, end
		return 0
	}
	down := s.down()
	if took := end.Sub(sentAt); took <= pausedAfter(s.timeout) {
		// From the send, or from a later answer to another call.
		silentFrom := later(sentAt, s.last)
		down += min(max(sentAt.Sub(s.last), 0), s.spacing) + max(earlier(end, sentAt.Add(s.timeout)).Sub(silentFrom), 0)
	}
	s.at, s.last = end, end
	s.from = end.Add(-down)
	s.heard(heard)
	return s.down()
}

// heard ends the silence at t, when the runner answered another call; it
// only ever shortens the silence, never counting time before a pause.
func (s *silence) heard(t time.Time) {
	if !t.After(s.from) {
		return
	}
	s.from, s.at, s.last = t, later(s.at, t), later(s.last, t)
}

// down is the silence known so far: 0 if the runner answered last.
func (s *silence) down() time.Duration { return s.at.Sub(s.from) }

// since is the silence known so far, counted from answeredAt at the
// earliest: a worker's own answer from the runner (its activation) that the
// probes did not see.
func (s *silence) since(answeredAt time.Time) time.Duration {
	return max(s.at.Sub(later(s.from, answeredAt)), 0)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
