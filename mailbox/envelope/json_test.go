package envelope

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mailbox/envelope/demo"
	envelopev1 "github.com/prism-mesh/prism/proto/prism/envelope/v1"
)

// jsonWords are strings with everything a JSON encoder must get right:
// quotes, backslashes, every kind of control character, HTML characters,
// U+2028, U+FFFD itself, astral runes, and bad UTF-8.
var jsonWords = []string{"", "m-1", "audit.events", "\"", "\\", "a\"b\\c", "\x00", "\x01\x1f\x7f", "\b\f\n\r\t",
	"<a href=\"x\">&amp;</a>", "\u2028\u2029", "\ufffd", "é日本", "😀𝄞", "\xff", "a\xc3", "\xed\xa0\x80",
	strings.Repeat("long ", 60), "/", "\u00a0\u200b"}

// referenceJSON is what AppendJSON stands in for: the envelope decoded, its
// payload taken apart, the rest marshalled by protojson (compacted: protojson
// spaces its output at random from build to build). ok is false when either
// step fails, and the HTTP API then shows no envelope.
func referenceJSON(raw []byte) ([]byte, *anypb.Any, bool) {
	env := &envelopev1.PrismEnvelope{}
	if proto.Unmarshal(raw, env) != nil {
		return nil, nil, false
	}
	p := env.GetPayload()
	env.Payload = nil
	ej, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(env)
	if err != nil {
		return nil, p, false
	}
	var c bytes.Buffer
	if err := json.Compact(&c, ej); err != nil {
		panic(err)
	}
	return c.Bytes(), p, true
}

// checkJSON fails unless AppendJSON either declines raw (leaving its
// destination as it was) or writes byte for byte what referenceJSON writes
// and returns the same payload. It returns whether AppendJSON took raw.
func checkJSON(t *testing.T, raw []byte) bool {
	t.Helper()
	dst := []byte(`{"x":`)
	got, p, ok := AppendJSON(dst, raw)
	want, wantP, wantOK := referenceJSON(raw)
	if !ok {
		if string(got) != `{"x":` {
			t.Fatalf("%x: declined, but left %q in its destination", raw, got)
		}
		return false
	}
	if !wantOK {
		t.Fatalf("%x: rendered %s, but the decoder or protojson refuses it", raw, got)
	}
	if got := got[len(dst):]; !bytes.Equal(got, want) {
		t.Fatalf("%x:\n got %s\nwant %s", raw, got, want)
	}
	if p.Present != (wantP != nil) || string(p.TypeURL) != wantP.GetTypeUrl() ||
		!bytes.Equal(p.Value, wantP.GetValue()) || (p.Value == nil) != (wantP.GetValue() == nil) {
		t.Fatalf("%x: payload %+v, want %v", raw, p, wantP)
	}
	return true
}

// envGen makes random valid envelopes: each field set or not, strings from
// jsonWords (valid ones only, as proto.Marshal wants) or random runes, int32
// extremes, timestamps at every precision and at the ends of their range.
type envGen struct{ r *rand.Rand }

func (g envGen) str() string {
	if g.r.IntN(3) == 0 {
		rs := make([]rune, g.r.IntN(8))
		for i := range rs {
			switch g.r.IntN(3) {
			case 0:
				rs[i] = rune(g.r.IntN(0x80))
			case 1:
				rs[i] = rune(g.r.IntN(0x10000))
			default:
				rs[i] = rune(g.r.IntN(utf8MaxRune))
			}
		}
		return string(rs) // surrogates and such become U+FFFD, valid UTF-8
	}
	for {
		if w := jsonWords[g.r.IntN(len(jsonWords))]; strings.ToValidUTF8(w, "") == w {
			return w
		}
	}
}

const utf8MaxRune = 0x10FFFF

func (g envGen) maybe() bool { return g.r.IntN(2) == 0 }

func (g envGen) bytes() []byte {
	if g.r.IntN(4) == 0 {
		return nil
	}
	b := make([]byte, g.r.IntN(40))
	for i := range b {
		b[i] = byte(g.r.Uint32())
	}
	return b
}

func (g envGen) int32() int32 {
	return []int32{0, 1, -1, math.MaxInt32, math.MinInt32, int32(g.r.Uint32())}[g.r.IntN(6)]
}

