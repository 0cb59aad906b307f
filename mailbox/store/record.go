package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/klauspost/compress/s2"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/encoding/protowire"
)

// A record is an item: uvarint(len(hdr)) hdr blob, where hdr is the item without its blob in protobuf wire format
// and blob the envelope bytes as received. The value of an item's primary key holds it in one of three formats,
// told apart by the entry's Badger user meta byte, so stores written before compression read as they are:
//
//	formatPlain  (0): the record.
//	formatS2     (1): uvarint(len(blob)) then the record as one S2 block (github.com/klauspost/compress/s2).
//	formatS2Dict (2): the same, the block compressed against the store's dictionary (box.dictKey).
//
// The record is compressed whole, not the blob alone: the header repeats the envelope's strings (message id,
// topic, trace id, ...), which the compressor then finds as matches. A record alone is too short for much else to
// repeat (a 1 KiB record with a JSON payload compresses by a quarter), so a store compresses against a dictionary
// made from the first records it was given: field names, type and schema URLs, namespaces, the shape of the
// payloads; the same record then compresses four-fold. The dictionary is written durably before the first record
// that uses it and never changes, so formatS2Dict always means that one. The blob length leads, uncompressed,
// so a retention pass counts bytes without decompressing. S2 rather than zstd: per 1 KiB record zstd's encoder
// costs tens of µs (it resets its tables for every input) against S2's few. A record is stored compressed only
// when that saves at least a sixteenth of it, and it is decompressed on every read, a µs or two per record.
const (
	formatPlain  byte = 0
	formatS2     byte = 1
	formatS2Dict byte = 2
)

// compressMin is the smallest record worth compressing: below Badger's value threshold the record stays in the
// LSM tree, whose blocks are compressed anyway.
const compressMin = 256

// Dictionary: made from at least dictMinSample bytes of the first records written (at most dictMaxSample, more
// helps little), kept under the mailbox's dictKey.
const (
	dictMinSample = 4 << 10
	dictMaxSample = 32 << 10
)

// makeDict makes a dictionary from the records of items, nil if they are too few.
func makeDict(items []*mailboxv1.MailboxItem) *s2.Dict {
	var sample []byte
	for _, it := range items {
		if len(sample) >= dictMaxSample {
			break
		}
		sample = append(sample, encodeRecord(it)...)
	}
	if len(sample) < dictMinSample {
		return nil
	}
	// The newest bytes are the ones nearest to what is compressed, and what matches prefer.
	return s2.MakeDict(sample[max(0, len(sample)-dictMaxSample):], nil)
}

// storeRecord returns the value to store for rec, an encodeRecord of an item with a blob of blobLen bytes, and
// its format; dict, when not nil, is the store's dictionary. A compressed value is written into dst if it has
// room for storedMaxLen(len(rec)) bytes (a writer reuses one buffer for a batch), else into a new slice.
func storeRecord(dst, rec []byte, blobLen int, dict *s2.Dict) ([]byte, byte) {
	if len(rec) < compressMin {
		return rec, formatPlain
	}
	v := dst[:cap(dst)]
	if need := storedMaxLen(len(rec)); len(v) < need {
		v = make([]byte, need)
	}
	n := binary.PutUvarint(v, uint64(blobLen))
	format := formatS2
	if dict != nil {
		format = formatS2Dict
		n += len(dict.Encode(v[n:], rec))
	} else {
		n += len(s2.EncodeBetter(v[n:], rec))
	}
	if n > len(rec)-len(rec)/16 {
		return rec, formatPlain
	}
	return v[:n:n], format
}

// storedMaxLen is the most bytes storeRecord writes for a record of recLen bytes.
func storedMaxLen(recLen int) int { return binary.MaxVarintLen64 + s2.MaxEncodedLen(recLen) }

// itemValue is a primary key's value as Badger holds it: the bytes, their format (the entry's user meta) and the
// store's dictionary (nil if it has none).
type itemValue struct {
	b      []byte
	format byte
	dict   *s2.Dict
}

// record returns the plain record, v.b itself or decompressed into *buf, which it grows as needed (a reader
// reuses it across items).
func (v itemValue) record(buf *[]byte) ([]byte, error) {
	if v.format == formatPlain {
		return v.b, nil
	}
	if v.format != formatS2 && v.format != formatS2Dict {
		return nil, fmt.Errorf("%w: unknown format %d", errCorruptRecord, v.format)
	}
	_, w := binary.Uvarint(v.b)
	if w <= 0 {
		return nil, errCorruptRecord
	}
	n, err := s2.DecodedLen(v.b[w:])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errCorruptRecord, err)
	}
	if cap(*buf) < n {
		*buf = make([]byte, n)
	}
	var rec []byte
	switch {
	case v.format == formatS2:
		rec, err = s2.Decode((*buf)[:cap(*buf)], v.b[w:])
	case v.dict == nil:
		return nil, fmt.Errorf("%w: compressed with a dictionary the store does not have", errCorruptRecord)
	default:
		rec, err = v.dict.Decode((*buf)[:cap(*buf)], v.b[w:])
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errCorruptRecord, err)
	}
	return rec, nil
}

