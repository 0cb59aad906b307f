package sidecare2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// logRecord is one JSON log line of a prism process: its time, message and
// the attributes this file reads.
type logRecord struct {
	Time      time.Time `json:"time"`
	Msg       string    `json:"msg"`
	MailboxID string    `json:"mailbox_id"`
	Epoch     uint64    `json:"epoch"`
	Asked     int       `json:"asked"`
	Granted   int       `json:"granted"`
	// Took is how long the runner's control API took over the call, in
	// nanoseconds (slog's JSON of a time.Duration).
	Took time.Duration `json:"took"`
}

// logRecords are the records of the JSON log at path whose message is one
// of msgs, in order.
func logRecords(t *testing.T, path string, msgs ...string) []logRecord {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []logRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r logRecord
		if json.Unmarshal(sc.Bytes(), &r) == nil && slices.Contains(msgs, r.Msg) {
			out = append(out, r)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// cpuTime is the CPU time (user and system) process pid has used.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's name, which is in parentheses: utime
	// and stime are the 14th and 15th of the line, in clock ticks (100 Hz).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	var ticks int64
	for _, s := range f[11:13] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// percentile is the p-th percentile of ds (sorted in place).
func percentile(ds []time.Duration, p float64) time.Duration {
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(float64(len(ds))*p))]
}

// span is the first and last time of records, by message.
type span struct {
	first, last time.Time
	n           int
}

func spans(recs []logRecord) map[string]*span {
	out := map[string]*span{}
	for _, r := range recs {
		s := out[r.Msg]
		if s == nil {
			s = &span{first: r.Time}
			out[r.Msg] = s
		}
		s.last = r.Time
		s.n++
	}
	return out
}

