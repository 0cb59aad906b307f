package main

import (
	"fmt"
	"os"
	"strings"
)

const contactGaps = "prism_admin_raft_leader_contact_gap_seconds"

// maxTerm is the highest raft term the running nodes report.
func maxTerm(c *prismCluster) float64 {
	var term float64
	for i, n := range c.nodes {
		if n.cmd == nil {
			continue
		}
		if t, err := scrapeGauge("http://"+c.http[i]+"/metrics", "prism_admin_raft_term"); err == nil {
			term = max(term, t)
		}
	}
	return term
}

// raftStability reports what a run's load cost raft's leadership: the
// elections during it (the term's rise from term0) and the followers'
// silences from their leader (prism_admin_raft_leader_contact_gap_seconds,
// over the nodes' life, setup included): the worst one's bucket bound and
// how many came near --raft-timing fast's heartbeat timeout. A gap past the
// timeout may start an election, and then is not among the gaps (the next
// contact is of another term), so the elections are the figure to read
// first.
func raftStability(c *prismCluster, name string, term0 float64) {
	bench("admin.raft_elections_"+name, maxTerm(c)-term0, "elections")
	var merged []bucket
	for i, n := range c.nodes {
		if n.cmd == nil {
			continue
		}
		// One scrape per node: its count would move on between two.
		bs, err := scrapeHistogram("http://"+c.http[i]+"/metrics", contactGaps)
		if err != nil {
			fmt.Fprintf(os.Stderr, "# %s: %v\n", name, err)
			return
		}
		if merged == nil {
			merged = make([]bucket, len(bs))
		}
		for j, b := range bs {
			merged[j] = bucket{b.le, merged[j].n + b.n}
		}
	}
	// Up to the last bound (5 s): a longer silence is always an election,
	// counted above, after which the next contact is of another term.
	total := merged[len(merged)-1].n
	if total == 0 {
		return
	}
	var worst float64
	over := map[float64]float64{}
	for _, b := range merged {
		if worst == 0 && b.n == total {
			worst = b.le
		}
		over[b.le] = total - b.n
	}
	bench("admin.raft_contact_gap_worst_le_ms_"+name, worst*1000, "ms")
	bench("admin.raft_contact_gap_p999_ms_"+name, quantile(merged, 0.999)*1000, "ms")
	bench("admin.raft_contact_gaps_over_50ms_"+name, over[0.05], "gaps")
	bench("admin.raft_contact_gaps_over_100ms_"+name, over[0.1], "gaps")
	fmt.Fprintf(os.Stderr, "# %s: %.0f leader contacts timed on the followers\n", name, total)
	// The nodes log each silence past the heartbeat timeout with its
	// length, and raft each election it starts.
	for _, n := range c.nodes {
		b, err := os.ReadFile(n.log)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "no word from the leader") || strings.Contains(l, "heartbeat timeout reached") {
				fmt.Fprintf(os.Stderr, "# %s: %s: %s\n", name, n.name, l)
			}
		}
	}
}
