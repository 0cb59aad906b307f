package store

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"

	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Key layout. Every item has a 16-byte position pos = invTs(8) | invSeq(8), big endian, where invTs is the
// item's timestamp with the sign bit flipped and then all bits inverted, and invSeq is the inverted store-wide
// write sequence. Byte order of pos is therefore newest first, and among equal timestamps the later write
// first, so every "newest first" read is a plain forward iteration and a cursor is just the last pos returned.
//
//	'e' pos                        -> record: uvarint(len(hdr)) hdr blob, hdr = the item's headers (proto) without
//	                                  the blob. One value, so a result needs one read; it is larger than the value
//	                                  threshold and lives in the value log, which keeps the LSM tree keys-only and
//	                                  small (cheap compactions, key-only index scans stay in memory).
//	'm' message_id                 -> pos: dedup on write, Get by message id, and the way back from an item to
//	                                  its primary key.
//	'i' kind uvarint(len) value pos -> nothing: one secondary index entry per indexed header. kind is one of
//	                                  topic, principal, correlation id, trace id. A query seeks to
//	                                  'i' kind len value pos(end of the time range, or the cursor) and walks
//	                                  forward key-only (PrefetchValues=false) until the start of the time range,
//	                                  so it touches only matching keys and never earlier pages.
//	'!' "meta"                     -> counters (events, envelope bytes, last sequence), rewritten in the same
//	                                  transaction as every write and delete so Stats never scans and never drifts.
//
// The time index is the primary order itself.
const (
	prefixItem  = 'e'
	prefixMsgID = 'm'
	prefixIndex = 'i'

	posLen = 16
)

var metaKey = []byte("!meta")

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

func itemKey(p pos) []byte {
	k := make([]byte, 1+posLen)
	k[0] = prefixItem
	copy(k[1:], p[:])
	return k
}

func msgIDKey[T string | []byte](id T) []byte {
	k := make([]byte, 1+len(id))
	k[0] = prefixMsgID
	copy(k[1:], id)
	return k
}

// indexPrefix is the prefix of every index entry of (kind, value).
func indexPrefix[T string | []byte](kind byte, value T) []byte {
	k := make([]byte, 0, 2+binary.MaxVarintLen64+len(value)+posLen)
	k = append(k, prefixIndex, kind)
	k = binary.AppendUvarint(k, uint64(len(value)))
	return append(k, value...)
}

func indexKey[T string | []byte](kind byte, value T, p pos) []byte {
	return append(indexPrefix(kind, value), p[:]...)
}

// indexed are the header fields that keys are made of, sliced out of a record without decoding all of it: the
// retention pass and query filters need only these, and a full proto decode would allocate every header.
type indexed struct {
	msgID, topic, principal, corr, trace []byte
	blobLen                              int
}

func indexedOf(it *mailboxv1.MailboxItem) indexed {
	return indexed{
		msgID:     []byte(it.GetMessageId()),
		topic:     []byte(it.GetTopic()),
		principal: []byte(it.GetPrincipal()),
		corr:      []byte(it.GetCorrelationId()),
		trace:     []byte(it.GetTraceId()),
		blobLen:   len(it.GetEnvelopeBlob()),
	}
}

// Field numbers of MailboxItem (proto/prism/mailbox/v1); TestParseIndexed checks them against the generated code.
const (
	fieldMessageID     = 1
	fieldTopic         = 3
	fieldCorrelationID = 8
	fieldPrincipal     = 9
	fieldTraceID       = 11
)

