package sidecare2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// Pauses past the bounds, as outside testers' fault schedules make them
// (SIGSTOP, not only kill -9): the paused side's deadline passes while it
// cannot act, and after SIGCONT it must not serve from what it held before.

// answer is one stats request to a runner for the mailbox: when it was sent
// and answered, the status and the epoch served.
type answer struct {
	runner       string
	sent, got    time.Time
	code         int
	epoch        uint64
	err          error
	queuedPaused bool // sent while the runner was paused
}

// answers records the stats answers of a test's runners.
type answers struct {
	mu   sync.Mutex
	rows []answer
}

func (as *answers) add(a answer) {
	as.mu.Lock()
	defer as.mu.Unlock()
	as.rows = append(as.rows, a)
}

func (as *answers) all() []answer {
	as.mu.Lock()
	defer as.mu.Unlock()
	return append([]answer(nil), as.rows...)
}

// ask sends one stats request to r with client c and records the answer.
func (as *answers) ask(c e2e.HTTP, name string, r *e2e.Runner, queued bool) answer {
	a := answer{runner: name, sent: time.Now(), queuedPaused: queued}
	code, body, _, err := c.Get(r.QueryURL() + "/v1/mailboxes/" + mailboxID + "/stats")
	a.got, a.code, a.err = time.Now(), code, err
	if code == 200 {
		var st struct {
			Epoch uint64 `json:"epoch"`
		}
		a.err = json.Unmarshal([]byte(body), &st)
		a.epoch = st.Epoch
	}
	as.add(a)
	return a
}

// poll asks each runner every 20 ms, each from its own goroutine (a paused
// runner holds its request up to the client's timeout without delaying the
// other's), until stop closes.
func (as *answers) poll(stop <-chan struct{}, runners map[string]*e2e.Runner) *sync.WaitGroup {
	var wg sync.WaitGroup
	for name, r := range runners {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				as.ask(web, name, r, false)
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		})
	}
	return &wg
}

// overlaps are the answers of old (200, its epoch) that prove it served
// the mailbox once the new holder had: sent after the new holder's first
// 200 was received, so both answered at some instant. served is when the
// new holder first answered 200 (zero: never).
func overlaps(rows []answer, old, holder string) (served time.Time, bad []answer) {
	for _, a := range rows {
		if a.runner == holder && a.code == 200 && (served.IsZero() || a.got.Before(served)) {
			served = a.got
		}
	}
	if served.IsZero() {
		return served, nil
	}
	for _, a := range rows {
		if a.runner == old && a.code == 200 && a.sent.After(served) {
			bad = append(bad, a)
		}
	}
	return served, bad
}

func describe(rows []answer, start time.Time) string {
	var b strings.Builder
	for _, a := range rows {
		fmt.Fprintf(&b, "%s sent %.3fs got %.3fs: %d epoch %d err %v queued %v\n", a.runner, a.sent.Sub(start).Seconds(), a.got.Sub(start).Seconds(), a.code, a.epoch, a.err, a.queuedPaused)
	}
	return b.String()
}

// standbyWaiting starts a world where runner-a serves the mailbox under
// epochA with n events stored and committed, and runner-b, on the same
// proxy, has its sidecar waiting for the lease.
func standbyWaiting(t *testing.T, n int) (e *env, epochA uint64, runnerB *e2e.Runner) {
	t.Helper()
	e = setup(t, 1, grpcAddrs)
	admin := e.admins[0]
	epochA = e.heldBy(t, admin, "runner-a", e.runner, 0)
	e.tl.mark("runner-a serving, epoch %d", epochA)
	e.kafka.ProduceEnvelopes(t, topic, envelopes("before", n)...)
	testwait.For(t, 30*time.Second, "runner-a stored and committed the first events", func() (bool, string) {
		_, _, stored, err := mailboxStats(e.runner)
		committed := e.kafka.Committed(t, mailboxID, topic)
		return stored == int64(n) && committed == int64(n), fmt.Sprintf("stored %d committed %d err %v", stored, committed, err)
	})
	runnerB = startRunner(t, "runner-b", e.kafka.Brokers)
	sidecarB := startSidecar(t, "sidecar-b", "runner-b", runnerB, admin.GRPCAddr)
	testwait.For(t, 30*time.Second, "sidecar-b waiting for the lease", func() (bool, string) {
		return sidecarB.LogHas("lease refused"), sidecarB.Tail(3)
	})
	return e, epochA, runnerB
}

