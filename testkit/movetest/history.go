package movetest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/prism-mesh/prism/mesh"
)

// History is what peer recovery must keep (docs/architecture.md#peer-recovery):
// every event a namespace URL answered, it answers again after a move, even
// once Kafka has deleted the records it came from. A HistoryReader walks
// every page of namespaces' events through the gateway, over and over, and
// JudgeHistory checks that no walk lacks an event an earlier walk returned.

// Trim deletes, on every partition of topic, the records before fraction of
// its high watermark (Kafka's DeleteRecords, as retention would), and
// returns each partition's new low watermark.
func (w *World) Trim(topic string, fraction float64) map[int32]int64 {
	w.TB.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(w.Kafka.Brokers...))
	if err != nil {
		w.TB.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	high := w.offsets(ctx, cl, topic, -1)
	del := kmsg.NewPtrDeleteRecordsRequest()
	del.TimeoutMillis = 10_000
	dt := kmsg.NewDeleteRecordsRequestTopic()
	dt.Topic = topic
	for _, p := range slices.Sorted(maps.Keys(high)) {
		dp := kmsg.NewDeleteRecordsRequestTopicPartition()
		dp.Partition, dp.Offset = p, int64(float64(high[p])*fraction)
		dt.Partitions = append(dt.Partitions, dp)
	}
	del.Topics = append(del.Topics, dt)
	resp, err := del.RequestWith(ctx, cl)
	if err != nil {
		w.TB.Fatalf("delete records of %s: %v", topic, err)
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerrOf(p.ErrorCode); err != nil {
				w.TB.Fatalf("delete records of %s/%d: %v", topic, p.Partition, err)
			}
		}
	}
	return w.offsets(ctx, cl, topic, -2)
}

// offsets lists topic's offsets per partition at timestamp ts: -1 the high
// watermarks, -2 the low ones.
func (w *World) offsets(ctx context.Context, cl *kgo.Client, topic string, ts int64) map[int32]int64 {
	w.TB.Helper()
	meta := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, mt)
	m, err := meta.RequestWith(ctx, cl)
	if err != nil || len(m.Topics) != 1 {
		w.TB.Fatalf("metadata of %s: %v", topic, err)
	}
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for _, p := range m.Topics[0].Partitions {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p.Partition, ts
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		w.TB.Fatalf("list offsets of %s: %v", topic, err)
	}
	out := map[int32]int64{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerrOf(p.ErrorCode); err != nil {
				w.TB.Fatalf("list offsets of %s/%d: %v", topic, p.Partition, err)
			}
			out[p.Partition] = p.Offset
		}
	}
	return out
}

func kerrOf(code int16) error {
	if code == 0 {
		return nil
	}
	return fmt.Errorf("kafka error code %d", code)
}

// Walk is one walk of every page of a namespace's events.
type Walk struct {
	NS         string
	Start, End time.Time
	// IDs are the message ids answered over every page.
	IDs map[string]bool
	// Pages are the pages' answers (Events: the events on the page), in
	// order; the last failed when Err is set.
	Pages []Answer
	Err   error
}

// OK reports whether every page was answered.
func (wk Walk) OK() bool { return wk.Err == nil }

// WalkEvents reads every page of ns's events through the gateway's
// namespace URL, size events a page, following next_page_token.
func (w *World) WalkEvents(ns string, size int) Walk {
	wk := Walk{NS: ns, Start: time.Now(), IDs: map[string]bool{}}
	defer func() { wk.End = time.Now() }()
	token := ""
	for range 10_000 {
		u := w.Gateway.HTTPURL() + "/v1/namespaces/" + ns + "/events?limit=" + strconv.Itoa(size)
		if token != "" {
			u += "&page_token=" + url.QueryEscape(token)
		}
		code, body, hdr, err := w.web.Get(u)
		a := Answer{NS: ns, At: time.Now(), Code: code, Err: err}
		if hdr != nil {
			a.Mailbox, a.Epoch = hdr.Get(mesh.HeaderMailbox), hdr.Get(mesh.HeaderEpoch)
		}
		var page struct {
			Items []struct {
				MessageID string `json:"message_id"`
			} `json:"items"`
			NextPageToken string `json:"next_page_token"`
		}
		if err == nil && code == 200 {
			if jerr := json.Unmarshal([]byte(body), &page); jerr != nil {
				a.Err = fmt.Errorf("page: %w", jerr)
			}
		} else if err == nil {
			a.Err = fmt.Errorf("status %d: %.200s", code, body)
		}
		a.Events = int64(len(page.Items))
		wk.Pages = append(wk.Pages, a)
		if a.Err != nil {
			wk.Err = a.Err
			return wk
		}
		for _, it := range page.Items {
			wk.IDs[it.MessageID] = true
		}
		if token = page.NextPageToken; token == "" {
			return wk
		}
	}
	wk.Err = fmt.Errorf("more than 10000 pages")
	return wk
}

