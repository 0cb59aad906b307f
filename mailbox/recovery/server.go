// Package recovery is peer recovery (docs/architecture.md#peer-recovery): a new mailbox of a namespace is seeded
// by copying a live mailbox's store from the runner holding it, then consumes Kafka from the stored positions the
// copy carries, so a move keeps the history Kafka no longer holds.
//
// The source side (Server) serves prism.runner.v1.MailboxRecovery on the runner's query port: a consistent
// snapshot of the mailbox's keys (store.Snapshot, one read timestamp) in key order, in chunks of bounded size,
// each checked by CRC-32C, throttled runner-wide, ending with the stored positions read before the snapshot was
// taken (everything they cover is in it: ingest reports a position only once its write has returned) and the
// totals. A cut stream resumes on the same snapshot, held for a while after its stream ends; a snapshot no longer
// held is ABORTED, and the receiver starts over. Positions a little behind the snapshot are safe: the receiver's
// ingest reads the records between them again and the store drops them as duplicates by message id.
//
// The receiving side (Seed) writes the chunks into a store.Import, which commits its cursor with each chunk, so a
// copy cut by a crash of either side resumes after the last durable key, or starts over after dropping what it
// had, and never leaves a mailbox with holes.
package recovery

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/prism-mesh/prism/mailbox/store"
	"github.com/prism-mesh/prism/mesh/identity"
	runnerv1 "github.com/prism-mesh/prism/proto/prism/runner/v1"
)

// Defaults of ServerConfig.
const (
	DefaultRate         = 100 << 20 // bytes per second
	DefaultChunkBytes   = 1 << 20
	DefaultLinger       = time.Minute
	DefaultMaxSnapshots = 4
)

// MaxChunkBytes bounds ServerConfig.ChunkBytes, so a chunk (and the one entry that may exceed it) fits the
// receiver's message size limit (MaxMessageBytes).
const MaxChunkBytes = 4 << 20

// MaxMessageBytes is the largest FetchMailboxResponse a receiver takes: a chunk of MaxChunkBytes plus one entry as
// large as an envelope may be.
const MaxMessageBytes = 16 << 20

// Source is the runner as the server sees it.
type Source interface {
	// RecoveryAllowed is nil if the runner of proxy caller may copy mailbox id, or a status error:
	// PermissionDenied if AllowRecovery does not name caller for id, NotFound if the runner does not hold id under
	// a live lease.
	RecoveryAllowed(id, caller string) error
	// RecoverySnapshot is a snapshot of mailbox id with the stored positions it covers, or a status error
	// (Unavailable while the positions are not known yet).
	RecoverySnapshot(id string) (*store.Snapshot, []store.Position, error)
}

// ServerConfig configures a Server; Source is required.
type ServerConfig struct {
	Source Source
	// Rate bounds the bytes per second all copies send together (0: DefaultRate).
	Rate int64
	// ChunkBytes bounds a message's entries (0: DefaultChunkBytes; at most MaxChunkBytes): with the rate, it is
	// what a copy holds in memory.
	ChunkBytes int
	// Linger is how long a snapshot is held once no stream reads it, for a cut stream to resume (0: DefaultLinger).
	Linger time.Duration
	// MaxSnapshots bounds the snapshots held at once (0: DefaultMaxSnapshots); more are ResourceExhausted.
	MaxSnapshots int
	Clock        clock.Clock  // nil = clock.RealClock{}
	Logger       *slog.Logger // nil = slog.Default()
}

// Server implements runnerv1.MailboxRecoveryServer.
type Server struct {
	runnerv1.UnimplementedMailboxRecoveryServer
	cfg     ServerConfig
	limiter *rate.Limiter

	mu     sync.Mutex
	held   map[string]*held
	closed bool
}

// held is a snapshot kept for the copy of one mailbox to one caller.
type held struct {
	id, mailbox, caller string
	sn                  *store.Snapshot
	positions           []*runnerv1.StoredPosition
	streams             int           // reading it now
	linger              chan struct{} // closed to stop the wait that releases it after Linger; nil while read
	entries, bytes      int64         // sent, over all its streams
}

