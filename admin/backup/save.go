package backup

import (
	"context"
	"errors"
	"fmt"
	"io"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
)

// Save calls Admin.SaveSnapshot and writes the stream to path atomically
// (WriteFile): a refusal, a broken stream or bytes that do not match the
// leader's checksum leave no file.
func Save(ctx context.Context, c adminv1.AdminClient, path string) (*adminv1.SnapshotInfo, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.SaveSnapshot(ctx, &adminv1.SaveSnapshotRequest{})
	if err != nil {
		return nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	info := first.GetInfo()
	if info == nil {
		return nil, errors.New("save snapshot: the stream does not start with the snapshot's info")
	}
	if err := WriteFile(path, info, &chunkReader{stream: stream}); err != nil {
		return nil, err
	}
	return info, nil
}

// chunkReader reads the chunks that follow the info.
type chunkReader struct {
	stream adminv1.Admin_SaveSnapshotClient
	buf    []byte
}

func (r *chunkReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		m, err := r.stream.Recv()
		if err != nil {
			return 0, err
		}
		if m.GetInfo() != nil {
			return 0, fmt.Errorf("save snapshot: a second info in the stream")
		}
		r.buf = m.GetChunk()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

var _ io.Reader = (*chunkReader)(nil)
