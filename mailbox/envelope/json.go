package envelope

import (
	"encoding/base64"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// Payload is an envelope's google.protobuf.Any as the decoded envelope holds
// it: Value is nil when the wire's last value was empty or absent, as
// proto.Unmarshal leaves a proto3 bytes field.
type Payload struct {
	Present bool
	TypeURL []byte
	Value   []byte
}

// AppendJSON appends the envelope raw holds, payload left out, exactly as
// protojson.MarshalOptions{UseProtoNames: true} writes the decoded envelope
// with its Payload set to nil (compact: protojson's own spacing varies from
// build to build on purpose), and returns the payload apart. It reads the wire
// straight into the JSON, without the decode's allocations and protojson's
// reflection, which were most of the CPU of a page of the HTTP API.
//
// It reports false, and leaves dst as it was, for anything it does not
// render as the decoder and protojson would: bytes proto.Unmarshal refuses, a
// message field given twice (which proto merges), a timestamp protojson
// refuses. The caller then decodes and marshals the envelope itself.
//
// What it mirrors: fields in declaration order, proto3 zero values left out,
// present messages written even when empty, int32s as numbers, bytes as
// padded base64, timestamps in RFC 3339 with 0, 3, 6 or 9 fractional digits,
// map entries sorted by key with the last of equal keys winning, unknown
// fields and known fields with another wire type skipped, strings escaped as
// protojson escapes them.
func AppendJSON(dst, raw []byte) ([]byte, Payload, bool) {
	var s jsonScan
	out, ok := s.message(dst, raw, envelopeJSON)
	if !ok {
		return dst, Payload{}, false
	}
	return out, s.payload, true
}

type jsonKind uint8

const (
	jInt32 jsonKind = iota + 1
	jBool
	jString
	jBytes
	jTimestamp
	jMessage
	jPayload         // google.protobuf.Any, returned apart
	jStringBytesMap  // map<string, bytes>
	jStringStringMap // map<string, string>
)

// maxJSONFields is the most fields a message below declares (metadata's).
const maxJSONFields = 10

// jsonField is one field of the envelope's schema; a message's fields are
// listed in declaration order, which is the order protojson writes them.
type jsonField struct {
	num  protowire.Number
	name string // as protojson writes it, quoted and followed by ':'
	kind jsonKind
	msg  []jsonField // a jMessage's fields
}

var (
	encryptionJSON = []jsonField{
		{1, `"algorithm":`, jString, nil},
		{2, `"key_id":`, jString, nil},
		{3, `"iv":`, jBytes, nil},
		{4, `"aad":`, jBytes, nil},
	}
	securityJSON = []jsonField{
		{1, `"publisher_id":`, jString, nil},
		{2, `"publisher_team":`, jString, nil},
		{3, `"encryption":`, jMessage, encryptionJSON},
		{4, `"signature":`, jBytes, nil},
		{5, `"signature_algorithm":`, jString, nil},
		{6, `"auth_token":`, jString, nil},
	}
	observabilityJSON = []jsonField{
		{1, `"trace_id":`, jString, nil},
		{2, `"span_id":`, jString, nil},
		{3, `"parent_span_id":`, jString, nil},
		{4, `"sampled":`, jBool, nil},
		{5, `"labels":`, jStringStringMap, nil},
	}
	schemaJSON = []jsonField{
		{1, `"schema_url":`, jString, nil},
		{2, `"schema_version":`, jString, nil},
		{3, `"schema_name":`, jString, nil},
		{4, `"schema_hash":`, jString, nil},
	}
	metadataJSON = []jsonField{
		{1, `"message_id":`, jString, nil},
		{2, `"topic":`, jString, nil},
		{3, `"namespace":`, jString, nil},
		{4, `"published_at":`, jTimestamp, nil},
		{5, `"content_type":`, jString, nil},
		{6, `"content_encoding":`, jString, nil},
		{7, `"correlation_id":`, jString, nil},
		{8, `"causation_id":`, jString, nil},
		{9, `"priority":`, jInt32, nil},
		{10, `"expires_at":`, jTimestamp, nil},
	}
	envelopeJSON = []jsonField{
		{1, `"envelope_version":`, jInt32, nil},
		{2, `"metadata":`, jMessage, metadataJSON},
		{3, "", jPayload, nil},
		{4, `"security":`, jMessage, securityJSON},
		{5, `"observability":`, jMessage, observabilityJSON},
		{6, `"schema":`, jMessage, schemaJSON},
		{99, `"extensions":`, jStringBytesMap, nil},
	}
)

// jsonScan holds what one AppendJSON call gathers besides its output.
type jsonScan struct {
	payload Payload
}

type mapEntryJSON struct{ key, value []byte }

// slot is the last occurrence of a field in a message.
type slot struct {
	set bool
	u   uint64
	b   []byte
}

// message appends the message b holds, of the given fields, as a JSON object.
func (s *jsonScan) message(out, b []byte, fields []jsonField) ([]byte, bool) {
	var slots [maxJSONFields]slot
	mapAt := -1 // the map field's index; its entries are gathered, not kept in a slot
	var entryBuf [8]mapEntryJSON
	entries := entryBuf[:0]
	for len(b) > 0 {
		f, ok := nextField(&b)
		if !ok {
			return out, false
		}
		i := fieldIndex(fields, f.num)
		if i < 0 {
			continue
		}
		kind := fields[i].kind
		want := protowire.BytesType
		if kind == jInt32 || kind == jBool {
			want = protowire.VarintType
		}
		if f.typ != want {
			continue // another wire type: proto.Unmarshal keeps it as an unknown field, protojson drops it
		}
		switch kind {
		case jString:
			if !utf8.Valid(f.b) {
				return out, false
			}
		case jMessage, jPayload, jTimestamp:
			if slots[i].set {
				return out, false // proto merges a repeated message; left to the decoder
			}
		case jStringBytesMap, jStringStringMap:
			k, v, ok := mapEntry(f.b, kind == jStringStringMap)
			if !ok {
				return out, false
			}
			entries = append(entries, mapEntryJSON{k, v})
			mapAt = i
			continue
		}
		slots[i] = slot{set: true, u: f.u, b: f.b}
	}
	out = append(out, '{')
	first := true
	for i, fd := range fields {
		sl := slots[i]
		if !sl.set && i != mapAt {
			continue
		}
		switch fd.kind {
		case jInt32:
			if int32(sl.u) == 0 {
				continue
			}
		case jBool:
			if sl.u == 0 {
				continue
			}
		case jString, jBytes:
			if len(sl.b) == 0 {
				continue
			}
		case jPayload:
			var ok bool
			if s.payload, ok = anyFields(sl.b); !ok {
				return out, false
			}
			continue
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(out, fd.name...)
		switch fd.kind {
		case jInt32:
			out = strconv.AppendInt(out, int64(int32(sl.u)), 10)
		case jBool:
			out = append(out, "true"...)
		case jString:
			out = AppendJSONString(out, sl.b, false)
		case jBytes:
			out = appendBase64(out, sl.b)
		case jTimestamp:
			var ok bool
			if out, ok = appendTimestamp(out, sl.b); !ok {
				return out, false
			}
		case jMessage:
			var ok bool
			if out, ok = s.message(out, sl.b, fd.msg); !ok {
				return out, false
			}
		case jStringBytesMap, jStringStringMap:
			out = appendMap(out, entries, fd.kind == jStringBytesMap)
		}
	}
	return append(out, '}'), true
}

func fieldIndex(fields []jsonField, num protowire.Number) int {
	for i := range fields {
		if fields[i].num == num {
			return i
		}
	}
	return -1
}

// appendMap appends a map's entries as protojson does: sorted by key, the
// last of equal keys (as proto.Unmarshal keeps it).
func appendMap(out []byte, entries []mapEntryJSON, bytesValues bool) []byte {
	slices.SortStableFunc(entries, func(x, y mapEntryJSON) int { return compareBytes(x.key, y.key) })
	out = append(out, '{')
	first := true
	for i, e := range entries {
		if i+1 < len(entries) && string(entries[i+1].key) == string(e.key) {
			continue
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = AppendJSONString(out, e.key, false)
		out = append(out, ':')
		if bytesValues {
			out = appendBase64(out, e.value)
		} else {
			out = AppendJSONString(out, e.value, false)
		}
	}
	return append(out, '}')
}

func compareBytes(x, y []byte) int {
	switch {
	case string(x) < string(y):
		return -1
	case string(x) > string(y):
		return 1
	}
	return 0
}

// anyFields reads a google.protobuf.Any as proto.Unmarshal fills it.
func anyFields(b []byte) (Payload, bool) {
	p := Payload{Present: true}
	for len(b) > 0 {
		f, ok := nextField(&b)
		if !ok {
			return Payload{}, false
		}
		if f.typ != protowire.BytesType {
			continue
		}
		switch f.num {
		case 1:
			if !utf8.Valid(f.b) {
				return Payload{}, false
			}
			p.TypeURL = f.b
		case 2:
			p.Value = f.b
		}
	}
	if len(p.Value) == 0 {
		p.Value = nil
	}
	return p, true
}

// appendTimestamp appends a google.protobuf.Timestamp as protojson does, or
// reports false for one it refuses (out of range).
func appendTimestamp(out, b []byte) ([]byte, bool) {
	var secs int64
	var nanos int32
	for len(b) > 0 {
		f, ok := nextField(&b)
		if !ok {
			return out, false
		}
		if f.typ != protowire.VarintType {
			continue
		}
		switch f.num {
		case 1:
			secs = int64(f.u)
		case 2:
			nanos = int32(f.u)
		}
	}
	const minSecs, maxSecs = -62135596800, 253402300799 // 0001-01-01 and 9999-12-31T23:59:59
	if secs < minSecs || secs > maxSecs || nanos < 0 || nanos > 999_999_999 {
		return out, false
	}
	out = append(out, '"')
	out = time.Unix(secs, int64(nanos)).UTC().AppendFormat(out, "2006-01-02T15:04:05.000000000")
	for range 2 {
		if n := len(out); string(out[n-3:]) == "000" {
			out = out[:n-3]
		}
	}
	if n := len(out); string(out[n-4:]) == ".000" {
		out = out[:n-4]
	}
	return append(out, 'Z', '"'), true
}

func appendBase64(out, v []byte) []byte {
	out = append(out, '"')
	out = base64.StdEncoding.AppendEncode(out, v)
	return append(out, '"')
}

// AppendJSONString appends s as a JSON string. Either way '"', '\\' and the
// control characters are escaped (\b \f \n \r \t by name, the others as
// \u00xx). With encodingJSON it escapes s as encoding/json does: also '<',
// '>' and '&' (HTML-safe), U+2028 and U+2029, and each byte of invalid UTF-8
// as \ufffd. Without, it escapes valid UTF-8 s as protojson does: nothing
// more ('<', '>', '&', U+2028 and U+2029 as they are).
func AppendJSONString[S ~string | ~[]byte](out []byte, s S, encodingJSON bool) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			if !encodingJSON {
				i++
				continue
			}
			r, size := utf8.DecodeRune([]byte(s[i:min(i+utf8.UTFMax, len(s))]))
			switch {
			case r == utf8.RuneError && size == 1:
				out = append(out, s[start:i]...)
				out = append(out, `\ufffd`...)
			case r == '\u2028' || r == '\u2029':
				out = append(out, s[start:i]...)
				out = append(out, '\\', 'u', '2', '0', '2', hex[r&0xf])
			default:
				i += size
				continue
			}
			i += size
			start = i
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' && (!encodingJSON || c != '<' && c != '>' && c != '&') {
			i++
			continue
		}
		out = append(out, s[start:i]...)
		switch c {
		case '"', '\\':
			out = append(out, '\\', c)
		case '\b':
			out = append(out, '\\', 'b')
		case '\f':
			out = append(out, '\\', 'f')
		case '\n':
			out = append(out, '\\', 'n')
		case '\r':
			out = append(out, '\\', 'r')
		case '\t':
			out = append(out, '\\', 't')
		default:
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		i++
		start = i
	}
	out = append(out, s[start:]...)
	return append(out, '"')
}
