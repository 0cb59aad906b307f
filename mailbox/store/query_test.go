package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// stored is an item as the brute-force model sees it: with its write order, which breaks timestamp ties.
type stored struct {
	it  *mailboxv1.MailboxItem
	seq int
}

func pick(r *rand.Rand, vals []string) string { return vals[r.Intn(len(vals))] }

var (
	propTopics     = []string{"orders", "payments", "users", ""}
	propPrincipals = []string{"alice", "bob", "carol", "dave", "erin", ""}
	propCorr       = []string{"", "", "c1", "c2", "c3"}
	propTrace      = []string{"", "t1", "t2", "t3", "t4"}
)

// shape is how random data is made: batches of up to batch items (small batches repeat a value a few times,
// big ones tens of times, as ingest's do), with timestamps of a few milliseconds times scale (a scale wider than
// maxBlockSpan splits a batch's values into several posting blocks and makes walks reach back across them),
// and, if group is above 1, up to group batches committed as one write group (as concurrent Writes are), whose
// posting blocks hold a value's items of all its batches.
type shape struct {
	batch int
	scale int64
	group int
}

var smallBatches = shape{batch: 20, scale: 1}

// genItems writes random items with ids starting with prefix in random batches (with redeliveries) and returns
// what the store must hold.
func genItems(t *testing.T, r *rand.Rand, s *Store, prefix string) []stored {
	t.Helper()
	return genShaped(t, r, s, prefix, smallBatches)
}

func genShaped(t *testing.T, r *rand.Rand, s *Store, prefix string, sh shape) []stored {
	t.Helper()
	n := r.Intn(150 * sh.batch / smallBatches.batch)
	var model []stored
	ids := map[string]bool{}
	for len(model) < n {
		batches := make([][]*mailboxv1.MailboxItem, 1)
		if sh.group > 1 {
			batches = make([][]*mailboxv1.MailboxItem, 1+r.Intn(sh.group))
		}
		for b := range batches {
			batch := make([]*mailboxv1.MailboxItem, 1+r.Intn(sh.batch))
			for i := range batch {
				id := fmt.Sprintf("%s-%d", prefix, r.Intn(n+10))
				batch[i] = &mailboxv1.MailboxItem{
					MessageId:     id,
					Timestamp:     (int64(r.Intn(40)) - 5) * sh.scale, // few distinct timestamps: many ties, some negative
					Topic:         pick(r, propTopics),
					Principal:     pick(r, propPrincipals),
					CorrelationId: pick(r, propCorr),
					TraceId:       pick(r, propTrace),
					EnvelopeBlob:  propBlob(r, id),
				}
			}
			batches[b] = batch
		}
		res := writeBatches(t, s, batches)
		// A group stores its batches in queue order, as one batch after the other would.
		for b, batch := range batches {
			var want WriteResult
			for _, it := range batch {
				if ids[it.GetMessageId()] {
					want.Duplicates++
					continue
				}
				ids[it.GetMessageId()] = true
				want.Stored++
				model = append(model, stored{it: it, seq: len(model)})
			}
			if res[b] != want {
				t.Fatalf("write result of batch %d of %d %+v, model says %+v", b, len(batches), res[b], want)
			}
		}
	}
	return model
}

// writeBatches writes one batch by Write, or several as one write group, and returns each batch's result.
func writeBatches(t *testing.T, s *Store, batches [][]*mailboxv1.MailboxItem) []WriteResult {
	t.Helper()
	if len(batches) == 1 {
		res, err := s.Write(context.Background(), batches[0])
		if err != nil {
			t.Fatal(err)
		}
		return []WriteResult{res}
	}
	group := make([]*writeReq, len(batches))
	for b, batch := range batches {
		group[b] = req(s, batch...)
	}
	sendAndWait(s, group...)
	res := make([]WriteResult, len(group))
	for b, r := range group {
		if r.err != nil {
			t.Fatalf("batch %d of a group: %v", b, r.err)
		}
		res[b] = r.res
	}
	return res
}

