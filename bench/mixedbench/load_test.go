package main

import (
	"bytes"
	"context"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mailbox/envelope"
	"github.com/prism-mesh/prism/mailbox/envelope/demo"
	"github.com/prism-mesh/prism/mailbox/query/httpapi"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// The load generator reads answers by keys, not by decoding them: the keys must be where the query API writes
// them, one item key per item, and the ids taken must be the items' own.
func TestAnswersReadByKeys(t *testing.T) {
	t.Parallel()
	gen := demo.New(demo.Options{Seed: 1, IDPrefix: "t", PayloadSize: 200})
	var items []*mailboxv1.MailboxItem
	for range 20 {
		env := gen.Next(topic)
		it, err := envelope.ExtractMailboxItem(env, nil)
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, it)
	}
	for _, tc := range []struct {
		name  string
		write func(*httptest.ResponseRecorder)
		items []*mailboxv1.MailboxItem
	}{
		{"page", func(w *httptest.ResponseRecorder) {
			httpapi.WriteEvents(w, mailboxID, &mailboxv1.QueryEventsResponse{Items: items, NextPageToken: "next"})
		}, items},
		{"one event", func(w *httptest.ResponseRecorder) { httpapi.WriteEvent(w, mailboxID, items[3]) }, items[3:4]},
		{"empty page", func(w *httptest.ResponseRecorder) {
			httpapi.WriteEvents(w, mailboxID, &mailboxv1.QueryEventsResponse{})
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := httptest.NewRecorder()
			tc.write(w)
			body := w.Body.Bytes()
			if n := bytes.Count(body, itemsKey); n != len(tc.items) {
				t.Fatalf("%d item keys in the answer, want %d", n, len(tc.items))
			}
			var pool idPool
			for range 50 {
				pool.harvest(body)
			}
			for k, got := range [][]string{pool.msg, pool.corr, pool.trace, pool.p} {
				var want []string
				for _, it := range tc.items {
					want = append(want, [...]string{it.GetMessageId(), it.GetCorrelationId(), it.GetTraceId(), it.GetPrincipal()}[k])
				}
				if len(tc.items) > 0 && len(got) == 0 {
					t.Errorf("%s: no id taken", idKeys[k])
				}
				for _, v := range got {
					if !slices.Contains(want, v) {
						t.Errorf("%s: took %q, not an item's (%q)", idKeys[k], v, want)
					}
				}
			}
		})
	}
}

func TestPaceSendsWhatFallsDue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		lanes      int
		limit      int
		hold       time.Duration // how long each call takes
		timeout    time.Duration
		wantSent   int
		wantBehind bool
	}{
		{"quick answers", 1, 200, 0, time.Minute, 200, false},
		// Every call outlives the loop and every deadline, so all but the first maxInFlight of a lane wait for a
		// slot and give up.
		{"stalled server", 1, maxInFlight + 50, time.Second, 100 * time.Millisecond, maxInFlight, true},
		{"stalled server, two lanes", 2, 2*maxInFlight + 50, time.Second, 100 * time.Millisecond, 2 * maxInFlight, true},
		{"two lanes, room in each", 2, 2 * maxInFlight, time.Second, 100 * time.Millisecond, 2 * maxInFlight, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls, expired atomic.Int64
			p := pace(context.Background(), 2000, tc.lanes, tc.limit, tc.timeout, func(ctx context.Context, _ int, _ time.Time) {
				calls.Add(1)
				if ctx.Err() != nil {
					expired.Add(1)
					return
				}
				time.Sleep(tc.hold) // a server that ignores the deadline, so the slot stays taken
			})
			if p.due != tc.limit || int(calls.Load()) != tc.limit {
				t.Errorf("%d due, %d calls, want %d of each", p.due, calls.Load(), tc.limit)
			}
			if p.sent != tc.wantSent || int(expired.Load()) != tc.limit-tc.wantSent {
				t.Errorf("%d sent, %d called past their deadline, want %d and %d", p.sent, expired.Load(), tc.wantSent, tc.limit-tc.wantSent)
			}
			w := p.warnings(tc.limit)
			if behind := slices.ContainsFunc(w, func(s string) bool { return strings.Contains(s, "servers fell behind") }); behind != tc.wantBehind {
				t.Errorf("warnings %q; want one that the servers fell behind: %v", w, tc.wantBehind)
			}
		})
	}
}
