package envelope

import (
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/timestamppb"

	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// decodeIndexed parses envelope bytes in one pass straight into the item a
// mailbox stores (every header ExtractMailboxItem sets but the timestamp and
// the blob) and an envelope holding only what Validate reads (version and
// metadata). The payload, the labels and the other unindexed fields are
// checked as proto.Unmarshal checks them (well-formed wire, UTF-8 strings) but
// neither copied nor kept.
//
// It reports false for anything proto.Unmarshal might reject, and then the full
// decoder decides and words the error: a rejection costs a second parse, an
// accepted envelope saves most of the first (the payload copy, the context
// messages and the extensions map, 18 of 44 allocations per record).
//
// What it mirrors of protobuf-go's unmarshal, field by field: a known field
// with another wire type is an unknown field; unknown fields are skipped if
// well-formed (groups included); a repeated scalar or string keeps the last
// value, a repeated message merges into the one before (here: its fields land
// on the same item), a map entry's missing key or value is the zero value and
// a later entry with the same key wins; field numbers outside 1..2^29-1, an
// unmatched end-group and a malformed varint or length fail the whole message.
func decodeIndexed(raw []byte) (*envelopev1.PrismEnvelope, *mailboxv1.MailboxItem, bool) {
	env := &envelopev1.PrismEnvelope{}
	item := &mailboxv1.MailboxItem{}
	for b := raw; len(b) > 0; {
		f, ok := nextField(&b)
		if !ok {
			return nil, nil, false
		}
		switch f.num {
		case 1: // envelope_version
			if f.typ == protowire.VarintType {
				env.EnvelopeVersion = int32(f.u)
			}
			continue
		case 2, 3, 4, 5, 6, 99:
			if f.typ != protowire.BytesType {
				continue
			}
		default:
			continue
		}
		switch f.num {
		case 2: // metadata
			if env.Metadata == nil {
				env.Metadata = &envelopev1.PrismMetadata{}
			}
			ok = decodeMetadata(f.b, env.Metadata, item)
		case 3: // payload: google.protobuf.Any, its type_url a string
			ok = checkStrings(f.b, 1)
		case 4: // security
			ok = decodeSecurity(f.b, item)
		case 5: // observability
			ok = decodeObservability(f.b, item)
		case 6: // schema
			ok = decodeSchema(f.b, item)
		case 99: // extensions: map<string, bytes>
			var k, v []byte
			if k, v, ok = mapEntry(f.b, false); ok {
				if item.CustomHeaders == nil {
					item.CustomHeaders = make(map[string]string, 4)
				}
				// As ExtractMailboxItem: item headers are proto3 strings and must be UTF-8.
				item.CustomHeaders[string(k)] = strings.ToValidUTF8(string(v), "\uFFFD")
			}
		}
		if !ok {
			return nil, nil, false
		}
	}
	item.MessageId = env.GetMetadata().GetMessageId()
	item.Topic = env.GetMetadata().GetTopic()
	if ts := env.GetMetadata().GetPublishedAt(); ts != nil {
		item.Timestamp = ts.AsTime().UnixMilli()
	}
	return env, item, true
}

func decodeMetadata(b []byte, md *envelopev1.PrismMetadata, item *mailboxv1.MailboxItem) bool {
	for len(b) > 0 {
		f, ok := nextField(&b)
		if !ok {
			return false
		}
		if f.typ != protowire.BytesType {
			continue // every field read here is length-delimited; scalars are skipped as unknown would be
		}
		switch f.num {
		case 1, 2, 3, 5, 6, 7, 8:
			if !utf8.Valid(f.b) {
				return false
			}
			switch f.num {
			case 1:
				md.MessageId = string(f.b)
			case 2:
				md.Topic = string(f.b)
			case 3:
				item.Namespace = string(f.b)
			case 5:
				item.ContentType = string(f.b)
			case 7:
				item.CorrelationId = string(f.b)
			}
		case 4: // published_at
			if md.PublishedAt == nil {
				md.PublishedAt = &timestamppb.Timestamp{}
			}
			if !decodeTimestamp(f.b, md.PublishedAt) {
				return false
			}
		case 10: // expires_at: scalars only
			if !checkStrings(f.b) {
				return false
			}
		}
	}
	return true
}

// decodeTimestamp refuses a timestamp with anything but its two fields: an
// invalid one is rejected with its text, unknown fields included, which only
// the full decoder can write.
func decodeTimestamp(b []byte, ts *timestamppb.Timestamp) bool {
	for len(b) > 0 {
		f, ok := nextField(&b)
		if !ok || f.typ != protowire.VarintType || (f.num != 1 && f.num != 2) {
			return false
		}
		switch f.num {
		case 1:
			ts.Seconds = int64(f.u)
		case 2:
			ts.Nanos = int32(f.u)
		}
	}
	return true
}

func decodeSecurity(b []byte, item *mailboxv1.MailboxItem) bool {
	for len(b) > 0 {
		f, ok := nextField(&b)
		if !ok {
			return false
		}
		if f.typ != protowire.BytesType {
			continue
		}
		switch f.num {
		case 1, 2, 5, 6:
			if !utf8.Valid(f.b) {
				return false
			}
			if f.num == 1 {
				item.Principal = string(f.b)
			}
		case 3: // encryption: algorithm and key_id are strings
			if !decodeEncryption(f.b, item) {
				return false
			}
		}
	}
	return true
}

func decodeEncryption(b []byte, item *mailboxv1.MailboxItem) bool {
	for len(b) > 0 {
		f, ok := nextField(&b)
		if !ok {
			return false
		}
		if f.typ != protowire.BytesType || (f.num != 1 && f.num != 2) {
			continue
		}
		if !utf8.Valid(f.b) {
			return false
		}
		if f.num == 1 {
			item.Encryption = string(f.b)
		}
	}
	return true
}

func decodeObservability(b []byte, item *mailboxv1.MailboxItem) bool {
	for len(b) > 0 {
		f, ok := nextField(&b)
		if !ok {
			return false
		}
		if f.typ != protowire.BytesType {
			continue
		}
		switch f.num {
		case 1, 2, 3:
			if !utf8.Valid(f.b) {
				return false
			}
			switch f.num {
			case 1:
				item.TraceId = string(f.b)
			case 2:
				item.SpanId = string(f.b)
			}
		case 5: // labels: map<string, string>
			if _, _, ok := mapEntry(f.b, true); !ok {
				return false
			}
		}
	}
	return true
}

func decodeSchema(b []byte, item *mailboxv1.MailboxItem) bool {
	for len(b) > 0 {
		f, ok := nextField(&b)
		if !ok {
			return false
		}
		if f.typ != protowire.BytesType || f.num < 1 || f.num > 4 {
			continue
		}
		if !utf8.Valid(f.b) {
			return false
		}
		switch f.num {
		case 1:
			item.SchemaUrl = string(f.b)
		case 2:
			item.SchemaVersion = string(f.b)
		}
	}
	return true
}

// mapEntry parses a map entry with a string key and a bytes value, or a string
// value when stringValue is set (then checked for UTF-8 like the key).
func mapEntry(b []byte, stringValue bool) (key, value []byte, ok bool) {
	for len(b) > 0 {
		f, ok := nextField(&b)
		if !ok {
			return nil, nil, false
		}
		if f.typ != protowire.BytesType {
			continue
		}
		switch f.num {
		case 1:
			if !utf8.Valid(f.b) {
				return nil, nil, false
			}
			key = f.b
		case 2:
			if stringValue && !utf8.Valid(f.b) {
				return nil, nil, false
			}
			value = f.b
		}
	}
	return key, value, true
}

// checkStrings checks a message that is not kept: well-formed, and its string
// fields (the numbers given) valid UTF-8.
func checkStrings(b []byte, stringFields ...protowire.Number) bool {
	for len(b) > 0 {
		f, ok := nextField(&b)
		if !ok {
			return false
		}
		if f.typ != protowire.BytesType {
			continue
		}
		for _, n := range stringFields {
			if f.num == n && !utf8.Valid(f.b) {
				return false
			}
		}
	}
	return true
}

// field is one field of a message: a varint's value or a length-delimited
// field's bytes (other wire types are skipped, their values unread).
type field struct {
	num protowire.Number
	typ protowire.Type
	u   uint64
	b   []byte
}

// nextField consumes the next field of *b. It fails where protobuf-go's
// unmarshal fails: a malformed tag or value, a field number out of range, an
// end-group without its start, a reserved wire type (ConsumeFieldValue refuses
// the last two).
func nextField(b *[]byte) (field, bool) {
	tag, n := protowire.ConsumeVarint(*b)
	if n < 0 {
		return field{}, false
	}
	num := tag >> 3
	if num < uint64(protowire.MinValidNumber) || num > uint64(protowire.MaxValidNumber) {
		return field{}, false
	}
	f := field{num: protowire.Number(num), typ: protowire.Type(tag & 7)}
	rest := (*b)[n:]
	switch f.typ {
	case protowire.VarintType:
		f.u, n = protowire.ConsumeVarint(rest)
	case protowire.BytesType:
		f.b, n = protowire.ConsumeBytes(rest)
	default:
		n = protowire.ConsumeFieldValue(f.num, f.typ, rest)
	}
	if n < 0 {
		return field{}, false
	}
	*b = rest[n:]
	return f, true
}
