package gatewaye2e

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prism-mesh/prism/testkit/e2e"
	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/testwait"
)

// TestRunnerKilledAndRestartedOnItsAddress: a runner is killed (kill -9)
// and started again on the same addresses and data while a client queries
// its mailbox through `prism gateway` every 10 ms. The endpoint does not
// change, so xDS sends nothing: the gateway's own reconnect finds the
// runner. The runner answers the gateway (its mailbox's 200, or its 404
// until its sidecar has it open the mailbox again) within a few hundred
// milliseconds of it listening again, not after grpc-go's default connect
// backoff, which by then has grown past a second.
func TestRunnerKilledAndRestartedOnItsAddress(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an admin node, a runner, a sidecar and a gateway")
	}
	kafka := kafkatest.Start(t, kafkatest.Topics(2, "audit.events"))
	kafka.ProduceEnvelopes(t, "audit.events", kafkatest.Envelopes("audit.events", 5)...)
	cluster := e2e.StartAdmins(t, e2e.AdminOptions{Size: 1})
	createNamespace(cluster, "audit", "audit.events")
	r := e2e.StartRunner(t, e2e.RunnerOptions{Brokers: kafka.Brokers, Args: []string{"--batch-wait", "20ms"}})
	e2e.StartSidecar(t, e2e.SidecarOptions{ProxyID: proxyID, RunnerID: "runner-1", Runner: r, Admins: cluster.GRPCAddrs(), Lease: lease})
	gw := e2e.StartGateway(t, e2e.GatewayOptions{NodeID: "gateway-restart", Admins: cluster.GRPCAddrs(), Timeout: 3 * time.Second})
	served(t, gw, "audit@proxy-1", 5)

	type answer struct {
		end  time.Time
		code int
		body string
	}
	var (
		mu      sync.Mutex
		answers []answer
	)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			code, _, _, body := stats(gw, "audit@proxy-1")
			mu.Lock()
			answers = append(answers, answer{end: time.Now(), code: code, body: body})
			mu.Unlock()
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-done
	}()

	r.Kill()
	killed := time.Now()
	// Started again as soon as a query failed to reach it: faster than its
	// sidecar reports it not ready, so its endpoint stays as it was.
	testwait.For(t, 30*time.Second, "a query failing while the runner is down", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, a := range answers {
			if a.end.After(killed) && a.code == 503 {
				n++
			}
		}
		return n > 0, fmt.Sprint(n, " failed")
	})
	r.Restart()
	var listening time.Time
	testwait.For(t, 30*time.Second, "the runner listening again", func() (bool, string) {
		code, _, _, err := web.Get(r.HTTPURL() + "/healthz")
		listening = time.Now()
		return err == nil && code == 200, fmt.Sprint(code, err)
	})
	answered := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		for _, a := range answers {
			if a.end.After(listening) && a.code != 503 && a.code != 0 {
				return a.end
			}
		}
		return time.Time{}
	}
	testwait.For(t, 30*time.Second, "the runner answering through the gateway", func() (bool, string) { return !answered().IsZero(), "" })
	served(t, gw, "audit@proxy-1", 5)
	close(stop)
	<-done
	failed, total := 0, 0
	for _, a := range answers {
		if a.end.After(killed) && a.end.Before(listening) {
			total++
			if a.code != 200 {
				failed++
			}
		}
	}
	late := answered().Sub(listening)
	t.Logf("runner down %v; answered through the gateway %v after it listened again; %d of %d queries while it was down failed", listening.Sub(killed).Round(time.Millisecond), late.Round(time.Millisecond), failed, total)
	if late > 500*time.Millisecond {
		t.Errorf("the runner back on its address answered through the gateway %v after it listened again, want within 500ms", late)
		for _, a := range answers {
			if a.end.After(killed) && a.code != 200 {
				t.Logf("%v after the kill: %d %s", a.end.Sub(killed).Round(time.Millisecond), a.code, a.body)
			}
		}
	}
}