// NewServer makes a server holding no snapshot.
func NewServer(cfg ServerConfig) *Server {
	if cfg.Rate <= 0 {
		cfg.Rate = DefaultRate
	}
	if cfg.ChunkBytes <= 0 {
		cfg.ChunkBytes = DefaultChunkBytes
	}
	cfg.ChunkBytes = min(cfg.ChunkBytes, MaxChunkBytes)
	if cfg.Linger <= 0 {
		cfg.Linger = DefaultLinger
	}
	if cfg.MaxSnapshots <= 0 {
		cfg.MaxSnapshots = DefaultMaxSnapshots
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// A burst of one chunk: a copy sends a chunk once the bucket holds it.
	return &Server{cfg: cfg, limiter: rate.NewLimiter(rate.Limit(cfg.Rate), max(cfg.ChunkBytes, int(min(cfg.Rate, MaxChunkBytes)))), held: map[string]*held{}}
}

// Register adds MailboxRecovery to g.
func (s *Server) Register(g *grpc.Server) { runnerv1.RegisterMailboxRecoveryServer(g, s) }

// Close releases every snapshot held; streams in progress fail. It must be called before the runner's store
// closes.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, h := range s.held {
		s.releaseLocked(h)
	}
}

func (s *Server) releaseLocked(h *held) {
	if s.held[h.id] != h {
		return
	}
	delete(s.held, h.id)
	h.stopLinger()
	h.sn.Close()
}

// FetchMailbox implements MailboxRecovery: see the package doc and runner.v1.
func (s *Server) FetchMailbox(req *runnerv1.FetchMailboxRequest, stream grpc.ServerStreamingServer[runnerv1.FetchMailboxResponse]) error {
	ctx := stream.Context()
	caller, ok := identity.Caller(ctx)
	if !ok || caller.IsZero() {
		var err error
		if caller, err = identity.FromContext(ctx); err != nil {
			return status.Errorf(codes.Unauthenticated, "fetch %s: a proxy's client certificate is required: %v", req.GetMailboxId(), err)
		}
	}
	if caller.Role != identity.Proxy {
		return status.Errorf(codes.PermissionDenied, "fetch %s: %s is not a proxy", req.GetMailboxId(), caller)
	}
	log := s.cfg.Logger.With("mailbox_id", req.GetMailboxId(), "caller", caller.Name)
	h, err := s.hold(req, caller.Name)
	if err != nil {
		return err
	}
	defer s.unhold(h)
	cursor := req.GetCursor()
	if len(cursor) == 0 {
		cursor = nil
	}
	log.Info("recovery copy streaming", "snapshot_id", h.id, "resumed", cursor != nil, "events", h.sn.Events())
	for {
		entries, more, err := h.sn.Next(cursor, s.cfg.ChunkBytes)
		if err != nil {
			return status.Errorf(codes.Internal, "fetch %s: %v", req.GetMailboxId(), err)
		}
		msg := &runnerv1.FetchMailboxResponse{SnapshotId: h.id, Entries: make([]*runnerv1.RecoveryEntry, len(entries))}
		size := 0
		for i, e := range entries {
			msg.Entries[i] = &runnerv1.RecoveryEntry{Key: e.Key, Value: e.Value, Meta: uint32(e.Meta)}
			size += len(e.Key) + len(e.Value)
		}
		msg.Crc32C = ChunkChecksum(msg.GetEntries())
		if err := s.limiter.WaitN(ctx, min(size, s.limiter.Burst())); err != nil {
			return status.FromContextError(err).Err()
		}
		s.mu.Lock()
		h.entries += int64(len(entries))
		h.bytes += int64(size)
		if !more {
			msg.Done = &runnerv1.RecoveryDone{StoredPositions: h.positions, Entries: h.entries, Bytes: h.bytes, Events: h.sn.Events()}
		}
		s.mu.Unlock()
		if err := stream.Send(msg); err != nil {
			return err
		}
		if !more {
			log.Info("recovery copy sent", "snapshot_id", h.id, "entries", msg.Done.GetEntries(), "bytes", msg.Done.GetBytes())
			return nil
		}
		if len(entries) > 0 {
			cursor = entries[len(entries)-1].Key
		}
	}
}

