package movesbench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/prism-mesh/prism/mesh"
	adminv1 "github.com/prism-mesh/prism/proto/prism/admin/v1"

	"github.com/prism-mesh/prism/testkit/kafkatest"
	"github.com/prism-mesh/prism/testkit/movetest"
	"github.com/prism-mesh/prism/testkit/testbin"
	"github.com/prism-mesh/prism/testkit/testwait"
)

var (
	rollingNamespaces = flag.Int("rolling-namespaces", 9, "namespaces read during the rolling restart, one reader each")
	produceRate       = flag.Int("produce-rate", 50, "events/s produced to the namespaces' topic during the rolling restart (0: a quiet topic)")
	catchupEvents     = flag.Int("catchup-events", 1_000_000, "events in the namespace moved for moves.catchup_s_<n>")
	drainNamespaces   = flag.Int("drain-namespaces", 100, "namespaces on the drained proxy for moves.drain_s_<n>ns")
)

// note prints a line for the reader of the run, not for the figures.
func note(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "movesbench: "+format+"\n", args...)
}

// BenchmarkRollingRestart restarts three runners one by one in the
// kubelet's order, as tests/moves' TestRollingRestartWithoutAFailedQuery
// does: the runner container's preStop hook (`prism sidecar drain-wait`)
// hands its proxy's namespaces off, the runner gets SIGTERM, then its
// native sidecar; both come back and rebalancing hands the namespaces
// back. One reader per namespace queries it through the gateway in a
// tight loop while the topic flows. Figures: the failed queries and the
// p99 over every handoff of its longest gap between two successful
// answers of its namespace.
func BenchmarkRollingRestart(b *testing.B) {
	for range b.N {
		ids := []string{"proxy-1", "proxy-2", "proxy-3"}
		w := newWorld(b)
		for _, id := range ids {
			w.StartProxy(id)
		}
		w.AwaitProxies(ids...)
		var names []string
		for i := range *rollingNamespaces {
			names = append(names, fmt.Sprintf("rolling-%d", i))
		}
		where := w.create(names, movetest.Quiet, ids...)
		w.StartGateway()
		w.Served(where, atLeast(movetest.SeedEvents), 60*time.Second)
		prism, err := testbin.Path("prism")
		if err != nil {
			b.Fatal(err)
		}

		stopMoves := w.watchMoves()
		stopProducing := w.producer(movetest.Quiet, *produceRate)
		r := w.Read(names, len(names), 10*time.Millisecond, 8*time.Minute)
		started := time.Now()
		for _, id := range ids {
			p := w.Proxies[id]
			at := time.Now()
			preStop := exec.Command(prism, "sidecar", "drain-wait", "--addr", p.Sidecar.HTTPAddr, "--timeout", "60s")
			if out, err := preStop.CombinedOutput(); err != nil {
				b.Fatalf("%s preStop: %v\n%s", id, err, out)
			}
			drained := time.Since(at)
			if err := p.Runner.Term(15 * time.Second); err != nil {
				b.Fatalf("%s runner: %v", id, err)
			}
			if err := p.Sidecar.Term(15 * time.Second); err != nil {
				b.Fatalf("%s sidecar: %v", id, err)
			}
			p.Runner.Restart()
			p.Sidecar.Restart()
			w.Settled(where, 90*time.Second)
			w.Served(where, atLeast(movetest.SeedEvents), 30*time.Second)
			note("%s restarted in %v (preStop drain %v)", id, time.Since(at).Round(time.Millisecond), drained.Round(time.Millisecond))
		}
		time.Sleep(2 * time.Second)
		answers := r.End()
		produced := stopProducing()
		handoffs := stopMoves()
		v := movetest.Judge(answers)
		during, quiet := pauses(answers, handoffs)
		note("rolling restart of 3 runners in %v, %d events produced meanwhile: %v", time.Since(started).Round(time.Millisecond), produced, v)
		note("%d handoffs; longest gap per handoff: p50 %v, p99 %v; in %d windows as long outside handoffs: p50 %v, p99 %v",
			len(during), percentile(during, 50), percentile(during, 99), len(quiet), percentile(quiet, 50), percentile(quiet, 99))
		figure("moves.failed_queries_rolling_restart", v.Failed, "queries")
		figure("moves.events_went_down_rolling_restart", v.EventsDown, "answers")
		figure("moves.switch_pause_p99_ms", ms(percentile(during, 99)), "ms")
		figure("moves.quiet_pause_p99_ms", ms(percentile(quiet, 99)), "ms")
	}
}

