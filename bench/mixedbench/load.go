package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/prism-mesh/prism/mesh"
	mailboxv1 "github.com/prism-mesh/prism/proto/prism/mailbox/v1"
)

// door is one way to the mailbox's queries: the runner itself ("direct") or `prism gateway` in front of it
// ("gateway"), each over HTTP/JSON (base is the mailbox's URL) and gRPC.
type door struct {
	name string
	base string
	qc   mailboxv1.MailboxQueryClient
}

// maxInFlight bounds the requests a loop's lane has outstanding, so a stalled
// server slows the loop instead of exhausting file descriptors; latency is
// still counted from when a request was due, so the wait is not hidden.
const maxInFlight = 256

// paced is how well a loop kept its rate: requests due, requests sent (started before their deadline), how many
// of those first waited for one of the maxInFlight slots (the server falling behind), and the delay between due
// and start of those that did not wait (this process's own lag: timers and goroutines waiting for a core).
type paced struct {
	due, sent, slotWaits int
	lag                  []time.Duration
}

func (p *paced) String() string {
	slices.Sort(p.lag)
	s := fmt.Sprintf("%d due, %d sent", p.due, p.sent)
	if len(p.lag) > 0 {
		s += fmt.Sprintf(" (start after due: p99 %.2f ms, max %.1f ms)", ms(p.lag[len(p.lag)*99/100]), ms(p.lag[len(p.lag)-1]))
	}
	if p.slotWaits > 0 {
		s += fmt.Sprintf(", %d waited for one of their lane's %d in-flight slots", p.slotWaits, maxInFlight)
	}
	return s
}

// warnings say how a loop that meant to send want requests fell short of its rate, if it did by more than 1 %:
// too few fell due (this process's pacing loop starved), the servers held every slot, or this process started
// requests late on its own (a p99 start lag over 5 ms).
func (p *paced) warnings(want int) []string {
	var w []string
	if p.due < want*99/100 {
		w = append(w, fmt.Sprintf("only %d of the %d requests meant fell due: this process's pacing could not keep the rate", p.due, want))
	}
	if behind := p.due - p.sent + p.slotWaits; behind > p.due/100 {
		w = append(w, fmt.Sprintf("the servers fell behind: %d of %d requests waited for one of their lane's %d in-flight slots, %d of them past their timeout (not sent)",
			behind, p.due, maxInFlight, p.due-p.sent))
	}
	if len(p.lag) > 0 {
		slices.Sort(p.lag)
		if l := p.lag[len(p.lag)*99/100]; l > 5*time.Millisecond {
			w = append(w, fmt.Sprintf("this process started requests late without waiting for a slot (p99 %.1f ms after due): it lacked a core", ms(l)))
		}
	}
	return w
}

// pace calls fn rate times a second, each call in its own goroutine, with its sequence number, the time it
// was due and a context that ends timeout after that, until ctx ends (or, when limit > 0, limit calls were
// due); then it waits for the calls it started. An open loop: a slow answer does not slow the arrivals, as
// with independent clients. Calls whose numbers are equal modulo lanes share maxInFlight slots (a lane per
// door: the gateway's clients do not queue behind the runner's). A call that found no free slot before its
// deadline still gets fn, with the context already ended, so its failure is counted where the others are.
func pace(ctx context.Context, rate float64, lanes, limit int, timeout time.Duration, fn func(ctx context.Context, i int, due time.Time)) *paced {
	p := &paced{}
	if rate <= 0 {
		return p
	}
	var mu sync.Mutex
	slots := make([]chan struct{}, max(lanes, 1))
	for k := range slots {
		slots[k] = make(chan struct{}, maxInFlight)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	interval := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	for i := 0; limit <= 0 || i < limit; i++ {
		next = next.Add(interval)
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return p
		case <-t.C:
		}
		wg.Add(1)
		p.due++
		go func(i int, due time.Time) {
			defer wg.Done()
			rctx, cancel := context.WithDeadline(context.Background(), due.Add(timeout))
			defer cancel()
			lane := slots[i%len(slots)]
			waited, sent := false, true
			select {
			case lane <- struct{}{}:
			default:
				waited = true
				select {
				case lane <- struct{}{}:
				case <-rctx.Done():
					sent = false
				}
			}
			mu.Lock()
			switch {
			case !sent:
			case waited:
				p.sent++
				p.slotWaits++
			default:
				p.sent++
				p.lag = append(p.lag, time.Since(due))
			}
			mu.Unlock()
			if sent {
				defer func() { <-lane }()
			}
			fn(rctx, i, due)
		}(i, next)
	}
	return p
}

