package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// Cordon asks the admin cluster to cordon proxyID (ControlPlane
// DrainProxy): it takes no new namespaces and its namespaces move off by
// handoff. Config.Cordon is one; nil waits without cordoning.
type Cordon func(ctx context.Context, proxyID string) error

// NewInstance is a random sidecar instance name (Config.Instance).
func NewInstance() string { return strings.ToLower(rand.Text()) }

// DrainResult is what Drain waited for.
type DrainResult struct {
	ProxyID string `json:"proxy_id"`
	// Cordoned is false when Config.Cordon is nil or kept failing until
	// the deadline.
	Cordoned bool `json:"cordoned"`
	// WaitedFor are the mailboxes held when the drain began that it had
	// to see go: served, handed off, or still closing and releasing.
	WaitedFor []string `json:"waited_for"`
	// Remaining are those still held at the end; empty when drained.
	Remaining []string `json:"remaining"`
	// NowhereToHandOff is true when the drain ended because no proxy can
	// take a namespace (the admin's no_placeable_proxy): Remaining are
	// kept here, served until the runner stops.
	NowhereToHandOff bool   `json:"nowhere_to_hand_off,omitempty"`
	Took             string `json:"took"`
	Error            string `json:"error,omitempty"`
}

// Drained reports whether the proxy holds nothing it can hand off.
func (r DrainResult) Drained() bool {
	return r.Error == "" && (len(r.Remaining) == 0 || r.NowhereToHandOff)
}

// Drain is the first step of a pod's stop (the runner's preStop hook,
// docs/architecture.md#kubernetes-stop-order): it cordons the proxy, so
// the admin moves its namespaces to other proxies by handoff, then waits
// until the proxy holds no namespace it serves or hands off and every
// unassigned mailbox has been closed and released (docs/architecture.md#release), or
// until timeout passes on the agent's clock. A namespace catching up here
// does not hold the drain: the admin abandons moves to a cordoned proxy.
// The runner keeps serving throughout; it is stopped only after Drain.
func (a *Agent) Drain(ctx context.Context, timeout time.Duration) DrainResult {
	clk := a.cfg.Clock
	start := clk.Now()
	// The sidecar stopping (Shutdown) ends the wait too: it releases
	// everything itself.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(a.life.halt, cancel)
	defer stop()
	expired := make(chan struct{})
	t := clk.NewTimer(timeout)
	defer t.Stop()
	go func() {
		select {
		case <-t.C():
			close(expired)
		case <-ctx.Done():
		}
	}()
	res := DrainResult{ProxyID: a.cfg.ProxyID}
	a.log.Info("drain: cordoning the proxy, then waiting for its namespaces to be handed off", "timeout", timeout)
	// What it waits for is what was held as it began: a namespace handed
	// off while the cordon is retried counts too.
	held, kept, changed := a.drainHeld()
	res.WaitedFor = slices.Concat(held, kept)
	slices.Sort(res.WaitedFor)
	res.Cordoned = a.cordon(ctx, expired)
	for len(held) > 0 && res.Error == "" {
		select {
		case <-changed:
			held, kept, changed = a.drainHeld()
		case <-expired:
			res.Error = fmt.Sprintf("deadline %v passed with mailboxes still held", timeout)
		case <-ctx.Done():
			res.Error = "drain abandoned: the request ended or the sidecar is stopping"
		}
	}
	// Before the cordon is applied the proxy itself is placeable, so the
	// admin says nowhere only when no proxy could take a namespace either
	// way: what it keeps then stays until the runner stops.
	res.Remaining, res.Took = slices.Concat(held, kept), clk.Since(start).String()
	slices.Sort(res.Remaining)
	res.NowhereToHandOff = len(kept) > 0
	if res.WaitedFor == nil {
		res.WaitedFor = []string{}
	}
	if res.Remaining == nil {
		res.Remaining = []string{}
	}
	log := a.log.With("waited_for", res.WaitedFor, "remaining", res.Remaining, "took", res.Took, "cordoned", res.Cordoned)
	switch {
	case res.NowhereToHandOff && res.Drained():
		log.Warn("drain done: no proxy can take this proxy's namespaces; they are served until the runner stops, then by none until a runner registers")
	case res.Drained():
		log.Info("drain done: the proxy serves no namespace; the runner may stop")
	default:
		log.Warn("drain ended with namespaces still held; the runner stops anyway", "err", res.Error)
	}
	return res
}

// cordon calls Config.Cordon until it succeeds; false if it is nil, or
// ctx ended or the deadline passed first.
func (a *Agent) cordon(ctx context.Context, expired <-chan struct{}) bool {
	if a.cfg.Cordon == nil {
		a.log.Warn("drain: no cordon configured; waiting without asking the admin to move the namespaces")
		return false
	}
	bo := a.cfg.Backoff
	for {
		cctx, cancel := context.WithTimeout(ctx, a.cfg.RPCTimeout)
		err := a.cfg.Cordon(cctx, a.cfg.ProxyID)
		cancel()
		if err == nil {
			a.log.Info("drain: proxy cordoned; its namespaces move off by handoff")
			return true
		}
		a.log.Warn("drain: cordon failed; retrying", "err", err)
		t := a.cfg.Clock.NewTimer(bo.Step())
		select {
		case <-t.C():
		case <-expired:
			t.Stop()
			return false
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
}

// drainHeld lists, sorted, the mailboxes a drain waits for: those
// assigned as serving or handing off, and those still closing; those it
// cannot wait for, serving with no proxy placeable to take them; and a
// channel closed at their next change.
func (a *Agent) drainHeld() (held, kept []string, changed <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, w := range a.workers {
		switch role := w.view().Role; {
		case role == adminv1.AssignmentRole_ASSIGNMENT_ROLE_CATCHING_UP, role == adminv1.AssignmentRole_ASSIGNMENT_ROLE_REPLICA:
		case role == adminv1.AssignmentRole_ASSIGNMENT_ROLE_SERVING && a.nowhere:
			kept = append(kept, id)
		default:
			held = append(held, id)
		}
	}
	for id := range a.closing {
		held = append(held, id)
	}
	slices.Sort(held)
	slices.Sort(kept)
	return held, kept, a.changed
}

// serveDrain is POST /drain?timeout=D: Drain, answered 200 with its result
// once drained, or 504 when the deadline passed first. Only a caller on
// loopback may drain: the preStop hook runs in the runner container of the
// same pod (one network namespace), while the port also serves probes and
// metrics to the cluster, where anyone could otherwise hand the proxy's
// namespaces away.
func (a *Agent) serveDrain(w http.ResponseWriter, r *http.Request) {
	if !fromLoopback(r) {
		http.Error(w, "drain: only a caller in this pod (loopback) may drain its proxy", http.StatusForbidden)
		return
	}
	timeout, err := time.ParseDuration(r.URL.Query().Get("timeout"))
	if err != nil || timeout <= 0 {
		http.Error(w, "timeout: a positive duration is required, e.g. ?timeout=3m", http.StatusBadRequest)
		return
	}
	res := a.Drain(r.Context(), timeout)
	code := http.StatusOK
	if !res.Drained() {
		code = http.StatusGatewayTimeout
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(res)
}

// fromLoopback reports whether r came from a loopback address.
func fromLoopback(r *http.Request) bool {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}
