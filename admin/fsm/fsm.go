package fsm

import (
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// LeaseObserver mirrors the lease table, e.g. package lease's Lessor. It is
// called synchronously from Apply and Restore, in log order, after the change
// is in the table; it must not call back into the FSM. Leases it receives
// are shared and must not be modified.
type LeaseObserver interface {
	// LeaseGranted reports a grant, including a reconnect that replaced the
	// same mailbox's previous epoch.
	LeaseGranted(l *adminv1.Lease)
	// LeaseRemoved reports a release or an expire.
	LeaseRemoved(mailboxID string, epoch uint64)
	// LeasesRestored replaces the whole table after a snapshot restore.
	LeasesRestored(leases []*adminv1.Lease)
}

// FSM implements raft.FSM and raft.BatchingFSM. Create it with New.
type FSM struct {
	log      *slog.Logger
	observer LeaseObserver
	moves    MoveObserver
	commits  CommitObserver

	mu      sync.RWMutex
	st      *state
	applied uint64
	changed chan struct{}

	// pendingCache is PendingMoves' count for state st at placementGen
	// gen; its own lock, as readers hold mu shared.
	pendingCache struct {
		mu  sync.Mutex
		st  *state
		gen uint64
		n   int
	}

	// replaceScope, when set, lists the namespaces replace visits in place
	// of its candidates: tests set it to every namespace to hold the
	// indexed pass to the full one.
	replaceScope func(*state) []string
}

// Option configures an FSM.
type Option func(*FSM)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(f *FSM) { f.log = l } }

// WithLeaseObserver mirrors every lease change into o.
func WithLeaseObserver(o LeaseObserver) Option { return func(f *FSM) { f.observer = o } }

// New returns an empty FSM.
func New(opts ...Option) *FSM {
	f := &FSM{log: slog.Default(), st: newState(), changed: make(chan struct{})}
	for _, o := range opts {
		o(f)
	}
	return f
}

var _ raft.BatchingFSM = (*FSM)(nil)

// Encode checks a command whole (Validate) and serializes it for
// raft.Apply. The server calls it once, on the leader, right after stamping
// the leader's time into the command, so nothing malformed reaches the log.
func Encode(cmd *adminv1.Command) ([]byte, error) {
	if err := Validate(cmd); err != nil {
		return nil, err
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("encode %s command: %w", CommandType(cmd), err)
	}
	return b, nil
}

// Decode parses a log entry's data.
func Decode(data []byte) (*adminv1.Command, error) {
	cmd := &adminv1.Command{}
	if err := proto.Unmarshal(data, cmd); err != nil {
		return nil, fmt.Errorf("%w: undecodable command: %v", ErrInvalid, err)
	}
	return cmd, nil
}

// CommandType names a command by its body field ("acquire_lease"), or
// "unknown"; for logs and metric labels, never for dispatch.
func CommandType(cmd *adminv1.Command) string {
	if cmd == nil {
		return "unknown"
	}
	if fd := cmd.ProtoReflect().WhichOneof(bodyOneof); fd != nil {
		return string(fd.Name())
	}
	return "unknown"
}

var bodyOneof = (&adminv1.Command{}).ProtoReflect().Descriptor().Oneofs().ByName("body")

// handler is one command type. validate looks only at the command; apply may
// additionally refuse on state, but only before it mutates anything.
type handler struct {
	validate func(cmd *adminv1.Command) error
	apply    func(tx *txn, cmd *adminv1.Command) (any, error)
}

