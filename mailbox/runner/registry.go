package runner

import (
	"errors"
	"maps"
	"slices"
	"sync"

	"github.com/prism-mesh/prism/mailbox/query"
	"github.com/prism-mesh/prism/mailbox/store"
)

// OpenFailures says, for each mailbox whose last store open failed, why.
func (r *Runner) OpenFailures() map[string]error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return maps.Clone(r.failed)
}

// errRunnerClosed refuses an Open or Prepare once Close has begun.
var errRunnerClosed = errors.New("runner closed")

// registry is what the runner hosts, by mailbox id: the mailboxes it serves,
// the stores opened ahead of an Open, why each mailbox's last store open
// failed, and who may copy each. It keeps no lifecycle: which call a mailbox
// may take in which state is mailbox/control's (lifecycle.go), and a host
// call that does not fit what the registry holds is refused (ErrNotOpen,
// already open).
//
// mu guards the maps and closed, and is held only to read or change them,
// never across a store's opening or an ingest's start, so queries to every
// mailbox answer while another opens. The calls about one id take turns
// (turn): an Open or Prepare holds its id's turn across that slow work, and
// a call about the same id (close, drain, epoch, deadline) waits for it, so
// it acts on what the open leaves rather than on nothing. A turn is taken
// before mu, never while holding it.
type registry struct {
	mu        sync.RWMutex
	mailboxes map[string]*mailbox
	prepared  map[string]*store.Store // opened ahead of Open; not served
	// failed holds why each mailbox's last store open failed, until one
	// succeeds or the mailbox is discarded: /readyz and a gauge report it.
	failed map[string]error
	// allowed is who may fetch a copy of each mailbox (AllowRecovery).
	allowed map[string][]string
	closed  bool
	opens   sync.WaitGroup // the Opens and Prepares in flight, which Close waits for

	turnsMu sync.Mutex
	turns   map[string]*turn
}

func newRegistry() registry {
	return registry{
		mailboxes: map[string]*mailbox{},
		prepared:  map[string]*store.Store{},
		failed:    map[string]error{},
		allowed:   map[string][]string{},
		turns:     map[string]*turn{},
	}
}

// turn is one id's turn; takers counts the calls holding or awaiting it,
// so that the last one out drops it from the registry.
type turn struct {
	mu     sync.Mutex
	takers int
}

// turn waits until no other call about id holds its turn, and holds it
// until release.
func (g *registry) turn(id string) (release func()) {
	g.turnsMu.Lock()
	t, ok := g.turns[id]
	if !ok {
		t = &turn{}
		g.turns[id] = t
	}
	t.takers++
	g.turnsMu.Unlock()
	t.mu.Lock()
	return func() {
		t.mu.Unlock()
		g.turnsMu.Lock()
		if t.takers--; t.takers == 0 {
			delete(g.turns, id)
		}
		g.turnsMu.Unlock()
	}
}

// beginOpen takes id's turn for an Open or Prepare and counts it in flight,
// refused once Close has begun; done ends both. Close waits for every open
// begun, and such an open that finds the runner closed when its store is
// open closes what it opened before done.
func (g *registry) beginOpen(id string) (done func(), err error) {
	release := g.turn(id)
	if g.unlessClosed(func() { g.opens.Add(1) }) {
		release()
		return nil, errRunnerClosed
	}
	return func() {
		g.opens.Done()
		release()
	}, nil
}

// unlessClosed runs fn with mu held unless Close has begun, and says
// whether it had.
func (g *registry) unlessClosed(fn func()) (closed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return true
	}
	fn()
	return false
}

// settled runs fn with mu held once no Open or Prepare of id is in flight.
func (g *registry) settled(id string, fn func()) {
	release := g.turn(id)
	defer release()
	g.mu.Lock()
	defer g.mu.Unlock()
	fn()
}

// Mailbox implements query.Mailboxes. A mailbox past its lease deadline is
// not served (SetValidFor).
func (r *Runner) Mailbox(id string) (query.Source, uint64, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	mb, ok := r.mailboxes[id]
	if !ok || mb.expired(r.cfg.Clock.Now()) {
		return nil, 0, false
	}
	return guarded{mb}, mb.epoch.Load(), true
}

// Consuming reports whether mailbox id is open and in an active consumer
// group session.
func (r *Runner) Consuming(id string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	mb, ok := r.mailboxes[id]
	return ok && mb.consuming()
}

// IDs lists the mailboxes served, sorted: open and within their lease
// deadline (SetValidFor), as Mailbox finds them.
func (r *Runner) IDs() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	now := r.cfg.Clock.Now()
	ids := make([]string, 0, len(r.mailboxes))
	for id, mb := range r.mailboxes {
		if !mb.expired(now) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}