func (g envGen) timestamp() *timestamppb.Timestamp {
	secs := []int64{-62135596800, 253402300799, 0, -1, 1_700_000_000, g.r.Int64N(253402300799+62135596800) - 62135596800}[g.r.IntN(6)]
	nanos := []int32{0, 1, 999_999_999, 123_000_000, 123_456_000, 100, int32(g.r.IntN(1e9))}[g.r.IntN(7)]
	return &timestamppb.Timestamp{Seconds: secs, Nanos: nanos}
}

func (g envGen) strMap() map[string]string {
	m := map[string]string{}
	for range g.r.IntN(5) {
		m[g.str()] = g.str()
	}
	return m
}

func (g envGen) envelope() *envelopev1.PrismEnvelope {
	env := &envelopev1.PrismEnvelope{EnvelopeVersion: g.int32()}
	if g.maybe() {
		env.Metadata = &envelopev1.PrismMetadata{MessageId: g.str(), Topic: g.str(), Namespace: g.str(), ContentType: g.str(),
			ContentEncoding: g.str(), CorrelationId: g.str(), CausationId: g.str(), Priority: g.int32()}
		if g.maybe() {
			env.Metadata.PublishedAt = g.timestamp()
		}
		if g.maybe() {
			env.Metadata.ExpiresAt = g.timestamp()
		}
	}
	if g.maybe() {
		env.Payload = &anypb.Any{TypeUrl: g.str(), Value: g.bytes()}
	}
	if g.maybe() {
		env.Security = &envelopev1.SecurityContext{PublisherId: g.str(), PublisherTeam: g.str(), Signature: g.bytes(),
			SignatureAlgorithm: g.str(), AuthToken: g.str()}
		if g.maybe() {
			env.Security.Encryption = &envelopev1.EncryptionInfo{Algorithm: g.str(), KeyId: g.str(), Iv: g.bytes(), Aad: g.bytes()}
		}
	}
	if g.maybe() {
		env.Observability = &envelopev1.ObservabilityContext{TraceId: g.str(), SpanId: g.str(), ParentSpanId: g.str(),
			Sampled: g.maybe(), Labels: g.strMap()}
	}
	if g.maybe() {
		env.Schema = &envelopev1.SchemaContext{SchemaUrl: g.str(), SchemaVersion: g.str(), SchemaName: g.str(), SchemaHash: g.str()}
	}
	if g.maybe() {
		env.Extensions = map[string][]byte{}
		for range g.r.IntN(5) {
			env.Extensions[g.str()] = g.bytes()
		}
	}
	return env
}

// TestAppendJSONTakesEveryValidEnvelope: every envelope a producer's
// proto.Marshal makes, with any field set, comes out as protojson writes it
// (map entries arrive in random order), without falling back.
func TestAppendJSONTakesEveryValidEnvelope(t *testing.T) {
	t.Parallel()
	full, _ := proto.Marshal(fullEnvelope())
	raws := [][]byte{nil, {}, full}
	gen := demo.New(demo.Options{Seed: 3, Namespace: "audit"})
	for range 500 {
		_, raw := gen.NextBytes("audit.events")
		raws = append(raws, raw)
	}
	for i := range 20_000 {
		raw, err := proto.Marshal(envGen{r: rand.New(rand.NewPCG(18, uint64(i)))}.envelope())
		if err != nil {
			t.Fatal(err)
		}
		raws = append(raws, raw)
	}
	for _, raw := range raws {
		if !checkJSON(t, raw) {
			if _, _, ok := referenceJSON(raw); ok {
				t.Fatalf("declined %x, a valid envelope protojson renders", raw)
			}
		}
	}
}

// TestAppendJSONOddWire: random wire of the envelope's schema with every
// oddity (repeats, wrong wire types, unknown fields and groups, bad UTF-8,
// out-of-range varints and timestamps, concatenations, damage) is rendered
// as protojson renders its decoding, or declined; both sides are reached.
func TestAppendJSONOddWire(t *testing.T) {
	t.Parallel()
	took, refused, declinedValid := 0, 0, 0
	for i := range 30_000 {
		g := wireGen{r: rand.New(rand.NewPCG(18, uint64(i))), words: jsonWords}
		raw := g.message("env", 0)
		if g.r.IntN(4) == 0 {
			raw = append(raw, g.message("env", 0)...)
		}
		if g.r.IntN(3) == 0 {
			raw = g.mutate(raw)
		}
		switch _, _, ok := referenceJSON(raw); {
		case checkJSON(t, raw):
			took++
		case ok:
			declinedValid++
		default:
			refused++
		}
	}
	t.Logf("rendered %d, declined %d the reference renders (merges), %d the reference refuses", took, declinedValid, refused)
	if took < 3000 || refused < 3000 || declinedValid < 300 {
		t.Fatalf("rendered %d, declined %d valid and %d invalid: the generator is off balance", took, declinedValid, refused)
	}
}