// handlers is the dispatch table, keyed by the Go type of the Command's body
// (the oneof wrapper, e.g. *adminv1.Command_AcquireLease), so a key cannot be
// misspelt. TestEveryCommandHasAHandler fails when the proto gains a command
// this table lacks.
var handlers = map[reflect.Type]handler{
	reflect.TypeFor[*adminv1.Command_RegisterProxy]():    {validateRegisterProxy, applyRegisterProxy},
	reflect.TypeFor[*adminv1.Command_ProxyHeartbeat]():   {validateProxyHeartbeat, applyProxyHeartbeat},
	reflect.TypeFor[*adminv1.Command_MarkProxiesStale](): {validateMarkProxiesStale, applyMarkProxiesStale},
	reflect.TypeFor[*adminv1.Command_CreateNamespace]():  {validateCreateNamespace, applyCreateNamespace},
	reflect.TypeFor[*adminv1.Command_DeleteNamespace]():  {validateDeleteNamespace, applyDeleteNamespace},
	reflect.TypeFor[*adminv1.Command_AcquireLease]():     {validateAcquireLease, applyAcquireLease},
	reflect.TypeFor[*adminv1.Command_ReleaseLease]():     {validateReleaseLease, applyReleaseLease},
	reflect.TypeFor[*adminv1.Command_ExpireLeases]():     {validateExpireLeases, applyExpireLeases},
	reflect.TypeFor[*adminv1.Command_CheckpointLeases](): {validateCheckpointLeases, applyCheckpointLeases},
	reflect.TypeFor[*adminv1.Command_PutMembers]():       {validatePutMembers, applyPutMembers},
	reflect.TypeFor[*adminv1.Command_RemoveMember]():     {validateRemoveMember, applyRemoveMember},
	reflect.TypeFor[*adminv1.Command_OpenSession]():      {validateOpenSession, applyOpenSession},
	reflect.TypeFor[*adminv1.Command_CloseSession]():     {validateCloseSession, applyCloseSession},
	reflect.TypeFor[*adminv1.Command_AcquireLeases]():    {validateAcquireLeases, applyAcquireLeases},
	reflect.TypeFor[*adminv1.Command_ReleaseLeases]():    {validateReleaseLeases, applyReleaseLeases},
	reflect.TypeFor[*adminv1.Command_ExpireSessions]():   {validateExpireSessions, applyExpireSessions},
	reflect.TypeFor[*adminv1.Command_StartMove]():        {validateStartMove, applyStartMove},
	reflect.TypeFor[*adminv1.Command_SwitchMove]():       {validateSwitchMove, applySwitchMove},
	reflect.TypeFor[*adminv1.Command_EndHandoff]():       {validateEndHandoff, applyEndHandoff},
	reflect.TypeFor[*adminv1.Command_AbandonMove]():      {validateAbandonMove, applyAbandonMove},
	reflect.TypeFor[*adminv1.Command_Rebalance]():        {validateRebalance, applyRebalance},
	reflect.TypeFor[*adminv1.Command_CordonProxy]():      {validateCordonProxy, applyCordonProxy},
	reflect.TypeFor[*adminv1.Command_DrainProxy]():       {validateDrainProxy, applyDrainProxy},
}

// lookup finds cmd's handler. A body this version does not know (decoded as
// an unknown field, so Body is nil) or no body at all has none.
func lookup(cmd *adminv1.Command) (handler, error) {
	body := cmd.GetBody()
	if body == nil {
		return handler{}, ErrUnknownCommand
	}
	h, ok := handlers[reflect.TypeOf(body)]
	if !ok {
		return handler{}, fmt.Errorf("%w: %s", ErrUnknownCommand, CommandType(cmd))
	}
	return h, nil
}

// ValidateBody checks what a node can check before the leader stamps a
// command: a known body type with well-formed fields. A node that is not the
// leader runs it on each write request, so a malformed one is refused at once
// rather than forwarded or held until a leader appears.
func ValidateBody(cmd *adminv1.Command) error {
	h, err := lookup(cmd)
	if err != nil {
		return err
	}
	if err := h.validate(cmd); err != nil {
		return err
	}
	return admit(cmd)
}

// Validate checks a whole command as it may be proposed: a known type, the
// leader's timestamp, well-formed fields and the name rules for the names
// it introduces (admit), without looking at state.
func Validate(cmd *adminv1.Command) error {
	if _, err := check(cmd); err != nil {
		return err
	}
	return admit(cmd)
}

func check(cmd *adminv1.Command) (handler, error) {
	h, err := lookup(cmd)
	if err != nil {
		return handler{}, err
	}
	if cmd.GetNow() == nil {
		return handler{}, invalid("now", "missing leader timestamp")
	}
	if err := cmd.GetNow().CheckValid(); err != nil {
		return handler{}, invalid("now", "%v", err)
	}
	if err := checkOpenFailureExclusion(cmd); err != nil {
		return handler{}, err
	}
	if err := h.validate(cmd); err != nil {
		return handler{}, err
	}
	return h, nil
}