// HistoryReader walks namespaces' events until End or its deadline, one
// namespace after the other, pausing between walks; it keeps every walk.
type HistoryReader struct {
	mu    sync.Mutex
	walks []Walk
	stop  chan struct{}
	done  chan struct{}
}

// ReadHistory starts a HistoryReader that stops by itself after limit.
func (w *World) ReadHistory(namespaces []string, size int, pause, limit time.Duration) *HistoryReader {
	r := &HistoryReader{stop: make(chan struct{}), done: make(chan struct{})}
	deadline := time.Now().Add(limit)
	go func() {
		defer close(r.done)
		for k := 0; time.Now().Before(deadline); k++ {
			select {
			case <-r.stop:
				return
			default:
			}
			wk := w.WalkEvents(namespaces[k%len(namespaces)], size)
			r.mu.Lock()
			r.walks = append(r.walks, wk)
			r.mu.Unlock()
			time.Sleep(pause)
		}
	}()
	return r
}

// Walks is every walk so far.
func (r *HistoryReader) Walks() []Walk {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.walks)
}

// End stops the reader and returns its walks in the order they began.
func (r *HistoryReader) End() []Walk {
	close(r.stop)
	<-r.done
	return r.Walks()
}

// HistoryVerdict is what peer recovery promises over a run's walks: no page
// failed, every page names its mailbox and epoch, no namespace's epoch goes
// down, and no walk lacks an event an earlier walk of its namespace
// returned.
type HistoryVerdict struct {
	Walks, Failed, NoMailbox, EpochDown, Lacking int
	// Lost is, per namespace, how many events answered before were missing
	// from its last walk.
	Lost                        map[string]int
	FirstFailures, FirstLacking []string
}

// JudgeHistory reads walks in the order they began.
func JudgeHistory(walks []Walk) HistoryVerdict {
	v := HistoryVerdict{Lost: map[string]int{}}
	seen := map[string]map[string]bool{}
	lastEpoch := map[string]uint64{}
	for _, wk := range walks {
		v.Walks++
		for _, a := range wk.Pages {
			if a.Err != nil || a.Code != 200 {
				continue
			}
			e, err := strconv.ParseUint(a.Epoch, 10, 64)
			if !strings.HasPrefix(a.Mailbox, wk.NS+"@") || err != nil || e == 0 {
				v.NoMailbox++
				continue
			}
			if e < lastEpoch[wk.NS] {
				v.EpochDown++
			}
			lastEpoch[wk.NS] = max(e, lastEpoch[wk.NS])
		}
		if !wk.OK() {
			v.Failed++
			if len(v.FirstFailures) < 5 {
				v.FirstFailures = append(v.FirstFailures, fmt.Sprintf("%s at %s: %v", wk.NS, wk.Start.Format("15:04:05.000"), wk.Err))
			}
			continue
		}
		before := seen[wk.NS]
		if before == nil {
			before = map[string]bool{}
			seen[wk.NS] = before
		}
		missing := 0
		for id := range before {
			if !wk.IDs[id] {
				missing++
			}
		}
		v.Lost[wk.NS] = missing
		if missing > 0 {
			v.Lacking++
			if len(v.FirstLacking) < 5 {
				last := wk.Pages[len(wk.Pages)-1]
				v.FirstLacking = append(v.FirstLacking, fmt.Sprintf("%s at %s: %d of %d events answered before missing (%d answered, from %s epoch %s)",
					wk.NS, wk.Start.Format("15:04:05.000"), missing, len(before), len(wk.IDs), last.Mailbox, last.Epoch))
			}
		}
		for id := range wk.IDs {
			before[id] = true
		}
	}
	return v
}

// Kept reports whether every property held over at least one walk.
func (v HistoryVerdict) Kept() bool {
	return v.Walks > 0 && v.Failed == 0 && v.NoMailbox == 0 && v.EpochDown == 0 && v.Lacking == 0
}

func (v HistoryVerdict) String() string {
	return fmt.Sprintf("%d walks: %d failed, %d pages without mailbox or epoch, epoch down %d times, %d walks lacking events answered before (lost in the last walk: %v); first failures %q; first lacking %q",
		v.Walks, v.Failed, v.NoMailbox, v.EpochDown, v.Lacking, v.Lost, v.FirstFailures, v.FirstLacking)
}

// Stats is ns's /stats answer through the gateway's namespace URL, decoded.
func (w *World) Stats(ns string) (map[string]any, error) {
	code, body, _, err := w.web.Get(w.Gateway.HTTPURL() + "/v1/namespaces/" + ns + "/stats")
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("status %d: %.200s", code, body)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	return st, nil
}
