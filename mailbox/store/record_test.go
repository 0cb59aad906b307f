package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	badger "github.com/dgraph-io/badger/v4"
	"github.com/klauspost/compress/s2"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/proto"
)

// TestStoreRecordFormats: a record is stored compressed only when it is big enough and compresses, and every
// format reads back as the record, with its blob length known without decompressing.
func TestStoreRecordFormats(t *testing.T) {
	t.Parallel()
	random := make([]byte, 1000)
	fillRandom(random, 1)
	tests := []struct {
		name string
		blob []byte
		want byte
	}{
		{"small", []byte("tiny"), formatPlain},
		{"json", []byte(strings.Repeat(`{"field":"email","old":"a@example.com","new":"b@example.com"},`, 15)), formatS2},
		{"encrypted", random, formatPlain},
	}
	var sample []*mailboxv1.MailboxItem
	for i := range 20 {
		it := item(fmt.Sprint("m-", i), int64(i))
		it.EnvelopeBlob = tests[1].blob
		sample = append(sample, it)
	}
	dict := makeDict(sample)
	if dict == nil || makeDict(sample[:1]) != nil {
		t.Fatal("makeDict: no dictionary from 20 records, or one from a single one")
	}
	tests = append(tests, struct {
		name string
		blob []byte
		want byte
	}{"json with dictionary", tests[1].blob, formatS2Dict})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var d *s2.Dict
			if tc.want == formatS2Dict {
				d = dict
			}
			it := item("m-1", 7)
			it.EnvelopeBlob = tc.blob
			rec := encodeRecord(it)
			v, format := storeRecord(nil, rec, len(tc.blob), d)
			if format != tc.want {
				t.Fatalf("format %d, want %d", format, tc.want)
			}
			if format == formatS2 && len(v) > len(rec)/2 {
				t.Errorf("compressed %d bytes to %d", len(rec), len(v))
			}
			var buf []byte
			got, err := itemValue{v, format, d}.record(&buf)
			if err != nil || !bytes.Equal(got, rec) {
				t.Fatalf("record() = %x, %v; want %x", got, err, rec)
			}
			if n, err := (itemValue{v, format, d}).blobLen(); err != nil || n != len(tc.blob) {
				t.Errorf("blobLen() = %d, %v; want %d", n, err, len(tc.blob))
			}
			if d != nil {
				if _, err := (itemValue{v, format, nil}).record(&buf); !errors.Is(err, errCorruptRecord) {
					t.Errorf("record() without the dictionary: %v, want errCorruptRecord", err)
				}
			}
		})
	}
	var buf []byte
	for _, v := range []itemValue{{[]byte{0x80}, formatS2, nil}, {[]byte{3, 1, 2}, formatS2, nil}, {[]byte{1}, 9, nil}} {
		if _, err := v.record(&buf); !errors.Is(err, errCorruptRecord) {
			t.Errorf("record() of %v: %v, want errCorruptRecord", v, err)
		}
		if _, err := v.blobLen(); !errors.Is(err, errCorruptRecord) {
			t.Errorf("blobLen() of %v: %v, want errCorruptRecord", v, err)
		}
	}
}

// formats counts the primary keys of s by value format.
func formats(t *testing.T, s *Store) map[byte]int {
	t.Helper()
	out := map[byte]int{}
	err := s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: s.box.itemPrefix()})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			out[it.Item().UserMeta()]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestStoreWrittenBeforeCompression: a store whose records were all written uncompressed, as every store was
// before compression, opens and answers exactly as before, takes compressed records beside them, and counts
// both kinds right through retention and its sweep.
func TestStoreWrittenBeforeCompression(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewSource(18))
	dir := filepath.Join(t.TempDir(), "mbox")
	old := openDir(t, dir, Options{plainRecords: true})
	var model []stored
	for i := 0; len(model) < 50; i++ {
		model = appendModel(model, genItems(t, r, old, fmt.Sprint("old", i)))
	}
	if f := formats(t, old); f[formatS2] != 0 || f[formatPlain] != len(model) {
		t.Fatalf("the old path wrote formats %v, want %d plain records", f, len(model))
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	s := openDir(t, dir, Options{MaxAge: time.Millisecond})
	defer func() { s.Close() }()
	checkQueries(t, r, s, model, 100)
	for _, m := range model {
		got, err := s.Get(context.Background(), m.it.GetMessageId())
		if err != nil || !proto.Equal(got, m.it) {
			t.Fatalf("Get(%s) = %v, %v; want %v", m.it.GetMessageId(), got, err, m.it)
		}
	}
	for i := 0; len(model) < 150; i++ {
		model = appendModel(model, genItems(t, r, s, fmt.Sprint("new", i)))
	}
	if f := formats(t, s); f[formatS2Dict] == 0 || f[formatPlain] <= len(model)/2 {
		t.Fatalf("formats %v after new writes, want the old plain ones and new ones compressed with the dictionary", f)
	}
	checkQueries(t, r, s, model, 100)
	st, err := s.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := blobBytes(model); st.GetTotalEvents() != int64(len(model)) || st.GetTotalBytes() != want {
		t.Fatalf("stats %d events, %d bytes; want %d, %d", st.GetTotalEvents(), st.GetTotalBytes(), len(model), want)
	}

	const floor = 17
	res, err := s.RetainOnce(context.Background(), time.UnixMilli(floor).Add(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	gone := slices.DeleteFunc(slices.Clone(model), func(x stored) bool { return x.it.GetTimestamp() >= floor })
	if res.Deleted != len(gone) || res.DeletedBytes != blobBytes(gone) {
		t.Fatalf("retention deleted %+v, want %d items of %d bytes", res, len(gone), blobBytes(gone))
	}
	if n, err := s.Sweep(context.Background()); err != nil || n != len(gone) {
		t.Fatalf("sweep removed %d, %v; want %d", n, err, len(gone))
	}
	model = slices.DeleteFunc(model, func(x stored) bool { return x.it.GetTimestamp() < floor })
	checkQueries(t, r, s, model, 100)
	// The dictionary is read back on open.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openDir(t, dir, Options{MaxAge: time.Millisecond})
	if s.dict.Load() == nil {
		t.Fatal("no dictionary after reopening")
	}
	checkQueries(t, r, s, model, 100)
}

// appendModel appends the items written after model's.
func appendModel(model, more []stored) []stored {
	for _, m := range more {
		model = append(model, stored{it: m.it, seq: len(model)})
	}
	return model
}

func blobBytes(model []stored) int64 {
	var n int64
	for _, m := range model {
		n += int64(len(m.it.GetEnvelopeBlob()))
	}
	return n
}