// The sidecar paused (SIGSTOP) longer than ttl + grace while its runner runs:
// the runner fences itself by the deadline it was handed, the admin expires
// the lease and a standby runner of the proxy takes it under a newer epoch.
// After SIGCONT the sidecar renews nothing from its stale session (its
// validity ran out during the pause, and only a keepalive sent after the
// resume and acknowledged could extend anything), so runner-a never serves
// the mailbox again: polled every 20 ms through the pause and for seconds
// after the resume, the two runners never both answer. The resumed sidecar
// ends with its session and lease gone, counted and logged, alive and
// waiting (refused: held by runner-b), and the new holder stores every
// event produced after runner-a fenced (runner-a committed what it stored
// before).
func TestSidecarPausedPastExpiryNeverServesStale(t *testing.T) {
	const n1, n2 = 100, 150
	e, epochA, runnerB := standbyWaiting(t, n1)
	admin := e.admins[0]

	var as answers
	stop := make(chan struct{})
	polling := as.poll(stop, map[string]*e2e.Runner{"runner-a": e.runner, "runner-b": runnerB})
	stopPolling := sync.OnceFunc(func() { close(stop); polling.Wait() })
	defer stopPolling()

	paused := e.tl.mark("SIGSTOP sidecar-a (ttl %v, grace %v)", ttl, grace)
	e.sidecar.Pause()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			e.sidecar.Resume()
		}
	}
	t.Cleanup(resume) // a failed wait below must not leave it stopped
	var fenced time.Time
	testwait.For(t, ttl+2*time.Second, "runner-a fenced by its own deadline", func() (bool, string) {
		code, _, _, err := mailboxStats(e.runner)
		if code == 404 {
			fenced = e.tl.mark("runner-a stopped serving")
		}
		return code == 404, fmt.Sprint(code, err)
	})
	e.kafka.ProduceEnvelopes(t, topic, envelopes("after", n2)...)
	e.tl.mark("%d more events produced", n2)
	epochB := e.heldBy(t, admin, "runner-b", runnerB, epochA)
	e.tl.mark("runner-b serving, epoch %d", epochB)
	// The pause outlasts ttl + grace whatever the waits above took.
	time.Sleep(time.Until(paused.Add(ttl + grace + time.Second)))
	resume()
	resumedAt := e.tl.mark("SIGCONT sidecar-a after %v", time.Since(paused).Round(time.Millisecond))

	// The resumed sidecar finds its session gone: lost on its own clock
	// (ttl elapsed) or refused by the admin.
	testwait.For(t, 10*time.Second, "sidecar-a reports its session lost", func() (bool, string) {
		return e.sidecar.LogHas("session lost"), e.sidecar.Tail(5)
	})
	e.tl.mark("sidecar-a reported the loss")
	// It asks again and is refused: the lease is runner-b's, and so is the
	// proxy's registration (sidecar-b registered it while sidecar-a was
	// stopped), so even a session is refused; it retries, alive.
	testwait.For(t, 15*time.Second, "sidecar-a asks again and is refused for runner-b", func() (bool, string) {
		n := countLines(e.sidecar.LogPath, "lease refused", "HELD_BY_OTHER") + countLines(e.sidecar.LogPath, "session refused", "NOT_PROXY_RUNNER")
		return n > 0, e.sidecar.Tail(5)
	})
	if !e.sidecar.LogHas("lease lost; fencing the runner", "ttl_elapsed", mailboxID) {
		t.Errorf("sidecar-a did not log the lease's loss with its reason:\n%s", e.sidecar.Tail(20))
	}
	// Seconds of polling after the resume: a revived runner-a shows here.
	time.Sleep(time.Until(resumedAt.Add(4 * time.Second)))
	stopPolling()
	e.tl.mark("polling stopped")

	testwait.For(t, 30*time.Second, "runner-b stored every event produced after runner-a fenced", func() (bool, string) {
		_, _, stored, err := mailboxStats(runnerB)
		return stored == n2, fmt.Sprint(stored, err)
	})
	testwait.For(t, 10*time.Second, "every offset committed", func() (bool, string) {
		c := e.kafka.Committed(t, mailboxID, topic)
		return c == n1+n2, fmt.Sprint(c)
	})
	t.Logf("timeline:\n%s", e.tl)

	rows := as.all()
	served, bad := overlaps(rows, "runner-a", "runner-b")
	if served.IsZero() {
		t.Fatalf("the poll never saw runner-b serve:\n%s", describe(rows, paused))
	}
	if len(bad) > 0 {
		t.Errorf("runner-a answered %d times after runner-b first served (%.3fs):\n%s", len(bad), served.Sub(paused).Seconds(), describe(bad, paused))
	}
	for _, a := range rows {
		if a.runner == "runner-a" && a.code == 200 && a.sent.After(fenced) {
			t.Errorf("runner-a served again after its fence (%.3fs): %s", fenced.Sub(paused).Seconds(), describe([]answer{a}, paused))
		}
	}
	if !e.sidecar.Alive() {
		t.Fatal("sidecar-a exited after the resume")
	}
	if n := countLines(e.sidecar.LogPath, "sidecar starting"); n != 1 {
		t.Errorf("sidecar-a started %d times, want once", n)
	}
	if l, err := leaseOf(admin); err != nil || l.GetRunnerId() != "runner-b" || l.GetEpoch() != epochB {
		t.Errorf("lease after the resume: %v %v, want runner-b at epoch %d", l, err, epochB)
	}
	if v, err := web.Metric(e.sidecar.HTTPURL(), "prism_sidecar_lease_losses_total"); err != nil || v < 1 {
		t.Errorf("sidecar-a counted %v lease losses (err %v), want at least one", v, err)
	}
	if v, err := web.Metric(e.runner.HTTPURL(), "prism_runner_fences_total", `reason="deadline_passed"`); err != nil || v != 1 {
		t.Errorf("runner-a fences by deadline: %v %v, want 1", v, err)
	}
	if code, _, _, err := mailboxStats(e.runner); code != 404 {
		t.Errorf("runner-a at the end: %d %v, want 404", code, err)
	}
	if n := countLines(e.runner.LogPath, "mailbox active: consuming and serving"); n != 1 {
		t.Errorf("runner-a activated the mailbox %d times, want once (never again after the resume)", n)
	}
}

