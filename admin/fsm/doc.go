// Package fsm is the admin cluster's replicated state machine: proxies,
// namespaces with their placement, and mailbox leases, behind hashicorp/raft's
// FSM interface.
//
// Everything that decides who may serve a mailbox happens here, in Raft log
// order, which is what makes lease acquisition linearizable: two acquires for
// one mailbox are two log entries, and the second one sees the first one's
// grant. For that to hold on every replica the package is strictly
// deterministic: Apply never reads a clock (the leader stamps Command.now),
// never depends on map iteration order (every output and every multi-row
// update goes through sorted keys), and a lease's epoch is the Raft term and
// index of its grant (epoch.go), so it is unique and only grows without any
// counter to replicate, even across a node that lost its log's tail.
//
// Commands are dispatched through a table keyed by the Go type of the
// Command body's oneof (Consul's typed dispatch); a test walks the oneof so
// no command goes without a handler. A command with no handler, including one
// written by a newer version that this one decodes as an unknown field, is an
// error. Handlers check everything that can fail before they touch state, so
// an error never leaves a command half-applied.
//
// A client's command is checked on its way to the log in two places, each for
// its own reason: a node that is not the leader checks the body
// (ValidateBody) so it refuses a malformed request without forwarding it, and
// the leader stamps its clock into Command.now and checks the whole command
// once in Encode, right before proposing. The leader's stamp is the only one:
// its lessor's clock governs expiry, so grants and renewals must be timed by
// it. Apply checks again, not as a step of the request path but because a log
// entry may hold bytes from anywhere.
//
// Liveness of leases is not evaluated here: a lease in the table is live until
// a release or an expire command removes it. Only the leader knows when a
// lease is due (package lease keeps renewals leader-local), and it says so by
// committing an expire that names the lease's epoch; an expire that lost a
// race with a re-acquire names an old epoch and is ignored.
//
// Readers (gRPC servers, WatchAssignments, the xDS translator) use the
// accessors, which return copies, and Changed, which hands out a channel
// closed by the next state change: level-triggered, so a slow reader simply
// reads the newest state and never needs a backlog of events.
package fsm