// latencies are one loop's answers: how long after due each came, and the requests that failed. A request
// that timed out counts at the time it gave up (at least the timeout), so a loop the server could not keep up
// with shows it in its percentiles.
type latencies struct {
	mu             sync.Mutex
	d              []time.Duration
	errs, timeouts int
}

func (l *latencies) record(d time.Duration, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded:
		l.timeouts++
		l.d = append(l.d, d)
	case err != nil:
		l.errs++
		if l.errs <= 3 {
			fmt.Fprintln(os.Stderr, "# request failed:", err)
		}
	default:
		l.d = append(l.d, d)
	}
}

func (l *latencies) quantile(p float64) float64 {
	if len(l.d) == 0 {
		return math.NaN()
	}
	return ms(l.d[min(len(l.d)-1, int(p*float64(len(l.d))))])
}

// report prints name's p99 as a BENCH line (name has a %s for the percentile) and a note with the rest.
func (l *latencies) report(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	slices.Sort(l.d)
	timeouts := ""
	if l.timeouts > 0 {
		timeouts = fmt.Sprintf(" (%d of them timed out, counted at their timeout)", l.timeouts)
	}
	fmt.Fprintf(os.Stderr, "# %s: %d answered%s, %d failed, p50 %.2f ms, max %.1f ms\n", fmt.Sprintf(name, "*"), len(l.d), timeouts, l.errs, l.quantile(0.5), l.quantile(1))
	fmt.Printf("BENCH "+name+" %.2f ms\n", "99", l.quantile(0.99))
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// split is a loop's latencies in all and by door.
type split struct {
	all    latencies
	byDoor map[string]*latencies
}

func newSplit(doors []door) *split {
	s := &split{byDoor: map[string]*latencies{}}
	for _, d := range doors {
		s.byDoor[d.name] = &latencies{}
	}
	return s
}

// time runs fn, a request due at due through door d, and records how long after due it answered.
func (s *split) time(d door, due time.Time, fn func() error) {
	err := fn()
	took := time.Since(due)
	s.all.record(took, err)
	s.byDoor[d.name].record(took, err)
}

// report prints the whole under name and, when there is more than one door, each door's under name_<door>.
func (s *split) report(name string, doors []door) {
	s.all.report(name)
	if len(doors) < 2 {
		return
	}
	for _, d := range doors {
		s.byDoor[d.name].report(name + "_" + d.name)
	}
}

// idPool keeps ids seen in answers, so id lookups ask for what exists.
type idPool struct {
	mu                  sync.Mutex
	msg, corr, trace, p []string
}

// idKeys are the fields an answer's items carry the ids in, as the query API writes them, in idPool.pick's
// order.
var idKeys = [][]byte{[]byte(`"message_id":"`), []byte(`"correlation_id":"`), []byte(`"trace_id":"`), []byte(`"principal":"`)}

// harvest keeps one item's ids from a JSON answer, found by their keys from a random point of the body:
// decoding whole pages would cost this process more CPU than the runner spends answering them.
func (p *idPool) harvest(body []byte) {
	if len(body) == 0 {
		return
	}
	from := rand.IntN(len(body)/2 + 1)
	var found [4]string
	for k, key := range idKeys {
		i := bytes.Index(body[from:], key)
		if i < 0 {
			i = bytes.Index(body, key)
		} else {
			i += from
		}
		if i < 0 {
			continue
		}
		v := body[i+len(key):]
		end := bytes.IndexByte(v, '"')
		if end <= 0 || bytes.IndexByte(v[:end], '\\') >= 0 {
			continue
		}
		found[k] = string(v[:end])
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, s := range []*[]string{&p.msg, &p.corr, &p.trace, &p.p} {
		v := found[k]
		switch {
		case v == "":
		case len(*s) < 256:
			*s = append(*s, v)
		default:
			(*s)[rand.IntN(len(*s))] = v
		}
	}
}

func (p *idPool) pick(kind int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := [][]string{p.msg, p.corr, p.trace, p.p}[kind]
	if len(s) == 0 {
		return ""
	}
	return s[rand.IntN(len(s))]
}

// itemsKey appears once per item of a JSON answer (the envelope's own JSON has no such field): the answer's
// item count without decoding it.
var itemsKey = []byte(`"envelope_blob":`)

// httpQuery sends one of the realistic queries: the latest page, latest by
// topic, a time window, by principal, correlation id, trace id, or one event
// by id. Pages are of 100. It checks the answer's status and that an event
// asked for by id came back.
func httpQuery(ctx context.Context, cl *http.Client, base string, pool *idPool) error {
	q := url.Values{"limit": {"100"}}
	path := "/events"
	byID := false
	switch k := rand.IntN(7); k {
	case 0:
	case 1:
		q.Set("topic", topic)
	case 2:
		now := time.Now()
		q.Set("start", fmt.Sprint(now.Add(-2*time.Second).UnixMilli()))
		q.Set("end", fmt.Sprint(now.UnixMilli()))
	default:
		v := pool.pick(k - 3)
		if v == "" {
			break
		}
		switch k {
		case 3:
			path, byID = "/events/"+url.PathEscape(v), true
		case 4:
			q.Set("correlation_id", v)
		case 5:
			q.Set("trace_id", v)
		case 6:
			q.Set("principal", v)
		}
	}
	return fetch(ctx, cl, base+path+"?"+q.Encode(), func(body []byte) error {
		if byID && bytes.Count(body, itemsKey) != 1 {
			return fmt.Errorf("GET %s: no item in the answer", path)
		}
		pool.harvest(body)
		return nil
	})
}

func grpcQuery(ctx context.Context, qc mailboxv1.MailboxQueryClient, mailbox string, pool *idPool) error {
	ctx = metadata.AppendToOutgoingContext(ctx, mesh.HeaderMailboxID, mailbox)
	f := &mailboxv1.EventFilter{Limit: 100}
	switch k := rand.IntN(7); k {
	case 0:
	case 1:
		f.Topics = []string{topic}
	case 2:
		now := time.Now()
		f.StartTime, f.EndTime = timestamppb.New(now.Add(-2*time.Second)), timestamppb.New(now)
	default:
		v := pool.pick(k - 3)
		switch {
		case v == "":
		case k == 3:
			_, err := qc.GetEvent(ctx, &mailboxv1.GetEventRequest{MessageId: v})
			return err
		case k == 4:
			f.CorrelationId = v
		case k == 5:
			f.TraceId = v
		case k == 6:
			f.Principals = []string{v}
		}
	}
	_, err := qc.QueryEvents(ctx, &mailboxv1.QueryEventsRequest{Filter: f})
	return err
}

// httpAnswers and httpBytes count the HTTP answers read and their bytes.
var httpAnswers, httpBytes atomic.Int64

// bodies holds answer buffers between requests.
var bodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// fetch GETs u and hands check the body of a 200 answer (valid only during the call; nil check just reads it).
func fetch(ctx context.Context, cl *http.Client, u string, check func(body []byte) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %s: %s", u, resp.Status, strings.TrimSpace(string(b)))
	}
	buf := bodies.Get().(*bytes.Buffer)
	defer bodies.Put(buf)
	buf.Reset()
	n, err := buf.ReadFrom(resp.Body)
	if err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	httpAnswers.Add(1)
	httpBytes.Add(n)
	if check == nil {
		return nil
	}
	return check(buf.Bytes())
}
