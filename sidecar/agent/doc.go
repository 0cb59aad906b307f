// Package agent is the lease sidecar, the client side of
// docs/architecture.md#lease-semantics: next to one runner it registers the
// proxy, follows the proxy's assignments and, for each assigned mailbox, has
// the runner open it, acquires its lease and lets the runner serve only under
// that lease's epoch. docs/architecture.md#the-sidecar says how and why.
package agent
