// Command renewload drives session keepalives at one admin node for the
// overload test (tests/admin_cluster), built without the race detector so
// the load generator is not what limits the rate. With -rate 0 it runs
// closed-loop with -workers callers (the ramp that measures what the
// leader answers); otherwise it sends -rate keepalives a second open-loop,
// whatever the answers, at most -inflight outstanding (a send that finds
// them all taken is counted as skipped, not sent). Every call is bounded by
// -timeout and the run by -for. It prints its counts as JSON on stdout.
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
)

type result struct {
	Sent     int64            `json:"sent"`
	Skipped  int64            `json:"skipped"`
	Renewed  int64            `json:"renewed"`
	Refused  int64            `json:"refused"`
	Errors   map[string]int64 `json:"errors"`
	Seconds  float64          `json:"seconds"`
	Refusals []string         `json:"refusals"`
}

func main() {
	addr := flag.String("addr", "", "admin gRPC address (plaintext)")
	sessions := flag.String("sessions", "", "proxy:session_id,...")
	rate := flag.Int("rate", 0, "keepalives a second, open-loop; 0: closed-loop with -workers")
	workers := flag.Int("workers", 256, "closed-loop callers")
	inflight := flag.Int("inflight", 20000, "open-loop outstanding calls at most")
	conns := flag.Int("conns", 8, "gRPC connections")
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
	var clients []adminv1.SessionsClient
	for range *conns {
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
		skipped  atomic.Int64
		wg       sync.WaitGroup
		deadline = time.Now().Add(*dur)
	)
	call := func() {
		i := next.Add(1)
		s := ss[int(i)%len(ss)]
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		defer cancel()
		sent.Add(1)
		r, err := clients[int(i)%len(clients)].KeepAliveSession(ctx, &adminv1.KeepAliveSessionRequest{ProxyId: s.proxy, SessionId: s.id})
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
	start := time.Now()
	if *rate == 0 {
		for range *workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					call()
				}
			}()
		}
		wg.Wait()
	} else {
		slots := make(chan struct{}, *inflight)
		tick := time.NewTicker(time.Millisecond)
		per := float64(*rate) / 1000
		var owed float64
		for now := range tick.C {
			if now.After(deadline) {
				break
			}
			owed += per
			for ; owed >= 1; owed-- {
				select {
				case slots <- struct{}{}:
					wg.Add(1)
					go func() {
						defer wg.Done()
						defer func() { <-slots }()
						call()
					}()
				default:
					skipped.Add(1)
				}
			}
		}
		tick.Stop()
	}
	elapsed := time.Since(start)
	wg.Wait()
	res.Sent, res.Renewed, res.Refused, res.Skipped = sent.Load(), renewed.Load(), refused.Load(), skipped.Load()
	res.Seconds = elapsed.Seconds()
	_ = json.NewEncoder(os.Stdout).Encode(res)
}
