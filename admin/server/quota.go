package server

import (
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/mesh"
)

// Quotas bound how many proxies, namespaces and leases the cluster holds,
// so no caller can grow the replicated state (and every runner's memory)
// without limit. A call that would add one more past its bound is refused
// ResourceExhausted; renewals, re-registrations and re-creations of what
// exists are not. Each node checks its own state, so concurrent additions
// may pass a bound by their number.
type Quotas struct {
	Proxies, Namespaces, Leases int
	// LeasesPerProxy bounds one proxy's leases, so one sidecar cannot take
	// the whole Leases quota from the others.
	LeasesPerProxy int
	// SessionsPerProxy bounds one proxy's open sessions: a sidecar needs
	// one, plus its predecessor's while that runs out after a restart, so a
	// loop of OpenSession stops here rather than filling the table.
	SessionsPerProxy int
}

// DefaultQuotas are far above what one cluster is sized for (the
// benchmarks run 10k leases) and low enough to stop a runaway client.
var DefaultQuotas = Quotas{Proxies: 5_000, Namespaces: 50_000, Leases: 200_000, LeasesPerProxy: 10_000, SessionsPerProxy: 4}

func (q Quotas) withDefaults() Quotas {
	if q.Proxies == 0 {
		q.Proxies = DefaultQuotas.Proxies
	}
	if q.Namespaces == 0 {
		q.Namespaces = DefaultQuotas.Namespaces
	}
	if q.Leases == 0 {
		q.Leases = DefaultQuotas.Leases
	}
	if q.LeasesPerProxy == 0 {
		q.LeasesPerProxy = DefaultQuotas.LeasesPerProxy
	}
	if q.SessionsPerProxy == 0 {
		q.SessionsPerProxy = DefaultQuotas.SessionsPerProxy
	}
	return q
}

func overQuota(what string, have, limit int) error {
	if have < limit {
		return nil
	}
	return quotaExceeded(what, "%s: the cluster holds %d, its quota (prism admin --max-%s)", what, have, what)
}

// quotaExceeded is a quota's refusal: RESOURCE_EXHAUSTED with a
// google.rpc.QuotaFailure naming the quota, which tells a client that this
// is the cluster's answer and not one node's trouble (admin/client does not
// retry it on another node: they all hold the same state).
func quotaExceeded(subject, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	st, err := status.New(codes.ResourceExhausted, msg).WithDetails(&errdetails.QuotaFailure{
		Violations: []*errdetails.QuotaFailure_Violation{{Subject: subject, Description: msg}},
	})
	if err != nil {
		return status.Error(codes.ResourceExhausted, msg)
	}
	return st.Err()
}

// admitProxy refuses registering a new proxy past the quota.
func (s *Server) admitProxy(id string) error {
	if s.fsm.HasProxy(id) {
		return nil
	}
	return overQuota("proxies", s.fsm.Counts().Proxies, s.cfg.Quotas.Proxies)
}

// admitNamespace refuses creating a new namespace past the quota.
func (s *Server) admitNamespace(name string) error {
	if ns, _, _ := s.fsm.Namespace(name); ns != nil {
		return nil
	}
	return overQuota("namespaces", s.fsm.Counts().Namespaces, s.cfg.Quotas.Namespaces)
}

// admitLease refuses a lease on a mailbox that has none past the cluster's
// quota or its proxy's. A mailbox that has a lease is never refused: a
// renewal or re-grant does not add one.
func (s *Server) admitLease(mailboxID string) error {
	if l, _ := s.fsm.Lease(mailboxID); l != nil {
		return nil
	}
	if err := overQuota("leases", s.fsm.Counts().Leases, s.cfg.Quotas.Leases); err != nil {
		return err
	}
	// A malformed id is the write's to refuse (InvalidArgument), not the quota's.
	if id, err := mesh.ParseMailboxID(mailboxID); err == nil {
		if have := s.fsm.ProxyLeases(id.Proxy); have >= s.cfg.Quotas.LeasesPerProxy {
			return quotaExceeded("leases-per-proxy", "leases of proxy %s: it holds %d, its quota (prism admin --max-leases-per-proxy)", id.Proxy, have)
		}
	}
	return nil
}

// admitSession refuses a proxy's session past its quota.
func (s *Server) admitSession(proxyID string) error {
	if have := s.fsm.ProxySessions(proxyID); have >= s.cfg.Quotas.SessionsPerProxy {
		return quotaExceeded("sessions-per-proxy", "sessions of proxy %s: it has %d open, its quota; close one or let it expire", proxyID, have)
	}
	return nil
}

// admitLeases refuses a bulk grant whose new leases (mailboxes without one
// now) would take the cluster or the proxy past its lease quota; re-grants
// count for nothing, as in admitLease.
func (s *Server) admitLeases(proxyID string, mailboxIDs []string) error {
	fresh := 0
	for _, m := range mailboxIDs {
		if l, _ := s.fsm.Lease(m); l == nil {
			fresh++
		}
	}
	if fresh == 0 {
		return nil
	}
	if have := s.fsm.Counts().Leases; have+fresh > s.cfg.Quotas.Leases {
		return quotaExceeded("leases", "leases: the cluster holds %d, %d more would pass its quota %d (prism admin --max-leases)", have, fresh, s.cfg.Quotas.Leases)
	}
	if have := s.fsm.ProxyLeases(proxyID); have+fresh > s.cfg.Quotas.LeasesPerProxy {
		return quotaExceeded("leases-per-proxy", "leases of proxy %s: it holds %d, %d more would pass its quota %d (prism admin --max-leases-per-proxy)", proxyID, have, fresh, s.cfg.Quotas.LeasesPerProxy)
	}
	return nil
}