// hold finds the snapshot a resume names, or takes a new one; it is held until unhold.
func (s *Server) hold(req *runnerv1.FetchMailboxRequest, caller string) (*held, error) {
	id := req.GetMailboxId()
	// Authorized first, on every call (a resume too): the placement may have changed since.
	if err := s.cfg.Source.RecoveryAllowed(id, caller); err != nil {
		return nil, err
	}
	if want := req.GetSnapshotId(); want != "" {
		s.mu.Lock()
		defer s.mu.Unlock()
		h, ok := s.held[want]
		if !ok || h.mailbox != id || h.caller != caller {
			return nil, status.Errorf(codes.Aborted, "fetch %s: snapshot %q is no longer held here; start over", id, want)
		}
		h.streams++
		h.stopLinger()
		return h, nil
	}
	s.mu.Lock()
	// A copy started over lets go of its earlier snapshot at once.
	for _, h := range s.held {
		if h.mailbox == id && h.caller == caller && h.streams == 0 {
			s.releaseLocked(h)
		}
	}
	n := len(s.held)
	s.mu.Unlock()
	if n >= s.cfg.MaxSnapshots {
		return nil, status.Errorf(codes.ResourceExhausted, "fetch %s: %d copies in progress, the most this runner serves at once", id, n)
	}
	sn, positions, err := s.cfg.Source.RecoverySnapshot(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.held) >= s.cfg.MaxSnapshots {
		sn.Close()
		return nil, status.Errorf(codes.Unavailable, "fetch %s: the runner is stopping or serves the most copies it may at once; retry", id)
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := &held{id: hex.EncodeToString(b[:]), mailbox: id, caller: caller, sn: sn, streams: 1}
	for _, p := range positions {
		h.positions = append(h.positions, &runnerv1.StoredPosition{Topic: p.Topic, Partition: p.Partition, NextOffset: p.Next})
	}
	s.held[h.id] = h
	return h, nil
}

// unhold ends a stream's use of h; once no stream reads it, it is released after Linger.
func (s *Server) unhold(h *held) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.streams--; h.streams > 0 || s.held[h.id] != h {
		return
	}
	stop := make(chan struct{})
	h.linger = stop
	t := s.cfg.Clock.NewTimer(s.cfg.Linger)
	go func() {
		defer t.Stop()
		select {
		case <-stop:
		case <-t.C():
			s.mu.Lock()
			defer s.mu.Unlock()
			if h.linger == stop {
				s.releaseLocked(h)
			}
		}
	}()
}

// stopLinger stops h's release after Linger, if one is waiting; the server's mu is held.
func (h *held) stopLinger() {
	if h.linger != nil {
		close(h.linger)
		h.linger = nil
	}
}

// Held is how many snapshots the server holds.
func (s *Server) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ChunkChecksum is the CRC-32C of a chunk's entries: for each, its key's length (uvarint), key, meta byte, value's
// length (uvarint) and value.
func ChunkChecksum(entries []*runnerv1.RecoveryEntry) uint32 {
	var crc uint32
	var n [binary.MaxVarintLen64 + 1]byte
	for _, e := range entries {
		b := binary.AppendUvarint(n[:0], uint64(len(e.GetKey())))
		crc = crc32.Update(crc, castagnoli, b)
		crc = crc32.Update(crc, castagnoli, e.GetKey())
		b = append(n[:0], byte(e.GetMeta()))
		b = binary.AppendUvarint(b, uint64(len(e.GetValue())))
		crc = crc32.Update(crc, castagnoli, b)
		crc = crc32.Update(crc, castagnoli, e.GetValue())
	}
	return crc
}
