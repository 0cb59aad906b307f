package store

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
)

// Key layout. One Badger database (DB, db.go) holds every mailbox of a runner: each mailbox's keys start with its
// number, box (boxLen bytes, big endian), allocated from a counter when the mailbox is first opened and never
// reused, so the leftover keys of a dropped mailbox can never be read as another's. Number 0 is the database's
// own (db.go: layout version, counter, catalog of mailbox ids, drops in progress). Below, every key of a mailbox
// is box followed by what is shown.
//
// Every item has a 16-byte position pos = invTs(8) | invSeq(8), big endian, where invTs is the
// item's timestamp with the sign bit flipped and then all bits inverted, and invSeq is the inverted store-wide
// write sequence. Byte order of pos is therefore newest first, and among equal timestamps the later write
// first, so every "newest first" read is a plain forward iteration and a cursor is just the last pos returned.
//
//	'e' pos                        -> record (record.go): the item's headers and its envelope blob in one value, so
//	                                  a result needs one read. Records are over the value threshold and live in
//	                                  the value log, which keeps the LSM tree keys-only and small (cheap
//	                                  compactions; key-only index walks stay in the block cache).
//	'm' message_id                 -> pos: dedup on write (one point lookup, mostly answered by bloom filters)
//	                                  and Get by message id.
//	'p' kind uvarint(len) value F  -> the positions of one write group's items with that indexed header (a
//	                                  posting block, posting.go), F the first (newest) of them. kind is one of
//	                                  topic, principal, correlation id, trace id. A batch repeats a topic tens of
//	                                  times and a trace id about ten, so one block per (kind, value) and group
//	                                  instead of an entry per item and index saves most of the writes. A query
//	                                  seeks to 'p' kind len value (its start, less meta.span) and merges the
//	                                  blocks in order (blockCursor), so it reads only matching positions and
//	                                  never earlier pages.
//	'!' "meta"                     -> the layout version, counters (events, envelope bytes, last sequence), the
//	                                  retention floor and the widest block span, rewritten in the same
//	                                  transaction as every write and retention pass so Stats never scans and
//	                                  never drifts.
//	'!' "dict"                     -> the compression dictionary (record.go).
//
// Every iterator is bounded by a prefix that starts with box, so no read of one mailbox ever walks another's keys.
// The time index is the primary order itself. Retention deletes by raising the floor (retention.go): every read
// bounds its walk at the floor, which costs nothing since all orders end in the position, and a sweep removes
// the keys below it later.
const (
	prefixItem    = 'e'
	prefixMsgID   = 'm'
	prefixPosting = 'p'

	posLen = 16
)

// boxLen is the length of a mailbox's number, the first bytes of all its keys.
const boxLen = 4

// box is a mailbox's number as its keys start with it.
type box [boxLen]byte

func boxOf(n uint32) box {
	var b box
	binary.BigEndian.PutUint32(b[:], n)
	return b
}

func (b box) num() uint32 { return binary.BigEndian.Uint32(b[:]) }

// key is b followed by rest.
func (b box) key(rest ...byte) []byte {
	k := make([]byte, 0, boxLen+len(rest))
	return append(append(k, b[:]...), rest...)
}

func (b box) metaKey() []byte { return b.key([]byte("!meta")...) }

func (b box) dictKey() []byte { return b.key([]byte("!dict")...) }

// itemPrefix is the prefix of every primary key.
func (b box) itemPrefix() []byte { return b.key(prefixItem) }

// posOfItem is the position of primary key k.
func posOfItem(k []byte) pos {
	var p pos
	copy(p[:], k[boxLen+1:])
	return p
}

// oldestFrom is where a reverse iteration of the primary order seeks to start at the oldest item not older
// than ts: the largest position an item at ts can have, or past every primary key.
func (b box) oldestFrom(ts int64) []byte {
	if ts == math.MinInt64 {
		return b.key(append([]byte{prefixItem}, bytes.Repeat([]byte{0xff}, posLen+1)...)...)
	}
	return b.itemKey(makePos(ts, 0))
}

// Index kinds; the byte values are part of the on-disk format.
const (
	kindTopic       byte = 't'
	kindPrincipal   byte = 'p'
	kindCorrelation byte = 'c'
	kindTrace       byte = 'r'
)

type pos [posLen]byte

const signBit = uint64(1) << 63

func invTs(ts int64) uint64 { return ^(uint64(ts) ^ signBit) }

func tsFromInv(v uint64) int64 { return int64(^v ^ signBit) }

func makePos(ts int64, seq uint64) pos {
	var p pos
	binary.BigEndian.PutUint64(p[:8], invTs(ts))
	binary.BigEndian.PutUint64(p[8:], ^seq)
	return p
}

func (p pos) ts() int64 { return tsFromInv(binary.BigEndian.Uint64(p[:8])) }

