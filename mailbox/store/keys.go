package store

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/encoding/protowire"
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

// afterLastItem sorts after every primary key: a reverse iteration seeks here to start at the oldest item.
var afterLastItem = append([]byte{prefixItem}, bytes.Repeat([]byte{0xff}, posLen+1)...)

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

// indexed are the header fields that keys are made of, sliced out of a record without decoding all of it: the
// retention pass and query filters need only these, and a full proto decode would allocate every header.
type indexed struct {
	msgID, topic, principal, corr, trace []byte
	blobLen                              int
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

// itemKeys returns every key of an item, carved out of one allocation: its primary key, its message-id key, then
// its index keys. Topic and principal are indexed even when empty so a filter for the empty value is still an
// index lookup; correlation and trace ids only when set, since an empty filter value means "no filter" for them.
func itemKeys[T string | []byte](p pos, msgID, topic, principal, corr, trace T) [][]byte {
	vals := [...]T{topic, principal, corr, trace}
	kinds := [...]byte{kindTopic, kindPrincipal, kindCorrelation, kindTrace}
	size := 2*(1+posLen) + len(msgID)
	for _, v := range vals {
		size += 2 + binary.MaxVarintLen64 + len(v) + posLen
	}
	// buf never grows past its capacity, so the keys sliced from it stay valid.
	buf := make([]byte, 0, size)
	keys := make([][]byte, 0, 2+len(vals))
	cut := func(start int) { keys = append(keys, buf[start:len(buf):len(buf)]) }
	buf = append(buf, prefixItem)
	buf = append(buf, p[:]...)
	cut(0)
	start := len(buf)
	buf = append(buf, prefixMsgID)
	buf = append(buf, msgID...)
	cut(start)
	for i, v := range vals {
		if len(v) == 0 && (kinds[i] == kindCorrelation || kinds[i] == kindTrace) {
			continue
		}
		start = len(buf)
		buf = append(buf, prefixIndex, kinds[i])
		buf = binary.AppendUvarint(buf, uint64(len(v)))
		buf = append(buf, v...)
		buf = append(buf, p[:]...)
		cut(start)
	}
	return keys
}

// Field numbers of MailboxItem's headers, for the encoder below.
const (
	fieldTimestamp     = 2
	fieldContentType   = 4
	fieldSchemaURL     = 5
	fieldSchemaVersion = 6
	fieldEncryption    = 7
	fieldNamespace     = 10
	fieldSpanID        = 12
	fieldCustomHeaders = 13
)

// appendHeaders appends the item without its blob in protobuf wire format, exactly what proto.Marshal writes for
// it (TestEncodeHeaders checks that), without the reflection and allocations of the generic marshaler: this runs
// for every stored event.
func appendHeaders(b []byte, it *mailboxv1.MailboxItem) []byte {
	str := func(num protowire.Number, v string) {
		if v != "" {
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendString(b, v)
		}
	}
	str(fieldMessageID, it.GetMessageId())
	if ts := it.GetTimestamp(); ts != 0 {
		b = protowire.AppendTag(b, fieldTimestamp, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(ts))
	}
	str(fieldTopic, it.GetTopic())
	str(fieldContentType, it.GetContentType())
	str(fieldSchemaURL, it.GetSchemaUrl())
	str(fieldSchemaVersion, it.GetSchemaVersion())
	str(fieldEncryption, it.GetEncryption())
	str(fieldCorrelationID, it.GetCorrelationId())
	str(fieldPrincipal, it.GetPrincipal())
	str(fieldNamespace, it.GetNamespace())
	str(fieldTraceID, it.GetTraceId())
	str(fieldSpanID, it.GetSpanId())
	if h := it.GetCustomHeaders(); len(h) > 0 {
		keys := make([]string, 0, len(h))
		for k := range h {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			v := h[k]
			// A map entry is a message {1: key, 2: value}; proto.Marshal writes both fields even when empty.
			n := protowire.SizeTag(1) + protowire.SizeBytes(len(k)) + protowire.SizeTag(2) + protowire.SizeBytes(len(v))
			b = protowire.AppendTag(b, fieldCustomHeaders, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(n))
			b = protowire.AppendTag(b, 1, protowire.BytesType)
			b = protowire.AppendString(b, k)
			b = protowire.AppendTag(b, 2, protowire.BytesType)
			b = protowire.AppendString(b, v)
		}
	}
	return b
}

func encodeRecord(it *mailboxv1.MailboxItem) []byte {
	hdr := appendHeaders(make([]byte, 0, 512), it)
	blob := it.GetEnvelopeBlob()
	rec := make([]byte, 0, binary.MaxVarintLen64+len(hdr)+len(blob))
	rec = binary.AppendUvarint(rec, uint64(len(hdr)))
	rec = append(rec, hdr...)
	return append(rec, blob...)
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

// decodeItem decodes a whole record; rec may be reused by the caller afterwards. It is the inverse of
// appendHeaders, hand-written for the same reason: every item a query returns goes through it. All header
// strings are cut from one string copy of the header bytes, one allocation instead of one per field.
func decodeItem(rec []byte) (*mailboxv1.MailboxItem, error) {
	hdr, blob, err := splitRecord(rec)
	if err != nil {
		return nil, err
	}
	it := &mailboxv1.MailboxItem{EnvelopeBlob: bytes.Clone(blob)}
	hs := string(hdr)
	for off := 0; off < len(hdr); {
		num, typ, n := protowire.ConsumeTag(hdr[off:])
		if n < 0 {
			return nil, errCorruptRecord
		}
		off += n
		switch {
		case num == fieldTimestamp && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(hdr[off:])
			if n < 0 {
				return nil, errCorruptRecord
			}
			it.Timestamp = int64(v)
			off += n
		case typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(hdr[off:])
			if n < 0 {
				return nil, errCorruptRecord
			}
			start := off + n - len(v)
			str := hs[start : start+len(v)]
			off += n
			if num == fieldCustomHeaders {
				k, val, err := decodeMapEntry(v, str)
				if err != nil {
					return nil, err
				}
				if it.CustomHeaders == nil {
					it.CustomHeaders = map[string]string{}
				}
				it.CustomHeaders[k] = val
				continue
			}
			if f := stringField(it, num); f != nil {
				*f = str
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, hdr[off:])
			if n < 0 {
				return nil, errCorruptRecord
			}
			off += n
		}
	}
	return it, nil
}

func stringField(it *mailboxv1.MailboxItem, num protowire.Number) *string {
	switch num {
	case fieldMessageID:
		return &it.MessageId
	case fieldTopic:
		return &it.Topic
	case fieldContentType:
		return &it.ContentType
	case fieldSchemaURL:
		return &it.SchemaUrl
	case fieldSchemaVersion:
		return &it.SchemaVersion
	case fieldEncryption:
		return &it.Encryption
	case fieldCorrelationID:
		return &it.CorrelationId
	case fieldPrincipal:
		return &it.Principal
	case fieldNamespace:
		return &it.Namespace
	case fieldTraceID:
		return &it.TraceId
	case fieldSpanID:
		return &it.SpanId
	}
	return nil
}

// decodeMapEntry decodes one custom_headers entry {1: key, 2: value} from b; s holds the same bytes as a
// string, which the results are cut from.
func decodeMapEntry(b []byte, s string) (key, val string, err error) {
	for off := 0; off < len(b); {
		num, typ, n := protowire.ConsumeTag(b[off:])
		if n < 0 {
			return "", "", errCorruptRecord
		}
		off += n
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b[off:]); n < 0 {
				return "", "", errCorruptRecord
			}
			off += n
			continue
		}
		v, n := protowire.ConsumeBytes(b[off:])
		if n < 0 {
			return "", "", errCorruptRecord
		}
		start := off + n - len(v)
		off += n
		switch num {
		case 1:
			key = s[start : start+len(v)]
		case 2:
			val = s[start : start+len(v)]
		}
	}
	return key, val, nil
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
