package server

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-mesh/prism/internal/diskfree"
)

// essentialWrites are the writes a node short of disk space still proposes,
// and that the leader never sheds for load (admission.go). Refusing a
// proxy's heartbeat would have the leader mark a live proxy stale and move
// its namespaces; refusing a release or a session's close would hold a
// lease its runner gave back until it expires; refusing a proxy's own drain
// would have its pod stop with its namespaces still on it, so they move
// break-before-make. Each is small and bounded by
// what already exists, as are the leader's own commands (expiry,
// checkpoints, stale marks, member addresses), which never pass through
// write; the watermark's margin is there for them. Every write that adds
// state, and the operators' writes, are refused.
var essentialWrites = map[string]bool{
	"ProxyHeartbeat": true,
	"ReleaseLease":   true,
	"ReleaseLeases":  true,
	"CloseSession":   true,
	"DrainProxy":     true,
}

// admitWrite refuses method, RESOURCE_EXHAUSTED, while this node's data dir
// (raft-wal and snapshots) is below its free-space watermark: before the
// Raft log fails an append for want of space, which makes a leader step
// down and a follower fall behind. A follower checks its own disk before it
// forwards, and the leader its own when the call reaches it. Reads and lease
// renewals (the lessor's memory, not Raft) never come here.
func (s *Server) admitWrite(method string) error {
	if essentialWrites[method] {
		return nil
	}
	if err := s.cfg.Disk.Err(); err != nil {
		return status.Errorf(codes.ResourceExhausted, "%s refused: %v; writes resume once free space is back above the watermark", method, err)
	}
	return nil
}

// noticeFull tells the guard of a Raft append that failed for want of space
// despite the watermark, so writes are refused until space returns.
func (s *Server) noticeFull(err error) {
	if diskfree.IsNoSpace(err) {
		s.cfg.Disk.Full(err)
	}
}