// next returns the smallest position after p, and false if p is the last possible one.
func (p pos) next() (pos, bool) {
	for i := posLen - 1; i >= 0; i-- {
		p[i]++
		if p[i] != 0 {
			return p, true
		}
	}
	return p, false
}

func (b box) itemKey(p pos) []byte { return b.key(append([]byte{prefixItem}, p[:]...)...) }

func msgIDKey[T string | []byte](b box, id T) []byte {
	k := make([]byte, 0, boxLen+1+len(id))
	k = append(append(k, b[:]...), prefixMsgID)
	return append(k, id...)
}

// indexPrefix is the prefix of every posting block of (kind, value) in mailbox b.
func indexPrefix[T string | []byte](b box, kind byte, value T) []byte {
	return appendIndexPrefix(make([]byte, 0, boxLen+2+binary.MaxVarintLen64+len(value)+posLen), b, kind, value)
}

func appendIndexPrefix[T string | []byte](dst []byte, b box, kind byte, value T) []byte {
	dst = append(dst, b[:]...)
	dst = append(dst, prefixPosting, kind)
	dst = binary.AppendUvarint(dst, uint64(len(value)))
	return append(dst, value...)
}

// arenaIndexPrefix is indexPrefix carved out of a (nil: allocated on its own).
func arenaIndexPrefix[T string | []byte](a *arena, b box, kind byte, value T) []byte {
	n := boxLen + 2 + (bits.Len64(uint64(len(value))|1)+6)/7 + len(value) // the length's uvarint takes 7 bits a byte
	return appendIndexPrefix(a.alloc(n)[:0], b, kind, value)
}

// itemKeys returns an item's own keys in mailbox b, carved out of one slice of a (nil: allocated on its own): its
// primary key and its message-id key.
func itemKeys[T string | []byte](a *arena, b box, p pos, msgID T) [2][]byte {
	const primary = boxLen + 1 + posLen
	buf := a.alloc(primary + boxLen + 1 + len(msgID))[:0]
	buf = append(buf, b[:]...)
	buf = append(buf, prefixItem)
	buf = append(buf, p[:]...)
	buf = append(buf, b[:]...)
	buf = append(buf, prefixMsgID)
	buf = append(buf, msgID...)
	return [2][]byte{buf[:primary:primary], buf[primary:]}
}

// indexPrefixes appends to dst the posting-list prefixes in mailbox b an item belongs to, carved out of a (nil:
// allocated each on its own). Topic and principal are indexed even when empty so a filter for the empty value is
// still an index lookup; correlation and trace ids only when set, since an empty filter value means "no filter"
// for them.
func indexPrefixes[T string | []byte](dst [][]byte, a *arena, b box, topic, principal, corr, trace T) [][]byte {
	dst = append(dst, arenaIndexPrefix(a, b, kindTopic, topic), arenaIndexPrefix(a, b, kindPrincipal, principal))
	if len(corr) > 0 {
		dst = append(dst, arenaIndexPrefix(a, b, kindCorrelation, corr))
	}
	if len(trace) > 0 {
		dst = append(dst, arenaIndexPrefix(a, b, kindTrace, trace))
	}
	return dst
}

// arena hands out byte slices carved from blocks of arenaBlock bytes, so that a write batch's records and keys
// take an allocation per block instead of several per item. A block stays in memory as long as any slice of it
// is referenced: an arena serves what lives and dies together (a batch, until its Write returns).
type arena struct{ free []byte }

const arenaBlock = 64 << 10

// alloc returns n bytes; a nil arena allocates them on their own.
func (a *arena) alloc(n int) []byte {
	if a == nil || n > arenaBlock/8 {
		return make([]byte, n)
	}
	if n > cap(a.free) {
		a.free = make([]byte, 0, arenaBlock)
	}
	b := a.free[:n:n]
	a.free = a.free[n:n]
	return b
}

// copy returns a copy of b in a.
func (a *arena) copy(b []byte) []byte {
	c := a.alloc(len(b))
	copy(c, b)
	return c
}

// Page tokens are base64url(version byte, pos of the last item returned). The version lets the format change
// without old tokens being misread. A token is only a position, so it needs no server state and stays valid
// across restarts; used with a changed filter it continues that filter from the same point in time.
const pageTokenVersion = 1

func encodePageToken(p pos) string {
	b := make([]byte, 0, 1+posLen)
	b = append(b, pageTokenVersion)
	b = append(b, p[:]...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePageToken(s string) (pos, error) {
	var p pos
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return p, fmt.Errorf("not base64url: %v", err)
	}
	if len(b) != 1+posLen {
		return p, fmt.Errorf("wrong length %d", len(b))
	}
	if b[0] != pageTokenVersion {
		return p, fmt.Errorf("unknown version %d", b[0])
	}
	copy(p[:], b[1:])
	return p, nil
}
