package backup

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/admin/fsm"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// Node is the raft member a snapshot is taken on (raftnode.Node).
type Node interface {
	ID() string
	Term() uint64
}

// Capture takes a snapshot of f, as raft would persist it, and describes it.
// The term is read after the FSM is copied, so it is at least the term of
// every entry the copy holds and so of every epoch granted in it.
func Capture(f *fsm.FSM, node Node, now time.Time) (*adminv1.SnapshotInfo, []byte, error) {
	snap, err := f.Snapshot()
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot fsm: %w", err)
	}
	defer snap.Release()
	term := node.Term()
	sink := &bufferSink{}
	if err := snap.Persist(sink); err != nil {
		return nil, nil, err
	}
	info, err := describe(sink.Bytes())
	if err != nil {
		return nil, nil, err
	}
	info.Term = term
	info.NodeId = node.ID()
	info.SavedAt = timestamppb.New(now)
	return info, sink.Bytes(), nil
}

// describe fills a SnapshotInfo from an FSM snapshot's own header.
func describe(data []byte) (*adminv1.SnapshotInfo, error) {
	hdr := &adminv1.SnapshotHeader{}
	if err := protodelim.UnmarshalFrom(bytes.NewReader(data), hdr); err != nil {
		return nil, fmt.Errorf("read fsm snapshot header: %w", err)
	}
	sum := sha256.Sum256(data)
	return &adminv1.SnapshotInfo{
		FsmFormat:      hdr.GetFormat(),
		Index:          hdr.GetAppliedIndex(),
		Size:           uint64(len(data)),
		Sha256:         sum[:],
		NamespaceCount: hdr.GetNamespaceCount(),
		ProxyCount:     hdr.GetProxyCount(),
		LeaseCount:     hdr.GetLeaseCount(),
		SessionCount:   hdr.GetSessionCount(),
	}, nil
}

// bufferSink is a raft.SnapshotSink in memory.
type bufferSink struct {
	bytes.Buffer
}

var _ raft.SnapshotSink = (*bufferSink)(nil)

func (*bufferSink) ID() string    { return "backup" }
func (*bufferSink) Cancel() error { return nil }
func (*bufferSink) Close() error  { return nil }