// Issue 20's bulk grant: a sidecar whose proxy is assigned 1,000
// namespaces, started against a real admin and a real runner, has every
// one of the 1,000 mailboxes served within a second of the session's bulk
// grant (the one AcquireLeases answer): the runner's store holds every
// mailbox in one Badger, so each mailbox's store is open before its lease
// is asked for, and activating it after the grant only starts its consumer
// and publishes it. Served means the runner answers the mailbox's query
// under its granted epoch; the time is the runner's log of each mailbox
// made active (it answers from that moment), checked afterwards by a query
// of every mailbox. The phases (prepares, the grant, activations, consumer
// group joins) are logged with their times.
func TestSidecarBulkGrantServes1000WithinASecond(t *testing.T) {
	const n = 1000
	bound := time.Second
	kafka := kafkatest.Start(t, kafkatest.Topics(1, topic))
	cluster := e2e.StartAdmins(t, e2e.AdminOptions{Size: 1})
	admin := cluster.Nodes[0]
	createNamespaces(t, admin, n)
	runner := e2e.StartRunner(t, e2e.RunnerOptions{Name: "runner-a", Brokers: kafka.Brokers,
		Args: []string{"--batch-wait", "20ms", "--log-format", "json", "--memory-budget", "1GiB"}})
	procs := map[string]int{"runner": runner.Pid(), "admin": admin.Pid(), "test (kfake)": os.Getpid()}
	cpu0 := map[string]time.Duration{}
	for name, pid := range procs {
		cpu0[name] = cpuTime(t, pid)
	}
	started := time.Now()
	sidecar := startSidecar(t, "sidecar-a", "runner-a", runner, admin.GRPCAddr)
	procs["sidecar"] = sidecar.Pid()
	epochs := map[string]uint64{}
	testwait.For(t, 60*time.Second, fmt.Sprintf("%d leases held", n), func() (bool, string) {
		ls, err := sessionLeases(admin)
		if err != nil || len(ls) != n {
			return false, fmt.Sprintf("%d leases, err %v", len(ls), err)
		}
		for _, l := range ls {
			epochs[l.GetMailboxId()] = l.GetEpoch()
		}
		return true, ""
	})
	testwait.For(t, 60*time.Second, "sidecar ready (every mailbox served)", sidecar.Ready)
	var cpu []string
	for _, name := range slices.Sorted(maps.Keys(procs)) {
		cpu = append(cpu, fmt.Sprintf("%s %.2fs", name, (cpuTime(t, procs[name])-cpu0[name]).Seconds()))
	}
	took := time.Since(started)

	const (
		msgPrepared = "mailbox store opened; waiting for a lease epoch"
		msgActive   = "mailbox active: consuming and serving"
		msgJoined   = "consumer group session started"
		msgGranted  = "leases acquired in one batch"
	)
	var grant *logRecord
	for _, r := range logRecords(t, sidecar.LogPath, msgGranted) {
		if r.Asked != n || r.Granted != n {
			t.Fatalf("the sidecar's batch asked %d and was granted %d, want one batch of %d", r.Asked, r.Granted, n)
		}
		if grant != nil {
			t.Fatal("the sidecar asked for its leases in more than one batch")
		}
		grant = &r
	}
	if grant == nil {
		t.Fatal("the sidecar logged no bulk grant")
	}
	// Every mailbox active once, under its granted epoch.
	var recs []logRecord
	var activations []time.Duration
	active := map[string]time.Time{}
	for _, r := range logRecords(t, runner.LogPath, msgPrepared, msgActive, msgJoined) {
		recs = append(recs, r)
		if r.Msg != msgActive {
			continue
		}
		if want, ok := epochs[r.MailboxID]; !ok || r.Epoch != want {
			t.Fatalf("the runner activated %s under epoch %d, want its grant's %d", r.MailboxID, r.Epoch, want)
		}
		active[r.MailboxID] = r.Time
		activations = append(activations, r.Took)
	}
	if len(active) != n {
		t.Fatalf("the runner activated %d mailboxes, want %d", len(active), n)
	}
	ph := spans(recs)
	phase := func(msg string) string {
		s := ph[msg]
		if s == nil {
			return "none"
		}
		return fmt.Sprintf("%d from %+.3fs to %+.3fs", s.n, s.first.Sub(grant.Time).Seconds(), s.last.Sub(grant.Time).Seconds())
	}
	served := ph[msgActive].last.Sub(grant.Time)
	t.Logf("bulk grant of %d leases %.3fs after the sidecar started; relative to the grant: stores opened (prepares) %s; activations %s; consumer group joins %s; every mailbox served %.3fs after the grant",
		n, grant.Time.Sub(started).Seconds(), phase(msgPrepared), phase(msgActive), phase(msgJoined), served.Seconds())
	t.Logf("one activation in the runner (its consumer started, the mailbox published), at most 32 at once (the sidecar's bound): p50 %v p90 %v max %v; CPU used from the sidecar's start to its readiness (%.3fs): %s",
		percentile(activations, 0.5).Round(time.Millisecond), percentile(activations, 0.9).Round(time.Millisecond), percentile(activations, 1).Round(time.Millisecond), took.Seconds(), strings.Join(cpu, ", "))

	// What the log says, the queries confirm: every mailbox answers under
	// its granted epoch (not timed: a thousand queries from here take
	// their own time on two cores).
	var wg sync.WaitGroup
	ids := make(chan string, n)
	for id := range epochs {
		ids <- id
	}
	close(ids)
	var mu sync.Mutex
	var wrong []string
	for range 8 {
		wg.Go(func() {
			for id := range ids {
				code, epoch, _, err := mailboxStatsOf(runner, id)
				if err != nil || code != 200 || epoch != epochs[id] {
					mu.Lock()
					wrong = append(wrong, fmt.Sprintf("%s: %d epoch %d err %v, want epoch %d", id, code, epoch, err, epochs[id]))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(wrong) > 0 {
		slices.Sort(wrong)
		t.Fatalf("%d of %d mailboxes do not answer under their granted epoch: %s", len(wrong), n, strings.Join(wrong[:min(len(wrong), 10)], "; "))
	}
	fmt.Printf("BENCH sidecar.bulk_grant_served_%d_ms %.1f ms\n", n, float64(served.Microseconds())/1000)
	if served > bound {
		t.Errorf("every mailbox served %v after the bulk grant, want within %v", served, bound)
	}
}
