package raftnode

import (
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/hashicorp/raft"
)

func TestCheckLogLoss(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                   string
		mark, lastLog, snapIdx uint64
		accept                 bool
		wantErr                error
		wantMark               uint64
	}{
		{name: "new node", wantMark: 0},
		{name: "log reaches the mark", mark: 10, lastLog: 10, wantMark: 10},
		{name: "log past the mark", mark: 10, lastLog: 14, wantMark: 10},
		{name: "snapshot covers the mark", mark: 10, lastLog: 0, snapIdx: 12, wantMark: 10},
		{name: "log cut before the mark", mark: 10, lastLog: 7, wantErr: ErrLogLoss},
		{name: "log and snapshot short of the mark", mark: 10, lastLog: 5, snapIdx: 6, wantErr: ErrLogLoss},
		{name: "operator accepts the loss", mark: 10, lastLog: 7, accept: true, wantMark: 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := raft.NewInmemStore()
			if tc.mark > 0 {
				if err := store.SetUint64(keyAckedIndex, tc.mark); err != nil {
					t.Fatal(err)
				}
			}
			for i := uint64(1); i <= tc.lastLog; i++ {
				if err := store.StoreLog(&raft.Log{Index: i, Term: 1, Type: raft.LogNoop}); err != nil {
					t.Fatal(err)
				}
			}
			snaps := raft.NewInmemSnapshotStore()
			if tc.snapIdx > 0 {
				sink, err := snaps.Create(raft.SnapshotVersionMax, tc.snapIdx, 1, raft.Configuration{}, 1, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := sink.Close(); err != nil {
					t.Fatal(err)
				}
			}
			got, err := checkLogLoss(store, store, snaps, tc.accept, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if !errors.Is(err, tc.wantErr) || (err == nil && got != tc.wantMark) {
				t.Fatalf("checkLogLoss = %d, %v; want %d, %v", got, err, tc.wantMark, tc.wantErr)
			}
			if stored, _ := store.GetUint64(keyAckedIndex); err == nil && stored != tc.wantMark {
				t.Fatalf("stored mark = %d, want %d", stored, tc.wantMark)
			}
		})
	}
}