// propBlob is an envelope for id in each of the stored formats (record.go): too small to compress, compressible
// (stored compressed) and random (not worth compressing, stored as is).
func propBlob(r *rand.Rand, id string) []byte {
	switch r.Intn(3) {
	case 0:
		return []byte(id)
	case 1:
		return []byte(id + strings.Repeat(`{"field":"email","old":"a@example.com"},`, 1+r.Intn(20)))
	default:
		b := make([]byte, 256+r.Intn(512))
		for i := range b {
			b[i] = byte(r.Intn(256))
		}
		return append([]byte(id), b...)
	}
}

func randSubset(r *rand.Rand, vals []string) []string {
	if r.Intn(2) == 0 {
		return nil
	}
	var out []string
	for range 1 + r.Intn(3) {
		out = append(out, pick(r, append(vals, "absent")))
	}
	return out
}

// randTime is a time near the item timestamps, sometimes between two milliseconds.
func randTime(r *rand.Rand, scale int64) *timestamppb.Timestamp {
	t := time.UnixMilli((int64(r.Intn(50)) - 10) * scale)
	if r.Intn(3) == 0 {
		t = t.Add(time.Duration(r.Intn(1_000_000)))
	}
	return timestamppb.New(t)
}

func randFilter(r *rand.Rand, scale int64) *mailboxv1.EventFilter {
	f := &mailboxv1.EventFilter{
		Topics:     randSubset(r, propTopics),
		Principals: randSubset(r, propPrincipals),
	}
	if r.Intn(3) == 0 {
		f.CorrelationId = pick(r, propCorr[2:])
	}
	if r.Intn(3) == 0 {
		f.TraceId = pick(r, propTrace[1:])
	}
	if r.Intn(2) == 0 {
		f.StartTime = randTime(r, scale)
	}
	if r.Intn(2) == 0 {
		f.EndTime = randTime(r, scale)
	}
	if f.StartTime != nil && f.EndTime != nil && !f.StartTime.AsTime().Before(f.EndTime.AsTime()) {
		f.StartTime, f.EndTime = f.EndTime, f.StartTime
		if !f.StartTime.AsTime().Before(f.EndTime.AsTime()) {
			f.EndTime = nil
		}
	}
	switch r.Intn(4) {
	case 0:
		f.Limit = 0
	case 1:
		f.Limit = mesh.MaxQueryLimit + 1 + int32(r.Intn(10))
	default:
		f.Limit = 1 + int32(r.Intn(15))
	}
	return f
}

func contains(vals []string, v string) bool { return len(vals) == 0 || slices.Contains(vals, v) }

// bruteForce is the query semantics spelled out over the whole model.
func bruteForce(model []stored, f *mailboxv1.EventFilter) []*mailboxv1.MailboxItem {
	var out []stored
	for _, s := range model {
		it := s.it
		at := time.UnixMilli(it.GetTimestamp())
		if f.GetStartTime() != nil && at.Before(f.GetStartTime().AsTime()) {
			continue
		}
		if f.GetEndTime() != nil && !at.Before(f.GetEndTime().AsTime()) {
			continue
		}
		if !contains(f.GetTopics(), it.GetTopic()) || !contains(f.GetPrincipals(), it.GetPrincipal()) {
			continue
		}
		if f.GetCorrelationId() != "" && it.GetCorrelationId() != f.GetCorrelationId() {
			continue
		}
		if f.GetTraceId() != "" && it.GetTraceId() != f.GetTraceId() {
			continue
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b stored) int {
		return cmp.Or(cmp.Compare(b.it.GetTimestamp(), a.it.GetTimestamp()), cmp.Compare(b.seq, a.seq))
	})
	items := make([]*mailboxv1.MailboxItem, len(out))
	for i, s := range out {
		items[i] = s.it
	}
	return items
}

func effectiveLimit(l int32) int {
	switch {
	case l == 0:
		return mesh.DefaultQueryLimit
	case l > mesh.MaxQueryLimit:
		return mesh.MaxQueryLimit
	}
	return int(l)
}

