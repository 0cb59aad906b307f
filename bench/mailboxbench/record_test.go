package main

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/envelope/demo"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/proto"

	"github.com/prism-mesh/prism/bench/internal/payload"
)

// BenchmarkRecordEncoding compares what the store could compress an item's record with (issue 16: CPU per event;
// issue 18: bytes on disk), over this bench's items with JSON and random payloads and ingestbench's demo envelopes
// (random payloads, a third marked encrypted):
//
//	go -C bench test -run '^$' -bench RecordEncoding ./mailboxbench
//
// A record is what mailbox/store stores for an item (store.appendRecord: uvarint(len(hdr)) hdr blob, hdr being
// the item without its blob as proto.Marshal writes it). The dictionary is made from the first 32 KiB of records,
// as the store makes its own; the records measured come after them. B/rec is what would be stored, with the
// store's rule that a record saving less than a sixteenth stays plain; decode is the read side's cost.
func BenchmarkRecordEncoding(b *testing.B) {
	for _, s := range recordSets(b) {
		for _, c := range recordCodecs(b, s.dict) {
			var raw, stored int
			enc := make([][]byte, len(s.recs))
			dst := make([]byte, 0, 8<<10)
			for i, r := range s.recs {
				v := c.enc(dst, s.items[i], r)
				if len(v) > len(r)-len(r)/16 {
					v = r
				} else if got, err := c.dec(nil, v); err != nil || !bytes.Equal(got, r) {
					b.Fatalf("%s/%s: record %d does not decode: %v", s.name, c.name, i, err)
				}
				raw, stored = raw+len(r), stored+len(v)
				enc[i] = bytes.Clone(v)
			}
			b.Run(s.name+"/"+c.name, func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					j := i % len(s.recs)
					c.enc(dst, s.items[j], s.recs[j])
				}
				b.ReportMetric(float64(stored)/float64(len(s.recs)), "B/rec")
				b.ReportMetric(float64(raw)/float64(len(s.recs)), "plainB/rec")
			})
			b.Run(s.name+"/"+c.name+"/decode", func(b *testing.B) {
				out := make([]byte, 0, 8<<10)
				for i := 0; b.Loop(); i++ {
					if v := enc[i%len(enc)]; len(v) != len(s.recs[i%len(enc)]) {
						if _, err := c.dec(out, v); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}

type recordSet struct {
	name  string
	items []*mailboxv1.MailboxItem
	recs  [][]byte
	dict  []byte // the first 32 KiB of records, not among recs
}

func recordSets(b *testing.B) []recordSet {
	const n, sample = 2000, 32 << 10
	mk := func(name string, next func() *mailboxv1.MailboxItem) recordSet {
		s := recordSet{name: name}
		for len(s.dict) < sample {
			s.dict = append(s.dict, record(b, next())...)
		}
		for range n {
			it := next()
			s.items, s.recs = append(s.items, it), append(s.recs, record(b, it))
		}
		return s
	}
	var sets []recordSet
	defer func(k payload.Kind) { payloadKind = k }(payloadKind)
	for _, k := range []payload.Kind{payload.JSON, payload.Random} {
		payloadKind = k
		i := 0
		sets = append(sets, mk("mailboxbench-"+string(k), func() *mailboxv1.MailboxItem { i++; return itemOf(i) }))
	}
	// ingestbench's envelopes: demo's, padded to about 1 KiB.
	_, probe := demo.New(demo.Options{PayloadSize: 1}).NextBytes("orders")
	gen := demo.New(demo.Options{Seed: 1, IDPrefix: "bench", PayloadSize: 1024 - len(probe)})
	return append(sets, mk("ingestbench-demo", func() *mailboxv1.MailboxItem {
		env := gen.Next("orders")
		raw, err := proto.Marshal(env)
		if err != nil {
			b.Fatal(err)
		}
		it, err := envelope.ExtractMailboxItem(env, raw)
		if err != nil {
			b.Fatal(err)
		}
		return it
	}))
}

// record is the store's record of it.
func record(b *testing.B, it *mailboxv1.MailboxItem) []byte {
	h := proto.CloneOf(it)
	h.EnvelopeBlob = nil
	hdr, err := proto.MarshalOptions{Deterministic: true}.Marshal(h)
	if err != nil {
		b.Fatal(err)
	}
	return append(append(binary.AppendUvarint(nil, uint64(len(hdr))), hdr...), it.GetEnvelopeBlob()...)
}

type recordCodec struct {
	name string
	enc  func(dst []byte, it *mailboxv1.MailboxItem, rec []byte) []byte
	dec  func(dst, v []byte) ([]byte, error)
}

func recordCodecs(b *testing.B, sample []byte) []recordCodec {
	d := s2.MakeDict(sample, nil)
	zenc := func(opts ...zstd.EOption) *zstd.Encoder {
		e, err := zstd.NewWriter(nil, append(opts, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1),
			zstd.WithEncoderCRC(false))...)
		if err != nil {
			b.Fatal(err)
		}
		return e
	}
	zdec := func(opts ...zstd.DOption) func(dst, v []byte) ([]byte, error) {
		r, err := zstd.NewReader(nil, append(opts, zstd.WithDecoderConcurrency(1))...)
		if err != nil {
			b.Fatal(err)
		}
		return func(dst, v []byte) ([]byte, error) { return r.DecodeAll(v, dst[:0]) }
	}
	zd, z := zenc(zstd.WithEncoderDictRaw(1, sample)), zenc()
	return []recordCodec{
		{"dict.Encode", func(dst []byte, _ *mailboxv1.MailboxItem, r []byte) []byte { return d.Encode(dst, r) }, d.Decode},
		{"dict.EncodeBetter", func(dst []byte, _ *mailboxv1.MailboxItem, r []byte) []byte { return d.EncodeBetter(dst, r) }, d.Decode},
		{"s2.Encode", func(dst []byte, _ *mailboxv1.MailboxItem, r []byte) []byte { return s2.Encode(dst, r) }, s2.Decode},
		{"s2.EncodeBetter", func(dst []byte, _ *mailboxv1.MailboxItem, r []byte) []byte { return s2.EncodeBetter(dst, r) }, s2.Decode},
		{"zstd-fastest-dict", func(dst []byte, _ *mailboxv1.MailboxItem, r []byte) []byte { return zd.EncodeAll(r, dst[:0]) }, zdec(zstd.WithDecoderDictRaw(1, sample))},
		{"zstd-fastest", func(dst []byte, _ *mailboxv1.MailboxItem, r []byte) []byte { return z.EncodeAll(r, dst[:0]) }, zdec()},
		// Items marked encrypted through s2's assembly encoder, the rest against the dictionary: the cheap probe.
		{"encrypted-s2.Encode", func(dst []byte, it *mailboxv1.MailboxItem, r []byte) []byte {
			if it.GetEncryption() != "" {
				return append(append(dst[:0], 0), s2.Encode(dst[1:cap(dst)], r)...)
			}
			return append(append(dst[:0], 1), d.Encode(dst[1:cap(dst)], r)...)
		}, func(dst, v []byte) ([]byte, error) {
			if v[0] == 0 {
				return s2.Decode(dst, v[1:])
			}
			return d.Decode(dst, v[1:])
		}},
	}
}