// TestAppendJSONWireEdges: wire no proto.Marshal writes but the decoder
// takes is rendered as protojson renders its decoding.
func TestAppendJSONWireEdges(t *testing.T) {
	t.Parallel()
	tag := protowire.AppendTag
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(tag(nil, num, protowire.VarintType), v)
	}
	bytesField := func(num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(tag(nil, num, protowire.BytesType), v)
	}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, tc := range []struct {
		name string
		raw  []byte
	}{
		{"empty payload value", bytesField(3, cat(bytesField(1, []byte("t")), bytesField(2, nil)))},
		{"payload value emptied by a later one", bytesField(3, cat(bytesField(2, []byte{1}), bytesField(2, nil)))},
		{"empty payload", bytesField(3, nil)},
		{"version 2^32 is 0 as an int32", varint(1, 1<<32)},
		{"version 2^32+5 is 5", varint(1, 1<<32+5)},
		{"version -1 as a 10-byte varint", varint(1, math.MaxUint64)},
		{"zero values on the wire", cat(varint(1, 0), bytesField(2, cat(bytesField(1, nil), varint(9, 0))), bytesField(5, varint(4, 0)))},
		{"sampled as any nonzero varint", bytesField(5, varint(4, 1<<40))},
		{"last of a repeated string wins", bytesField(2, cat(bytesField(1, []byte("a")), bytesField(1, []byte("b")), bytesField(1, nil)))},
		{"map entries without key or value", cat(bytesField(99, nil), bytesField(99, bytesField(1, []byte("k"))), bytesField(99, bytesField(2, []byte("v"))))},
		{"map entries with equal keys, the last wins", cat(bytesField(99, cat(bytesField(1, []byte("k")), bytesField(2, []byte("1")))),
			bytesField(99, bytesField(1, []byte("a"))), bytesField(99, cat(bytesField(1, []byte("k")), bytesField(2, []byte("2")))))},
		{"labels with equal keys", bytesField(5, cat(bytesField(5, bytesField(1, []byte("k"))), bytesField(5, cat(bytesField(1, []byte("k")), bytesField(2, []byte("\n")))),
			bytesField(5, cat(bytesField(1, []byte("k")), bytesField(1, []byte("j"))))))},
		{"known fields with another wire type", cat(bytesField(1, []byte("x")), varint(2, 7), bytesField(5, cat(bytesField(4, []byte{1}), varint(1, 3))))},
		{"unknown fields and a group", cat(varint(7, 1), bytesField(100, []byte("x")), tag(nil, 50, protowire.StartGroupType), varint(1, 1), tag(nil, 50, protowire.EndGroupType),
			protowire.AppendFixed32(tag(nil, 2, protowire.Fixed32Type), 1))},
		{"timestamp with unknown fields", bytesField(2, bytesField(4, cat(varint(1, 5), varint(3, 9), bytesField(4, nil), varint(2, 1000))))},
		{"timestamp of zero, and an empty one", bytesField(2, cat(bytesField(4, varint(1, 0)), bytesField(10, nil)))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if !checkJSON(t, tc.raw) {
				t.Fatalf("declined %x", tc.raw)
			}
		})
	}
}

