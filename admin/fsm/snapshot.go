package fsm

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"github.com/hashicorp/raft"
	"github.com/prism-mesh/prism/admin/placement"
	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"
)

// snapshotFormat is SnapshotHeader.format for the layout written here.
const snapshotFormat = 1

// maxRecordSize bounds one snapshot record on restore so a corrupt length
// cannot make us allocate gigabytes.
const maxRecordSize = 16 << 20

// Snapshot captures the tables by copying their maps; rows are immutable,
// so Apply can continue while Persist writes.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return &snapshot{st: f.st.clone(), applied: f.applied}, nil
}

type snapshot struct {
	st      *state
	applied uint64
}

// Persist writes the header and every row, sorted, deterministically.
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if err := s.write(sink); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persist fsm snapshot at index %d: %w", s.applied, err)
	}
	return sink.Close()
}

func (s *snapshot) write(w io.Writer) error {
	bw := bufio.NewWriter(w)
	opts := protodelim.MarshalOptions{MarshalOptions: proto.MarshalOptions{Deterministic: true}}
	hdr := &adminv1.SnapshotHeader{
		Format:         snapshotFormat,
		AppliedIndex:   s.applied,
		RoutesIndex:    s.st.routesIndex,
		ProxyCount:     uint64(len(s.st.proxies)),
		NamespaceCount: uint64(len(s.st.namespaces)),
		LeaseCount:     uint64(len(s.st.leases)),
		MemberCount:    uint64(len(s.st.members)),
		SessionCount:   uint64(len(s.st.sessions)),
		EpochHighWater: s.st.epochHighWater,

		ProxyRoutesIndex: s.st.proxyRoutesIndex,
	}
	if _, err := opts.MarshalTo(bw, hdr); err != nil {
		return err
	}
	var recs []*adminv1.SnapshotRecord
	for _, p := range sortedValues(s.st.proxies) {
		recs = append(recs, &adminv1.SnapshotRecord{Record: &adminv1.SnapshotRecord_Proxy{Proxy: p}})
	}
	for _, n := range sortedValues(s.st.namespaces) {
		recs = append(recs, &adminv1.SnapshotRecord{Record: &adminv1.SnapshotRecord_Namespace{Namespace: n}})
	}
	for _, l := range sortedValues(s.st.leases) {
		recs = append(recs, &adminv1.SnapshotRecord{Record: &adminv1.SnapshotRecord_Lease{Lease: l}})
	}
	for _, m := range sortedValues(s.st.members) {
		recs = append(recs, &adminv1.SnapshotRecord{Record: &adminv1.SnapshotRecord_Member{Member: m}})
	}
	for _, ss := range sortedSessions(s.st.sessions) {
		recs = append(recs, &adminv1.SnapshotRecord{Record: &adminv1.SnapshotRecord_Session{Session: ss}})
	}
	for _, r := range recs {
		if _, err := opts.MarshalTo(bw, r); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func (s *snapshot) Release() {}

// Restore replaces the state with a snapshot. It builds the new state
// completely first and swaps it in only if the whole snapshot was read, so a
// truncated or corrupt snapshot leaves the FSM as it was.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	st, applied, err := readSnapshot(bufio.NewReader(rc))
	if err != nil {
		return fmt.Errorf("restore fsm snapshot: %w", err)
	}
	f.warnNames(st)
	f.mu.Lock()
	f.st = st
	f.applied = applied
	close(f.changed)
	f.changed = make(chan struct{})
	leases := sortedValues(st.leases)
	sessions := sortedSessions(st.sessions)
	f.mu.Unlock()
	if f.observer != nil {
		if so, ok := f.observer.(SessionObserver); ok {
			so.SessionsRestored(sessions)
		}
		f.observer.LeasesRestored(leases)
	}
	return nil
}

// warnNames logs each namespace and proxy of a restored state whose name an
// older version admitted but the name rules (admit) refuse. They are kept
// and work as they did (placed, leased, served, deletable by name), so a
// snapshot never fails on them; but no component that carries only
// mesh.NameRule's characters can route to them, and they cannot be created
// or registered again: the way out is a new namespace under a valid name.
func (f *FSM) warnNames(st *state) {
	for _, ns := range sortedKeys(st.namespaces) {
		if !mesh.ValidNamespace(ns) {
			f.log.Warn("namespace breaks the name rule: kept, but routing may not reach it; recreate it under a valid name and delete it",
				"namespace", mesh.Echo(ns), "rule", mesh.NamespaceRule)
		}
	}
	for _, id := range sortedKeys(st.proxies) {
		if !mesh.ValidName(id) {
			f.log.Warn("proxy id breaks the name rule: kept, but xDS routes nothing to it and it cannot register again",
				"proxy", mesh.Echo(id), "rule", mesh.NameRule)
		}
	}
}

func readSnapshot(r *bufio.Reader) (*state, uint64, error) {
	opts := protodelim.UnmarshalOptions{MaxSize: maxRecordSize}
	hdr := &adminv1.SnapshotHeader{}
	if err := opts.UnmarshalFrom(r, hdr); err != nil {
		return nil, 0, fmt.Errorf("header: %w", err)
	}
	if hdr.GetFormat() != snapshotFormat {
		return nil, 0, fmt.Errorf("unknown snapshot format %d", hdr.GetFormat())
	}
	st := newState()
	st.routesIndex = hdr.GetRoutesIndex()
	st.epochHighWater = hdr.GetEpochHighWater()
	st.proxyRoutesIndex = hdr.GetProxyRoutesIndex()
	for {
		rec := &adminv1.SnapshotRecord{}
		err := opts.UnmarshalFrom(r, rec)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, 0, fmt.Errorf("record %d: %w", len(st.proxies)+len(st.namespaces)+len(st.leases)+len(st.members)+len(st.sessions), err)
		}
		switch x := rec.GetRecord().(type) {
		case *adminv1.SnapshotRecord_Proxy:
			st.proxies[x.Proxy.GetRegistration().GetProxyId()] = x.Proxy
		case *adminv1.SnapshotRecord_Namespace:
			st.namespaces[x.Namespace.GetName()] = x.Namespace
		case *adminv1.SnapshotRecord_Lease:
			st.leases[x.Lease.GetMailboxId()] = x.Lease
		case *adminv1.SnapshotRecord_Member:
			st.members[x.Member.GetId()] = x.Member
		case *adminv1.SnapshotRecord_Session:
			st.sessions[x.Session.GetId()] = x.Session
		default:
			return nil, 0, fmt.Errorf("record of unknown kind")
		}
	}
	if uint64(len(st.proxies)) != hdr.GetProxyCount() || uint64(len(st.namespaces)) != hdr.GetNamespaceCount() ||
		uint64(len(st.leases)) != hdr.GetLeaseCount() || uint64(len(st.members)) != hdr.GetMemberCount() ||
		uint64(len(st.sessions)) != hdr.GetSessionCount() {
		return nil, 0, fmt.Errorf("truncated: header promises %d proxies, %d namespaces, %d leases, %d members, %d sessions; read %d, %d, %d, %d, %d",
			hdr.GetProxyCount(), hdr.GetNamespaceCount(), hdr.GetLeaseCount(), hdr.GetMemberCount(), hdr.GetSessionCount(),
			len(st.proxies), len(st.namespaces), len(st.leases), len(st.members), len(st.sessions))
	}
	st.table = placement.Compute(st.placeableProxyIDs())
	st.proxyLeases = countLeases(st.leases)
	st.sessionLeases = countSessionLeases(st.leases)
	st.namespaceLeases = countNamespaceLeases(st.leases)
	st.reindexNamespaces()
	if st.proxyRoutesIndex == 0 && len(st.proxies) > 0 {
		// A snapshot from before the field: the last proxy change is at or
		// before the snapshot, and claiming it is at the snapshot costs
		// watchers one rebuild, where claiming nothing changed would hide
		// the proxies.
		st.proxyRoutesIndex = hdr.GetAppliedIndex()
	}
	return st, hdr.GetAppliedIndex(), nil
}
