package envelope

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/mailbox/envelope/demo"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// kind is what a field of the envelope's schema holds, for the generator.
type kind int

const (
	kVarint kind = iota
	kString
	kBytes
	kMessage
)

type fieldShape struct {
	kind kind
	msg  string // the message type of a kMessage field
}

// shapes is the envelope's schema (proto/prism/envelope/v1), as the wire sees it.
var shapes = map[string]map[protowire.Number]fieldShape{
	"env": {1: {kind: kVarint}, 2: {kMessage, "md"}, 3: {kMessage, "any"}, 4: {kMessage, "sec"},
		5: {kMessage, "obs"}, 6: {kMessage, "schema"}, 99: {kMessage, "ext"}},
	"md": {1: {kind: kString}, 2: {kind: kString}, 3: {kind: kString}, 4: {kMessage, "ts"}, 5: {kind: kString},
		6: {kind: kString}, 7: {kind: kString}, 8: {kind: kString}, 9: {kind: kVarint}, 10: {kMessage, "ts"}},
	"ts":     {1: {kind: kVarint}, 2: {kind: kVarint}},
	"any":    {1: {kind: kString}, 2: {kind: kBytes}},
	"sec":    {1: {kind: kString}, 2: {kind: kString}, 3: {kMessage, "enc"}, 4: {kind: kBytes}, 5: {kind: kString}, 6: {kind: kString}},
	"enc":    {1: {kind: kString}, 2: {kind: kString}, 3: {kind: kBytes}, 4: {kind: kBytes}},
	"obs":    {1: {kind: kString}, 2: {kind: kString}, 3: {kind: kString}, 4: {kind: kVarint}, 5: {kMessage, "labels"}},
	"schema": {1: {kind: kString}, 2: {kind: kString}, 3: {kind: kString}, 4: {kind: kString}},
	"ext":    {1: {kind: kString}, 2: {kind: kBytes}},
	"labels": {1: {kind: kString}, 2: {kind: kString}},
}

// wireGen writes random messages of the envelope's schema, mostly well-formed,
// with the oddities protobuf-go has rules for: repeated fields, wrong wire
// types, unknown fields and groups, invalid UTF-8, malformed bytes.
type wireGen struct {
	r     *rand.Rand
	words []string // the strings it writes; nil = a few ids and bad UTF-8
}

func (g wireGen) text() []byte {
	words := g.words
	if words == nil {
		words = []string{"", "m-1", "audit.events", "ns", "user-1", "AES-256-GCM", "t", "\xff", "a\xc3", "é"}
	}
	return []byte(words[g.r.IntN(len(words))])
}

func (g wireGen) message(msg string, depth int) []byte {
	var b []byte
	nums := slices.Sorted(maps.Keys(shapes[msg])) // in order, so a seed makes the same messages
	for range g.r.IntN(7) {
		num := nums[g.r.IntN(len(nums))]
		shape := shapes[msg][num]
		switch g.r.IntN(20) {
		case 0: // an unknown field
			num = protowire.Number(11 + g.r.IntN(80))
			shape = fieldShape{kind: kind(g.r.IntN(3))}
		case 1: // a known field with another wire type
			shape.kind = (shape.kind + 1 + kind(g.r.IntN(3))) % 4
			if shape.kind == kMessage {
				shape.kind = kBytes
			}
		case 2: // a group, sometimes closed by the wrong number
			b = protowire.AppendTag(b, num, protowire.StartGroupType)
			b = append(b, g.message("ts", depth+1)...)
			end := num
			if g.r.IntN(4) == 0 {
				end++
			}
			b = protowire.AppendTag(b, end, protowire.EndGroupType)
			continue
		case 3:
			b = protowire.AppendTag(b, num, protowire.Fixed64Type)
			b = protowire.AppendFixed64(b, g.r.Uint64())
			continue
		}
		switch shape.kind {
		case kVarint:
			b = protowire.AppendTag(b, num, protowire.VarintType)
			b = protowire.AppendVarint(b, g.r.Uint64()>>g.r.IntN(64))
		case kString:
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendBytes(b, g.text())
		case kBytes:
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendBytes(b, append(g.text(), byte(g.r.Uint32())))
		case kMessage:
			b = protowire.AppendTag(b, num, protowire.BytesType)
			if depth > 3 {
				b = protowire.AppendBytes(b, nil)
			} else {
				b = protowire.AppendBytes(b, g.message(shape.msg, depth+1))
			}
		}
	}
	return b
}