// TestQueryMatchesBruteForce compares random filters, paged to the end, with a scan of the same random items.
func TestQueryMatchesBruteForce(t *testing.T) {
	t.Parallel()
	for d := range 40 {
		t.Run(fmt.Sprintf("dataset-%d", d), func(t *testing.T) {
			t.Parallel()
			bruteForceDataset(t, d, smallBatches)
		})
	}
}

// TestQueryMatchesBruteForceBigBatches is the same with ingest-sized batches, each value repeated many times in
// a posting block, and with timestamps spread so wide that a batch's values split into several blocks.
func TestQueryMatchesBruteForceBigBatches(t *testing.T) {
	t.Parallel()
	for d := range 24 {
		sh := shape{batch: 300, scale: 1}
		if d >= 12 {
			sh.scale = maxBlockSpan / 8
		}
		t.Run(fmt.Sprintf("dataset-%d-scale-%d", d, sh.scale), func(t *testing.T) {
			t.Parallel()
			bruteForceDataset(t, d, sh)
		})
	}
}

// TestQueryMatchesBruteForceGroups is the same with batches committed in write groups of up to four, as the
// claims of several partitions commit them: a group's posting blocks merge its batches' items of a value.
func TestQueryMatchesBruteForceGroups(t *testing.T) {
	t.Parallel()
	for d := range 24 {
		sh := shape{batch: smallBatches.batch, scale: 1, group: 4}
		switch {
		case d >= 16:
			sh.batch, sh.scale = 300, maxBlockSpan/8
		case d >= 8:
			sh.batch = 300
		}
		t.Run(fmt.Sprintf("dataset-%d-batch-%d-scale-%d", d, sh.batch, sh.scale), func(t *testing.T) {
			t.Parallel()
			bruteForceDataset(t, d, sh)
		})
	}
}

// bruteForceDataset writes dataset d of shape sh and checks random queries on it against the brute force.
func bruteForceDataset(t *testing.T, d int, sh shape) {
	bruteForceOn(t, openMem(t, Options{MaxAge: time.Millisecond}), d, sh)
}

