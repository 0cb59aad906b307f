// Command renewload drives session keepalives at one admin node for the
// overload test (tests/admin_cluster), built without the race detector so
// the load generator is not what limits the rate. With -rate 0 it runs
// closed-loop with -workers callers (the ramp that measures what the
// leader answers); otherwise it sends -rate keepalives a second open-loop,
// whatever the answers: each millisecond it starts as many calls as the
// rate owes since the start (a late tick catches up, it is not lost), on
// enough connections that gRPC's per-connection stream limit never holds a
// call back on the client (-conns is raised to -rate x -timeout / 500),
// with no bound on calls outstanding. Every call is bounded by -timeout and
// the run by -for. It prints its counts as JSON on stdout, with, per
// session, the longest time between the sends of two keepalives that were
// renewed (a sidecar counts its validity from the send): the longest a
// holder went without a renewal it could use.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"
	"github.com/prism-mesh/prism/testkit/loadgen"
)

type result struct {
	Sent     int64            `json:"sent"`
	Renewed  int64            `json:"renewed"`
	Refused  int64            `json:"refused"`
	Errors   map[string]int64 `json:"errors"`
	Seconds  float64          `json:"seconds"`
	Refusals []string         `json:"refusals"`
	// MaxGapMs is the longest, over sessions, between the sends of two
	// renewed keepalives of a session, its start and end included.
	MaxGapMs float64 `json:"max_gap_ms"`
}

func main() {
	addr := flag.String("addr", "", "admin gRPC address (plaintext)")
	sessions := flag.String("sessions", "", "proxy:session_id,...")
	rate := flag.Int("rate", 0, "keepalives a second, open-loop; 0: closed-loop with -workers")
	workers := flag.Int("workers", 256, "closed-loop callers")
	conns := flag.Int("conns", 8, "gRPC connections at least")
	timeout := flag.Duration("timeout", 5*time.Second, "per call")
	dur := flag.Duration("for", 3*time.Second, "run length")
	flag.Parse()
	type sess struct {
		proxy string
		id    uint64
	}
	var ss []sess
	for _, p := range strings.Split(*sessions, ",") {
		proxy, id, _ := strings.Cut(p, ":")
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bad -sessions:", err)
			os.Exit(2)
		}
		ss = append(ss, sess{proxy, n})
	}
	// Every connection takes 1,000 concurrent streams (the admin's
	// default); keep the calls a connection may hold at half that.
	n := max(*conns, int(float64(*rate)*timeout.Seconds()/500)+1)
	var clients []adminv1.SessionsClient
	for range n {
		cc, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer cc.Close()
		clients = append(clients, adminv1.NewSessionsClient(cc))
	}
	var (
		res      = result{Errors: map[string]int64{}}
		mu       sync.Mutex
		sent     atomic.Int64
		next     atomic.Int64
		renewed  atomic.Int64
		refused  atomic.Int64
		start    = time.Now()
		deadline = start.Add(*dur)
		// lastRenewed[i] is the send time of session i's latest renewed
		// keepalive; maxGap[i] the longest between two.
		lastRenewed = make([]time.Time, len(ss))
		maxGap      = make([]time.Duration, len(ss))
	)
	for i := range lastRenewed {
		lastRenewed[i] = start
	}
	call := func() {
		i := next.Add(1)
		si := int(i) % len(ss)
		s := ss[si]
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		defer cancel()
		sent.Add(1)
		at := time.Now()
		r, err := clients[int(i)%len(clients)].KeepAliveSession(ctx, &adminv1.KeepAliveSessionRequest{ProxyId: s.proxy, SessionId: s.id})
		if err == nil && r.GetRenewed() {
			mu.Lock()
			if at.After(lastRenewed[si]) {
				maxGap[si] = max(maxGap[si], at.Sub(lastRenewed[si]))
				lastRenewed[si] = at
			}
			mu.Unlock()
		}
		switch {
		case err != nil:
			mu.Lock()
			res.Errors[status.Code(err).String()]++
			mu.Unlock()
		case r.GetRenewed():
			renewed.Add(1)
		default:
			refused.Add(1)
			mu.Lock()
			if len(res.Refusals) < 20 {
				res.Refusals = append(res.Refusals, fmt.Sprintf("session %d: %v", s.id, r.GetRefusal()))
			}
			mu.Unlock()
		}
	}
	elapsed := loadgen.Run(start, deadline, float64(*rate), *workers, call)
	res.Sent, res.Renewed, res.Refused = sent.Load(), renewed.Load(), refused.Load()
	res.Seconds = elapsed.Seconds()
	for i := range ss {
		gap := max(maxGap[i], deadline.Sub(lastRenewed[i]))
		res.MaxGapMs = max(res.MaxGapMs, float64(gap)/float64(time.Millisecond))
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
}