// mutate damages b: a flipped bit, a cut, a copied run, a zeroed byte.
func (g wireGen) mutate(b []byte) []byte {
	if len(b) == 0 {
		return b
	}
	b = append([]byte(nil), b...)
	i := g.r.IntN(len(b))
	switch g.r.IntN(4) {
	case 0:
		b[i] ^= 1 << g.r.IntN(8)
	case 1:
		b = b[:i]
	case 2:
		j := i + g.r.IntN(len(b)-i)
		b = append(b[:j:j], append(append([]byte(nil), b[i:j]...), b[j:]...)...)
	case 3:
		b[i] = 0
	}
	return b
}

// checkSame fails unless Process answers for raw exactly as the full decoder
// does (proto.Unmarshal, Validate, ExtractMailboxItem): the same item, or the
// same rejection with the same words, in every mode. It returns whether the
// one-pass decoder took raw.
func checkSame(t *testing.T, raw []byte) bool {
	t.Helper()
	_, _, fast := decodeIndexed(raw)
	if _, err := Decode(raw); err != nil && fast {
		t.Fatalf("one-pass decoder took %x, which proto.Unmarshal refuses: %v", raw, err)
	}
	for _, mode := range []Mode{Strict, Warn, Disabled} {
		got, gotErr := Process(raw, mode, nil)
		want, wantErr := reference(raw, mode)
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Fatalf("%s %x: error %v, want %v", mode, raw, gotErr, wantErr)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("%s %x:\n item %v\n want %v", mode, raw, got, want)
		}
	}
	return fast
}

// reference is Process written the plain way, Decode then validate, for the
// one-pass decoder to agree with.
func reference(raw []byte, mode Mode) (*mailboxv1.MailboxItem, error) {
	env, err := Decode(raw)
	if err != nil {
		return nil, err
	}
	if err := Validate(env, mode, nil); err != nil {
		return nil, err
	}
	return ExtractMailboxItem(env, raw)
}

// TestDecodeIndexedMatchesProtoUnmarshal is the one-pass decoder's referee:
// 100k random envelopes of the schema with every oddity the wire allows, their
// concatenations (which proto merges) and damaged copies give the same item or
// the same rejection as the full decoder.
func TestDecodeIndexedMatchesProtoUnmarshal(t *testing.T) {
	t.Parallel()
	fast, total := 0, 0
	for i := range 100_000 {
		g := wireGen{r: rand.New(rand.NewPCG(16, uint64(i)))}
		raw := g.message("env", 0)
		if g.r.IntN(4) == 0 {
			raw = append(raw, g.message("env", 0)...)
		}
		if g.r.IntN(3) == 0 {
			raw = g.mutate(raw)
		}
		total++
		if checkSame(t, raw) {
			fast++
		}
	}
	// The generator must reach both sides, or the comparison proves little.
	if fast < total/4 || fast > total*19/20 {
		t.Fatalf("one-pass decoder took %d of %d inputs; the generator is off balance", fast, total)
	}
}

// TestDecodeIndexedTakesDemoEnvelopes: what producers send goes the fast way,
// whole or damaged, and comes out as the full decoder makes it.
func TestDecodeIndexedTakesDemoEnvelopes(t *testing.T) {
	t.Parallel()
	gen := demo.New(demo.Options{Seed: 7, Namespace: "audit"})
	g := wireGen{r: rand.New(rand.NewPCG(7, 7))}
	full, _ := proto.Marshal(fullEnvelope())
	if !checkSame(t, full) {
		t.Fatal("one-pass decoder refused fullEnvelope")
	}
	for range 2000 {
		_, raw := gen.NextBytes("audit.events")
		if !checkSame(t, raw) {
			t.Fatalf("one-pass decoder refused a demo envelope %x", raw)
		}
		checkSame(t, g.mutate(raw))
	}
}

// FuzzDecodeIndexed: for any bytes, Process answers as the full decoder does.
func FuzzDecodeIndexed(f *testing.F) {
	raw, _ := proto.Marshal(fullEnvelope())
	f.Add(raw)
	f.Add([]byte{0x12, 0x00})
	f.Add(append(raw, raw...))
	f.Fuzz(func(t *testing.T, b []byte) { checkSame(t, b) })
}

func BenchmarkProcess(b *testing.B) {
	gen := demo.New(demo.Options{Seed: 1, PayloadSize: 700})
	raws := make([][]byte, 1024)
	for i := range raws {
		_, raws[i] = gen.NextBytes("bench.events")
	}
	b.Run("one-pass", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := Process(raws[i%len(raws)], Strict, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if _, err := reference(raws[i%len(raws)], Strict); err != nil {
				b.Fatal(err)
			}
		}
	})
}