// Apply applies one committed log entry. It returns the command's response
// message (see the apply* functions) or an error; on error nothing changed.
func (f *FSM) Apply(l *raft.Log) any {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies entries under one lock and one change notification,
// which is what keeps acquire latency flat when Raft batches a burst.
func (f *FSM) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	var events []leaseEvent
	var moves []moveEvent
	var commits []Commit
	f.mu.Lock()
	changed := false
	for i, l := range logs {
		if l.Index > f.applied {
			f.applied = l.Index
		}
		if l.Type != raft.LogCommand {
			continue
		}
		tx := &txn{st: f.st, index: l.Index, term: l.Term, replaceScope: f.replaceScope}
		cmd, res, err := f.applyOne(tx, l.Data)
		if err != nil {
			out[i] = err
			continue
		}
		out[i] = res
		if f.commits != nil && (tx.changed || len(tx.events) > 0 || len(tx.moveEvents) > 0) {
			commits = append(commits, commitOf(tx, cmd, res))
		}
		changed = changed || tx.changed
		events = append(events, tx.events...)
		moves = append(moves, tx.moveEvents...)
	}
	if changed {
		close(f.changed)
		f.changed = make(chan struct{})
	}
	f.mu.Unlock()
	f.deliver(events)
	f.deliverMoves(moves)
	for _, c := range commits {
		f.commits.Committed(c)
	}
	return out
}

func (f *FSM) applyOne(tx *txn, data []byte) (*adminv1.Command, any, error) {
	cmd, err := Decode(data)
	if err != nil {
		return nil, nil, fmt.Errorf("apply at index %d: %w", tx.index, err)
	}
	// Encode checked this command before it was proposed, but a log entry
	// may hold bytes from anywhere (another version, a bug, a hand-made
	// log): apply refuses what Encode would have, the same way on every
	// replica, before anything is touched. Except admit's name rules: an
	// entry an older version committed must apply as it did there, or a
	// replica replaying it would diverge from one that applied it.
	h, err := check(cmd)
	if err != nil {
		return nil, nil, fmt.Errorf("apply %s at index %d: %w", CommandType(cmd), tx.index, err)
	}
	tx.now = cmd.GetNow().AsTime()
	res, err := h.apply(tx, cmd)
	if err != nil {
		if tx.changed {
			// A handler broke the check-then-mutate contract. Every replica
			// does the same, so they stay equal, but the state is suspect.
			f.log.Error("fsm handler failed after mutating state", "command", CommandType(cmd), "index", tx.index, "err", err)
		}
		return nil, nil, fmt.Errorf("apply %s at index %d: %w", CommandType(cmd), tx.index, err)
	}
	return cmd, res, nil
}

func (f *FSM) deliver(events []leaseEvent) {
	if f.observer == nil {
		return
	}
	so, _ := f.observer.(SessionObserver)
	for _, e := range events {
		switch {
		case e.granted != nil:
			f.observer.LeaseGranted(e.granted)
		case e.opened != nil:
			if so != nil {
				so.SessionOpened(e.opened)
			}
		case e.closed != 0:
			if so != nil {
				so.SessionClosed(e.closed)
			}
		default:
			f.observer.LeaseRemoved(e.mailboxID, e.epoch)
		}
	}
}

func (f *FSM) deliverMoves(events []moveEvent) {
	if f.moves == nil {
		return
	}
	for _, e := range events {
		if e.switched {
			f.moves.MoveSwitched(e.namespace, e.reason)
		} else {
			f.moves.MoveAbandoned(e.namespace, e.abandon)
		}
	}
}

// Changed returns the applied index and a channel that is closed by the next
// state change after it. Watchers read the state, then wait on the channel.
func (f *FSM) Changed() (uint64, <-chan struct{}) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.applied, f.changed
}

// AppliedIndex is the index of the last applied log entry.
func (f *FSM) AppliedIndex() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.applied
}

// leaseEvent is one change for the observer: a grant, a session opened or
// closed, else a lease removed.
type leaseEvent struct {
	granted   *adminv1.Lease
	opened    *adminv1.Session
	closed    uint64
	mailboxID string
	epoch     uint64
}

// txn is one command's view of the state while it applies.
type txn struct {
	st      *state
	index   uint64
	term    uint64 // raft term of the entry; with index, the epoch of a grant
	now     time.Time
	changed bool
	events  []leaseEvent
	// moveEvents are only delivered if the command applied: a handler
	// that fails has not mutated anything, so it has recorded none.
	moveEvents []moveEvent
	// replaceScope is FSM.replaceScope.
	replaceScope func(*state) []string
}

func (tx *txn) nowpb() *timestamppb.Timestamp { return timestamppb.New(tx.now) }