// bruteForceOn is bruteForceDataset on s, a store with a MaxAge of a millisecond, and returns what s holds.
func bruteForceOn(t *testing.T, s *Store, d int, sh shape) []stored {
	const filters = 150
	r := rand.New(rand.NewSource(int64(d)))
	model := genShaped(t, r, s, "id", sh)
	if d%2 == 1 {
		// Half the datasets have had a retention pass, half of those its sweep too: queries must
		// bound every walk at the floor whether or not the keys below it are gone.
		floor := (int64(r.Intn(40)) - 5) * sh.scale
		if _, err := s.RetainOnce(context.Background(), time.UnixMilli(floor).Add(time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if d%4 == 1 {
			if _, err := s.Sweep(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		model = slices.DeleteFunc(model, func(x stored) bool { return x.it.GetTimestamp() < floor })
		if d%4 == 1 {
			checkPostings(t, s, model, floor)
		}
	}
	checkQueriesScaled(t, r, s, model, filters, sh.scale)
	return model
}

// checkPostings asserts that after a sweep to floor the posting blocks list exactly the positions of the items
// of model (those not below the floor), each once per index it is in.
func checkPostings(t *testing.T, s *Store, model []stored, floor int64) {
	t.Helper()
	want := 0
	for _, x := range model {
		want += 2 // topic and principal, always indexed
		if x.it.GetCorrelationId() != "" {
			want++
		}
		if x.it.GetTraceId() != "" {
			want++
		}
	}
	live := map[pos]bool{}
	for _, k := range rawKeys(t, s)[prefixItem] {
		var p pos
		copy(p[:], k[1:])
		live[p] = p.ts() >= floor
	}
	refs := postingRefs(t, s)
	for _, p := range refs {
		if !live[p] {
			t.Errorf("a posting block lists %x (at %d), no item above the floor %d", p, p.ts(), floor)
		}
	}
	if len(refs) != want {
		t.Errorf("%d positions in posting lists, want %d", len(refs), want)
	}
}

// checkQueries runs n random filters on s, each paged to the end, and compares them with the brute force over
// model.
func checkQueries(t *testing.T, r *rand.Rand, s *Store, model []stored, n int) {
	t.Helper()
	checkQueriesScaled(t, r, s, model, n, 1)
}

// checkQueriesScaled is checkQueries with the filters' times scaled like the items' (shape.scale).
func checkQueriesScaled(t *testing.T, r *rand.Rand, s *Store, model []stored, n int, scale int64) {
	t.Helper()
	for q := range n {
		f := randFilter(r, scale)
		want := bruteForce(model, f)
		limit := effectiveLimit(f.GetLimit())
		var got []*mailboxv1.MailboxItem
		for page := 0; ; page++ {
			if page > len(model)+1 {
				t.Fatalf("filter %d %v: pagination does not end", q, f)
			}
			resp, err := s.Query(context.Background(), f)
			if err != nil {
				t.Fatalf("filter %d %v: %v", q, f, err)
			}
			if len(resp.GetItems()) > limit {
				t.Fatalf("filter %d %v: page of %d items, limit %d", q, f, len(resp.GetItems()), limit)
			}
			if resp.GetNextPageToken() != "" && len(resp.GetItems()) != limit {
				t.Fatalf("filter %d %v: short page %d with a next token", q, f, len(resp.GetItems()))
			}
			got = append(got, resp.GetItems()...)
			if resp.GetNextPageToken() == "" {
				break
			}
			f = proto.CloneOf(f)
			f.PageToken = resp.GetNextPageToken()
		}
		if len(got) != len(want) {
			t.Fatalf("filter %d %v: got %d items, want %d\n got  %v\n want %v", q, f, len(got), len(want), ids(got), ids(want))
		}
		for i := range got {
			if !proto.Equal(got[i], want[i]) {
				t.Fatalf("filter %d %v: item %d is %v, want %v\n got  %v\n want %v", q, f, i, got[i].GetMessageId(), want[i].GetMessageId(), ids(got), ids(want))
			}
		}
	}
}

func ids(items []*mailboxv1.MailboxItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = fmt.Sprintf("%s@%d", it.GetMessageId(), it.GetTimestamp())
	}
	return out
}

func TestQueryRejectsBadFilters(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{})
	mustWrite(t, s, item("a", 1))
	many := make([]string, mesh.MaxFilterValues+1)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	tests := []struct {
		name  string
		f     *mailboxv1.EventFilter
		param string
	}{
		{"negative limit", &mailboxv1.EventFilter{Limit: -1}, "limit"},
		{"start equals end", &mailboxv1.EventFilter{StartTime: timestamppb.New(time.UnixMilli(5)), EndTime: timestamppb.New(time.UnixMilli(5))}, "start_time"},
		{"start after end", &mailboxv1.EventFilter{StartTime: timestamppb.New(time.UnixMilli(6)), EndTime: timestamppb.New(time.UnixMilli(5))}, "start_time"},
		{"invalid end", &mailboxv1.EventFilter{EndTime: &timestamppb.Timestamp{Nanos: -1}}, "end_time"},
		{"token not base64", &mailboxv1.EventFilter{PageToken: "!!!"}, "page_token"},
		{"token wrong length", &mailboxv1.EventFilter{PageToken: "AQID"}, "page_token"},
		{"token wrong version", &mailboxv1.EventFilter{PageToken: "AgAAAAAAAAAAAAAAAAAAAAAA"}, "page_token"},
		{"too many topics", &mailboxv1.EventFilter{Topics: many}, "topics"},
		{"too many principals", &mailboxv1.EventFilter{Principals: many}, "principals"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := s.Query(context.Background(), tc.f)
			if !errors.Is(err, ErrInvalidFilter) {
				t.Fatalf("got %v, want ErrInvalidFilter", err)
			}
			if want := tc.param + ":"; !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name %q", err, tc.param)
			}
		})
	}
}

func TestPageTokenRoundTrip(t *testing.T) {
	t.Parallel()
	for _, p := range []pos{makePos(0, 0), makePos(-1, 7), makePos(1<<62, 1<<63), {}} {
		got, err := decodePageToken(encodePageToken(p))
		if err != nil || got != p {
			t.Errorf("round trip of %x: %x, %v", p, got, err)
		}
	}
}