// blobLen is the length of the record's envelope blob, read without decompressing.
func (v itemValue) blobLen() (int, error) {
	switch v.format {
	case formatPlain:
		_, blob, err := splitRecord(v.b)
		return len(blob), err
	case formatS2, formatS2Dict:
		n, w := binary.Uvarint(v.b)
		if w <= 0 {
			return 0, errCorruptRecord
		}
		// The blob is part of the record, whose length the block starts with.
		if recLen, err := s2.DecodedLen(v.b[w:]); err != nil || n > uint64(recLen) {
			return 0, errCorruptRecord
		}
		return int(n), nil
	}
	return 0, fmt.Errorf("%w: unknown format %d", errCorruptRecord, v.format)
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

func encodeRecord(it *mailboxv1.MailboxItem) []byte { return appendRecord(nil, it) }

// appendRecord appends it's record to b.
func appendRecord(b []byte, it *mailboxv1.MailboxItem) []byte {
	// The header goes after room for its length, then moves back to follow the length's actual bytes.
	start := len(b)
	b = appendHeaders(append(b, make([]byte, binary.MaxVarintLen64)...), it)
	n := len(b) - start - binary.MaxVarintLen64
	w := binary.PutUvarint(b[start:], uint64(n))
	copy(b[start+w:], b[start+binary.MaxVarintLen64:])
	return append(b[:start+w+n], it.GetEnvelopeBlob()...)
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

// meta is the store's counters and its retention floor, rewritten in the transaction of every write and
// retention pass.
type meta struct {
	events, bytes int64
	seq           uint64
	// floorBits is the retention floor with its sign bit flipped, so the zero value is math.MinInt64: no floor.
	floorBits uint64
	// span is the widest time span, in milliseconds, of any posting block written (posting.go): a walk starting
	// at a position reads the blocks starting up to span before it. It only grows.
	span uint64
	// oldest and newest are the timestamps of the oldest and newest items not below the floor, oldest > newest
	// when there is none. They are not stored: Open finds them (setBounds), writes widen them and retention
	// passes raise oldest, so Stats reads no key.
	oldest, newest int64
}

// widen takes an item stored at ts into the bounds.
func (m *meta) widen(ts int64) {
	if m.oldest > m.newest {
		m.oldest, m.newest = ts, ts
		return
	}
	m.oldest, m.newest = min(m.oldest, ts), max(m.newest, ts)
}

// floor is the retention floor: items with an earlier timestamp are deleted, whether or not the sweep has
// removed their keys yet.
func (m meta) floor() int64 { return int64(m.floorBits ^ signBit) }

func (m *meta) setFloor(ts int64) { m.floorBits = uint64(ts) ^ signBit }

// Versions 1 (no floor) and 2 are stores with an index entry per item and index instead of posting blocks: Open
// refuses them (ErrOldLayout) rather than read their indexes as empty.
const metaVersion = 3

// ErrOldLayout is wrapped by OpenDB's error for a store written before the one-database layout (a Badger per
// mailbox, keys.go), and by DB.Open's for a mailbox written with per-item index entries (before posting blocks).
// Nothing in it is lost or changed: rebuilding it from Kafka (prism runner rebuild) writes it anew.
var ErrOldLayout = errors.New("store written in an older layout: rebuild it from Kafka with prism runner rebuild")

func (m meta) encode() []byte {
	b := []byte{metaVersion}
	b = binary.AppendVarint(b, m.events)
	b = binary.AppendVarint(b, m.bytes)
	b = binary.AppendUvarint(b, m.seq)
	b = binary.AppendUvarint(b, m.floorBits)
	return binary.AppendUvarint(b, m.span)
}

func decodeMeta(b []byte) (meta, error) {
	if len(b) > 0 && (b[0] == 1 || b[0] == 2) {
		return meta{}, ErrOldLayout
	}
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
	b = b[w:]
	if m.floorBits, w = binary.Uvarint(b); w <= 0 {
		return meta{}, fmt.Errorf("meta: bad retention floor")
	}
	b = b[w:]
	if m.span, w = binary.Uvarint(b); w <= 0 || m.span > maxBlockSpan {
		return meta{}, fmt.Errorf("meta: bad block span")
	}
	return m, nil
}