// parseIndexed reads the indexed fields of a record; the slices alias rec.
func parseIndexed(rec []byte) (indexed, error) {
	var x indexed
	hdr, blob, err := splitRecord(rec)
	if err != nil {
		return x, err
	}
	x.blobLen = len(blob)
	for len(hdr) > 0 {
		num, typ, n := protowire.ConsumeTag(hdr)
		if n < 0 {
			return x, errCorruptRecord
		}
		hdr = hdr[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, hdr); n < 0 {
				return x, errCorruptRecord
			}
			hdr = hdr[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(hdr)
		if n < 0 {
			return x, errCorruptRecord
		}
		hdr = hdr[n:]
		switch num {
		case fieldMessageID:
			x.msgID = v
		case fieldTopic:
			x.topic = v
		case fieldCorrelationID:
			x.corr = v
		case fieldPrincipal:
			x.principal = v
		case fieldTraceID:
			x.trace = v
		}
	}
	return x, nil
}

// indexEntries lists the index keys of an item. Topic and principal are indexed even when empty so a filter for
// the empty value is still an index lookup; correlation and trace ids only when set, since an empty filter value
// means "no filter" for them.
func indexEntries(x indexed, p pos) [][]byte {
	keys := [][]byte{
		indexKey(kindTopic, x.topic, p),
		indexKey(kindPrincipal, x.principal, p),
	}
	if len(x.corr) > 0 {
		keys = append(keys, indexKey(kindCorrelation, x.corr, p))
	}
	if len(x.trace) > 0 {
		keys = append(keys, indexKey(kindTrace, x.trace, p))
	}
	return keys
}

// headersOf is the item without its blob, field by field: proto messages must not be copied by value.
func headersOf(it *mailboxv1.MailboxItem) *mailboxv1.MailboxItem {
	return &mailboxv1.MailboxItem{
		MessageId:     it.GetMessageId(),
		Timestamp:     it.GetTimestamp(),
		Topic:         it.GetTopic(),
		ContentType:   it.GetContentType(),
		SchemaUrl:     it.GetSchemaUrl(),
		SchemaVersion: it.GetSchemaVersion(),
		Encryption:    it.GetEncryption(),
		CorrelationId: it.GetCorrelationId(),
		Principal:     it.GetPrincipal(),
		Namespace:     it.GetNamespace(),
		TraceId:       it.GetTraceId(),
		SpanId:        it.GetSpanId(),
		CustomHeaders: it.GetCustomHeaders(),
	}
}

func encodeRecord(it *mailboxv1.MailboxItem) ([]byte, error) {
	hdr, err := proto.Marshal(headersOf(it))
	if err != nil {
		return nil, fmt.Errorf("marshal headers of %q: %w", it.GetMessageId(), err)
	}
	blob := it.GetEnvelopeBlob()
	rec := make([]byte, 0, binary.MaxVarintLen64+len(hdr)+len(blob))
	rec = binary.AppendUvarint(rec, uint64(len(hdr)))
	rec = append(rec, hdr...)
	return append(rec, blob...), nil
}

var errCorruptRecord = errors.New("corrupt record")

// splitRecord returns the header bytes and the blob of a record without copying.
func splitRecord(rec []byte) (hdr, blob []byte, err error) {
	n, w := binary.Uvarint(rec)
	if w <= 0 || n > uint64(len(rec)-w) {
		return nil, nil, errCorruptRecord
	}
	return rec[w : w+int(n)], rec[w+int(n):], nil
}

// decodeItem decodes a whole record; rec may be reused by the caller afterwards.
func decodeItem(rec []byte) (*mailboxv1.MailboxItem, error) {
	hdr, blob, err := splitRecord(rec)
	if err != nil {
		return nil, err
	}
	it := &mailboxv1.MailboxItem{}
	if err := proto.Unmarshal(hdr, it); err != nil {
		return nil, fmt.Errorf("%w: %v", errCorruptRecord, err)
	}
	it.EnvelopeBlob = bytes.Clone(blob)
	return it, nil
}

type meta struct {
	events, bytes int64
	seq           uint64
}

const metaVersion = 1

func (m meta) encode() []byte {
	b := []byte{metaVersion}
	b = binary.AppendVarint(b, m.events)
	b = binary.AppendVarint(b, m.bytes)
	return binary.AppendUvarint(b, m.seq)
}

func decodeMeta(b []byte) (meta, error) {
	if len(b) == 0 || b[0] != metaVersion {
		return meta{}, fmt.Errorf("meta: unknown version")
	}
	b = b[1:]
	var m meta
	var w int
	if m.events, w = binary.Varint(b); w <= 0 {
		return meta{}, fmt.Errorf("meta: bad events counter")
	}
	b = b[w:]
	if m.bytes, w = binary.Varint(b); w <= 0 {
		return meta{}, fmt.Errorf("meta: bad bytes counter")
	}
	b = b[w:]
	if m.seq, w = binary.Uvarint(b); w <= 0 {
		return meta{}, fmt.Errorf("meta: bad sequence")
	}
	return m, nil
}

// Page tokens are base64url(version byte, pos of the last item returned). The version lets the format change
// without old tokens being misread.
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