func FuzzPageToken(f *testing.F) {
	f.Add(encodePageToken(makePos(1700000000000, 42)))
	f.Add("")
	f.Add("AQ")
	f.Add("AgAAAAAAAAAAAAAAAAAAAAAA")
	s, err := Open(Options{InMemory: true})
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Write(context.Background(), []*mailboxv1.MailboxItem{item("a", 1), item("b", 2), item("c", 2)}); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		p, err := decodePageToken(tok)
		if err == nil && encodePageToken(p) != tok {
			t.Fatalf("token %q decodes to %x, which encodes differently", tok, p)
		}
		resp, err := s.Query(context.Background(), &mailboxv1.EventFilter{PageToken: tok, Limit: 1})
		if tok != "" && err != nil && !errors.Is(err, ErrInvalidFilter) {
			t.Fatalf("token %q: error %v is not ErrInvalidFilter", tok, err)
		}
		if err == nil && len(resp.GetItems()) > 1 {
			t.Fatalf("token %q: %d items for limit 1", tok, len(resp.GetItems()))
		}
	})
}

// TestPlannerPicksMostSelectiveIndex pins the planner's choice; the property test proves the answers right,
// this proves they come from an index range rather than a walk of the whole mailbox.
// testBox is the mailbox number of plans made without a store.
var testBox = boxOf(7)

func TestPlannerPicksMostSelectiveIndex(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		f      *mailboxv1.EventFilter
		ranges [][]byte
	}{
		{"correlation id first", &mailboxv1.EventFilter{CorrelationId: "c", TraceId: "t", Principals: []string{"p"}, Topics: []string{"x"}}, [][]byte{indexPrefix(testBox, kindCorrelation, "c")}},
		{"then trace id", &mailboxv1.EventFilter{TraceId: "t", Principals: []string{"p"}, Topics: []string{"x"}}, [][]byte{indexPrefix(testBox, kindTrace, "t")}},
		{"then principals, merged", &mailboxv1.EventFilter{Principals: []string{"q", "p", "q"}, Topics: []string{"x"}}, [][]byte{indexPrefix(testBox, kindPrincipal, "p"), indexPrefix(testBox, kindPrincipal, "q")}},
		{"then topics", &mailboxv1.EventFilter{Topics: []string{"x"}, StartTime: timestamppb.New(time.UnixMilli(1))}, [][]byte{indexPrefix(testBox, kindTopic, "x")}},
		{"time range alone walks the primary order", &mailboxv1.EventFilter{StartTime: timestamppb.New(time.UnixMilli(1))}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pl, err := planQuery(testBox, tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(pl.ranges, tc.ranges, func(a, b []byte) bool { return string(a) == string(b) }) {
				t.Errorf("ranges %q, want %q", pl.ranges, tc.ranges)
			}
		})
	}
}

// TestQueryDuringWrites reads while a writer keeps storing: every page is newest first and holds only items
// that were written, and nothing races (run with -race).
func TestQueryDuringWrites(t *testing.T) {
	t.Parallel()
	s := openMem(t, Options{})
	const batches, per = 50, 40
	done := make(chan error, 1)
	go func() {
		for b := range batches {
			batch := make([]*mailboxv1.MailboxItem, per)
			for i := range batch {
				batch[i] = item(fmt.Sprintf("w-%d-%d", b, i), int64((b*per+i)%97))
			}
			if _, err := s.Write(context.Background(), batch); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for reading := true; reading; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			reading = false
		default:
		}
		resp, err := s.Query(context.Background(), &mailboxv1.EventFilter{Topics: []string{"orders.created"}, Limit: 25})
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(resp.GetItems()); i++ {
			if resp.GetItems()[i].GetTimestamp() > resp.GetItems()[i-1].GetTimestamp() {
				t.Fatalf("page not newest first: %v", ids(resp.GetItems()))
			}
		}
	}
	st, _ := s.Stats(context.Background())
	if st.GetTotalEvents() != batches*per {
		t.Errorf("%d events, want %d", st.GetTotalEvents(), batches*per)
	}
}