// The runner paused (SIGSTOP) longer than the runner-dead bound: its sidecar
// gives the lease up, fences, and releases it once the deadline it handed
// the runner has passed; a standby runner of the proxy takes it under a
// newer epoch. Requests that reached runner-a's socket during the pause, and
// those sent right after SIGCONT, must not be answered from the ownership it
// lost: its deadline passed during the pause, whatever its timer has yet to
// run. Nor may runner-a store or commit anything of the mailbox after the
// resume: events produced during the pause (a fetch in flight at the pause
// may carry them) are all in runner-b's store, and the group's offsets end
// at everything produced.
func TestRunnerPausedPastBoundNeverServesStale(t *testing.T) {
	const n1, n2 = 100, 150
	e, epochA, runnerB := standbyWaiting(t, n1)
	admin := e.admins[0]

	var as answers
	// Clients connected before the pause, so that their requests in it
	// reach runner-a's socket (a new connection would wait in the TLS
	// handshake instead).
	const queued = 6
	clients := make([]e2e.HTTP, queued)
	for i := range clients {
		clients[i] = e2e.NewHTTP(60 * time.Second)
		if a := as.ask(clients[i], "runner-a", e.runner, false); a.code != 200 {
			t.Fatalf("runner-a before the pause: %d %v", a.code, a.err)
		}
	}
	paused := e.tl.mark("SIGSTOP runner-a (bound %v, ttl %v)", runnerDeadAfter, ttl)
	e.runner.Pause()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			e.runner.Resume()
		}
	}
	t.Cleanup(resume)
	// Produced at once, while runner-a's fetch may still be in flight.
	e.kafka.ProduceEnvelopes(t, topic, envelopes("paused", n2)...)
	e.tl.mark("%d events produced during the pause", n2)
	// Requests queued in runner-a's socket for the rest of the pause.
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() { as.ask(c, "runner-a", e.runner, true) })
	}
	epochB := e.heldBy(t, admin, "runner-b", runnerB, epochA)
	e.tl.mark("runner-b serving, epoch %d", epochB)
	testwait.For(t, 10*time.Second, "sidecar-a gave the lease back", func() (bool, string) {
		return e.sidecar.LogHas("lease released", `"cause":"runner_unreachable"`), e.sidecar.Tail(3)
	})
	e.tl.mark("sidecar-a released the lease")

	stop := make(chan struct{})
	polling := as.poll(stop, map[string]*e2e.Runner{"runner-a": e.runner, "runner-b": runnerB})
	stopPolling := sync.OnceFunc(func() { close(stop); polling.Wait() })
	defer stopPolling()
	resume()
	resumedAt := e.tl.mark("SIGCONT runner-a after %v", time.Since(paused).Round(time.Millisecond))
	// Fresh requests right after the resume, before the timers have run.
	for range queued {
		c := e2e.NewHTTP(10 * time.Second)
		wg.Go(func() { as.ask(c, "runner-a", e.runner, false) })
	}
	wg.Wait()
	e.tl.mark("the queued requests answered")
	time.Sleep(time.Until(resumedAt.Add(4 * time.Second)))
	stopPolling()

	testwait.For(t, 40*time.Second, "runner-b stored every event produced during the pause", func() (bool, string) {
		_, _, stored, err := mailboxStats(runnerB)
		return stored == n2, fmt.Sprint(stored, err)
	})
	e.tl.mark("runner-b stored the %d events", n2)
	testwait.For(t, 10*time.Second, "every offset committed", func() (bool, string) {
		c := e.kafka.Committed(t, mailboxID, topic)
		return c == n1+n2, fmt.Sprint(c)
	})
	t.Logf("timeline:\n%s", e.tl)

	rows := as.all()
	for _, a := range rows {
		if a.runner == "runner-a" && a.code == 200 && a.sent.After(paused) {
			t.Errorf("runner-a answered for the mailbox after its deadline passed in the pause: %s", describe([]answer{a}, paused))
		}
	}
	if _, bad := overlaps(rows, "runner-a", "runner-b"); len(bad) > 0 {
		t.Errorf("both runners answered:\n%s", describe(bad, paused))
	}
	if code, _, _, err := mailboxStats(e.runner); code != 404 {
		t.Errorf("runner-a at the end: %d %v, want 404", code, err)
	}
	// Runner-a answered last at the pause; an extension sent just before
	// may have been taken, so its deadline is at most about two ttl after,
	// and the release waits for no RPC timeout. The two seconds are for
	// polling and scheduling on a loaded machine.
	if at, ok := e.sidecar.LogTime("lease released"); !ok || at.Sub(paused) > 2*ttl+2*time.Second {
		t.Errorf("sidecar-a released the lease %v after the pause (logged %v), want within 2 ttl", at.Sub(paused), ok)
	}
	if l, err := leaseOf(admin); err != nil || l.GetRunnerId() != "runner-b" || l.GetEpoch() != epochB {
		t.Errorf("lease after the resume: %v %v, want runner-b at epoch %d", l, err, epochB)
	}
	if n := countLines(e.runner.LogPath, "mailbox active: consuming and serving"); n != 1 {
		t.Errorf("runner-a activated the mailbox %d times, want once (never again after the resume)", n)
	}
	t.Logf("answers:\n%s", describe(rows[:min(len(rows), 40)], paused))
}

// countLines is how many lines of the log at path hold every part.
func countLines(path string, parts ...string) int {
	n := 0
	for _, l := range strings.Split(logLines(path, parts[0]), "\n") {
		ok := l != ""
		for _, p := range parts[1:] {
			ok = ok && strings.Contains(l, p)
		}
		if ok {
			n++
		}
	}
	return n
}