// TestJSONTablesMatchTheSchema: AppendJSON's field tables are the envelope's
// messages as protojson sees them, so a field added to the .proto without its
// row fails here rather than vanishing from the HTTP API.
func TestJSONTablesMatchTheSchema(t *testing.T) {
	t.Parallel()
	var check func(md protoreflect.MessageDescriptor, fields []jsonField)
	check = func(md protoreflect.MessageDescriptor, fields []jsonField) {
		if md.Fields().Len() != len(fields) {
			t.Fatalf("%s: %d fields, the table has %d", md.FullName(), md.Fields().Len(), len(fields))
		}
		for i, row := range fields {
			fd := md.Fields().Get(i) // declaration order, protojson's
			if fd.Number() != row.num {
				t.Fatalf("%s: field %d is number %d, the table's %d", md.FullName(), i, fd.Number(), row.num)
			}
			want := map[protoreflect.Kind]jsonKind{protoreflect.Int32Kind: jInt32, protoreflect.BoolKind: jBool,
				protoreflect.StringKind: jString, protoreflect.BytesKind: jBytes}[fd.Kind()]
			switch {
			case fd.IsMap() && fd.MapValue().Kind() == protoreflect.BytesKind:
				want = jStringBytesMap
			case fd.IsMap() && fd.MapValue().Kind() == protoreflect.StringKind:
				want = jStringStringMap
			case fd.Message() != nil && fd.Message().FullName() == "google.protobuf.Timestamp":
				want = jTimestamp
			case fd.Message() != nil && fd.Message().FullName() == "google.protobuf.Any":
				want = jPayload
			case fd.Message() != nil:
				want = jMessage
				check(fd.Message(), row.msg)
			}
			if fd.IsList() || (fd.IsMap() && fd.MapKey().Kind() != protoreflect.StringKind) || want != row.kind {
				t.Fatalf("%s.%s: kind %v (list %v), the table's %d", md.FullName(), fd.Name(), fd.Kind(), fd.IsList(), row.kind)
			}
			if wantName := `"` + fd.TextName() + `":`; want != jPayload && row.name != wantName {
				t.Fatalf("%s.%s: the table names it %s", md.FullName(), fd.Name(), row.name)
			}
		}
	}
	check((&envelopev1.PrismEnvelope{}).ProtoReflect().Descriptor(), envelopeJSON)
}

// TestAppendJSONDeclines: the shapes left to the decoder are declined, and
// each is one the reference renders or refuses as the HTTP API then shows it.
func TestAppendJSONDeclines(t *testing.T) {
	t.Parallel()
	full, _ := proto.Marshal(fullEnvelope())
	ts := func(secs, nanos uint64) []byte {
		b := protowire.AppendTag(nil, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, secs)
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		return protowire.AppendVarint(b, nanos)
	}
	md := func(b []byte) []byte {
		b = protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), b)
		return protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), b)
	}
	for _, tc := range []struct {
		name     string
		raw      []byte
		rendered bool // whether decoding and protojson render it
	}{
		{"concatenated envelopes merge", append(full, full...), true},
		{"published_at before year 1", md(ts(uint64(math.MaxUint64-62135596800), 0)), false},
		{"published_at after 9999", md(ts(253402300800, 0)), false},
		{"negative nanos", md(ts(0, math.MaxUint64)), false},
		{"a billion nanos", md(ts(0, 1e9)), false},
		{"bad UTF-8 in a topic", []byte{0x12, 0x03, 0x12, 0x01, 0xff}, false},
		{"truncated", full[:len(full)-1], false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if checkJSON(t, tc.raw) {
				t.Fatal("rendered; want it left to the decoder")
			}
			if _, _, ok := referenceJSON(tc.raw); ok != tc.rendered {
				t.Fatalf("reference renders it: %v, want %v", ok, tc.rendered)
			}
		})
	}
}

// FuzzAppendJSON: for any bytes, AppendJSON declines or writes what the
// decoder and protojson write.
func FuzzAppendJSON(f *testing.F) {
	raw, _ := proto.Marshal(fullEnvelope())
	f.Add(raw)
	f.Add([]byte{})
	f.Add(append(raw, raw...))
	_, demoRaw := demo.New(demo.Options{Seed: 1}).NextBytes("audit.events")
	f.Add(demoRaw)
	f.Fuzz(func(t *testing.T, b []byte) { checkJSON(t, b) })
}

func BenchmarkAppendJSON(b *testing.B) {
	gen := demo.New(demo.Options{Seed: 1, PayloadSize: 700})
	raws := make([][]byte, 256)
	for i := range raws {
		_, raws[i] = gen.NextBytes("bench.events")
	}
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		var out []byte
		for i := 0; b.Loop(); i++ {
			out, _, _ = AppendJSON(out[:0], raws[i%len(raws)])
		}
	})
	b.Run("protojson", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			env := &envelopev1.PrismEnvelope{}
			if err := proto.Unmarshal(raws[i%len(raws)], env); err != nil {
				b.Fatal(err)
			}
			env.Payload = nil
			if _, err := (protojson.MarshalOptions{UseProtoNames: true}).Marshal(env); err != nil {
				b.Fatal(err)
			}
		}
	})
}