// BenchmarkCatchUp moves two namespaces whose topic holds -catchup-events
// events (4 partitions) off their source once it has them all, one after the
// other: the first to a proxy whose runner runs with --peer-recovery=false,
// so its mailbox reads every event from Kafka (moves.catchup_s_<n>), the
// second to one that copies the source's mailbox by peer recovery and then
// reads Kafka from the copied positions (moves.recovery_s_<n>). Each figure is
// the move's start to its switch.
func BenchmarkCatchUp(b *testing.B) {
	for range b.N {
		const big = "big.events"
		n := *catchupEvents
		ids := []string{"proxy-1", "proxy-2", "proxy-3"}
		w := newWorld(b, kafkatest.Topics(4, big))
		at := time.Now()
		w.produceMany(big, n)
		note("produced %d events in %v", n, time.Since(at).Round(time.Millisecond))
		w.StartProxy("proxy-1")
		w.StartProxy("proxy-2", "--peer-recovery=false")
		w.StartProxy("proxy-3")
		w.AwaitProxies(ids...)
		names := namesOn(2, "deep", "proxy-1", ids...)
		at = time.Now()
		w.create(names, big, ids...)
		w.StartGateway()
		w.Served(map[string]string{names[0]: "proxy-1", names[1]: "proxy-1"}, atLeast(int64(n)), 10*time.Minute)
		note("source caught up in %v (creation to every event of both namespaces served through the gateway)", time.Since(at).Round(time.Millisecond))

		for _, m := range []struct{ ns, to, figure string }{
			{names[0], "proxy-2", "moves.catchup_s_"},
			{names[1], "proxy-3", "moves.recovery_s_"},
		} {
			took, rec := w.moveAndSwitch(m.ns, m.to)
			note("%s: %d events on %s and switched in %v (%.0f events/s); recovery %s, %d bytes copied, history complete %v",
				m.ns, n, m.to, took.Round(time.Millisecond), float64(n)/took.Seconds(), rec.GetState(), rec.GetBytesCopied(), rec.GetHistoryComplete())
			figure(m.figure+countName(n), fmt.Sprintf("%.1f", took.Seconds()), "s")
		}
	}
}

// moveAndSwitch moves ns to proxy to by hand and waits for the switch; it returns the time from the call to
// ListMoves showing the switch, and the destination's recovery as the admin last heard it.
func (w *world) moveAndSwitch(ns, to string) (time.Duration, *adminv1.RecoveryStatus) {
	w.TB.Helper()
	started := time.Now()
	w.Must("move "+ns, func(ctx context.Context, a adminv1.AdminClient) error {
		_, err := a.MoveNamespace(ctx, &adminv1.MoveNamespaceRequest{Namespace: ns, ToProxyId: to})
		return err
	})
	var rec *adminv1.RecoveryStatus
	testwait.For(w.TB, 10*time.Minute, ns+" switched to "+to, func() (bool, string) {
		var r *adminv1.GetNamespaceResponse
		var moves *adminv1.ListMovesResponse
		if err := w.Admin(func(ctx context.Context, a adminv1.AdminClient) (err error) {
			if r, err = a.GetNamespace(ctx, &adminv1.GetNamespaceRequest{Namespace: ns}); err != nil {
				return err
			}
			moves, err = a.ListMoves(ctx, &adminv1.ListMovesRequest{})
			return err
		}); err != nil {
			return false, err.Error()
		}
		for _, rp := range r.GetReplicas() {
			if rp.GetProxyId() == to && rp.GetHealth().GetRecovery() != nil {
				rec = rp.GetHealth().GetRecovery()
			}
		}
		for _, m := range moves.GetMoves() {
			if m.GetNamespace() == ns {
				return m.GetState() == adminv1.MoveState_MOVE_STATE_HANDING_OFF, m.GetState().String() + fmt.Sprint(" lag ", m.GetLag(), " known=", m.GetLagKnown())
			}
		}
		return false, "no move listed"
	})
	return time.Since(started), rec
}

