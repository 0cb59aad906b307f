package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// A failover's phases, read from the survivors' logs (prism admin at
// --log-level info, JSON): raft's own lines for detection and election,
// raftnode's for the barrier and the server's for the lessor's promotion.
// Times are from the kill; the leader's last heartbeat went out at most
// HeartbeatTimeout/10 before it.
type failoverTrace struct {
	// timeouts are the survivors' "heartbeat timeout reached" (the first
	// follower to notice; the second one's is when it stops refusing votes
	// for having a leader), in the order they happened.
	timeouts []time.Duration
	// candidacies counts "entering candidate state" across the survivors:
	// more than one is a failed pre-vote or a split vote.
	candidacies int
	// elected is raft's "election won", ready the new leader's barrier
	// (raftnode's "leadership changed" with is_leader), promoted the lessor's.
	elected, ready, promoted time.Duration
}

// traceFailover reads the log files from kill on.
func traceFailover(logs []string, kill time.Time) (failoverTrace, error) {
	var t failoverTrace
	for _, path := range logs {
		f, err := os.Open(path)
		if err != nil {
			return t, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var l struct {
				Time     time.Time `json:"time"`
				Msg      string    `json:"msg"`
				IsLeader bool      `json:"is_leader"`
			}
			if json.Unmarshal(sc.Bytes(), &l) != nil || l.Time.Before(kill) {
				continue
			}
			at := l.Time.Sub(kill)
			switch {
			case strings.HasPrefix(l.Msg, "heartbeat timeout reached"):
				t.timeouts = append(t.timeouts, at)
			case l.Msg == "entering candidate state":
				t.candidacies++
			case l.Msg == "election won":
				t.elected = firstAt(t.elected, at)
			case l.Msg == "leadership changed" && l.IsLeader:
				t.ready = firstAt(t.ready, at)
			case strings.HasPrefix(l.Msg, "leading: lessor promoted"):
				t.promoted = firstAt(t.promoted, at)
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return t, fmt.Errorf("read %s: %w", path, err)
		}
	}
	slices.Sort(t.timeouts)
	return t, nil
}

func firstAt(cur, at time.Duration) time.Duration {
	if cur == 0 || at < cur {
		return at
	}
	return cur
}

func (t failoverTrace) String() string {
	var b strings.Builder
	b.WriteString("heartbeat timeouts")
	for _, d := range t.timeouts {
		fmt.Fprintf(&b, " %.1f", ms(d))
	}
	fmt.Fprintf(&b, " ms, %d candidacies, elected %.1f ms, barrier %.1f ms, lessor promoted %.1f ms", t.candidacies, ms(t.elected), ms(t.ready), ms(t.promoted))
	return b.String()
}