// BenchmarkDrain cordons a proxy serving -drain-namespaces namespaces
// (names hashing places on it, so the other proxy holds none) while a
// reader queries them all through the gateway: the figure is the cordon
// to the proxy serving nothing, every namespace switched to the other
// proxy and its handoff tail (12 s) over; the moves run at the default
// --max-concurrent-moves (4).
func BenchmarkDrain(b *testing.B) {
	for range b.N {
		n := *drainNamespaces
		ids := []string{"proxy-1", "proxy-2"}
		w := newWorld(b)
		for _, id := range ids {
			w.StartProxy(id)
		}
		w.AwaitProxies(ids...)
		names := namesOn(n, "drain", "proxy-1", ids...)
		at := time.Now()
		where := w.create(names, movetest.Quiet, ids...)
		w.StartGateway()
		w.Served(where, atLeast(movetest.SeedEvents), 3*time.Minute)
		note("%d namespaces created and served on proxy-1 in %v", n, time.Since(at).Round(time.Millisecond))

		after := map[string]string{}
		for _, ns := range names {
			after[ns] = "proxy-2"
		}
		r := w.Read(names, 4, time.Millisecond, 8*time.Minute)
		started := time.Now()
		w.Must("cordon proxy-1", func(ctx context.Context, a adminv1.AdminClient) error {
			_, err := a.CordonProxy(ctx, &adminv1.CordonProxyRequest{ProxyId: "proxy-1", Cordoned: true})
			return err
		})
		lastSwitch := w.switched("proxy-1", 5*time.Minute)
		done := w.Settled(after, 5*time.Minute)
		took := done.Sub(started)
		time.Sleep(time.Second)
		v := movetest.Judge(r.End())
		note("drain of %d namespaces: last switch after %v, serving nothing after %v; %v",
			n, lastSwitch.Sub(started).Round(time.Millisecond), took.Round(time.Millisecond), v)
		figure(fmt.Sprintf("moves.drain_s_%dns", n), fmt.Sprintf("%.1f", took.Seconds()), "s")
		figure(fmt.Sprintf("moves.failed_queries_drain_%dns", n), v.Failed, "queries")
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }

// switched waits until no namespace is assigned to proxy or moving to
// it, and returns when it saw that.
func (w *world) switched(proxy string, bound time.Duration) time.Time {
	w.TB.Helper()
	var at time.Time
	testwait.For(w.TB, bound, "every namespace switched off "+proxy, func() (bool, string) {
		left := 0
		if err := w.Admin(func(ctx context.Context, a adminv1.AdminClient) error {
			left = 0
			// Every page: -drain-namespaces may be more than one.
			return mesh.AllPages(func(token string) (*adminv1.ListNamespacesResponse, error) {
				return a.ListNamespaces(ctx, &adminv1.ListNamespacesRequest{PageToken: token})
			}, func(r *adminv1.ListNamespacesResponse) {
				for _, n := range r.GetNamespaces() {
					if n.GetAssignedProxyId() == proxy || n.GetIncomingProxyId() == proxy {
						left++
					}
				}
			})
		}); err != nil {
			return false, err.Error()
		}
		at = time.Now()
		return left == 0, fmt.Sprint(left, " namespaces left on ", proxy)
	})
	return at
}
